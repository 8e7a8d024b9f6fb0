// Kernels of the gather-GEMM-scatter dataflow on CUDA (the GEMMs go through ATen / cuBLAS in
// gather_scatter_cuda.cpp). ATen-free: host launchers over raw pointers, each returning the
// launch's cudaError_t. Every launch with no work returns cudaSuccess without launching.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace torchsparse_pp {
namespace gather_scatter_kernels {

// Element type of the GEMM products and of the output accumulator they are added into.
enum class ScatterTypes {
  kFloat32,             // float products into a float accumulator
  kFloat64,             // double into double
  kFloat16ToFloat32,    // __half products into a float accumulator
  kBFloat16ToFloat32,   // __nv_bfloat16 products into a float accumulator
};

// buf row i = src row idx[i] for i < valid, zero bytes for valid <= i < rows (padding rows of a
// batched GEMM). Rows are row_bytes long in both; a pure byte copy, so any element type works
// (all-zero bytes are +0 in every IEEE type). Copies 16-, 8-, 4- or 2-byte words, the widest
// that divides row_bytes and both base addresses.
cudaError_t launch_gather_rows(const void* src, const int32_t* idx, int64_t valid, int64_t rows,
                               int64_t row_bytes, void* buf, cudaStream_t stream);

// out row idx[i] += rows row i (converted to the accumulator type) for i < n, channels wide.
// No atomics: the caller guarantees that idx holds each row at most once per launch.
cudaError_t launch_scatter_add_rows(const void* rows, ScatterTypes types, const int32_t* idx, int64_t n,
                                    int64_t channels, void* out, cudaStream_t stream);

}  // namespace gather_scatter_kernels
}  // namespace torchsparse_pp
