// BatchNorm's float32 row loops with AVX2 intrinsics, 8 channels per step, for CPUs without
// AVX-512: the compiler's clones of the generic loops turned the mask's bit tests into a
// branch or a shift per column (the masked backward ran 1.3-2.3x slower than the ReLU mask
// recomputed from the input, the masked forward 2x slower than without the mask). A step's 8
// bits become lanes by one and + compare; a row's last n % 8 columns run the same steps one at a
// time. Every product and sum is its own rounded step, in the generic loops' order.
#include "batch_norm_simd.h"

#include "cpu_features.h"
#include "register_tile.h"

#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <vector>

namespace torchsparse_pp {

namespace {

// The row's mask bits of columns j .. j + 7 (j a multiple of 8).
inline uint32_t bits8(const uint16_t* m_row, int64_t j) { return (m_row[j >> 4] >> (j & 15)) & 0xFFu; }

// All ones in the lanes whose bit is set.
TSPP_AVX2_TARGET inline __attribute__((always_inline)) __m256 lanes_of(uint32_t bits) {
  const __m256i select = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
  return _mm256_castsi256_ps(_mm256_cmpeq_epi32(_mm256_and_si256(_mm256_set1_epi32(static_cast<int>(bits)), select),
                                                select));
}

// dy where the mask bit is set (or without mask), else +0: the vector steps' and, one column.
inline float kept(float g, const uint16_t* m_row, int64_t j) {
  return m_row == nullptr || (m_row[j >> 4] >> (j & 15)) & 1u ? g : 0.0f;
}

TSPP_AVX2_TARGET inline __attribute__((always_inline)) __m256 masked_grad(const float* dy, const uint16_t* m_row,
                                                                           int64_t j) {
  const __m256 g = _mm256_loadu_ps(dy + j);
  return m_row != nullptr ? _mm256_and_ps(g, lanes_of(bits8(m_row, j))) : g;
}

TSPP_AVX2_TARGET void apply_masked(const float* x, const float* residual, int64_t rows, int64_t n, const float* scale,
                                   const float* shift, float* y, uint16_t* mask) {
  const int64_t words = mask_words(n);
  const __m256 zero = _mm256_setzero_ps();
  for (int64_t i = 0; i < rows; ++i) {
    const float* x_row = x + i * n;
    const float* r_row = residual != nullptr ? residual + i * n : nullptr;
    float* y_row = y + i * n;
    uint16_t* m_row = mask + i * words;
    // A word's bits gather in a register: an or into memory per step would chain each step to
    // the last one's store (3x slower on 16-wide rows).
    for (int64_t w = 0; w < words; ++w) {
      uint32_t word = 0;
      for (int64_t j = w * 16; j < std::min(n, w * 16 + 16);) {
        if (j + 8 <= n) {
          __m256 v = _mm256_add_ps(_mm256_mul_ps(_mm256_loadu_ps(x_row + j), _mm256_loadu_ps(scale + j)),
                                   _mm256_loadu_ps(shift + j));
          if (r_row != nullptr) v = _mm256_add_ps(v, _mm256_loadu_ps(r_row + j));
          const __m256 positive = _mm256_cmp_ps(v, zero, _CMP_GT_OQ);  // NaN: not positive
          _mm256_storeu_ps(y_row + j, _mm256_and_ps(positive, v));
          word |= static_cast<uint32_t>(_mm256_movemask_ps(positive)) << (j & 15);
          j += 8;
        } else {
          float v = x_row[j] * scale[j] + shift[j];
          if (r_row != nullptr) v += r_row[j];
          y_row[j] = v > 0.0f ? v : 0.0f;
          word |= uint32_t(v > 0.0f) << (j & 15);
          ++j;
        }
      }
      m_row[w] = static_cast<uint16_t>(word);
    }
  }
}

// Channels up to kRegisterVectors * 8 (a multiple of 8) keep a block's sums in registers (in
// memory each row's sums wait on the previous row's stores). Same steps, same order.
constexpr int kRegisterVectors = 6;

template <int NV>
TSPP_AVX2_TARGET inline __attribute__((always_inline)) void fold_registers(const __m256 (&p1)[NV],
                                                                            const __m256 (&p2)[NV], double* s1,
                                                                            double* s2) {
  alignas(32) float b1[8 * NV], b2[8 * NV];
  for (int v = 0; v < NV; ++v) {
    _mm256_store_ps(b1 + 8 * v, p1[v]);
    _mm256_store_ps(b2 + 8 * v, p2[v]);
  }
  fold_block_sums(b1, b2, 8 * NV, s1, s2);
}

// s1 += sum(a), s2 += sum(a * d) per channel, d = x - center: the statistics (a = d, center the
// shift) or the backward's sums (a = dy, under the mask when given; center the mean).
template <int NV, bool Stats>
TSPP_AVX2_TARGET void register_sums(const float* dy, const float* x, const uint16_t* mask, int64_t rows,
                                    int64_t block_rows, const float* center, double* s1, double* s2) {
  constexpr int64_t n = 8 * NV, words = (n + 15) / 16;
  for (int64_t r0 = 0; r0 < rows; r0 += block_rows) {
    __m256 p1[NV], p2[NV];
    for (int v = 0; v < NV; ++v) p1[v] = p2[v] = _mm256_setzero_ps();
    for (int64_t i = r0; i < std::min(rows, r0 + block_rows); ++i) {
      const uint16_t* m_row = mask != nullptr ? mask + i * words : nullptr;
#pragma GCC unroll 8
      for (int v = 0; v < NV; ++v) {
        const __m256 d = _mm256_sub_ps(_mm256_loadu_ps(x + i * n + 8 * v), _mm256_loadu_ps(center + 8 * v));
        const __m256 a = Stats ? d : masked_grad(dy + i * n, m_row, 8 * v);
        p1[v] = _mm256_add_ps(p1[v], a);
        p2[v] = _mm256_add_ps(p2[v], _mm256_mul_ps(a, d));
      }
    }
    fold_registers<NV>(p1, p2, s1, s2);
  }
}

TSPP_AVX2_TARGET void grad_sums(const float* dy, const float* x, const uint16_t* mask, int64_t rows, int64_t n,
                                int64_t block_rows, const float* mean, double* sg, double* sgx) {
  const int64_t words = mask_words(n);
  std::vector<float> p1(n), p2(n);
  for (int64_t r0 = 0; r0 < rows; r0 += block_rows) {
    std::fill(p1.begin(), p1.end(), 0.0f);
    std::fill(p2.begin(), p2.end(), 0.0f);
    for (int64_t i = r0; i < std::min(rows, r0 + block_rows); ++i) {
      const uint16_t* m_row = mask != nullptr ? mask + i * words : nullptr;
      const float* g_row = dy + i * n;
      const float* x_row = x + i * n;
      int64_t j = 0;
      for (; j + 8 <= n; j += 8) {
        const __m256 g = masked_grad(g_row, m_row, j);
        const __m256 d = _mm256_sub_ps(_mm256_loadu_ps(x_row + j), _mm256_loadu_ps(mean + j));
        _mm256_storeu_ps(p1.data() + j, _mm256_add_ps(_mm256_loadu_ps(p1.data() + j), g));
        _mm256_storeu_ps(p2.data() + j, _mm256_add_ps(_mm256_loadu_ps(p2.data() + j), _mm256_mul_ps(g, d)));
      }
      for (; j < n; ++j) {
        const float g = kept(g_row[j], m_row, j);
        p1[j] += g;
        p2[j] += g * (x_row[j] - mean[j]);
      }
    }
    fold_block_sums(p1.data(), p2.data(), n, sg, sgx);
  }
}

TSPP_AVX2_TARGET void grad_input(const float* dy, const float* x, const uint16_t* mask, int64_t rows, int64_t n,
                                 const float* mean, const float* a, const float* b, const float* c, float* dx,
                                 float* masked_out) {
  const int64_t words = mask_words(n);
  for (int64_t i = 0; i < rows; ++i) {
    const uint16_t* m_row = mask != nullptr ? mask + i * words : nullptr;
    const float* g_row = dy + i * n;
    const float* x_row = x + i * n;
    float* d_row = dx + i * n;
    float* o_row = masked_out != nullptr ? masked_out + i * n : nullptr;
    int64_t j = 0;
    for (; j + 8 <= n; j += 8) {
      const __m256 g = masked_grad(g_row, m_row, j);
      if (o_row != nullptr) _mm256_storeu_ps(o_row + j, g);
      const __m256 d = _mm256_sub_ps(_mm256_loadu_ps(x_row + j), _mm256_loadu_ps(mean + j));
      _mm256_storeu_ps(d_row + j, _mm256_add_ps(_mm256_add_ps(_mm256_mul_ps(_mm256_loadu_ps(a + j), g),
                                                              _mm256_mul_ps(_mm256_loadu_ps(b + j), d)),
                                                _mm256_loadu_ps(c + j)));
    }
    for (; j < n; ++j) {
      const float g = kept(g_row[j], m_row, j);
      if (o_row != nullptr) o_row[j] = g;
      d_row[j] = a[j] * g + b[j] * (x_row[j] - mean[j]) + c[j];
    }
  }
}

}  // namespace

bool batch_norm_avx2_available() {
  static const bool present = cpu_has_avx2_fma();
  return present;
}

void bn_apply_masked_avx2(const float* x, const float* residual, int64_t rows, int64_t n, const float* scale,
                          const float* shift, float* y, uint16_t* mask) {
  apply_masked(x, residual, rows, n, scale, shift, y, mask);
}

bool bn_shifted_sums_avx2(const float* x, int64_t rows, int64_t n, int64_t block_rows, const float* shift, double* s1,
                          double* s2) {
  if (n % 8 != 0 || n / 8 > kRegisterVectors) return false;
  with_constant<kRegisterVectors>(n / 8, [&](auto nv) {
    register_sums<decltype(nv)::value, true>(nullptr, x, nullptr, rows, block_rows, shift, s1, s2);
  });
  return true;
}

void bn_grad_sums_avx2(const float* dy, const float* x, const uint16_t* mask, int64_t rows, int64_t n,
                       int64_t block_rows, const float* mean, double* sg, double* sgx) {
  if (n % 8 == 0 && n / 8 <= kRegisterVectors) {
    with_constant<kRegisterVectors>(n / 8, [&](auto nv) {
      register_sums<decltype(nv)::value, false>(dy, x, mask, rows, block_rows, mean, sg, sgx);
    });
    return;
  }
  grad_sums(dy, x, mask, rows, n, block_rows, mean, sg, sgx);
}

void bn_grad_input_avx2(const float* dy, const float* x, const uint16_t* mask, int64_t rows, int64_t n,
                        const float* mean, const float* a, const float* b, const float* c, float* dx,
                        float* masked_out) {
  grad_input(dy, x, mask, rows, n, mean, a, b, c, dx, masked_out);
}

}  // namespace torchsparse_pp
