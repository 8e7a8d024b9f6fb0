// Launch templates: grid and launch of one kernel configuration. Included only by the generated
// instantiation files. Shared memory is static, so a launch needs no attribute call first.
#pragma once

#include "kernel.cuh"

namespace torchsparse_pp {
namespace fod {

template <class Cfg>
cudaError_t launch_forward_atomic_config(const ForwardParams& p, cudaStream_t stream) {
  // At most ceil(pairs / M) + K tiles (each offset's last tile may be partial); CTAs past the
  // real count return at once. Sized from host-known numbers: no device read.
  const int64_t tiles = (p.pairs.num_pairs + Cfg::kM - 1) / Cfg::kM + p.pairs.K;
  const dim3 grid(static_cast<unsigned>(tiles), static_cast<unsigned>((p.c_out + Cfg::kN - 1) / Cfg::kN));
  if (p.pairs.num_pairs == 0 || grid.y == 0) return cudaSuccess;
  forward_atomic_kernel<Cfg><<<grid, Cfg::kThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

template <class Cfg>
cudaError_t launch_forward_owned_config(const ForwardParams& p, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>((p.num_dst + Cfg::kM - 1) / Cfg::kM),
                  static_cast<unsigned>((p.c_out + Cfg::kN - 1) / Cfg::kN));
  if (grid.x == 0 || grid.y == 0) return cudaSuccess;
  forward_owned_kernel<Cfg><<<grid, Cfg::kThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

template <class Cfg>
cudaError_t launch_wgrad_config(const WgradParams& p, cudaStream_t stream) {
  const int64_t tiles_mn = int64_t((p.c_in + Cfg::kM - 1) / Cfg::kM) * ((p.c_out + Cfg::kN - 1) / Cfg::kN);
  const dim3 grid(static_cast<unsigned>(tiles_mn), static_cast<unsigned>(p.pairs.K), static_cast<unsigned>(p.chunks));
  if (grid.x == 0 || grid.y == 0 || grid.z == 0) return cudaSuccess;
  wgrad_kernel<Cfg><<<grid, Cfg::kThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace fod
}  // namespace torchsparse_pp
