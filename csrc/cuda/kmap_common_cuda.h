// Host helpers shared by the CUDA kernel-map wrappers: argument checks, and the errors of the
// CPU ops (same messages) computed from device data. CUDA builds only.
#pragma once

#include <ATen/ATen.h>

namespace torchsparse_pp {
namespace kmap_host {

// Validates dtype, shape and device of a coordinate tensor and returns it contiguous.
at::Tensor checked_coords_cuda(const at::Tensor& coords, const char* name);

// Raises unless `t` lives on the device of `ref`.
void check_on_same_device(const at::Tensor& t, const char* t_name, const at::Tensor& ref, const char* ref_name);

// Packed keys of checked coordinates; raises the CPU op's error for the first row outside the
// packable range.
at::Tensor pack_coords_cuda(const at::Tensor& coords, const char* name);

// How a duplicate coordinate is reported: by the smallest row that repeats an earlier one
// (hash_build), or by the first repeated pair in key order (the sort-based CPU builds).
enum class DuplicateReport { kRow, kRowPair };

// A [capacity, 2] (key, row) table of the coordinates, as hash_build makes it; raises for rows
// outside the range, duplicates and an insert past the probe bound.
at::Tensor build_table_cuda(const at::Tensor& coords, DuplicateReport report);

// Raises the sort-based builds' error ("duplicate coordinate (..) at rows a and b") if two of
// the packed keys are equal.
void check_unique_keys_cuda(const at::Tensor& keys, const at::Tensor& coords);

// Output-stationary table [rows >= num_rows, K] on a CUDA device with entries in [-1, num_src)
// (the checks of the CPU's check_table).
void check_table_cuda(const at::Tensor& table, int64_t num_rows, int64_t K, int64_t num_src);

}  // namespace kmap_host
}  // namespace torchsparse_pp
