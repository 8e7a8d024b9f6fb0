// Weight gradient over a pair list in registers:
//
//   dW[:C_src, :C_dst] (+)= sum_i feats[src[i], :C_src]^T grad[dst[i], :C_dst]     for i < count
//
// The sum runs over pairs, so a GEMM would need one operand transposed (a scalar scatter per
// element on gather). Here each pair is a rank-1 update instead: a register block of dW rows
// broadcasts its feature values straight from the source row and multiplies the gradient row's
// vectors, so neither operand goes through a gathered tile. Float32, AVX-512 or AVX2
// (pair_gemm_available); bfloat16 with the AVX512-BF16 dot product, two pairs per product.
#pragma once

#include <c10/util/BFloat16.h>

#include <cstdint>

namespace torchsparse_pp {

// Whether pair_wgrad beats the float tiles for these widths: always with AVX-512; with AVX2 (8
// columns per vector, 12 accumulators) up to 128 x 64 weights (MinkUNet 0.5x on a Zen 3, 2
// threads, per layer: 16 x 16 1.6x, 48 x 48 1.2-1.4x, 128 x 64 1.2x faster; 128 x 128 and
// 192 x 128 even, 0.94-1.18x from run to run).
bool pair_wgrad_pays(int64_t c_src, int64_t c_dst);

// feats [*, c_src] and grad [*, c_dst] row-major; dw [c_src, c_dst] is overwritten unless
// `accumulate`. Call with the pairs of one L2-sized chunk: the AVX-512 kernel's register blocks
// each re-read all of them; the AVX2 kernel goes through them in small groups that stay in L1.
void pair_wgrad(int64_t count, const int32_t* src, const int32_t* dst, const float* feats, int64_t c_src,
                const float* grad, int64_t c_dst, float* dw, bool accumulate);

// Whether the bfloat16 pair_wgrad beats the bf16 tiles (tile_policy.h) for these widths: on
// narrow weights only (up to 16 x 32), where gathering the tiles costs more than their products
// (MinkUNet 0.5x on a Zen 5, 2 threads: 4 x 16 1.8x, 16 x 16 1.3-1.4x, 16 x 32 1.07x; from 32 x 32
// up the tiles win, 1.15-1.95x). Needs bf16_dot_available() to say yes.
bool bf16_pair_wgrad_pays(int64_t c_src, int64_t c_dst);

// bfloat16 feats and grad, float sums, by the AVX512-BF16 dot product (two pairs per dot
// product); needs bf16_dot_available().
void pair_wgrad(int64_t count, const int32_t* src, const int32_t* dst, const c10::BFloat16* feats, int64_t c_src,
                const c10::BFloat16* grad, int64_t c_dst, float* dw, bool accumulate);

}  // namespace torchsparse_pp
