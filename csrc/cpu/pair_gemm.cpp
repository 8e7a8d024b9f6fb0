// The AVX-512 register gather-GEMM-scatter kernels of pair_gemm.h, and the choice between them and
// the AVX2 ones (pair_gemm_avx2.h). Compiled for the baseline ISA; the kernels carry their own
// target attributes and run only after the CPU check.
#include "pair_gemm.h"

#include <torch/library.h>

#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <string>

#include "bf16_gemm.h"
#include "cpu_features.h"
#include "pair_gemm_avx2.h"
#include "register_tile.h"

namespace torchsparse_pp {

namespace {

// Pairs ahead whose source row the narrow kernel fetches.
constexpr int64_t kPrefetchPairs = 8;

// Source rows of the next group are fetched while this group computes.
template <typename T>
inline void prefetch_rows(const T* feats, int64_t ldf, const int32_t* src, int64_t count, int64_t bytes) {
  for (int64_t m = 0; m < count; ++m) {
    const char* row = reinterpret_cast<const char*>(feats + static_cast<int64_t>(src[m]) * ldf);
    for (int64_t b = 0; b < bytes; b += 64) __builtin_prefetch(row + b);
  }
}

// Stores or adds the accumulators into MR destination rows.
template <int MR, int NV>
TSPP_AVX512_TARGET inline void write_rows(__m512 (&acc)[MR][NV], float* const* out_rows, __mmask16 tail,
                                          bool accumulate) {
#pragma GCC unroll 8
  for (int m = 0; m < MR; ++m) store_register_row<NV>(acc[m], out_rows[m], tail, accumulate);
}

// bfloat16 rows take whole sums only (the caller never accumulates into them).
template <int MR, int NV>
TSPP_AVX512_TARGET inline void write_rows(__m512 (&acc)[MR][NV], c10::BFloat16* const* out_rows, __mmask16 tail,
                                          bool /*accumulate: false*/) {
#pragma GCC unroll 8
  for (int m = 0; m < MR; ++m) store_register_row_bf16<NV>(acc[m], reinterpret_cast<uint16_t*>(out_rows[m]), tail);
}

// MR rows by NV vectors of 16 output columns, float32, summed over `terms` products: term j
// multiplies rows a_rows[j * MR + m] by W_terms[j] ([K, N] row-major, column offset applied).
template <int MR, int NV>
TSPP_AVX512_TARGET inline __attribute__((always_inline)) void kernel_f32_body(int64_t terms, const float* const* a_rows,
                                                                              int64_t K, const float* const* W_terms,
                                                                              int64_t N, float* const* out_rows,
                                                                              __mmask16 tail, bool accumulate) {
  __m512 acc[MR][NV];
#pragma GCC unroll 8
  for (int m = 0; m < MR; ++m)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) acc[m][v] = _mm512_setzero_ps();
  for (int64_t j = 0; j < terms; ++j) {
    const float* const* a = a_rows + j * MR;
    for (int64_t k = 0; k < K; ++k) {
      __m512 b[NV];
      const float* w = W_terms[j] + k * N;
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v)
        b[v] = v == NV - 1 ? _mm512_maskz_loadu_ps(tail, w + 16 * v) : _mm512_loadu_ps(w + 16 * v);
#pragma GCC unroll 8
      for (int m = 0; m < MR; ++m) {
        const __m512 x = _mm512_set1_ps(a[m][k]);
#pragma GCC unroll 4
        for (int v = 0; v < NV; ++v) acc[m][v] = _mm512_fmadd_ps(x, b[v], acc[m][v]);
      }
    }
  }
  write_rows<MR, NV>(acc, out_rows, tail, accumulate);
}

template <int MR, int NV>
TSPP_AVX512_TARGET void kernel_f32(int64_t terms, const float* const* a_rows, int64_t K, const float* const* W_terms,
                                   int64_t N, float* const* out_rows, __mmask16 tail, bool accumulate) {
  kernel_f32_body<MR, NV>(terms, a_rows, K, W_terms, N, out_rows, tail, accumulate);
}

