// The AVX2 + FMA register kernels of pair_gemm_avx2.h. Compiled for the baseline ISA; the kernels
// carry their own target attribute and run only after the CPU check. A vector holds 8 floats and
// there are 16 vector registers, so a pass keeps 12 sums: 6 rows x 2 vectors (16 output columns)
// in general, one pass per 16 columns re-reading the rows from L1; fetch-on-demand outputs of up
// to 32 columns (and 48, 64) take 12 / NV rows x NV vectors in one loop (one_pass_kernel).
#include "pair_gemm_avx2.h"

#include <immintrin.h>

#include <algorithm>
#include <type_traits>

#include "cpu_features.h"
#include "pair_gemm.h"
#include "register_tile.h"
#include "tile_gemm.h"

namespace torchsparse_pp {
namespace avx2 {

namespace {

constexpr int kLanes = 8;
constexpr int64_t kRows = kRowGroup;       // rows per group; a_rows hold kRows pointers per term
constexpr int64_t kColumns = 2 * kLanes;   // output columns per pass
constexpr int64_t kTermChunk = 64;         // terms summed per pass, as the AVX-512 kernels chunk them
constexpr int64_t kPrefetchPairs = 8;      // pairs ahead whose source row the narrow kernel fetches

template <int V>
using Int = std::integral_constant<int, V>;
template <bool B>
using Bool = std::integral_constant<bool, B>;

// The lanes [0, last) of a vector (last in 1..8), as a maskload / maskstore mask.
TSPP_AVX2_TARGET inline __m256i lanes_below(int last) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(last), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

// Vector v of a row of NV vectors; with Masked the last one reads only the lanes of `tail`.
template <int NV, bool Masked>
TSPP_AVX2_TARGET inline __m256 load_vector(const float* row, int v, __m256i tail) {
  if (Masked && v == NV - 1) return _mm256_maskload_ps(row + kLanes * v, tail);
  return _mm256_loadu_ps(row + kLanes * v);
}

// row = acc, or row + acc with `accumulate`.
template <int NV, bool Masked>
TSPP_AVX2_TARGET inline void store_row(const __m256 (&acc)[NV], float* row, __m256i tail, bool accumulate) {
#pragma GCC unroll 4
  for (int v = 0; v < NV; ++v) {
    const __m256 sum = accumulate ? _mm256_add_ps(acc[v], load_vector<NV, Masked>(row, v, tail)) : acc[v];
    if (Masked && v == NV - 1) _mm256_maskstore_ps(row + kLanes * v, tail, sum);
    else _mm256_storeu_ps(row + kLanes * v, sum);
  }
}

// acc[m] += a[m][k] * w[0 .. NV vectors) for MR rows: one step of k. With the row's vectors of W
// and one broadcast at a time when they fit the 16 registers, else all broadcasts and one vector
// of W at a time.
template <int MR, int NV, bool Masked>
TSPP_AVX2_TARGET inline __attribute__((always_inline)) void fma_step(__m256 (&acc)[MR][NV], const float* const* a,
                                                                    int64_t k, const float* w, __m256i tail) {
  if constexpr (NV * (MR + 1) + 1 <= 16) {
    __m256 b[NV];
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) b[v] = load_vector<NV, Masked>(w, v, tail);
#pragma GCC unroll 12
    for (int m = 0; m < MR; ++m) {
      const __m256 x = _mm256_broadcast_ss(a[m] + k);
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) acc[m][v] = _mm256_fmadd_ps(x, b[v], acc[m][v]);
    }
  } else {
    __m256 x[MR];
#pragma GCC unroll 12
    for (int m = 0; m < MR; ++m) x[m] = _mm256_broadcast_ss(a[m] + k);
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) {
      const __m256 b = load_vector<NV, Masked>(w, v, tail);
#pragma GCC unroll 12
      for (int m = 0; m < MR; ++m) acc[m][v] = _mm256_fmadd_ps(x[m], b, acc[m][v]);
    }
  }
}

