// The AVX-512 register weight-gradient kernels of pair_wgrad.h, float32 and bfloat16 (the AVX2
// one is in pair_gemm_avx2.cpp). Compiled for the baseline ISA; the kernels carry their own
// target attributes and run only after the CPU check.
#include "pair_wgrad.h"

#include <immintrin.h>

#include <algorithm>

#include <c10/util/Exception.h>

#include "bf16_gemm.h"
#include "cpu_features.h"
#include "pair_gemm.h"
#include "pair_gemm_avx2.h"
#include "register_tile.h"

// GCC 12 warns of the intrinsic headers' own undefined operands (_mm512_undefined_*).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

namespace torchsparse_pp {

namespace {

// Pairs ahead whose rows the first register block fetches (later blocks find them in cache).
constexpr int64_t kAhead = 8;

// dw[m, 16 v ..] (+)= sum_i x_i[m] g_i[16 v ..] for MR rows and NV vectors of columns; feats,
// grad and dw already point at the block's first row / column.
template <int MR, int NV>
TSPP_AVX512_TARGET void outer_kernel(int64_t count, const int32_t* src, const int32_t* dst, const float* feats,
                                     int64_t ldf, const float* grad, int64_t ldg, float* dw, int64_t ldw,
                                     __mmask16 tail, bool accumulate, int64_t prefetch_bytes_f,
                                     int64_t prefetch_bytes_g, const float* feats_row0, const float* grad_row0) {
  __m512 acc[MR][NV];
#pragma GCC unroll 16
  for (int m = 0; m < MR; ++m)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) acc[m][v] = _mm512_setzero_ps();
  for (int64_t i = 0; i < count; ++i) {
    if (prefetch_bytes_f > 0 && i + kAhead < count) {
      const char* f = reinterpret_cast<const char*>(feats_row0 + static_cast<int64_t>(src[i + kAhead]) * ldf);
      const char* g = reinterpret_cast<const char*>(grad_row0 + static_cast<int64_t>(dst[i + kAhead]) * ldg);
      for (int64_t b = 0; b < prefetch_bytes_f; b += 64) __builtin_prefetch(f + b);
      for (int64_t b = 0; b < prefetch_bytes_g; b += 64) __builtin_prefetch(g + b);
    }
    const float* x = feats + static_cast<int64_t>(src[i]) * ldf;
    const float* g = grad + static_cast<int64_t>(dst[i]) * ldg;
    __m512 b[NV];
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v)
      b[v] = v == NV - 1 ? _mm512_maskz_loadu_ps(tail, g + 16 * v) : _mm512_loadu_ps(g + 16 * v);
#pragma GCC unroll 16
    for (int m = 0; m < MR; ++m) {
      const __m512 xm = _mm512_set1_ps(x[m]);
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) acc[m][v] = _mm512_fmadd_ps(xm, b[v], acc[m][v]);
    }
  }
  store_register_tile<MR, NV>(acc, dw, ldw, tail, accumulate);
}

// Rows per register block for NV vectors of columns: 24 accumulators at most, 12 rows at most
// (the broadcasts then outnumber the loads of the gradient row).
template <int NV>
constexpr int kBlockRows = NV == 1 ? 12 : NV == 2 ? 12 : NV == 3 ? 8 : 6;

// Register blocks of MR rows of dW (the last one narrower) over the column block at n0:
// kernel(rows, i0, prefetch bytes of a feature row, of a gradient row) runs one. The first block
// of the call meets the chunk's rows in memory, so it alone fetches them ahead.
template <int MR, typename T, typename Kernel>
void row_blocks(int64_t c_src, int64_t c_dst, int64_t n0, Kernel&& kernel) {
  for (int64_t i0 = 0; i0 < c_src; i0 += MR) {
    const bool first = n0 == 0 && i0 == 0;
    const int64_t pf = first ? c_src * int64_t(sizeof(T)) : 0, pg = first ? c_dst * int64_t(sizeof(T)) : 0;
    with_constant<MR>(std::min<int64_t>(MR, c_src - i0), [&](auto rows) { kernel(rows, i0, pf, pg); });
  }
}

// bfloat16: each dot product takes two pairs, so pairs go two at a time. Their two rows are
// merged into (even, odd) words in registers: the feature values of the block's MR rows into one
// vector (stored, then broadcast per row), the gradient columns into NV vectors. An odd count's
// last pair has a zero partner (its loads masked off).
template <int MR, int NV>
TSPP_AVX512_BF16_TARGET void outer_kernel_bf16(int64_t count, const int32_t* src, const int32_t* dst,
                                               const uint16_t* feats, int64_t ldf, const uint16_t* grad, int64_t ldg,
                                               float* dw, int64_t ldw, __mmask16 tail, bool accumulate,
                                               int64_t prefetch_bytes_f, int64_t prefetch_bytes_g,
                                               const uint16_t* feats_row0, const uint16_t* grad_row0) {
  static_assert(MR <= 16, "one vector holds the block's feature words");
  constexpr __mmask16 kRows = static_cast<__mmask16>((1u << MR) - 1u);
  const auto words = [](const uint16_t* even, const uint16_t* odd, __mmask16 k_even, __mmask16 k_odd)
      __attribute__((always_inline, target("avx512f,avx512bw,avx512vl"))) {
    const __m512i lo = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(k_even, even));
    const __m512i hi = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(k_odd, odd));
    return _mm512_or_si512(lo, _mm512_slli_epi32(hi, 16));
  };
  __m512 acc[MR][NV];
