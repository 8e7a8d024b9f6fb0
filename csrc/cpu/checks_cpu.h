// Argument checks shared by the CPU dataflow kernels. The ops are public (torch.ops), so every
// index they will follow is validated before any kernel runs.
#pragma once

#include <ATen/ATen.h>

#include <string>

namespace torchsparse_pp {

// Feature matrix [N, C] of a supported dtype.
void check_feats(const at::Tensor& t, const char* name);

// Operands of a weight gradient: feats [N_src, C_src] and grad_out [N_dst, C_dst], one dtype.
void check_wgrad_operands(const at::Tensor& feats, const at::Tensor& grad);

// Weight [K, C_in, C_out] of the feats' dtype; returns (C_src, C_dst) for the multiplication
// direction (transposed weights multiply by W[k]^T).
std::pair<int64_t, int64_t> check_weight(const at::Tensor& weight, const at::Tensor& feats,
                                         bool transpose_weight);

// Weight-stationary pairs: offsets [K + 1] bound the pairs of each offset, indices lie in
// [0, num_src) and [0, num_dst), no offset names a destination twice, and identity[k] really
// means pairs (j, j) for every row. Returns whether the destinations ascend within every offset
// (the order kmap_pairs produces; one pass over the pairs checks all of this then).
bool check_pairs(const at::Tensor& src_idx, const at::Tensor& dst_idx, const at::Tensor& offsets,
                 const at::Tensor& identity, int64_t K, int64_t num_src, int64_t num_dst);

// Raises unless check_pairs found the destinations ascending within each offset (what
// fetch-on-demand's forward relies on).
void require_pairs_sorted_by_dst(bool ascending);

// Output-stationary table [rows >= num_rows, K] with entries in [-1, num_src).
void check_table(const at::Tensor& table, int64_t num_rows, int64_t K, int64_t num_src);
// Its layout alone (dtype, shape, device, num_rows), for readers that range-check entries as they use them.
void check_table_layout(const at::Tensor& table, int64_t num_rows, int64_t K);

// Memory this process may still use: MemAvailable (/proc/meminfo), capped by the cgroup's
// limit and by TSPP_MEMORY_LIMIT_BYTES when set (a byte count; a test hook, documented in
// docs/bad_inputs.md); -1 when none can be read.
int64_t available_memory_bytes();

// Raises before an allocation of `bytes` that cannot fit in the available memory (the
// allocation would fail later, or the OOM killer would end the process); `what` says what
// needs it and why that much. Sizes under 64 MiB are not checked (no /proc read) unless
// TSPP_MEMORY_LIMIT_BYTES is set. torchsparse_pp/kmap/torch_ops.py mirrors both.
void check_memory(int64_t bytes, const std::string& what);

}  // namespace torchsparse_pp
