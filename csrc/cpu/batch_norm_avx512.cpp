// BatchNorm's float32 row loops with AVX-512 intrinsics: 16 channels per step, the ReLU's mask
// one 16-bit word per step (a k-register as it is). The compiler's clones of the generic loops
// would unpack the bits lane by lane; and keeping the mask as bits lets the backward skip the
// residual (a MinkUNet residual layer's backward read it twice, ~40 % of its traffic).
// Every product and sum is its own rounded step, in the generic loops' order.
#include "batch_norm_simd.h"

#include "cpu_features.h"
#include "pair_gemm.h"
#include "register_tile.h"

#include <immintrin.h>

#include <algorithm>
#include <vector>

// GCC 12 warns of the intrinsic headers' own undefined operands (_mm512_undefined_*).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

namespace torchsparse_pp {

namespace {

constexpr __mmask16 kAll = 0xFFFF;

// Lanes of the vector at column j of an n-wide row. With Full (n a multiple of 16) a constant,
// so the loads under it are plain loads.
template <bool Full>
TSPP_AVX512_TARGET inline __attribute__((always_inline)) __mmask16 lanes(int64_t j, int64_t n) {
  if constexpr (Full) return kAll;
  return n - j >= 16 ? kAll : static_cast<__mmask16>((1u << (n - j)) - 1u);
}

// dy at (row, j), zero where the row's mask word clears it (no mask: no ReLU).
TSPP_AVX512_TARGET inline __attribute__((always_inline)) __m512 masked_grad(const float* dy, const uint16_t* m_row,
                                                                             int64_t j, __mmask16 k) {
  if (m_row != nullptr) k &= static_cast<__mmask16>(m_row[j / 16]);
  return _mm512_maskz_loadu_ps(k, dy + j);
}

template <bool Full, bool Residual>
TSPP_AVX512_TARGET void apply_masked(const float* x, const float* residual, int64_t rows, int64_t n,
                                     const float* scale, const float* shift, float* y, uint16_t* mask) {
  const int64_t words = mask_words(n);
  const __m512 zero = _mm512_setzero_ps();
  for (int64_t i = 0; i < rows; ++i) {
    const float* x_row = x + i * n;
    const float* r_row = Residual ? residual + i * n : nullptr;
    float* y_row = y + i * n;
    uint16_t* m_row = mask + i * words;
    for (int64_t j = 0; j < n; j += 16) {
      const __mmask16 k = lanes<Full>(j, n);
      __m512 v = _mm512_add_ps(_mm512_mul_ps(_mm512_maskz_loadu_ps(k, x_row + j), _mm512_maskz_loadu_ps(k, scale + j)),
                               _mm512_maskz_loadu_ps(k, shift + j));
      if constexpr (Residual) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(k, r_row + j));
      const __mmask16 positive = _mm512_mask_cmp_ps_mask(k, v, zero, _CMP_GT_OQ);  // NaN: not positive
      _mm512_mask_storeu_ps(y_row + j, k, _mm512_maskz_mov_ps(positive, v));
      m_row[j / 16] = static_cast<uint16_t>(positive);
    }
  }
}

// Channels up to kRegisterVectors * 16 (a multiple of 16) keep a block's sums in registers: in
// memory each row's sums wait on the previous row's stores (~20 cycles a row at 16 channels).
// Same steps in the same order as the loops with the sums in memory.
constexpr int kRegisterVectors = 8;

template <int NV>
TSPP_AVX512_TARGET inline __attribute__((always_inline)) void fold_registers(const __m512 (&p1)[NV],
                                                                              const __m512 (&p2)[NV], double* s1,
                                                                              double* s2) {
  alignas(64) float b1[16 * NV], b2[16 * NV];
#pragma GCC unroll 8
  for (int v = 0; v < NV; ++v) {
    _mm512_store_ps(b1 + 16 * v, p1[v]);
    _mm512_store_ps(b2 + 16 * v, p2[v]);
  }
  fold_block_sums(b1, b2, 16 * NV, s1, s2);
}

// s1 += sum(a), s2 += sum(a * d) per channel, d = x - center: the statistics (a = d, center the
// shift) or the backward's sums (a = dy, under the mask when Masked; center the mean).
template <int NV, bool Stats, bool Masked>
TSPP_AVX512_TARGET void register_sums(const float* dy, const float* x, const uint16_t* mask, int64_t rows,
                                      int64_t block_rows, const float* center, double* s1, double* s2) {
  constexpr int64_t n = 16 * NV;
  __m512 c[NV];
#pragma GCC unroll 8
  for (int v = 0; v < NV; ++v) c[v] = _mm512_loadu_ps(center + 16 * v);
  for (int64_t r0 = 0; r0 < rows; r0 += block_rows) {
    __m512 p1[NV], p2[NV];
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) p1[v] = p2[v] = _mm512_setzero_ps();
    for (int64_t i = r0; i < std::min(rows, r0 + block_rows); ++i) {
#pragma GCC unroll 8
      for (int v = 0; v < NV; ++v) {
        const __m512 d = _mm512_sub_ps(_mm512_loadu_ps(x + i * n + 16 * v), c[v]);
        __m512 a = d;
        if constexpr (!Stats) {
          const __mmask16 k = Masked ? static_cast<__mmask16>(mask[i * NV + v]) : kAll;
          a = _mm512_maskz_loadu_ps(k, dy + i * n + 16 * v);
        }
        p1[v] = _mm512_add_ps(p1[v], a);
        p2[v] = _mm512_add_ps(p2[v], _mm512_mul_ps(a, d));
      }
    }
    fold_registers<NV>(p1, p2, s1, s2);
  }
}