// out_rows[m] (+)= sum_j a_rows[j * kRows + m][:K] @ W_terms[j] (rows of ldw floats) for MR rows
// and NV vectors of columns, the sums in registers across all terms.
template <int MR, int NV, bool Masked>
TSPP_AVX2_TARGET void rows_kernel(int64_t terms, const float* const* a_rows, int64_t K, const float* const* W_terms,
                                  int64_t ldw, float* const* out_rows, int last, bool accumulate) {
  const __m256i tail = lanes_below(last);
  __m256 acc[MR][NV];
#pragma GCC unroll 8
  for (int m = 0; m < MR; ++m)
#pragma GCC unroll 2
    for (int v = 0; v < NV; ++v) acc[m][v] = _mm256_setzero_ps();
  for (int64_t j = 0; j < terms; ++j) {
    const float* const* a = a_rows + j * kRows;
    const float* w = W_terms[j];
    for (int64_t k = 0; k < K; ++k, w += ldw) fma_step<MR, NV, Masked>(acc, a, k, w, tail);
  }
#pragma GCC unroll 8
  for (int m = 0; m < MR; ++m) store_row<NV, Masked>(acc[m], out_rows[m], tail, accumulate);
}

// Calls fn(Int<NV>, Bool<Masked>) for a block of `width` (1 .. 8 * MaxNV) columns.
template <int MaxNV = 2, typename Fn>
void with_block(int64_t width, Fn&& fn) {
  const bool masked = width % kLanes != 0;
  with_constant<MaxNV>((width + kLanes - 1) / kLanes,
                       [&](auto nv) { masked ? fn(nv, Bool<true>{}) : fn(nv, Bool<false>{}); });
}

// The lanes of the last vector of a block of `width` columns.
inline int last_lanes(int64_t width) { return static_cast<int>(width - kLanes * ((width - 1) / kLanes)); }

// out rows[m] (+)= sum_j rows_j[m] @ W_j, 16 columns per pass, terms in chunks of kTermChunk.
void columns(int64_t rows, int64_t terms, const float* const* a, int64_t K, const float* const* W, int64_t N,
             float* const* out_rows, bool accumulate) {
  const float* wn[kTermChunk];
  float* on[kRows];
  for (int64_t n0 = 0; n0 < N; n0 += kColumns) {
    const int64_t width = std::min(kColumns, N - n0);
    for (int64_t m = 0; m < rows; ++m) on[m] = out_rows[m] + n0;
    for (int64_t j0 = 0; j0 < terms; j0 += kTermChunk) {
      const int64_t nj = std::min(kTermChunk, terms - j0);
      for (int64_t j = 0; j < nj; ++j) wn[j] = W[j0 + j] + n0;
      const bool add = accumulate || j0 > 0;
      with_block(width, [&](auto nv, auto masked) {
        with_constant<kRows>(rows, [&](auto mr) {
          rows_kernel<decltype(mr)::value, decltype(nv)::value, decltype(masked)::value>(
              nj, a + j0 * kRows, K, wn, N, on, last_lanes(width), add);
        });
      });
    }
  }
}

// Narrow operands (the stem's 4 -> 16, or K <= 12 for at most 8 columns): W stays in 12
// registers for the whole call, one row in and one row out per pair, summed as rows_kernel sums.
template <int K, int NV, bool Masked>
TSPP_AVX2_TARGET void narrow_kernel(int64_t count, const int32_t* src, const int32_t* dst, const float* feats,
                                    int64_t ldf, const float* W, int64_t N, float* out, int64_t ldo, int last,
                                    bool accumulate) {
  const __m256i tail = lanes_below(last);
  __m256 w[K][NV];
#pragma GCC unroll 12
  for (int k = 0; k < K; ++k)
#pragma GCC unroll 2
    for (int v = 0; v < NV; ++v) w[k][v] = load_vector<NV, Masked>(W + k * N, v, tail);
  for (int64_t i = 0; i < count; ++i) {
    if (i + kPrefetchPairs < count) __builtin_prefetch(feats + static_cast<int64_t>(src[i + kPrefetchPairs]) * ldf);
    const float* x = feats + static_cast<int64_t>(src[i]) * ldf;
    __m256 acc[NV];
#pragma GCC unroll 2
    for (int v = 0; v < NV; ++v) acc[v] = _mm256_setzero_ps();
#pragma GCC unroll 12
    for (int k = 0; k < K; ++k) {
      const __m256 xk = _mm256_broadcast_ss(x + k);
#pragma GCC unroll 2
      for (int v = 0; v < NV; ++v) acc[v] = _mm256_fmadd_ps(xk, w[k][v], acc[v]);
    }
    store_row<NV, Masked>(acc, out + static_cast<int64_t>(dst[i]) * ldo, tail, accumulate);
  }
}

