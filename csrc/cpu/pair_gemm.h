// Gather-GEMM-scatter in registers for the fetch-on-demand forward:
//
//   out[dst[i], :N] (+)= feats[src[i], :K] @ W[K, N]     for i < count
//
// A register-blocked micro-kernel (AVX-512, or AVX2 on CPUs without it) reads its rows of A
// straight from the source rows (broadcasts through row pointers) and adds its accumulators
// straight into the destination rows: no gathered tile and no product tile go through memory.
// The pairs of one call must name each destination at most once (true within one offset).
// Float32 with FMA, bfloat16 with the AVX512-BF16 dot product (float sums, W packed by
// bf16_pack_pairs) or, without it, widened to float (float W).
#pragma once

#include <c10/util/BFloat16.h>

#include <cstdint>
#include <string>

namespace torchsparse_pp {

// Rows per register group (6 rows x 4 vectors of 16 columns of accumulators).
constexpr int64_t kRowGroup = 6;

// The instruction set of the register kernels on this CPU: AVX-512 (F/BW/VL), else AVX2 + FMA
// (pair_gemm_avx2.h), else none (float tiles). TSPP_DISABLE_AVX512_KERNELS=1 takes AVX2 on an
// AVX-512 CPU (the bf16 dot kernels are then off too) and TSPP_DISABLE_PAIR_KERNEL=1 takes
// none: tests compare the paths.
enum class RegisterIsa { kNone = 0, kAvx2 = 1, kAvx512 = 2 };  // op cpu_register_isa's numbers
RegisterIsa register_isa();

// Chooses "avx512", "avx2" or "none" from now on (torchsparse_pp.backends.cpu_kernels); an
// instruction set the CPU lacks is an error. "avx2" also turns the bf16 dot kernels off; "none"
// leaves them as the environment says (as at start), so each name gives one state.
void set_register_isa(const std::string& name);

// Whether the AVX-512 kernels are off (TSPP_DISABLE_AVX512_KERNELS=1, or "avx2" chosen).
bool avx512_kernels_off();

// Whether the register kernels run on this CPU: float32 on either instruction set; bfloat16
// with the dot product (AVX512-BF16, W in packed pairs) or widened to float (W in float).
bool pair_gemm_available();

// out rows are float [*, ldo]; with `accumulate` false the rows are overwritten.
void pair_gemm(int64_t count, const int32_t* src, const int32_t* dst, const float* feats, int64_t ldf, int64_t K,
               const float* W, int64_t N, float* out, int64_t ldo, bool accumulate);

// bfloat16 features and W packed in pairs of K rows (K padded to even); float out rows.
void pair_gemm(int64_t count, const int32_t* src, const int32_t* dst, const c10::BFloat16* feats, int64_t ldf,
               int64_t K, const c10::BFloat16* W_packed, int64_t N, float* out, int64_t ldo, bool accumulate);
// bfloat16 features and float W (CPUs without the bf16 dot product): each row widened to float.
void pair_gemm(int64_t count, const int32_t* src, const int32_t* dst, const c10::BFloat16* feats, int64_t ldf,
               int64_t K, const float* W, int64_t N, float* out, int64_t ldo, bool accumulate);

// Output-stationary form (implicit GEMM): out_rows[m] (+)= sum_j a_rows[j * kRowGroup + m] @ W_j
// for m < rows <= kRowGroup, the sum kept in registers across the terms j. A row pointer may point
// at zeros (an absent neighbour). W_j as in pair_gemm (float [K, N], or bfloat16 packed pairs).
void rows_gemm(int64_t rows, int64_t terms, const float* const* a_rows, int64_t K, const float* const* W_terms,
               int64_t N, float* const* out_rows, bool accumulate);
void rows_gemm(int64_t rows, int64_t terms, const c10::BFloat16* const* a_rows, int64_t K,
               const c10::BFloat16* const* W_terms, int64_t N, float* const* out_rows, bool accumulate);
void rows_gemm(int64_t rows, int64_t terms, const c10::BFloat16* const* a_rows, int64_t K,
               const float* const* W_terms, int64_t N, float* const* out_rows, bool accumulate);

// The bfloat16 dot-product form writing bfloat16 rows (the float sums rounded to nearest even,
// as c10::BFloat16 rounds), for at most kMaxNarrowRowTerms terms: no float rows in between.
constexpr int64_t kMaxNarrowRowTerms = 64;
void rows_gemm(int64_t rows, int64_t terms, const c10::BFloat16* const* a_rows, int64_t K,
               const c10::BFloat16* const* W_terms, int64_t N, c10::BFloat16* const* out_rows);

}  // namespace torchsparse_pp