// acc[m][v] += the pair p of row a[m] . the packed W row `row` (one dot product per vector);
// `half`: p is an odd K's last pair, whose second element is zero (the row may end there).
template <int MR, int NV>
TSPP_AVX512_BF16_TARGET inline __attribute__((always_inline)) void dot_pair(__m512 (&acc)[MR][NV],
                                                                            const c10::BFloat16* const* a,
                                                                            const uint32_t* row, int64_t p,
                                                                            bool half, __mmask16 tail) {
  __m512i b[NV];
#pragma GCC unroll 4
  for (int v = 0; v < NV; ++v)
    b[v] = v == NV - 1 ? _mm512_maskz_loadu_epi32(tail, row + 16 * v) : _mm512_loadu_si512(row + 16 * v);
#pragma GCC unroll 8
  for (int m = 0; m < MR; ++m) {
    const auto* bits = reinterpret_cast<const uint16_t*>(a[m]) + 2 * p;
    uint32_t word = bits[0];
    if (!half) word |= static_cast<uint32_t>(bits[1]) << 16;
    const __m512i x = _mm512_set1_epi32(static_cast<int>(word));
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) acc[m][v] = _mm512_dpbf16_ps(acc[m][v], (__m512bh)x, (__m512bh)b[v]);
  }
}

// The same for bfloat16: pairs of K per dot product; an odd K's last element pairs with zero.
// With up to 12 accumulators the sums alone would wait on the dot product's latency, so
// alternate pairs go to a second set of sums, added at the end. The sets follow from the full
// group's size, not MR: a row sums in one order whether its group is whole or the last partial
// one (where groups split depends on the blocks, so on the thread count).
template <int MR, int NV, typename O>
TSPP_AVX512_BF16_TARGET inline __attribute__((always_inline)) void kernel_bf16_body(
    int64_t terms, const c10::BFloat16* const* a_rows, int64_t K, const c10::BFloat16* const* W_terms, int64_t N,
    O* const* out_rows, __mmask16 tail, bool accumulate) {
  constexpr int kSets = 2 * kRowGroup * NV <= 24 ? 2 : 1;
  __m512 acc[kSets][MR][NV];
#pragma GCC unroll 2
  for (int s = 0; s < kSets; ++s)
#pragma GCC unroll 8
    for (int m = 0; m < MR; ++m)
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) acc[s][m][v] = _mm512_setzero_ps();
  const int64_t pairs = (K + 1) / 2, full = K / 2;
  for (int64_t j = 0; j < terms; ++j) {
    const c10::BFloat16* const* a = a_rows + j * MR;
    const auto* w = reinterpret_cast<const uint32_t*>(W_terms[j]);
    int64_t p = 0;
    if constexpr (kSets == 2)
      for (; p + 1 < full; p += 2) {
        dot_pair<MR, NV>(acc[0], a, w + p * N, p, false, tail);
        dot_pair<MR, NV>(acc[1], a, w + (p + 1) * N, p + 1, false, tail);
      }
    // Whole pairs with `half` fixed: every row's pair is then one broadcast load (a per-pair
    // test made the compiler build some pairs in a general register).
    for (; p < full; ++p) dot_pair<MR, NV>(acc[0], a, w + p * N, p, false, tail);
    if (p < pairs) dot_pair<MR, NV>(acc[0], a, w + p * N, p, true, tail);
  }
  if constexpr (kSets == 2)
#pragma GCC unroll 8
    for (int m = 0; m < MR; ++m)
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) acc[0][m][v] = _mm512_add_ps(acc[0][m][v], acc[1][m][v]);
  write_rows<MR, NV>(acc[0], out_rows, tail, accumulate);
}

template <int MR, int NV, typename O>
TSPP_AVX512_BF16_TARGET void kernel_bf16(int64_t terms, const c10::BFloat16* const* a_rows, int64_t K,
                                         const c10::BFloat16* const* W_terms, int64_t N, O* const* out_rows,
                                         __mmask16 tail, bool accumulate) {
  kernel_bf16_body<MR, NV, O>(terms, a_rows, K, W_terms, N, out_rows, tail, accumulate);
}

template <typename T>
struct Kernels;

