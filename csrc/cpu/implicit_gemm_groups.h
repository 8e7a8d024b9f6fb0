// The operands of the implicit-GEMM register kernels (implicit_gemm_registers.h), per group of
// kRowGroup consecutive positions of one split of a plan: the offsets that one of the group's
// rows has (ascending: the group's terms) and, per term, each row's source row (-1: none, read
// as a row of zeros). They depend on the table and the plan alone, so the map caches them
// (KernelMap.row_groups) rather than every forward reading the whole table again (~30 % of a
// bfloat16 forward on MinkUNet's layers on a Zen 5: table rows scattered by the sorted order,
// their present bits, the coverage check, the terms' order).
#pragma once

#include <ATen/ATen.h>

#include <tuple>

#include "implicit_gemm_plan.h"
#include "pair_gemm.h"

namespace torchsparse_pp {

// (term_begin int64 [groups + 1], term_offsets int32 [terms], term_sources int32 [terms, kRowGroup]);
// group g = s * groups_per_split + pos / kRowGroup covers positions [pos, pos + kRowGroup) of split s.
using RowGroupTensors = std::tuple<at::Tensor, at::Tensor, at::Tensor>;

inline int64_t groups_per_split(const KmapPlan& plan) { return (plan.padded + kRowGroup - 1) / kRowGroup; }

// Views of RowGroupTensors whose sizes were checked against the plan (row_groups_view). Their
// values are checked where the kernel reads them: a group with more terms than its split has
// offsets, an offset outside its split or a source outside [-1, num_src) is flagged there
// (and read as nothing), and the forward raises kBadRowGroups.
struct RowGroups {
  int64_t per_split, terms;
  const int64_t* term_begin;
  const int32_t* term_offsets;
  const int32_t* term_sources;
};

extern const char* const kBadRowGroups;

// The groups of `plan` over `table` [rows, K]; raises kPlanMissesOffsets when a row has a
// neighbour outside its tile's mask.
RowGroupTensors build_row_groups(const KmapPlan& plan, const at::Tensor& table);

RowGroups row_groups_view(const KmapPlan& plan, const RowGroupTensors& groups);

}  // namespace torchsparse_pp
