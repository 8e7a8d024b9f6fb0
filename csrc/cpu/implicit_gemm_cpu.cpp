// Implicit-GEMM dataflow on the CPU: output-stationary over tiles of output rows.
//
// A tile gathers, for each offset that any of its rows uses (the OR of the rows' bitmasks),
// the rows' neighbours into an im2col block (zeros where a row has none) and multiplies it by
// the matching rows of the stacked weight [K * C_in, C_out]. Runs of consecutive offsets are
// contiguous in the weight, so each run is one GEMM and weights are never copied. Each output
// row belongs to one tile, so results are written straight to the output, without atomics.
//
// A plan (kmap_plan) splits the offsets into ranges; sorted plans reorder rows by bitmask per
// split so that tiles share masks and skip more offsets. Consecutive tiles with equal masks run
// as one segment, so small tiles (little waste) still make GEMMs with many rows. With several
// splits every split writes its own partial buffer, and the buffers are added in split order.
//
// A missing neighbour must contribute nothing, as in the gather dataflows: a zero row times a
// weight holding Inf or NaN would be NaN. So offsets whose weight is not finite are left out
// of the tile GEMMs and added row by row over present neighbours only (forward / dgrad).
// Finite weights (the common case) cost one scan. The weight gradient runs per offset over the
// table's pairs (kmap_pairs), which hold present neighbours only.
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <immintrin.h>
#include <torch/library.h>

#include "checks_cpu.h"
#include "cpu_features.h"
#include "kmap_common.h"
#include "pair_tiles.h"
#include "tile_policy.h"

#include <atomic>
#include <cstring>
#include <vector>