// Largest K the narrow kernel takes for NV vectors of columns (W in 12 registers).
constexpr int64_t kNarrowK[3] = {0, 12, 6};

bool narrow_pair_gemm(int64_t count, const int32_t* src, const int32_t* dst, const float* feats, int64_t ldf,
                      int64_t K, const float* W, int64_t N, float* out, int64_t ldo, bool accumulate) {
  if (K < 1 || N < 1 || N > kColumns || K > kNarrowK[(N + kLanes - 1) / kLanes]) return false;
  with_block(N, [&](auto nv, auto masked) {
    with_constant<kNarrowK[decltype(nv)::value]>(K, [&](auto k) {
      narrow_kernel<decltype(k)::value, decltype(nv)::value, decltype(masked)::value>(
          count, src, dst, feats, ldf, W, N, out, ldo, last_lanes(N), accumulate);
    });
  });
  return true;
}

// d[:n] = float(s[:n]): a bfloat16 is the upper half of a float.
TSPP_AVX2_TARGET void widen(const c10::BFloat16* s, int64_t n, float* d) {
  const auto* bits = reinterpret_cast<const uint16_t*>(s);
  int64_t j = 0;
  for (; j + kLanes <= n; j += kLanes) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(bits + j));
    _mm256_storeu_ps(d + j, _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16)));
  }
  for (; j < n; ++j) d[j] = __builtin_bit_cast(float, static_cast<uint32_t>(bits[j]) << 16);
}

// One group of MR pairs: all its 16-column passes in one call (no dispatch between them), and
// the next group's source rows (row_bytes each) and, when adding, its destination rows fetched
// a pass at a time while this group computes. 6-12 % faster than a dispatch per pass and a
// fetch of the source rows only (Zen 3, 48- and 64-column layers, 1 and 2 threads).
template <int MR>
TSPP_AVX2_TARGET void group_passes(const float* const* a, int64_t K, const float* W, int64_t N, float* const* o,
                                   bool accumulate, const char* const* next_src, float* const* next_dst,
                                   int64_t next, int64_t row_bytes) {
  const float* w[1];
  float* on[kRows];
  const int64_t passes = (N + kColumns - 1) / kColumns;
  const int64_t per_pass = (next + passes - 1) / passes;
  int64_t fetched = 0;
  for (int64_t n0 = 0; n0 < N; n0 += kColumns) {
    for (const int64_t end = std::min(next, fetched + per_pass); fetched < end; ++fetched) {
      prefetch_row(next_src[fetched], row_bytes);
      if (accumulate) __builtin_prefetch(next_dst[fetched]);
    }
    w[0] = W + n0;
#pragma GCC unroll 6
    for (int m = 0; m < MR; ++m) on[m] = o[m] + n0;
    const int64_t width = std::min(kColumns, N - n0);
    if (width == kColumns) {
      rows_kernel<MR, 2, false>(1, a, K, w, N, on, kLanes, accumulate);
    } else {
      with_block(width, [&](auto nv, auto masked) {
        rows_kernel<MR, decltype(nv)::value, decltype(masked)::value>(1, a, K, w, N, on, last_lanes(width),
                                                                       accumulate);
      });
    }
  }
}

