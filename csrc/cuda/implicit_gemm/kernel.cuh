// The implicit-GEMM kernel template: a GEMM whose A operand is gathered through the kernel map.
//
// Forward (and dgrad, with the transposed table and W^T): a CTA owns CTA_M destination rows
// (row slots of the plan, possibly reordered by bitmask) and CTA_N output channels. It walks
// K = (offsets present in its rows) x C_in in CTA_K steps: A rows come from the source rows the
// table names (zeros where there is none), B is a dense slice of the weight. Two shared-memory
// stages; stage s+1 is copied with cp.async while stage s multiplies. The present offsets are
// listed 64 at a time (one mask word), so shared memory does not grow with the kernel volume.
//
// Weight gradient: a CTA owns (CTA_M input channels) x (CTA_N output channels) of one offset and
// a chunk of plan tiles; its reduction dimension is rows, CTA_K per step. The CTA lists the tiles
// whose mask has the offset CTA-threads at a time (a block-wide compaction) and skips the rest.
// Chunks write float partials that the wrapper sums in a fixed order.
//
// All shared memory is static: ptxas reports it and `make cuda-check` bounds it per kernel.
#pragma once

#include "../gemm/tile_copy.cuh"
#include "../gemm/warp_math.cuh"
#include "params.h"

namespace torchsparse_pp {
namespace igemm {

using gemm::compact_block;
using gemm::copy_piece;
using gemm::from_acc;
using gemm::MmaHalf;
using gemm::MmaTF32;
using gemm::pad_kn;
using gemm::pad_mk;
using gemm::piece_elems;
using gemm::run_double_buffered;
using gemm::Simt;

template <typename T_, class Math_, int CTA_M_, int CTA_N_, int CTA_K_, bool WIDE_, typename Out_>
struct ForwardConfig : gemm::ForwardTile<T_, Math_, CTA_M_, CTA_N_, CTA_K_, WIDE_, Out_> {
  static_assert(Math_::kThreads >= 64, "one thread per offset of a 64-bit mask word");
};

template <class Cfg>
__global__ void __launch_bounds__(Cfg::kThreads) forward_kernel(const ForwardParams p) {
  using T = typename Cfg::T;
  using Out = typename Cfg::Out;
  constexpr int M = Cfg::kM, N = Cfg::kN, KT = Cfg::kK, NT = Cfg::kThreads;
  constexpr int LDA = Cfg::kLda, LDB = Cfg::kLdb;
  // This thread's 16-byte pieces of the A tile ([M][KT]); fixed for the whole kernel.
  using APieces = gemm::TilePieces<T, M, KT, NT>;

  __shared__ __align__(16) T As[2][M * LDA];
  __shared__ __align__(16) T Bs[2][KT * LDB];
  __shared__ int32_t rows[M];
  __shared__ int offsets[64];
  __shared__ int warp_totals[NT / 32];

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
  __syncthreads();

  const int c_chunks = (p.c_in + KT - 1) / KT;
  // Source row of each of this thread's A pieces for the current offset (-1: none), refreshed
  // once per offset: a 32-bit index, the 64-bit address is formed at the copy.
  int32_t a_src[APieces::kIters];
#pragma unroll
  for (int i = 0; i < APieces::kIters; ++i) a_src[i] = -1;

  auto load_stage = [&](int stage, int step) {
    const int oi = step / c_chunks;
    const int c0 = (step - oi * c_chunks) * KT;
    const int k = offsets[oi];
    if (c0 == 0) {
#pragma unroll
      for (int i = 0; i < APieces::kIters; ++i) {
        const int32_t row = APieces::active(i) ? rows[APieces::row(i)] : -1;
        a_src[i] = row >= 0 ? P.table[int64_t(row) * K + k] : -1;
      }
    }
    gemm::copy_gathered_tile<T, M, KT, NT, LDA, Cfg::kWide>(As[stage], a_src, src, p.c_in, c0);
    gemm::copy_weight_tile<T, KT, N, NT, LDB, Cfg::kWide>(Bs[stage], weight + int64_t(k) * p.c_in * p.c_out, p.c_in,
                                                          p.c_out, c0, n0);
  };

  typename Cfg::Math math;
  math.zero();
  // The offsets of this split that any row of the CTA has (the OR of its plan tiles' masks),
  // one 64-bit mask word at a time.
  const int64_t t_begin = slot0 / P.tile_rows;
  const int64_t t_end = min((slot0 + M - 1) / P.tile_rows + 1, int64_t(P.tiles));
  const int64_t* masks = P.tile_masks + int64_t(split) * P.tiles * P.words;
  for (int w = 0; w < P.words; ++w) {
    unsigned long long bits = 0;
    for (int64_t t = t_begin; t < t_end; ++t) bits |= static_cast<unsigned long long>(masks[t * P.words + w]);
    const int k = k_begin + w * 64 + tid;
    const bool present = tid < 64 && ((bits >> tid) & 1ull) != 0 && k < k_end;
    const int count = compact_block<NT>(present, k, offsets, warp_totals);
    run_double_buffered(count * c_chunks, load_stage,
                        [&](int stage) { math.compute(As[stage], LDA, Bs[stage], LDB); });
  }

  // Every row slot of the CTA is written, zeros included, so the output needs no memset.
  Out* const out = static_cast<Out*>(p.out) + int64_t(split) * P.num_rows * p.c_out;
  math.for_each([&](int m, int n, typename Cfg::Math::Acc value) {
    const int32_t row = rows[m];
    if (row >= 0 && row < P.num_rows && n0 + n < p.c_out)
      out[int64_t(row) * p.c_out + n0 + n] = from_acc<Out>(value);
  });
}

template <typename T_, class Math_, int CTA_M_, int CTA_N_, int CTA_K_, bool WIDE_>
struct WgradConfig : gemm::WgradTile<T_, Math_, CTA_M_, CTA_N_, CTA_K_, WIDE_> {};  // named: ptxas_report groups by it

template <class Cfg>
__global__ void __launch_bounds__(Cfg::kThreads) wgrad_kernel(const WgradParams p) {
  using T = typename Cfg::T;
  constexpr int M = Cfg::kM, N = Cfg::kN, KT = Cfg::kK, NT = Cfg::kThreads;
  constexpr int LDA = Cfg::kLda, LDB = Cfg::kLdb;
  using APieces = gemm::TilePieces<T, KT, M, NT>;  // A: [KT][M], rows x input channels
  using BPieces = gemm::TilePieces<T, KT, N, NT>;  // B: [KT][N], rows x output channels

  __shared__ __align__(16) T As[2][KT * LDA];
  __shared__ __align__(16) T Bs[2][KT * LDB];
  __shared__ int tiles[NT];
  __shared__ int warp_totals[NT / 32];

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

  const int steps_per_tile = P.tile_rows / KT;
  // The destination row of a plan slot (-1: padding).
  auto row_of = [&](int64_t slot) -> int32_t {
    return P.order != nullptr ? P.order[int64_t(split) * P.order_len + slot]
                              : (slot < P.num_rows ? static_cast<int32_t>(slot) : -1);
  };

  auto load_stage = [&](int stage, int step) {
    const int ti = step / steps_per_tile;
    const int64_t slot0 = int64_t(tiles[ti]) * P.tile_rows + (step - ti * steps_per_tile) * KT;
#pragma unroll
    for (int i = 0; i < APieces::kIters; ++i) {
      if (!APieces::active(i)) continue;
      const int r = APieces::row(i), c = APieces::col(i);
      const int32_t row = row_of(slot0 + r);
      const int32_t nbr = row >= 0 ? P.table[int64_t(row) * K + k] : -1;
      const T* src_row = nbr >= 0 ? src + int64_t(nbr) * p.c_in + m0 : src;
      copy_piece<T, Cfg::kWide>(As[stage] + r * LDA + c, src_row, nbr >= 0, c, p.c_in - m0, src);
    }
#pragma unroll
    for (int i = 0; i < BPieces::kIters; ++i) {
      if (!BPieces::active(i)) continue;
      const int r = BPieces::row(i), n = BPieces::col(i);
      const int32_t row = row_of(slot0 + r);
      const T* grad_row = row >= 0 ? grad + int64_t(row) * p.c_out + n0 : grad;
      copy_piece<T, Cfg::kWide>(Bs[stage] + r * LDB + n, grad_row, row >= 0, n, p.c_out - n0, grad);
    }
  };

  typename Cfg::Math math;
  math.zero();
  // The plan tiles of this chunk in which some row has offset k, listed NT at a time by a
  // block-wide compaction (one tile per thread); tiles whose mask lacks the offset are skipped.
  const int64_t* masks = P.tile_masks + int64_t(split) * P.tiles * P.words + bit / 64;
  const int t_begin = chunk * p.tiles_per_chunk;
  const int t_end = min(t_begin + p.tiles_per_chunk, P.tiles);
  for (int w0 = t_begin; w0 < t_end; w0 += NT) {
    const int t = w0 + tid;
    const bool has_offset =
        t < t_end && ((static_cast<unsigned long long>(masks[int64_t(t) * P.words]) >> (bit % 64)) & 1ull) != 0;
    const int count = compact_block<NT>(has_offset, t, tiles, warp_totals);
    run_double_buffered(count * steps_per_tile, load_stage,
                        [&](int stage) { math.compute(As[stage], LDA, Bs[stage], LDB); });
  }

  using Acc = typename Cfg::Math::Acc;
  Acc* const out = static_cast<Acc*>(p.partial) + (int64_t(chunk) * K + k) * p.c_in * p.c_out;
  math.for_each([&](int m, int n, Acc value) {
    if (m0 + m < p.c_in && n0 + n < p.c_out) out[int64_t(m0 + m) * p.c_out + n0 + n] = value;
  });
}

}  // namespace igemm
}  // namespace torchsparse_pp