template <>
struct Kernels<float> {
  template <int MR, int NV, typename O = float>
  static void run(int64_t j, const float* const* a, int64_t K, const float* const* W, int64_t N, float* const* o,
                  __mmask16 t, bool acc) {
    kernel_f32<MR, NV>(j, a, K, W, N, o, t, acc);
  }
  static int64_t w_column_stride() { return 1; }  // W[k, n]: column n at n
};

template <>
struct Kernels<c10::BFloat16> {
  template <int MR, int NV, typename O>
  static void run(int64_t j, const c10::BFloat16* const* a, int64_t K, const c10::BFloat16* const* W, int64_t N,
                  O* const* o, __mmask16 t, bool acc) {
    kernel_bf16<MR, NV>(j, a, K, W, N, o, t, acc);
  }
  static int64_t w_column_stride() { return 2; }  // packed pairs: column n at 2 n
};

// A group of `rows` (<= MR) rows; a narrower instantiation for the last group. Row pointers of
// term j are a[j * MR + m] with MR the group width the caller used. Output rows O: float, or
// bfloat16 for at most 64 terms (one call, so no partial sums to add).
template <typename T, int NV, int MR, typename O>
void group(int64_t rows, int64_t terms, const T* const* a, int64_t K, const T* const* W, int64_t N, O* const* o,
           __mmask16 tail, bool acc) {
  using Run = Kernels<T>;
  if (rows == MR) return Run::template run<MR, NV, O>(terms, a, K, W, N, o, tail, acc);
  // A partial group: repack the row pointers of every term to the narrower width.
  const T* packed[8 * 64];
  const int64_t chunk = 64;
  for (int64_t j0 = 0; j0 < terms; j0 += chunk) {
    const int64_t nj = std::min(chunk, terms - j0);
    for (int64_t j = 0; j < nj; ++j)
      for (int64_t m = 0; m < rows; ++m) packed[j * rows + m] = a[(j0 + j) * MR + m];
    const bool add = acc || j0 > 0;
    switch (rows) {
      case 1: Run::template run<1, NV, O>(nj, packed, K, W + j0, N, o, tail, add); break;
      case 2: Run::template run<2, NV, O>(nj, packed, K, W + j0, N, o, tail, add); break;
      case 3: Run::template run<3, NV, O>(nj, packed, K, W + j0, N, o, tail, add); break;
      case 4: Run::template run<4, NV, O>(nj, packed, K, W + j0, N, o, tail, add); break;
      case 5: Run::template run<5, NV, O>(nj, packed, K, W + j0, N, o, tail, add); break;
      case 6: Run::template run<6, NV, O>(nj, packed, K, W + j0, N, o, tail, add); break;
      default: Run::template run<7, NV, O>(nj, packed, K, W + j0, N, o, tail, add); break;
    }
  }
}

// out rows[m] (+)= sum_j rows_j[m] @ W_j over column blocks of 64 (the rows of A stay in L1).
template <typename T, int MR, typename O = float>
void columns(int64_t rows, int64_t terms, const T* const* a, int64_t K, const T* const* W, int64_t N,
             O* const* out_rows, bool accumulate) {
  static_assert(MR <= 6, "6 rows x 4 vectors of accumulators fill the registers");
  const T* wn[64];
  O* on[8];
  for_column_blocks(N, [&](int64_t n0, auto nv, __mmask16 tail) {
    for (int64_t m = 0; m < rows; ++m) on[m] = out_rows[m] + n0;
    for (int64_t j0 = 0; j0 < terms; j0 += 64) {
      const int64_t nj = std::min<int64_t>(64, terms - j0);
      for (int64_t j = 0; j < nj; ++j) wn[j] = W[j0 + j] + n0 * Kernels<T>::w_column_stride();
      group<T, decltype(nv)::value, MR, O>(rows, nj, a + j0 * MR, K, wn, N, on, tail, accumulate || j0 > 0);
    }
  });
}

// Moves each of a group's output row pointers `by` columns on.
inline void shift_rows(float* (&rows)[kRowGroup], int64_t by) {
  for (auto& r : rows) r += by;
}

