// Strided and generative kernel maps on the GPU: per-tap reach, key enumeration, map fill.
#include "kmap_strided.h"

#include "../common/coords.h"
#include "kmap_launch.h"

namespace torchsparse_pp {
namespace kmap_kernels {

namespace {

using ull = unsigned long long;

// The coordinate that p reaches on axis a through tap t, if any (same formulas as the CPU's
// AxisRule: (p + pad - t*d) must be a multiple of s for kReadBy).
__device__ __forceinline__ bool axis_reach(const ReachRule& r, int a, int64_t p, int64_t t, int64_t* q) {
  int64_t v;
  if (r.rel == Relation::kFloor) {
    v = floor_div(p, r.s[a]);
  } else if (r.rel == Relation::kWrites) {
    v = p * r.s[a] - r.pad[a] + t * r.d[a];
  } else {
    const int64_t num = p + r.pad[a] - t * r.d[a];
    if (num % r.s[a] != 0) return false;
    v = num / r.s[a];  // exact
  }
  if (r.range[a] >= 0 && (v < 0 || v >= r.range[a])) return false;
  *q = v;
  return true;
}

__device__ __forceinline__ int64_t axis_count(const ReachRule& r, int a, int64_t p) {
  int64_t n = 0, q;
  for (int64_t t = 0; t < r.taps[a]; ++t) n += axis_reach(r, a, p, t, &q);
  return n;
}

// Index of key in sorted unique keys[0, m), or -1.
__device__ __forceinline__ int64_t find_sorted(const int64_t* keys, int64_t m, int64_t key) {
  int64_t lo = 0, hi = m;
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (keys[mid] < key) lo = mid + 1;
    else hi = mid;
  }
  return lo < m && keys[lo] == key ? lo : -1;
}

__global__ void reach_counts_kernel(const int32_t* coords, int64_t n, ReachRule rule, int64_t* counts) {
  TSPP_GRID_LOOP(i, n) {
    const int32_t* c = coords + 4 * i;
    counts[i] = axis_count(rule, 0, c[1]) * axis_count(rule, 1, c[2]) * axis_count(rule, 2, c[3]);
  }
}

__global__ void reach_keys_kernel(const int32_t* coords, int64_t n, ReachRule rule, const int64_t* starts,
                                  int64_t* keys, int64_t* bad_row) {
  TSPP_GRID_LOOP(i, n) {
    const int32_t* c = coords + 4 * i;
    const int64_t b = c[0];
    int64_t pos = starts[i];
    bool bad = false;
    int64_t qx, qy, qz;
    for (int64_t tx = 0; tx < rule.taps[0]; ++tx) {
      if (!axis_reach(rule, 0, c[1], tx, &qx)) continue;
      for (int64_t ty = 0; ty < rule.taps[1]; ++ty) {
        if (!axis_reach(rule, 1, c[2], ty, &qy)) continue;
        for (int64_t tz = 0; tz < rule.taps[2]; ++tz) {
          if (!axis_reach(rule, 2, c[3], tz, &qz)) continue;
          const bool ok = coord_in_range(b, qx, qy, qz);
          bad |= !ok;
          keys[pos++] = ok ? pack_coord(b, qx, qy, qz) : kEmptyKey;
        }
      }
    }
    if (bad) atomicMin(reinterpret_cast<ull*>(bad_row), static_cast<ull>(i));
  }
}

__global__ void unpack_keys_kernel(const int64_t* keys, int64_t m, int32_t* coords) {
  TSPP_GRID_LOOP(i, m) { unpack_coord(keys[i], coords + 4 * i); }
}

__global__ void reach_fill_kernel(const int32_t* coords, int64_t n, ReachRule rule, const int64_t* sorted_keys,
                                  int64_t m, FillMode mode, int32_t* out_in, int64_t* flag) {
  const int64_t K = rule.taps[0] * rule.taps[1] * rule.taps[2];
  TSPP_GRID_LOOP(e, n * K) {
    const int64_t p = e / K, k = e % K;
    const int64_t tx = k / (rule.taps[1] * rule.taps[2]), ty = (k / rule.taps[2]) % rule.taps[1],
                  tz = k % rule.taps[2];
    const int32_t* c = coords + 4 * p;
    int64_t qx, qy, qz;
    if (!axis_reach(rule, 0, c[1], tx, &qx) || !axis_reach(rule, 1, c[2], ty, &qy) ||
        !axis_reach(rule, 2, c[3], tz, &qz) || !coord_in_range(c[0], qx, qy, qz))
      continue;
    const int64_t f = find_sorted(sorted_keys, m, pack_coord(c[0], qx, qy, qz));
    if (f < 0) continue;
    int32_t* cell = out_in + f * K + k;
    switch (mode) {
      case FillMode::kClaim:
        if (atomicCAS(cell, -1, static_cast<int32_t>(p)) != -1) *flag = 1;
        break;
      case FillMode::kClaimMin:
        atomicMin(cell, static_cast<int32_t>(p));
        break;
      case FillMode::kSecondClaim:
        if (*cell < p) atomicMin(reinterpret_cast<ull*>(flag), static_cast<ull>(p));
        break;
      case FillMode::kRowOfInput:
        out_in[p * K + k] = static_cast<int32_t>(f);
        break;
    }
  }
}

}  // namespace

cudaError_t reach_counts(const int32_t* coords, int64_t n, ReachRule rule, int64_t* counts,
                         cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  reach_counts_kernel<<<grid_for(n), kThreads, 0, stream>>>(coords, n, rule, counts);
  return cudaGetLastError();
}

cudaError_t reach_keys(const int32_t* coords, int64_t n, ReachRule rule, const int64_t* starts,
                       int64_t* keys, int64_t* bad_row, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  reach_keys_kernel<<<grid_for(n), kThreads, 0, stream>>>(coords, n, rule, starts, keys, bad_row);
  return cudaGetLastError();
}

cudaError_t unpack_keys(const int64_t* keys, int64_t m, int32_t* coords, cudaStream_t stream) {
  if (m <= 0) return cudaSuccess;
  unpack_keys_kernel<<<grid_for(m), kThreads, 0, stream>>>(keys, m, coords);
  return cudaGetLastError();
}

cudaError_t reach_fill(const int32_t* coords, int64_t n, ReachRule rule, const int64_t* sorted_keys,
                       int64_t m, FillMode mode, int32_t* out_in, int64_t* flag, cudaStream_t stream) {
  const int64_t cells = n * rule.taps[0] * rule.taps[1] * rule.taps[2];
  if (cells <= 0 || m <= 0) return cudaSuccess;
  reach_fill_kernel<<<grid_for(cells), kThreads, 0, stream>>>(coords, n, rule, sorted_keys, m, mode,
                                                              out_in, flag);
  return cudaGetLastError();
}

}  // namespace kmap_kernels
}  // namespace torchsparse_pp
