// The AVX512-BF16 tile kernel of bf16_gemm.h. Compiled for the baseline ISA; the kernel
// functions carry their own target attribute and run only after the CPU check.
#include "bf16_gemm.h"

#include <ATen/Parallel.h>
#include <immintrin.h>
#include <torch/library.h>

#include <algorithm>

#include "cpu_features.h"
#include "pair_gemm.h"
#include "register_tile.h"
#include "tile_gemm.h"

// GCC 12 warns of the intrinsic headers' own undefined operands (_mm512_undefined_*).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

namespace torchsparse_pp {

namespace {

// acc[m][v] += A-pair(m, p) . B-pairs(p, 16 v .. 16 v + 15) for every pair p: MR rows by NV
// vectors of 16 columns; the last vector loads and stores under `tail`.
template <int MR, int NV>
TSPP_AVX512_BF16_TARGET void micro_kernel(int64_t pairs, const uint32_t* A, int64_t row_stride,
                                          int64_t pair_stride, const uint32_t* B, int64_t N, float* C, int64_t ldc,
                                          __mmask16 tail, bool accumulate) {
  // Fully unrolled so that the accumulators live in registers (GCC keeps a partly indexed
  // array of vectors on the stack).
  __m512 acc[MR][NV];
#pragma GCC unroll 16
  for (int m = 0; m < MR; ++m)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) acc[m][v] = _mm512_setzero_ps();
  for (int64_t p = 0; p < pairs; ++p) {
    __m512i b[NV];
    const uint32_t* row = B + p * N;
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v)
      b[v] = v == NV - 1 ? _mm512_maskz_loadu_epi32(tail, row + 16 * v) : _mm512_loadu_si512(row + 16 * v);
#pragma GCC unroll 16
    for (int m = 0; m < MR; ++m) {
      const __m512i a = _mm512_set1_epi32(static_cast<int>(A[m * row_stride + p * pair_stride]));
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) acc[m][v] = _mm512_dpbf16_ps(acc[m][v], (__m512bh)a, (__m512bh)b[v]);
    }
  }
  store_register_tile<MR, NV>(acc, C, ldc, tail, accumulate);
}

// Rows of one column block in steps of MR, the remainder by a narrower instantiation. MR x NV
// stays within 24 accumulators, and with one or two vectors MR is large enough that the sums
// do not wait on the dot product's latency (8 rows of one vector did: 16 x 16 weight gradients
// ran no faster than in float32).
template <int NV>
constexpr int kTileRows = NV == 1 ? 16 : NV == 2 ? 12 : NV == 3 ? 8 : 6;

template <int NV>
TSPP_AVX512_BF16_TARGET void column_block(int64_t M, int64_t pairs, const uint32_t* A, int64_t row_stride,
                                          int64_t pair_stride, const uint32_t* B, int64_t N, float* C, int64_t ldc,
                                          __mmask16 tail, bool accumulate) {
  constexpr int MR = kTileRows<NV>;
  int64_t m = 0;
  for (; m + MR <= M; m += MR)
    micro_kernel<MR, NV>(pairs, A + m * row_stride, row_stride, pair_stride, B, N, C + m * ldc, ldc, tail,
                         accumulate);
  with_constant<MR - 1>(M - m, [&](auto rows) {
    micro_kernel<decltype(rows)::value, NV>(pairs, A + m * row_stride, row_stride, pair_stride, B, N, C + m * ldc,
                                            ldc, tail, accumulate);
  });
}

// Rows ahead whose cache lines bf16_gather_pairs requests: they are random reads.
constexpr int64_t kGatherAhead = 64;

