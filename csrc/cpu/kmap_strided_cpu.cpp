// Strided and generative kernel maps on the CPU, by sorting what each input reaches.
//
// Every input p lists the coordinates it reaches through each kernel tap: the strided outputs
// q with q*s - pad + t*d = p, or the sites p*s - pad + t*d a generative transposed conv writes.
// Radix-sorting these (key, row, offset) candidates yields the new coordinate set (unique keys,
// in canonical order) and, at the same time, every candidate's row in it: no hash table, one
// pass of sequential memory traffic per radix digit.
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <atomic>
#include <limits>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "checks_cpu.h"
#include "hash_cpu.h"
#include "kmap_common.h"
#include "kmap_grid_cpu.h"
#include "radix_sort.h"

namespace torchsparse_pp {

namespace {

constexpr int64_t kNoRow = std::numeric_limits<int64_t>::max();
// Bytes per candidate while a map is built: key and payload, and the radix sort's copies.
constexpr int64_t kCandidateBytes = 4 * sizeof(uint64_t);

enum class Relation {
  kReadBy,  // outputs q with q*s - pad + t*d = p (strided conv)
  kFloor,   // q = floor(p / s) (minkowski output set)
  kWrites,  // p*s - pad + t*d (conv_transpose3d)
};

// floor(x / s): an arithmetic shift for power-of-two strides (shift = log2(s), else -1; a
// division costs ~30 cycles, and the common strides are 1 and 2).
inline int64_t divide_by_stride(int64_t x, int64_t s, int shift) {
  return shift >= 0 ? (x >> shift) : floor_div(x, s);
}

// One axis of a relation, with the taps that can reach each residue of p + pad modulo s
// precomputed, so that the hot loop needs one division per axis instead of one per tap.
struct AxisRule {
  Relation rel;
  int64_t k, s, d, pad, range;        // range: exclusive bound of [0, range), or -1
  int shift;                          // log2(s) when s is a power of two (no division), else -1
  std::vector<int64_t> first;         // [s + 1]: taps of residue r are [first[r], first[r+1])
  std::vector<int64_t> taps, behind;  // tap t, and (t*d - r) / s: q = floor((p+pad)/s) - behind

  AxisRule(const KernelGeometry& g, Relation relation, int a, const int64_t* out_range)
      : rel(relation), k(g.k[a]), s(g.s[a]), d(g.d[a]), pad(g.pad[a]),
        range(out_range != nullptr ? out_range[a] : -1), shift(-1) {
    if ((s & (s - 1)) == 0) shift = __builtin_ctzll(static_cast<uint64_t>(s));
    if (rel != Relation::kReadBy) return;
    first.assign(s + 1, 0);
    for (int64_t r = 0; r < s; ++r) {
      first[r] = static_cast<int64_t>(taps.size());
      for (int64_t t = 0; t < k; ++t)
        if (((t * d - r) % s + s) % s == 0) {
          taps.push_back(t);
          behind.push_back(floor_div(t * d - r, s));
        }
    }
    first[s] = static_cast<int64_t>(taps.size());
    single = true;  // every residue has exactly one tap
    for (int64_t r = 0; r < s; ++r) single = single && first[r + 1] - first[r] == 1;
  }

  bool single = false;  // kReadBy with one tap per residue (kernel == stride, e.g. k2 s2)

  int64_t divide(int64_t x) const { return divide_by_stride(x, s, shift); }

  // Coordinates (and taps) that p reaches on this axis; returns how many.
  int reach(int64_t p, int64_t* coord, int64_t* tap) const {
    int n = 0;
    auto push = [&](int64_t q, int64_t t) {
      if (range >= 0 && (q < 0 || q >= range)) return;
      coord[n] = q;
      tap[n] = t;
      ++n;
    };
    if (rel == Relation::kFloor) {
      push(divide(p), 0);
    } else if (rel == Relation::kWrites) {
      for (int64_t t = 0; t < k; ++t) push(p * s - pad + t * d, t);
    } else {
      const int64_t base = divide(p + pad), r = p + pad - base * s;
      for (int64_t i = first[r]; i < first[r + 1]; ++i) push(base - behind[i], taps[i]);
    }
    return n;
  }
};

struct Rules {
  AxisRule axis[3];
  int64_t ky, kz;

