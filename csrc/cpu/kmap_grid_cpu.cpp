// Downsampling on an occupancy bitmap (see kmap_grid_cpu.h).
//
// One bit per cell of the outputs' bounding box, in (batch, x, y, z) row-major order, which is
// the canonical coordinate order: setting the bit of every reached output and counting the set
// bits before a cell gives each output its row, with no sort. At MinkUNet's coarse levels the
// box has tens of cells per input, a few bytes of bitmap per input against the 32 bytes per
// input a radix sort moves on each pass.
#include "kmap_grid_cpu.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "../common/coords.h"
#include "checks_cpu.h"
#include "cpu_features.h"
#include "kmap_common.h"

namespace torchsparse_pp {

namespace {

// Rows per parallel chunk: each pass costs a few nanoseconds per row, less than waking a thread
// below this.
constexpr int64_t kGridGrain = 32768;
// Cell of an input that reaches no output (cells are numbered below it).
constexpr uint32_t kNoCell = std::numeric_limits<uint32_t>::max();

// Per-column bounds of an int32 [n, 4] coordinate tensor.
struct ColumnBounds {
  int32_t lo[4], hi[4];
};

TSPP_ROW_CLONES void bound_rows(const int32_t* c, int64_t begin, int64_t end, ColumnBounds& out) {
  ColumnBounds b = out;
  for (int64_t i = begin; i < end; ++i)
    for (int j = 0; j < 4; ++j) {
      b.lo[j] = std::min(b.lo[j], c[4 * i + j]);
      b.hi[j] = std::max(b.hi[j], c[4 * i + j]);
    }
  out = b;
}

// Bounds that any row narrows.
ColumnBounds empty_bounds() {
  ColumnBounds b;
  std::fill(b.lo, b.lo + 4, std::numeric_limits<int32_t>::max());
  std::fill(b.hi, b.hi + 4, std::numeric_limits<int32_t>::min());
  return b;
}

ColumnBounds column_bounds(const int32_t* c, int64_t n) {
  ColumnBounds all = empty_bounds();
  std::mutex merge;
  at::parallel_for(0, n, kGridGrain, [&](int64_t begin, int64_t end) {
    ColumnBounds part = empty_bounds();  // not a copy of `all`, which other chunks may be merging into
    bound_rows(c, begin, end, part);
    std::lock_guard<std::mutex> lock(merge);
    for (int j = 0; j < 4; ++j) {
      all.lo[j] = std::min(all.lo[j], part.lo[j]);
      all.hi[j] = std::max(all.hi[j], part.hi[j]);
    }
  });
  return all;
}

// The outputs' bounding box. 32-bit fields, so that the per-row pass vectorises: inputs are
// packable (|p| < 2^15, pad <= 2^20) and the box has fewer than 2^32 cells.
struct OutputGrid {
  int32_t batch0;
  int32_t lo[3];    // smallest output coordinate per axis
  uint32_t dim[4];  // batches, then cells per axis
  int32_t pad[3], shift[3], mask[3];
  uint32_t ky, kz;

