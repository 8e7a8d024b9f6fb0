// CPU hash-table building blocks shared by hash_cpu.cpp and kmap_cpu.cpp.
#pragma once

#include <ATen/ATen.h>

#include <atomic>

#include "../common/hash_table.h"

namespace torchsparse_pp {

enum class InsertResult { kInserted, kExists, kFull };

// Lock-free insert: the CAS on the key slot makes concurrent inserts of equal keys agree.
inline InsertResult hash_insert(int64_t* keys, int32_t* vals, int64_t capacity, int64_t key,
                                int32_t val, int32_t* existing = nullptr) {
  const int64_t mask = capacity - 1;
  int64_t slot = static_cast<int64_t>(hash_key(key) & static_cast<uint64_t>(mask));
  const int64_t limit = capacity < kMaxProbes ? capacity : kMaxProbes;
  for (int64_t i = 0; i < limit; ++i) {
    int64_t expected = kEmptyKey;
    if (__atomic_compare_exchange_n(&keys[slot], &expected, key, false, __ATOMIC_ACQ_REL,
                                    __ATOMIC_ACQUIRE)) {
      vals[slot] = val;
      return InsertResult::kInserted;
    }
    if (expected == key) {
      if (existing != nullptr) *existing = vals[slot];
      return InsertResult::kExists;
    }
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

// Validates dtype and shape of a coordinate tensor and returns it contiguous.
at::Tensor checked_coords(const at::Tensor& coords, const char* name);

// Packs rows of a checked [N, 4] int32 tensor, raising a clear error for the first row that
// lies outside the packable range.
at::Tensor pack_coords_cpu(const at::Tensor& coords, const char* name);

// Builds the table for packed keys; duplicate keys raise an error naming both rows.
std::tuple<at::Tensor, at::Tensor> hash_build_from_keys_cpu(const at::Tensor& packed,
                                                            const at::Tensor& coords);

// Reports a failed insert; kept out of line so loops stay small.
[[noreturn]] void throw_probe_limit(int64_t capacity);

}  // namespace torchsparse_pp
