// CPU hash-table building blocks shared by hash_cpu.cpp and kmap_cpu.cpp.
#pragma once

#include <ATen/ATen.h>

#include <atomic>

#include "../common/hash_table.h"

namespace torchsparse_pp {

enum class InsertResult { kInserted, kExists, kFull };

// Lock-free insert: the CAS on the key makes concurrent inserts of equal keys agree. The value
// is written by the winner only; readers run after the parallel region that inserts.
inline InsertResult hash_insert(int64_t* slots, int64_t capacity, int64_t key, int64_t value) {
  const int64_t mask = capacity - 1;
  int64_t slot = home_slot(key, capacity);
  const int64_t limit = probe_limit(capacity);
  for (int64_t i = 0; i < limit; ++i) {
    int64_t expected = kEmptyKey;
    if (__atomic_compare_exchange_n(&slots[2 * slot], &expected, key, false, __ATOMIC_ACQ_REL,
                                    __ATOMIC_ACQUIRE)) {
      slots[2 * slot + 1] = value;
      return InsertResult::kInserted;
    }
    if (expected == key) return InsertResult::kExists;
    slot = (slot + 1) & mask;
  }
  return InsertResult::kFull;
}

// Keeps the smallest row index seen by any thread, so error messages are deterministic.
inline void atomic_min(std::atomic<int64_t>& target, int64_t value) {
  int64_t cur = target.load();
  while (value < cur && !target.compare_exchange_weak(cur, value)) {
  }
}

// An empty [capacity, 2] table able to hold n keys at load factor <= 1/2.
at::Tensor empty_table(int64_t n, const at::TensorOptions& options);

// Validates a table tensor from hash_build (or a kmap op) and returns a view of it.
CoordHashView table_view(const at::Tensor& table);

// Validates dtype and shape of a coordinate tensor and returns it contiguous.
at::Tensor checked_coords(const at::Tensor& coords, const char* name);

// Packs rows of a checked [N, 4] int32 tensor, raising a clear error for the first row that
// lies outside the packable range.
at::Tensor pack_coords_cpu(const at::Tensor& coords, const char* name);

// Builds the table mapping key[i] -> i; duplicate keys raise an error naming the row
// (`coords` is only read to print it).
at::Tensor hash_build_from_keys_cpu(const at::Tensor& packed, const at::Tensor& coords);

// Raises the error for an insert that ran past the probe bound.
[[noreturn]] void throw_probe_limit(int64_t capacity);

}  // namespace torchsparse_pp
