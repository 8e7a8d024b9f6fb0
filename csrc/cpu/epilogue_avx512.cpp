// The bfloat16 output epilogue with AVX-512 intrinsics: 16 columns per step, one masked step
// for a row's tail. The compiler's clone of the generic loop works in 256-bit halves and narrows
// through pack / permute shuffles, which made it ~9 % of a bf16 inference on a Zen 5.
#include "epilogue_avx512.h"

#include "cpu_features.h"
#include "pair_gemm.h"
#include "register_tile.h"

#include <immintrin.h>

#include <type_traits>

// GCC 12 warns of the intrinsic headers' own undefined operands (_mm512_undefined_*).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

namespace torchsparse_pp {

namespace {

// One vector of 16 values at `at` (column `col` of its row), through the epilogue, rounded; the
// loads under `k` (a constant all-ones mask compiles to plain loads). bias, residual and ReLU
// fixed at compile time: a handful of instructions.
template <bool Bias, bool Residual, bool Relu>
TSPP_AVX512_TARGET inline __attribute__((always_inline)) __m512i epilogue_vector(const float* rows, const float* bias,
                                                                                 const uint16_t* residual, int64_t at,
                                                                                 int64_t col, __mmask16 k) {
  __m512 v = _mm512_maskz_loadu_ps(k, rows + at);
  if constexpr (Bias) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(k, bias + col));
  if constexpr (Residual)
    v = _mm512_add_ps(v, _mm512_castsi512_ps(
                             _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(k, residual + at)), 16)));
  // max returns its second operand for a NaN: 0, as the generic loop's (v > 0 ? v : 0).
  if constexpr (Relu) v = _mm512_max_ps(v, _mm512_setzero_ps());
  return round_to_bf16_bits(v);
}

// Row by row, the last vector of each row under a mask (any width).
template <bool Bias, bool Residual, bool Relu>
TSPP_AVX512_TARGET void narrow_rows(const float* rows, int64_t count, int64_t n, const float* bias,
                                    const uint16_t* residual, uint16_t* out) {
  const __mmask16 tail = static_cast<__mmask16>((1u << (n % 16 == 0 ? 16 : n % 16)) - 1u);
  for (int64_t i = 0; i < count; ++i) {
    const uint16_t* r = Residual ? residual + i * n : nullptr;
    for (int64_t j = 0; j < n; j += 16) {
      const __mmask16 k = j + 16 <= n ? __mmask16(0xFFFF) : tail;
      _mm512_mask_cvtepi32_storeu_epi16(out + i * n + j, k,
                                        epilogue_vector<Bias, Residual, Relu>(rows + i * n, bias, r, j, j, k));
    }
  }
}

// n a multiple of 16 (every MinkUNet / CenterPoint width): the rows are one flat run of
// count * n values, 32 per step, two vectors packed into one 64-byte store, every load and store
// whole. The per-row loop's masked loads of the bfloat16 residual made a 48-wide residual layer's
// bf16 forward ~14 % slower (Zen 5).
template <bool Bias, bool Residual, bool Relu>
TSPP_AVX512_TARGET void narrow_flat(const float* rows, int64_t count, int64_t n, const float* bias,
                                    const uint16_t* residual, uint16_t* out) {
  const int64_t total = count * n;
  constexpr __mmask16 kAll = 0xFFFF;
  // packus interleaves the two vectors per 128-bit lane; this puts the quarters back in order.
  const __m512i order = _mm512_setr_epi64(0, 2, 4, 6, 1, 3, 5, 7);
  int64_t at = 0, col = 0;
  for (; at + 32 <= total; at += 32) {
    const __m512i lo = epilogue_vector<Bias, Residual, Relu>(rows, bias, residual, at, col, kAll);
    col = col + 16 == n ? 0 : col + 16;
    const __m512i hi = epilogue_vector<Bias, Residual, Relu>(rows, bias, residual, at + 16, col, kAll);
    col = col + 16 == n ? 0 : col + 16;
    _mm512_storeu_si512(out + at, _mm512_permutexvar_epi64(order, _mm512_packus_epi32(lo, hi)));
  }
  if (at < total) {
    const __m512i last = epilogue_vector<Bias, Residual, Relu>(rows, bias, residual, at, col, kAll);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + at), _mm512_cvtepi32_epi16(last));
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
  const auto with_relu = [&](auto has_bias, auto has_residual) {
    const auto run = [&](auto has_relu) {
      constexpr bool kBias = decltype(has_bias)::value, kResidual = decltype(has_residual)::value;
      constexpr bool kRelu = decltype(has_relu)::value;
      if (n % 16 == 0) return narrow_flat<kBias, kResidual, kRelu>(rows, count, n, bias, r, o);
      narrow_rows<kBias, kResidual, kRelu>(rows, count, n, bias, r, o);
    };
    relu ? run(std::true_type{}) : run(std::false_type{});
  };
  const auto with_residual = [&](auto has_bias) {
    r != nullptr ? with_relu(has_bias, std::true_type{}) : with_relu(has_bias, std::false_type{});
  };
  bias != nullptr ? with_residual(std::true_type{}) : with_residual(std::false_type{});
}

}  // namespace torchsparse_pp