// Groups of kRows pairs; `row` gives the float row the kernel reads for pair i and slot m of
// its group (the source row itself, or its widened copy).
template <typename T, typename RowFn>
void pair_groups(int64_t count, const int32_t* src, const int32_t* dst, const T* feats, int64_t ldf, int64_t K,
                 const float* W, int64_t N, float* out, int64_t ldo, bool accumulate, RowFn&& row) {
  const float* a[kRows];
  float* o[kRows];
  const char* next_src[kRows];
  float* next_dst[kRows];
  for (int64_t i0 = 0; i0 < count; i0 += kRows) {
    const int64_t rows = std::min(kRows, count - i0);
    const int64_t next = std::clamp<int64_t>(count - i0 - kRows, 0, kRows);
    for (int64_t m = 0; m < rows; ++m) {
      a[m] = row(i0 + m, m);
      o[m] = out + static_cast<int64_t>(dst[i0 + m]) * ldo;
    }
    for (int64_t m = 0; m < next; ++m) {
      next_src[m] = reinterpret_cast<const char*>(feats + static_cast<int64_t>(src[i0 + kRows + m]) * ldf);
      next_dst[m] = out + static_cast<int64_t>(dst[i0 + kRows + m]) * ldo;
    }
    with_constant<kRows>(rows, [&](auto mr) {
      group_passes<decltype(mr)::value>(a, K, W, N, o, accumulate, next_src, next_dst, next,
                                        K * static_cast<int64_t>(sizeof(T)));
    });
  }
}

// The rows src[0 .. count) of feats (K elements each), fetched into cache.
template <typename T>
void prefetch_group(const T* feats, int64_t ldf, const int32_t* src, int64_t count, int64_t K) {
  for (int64_t m = 0; m < count; ++m) prefetch_row(feats + static_cast<int64_t>(src[m]) * ldf, K);
}

// Rows per group of the one-pass kernel for NV vectors of output columns.
template <int NV>
constexpr int kOnePassRows = NV == 1 ? 12 : NV == 2 ? 6 : NV == 3 ? 4 : 3;
// Groups ahead whose source and destination rows the one-pass kernel fetches.
constexpr int64_t kOnePassAhead = 8;

// `blocks` blocks of NV vectors (NV <= 4) of output columns over each group of pairs, one after
// the other: the group's row pointers stay in registers and no call or pointer array sits
// between groups (for 16- and 32-channel layers these cost about as much as the products:
// 1.1-1.35x faster per layer on a Zen 3; 48 columns as 2 rows x 6 vectors were slower).
// Sums as rows_kernel sums them.
template <int NV, bool Masked>
TSPP_AVX2_TARGET void one_pass_kernel(int64_t groups, const int32_t* src, const int32_t* dst, const float* feats,
                                      int64_t ldf, int64_t K, const float* W, int64_t N, float* out, int64_t ldo,
                                      int last, bool accumulate, int64_t blocks) {
  constexpr int MR = kOnePassRows<NV>;
  const __m256i tail = lanes_below(last);
  for (int64_t g = 0; g < groups; ++g, src += MR, dst += MR) {
    if (g + kOnePassAhead < groups) {
#pragma GCC unroll 12
      for (int m = 0; m < MR; ++m) {
        prefetch_row(feats + static_cast<int64_t>(src[kOnePassAhead * MR + m]) * ldf, K);
        if (accumulate) __builtin_prefetch(out + static_cast<int64_t>(dst[kOnePassAhead * MR + m]) * ldo);
      }
    }
    const float* a[MR];
#pragma GCC unroll 12
    for (int m = 0; m < MR; ++m) a[m] = feats + static_cast<int64_t>(src[m]) * ldf;
    for (int64_t n0 = 0; n0 < blocks * NV * kLanes; n0 += NV * kLanes) {
      __m256 acc[MR][NV];
#pragma GCC unroll 12
      for (int m = 0; m < MR; ++m)
#pragma GCC unroll 4
        for (int v = 0; v < NV; ++v) acc[m][v] = _mm256_setzero_ps();
      const float* w = W + n0;
      for (int64_t k = 0; k < K; ++k, w += N) fma_step<MR, NV, Masked>(acc, a, k, w, tail);
#pragma GCC unroll 12
      for (int m = 0; m < MR; ++m)
        store_row<NV, Masked>(acc[m], out + static_cast<int64_t>(dst[m]) * ldo + n0, tail, accumulate);
    }
  }
}

