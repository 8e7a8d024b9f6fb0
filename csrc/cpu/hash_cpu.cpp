// Exact coordinate hash table on the CPU: build and query, parallel over rows.
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <atomic>
#include <limits>

#include "hash_cpu.h"

namespace torchsparse_pp {

namespace {

std::string row_string(const int32_t* c) {
  return "(" + std::to_string(c[0]) + ", " + std::to_string(c[1]) + ", " + std::to_string(c[2]) +
         ", " + std::to_string(c[3]) + ")";
}

}  // namespace

at::Tensor checked_coords(const at::Tensor& coords, const char* name) {
  TORCH_CHECK(coords.scalar_type() == at::kInt, name, " must be int32 (batch, x, y, z), got ",
              coords.scalar_type());
  TORCH_CHECK(coords.dim() == 2 && coords.size(1) == 4, name,
              " must have shape [N, 4] (batch, x, y, z), got ", coords.sizes());
  TORCH_CHECK(coords.device().is_cpu(), name, " must be on the CPU for this kernel");
  return coords.contiguous();
}

at::Tensor pack_coords_cpu(const at::Tensor& coords, const char* name) {
  const int64_t n = coords.size(0);
  auto packed = at::empty({n}, coords.options().dtype(at::kLong));
  const int32_t* c = coords.data_ptr<int32_t>();
  int64_t* p = packed.data_ptr<int64_t>();
  std::atomic<int64_t> bad{std::numeric_limits<int64_t>::max()};
  at::parallel_for(0, n, 4096, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const int32_t* r = c + 4 * i;
      if (!coord_in_range(r[0], r[1], r[2], r[3])) {
        atomic_min(bad, i);
        p[i] = kEmptyKey;
        continue;
      }
      p[i] = pack_coord(r[0], r[1], r[2], r[3]);
    }
  });
  const int64_t row = bad.load();
  TORCH_CHECK(row == std::numeric_limits<int64_t>::max(), name, " row ", row, " = ",
              row_string(c + 4 * row),
              " is outside the supported coordinate range: batch in [0, ", kBatchMax,
              "], x/y/z in [", kSpatialMin, ", ", kSpatialMax, "]");
  return packed;
}

void throw_probe_limit(int64_t capacity) {
  TORCH_CHECK(false, "coordinate hash table: an insert exceeded the probe bound of ",
              std::min(capacity, kMaxProbes), " slots (capacity ", capacity,
              "); the keys are pathological for the hash function");
  __builtin_unreachable();
}

std::tuple<at::Tensor, at::Tensor> hash_build_from_keys_cpu(const at::Tensor& packed,
                                                            const at::Tensor& coords) {
  const int64_t n = packed.size(0);
  TORCH_CHECK(n <= std::numeric_limits<int32_t>::max(),
              "coordinate hash table: at most 2^31-1 coordinates are supported, got ", n);
  const int64_t cap = hash_capacity_for(n);
  auto keys = at::full({cap}, kEmptyKey, packed.options());
  auto vals = at::full({cap}, -1, packed.options().dtype(at::kInt));
  const int64_t* p = packed.data_ptr<int64_t>();
  int64_t* k = keys.data_ptr<int64_t>();
  int32_t* v = vals.data_ptr<int32_t>();
  std::atomic<int64_t> dup_row{std::numeric_limits<int64_t>::max()};
  std::atomic<bool> full{false};
  at::parallel_for(0, n, 4096, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      int32_t other = -1;
      auto r = hash_insert(k, v, cap, p[i], static_cast<int32_t>(i), &other);
      if (r == InsertResult::kExists) atomic_min(dup_row, i);
      if (r == InsertResult::kFull) full = true;
    }
  });
  if (full) throw_probe_limit(cap);
  const int64_t row = dup_row.load();
  if (row != std::numeric_limits<int64_t>::max()) {
    const int32_t* c = coords.data_ptr<int32_t>();
    TORCH_CHECK(false, "duplicate coordinate ", row_string(c + 4 * row), " at row ", row,
                ": the coordinates of a SparseTensor must be unique "
                "(torchsparse_pp.utils.sparse_quantize removes duplicates)");
  }
  return {keys, vals};
}

std::tuple<at::Tensor, at::Tensor> hash_build_cpu(const at::Tensor& coords_in) {
  auto coords = checked_coords(coords_in, "coords");
  auto packed = pack_coords_cpu(coords, "coords");
  return hash_build_from_keys_cpu(packed, coords);
}

at::Tensor hash_query_cpu(const at::Tensor& keys, const at::Tensor& vals,
                          const at::Tensor& query_in) {
  TORCH_CHECK(keys.scalar_type() == at::kLong && vals.scalar_type() == at::kInt &&
                  keys.dim() == 1 && keys.sizes() == vals.sizes(),
              "hash_query: (keys, vals) must come from hash_build");
  auto query = checked_coords(query_in, "query");
  const int64_t n = query.size(0);
  auto out = at::empty({n}, query.options());
  CoordHashView table{keys.data_ptr<int64_t>(), vals.data_ptr<int32_t>(), keys.size(0)};
  const int32_t* q = query.data_ptr<int32_t>();
  int32_t* o = out.data_ptr<int32_t>();
  at::parallel_for(0, n, 4096, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const int32_t* r = q + 4 * i;
      // Keys outside the packable range cannot be in the table.
      o[i] = coord_in_range(r[0], r[1], r[2], r[3]) ? table.find(pack_coord(r[0], r[1], r[2], r[3]))
                                                    : -1;
    }
  });
  return out;
}

TORCH_LIBRARY_IMPL(torchsparse_pp, CPU, m) {
  m.impl("hash_build", &hash_build_cpu);
  m.impl("hash_query", &hash_query_cpu);
}

}  // namespace torchsparse_pp
