// bfloat16 tile GEMMs on the CPU's bf16 dot-product instructions (AVX512-BF16 vdpbf16ps):
// C[M, N] (+)= A[M, K] B[K, N] with A row-major bfloat16, B packed in pairs of K rows and C
// float. Chosen at run time from the CPU's features; without them the dataflows keep their float
// tiles (bfloat16 converted on gather), which give the same sums up to float rounding order.
//
// ATen's cpublas::brgemm has a bf16 path only with AMX (could_pack); oneDNN's GEMM has one for
// AVX512-BF16 too but costs microseconds per call, far more than one tile. So the tile kernel is
// ours: a register-blocked micro-kernel with one vdpbf16ps per (row, 16 columns, pair of K).
#pragma once

#include <ATen/ATen.h>

#include <cstdint>

namespace torchsparse_pp {

// Whether the bf16 dot-product kernels run on this CPU (and are not switched off by
// TSPP_DISABLE_BF16_DOT=1 or TSPP_DISABLE_AVX512_KERNELS=1, which tests use to compare paths).
bool bf16_dot_available();

// K rounded up to whole pairs: the length of a packed K dimension.
inline int64_t bf16_pairs_len(int64_t k) { return (k + 1) / 2 * 2; }

// Packs B[K, N] (row-major, leading dimension ldb) as [ceil(K/2)][N][2]: element (k, n) goes to
// ((k / 2) * N + n) * 2 + k % 2; an odd K gets a zero last row.
void bf16_pack_pairs(int64_t K, int64_t N, const at::BFloat16* B, int64_t ldb, at::BFloat16* out);

// The weight [K, C_src, C_dst] (C_src, C_dst swapped with `transpose`) with every offset's rows
// packed: [K, ceil(C_src / 2), C_dst, 2]; offset k starts at k * bf16_pairs_len(C_src) * C_dst.
at::Tensor bf16_packed_weight(const at::Tensor& weight, bool transpose);

// out[p, j] = (src[rows[2p], j], src[rows[2p + 1], j]) as one 32-bit word, for p < ceil(n / 2)
// and j < c: gathered rows packed like B (the weight gradient's operands). A row < 0, and the
// missing partner of an odd n's last row, read as zeros. Needs bf16_dot_available().
void bf16_gather_pairs(const at::BFloat16* src, int64_t c, const int64_t* rows, int64_t n, at::BFloat16* out);

// C[M, N] (+)= A[M, K_even] * B, B packed by bf16_pack_pairs (N columns). lda is even (A's rows
// hold whole pairs). Needs bf16_dot_available().
void bf16_gemm(int64_t M, int64_t N, int64_t K_even, const at::BFloat16* A, int64_t lda,
               const at::BFloat16* B_packed, float* C, int64_t ldc, bool accumulate);

// The same with A given by strides in whole pairs: the pair (A[m, 2p], A[m, 2p + 1]) is the
// 32-bit word at A + 2 * (m * row_stride + p * pair_stride). Row-major A has (lda / 2, 1); A
// packed like B ([K_even / 2][M][2], what the weight gradient gathers) has (1, M).
void bf16_gemm_strided(int64_t M, int64_t N, int64_t K_even, const at::BFloat16* A, int64_t row_stride,
                       int64_t pair_stride, const at::BFloat16* B_packed, float* C, int64_t ldc, bool accumulate);

}  // namespace torchsparse_pp
