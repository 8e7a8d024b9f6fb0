// Open-addressing hash table of packed coordinates (linear probing).
// A table is one [capacity, 2] int64 tensor of (key, value) slots, interleaved so that a hit
// costs one cache line. This view only reads and probes it, so the CPU build and a later CUDA
// build share the lookup logic.
#pragma once

#include "coords.h"

namespace torchsparse_pp {

// Inserts give up after this many probes; lookups therefore never need to look further.
constexpr int64_t kMaxProbes = 4096;

TSPP_HOST_DEVICE int64_t probe_limit(int64_t capacity) {
  return capacity < kMaxProbes ? capacity : kMaxProbes;
}

TSPP_HOST_DEVICE int64_t home_slot(int64_t key, int64_t capacity) {
  return static_cast<int64_t>(hash_key(key) & static_cast<uint64_t>(capacity - 1));
}

struct CoordHashView {
  const int64_t* slots;  // [capacity][2]: key (kEmptyKey where free), value
  int64_t capacity;      // power of two

  // Value stored for `key`, or -1. Exact: keys are compared in full, never by hash.
  TSPP_HOST_DEVICE int64_t find(int64_t key) const {
    const int64_t mask = capacity - 1;
    int64_t slot = home_slot(key, capacity);
    const int64_t limit = probe_limit(capacity);
    for (int64_t i = 0; i < limit; ++i) {
      const int64_t k = slots[2 * slot];
      if (k == key) return slots[2 * slot + 1];
      if (k == kEmptyKey) return -1;
      slot = (slot + 1) & mask;
    }
    return -1;
  }
};

// Smallest power of two that keeps the load factor at or below one half.
inline int64_t hash_capacity_for(int64_t n) {
  int64_t cap = 16;
  while (cap < 2 * n) cap <<= 1;
  return cap;
}

}  // namespace torchsparse_pp
