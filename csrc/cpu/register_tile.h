// Shared pieces of the AVX-512 register kernels: storing a block of accumulators (float, or
// rounded to bfloat16), and picking the instantiation of a kernel templated on a small size known
// only at run time.
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <type_traits>

#include "cpu_features.h"

namespace torchsparse_pp {

// row[16 v ..] = acc[v] (+ what is there, with `accumulate`) for NV vectors of 16 columns; the
// last vector stores under `tail`.
template <int NV>
TSPP_AVX512_TARGET inline void store_register_row(__m512 (&acc)[NV], float* row, __mmask16 tail, bool accumulate) {
#pragma GCC unroll 4
  for (int v = 0; v < NV; ++v) {
    float* c = row + 16 * v;
    // Plain loads and stores where the vector is whole (masked ones cost more on some cores;
    // a constant all-ones mask compiles to a plain load, without GCC 12's warning on
    // _mm512_loadu_ps); only a partial last vector takes the tail mask. The output is read
    // only when summed into.
    __m512 sum = acc[v];
    if (v < NV - 1 || tail == __mmask16(0xFFFF)) {
      if (accumulate) sum = _mm512_add_ps(sum, _mm512_maskz_loadu_ps(__mmask16(0xFFFF), c));
      _mm512_storeu_ps(c, sum);
      continue;
    }
    if (accumulate) sum = _mm512_add_ps(sum, _mm512_maskz_loadu_ps(tail, c));
    _mm512_mask_storeu_ps(c, tail, sum);
  }
}

// The bfloat16 bits (in the low half of each 32-bit lane) of v rounded to nearest even, as
// c10::BFloat16 rounds; NaN becomes 0x7FC0. Bit-level, so no dependence on MXCSR or the
// AVX512-BF16 conversion's handling of denormals.
// (The shifts are the zero-masking forms: GCC 12 warns of the plain ones' undefined operand
// where they are inlined.)
TSPP_AVX512_TARGET inline __m512i round_to_bf16_bits(__m512 v) {
  const __mmask16 all = 0xFFFF;
  const __m512i b = _mm512_castps_si512(v);
  const __m512i odd = _mm512_and_si512(_mm512_maskz_srli_epi32(all, b, 16), _mm512_set1_epi32(1));
  const __m512i h =
      _mm512_maskz_srli_epi32(all, _mm512_add_epi32(b, _mm512_add_epi32(_mm512_set1_epi32(0x7FFF), odd)), 16);
  const __mmask16 nan =
      _mm512_cmpgt_epu32_mask(_mm512_and_si512(b, _mm512_set1_epi32(0x7FFFFFFF)), _mm512_set1_epi32(0x7F800000));
  return _mm512_mask_mov_epi32(h, nan, _mm512_set1_epi32(0x7FC0));
}

// row[16 v ..] = acc[v] rounded to bfloat16, the last vector under `tail`.
template <int NV>
TSPP_AVX512_TARGET inline void store_register_row_bf16(__m512 (&acc)[NV], uint16_t* row, __mmask16 tail) {
#pragma GCC unroll 4
  for (int v = 0; v < NV; ++v)
    _mm512_mask_cvtepi32_storeu_epi16(row + 16 * v, v < NV - 1 ? __mmask16(0xFFFF) : tail,
                                      round_to_bf16_bits(acc[v]));
}

// The same for MR rows c + m * ldc.
template <int MR, int NV>
TSPP_AVX512_TARGET inline void store_register_tile(__m512 (&acc)[MR][NV], float* c, int64_t ldc, __mmask16 tail,
                                                   bool accumulate) {
#pragma GCC unroll 16
  for (int m = 0; m < MR; ++m) store_register_row<NV>(acc[m], c + m * ldc, tail, accumulate);
}

// fn(std::integral_constant<int, V>{}) for the V in [1, Max] that equals `value`; nothing when
// none does.
template <int Max, typename Fn>
inline void with_constant(int64_t value, Fn&& fn) {
  if constexpr (Max > 0) {
    if (value == Max) return fn(std::integral_constant<int, Max>{});
    with_constant<Max - 1>(value, fn);
  }
}

// fn(n0, std::integral_constant<int, NV>{}, tail) for the column blocks of at most 64 columns (4
// vectors of 16) of n columns: NV vectors from n0, the last one under `tail`.
template <typename Fn>
inline void for_column_blocks(int64_t n, Fn&& fn) {
  for (int64_t n0 = 0; n0 < n; n0 += 64) {
    const int64_t width = n - n0 < 64 ? n - n0 : 64;
    const int nv = static_cast<int>((width + 15) / 16);
    const __mmask16 tail = static_cast<__mmask16>((1u << (width - 16 * (nv - 1))) - 1u);
    with_constant<4>(nv, [&](auto vectors) { fn(n0, vectors, tail); });
  }
}

}  // namespace torchsparse_pp
