// Kernel-map construction on the CPU: output coordinate sets and both views of the map.
//
// Every map relates inputs p and outputs q by p = q*s - pad + t*d per axis (t: kernel tap).
// Submanifold maps look up each output's neighbours in the input's hash table. Strided and
// generative maps instead enumerate what each input reaches, which costs one lookup per pair
// rather than one per (output, offset), and build the new coordinates' table on the way.
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <atomic>
#include <limits>
#include <vector>

#include "hash_cpu.h"
#include "kmap_common.h"
#include "radix_sort.h"

namespace torchsparse_pp {

namespace {

constexpr int64_t kNoRow = std::numeric_limits<int64_t>::max();

const int64_t* checked_range(const at::OptionalIntArrayRef& out_range, int64_t* buf) {
  if (!out_range.has_value()) return nullptr;
  TORCH_CHECK(out_range->size() == 3, "out_range must have 3 entries, got ", *out_range);
  for (int a = 0; a < 3; ++a) {
    TORCH_CHECK((*out_range)[a] >= 1, "out_range must be positive, got ", *out_range);
    buf[a] = (*out_range)[a];
  }
  return buf;
}

// How an input coordinate p relates to the coordinates it reaches on one axis.
enum class Relation {
  kReadBy,   // outputs q with q*s - pad + t*d = p (strided conv)
  kFloor,    // q = floor(p / s) (minkowski output set)
  kWrites,   // p*s - pad + t*d (conv_transpose3d)
};

struct AxisReach {
  int n;
  int64_t coord[kMaxKernelAxis];
  int64_t tap[kMaxKernelAxis];
};

void reach_axis(const KernelGeometry& g, Relation rel, int a, int64_t p, const int64_t* range,
                AxisReach& r) {
  r.n = 0;
  if (rel == Relation::kFloor) {
    r.coord[0] = floor_div(p, g.s[a]);
    r.tap[0] = 0;
    r.n = 1;
    return;
  }
  for (int64_t t = 0; t < g.k[a]; ++t) {
    int64_t q;
    if (rel == Relation::kReadBy) {
      const int64_t num = p + g.pad[a] - t * g.d[a];
      if (((num % g.s[a]) + g.s[a]) % g.s[a] != 0) continue;  // no integer q
      q = num / g.s[a];
    } else {
      q = g.input_of(a, p, t);
    }
    if (range != nullptr && (q < 0 || q >= range[a])) continue;
    r.coord[r.n] = q;
    r.tap[r.n] = t;
    ++r.n;
  }
}

// Calls fn(key, offset) for every coordinate that `row` reaches; key is kEmptyKey where the
// coordinate lies outside the packable range. Returns how many coordinates it visited.
template <typename Fn>
int64_t for_each_reach(const KernelGeometry& g, Relation rel, const int32_t* row,
                       const int64_t* range, Fn&& fn) {
  AxisReach ax[3];
  for (int a = 0; a < 3; ++a) reach_axis(g, rel, a, row[1 + a], range, ax[a]);
  for (int x = 0; x < ax[0].n; ++x)
    for (int y = 0; y < ax[1].n; ++y)
      for (int z = 0; z < ax[2].n; ++z) {
        const int64_t cx = ax[0].coord[x], cy = ax[1].coord[y], cz = ax[2].coord[z];
        const int64_t key =
            coord_in_range(row[0], cx, cy, cz) ? pack_coord(row[0], cx, cy, cz) : kEmptyKey;
        fn(key, g.offset_index(ax[0].tap[x], ax[1].tap[y], ax[2].tap[z]));
      }
  return int64_t(ax[0].n) * ax[1].n * ax[2].n;
}

// Sorted unique keys of every coordinate the rows reach: the new coordinate set.
std::vector<uint64_t> reached_keys(const at::Tensor& coords, const KernelGeometry& g, Relation rel,
                                   const int64_t* range) {
  const int64_t n = coords.size(0);
  const int32_t* c = coords.data_ptr<int32_t>();
  // Count, then fill at per-row offsets: the candidate list is in row order on any thread count.
  std::vector<int64_t> start(n + 1, 0);
  at::parallel_for(0, n, 4096, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i)
      start[i + 1] = for_each_reach(g, rel, c + 4 * i, range, [](int64_t, int64_t) {});
  });
  for (int64_t i = 0; i < n; ++i) start[i + 1] += start[i];
  std::vector<uint64_t> keys(start[n]);
  std::atomic<int64_t> bad_row{kNoRow};
  at::parallel_for(0, n, 4096, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      int64_t pos = start[i];
      for_each_reach(g, rel, c + 4 * i, range, [&](int64_t key, int64_t) {
        if (key == kEmptyKey) atomic_min(bad_row, i);
        keys[pos++] = static_cast<uint64_t>(key);
      });
    }
  });
  TORCH_CHECK(bad_row.load() == kNoRow, "input row ", bad_row.load(),
              " produces an output coordinate outside the supported range: batch in [0, ",
              kBatchMax, "], x/y/z in [", kSpatialMin, ", ", kSpatialMax, "]");
  // Packed keys are non-negative, so their unsigned order is the coordinate order.
  radix_sort(keys);
  keys.erase(std::unique(keys.begin(), keys.end()), keys.end());
  return keys;
}