namespace torchsparse_pp {

namespace {

// A segment has at most this many rows, and its im2col block at most kIm2colValues values.
constexpr int64_t kMaxSegmentRows = 128;
constexpr int64_t kIm2colValues = int64_t(1) << 17;

struct Plan {
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

// Whether a value is Inf or NaN, from its bits (all-ones exponent): integer ops that vectorise.
template <typename T>
struct FloatBits;
template <>
struct FloatBits<float> {
  using U = uint32_t;
  static constexpr U kExponent = 0x7f800000u;
};
template <>
struct FloatBits<double> {
  using U = uint64_t;
  static constexpr U kExponent = 0x7ff0000000000000ull;
};
template <>
struct FloatBits<at::BFloat16> {
  using U = uint16_t;
  static constexpr U kExponent = 0x7f80u;
};

// Whether any of v[0, n) is Inf or NaN.
template <typename T>
bool any_nonfinite(const T* v, int64_t n) {
  using U = typename FloatBits<T>::U;
  constexpr U e = FloatBits<T>::kExponent;
  U bits;
  bool found = false;
  for (int64_t j = 0; j < n; ++j) {
    std::memcpy(&bits, v + j, sizeof(U));
    found |= (bits & e) == e;
  }
  return found;
}

// Per offset of a contiguous [K, C_in, C_out] weight: whether it holds Inf or NaN. Empty when
// every weight is finite.
template <typename T>
std::vector<char> nonfinite_offsets(const at::Tensor& weight) {
  const int64_t K = weight.size(0), per = weight.size(1) * weight.size(2);
  const T* w = weight.data_ptr<T>();
  std::vector<char> bad(K, 0);
  bool any = false;
  for (int64_t k = 0; k < K; ++k) {
    bad[k] = any_nonfinite(w + k * per, per);
    any |= bad[k] != 0;
  }
  return any ? bad : std::vector<char>();
}

// Consecutive tiles of one split with equal masks, up to kMaxSegmentRows rows.
struct Segment {
  int64_t split, t0, t1;
};

std::vector<Segment> segments(const Plan& plan) {
  const int64_t max_tiles = std::max<int64_t>(1, kMaxSegmentRows / plan.tile_rows);
  std::vector<Segment> out;
  for (int64_t s = 0; s < plan.splits; ++s)
    for (int64_t t = 0; t < plan.tiles;) {
      int64_t t1 = t + 1;
      while (t1 < plan.tiles && t1 - t < max_tiles &&
             std::equal(plan.mask(s, t), plan.mask(s, t) + plan.words, plan.mask(s, t1)))
        ++t1;
      out.push_back({s, t, t1});
      t = t1;
    }
  return out;
}

// Offsets per im2col block for `rows` rows of `channels` channels.
int64_t offsets_per_block(int64_t rows, int64_t channels) {
  return std::max<int64_t>(1, kIm2colValues / std::max<int64_t>(1, rows * channels));  // channels may be 0
}

Plan make_plan(const at::Tensor& bounds, const at::Tensor& order, const at::Tensor& tile_masks,
               int64_t K, int64_t num_rows, int64_t tile_rows) {
  TORCH_CHECK(tile_rows >= 1, "tile_rows must be >= 1, got ", tile_rows);
  TORCH_CHECK(bounds.scalar_type() == at::kLong && bounds.dim() == 1 && bounds.size(0) >= 2 &&
                  bounds.is_contiguous(),
              "plan bounds must be an int64 vector [splits + 1] from kmap_plan");
  const int64_t splits = bounds.size(0) - 1;
  const int64_t* b = bounds.data_ptr<int64_t>();
  TORCH_CHECK(b[0] == 0 && b[splits] == K, "plan bounds must run from 0 to K = ", K);
  int64_t longest = 0;
  for (int64_t s = 0; s < splits; ++s) {
    TORCH_CHECK(b[s] < b[s + 1], "plan bounds must increase");
    longest = std::max(longest, b[s + 1] - b[s]);
  }
  const int64_t tiles = (num_rows + tile_rows - 1) / tile_rows;
  const int64_t words = (longest + 63) / 64;
  TORCH_CHECK(tile_masks.scalar_type() == at::kLong && tile_masks.is_contiguous() &&
                  tile_masks.sizes() == at::IntArrayRef({splits, tiles, words}),
              "plan tile masks must be int64 [splits, tiles, words] = [", splits, ", ", tiles, ", ",
              words, "], got ", tile_masks.sizes());
  const int32_t* ord = nullptr;
  if (order.numel() > 0) {
    TORCH_CHECK(order.scalar_type() == at::kInt && order.is_contiguous() &&
                    order.sizes() == at::IntArrayRef({splits, tiles * tile_rows}),
                "plan order must be int32 [splits, tiles * tile_rows], got ", order.sizes());
    // Each split's order must be a permutation of the rows, padded with -1.
    std::vector<char> seen(num_rows);
    for (int64_t s = 0; s < splits; ++s) {
      std::fill(seen.begin(), seen.end(), 0);
      const int32_t* o = order.data_ptr<int32_t>() + s * tiles * tile_rows;
      for (int64_t i = 0; i < tiles * tile_rows; ++i) {
        TORCH_CHECK(o[i] >= -1 && o[i] < num_rows && (o[i] < 0 || !seen[o[i]]),
                    "plan order must be a permutation of the rows");
        if (o[i] >= 0) seen[o[i]] = 1;
      }
      for (int64_t r = 0; r < num_rows; ++r)
        TORCH_CHECK(seen[r], "plan order misses row ", r);
    }
    ord = order.data_ptr<int32_t>();
  }
  return Plan{splits, tiles, words, tile_rows, tiles * tile_rows, b, ord,
              reinterpret_cast<const uint64_t*>(tile_masks.data_ptr<int64_t>()), num_rows};
}

// Bit j set where table row `m` has a neighbour through offset k0 + j, for j < n <= 64.
TSPP_ROW_CLONES uint64_t present_bits(const int32_t* m, int64_t n) {
  uint64_t bits = 0;
  for (int64_t j = 0; j < n; ++j) bits |= static_cast<uint64_t>(m[j] >= 0) << j;
  return bits;
}

// present_bits by AVX-512 compares, 16 offsets at a time (the coverage check below scans the
// whole table on every call: ~1 ms for a 90k-row, 27-offset map one bit at a time).
TSPP_AVX512_TARGET uint64_t present_bits_avx512(const int32_t* m, int64_t n) {
  uint64_t bits = 0;
  for (int64_t j = 0; j < n; j += 16) {
    const __mmask16 k = n - j >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << (n - j)) - 1u);
    const __m512i v = _mm512_maskz_loadu_epi32(k, m + j);
    bits |= uint64_t(_mm512_mask_cmpge_epi32_mask(k, v, _mm512_setzero_si512())) << j;
  }
  return bits;
}

// A tile skips the offsets outside its mask: a mask that misses a neighbour one of its rows has
// would drop that term silently, so every present table entry must be covered. Per row and 64
// offsets: one word of present neighbours, which must lie within the tile's mask word.
void check_plan_covers_table(const Plan& plan, const at::Tensor& table) {
  const int64_t K = table.size(1);
  const int32_t* map = table.data_ptr<int32_t>();
  std::atomic<bool> covered{true};
  const auto bits_of = register_isa() == RegisterIsa::kAvx512 ? present_bits_avx512 : present_bits;
  at::parallel_for(0, plan.splits * plan.tiles, 64, [&](int64_t begin, int64_t end) {
    bool ok = true;
    for (int64_t st = begin; st < end; ++st) {
      const int64_t s = st / plan.tiles, t = st % plan.tiles, b0 = plan.bounds[s], b1 = plan.bounds[s + 1];
      const uint64_t* mask = plan.mask(s, t);
      for (int64_t i = 0; i < plan.tile_rows; ++i) {
        const int64_t r = plan.row(s, t * plan.tile_rows + i);
        if (r < 0) continue;
        for (int64_t k0 = b0; k0 < b1; k0 += 64)
          ok &= (bits_of(map + r * K + k0, std::min<int64_t>(64, b1 - k0)) & ~mask[(k0 - b0) / 64]) == 0;
      }
    }
    if (!ok) covered = false;
  });
  TORCH_CHECK(covered.load(), "plan tile masks miss offsets that their rows have: the plan does not "
              "belong to this map (make it with kmap_plan on the same table)");
}

// One segment of the forward by the register kernels (pair_gemm.h rows_gemm): groups of rows
// sum, in registers, every offset that one of them has, and write their output rows once; a
// row's absent neighbours read a row of zeros; padding slots of a sorted plan write to a sink
// row. `zero_empty`: rows of a segment without offsets get zeros (a split's partial buffer
// starts at zero).
template <typename T, typename A>
void register_segment(const Plan& plan, const Segment& seg, const int32_t* map, int64_t K, const T* f, int64_t c_src,
                      const A* wp, int64_t k_len, int64_t c_dst, float* dst, bool zero_empty) {
  const int64_t s = seg.split, p0 = seg.t0 * plan.tile_rows, rows = (seg.t1 - seg.t0) * plan.tile_rows;
  std::vector<int64_t>& present = *scratch_vector<int64_t, 2>();
  present.clear();
  plan.for_each_run(s, seg.t0, nullptr, [&](int64_t k0, int64_t k1) {
    for (int64_t k = k0; k < k1; ++k) present.push_back(k);
  });
  const int64_t terms = static_cast<int64_t>(present.size());
  const T* zeros = scratch_zeros<T>(c_src);
  float* sink = scratch<float, 3>(c_dst);
  const T** a = scratch<const T*, 4>(std::max<int64_t>(1, terms) * kRowGroup);
  const A** w = scratch<const A*, 5>(std::max<int64_t>(1, terms));
  // Padding slots of a sorted plan read a table row with no neighbours.
  std::vector<int32_t>& none = *scratch_vector<int32_t, 6>();
  none.assign(K, -1);
  for (int64_t g0 = 0; g0 < rows; g0 += kRowGroup) {
    const int64_t group = std::min(kRowGroup, rows - g0);
    float* out_rows[kRowGroup];
    const int32_t* table_rows[kRowGroup];
    for (int64_t m = 0; m < group; ++m) {
      const int64_t r = plan.row(s, p0 + g0 + m);
      out_rows[m] = r < 0 ? sink : dst + r * c_dst;
      table_rows[m] = r < 0 ? none.data() : map + r * K;
    }
    // The tile's offsets that some row of this group has: the rest would only add zero
    // products (weights here are finite), and a group's rows are fewer than the tile's.
    int64_t used = 0;
    for (int64_t j = 0; j < terms; ++j) {
      const int64_t k = present[j];
      bool any = false;
      for (int64_t m = 0; m < group; ++m) {
        const int64_t r = table_rows[m][k];
        a[used * kRowGroup + m] = r < 0 ? zeros : f + r * c_src;
        any |= r >= 0;
      }
      if (any) w[used++] = wp + k * k_len * c_dst;
    }
    if (used == 0) {
      if (zero_empty)
        for (int64_t m = 0; m < group; ++m) std::fill(out_rows[m], out_rows[m] + c_dst, 0.f);
      continue;
    }
    rows_gemm(group, used, a, c_src, w, c_dst, out_rows, false);
  }
}

template <typename T, typename Tiles>
at::Tensor forward_impl(Tiles, const at::Tensor& feats, const at::Tensor& weight, const at::Tensor& table,
                        int64_t num_dst, bool transpose_weight, const Plan& plan) {
  using A = typename Tiles::A;
  using M = typename Tiles::Acc;
  const at::Tensor w = Tiles::weights(weight, transpose_weight);
  const int64_t K = weight.size(0);
  const int64_t c_src = weight.size(transpose_weight ? 2 : 1), c_dst = weight.size(transpose_weight ? 1 : 2);
  const int64_t k_len = Tiles::k_len(c_src);  // an offset's columns in the im2col block
  const bool partial = plan.splits > 1;
  const auto acc_type = c10::CppTypeToScalarType<M>::value;
  at::Tensor out = partial ? at::zeros({plan.splits, num_dst, c_dst}, feats.options().dtype(acc_type))
                           : at::empty({num_dst, c_dst}, feats.options().dtype(acc_type));
  const T* f = feats.data_ptr<T>();
  const A* wp = w.data_ptr<A>();
  const int32_t* map = table.data_ptr<int32_t>();
  M* o = out.data_ptr<M>();
  const auto segs = segments(plan);
  // Offsets whose weight holds Inf or NaN: added per present neighbour below, not in the GEMMs.
  const at::Tensor weight_c = weight.contiguous();
  const std::vector<char> bad = nonfinite_offsets<T>(weight_c);
  const char* skip = bad.empty() ? nullptr : bad.data();
  const T* w_raw = weight_c.data_ptr<T>();
  const int64_t c_in = weight.size(1), c_out = weight.size(2);
  // The register kernels keep each group's sums across the tile's offsets (every output row
  // written once, absent neighbours read zeros); weights with Inf / NaN take the tile path.
  bool registers = false;
  if constexpr (kPairKernel<T, Tiles>) registers = pair_gemm_available() && skip == nullptr;
  parallel_items(static_cast<int64_t>(segs.size()), [&](int64_t item) {
    const Segment seg = segs[item];
    const int64_t s = seg.split, p0 = seg.t0 * plan.tile_rows, rows = (seg.t1 - seg.t0) * plan.tile_rows;
    if constexpr (kPairKernel<T, Tiles>) {
      if (registers) {
        register_segment<T>(plan, seg, map, K, f, c_src, wp, k_len, c_dst, o + (partial ? s * num_dst * c_dst : 0),
                            !partial);
        return;
      }
    }
    const int64_t per_block = offsets_per_block(rows, k_len);
    A* a = scratch<A, 0>(rows * per_block * k_len);
    M* c = scratch<M, 1>(rows * c_dst);
    bool written = false;
    plan.for_each_run(s, seg.t0, skip, [&](int64_t k0, int64_t k1) {
      for (int64_t ka = k0; ka < k1; ka += per_block) {
        const int64_t kb = std::min(k1, ka + per_block), cols = (kb - ka) * k_len;
        for (int64_t k = ka; k < kb; ++k)
          Tiles::gather_rows(f, c_src, rows, [&](int64_t i) { return plan.source(s, p0 + i, map, K, k); },
                             a + (k - ka) * k_len, cols);
        Tiles::gemm(rows, c_dst, cols, a, cols, wp + ka * k_len * c_dst, c, c_dst, written);
        written = true;
      }
    });
    for (int64_t k = plan.bounds[s]; skip != nullptr && k < plan.bounds[s + 1]; ++k) {
      if (!skip[k] || !plan.tile_has(s, seg.t0, k)) continue;
      if (!written) std::fill(c, c + rows * c_dst, M(0));
      written = true;
      const T* wk = w_raw + k * c_in * c_out;
      for (int64_t i = 0; i < rows; ++i) {
        const int64_t p = plan.source(s, p0 + i, map, K, k);
        if (p < 0) continue;
        const T* x = f + p * c_src;
        M* ci = c + i * c_dst;
        for (int64_t e = 0; e < c_src; ++e) {
          const M xe = static_cast<M>(x[e]);
          for (int64_t j = 0; j < c_dst; ++j)  // W[k] is [C_in, C_out]; dgrad reads it transposed
            ci[j] += xe * static_cast<M>(transpose_weight ? wk[j * c_out + e] : wk[e * c_out + j]);
        }
      }
    }
    M* dst = o + (partial ? s * num_dst * c_dst : 0);
    for (int64_t i = 0; i < rows; ++i) {
      const int64_t r = plan.row(s, p0 + i);
      if (r < 0) continue;
      M* d = dst + r * c_dst;
      if (written) std::copy(c + i * c_dst, c + (i + 1) * c_dst, d);
      else if (!partial) std::fill(d, d + c_dst, M(0));
    }
  });
  if (partial) {
    // Splits add in split order, the same on any thread count.
    at::Tensor sum = at::empty({num_dst, c_dst}, out.options());
    M* r = sum.data_ptr<M>();
    at::parallel_for(0, num_dst * c_dst, 1 << 14, [&](int64_t begin, int64_t end) {
      for (int64_t j = begin; j < end; ++j) {
        M acc = o[j];
        for (int64_t s = 1; s < plan.splits; ++s) acc += o[s * num_dst * c_dst + j];
        r[j] = acc;
      }
    });
    out = sum;
  }
  return out.scalar_type() == feats.scalar_type() ? out : out.to(feats.scalar_type());
}

}  // namespace

