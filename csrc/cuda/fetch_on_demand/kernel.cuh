// The fetch-on-demand kernel templates: gather -> mma -> scatter over weight-stationary pairs,
// float (double for float64) accumulation, no gathered matrix ever in DRAM.
//
// forward_atomic_kernel: one fused launch over all offsets. CTA t finds its offset k from the
// prefix sum of the per-offset tile counts ceil(pairs_k / CTA_M) (one warp scans them, 32 offsets
// per step), takes CTA_M consecutive pairs of k, multiplies their gathered source rows by W[k]
// (CTA_K input channels per step, two cp.async stages) and adds the products into the
// destination rows with atomics.
//
// forward_owned_kernel (deterministic): a CTA owns CTA_M destination rows. The pairs of each
// offset ascend by destination, so a binary search per offset finds those that write the CTA's
// rows; the CTA adds the offsets in ascending order into its accumulators and stores each row
// once. Offsets are taken a window at a time (one search per thread), so shared memory does not
// grow with the kernel volume. The result does not depend on scheduling: run-to-run identical.
//
// wgrad_kernel: a CTA owns (CTA_M input channels) x (CTA_N output channels) of one offset and a
// contiguous chunk of its pairs; the reduction runs over pairs, CTA_K per step. Chunks write
// partials that the wrapper sums in chunk order (deterministic by construction).
#pragma once

#include "../gemm/tile_copy.cuh"
#include "../gemm/warp_math.cuh"
#include "params.h"

