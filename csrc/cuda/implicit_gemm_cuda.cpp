// implicit_gemm_forward / implicit_gemm_wgrad on CUDA: argument and plan checks, tile choice,
// buffers, and the fixed-order sum of split (forward) and chunk (wgrad) partials.
#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <limits>
#include <vector>

#include "implicit_gemm/params.h"

namespace torchsparse_pp {

namespace {

using igemm::DType;
using igemm::Math;
using igemm::PlanView;
using igemm::TileShape;

DType kernel_dtype(at::ScalarType st) {
  switch (st) {
    case at::kHalf: return DType::kHalf;
    case at::kBFloat16: return DType::kBFloat16;
    case at::kFloat: return DType::kFloat;
    case at::kDouble: return DType::kDouble;
    default: TORCH_CHECK(false, "the CUDA kernels support float16, bfloat16, float32 and float64, got ", st);
  }
}

// Accumulator partials: float, or double for float64 inputs.
at::ScalarType partial_dtype(at::ScalarType st) { return st == at::kDouble ? at::kDouble : at::kFloat; }

int multiprocessors(const at::Device& device) {
  int count = 0;
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device.index()));
  return count;
}

cudaStream_t current_stream() { return c10::cuda::getCurrentCUDAStream().stream(); }

// cp.async, mma.sync m16n8k16 and TF32 need compute capability 8.0 (Ampere) or newer.
void check_architecture(const at::Device& device) {
  int major = 0;
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device.index()));
  TORCH_CHECK(major >= 8, "the CUDA implicit GEMM needs compute capability 8.0 or newer; ", device, " has ", major,
              ".x (use the gather_scatter dataflow there)");
}

void check_operand(const at::Tensor& t, const char* name, const at::Device& device) {
  TORCH_CHECK(t.dim() == 2, name, " must be 2-D [N, C], got ", t.sizes());
  TORCH_CHECK(t.device() == device, name, " is on ", t.device(), " but the map is on ", device);
  kernel_dtype(t.scalar_type());
}

// Table and plan shapes, bounds on the host, then one validation pass on the device (indices in
// range, every neighbour covered by its tile's mask, each row listed once per split).
PlanView checked_plan(const at::Tensor& table, int64_t num_rows, int64_t K, int64_t num_src, const at::Tensor& bounds,
                      const at::Tensor& order, const at::Tensor& tile_masks, int64_t tile_rows) {
  const auto device = table.device();
  TORCH_CHECK(table.scalar_type() == at::kInt && table.dim() == 2 && table.size(1) == K && table.is_contiguous(),
              "the map must be a contiguous int32 [rows, K = ", K, "] tensor, got ", table.scalar_type(), " ",
              table.sizes());
  TORCH_CHECK(num_rows >= 0 && num_rows <= table.size(0), "num rows (", num_rows, ") exceeds the map's ",
              table.size(0), " rows");
  TORCH_CHECK(num_rows < std::numeric_limits<int32_t>::max() && num_src < std::numeric_limits<int32_t>::max(),
              "row counts must fit int32");
  // The forward kernel lists a CTA's offsets in shared memory (4 bytes each).
  TORCH_CHECK(K >= 1 && K <= 4096, "the CUDA implicit GEMM supports kernel volumes in [1, 4096], got ", K);
  TORCH_CHECK(tile_rows >= 1, "tile_rows must be >= 1, got ", tile_rows);
  for (const auto* t : {&bounds, &order, &tile_masks})
    TORCH_CHECK(t->device() == device && t->is_contiguous(), "plan tensors must be contiguous and on ", device);
  TORCH_CHECK(bounds.scalar_type() == at::kLong && bounds.dim() == 1 && bounds.size(0) >= 2,
              "bounds must be an int64 vector [splits + 1], got ", bounds.sizes());
  const int64_t splits = bounds.size(0) - 1;
  const auto host_bounds = bounds.cpu();
  const int64_t* b = host_bounds.data_ptr<int64_t>();
  TORCH_CHECK(b[0] == 0 && b[splits] == K, "bounds must run from 0 to K = ", K, ", got ", b[0], " .. ", b[splits]);
  int64_t longest = 0;
  for (int64_t s = 0; s < splits; ++s) {
    TORCH_CHECK(b[s] < b[s + 1], "bounds must increase, got bounds[", s, "] = ", b[s], " >= bounds[", s + 1,
                "] = ", b[s + 1]);
    longest = std::max(longest, b[s + 1] - b[s]);
  }
  const int64_t tiles = (num_rows + tile_rows - 1) / tile_rows;
  TORCH_CHECK(tile_masks.scalar_type() == at::kLong && tile_masks.dim() == 3 && tile_masks.size(0) == splits &&
                  tile_masks.size(1) == tiles && tile_masks.size(2) * 64 >= longest,
              "tile_masks must be int64 [splits = ", splits, ", tiles = ", tiles, ", words >= ", (longest + 63) / 64,
              "], got ", tile_masks.sizes());
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

  auto flags = at::zeros({4}, table.options());
  auto row_counts = at::zeros({sorted ? splits * num_rows : 0}, table.options());
  C10_CUDA_CHECK(igemm::launch_validate_plan(plan, num_src, row_counts.data_ptr<int32_t>(), flags.data_ptr<int32_t>(),
                                             current_stream()));
  const auto f = flags.cpu();
  const int32_t* bad = f.data_ptr<int32_t>();
  TORCH_CHECK(bad[0] == 0, "the map has ", bad[0], " entries outside [-1, ", num_src, ")");
  TORCH_CHECK(bad[1] == 0, "the plan's order has ", bad[1], " entries outside [-1, ", num_rows, ")");
  TORCH_CHECK(bad[2] == 0, "the plan does not cover the map: ", bad[2],
              " neighbours have offsets their tile's mask lacks (a plan of another map?)");
  TORCH_CHECK(bad[3] == 0, "the plan's order must list every row once per split; ", bad[3], " (split, row) do not");
  return plan;
}

