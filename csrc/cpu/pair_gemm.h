// Gather-GEMM-scatter in registers for the fetch-on-demand forward:
//
//   out[dst[i], :N] (+)= feats[src[i], :K] @ W[K, N]     for i < count
//
// A register-blocked AVX-512 micro-kernel reads its rows of A straight from the source rows
// (broadcasts through row pointers) and adds its accumulators straight into the destination rows:
// no gathered tile and no product tile go through memory. The pairs of one call must name each
// destination at most once (true within one offset). Float32 with FMA, bfloat16 with the
// AVX512-BF16 dot product (float sums, W packed by bf16_pack_pairs).
#pragma once

#include <c10/util/BFloat16.h>

#include <cstdint>

namespace torchsparse_pp {

// Rows per register group (6 rows x 4 vectors of 16 columns of accumulators).
constexpr int64_t kRowGroup = 6;

// Whether the register kernels run on this CPU (AVX-512 F/BW/VL; bf16 also needs AVX512-BF16)
// and are not switched off by TSPP_DISABLE_PAIR_KERNEL=1 (tests compare both paths).
bool pair_gemm_available();

// out rows are float [*, ldo]; with `accumulate` false the rows are overwritten.
void pair_gemm(int64_t count, const int32_t* src, const int32_t* dst, const float* feats, int64_t ldf, int64_t K,
               const float* W, int64_t N, float* out, int64_t ldo, bool accumulate);

// bfloat16 features and W packed in pairs of K rows (K padded to even); float out rows.
void pair_gemm(int64_t count, const int32_t* src, const int32_t* dst, const c10::BFloat16* feats, int64_t ldf,
               int64_t K, const c10::BFloat16* W_packed, int64_t N, float* out, int64_t ldo, bool accumulate);

// Output-stationary form (implicit GEMM): out_rows[m] (+)= sum_j a_rows[j * kRowGroup + m] @ W_j
// for m < rows <= kRowGroup, the sum kept in registers across the terms j. A row pointer may point
// at zeros (an absent neighbour). W_j as in pair_gemm (float [K, N], or bfloat16 packed pairs).
void rows_gemm(int64_t rows, int64_t terms, const float* const* a_rows, int64_t K, const float* const* W_terms,
               int64_t N, float* const* out_rows, bool accumulate);
void rows_gemm(int64_t rows, int64_t terms, const c10::BFloat16* const* a_rows, int64_t K,
               const c10::BFloat16* const* W_terms, int64_t N, float* const* out_rows, bool accumulate);

}  // namespace torchsparse_pp
