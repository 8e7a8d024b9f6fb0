// AVX2 versions of BatchNorm's float32 row loops (batch_norm_cpu.cpp) for CPUs without AVX-512:
// the contracts of batch_norm_avx512.h, bit for bit.
#pragma once

#include <cstdint>

namespace torchsparse_pp {

// AVX2 with FMA3 present.
bool batch_norm_avx2_available();

void bn_apply_masked_avx2(const float* x, const float* residual, int64_t rows, int64_t n, const float* scale,
                          const float* shift, float* y, uint16_t* mask);

void bn_grad_sums_avx2(const float* dy, const float* x, const uint16_t* mask, int64_t rows, int64_t n,
                       int64_t block_rows, const float* mean, double* sg, double* sgx);

void bn_grad_input_avx2(const float* dy, const float* x, const uint16_t* mask, int64_t rows, int64_t n,
                        const float* mean, const float* a, const float* b, const float* c, float* dx,
                        float* masked_out);

}  // namespace torchsparse_pp