  int32_t output_coord(int a, int32_t p) const { return (p + pad[a]) >> shift[a]; }
};

// The grid for these inputs, or nothing if an input or output is not packable or the box has
// more than `max_cells` cells.
std::optional<OutputGrid> output_grid(const ColumnBounds& in, const ShiftAxis (&axes)[3], int64_t ky, int64_t kz,
                                      int64_t max_cells) {
  if (!batch_in_range(in.lo[0]) || !batch_in_range(in.hi[0])) return std::nullopt;
  OutputGrid g{};
  g.batch0 = in.lo[0];
  g.dim[0] = static_cast<uint32_t>(in.hi[0] - in.lo[0] + 1);
  g.ky = static_cast<uint32_t>(ky);
  g.kz = static_cast<uint32_t>(kz);
  int64_t cells = g.dim[0];
  for (int a = 0; a < 3; ++a) {
    const ShiftAxis& x = axes[a];
    if (!spatial_in_range(in.lo[a + 1]) || !spatial_in_range(in.hi[a + 1])) return std::nullopt;
    g.pad[a] = static_cast<int32_t>(x.pad);
    g.shift[a] = static_cast<int32_t>(x.shift);
    g.mask[a] = static_cast<int32_t>(x.mask);
    int64_t lo = g.output_coord(a, in.lo[a + 1]), hi = g.output_coord(a, in.hi[a + 1]);
    if (x.range >= 0) {
      lo = std::max<int64_t>(lo, 0);
      hi = std::min<int64_t>(hi, x.range - 1);
    }
    // Nothing reached, or outputs that would need the sort path's range error.
    if (lo > hi || !spatial_in_range(lo) || !spatial_in_range(hi)) return std::nullopt;
    g.lo[a] = static_cast<int32_t>(lo);
    g.dim[a + 1] = static_cast<uint32_t>(hi - lo + 1);
    cells *= g.dim[a + 1];  // each factor <= 2^17 and cells <= max_cells before: no overflow
    if (cells > max_cells) return std::nullopt;
  }
  return g;
}

// Cell of the output each row reaches (kNoCell if none) and the tap it reaches it through.
// Branch-free 32-bit arithmetic over independent rows: vectorised in each clone.
TSPP_ROW_CLONES void cells_of_rows(const OutputGrid g, const int32_t* __restrict c, int64_t begin, int64_t end,
                                   uint32_t* __restrict cell, uint8_t* __restrict tap) {
  for (int64_t i = begin; i < end; ++i) {
    const int32_t* row = c + 4 * i;
    const int32_t px = row[1] + g.pad[0], py = row[2] + g.pad[1], pz = row[3] + g.pad[2];
    const uint32_t ux = static_cast<uint32_t>((px >> g.shift[0]) - g.lo[0]);
    const uint32_t uy = static_cast<uint32_t>((py >> g.shift[1]) - g.lo[1]);
    const uint32_t uz = static_cast<uint32_t>((pz >> g.shift[2]) - g.lo[2]);
    const bool reached = (ux < g.dim[1]) & (uy < g.dim[2]) & (uz < g.dim[3]);
    const uint32_t at = ((static_cast<uint32_t>(row[0] - g.batch0) * g.dim[1] + ux) * g.dim[2] + uy) * g.dim[3] + uz;
    cell[i] = reached ? at : kNoCell;
    tap[i] = static_cast<uint8_t>(((static_cast<uint32_t>(px & g.mask[0]) * g.ky + static_cast<uint32_t>(py & g.mask[1])) *
                                       g.kz +
                                   static_cast<uint32_t>(pz & g.mask[2])));
  }
}

// Sets the bits of rows [begin, end)'s cells; returns how many rows reach no cell. Bits of one
// word are gathered in a register while consecutive rows hit it (sorted inputs mostly do): an or
// into memory per row would chain each row to the previous one's store.
int64_t mark_cells(const uint32_t* cell, int64_t begin, int64_t end, uint64_t* occupied, bool atomic) {
  int64_t word = -1;
  uint64_t bits = 0;
  const auto flush = [&] {
    if (word < 0) return;
    if (atomic)
      __atomic_fetch_or(&occupied[word], bits, __ATOMIC_RELAXED);
    else
      occupied[word] |= bits;
  };
  int64_t unreached = 0;
  for (int64_t i = begin; i < end; ++i) {
    if (cell[i] == kNoCell) {
      ++unreached;
      continue;
    }
    const int64_t w = cell[i] >> 6;
    if (w != word) {
      flush();
      word = w;
      bits = 0;
    }
    bits |= uint64_t(1) << (cell[i] & 63);
  }
  flush();
  return unreached;
}

// rank[w]: the set bits before word w, the row of its first output; returns all set bits.
TSPP_POPCNT_CLONES int64_t rank_words(const uint64_t* occupied, int64_t words, uint32_t* rank) {
  int64_t outputs = 0;
  for (int64_t w = 0; w < words; ++w) {
    rank[w] = static_cast<uint32_t>(outputs);  // outputs <= inputs < 2^31
    outputs += __builtin_popcountll(occupied[w]);
  }
  return outputs;
}

// Rows [begin, end) claim their map cells; returns whether a cell was claimed twice.
TSPP_POPCNT_CLONES bool claim_cells(const uint32_t* cell, const uint8_t* tap, int64_t begin, int64_t end,
                                    const uint64_t* occupied, const uint32_t* rank, int32_t* out_in, int64_t K) {
  bool seen_twice = false;
  for (int64_t i = begin; i < end; ++i) {
    const uint32_t at = cell[i];
    if (at == kNoCell) continue;
    const uint64_t below = occupied[at >> 6] & ((uint64_t(1) << (at & 63)) - 1);
    const int64_t q = rank[at >> 6] + __builtin_popcountll(below);
    int32_t& slot = out_in[q * K + tap[i]];
    seen_twice |= slot >= 0;
    slot = static_cast<int32_t>(i);
  }
  return seen_twice;
}

// n / d for 32-bit n by a multiply (d >= 2): floor(2^64 / d) + 1 is exact for every 32-bit n.
struct Divider {
  uint64_t d, magic;
  explicit Divider(uint64_t divisor) : d(divisor), magic(divisor > 1 ? ~uint64_t(0) / divisor + 1 : 0) {}
  uint64_t div(uint64_t n) const {
    return d == 1 ? n : static_cast<uint64_t>((static_cast<unsigned __int128>(magic) * n) >> 64);
  }
};

// The coordinates of the outputs of words [begin, end), decoded from their cells.
void decode_outputs(const OutputGrid g, const uint64_t* occupied, const uint32_t* rank, int64_t begin, int64_t end,
                    int32_t* out_coords) {
  const Divider by_z(g.dim[3]), by_y(g.dim[2]), by_x(g.dim[1]);
  for (int64_t w = begin; w < end; ++w) {
    int32_t* out = out_coords + 4 * rank[w];
    for (uint64_t bits = occupied[w]; bits != 0; bits &= bits - 1, out += 4) {
      const uint64_t at = static_cast<uint64_t>(w) * 64 + __builtin_ctzll(bits);
      const uint64_t xyz_row = by_z.div(at), xy_row = by_y.div(xyz_row), b = by_x.div(xy_row);
      out[0] = static_cast<int32_t>(b) + g.batch0;
      out[1] = static_cast<int32_t>(xy_row - b * g.dim[1]) + g.lo[0];
      out[2] = static_cast<int32_t>(xyz_row - xy_row * g.dim[2]) + g.lo[1];
      out[3] = static_cast<int32_t>(at - xyz_row * g.dim[3]) + g.lo[2];
    }
  }
}

}  // namespace

std::optional<std::tuple<at::Tensor, at::Tensor>> downsample_on_grid(const at::Tensor& coords, const ShiftAxis (&axes)[3],
                                                                     int64_t ky, int64_t kz, int64_t K,
                                                                     int64_t pad_rows_to) {
  const int64_t n = coords.size(0);
  if (n == 0 || K > 256) return std::nullopt;  // taps are stored as bytes
  const int32_t* c = coords.data_ptr<int32_t>();
  const int64_t max_cells = std::min<int64_t>(kGridCellsPerInput * n, kNoCell - 1);
  const auto grid = output_grid(column_bounds(c, n), axes, ky, kz, max_cells);
  if (!grid) return std::nullopt;
  const int64_t cells = int64_t(grid->dim[0]) * grid->dim[1] * grid->dim[2] * grid->dim[3];
  const int64_t words = (cells + 63) / 64;
  const bool parallel = n >= 2 * kGridGrain && at::get_num_threads() > 1;
  // In parallel, two rows claiming one map cell could race unseen: duplicates are ruled out first
  // (serially, claiming a cell twice reveals them).
  if (parallel) check_coords_unique(coords);
  const int64_t grain = parallel ? kGridGrain : n;  // n: one chunk, on this thread
  check_memory(words * (sizeof(uint64_t) + sizeof(uint32_t)) + n * (sizeof(uint32_t) + sizeof(uint8_t)),
               "the kernel map's occupancy bitmap (" + std::to_string(cells) + " cells)");

  auto cell = std::make_unique_for_overwrite<uint32_t[]>(n);
  auto tap = std::make_unique_for_overwrite<uint8_t[]>(n);
  std::vector<uint64_t> occupied(words, 0);
  std::atomic<int64_t> unreached{0};
  at::parallel_for(0, n, grain, [&](int64_t begin, int64_t end) {
    cells_of_rows(*grid, c, begin, end, cell.get(), tap.get());
    unreached += mark_cells(cell.get(), begin, end, occupied.data(), parallel);
  });
  // Map cells catch duplicates among the rows that reach an output; clipped rows must be unique too.
  if (!parallel && unreached.load() > 0) check_coords_unique(coords);
  auto rank = std::make_unique_for_overwrite<uint32_t[]>(words);
  const int64_t outputs = rank_words(occupied.data(), words, rank.get());
  check_rows(outputs, "the new coordinate set");

  auto out_coords = at::empty({outputs, 4}, coords.options());
  const int64_t rows = padded_rows(outputs, pad_rows_to);
  auto out_in = at::empty({rows, K}, coords.options());
  int32_t* m = out_in.data_ptr<int32_t>();
  std::fill(m, m + rows * K, -1);
  std::atomic<bool> duplicate{false};
  at::parallel_for(0, n, grain, [&](int64_t begin, int64_t end) {
    if (claim_cells(cell.get(), tap.get(), begin, end, occupied.data(), rank.get(), m, K)) duplicate = true;
  });
  if (duplicate.load()) {
    check_coords_unique(coords);  // raises, naming the two rows
    TORCH_CHECK(false, "duplicate input coordinates: the coordinates of a SparseTensor must be unique");
  }
  at::parallel_for(0, words, parallel ? kGridGrain / 8 : words, [&](int64_t begin, int64_t end) {
    decode_outputs(*grid, occupied.data(), rank.get(), begin, end, out_coords.data_ptr<int32_t>());
  });
  return std::make_tuple(out_coords, out_in);
}

}  // namespace torchsparse_pp
