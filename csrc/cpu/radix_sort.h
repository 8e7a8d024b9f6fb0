// Stable LSD radix sort of 64-bit keys, optionally carrying a payload. Digits that are equal for
// every key are skipped, which makes packed coordinates and kernel masks (which use few bits)
// cheap to sort. Digits are 16 bits wide for large inputs and 8 bits for small ones, whose sort
// would otherwise be dominated by clearing and scanning 65536 counters per pass.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

namespace torchsparse_pp {

struct NoPayload {};

template <typename Payload = NoPayload>
void radix_sort(std::vector<uint64_t>& keys, std::vector<Payload>* payload = nullptr) {
  const int64_t n = static_cast<int64_t>(keys.size());
  const int bits = n < (int64_t(1) << 16) ? 8 : 16;
  const uint64_t mask = (uint64_t(1) << bits) - 1;
  std::vector<uint64_t> key_buffer(n);
  std::vector<Payload> payload_buffer(payload != nullptr ? n : 0);
  std::vector<int64_t> count(mask + 1);
  for (int shift = 0; shift < 64; shift += bits) {
    std::fill(count.begin(), count.end(), 0);
    for (uint64_t k : keys) ++count[(k >> shift) & mask];
    if (std::find(count.begin(), count.end(), n) != count.end()) continue;  // digit is constant
    int64_t sum = 0;
    for (auto& c : count) {
      const int64_t here = c;
      c = sum;
      sum += here;
    }
    for (int64_t i = 0; i < n; ++i) {
      const int64_t at = count[(keys[i] >> shift) & mask]++;
      key_buffer[at] = keys[i];
      if (payload != nullptr) payload_buffer[at] = (*payload)[i];
    }
    keys.swap(key_buffer);
    if (payload != nullptr) payload->swap(payload_buffer);
  }
}

}  // namespace torchsparse_pp
