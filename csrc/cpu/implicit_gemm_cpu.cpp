// Implicit-GEMM dataflow on the CPU: output-stationary over tiles of output rows.
//
// Float32 and bfloat16 with finite weights run the register kernels (implicit_gemm_registers.h):
// groups of rows sum every offset one of them has in registers. Otherwise (double, no AVX2,
// Inf / NaN in the weight) the tile GEMMs below run. A tile gathers, for each offset that any
// of its rows uses (the OR of the rows' bitmasks), the rows' neighbours into an im2col block
// (zeros where a row has none) and multiplies it by the matching rows of the stacked weight
// [K * C_in, C_out]. Runs of consecutive offsets are contiguous in the weight, so each run is
// one GEMM and weights are never copied. Each output row belongs to one tile, so results are
// written straight to the output, without atomics.
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
#include <torch/library.h>

#include "checks_cpu.h"
#include "implicit_gemm_plan.h"
#include "implicit_gemm_registers.h"
#include "kmap_common.h"
#include "pair_tiles.h"
#include "tile_policy.h"

#include <cstring>
#include <vector>

namespace torchsparse_pp {

namespace {

// A segment has at most this many rows, and its im2col block at most kIm2colValues values.
constexpr int64_t kMaxSegmentRows = 128;
constexpr int64_t kIm2colValues = int64_t(1) << 17;
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

std::vector<Segment> segments(const KmapPlan& plan) {
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

// `groups`: the plan's row groups (implicit_gemm_row_groups), or null to build them here. With
// them given the table is read (and checked) only by the tile path.
template <typename T, typename Tiles>
at::Tensor forward_impl(Tiles, const at::Tensor& feats, const at::Tensor& weight, const at::Tensor& table,
                        int64_t num_dst, bool transpose_weight, const KmapPlan& plan,
                        const RowGroupTensors* groups) {
  using A = typename Tiles::A;
  using M = typename Tiles::Acc;
  const at::Tensor w = Tiles::weights(weight, transpose_weight);
  const int64_t K = weight.size(0);
  const int64_t c_src = weight.size(transpose_weight ? 2 : 1), c_dst = weight.size(transpose_weight ? 1 : 2);
  const int64_t k_len = Tiles::k_len(c_src);  // an offset's columns in the im2col block
  const A* wp = w.data_ptr<A>();
  // Offsets whose weight holds Inf or NaN: added per present neighbour below, not in the GEMMs.
  const at::Tensor weight_c = weight.contiguous();
  const std::vector<char> bad = nonfinite_offsets<T>(weight_c);
  const char* skip = bad.empty() ? nullptr : bad.data();
  // Weights with Inf / NaN take the tile path (a zero row times them would be NaN).
  if constexpr (kPairKernel<T, Tiles>) {
    if (pair_gemm_available() && skip == nullptr) {
      const RowGroupTensors built = groups != nullptr ? *groups : build_row_groups(plan, table);
      return register_forward<T>(feats, wp, k_len, row_groups_view(plan, built), num_dst, c_src, c_dst, plan);
    }
  }
  if (groups != nullptr) check_table(table, num_dst, K, feats.size(0));
  check_plan_covers_table(plan, table);
  const bool partial = plan.splits > 1;
  const auto acc_type = c10::CppTypeToScalarType<M>::value;
  at::Tensor out = partial ? at::zeros({plan.splits, num_dst, c_dst}, feats.options().dtype(acc_type))
                           : at::empty({num_dst, c_dst}, feats.options().dtype(acc_type));
  const T* f = feats.data_ptr<T>();
  const int32_t* map = table.data_ptr<int32_t>();
  M* o = out.data_ptr<M>();
  const T* w_raw = weight_c.data_ptr<T>();
  const int64_t c_in = weight.size(1), c_out = weight.size(2);
  const auto segs = segments(plan);
  parallel_items(static_cast<int64_t>(segs.size()), [&](int64_t item) {
    const Segment seg = segs[item];
    const int64_t s = seg.split, p0 = seg.t0 * plan.tile_rows, rows = (seg.t1 - seg.t0) * plan.tile_rows;
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
  if (partial) out = sum_splits<M>(out);
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
  const auto plan = make_kmap_plan(bounds, order, tile_masks, K, num_dst, tile_rows);  // coverage: in forward_impl
  const auto feats = feats_in.contiguous();
  at::Tensor out;
  AT_DISPATCH_FLOATING_TYPES_AND(at::kBFloat16, feats.scalar_type(), "implicit_gemm_forward_cpu", [&] {
    with_tiles<scalar_t>([&](auto tiles) {
      out = forward_impl<scalar_t>(tiles, feats, weight, table, num_dst, transpose_weight, plan, nullptr);
    });
  });
  return out;
}

at::Tensor implicit_gemm_forward_grouped_cpu(const at::Tensor& feats_in, const at::Tensor& weight,
                                             const at::Tensor& table, int64_t num_dst, bool transpose_weight,
                                             const at::Tensor& bounds, const at::Tensor& order,
                                             const at::Tensor& tile_masks, int64_t tile_rows,
                                             const at::Tensor& term_begin, const at::Tensor& term_offsets,
                                             const at::Tensor& term_sources) {
  check_feats(feats_in, "feats");
  check_weight(weight, feats_in, transpose_weight);
  check_table_layout(table, num_dst, weight.size(0));  // its entries: read (and checked) by the tile path only
  const auto plan = make_kmap_plan(bounds, order, tile_masks, weight.size(0), num_dst, tile_rows);
  const RowGroupTensors groups{term_begin, term_offsets, term_sources};
  const auto feats = feats_in.contiguous();
  at::Tensor out;
  AT_DISPATCH_FLOATING_TYPES_AND(at::kBFloat16, feats.scalar_type(), "implicit_gemm_forward_grouped_cpu", [&] {
    with_tiles<scalar_t>([&](auto tiles) {
      out = forward_impl<scalar_t>(tiles, feats, weight, table, num_dst, transpose_weight, plan, &groups);
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
  const auto plan = make_kmap_plan(bounds, order, tile_masks, K, grad_in.size(0), tile_rows);
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
  m.impl("implicit_gemm_forward_grouped", &implicit_gemm_forward_grouped_cpu);
  m.impl("implicit_gemm_wgrad", &implicit_gemm_wgrad_cpu);
}

}  // namespace torchsparse_pp