// One call's pairs in whole groups of kRowGroup rows, the kernel inlined into the loop (each
// group's column blocks back to back): per group no call chain (columns -> group -> kernel) and
// no column dispatch, ~15 % of a 48-wide bf16 layer's time before. Returns the pairs done; a
// partial last group is left to the caller. One loop for both element types, each instance
// compiled for its kernel's instruction set.
#define TSPP_PAIR_ROWS_LOOP(KERNEL)                                                              \
  const int64_t bytes = K * static_cast<int64_t>(sizeof(*feats));                                \
  int64_t i0 = 0;                                                                                 \
  for (; i0 + kRowGroup <= count; i0 += kRowGroup) {                                              \
    if (i0 + kRowGroup < count)                                                                   \
      prefetch_rows(feats, ldf, src + i0 + kRowGroup, std::min(kRowGroup, count - i0 - kRowGroup), bytes); \
    decltype(feats) a[kRowGroup];                                                                 \
    float* o[kRowGroup];                                                                          \
    for (int64_t m = 0; m < kRowGroup; ++m) {                                                     \
      a[m] = feats + static_cast<int64_t>(src[i0 + m]) * ldf;                                     \
      o[m] = out + static_cast<int64_t>(dst[i0 + m]) * ldo;                                       \
    }                                                                                             \
    KERNEL;                                                                                       \
  }                                                                                               \
  return i0;

// A group's `full` column blocks of 64 (none for N <= 64), then the last of NV vectors, back to
// back in the loop (its rows still in L1 for the next block). w[b] is block b's weight.
template <int NV>
TSPP_AVX512_BF16_TARGET inline __attribute__((always_inline)) void bf16_column_blocks(
    const c10::BFloat16* const* a, int64_t K, const c10::BFloat16* const* w, int64_t full, int64_t N,
    float* (&o)[kRowGroup], __mmask16 tail, bool accumulate) {
  for (int64_t b = 0; b < full; ++b) {
    kernel_bf16_body<kRowGroup, 4, float>(1, a, K, w + b, N, o, 0xFFFF, accumulate);
    shift_rows(o, 64);
  }
  kernel_bf16_body<kRowGroup, NV, float>(1, a, K, w + full, N, o, tail, accumulate);
}

template <int NV>
TSPP_AVX512_TARGET inline __attribute__((always_inline)) void f32_column_blocks(
    const float* const* a, int64_t K, const float* const* w, int64_t full, int64_t N, float* (&o)[kRowGroup],
    __mmask16 tail, bool accumulate) {
  for (int64_t b = 0; b < full; ++b) {
    kernel_f32_body<kRowGroup, 4>(1, a, K, w + b, N, o, 0xFFFF, accumulate);
    shift_rows(o, 64);
  }
  kernel_f32_body<kRowGroup, NV>(1, a, K, w + full, N, o, tail, accumulate);
}

// Column blocks a group runs back to back in pair_rows: up to kMaxPairRowsColumns columns.
constexpr int64_t kMaxColumnBlocks = 8;
constexpr int64_t kMaxPairRowsColumns = 64 * kMaxColumnBlocks;

template <int NV>
TSPP_AVX512_BF16_TARGET int64_t pair_rows_bf16(int64_t count, const int32_t* src, const int32_t* dst,
                                               const c10::BFloat16* feats, int64_t ldf, int64_t K,
                                               const c10::BFloat16* W, int64_t N, float* out, int64_t ldo,
                                               __mmask16 tail, bool accumulate) {
  const int64_t full = (N - 1) / 64;
  const c10::BFloat16* w[kMaxColumnBlocks];
  for (int64_t b = 0; b <= full; ++b) w[b] = W + 2 * 64 * b;  // packed pairs: column n at 2 n
  TSPP_PAIR_ROWS_LOOP((bf16_column_blocks<NV>(a, K, w, full, N, o, tail, accumulate)))
}

