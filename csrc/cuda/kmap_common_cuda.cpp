// Host helpers shared by the CUDA kernel-map wrappers.
#include "kmap_common_cuda.h"

#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAStream.h>

#include <limits>
#include <string>

#include "../cpu/hash_cpu.h"
#include "../cpu/kmap_common.h"
#include "hash.h"

namespace torchsparse_pp {
namespace kmap_host {

namespace kernels = kmap_kernels;

namespace {

constexpr int64_t kNoRow = std::numeric_limits<int64_t>::max();

std::string row_string(const at::Tensor& coords, int64_t row) {
  const auto c = coords[row].cpu();
  const int32_t* v = c.data_ptr<int32_t>();
  return "(" + std::to_string(v[0]) + ", " + std::to_string(v[1]) + ", " + std::to_string(v[2]) +
         ", " + std::to_string(v[3]) + ")";
}

[[noreturn]] void throw_out_of_range(const at::Tensor& coords, const char* name, int64_t row) {
  TORCH_CHECK(false, name, " row ", row, " = ", row_string(coords, row),
              " is outside the supported coordinate range: batch in [0, ", kBatchMax, "], x/y/z in [",
              kSpatialMin, ", ", kSpatialMax, "]");
  __builtin_unreachable();
}

constexpr const char* kUniqueHint =
    ": the coordinates of a SparseTensor must be unique "
    "(torchsparse_pp.utils.sparse_quantize removes duplicates)";

// Keys in ascending order with their rows; equal keys keep ascending rows (stable).
std::tuple<at::Tensor, at::Tensor> stable_sort(const at::Tensor& keys) {
  return at::sort(keys, std::optional<bool>(true), 0, false);
}

// hash_build's report: the smallest row whose key an earlier row already has.
[[noreturn]] void throw_duplicate_row(const at::Tensor& keys, const at::Tensor& coords) {
  const auto [sorted, rows] = stable_sort(keys);
  const int64_t n = keys.size(0);
  const auto repeats = sorted.narrow(0, 1, n - 1) == sorted.narrow(0, 0, n - 1);
  const int64_t row = rows.narrow(0, 1, n - 1).masked_select(repeats).min().item<int64_t>();
  TORCH_CHECK(false, "duplicate coordinate ", row_string(coords, row), " at row ", row, kUniqueHint);
  __builtin_unreachable();
}

}  // namespace

at::Tensor checked_coords_cuda(const at::Tensor& coords, const char* name) {
  TORCH_CHECK(coords.scalar_type() == at::kInt, name, " must be int32 (batch, x, y, z), got ",
              coords.scalar_type());
  TORCH_CHECK(coords.dim() == 2 && coords.size(1) == 4, name,
              " must have shape [N, 4] (batch, x, y, z), got ", coords.sizes());
  TORCH_CHECK(coords.is_cuda(), name, " must be on a CUDA device for this kernel, got ", coords.device());
  return coords.contiguous();
}

void check_on_same_device(const at::Tensor& t, const char* t_name, const at::Tensor& ref,
                          const char* ref_name) {
  TORCH_CHECK(t.device() == ref.device(), t_name, " is on ", t.device(), " but ", ref_name, " is on ",
              ref.device(), "; both must be on one device");
}

at::Tensor pack_coords_cuda(const at::Tensor& coords, const char* name) {
  const int64_t n = coords.size(0);
  auto keys = at::empty({n}, coords.options().dtype(at::kLong));
  static_assert(kernels::kBadRow == 0, "pack_coords reports through status[kBadRow]");
  auto bad_row = at::full({1}, kNoRow, keys.options());
  C10_CUDA_CHECK(kernels::pack_coords(coords.data_ptr<int32_t>(), n, keys.data_ptr<int64_t>(),
                                      bad_row.data_ptr<int64_t>(), c10::cuda::getCurrentCUDAStream()));
  const int64_t row = bad_row.item<int64_t>();
  if (row != kNoRow) throw_out_of_range(coords, name, row);
  return keys;
}

at::Tensor build_table_cuda(const at::Tensor& coords, DuplicateReport report) {
  const int64_t n = coords.size(0);
  const auto stream = c10::cuda::getCurrentCUDAStream();
  auto keys = at::empty({n}, coords.options().dtype(at::kLong));
  auto status = at::zeros({kernels::kHashStatusSize}, keys.options());
  status.narrow(0, kernels::kBadRow, 1).fill_(kNoRow);
  C10_CUDA_CHECK(kernels::pack_coords(coords.data_ptr<int32_t>(), n, keys.data_ptr<int64_t>(),
                                      status.data_ptr<int64_t>(), stream));
  auto table = empty_table(n, coords.options());
  const int64_t capacity = table.size(0);
  // Rows out of range were packed as empty keys, which the insert skips; one read of the flags.
  C10_CUDA_CHECK(kernels::hash_insert_rows(keys.data_ptr<int64_t>(), n, table.data_ptr<int64_t>(), capacity,
                                           status.data_ptr<int64_t>(), stream));
  const auto flags = status.cpu();
  const int64_t* f = flags.data_ptr<int64_t>();
  if (f[kernels::kBadRow] != kNoRow) throw_out_of_range(coords, "coords", f[kernels::kBadRow]);
  if (f[kernels::kFull] != 0) throw_probe_limit(capacity);
  if (f[kernels::kDuplicate] != 0) {
    if (report == DuplicateReport::kRow) throw_duplicate_row(keys, coords);
    check_unique_keys_cuda(keys, coords);
    TORCH_CHECK(false, "coordinate hash table: a duplicate insert was flagged but no repeated key exists");
  }
  return table;
}

void check_unique_keys_cuda(const at::Tensor& keys, const at::Tensor& coords) {
  const int64_t n = keys.size(0);
  if (n < 2) return;
  const auto [sorted, rows] = stable_sort(keys);
  const auto repeats = sorted.narrow(0, 1, n - 1) == sorted.narrow(0, 0, n - 1);
  if (!repeats.any().item<bool>()) return;
  // First repeat in key order; stable, so rows[i] < rows[i + 1] for the pair.
  const int64_t i = repeats.nonzero()[0][0].item<int64_t>();
  const auto pair = rows.narrow(0, i, 2).cpu();
  const int64_t a = pair.data_ptr<int64_t>()[0], b = pair.data_ptr<int64_t>()[1];
  TORCH_CHECK(false, "duplicate coordinate ", row_string(coords, b), " at rows ", a, " and ", b, kUniqueHint);
}

void check_table_cuda(const at::Tensor& table, int64_t num_rows, int64_t K, int64_t num_src) {
  TORCH_CHECK(table.scalar_type() == at::kInt && table.dim() == 2 && table.size(1) == K &&
                  table.is_contiguous() && table.is_cuda(),
              "the map must be a contiguous int32 [rows, K = ", K, "] CUDA tensor, got ",
              table.scalar_type(), " ", table.sizes(), " on ", table.device());
  TORCH_CHECK(num_rows >= 0 && num_rows <= table.size(0), "num rows (", num_rows,
              ") must be in [0, ", table.size(0), "]");
  check_rows(num_rows, "the map (num rows)");
  check_rows(num_src, "the map's source (num_src)");
  const auto used = table.narrow(0, 0, num_rows);
  if (used.numel() == 0) return;
  const auto [lo, hi] = at::aminmax(used);
  const auto bounds = at::stack({lo, hi}).cpu();
  const int32_t* v = bounds.data_ptr<int32_t>();
  TORCH_CHECK(v[0] >= -1 && v[1] < num_src, "the map holds a row index outside [-1, ", num_src, ")");
}

}  // namespace kmap_host
}  // namespace torchsparse_pp
