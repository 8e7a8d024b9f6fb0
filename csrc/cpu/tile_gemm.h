// Small single-threaded GEMMs on thread-local tiles, and the work scheduler of the tiled
// dataflows (fetch-on-demand, implicit GEMM, deterministic gather-scatter).
//
// Every tile GEMM runs on one thread with a shape fixed by the work item, never by the thread
// count, so results are bit-identical across runs and OpenMP thread counts.
#pragma once

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/native/CPUBlas.h>

#include <atomic>
#include <cstring>
#include <vector>

#include "row_ops.h"

namespace torchsparse_pp {

// C[M, N] = A[M, K] * B[K, N] (+ C when accumulate), row-major with leading dimensions, as a
// plain loop with a fixed summation order.
template <typename T>
inline void naive_gemm(int64_t M, int64_t N, int64_t K, const T* A, int64_t lda, const T* B,
                       int64_t ldb, T* C, int64_t ldc, bool accumulate) {
  for (int64_t i = 0; i < M; ++i) {
    T* c = C + i * ldc;
    if (!accumulate) std::fill(c, c + N, T(0));
    for (int64_t k = 0; k < K; ++k) {
      const T a = A[i * lda + k];
      const T* b = B + k * ldb;
      for (int64_t j = 0; j < N; ++j) c[j] += a * b[j];
    }
  }
}

inline void tile_gemm(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const float* B,
                      int64_t ldb, float* C, int64_t ldc, bool accumulate) {
  if (M == 0 || N == 0) return;
  if (K == 0) {
    if (!accumulate)
      for (int64_t i = 0; i < M; ++i) std::fill(C + i * ldc, C + i * ldc + N, 0.f);
    return;
  }
#ifdef CPUBLAS_BRGEMM_F32F32F32
  // ATen's batch-reduce GEMM micro-kernel: built for exactly these cache-resident tiles.
  at::native::cpublas::brgemm(M, N, K, lda, ldb, ldc, accumulate, A, B, C, false);
#else
  naive_gemm(M, N, K, A, lda, B, ldb, C, ldc, accumulate);
#endif
}

// float64 is for gradcheck and oracle tests: exactness over speed.
inline void tile_gemm(int64_t M, int64_t N, int64_t K, const double* A, int64_t lda,
                      const double* B, int64_t ldb, double* C, int64_t ldc, bool accumulate) {
  naive_gemm(M, N, K, A, lda, B, ldb, C, ldc, accumulate);
}

// Releases per-thread GEMM state (e.g. AMX tile configuration) after a run of tile GEMMs.
inline void tile_gemm_release() {
#ifdef CPUBLAS_BRGEMM_F32F32F32
  at::native::cpublas::brgemm_release(false);
#endif
}

// Tiles compute in float for bfloat16 inputs and in the input type otherwise.
template <typename T>
struct TileMath {
  using type = T;
};
template <>
struct TileMath<at::BFloat16> {
  using type = float;
};

// Runs fn(item) for item in [0, n) with dynamic scheduling: each thread pulls the next item, so
// uneven items (e.g. sorted tiles) balance, and each item's result never depends on the thread.
template <typename Fn>
void parallel_items(int64_t n, Fn&& fn) {
  if (n <= 0) return;
  const int64_t workers = std::min<int64_t>(at::get_num_threads(), n);
  std::atomic<int64_t> next{0};
  at::parallel_for(0, workers, 1, [&](int64_t, int64_t) {
    for (int64_t item = next++; item < n; item = next++) fn(item);
    tile_gemm_release();
  });
}

// Weight in the tile math type, optionally transposed per offset: [K, rows, cols] contiguous.
at::Tensor tile_weight(const at::Tensor& weight, bool transpose);

}  // namespace torchsparse_pp

