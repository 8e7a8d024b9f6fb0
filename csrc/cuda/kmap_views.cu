// Derived views of a kernel map on the GPU: pairs, transposed table, plan masks.
#include "kmap_views.h"

#include "kmap_launch.h"

namespace torchsparse_pp {
namespace kmap_kernels {

namespace {

using ull = unsigned long long;
constexpr int kWarps = kPairChunkRows / 32;

// Block loops over chunks; every thread of a block runs the same iterations (barriers inside).
__global__ void pairs_count_kernel(const int32_t* out_in, int64_t num_out, int64_t K, int64_t num_in,
                                   int64_t num_chunks, int64_t* counts, int32_t* not_identity,
                                   int32_t* bad_input) {
  for (int64_t chunk = blockIdx.x; chunk < num_chunks; chunk += gridDim.x) {
    const int64_t r = chunk * kPairChunkRows + threadIdx.x;
    const bool live = r < num_out;
    for (int64_t k = 0; k < K; ++k) {
      const int32_t v = live ? out_in[r * K + k] : -1;
      if (live && v >= num_in) *bad_input = 1;
      const int present = __syncthreads_count(v >= 0);
      const int differs = __syncthreads_or(live && v != r);  // one store per block, not per row
      if (threadIdx.x == 0) {
        counts[k * num_chunks + chunk] = present;
        if (differs) not_identity[k] = 1;
      }
    }
  }
}

__global__ void pairs_fill_kernel(const int32_t* out_in, int64_t num_out, int64_t K, int64_t num_chunks,
                                  const int64_t* starts, int32_t* in_idx, int32_t* out_idx) {
  __shared__ int warp_totals[kWarps];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const unsigned lanes_below = (1u << lane) - 1u;
  for (int64_t chunk = blockIdx.x; chunk < num_chunks; chunk += gridDim.x) {
    const int64_t r = chunk * kPairChunkRows + threadIdx.x;
    const bool live = r < num_out;
    for (int64_t k = 0; k < K; ++k) {
      const int32_t v = live ? out_in[r * K + k] : -1;
      const bool present = v >= 0;
      const unsigned ballot = __ballot_sync(0xffffffffu, present);
      if (lane == 0) warp_totals[warp] = __popc(ballot);
      __syncthreads();
      if (present) {
        // Rank among the chunk's present rows: earlier warps, then earlier lanes.
        int64_t pos = starts[k * num_chunks + chunk] + __popc(ballot & lanes_below);
        for (int w = 0; w < warp; ++w) pos += warp_totals[w];
        in_idx[pos] = v;
        out_idx[pos] = static_cast<int32_t>(r);
      }
      __syncthreads();  // warp_totals is rewritten for the next offset
    }
  }
}

__global__ void transpose_map_kernel(const int32_t* out_in, int64_t num_out, int64_t K, int32_t* in_out,
                                     int32_t* clash) {
  TSPP_GRID_LOOP(e, num_out * K) {
    const int32_t p = out_in[e];
    if (p < 0) continue;
    const int64_t q = e / K, k = e % K;
    // Within one offset an input feeds at most one output; a second claim means a corrupt map.
    if (atomicCAS(in_out + static_cast<int64_t>(p) * K + k, -1, static_cast<int32_t>(q)) != -1) *clash = 1;
  }
}

__global__ void plan_row_masks_kernel(const int32_t* table, int64_t num_rows, int64_t K, const int64_t* bounds,
                                      int64_t splits, int64_t words, int64_t* masks) {
  TSPP_GRID_LOOP(e, splits * num_rows * words) {
    const int64_t w = e % words, r = (e / words) % num_rows, s = e / (words * num_rows);
    const int64_t k0 = bounds[s] + 64 * w;
    const int64_t k1 = bounds[s + 1] < k0 + 64 ? bounds[s + 1] : k0 + 64;
    ull mask = 0;
    for (int64_t k = k0; k < k1; ++k) mask |= ull(table[r * K + k] >= 0) << (k - k0);
    masks[e] = static_cast<int64_t>(mask);
  }
}

__global__ void plan_tile_masks_kernel(const int64_t* masks, int64_t num_rows, int64_t splits, int64_t words,
                                       const int32_t* order, int64_t order_stride, int64_t tile_rows,
                                       int64_t tiles, int64_t* tile_masks) {
  TSPP_GRID_LOOP(e, splits * num_rows) {
    const int64_t s = e / num_rows, i = e % num_rows;
    const int64_t row = order != nullptr ? order[s * order_stride + i] : i;
    const int64_t* src = masks + (s * num_rows + row) * words;
    ull* dst = reinterpret_cast<ull*>(tile_masks + (s * tiles + i / tile_rows) * words);
    for (int64_t w = 0; w < words; ++w)
      if (src[w] != 0) atomicOr(dst + w, static_cast<ull>(src[w]));
  }
}

unsigned chunk_grid(int64_t num_chunks) {
  constexpr int64_t kMaxBlocks = int64_t(1) << 20;
  return static_cast<unsigned>(num_chunks < kMaxBlocks ? num_chunks : kMaxBlocks);
}

}  // namespace

cudaError_t pairs_count(const int32_t* out_in, int64_t num_out, int64_t K, int64_t num_in,
                        int64_t num_chunks, int64_t* counts, int32_t* not_identity,
                        int32_t* bad_input, cudaStream_t stream) {
  if (num_chunks <= 0 || K <= 0) return cudaSuccess;
  pairs_count_kernel<<<chunk_grid(num_chunks), kPairChunkRows, 0, stream>>>(
      out_in, num_out, K, num_in, num_chunks, counts, not_identity, bad_input);
  return cudaGetLastError();
}

cudaError_t pairs_fill(const int32_t* out_in, int64_t num_out, int64_t K, int64_t num_chunks,
                       const int64_t* starts, int32_t* in_idx, int32_t* out_idx, cudaStream_t stream) {
  if (num_chunks <= 0 || K <= 0) return cudaSuccess;
  pairs_fill_kernel<<<chunk_grid(num_chunks), kPairChunkRows, 0, stream>>>(out_in, num_out, K, num_chunks,
                                                                          starts, in_idx, out_idx);
  return cudaGetLastError();
}

cudaError_t transpose_map(const int32_t* out_in, int64_t num_out, int64_t K, int32_t* in_out,
                          int32_t* clash, cudaStream_t stream) {
  if (num_out <= 0 || K <= 0) return cudaSuccess;
  transpose_map_kernel<<<grid_for(num_out * K), kThreads, 0, stream>>>(out_in, num_out, K, in_out, clash);
  return cudaGetLastError();
}

cudaError_t plan_row_masks(const int32_t* table, int64_t num_rows, int64_t K, const int64_t* bounds,
                           int64_t splits, int64_t words, int64_t* masks, cudaStream_t stream) {
  const int64_t n = splits * num_rows * words;
  if (n <= 0) return cudaSuccess;
  plan_row_masks_kernel<<<grid_for(n), kThreads, 0, stream>>>(table, num_rows, K, bounds, splits, words, masks);
  return cudaGetLastError();
}

cudaError_t plan_tile_masks(const int64_t* masks, int64_t num_rows, int64_t splits, int64_t words,
                            const int32_t* order, int64_t order_stride, int64_t tile_rows,
                            int64_t tiles, int64_t* tile_masks, cudaStream_t stream) {
  const int64_t n = splits * num_rows;
  if (n <= 0 || words <= 0) return cudaSuccess;
  plan_tile_masks_kernel<<<grid_for(n), kThreads, 0, stream>>>(masks, num_rows, splits, words, order,
                                                               order_stride, tile_rows, tiles, tile_masks);
  return cudaGetLastError();
}

}  // namespace kmap_kernels
}  // namespace torchsparse_pp
