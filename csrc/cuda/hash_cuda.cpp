// Exact coordinate hash table on CUDA: hash_build / hash_query over hash.cu, with the CPU ops'
// checks and messages. The table format is the CPU one, so either device's queries agree.
#include <ATen/ATen.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include "../cpu/hash_cpu.h"
#include "hash.h"
#include "kmap_common_cuda.h"

namespace torchsparse_pp {

namespace {

using namespace kmap_host;
namespace kernels = kmap_kernels;

at::Tensor hash_build_cuda(const at::Tensor& coords_in) {
  const auto coords = checked_coords_cuda(coords_in, "coords");
  const c10::cuda::CUDAGuard guard(coords.device());
  return build_table_cuda(coords, DuplicateReport::kRow);
}

at::Tensor hash_query_cuda(const at::Tensor& table, const at::Tensor& query_in) {
  const auto view = table_view(table);
  const auto query = checked_coords_cuda(query_in, "query");
  check_on_same_device(table, "the hash table", query, "query");
  const c10::cuda::CUDAGuard guard(query.device());
  const int64_t n = query.size(0);
  auto out = at::empty({n}, query.options());
  C10_CUDA_CHECK(kernels::hash_query_coords(view, query.data_ptr<int32_t>(), n, out.data_ptr<int32_t>(),
                                            c10::cuda::getCurrentCUDAStream()));
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(torchsparse_pp, CUDA, m) {
  m.impl("hash_build", &hash_build_cuda);
  m.impl("hash_query", &hash_query_cuda);
}

}  // namespace torchsparse_pp
