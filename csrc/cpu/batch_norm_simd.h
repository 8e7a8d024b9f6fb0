// Vector versions of BatchNorm's float32 row loops (batch_norm_cpu.cpp), AVX-512 and AVX2, bit
// for bit the generic loops' steps: the ReLU's mask travels as bits (one 16-bit word per 16
// channels of a row), which the vector loops turn into lane masks.
#pragma once

#include <cstdint>

namespace torchsparse_pp {

// The ReLU's mask as bits: one 16-bit word per 16 channels of a row, bit j % 16 of word j / 16
// set where the forward's output was positive.
inline int64_t mask_words(int64_t n) { return (n + 15) / 16; }

// AVX-512 F / BW / VL present and the AVX-512 kernels not turned off (avx512_kernels_off).
bool batch_norm_avx512_available();
// AVX2 with FMA3 present.
bool batch_norm_avx2_available();

// y = relu(x * scale + shift [+ residual]); mask bit j of a row = (y[j] > 0).
void bn_apply_masked_avx512(const float* x, const float* residual, int64_t rows, int64_t n, const float* scale,
                            const float* shift, float* y, uint16_t* mask);
void bn_apply_masked_avx2(const float* x, const float* residual, int64_t rows, int64_t n, const float* scale,
                          const float* shift, float* y, uint16_t* mask);

// s1 += sum(x - shift), s2 += sum((x - shift)^2) over `rows` rows, as the generic loop; false
// (nothing done) unless n fits the registers (AVX-512: a multiple of 16 up to 128; AVX2: of 8
// up to 48).
bool bn_shifted_sums_avx512(const float* x, int64_t rows, int64_t n, int64_t block_rows, const float* shift,
                            double* s1, double* s2);
bool bn_shifted_sums_avx2(const float* x, int64_t rows, int64_t n, int64_t block_rows, const float* shift, double* s1,
                          double* s2);

// sg += sum(g), sgx += sum(g * (x - mean)) over `rows` rows, g = dy (mask null) or dy where the
// mask bit is set; in float over blocks of `block_rows` rows, each block folded into double.
void bn_grad_sums_avx512(const float* dy, const float* x, const uint16_t* mask, int64_t rows, int64_t n,
                         int64_t block_rows, const float* mean, double* sg, double* sgx);
void bn_grad_sums_avx2(const float* dy, const float* x, const uint16_t* mask, int64_t rows, int64_t n,
                       int64_t block_rows, const float* mean, double* sg, double* sgx);

// dx = a * g + b * (x - mean) + c, g as above; masked_out = g where not null.
void bn_grad_input_avx512(const float* dy, const float* x, const uint16_t* mask, int64_t rows, int64_t n,
                          const float* mean, const float* a, const float* b, const float* c, float* dx,
                          float* masked_out);
void bn_grad_input_avx2(const float* dy, const float* x, const uint16_t* mask, int64_t rows, int64_t n,
                        const float* mean, const float* a, const float* b, const float* c, float* dx,
                        float* masked_out);

// A block's float sums folded into the double totals (both vector loops).
inline void fold_block_sums(const float* p1, const float* p2, int64_t n, double* sg, double* sgx) {
  for (int64_t j = 0; j < n; ++j) {
    sg[j] += static_cast<double>(p1[j]);
    sgx[j] += static_cast<double>(p2[j]);
  }
}

}  // namespace torchsparse_pp
