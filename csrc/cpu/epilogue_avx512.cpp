// The bfloat16 output epilogue with AVX-512 intrinsics: 16 columns per step, one masked step
// for a row's tail. The compiler's clone of the generic loop works in 256-bit halves and narrows
// through pack / permute shuffles, which made it ~9 % of a bf16 inference on a Zen 5.
#include "epilogue_avx512.h"

#include "cpu_features.h"
#include "pair_gemm.h"
#include "register_tile.h"

#include <immintrin.h>

// GCC 12 warns of the intrinsic headers' own undefined operands (_mm512_undefined_*).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

namespace torchsparse_pp {

namespace {

// bias, residual and ReLU fixed at compile time: the column loop is a handful of instructions.
template <bool Bias, bool Residual, bool Relu>
TSPP_AVX512_TARGET void narrow_rows(const float* rows, int64_t count, int64_t n, const float* bias,
                                    const uint16_t* residual, uint16_t* out) {
  const __mmask16 tail = static_cast<__mmask16>((1u << (n % 16 == 0 ? 16 : n % 16)) - 1u);
  for (int64_t i = 0; i < count; ++i) {
    const float* d = rows + i * n;
    const uint16_t* r = Residual ? residual + i * n : nullptr;
    uint16_t* o = out + i * n;
    for (int64_t j = 0; j < n; j += 16) {
      const __mmask16 k = j + 16 <= n ? __mmask16(0xFFFF) : tail;
      __m512 v = _mm512_maskz_loadu_ps(k, d + j);
      if constexpr (Bias) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(k, bias + j));
      if constexpr (Residual)
        v = _mm512_add_ps(v, _mm512_castsi512_ps(
                                 _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(k, r + j)), 16)));
      // max returns its second operand for a NaN: 0, as the generic loop's (v > 0 ? v : 0).
      if constexpr (Relu) v = _mm512_max_ps(v, _mm512_setzero_ps());
      const __m512i h = round_to_bf16_bits(v);
      _mm512_mask_cvtepi32_storeu_epi16(o + j, k, h);
    }
  }
}

}  // namespace

bool epilogue_avx512_available() {
  static const bool present = cpu_has_avx512(/*bf16=*/false);
  return present && !avx512_kernels_off();
}

void epilogue_narrow_rows_avx512(const float* rows, int64_t count, int64_t n, const float* bias,
                                 const c10::BFloat16* residual, bool relu, c10::BFloat16* out) {
  const auto* r = reinterpret_cast<const uint16_t*>(residual);
  auto* o = reinterpret_cast<uint16_t*>(out);
  const int which = (bias != nullptr ? 4 : 0) | (residual != nullptr ? 2 : 0) | (relu ? 1 : 0);
  switch (which) {
    case 0: return narrow_rows<false, false, false>(rows, count, n, bias, r, o);
    case 1: return narrow_rows<false, false, true>(rows, count, n, bias, r, o);
    case 2: return narrow_rows<false, true, false>(rows, count, n, bias, r, o);
    case 3: return narrow_rows<false, true, true>(rows, count, n, bias, r, o);
    case 4: return narrow_rows<true, false, false>(rows, count, n, bias, r, o);
    case 5: return narrow_rows<true, false, true>(rows, count, n, bias, r, o);
    case 6: return narrow_rows<true, true, false>(rows, count, n, bias, r, o);
    default: return narrow_rows<true, true, true>(rows, count, n, bias, r, o);
  }
}

}  // namespace torchsparse_pp
