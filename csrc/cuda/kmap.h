// Kernel maps by hash lookup on the GPU: out_in[q, k] = row of q*s - pad + delta_k*d in a table.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "../common/hash_table.h"
#include "../common/kernel_geometry.h"

namespace torchsparse_pp {
namespace kmap_kernels {

// Fills out_in[row, k] (row-major, K = g.volume() columns) for rows [0, n_out) and offsets
// k < searched with the table row of that neighbour, or -1. With `mirror` (a centred
// submanifold map, searched = K / 2) it also writes out_in[found, K-1-k] = row, and sets
// *foreign when a found row lies outside [0, n_out) (it is skipped).
cudaError_t kmap_lookup(CoordHashView table, const int32_t* out_coords, int64_t n_out,
                        KernelGeometry g, int64_t searched, bool mirror, int32_t* out_in,
                        int32_t* foreign, cudaStream_t stream);

// The centre offset K / 2 of a submanifold map: out_in[row, K/2] = row. With `check`, sets
// *foreign for a row whose own coordinate the table does not hold at that row.
cudaError_t kmap_centre(CoordHashView table, const int32_t* coords, int64_t n, int64_t K, bool check,
                        int32_t* out_in, int32_t* foreign, cudaStream_t stream);

}  // namespace kmap_kernels
}  // namespace torchsparse_pp
