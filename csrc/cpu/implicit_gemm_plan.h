// The plan of the CPU implicit-GEMM dataflow: kmap_plan's tensors, checked, and the pieces that
// both of its forward paths (tile GEMMs, register kernels) read it with.
//
// A plan splits the K offsets into ranges; per split, an optional sorted order of the rows
// (padded with -1 to whole tiles) and, per tile of tile_rows positions, the OR of its rows'
// neighbour bitmasks. A mask that misses a neighbour one of its rows has would drop that term,
// so every path checks that the masks cover the table.
#pragma once

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <cstdint>

namespace torchsparse_pp {

struct KmapPlan {
  int64_t splits, tiles, words, tile_rows, padded;
  const int64_t* bounds;     // [splits + 1] offset ranges
  const int32_t* order;      // [splits, padded] sorted rows (-1 pads), or null when unsorted
  const uint64_t* masks;     // [splits, tiles, words] OR of the tile's row bitmasks
  int64_t num_rows;

  // Output row at position pos of split s's row order, or -1.
  int64_t row(int64_t s, int64_t pos) const {
    if (order != nullptr) return order[s * padded + pos];
    return pos < num_rows ? pos : -1;
  }

  // The row of `map` ([rows, K]) that position pos of split s reads through offset k, or -1.
  int64_t source(int64_t s, int64_t pos, const int32_t* map, int64_t K, int64_t k) const {
    const int64_t r = row(s, pos);
    return r < 0 ? int64_t(-1) : int64_t(map[r * K + k]);
  }

  const uint64_t* mask(int64_t s, int64_t t) const { return masks + (s * tiles + t) * words; }

  // Whether offset k (of split s) is set in tile t's mask.
  bool tile_has(int64_t s, int64_t t, int64_t k) const {
    const int64_t j = k - bounds[s];
    return (mask(s, t)[j / 64] >> (j % 64)) & 1;
  }

  // Calls fn(k0, k1) for every run [k0, k1) of consecutive offsets set in the tile's mask,
  // leaving out the offsets flagged in `skip` (null: none).
  template <typename Fn>
  void for_each_run(int64_t s, int64_t t, const char* skip, Fn&& fn) const {
    const int64_t b0 = bounds[s], b1 = bounds[s + 1];
    int64_t start = -1;
    for (int64_t k = b0; k <= b1; ++k) {
      const bool set = k < b1 && tile_has(s, t, k) && (skip == nullptr || !skip[k]);
      if (set && start < 0) start = k;
      if (!set && start >= 0) {
        fn(start, k);
        start = -1;
      }
    }
  }
};

// The plan's tensors, checked against K and the table's row count (the order must permute the rows).
KmapPlan make_kmap_plan(const at::Tensor& bounds, const at::Tensor& order, const at::Tensor& tile_masks, int64_t K,
                        int64_t num_rows, int64_t tile_rows);

// bits[m] = the present-neighbour bits (entry >= 0) of rows[m][k0, k0 + n), n <= 64, for
// m < count; a null row gives 0. The variant for this CPU (AVX-512 compares where present).
using PresentBits = void (*)(const int32_t* const* rows, int64_t count, int64_t k0, int64_t n, uint64_t* bits);
PresentBits present_bits_function();

// The error for tile masks that miss a neighbour, and the check that scans the whole table.
extern const char* const kPlanMissesOffsets;
void check_plan_covers_table(const KmapPlan& plan, const at::Tensor& table);

// A split plan's partial buffers [splits, rows, c] added in split order (the same on any thread
// count).
template <typename M>
inline at::Tensor sum_splits(const at::Tensor& parts) {
  const int64_t splits = parts.size(0), n = parts.size(1) * parts.size(2);
  at::Tensor sum = at::empty({parts.size(1), parts.size(2)}, parts.options());
  const M* o = parts.data_ptr<M>();
  M* r = sum.data_ptr<M>();
  at::parallel_for(0, n, 1 << 14, [&](int64_t begin, int64_t end) {
    for (int64_t j = begin; j < end; ++j) {
      M acc = o[j];
      for (int64_t s = 1; s < splits; ++s) acc += o[s * n + j];
      r[j] = acc;
    }
  });
  return sum;
}

}  // namespace torchsparse_pp
