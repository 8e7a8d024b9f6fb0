// Tile copies, the two-stage pipeline and a block-wide compaction shared by the tiled kernels.
//
// Every copy into a shared tile moves 16-byte pieces (G = 16 / sizeof(T) consecutive elements
// of one row). Wide kernels copy a piece with one 16-byte cp.async (rows 16-byte aligned,
// channel counts multiples of G); narrow kernels copy the same piece element by element, so a
// thread owns as few rows in the narrow path as in the wide one (a thread that owned one element
// per row would keep a row index for every one of them live in registers).
#pragma once

#include "primitives.cuh"

namespace torchsparse_pp {
namespace gemm {

// Row padding of shared tiles, in elements. Rows stay 16-byte aligned for cp.async; [m][k] rows
// read by ldmatrix / TF32 fragments are padded by 16 bytes, [k][n] rows by 8 elements of 2- and
// 4-byte types, which spreads the fragment reads of a warp over all 32 banks.
template <typename T>
constexpr int pad_mk() { return 16 / int(sizeof(T)); }
template <typename T>
constexpr int pad_kn() { return sizeof(T) == 8 ? 2 : 8; }

// Elements per 16-byte piece.
template <typename T>
constexpr int piece_elems() { return 16 / int(sizeof(T)); }

// Copies elements [c, c + G) of a source row into dst (shared memory); elements at or past
// `limit`, and all of them when !row_ok, become zeros. `row` need not point anywhere valid when
// !row_ok; `any_valid` is a readable address for the zero-fill copies (cp.async with 0 source
// bytes still takes one). 16-bit elements copied one by one cannot use cp.async (4-byte minimum):
// they take a plain load and store.
template <typename T, bool WIDE>
__device__ __forceinline__ void copy_piece(T* dst, const T* row, bool row_ok, int c, int limit, const T* any_valid) {
  constexpr int G = piece_elems<T>();
  if constexpr (WIDE) {
    const bool ok = row_ok && c < limit;  // limit is a multiple of G
    cp_async<16>(dst, ok ? row + c : any_valid, ok ? 16 : 0);
  } else if constexpr (sizeof(T) >= 4) {
#pragma unroll
    for (int e = 0; e < G; ++e) {
      const bool ok = row_ok && c + e < limit;
      cp_async<int(sizeof(T))>(dst + e, ok ? row + c + e : any_valid, ok ? int(sizeof(T)) : 0);
    }
  } else {
#pragma unroll
    for (int e = 0; e < G; ++e) {
      const bool ok = row_ok && c + e < limit;
      dst[e] = ok ? row[c + e] : zero_value<T>();
    }
  }
}

// The pieces of a ROWS x COLS tile that one thread of NT copies: piece v = threadIdx.x + i * NT
// for i < kIters (those with v < kTotal), at tile row row(i) and column col(i).
template <typename T, int ROWS, int COLS, int NT>
struct TilePieces {
  static constexpr int kPerRow = COLS / piece_elems<T>();
  static constexpr int kTotal = ROWS * kPerRow;
  static constexpr int kIters = (kTotal + NT - 1) / NT;
  static_assert(COLS % piece_elems<T>() == 0, "pieces must not straddle tile rows");

