// Multi-versioned row loops (see row_ops.h).
#include "row_ops.h"

#include "cpu_features.h"
#include "epilogue_avx512.h"

#include <cstdint>
#include <type_traits>

namespace torchsparse_pp {

namespace {

// A value as its sum type: bfloat16 is the upper half of a float, so widening is a shift,
// which vectorises (the c10 operator may not).
template <typename Acc, typename T>
TSPP_INLINE_IN_CLONES Acc widened(T v) {
  if constexpr (std::is_same_v<T, c10::BFloat16>) return __builtin_bit_cast(float, static_cast<uint32_t>(v.x) << 16);
  else return v;
}

template <typename T, typename Acc>
TSPP_INLINE_IN_CLONES void scatter_add_impl(const T* rows, int64_t count, int64_t n, const int32_t* dst, Acc* out) {
  for (int64_t i = 0; i < count; ++i) {
    Acc* __restrict__ d = out + static_cast<int64_t>(dst[i]) * n;
    const T* __restrict__ s = rows + i * n;
    for (int64_t j = 0; j < n; ++j) d[j] += widened<Acc>(s[j]);
  }
}

// Copies as unsigned words of the element's size: the same bits, and a loop the compiler
// vectorises in place instead of calling memcpy per row.
template <typename T>
TSPP_INLINE_IN_CLONES void gather_impl(const T* src, const int32_t* idx, int64_t count, int64_t n, T* out) {
  using Word = std::conditional_t<sizeof(T) == 8, uint64_t, std::conditional_t<sizeof(T) == 4, uint32_t, uint16_t>>;
  const auto* s = reinterpret_cast<const Word*>(src);
  auto* o = reinterpret_cast<Word*>(out);
  for (int64_t i = 0; i < count; ++i) {
    const Word* __restrict__ r = s + static_cast<int64_t>(idx[i]) * n;
    Word* __restrict__ d = o + i * n;
    for (int64_t j = 0; j < n; ++j) d[j] = r[j];
  }
}

// float -> bfloat16 as c10::BFloat16 rounds (to nearest even; NaN stays NaN), branch-free so
// that it vectorises.
TSPP_INLINE_IN_CLONES uint16_t narrowed(float v) {
  const uint32_t b = __builtin_bit_cast(uint32_t, v);
  const bool nan = (b & 0x7FFFFFFFu) > 0x7F800000u;
  const uint32_t rounded = (b + 0x7FFFu + ((b >> 16) & 1u)) >> 16;
  return static_cast<uint16_t>(nan ? 0x7FC0u : rounded);
}

// One pass per row with the steps fixed at compile time (three passes of short rows cost more
// in loop overhead than in arithmetic); the same order as the unfused layers: bias, residual,
// ReLU. Results go back into the rows, or (bfloat16 out) narrowed into out in the same pass.
template <bool Bias, bool Residual, bool Relu, typename Acc, typename R, typename O>
TSPP_INLINE_IN_CLONES void epilogue_pass(const Acc* rows, int64_t count, int64_t n, const Acc* __restrict__ bias,
                                         const R* __restrict__ residual, O* out) {
  for (int64_t i = 0; i < count; ++i) {
    const Acc* d = rows + i * n;
    O* o = out + i * n;
    const R* __restrict__ r = Residual ? residual + i * n : nullptr;
    for (int64_t j = 0; j < n; ++j) {
      Acc v = d[j];
      if constexpr (Bias) v += bias[j];
      if constexpr (Residual) v += widened<Acc>(r[j]);
      if constexpr (Relu) v = v > Acc(0) ? v : Acc(0);
      if constexpr (std::is_same_v<O, c10::BFloat16>) reinterpret_cast<uint16_t*>(o)[j] = narrowed(v);
      else o[j] = v;
    }
  }
}

template <typename Acc, typename R, typename O>
TSPP_INLINE_IN_CLONES void epilogue_impl(const Acc* rows, int64_t count, int64_t n, const Acc* bias,
                                         const R* residual, bool relu, O* out) {
  const int which = (bias != nullptr ? 4 : 0) | (residual != nullptr ? 2 : 0) | (relu ? 1 : 0);
  switch (which) {
    case 0: return epilogue_pass<false, false, false>(rows, count, n, bias, residual, out);
    case 1: return epilogue_pass<false, false, true>(rows, count, n, bias, residual, out);
    case 2: return epilogue_pass<false, true, false>(rows, count, n, bias, residual, out);
    case 3: return epilogue_pass<false, true, true>(rows, count, n, bias, residual, out);
    case 4: return epilogue_pass<true, false, false>(rows, count, n, bias, residual, out);
    case 5: return epilogue_pass<true, false, true>(rows, count, n, bias, residual, out);
    case 6: return epilogue_pass<true, true, false>(rows, count, n, bias, residual, out);
    default: return epilogue_pass<true, true, true>(rows, count, n, bias, residual, out);
  }
}

}  // namespace

// Nothing to do writes nothing (the rows are the result).
TSPP_ROW_CLONES void epilogue_rows(float* rows, int64_t count, int64_t n, const float* bias, const float* residual,
                                   bool relu) {
  if (bias != nullptr || residual != nullptr || relu) epilogue_impl(rows, count, n, bias, residual, relu, rows);
}

TSPP_ROW_CLONES void epilogue_rows(float* rows, int64_t count, int64_t n, const float* bias,
                                   const c10::BFloat16* residual, bool relu) {
  if (bias != nullptr || residual != nullptr || relu) epilogue_impl(rows, count, n, bias, residual, relu, rows);
}

void epilogue_rows(double* rows, int64_t count, int64_t n, const double* bias, const double* residual, bool relu) {
  if (bias != nullptr || residual != nullptr || relu) epilogue_impl(rows, count, n, bias, residual, relu, rows);
}

namespace {

TSPP_ROW_CLONES void epilogue_narrow_generic(const float* rows, int64_t count, int64_t n, const float* bias,
                                             const c10::BFloat16* residual, bool relu, c10::BFloat16* out) {
  epilogue_impl(rows, count, n, bias, residual, relu, out);
}

}  // namespace

void epilogue_narrow_rows(const float* rows, int64_t count, int64_t n, const float* bias,
                          const c10::BFloat16* residual, bool relu, c10::BFloat16* out) {
  if (epilogue_avx512_available()) return epilogue_narrow_rows_avx512(rows, count, n, bias, residual, relu, out);
  epilogue_narrow_generic(rows, count, n, bias, residual, relu, out);
}

TSPP_ROW_CLONES void scatter_add_rows(const float* rows, int64_t count, int64_t n, const int32_t* dst, float* out) {
  scatter_add_impl(rows, count, n, dst, out);
}

TSPP_ROW_CLONES void scatter_add_rows(const double* rows, int64_t count, int64_t n, const int32_t* dst,
                                      double* out) {
  scatter_add_impl(rows, count, n, dst, out);
}

TSPP_ROW_CLONES void scatter_add_rows(const c10::BFloat16* rows, int64_t count, int64_t n, const int32_t* dst,
                                      float* out) {
  scatter_add_impl(rows, count, n, dst, out);
}

TSPP_ROW_CLONES void gather_rows(const float* src, const int32_t* idx, int64_t count, int64_t n, float* out) {
  gather_impl(src, idx, count, n, out);
}

TSPP_ROW_CLONES void gather_rows(const double* src, const int32_t* idx, int64_t count, int64_t n, double* out) {
  gather_impl(src, idx, count, n, out);
}

TSPP_ROW_CLONES void gather_rows(const c10::BFloat16* src, const int32_t* idx, int64_t count, int64_t n,
                                 c10::BFloat16* out) {
  gather_impl(src, idx, count, n, out);
}

TSPP_ROW_CLONES void widen_row(const c10::BFloat16* s, int64_t n, float* d) {
  // bfloat16 is the upper half of a float: a shift, which vectorises (the c10 operator may not).
  const auto* bits = reinterpret_cast<const uint16_t*>(s);
  auto* out = reinterpret_cast<uint32_t*>(d);
  for (int64_t j = 0; j < n; ++j) out[j] = static_cast<uint32_t>(bits[j]) << 16;
}

}  // namespace torchsparse_pp