// 16 columns per step in 256-bit halves: word unpacks interleave the two rows within 128-bit
// lanes and one lane permute puts the columns in order (2x faster than widening each row to 32
// bits and shifting, which made the gather ~40 % of a 48-wide bf16 weight gradient on a Zen 5).
TSPP_AVX512_TARGET void gather_pairs_kernel(const uint16_t* src, int64_t c, const int64_t* rows, int64_t n,
                                            uint32_t* out) {
  const int64_t row_bytes = c * 2, full = c / 16 * 16;
  const __mmask16 tail = static_cast<__mmask16>((1u << (c - full)) - 1u);
  const __mmask8 tail_first = static_cast<__mmask8>(tail), tail_second = static_cast<__mmask8>(tail >> 8);
  for (int64_t p = 0; p < (n + 1) / 2; ++p) {
    for (int64_t i = 2 * p + kGatherAhead; i < std::min(n, 2 * p + kGatherAhead + 2); ++i)
      if (rows[i] >= 0) prefetch_lines(src + rows[i] * c, row_bytes);
    // An absent row reads nothing: its loads are masked off (the pointer stays valid).
    const int64_t r0 = rows[2 * p], r1 = 2 * p + 1 < n ? rows[2 * p + 1] : -1;
    const uint16_t* e = src + std::max<int64_t>(r0, 0) * c;
    const uint16_t* o = src + std::max<int64_t>(r1, 0) * c;
    const __mmask16 keep_e = r0 >= 0 ? 0xFFFF : 0, keep_o = r1 >= 0 ? 0xFFFF : 0;
    uint32_t* w = out + p * c;
    // Lane l of an unpack holds columns 4 (2 l) .. + 3 (low) and 4 (2 l + 1) .. + 3 (high).
    const auto pairs = [&](int64_t j, __mmask16 k, __m256i& first, __m256i& second)
        __attribute__((always_inline, target("avx512f,avx512bw,avx512vl"))) {
      const __m256i even = _mm256_maskz_loadu_epi16(k & keep_e, e + j);
      const __m256i odd = _mm256_maskz_loadu_epi16(k & keep_o, o + j);
      const __m256i low = _mm256_unpacklo_epi16(even, odd), high = _mm256_unpackhi_epi16(even, odd);
      first = _mm256_permute2x128_si256(low, high, 0x20);   // columns j .. j + 7
      second = _mm256_permute2x128_si256(low, high, 0x31);  // columns j + 8 .. j + 15
    };
    __m256i first, second;
    for (int64_t j = 0; j < full; j += 16) {
      pairs(j, 0xFFFF, first, second);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(w + j), first);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(w + j + 8), second);
    }
    if (full < c) {
      pairs(full, tail, first, second);
      _mm256_mask_storeu_epi32(w + full, tail_first, first);
      _mm256_mask_storeu_epi32(w + full + 8, tail_second, second);
    }
  }
}

}  // namespace

bool bf16_dot_available() {
  static const bool available = [] {
    return cpu_has_avx512(/*bf16=*/true) && !disabled_by_env("TSPP_DISABLE_BF16_DOT");
  }();
  return available && !avx512_kernels_off();
}

// One 32-bit word per (pair, column), even row in the low half (little-endian): a loop the
// compiler vectorises (it runs on every bf16 conv call, on the whole weight).
TSPP_ROW_CLONES void bf16_pack_pairs(int64_t K, int64_t N, const at::BFloat16* B, int64_t ldb, at::BFloat16* out) {
  const auto* bits = reinterpret_cast<const uint16_t*>(B);
  auto* words = reinterpret_cast<uint32_t*>(out);
  for (int64_t p = 0; p < (K + 1) / 2; ++p) {
    const uint16_t* __restrict__ even = bits + 2 * p * ldb;
    uint32_t* __restrict__ o = words + p * N;
    if (2 * p + 1 < K) {
      const uint16_t* __restrict__ odd = even + ldb;
      for (int64_t n = 0; n < N; ++n) o[n] = even[n] | (static_cast<uint32_t>(odd[n]) << 16);
    } else {
      for (int64_t n = 0; n < N; ++n) o[n] = even[n];
    }
  }
}

namespace {

// bf16_pack_pairs of B = Bt^T, Bt [N, K] row-major: a pair of K values of column n is two
// neighbours in Bt's row n, so packing is a transpose of 32-bit words ([N][K / 2] -> [K / 2][N]),
// in blocks of 16 x 16 words that stay in L1 (no transposed copy of the weight first).
TSPP_ROW_CLONES void bf16_pack_pairs_transposed(int64_t K, int64_t N, const at::BFloat16* Bt, at::BFloat16* out) {
  const auto* bits = reinterpret_cast<const uint16_t*>(Bt);
  auto* words = reinterpret_cast<uint32_t*>(out);
  const int64_t pairs = (K + 1) / 2;
  constexpr int64_t kBlock = 16;
  for (int64_t n0 = 0; n0 < N; n0 += kBlock)
    for (int64_t p0 = 0; p0 < pairs; p0 += kBlock)
      for (int64_t p = p0; p < std::min(pairs, p0 + kBlock); ++p) {
        const bool whole = 2 * p + 1 < K;
        for (int64_t n = n0; n < std::min(N, n0 + kBlock); ++n) {
          const uint16_t* row = bits + n * K + 2 * p;
          words[p * N + n] = row[0] | (whole ? static_cast<uint32_t>(row[1]) << 16 : 0u);
        }
      }
}

}  // namespace