// The coordinates of sorted keys, and the table mapping each key to its row.
std::tuple<at::Tensor, at::Tensor> coords_and_table(const std::vector<uint64_t>& keys,
                                                    const at::TensorOptions& options) {
  const int64_t m = static_cast<int64_t>(keys.size());
  auto coords = at::empty({m, 4}, options.dtype(at::kInt));
  auto packed = at::empty({m}, options.dtype(at::kLong));
  int32_t* o = coords.data_ptr<int32_t>();
  int64_t* p = packed.data_ptr<int64_t>();
  at::parallel_for(0, m, 8192, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      p[i] = static_cast<int64_t>(keys[i]);
      unpack_coord(p[i], o + 4 * i);
    }
  });
  return {coords, hash_build_from_keys_cpu(packed, coords)};
}

}  // namespace

std::tuple<at::Tensor, at::Tensor, at::Tensor> kmap_downsample_cpu(
    const at::Tensor& coords_in, at::IntArrayRef kernel_size, at::IntArrayRef stride,
    at::IntArrayRef dilation, at::IntArrayRef padding, c10::string_view mode,
    at::OptionalIntArrayRef out_range, int64_t pad_rows_to) {
  const auto coords = checked_coords(coords_in, "coords");
  const auto g = make_geometry(kernel_size, stride, dilation, padding);
  TORCH_CHECK(mode == "spconv" || mode == "minkowski", "unknown downsample mode '",
              std::string(mode), "'; expected 'spconv' or 'minkowski'");
  const bool minkowski = mode == "minkowski";
  TORCH_CHECK(!(minkowski && out_range.has_value()),
              "out_range does not apply to the minkowski output set (floor(p/s) needs no clip)");
  int64_t range_buf[3];
  const int64_t* range = checked_range(out_range, range_buf);

  const auto keys = reached_keys(coords, g, minkowski ? Relation::kFloor : Relation::kReadBy, range);
  auto [out_coords, out_table] = coords_and_table(keys, coords.options());
  const int64_t K = g.volume();
  auto out_in = at::full({padded_rows(out_coords.size(0), pad_rows_to), K}, -1, coords.options());
  const CoordHashView table{out_table.data_ptr<int64_t>(), out_table.size(0)};
  const int32_t* c = coords.data_ptr<int32_t>();
  int32_t* m = out_in.data_ptr<int32_t>();
  // An (output, offset) cell determines its input coordinate, so a cell claimed twice means a
  // duplicate input coordinate; the claim is a CAS so that this is caught, never raced.
  std::atomic<int64_t> dup_row{kNoRow};
  at::parallel_for(0, coords.size(0), 2048, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i)
      for_each_reach(g, Relation::kReadBy, c + 4 * i, range, [&](int64_t key, int64_t k) {
        const int64_t row = key == kEmptyKey ? -1 : table.find(key);  // minkowski: may be absent
        if (row < 0) return;
        int32_t expected = -1;
        if (!__atomic_compare_exchange_n(&m[row * K + k], &expected, static_cast<int32_t>(i), false,
                                         __ATOMIC_RELAXED, __ATOMIC_RELAXED))
          atomic_min(dup_row, std::max<int64_t>(i, expected));
      });
  });
  TORCH_CHECK(dup_row.load() == kNoRow, "duplicate coordinate at row ", dup_row.load(),
              ": the coordinates of a SparseTensor must be unique "
              "(torchsparse_pp.utils.sparse_quantize removes duplicates)");
  return {out_coords, out_in, out_table};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> kmap_generative_cpu(
    const at::Tensor& coords_in, at::IntArrayRef kernel_size, at::IntArrayRef stride,
    at::IntArrayRef dilation, at::IntArrayRef padding, at::OptionalIntArrayRef out_range,
    int64_t pad_rows_to) {
  const auto coords = checked_coords(coords_in, "coords");
  const auto g = make_geometry(kernel_size, stride, dilation, padding);
  int64_t range_buf[3];
  const int64_t* range = checked_range(out_range, range_buf);

  // Hashing the coarse set only rejects duplicate coordinates, which the fine set cannot reveal.
  hash_build_from_keys_cpu(pack_coords_cpu(coords, "coords"), coords);
  const auto keys = reached_keys(coords, g, Relation::kWrites, range);
  auto [fine_coords, fine_table] = coords_and_table(keys, coords.options());
  const int64_t K = g.volume();
  const int64_t n = coords.size(0);
  auto out_in = at::full({padded_rows(n, pad_rows_to), K}, -1, coords.options());
  const CoordHashView table{fine_table.data_ptr<int64_t>(), fine_table.size(0)};
  const int32_t* c = coords.data_ptr<int32_t>();
  int32_t* m = out_in.data_ptr<int32_t>();
  // Rows are the coarse inputs of the transposed conv; entries index the fine set it writes.
  at::parallel_for(0, n, 2048, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i)
      for_each_reach(g, Relation::kWrites, c + 4 * i, range, [&](int64_t key, int64_t k) {
        m[i * K + k] = static_cast<int32_t>(table.find(key));
      });
  });
  return {fine_coords, out_in, fine_table};
}