  Rules(const KernelGeometry& g, Relation rel, const int64_t* range)
      : axis{AxisRule(g, rel, 0, range), AxisRule(g, rel, 1, range), AxisRule(g, rel, 2, range)},
        ky(g.k[1]), kz(g.k[2]) {}

  // How many coordinates `row` reaches (what for_each visits), without visiting them.
  int64_t count(const int32_t* row) const {
    int64_t c[kMaxKernelAxis], t[kMaxKernelAxis];
    int64_t total = axis[0].reach(row[1], c, t);
    if (total != 0) total *= axis[1].reach(row[2], c, t);
    if (total != 0) total *= axis[2].reach(row[3], c, t);
    return total;
  }

  // Calls fn(key, offset) for every coordinate `row` reaches; key is kEmptyKey outside the
  // packable range. Returns how many it visited.
  template <typename Fn>
  int64_t for_each(const int32_t* row, Fn&& fn) const {
    int64_t cx[kMaxKernelAxis], cy[kMaxKernelAxis], cz[kMaxKernelAxis];
    int64_t tx[kMaxKernelAxis], ty[kMaxKernelAxis], tz[kMaxKernelAxis];
    const int nx = axis[0].reach(row[1], cx, tx), ny = axis[1].reach(row[2], cy, ty),
              nz = axis[2].reach(row[3], cz, tz);
    for (int x = 0; x < nx; ++x)
      for (int y = 0; y < ny; ++y)
        for (int z = 0; z < nz; ++z) {
          const bool ok = coord_in_range(row[0], cx[x], cy[y], cz[z]);
          fn(ok ? pack_coord(row[0], cx[x], cy[y], cz[z]) : kEmptyKey, (tx[x] * ky + ty[y]) * kz + tz[z]);
        }
    return int64_t(nx) * ny * nz;
  }
};

// An AxisRule with one tap per residue, as values a loop keeps in registers: read through the
// rule, every field is reloaded after each candidate store (uint64 stores may alias the rule's
// int64 fields), which made these loads the hottest instructions of the pass.
struct SingleTapAxis {
  int64_t pad, s, range;
  int shift;
  const int64_t* behind;
  const int64_t* taps;

  explicit SingleTapAxis(const AxisRule& a)
      : pad(a.pad), s(a.s), range(a.range), shift(a.shift), behind(a.behind.data()), taps(a.taps.data()) {}

  // The one (coordinate, tap) p reaches; false if it is outside the range.
  bool reach(int64_t p, int64_t& coord, int64_t& tap) const {
    const int64_t base = divide_by_stride(p + pad, s, shift), r = p + pad - base * s;
    coord = base - behind[r];
    tap = taps[r];
    return range < 0 || (coord >= 0 && coord < range);
  }
};

// Candidates (key, row << 32 | offset) of every input, sorted by key.
struct Candidates {
  std::vector<uint64_t> keys, payload;
};

// An axis with kernel == stride, dilation 1 and a power-of-two stride (k2 s2): p reaches
// q = (p + pad) >> shift through tap (p + pad) & mask, with no table, so that a loop over rows
// keeps all three axes in registers. With a clip range, q counts only in [0, range).
struct UnitTapAxis : ShiftAxis {
  static bool applies(const AxisRule& a) {
    if (!a.single || a.shift < 0) return false;
    for (int64_t r = 0; r < a.s; ++r)
      if (a.taps[r] != r || a.behind[r] != 0) return false;
    return true;
  }

  explicit UnitTapAxis(const AxisRule& a) : ShiftAxis{a.pad, a.shift, a.s - 1, a.range} {}