template <int NV>
TSPP_AVX512_TARGET int64_t pair_rows_f32(int64_t count, const int32_t* src, const int32_t* dst, const float* feats,
                                         int64_t ldf, int64_t K, const float* W, int64_t N, float* out, int64_t ldo,
                                         __mmask16 tail, bool accumulate) {
  const int64_t full = (N - 1) / 64;
  const float* w[kMaxColumnBlocks];
  for (int64_t b = 0; b <= full; ++b) w[b] = W + 64 * b;
  TSPP_PAIR_ROWS_LOOP((f32_column_blocks<NV>(a, K, w, full, N, o, tail, accumulate)))
}
#undef TSPP_PAIR_ROWS_LOOP

// pair_rows_*<NV> for N <= kMaxPairRowsColumns, NV the vectors of the last column block.
template <typename T>
int64_t pair_rows(int64_t count, const int32_t* src, const int32_t* dst, const T* feats, int64_t ldf, int64_t K,
                  const T* W, int64_t N, float* out, int64_t ldo, bool accumulate) {
  int64_t done = 0;
  // One block: the columns after the whole blocks of 64 (the loop runs those first), all N when
  // N <= 64.
  for_column_blocks(N - (N - 1) / 64 * 64, [&](int64_t, auto nv, __mmask16 tail) {
    constexpr int kNv = decltype(nv)::value;
    if constexpr (std::is_same_v<T, float>)
      done = pair_rows_f32<kNv>(count, src, dst, feats, ldf, K, W, N, out, ldo, tail, accumulate);
    else
      done = pair_rows_bf16<kNv>(count, src, dst, feats, ldf, K, W, N, out, ldo, tail, accumulate);
  });
  return done;
}

// Narrow operands (K x N within 24 vectors: the stem's 4 -> 16, 16 -> 16 or 12 -> 32 layers):
// W stays in registers and each pair is one row in, one row out, with no per-group call chain.
// The sums run in the row-group kernels' order, so results do not depend on which kernel ran.
template <int K, int NV>
TSPP_AVX512_TARGET void narrow_kernel(int64_t count, const int32_t* src, const int32_t* dst, const float* feats,
                                      int64_t ldf, const float* W, int64_t N, float* out, int64_t ldo,
                                      __mmask16 tail, bool accumulate) {
  __m512 w[K][NV];
#pragma GCC unroll 16
  for (int k = 0; k < K; ++k)
#pragma GCC unroll 2
    for (int v = 0; v < NV; ++v)
      w[k][v] = v == NV - 1 ? _mm512_maskz_loadu_ps(tail, W + k * N + 16 * v) : _mm512_loadu_ps(W + k * N + 16 * v);
  for (int64_t i = 0; i < count; ++i) {
    if (i + kPrefetchPairs < count) __builtin_prefetch(feats + static_cast<int64_t>(src[i + kPrefetchPairs]) * ldf);
    const float* x = feats + static_cast<int64_t>(src[i]) * ldf;
    float* o = out + static_cast<int64_t>(dst[i]) * ldo;
    __m512 acc[NV];
#pragma GCC unroll 2
    for (int v = 0; v < NV; ++v) acc[v] = _mm512_setzero_ps();
#pragma GCC unroll 16
    for (int k = 0; k < K; ++k) {
      const __m512 xk = _mm512_set1_ps(x[k]);
#pragma GCC unroll 2
      for (int v = 0; v < NV; ++v) acc[v] = _mm512_fmadd_ps(xk, w[k][v], acc[v]);
    }
    store_register_row<NV>(acc, o, tail, accumulate);
  }
}

// Largest K the narrow kernel takes for NV vectors of columns (W in 16 or 24 registers).
constexpr int64_t kNarrowK[3] = {0, 16, 12};

// The narrow kernel when it takes (K, N); false otherwise.
bool narrow_pair_gemm(int64_t count, const int32_t* src, const int32_t* dst, const float* feats, int64_t ldf,
                      int64_t K, const float* W, int64_t N, float* out, int64_t ldo, bool accumulate) {
  const int64_t nv = (N + 15) / 16;
  if (K < 1 || N < 1 || nv > 2 || K > kNarrowK[nv]) return false;
  const __mmask16 tail = static_cast<__mmask16>((1u << (N - 16 * (nv - 1))) - 1u);
  const auto run = [&](auto k, auto nv_) {
    narrow_kernel<decltype(k)::value, decltype(nv_)::value>(count, src, dst, feats, ldf, W, N, out, ldo, tail,
                                                            accumulate);
  };
  if (nv == 1) with_constant<kNarrowK[1]>(K, [&](auto k) { run(k, std::integral_constant<int, 1>{}); });
  else with_constant<kNarrowK[2]>(K, [&](auto k) { run(k, std::integral_constant<int, 2>{}); });
  return true;
}

