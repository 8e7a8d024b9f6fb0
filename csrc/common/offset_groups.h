// Adaptive grouping of gather_scatter (shared by the CPU and CUDA ops): which offsets' pairs are
// multiplied together. Header-only and free of ATen.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

namespace torchsparse_pp {

// One member is a plain GEMM; several are padded to `rows` pairs each and batched.
struct OffsetGroup {
  std::vector<int64_t> members;
  int64_t rows;
};

// Offsets (largest first) below mm_thresh pairs join the current group while padding them to its
// largest count wastes at most `epsilon` of it; epsilon = 0 keeps one GEMM per offset. Identity
// and empty offsets are left out. `off` has K + 1 bounds; is_identity(k) says offset k is j -> j.
template <typename IsIdentity>
std::vector<OffsetGroup> plan_offset_groups(const int64_t* off, int64_t K, IsIdentity&& is_identity, double epsilon,
                                            int64_t mm_thresh) {
  std::vector<int64_t> order;
  for (int64_t k = 0; k < K; ++k)
    if (!is_identity(k) && off[k + 1] > off[k]) order.push_back(k);
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t a, int64_t b) { return off[a + 1] - off[a] > off[b + 1] - off[b]; });
  std::vector<OffsetGroup> groups;
  bool open = false;
  for (int64_t k : order) {
    const int64_t n = off[k + 1] - off[k];
    const bool batchable = epsilon > 0 && n < mm_thresh;
    if (open && batchable && groups.back().rows - n <= epsilon * groups.back().rows) {
      groups.back().members.push_back(k);
      continue;
    }
    groups.push_back({{k}, n});
    open = batchable;
  }
  return groups;
}

}  // namespace torchsparse_pp
