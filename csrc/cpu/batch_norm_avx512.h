// AVX-512 versions of BatchNorm's float32 row loops (batch_norm_cpu.cpp), bit for bit the same
// steps: the ReLU's mask travels as bits (one 16-bit word per 16 channels of a row), which the
// generic loops test one bit at a time.
#pragma once

#include <cstdint>

namespace torchsparse_pp {

// AVX-512 F / BW / VL present and the AVX-512 kernels not turned off (avx512_kernels_off).
bool batch_norm_avx512_available();

// y = relu(x * scale + shift [+ residual]); mask bit j of a row = (y[j] > 0).
void bn_apply_masked_avx512(const float* x, const float* residual, int64_t rows, int64_t n, const float* scale,
                            const float* shift, float* y, uint16_t* mask);

// sg += sum(g), sgx += sum(g * (x - mean)) over `rows` rows, g = dy (mask null) or dy where the
// mask bit is set; in float over blocks of `block_rows` rows, each block folded into double.
void bn_grad_sums_avx512(const float* dy, const float* x, const uint16_t* mask, int64_t rows, int64_t n,
                         int64_t block_rows, const float* mean, double* sg, double* sgx);

// dx = a * g + b * (x - mean) + c, g as above; masked_out = g where not null.
void bn_grad_input_avx512(const float* dy, const float* x, const uint16_t* mask, int64_t rows, int64_t n,
                          const float* mean, const float* a, const float* b, const float* c, float* dx,
                          float* masked_out);

}  // namespace torchsparse_pp
