// Lookups in the generated dispatch tables (csrc/cuda/*/generated/dispatch.cpp): rows of
// (dtype, math, tile shape, launchers), a tile named by its index among the rows of its
// (dtype, math). Host code, ATen-free.
#pragma once

#include <cstddef>

#include "types.h"

namespace torchsparse_pp {
namespace gemm {

template <class Entry, std::size_t N>
const Entry* find_entry(const Entry (&entries)[N], DType dtype, Math math, int tile) {
  int seen = 0;
  for (const Entry& e : entries)
    if (e.dtype == dtype && e.math == math && seen++ == tile) return &e;
  return nullptr;
}

// The tile shapes of (dtype, math) in table order: count returned, at most `capacity` written.
template <class Entry, std::size_t N>
int tile_shapes_of(const Entry (&entries)[N], DType dtype, Math math, TileShape* shapes, int capacity) {
  int count = 0;
  for (const Entry& e : entries)
    if (e.dtype == dtype && e.math == math) {
      if (count < capacity) shapes[count] = e.shape;
      ++count;
    }
  return count;
}

}  // namespace gemm
}  // namespace torchsparse_pp
