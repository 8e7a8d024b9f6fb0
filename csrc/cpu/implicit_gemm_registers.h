// The register-kernel forward of the CPU implicit-GEMM dataflow (pair_gemm.h rows_gemm): the
// path for float32 and bfloat16 on CPUs with AVX2 or AVX-512 and finite weights;
// implicit_gemm_cpu.cpp runs the tile GEMMs otherwise.
#pragma once

#include <ATen/ATen.h>

#include <algorithm>
#include <atomic>
#include <type_traits>

#include "implicit_gemm_groups.h"
#include "implicit_gemm_plan.h"
#include "pair_gemm.h"
#include "row_ops.h"
#include "tile_gemm.h"

namespace torchsparse_pp {

// Positions of a split's row order per work item (16 row groups).
constexpr int64_t kRegisterItemRows = 16 * kRowGroup;

// The forward over positions [pos0, pos1) of split s's row order (pos0 a multiple of kRowGroup):
// groups of kRowGroup rows sum, in registers, the terms of their row group (implicit_gemm_groups.h:
// every offset one of them has, ascending, as the tile path) and write their output rows once;
// a row's absent neighbours read a row of zeros; padding slots of a sorted plan write to a sink
// row. A sorted plan's rows read features scattered over the scan, so the loop is pipelined: the
// next group's operands are set up, requesting its feature and output rows, before this group's
// GEMM (1.4-1.5x on MinkUNet's full-resolution layers on a Zen 5). Output rows O are float, or
// bfloat16 (one split): the kernel then rounds its sums into the output rows (a group of more
// than kMaxNarrowRowTerms terms goes through a float staging block in L1), so no float output is
// written and converted afterwards. `zero_empty`: rows without neighbours get zeros (a split's
// partial buffer starts at zero). Returns false when a group's terms or sources are out of range
// (those read as nothing; the caller raises kBadRowGroups).
template <typename T, typename A, typename O>
bool register_rows(const KmapPlan& plan, const RowGroups& row_groups, int64_t s, int64_t pos0, int64_t pos1,
                   const T* f, int64_t num_src, int64_t c_src, const A* wp, int64_t k_len, int64_t c_dst, O* dst,
                   bool zero_empty) {
  constexpr bool kNarrow = std::is_same_v<O, c10::BFloat16>;
  const int64_t b0 = plan.bounds[s], b1 = plan.bounds[s + 1], span = b1 - b0;
  const T* zeros = scratch_zeros<T>(c_src);
  float* sink = scratch<float, 3>(kNarrow ? 2 * kRowGroup * c_dst : c_dst);  // bf16: the staging blocks
  O* narrow_sink = kNarrow ? scratch<O, 3>(c_dst) : nullptr;  // bf16: padding slots write here
  struct Group {
    int64_t rows = 0, used = 0;
    float* out[kRowGroup];
    O* final[kRowGroup];  // bf16: the output rows (padding: a sink row), out[] being staging rows
    const T** a;
    const A** w;
  } groups[2];
  groups[0].a = scratch<const T*, 4>(2 * span * kRowGroup);
  groups[1].a = groups[0].a + span * kRowGroup;
  groups[0].w = scratch<const A*, 5>(2 * span);
  groups[1].w = groups[0].w + span;
  const auto place_row = [&](Group& g, int64_t m, int64_t r) {
    if constexpr (kNarrow) {
      g.out[m] = sink + ((&g - groups) * kRowGroup + m) * c_dst;
      g.final[m] = r < 0 ? narrow_sink : dst + r * c_dst;
    } else {
      g.out[m] = r < 0 ? sink : dst + r * c_dst;
    }
    const O* row = r < 0 ? nullptr : dst + r * c_dst;  // written soon
    for (int64_t b = 0; row != nullptr && b < c_dst * int64_t(sizeof(O)); b += 64)
      __builtin_prefetch(reinterpret_cast<const char*>(row) + b, 1);
  };
  bool valid = true;
  const uintptr_t feature_base = reinterpret_cast<uintptr_t>(f), zero_row = reinterpret_cast<uintptr_t>(zeros);
  const uintptr_t row_bytes = uintptr_t(c_src) * sizeof(T);
  const auto build = [&](int64_t pos, Group& g) {
    g.rows = std::min(kRowGroup, pos1 - pos);
    for (int64_t m = 0; m < g.rows; ++m) place_row(g, m, plan.row(s, pos + m));
    const int64_t group = s * row_groups.per_split + pos / kRowGroup;
    const int64_t t0 = row_groups.term_begin[group], t1 = row_groups.term_begin[group + 1];
    const bool fits = 0 <= t0 && t0 <= t1 && t1 <= row_groups.terms && t1 - t0 <= span;
    valid &= fits;
    g.used = fits ? t1 - t0 : 0;
    for (int64_t t = 0; t < g.used; ++t) {
      const int64_t k = row_groups.term_offsets[t0 + t];
      const bool inside = b0 <= k && k < b1;
      valid &= inside;
      g.w[t] = wp + (inside ? k : b0) * k_len * c_dst;
      const int32_t* sources = row_groups.term_sources + (t0 + t) * kRowGroup;
      // A select by mask, not a branch: ~1 in 6 slots is empty, in no pattern a predictor learns.
      const T** a = g.a + t * kRowGroup;
      for (int64_t m = 0; m < g.rows; ++m) {
        const int64_t p = sources[m];
        const bool inside_rows = static_cast<uint64_t>(p + 1) <= static_cast<uint64_t>(num_src);  // [-1, num_src)
        valid &= inside_rows;
        const uintptr_t use = uintptr_t(0) - uintptr_t((p >= 0) & inside_rows);
        const uintptr_t row = zero_row ^ (((feature_base + uintptr_t(p) * row_bytes) ^ zero_row) & use);
        a[m] = reinterpret_cast<const T*>(row);
        prefetch_row(a[m], c_src);
      }
    }
  };
  build(pos0, groups[0]);
  for (int64_t pos = pos0, i = 0; pos < pos1; pos += kRowGroup, i ^= 1) {
    if (pos + kRowGroup < pos1) build(pos + kRowGroup, groups[i ^ 1]);
    const Group& g = groups[i];
    if constexpr (kNarrow) {
      // The kernel rounds its own sums with packed bf16 weights (A); float weights, or more
      // terms than one kernel call takes, go through the float staging rows.
      constexpr bool kDirect = std::is_same_v<A, c10::BFloat16>;
      if (g.used == 0) {
        for (int64_t m = 0; m < g.rows; ++m) std::fill(g.final[m], g.final[m] + c_dst, O(0));
      } else if (kDirect && g.used <= kMaxNarrowRowTerms) {
        if constexpr (kDirect) rows_gemm(g.rows, g.used, g.a, c_src, g.w, c_dst, g.final);
      } else {
        rows_gemm(g.rows, g.used, g.a, c_src, g.w, c_dst, g.out, false);
        for (int64_t m = 0; m < g.rows; ++m)
          epilogue_narrow_rows(g.out[m], 1, c_dst, nullptr, nullptr, false, g.final[m]);
      }
    } else if (g.used > 0) {
      rows_gemm(g.rows, g.used, g.a, c_src, g.w, c_dst, g.out, false);
    } else if (zero_empty) {
      for (int64_t m = 0; m < g.rows; ++m) std::fill(g.out[m], g.out[m] + c_dst, 0.f);
    }
  }
  return valid;
}

// The forward by the register kernels over items of kRegisterItemRows positions of one split,
// taken dynamically. A bfloat16 forward with one split writes its bfloat16 output directly.
template <typename T, typename A>
at::Tensor register_forward(const at::Tensor& feats, const A* wp, int64_t k_len, const RowGroups& row_groups,
                            int64_t num_dst, int64_t c_src, int64_t c_dst, const KmapPlan& plan) {
  const bool partial = plan.splits > 1;
  const bool narrow = std::is_same_v<T, c10::BFloat16> && !partial;
  at::Tensor out = partial ? at::zeros({plan.splits, num_dst, c_dst}, feats.options().dtype(at::kFloat))
                           : at::empty({num_dst, c_dst}, feats.options().dtype(narrow ? feats.scalar_type()
                                                                                         : at::kFloat));
  const T* f = feats.data_ptr<T>();
  const int64_t num_src = feats.size(0), per_split = (plan.padded + kRegisterItemRows - 1) / kRegisterItemRows;
  std::atomic<bool> valid{true};
  const auto run = [&](auto* o) {
    parallel_items(plan.splits * per_split, [&](int64_t item) {
      const int64_t s = item / per_split, pos0 = item % per_split * kRegisterItemRows;
      if (!register_rows<T>(plan, row_groups, s, pos0, std::min(plan.padded, pos0 + kRegisterItemRows), f, num_src,
                            c_src, wp, k_len, c_dst, o + s * num_dst * c_dst, !partial))
        valid = false;
    });
  };
  if constexpr (std::is_same_v<T, c10::BFloat16>) {
    if (narrow) run(out.data_ptr<c10::BFloat16>());
  }
  if (!narrow) run(out.data_ptr<float>());
  TORCH_CHECK(valid.load(), kBadRowGroups);
  if (partial) out = sum_splits<float>(out);
  return out.scalar_type() == feats.scalar_type() ? out : out.to(feats.scalar_type());
}

}  // namespace torchsparse_pp