  __device__ __forceinline__ static bool active(int i) { return kTotal % NT == 0 || int(threadIdx.x) + i * NT < kTotal; }
  __device__ __forceinline__ static int row(int i) { return (int(threadIdx.x) + i * NT) / kPerRow; }
  __device__ __forceinline__ static int col(int i) { return ((int(threadIdx.x) + i * NT) % kPerRow) * piece_elems<T>(); }
};

// A tile [M][KT] (row stride LDA) gathered from rows of src [*, c_in], channels [c0, c0 + KT):
// tile row r of this thread's piece i reads source row a_src[i] (-1: a zero row).
template <typename T, int M, int KT, int NT, int LDA, bool WIDE>
__device__ __forceinline__ void copy_gathered_tile(T* as, const int32_t (&a_src)[TilePieces<T, M, KT, NT>::kIters],
                                                   const T* src, int c_in, int c0) {
  using Pieces = TilePieces<T, M, KT, NT>;
#pragma unroll
  for (int i = 0; i < Pieces::kIters; ++i) {
    if (!Pieces::active(i)) continue;
    const bool row_ok = a_src[i] >= 0;
    const T* row = row_ok ? src + int64_t(a_src[i]) * c_in + c0 : src;
    copy_piece<T, WIDE>(as + Pieces::row(i) * LDA + Pieces::col(i), row, row_ok, Pieces::col(i), c_in - c0, src);
  }
}

// A tile [KT][N] (row stride LDB) = w[c0 + kk, n0 + n] of a row-major [c_in, c_out] weight
// slice w_k, zeros outside it.
template <typename T, int KT, int N, int NT, int LDB, bool WIDE>
__device__ __forceinline__ void copy_weight_tile(T* bs, const T* w_k, int c_in, int c_out, int c0, int n0) {
  using Pieces = TilePieces<T, KT, N, NT>;
#pragma unroll
  for (int i = 0; i < Pieces::kIters; ++i) {
    if (!Pieces::active(i)) continue;
    const int kk = Pieces::row(i);
    const bool row_ok = c0 + kk < c_in;
    const T* row = row_ok ? w_k + int64_t(c0 + kk) * c_out + n0 : w_k;
    copy_piece<T, WIDE>(bs + kk * LDB + Pieces::col(i), row, row_ok, Pieces::col(i), c_out - n0, w_k);
  }
}

// Runs `steps` (copy, multiply) steps through two shared-memory stages: the copy of step s + 1
// is in flight while step s multiplies. load_stage(stage, step) issues the copies (cp.async or
// plain stores); compute_stage(stage) reads a completed stage. `steps` must be the same in every
// thread of the block (it contains barriers).
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

// Block-wide stream compaction: thread t offers `value` when `keep`; the kept values land in
// list[0, count) in thread order and every thread returns count. NT threads (a multiple of 32);
// warp_totals is shared scratch of NT / 32 ints. Two barriers: every thread must call it, and
// `list` may be rewritten by the next call once this one has returned.
template <int NT>
__device__ __forceinline__ int compact_block(bool keep, int value, int* list, int* warp_totals) {
  static_assert(NT % 32 == 0, "whole warps");
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const unsigned ballot = __ballot_sync(0xffffffffu, keep);
  if (lane == 0) warp_totals[warp] = __popc(ballot);
  __syncthreads();
  int before = 0, count = 0;
#pragma unroll
  for (int w = 0; w < NT / 32; ++w) {
    const int n = warp_totals[w];
    before += w < warp ? n : 0;
    count += n;
  }
  if (keep) list[before + __popc(ballot & ((1u << lane) - 1u))] = value;
  __syncthreads();
  return count;
}

// Tile shapes and shared-memory strides both dataflows' kernels use.
// Forward (and dgrad): A [M][K] gathered rows x input channels, B [K][N] weight slice.
template <typename T_, class Math_, int CTA_M_, int CTA_N_, int CTA_K_, bool WIDE_, typename Out_>
struct ForwardTile {
  using T = T_;
  using Math = Math_;
  using Out = Out_;
  static constexpr int kM = CTA_M_, kN = CTA_N_, kK = CTA_K_;
  static constexpr bool kWide = WIDE_;
  static constexpr int kThreads = Math::kThreads;
  static constexpr int kPiece = piece_elems<T>();
  static constexpr int kLda = kK + pad_mk<T>();
  static constexpr int kLdb = kN + pad_kn<T>();
  static_assert(kK % kPiece == 0 && kN % kPiece == 0, "pieces must not straddle tile rows");
};

// Weight gradient: A [K][M] rows x input channels, B [K][N] rows x output channels.
template <typename T_, class Math_, int CTA_M_, int CTA_N_, int CTA_K_, bool WIDE_>
struct WgradTile {
  using T = T_;
  using Math = Math_;
  static constexpr int kM = CTA_M_, kN = CTA_N_, kK = CTA_K_;
  static constexpr bool kWide = WIDE_;
  static constexpr int kThreads = Math::kThreads;
  static constexpr int kPiece = piece_elems<T>();
  static constexpr int kLda = kM + pad_kn<T>();
  static constexpr int kLdb = kN + pad_kn<T>();
  static_assert(kM % kPiece == 0 && kN % kPiece == 0, "pieces must not straddle tile rows");
};

}  // namespace gemm
}  // namespace torchsparse_pp
