// Launch template: grid and launch of one kernel configuration. Included only by the generated
// instantiation files. Shared memory is static, so a launch needs no attribute call first.
#pragma once

#include "kernel.cuh"

namespace torchsparse_pp {
namespace igemm {

template <class Cfg>
cudaError_t launch_forward_config(const ForwardParams& p, cudaStream_t stream) {
  const int64_t slots = p.plan.order != nullptr ? p.plan.order_len : p.plan.num_rows;
  const dim3 grid(static_cast<unsigned>((slots + Cfg::kM - 1) / Cfg::kM),
                  static_cast<unsigned>((p.c_out + Cfg::kN - 1) / Cfg::kN), static_cast<unsigned>(p.plan.splits));
  if (grid.x == 0 || grid.y == 0 || grid.z == 0) return cudaSuccess;
  forward_kernel<Cfg><<<grid, Cfg::kThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

template <class Cfg>
cudaError_t launch_wgrad_config(const WgradParams& p, cudaStream_t stream) {
  const int64_t tiles_mn = int64_t((p.c_in + Cfg::kM - 1) / Cfg::kM) * ((p.c_out + Cfg::kN - 1) / Cfg::kN);
  const dim3 grid(static_cast<unsigned>(tiles_mn), static_cast<unsigned>(p.plan.K), static_cast<unsigned>(p.chunks));
  if (grid.x == 0 || grid.y == 0 || grid.z == 0) return cudaSuccess;
  wgrad_kernel<Cfg><<<grid, Cfg::kThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace igemm
}  // namespace torchsparse_pp
