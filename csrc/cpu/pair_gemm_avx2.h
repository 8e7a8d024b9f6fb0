// The register kernels of pair_gemm.h and pair_wgrad.h for CPUs with AVX2 + FMA but no AVX-512
// (AMD Zen 2 / 3, Intel client cores), and the bfloat16 forms for CPUs without the bf16 dot
// product, which widen each gathered row to float and run the float kernel on it.
//
// Every float32 output element of pair_gemm and rows_gemm sums its terms in the AVX-512 kernels'
// order (from zero, term by term and k by k, then added to the destination), so results are
// bit-identical to theirs. pair_wgrad sums each group of pairs from zero and adds it to dw, so its
// rounding differs from the AVX-512 kernel's (which sums a whole chunk first).
// Called only after register_isa() said the CPU has AVX2 + FMA.
#pragma once

#include <c10/util/BFloat16.h>

#include <cstdint>

namespace torchsparse_pp {
namespace avx2 {

void pair_gemm(int64_t count, const int32_t* src, const int32_t* dst, const float* feats, int64_t ldf, int64_t K,
               const float* W, int64_t N, float* out, int64_t ldo, bool accumulate);
void pair_gemm(int64_t count, const int32_t* src, const int32_t* dst, const c10::BFloat16* feats, int64_t ldf,
               int64_t K, const float* W, int64_t N, float* out, int64_t ldo, bool accumulate);

void rows_gemm(int64_t rows, int64_t terms, const float* const* a_rows, int64_t K, const float* const* W_terms,
               int64_t N, float* const* out_rows, bool accumulate);
void rows_gemm(int64_t rows, int64_t terms, const c10::BFloat16* const* a_rows, int64_t K,
               const float* const* W_terms, int64_t N, float* const* out_rows, bool accumulate);

void pair_wgrad(int64_t count, const int32_t* src, const int32_t* dst, const float* feats, int64_t c_src,
                const float* grad, int64_t c_dst, float* dw, bool accumulate);

}  // namespace avx2
}  // namespace torchsparse_pp
