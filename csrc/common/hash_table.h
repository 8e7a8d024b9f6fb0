// Open-addressing hash table of packed coordinates (linear probing).
// The table is two flat arrays owned by tensors; this view only reads and probes them,
// so the CPU build and a later CUDA build share the lookup logic.
#pragma once

#include "coords.h"

namespace torchsparse_pp {

// Inserts give up after this many probes; lookups therefore never need to look further.
constexpr int64_t kMaxProbes = 4096;

struct CoordHashView {
  const int64_t* keys;  // [capacity], kEmptyKey where free
  const int32_t* vals;  // [capacity]
  int64_t capacity;     // power of two

  TSPP_HOST_DEVICE int64_t probe_limit() const {
    return capacity < kMaxProbes ? capacity : kMaxProbes;
  }

  // Index stored for `key`, or -1. Exact: keys are compared in full, never by hash.
  TSPP_HOST_DEVICE int32_t find(int64_t key) const {
    const int64_t mask = capacity - 1;
    int64_t slot = static_cast<int64_t>(hash_key(key) & static_cast<uint64_t>(mask));
    const int64_t limit = probe_limit();
    for (int64_t i = 0; i < limit; ++i) {
      const int64_t k = keys[slot];
      if (k == key) return vals[slot];
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