// Tile choice from the generated table: the narrowest CTA_N that covers the output channels
// (else the widest), then the largest CTA_M that still gives two CTAs per SM, else the smallest.
// k_multiple_of > 0 restricts to tiles whose K step divides it.
int choose_tile(const at::Device& device, DType dtype, Math math, int64_t rows, int64_t cols, int64_t k_multiple_of) {
  TileShape shapes[32];
  const int count = std::min(igemm::tile_shapes(dtype, math, shapes, 32), 32);
  TORCH_CHECK(count > 0, "no implicit-GEMM kernels were generated for this dtype");
  int widest = 0;
  for (int i = 0; i < count; ++i) widest = std::max(widest, shapes[i].cta_n);
  int want_n = widest;
  for (int i = 0; i < count; ++i)
    if (shapes[i].cta_n >= cols && shapes[i].cta_n < want_n) want_n = shapes[i].cta_n;
  const int64_t sms = multiprocessors(device);
  int largest_filling = -1, smallest = -1;
  for (int i = 0; i < count; ++i) {
    if (shapes[i].cta_n != want_n || (k_multiple_of > 0 && k_multiple_of % shapes[i].cta_k != 0)) continue;
    const int64_t ctas = (rows + shapes[i].cta_m - 1) / shapes[i].cta_m * ((cols + want_n - 1) / want_n);
    if (ctas >= 2 * sms && (largest_filling < 0 || shapes[i].cta_m > shapes[largest_filling].cta_m)) largest_filling = i;
    if (smallest < 0 || shapes[i].cta_m < shapes[smallest].cta_m) smallest = i;
  }
  const int best = largest_filling >= 0 ? largest_filling : smallest;
  TORCH_CHECK(best >= 0, "no implicit-GEMM tile fits (plan tile rows must be a multiple of the kernels' K step)");
  return best;
}

bool aligned16(const at::Tensor& t) { return reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0; }

Math math_for(at::ScalarType st, bool allow_tf32) { return st == at::kFloat && allow_tf32 ? Math::kTF32 : Math::kDefault; }

}  // namespace

at::Tensor implicit_gemm_forward_cuda(const at::Tensor& feats_in, const at::Tensor& weight_in, const at::Tensor& table,
                                      int64_t num_dst, bool transpose_weight, const at::Tensor& bounds,
                                      const at::Tensor& order, const at::Tensor& tile_masks, int64_t tile_rows,
                                      bool allow_tf32) {
  const c10::cuda::CUDAGuard guard(table.device());
  check_architecture(table.device());
  check_operand(feats_in, "feats", table.device());
  TORCH_CHECK(weight_in.dim() == 3, "weight must be [K, C_in, C_out], got ", weight_in.sizes());
  TORCH_CHECK(weight_in.device() == table.device(), "weight is on ", weight_in.device(), " but the map is on ",
              table.device());
  TORCH_CHECK(weight_in.scalar_type() == feats_in.scalar_type(), "weight dtype ", weight_in.scalar_type(),
              " does not match feats dtype ", feats_in.scalar_type());
  // dgrad multiplies by W[k]^T: a contiguous transposed copy (the weight is small) keeps one kernel.
  const auto weight = transpose_weight ? weight_in.transpose(1, 2).contiguous() : weight_in.contiguous();
  const auto feats = feats_in.contiguous();
  const int64_t K = weight.size(0), c_in = weight.size(1), c_out = weight.size(2);
  TORCH_CHECK(feats.size(1) == c_in, "feats have ", feats.size(1), " channels but the weight expects ", c_in);
  TORCH_CHECK(c_in < (1 << 30) && c_out <= (1 << 21), "channel counts must be below 2^30 (input) and 2^21 "
              "(output: grid rows of at most 65535 tiles)");
  // The kernel counts its (offset, C_in chunk) steps in int; the smallest chunk is 8 channels.
  TORCH_CHECK(K * ((c_in + 7) / 8) < std::numeric_limits<int32_t>::max(), "kernel volume x input channels (", K,
              " x ", c_in, ") is too large");
  const int64_t num_src = feats.size(0);
  const PlanView plan = checked_plan(table, num_dst, K, num_src, bounds, order, tile_masks, tile_rows);
  const auto st = feats.scalar_type();
  if (num_dst == 0 || c_out == 0 || num_src == 0 || c_in == 0) return at::zeros({num_dst, c_out}, feats.options());

  const DType dtype = kernel_dtype(st);
  const Math math = math_for(st, allow_tf32);
  const int64_t slots = plan.order != nullptr ? plan.order_len : num_dst;
  const int tile = choose_tile(table.device(), dtype, math, slots, c_out, /*any K step*/ 0);
  const int64_t vec = 16 / static_cast<int64_t>(feats.element_size());
  const bool wide = c_in % vec == 0 && c_out % vec == 0 && aligned16(feats) && aligned16(weight);
  const bool acc_out = plan.splits > 1;
  auto out = acc_out ? at::empty({plan.splits, num_dst, c_out}, feats.options().dtype(partial_dtype(st)))
                     : at::empty({num_dst, c_out}, feats.options());

  igemm::ForwardParams p{};
  p.src = feats.data_ptr();
  p.weight = weight.data_ptr();
  p.out = out.data_ptr();
  p.num_src = num_src;
  p.c_in = static_cast<int>(c_in);
  p.c_out = static_cast<int>(c_out);
  p.plan = plan;
  C10_CUDA_CHECK(igemm::launch_forward(dtype, math, tile, wide, acc_out, p, current_stream()));
  // Split partials summed in split order: deterministic.
  return acc_out ? out.sum(0).to(st) : out;
}

