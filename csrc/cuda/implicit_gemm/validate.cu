// Validation of a table and plan before the implicit-GEMM kernels follow them: the ops are
// public, and a bad index would fault while a plan that misses a neighbour would silently drop it.
#include "params.h"

namespace torchsparse_pp {
namespace igemm {

namespace {

__global__ void check_slots(const PlanView P, int64_t num_src, int32_t* row_counts, int32_t* flags) {
  const int64_t slots = P.order != nullptr ? P.order_len : P.num_rows;
  const int64_t total = slots * P.splits;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t split = i / slots, slot = i - split * slots;
    int64_t row = slot;
    if (P.order != nullptr) {
      row = P.order[i];
      if (row < -1 || row >= P.num_rows) {
        atomicAdd(&flags[1], 1);
        continue;
      }
      if (row < 0) continue;
      atomicAdd(&row_counts[split * P.num_rows + row], 1);
    }
    const int64_t k_begin = P.bounds[split], k_end = P.bounds[split + 1];
    const int64_t* mask = P.tile_masks + (split * P.tiles + slot / P.tile_rows) * P.words;
    const int32_t* entries = P.table + row * P.K;
    for (int64_t k = k_begin; k < k_end; ++k) {
      const int32_t v = entries[k];
      if (v < -1 || v >= num_src) {
        atomicAdd(&flags[0], 1);
      } else if (v >= 0) {
        const int64_t bit = k - k_begin;
        if (((static_cast<unsigned long long>(mask[bit / 64]) >> (bit % 64)) & 1ull) == 0) atomicAdd(&flags[2], 1);
      }
    }
  }
}

__global__ void check_row_counts(const int32_t* row_counts, int64_t total, int32_t* flags) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x)
    if (row_counts[i] != 1) atomicAdd(&flags[3], 1);
}

unsigned blocks_for(int64_t work, int threads) {
  const int64_t blocks = (work + threads - 1) / threads;
  return static_cast<unsigned>(blocks < 1 ? 1 : (blocks > 65535 ? 65535 : blocks));
}

}  // namespace

cudaError_t launch_validate_plan(const PlanView& plan, int64_t num_src, int32_t* row_counts, int32_t* flags,
                                 cudaStream_t stream) {
  constexpr int kThreads = 256;
  const int64_t slots = (plan.order != nullptr ? plan.order_len : plan.num_rows) * plan.splits;
  if (slots > 0) {
    check_slots<<<blocks_for(slots, kThreads), kThreads, 0, stream>>>(plan, num_src, row_counts, flags);
    const cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return err;
  }
  const int64_t counted = plan.order != nullptr ? plan.num_rows * plan.splits : 0;
  if (counted > 0) check_row_counts<<<blocks_for(counted, kThreads), kThreads, 0, stream>>>(row_counts, counted, flags);
  return cudaGetLastError();
}

}  // namespace igemm
}  // namespace torchsparse_pp
