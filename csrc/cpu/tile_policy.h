// How the tiled CPU dataflows store and multiply their tiles, as two interchangeable policies:
//
// - FloatTiles<T>: tiles in float for float32 / bfloat16 (converted on gather) and in double for
//   float64; GEMMs by tile_gemm (ATen's brgemm micro-kernel, or plain loops for float64);
// - Bf16DotTiles: bfloat16 tiles multiplied by bf16_gemm (AVX512-BF16 dot products, float
//   sums), used for bfloat16 inputs when the CPU has the instructions. The K dimension of every
//   GEMM holds whole pairs, so each operand's K extent is padded to even with zeros, and the
//   right-hand operand (weights, or gathered gradients) is stored in pairs of K rows.
//
// A dataflow written against the policy interface (A, Acc, k_len, weights, gather_rows,
// gather_rows_t, gather_rhs, gemm, gemm_t) runs either way; with_tiles<T> picks the policy.
#pragma once

#include <ATen/ATen.h>

#include <algorithm>

#include "bf16_gemm.h"
#include "pair_gemm.h"
#include "tile_gemm.h"
#include "transpose_avx2.h"

namespace torchsparse_pp {

template <typename T>
struct FloatTiles {
  using A = typename TileMath<T>::type;  // tile element
  using Acc = A;                         // products and outputs

  static int64_t k_len(int64_t k) { return k; }

  // [K, C_src, C_dst] in tile layout (C_src and C_dst swapped with `transpose`).
  static at::Tensor weights(const at::Tensor& weight, bool transpose) { return tile_weight(weight, transpose); }

  // dst[i, :c] = src[row(i), :c] (zeros for row < 0), leading dimension ld.
  template <typename RowFn>
  static void gather_rows(const T* src, int64_t c, int64_t n, RowFn&& row, A* dst, int64_t ld) {
    gather_tile(src, c, n, row, dst, ld);
  }

  // The left operand of a GEMM over rows (the weight gradient, K = the n rows): here the
  // transposed tile dst[j, i] = src[row(i), j], leading dimension ld >= k_len(n).
  template <typename RowFn>
  static void gather_rows_t(const T* src, int64_t c, int64_t n, RowFn&& row, A* dst, int64_t ld) {
    if constexpr (std::is_same_v<T, float>) {
      if (register_isa() != RegisterIsa::kNone) return gather_tile_transposed_x8(src, c, n, row, dst, ld);
    }
    gather_tile_transposed(src, c, n, row, dst, ld);
  }

  // A right-hand GEMM operand of n rows (the K dimension) and c columns, in gemm's layout.
  template <typename RowFn>
  static void gather_rhs(const T* src, int64_t c, int64_t n, RowFn&& row, A* dst) {
    gather_tile(src, c, n, row, dst, c);
  }

  // C[M, N] (+)= A[M, K] B[K, N]; B in the layout of weights() / gather_rhs() (N columns).
  static void gemm(int64_t M, int64_t N, int64_t K, const A* a, int64_t lda, const A* b, Acc* c, int64_t ldc,
                   bool accumulate) {
    tile_gemm(M, N, K, a, lda, b, N, c, ldc, accumulate);
  }

  // C[blocks * M, N] (+)= A B with A made of `blocks` consecutive gather_rows_t tiles of M
  // columns each (K = k_len(n) rows), as gathered with leading dimension ld.
  static void gemm_t(int64_t blocks, int64_t M, int64_t N, int64_t K, const A* a, int64_t ld, const A* b, Acc* c,
                     int64_t ldc, bool accumulate) {
    tile_gemm(blocks * M, N, K, a, ld, b, N, c, ldc, accumulate);
  }
};

struct Bf16DotTiles {
  using T = at::BFloat16;
  using A = at::BFloat16;
  using Acc = float;

  static int64_t k_len(int64_t k) { return bf16_pairs_len(k); }

  static at::Tensor weights(const at::Tensor& weight, bool transpose) { return bf16_packed_weight(weight, transpose); }

  template <typename RowFn>
  static void gather_rows(const T* src, int64_t c, int64_t n, RowFn&& row, A* dst, int64_t ld) {
    gather_tile(src, c, n, row, dst, ld);
    if (k_len(c) > c)
      for (int64_t i = 0; i < n; ++i) dst[i * ld + c] = A(0.f);
  }

  // Rows 2p and 2p + 1 interleaved per column: [k_len(n) / 2][c][2]. Both operands of the
  // weight gradient are gathered this way: a pair of K values of one column is then one word.
  template <typename RowFn>
  static void gather_rhs(const T* src, int64_t c, int64_t n, RowFn&& row, A* dst) {
    int64_t* rows = scratch<int64_t, 0>(n);
    for (int64_t i = 0; i < n; ++i) rows[i] = row(i);
    bf16_gather_pairs(src, c, rows, n, dst);
  }

  template <typename RowFn>
  static void gather_rows_t(const T* src, int64_t c, int64_t n, RowFn&& row, A* dst, int64_t /*ld*/) {
    gather_rhs(src, c, n, row, dst);
  }

  static void gemm(int64_t M, int64_t N, int64_t K, const A* a, int64_t lda, const A* b, Acc* c, int64_t ldc,
                   bool accumulate) {
    bf16_gemm(M, N, K, a, lda, b, c, ldc, accumulate);
  }

  // Each block is [K / 2][M][2]: pair p of column m is word p * M + m.
  static void gemm_t(int64_t blocks, int64_t M, int64_t N, int64_t K, const A* a, int64_t /*ld*/, const A* b,
                     Acc* c, int64_t ldc, bool accumulate) {
    for (int64_t j = 0; j < blocks; ++j)
      bf16_gemm_strided(M, N, K, a + j * M * K, 1, M, b, c + j * M * ldc, ldc, accumulate);
  }
};

// Whether the register kernels (pair_gemm.h: rows of A read straight from the source rows, sums
// written straight to the output rows) serve inputs T with tiles Tiles: float32, and bfloat16
// with the bf16 dot product (weights in the policy's packed pairs) or without it (float weights,
// rows widened); they run where pair_gemm_available().
template <typename T, typename Tiles>
constexpr bool kPairKernel = (std::is_same_v<T, float> && std::is_same_v<Tiles, FloatTiles<float>>) ||
                             (std::is_same_v<T, at::BFloat16> && std::is_same_v<Tiles, Bf16DotTiles>) ||
                             (std::is_same_v<T, at::BFloat16> && std::is_same_v<Tiles, FloatTiles<at::BFloat16>>);

// Calls fn(policy) with the tiles that serve inputs of type T on this CPU.
template <typename T, typename Fn>
void with_tiles(Fn&& fn) {
  if constexpr (std::is_same_v<T, at::BFloat16>) {
    if (bf16_dot_available()) return fn(Bf16DotTiles{});
  }
  fn(FloatTiles<T>{});
}

}  // namespace torchsparse_pp
