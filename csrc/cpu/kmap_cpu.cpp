// Kernel-map construction on the CPU: output coordinate sets and both views of the map.
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <atomic>
#include <limits>
#include <parallel/algorithm>
#include <vector>

#include "../common/kernel_geometry.h"
#include "hash_cpu.h"

namespace torchsparse_pp {

namespace {

enum class OutputMode { kSpconv, kMinkowski, kGenerative };

OutputMode parse_mode(c10::string_view mode) {
  if (mode == "spconv") return OutputMode::kSpconv;
  if (mode == "minkowski") return OutputMode::kMinkowski;
  if (mode == "generative") return OutputMode::kGenerative;
  TORCH_CHECK(false, "unknown output-set mode '", std::string(mode),
              "'; expected 'spconv', 'minkowski' or 'generative'");
  __builtin_unreachable();
}

KernelGeometry make_geometry(at::IntArrayRef ks, at::IntArrayRef st, at::IntArrayRef dil,
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

// Output coordinates that input coordinate p reaches on one axis; returns how many.
int axis_outputs(const KernelGeometry& g, OutputMode mode, int a, int64_t p, const int64_t* range,
                 int64_t* out) {
  int n = 0;
  if (mode == OutputMode::kMinkowski) {
    out[n++] = floor_div(p, g.s[a]);
    return n;
  }
  for (int64_t t = 0; t < g.k[a]; ++t) {
    int64_t q;
    if (mode == OutputMode::kSpconv) {
      // p = q*s - pad + t*d has an integer solution only when s divides p + pad - t*d.
      const int64_t num = p + g.pad[a] - t * g.d[a];
      if (((num % g.s[a]) + g.s[a]) % g.s[a] != 0) continue;
      q = num / g.s[a];
    } else {
      q = g.input_of(a, p, t);  // conv_transpose writes p*s - pad + t*d
    }
    if (range != nullptr && (q < 0 || q >= range[a])) continue;
    out[n++] = q;
  }
  return n;
}

// Sorted unique keys of `candidates`, deduplicated through a hash set in parallel.
std::vector<int64_t> unique_sorted(const std::vector<int64_t>& candidates) {
  const int64_t n = static_cast<int64_t>(candidates.size());
  const int64_t cap = hash_capacity_for(n);
  std::vector<int64_t> keys(cap, kEmptyKey);
  std::vector<int32_t> vals(cap, 0);
  std::atomic<bool> full{false};
  at::parallel_for(0, n, 8192, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      if (hash_insert(keys.data(), vals.data(), cap, candidates[i], 0) == InsertResult::kFull)
        full = true;
    }
  });
  if (full) throw_probe_limit(cap);
  std::vector<int64_t> unique;
  unique.reserve(static_cast<size_t>(n));
  for (int64_t k : keys)
    if (k != kEmptyKey) unique.push_back(k);
  __gnu_parallel::sort(unique.begin(), unique.end());
  return unique;
}

}  // namespace

at::Tensor kmap_output_coords_cpu(const at::Tensor& coords_in, at::IntArrayRef kernel_size,
                                  at::IntArrayRef stride, at::IntArrayRef dilation,
                                  at::IntArrayRef padding, c10::string_view mode_name,
                                  at::OptionalIntArrayRef out_range) {
  const auto coords = checked_coords(coords_in, "coords");
  const auto g = make_geometry(kernel_size, stride, dilation, padding);
  const auto mode = parse_mode(mode_name);
  int64_t range_buf[3];
  const int64_t* range = nullptr;
  if (out_range.has_value()) {
    TORCH_CHECK(mode != OutputMode::kMinkowski,
                "out_range does not apply to the minkowski output set (floor(p/s) needs no clip)");
    TORCH_CHECK(out_range->size() == 3, "out_range must have 3 entries, got ", *out_range);
    for (int a = 0; a < 3; ++a) {
      TORCH_CHECK((*out_range)[a] >= 1, "out_range must be positive, got ", *out_range);
      range_buf[a] = (*out_range)[a];
    }
    range = range_buf;
  }
  const int64_t n = coords.size(0);
  const int32_t* c = coords.data_ptr<int32_t>();

  // Two passes (count, then fill) keep the candidate list in input order without locks.
  std::vector<int64_t> start(n + 1, 0);
  at::parallel_for(0, n, 4096, [&](int64_t begin, int64_t end) {
    int64_t q[kMaxKernelAxis];
    for (int64_t i = begin; i < end; ++i) {
      int64_t count = 1;
      for (int a = 0; a < 3; ++a) count *= axis_outputs(g, mode, a, c[4 * i + 1 + a], range, q);
      start[i + 1] = count;
    }
  });
  for (int64_t i = 0; i < n; ++i) start[i + 1] += start[i];

  std::vector<int64_t> candidates(start[n]);
  std::atomic<int64_t> bad{std::numeric_limits<int64_t>::max()};
  at::parallel_for(0, n, 4096, [&](int64_t begin, int64_t end) {
    int64_t qx[kMaxKernelAxis], qy[kMaxKernelAxis], qz[kMaxKernelAxis];
    for (int64_t i = begin; i < end; ++i) {
      const int32_t* r = c + 4 * i;
      const int nx = axis_outputs(g, mode, 0, r[1], range, qx);
      const int ny = axis_outputs(g, mode, 1, r[2], range, qy);
      const int nz = axis_outputs(g, mode, 2, r[3], range, qz);
      int64_t pos = start[i];
      for (int x = 0; x < nx; ++x)
        for (int y = 0; y < ny; ++y)
          for (int z = 0; z < nz; ++z) {
            if (!coord_in_range(r[0], qx[x], qy[y], qz[z])) {
              atomic_min(bad, i);
              candidates[pos++] = 0;
              continue;
            }
            candidates[pos++] = pack_coord(r[0], qx[x], qy[y], qz[z]);
          }
    }
  });
  const int64_t bad_row = bad.load();
  TORCH_CHECK(bad_row == std::numeric_limits<int64_t>::max(), "input row ", bad_row,
              " produces an output coordinate outside the supported range: batch in [0, ",
              kBatchMax, "], x/y/z in [", kSpatialMin, ", ", kSpatialMax, "]");

  const auto unique = unique_sorted(candidates);
  const int64_t m = static_cast<int64_t>(unique.size());
  auto out = at::empty({m, 4}, coords.options());
  int32_t* o = out.data_ptr<int32_t>();
  at::parallel_for(0, m, 8192, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) unpack_coord(unique[i], o + 4 * i);
  });
  return out;
}