at::Tensor implicit_gemm_wgrad_cuda(const at::Tensor& feats_in, const at::Tensor& grad_in, const at::Tensor& table,
                                    const at::Tensor& bounds, const at::Tensor& order, const at::Tensor& tile_masks,
                                    int64_t tile_rows, bool allow_tf32) {
  const c10::cuda::CUDAGuard guard(table.device());
  check_architecture(table.device());
  check_operand(feats_in, "feats", table.device());
  check_operand(grad_in, "grad_out", table.device());
  TORCH_CHECK(feats_in.scalar_type() == grad_in.scalar_type(), "feats dtype ", feats_in.scalar_type(),
              " does not match grad_out dtype ", grad_in.scalar_type());
  TORCH_CHECK(table.dim() == 2, "the map must be [rows, K], got ", table.sizes());
  const auto feats = feats_in.contiguous();
  const auto grad = grad_in.contiguous();
  const int64_t K = table.size(1), c_in = feats.size(1), c_out = grad.size(1);
  const int64_t num_src = feats.size(0), num_rows = grad.size(0);
  TORCH_CHECK(c_in < (1 << 30) && c_out < (1 << 30), "channel counts must be below 2^30");
  const PlanView plan = checked_plan(table, num_rows, K, num_src, bounds, order, tile_masks, tile_rows);
  const auto st = feats.scalar_type();
  if (num_rows == 0 || num_src == 0 || c_in == 0 || c_out == 0) return at::zeros({K, c_in, c_out}, feats.options());

  const DType dtype = kernel_dtype(st);
  const Math math = math_for(st, allow_tf32);
  // The reduction runs over rows in steps of CTA_K inside each plan tile.
  const int tile = choose_tile(table.device(), dtype, math, c_in, c_out, tile_rows);
  TileShape shapes[32];
  igemm::tile_shapes(dtype, math, shapes, 32);
  const TileShape shape = shapes[tile];
  const int64_t vec = 16 / static_cast<int64_t>(feats.element_size());
  const bool wide = c_in % vec == 0 && c_out % vec == 0 && aligned16(feats) && aligned16(grad);

  // Split-K over chunks of plan tiles: enough CTAs to fill the GPU about four times, at most
  // 4096 tiles per chunk (their list lives in shared memory).
  const int64_t sms = multiprocessors(table.device());
  const int64_t tiles_mn = ((c_in + shape.cta_m - 1) / shape.cta_m) * ((c_out + shape.cta_n - 1) / shape.cta_n);
  const int64_t tiles = std::max<int64_t>(plan.tiles, 1);
  int64_t chunks = std::min<int64_t>(tiles, std::max<int64_t>(1, (4 * sms + tiles_mn * K - 1) / (tiles_mn * K)));
  int64_t per_chunk = std::min<int64_t>((tiles + chunks - 1) / chunks, 4096);
  chunks = (tiles + per_chunk - 1) / per_chunk;
  TORCH_CHECK(chunks <= 65535 && tiles_mn <= std::numeric_limits<int32_t>::max(), "the weight gradient is too large");
  auto partial = at::empty({chunks, K, c_in, c_out}, feats.options().dtype(partial_dtype(st)));

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
  C10_CUDA_CHECK(igemm::launch_wgrad(dtype, math, tile, wide, p, current_stream()));
  // Chunk partials summed in chunk order: deterministic.
  return partial.sum(0).to(st);
}

TORCH_LIBRARY_IMPL(torchsparse_pp, CUDA, m) {
  m.impl("implicit_gemm_forward", &implicit_gemm_forward_cuda);
  m.impl("implicit_gemm_wgrad", &implicit_gemm_wgrad_cuda);
}

}  // namespace torchsparse_pp
