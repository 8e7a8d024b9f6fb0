// Writing a block of AVX-512 accumulators to memory, shared by the register kernels.
#pragma once

#include <immintrin.h>

#include <cstdint>

#include "cpu_features.h"

namespace torchsparse_pp {

// c[m * ldc + 16 v ..] = acc[m][v] (+ what is there, with `accumulate`) for MR rows and NV
// vectors of 16 columns; the last vector stores under `tail`.
template <int MR, int NV>
TSPP_AVX512_TARGET inline void store_register_tile(__m512 (&acc)[MR][NV], float* c, int64_t ldc, __mmask16 tail,
                                                   bool accumulate) {
#pragma GCC unroll 16
  for (int m = 0; m < MR; ++m)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) {
      const __mmask16 k = v == NV - 1 ? tail : __mmask16(0xFFFF);
      float* row = c + m * ldc + 16 * v;
      const __m512 sum = accumulate ? _mm512_add_ps(acc[m][v], _mm512_maskz_loadu_ps(k, row)) : acc[m][v];
      _mm512_mask_storeu_ps(row, k, sum);
    }
}

}  // namespace torchsparse_pp