// acc += the pair p of row x . its W vectors; `half`: an odd K's last pair (second element 0).
template <int NV>
TSPP_AVX512_BF16_TARGET inline __attribute__((always_inline)) void dot_row_pair(__m512 (&acc)[NV], const uint16_t* x,
                                                                                int p, bool half,
                                                                                const __m512i (&w)[NV]) {
  uint32_t word = x[2 * p];
  if (!half) word |= static_cast<uint32_t>(x[2 * p + 1]) << 16;
  const __m512bh xp = (__m512bh)_mm512_set1_epi32(static_cast<int>(word));
#pragma GCC unroll 2
  for (int v = 0; v < NV; ++v) acc[v] = _mm512_dpbf16_ps(acc[v], xp, (__m512bh)w[v]);
}

// The same for bfloat16: P pairs of K (W packed in pairs) held in registers, one dot product
// per pair of K; an odd K's last feature pairs with zero (the row may end there). Two sets of
// sums as in kernel_bf16 (alternate whole pairs, the rest to the first set): the chains are
// half as long, and the bits are the row-group kernel's.
template <int P, int NV, bool OddK>
TSPP_AVX512_BF16_TARGET void narrow_kernel_bf16(int64_t count, const int32_t* src, const int32_t* dst,
                                                const c10::BFloat16* feats, int64_t ldf,
                                                const c10::BFloat16* W_packed, int64_t N, float* out, int64_t ldo,
                                                __mmask16 tail, bool accumulate) {
  constexpr int kFull = OddK ? P - 1 : P;
  const auto* wp = reinterpret_cast<const uint32_t*>(W_packed);
  __m512i w[P][NV];
#pragma GCC unroll 16
  for (int p = 0; p < P; ++p)
#pragma GCC unroll 2
    for (int v = 0; v < NV; ++v)
      w[p][v] = v == NV - 1 ? _mm512_maskz_loadu_epi32(tail, wp + p * N + 16 * v)
                            : _mm512_loadu_si512(wp + p * N + 16 * v);
  for (int64_t i = 0; i < count; ++i) {
    if (i + kPrefetchPairs < count) __builtin_prefetch(feats + static_cast<int64_t>(src[i + kPrefetchPairs]) * ldf);
    const auto* x = reinterpret_cast<const uint16_t*>(feats + static_cast<int64_t>(src[i]) * ldf);
    float* o = out + static_cast<int64_t>(dst[i]) * ldo;
    __m512 acc[2][NV];
#pragma GCC unroll 2
    for (int v = 0; v < NV; ++v) acc[0][v] = acc[1][v] = _mm512_setzero_ps();
    int p = 0;
#pragma GCC unroll 16
    for (; p + 1 < kFull; p += 2) {
      dot_row_pair<NV>(acc[0], x, p, false, w[p]);
      dot_row_pair<NV>(acc[1], x, p + 1, false, w[p + 1]);
    }
    if (p < kFull) {
      dot_row_pair<NV>(acc[0], x, p, false, w[p]);
      ++p;
    }
    if (OddK) dot_row_pair<NV>(acc[0], x, p, true, w[p]);
#pragma GCC unroll 2
    for (int v = 0; v < NV; ++v) acc[0][v] = _mm512_add_ps(acc[0][v], acc[1][v]);
    store_register_row<NV>(acc[0], o, tail, accumulate);
  }
}

