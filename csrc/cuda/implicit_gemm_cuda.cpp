// implicit_gemm_forward / implicit_gemm_wgrad on CUDA: argument and plan-shape checks, tile
// choice, buffers, and the fixed-order sum of split (forward) and chunk (wgrad) partials.
//
// A call reads no device data on the host and validates no index: it only launches, so it never
// synchronises and can be captured in a CUDA graph. The plan and table are validated once, on the
// device, when the library builds and caches them (torchsparse_pp/ops/validate.py, called by
// KernelMap.plan); `torchsparse_pp.backends.validate_plans = True` makes the ops' Python wrappers
// validate before every call.
#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <limits>
#include <vector>

#include "../cpu/kmap_common.h"
#include "implicit_gemm/params.h"
#include "tiled_host.h"

namespace torchsparse_pp {

namespace {

using igemm::DType;
using igemm::Math;
using igemm::PlanView;
using igemm::TileShape;
using tiled::accumulator_dtype;
using tiled::check_operand;
using tiled::kernel_dtype;

// The table and plan as the kernels read them. Only shapes are checked here (host metadata): the
// values were validated when the plan was built.
PlanView plan_view(const at::Tensor& table, int64_t num_rows, int64_t K, int64_t num_src, const at::Tensor& bounds,
                   const at::Tensor& order, const at::Tensor& tile_masks, int64_t tile_rows) {
  const auto device = table.device();
  TORCH_CHECK(table.scalar_type() == at::kInt && table.dim() == 2 && table.size(1) == K && table.is_contiguous(),
              "the map must be a contiguous int32 [rows, K = ", K, "] tensor, got ", table.scalar_type(), " ",
              table.sizes());
  TORCH_CHECK(num_rows >= 0 && num_rows <= table.size(0), "num rows (", num_rows, ") exceeds the map's ",
              table.size(0), " rows");
  TORCH_CHECK(num_rows < std::numeric_limits<int32_t>::max() && num_src < std::numeric_limits<int32_t>::max(),
              "row counts must fit int32");
  TORCH_CHECK(K >= 1 && K <= 65535, "the CUDA implicit GEMM supports kernel volumes in [1, 65535] (grid rows of "
              "the weight gradient), got ", K);
  TORCH_CHECK(tile_rows >= 1, "tile_rows must be >= 1, got ", tile_rows);
  for (const auto* t : {&bounds, &order, &tile_masks})
    TORCH_CHECK(t->device() == device && t->is_contiguous(), "plan tensors must be contiguous and on ", device);
  TORCH_CHECK(bounds.scalar_type() == at::kLong && bounds.dim() == 1 && bounds.size(0) >= 2 &&
                  bounds.size(0) - 1 <= std::min<int64_t>(K, 65535),
              "bounds must be an int64 vector [splits + 1] with 1 <= splits <= K, got ", bounds.sizes());
  const int64_t splits = bounds.size(0) - 1;
  const int64_t tiles = (num_rows + tile_rows - 1) / tile_rows;
  TORCH_CHECK(tile_masks.scalar_type() == at::kLong && tile_masks.dim() == 3 && tile_masks.size(0) == splits &&
                  tile_masks.size(1) == tiles && tile_masks.size(2) >= 1,
              "tile_masks must be int64 [splits = ", splits, ", tiles = ", tiles, ", words], got ", tile_masks.sizes());
  TORCH_CHECK(tiles < std::numeric_limits<int32_t>::max(), "too many plan tiles");
  const bool sorted = order.numel() > 0 || (order.dim() == 2 && order.size(0) > 0);
  if (sorted)
    TORCH_CHECK(order.scalar_type() == at::kInt && order.dim() == 2 && order.size(0) == splits &&
                    order.size(1) == tiles * tile_rows,
                "order must be int32 [splits = ", splits, ", ", tiles * tile_rows, "], got ", order.sizes());

  PlanView plan{};
  plan.table = table.data_ptr<int32_t>();
  plan.order = sorted ? order.data_ptr<int32_t>() : nullptr;
  plan.bounds = bounds.data_ptr<int64_t>();
  plan.tile_masks = tile_masks.data_ptr<int64_t>();
  plan.num_rows = num_rows;
  plan.order_len = sorted ? order.size(1) : 0;
  plan.K = static_cast<int>(K);
  plan.splits = static_cast<int>(splits);
  plan.tile_rows = static_cast<int>(tile_rows);
  plan.tiles = static_cast<int>(tiles);
  plan.words = static_cast<int>(tile_masks.size(2));
  return plan;
}

}  // namespace

at::Tensor implicit_gemm_forward_cuda(const at::Tensor& feats_in, const at::Tensor& weight_in, const at::Tensor& table,
                                      int64_t num_dst, bool transpose_weight, const at::Tensor& bounds,
                                      const at::Tensor& order, const at::Tensor& tile_masks, int64_t tile_rows,
                                      bool allow_tf32) {
  const c10::cuda::CUDAGuard guard(table.device());
  tiled::check_architecture(table.device(), "implicit GEMM");
  check_operand(feats_in, "feats", table.device(), "the map is");
  check_rows(feats_in.size(0), "feats");
  check_rows(num_dst, "the destination (num_dst)");
  const auto weight = tiled::oriented_weight(weight_in, feats_in, transpose_weight, "the map is");
  const auto feats = feats_in.contiguous();
  const int64_t K = weight.size(0), c_in = weight.size(1), c_out = weight.size(2);
  // The kernel counts its (offset, C_in chunk) steps in int; the smallest chunk is 8 channels.
  TORCH_CHECK(K * ((c_in + 7) / 8) < std::numeric_limits<int32_t>::max(), "kernel volume x input channels (", K,
              " x ", c_in, ") is too large");
  const int64_t num_src = feats.size(0);
  const PlanView plan = plan_view(table, num_dst, K, num_src, bounds, order, tile_masks, tile_rows);
  const auto st = feats.scalar_type();
  if (num_dst == 0 || c_out == 0 || num_src == 0 || c_in == 0) return at::zeros({num_dst, c_out}, feats.options());

  const DType dtype = kernel_dtype(st);
  const Math math = tiled::math_for(st, allow_tf32);
  const int64_t slots = plan.order != nullptr ? plan.order_len : num_dst;
  int tile = 0;
  tiled::choose_tile(table.device(), &igemm::tile_shapes, dtype, math, slots, c_out, /*any K step*/ 0, &tile);
  const bool wide = tiled::wide_loads(feats, weight, c_in, c_out);
  const bool acc_out = plan.splits > 1;
  auto out = acc_out ? at::empty({plan.splits, num_dst, c_out}, feats.options().dtype(accumulator_dtype(st)))
                     : at::empty({num_dst, c_out}, feats.options());

  igemm::ForwardParams p{};
  p.src = feats.data_ptr();
  p.weight = weight.data_ptr();
  p.out = out.data_ptr();
  p.num_src = num_src;
  p.c_in = static_cast<int>(c_in);
  p.c_out = static_cast<int>(c_out);
  p.plan = plan;
  C10_CUDA_CHECK(igemm::launch_forward(dtype, math, tile, wide, acc_out, p, tiled::current_stream()));
  // Split partials summed in split order: deterministic.
  return acc_out ? out.sum(0).to(st) : out;
}

at::Tensor implicit_gemm_wgrad_cuda(const at::Tensor& feats_in, const at::Tensor& grad_in, const at::Tensor& table,
                                    const at::Tensor& bounds, const at::Tensor& order, const at::Tensor& tile_masks,
                                    int64_t tile_rows, bool allow_tf32) {
  const c10::cuda::CUDAGuard guard(table.device());
  tiled::check_architecture(table.device(), "implicit GEMM");
  check_operand(feats_in, "feats", table.device(), "the map is");
  check_operand(grad_in, "grad_out", table.device(), "the map is");
  check_rows(feats_in.size(0), "feats");
  check_rows(grad_in.size(0), "grad_out");
  TORCH_CHECK(feats_in.scalar_type() == grad_in.scalar_type(), "feats dtype ", feats_in.scalar_type(),
              " does not match grad_out dtype ", grad_in.scalar_type());
  TORCH_CHECK(table.dim() == 2, "the map must be [rows, K], got ", table.sizes());
  const auto feats = feats_in.contiguous();
  const auto grad = grad_in.contiguous();
  const int64_t K = table.size(1), c_in = feats.size(1), c_out = grad.size(1);
  const int64_t num_src = feats.size(0), num_rows = grad.size(0);
  TORCH_CHECK(c_in < (1 << 30) && c_out < (1 << 30), "channel counts must be below 2^30");
  const PlanView plan = plan_view(table, num_rows, K, num_src, bounds, order, tile_masks, tile_rows);
  const auto st = feats.scalar_type();
  if (num_rows == 0 || num_src == 0 || c_in == 0 || c_out == 0) return at::zeros({K, c_in, c_out}, feats.options());

  const DType dtype = kernel_dtype(st);
  const Math math = tiled::math_for(st, allow_tf32);
  // The reduction runs over rows in steps of CTA_K inside each plan tile.
  int tile = 0;
  const TileShape shape =
      tiled::choose_tile(table.device(), &igemm::tile_shapes, dtype, math, c_in, c_out, tile_rows, &tile);
  const bool wide = tiled::wide_loads(feats, grad, c_in, c_out);

  // Split-K over chunks of plan tiles: enough CTAs to fill the GPU about four times.
  const int64_t sms = tiled::multiprocessor_count(table.device());
  const int64_t tiles_mn = ((c_in + shape.cta_m - 1) / shape.cta_m) * ((c_out + shape.cta_n - 1) / shape.cta_n);
  const int64_t tiles = std::max<int64_t>(plan.tiles, 1);
  int64_t chunks = std::min<int64_t>(tiles, std::max<int64_t>(1, (4 * sms + tiles_mn * K - 1) / (tiles_mn * K)));
  const int64_t per_chunk = (tiles + chunks - 1) / chunks;
  chunks = (tiles + per_chunk - 1) / per_chunk;
  TORCH_CHECK(chunks <= 65535 && tiles_mn <= std::numeric_limits<int32_t>::max(), "the weight gradient is too large");
  auto partial = at::empty({chunks, K, c_in, c_out}, feats.options().dtype(accumulator_dtype(st)));

  igemm::WgradParams p{};
  p.src = feats.data_ptr();
  p.grad = grad.data_ptr();
  p.partial = partial.data_ptr();
  p.num_src = num_src;
  p.c_in = static_cast<int>(c_in);
  p.c_out = static_cast<int>(c_out);
  p.chunks = static_cast<int>(chunks);
  p.tiles_per_chunk = static_cast<int>(per_chunk);
  p.plan = plan;
  C10_CUDA_CHECK(igemm::launch_wgrad(dtype, math, tile, wide, p, tiled::current_stream()));
  // Chunk partials summed in chunk order: deterministic.
  return partial.sum(0).to(st);
}

TORCH_LIBRARY_IMPL(torchsparse_pp, CUDA, m) {
  m.impl("implicit_gemm_forward", &implicit_gemm_forward_cuda);
  m.impl("implicit_gemm_wgrad", &implicit_gemm_wgrad_cuda);
}

}  // namespace torchsparse_pp
