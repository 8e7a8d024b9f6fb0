// fetch_on_demand_forward / fetch_on_demand_wgrad on CUDA: argument and shape checks, tile
// choice, buffers, and the conversion of float accumulators.
//
// Forward: one fused launch over every offset's pairs (atomic float adds into a zeroed
// accumulator), or with `deterministic` the owned-rows kernel (each output row summed by one CTA,
// offsets in order). The weight gradient sums contiguous chunks of each offset's pairs into
// partials that are added in chunk order: deterministic by construction.
//
// A call reads no device data on the host and validates no index: it only launches, so it never
// synchronises and can be captured in a CUDA graph. The pairs are validated once, on the device,
// when the library builds a map's pair view (torchsparse_pp/ops/validate.py); with
// `torchsparse_pp.backends.validate_plans = True` the ops' Python wrappers validate before every
// call. `identity` flags are not needed here: an identity offset's pairs (j, j) run like any other.
#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <algorithm>
#include <limits>

#include "../cpu/kmap_common.h"
#include "fetch_on_demand/params.h"
#include "tiled_host.h"

namespace torchsparse_pp {

namespace {

using fod::DType;
using fod::Math;
using fod::TileShape;
using tiled::accumulator_dtype;
using tiled::check_operand;
using tiled::kernel_dtype;

// The pairs as the kernels read them; only shapes, dtypes and devices are checked (host metadata).
fod::PairList pair_list(const at::Tensor& src_idx, const at::Tensor& dst_idx, const at::Tensor& offsets,
                        const at::Tensor& identity, int64_t K, const at::Device& device) {
  TORCH_CHECK(src_idx.scalar_type() == at::kInt && dst_idx.scalar_type() == at::kInt && src_idx.dim() == 1 &&
                  src_idx.sizes() == dst_idx.sizes(),
              "pair indices must be two int32 vectors of equal length");
  TORCH_CHECK(offsets.scalar_type() == at::kLong && offsets.dim() == 1 && offsets.size(0) == K + 1,
              "offsets must be an int64 vector of length K + 1 = ", K + 1, ", got ", offsets.sizes());
  TORCH_CHECK(identity.scalar_type() == at::kBool && identity.dim() == 1 && identity.size(0) == K,
              "identity must be a bool vector of length K = ", K);
  for (const auto* t : {&src_idx, &dst_idx, &offsets})
    TORCH_CHECK(t->device() == device && t->is_contiguous(),
                "pair tensors must be contiguous tensors on the feats' device (", device, "), got one on ", t->device());
  TORCH_CHECK(K >= 1 && K <= 65535, "fetch-on-demand on CUDA supports kernel volumes in [1, 65535], got ", K);
  fod::PairList pairs{};
  pairs.src = src_idx.data_ptr<int32_t>();
  pairs.dst = dst_idx.data_ptr<int32_t>();
  pairs.offsets = offsets.data_ptr<int64_t>();
  pairs.num_pairs = src_idx.size(0);
  pairs.K = static_cast<int>(K);
  return pairs;
}

}  // namespace

at::Tensor fetch_on_demand_forward_cuda(const at::Tensor& feats_in, const at::Tensor& weight_in,
                                        const at::Tensor& src_idx, const at::Tensor& dst_idx,
                                        const at::Tensor& offsets, const at::Tensor& identity, int64_t num_dst,
                                        bool transpose_weight, bool deterministic, bool allow_tf32) {
  const auto device = feats_in.device();
  const c10::cuda::CUDAGuard guard(device);
  tiled::check_architecture(device, "fetch-on-demand");
  check_operand(feats_in, "feats", device, "feats are");
  TORCH_CHECK(num_dst >= 0, "num_dst must be >= 0, got ", num_dst);
  check_rows(feats_in.size(0), "feats");
  check_rows(num_dst, "the destination (num_dst)");
  const auto weight = tiled::oriented_weight(weight_in, feats_in, transpose_weight, "feats are");
  const auto feats = feats_in.contiguous();
  const int64_t K = weight.size(0), c_in = weight.size(1), c_out = weight.size(2);
  const fod::PairList pairs = pair_list(src_idx, dst_idx, offsets, identity, K, device);
  const auto st = feats.scalar_type();
  if (num_dst == 0 || c_out == 0 || pairs.num_pairs == 0 || c_in == 0)
    return at::zeros({num_dst, c_out}, feats.options());

  const DType dtype = kernel_dtype(st);
  const Math math = tiled::math_for(st, allow_tf32);
  const bool wide = tiled::wide_loads(feats, weight, c_in, c_out);
  fod::ForwardParams p{};
  p.src_feats = feats.data_ptr();
  p.weight = weight.data_ptr();
  p.num_dst = num_dst;
  p.c_in = static_cast<int>(c_in);
  p.c_out = static_cast<int>(c_out);
  p.pairs = pairs;
  int tile = 0;
  if (deterministic) {
    // Each output row is written once, zeros included: no memset, no conversion pass.
    tiled::choose_tile(device, &fod::tile_shapes, dtype, math, num_dst, c_out, 0, &tile);
    auto out = at::empty({num_dst, c_out}, feats.options());
    p.out = out.data_ptr();
    C10_CUDA_CHECK(fod::launch_forward_owned(dtype, math, tile, wide, p, tiled::current_stream()));
    return out;
  }
  const TileShape shape = tiled::choose_tile(device, &fod::tile_shapes, dtype, math, pairs.num_pairs, c_out, 0, &tile);
  TORCH_CHECK((pairs.num_pairs + shape.cta_m - 1) / shape.cta_m + K < std::numeric_limits<int32_t>::max(),
              "too many pairs (", pairs.num_pairs, ") for one launch");
  auto acc = at::zeros({num_dst, c_out}, feats.options().dtype(accumulator_dtype(st)));
  p.out = acc.data_ptr();
  C10_CUDA_CHECK(fod::launch_forward_atomic(dtype, math, tile, wide, p, tiled::current_stream()));
  return acc.scalar_type() == st ? acc : acc.to(st);
}

at::Tensor fetch_on_demand_wgrad_cuda(const at::Tensor& feats_in, const at::Tensor& grad_in, const at::Tensor& src_idx,
                                      const at::Tensor& dst_idx, const at::Tensor& offsets, const at::Tensor& identity,
                                      bool allow_tf32) {
  const auto device = feats_in.device();
  const c10::cuda::CUDAGuard guard(device);
  tiled::check_architecture(device, "fetch-on-demand");
  check_operand(feats_in, "feats", device, "feats are");
  check_operand(grad_in, "grad_out", device, "feats are");
  check_rows(feats_in.size(0), "feats");
  check_rows(grad_in.size(0), "grad_out");
  TORCH_CHECK(feats_in.scalar_type() == grad_in.scalar_type(), "feats dtype ", feats_in.scalar_type(),
              " does not match grad_out dtype ", grad_in.scalar_type());
  TORCH_CHECK(identity.dim() == 1, "identity must be a bool vector of length K, got shape ", identity.sizes());
  const int64_t K = identity.size(0);
  const fod::PairList pairs = pair_list(src_idx, dst_idx, offsets, identity, K, device);
  const auto feats = feats_in.contiguous();
  const auto grad = grad_in.contiguous();
  const int64_t c_in = feats.size(1), c_out = grad.size(1);
  TORCH_CHECK(c_in < (1 << 30) && c_out < (1 << 30), "channel counts must be below 2^30");
  const auto st = feats.scalar_type();
  if (pairs.num_pairs == 0 || c_in == 0 || c_out == 0) return at::zeros({K, c_in, c_out}, feats.options());

  const DType dtype = kernel_dtype(st);
  const Math math = tiled::math_for(st, allow_tf32);
  int tile = 0;
  const TileShape shape = tiled::choose_tile(device, &fod::tile_shapes, dtype, math, c_in, c_out, 0, &tile);
  const bool wide = tiled::wide_loads(feats, grad, c_in, c_out);

  // Split-K over chunks of each offset's pairs: enough CTAs to fill the GPU about four times,
  // each chunk still summing about 256 pairs or more (from the mean count: no device read).
  const int64_t sms = tiled::multiprocessor_count(device);
  const int64_t tiles_mn = ((c_in + shape.cta_m - 1) / shape.cta_m) * ((c_out + shape.cta_n - 1) / shape.cta_n);
  TORCH_CHECK(tiles_mn <= std::numeric_limits<int32_t>::max(), "the weight gradient is too large");
  const int64_t by_occupancy = (4 * sms + tiles_mn * K - 1) / (tiles_mn * K);
  const int64_t by_work = std::max<int64_t>(1, pairs.num_pairs / (K * 256));
  const int64_t chunks = std::max<int64_t>(1, std::min<int64_t>({64, by_occupancy, by_work}));
  auto partial = at::empty({chunks, K, c_in, c_out}, feats.options().dtype(accumulator_dtype(st)));

  fod::WgradParams p{};
  p.feats = feats.data_ptr();
  p.grad = grad.data_ptr();
  p.partial = partial.data_ptr();
  p.c_in = static_cast<int>(c_in);
  p.c_out = static_cast<int>(c_out);
  p.chunks = static_cast<int>(chunks);
  p.pairs = pairs;
  C10_CUDA_CHECK(fod::launch_wgrad(dtype, math, tile, wide, p, tiled::current_stream()));
  // Chunk partials summed in chunk order: deterministic.
  return partial.sum(0).to(st);
}

TORCH_LIBRARY_IMPL(torchsparse_pp, CUDA, m) {
  m.impl("fetch_on_demand_forward", &fetch_on_demand_forward_cuda);
  m.impl("fetch_on_demand_wgrad", &fetch_on_demand_wgrad_cuda);
}

}  // namespace torchsparse_pp