  // Whether every input coordinate of the supported range reaches a packable output.
  bool always_packable() const {
    return ((kSpatialMin + pad) >> shift) >= kSpatialMin && ((kSpatialMax + pad) >> shift) <= kSpatialMax;
  }
};

// collect_single's loop over rows [begin, end) for unit-tap axes (arguments by value: no store
// can alias them). With Clip, outputs outside [0, range) are not reached (one unsigned compare
// per axis); with Checked, unpackable outputs are not either, and the first row reaching one is
// returned (else kNoRow). Without it, the inputs are in range and every axis always_packable,
// so the loop is a few integer operations per row.
template <bool Checked, bool Clip>
int64_t collect_unit_taps(const int32_t* c, int64_t begin, int64_t end, const UnitTapAxis x, const UnitTapAxis y,
                          const UnitTapAxis z, const int64_t ky, const int64_t kz, uint64_t* keys,
                          uint64_t* payload) {
  int64_t bad = kNoRow;
  for (int64_t i = begin; i < end; ++i) {
    const int32_t* row = c + 4 * i;
    const int64_t px = row[1] + x.pad, py = row[2] + y.pad, pz = row[3] + z.pad;
    const int64_t qx = px >> x.shift, qy = py >> y.shift, qz = pz >> z.shift;
    bool reached = true, packable = true;
    if constexpr (Clip)
      reached = static_cast<uint64_t>(qx) < static_cast<uint64_t>(x.range) &&
                static_cast<uint64_t>(qy) < static_cast<uint64_t>(y.range) &&
                static_cast<uint64_t>(qz) < static_cast<uint64_t>(z.range);
    if constexpr (Checked) packable = coord_in_range(row[0], qx, qy, qz);
    keys[i] = static_cast<uint64_t>(reached && packable ? pack_coord(row[0], qx, qy, qz) : kEmptyKey);
    payload[i] = (static_cast<uint64_t>(i) << 32) |
                 static_cast<uint64_t>(((px & x.mask) * ky + (py & y.mask)) * kz + (pz & z.mask));
    if constexpr (Checked)
      if (reached && !packable && bad == kNoRow) bad = i;
  }
  return bad;
}

// Geometries where each input reaches at most one output (one tap per residue on every axis):
// one pass writes each input's candidate in its own slot, kEmptyKey where it reaches nothing
// (it sorts last and matches nothing), with no counting pass and no per-tap loops.
Candidates collect_single(const int32_t* c, int64_t n, const Rules& rules, int64_t K, bool strict) {
  check_memory(n * kCandidateBytes, "the kernel map's candidate list (" + std::to_string(n) + " inputs)");
  Candidates out{std::vector<uint64_t>(n), std::vector<uint64_t>(n)};
  std::atomic<int64_t> bad_row{kNoRow};
  if (UnitTapAxis::applies(rules.axis[0]) && UnitTapAxis::applies(rules.axis[1]) &&
      UnitTapAxis::applies(rules.axis[2])) {
    const UnitTapAxis x(rules.axis[0]), y(rules.axis[1]), z(rules.axis[2]);
    // Inputs are checked to be in range before candidates are collected.
    const bool checked = !(x.always_packable() && y.always_packable() && z.always_packable());
    const bool clip = x.range >= 0;
    // A few nanoseconds per row: below 32768 rows a second thread costs more than it saves.
    at::parallel_for(0, n, 32768, [&](int64_t begin, int64_t end) {
      const auto run = [&](auto checked_v, auto clip_v) {
        return collect_unit_taps<decltype(checked_v)::value, decltype(clip_v)::value>(
            c, begin, end, x, y, z, rules.ky, rules.kz, out.keys.data(), out.payload.data());
      };
      using Yes = std::true_type;
      using No = std::false_type;
      const int64_t bad = checked ? (clip ? run(Yes{}, Yes{}) : run(Yes{}, No{}))
                                  : (clip ? run(No{}, Yes{}) : run(No{}, No{}));
      if (strict && bad != kNoRow) atomic_min(bad_row, bad);
    });
  } else {
    at::parallel_for(0, n, 4096, [&](int64_t begin, int64_t end) {
      const SingleTapAxis ax(rules.axis[0]), ay(rules.axis[1]), az(rules.axis[2]);
      const int64_t ky = rules.ky, kz = rules.kz;
      uint64_t* keys = out.keys.data();
      uint64_t* payload = out.payload.data();
      for (int64_t i = begin; i < end; ++i) {
        const int32_t* row = c + 4 * i;
        int64_t qx = 0, qy = 0, qz = 0, tx = 0, ty = 0, tz = 0;
        int64_t key = kEmptyKey;
        if (ax.reach(row[1], qx, tx) && ay.reach(row[2], qy, ty) && az.reach(row[3], qz, tz)) {
          if (coord_in_range(row[0], qx, qy, qz))
            key = pack_coord(row[0], qx, qy, qz);
          else if (strict)
            atomic_min(bad_row, i);
        }
        keys[i] = static_cast<uint64_t>(key);
        payload[i] = (static_cast<uint64_t>(i) << 32) | static_cast<uint64_t>((tx * ky + ty) * kz + tz);
      }
    });
  }
  TORCH_CHECK(bad_row.load() == kNoRow, "input row ", bad_row.load(),
              " produces an output coordinate outside the supported range: batch in [0, ",
              kBatchMax, "], x/y/z in [", kSpatialMin, ", ", kSpatialMax, "]");
  radix_sort(out.keys, &out.payload);
  return out;
}

// With `strict`, a key outside the packable range is an error (it would be a new coordinate);
// otherwise such candidates are dropped (they cannot match an existing coordinate).
Candidates collect(const at::Tensor& coords, const Rules& rules, int64_t K, bool strict) {
  TORCH_CHECK(K <= std::numeric_limits<uint32_t>::max(), "a kernel of ", K, " offsets is not supported");
  const int64_t n = coords.size(0);
  const int32_t* c = coords.data_ptr<int32_t>();
  if (rules.axis[0].single && rules.axis[1].single && rules.axis[2].single)
    return collect_single(c, n, rules, K, strict);
  std::vector<int64_t> start(n + 1, 0);
  at::parallel_for(0, n, 4096, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i)
      start[i + 1] = rules.count(c + 4 * i);
  });
  for (int64_t i = 0; i < n; ++i) start[i + 1] += start[i];
  // Keys and payloads, and as much again while radix-sorting them.
  check_memory(start[n] * kCandidateBytes,
               "the kernel map's candidate list (" + std::to_string(start[n]) + " coordinates that " +
                   std::to_string(n) + " inputs reach through " + std::to_string(K) + " kernel offsets)");
  Candidates out{std::vector<uint64_t>(start[n]), std::vector<uint64_t>(start[n])};
  std::atomic<int64_t> bad_row{kNoRow};
  at::parallel_for(0, n, 4096, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      int64_t pos = start[i];
      rules.for_each(c + 4 * i, [&](int64_t key, int64_t k) {
        if (key == kEmptyKey && strict) atomic_min(bad_row, i);
        out.keys[pos] = static_cast<uint64_t>(key);  // kEmptyKey sorts last and never matches
        out.payload[pos++] = (static_cast<uint64_t>(i) << 32) | static_cast<uint64_t>(k);
      });
    }
  });
  TORCH_CHECK(bad_row.load() == kNoRow, "input row ", bad_row.load(),
              " produces an output coordinate outside the supported range: batch in [0, ",
              kBatchMax, "], x/y/z in [", kSpatialMin, ", ", kSpatialMax, "]");
  radix_sort(out.keys, &out.payload);
  return out;
}

