// Views of a kernel map on CUDA: weight-stationary pairs (kmap_pairs), the transposed table
// (kmap_transpose) and implicit-GEMM plans (kmap_plan). Outputs equal the CPU ops'.
#include <ATen/ATen.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <algorithm>
#include <limits>

#include "../cpu/kmap_common.h"
#include "kmap_common_cuda.h"
#include "kmap_views.h"

namespace torchsparse_pp {

namespace {

using namespace kmap_host;
namespace kernels = kmap_kernels;

// Rows 0..n-1 stably sorted by their mask words descending, lexicographic over words (word 0
// first), within consecutive windows of `window` rows: LSD passes from the last word, then a
// stable pass by window (the most significant key). masks: [n, words] int64.
at::Tensor rows_by_mask(const at::Tensor& masks, int64_t window) {
  const int64_t n = masks.size(0), words = masks.size(1);
  auto rows = at::arange(n, masks.options());
  const auto stable_order = [](const at::Tensor& key) {
    return std::get<1>(at::sort(key, std::optional<bool>(true), 0, false));
  };
  for (int64_t w = words - 1; w >= 0; --w) {
    // Descending as unsigned = ascending as signed after flipping every bit but the sign bit.
    const auto key = at::bitwise_xor(masks.select(1, w).index_select(0, rows),
                                     std::numeric_limits<int64_t>::max());
    rows = rows.index_select(0, stable_order(key));
  }
  if (window < n) rows = rows.index_select(0, stable_order(at::floor_divide(rows, window)));
  return rows;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> kmap_pairs_cuda(const at::Tensor& out_in_in,
                                                                           int64_t num_in, int64_t num_out) {
  check_pairs_arguments(out_in_in, num_in, num_out);
  TORCH_CHECK(out_in_in.is_cuda(), "out_in must be on a CUDA device for this kernel, got ", out_in_in.device());
  const auto out_in = out_in_in.contiguous();
  const int64_t K = out_in.size(1);
  const c10::cuda::CUDAGuard guard(out_in.device());
  const auto stream = c10::cuda::getCurrentCUDAStream();
  const auto long_options = out_in.options().dtype(at::kLong);

  // Pair counts per (offset, chunk of rows); their exclusive scan in offset-major order is where
  // each chunk writes its pairs, so pairs come ordered by offset, then output row.
  const int64_t chunks = (num_out + kernels::kPairChunkRows - 1) / kernels::kPairChunkRows;
  auto counts = at::empty({K * chunks}, long_options);
  auto not_identity = at::zeros({K}, out_in.options());
  auto bad_input = at::zeros({1}, out_in.options());
  const int32_t* m = out_in.data_ptr<int32_t>();
  C10_CUDA_CHECK(kernels::pairs_count(m, num_out, K, num_in, chunks, counts.data_ptr<int64_t>(),
                                      not_identity.data_ptr<int32_t>(), bad_input.data_ptr<int32_t>(),
                                      stream));
  TORCH_CHECK(bad_input.item<int32_t>() == 0, "out_in holds input rows >= num_in (", num_in, ")");
  if (K * chunks == 0) {
    const auto bool_options = out_in.options().dtype(at::kBool);
    return {at::empty({0}, out_in.options()), at::empty({0}, out_in.options()), at::zeros({K + 1}, long_options),
            at::zeros({K}, bool_options)};
  }
  const auto ends = counts.cumsum(0);
  const auto starts = ends - counts;
  const int64_t total = ends[K * chunks - 1].item<int64_t>();
  auto in_idx = at::empty({total}, out_in.options());
  auto out_idx = at::empty({total}, out_in.options());
  C10_CUDA_CHECK(kernels::pairs_fill(m, num_out, K, chunks, starts.data_ptr<int64_t>(),
                                     in_idx.data_ptr<int32_t>(), out_idx.data_ptr<int32_t>(), stream));
  auto offsets = at::cat({starts.view({K, chunks}).select(1, 0), ends.narrow(0, K * chunks - 1, 1)});
  // An offset whose pairs are (j, j) for every row needs no gather or scatter.
  auto identity = not_identity.eq(0);
  if (num_in != num_out) identity.fill_(false);
  return {in_idx, out_idx, offsets, identity};
}

at::Tensor kmap_transpose_cuda(const at::Tensor& out_in, int64_t num_out, int64_t num_in, int64_t pad_rows_to) {
  TORCH_CHECK(out_in.dim() == 2, "out_in must be [rows, K], got ", out_in.sizes());
  const int64_t K = out_in.size(1);
  const c10::cuda::CUDAGuard guard(out_in.device());
  check_table_cuda(out_in, num_out, K, num_in);
  TORCH_CHECK(pad_rows_to >= 1, "pad_rows_to must be >= 1, got ", pad_rows_to);
  const int64_t rows = (num_in + pad_rows_to - 1) / pad_rows_to * pad_rows_to;
  auto in_out = at::full({rows, K}, -1, out_in.options());
  auto clash = at::zeros({1}, out_in.options());
  C10_CUDA_CHECK(kernels::transpose_map(out_in.data_ptr<int32_t>(), num_out, K, in_out.data_ptr<int32_t>(),
                                        clash.data_ptr<int32_t>(), c10::cuda::getCurrentCUDAStream()));
  // Within one offset an input feeds at most one output; a second claim means a corrupt map.
  TORCH_CHECK(clash.item<int32_t>() == 0, "kmap_transpose: an input is read twice through one offset");
  return in_out;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> kmap_plan_cuda(const at::Tensor& table, int64_t num_rows,
                                                              int64_t split_mask_num, int64_t tile_rows,
                                                              int64_t sort_window) {
  TORCH_CHECK(table.dim() == 2, "the map must be [rows, K], got ", table.sizes());
  const int64_t K = table.size(1);
  const c10::cuda::CUDAGuard guard(table.device());
  check_table_cuda(table, num_rows, K, std::numeric_limits<int32_t>::max());
  const PlanShape shape = plan_shape(K, num_rows, split_mask_num, tile_rows, sort_window);
  const auto stream = c10::cuda::getCurrentCUDAStream();
  const bool sorted = shape.sorted;
  const int64_t splits = shape.splits, window = shape.window, words = shape.words, tiles = shape.tiles;
  const int64_t padded = shape.padded;
  const auto bounds = at::tensor(shape.bounds, table.options().dtype(at::kLong));
  auto order = at::full({sorted ? splits : 0, padded}, -1, table.options());
  auto tile_masks = at::zeros({splits, tiles, words}, table.options().dtype(at::kLong));
  if (num_rows == 0 || words == 0) return {bounds, order, tile_masks};

  auto masks = at::empty({splits, num_rows, words}, table.options().dtype(at::kLong));
  C10_CUDA_CHECK(kernels::plan_row_masks(table.data_ptr<int32_t>(), num_rows, K, bounds.data_ptr<int64_t>(),
                                         splits, words, masks.data_ptr<int64_t>(), stream));
  if (sorted)
    for (int64_t s = 0; s < splits; ++s)
      order.select(0, s).narrow(0, 0, num_rows).copy_(rows_by_mask(masks.select(0, s), window));
  C10_CUDA_CHECK(kernels::plan_tile_masks(masks.data_ptr<int64_t>(), num_rows, splits, words,
                                          sorted ? order.data_ptr<int32_t>() : nullptr, padded, tile_rows,
                                          tiles, tile_masks.data_ptr<int64_t>(), stream));
  return {bounds, order, tile_masks};
}

}  // namespace

TORCH_LIBRARY_IMPL(torchsparse_pp, CUDA, m) {
  m.impl("kmap_pairs", &kmap_pairs_cuda);
  m.impl("kmap_transpose", &kmap_transpose_cuda);
  m.impl("kmap_plan", &kmap_plan_cuda);
}

}  // namespace torchsparse_pp
