// Row loops of the tiled dataflows, built for several instruction sets and picked at load time
// (GCC function multi-versioning): the extension is compiled for the x86-64 baseline, whose
// 128-bit vectors would leave most of an AVX-512 core idle in these memory-bound loops.
#pragma once

#include <c10/util/BFloat16.h>

#include <cstdint>

namespace torchsparse_pp {

// out[dst[i], :n] += rows[i, :n] for i < count (rows row-major with leading dimension n).
void scatter_add_rows(const float* rows, int64_t count, int64_t n, const int32_t* dst, float* out);
void scatter_add_rows(const double* rows, int64_t count, int64_t n, const int32_t* dst, double* out);
void scatter_add_rows(const c10::BFloat16* rows, int64_t count, int64_t n, const int32_t* dst, float* out);

// out[i, :n] = src[idx[i], :n] for i < count (out row-major with leading dimension n): short rows
// copied inline, where a memcpy call per row would cost more than the copy.
void gather_rows(const float* src, const int32_t* idx, int64_t count, int64_t n, float* out);
void gather_rows(const double* src, const int32_t* idx, int64_t count, int64_t n, double* out);
void gather_rows(const c10::BFloat16* src, const int32_t* idx, int64_t count, int64_t n, c10::BFloat16* out);

// rows[i, :n] = act(rows[i, :n] + bias[:n] + residual[i, :n]) for i < count (bias / residual
// null when absent; residual rows have leading dimension n; act is ReLU when `relu`).
void epilogue_rows(float* rows, int64_t count, int64_t n, const float* bias, const float* residual, bool relu);
void epilogue_rows(float* rows, int64_t count, int64_t n, const float* bias, const c10::BFloat16* residual,
                   bool relu);
void epilogue_rows(double* rows, int64_t count, int64_t n, const double* bias, const double* residual, bool relu);

// out[i, :n] = bfloat16(act(rows[i, :n] + bias[:n] + residual[i, :n])) (each step only where
// given; rounded to nearest even as c10::BFloat16 rounds, NaN stays NaN): a float block's
// epilogue and narrowing in one pass.
void epilogue_narrow_rows(const float* rows, int64_t count, int64_t n, const float* bias,
                          const c10::BFloat16* residual, bool relu, c10::BFloat16* out);

// d[:n] = float(s[:n]).
void widen_row(const c10::BFloat16* s, int64_t n, float* d);

}  // namespace torchsparse_pp
