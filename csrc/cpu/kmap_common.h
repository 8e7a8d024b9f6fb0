// Helpers shared by the kernel-map ops (the CPU builders and the CUDA wrappers): argument checks
// and the shapes they derive.
#pragma once

#include <ATen/ATen.h>

#include <algorithm>
#include <limits>
#include <string>
#include <tuple>
#include <vector>

#include "../common/kernel_geometry.h"

namespace torchsparse_pp {

// Rows (coordinates, features, map rows) are indexed with int32 in maps, pairs and plans.
constexpr int64_t kMaxRows = std::numeric_limits<int32_t>::max();

// Raises unless `n` rows can be indexed with int32; `what` names the tensor or argument.
inline void check_rows(int64_t n, const char* what) {
  TORCH_CHECK(n <= kMaxRows, what, " has ", n, " rows; at most 2^31 - 1 = ", kMaxRows,
              " are supported (rows are indexed with int32)");
}

// Rows of an int32 [N, 4] coordinate tensor, checked before it is made contiguous (a copy of
// an expanded view past the limit would allocate first and fail later).
inline void check_coord_rows(const at::Tensor& coords, const char* name) {
  if (coords.scalar_type() == at::kInt && coords.dim() == 2 && coords.size(1) == 4) check_rows(coords.size(0), name);
}

// Per-axis bound of stride, dilation and padding: far beyond the coordinate range (x/y/z span
// 2^16), and small enough that q*s - pad + t*d stays exact in int64 for any packable q.
constexpr int64_t kMaxGeometryValue = int64_t(1) << 20;

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
  }
  for (int a = 0; a < 3; ++a) {
    TORCH_CHECK(st[a] <= kMaxGeometryValue, "stride must be at most 2^20 = ", kMaxGeometryValue,
                " per axis (coordinates span 2^16), got ", st);
    TORCH_CHECK(dil[a] <= kMaxGeometryValue, "dilation must be at most 2^20 = ", kMaxGeometryValue,
                " per axis (coordinates span 2^16), got ", dil);
    TORCH_CHECK(pad[a] <= kMaxGeometryValue, "padding must be at most 2^20 = ", kMaxGeometryValue,
                " per axis (coordinates span 2^16), got ", pad);
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

// out_range of a strided / generative map: nullptr when absent, else `buf` filled with it.
inline const int64_t* checked_range(const at::OptionalIntArrayRef& out_range, int64_t* buf) {
  if (!out_range.has_value()) return nullptr;
  TORCH_CHECK(out_range->size() == 3, "out_range must have 3 entries, got ", *out_range);
  for (int a = 0; a < 3; ++a) {
    TORCH_CHECK((*out_range)[a] >= 1, "out_range must be positive, got ", *out_range);
    buf[a] = (*out_range)[a];
  }
  return buf;
}

// kmap_downsample's output set: true for 'minkowski', false for 'spconv'.
inline bool checked_minkowski_mode(c10::string_view mode, const at::OptionalIntArrayRef& out_range) {
  TORCH_CHECK(mode == "spconv" || mode == "minkowski", "unknown downsample mode '", std::string(mode),
              "'; expected 'spconv' or 'minkowski'");
  const bool minkowski = mode == "minkowski";
  TORCH_CHECK(!(minkowski && out_range.has_value()),
              "out_range does not apply to the minkowski output set (floor(p/s) needs no clip)");
  return minkowski;
}

// kmap_pairs' arguments (the map's values are checked by each device).
inline void check_pairs_arguments(const at::Tensor& out_in, int64_t num_in, int64_t num_out) {
  TORCH_CHECK(out_in.scalar_type() == at::kInt && out_in.dim() == 2, "out_in must be an int32 [rows, K] map, got ",
              out_in.scalar_type(), " ", out_in.sizes());
  TORCH_CHECK(num_in >= 0 && num_out >= 0, "num_in and num_out must be >= 0, got ", num_in, " and ", num_out);
  check_rows(num_in, "num_in");
  check_rows(num_out, "num_out");
  TORCH_CHECK(num_out <= out_in.size(0), "num_out (", num_out, ") exceeds the rows of out_in (", out_in.size(0),
              ")");
}

// kmap_pairs on the CPU (kmap_cpu.cpp): per offset, the map's (input, output) rows in output
// row order, with the offsets' bounds and which offsets are the identity.
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> kmap_pairs_cpu(const at::Tensor& out_in,
                                                                          int64_t num_in, int64_t num_out);

// Shape of a kmap_plan: offset splits (bounds), 64-bit mask words per row, tiles of rows.
struct PlanShape {
  bool sorted;
  int64_t splits;
  int64_t window;  // rows sorted together
  int64_t words;
  int64_t tiles;
  int64_t padded;  // tiles * tile_rows
  std::vector<int64_t> bounds;
};

inline PlanShape plan_shape(int64_t K, int64_t num_rows, int64_t split_mask_num, int64_t tile_rows,
                            int64_t sort_window) {
  TORCH_CHECK(split_mask_num >= 0 && split_mask_num <= K, "split_mask_num must be in [0, K = ", K, "], got ",
              split_mask_num);
  TORCH_CHECK(tile_rows >= 1, "tile_rows must be >= 1, got ", tile_rows);
  TORCH_CHECK(sort_window >= 0, "sort_window must be >= 0, got ", sort_window);
  PlanShape p{};
  p.sorted = split_mask_num > 0;
  p.splits = p.sorted ? split_mask_num : 1;
  // Sorting within windows of rows keeps the spatial order between windows (cache locality of
  // the gathers); 0 sorts all rows at once.
  p.window = sort_window > 0 ? sort_window : std::max<int64_t>(num_rows, 1);
  p.bounds.resize(p.splits + 1);
  int64_t longest = 0;
  for (int64_t s = 0; s <= p.splits; ++s) p.bounds[s] = s * K / p.splits;
  for (int64_t s = 0; s < p.splits; ++s) longest = std::max(longest, p.bounds[s + 1] - p.bounds[s]);
  p.words = (longest + 63) / 64;
  p.tiles = (num_rows + tile_rows - 1) / tile_rows;
  p.padded = p.tiles * tile_rows;
  return p;
}

// Packed keys of a coordinate set in ascending order, with the row each came from.
struct SortedCoords {
  std::vector<uint64_t> keys;
  std::vector<int32_t> rows;
};

// Checks the range, sorts, and raises for duplicate coordinates (naming both rows).
SortedCoords sort_coords_checked(const at::Tensor& coords);

// The checks of sort_coords_checked (range, duplicates) without keeping the sorted keys.
void check_coords_unique(const at::Tensor& coords);

}  // namespace torchsparse_pp
