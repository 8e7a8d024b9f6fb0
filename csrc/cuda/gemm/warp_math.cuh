// What one CTA step computes from its shared-memory tiles: acc += A_tile * B_tile.
// A is [CTA_M][CTA_K] (row stride lda) or, with A_TRANS, stored as [CTA_K][CTA_M]; B is
// [CTA_K][CTA_N] (row stride ldb). Three policies: fp16/bf16 and TF32 tensor cores (mma.sync),
// and SIMT for exact float32 / float64. Each also maps its accumulators to tile coordinates.
#pragma once

#include "primitives.cuh"

namespace torchsparse_pp {
namespace gemm {

// Float accumulators of mma.sync m16n8 fragments: WARPS_M x WARPS_N warps tile the CTA, each
// owning a (CTA_M / WARPS_M) x (CTA_N / WARPS_N) block of 16 x 8 fragments.
template <int CTA_M, int CTA_N, int WARPS_M, int WARPS_N>
struct MmaAccumulators {
  using Acc = float;
  static constexpr int kThreads = WARPS_M * WARPS_N * 32;
  static constexpr int kWarpM = CTA_M / WARPS_M, kWarpN = CTA_N / WARPS_N;
  static constexpr int kMI = kWarpM / 16, kNI = kWarpN / 8;

  float acc[kMI][kNI][4];

  __device__ __forceinline__ void zero() {
#pragma unroll
    for (int i = 0; i < kMI; ++i)
#pragma unroll
      for (int j = 0; j < kNI; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.f;
  }

  // store(m, n, value) for every accumulator, m and n relative to the CTA tile. Fragment
  // element e of lane (g = lane / 4, t = lane % 4) sits at row g + 8 * (e / 2), column 2t + e % 2.
  template <typename Store>
  __device__ __forceinline__ void for_each(Store&& store) const {
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int wm0 = (warp / WARPS_N) * kWarpM, wn0 = (warp % WARPS_N) * kWarpN;
    const int g = lane / 4, t = lane % 4;
#pragma unroll
    for (int i = 0; i < kMI; ++i)
#pragma unroll
      for (int j = 0; j < kNI; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e)
          store(wm0 + i * 16 + g + (e / 2) * 8, wn0 + j * 8 + 2 * t + (e % 2), acc[i][j][e]);
  }
};

// fp16 / bf16 through mma.m16n8k16, fragments through ldmatrix.
template <typename T, int CTA_M, int CTA_N, int CTA_K, int WARPS_M, int WARPS_N, bool A_TRANS>
struct MmaHalf : MmaAccumulators<CTA_M, CTA_N, WARPS_M, WARPS_N> {
  using Base = MmaAccumulators<CTA_M, CTA_N, WARPS_M, WARPS_N>;
  using Base::acc;
  static constexpr int kWarpM = Base::kWarpM, kWarpN = Base::kWarpN, kMI = Base::kMI, kNI = Base::kNI;
  static_assert(kWarpM % 16 == 0 && kWarpN % 16 == 0 && CTA_K % 16 == 0, "mma.m16n8k16 tiling");

  __device__ __forceinline__ void compute(const T* As, int lda, const T* Bs, int ldb) {
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int wm0 = (warp / WARPS_N) * kWarpM, wn0 = (warp % WARPS_N) * kWarpN;
#pragma unroll
    for (int ks = 0; ks < CTA_K / 16; ++ks) {
      uint32_t a[kMI][4];
#pragma unroll
      for (int i = 0; i < kMI; ++i) {
        if constexpr (!A_TRANS) {
          // Matrices: (m 0-7, k 0-7), (m 8-15, k 0-7), (m 0-7, k 8-15), (m 8-15, k 8-15).
          ldmatrix_x4(a[i], As + (wm0 + i * 16 + lane % 16) * lda + ks * 16 + (lane / 16) * 8);
        } else {
          // Same four matrices read from [k][m] storage, transposed by ldmatrix.
          ldmatrix_x4_trans(a[i], As + (ks * 16 + lane % 8 + (lane / 16) * 8) * lda + wm0 + i * 16 +
                                      ((lane / 8) % 2) * 8);
        }
      }
      uint32_t b[kNI][2];
#pragma unroll
      for (int j = 0; j < kNI / 2; ++j) {
        // (k 0-7, n 0-7), (k 8-15, n 0-7), (k 0-7, n 8-15), (k 8-15, n 8-15) of [k][n] storage.
        uint32_t r[4];
        ldmatrix_x4_trans(r, Bs + (ks * 16 + lane % 16) * ldb + wn0 + j * 16 + (lane / 16) * 8);
        b[2 * j][0] = r[0];
        b[2 * j][1] = r[1];
        b[2 * j + 1][0] = r[2];
        b[2 * j + 1][1] = r[3];
      }
#pragma unroll
      for (int i = 0; i < kMI; ++i)
#pragma unroll
        for (int j = 0; j < kNI; ++j) mma_m16n8k16(acc[i][j], a[i], b[j][0], b[j][1], T());
    }
  }

};

// float32 on TF32 tensor cores through mma.m16n8k8; operands rounded to TF32 as they are read.
template <int CTA_M, int CTA_N, int CTA_K, int WARPS_M, int WARPS_N, bool A_TRANS>
struct MmaTF32 : MmaAccumulators<CTA_M, CTA_N, WARPS_M, WARPS_N> {
  using Base = MmaAccumulators<CTA_M, CTA_N, WARPS_M, WARPS_N>;
  using Base::acc;
  static constexpr int kWarpM = Base::kWarpM, kWarpN = Base::kWarpN, kMI = Base::kMI, kNI = Base::kNI;
  static_assert(kWarpM % 16 == 0 && kWarpN % 8 == 0 && CTA_K % 8 == 0, "mma.m16n8k8 tiling");