at::Tensor bf16_packed_weight(const at::Tensor& weight, bool transpose) {
  const auto w = weight.to(at::kBFloat16).contiguous();  // [K, rows, cols]: C_src = rows unless transposed
  const int64_t K = w.size(0), rows = w.size(1), cols = w.size(2);
  const int64_t c_src = transpose ? cols : rows, c_dst = transpose ? rows : cols, c_pad = bf16_pairs_len(c_src);
  at::Tensor packed = at::empty({K, c_pad / 2, c_dst, 2}, w.options());
  const at::BFloat16* src = w.data_ptr<at::BFloat16>();
  at::BFloat16* dst = packed.data_ptr<at::BFloat16>();
  // Offsets in parallel once there are ~64K values to pack (a 128 x 128 weight's 27 offsets).
  const int64_t grain = std::max<int64_t>(1, (int64_t(1) << 16) / std::max<int64_t>(1, rows * cols));
  at::parallel_for(0, K, grain, [&](int64_t k0, int64_t k1) {
    for (int64_t k = k0; k < k1; ++k) {
      if (transpose) bf16_pack_pairs_transposed(c_src, c_dst, src + k * rows * cols, dst + k * c_pad * c_dst);
      else bf16_pack_pairs(c_src, c_dst, src + k * rows * cols, c_dst, dst + k * c_pad * c_dst);
    }
  });
  return packed;
}

void bf16_gather_pairs(const at::BFloat16* src, int64_t c, const int64_t* rows, int64_t n, at::BFloat16* out) {
  TORCH_CHECK(bf16_dot_available(), "bf16_gather_pairs needs AVX512-BF16");
  gather_pairs_kernel(reinterpret_cast<const uint16_t*>(src), c, rows, n, reinterpret_cast<uint32_t*>(out));
}

void bf16_gemm_strided(int64_t M, int64_t N, int64_t K_even, const at::BFloat16* A, int64_t row_stride,
                       int64_t pair_stride, const at::BFloat16* B_packed, float* C, int64_t ldc, bool accumulate) {
  TORCH_CHECK(bf16_dot_available(), "bf16_gemm needs AVX512-BF16");
  TORCH_CHECK(K_even % 2 == 0, "bf16_gemm works on whole pairs of K");
  if (M == 0 || N == 0) return;
  const int64_t pairs = K_even / 2;
  const auto* a = reinterpret_cast<const uint32_t*>(A);
  const auto* b = reinterpret_cast<const uint32_t*>(B_packed);
  // Column blocks of 64 (4 vectors), the last one narrower and masked.
  for_column_blocks(N, [&](int64_t n0, auto nv, __mmask16 tail) {
    column_block<decltype(nv)::value>(M, pairs, a, row_stride, pair_stride, b + n0, N, C + n0, ldc, tail, accumulate);
  });
}

void bf16_gemm(int64_t M, int64_t N, int64_t K_even, const at::BFloat16* A, int64_t lda,
               const at::BFloat16* B_packed, float* C, int64_t ldc, bool accumulate) {
  TORCH_CHECK(lda % 2 == 0, "bf16_gemm: A's rows must hold whole pairs (even lda)");
  bf16_gemm_strided(M, N, K_even, A, lda / 2, 1, B_packed, C, ldc, accumulate);
}

}  // namespace torchsparse_pp

namespace torchsparse_pp {

TORCH_LIBRARY_IMPL(torchsparse_pp, CompositeExplicitAutograd, m) {
  m.impl("cpu_bf16_dot", []() { return bf16_dot_available(); });
}

}  // namespace torchsparse_pp
