// Strided and generative kernel maps on CUDA. Each input enumerates what it reaches (as the CPU
// build does); sort + unique of those keys is the new coordinate set in canonical (packed key)
// order, and a fill pass finds every (input, offset) target by binary search in it. Results
// and error messages equal the CPU ops'.
#include <ATen/ATen.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <limits>
#include <string>

#include "../cpu/kmap_common.h"
#include "kmap_common_cuda.h"
#include "kmap_strided.h"

namespace torchsparse_pp {

namespace {

using namespace kmap_host;
namespace kernels = kmap_kernels;

constexpr int64_t kNoRow = std::numeric_limits<int64_t>::max();

kernels::ReachRule make_rule(const KernelGeometry& g, kernels::Relation rel, const int64_t* range) {
  kernels::ReachRule r{};
  r.rel = rel;
  for (int a = 0; a < 3; ++a) {
    r.taps[a] = rel == kernels::Relation::kFloor ? 1 : g.k[a];
    r.s[a] = g.s[a];
    r.d[a] = g.d[a];
    r.pad[a] = g.pad[a];
    r.range[a] = range != nullptr ? range[a] : -1;
  }
  return r;
}

// Sorted unique packed keys of everything the inputs reach under `rule`; a reached coordinate
// outside the packable range is an error (it would be a new coordinate).
at::Tensor reached_set(const at::Tensor& coords, const kernels::ReachRule& rule, cudaStream_t stream) {
  const int64_t n = coords.size(0);
  const auto long_options = coords.options().dtype(at::kLong);
  if (n == 0) return at::empty({0}, long_options);
  const int32_t* c = coords.data_ptr<int32_t>();
  auto counts = at::empty({n}, long_options);
  C10_CUDA_CHECK(kernels::reach_counts(c, n, rule, counts.data_ptr<int64_t>(), stream));
  const auto ends = counts.cumsum(0);
  const auto starts = ends - counts;
  const int64_t total = ends[n - 1].item<int64_t>();
  auto keys = at::empty({total}, long_options);
  auto bad_row = at::full({1}, kNoRow, long_options);
  C10_CUDA_CHECK(kernels::reach_keys(c, n, rule, starts.data_ptr<int64_t>(), keys.data_ptr<int64_t>(),
                                     bad_row.data_ptr<int64_t>(), stream));
  const int64_t row = bad_row.item<int64_t>();
  TORCH_CHECK(row == kNoRow, "input row ", row,
              " produces an output coordinate outside the supported range: batch in [0, ", kBatchMax,
              "], x/y/z in [", kSpatialMin, ", ", kSpatialMax, "]");
  if (total == 0) return keys;
  const auto sorted = std::get<0>(at::sort(keys));
  auto unique = std::get<0>(at::unique_consecutive(sorted));
  check_rows(unique.size(0), "the new coordinate set");
  return unique;
}

at::Tensor coords_of(const at::Tensor& keys, const at::TensorOptions& options, cudaStream_t stream) {
  const int64_t m = keys.size(0);
  auto coords = at::empty({m, 4}, options.dtype(at::kInt));
  C10_CUDA_CHECK(kernels::unpack_keys(keys.data_ptr<int64_t>(), m, coords.data_ptr<int32_t>(), stream));
  return coords;
}

// Two inputs claimed one (output, offset) cell, so two input rows share a coordinate. Reports
// what the CPU's claim walk reports: the smallest row that is not its cell's first claimant.
[[noreturn]] void throw_duplicate_claim(const at::Tensor& coords, const kernels::ReachRule& rule,
                                        const at::Tensor& out_keys, const at::Tensor& out_in,
                                        cudaStream_t stream) {
  auto first = at::full_like(out_in, std::numeric_limits<int32_t>::max());
  auto row = at::full({1}, kNoRow, coords.options().dtype(at::kLong));
  for (auto mode : {kernels::FillMode::kClaimMin, kernels::FillMode::kSecondClaim})
    C10_CUDA_CHECK(kernels::reach_fill(coords.data_ptr<int32_t>(), coords.size(0), rule,
                                       out_keys.data_ptr<int64_t>(), out_keys.size(0), mode,
                                       first.data_ptr<int32_t>(), row.data_ptr<int64_t>(), stream));
  TORCH_CHECK(false, "duplicate coordinate at row ", row.item<int64_t>(),
              ": the coordinates of a SparseTensor must be unique "
              "(torchsparse_pp.utils.sparse_quantize removes duplicates)");
  __builtin_unreachable();
}

std::tuple<at::Tensor, at::Tensor> kmap_downsample_cuda(const at::Tensor& coords_in,
                                                        at::IntArrayRef kernel_size,
                                                        at::IntArrayRef stride,
                                                        at::IntArrayRef dilation,
                                                        at::IntArrayRef padding,
                                                        c10::string_view mode,
                                                        at::OptionalIntArrayRef out_range,
                                                        int64_t pad_rows_to) {
  check_coord_rows(coords_in, "coords");
  const auto coords = checked_coords_cuda(coords_in, "coords");
  const auto g = make_geometry(kernel_size, stride, dilation, padding);
  const bool minkowski = checked_minkowski_mode(mode, out_range);
  int64_t range_buf[3];
  const int64_t* range = checked_range(out_range, range_buf);
  const int64_t K = g.volume();
  const c10::cuda::CUDAGuard guard(coords.device());
  const auto stream = c10::cuda::getCurrentCUDAStream();
  // Every input must be packable and unique, also those whose outputs are clipped or in range
  // only because of the division (as on the CPU).
  check_unique_keys_cuda(pack_coords_cuda(coords, "coords"), coords);

  // spconv: the outputs are exactly what the inputs reach; minkowski: floor(p / s). Either way
  // the map joins what the inputs reach with that set.
  const auto read_by = make_rule(g, kernels::Relation::kReadBy, range);
  const auto out_keys =
      reached_set(coords, minkowski ? make_rule(g, kernels::Relation::kFloor, nullptr) : read_by, stream);
  auto out_coords = coords_of(out_keys, coords.options(), stream);
  auto out_in = at::full({padded_rows(out_keys.size(0), pad_rows_to), K}, -1, coords.options());
  // An (output, offset) cell determines its input coordinate: a second claim is a duplicate.
  auto clash = at::zeros({1}, coords.options().dtype(at::kLong));
  C10_CUDA_CHECK(kernels::reach_fill(coords.data_ptr<int32_t>(), coords.size(0), read_by,
                                     out_keys.data_ptr<int64_t>(), out_keys.size(0),
                                     kernels::FillMode::kClaim, out_in.data_ptr<int32_t>(),
                                     clash.data_ptr<int64_t>(), stream));
  if (clash.item<int64_t>() != 0) throw_duplicate_claim(coords, read_by, out_keys, out_in, stream);
  return {out_coords, out_in};
}

std::tuple<at::Tensor, at::Tensor> kmap_generative_cuda(const at::Tensor& coords_in,
                                                        at::IntArrayRef kernel_size,
                                                        at::IntArrayRef stride,
                                                        at::IntArrayRef dilation,
                                                        at::IntArrayRef padding,
                                                        at::OptionalIntArrayRef out_range,
                                                        int64_t pad_rows_to) {
  check_coord_rows(coords_in, "coords");
  const auto coords = checked_coords_cuda(coords_in, "coords");
  const auto g = make_geometry(kernel_size, stride, dilation, padding);
  int64_t range_buf[3];
  const int64_t* range = checked_range(out_range, range_buf);
  const int64_t K = g.volume();
  const int64_t n = coords.size(0);
  const c10::cuda::CUDAGuard guard(coords.device());
  const auto stream = c10::cuda::getCurrentCUDAStream();
  // Duplicates in the coarse set would double their fine sites.
  check_unique_keys_cuda(pack_coords_cuda(coords, "coords"), coords);
  const auto writes = make_rule(g, kernels::Relation::kWrites, range);
  const auto fine_keys = reached_set(coords, writes, stream);
  auto fine_coords = coords_of(fine_keys, coords.options(), stream);
  // Rows are the coarse inputs of the transposed conv; entries index the fine set it writes.
  auto out_in = at::full({padded_rows(n, pad_rows_to), K}, -1, coords.options());
  C10_CUDA_CHECK(kernels::reach_fill(coords.data_ptr<int32_t>(), n, writes, fine_keys.data_ptr<int64_t>(),
                                     fine_keys.size(0), kernels::FillMode::kRowOfInput,
                                     out_in.data_ptr<int32_t>(), nullptr, stream));
  return {fine_coords, out_in};
}

}  // namespace

TORCH_LIBRARY_IMPL(torchsparse_pp, CUDA, m) {
  m.impl("kmap_downsample", &kmap_downsample_cuda);
  m.impl("kmap_generative", &kmap_generative_cuda);
}

}  // namespace torchsparse_pp
