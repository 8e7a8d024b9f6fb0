// Helpers shared by the CPU kernel-map builders.
#pragma once

#include <ATen/ATen.h>

#include <vector>

#include "../common/kernel_geometry.h"

namespace torchsparse_pp {

inline KernelGeometry make_geometry(at::IntArrayRef ks, at::IntArrayRef st, at::IntArrayRef dil,
                             at::IntArrayRef pad) {
  TORCH_CHECK(ks.size() == 3 && st.size() == 3 && dil.size() == 3 && pad.size() == 3,
              "kernel_size, stride, dilation and padding must have 3 entries (x, y, z)");
  KernelGeometry g{};
  for (int a = 0; a < 3; ++a) {
    TORCH_CHECK(ks[a] >= 1 && ks[a] <= kMaxKernelAxis, "kernel_size must be in [1, ",
                kMaxKernelAxis, "] per axis, got ", ks);
    TORCH_CHECK(st[a] >= 1, "stride must be >= 1 per axis, got ", st);
    TORCH_CHECK(dil[a] >= 1, "dilation must be >= 1 per axis, got ", dil);
    TORCH_CHECK(pad[a] >= 0, "padding must be >= 0 per axis, got ", pad);
    g.k[a] = ks[a];
    g.s[a] = st[a];
    g.d[a] = dil[a];
    g.pad[a] = pad[a];
  }
  return g;
}

inline int64_t padded_rows(int64_t n, int64_t pad_rows_to) {
  TORCH_CHECK(pad_rows_to >= 1, "pad_rows_to must be >= 1, got ", pad_rows_to);
  return (n + pad_rows_to - 1) / pad_rows_to * pad_rows_to;
}

// Stride 1, odd kernels, centred padding: the map of Q = P is symmetric in its offsets.
inline bool is_centred_submanifold(const KernelGeometry& g) {
  for (int a = 0; a < 3; ++a)
    if (g.s[a] != 1 || g.k[a] % 2 == 0 || 2 * g.pad[a] != g.d[a] * (g.k[a] - 1)) return false;
  return true;
}

// Packed keys of a coordinate set in ascending order, with the row each came from.
struct SortedCoords {
  std::vector<uint64_t> keys;
  std::vector<int32_t> rows;
};

// Checks the range, sorts, and raises for duplicate coordinates (naming both rows).
SortedCoords sort_coords_checked(const at::Tensor& coords);

}  // namespace torchsparse_pp
