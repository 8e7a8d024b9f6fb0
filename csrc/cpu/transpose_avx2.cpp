// 8 x 8 float transposes in AVX2 registers for the transposed tile gather (transpose_avx2.h).
#include "transpose_avx2.h"

#include <immintrin.h>

#include "cpu_features.h"

namespace torchsparse_pp {

TSPP_AVX2_TARGET void transpose_rows_x8_avx2(const float* const* rows, int64_t c, int64_t valid, float* dst,
                                             int64_t ld) {
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  const __m256i store = _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int32_t>(valid)), lane);
  int64_t j0 = 0;
  for (; j0 + 8 <= c; j0 += 8) {
    __m256 r[8];
    for (int i = 0; i < 8; ++i) r[i] = _mm256_loadu_ps(rows[i] + j0);
    // Pairs, then quads, then the 128-bit halves: column j of the block ends in register j.
    __m256 t[8], u[8];
    for (int i = 0; i < 8; i += 2) {
      t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
      t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
    }
    for (int i = 0; i < 8; i += 4) {
      u[i] = _mm256_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(1, 0, 1, 0));
      u[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(3, 2, 3, 2));
      u[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(1, 0, 1, 0));
      u[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(3, 2, 3, 2));
    }
    for (int j = 0; j < 4; ++j) {
      r[j] = _mm256_permute2f128_ps(u[j], u[j + 4], 0x20);
      r[j + 4] = _mm256_permute2f128_ps(u[j], u[j + 4], 0x31);
    }
    if (valid == 8) {
      for (int j = 0; j < 8; ++j) _mm256_storeu_ps(dst + (j0 + j) * ld, r[j]);
    } else {
      for (int j = 0; j < 8; ++j) _mm256_maskstore_ps(dst + (j0 + j) * ld, store, r[j]);
    }
  }
  for (int64_t j = j0; j < c; ++j)
    for (int64_t i = 0; i < valid; ++i) dst[j * ld + i] = rows[i][j];
}

}  // namespace torchsparse_pp
