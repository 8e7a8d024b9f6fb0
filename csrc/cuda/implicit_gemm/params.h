// Arguments of the implicit-GEMM kernels, shared by the ATen wrapper (g++) and the kernels
// (nvcc). ATen-free.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "../gemm/types.h"

namespace torchsparse_pp {
namespace igemm {

using gemm::DType;
using gemm::Math;
using gemm::TileShape;

// An output-stationary table and its plan (see kmap_plan): rows are visited split by split, in
// `order` (sorted plans) or in table order (order == nullptr); tile_masks say which offsets of
// the split any row of a plan tile has, so whole tiles skip absent offsets. The kernels trust
// the plan: it is validated once when it is built (torchsparse_pp/ops/validate.py).
struct PlanView {
  const int32_t* table;       // [table_rows >= num_rows, K], -1 = no neighbour
  const int32_t* order;       // [splits, order_len] or nullptr
  const int64_t* bounds;      // [splits + 1] offset ranges of the splits
  const int64_t* tile_masks;  // [splits, tiles, words]: OR of the row bitmasks per plan tile
  int64_t num_rows;           // destination rows
  int64_t order_len;          // row slots per split in `order` (tiles * tile_rows)
  int K;
  int splits;
  int tile_rows;
  int tiles;
  int words;
};

// out[dst] = sum over offsets k and channels c: src[table[dst, k], c] * weight[k, c, :].
struct ForwardParams {
  const void* src;     // [num_src, c_in]
  const void* weight;  // [K, c_in, c_out] (dgrad passes W^T per offset)
  void* out;           // [splits, num_rows, c_out]: the input dtype when splits == 1, else the
                       // accumulator type (float; double for float64), summed by the wrapper
  int64_t num_src;
  int c_in;
  int c_out;
  PlanView plan;
};

// dW[k, c, n] = sum over rows r of src[table[r, k], c] * grad[r, n], split over chunks of plan
// tiles (partials [chunks, K, c_in, c_out] of the accumulator type, summed in a fixed order by
// the wrapper).
struct WgradParams {
  const void* src;     // [num_src, c_in]
  const void* grad;    // [num_rows, c_out]
  void* partial;       // [chunks, K, c_in, c_out], float (double for float64)
  int64_t num_src;
  int c_in;
  int c_out;
  int chunks;          // grid.z
  int tiles_per_chunk; // plan tiles summed by one CTA
  PlanView plan;
};

// Launchers of the generated instantiations. `wide` selects 16-byte vector loads (every row
// start 16-byte aligned: channel counts multiples of 16 / sizeof(T) and aligned pointers);
// otherwise element-wise loads. `acc_out` writes accumulator-type partials (several splits).
// All shared memory is static (at most 48 KiB, which `make cuda-check` verifies per kernel), so
// no launch needs an attribute set first. They return cudaErrorInvalidValue when no
// instantiation matches.
cudaError_t launch_forward(DType dtype, Math math, int tile, bool wide, bool acc_out, const ForwardParams& p,
                           cudaStream_t stream);
cudaError_t launch_wgrad(DType dtype, Math math, int tile, bool wide, const WgradParams& p, cudaStream_t stream);

// The tile shapes available for (dtype, math), in table order; count returned, at most `capacity` written.
int tile_shapes(DType dtype, Math math, TileShape* shapes, int capacity);

}  // namespace igemm
}  // namespace torchsparse_pp