at::Tensor implicit_gemm_forward_cpu(const at::Tensor& feats_in, const at::Tensor& weight,
                                     const at::Tensor& table, int64_t num_dst, bool transpose_weight,
                                     const at::Tensor& bounds, const at::Tensor& order,
                                     const at::Tensor& tile_masks, int64_t tile_rows,
                                     bool /*allow_tf32: the CPU has no TF32 unit, fp32 is exact*/) {
  check_feats(feats_in, "feats");
  check_weight(weight, feats_in, transpose_weight);
  const int64_t K = weight.size(0);
  check_table(table, num_dst, K, feats_in.size(0));
  const auto plan = make_plan(bounds, order, tile_masks, K, num_dst, tile_rows);
  check_plan_covers_table(plan, table);
  const auto feats = feats_in.contiguous();
  at::Tensor out;
  AT_DISPATCH_FLOATING_TYPES_AND(at::kBFloat16, feats.scalar_type(), "implicit_gemm_forward_cpu", [&] {
    with_tiles<scalar_t>([&](auto tiles) {
      out = forward_impl<scalar_t>(tiles, feats, weight, table, num_dst, transpose_weight, plan);
    });
  });
  return out;
}

at::Tensor implicit_gemm_wgrad_cpu(const at::Tensor& feats_in, const at::Tensor& grad_in,
                                   const at::Tensor& table, const at::Tensor& bounds,
                                   const at::Tensor& order, const at::Tensor& tile_masks,
                                   int64_t tile_rows,
                                   bool /*allow_tf32: the CPU has no TF32 unit, fp32 is exact*/) {
  check_wgrad_operands(feats_in, grad_in);
  TORCH_CHECK(table.dim() == 2, "the map must be [rows, K], got ", table.sizes());
  const int64_t K = table.size(1);
  check_table(table, grad_in.size(0), K, feats_in.size(0));
  const auto plan = make_plan(bounds, order, tile_masks, K, grad_in.size(0), tile_rows);
  check_plan_covers_table(plan, table);
  const auto feats = feats_in.contiguous();
  const auto grad = grad_in.contiguous();
  // Output-stationary tiles suit the forward, not the weight gradient: its GEMMs would run over
  // a tile's few rows and re-read all of dW per tile (2.5-14x slower than per-offset pairs on a
  // Zen 5, bfloat16 no faster than float32 on 128-wide layers). So the plan is checked, and dW
  // is summed per offset over the table's pairs by the fixed-order pairs kernel.
  const auto [src, dst, offsets, identity] = kmap_pairs_cpu(table, feats.size(0), grad.size(0));
  at::Tensor dweight;
  AT_DISPATCH_FLOATING_TYPES_AND(at::kBFloat16, feats.scalar_type(), "implicit_gemm_wgrad_cpu", [&] {
    dweight = pairs_wgrad_tiled<scalar_t>(feats, grad, src, dst, offsets, K);
  });
  return dweight;
}

TORCH_LIBRARY_IMPL(torchsparse_pp, CPU, m) {
  m.impl("implicit_gemm_forward", &implicit_gemm_forward_cpu);
  m.impl("implicit_gemm_wgrad", &implicit_gemm_wgrad_cpu);
}

}  // namespace torchsparse_pp
