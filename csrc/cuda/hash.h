// GPU coordinate hash table: the same [capacity, 2] int64 (key, row) slots as the CPU build, so
// CoordHashView (common/hash_table.h) reads either. Host launchers over raw device pointers.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "../common/hash_table.h"

namespace torchsparse_pp {
namespace kmap_kernels {

// status[kBadRow]: smallest row outside the packable range (initialise to INT64_MAX);
// status[kDuplicate], status[kFull]: set to 1 when a key was already present / an insert ran
// past the probe bound (initialise to 0).
enum HashStatus { kBadRow = 0, kDuplicate = 1, kFull = 2, kHashStatusSize = 3 };

// Packs int32 [n, 4] coordinates into keys; rows outside the range get kEmptyKey and lower
// status[kBadRow].
cudaError_t pack_coords(const int32_t* coords, int64_t n, int64_t* keys, int64_t* status,
                        cudaStream_t stream);

// Inserts key[i] -> i into an empty table of `capacity` (a power of two) slots by atomicCAS
// with linear probing bounded by probe_limit(capacity). kEmptyKey keys are skipped.
cudaError_t hash_insert_rows(const int64_t* keys, int64_t n, int64_t* slots, int64_t capacity,
                             int64_t* status, cudaStream_t stream);

// out[i] = row of query coordinate i in the table, or -1.
cudaError_t hash_query_coords(CoordHashView table, const int32_t* query, int64_t n, int32_t* out,
                              cudaStream_t stream);

}  // namespace kmap_kernels
}  // namespace torchsparse_pp