// Pairs whose output the one-pass kernel takes (<= 32, 48 or 64 columns), by full groups;
// returns how many pairs it took (the rest, fewer than a group, go through pair_groups).
int64_t one_pass_pair_gemm(int64_t count, const int32_t* src, const int32_t* dst, const float* feats, int64_t ldf,
                           int64_t K, const float* W, int64_t N, float* out, int64_t ldo, bool accumulate) {
  // 48 and 64 columns: two blocks of 3 or 4 vectors per group (2-10 % faster per layer than
  // pair_groups' passes of 16; at 128 columns, four blocks were not).
  const int64_t blocks = N == 48 || N == 64 ? 2 : 1;
  if (N > 4 * kLanes * blocks) return 0;
  int64_t taken = 0;
  const auto run = [&](auto nv, auto masked) {
    constexpr int NV = decltype(nv)::value;
    const int64_t groups = count / kOnePassRows<NV>;
    one_pass_kernel<NV, decltype(masked)::value>(groups, src, dst, feats, ldf, K, W, N, out, ldo,
                                                 last_lanes(N / blocks), accumulate, blocks);
    taken = groups * kOnePassRows<NV>;
  };
  with_block<4>(N / blocks, run);
  return taken;
}

// Rows of dw per register block: 12 accumulators (with one vector of columns, 12 rows).
template <int NV>
constexpr int kBlockRows = NV == 1 ? 12 : 6;

// Pairs per group of the weight gradient: their rows (~24 KiB) stay in cache while every
// register block of dw passes over them, and each block's sums go through dw once per group.
// Measured on a Zen 3 (MinkUNet 0.5x layers, 2 threads): 64 pairs of 48 + 48 columns beat 32.
constexpr int64_t kMaxGroupPairs = 64;
inline int64_t wgrad_group_pairs(int64_t c_src, int64_t c_dst) {
  return std::clamp<int64_t>((int64_t(24) << 10) / (4 * (c_src + c_dst)), 8, kMaxGroupPairs);
}

// dw[m, :] += sum_i x_rows[i][i0 + m] g_rows[i][n0 ..] over one group's pairs, for MR rows and
// NV vectors of columns; dw points at the block's first element.
template <int MR, int NV, bool Masked>
TSPP_AVX2_TARGET void group_kernel(int64_t count, const float* const* x_rows, const float* const* g_rows, int64_t i0,
                                   int64_t n0, float* dw, int64_t ldw, int last) {
  const __m256i tail = lanes_below(last);
  __m256 acc[MR][NV];
#pragma GCC unroll 12
  for (int m = 0; m < MR; ++m)
#pragma GCC unroll 2
    for (int v = 0; v < NV; ++v) acc[m][v] = _mm256_setzero_ps();
  for (int64_t i = 0; i < count; ++i) {
    const float* x = x_rows[i] + i0;
    const float* g = g_rows[i] + n0;
    __m256 b[NV];
#pragma GCC unroll 2
    for (int v = 0; v < NV; ++v) b[v] = load_vector<NV, Masked>(g, v, tail);
#pragma GCC unroll 12
    for (int m = 0; m < MR; ++m) {
      const __m256 xm = _mm256_broadcast_ss(x + m);
#pragma GCC unroll 2
      for (int v = 0; v < NV; ++v) acc[m][v] = _mm256_fmadd_ps(xm, b[v], acc[m][v]);
    }
  }
#pragma GCC unroll 12
  for (int m = 0; m < MR; ++m) store_row<NV, Masked>(acc[m], dw + m * ldw, tail, true);
}

}  // namespace

void pair_gemm(int64_t count, const int32_t* src, const int32_t* dst, const float* feats, int64_t ldf, int64_t K,
               const float* W, int64_t N, float* out, int64_t ldo, bool accumulate) {
  if (N < 1) return;  // no output columns (a C_out = 0 conv): nothing to write
  if (narrow_pair_gemm(count, src, dst, feats, ldf, K, W, N, out, ldo, accumulate)) return;
  const int64_t taken = one_pass_pair_gemm(count, src, dst, feats, ldf, K, W, N, out, ldo, accumulate);
  count -= taken;
  src += taken;
  dst += taken;
  pair_groups(count, src, dst, feats, ldf, K, W, N, out, ldo, accumulate,
              [&](int64_t i, int64_t) { return feats + static_cast<int64_t>(src[i]) * ldf; });
}

