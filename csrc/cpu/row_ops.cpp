// Multi-versioned row loops (see row_ops.h).
#include "row_ops.h"

namespace torchsparse_pp {

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define TSPP_ROW_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define TSPP_ROW_CLONES
#endif

namespace {

template <typename T>
inline void scatter_add_impl(const T* rows, int64_t count, int64_t n, const int32_t* dst, T* out) {
  for (int64_t i = 0; i < count; ++i) {
    T* d = out + static_cast<int64_t>(dst[i]) * n;
    const T* s = rows + i * n;
    for (int64_t j = 0; j < n; ++j) d[j] += s[j];
  }
}

template <typename Acc, typename R>
inline void epilogue_impl(Acc* rows, int64_t count, int64_t n, const Acc* bias, const R* residual, bool relu) {
  for (int64_t i = 0; i < count; ++i) {
    Acc* d = rows + i * n;
    if (bias != nullptr)
      for (int64_t j = 0; j < n; ++j) d[j] += bias[j];
    if (residual != nullptr) {
      const R* r = residual + i * n;
      for (int64_t j = 0; j < n; ++j) d[j] += static_cast<Acc>(r[j]);
    }
    if (relu)
      for (int64_t j = 0; j < n; ++j) d[j] = d[j] > Acc(0) ? d[j] : Acc(0);
  }
}

}  // namespace

TSPP_ROW_CLONES void epilogue_rows(float* rows, int64_t count, int64_t n, const float* bias, const float* residual,
                                   bool relu) {
  epilogue_impl(rows, count, n, bias, residual, relu);
}

TSPP_ROW_CLONES void epilogue_rows(float* rows, int64_t count, int64_t n, const float* bias,
                                   const c10::BFloat16* residual, bool relu) {
  epilogue_impl(rows, count, n, bias, residual, relu);
}

void epilogue_rows(double* rows, int64_t count, int64_t n, const double* bias, const double* residual, bool relu) {
  epilogue_impl(rows, count, n, bias, residual, relu);
}

TSPP_ROW_CLONES void scatter_add_rows(const float* rows, int64_t count, int64_t n, const int32_t* dst, float* out) {
  scatter_add_impl(rows, count, n, dst, out);
}

TSPP_ROW_CLONES void scatter_add_rows(const double* rows, int64_t count, int64_t n, const int32_t* dst,
                                      double* out) {
  scatter_add_impl(rows, count, n, dst, out);
}

TSPP_ROW_CLONES void interleave_rows(const c10::BFloat16* even, const c10::BFloat16* odd, int64_t n,
                                     c10::BFloat16* out) {
  const auto* e = reinterpret_cast<const uint16_t*>(even);
  const auto* o = reinterpret_cast<const uint16_t*>(odd);
  auto* w = reinterpret_cast<uint32_t*>(out);
  if (e != nullptr && o != nullptr)
    for (int64_t j = 0; j < n; ++j) w[j] = static_cast<uint32_t>(e[j]) | (static_cast<uint32_t>(o[j]) << 16);
  else if (e != nullptr)
    for (int64_t j = 0; j < n; ++j) w[j] = e[j];
  else if (o != nullptr)
    for (int64_t j = 0; j < n; ++j) w[j] = static_cast<uint32_t>(o[j]) << 16;
  else
    for (int64_t j = 0; j < n; ++j) w[j] = 0;
}

TSPP_ROW_CLONES void widen_row(const c10::BFloat16* s, int64_t n, float* d) {
  // bfloat16 is the upper half of a float: a shift, which vectorises (the c10 operator may not).
  const auto* bits = reinterpret_cast<const uint16_t*>(s);
  auto* out = reinterpret_cast<uint32_t*>(d);
  for (int64_t j = 0; j < n; ++j) out[j] = static_cast<uint32_t>(bits[j]) << 16;
}

TSPP_ROW_CLONES void narrow_row(const float* s, int64_t n, c10::BFloat16* d) {
  // The integer form of c10's round-to-nearest-even, branch-free so that it vectorises.
  const auto* bits = reinterpret_cast<const uint32_t*>(s);
  auto* out = reinterpret_cast<uint16_t*>(d);
  for (int64_t j = 0; j < n; ++j) {
    const uint32_t b = bits[j];
    const bool nan = (b & 0x7FFFFFFFu) > 0x7F800000u;
    const uint32_t rounded = (b + 0x7FFFu + ((b >> 16) & 1u)) >> 16;
    out[j] = static_cast<uint16_t>(nan ? 0x7FC0u : rounded);
  }
}

}  // namespace torchsparse_pp
