// Launch template: grid, dynamic shared memory and launch of one kernel configuration.
// Included only by the generated instantiation files.
#pragma once

#include "kernel.cuh"

namespace torchsparse_pp {
namespace igemm {

// Dynamic shared memory beyond the default 48 KiB (which also covers the kernels' few bytes of
// static shared memory, hence the margin) needs an explicit opt-in.
template <typename Kernel>
cudaError_t allow_shared_bytes(Kernel kernel, size_t bytes) {
  constexpr size_t kDefaultDynamicLimit = 48 * 1024 - 1024;
  if (bytes <= kDefaultDynamicLimit) return cudaSuccess;
  return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes));
}

template <class Cfg>
cudaError_t launch_forward_config(const ForwardParams& p, cudaStream_t stream) {
  const int64_t slots = p.plan.order != nullptr ? p.plan.order_len : p.plan.num_rows;
  const dim3 grid(static_cast<unsigned>((slots + Cfg::kM - 1) / Cfg::kM),
                  static_cast<unsigned>((p.c_out + Cfg::kN - 1) / Cfg::kN), static_cast<unsigned>(p.plan.splits));
  if (grid.x == 0 || grid.y == 0 || grid.z == 0) return cudaSuccess;
  const size_t bytes = Cfg::shared_bytes(p.plan.K);
  const cudaError_t err = allow_shared_bytes(forward_kernel<Cfg>, bytes);
  if (err != cudaSuccess) return err;
  forward_kernel<Cfg><<<grid, Cfg::kThreads, bytes, stream>>>(p);
  return cudaGetLastError();
}

template <class Cfg>
cudaError_t launch_wgrad_config(const WgradParams& p, cudaStream_t stream) {
  const int64_t tiles_mn = int64_t((p.c_in + Cfg::kM - 1) / Cfg::kM) * ((p.c_out + Cfg::kN - 1) / Cfg::kN);
  const dim3 grid(static_cast<unsigned>(tiles_mn), static_cast<unsigned>(p.plan.K), static_cast<unsigned>(p.chunks));
  if (grid.x == 0 || grid.y == 0 || grid.z == 0) return cudaSuccess;
  const size_t bytes = Cfg::shared_bytes(p.tiles_per_chunk);
  const cudaError_t err = allow_shared_bytes(wgrad_kernel<Cfg>, bytes);
  if (err != cudaSuccess) return err;
  wgrad_kernel<Cfg><<<grid, Cfg::kThreads, bytes, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace igemm
}  // namespace torchsparse_pp