at::Tensor coords_of(const std::vector<uint64_t>& keys, const at::TensorOptions& options) {
  const int64_t m = static_cast<int64_t>(keys.size());
  auto coords = at::empty({m, 4}, options.dtype(at::kInt));
  int32_t* o = coords.data_ptr<int32_t>();
  at::parallel_for(0, m, 8192, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) unpack_coord(static_cast<int64_t>(keys[i]), o + 4 * i);
  });
  return coords;
}

// Map cells being filled: an (output, offset) cell determines its input coordinate, so a cell
// claimed by two inputs means duplicate coordinates; check() names the first such row.
struct CellClaims {
  int64_t dup_row = kNoRow;

  void claim(int32_t& cell, int64_t p) {
    if (cell >= 0) dup_row = std::min<int64_t>(dup_row, std::max<int64_t>(p, cell));
    cell = static_cast<int32_t>(p);
  }

  void check() const {
    TORCH_CHECK(dup_row == kNoRow, "duplicate coordinate at row ", dup_row,
                ": the coordinates of a SparseTensor must be unique "
                "(torchsparse_pp.utils.sparse_quantize removes duplicates)");
  }
};

// Walks sorted candidates against the sorted unique keys they belong to, calling
// fn(unique index, row, offset) for each candidate whose key is among `unique`.
template <typename Fn>
void join(const Candidates& cand, const std::vector<uint64_t>& unique, Fn&& fn) {
  size_t u = 0;
  for (size_t i = 0; i < cand.keys.size(); ++i) {
    while (u < unique.size() && unique[u] < cand.keys[i]) ++u;
    if (u == unique.size()) break;
    if (unique[u] != cand.keys[i]) continue;
    fn(static_cast<int64_t>(u), static_cast<int64_t>(cand.payload[i] >> 32),
       static_cast<int64_t>(cand.payload[i] & 0xFFFFFFFFu));
  }
}

