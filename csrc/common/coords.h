// Packing of (batch, x, y, z) coordinates into one 64-bit key.
// Header-only and free of ATen so that CUDA kernels can include it too.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define TSPP_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define TSPP_HOST_DEVICE inline
#endif

namespace torchsparse_pp {

// 15 bits of batch and 16 signed bits per spatial axis: 63 bits, so every key is
// non-negative and -1 can mark an empty hash slot.
constexpr int64_t kBatchMax = (int64_t(1) << 15) - 1;
constexpr int64_t kSpatialMin = -(int64_t(1) << 15);
constexpr int64_t kSpatialMax = (int64_t(1) << 15) - 1;
constexpr int64_t kEmptyKey = -1;

TSPP_HOST_DEVICE bool batch_in_range(int64_t b) { return b >= 0 && b <= kBatchMax; }

TSPP_HOST_DEVICE bool spatial_in_range(int64_t v) { return v >= kSpatialMin && v <= kSpatialMax; }

TSPP_HOST_DEVICE bool coord_in_range(int64_t b, int64_t x, int64_t y, int64_t z) {
  return batch_in_range(b) && spatial_in_range(x) && spatial_in_range(y) && spatial_in_range(z);
}

// Monotone in (b, x, y, z) lexicographic order, so sorting keys sorts coordinates.
TSPP_HOST_DEVICE int64_t pack_coord(int64_t b, int64_t x, int64_t y, int64_t z) {
  return (b << 48) | ((x - kSpatialMin) << 32) | ((y - kSpatialMin) << 16) | (z - kSpatialMin);
}

TSPP_HOST_DEVICE void unpack_coord(int64_t key, int32_t* out) {
  out[0] = static_cast<int32_t>(key >> 48);
  out[1] = static_cast<int32_t>(((key >> 32) & 0xFFFF) + kSpatialMin);
  out[2] = static_cast<int32_t>(((key >> 16) & 0xFFFF) + kSpatialMin);
  out[3] = static_cast<int32_t>((key & 0xFFFF) + kSpatialMin);
}

// splitmix64 finaliser: packed keys of neighbours differ in few low bits, so they need mixing.
TSPP_HOST_DEVICE uint64_t hash_key(int64_t key) {
  uint64_t h = static_cast<uint64_t>(key);
  h ^= h >> 30;
  h *= 0xbf58476d1ce4e5b9ULL;
  h ^= h >> 27;
  h *= 0x94d049bb133111ebULL;
  h ^= h >> 31;
  return h;
}

// Floor division that rounds toward -inf for negative coordinates.
TSPP_HOST_DEVICE int64_t floor_div(int64_t a, int64_t b) {
  int64_t q = a / b;
  return (a % b != 0 && ((a < 0) != (b < 0))) ? q - 1 : q;
}

}  // namespace torchsparse_pp