// bfloat16: the pairs of K take the registers K took in float32 (up to 32 or 24 features).
bool narrow_pair_gemm(int64_t count, const int32_t* src, const int32_t* dst, const c10::BFloat16* feats, int64_t ldf,
                      int64_t K, const c10::BFloat16* W_packed, int64_t N, float* out, int64_t ldo, bool accumulate) {
  const int64_t nv = (N + 15) / 16, pairs = (K + 1) / 2;
  if (K < 1 || N < 1 || nv > 2 || pairs > kNarrowK[nv]) return false;
  const __mmask16 tail = static_cast<__mmask16>((1u << (N - 16 * (nv - 1))) - 1u);
  const auto run = [&](auto p, auto nv_) {
    constexpr int kP = decltype(p)::value, kNv = decltype(nv_)::value;
    if (K % 2) narrow_kernel_bf16<kP, kNv, true>(count, src, dst, feats, ldf, W_packed, N, out, ldo, tail, accumulate);
    else narrow_kernel_bf16<kP, kNv, false>(count, src, dst, feats, ldf, W_packed, N, out, ldo, tail, accumulate);
  };
  if (nv == 1) with_constant<kNarrowK[1]>(pairs, [&](auto p) { run(p, std::integral_constant<int, 1>{}); });
  else with_constant<kNarrowK[2]>(pairs, [&](auto p) { run(p, std::integral_constant<int, 2>{}); });
  return true;
}

template <typename T>
void pair_gemm_impl(int64_t count, const int32_t* src, const int32_t* dst, const T* feats, int64_t ldf, int64_t K,
                    const T* W, int64_t N, float* out, int64_t ldo, bool accumulate) {
  if (narrow_pair_gemm(count, src, dst, feats, ldf, K, W, N, out, ldo, accumulate)) return;
  constexpr int64_t kRows = kRowGroup;
  const T* a[kRows];
  float* o[kRows];
  const T* w[1] = {W};
  const int64_t start =
      N <= kMaxPairRowsColumns ? pair_rows(count, src, dst, feats, ldf, K, W, N, out, ldo, accumulate) : 0;
  for (int64_t i0 = start; i0 < count; i0 += kRows) {
    const int64_t rows = std::min(kRows, count - i0);
    if (i0 + kRows < count)
      prefetch_rows(feats, ldf, src + i0 + kRows, std::min(kRows, count - i0 - kRows), K * static_cast<int64_t>(sizeof(T)));
    for (int64_t m = 0; m < rows; ++m) {
      a[m] = feats + static_cast<int64_t>(src[i0 + m]) * ldf;
      o[m] = out + static_cast<int64_t>(dst[i0 + m]) * ldo;
    }
    columns<T, kRows>(rows, 1, a, K, w, N, o, accumulate);
  }
}

}  // namespace

namespace {

// The chosen instruction set, and whether the AVX-512 kernels (the bf16 dot ones included) are
// off; set from the CPU and the environment on first use, changed by set_register_isa.
std::atomic<int> chosen_isa{-1};
std::atomic<bool> avx512_off{false};

RegisterIsa initial_isa() {
  avx512_off = disabled_by_env("TSPP_DISABLE_AVX512_KERNELS");
  if (disabled_by_env("TSPP_DISABLE_PAIR_KERNEL")) return RegisterIsa::kNone;
  if (cpu_has_avx512(/*bf16=*/false) && !avx512_off) return RegisterIsa::kAvx512;
  return cpu_has_avx2_fma() ? RegisterIsa::kAvx2 : RegisterIsa::kNone;
}

}  // namespace

RegisterIsa register_isa() {
  int isa = chosen_isa.load(std::memory_order_relaxed);
  if (isa < 0) {
    static const int initial = static_cast<int>(initial_isa());
    int unset = -1;
    chosen_isa.compare_exchange_strong(unset, initial);
    isa = chosen_isa.load();
  }
  return static_cast<RegisterIsa>(isa);
}

bool avx512_kernels_off() {
  register_isa();  // reads the environment once
  return avx512_off.load(std::memory_order_relaxed);
}