// The spconv output set (the distinct keys the inputs reach) and its map, in one pass over the
// sorted candidates: each output's coordinate and map row are written when its first candidate
// is met, while they are in cache, instead of by a fill of the whole map, an unpacking pass and
// a join against a separate list of unique keys.
std::tuple<at::Tensor, at::Tensor> reached_outputs(const Candidates& cand, int64_t K, int64_t pad_rows_to,
                                                   const at::TensorOptions& options) {
  const std::vector<uint64_t>& keys = cand.keys;
  const auto empty = static_cast<uint64_t>(kEmptyKey);  // sorts last
  int64_t reached = 0;
  while (reached < static_cast<int64_t>(keys.size()) && keys[reached] != empty) ++reached;
  int64_t outputs = 0;
  for (int64_t i = 0; i < reached; ++i) outputs += i == 0 || keys[i] != keys[i - 1];
  check_rows(outputs, "the new coordinate set");
  auto out_coords = at::empty({outputs, 4}, options.dtype(at::kInt));
  const int64_t rows = padded_rows(outputs, pad_rows_to);
  auto out_in = at::empty({rows, K}, options.dtype(at::kInt));
  int32_t* c = out_coords.data_ptr<int32_t>();
  int32_t* m = out_in.data_ptr<int32_t>();
  std::fill(m, m + rows * K, -1);
  CellClaims claims;
  // Without a branch on "new output" (taken for about every second candidate, so mispredicted):
  // the output index advances by the comparison, and its coordinate is rewritten per candidate.
  int64_t q = -1;  // the output of candidate i
  uint64_t previous = reached > 0 ? ~keys[0] : 0;
  for (int64_t i = 0; i < reached; ++i) {
    q += keys[i] != previous;
    previous = keys[i];
    unpack_coord(static_cast<int64_t>(keys[i]), c + 4 * q);
    claims.claim(m[q * K + (cand.payload[i] & 0xFFFFFFFFu)], static_cast<int64_t>(cand.payload[i] >> 32));
  }
  claims.check();
  return {out_coords, out_in};
}

// Kernel == stride (a power of two) on every axis: the bitmap build of kmap_grid_cpu.h, when it
// applies. In minkowski mode only without padding, where floor(p / s) is what p reaches.
std::optional<std::tuple<at::Tensor, at::Tensor>> unit_taps_on_grid(const at::Tensor& coords, const Rules& rules,
                                                                    bool minkowski, int64_t K, int64_t pad_rows_to) {
  ShiftAxis axes[3];
  for (int a = 0; a < 3; ++a) {
    if (!UnitTapAxis::applies(rules.axis[a])) return std::nullopt;
    axes[a] = UnitTapAxis(rules.axis[a]);
    if (minkowski && axes[a].pad != 0) return std::nullopt;
  }
  return downsample_on_grid(coords, axes, rules.ky, rules.kz, K, pad_rows_to);
}