void pair_gemm(int64_t count, const int32_t* src, const int32_t* dst, const c10::BFloat16* feats, int64_t ldf,
               int64_t K, const float* W, int64_t N, float* out, int64_t ldo, bool accumulate) {
  if (N < 1) return;
  float* widened = scratch<float, 6>(kRows * K);
  pair_groups(count, src, dst, feats, ldf, K, W, N, out, ldo, accumulate, [&](int64_t i, int64_t m) {
    widen(feats + static_cast<int64_t>(src[i]) * ldf, K, widened + m * K);
    return static_cast<const float*>(widened + m * K);
  });
}

void rows_gemm(int64_t rows, int64_t terms, const float* const* a_rows, int64_t K, const float* const* W_terms,
               int64_t N, float* const* out_rows, bool accumulate) {
  columns(rows, terms, a_rows, K, W_terms, N, out_rows, accumulate);
}

void rows_gemm(int64_t rows, int64_t terms, const c10::BFloat16* const* a_rows, int64_t K,
               const float* const* W_terms, int64_t N, float* const* out_rows, bool accumulate) {
  float* widened = scratch<float, 6>(kTermChunk * kRows * K);
  const float** a = scratch<const float*, 7>(kTermChunk * kRows);
  for (int64_t j0 = 0; j0 < terms; j0 += kTermChunk) {
    const int64_t nj = std::min(kTermChunk, terms - j0);
    for (int64_t j = 0; j < nj; ++j)
      for (int64_t m = 0; m < rows; ++m) {
        float* d = widened + (j * kRows + m) * K;
        widen(a_rows[(j0 + j) * kRows + m], K, d);
        a[j * kRows + m] = d;
      }
    columns(rows, nj, a, K, W_terms + j0, N, out_rows, accumulate || j0 > 0);
  }
}

void pair_wgrad(int64_t count, const int32_t* src, const int32_t* dst, const float* feats, int64_t c_src,
                const float* grad, int64_t c_dst, float* dw, bool accumulate) {
  if (c_src < 1 || c_dst < 1) return;  // an empty weight
  if (!accumulate) std::fill(dw, dw + c_src * c_dst, 0.0f);
  const int64_t group = wgrad_group_pairs(c_src, c_dst);
  int64_t blocks = 0;
  for (int64_t n0 = 0; n0 < c_dst; n0 += kColumns) {
    const int64_t rows = c_dst - n0 > kLanes ? kBlockRows<2> : kBlockRows<1>;
    blocks += (c_src + rows - 1) / rows;
  }
  const float* x_rows[kMaxGroupPairs];
  const float* g_rows[kMaxGroupPairs];
  for (int64_t p0 = 0; p0 < count; p0 += group) {
    const int64_t n = std::min(group, count - p0);
    // The next group's rows are fetched while this one computes, a few pairs before each register
    // block: fetched all at once, they stall the loads behind them (twice as slow on a Zen 3).
    const int64_t next = p0 + group < count ? std::min(group, count - p0 - group) : 0;
    const int64_t per_block = (next + blocks - 1) / blocks;
    int64_t fetched = 0;
    for (int64_t i = 0; i < n; ++i) {
      x_rows[i] = feats + static_cast<int64_t>(src[p0 + i]) * c_src;
      g_rows[i] = grad + static_cast<int64_t>(dst[p0 + i]) * c_dst;
    }
    for (int64_t n0 = 0; n0 < c_dst; n0 += kColumns) {
      const int64_t width = std::min(kColumns, c_dst - n0);
      with_block(width, [&](auto nv, auto masked) {
        constexpr int MR = kBlockRows<decltype(nv)::value>;
        for (int64_t i0 = 0; i0 < c_src; i0 += MR) {
          if (fetched < next) {
            const int64_t k = std::min(per_block, next - fetched);
            prefetch_group(feats, c_src, src + p0 + group + fetched, k, c_src);
            prefetch_group(grad, c_dst, dst + p0 + group + fetched, k, c_dst);
            fetched += k;
          }
          with_constant<MR>(std::min<int64_t>(MR, c_src - i0), [&](auto rows) {
            group_kernel<decltype(rows)::value, decltype(nv)::value, decltype(masked)::value>(
                n, x_rows, g_rows, i0, n0, dw + i0 * c_dst + n0, c_dst, last_lanes(width));
          });
        }
      });
    }
  }
}

}  // namespace avx2
}  // namespace torchsparse_pp
