// Row groups of an implicit-GEMM plan (implicit_gemm_groups.h) and the op that builds them.
#include "implicit_gemm_groups.h"

#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <atomic>

#include "checks_cpu.h"

namespace torchsparse_pp {

const char* const kBadRowGroups =
    "row groups do not belong to this plan and source count: a group has more terms than its split has offsets, "
    "an offset outside its split, or a source row outside [-1, num_src) (make them with implicit_gemm_row_groups "
    "on the same table and plan)";

namespace {

constexpr int64_t kGroupsPerTask = 256;

// fn(k0, any, present, rows, table_rows) for each word of 64 offsets [k0, ...) of the group at
// position pos of split s: `any` the OR of the rows' present bits. Returns whether the tile masks
// cover every neighbour of the group's rows.
template <typename Fn>
bool for_each_word(const KmapPlan& plan, int64_t s, int64_t pos, const int32_t* map, int64_t K, PresentBits bits_of,
                   Fn&& fn) {
  const int64_t b0 = plan.bounds[s], b1 = plan.bounds[s + 1], rows = std::min(kRowGroup, plan.padded - pos);
  const int32_t* table_rows[kRowGroup];
  for (int64_t m = 0; m < rows; ++m) {
    const int64_t r = plan.row(s, pos + m);
    table_rows[m] = r < 0 ? nullptr : map + r * K;
  }
  bool covered = true;
  uint64_t present[kRowGroup];
  for (int64_t k0 = b0; k0 < b1; k0 += 64) {
    bits_of(table_rows, rows, k0, std::min<int64_t>(64, b1 - k0), present);
    uint64_t any = 0;
    for (int64_t m = 0; m < rows; ++m) {
      covered &= (present[m] & ~plan.mask(s, (pos + m) / plan.tile_rows)[(k0 - b0) / 64]) == 0;
      any |= present[m];
    }
    fn(k0, any, present, rows, table_rows);
  }
  return covered;
}

}  // namespace

RowGroupTensors build_row_groups(const KmapPlan& plan, const at::Tensor& table) {
  const int64_t per_split = groups_per_split(plan), count = plan.splits * per_split, K = table.size(1);
  const int32_t* map = table.data_ptr<int32_t>();
  const PresentBits bits_of = present_bits_function();
  const auto ints = table.options().dtype(at::kInt);
  at::Tensor term_begin = at::empty({count + 1}, table.options().dtype(at::kLong));
  int64_t* begin = term_begin.data_ptr<int64_t>();
  begin[0] = 0;
  // Terms per group, then their prefix sums, then the terms.
  std::atomic<bool> covered{true};
  at::parallel_for(0, count, kGroupsPerTask, [&](int64_t g0, int64_t g1) {
    bool ok = true;
    for (int64_t g = g0; g < g1; ++g) {
      int64_t terms = 0;
      ok &= for_each_word(plan, g / per_split, g % per_split * kRowGroup, map, K, bits_of,
                          [&](int64_t, uint64_t any, const uint64_t*, int64_t, const int32_t* const*) {
                            terms += __builtin_popcountll(any);
                          });
      begin[g + 1] = terms;
    }
    if (!ok) covered = false;
  });
  TORCH_CHECK(covered.load(), kPlanMissesOffsets);
  for (int64_t g = 0; g < count; ++g) begin[g + 1] += begin[g];
  at::Tensor term_offsets = at::empty({begin[count]}, ints);
  at::Tensor term_sources = at::empty({begin[count], kRowGroup}, ints);
  int32_t* offsets = term_offsets.data_ptr<int32_t>();
  int32_t* sources = term_sources.data_ptr<int32_t>();
  at::parallel_for(0, count, kGroupsPerTask, [&](int64_t g0, int64_t g1) {
    for (int64_t g = g0; g < g1; ++g) {
      int64_t t = begin[g];
      for_each_word(plan, g / per_split, g % per_split * kRowGroup, map, K, bits_of,
                    [&](int64_t k0, uint64_t any, const uint64_t* present, int64_t rows,
                        const int32_t* const* table_rows) {
                      // Terms in offset order; every slot starts empty, then each row fills its present ones.
                      const int64_t first = t;
                      uint8_t term_of[64];
                      for (; any != 0; any &= any - 1) {
                        const int64_t j = __builtin_ctzll(any);
                        term_of[j] = static_cast<uint8_t>(t - first);
                        offsets[t++] = static_cast<int32_t>(k0 + j);
                      }
                      std::fill(sources + first * kRowGroup, sources + t * kRowGroup, -1);
                      for (int64_t m = 0; m < rows; ++m)
                        for (uint64_t bits = present[m]; bits != 0; bits &= bits - 1) {
                          const int64_t j = __builtin_ctzll(bits);
                          sources[(first + term_of[j]) * kRowGroup + m] = table_rows[m][k0 + j];
                        }
                    });
    }
  });
  return {term_begin, term_offsets, term_sources};
}

RowGroups row_groups_view(const KmapPlan& plan, const RowGroupTensors& groups) {
  const auto& [term_begin, term_offsets, term_sources] = groups;
  const int64_t count = plan.splits * groups_per_split(plan);
  TORCH_CHECK(term_begin.scalar_type() == at::kLong && term_begin.dim() == 1 && term_begin.size(0) == count + 1 &&
                  term_begin.is_contiguous() && term_begin.device().is_cpu(),
              "row groups: term_begin must be a contiguous int64 CPU vector of groups + 1 = ", count + 1,
              " entries for this plan, got ", term_begin.scalar_type(), " ", term_begin.sizes());
  TORCH_CHECK(term_offsets.scalar_type() == at::kInt && term_offsets.dim() == 1 && term_offsets.is_contiguous() &&
                  term_offsets.device().is_cpu(),
              "row groups: term_offsets must be a contiguous int32 CPU vector, got ", term_offsets.scalar_type(), " ",
              term_offsets.sizes());
  const int64_t terms = term_offsets.size(0);
  TORCH_CHECK(term_sources.scalar_type() == at::kInt && term_sources.is_contiguous() &&
                  term_sources.device().is_cpu() && term_sources.sizes() == at::IntArrayRef({terms, kRowGroup}),
              "row groups: term_sources must be a contiguous int32 CPU tensor [terms = ", terms, ", ", kRowGroup,
              "], got ", term_sources.scalar_type(), " ", term_sources.sizes());
  return RowGroups{groups_per_split(plan), terms, term_begin.data_ptr<int64_t>(), term_offsets.data_ptr<int32_t>(),
                   term_sources.data_ptr<int32_t>()};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> implicit_gemm_row_groups_cpu(const at::Tensor& table, int64_t num_rows,
                                                                            const at::Tensor& bounds,
                                                                            const at::Tensor& order,
                                                                            const at::Tensor& tile_masks,
                                                                            int64_t tile_rows) {
  TORCH_CHECK(table.dim() == 2, "the map must be [rows, K], got ", table.sizes());
  check_table_layout(table, num_rows, table.size(1));  // entries are range-checked where the forward reads them
  const auto plan = make_kmap_plan(bounds, order, tile_masks, table.size(1), num_rows, tile_rows);
  return build_row_groups(plan, table);
}

TORCH_LIBRARY_IMPL(torchsparse_pp, CPU, m) { m.impl("implicit_gemm_row_groups", &implicit_gemm_row_groups_cpu); }

}  // namespace torchsparse_pp