std::vector<uint64_t> unique_keys(const std::vector<uint64_t>& sorted) {
  std::vector<uint64_t> out;
  out.reserve(sorted.size());
  for (uint64_t k : sorted)
    if (k != static_cast<uint64_t>(kEmptyKey) && (out.empty() || out.back() != k)) out.push_back(k);
  return out;
}

}  // namespace

std::tuple<at::Tensor, at::Tensor> kmap_downsample_cpu(const at::Tensor& coords_in,
                                                       at::IntArrayRef kernel_size,
                                                       at::IntArrayRef stride,
                                                       at::IntArrayRef dilation,
                                                       at::IntArrayRef padding,
                                                       c10::string_view mode,
                                                       at::OptionalIntArrayRef out_range,
                                                       int64_t pad_rows_to) {
  check_coord_rows(coords_in, "coords");
  const auto coords = checked_coords(coords_in, "coords");
  const auto g = make_geometry(kernel_size, stride, dilation, padding);
  const bool minkowski = checked_minkowski_mode(mode, out_range);
  int64_t range_buf[3];
  const int64_t* range = checked_range(out_range, range_buf);
  const int64_t K = g.volume();
  const Rules reach(g, Relation::kReadBy, range);
  if (auto grid = unit_taps_on_grid(coords, reach, minkowski, K, pad_rows_to)) return std::move(*grid);
  // Every input must be packable and unique, also those whose outputs are clipped or in range
  // only because of the division.
  check_coords_unique(coords);

  // spconv: the outputs are exactly what the inputs reach; minkowski: floor(p / s), joined with
  // what the inputs reach (an output cell is claimed once unless coordinates repeat).
  const auto reached = collect(coords, reach, K, !minkowski);
  if (!minkowski) return reached_outputs(reached, K, pad_rows_to, coords.options());
  const auto out_keys = unique_keys(collect(coords, Rules(g, Relation::kFloor, nullptr), K, true).keys);
  check_rows(static_cast<int64_t>(out_keys.size()), "the new coordinate set");
  auto out_coords = coords_of(out_keys, coords.options());
  auto out_in = at::full({padded_rows(out_coords.size(0), pad_rows_to), K}, -1, coords.options());
  int32_t* m = out_in.data_ptr<int32_t>();
  CellClaims claims;
  join(reached, out_keys, [&](int64_t q, int64_t p, int64_t k) { claims.claim(m[q * K + k], p); });
  claims.check();
  return {out_coords, out_in};
}

std::tuple<at::Tensor, at::Tensor> kmap_generative_cpu(const at::Tensor& coords_in,
                                                       at::IntArrayRef kernel_size,
                                                       at::IntArrayRef stride,
                                                       at::IntArrayRef dilation,
                                                       at::IntArrayRef padding,
                                                       at::OptionalIntArrayRef out_range,
                                                       int64_t pad_rows_to) {
  check_coord_rows(coords_in, "coords");
  const auto coords = checked_coords(coords_in, "coords");
  const auto g = make_geometry(kernel_size, stride, dilation, padding);
  int64_t range_buf[3];
  const int64_t* range = checked_range(out_range, range_buf);
  const int64_t K = g.volume();
  check_coords_unique(coords);  // duplicates in the coarse set would double their fine sites
  const auto written = collect(coords, Rules(g, Relation::kWrites, range), K, true);
  const auto fine_keys = unique_keys(written.keys);
  check_rows(static_cast<int64_t>(fine_keys.size()), "the new coordinate set");
  auto fine_coords = coords_of(fine_keys, coords.options());
  // Rows are the coarse inputs of the transposed conv; entries index the fine set it writes.
  auto out_in = at::full({padded_rows(coords.size(0), pad_rows_to), K}, -1, coords.options());
  int32_t* m = out_in.data_ptr<int32_t>();
  join(written, fine_keys, [&](int64_t f, int64_t p, int64_t k) { m[p * K + k] = static_cast<int32_t>(f); });
  return {fine_coords, out_in};
}

TORCH_LIBRARY_IMPL(torchsparse_pp, CPU, m) {
  m.impl("kmap_downsample", &kmap_downsample_cpu);
  m.impl("kmap_generative", &kmap_generative_cpu);
}

}  // namespace torchsparse_pp
