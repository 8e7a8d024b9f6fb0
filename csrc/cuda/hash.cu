// GPU coordinate hash table: packing with range checks, lock-free insert, exact lookup.
#include "hash.h"

#include "kmap_launch.h"

namespace torchsparse_pp {
namespace kmap_kernels {

namespace {

using ull = unsigned long long;

__global__ void pack_coords_kernel(const int32_t* coords, int64_t n, int64_t* keys, int64_t* status) {
  TSPP_GRID_LOOP(i, n) {
    const int32_t* r = coords + 4 * i;
    const int64_t b = r[0], x = r[1], y = r[2], z = r[3];
    if (coord_in_range(b, x, y, z)) {
      keys[i] = pack_coord(b, x, y, z);
    } else {
      keys[i] = kEmptyKey;
      atomicMin(reinterpret_cast<ull*>(status + kBadRow), static_cast<ull>(i));
    }
  }
}

__global__ void hash_insert_kernel(const int64_t* keys, int64_t n, int64_t* slots, int64_t capacity,
                                   int64_t* status) {
  TSPP_GRID_LOOP(i, n) {
    const int64_t key = keys[i];
    if (key == kEmptyKey) continue;  // a range error, reported by the caller
    const int64_t mask = capacity - 1;
    const int64_t limit = probe_limit(capacity);
    int64_t slot = home_slot(key, capacity);
    bool placed = false;
    for (int64_t p = 0; p < limit; ++p) {
      // A slot's key changes once (empty -> key), so a non-empty read is final and saves a CAS.
      int64_t seen = *reinterpret_cast<volatile const int64_t*>(slots + 2 * slot);
      if (seen == kEmptyKey)
        seen = static_cast<int64_t>(atomicCAS(reinterpret_cast<ull*>(slots + 2 * slot),
                                              static_cast<ull>(kEmptyKey), static_cast<ull>(key)));
      if (seen == kEmptyKey) {
        slots[2 * slot + 1] = i;  // readers run in later kernels
        placed = true;
        break;
      }
      if (seen == key) {
        status[kDuplicate] = 1;
        placed = true;
        break;
      }
      slot = (slot + 1) & mask;
    }
    if (!placed) status[kFull] = 1;
  }
}

__global__ void hash_query_kernel(CoordHashView table, const int32_t* query, int64_t n, int32_t* out) {
  TSPP_GRID_LOOP(i, n) {
    const int32_t* r = query + 4 * i;
    const int64_t b = r[0], x = r[1], y = r[2], z = r[3];
    // Keys outside the packable range cannot be in the table.
    out[i] = coord_in_range(b, x, y, z) ? static_cast<int32_t>(table.find(pack_coord(b, x, y, z))) : -1;
  }
}

}  // namespace

cudaError_t pack_coords(const int32_t* coords, int64_t n, int64_t* keys, int64_t* status,
                        cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  pack_coords_kernel<<<grid_for(n), kThreads, 0, stream>>>(coords, n, keys, status);
  return cudaGetLastError();
}

cudaError_t hash_insert_rows(const int64_t* keys, int64_t n, int64_t* slots, int64_t capacity,
                             int64_t* status, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  hash_insert_kernel<<<grid_for(n), kThreads, 0, stream>>>(keys, n, slots, capacity, status);
  return cudaGetLastError();
}

cudaError_t hash_query_coords(CoordHashView table, const int32_t* query, int64_t n, int32_t* out,
                              cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  hash_query_kernel<<<grid_for(n), kThreads, 0, stream>>>(table, query, n, out);
  return cudaGetLastError();
}

}  // namespace kmap_kernels
}  // namespace torchsparse_pp
