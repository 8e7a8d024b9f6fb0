// Kernel maps by hash lookup on the GPU, one thread per (output row, offset) cell.
#include "kmap.h"

#include "kmap_launch.h"

namespace torchsparse_pp {
namespace kmap_kernels {

namespace {

__global__ void kmap_lookup_kernel(CoordHashView table, const int32_t* coords, int64_t n_out,
                                   KernelGeometry g, int64_t searched, bool mirror, int32_t* out_in,
                                   int32_t* foreign) {
  const int64_t K = g.volume();
  // Consecutive threads take the offsets of one row: its coordinate is read once per warp and
  // its out_in row is written contiguously.
  TSPP_GRID_LOOP(e, n_out * searched) {
    const int64_t row = e / searched, k = e % searched;
    const int64_t i = k / (g.k[1] * g.k[2]), j = (k / g.k[2]) % g.k[1], l = k % g.k[2];
    const int32_t* q = coords + 4 * row;
    const int64_t b = q[0], x = g.input_of(0, q[1], i), y = g.input_of(1, q[2], j),
                  z = g.input_of(2, q[3], l);
    // Neighbours outside the packable range cannot exist in the table.
    const int64_t found = coord_in_range(b, x, y, z) ? table.find(pack_coord(b, x, y, z)) : -1;
    out_in[row * K + k] = static_cast<int32_t>(found);
    if (!mirror || found < 0) continue;
    if (found >= n_out) {
      *foreign = 1;
      continue;
    }
    // q reads p through k exactly when p reads q through K-1-k; each such cell has one writer.
    out_in[found * K + (K - 1 - k)] = static_cast<int32_t>(row);
  }
}

__global__ void kmap_centre_kernel(CoordHashView table, const int32_t* coords, int64_t n, int64_t K,
                                   bool check, int32_t* out_in, int32_t* foreign) {
  TSPP_GRID_LOOP(row, n) {
    if (check) {
      const int32_t* q = coords + 4 * row;
      const int64_t self = coord_in_range(q[0], q[1], q[2], q[3])
                               ? table.find(pack_coord(q[0], q[1], q[2], q[3]))
                               : -1;
      if (self != row) *foreign = 1;
    }
    out_in[row * K + K / 2] = static_cast<int32_t>(row);
  }
}

}  // namespace

cudaError_t kmap_lookup(CoordHashView table, const int32_t* out_coords, int64_t n_out,
                        KernelGeometry g, int64_t searched, bool mirror, int32_t* out_in,
                        int32_t* foreign, cudaStream_t stream) {
  if (n_out <= 0 || searched <= 0) return cudaSuccess;
  kmap_lookup_kernel<<<grid_for(n_out * searched), kThreads, 0, stream>>>(
      table, out_coords, n_out, g, searched, mirror, out_in, foreign);
  return cudaGetLastError();
}

cudaError_t kmap_centre(CoordHashView table, const int32_t* coords, int64_t n, int64_t K, bool check,
                        int32_t* out_in, int32_t* foreign, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  kmap_centre_kernel<<<grid_for(n), kThreads, 0, stream>>>(table, coords, n, K, check, out_in, foreign);
  return cudaGetLastError();
}

}  // namespace kmap_kernels
}  // namespace torchsparse_pp