namespace torchsparse_pp {

// Source rows are random reads from a table larger than L2: gathers fetch a few rows ahead.
constexpr int64_t kPrefetchRows = 8;

template <typename T>
inline void prefetch_row(const T* row, int64_t c) {
  const char* p = reinterpret_cast<const char*>(row);
  for (int64_t b = 0; b < c * static_cast<int64_t>(sizeof(T)); b += 64) __builtin_prefetch(p + b);
}

// Requests every cache line of [start, start + bytes), bytes > 0, the last one too when the range
// does not start on a line (a 96- or 108-byte row straddles one more line than bytes / 64).
inline void prefetch_lines(const void* start, int64_t bytes) {
  const char* p = static_cast<const char*>(start);
  for (int64_t b = 0; b < bytes; b += 64) __builtin_prefetch(p + b);
  __builtin_prefetch(p + bytes - 1);
}

// dst[i, :c] = src[row(i), :c] in the tile type; rows < 0 give zeros (absent neighbours).
template <typename T, typename M, typename RowFn>
inline void gather_tile(const T* src, int64_t c, int64_t n, RowFn&& row, M* dst, int64_t ld) {
  for (int64_t i = 0; i < n; ++i) {
    if (i + kPrefetchRows < n) {
      const int64_t ahead = row(i + kPrefetchRows);
      if (ahead >= 0) prefetch_row(src + ahead * c, c);
    }
    const int64_t r = row(i);
    M* d = dst + i * ld;
    if (r < 0) {
      std::fill(d, d + c, M(0));
      continue;
    }
    const T* s = src + r * c;
    if constexpr (std::is_same_v<T, M>) std::memcpy(d, s, sizeof(T) * c);
    else if constexpr (std::is_same_v<T, c10::BFloat16> && std::is_same_v<M, float>) widen_row(s, c, d);
    else for (int64_t j = 0; j < c; ++j) d[j] = static_cast<M>(s[j]);
  }
}

// Like gather_tile but writes the transpose: dst[j, i] = src[row(i), j]. Rows go through a
// small block first, so each column is written as a run of kTransposeBlock values instead of
// one value per cache line.
constexpr int64_t kTransposeBlock = 16;

template <typename T, typename M, typename RowFn>
inline void gather_tile_transposed(const T* src, int64_t c, int64_t n, RowFn&& row, M* dst, int64_t ld) {
  thread_local std::vector<M> block;
  if (static_cast<int64_t>(block.size()) < kTransposeBlock * c) block.resize(kTransposeBlock * c);
  for (int64_t i0 = 0; i0 < n; i0 += kTransposeBlock) {
    const int64_t rows = std::min(kTransposeBlock, n - i0);
    for (int64_t i = i0 + kTransposeBlock; i < std::min(n, i0 + 2 * kTransposeBlock); ++i) {
      const int64_t ahead = row(i);
      if (ahead >= 0) prefetch_row(src + ahead * c, c);
    }
    gather_tile(src, c, rows, [&](int64_t i) { return row(i0 + i); }, block.data(), c);
    for (int64_t j = 0; j < c; ++j) {
      M* d = dst + j * ld + i0;
      for (int64_t i = 0; i < rows; ++i) d[i] = block[i * c + j];
    }
  }
}

// A per-thread scratch buffer that grows as needed; `slot` separates buffers used together.
// It starts on a cache line (malloc gives 16 bytes), so that rows of whole vectors do not
// straddle lines. Its contents are unspecified (growing it moves them): callers write first.
template <typename M, int slot>
inline M* scratch(int64_t count) {
  static_assert(std::is_trivially_copyable_v<M>, "scratch holds plain values");
  constexpr size_t kLine = 64;
  thread_local std::vector<unsigned char> bytes;
  const size_t size = static_cast<size_t>(count) * sizeof(M);
  if (bytes.size() < size + kLine) bytes.resize(size + kLine);
  const auto start = (reinterpret_cast<uintptr_t>(bytes.data()) + kLine - 1) / kLine * kLine;
  return reinterpret_cast<M*>(start);
}

// A per-thread vector (its size is the caller's business).
template <typename M, int slot>
inline std::vector<M>* scratch_vector() {
  thread_local std::vector<M> buffer;
  return &buffer;
}

// At least `count` zeros of type M, per thread (never written).
template <typename M>
inline const M* scratch_zeros(int64_t count) {
  thread_local std::vector<M> zeros;
  if (static_cast<int64_t>(zeros.size()) < count) zeros.assign(count, M(0));
  return zeros.data();
}

}  // namespace torchsparse_pp
