// Derived views of a kernel map on the GPU: weight-stationary pairs, the transposed table and
// implicit-GEMM plan masks. ATen-free launchers over raw device pointers.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace torchsparse_pp {
namespace kmap_kernels {

// Rows per chunk of the pairs kernels (one thread per row of a chunk).
constexpr int kPairChunkRows = 256;

// Per chunk of kPairChunkRows rows and offset k: counts[k * num_chunks + chunk] = number of
// rows r < num_out with out_in[r, k] >= 0. Sets *bad_input when an entry is >= num_in and
// not_identity[k] when some row r has out_in[r, k] != r (both initialised to 0).
cudaError_t pairs_count(const int32_t* out_in, int64_t num_out, int64_t K, int64_t num_in,
                        int64_t num_chunks, int64_t* counts, int32_t* not_identity,
                        int32_t* bad_input, cudaStream_t stream);

// Writes the pairs of every (chunk, offset) from starts[k * num_chunks + chunk] on, in row
// order: in_idx = out_in[r, k], out_idx = r.
cudaError_t pairs_fill(const int32_t* out_in, int64_t num_out, int64_t K, int64_t num_chunks,
                       const int64_t* starts, int32_t* in_idx, int32_t* out_idx, cudaStream_t stream);

// in_out[p, k] = q for every out_in[q, k] = p >= 0 (q < num_out), by CAS from -1; *clash = 1
// when a cell is claimed twice.
cudaError_t transpose_map(const int32_t* out_in, int64_t num_out, int64_t K, int32_t* in_out,
                          int32_t* clash, cudaStream_t stream);

// masks[s, r, w] = bits (k - bounds[s]) for k in [bounds[s] + 64w, min(bounds[s+1], +64)) where
// table[r, k] >= 0; splits * num_rows * words words of 64 bits.
cudaError_t plan_row_masks(const int32_t* table, int64_t num_rows, int64_t K, const int64_t* bounds,
                           int64_t splits, int64_t words, int64_t* masks, cudaStream_t stream);

// tile_masks[s, i / tile_rows, w] |= masks[s, row_i, w], row_i = order[s * order_stride + i]
// (or i when order is null), for i < num_rows. tile_masks starts at zero.
cudaError_t plan_tile_masks(const int64_t* masks, int64_t num_rows, int64_t splits, int64_t words,
                            const int32_t* order, int64_t order_stride, int64_t tile_rows,
                            int64_t tiles, int64_t* tile_masks, cudaStream_t stream);

}  // namespace kmap_kernels
}  // namespace torchsparse_pp