#pragma GCC unroll 16
  for (int m = 0; m < MR; ++m)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) acc[m][v] = _mm512_setzero_ps();
  alignas(64) uint32_t xw[16];
  for (int64_t i = 0; i < count; i += 2) {
    if (prefetch_bytes_f > 0)
      for (int64_t a = i + 2 * kAhead; a < std::min(count, i + 2 * kAhead + 2); ++a) {
        const char* f = reinterpret_cast<const char*>(feats_row0 + static_cast<int64_t>(src[a]) * ldf);
        const char* g = reinterpret_cast<const char*>(grad_row0 + static_cast<int64_t>(dst[a]) * ldg);
        for (int64_t b = 0; b < prefetch_bytes_f; b += 64) __builtin_prefetch(f + b);
        for (int64_t b = 0; b < prefetch_bytes_g; b += 64) __builtin_prefetch(g + b);
      }
    const int64_t j = i + 1 < count ? i + 1 : i;
    const __mmask16 has_odd = i + 1 < count ? __mmask16(0xFFFF) : __mmask16(0);
    const uint16_t* xe = feats + static_cast<int64_t>(src[i]) * ldf;
    const uint16_t* xo = feats + static_cast<int64_t>(src[j]) * ldf;
    const uint16_t* ge = grad + static_cast<int64_t>(dst[i]) * ldg;
    const uint16_t* go = grad + static_cast<int64_t>(dst[j]) * ldg;
    _mm512_store_si512(xw, words(xe, xo, kRows, kRows & has_odd));
    __m512i b[NV];
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) {
      const __mmask16 k = v == NV - 1 ? tail : __mmask16(0xFFFF);
      b[v] = words(ge + 16 * v, go + 16 * v, k, k & has_odd);
    }
#pragma GCC unroll 16
    for (int m = 0; m < MR; ++m) {
      const __m512bh x = (__m512bh)_mm512_set1_epi32(static_cast<int>(xw[m]));
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) acc[m][v] = _mm512_dpbf16_ps(acc[m][v], x, (__m512bh)b[v]);
    }
  }
  store_register_tile<MR, NV>(acc, dw, ldw, tail, accumulate);
}

// Rows per register block: 24 accumulators at most, 16 rows at most (one vector of words).
template <int NV>
constexpr int kBlockRowsBf16 = NV == 1 ? 16 : NV == 2 ? 12 : NV == 3 ? 8 : 6;

}  // namespace

bool pair_wgrad_pays(int64_t c_src, int64_t c_dst) {
  return register_isa() == RegisterIsa::kAvx512 || c_src * c_dst <= 128 * 64;
}

void pair_wgrad(int64_t count, const int32_t* src, const int32_t* dst, const float* feats, int64_t c_src,
                const float* grad, int64_t c_dst, float* dw, bool accumulate) {
  if (register_isa() != RegisterIsa::kAvx512)
    return avx2::pair_wgrad(count, src, dst, feats, c_src, grad, c_dst, dw, accumulate);
  for_column_blocks(c_dst, [&](int64_t n0, auto nv, __mmask16 tail) {
    constexpr int NV = decltype(nv)::value;
    row_blocks<kBlockRows<NV>, float>(c_src, c_dst, n0, [&](auto rows, int64_t i0, int64_t pf, int64_t pg) {
      outer_kernel<decltype(rows)::value, NV>(count, src, dst, feats + i0, c_src, grad + n0, c_dst,
                                              dw + i0 * c_dst + n0, c_dst, tail, accumulate, pf, pg, feats, grad);
    });
  });
}

}  // namespace torchsparse_pp

namespace torchsparse_pp {

bool bf16_pair_wgrad_pays(int64_t c_src, int64_t c_dst) { return bf16_dot_available() && c_src * c_dst <= 16 * 32; }

void pair_wgrad(int64_t count, const int32_t* src, const int32_t* dst, const c10::BFloat16* feats, int64_t c_src,
                const c10::BFloat16* grad, int64_t c_dst, float* dw, bool accumulate) {
  TORCH_CHECK(bf16_dot_available(), "the bfloat16 pair_wgrad needs AVX512-BF16");
  const auto* f = reinterpret_cast<const uint16_t*>(feats);
  const auto* g = reinterpret_cast<const uint16_t*>(grad);
  for_column_blocks(c_dst, [&](int64_t n0, auto nv, __mmask16 tail) {
    constexpr int NV = decltype(nv)::value;
    row_blocks<kBlockRowsBf16<NV>, uint16_t>(c_src, c_dst, n0, [&](auto rows, int64_t i0, int64_t pf, int64_t pg) {
      outer_kernel_bf16<decltype(rows)::value, NV>(count, src, dst, f + i0, c_src, g + n0, c_dst, dw + i0 * c_dst + n0,
                                                   c_dst, tail, accumulate, pf, pg, f, g);
    });
  });
}

}  // namespace torchsparse_pp
