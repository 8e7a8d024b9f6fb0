// Submanifold kernel maps (Q = P) on the CPU by sort and merge, without hashing.
//
// Packing is monotone and a neighbour offset adds one constant to a packed key, so for a fixed
// offset the shifted keys of a sorted coordinate set are sorted too. The offsets of one (dx, dy)
// differ only in z, the lowest field, so their neighbours of a row are one short run of keys:
// each such column is one linear merge of the sorted keys against themselves, scanning the run
// at the cursor (sequential memory traffic instead of a random hash probe per (row, offset)).
// A carry between packed fields would alias another coordinate, so a match counts only if every
// shifted field stays in range.
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <atomic>
#include <limits>
#include <string>
#include <vector>

#include "checks_cpu.h"
#include "hash_cpu.h"
#include "kmap_common.h"

namespace torchsparse_pp {

namespace {


int64_t field(uint64_t key, int shift) {
  return static_cast<int64_t>((key >> shift) & 0xFFFF) + kSpatialMin;
}

}  // namespace

at::Tensor kmap_submanifold_cpu(const at::Tensor& coords_in, at::IntArrayRef kernel_size,
                                at::IntArrayRef dilation, at::IntArrayRef padding,
                                int64_t pad_rows_to) {
  const auto coords = checked_coords(coords_in, "coords");
  const int64_t unit[3] = {1, 1, 1};
  const auto g = make_geometry(kernel_size, unit, dilation, padding);
  const int64_t n = coords.size(0), K = g.volume();
  // The table, and the sorted keys and rows (twice while sorting).
  check_memory(padded_rows(n, pad_rows_to) * K * 4 + n * 24,
               "the submanifold kernel map (" + std::to_string(n) + " rows x " + std::to_string(K) +
                   " kernel offsets, int32)");
  const auto [keys, rows] = sort_coords_checked(coords);

  auto out_in = at::full({padded_rows(n, pad_rows_to), K}, -1, coords.options());
  int32_t* m = out_in.data_ptr<int32_t>();
  // A centred map is symmetric: q reads p through offset k exactly when p reads q through
  // K-1-k, so only offsets before the centre are merged and the rest are mirrored.
  const bool symmetric = is_centred_submanifold(g);
  const int64_t merged = symmetric ? K / 2 : K;
  // Offsets sharing (dx, dy) form a column: their shifted keys are one run in z, so one
  // cursor per column finds all of them, where a cursor per offset would walk the keys once
  // per offset (13 walks instead of 5 for a 3x3x3 kernel).
  struct Column {
    int64_t dx, dy, dz0, k0, delta0;  // offsets k0 + l read z = dz0 + l * dilation, l < k[2]
  };
  std::vector<Column> columns;
  for (int64_t i = 0; i < g.k[0]; ++i)
    for (int64_t j = 0; j < g.k[1]; ++j) {
      const int64_t k0 = g.offset_index(i, j, 0);
      if (k0 >= merged) continue;
      const int64_t dx = g.input_of(0, 0, i), dy = g.input_of(1, 0, j), dz0 = g.input_of(2, 0, 0);
      columns.push_back({dx, dy, dz0, k0, dx * (int64_t(1) << 32) + dy * (int64_t(1) << 16) + dz0});
    }
  const int64_t dz_step = g.d[2], span = (g.k[2] - 1) * dz_step;

  // About 32 chunks whatever n is, so that small sets (the coarse levels of a U-Net) still
  // split evenly over the threads (at most 4096 rows, at least 256, per chunk).
  const int64_t merge_chunk = std::clamp<int64_t>((n + 31) / 32, 256, 4096);
  at::parallel_for(0, (n + merge_chunk - 1) / merge_chunk, 1, [&](int64_t cb, int64_t ce) {
    for (int64_t chunk = cb; chunk < ce; ++chunk) {
      const int64_t i0 = chunk * merge_chunk, i1 = std::min(n, i0 + merge_chunk);
      for (const Column& col : columns) {
        // Row i's column holds the keys in [keys[i] + delta0, keys[i] + delta0 + span]. Keys
        // below 0 (batch 0 at the low edge of the range) hold nothing.
        const int64_t first = std::max<int64_t>(static_cast<int64_t>(keys[i0]) + col.delta0, 0);
        int64_t j = std::lower_bound(keys.begin(), keys.end(), static_cast<uint64_t>(first)) - keys.begin();
        for (int64_t i = i0; i < i1; ++i) {
          const uint64_t key = keys[i];
          const int64_t low = static_cast<int64_t>(key) + col.delta0, high = low + span;
          if (high < 0) continue;
          const auto lowest = static_cast<uint64_t>(std::max<int64_t>(low, 0));
          while (j < n && keys[j] < lowest) ++j;
          if (j == n || keys[j] > static_cast<uint64_t>(high)) continue;
          // x and y are the same for the whole column: a carry out of z is the only other case.
          if (!spatial_in_range(field(key, 32) + col.dx) || !spatial_in_range(field(key, 16) + col.dy)) continue;
          const int64_t z = field(key, 0);
          int32_t* row_i = m + static_cast<int64_t>(rows[i]) * K;
          for (int64_t t = j; t < n && keys[t] <= static_cast<uint64_t>(high); ++t) {
            const int64_t rel = static_cast<int64_t>(keys[t]) - low;
            if (dz_step != 1 && rel % dz_step != 0) continue;
            const int64_t l = dz_step == 1 ? rel : rel / dz_step, k = col.k0 + l;
            if (k >= merged) break;  // the rest of the column is mirrored (or the centre)
            if (!spatial_in_range(z + col.dz0 + l * dz_step)) continue;  // a carry between fields
            row_i[k] = rows[t];
            if (symmetric) m[static_cast<int64_t>(rows[t]) * K + (K - 1 - k)] = rows[i];
          }
        }
      }
    }
  });
  if (symmetric)
    at::parallel_for(0, n, 1 << 14, [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) m[r * K + K / 2] = static_cast<int32_t>(r);
    });
  return out_in;
}

TORCH_LIBRARY_IMPL(torchsparse_pp, CPU, m) {
  m.impl("kmap_submanifold", &kmap_submanifold_cpu);
}

}  // namespace torchsparse_pp