  __device__ __forceinline__ static float a_at(const float* As, int lda, int m, int k) {
    return A_TRANS ? As[k * lda + m] : As[m * lda + k];
  }

  __device__ __forceinline__ void compute(const float* As, int lda, const float* Bs, int ldb) {
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int wm0 = (warp / WARPS_N) * kWarpM, wn0 = (warp % WARPS_N) * kWarpN;
    const int g = lane / 4, t = lane % 4;
#pragma unroll
    for (int ks = 0; ks < CTA_K / 8; ++ks) {
      const int k0 = ks * 8;
      uint32_t a[kMI][4];
#pragma unroll
      for (int i = 0; i < kMI; ++i) {
        const int m = wm0 + i * 16 + g;
        a[i][0] = to_tf32(a_at(As, lda, m, k0 + t));
        a[i][1] = to_tf32(a_at(As, lda, m + 8, k0 + t));
        a[i][2] = to_tf32(a_at(As, lda, m, k0 + t + 4));
        a[i][3] = to_tf32(a_at(As, lda, m + 8, k0 + t + 4));
      }
#pragma unroll
      for (int j = 0; j < kNI; ++j) {
        const int n = wn0 + j * 8 + g;
        const uint32_t b0 = to_tf32(Bs[(k0 + t) * ldb + n]);
        const uint32_t b1 = to_tf32(Bs[(k0 + t + 4) * ldb + n]);
#pragma unroll
        for (int i = 0; i < kMI; ++i) mma_m16n8k8_tf32(acc[i][j], a[i], b0, b1);
      }
    }
  }
};

// Exact float32 / float64 on the CUDA cores: each thread owns TM x TN outputs, strided by the
// thread grid so that a warp reads few distinct A rows (broadcast) and consecutive B columns.
template <typename T, int CTA_M, int CTA_N, int CTA_K, int TM, int TN, bool A_TRANS>
struct Simt {
  using Acc = T;
  static constexpr int kTX = CTA_N / TN, kTY = CTA_M / TM;
  static constexpr int kThreads = kTX * kTY;
  static_assert(CTA_M % TM == 0 && CTA_N % TN == 0, "SIMT tiling");

  T acc[TM][TN];

  __device__ __forceinline__ void zero() {
#pragma unroll
    for (int i = 0; i < TM; ++i)
#pragma unroll
      for (int j = 0; j < TN; ++j) acc[i][j] = T(0);
  }

  __device__ __forceinline__ void compute(const T* As, int lda, const T* Bs, int ldb) {
    const int ty = threadIdx.x / kTX, tx = threadIdx.x % kTX;
#pragma unroll
    for (int k = 0; k < CTA_K; ++k) {
      T a[TM], b[TN];
#pragma unroll
      for (int i = 0; i < TM; ++i) {
        const int m = ty + i * kTY;
        a[i] = A_TRANS ? As[k * lda + m] : As[m * lda + k];
      }
#pragma unroll
      for (int j = 0; j < TN; ++j) b[j] = Bs[k * ldb + tx + j * kTX];
#pragma unroll
      for (int i = 0; i < TM; ++i)
#pragma unroll
        for (int j = 0; j < TN; ++j) acc[i][j] = fma(a[i], b[j], acc[i][j]);
    }
  }

  template <typename Store>
  __device__ __forceinline__ void for_each(Store&& store) const {
    const int ty = threadIdx.x / kTX, tx = threadIdx.x % kTX;
#pragma unroll
    for (int i = 0; i < TM; ++i)
#pragma unroll
      for (int j = 0; j < TN; ++j) store(ty + i * kTY, tx + j * kTX, acc[i][j]);
  }
};

}  // namespace gemm
}  // namespace torchsparse_pp
