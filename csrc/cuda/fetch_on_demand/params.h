// Arguments of the fetch-on-demand kernels, shared by the ATen wrapper (g++) and the kernels
// (nvcc). ATen-free.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "../gemm/types.h"

namespace torchsparse_pp {
namespace fod {

using gemm::DType;
using gemm::Math;
using gemm::TileShape;

// Weight-stationary pairs: pair j of offset k (offsets[k] <= j < offsets[k + 1]) reads source
// row src[j] and adds into destination row dst[j]; each destination appears at most once per
// offset, and the destinations of an offset ascend (kmap_pairs' order; the owned-rows kernel
// searches them). The kernels trust the pairs: they are validated once when the map's view is
// built (torchsparse_pp/ops/validate.py).
struct PairList {
  const int32_t* src;      // [num_pairs]
  const int32_t* dst;      // [num_pairs]
  const int64_t* offsets;  // [K + 1], on the device
  int64_t num_pairs;
  int K;
};

// out[dst[j]] += src_feats[src[j]] @ weight[k] over the pairs j of every offset k.
struct ForwardParams {
  const void* src_feats;  // [num_src, c_in]
  const void* weight;     // [K, c_in, c_out] (dgrad passes W^T per offset)
  void* out;              // [num_dst, c_out]: atomic kernels add into a zeroed accumulator-type
                          // buffer (float; double for float64); owned-rows kernels write every
                          // row in the output type
  int64_t num_dst;
  int c_in;
  int c_out;
  PairList pairs;
};

// dW[k] = sum over the pairs j of offset k: feats[src[j]]^T grad[dst[j]], split over `chunks`
// contiguous ranges of each offset's pairs (partials [chunks, K, c_in, c_out] of the accumulator
// type, summed in chunk order by the wrapper: deterministic).
struct WgradParams {
  const void* feats;  // [num_src, c_in]
  const void* grad;   // [num_dst, c_out]
  void* partial;      // [chunks, K, c_in, c_out]
  int c_in;
  int c_out;
  int chunks;
  PairList pairs;
};

// Launchers of the generated instantiations (`wide`: 16-byte vector loads, see
// igemm::launch_forward). forward_atomic: one fused launch over every offset's pairs, a CTA
// takes CTA_M pairs of one offset and adds its products with atomics. forward_owned: the
// deterministic variant, a CTA owns CTA_M destination rows and adds the offsets in order.
// They return cudaErrorInvalidValue when no instantiation matches.
cudaError_t launch_forward_atomic(DType dtype, Math math, int tile, bool wide, const ForwardParams& p,
                                  cudaStream_t stream);
cudaError_t launch_forward_owned(DType dtype, Math math, int tile, bool wide, const ForwardParams& p,
                                 cudaStream_t stream);
cudaError_t launch_wgrad(DType dtype, Math math, int tile, bool wide, const WgradParams& p, cudaStream_t stream);

// The tile shapes available for (dtype, math), in table order; count returned, at most `capacity` written.
int tile_shapes(DType dtype, Math math, TileShape* shapes, int capacity);

}  // namespace fod
}  // namespace torchsparse_pp
