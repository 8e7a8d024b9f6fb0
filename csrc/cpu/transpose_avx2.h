// The weight gradient's left operand, a gathered and transposed tile, by 8 x 8 register
// transposes (AVX2): each source row is read 8 floats at a time and each tile row written 8
// values at a time, where the portable path copies rows into a block and transposes it one
// float per instruction (on a 48-channel layer that took as long as the GEMM it fed).
#pragma once

#include <cstdint>

#include "tile_gemm.h"

namespace torchsparse_pp {

// dst[j * ld + i] = rows[i][j] for i < valid (<= 8) and j < c; nothing else is written.
void transpose_rows_x8_avx2(const float* const* rows, int64_t c, int64_t valid, float* dst, int64_t ld);

// gather_tile_transposed for float tiles on CPUs with AVX2: dst[j * ld + i] = src[row(i) * c + j]
// for i < n (zeros where row(i) < 0).
template <typename RowFn>
inline void gather_tile_transposed_x8(const float* src, int64_t c, int64_t n, RowFn&& row, float* dst, int64_t ld) {
  const float* zeros = scratch_zeros<float>(c);
  const float* rows[8];
  for (int64_t i0 = 0; i0 < n; i0 += 8) {
    const int64_t valid = std::min<int64_t>(8, n - i0);
    for (int64_t i = 0; i < 8; ++i) {
      const int64_t r = i < valid ? row(i0 + i) : -1;
      rows[i] = r < 0 ? zeros : src + r * c;
      if (i0 + 8 + i < n) {  // the next block's rows, while this one is transposed
        const int64_t ahead = row(i0 + 8 + i);
        if (ahead >= 0) prefetch_row(src + ahead * c, c);
      }
    }
    transpose_rows_x8_avx2(rows, c, valid, dst + i0, ld);
  }
}

}  // namespace torchsparse_pp