void set_register_isa(const std::string& name) {
  register_isa();
  if (name == "avx512") {
    TORCH_CHECK(cpu_has_avx512(/*bf16=*/false), "cpu kernels 'avx512': this CPU lacks AVX-512 F/BW/VL");
    avx512_off = false;
    chosen_isa = static_cast<int>(RegisterIsa::kAvx512);
  } else if (name == "avx2") {
    TORCH_CHECK(cpu_has_avx2_fma(), "cpu kernels 'avx2': this CPU lacks AVX2 + FMA");
    avx512_off = true;
    chosen_isa = static_cast<int>(RegisterIsa::kAvx2);
  } else {
    TORCH_CHECK(name == "none", "cpu kernels must be 'avx512', 'avx2' or 'none', got '", name, "'");
    // As at start with TSPP_DISABLE_PAIR_KERNEL=1: the state follows from the name alone.
    avx512_off = disabled_by_env("TSPP_DISABLE_AVX512_KERNELS");
    chosen_isa = static_cast<int>(RegisterIsa::kNone);
  }
}

bool pair_gemm_available() { return register_isa() != RegisterIsa::kNone; }

void pair_gemm(int64_t count, const int32_t* src, const int32_t* dst, const float* feats, int64_t ldf, int64_t K,
               const float* W, int64_t N, float* out, int64_t ldo, bool accumulate) {
  if (register_isa() == RegisterIsa::kAvx512)
    return pair_gemm_impl(count, src, dst, feats, ldf, K, W, N, out, ldo, accumulate);
  avx2::pair_gemm(count, src, dst, feats, ldf, K, W, N, out, ldo, accumulate);
}

void pair_gemm(int64_t count, const int32_t* src, const int32_t* dst, const c10::BFloat16* feats, int64_t ldf,
               int64_t K, const c10::BFloat16* W_packed, int64_t N, float* out, int64_t ldo, bool accumulate) {
  pair_gemm_impl(count, src, dst, feats, ldf, K, W_packed, N, out, ldo, accumulate);
}

// bfloat16 with float W: the AVX2 widening kernels on either instruction set.
void pair_gemm(int64_t count, const int32_t* src, const int32_t* dst, const c10::BFloat16* feats, int64_t ldf,
               int64_t K, const float* W, int64_t N, float* out, int64_t ldo, bool accumulate) {
  avx2::pair_gemm(count, src, dst, feats, ldf, K, W, N, out, ldo, accumulate);
}

void rows_gemm(int64_t rows, int64_t terms, const float* const* a_rows, int64_t K, const float* const* W_terms,
               int64_t N, float* const* out_rows, bool accumulate) {
  if (register_isa() == RegisterIsa::kAvx512)
    return columns<float, kRowGroup>(rows, terms, a_rows, K, W_terms, N, out_rows, accumulate);
  avx2::rows_gemm(rows, terms, a_rows, K, W_terms, N, out_rows, accumulate);
}

void rows_gemm(int64_t rows, int64_t terms, const c10::BFloat16* const* a_rows, int64_t K,
               const float* const* W_terms, int64_t N, float* const* out_rows, bool accumulate) {
  avx2::rows_gemm(rows, terms, a_rows, K, W_terms, N, out_rows, accumulate);
}

void rows_gemm(int64_t rows, int64_t terms, const c10::BFloat16* const* a_rows, int64_t K,
               const c10::BFloat16* const* W_terms, int64_t N, float* const* out_rows, bool accumulate) {
  columns<c10::BFloat16, kRowGroup>(rows, terms, a_rows, K, W_terms, N, out_rows, accumulate);
}

void rows_gemm(int64_t rows, int64_t terms, const c10::BFloat16* const* a_rows, int64_t K,
               const c10::BFloat16* const* W_terms, int64_t N, c10::BFloat16* const* out_rows) {
  TORCH_CHECK(terms <= kMaxNarrowRowTerms, "rows_gemm: bfloat16 output rows take at most ", kMaxNarrowRowTerms,
              " terms, got ", terms);
  columns<c10::BFloat16, kRowGroup>(rows, terms, a_rows, K, W_terms, N, out_rows, false);
}

TORCH_LIBRARY_IMPL(torchsparse_pp, CompositeExplicitAutograd, m) {
  m.impl("cpu_register_kernels", []() { return pair_gemm_available(); });
  m.impl("cpu_register_isa", []() { return static_cast<int64_t>(register_isa()); });
  m.impl("cpu_set_register_isa", [](c10::string_view isa) { set_register_isa(std::string(isa)); });
}

}  // namespace torchsparse_pp
