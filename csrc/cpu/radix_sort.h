// Stable LSD radix sort of 64-bit keys, optionally carrying a payload. Digits that are equal for
// every key are skipped, which makes packed coordinates and kernel masks (which use few bits)
// cheap to sort. Digits are 16 bits wide for large inputs and 8 bits for small ones, whose sort
// would otherwise be dominated by clearing and scanning 65536 counters per pass.
//
// Each pass is split into contiguous blocks, one per thread: per-block digit counts, then each
// block scatters its keys in order to its own slice of every bucket. A stable sort has one
// result, so the output does not depend on the number of blocks (or threads).
#pragma once

#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>
#include <vector>

namespace torchsparse_pp {

struct NoPayload {};

template <typename Payload = NoPayload>
void radix_sort(std::vector<uint64_t>& keys, std::vector<Payload>* payload = nullptr) {
  const int64_t n = static_cast<int64_t>(keys.size());
  if (n < 2) return;
  const int bits = n < (int64_t(1) << 16) ? 8 : 16;
  const int64_t buckets = int64_t(1) << bits;
  const uint64_t mask = static_cast<uint64_t>(buckets - 1);
  // Blocks of at least 16384 keys (below that a pass costs less than waking a thread); one when
  // called from inside a parallel region (the caller already splits the work).
  const int64_t blocks = at::in_parallel_region()
                             ? 1
                             : std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(), n / 16384));
  const int64_t block = (n + blocks - 1) / blocks;

  // The bits that differ between any two keys: only digits holding some of them are sorted.
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

  std::vector<uint64_t> key_buffer(n);
  std::vector<Payload> payload_buffer(payload != nullptr ? n : 0);
  std::vector<int64_t> count(blocks * buckets);
  for (int shift = 0; shift < 64; shift += bits) {
    if (((varying >> shift) & mask) == 0) continue;  // digit is constant
    at::parallel_for(0, blocks, 1, [&](int64_t b0, int64_t b1) {
      for (int64_t b = b0; b < b1; ++b) {
        int64_t* c = count.data() + b * buckets;
        std::fill(c, c + buckets, 0);
        for (int64_t i = b * block, end = std::min(n, (b + 1) * block); i < end; ++i) ++c[(keys[i] >> shift) & mask];
      }
    });
    // Bucket by bucket, block by block: where each block's keys of each digit start.
    int64_t sum = 0;
    for (int64_t d = 0; d < buckets; ++d)
      for (int64_t b = 0; b < blocks; ++b) {
        int64_t& c = count[b * buckets + d];
        const int64_t here = c;
        c = sum;
        sum += here;
      }
    at::parallel_for(0, blocks, 1, [&](int64_t b0, int64_t b1) {
      for (int64_t b = b0; b < b1; ++b) {
        int64_t* c = count.data() + b * buckets;
        for (int64_t i = b * block, end = std::min(n, (b + 1) * block); i < end; ++i) {
          const int64_t at = c[(keys[i] >> shift) & mask]++;
          key_buffer[at] = keys[i];
          if (payload != nullptr) payload_buffer[at] = (*payload)[i];
        }
      }
    });
    keys.swap(key_buffer);
    if (payload != nullptr) payload->swap(payload_buffer);
  }
}

}  // namespace torchsparse_pp