namespace {

// Axis inputs q*s - pad + t*d for every tap t of one output coordinate.
void axis_inputs(const KernelGeometry& g, const int32_t* q, int64_t (*p)[kMaxKernelAxis]) {
  for (int a = 0; a < 3; ++a)
    for (int64_t t = 0; t < g.k[a]; ++t) p[a][t] = g.input_of(a, q[1 + a], t);
}

bool is_centred_submanifold(const KernelGeometry& g) {
  for (int a = 0; a < 3; ++a)
    if (g.s[a] != 1 || g.k[a] % 2 == 0 || 2 * g.pad[a] != g.d[a] * (g.k[a] - 1)) return false;
  return true;
}

}  // namespace

at::Tensor kmap_out_in_cpu(const at::Tensor& keys, const at::Tensor& vals,
                           const at::Tensor& out_coords_in, at::IntArrayRef kernel_size,
                           at::IntArrayRef stride, at::IntArrayRef dilation,
                           at::IntArrayRef padding, int64_t pad_rows_to, bool submanifold) {
  TORCH_CHECK(keys.scalar_type() == at::kLong && vals.scalar_type() == at::kInt &&
                  keys.dim() == 1 && keys.sizes() == vals.sizes(),
              "kmap_out_in: (keys, vals) must come from hash_build");
  TORCH_CHECK(pad_rows_to >= 1, "pad_rows_to must be >= 1, got ", pad_rows_to);
  const auto out_coords = checked_coords(out_coords_in, "out_coords");
  const auto g = make_geometry(kernel_size, stride, dilation, padding);
  TORCH_CHECK(!submanifold || is_centred_submanifold(g),
              "kmap_out_in: submanifold=True needs stride 1 and odd kernels with centred padding");
  const int64_t n_out = out_coords.size(0);
  const int64_t rows = (n_out + pad_rows_to - 1) / pad_rows_to * pad_rows_to;
  const int64_t K = g.volume();
  auto out_in = at::full({rows, K}, -1, out_coords.options());
  const CoordHashView table{keys.data_ptr<int64_t>(), vals.data_ptr<int32_t>(), keys.size(0)};
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
            const int32_t found = coord_in_range(b, x, y, z) ? table.find(pack_coord(b, x, y, z)) : -1;
            dst[k] = found;
            if (submanifold && found >= 0) {
              if (found >= n_out) {
                foreign_rows = true;
                continue;
              }
              m[found * K + (K - 1 - k)] = static_cast<int32_t>(row);
            }
          }
      if (submanifold) dst[K / 2] = static_cast<int32_t>(row);
    }
  });
  TORCH_CHECK(!foreign_rows.load(),
              "kmap_out_in: submanifold=True needs out_coords to be the coordinates the table holds");
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
  m.impl("kmap_output_coords", &kmap_output_coords_cpu);
  m.impl("kmap_out_in", &kmap_out_in_cpu);
  m.impl("kmap_pairs", &kmap_pairs_cpu);
}

}  // namespace torchsparse_pp