template <bool Full>
TSPP_AVX512_TARGET void grad_sums(const float* dy, const float* x, const uint16_t* mask, int64_t rows, int64_t n,
                                  int64_t block_rows, const float* mean, double* sg, double* sgx) {
  const int64_t words = mask_words(n);
  std::vector<float> p1(words * 16), p2(words * 16);
  for (int64_t r0 = 0; r0 < rows; r0 += block_rows) {
    std::fill(p1.begin(), p1.end(), 0.0f);
    std::fill(p2.begin(), p2.end(), 0.0f);
    for (int64_t i = r0; i < std::min(rows, r0 + block_rows); ++i) {
      const uint16_t* m_row = mask != nullptr ? mask + i * words : nullptr;
      for (int64_t j = 0; j < n; j += 16) {
        const __mmask16 k = lanes<Full>(j, n);
        const __m512 g = masked_grad(dy + i * n, m_row, j, k);
        const __m512 d = _mm512_sub_ps(_mm512_maskz_loadu_ps(k, x + i * n + j), _mm512_maskz_loadu_ps(k, mean + j));
        _mm512_storeu_ps(p1.data() + j, _mm512_add_ps(_mm512_loadu_ps(p1.data() + j), g));
        _mm512_storeu_ps(p2.data() + j, _mm512_add_ps(_mm512_loadu_ps(p2.data() + j), _mm512_mul_ps(g, d)));
      }
    }
    fold_block_sums(p1.data(), p2.data(), n, sg, sgx);
  }
}

template <bool Full, bool MaskedOut>
TSPP_AVX512_TARGET void grad_input(const float* dy, const float* x, const uint16_t* mask, int64_t rows, int64_t n,
                                   const float* mean, const float* a, const float* b, const float* c, float* dx,
                                   float* masked_out) {
  const int64_t words = mask_words(n);
  for (int64_t i = 0; i < rows; ++i) {
    const uint16_t* m_row = mask != nullptr ? mask + i * words : nullptr;
    for (int64_t j = 0; j < n; j += 16) {
      const __mmask16 k = lanes<Full>(j, n);
      const __m512 g = masked_grad(dy + i * n, m_row, j, k);
      if constexpr (MaskedOut) _mm512_mask_storeu_ps(masked_out + i * n + j, k, g);
      const __m512 d = _mm512_sub_ps(_mm512_maskz_loadu_ps(k, x + i * n + j), _mm512_maskz_loadu_ps(k, mean + j));
      const __m512 v = _mm512_add_ps(_mm512_add_ps(_mm512_mul_ps(_mm512_maskz_loadu_ps(k, a + j), g),
                                                   _mm512_mul_ps(_mm512_maskz_loadu_ps(k, b + j), d)),
                                     _mm512_maskz_loadu_ps(k, c + j));
      _mm512_mask_storeu_ps(dx + i * n + j, k, v);
    }
  }
}

}  // namespace

bool batch_norm_avx512_available() {
  static const bool present = cpu_has_avx512(/*bf16=*/false);
  return present && !avx512_kernels_off();
}

void bn_apply_masked_avx512(const float* x, const float* residual, int64_t rows, int64_t n, const float* scale,
                            const float* shift, float* y, uint16_t* mask) {
  const bool full = n % 16 == 0;
  if (residual != nullptr)
    full ? apply_masked<true, true>(x, residual, rows, n, scale, shift, y, mask)
         : apply_masked<false, true>(x, residual, rows, n, scale, shift, y, mask);
  else
    full ? apply_masked<true, false>(x, residual, rows, n, scale, shift, y, mask)
         : apply_masked<false, false>(x, residual, rows, n, scale, shift, y, mask);
}

bool bn_shifted_sums_avx512(const float* x, int64_t rows, int64_t n, int64_t block_rows, const float* shift,
                            double* s1, double* s2) {
  if (n % 16 != 0 || n / 16 > kRegisterVectors) return false;
  with_constant<kRegisterVectors>(n / 16, [&](auto nv) {
    register_sums<decltype(nv)::value, true, false>(nullptr, x, nullptr, rows, block_rows, shift, s1, s2);
  });
  return true;
}

void bn_grad_sums_avx512(const float* dy, const float* x, const uint16_t* mask, int64_t rows, int64_t n,
                         int64_t block_rows, const float* mean, double* sg, double* sgx) {
  if (n % 16 == 0 && n / 16 <= kRegisterVectors) {
    with_constant<kRegisterVectors>(n / 16, [&](auto nv) {
      constexpr int NV = decltype(nv)::value;
      mask != nullptr ? register_sums<NV, false, true>(dy, x, mask, rows, block_rows, mean, sg, sgx)
                      : register_sums<NV, false, false>(dy, x, mask, rows, block_rows, mean, sg, sgx);
    });
    return;
  }
  n % 16 == 0 ? grad_sums<true>(dy, x, mask, rows, n, block_rows, mean, sg, sgx)
              : grad_sums<false>(dy, x, mask, rows, n, block_rows, mean, sg, sgx);
}

void bn_grad_input_avx512(const float* dy, const float* x, const uint16_t* mask, int64_t rows, int64_t n,
                          const float* mean, const float* a, const float* b, const float* c, float* dx,
                          float* masked_out) {
  const bool full = n % 16 == 0;
  if (masked_out != nullptr)
    full ? grad_input<true, true>(dy, x, mask, rows, n, mean, a, b, c, dx, masked_out)
         : grad_input<false, true>(dy, x, mask, rows, n, mean, a, b, c, dx, masked_out);
  else
    full ? grad_input<true, false>(dy, x, mask, rows, n, mean, a, b, c, dx, masked_out)
         : grad_input<false, false>(dy, x, mask, rows, n, mean, a, b, c, dx, masked_out);
}

}  // namespace torchsparse_pp
