// Kernel maps on CUDA by hash lookup: kmap_out_in between any two sets, and kmap_submanifold
// (Q = P) through a table of P. Results equal the CPU ops' (the CPU's sort-merge submanifold
// build is tested equal to its hash-probe build).
#include <ATen/ATen.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <limits>

#include "../cpu/hash_cpu.h"
#include "../cpu/kmap_common.h"
#include "kmap.h"
#include "kmap_common_cuda.h"

namespace torchsparse_pp {

namespace {

using namespace kmap_host;
namespace kernels = kmap_kernels;

at::Tensor kmap_out_in_cuda(const at::Tensor& table_in, const at::Tensor& out_coords_in,
                            at::IntArrayRef kernel_size, at::IntArrayRef stride,
                            at::IntArrayRef dilation, at::IntArrayRef padding, int64_t pad_rows_to,
                            bool submanifold) {
  const auto table = table_view(table_in);
  const auto out_coords = checked_coords_cuda(out_coords_in, "out_coords");
  check_on_same_device(table_in, "the hash table", out_coords, "out_coords");
  const auto g = make_geometry(kernel_size, stride, dilation, padding);
  TORCH_CHECK(!submanifold || is_centred_submanifold(g),
              "kmap_out_in: submanifold=True needs stride 1 and odd kernels with centred padding");
  const int64_t n_out = out_coords.size(0);
  TORCH_CHECK(n_out <= std::numeric_limits<int32_t>::max(),
              "at most 2^31-1 output coordinates are supported, got ", n_out);
  const int64_t K = g.volume();
  const c10::cuda::CUDAGuard guard(out_coords.device());
  const auto stream = c10::cuda::getCurrentCUDAStream();
  auto out_in = at::full({padded_rows(n_out, pad_rows_to), K}, -1, out_coords.options());
  auto foreign = at::zeros({1}, out_coords.options());
  // A centred submanifold map is symmetric: look up the offsets before the centre, mirror the rest.
  const int64_t searched = submanifold ? K / 2 : K;
  const int32_t* c = out_coords.data_ptr<int32_t>();
  C10_CUDA_CHECK(kernels::kmap_lookup(table, c, n_out, g, searched, submanifold, out_in.data_ptr<int32_t>(),
                                      foreign.data_ptr<int32_t>(), stream));
  if (submanifold) {
    // The centre reads the output itself; checking it proves out_coords is the table's set.
    C10_CUDA_CHECK(kernels::kmap_centre(table, c, n_out, K, true, out_in.data_ptr<int32_t>(),
                                        foreign.data_ptr<int32_t>(), stream));
    TORCH_CHECK(foreign.item<int32_t>() == 0,
                "kmap_out_in: submanifold=True needs out_coords to be the coordinates the table holds, "
                "in the same order");
  }
  return out_in;
}

at::Tensor kmap_submanifold_cuda(const at::Tensor& coords_in, at::IntArrayRef kernel_size,
                                 at::IntArrayRef dilation, at::IntArrayRef padding, int64_t pad_rows_to) {
  const auto coords = checked_coords_cuda(coords_in, "coords");
  const int64_t unit[3] = {1, 1, 1};
  const auto g = make_geometry(kernel_size, unit, dilation, padding);
  const int64_t n = coords.size(0), K = g.volume();
  TORCH_CHECK(n <= std::numeric_limits<int32_t>::max(), "at most 2^31-1 coordinates are supported, got ", n);
  const c10::cuda::CUDAGuard guard(coords.device());
  const auto stream = c10::cuda::getCurrentCUDAStream();
  const auto table_tensor = build_table_cuda(coords, DuplicateReport::kRowPair);
  const CoordHashView table{table_tensor.data_ptr<int64_t>(), table_tensor.size(0)};

  auto out_in = at::full({padded_rows(n, pad_rows_to), K}, -1, coords.options());
  auto unused_flag = at::zeros({1}, coords.options());
  // The table holds exactly these coordinates at their rows, so mirrored cells stay in range.
  const bool symmetric = is_centred_submanifold(g);
  const int32_t* c = coords.data_ptr<int32_t>();
  C10_CUDA_CHECK(kernels::kmap_lookup(table, c, n, g, symmetric ? K / 2 : K, symmetric,
                                      out_in.data_ptr<int32_t>(), unused_flag.data_ptr<int32_t>(), stream));
  if (symmetric)
    C10_CUDA_CHECK(kernels::kmap_centre(table, c, n, K, false, out_in.data_ptr<int32_t>(),
                                        unused_flag.data_ptr<int32_t>(), stream));
  return out_in;
}

}  // namespace

TORCH_LIBRARY_IMPL(torchsparse_pp, CUDA, m) {
  m.impl("kmap_out_in", &kmap_out_in_cuda);
  m.impl("kmap_submanifold", &kmap_submanifold_cuda);
}

}  // namespace torchsparse_pp
