// Digits of a radix sort taken from the bits that vary between the keys only.
//
// The varying bits are numbered from the lowest up, skipping constant ones, and cut into digits
// of `bits` of them each; a digit gathers its bits from up to kMaxParts contiguous runs of the
// key. Sorting by these digits, lowest first, sorts by the varying bits, which is sorting the keys.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

namespace torchsparse_pp {

struct RadixDigit {
  static constexpr int kMaxParts = 4;
  int bits = 0;   // width of the digit
  int parts = 0;  // runs of key bits it is made of
  int shift[kMaxParts] = {};
  uint64_t mask[kMaxParts] = {};
  int to[kMaxParts] = {};

  // The digit of `key` (Parts == parts, a constant so that the loop unrolls).
  template <int Parts>
  uint64_t of(uint64_t key) const {
    uint64_t d = 0;
    for (int j = 0; j < Parts; ++j) d |= ((key >> shift[j]) & mask[j]) << to[j];
    return d;
  }
};

// Widest digit worth a pass over n keys: the 2^bits counters are cleared and scanned once per
// pass, which stays small next to moving the keys with about 4 or more keys per counter; 16 bits
// at most, 8 at least.
inline int radix_max_bits(int64_t n) {
  if (n >= (int64_t(1) << 16)) return 16;
  const int log2_n = 63 - __builtin_clzll(static_cast<uint64_t>(std::max<int64_t>(n, 1)));
  return std::clamp(log2_n - 2, 8, 12);
}

// Digit width: the fewest passes radix_max_bits allows, with the varying bits spread evenly over
// them (a smaller last digit would not save a pass, only make the others wider).
inline int radix_digit_bits(int64_t n, uint64_t varying) {
  const int total = __builtin_popcountll(varying), max_bits = radix_max_bits(n);
  if (total == 0) return max_bits;
  const int passes = (total + max_bits - 1) / max_bits;
  return (total + passes - 1) / passes;
}

// The digits covering every set bit of `varying`, lowest first; none when no bit varies.
inline std::vector<RadixDigit> radix_digits(uint64_t varying, int bits) {
  std::vector<RadixDigit> digits;
  RadixDigit digit;
  uint64_t rest = varying;
  while (rest != 0) {
    int lo = __builtin_ctzll(rest);
    const uint64_t above = ~(rest >> lo);  // zero only if the run reaches bit 63
    int len = above == 0 ? 64 - lo : __builtin_ctzll(above);
    rest = len + lo >= 64 ? 0 : rest & (~uint64_t(0) << (lo + len));
    while (len > 0) {
      const int take = std::min(len, bits - digit.bits);
      digit.shift[digit.parts] = lo;
      digit.mask[digit.parts] = (uint64_t(1) << take) - 1;
      digit.to[digit.parts] = digit.bits;
      ++digit.parts;
      digit.bits += take;
      lo += take;
      len -= take;
      if (digit.bits == bits || digit.parts == RadixDigit::kMaxParts) {
        digits.push_back(digit);
        digit = RadixDigit();
      }
    }
  }
  if (digit.bits > 0) digits.push_back(digit);
  return digits;
}

}  // namespace torchsparse_pp
