// Fetch-on-demand dataflow on the CPU: chunks of each offset's pairs are gathered into
// thread-local tiles, multiplied, and scatter-added block by block of destination rows; no
// gathered matrix ever goes to DRAM (see pair_tiles.h).
#include <ATen/Dispatch.h>
#include <torch/library.h>

#include "checks_cpu.h"
#include "pair_tiles.h"

namespace torchsparse_pp {

at::Tensor fetch_on_demand_forward_cpu(const at::Tensor& feats_in, const at::Tensor& weight_in,
                                       const at::Tensor& src_idx, const at::Tensor& dst_idx,
                                       const at::Tensor& offsets, const at::Tensor& identity,
                                       int64_t num_dst, bool transpose_weight) {
  check_feats(feats_in, "feats");
  check_weight(weight_in, feats_in, transpose_weight);
  require_pairs_sorted_by_dst(
      check_pairs(src_idx, dst_idx, offsets, identity, weight_in.size(0), feats_in.size(0), num_dst));
  const auto feats = feats_in.contiguous();
  at::Tensor out;
  AT_DISPATCH_FLOATING_TYPES_AND(at::kBFloat16, feats.scalar_type(), "fetch_on_demand_forward_cpu", [&] {
    out = pairs_forward_tiled<scalar_t>(feats, weight_in, src_idx, dst_idx, offsets, identity, num_dst,
                                        transpose_weight);
  });
  return out;
}

at::Tensor fetch_on_demand_wgrad_cpu(const at::Tensor& feats_in, const at::Tensor& grad_in,
                                     const at::Tensor& src_idx, const at::Tensor& dst_idx,
                                     const at::Tensor& offsets, const at::Tensor& identity) {
  check_wgrad_operands(feats_in, grad_in);
  const int64_t K = identity.size(0);
  check_pairs(src_idx, dst_idx, offsets, identity, K, feats_in.size(0), grad_in.size(0));
  const auto feats = feats_in.contiguous();
  const auto grad = grad_in.contiguous();
  at::Tensor dweight;
  AT_DISPATCH_FLOATING_TYPES_AND(at::kBFloat16, feats.scalar_type(), "fetch_on_demand_wgrad_cpu", [&] {
    dweight = pairs_wgrad_tiled<scalar_t>(feats, grad, src_idx, dst_idx, offsets, K);
  });
  return dweight;
}

at::Tensor fetch_on_demand_forward_fused_cpu(const at::Tensor& feats_in, const at::Tensor& weight_in,
                                             const at::Tensor& src_idx, const at::Tensor& dst_idx,
                                             const at::Tensor& offsets, const at::Tensor& identity, int64_t num_dst,
                                             const std::optional<at::Tensor>& bias,
                                             const std::optional<at::Tensor>& residual, bool relu) {
  check_feats(feats_in, "feats");
  check_weight(weight_in, feats_in, false);
  require_pairs_sorted_by_dst(
      check_pairs(src_idx, dst_idx, offsets, identity, weight_in.size(0), feats_in.size(0), num_dst));
  const int64_t c_dst = weight_in.size(2);
  Epilogue epilogue;
  epilogue.relu = relu;
  if (bias.has_value()) {
    TORCH_CHECK(bias->dim() == 1 && bias->size(0) == c_dst && bias->device().is_cpu(),
                "bias must be a CPU vector of C_out = ", c_dst, " values, got ", bias->sizes());
    TORCH_CHECK(at::isFloatingType(bias->scalar_type()), "bias must be floating point, got ", bias->scalar_type());
    epilogue.bias = *bias;
  }
  if (residual.has_value()) {
    TORCH_CHECK(residual->dim() == 2 && residual->size(0) == num_dst && residual->size(1) == c_dst,
                "residual must be [num_dst, C_out] = [", num_dst, ", ", c_dst, "], got ", residual->sizes());
    TORCH_CHECK(residual->scalar_type() == feats_in.scalar_type() && residual->device().is_cpu(),
                "residual must be a CPU tensor of the feats' dtype ", feats_in.scalar_type(), ", got ",
                residual->scalar_type(), " on ", residual->device());
    epilogue.residual = residual->contiguous();
  }
  const auto feats = feats_in.contiguous();
  at::Tensor out;
  AT_DISPATCH_FLOATING_TYPES_AND(at::kBFloat16, feats.scalar_type(), "fetch_on_demand_forward_fused_cpu", [&] {
    out = pairs_forward_tiled<scalar_t>(feats, weight_in, src_idx, dst_idx, offsets, identity, num_dst, false,
                                        epilogue);
  });
  return out;
}

namespace {

// The schema's deterministic / allow_tf32 choose among the CUDA kernels; these kernels are
// deterministic by construction and exact (the CPU has no TF32 unit) whatever they say.
at::Tensor fetch_on_demand_forward_op(const at::Tensor& feats, const at::Tensor& weight, const at::Tensor& src_idx,
                                      const at::Tensor& dst_idx, const at::Tensor& offsets,
                                      const at::Tensor& identity, int64_t num_dst, bool transpose_weight,
                                      bool /*deterministic*/, bool /*allow_tf32*/) {
  return fetch_on_demand_forward_cpu(feats, weight, src_idx, dst_idx, offsets, identity, num_dst, transpose_weight);
}

at::Tensor fetch_on_demand_wgrad_op(const at::Tensor& feats, const at::Tensor& grad, const at::Tensor& src_idx,
                                    const at::Tensor& dst_idx, const at::Tensor& offsets, const at::Tensor& identity,
                                    bool /*allow_tf32*/) {
  return fetch_on_demand_wgrad_cpu(feats, grad, src_idx, dst_idx, offsets, identity);
}

}  // namespace

TORCH_LIBRARY_IMPL(torchsparse_pp, CPU, m) {
  m.impl("fetch_on_demand_forward", &fetch_on_demand_forward_op);
  m.impl("fetch_on_demand_wgrad", &fetch_on_demand_wgrad_op);
  m.impl("fetch_on_demand_forward_fused", &fetch_on_demand_forward_fused_cpu);
}

}  // namespace torchsparse_pp
