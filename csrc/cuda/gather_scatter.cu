// Gather and scatter-add kernels of the gather-GEMM-scatter dataflow.
//
// All kernels are grid-stride loops over a flat index of (row, word or vector). The index is
// 32-bit when the flat size is below 2^31 (cheap division) and 64-bit otherwise; every element
// address is formed as int64 row * words_per_row, so feature tensors above 2^31 elements work.
#include "gather_scatter.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace torchsparse_pp {
namespace gather_scatter_kernels {

namespace {

constexpr int kThreads = 256;
// Enough blocks to fill any current GPU several times over; larger work loops in the kernel.
constexpr int64_t kMaxBlocks = 1 << 16;

int blocks_for(int64_t work) {
  const int64_t blocks = (work + kThreads - 1) / kThreads;
  return static_cast<int>(blocks < kMaxBlocks ? blocks : kMaxBlocks);
}

// A 32-bit flat index stays below 2^31 + kMaxBlocks * kThreads < 2^32 in the loop.
bool fits_32_bit(int64_t work) { return work < (int64_t{1} << 31); }

bool aligned(const void* p, int64_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

// ---- gather --------------------------------------------------------------------------------

template <typename Word, typename Index>
__global__ void gather_rows_kernel(const Word* __restrict__ src, const int32_t* __restrict__ idx, Index valid,
                                   Index total, Index words_per_row, Word* __restrict__ buf) {
  const Index step = static_cast<Index>(gridDim.x) * blockDim.x;
  for (Index e = static_cast<Index>(blockIdx.x) * blockDim.x + threadIdx.x; e < total; e += step) {
    const Index row = e / words_per_row;
    const Index word = e - row * words_per_row;
    Word value{};  // padding rows are zero bytes
    if (row < valid)
      value = src[static_cast<int64_t>(idx[row]) * static_cast<int64_t>(words_per_row) + static_cast<int64_t>(word)];
    buf[e] = value;
  }
}

template <typename Word>
cudaError_t gather_words(const void* src, const int32_t* idx, int64_t valid, int64_t rows, int64_t row_bytes,
                         void* buf, cudaStream_t stream) {
  const int64_t words_per_row = row_bytes / static_cast<int64_t>(sizeof(Word));
  const int64_t total = rows * words_per_row;
  const auto* s = static_cast<const Word*>(src);
  auto* b = static_cast<Word*>(buf);
  if (fits_32_bit(total))
    gather_rows_kernel<Word, uint32_t><<<blocks_for(total), kThreads, 0, stream>>>(
        s, idx, static_cast<uint32_t>(valid), static_cast<uint32_t>(total), static_cast<uint32_t>(words_per_row), b);
  else
    gather_rows_kernel<Word, int64_t><<<blocks_for(total), kThreads, 0, stream>>>(s, idx, valid, total,
                                                                                   words_per_row, b);
  return cudaGetLastError();
}

// ---- scatter-add ---------------------------------------------------------------------------

template <typename T, int V>
struct alignas(sizeof(T) * V) Vec {
  T v[V];
};

__device__ __forceinline__ float to_acc(float x) { return x; }
__device__ __forceinline__ double to_acc(double x) { return x; }
__device__ __forceinline__ float to_acc(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_acc(__nv_bfloat16 x) { return __bfloat162float(x); }

// Each (pair, vector of V channels) is one thread's: with every destination at most once per
// launch, no two threads touch the same output vector, so a plain read-add-write is exact.
template <typename T, typename Acc, int V, typename Index>
__global__ void scatter_add_rows_kernel(const Vec<T, V>* __restrict__ rows, const int32_t* __restrict__ idx,
                                        Index total, Index vecs_per_row, Vec<Acc, V>* __restrict__ out) {
  const Index step = static_cast<Index>(gridDim.x) * blockDim.x;
  for (Index e = static_cast<Index>(blockIdx.x) * blockDim.x + threadIdx.x; e < total; e += step) {
    const Index row = e / vecs_per_row;
    const Index vec = e - row * vecs_per_row;
    const Vec<T, V> add = rows[e];
    Vec<Acc, V>* target =
        out + static_cast<int64_t>(idx[row]) * static_cast<int64_t>(vecs_per_row) + static_cast<int64_t>(vec);
    Vec<Acc, V> sum = *target;
#pragma unroll
    for (int i = 0; i < V; ++i) sum.v[i] += to_acc(add.v[i]);
    *target = sum;
  }
}

template <typename T, typename Acc, int V>
cudaError_t scatter_vectors(const void* rows, const int32_t* idx, int64_t n, int64_t channels, void* out,
                            cudaStream_t stream) {
  const int64_t vecs_per_row = channels / V;
  const int64_t total = n * vecs_per_row;
  const auto* r = static_cast<const Vec<T, V>*>(rows);
  auto* o = static_cast<Vec<Acc, V>*>(out);
  if (fits_32_bit(total))
    scatter_add_rows_kernel<T, Acc, V, uint32_t><<<blocks_for(total), kThreads, 0, stream>>>(
        r, idx, static_cast<uint32_t>(total), static_cast<uint32_t>(vecs_per_row), o);
  else
    scatter_add_rows_kernel<T, Acc, V, int64_t><<<blocks_for(total), kThreads, 0, stream>>>(r, idx, total,
                                                                                             vecs_per_row, o);
  return cudaGetLastError();
}

// The widest vector (16 bytes of accumulator, then half of that, then one element) that the
// channel count and both base addresses allow.
template <typename T, typename Acc>
cudaError_t scatter_typed(const void* rows, const int32_t* idx, int64_t n, int64_t channels, void* out,
                          cudaStream_t stream) {
  constexpr int kWide = 16 / sizeof(Acc);
  auto fits = [&](int v) {
    return channels % v == 0 && aligned(rows, sizeof(T) * v) && aligned(out, sizeof(Acc) * v);
  };
  if (fits(kWide)) return scatter_vectors<T, Acc, kWide>(rows, idx, n, channels, out, stream);
  if constexpr (kWide >= 4) {
    if (fits(kWide / 2)) return scatter_vectors<T, Acc, kWide / 2>(rows, idx, n, channels, out, stream);
  }
  return scatter_vectors<T, Acc, 1>(rows, idx, n, channels, out, stream);
}

}  // namespace

cudaError_t launch_gather_rows(const void* src, const int32_t* idx, int64_t valid, int64_t rows,
                               int64_t row_bytes, void* buf, cudaStream_t stream) {
  if (rows <= 0 || row_bytes <= 0) return cudaSuccess;
  auto fits = [&](int64_t w) { return row_bytes % w == 0 && aligned(src, w) && aligned(buf, w); };
  if (fits(16)) return gather_words<uint4>(src, idx, valid, rows, row_bytes, buf, stream);
  if (fits(8)) return gather_words<uint2>(src, idx, valid, rows, row_bytes, buf, stream);
  if (fits(4)) return gather_words<uint32_t>(src, idx, valid, rows, row_bytes, buf, stream);
  if (fits(2)) return gather_words<uint16_t>(src, idx, valid, rows, row_bytes, buf, stream);
  return gather_words<uint8_t>(src, idx, valid, rows, row_bytes, buf, stream);
}

cudaError_t launch_scatter_add_rows(const void* rows, ScatterTypes types, const int32_t* idx, int64_t n,
                                    int64_t channels, void* out, cudaStream_t stream) {
  if (n <= 0 || channels <= 0) return cudaSuccess;
  switch (types) {
    case ScatterTypes::kFloat32: return scatter_typed<float, float>(rows, idx, n, channels, out, stream);
    case ScatterTypes::kFloat64: return scatter_typed<double, double>(rows, idx, n, channels, out, stream);
    case ScatterTypes::kFloat16ToFloat32: return scatter_typed<__half, float>(rows, idx, n, channels, out, stream);
    case ScatterTypes::kBFloat16ToFloat32:
      return scatter_typed<__nv_bfloat16, float>(rows, idx, n, channels, out, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace gather_scatter_kernels
}  // namespace torchsparse_pp
