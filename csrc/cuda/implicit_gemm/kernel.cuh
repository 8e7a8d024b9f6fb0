// The implicit-GEMM kernel template: a GEMM whose A operand is gathered through the kernel map.
//
// Forward (and dgrad, with the transposed table and W^T): a CTA owns CTA_M destination rows
// (row slots of the plan, possibly reordered by bitmask) and CTA_N output channels. It walks
// K = (offsets present in its rows) x C_in in CTA_K steps: A rows come from the source rows the
// table names (zeros where there is none), B is a dense slice of the weight. Two shared-memory
// stages; stage s+1 is copied with cp.async while stage s multiplies.
//
// Weight gradient: a CTA owns (CTA_M input channels) x (CTA_N output channels) of one offset and
// a chunk of plan tiles; its reduction dimension is rows, CTA_K per step. Tiles whose mask lacks
// the offset are skipped. Chunks write float partials that the wrapper sums in a fixed order.
#pragma once

#include "params.h"
#include "../gemm/primitives.cuh"
#include "../gemm/warp_math.cuh"

namespace torchsparse_pp {
namespace igemm {

// Row padding of shared tiles, in elements. Rows stay 16-byte aligned for cp.async; A rows read
// by ldmatrix / TF32 fragments ([m][k]) are padded by 16 bytes, [k][n] rows by 8 elements of
// 2- and 4-byte types, which spreads the fragment reads of a warp over all 32 banks.
template <typename T>
constexpr int pad_mk() { return 16 / int(sizeof(T)); }
template <typename T>
constexpr int pad_kn() { return sizeof(T) == 8 ? 2 : 8; }

// One VEC-element copy into shared memory; `valid == false` writes zeros. 16-bit types copied
// one element at a time cannot use cp.async (4-byte minimum) and take a plain load and store.
template <typename T, int VEC>
__device__ __forceinline__ void copy_vector(T* dst, const T* src, bool valid, const T* any_valid_address) {
  constexpr int kBytes = VEC * int(sizeof(T));
  if constexpr (kBytes >= 4) {
    cp_async<kBytes>(dst, valid ? src : any_valid_address, valid ? kBytes : 0);
  } else {
    dst[0] = valid ? src[0] : zero_value<T>();
  }
}

// Runs `steps` (copy, multiply) steps through two shared-memory stages: the copy of step s + 1
// is in flight while step s multiplies. load_stage(stage, step) issues the copies (cp.async or
// plain stores); compute_stage(stage) reads a completed stage.
template <typename Load, typename Compute>
__device__ __forceinline__ void run_double_buffered(int steps, Load&& load_stage, Compute&& compute_stage) {
  if (steps > 0) {
    load_stage(0, 0);
    cp_async_commit();
  }
  for (int s = 0; s < steps; ++s) {
    if (s + 1 < steps) {
      load_stage((s + 1) & 1, s + 1);
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    compute_stage(s & 1);
    __syncthreads();  // the next copy overwrites this stage
  }
}

template <typename T_, class Math_, int CTA_M_, int CTA_N_, int CTA_K_, int VEC_, typename Out_>
struct ForwardConfig {
  using T = T_;
  using Math = Math_;
  using Out = Out_;
  static constexpr int kM = CTA_M_, kN = CTA_N_, kK = CTA_K_, kVec = VEC_;
  static constexpr int kThreads = Math::kThreads;
  static constexpr int kLda = kK + pad_mk<T>();  // A: [M][K]
  static constexpr int kLdb = kN + pad_kn<T>();  // B: [K][N]
  static constexpr int kStageElems = kM * kLda + kK * kLdb;
  static_assert(kK % kVec == 0 && kN % kVec == 0, "vectors must not straddle tile rows");

  static size_t shared_bytes(int K) {
    return 2 * size_t(kStageElems) * sizeof(T) + size_t(kM) * sizeof(int32_t) + size_t(K) * sizeof(int32_t);
  }
};

template <class Cfg>
__global__ void __launch_bounds__(Cfg::kThreads) forward_kernel(const ForwardParams p) {
  using T = typename Cfg::T;
  using Out = typename Cfg::Out;
  constexpr int M = Cfg::kM, N = Cfg::kN, KT = Cfg::kK, VEC = Cfg::kVec, NT = Cfg::kThreads;
  constexpr int LDA = Cfg::kLda, LDB = Cfg::kLdb;
  // Per-thread shares of the A ([M][KT]) and B ([KT][N]) copies; fixed for the whole kernel.
  constexpr int A_VPR = KT / VEC, A_TOTAL = M * A_VPR, A_ITERS = (A_TOTAL + NT - 1) / NT;
  constexpr int B_VPR = N / VEC, B_TOTAL = KT * B_VPR, B_ITERS = (B_TOTAL + NT - 1) / NT;

  extern __shared__ __align__(16) unsigned char shared_raw[];
  T* const As = reinterpret_cast<T*>(shared_raw);
  T* const Bs = As + 2 * M * LDA;
  int32_t* const rows = reinterpret_cast<int32_t*>(Bs + 2 * KT * LDB);
  int32_t* const offsets = rows + M;
  __shared__ int num_offsets;

  const PlanView& P = p.plan;
  const int tid = threadIdx.x;
  const int split = blockIdx.z;
  const int64_t slot0 = int64_t(blockIdx.x) * M;
  const int n0 = blockIdx.y * N;
  const int K = P.K;
  const int k_begin = static_cast<int>(P.bounds[split]);
  const int k_end = static_cast<int>(P.bounds[split + 1]);
  const T* const src = static_cast<const T*>(p.src);
  const T* const weight = static_cast<const T*>(p.weight);

  // Destination row of each slot of this CTA (-1: padding).
  for (int i = tid; i < M; i += NT) {
    const int64_t slot = slot0 + i;
    int32_t row = -1;
    if (P.order != nullptr) {
      if (slot < P.order_len) row = P.order[int64_t(split) * P.order_len + slot];
    } else if (slot < P.num_rows) {
      row = static_cast<int32_t>(slot);
    }
    rows[i] = row;
  }
  // Offsets of this split that any row of the CTA has: the OR of its plan tiles' masks.
  if (tid == 0) {
    int count = 0;
    const int64_t t_begin = slot0 / P.tile_rows;
    const int64_t t_end = min((slot0 + M - 1) / P.tile_rows + 1, int64_t(P.tiles));
    const int64_t* masks = P.tile_masks + int64_t(split) * P.tiles * P.words;
    for (int w = 0; w < P.words; ++w) {
      unsigned long long bits = 0;
      for (int64_t t = t_begin; t < t_end; ++t) bits |= static_cast<unsigned long long>(masks[t * P.words + w]);
      while (bits != 0) {
        const int k = k_begin + w * 64 + (__ffsll(static_cast<long long>(bits)) - 1);
        bits &= bits - 1;
        if (k < k_end) offsets[count++] = k;
      }
    }
    num_offsets = count;
  }
  __syncthreads();

  const int c_chunks = (p.c_in + KT - 1) / KT;
  const int steps = num_offsets * c_chunks;
  // Element offset of the source row each of this thread's A vectors reads for the current
  // offset (-1: none). Refreshed once per offset, so the per-step address is one add.
  int64_t a_row[A_ITERS];

  auto load_stage = [&](int stage, int step) {
    const int oi = step / c_chunks;
    const int c0 = (step - oi * c_chunks) * KT;
    const int k = offsets[oi];
    if (c0 == 0) {
#pragma unroll
      for (int i = 0; i < A_ITERS; ++i) {
        const int v = tid + i * NT;
        a_row[i] = -1;
        if (v < A_TOTAL) {
          const int32_t row = rows[v / A_VPR];
          const int32_t nbr = row >= 0 ? P.table[int64_t(row) * K + k] : -1;
          if (nbr >= 0) a_row[i] = int64_t(nbr) * p.c_in;
        }
      }
    }
    T* const as = As + stage * M * LDA;
#pragma unroll
    for (int i = 0; i < A_ITERS; ++i) {
      const int v = tid + i * NT;
      if (A_TOTAL % NT == 0 || v < A_TOTAL) {
        const int r = v / A_VPR, c = (v % A_VPR) * VEC;
        const bool ok = a_row[i] >= 0 && c0 + c < p.c_in;
        copy_vector<T, VEC>(as + r * LDA + c, src + (ok ? a_row[i] + c0 + c : 0), ok, src);
      }
    }
    T* const bs = Bs + stage * KT * LDB;
    const T* const w_k = weight + int64_t(k) * p.c_in * p.c_out;
#pragma unroll
    for (int i = 0; i < B_ITERS; ++i) {
      const int v = tid + i * NT;
      if (B_TOTAL % NT == 0 || v < B_TOTAL) {
        const int kk = v / B_VPR, n = (v % B_VPR) * VEC;
        const bool ok = c0 + kk < p.c_in && n0 + n < p.c_out;
        copy_vector<T, VEC>(bs + kk * LDB + n, w_k + (ok ? int64_t(c0 + kk) * p.c_out + n0 + n : 0), ok, weight);
      }
    }
  };

  typename Cfg::Math math;
  math.zero();
  run_double_buffered(steps, load_stage,
                      [&](int stage) { math.compute(As + stage * M * LDA, LDA, Bs + stage * KT * LDB, LDB); });

  // Every row slot of the CTA is written, zeros included, so the output needs no memset.
  Out* const out = static_cast<Out*>(p.out) + int64_t(split) * P.num_rows * p.c_out;
  math.for_each([&](int m, int n, typename Cfg::Math::Acc value) {
    const int32_t row = rows[m];
    if (row >= 0 && row < P.num_rows && n0 + n < p.c_out)
      out[int64_t(row) * p.c_out + n0 + n] = from_acc<Out>(value);
  });
}

template <typename T_, class Math_, int CTA_M_, int CTA_N_, int CTA_K_, int VEC_>
struct WgradConfig {
  using T = T_;
  using Math = Math_;
  static constexpr int kM = CTA_M_, kN = CTA_N_, kK = CTA_K_, kVec = VEC_;
  static constexpr int kThreads = Math::kThreads;
  static constexpr int kLda = kM + pad_kn<T>();  // A stored [K][M] (rows x input channels)
  static constexpr int kLdb = kN + pad_kn<T>();  // B: [K][N] (rows x output channels)
  static constexpr int kStageElems = kK * kLda + kK * kLdb;
  static_assert(kM % kVec == 0 && kN % kVec == 0, "vectors must not straddle tile rows");

  static size_t shared_bytes(int tiles_per_chunk) {
    return 2 * size_t(kStageElems) * sizeof(T) + size_t(tiles_per_chunk) * sizeof(int32_t);
  }
};

template <class Cfg>
__global__ void __launch_bounds__(Cfg::kThreads) wgrad_kernel(const WgradParams p) {
  using T = typename Cfg::T;
  constexpr int M = Cfg::kM, N = Cfg::kN, KT = Cfg::kK, VEC = Cfg::kVec, NT = Cfg::kThreads;
  constexpr int LDA = Cfg::kLda, LDB = Cfg::kLdb;
  constexpr int A_VPR = M / VEC, A_TOTAL = KT * A_VPR, A_ITERS = (A_TOTAL + NT - 1) / NT;
  constexpr int B_VPR = N / VEC, B_TOTAL = KT * B_VPR, B_ITERS = (B_TOTAL + NT - 1) / NT;

  extern __shared__ __align__(16) unsigned char shared_raw[];
  T* const As = reinterpret_cast<T*>(shared_raw);
  T* const Bs = As + 2 * KT * LDA;
  int32_t* const tiles = reinterpret_cast<int32_t*>(Bs + 2 * KT * LDB);
  __shared__ int num_tiles;

  const PlanView& P = p.plan;
  const int tid = threadIdx.x;
  const int tiles_n = (p.c_out + N - 1) / N;
  const int m0 = (blockIdx.x / tiles_n) * M;
  const int n0 = (blockIdx.x % tiles_n) * N;
  const int k = blockIdx.y;
  const int chunk = blockIdx.z;
  const int K = P.K;
  int split = 0;
  while (split + 1 < P.splits && P.bounds[split + 1] <= k) ++split;
  const int bit = k - static_cast<int>(P.bounds[split]);
  const T* const src = static_cast<const T*>(p.src);
  const T* const grad = static_cast<const T*>(p.grad);

  // Plan tiles of this chunk in which some row has offset k.
  if (tid == 0) {
    int count = 0;
    const int64_t* masks = P.tile_masks + int64_t(split) * P.tiles * P.words + bit / 64;
    const int t_begin = chunk * p.tiles_per_chunk;
    const int t_end = min(t_begin + p.tiles_per_chunk, P.tiles);
    for (int t = t_begin; t < t_end; ++t)
      if ((static_cast<unsigned long long>(masks[int64_t(t) * P.words]) >> (bit % 64)) & 1ull) tiles[count++] = t;
    num_tiles = count;
  }
  __syncthreads();

  const int steps_per_tile = P.tile_rows / KT;
  const int steps = num_tiles * steps_per_tile;

  auto load_stage = [&](int stage, int step) {
    const int ti = step / steps_per_tile;
    const int64_t slot0 = int64_t(tiles[ti]) * P.tile_rows + (step - ti * steps_per_tile) * KT;
    T* const as = As + stage * KT * LDA;
#pragma unroll
    for (int i = 0; i < A_ITERS; ++i) {
      const int v = tid + i * NT;
      if (A_TOTAL % NT == 0 || v < A_TOTAL) {
        const int r = v / A_VPR, c = (v % A_VPR) * VEC;
        const int64_t slot = slot0 + r;
        const int32_t row = P.order != nullptr ? P.order[int64_t(split) * P.order_len + slot]
                                               : (slot < P.num_rows ? static_cast<int32_t>(slot) : -1);
        const int32_t nbr = row >= 0 ? P.table[int64_t(row) * K + k] : -1;
        const bool ok = nbr >= 0 && m0 + c < p.c_in;
        copy_vector<T, VEC>(as + r * LDA + c, src + (ok ? int64_t(nbr) * p.c_in + m0 + c : 0), ok, src);
      }
    }
    T* const bs = Bs + stage * KT * LDB;
#pragma unroll
    for (int i = 0; i < B_ITERS; ++i) {
      const int v = tid + i * NT;
      if (B_TOTAL % NT == 0 || v < B_TOTAL) {
        const int r = v / B_VPR, n = (v % B_VPR) * VEC;
        const int64_t slot = slot0 + r;
        const int32_t row = P.order != nullptr ? P.order[int64_t(split) * P.order_len + slot]
                                               : (slot < P.num_rows ? static_cast<int32_t>(slot) : -1);
        const bool ok = row >= 0 && n0 + n < p.c_out;
        copy_vector<T, VEC>(bs + r * LDB + n, grad + (ok ? int64_t(row) * p.c_out + n0 + n : 0), ok, grad);
      }
    }
  };

  typename Cfg::Math math;
  math.zero();
  run_double_buffered(steps, load_stage,
                      [&](int stage) { math.compute(As + stage * KT * LDA, LDA, Bs + stage * KT * LDB, LDB); });

  using Acc = typename Cfg::Math::Acc;
  Acc* const out = static_cast<Acc*>(p.partial) + (int64_t(chunk) * K + k) * p.c_in * p.c_out;
  math.for_each([&](int m, int n, Acc value) {
    if (m0 + m < p.c_in && n0 + n < p.c_out) out[int64_t(m0 + m) * p.c_out + n0 + n] = value;
  });
}

}  // namespace igemm
}  // namespace torchsparse_pp
