// The AVX-512 register weight-gradient kernel of pair_wgrad.h (the AVX2 one is in
// pair_gemm_avx2.cpp). Compiled for the baseline ISA; the kernel carries its own target
// attribute and runs only after the CPU check.
#include "pair_wgrad.h"

#include <immintrin.h>

#include <algorithm>

#include "cpu_features.h"
#include "pair_gemm.h"
#include "pair_gemm_avx2.h"
#include "register_tile.h"

namespace torchsparse_pp {

namespace {

// Pairs ahead whose rows the first register block fetches (later blocks find them in cache).
constexpr int64_t kAhead = 8;

// dw[m, 16 v ..] (+)= sum_i x_i[m] g_i[16 v ..] for MR rows and NV vectors of columns; feats,
// grad and dw already point at the block's first row / column.
template <int MR, int NV>
TSPP_AVX512_TARGET void outer_kernel(int64_t count, const int32_t* src, const int32_t* dst, const float* feats,
                                     int64_t ldf, const float* grad, int64_t ldg, float* dw, int64_t ldw,
                                     __mmask16 tail, bool accumulate, int64_t prefetch_bytes_f,
                                     int64_t prefetch_bytes_g, const float* feats_row0, const float* grad_row0) {
  __m512 acc[MR][NV];
#pragma GCC unroll 16
  for (int m = 0; m < MR; ++m)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) acc[m][v] = _mm512_setzero_ps();
  for (int64_t i = 0; i < count; ++i) {
    if (prefetch_bytes_f > 0 && i + kAhead < count) {
      const char* f = reinterpret_cast<const char*>(feats_row0 + static_cast<int64_t>(src[i + kAhead]) * ldf);
      const char* g = reinterpret_cast<const char*>(grad_row0 + static_cast<int64_t>(dst[i + kAhead]) * ldg);
      for (int64_t b = 0; b < prefetch_bytes_f; b += 64) __builtin_prefetch(f + b);
      for (int64_t b = 0; b < prefetch_bytes_g; b += 64) __builtin_prefetch(g + b);
    }
    const float* x = feats + static_cast<int64_t>(src[i]) * ldf;
    const float* g = grad + static_cast<int64_t>(dst[i]) * ldg;
    __m512 b[NV];
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v)
      b[v] = v == NV - 1 ? _mm512_maskz_loadu_ps(tail, g + 16 * v) : _mm512_loadu_ps(g + 16 * v);
#pragma GCC unroll 16
    for (int m = 0; m < MR; ++m) {
      const __m512 xm = _mm512_set1_ps(x[m]);
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) acc[m][v] = _mm512_fmadd_ps(xm, b[v], acc[m][v]);
    }
  }
  store_register_tile<MR, NV>(acc, dw, ldw, tail, accumulate);
}

// Rows per register block for NV vectors of columns: 24 accumulators at most, 12 rows at most
// (the broadcasts then outnumber the loads of the gradient row).
template <int NV>
constexpr int kBlockRows = NV == 1 ? 12 : NV == 2 ? 12 : NV == 3 ? 8 : 6;

template <int NV>
void column_block(int64_t count, const int32_t* src, const int32_t* dst, const float* feats, int64_t c_src,
                  const float* grad, int64_t c_dst, int64_t n0, float* dw, __mmask16 tail, bool accumulate) {
  constexpr int MR = kBlockRows<NV>;
  for (int64_t i0 = 0; i0 < c_src; i0 += MR) {
    // The first block of the call meets the chunk's rows in memory; it fetches them ahead.
    const bool first = n0 == 0 && i0 == 0;
    const int64_t pf = first ? c_src * int64_t(sizeof(float)) : 0, pg = first ? c_dst * int64_t(sizeof(float)) : 0;
    with_constant<MR>(std::min<int64_t>(MR, c_src - i0), [&](auto rows) {
      outer_kernel<decltype(rows)::value, NV>(count, src, dst, feats + i0, c_src, grad + n0, c_dst,
                                              dw + i0 * c_dst + n0, c_dst, tail, accumulate, pf, pg, feats, grad);
    });
  }
}

}  // namespace

bool pair_wgrad_pays(int64_t c_src, int64_t c_dst) {
  return register_isa() == RegisterIsa::kAvx512 || c_src * c_dst <= 128 * 64;
}

void pair_wgrad(int64_t count, const int32_t* src, const int32_t* dst, const float* feats, int64_t c_src,
                const float* grad, int64_t c_dst, float* dw, bool accumulate) {
  if (register_isa() != RegisterIsa::kAvx512)
    return avx2::pair_wgrad(count, src, dst, feats, c_src, grad, c_dst, dw, accumulate);
  for (int64_t n0 = 0; n0 < c_dst; n0 += 64) {
    const int64_t w = std::min<int64_t>(64, c_dst - n0);
    const int nv = static_cast<int>((w + 15) / 16);
    const __mmask16 tail = static_cast<__mmask16>((1u << (w - 16 * (nv - 1))) - 1u);
    switch (nv) {
      case 1: column_block<1>(count, src, dst, feats, c_src, grad, c_dst, n0, dw, tail, accumulate); break;
      case 2: column_block<2>(count, src, dst, feats, c_src, grad, c_dst, n0, dw, tail, accumulate); break;
      case 3: column_block<3>(count, src, dst, feats, c_src, grad, c_dst, n0, dw, tail, accumulate); break;
      default: column_block<4>(count, src, dst, feats, c_src, grad, c_dst, n0, dw, tail, accumulate); break;
    }
  }
}

}  // namespace torchsparse_pp
