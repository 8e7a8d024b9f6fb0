// Stable LSD radix sort of 64-bit keys in 16-bit digits, optionally carrying a payload.
// Digits that are equal for every key are skipped, which makes packed coordinates and kernel
// masks (which use few bits) cheap to sort.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

namespace torchsparse_pp {

struct NoPayload {};

template <typename Payload = NoPayload>
void radix_sort(std::vector<uint64_t>& keys, std::vector<Payload>* payload = nullptr) {
  constexpr int kBits = 16;
  constexpr uint64_t kMask = (uint64_t(1) << kBits) - 1;
  const int64_t n = static_cast<int64_t>(keys.size());
  std::vector<uint64_t> key_buffer(n);
  std::vector<Payload> payload_buffer(payload != nullptr ? n : 0);
  std::vector<int64_t> count(kMask + 1);
  for (int shift = 0; shift < 64; shift += kBits) {
    std::fill(count.begin(), count.end(), 0);
    for (uint64_t k : keys) ++count[(k >> shift) & kMask];
    if (std::find(count.begin(), count.end(), n) != count.end()) continue;  // digit is constant
    int64_t sum = 0;
    for (auto& c : count) {
      const int64_t here = c;
      c = sum;
      sum += here;
    }
    for (int64_t i = 0; i < n; ++i) {
      const int64_t at = count[(keys[i] >> shift) & kMask]++;
      key_buffer[at] = keys[i];
      if (payload != nullptr) payload_buffer[at] = (*payload)[i];
    }
    keys.swap(key_buffer);
    if (payload != nullptr) payload->swap(payload_buffer);
  }
}

}  // namespace torchsparse_pp