namespace {

// Axis inputs q*s - pad + t*d for every tap t of one output coordinate.
void axis_inputs(const KernelGeometry& g, const int32_t* q, int64_t (*p)[kMaxKernelAxis]) {
  for (int a = 0; a < 3; ++a)
    for (int64_t t = 0; t < g.k[a]; ++t) p[a][t] = g.input_of(a, q[1 + a], t);
}

}  // namespace

at::Tensor kmap_out_in_cpu(const at::Tensor& table_in, const at::Tensor& out_coords_in,
                           at::IntArrayRef kernel_size, at::IntArrayRef stride,
                           at::IntArrayRef dilation, at::IntArrayRef padding, int64_t pad_rows_to,
                           bool submanifold) {
  const auto table = table_view(table_in);
  const auto out_coords = checked_coords(out_coords_in, "out_coords");
  const auto g = make_geometry(kernel_size, stride, dilation, padding);
  TORCH_CHECK(!submanifold || is_centred_submanifold(g),
              "kmap_out_in: submanifold=True needs stride 1 and odd kernels with centred padding");
  const int64_t n_out = out_coords.size(0);
  const int64_t K = g.volume();
  auto out_in = at::full({padded_rows(n_out, pad_rows_to), K}, -1, out_coords.options());
  const int32_t* c = out_coords.data_ptr<int32_t>();
  int32_t* m = out_in.data_ptr<int32_t>();
  // A centred submanifold map is symmetric: q reads p through offset k exactly when p reads q
  // through offset K-1-k. So only offsets before the centre are looked up; the rest are mirrored,
  // and each mirrored cell has exactly one writer.
  const int64_t searched = submanifold ? K / 2 : K;
  std::atomic<bool> foreign_rows{false};
  at::parallel_for(0, n_out, 1024, [&](int64_t begin, int64_t end) {
    int64_t p[3][kMaxKernelAxis];
    for (int64_t row = begin; row < end; ++row) {
      const int32_t* q = c + 4 * row;
      axis_inputs(g, q, p);
      int32_t* dst = m + row * K;
      for (int64_t i = 0; i < g.k[0]; ++i)
        for (int64_t j = 0; j < g.k[1]; ++j)
          for (int64_t l = 0; l < g.k[2]; ++l) {
            const int64_t k = g.offset_index(i, j, l);
            if (k >= searched) continue;
            const int64_t b = q[0], x = p[0][i], y = p[1][j], z = p[2][l];
            // Neighbours outside the packable range cannot exist in the table.
            const int32_t found = coord_in_range(b, x, y, z)
                                      ? static_cast<int32_t>(table.find(pack_coord(b, x, y, z)))
                                      : -1;
            dst[k] = found;
            if (submanifold && found >= 0) {
              if (found >= n_out) {
                foreign_rows = true;
                continue;
              }
              m[found * K + (K - 1 - k)] = static_cast<int32_t>(row);
            }
          }
      if (submanifold) {
        // The centre reads the output itself; checking it proves out_coords is the table's set.
        const int64_t self = coord_in_range(q[0], q[1], q[2], q[3])
                                 ? table.find(pack_coord(q[0], q[1], q[2], q[3]))
                                 : -1;
        if (self != row) foreign_rows = true;
        dst[K / 2] = static_cast<int32_t>(row);
      }
    }
  });
  TORCH_CHECK(!foreign_rows.load(),
              "kmap_out_in: submanifold=True needs out_coords to be the coordinates the table holds, "
              "in the same order");
  return out_in;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> kmap_pairs_cpu(
    const at::Tensor& out_in_in, int64_t num_in, int64_t num_out) {
  TORCH_CHECK(out_in_in.scalar_type() == at::kInt && out_in_in.dim() == 2,
              "out_in must be an int32 [rows, K] map, got ", out_in_in.scalar_type(), " ",
              out_in_in.sizes());
  TORCH_CHECK(num_in >= 0 && num_out >= 0, "num_in and num_out must be >= 0, got ", num_in, " and ",
              num_out);
  TORCH_CHECK(num_out <= out_in_in.size(0), "num_out (", num_out, ") exceeds the rows of out_in (",
              out_in_in.size(0), ")");
  const auto out_in = out_in_in.contiguous();
  const int64_t K = out_in.size(1);
  const int32_t* m = out_in.data_ptr<int32_t>();

  // Fixed row chunks make the pair order (offset, then output row) independent of threads.
  const int64_t chunk = std::max<int64_t>(1024, (num_out + 255) / 256);
  const int64_t num_chunks = (num_out + chunk - 1) / chunk;
  std::vector<int64_t> counts(num_chunks * K, 0);
  std::atomic<bool> in_range{true};
  at::parallel_for(0, num_chunks, 1, [&](int64_t cb, int64_t ce) {
    for (int64_t ch = cb; ch < ce; ++ch) {
      int64_t* cnt = counts.data() + ch * K;
      const int64_t r1 = std::min(num_out, (ch + 1) * chunk);
      for (int64_t r = ch * chunk; r < r1; ++r)
        for (int64_t k = 0; k < K; ++k) {
          const int32_t v = m[r * K + k];
          cnt[k] += v >= 0;
          if (v >= num_in) in_range = false;
        }
    }
  });
  TORCH_CHECK(in_range.load(), "out_in holds input rows >= num_in (", num_in, ")");
  auto offsets = at::empty({K + 1}, out_in.options().dtype(at::kLong));
  int64_t* off = offsets.data_ptr<int64_t>();
  std::vector<int64_t> pos(num_chunks * K);
  int64_t total = 0;
  for (int64_t k = 0; k < K; ++k) {
    off[k] = total;
    for (int64_t ch = 0; ch < num_chunks; ++ch) {
      pos[ch * K + k] = total;
      total += counts[ch * K + k];
    }
  }
  off[K] = total;
  auto in_idx = at::empty({total}, out_in.options());
  auto out_idx = at::empty({total}, out_in.options());
  int32_t* ii = in_idx.data_ptr<int32_t>();
  int32_t* oi = out_idx.data_ptr<int32_t>();
  at::parallel_for(0, num_chunks, 1, [&](int64_t cb, int64_t ce) {
    for (int64_t ch = cb; ch < ce; ++ch) {
      int64_t* p = pos.data() + ch * K;
      const int64_t r1 = std::min(num_out, (ch + 1) * chunk);
      for (int64_t r = ch * chunk; r < r1; ++r)
        for (int64_t k = 0; k < K; ++k) {
          const int32_t src = m[r * K + k];
          if (src < 0) continue;
          ii[p[k]] = src;
          oi[p[k]] = static_cast<int32_t>(r);
          ++p[k];
        }
    }
  });

  // An offset whose pairs are (j, j) for every row needs no gather or scatter.
  auto identity = at::zeros({K}, out_in.options().dtype(at::kBool));
  bool* id = identity.data_ptr<bool>();
  for (int64_t k = 0; k < K; ++k) {
    if (num_in != num_out || off[k + 1] - off[k] != num_out || num_out == 0) continue;
    bool same = true;
    for (int64_t j = 0; j < num_out && same; ++j) same = ii[off[k] + j] == j;
    id[k] = same;
  }
  return {in_idx, out_idx, offsets, identity};
}

TORCH_LIBRARY_IMPL(torchsparse_pp, CPU, m) {
  m.impl("kmap_downsample", &kmap_downsample_cpu);
  m.impl("kmap_generative", &kmap_generative_cpu);
  m.impl("kmap_out_in", &kmap_out_in_cpu);
  m.impl("kmap_pairs", &kmap_pairs_cpu);
}

}  // namespace torchsparse_pp
