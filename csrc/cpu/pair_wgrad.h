// Weight gradient over a pair list in registers:
//
//   dW[:C_src, :C_dst] (+)= sum_i feats[src[i], :C_src]^T grad[dst[i], :C_dst]     for i < count
//
// The sum runs over pairs, so a GEMM would need one operand transposed (a scalar scatter per
// element on gather). Here each pair is a rank-1 update instead: a register block of dW rows
// broadcasts its feature values straight from the source row and multiplies the gradient row's
// vectors, so neither operand goes through a gathered tile. Float32, AVX-512 or AVX2
// (pair_gemm_available).
#pragma once

#include <cstdint>

namespace torchsparse_pp {

// Whether pair_wgrad beats the float tiles for these widths: always with AVX-512; with AVX2 (8
// columns per vector, 12 accumulators) only for narrow weights, since each register block
// re-reads the chunk's rows and wide weights take many blocks (MinkUNet 0.5x on a Zen 3, per
// layer: 16 x 16 1.4-1.6x faster, 32 x 32 even, 48 x 48 and up 0.8-0.9x).
bool pair_wgrad_pays(int64_t c_src, int64_t c_dst);

// feats [*, c_src] and grad [*, c_dst] row-major; dw [c_src, c_dst] is overwritten unless
// `accumulate`. Call with the pairs of one L2-sized chunk: every register block re-reads them.
void pair_wgrad(int64_t count, const int32_t* src, const int32_t* dst, const float* feats, int64_t c_src,
                const float* grad, int64_t c_dst, float* dw, bool accumulate);

}  // namespace torchsparse_pp