namespace torchsparse_pp {
namespace fod {

using gemm::compact_block;
using gemm::copy_gathered_tile;
using gemm::copy_piece;
using gemm::copy_weight_tile;
using gemm::from_acc;
using gemm::MmaHalf;
using gemm::MmaTF32;
using gemm::pad_kn;
using gemm::pad_mk;
using gemm::piece_elems;
using gemm::run_double_buffered;
using gemm::Simt;
using gemm::TilePieces;

constexpr int kStaticSharedBudget = 44 * 1024;  // below the 48 KiB static limit, with margin

// Forward kernels: A [M][K] gathered pair rows, B [K][N] weight slice, Out the stored type.
template <typename T_, class Math_, int CTA_M_, int CTA_N_, int CTA_K_, bool WIDE_, typename Out_>
struct ForwardConfig : gemm::ForwardTile<T_, Math_, CTA_M_, CTA_N_, CTA_K_, WIDE_, Out_> {
  using Tile = gemm::ForwardTile<T_, Math_, CTA_M_, CTA_N_, CTA_K_, WIDE_, Out_>;
  static constexpr int kTileBytes = 2 * (Tile::kM * Tile::kLda + Tile::kK * Tile::kLdb) * int(sizeof(T_));
  // Offsets per window of the owned-rows kernel: a [window][CTA_M] table of source rows.
  static constexpr int kWindowRaw = (kStaticSharedBudget - kTileBytes) / (Tile::kM * 4);
  static constexpr int kWindow = kWindowRaw > 32 ? 32 : (kWindowRaw < 1 ? 1 : kWindowRaw);
  static_assert(Tile::kThreads >= 32 && kWindow <= Tile::kThreads, "one window offset per thread");
};

template <class Cfg>
__global__ void __launch_bounds__(Cfg::kThreads) forward_atomic_kernel(const ForwardParams p) {
  using T = typename Cfg::T;
  using Out = typename Cfg::Out;  // the accumulator type, added into with atomics
  constexpr int M = Cfg::kM, N = Cfg::kN, KT = Cfg::kK, NT = Cfg::kThreads;
  constexpr int LDA = Cfg::kLda, LDB = Cfg::kLdb;
  using APieces = TilePieces<T, M, KT, NT>;

  __shared__ __align__(16) T As[2][M * LDA];
  __shared__ __align__(16) T Bs[2][KT * LDB];
  __shared__ int32_t src_rows[M];
  __shared__ int32_t dst_rows[M];
  __shared__ int tile_offset;
  __shared__ long long tile_first;

  const PairList& L = p.pairs;
  const int tid = threadIdx.x;
  const long long tile = blockIdx.x;
  const int n0 = blockIdx.y * N;

  // The offset owning this tile: tiles are numbered offset after offset, ceil(count_k / M) each.
  if (tid < 32) {
    const int lane = tid;
    long long before = 0;  // tiles of the offsets already scanned
    int found = -1;
    long long first = 0;
    for (int k0 = 0; k0 < L.K && before <= tile; k0 += 32) {
      const int k = k0 + lane;
      const long long begin = k < L.K ? L.offsets[k] : 0;
      const long long count = k < L.K ? L.offsets[k + 1] - begin : 0;
      const long long tiles = (count + M - 1) / M;
      long long inclusive = tiles;
#pragma unroll
      for (int d = 1; d < 32; d *= 2) {
        const long long up = __shfl_up_sync(0xffffffffu, inclusive, d);
        if (lane >= d) inclusive += up;
      }
      const long long start = before + inclusive - tiles;
      if (tile >= start && tile < start + tiles) {
        found = k;
        first = begin + (tile - start) * M;
      }
      before += __shfl_sync(0xffffffffu, inclusive, 31);
    }
    const unsigned hit = __ballot_sync(0xffffffffu, found >= 0);
    if (hit == 0) {
      if (lane == 0) tile_offset = -1;
    } else if (lane == __ffs(hit) - 1) {
      tile_offset = found;
      tile_first = first;
    }
  }
  __syncthreads();
  const int k = tile_offset;
  if (k < 0) return;  // the grid is sized by an upper bound on the tile count
  const long long first = tile_first, end = L.offsets[k + 1];
  for (int i = tid; i < M; i += NT) {
    const long long j = first + i;
    src_rows[i] = j < end ? L.src[j] : -1;
    dst_rows[i] = j < end ? L.dst[j] : -1;
  }
  __syncthreads();

  const T* const src = static_cast<const T*>(p.src_feats);
  const T* const w_k = static_cast<const T*>(p.weight) + int64_t(k) * p.c_in * p.c_out;
  int32_t a_src[APieces::kIters];
#pragma unroll
  for (int i = 0; i < APieces::kIters; ++i) a_src[i] = APieces::active(i) ? src_rows[APieces::row(i)] : -1;

  typename Cfg::Math math;
  math.zero();
  run_double_buffered(
      (p.c_in + KT - 1) / KT,
      [&](int stage, int step) {
        copy_gathered_tile<T, M, KT, NT, LDA, Cfg::kWide>(As[stage], a_src, src, p.c_in, step * KT);
        copy_weight_tile<T, KT, N, NT, LDB, Cfg::kWide>(Bs[stage], w_k, p.c_in, p.c_out, step * KT, n0);
      },
      [&](int stage) { math.compute(As[stage], LDA, Bs[stage], LDB); });

  Out* const out = static_cast<Out*>(p.out);
  math.for_each([&](int m, int n, typename Cfg::Math::Acc value) {
    const int32_t row = dst_rows[m];
    if (row >= 0 && n0 + n < p.c_out) atomicAdd(out + int64_t(row) * p.c_out + n0 + n, static_cast<Out>(value));
  });
}

// First j in [lo, hi) with dst[j] >= value (dst ascends there).
__device__ __forceinline__ long long lower_bound(const int32_t* dst, long long lo, long long hi, long long value) {
  while (lo < hi) {
    const long long mid = lo + (hi - lo) / 2;
    if (dst[mid] < value) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

template <class Cfg>
__global__ void __launch_bounds__(Cfg::kThreads) forward_owned_kernel(const ForwardParams p) {
  using T = typename Cfg::T;
  using Out = typename Cfg::Out;
  constexpr int M = Cfg::kM, N = Cfg::kN, KT = Cfg::kK, NT = Cfg::kThreads, W = Cfg::kWindow;
  constexpr int LDA = Cfg::kLda, LDB = Cfg::kLdb;
  using APieces = TilePieces<T, M, KT, NT>;

  __shared__ __align__(16) T As[2][M * LDA];
  __shared__ __align__(16) T Bs[2][KT * LDB];
  __shared__ int32_t row_src[W][M];  // source row per (window offset, CTA row), -1: none
  __shared__ long long pair_lo[W], pair_hi[W];
  __shared__ int window[NT];         // window slots (offset - window start) with pairs
  __shared__ int warp_totals[NT / 32];

  const PairList& L = p.pairs;
  const int tid = threadIdx.x;
  const long long r0 = (long long)blockIdx.x * M;
  const int n0 = blockIdx.y * N;
  const T* const src = static_cast<const T*>(p.src_feats);
  const T* const weight = static_cast<const T*>(p.weight);
  const int c_chunks = (p.c_in + KT - 1) / KT;

  int32_t a_src[APieces::kIters];
#pragma unroll
  for (int i = 0; i < APieces::kIters; ++i) a_src[i] = -1;
  int k_window = 0;  // first offset of the current window

  auto load_stage = [&](int stage, int step) {
    const int item = step / c_chunks;
    const int c0 = (step - item * c_chunks) * KT;
    if (c0 == 0) {
#pragma unroll
      for (int i = 0; i < APieces::kIters; ++i) a_src[i] = APieces::active(i) ? row_src[item][APieces::row(i)] : -1;
    }
    const int k = k_window + window[item];
    copy_gathered_tile<T, M, KT, NT, LDA, Cfg::kWide>(As[stage], a_src, src, p.c_in, c0);
    copy_weight_tile<T, KT, N, NT, LDB, Cfg::kWide>(Bs[stage], weight + int64_t(k) * p.c_in * p.c_out, p.c_in,
                                                    p.c_out, c0, n0);
  };

  typename Cfg::Math math;
  math.zero();
  for (k_window = 0; k_window < L.K; k_window += W) {
    // Each of the window's offsets: its pairs that write rows [r0, r0 + M), one search per thread.
    const int k = k_window + tid;
    bool has_pairs = false;
    if (tid < W && k < L.K) {
      const long long begin = L.offsets[k], end = L.offsets[k + 1];
      const long long lo = lower_bound(L.dst, begin, end, r0);
      const long long hi = lower_bound(L.dst, lo, end, r0 + M);
      pair_lo[tid] = lo;
      pair_hi[tid] = hi;
      has_pairs = hi > lo;
    }
    const int count = compact_block<NT>(has_pairs, tid, window, warp_totals);
    for (int i = tid; i < count * M; i += NT) row_src[i / M][i % M] = -1;
    __syncthreads();
    for (int item = 0; item < count; ++item) {
      const int slot = window[item];
      for (long long j = pair_lo[slot] + tid; j < pair_hi[slot]; j += NT) {
        const long long r = L.dst[j] - r0;
        if (r >= 0 && r < M) row_src[item][r] = L.src[j];  // in range for sorted pairs; guards others
      }
    }
    __syncthreads();
    // Offsets in ascending order, channels in ascending order: a fixed summation order.
    run_double_buffered(count * c_chunks, load_stage,
                        [&](int stage) { math.compute(As[stage], LDA, Bs[stage], LDB); });
  }

  // Every row of the CTA is written, zeros included: the output needs no memset.
  Out* const out = static_cast<Out*>(p.out);
  math.for_each([&](int m, int n, typename Cfg::Math::Acc value) {
    if (r0 + m < p.num_dst && n0 + n < p.c_out) out[(r0 + m) * p.c_out + n0 + n] = from_acc<Out>(value);
  });
}

// Weight gradient: A [K][M] = feats rows of the step's pairs (input channels m0..), B [K][N] =
// grad rows of the same pairs (output channels n0..).
template <typename T_, class Math_, int CTA_M_, int CTA_N_, int CTA_K_, bool WIDE_>
struct WgradConfig : gemm::WgradTile<T_, Math_, CTA_M_, CTA_N_, CTA_K_, WIDE_> {};  // named: ptxas_report groups by it

template <class Cfg>
__global__ void __launch_bounds__(Cfg::kThreads) wgrad_kernel(const WgradParams p) {
  using T = typename Cfg::T;
  constexpr int M = Cfg::kM, N = Cfg::kN, KT = Cfg::kK, NT = Cfg::kThreads;
  constexpr int LDA = Cfg::kLda, LDB = Cfg::kLdb;
  using APieces = TilePieces<T, KT, M, NT>;
  using BPieces = TilePieces<T, KT, N, NT>;

  __shared__ __align__(16) T As[2][KT * LDA];
  __shared__ __align__(16) T Bs[2][KT * LDB];

  const PairList& L = p.pairs;
  const int tiles_n = (p.c_out + N - 1) / N;
  const int m0 = (blockIdx.x / tiles_n) * M;
  const int n0 = (blockIdx.x % tiles_n) * N;
  const int k = blockIdx.y;
  const int chunk = blockIdx.z;
  const long long begin = L.offsets[k], count = L.offsets[k + 1] - begin;
  const long long lo = begin + count * chunk / p.chunks, hi = begin + count * (chunk + 1) / p.chunks;
  const T* const feats = static_cast<const T*>(p.feats);
  const T* const grad = static_cast<const T*>(p.grad);

  auto load_stage = [&](int stage, int step) {
    const long long j0 = lo + (long long)step * KT;
#pragma unroll
    for (int i = 0; i < APieces::kIters; ++i) {
      if (!APieces::active(i)) continue;
      const int r = APieces::row(i), c = APieces::col(i);
      const bool ok = j0 + r < hi;
      const T* row = ok ? feats + int64_t(L.src[j0 + r]) * p.c_in + m0 : feats;
      copy_piece<T, Cfg::kWide>(As[stage] + r * LDA + c, row, ok, c, p.c_in - m0, feats);
    }
#pragma unroll
    for (int i = 0; i < BPieces::kIters; ++i) {
      if (!BPieces::active(i)) continue;
      const int r = BPieces::row(i), n = BPieces::col(i);
      const bool ok = j0 + r < hi;
      const T* row = ok ? grad + int64_t(L.dst[j0 + r]) * p.c_out + n0 : grad;
      copy_piece<T, Cfg::kWide>(Bs[stage] + r * LDB + n, row, ok, n, p.c_out - n0, grad);
    }
  };

  typename Cfg::Math math;
  math.zero();
  run_double_buffered(static_cast<int>((hi - lo + KT - 1) / KT), load_stage,
                      [&](int stage) { math.compute(As[stage], LDA, Bs[stage], LDB); });

  using Acc = typename Cfg::Math::Acc;
  Acc* const out = static_cast<Acc*>(p.partial) + ((long long)chunk * L.K + k) * p.c_in * p.c_out;
  math.for_each([&](int m, int n, Acc value) {
    if (m0 + m < p.c_in && n0 + n < p.c_out) out[int64_t(m0 + m) * p.c_out + n0 + n] = value;
  });
}

}  // namespace fod
}  // namespace torchsparse_pp
