// AVX-512 version of epilogue_narrow_rows (row_ops.h), which calls it where the CPU has AVX-512.
#pragma once

#include <c10/util/BFloat16.h>

#include <cstdint>

namespace torchsparse_pp {

// AVX-512 F / BW / VL present and the AVX-512 kernels not turned off (avx512_kernels_off).
bool epilogue_avx512_available();

// epilogue_narrow_rows's contract, bit for bit; needs epilogue_avx512_available().
void epilogue_narrow_rows_avx512(const float* rows, int64_t count, int64_t n, const float* bias,
                                 const c10::BFloat16* residual, bool relu, c10::BFloat16* out);

}  // namespace torchsparse_pp
