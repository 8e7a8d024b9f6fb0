// Launch helpers shared by the kernel-map kernels (included by .cu files only; ATen-free).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace torchsparse_pp {
namespace kmap_kernels {

constexpr int kThreads = 256;

// Blocks for a grid-stride loop over n items; the cap keeps the grid legal, the loop covers the rest.
inline unsigned grid_for(int64_t n) {
  const int64_t blocks = (n + kThreads - 1) / kThreads;
  constexpr int64_t kMaxBlocks = int64_t(1) << 20;
  return static_cast<unsigned>(blocks < kMaxBlocks ? blocks : kMaxBlocks);
}

// Every index in [0, n) once across the grid, in 64-bit (n may exceed 2^31).
#define TSPP_GRID_LOOP(i, n)                                                         \
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < (n); \
       i += static_cast<int64_t>(blockDim.x) * gridDim.x)

}  // namespace kmap_kernels
}  // namespace torchsparse_pp
