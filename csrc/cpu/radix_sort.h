// Stable LSD radix sort of 64-bit keys, optionally carrying a payload. Only the bits that differ
// between keys are sorted, gathered into as few digits as the key count allows (radix_digits.h):
// packed coordinates vary in ~20-30 bits spread over three fields, which byte-aligned digits
// would cover with 4-6 passes and these with 2-3.
//
// Each pass is split into contiguous blocks, one per thread: per-block digit counts, then each
// block scatters its keys in order to its own slice of every bucket. A stable sort has one
// result, so the output does not depend on the number of blocks (or threads).
#pragma once

#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "radix_digits.h"

namespace torchsparse_pp {

struct NoPayload {};

namespace radix_detail {

// One counting pass over digit `d` (with `Parts` parts) from (keys, payload) into (keys_out,
// payload_out).
template <int Parts, typename Payload>
void sort_pass(const RadixDigit& d, int64_t n, int64_t blocks, int64_t block, int64_t buckets,
               int64_t* count, const uint64_t* keys, uint64_t* keys_out, const Payload* payload,
               Payload* payload_out) {
  at::parallel_for(0, blocks, 1, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      int64_t* c = count + b * buckets;
      std::fill(c, c + buckets, 0);
      for (int64_t i = b * block, end = std::min(n, (b + 1) * block); i < end; ++i) ++c[d.of<Parts>(keys[i])];
    }
  });
  // Bucket by bucket, block by block: where each block's keys of each digit start.
  int64_t sum = 0;
  for (int64_t v = 0; v < buckets; ++v)
    for (int64_t b = 0; b < blocks; ++b) {
      int64_t& c = count[b * buckets + v];
      const int64_t here = c;
      c = sum;
      sum += here;
    }
  at::parallel_for(0, blocks, 1, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      int64_t* c = count + b * buckets;
      for (int64_t i = b * block, end = std::min(n, (b + 1) * block); i < end; ++i) {
        const int64_t at = c[d.of<Parts>(keys[i])]++;
        keys_out[at] = keys[i];
        if (payload != nullptr) payload_out[at] = payload[i];
      }
    }
  });
}

}  // namespace radix_detail

template <typename Payload = NoPayload>
void radix_sort(std::vector<uint64_t>& keys, std::vector<Payload>* payload = nullptr) {
  const int64_t n = static_cast<int64_t>(keys.size());
  if (n < 2) return;
  // Blocks of at least 16384 keys (below that a pass costs less than waking a thread); one when
  // called from inside a parallel region (the caller already splits the work).
  const int64_t blocks = at::in_parallel_region()
                             ? 1
                             : std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(), n / 16384));
  const int64_t block = (n + blocks - 1) / blocks;

  // The bits that differ between any two keys: only they are sorted.
  std::vector<uint64_t> differing(blocks, 0);
  at::parallel_for(0, blocks, 1, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      uint64_t bits_seen = 0;
      const uint64_t first = keys[0];
      for (int64_t i = b * block, end = std::min(n, (b + 1) * block); i < end; ++i) bits_seen |= keys[i] ^ first;
      differing[b] = bits_seen;
    }
  });
  uint64_t varying = 0;
  for (uint64_t v : differing) varying |= v;
  const std::vector<RadixDigit> digits = radix_digits(varying, radix_digit_bits(n, varying));
  if (digits.empty()) return;

  int width = 0;
  for (const RadixDigit& d : digits) width = std::max(width, d.bits);
  const int64_t buckets = int64_t(1) << width;
  // Scratch copies are fully written by each pass: no zero-filling.
  auto key_buffer = std::make_unique_for_overwrite<uint64_t[]>(n);
  std::unique_ptr<Payload[]> payload_buffer;
  if (payload != nullptr) payload_buffer = std::make_unique_for_overwrite<Payload[]>(n);
  std::vector<int64_t> count(blocks * buckets);

  uint64_t* src_keys = keys.data();
  uint64_t* dst_keys = key_buffer.get();
  Payload* src_payload = payload != nullptr ? payload->data() : nullptr;
  Payload* dst_payload = payload_buffer.get();
  for (const RadixDigit& d : digits) {
    switch (d.parts) {
#define TSPP_RADIX_PASS(P)                                                                                 \
  case P:                                                                                                  \
    radix_detail::sort_pass<P>(d, n, blocks, block, buckets, count.data(), src_keys, dst_keys, src_payload, \
                               dst_payload);                                                               \
    break;
      TSPP_RADIX_PASS(1)
      TSPP_RADIX_PASS(2)
      TSPP_RADIX_PASS(3)
      TSPP_RADIX_PASS(4)
#undef TSPP_RADIX_PASS
    }
    std::swap(src_keys, dst_keys);
    std::swap(src_payload, dst_payload);
  }
  // After an odd number of passes the result sits in the scratch copies.
  if (src_keys != keys.data()) {
    std::memcpy(keys.data(), src_keys, n * sizeof(uint64_t));
    if (payload != nullptr) std::memcpy(payload->data(), src_payload, n * sizeof(Payload));
  }
}

}  // namespace torchsparse_pp
