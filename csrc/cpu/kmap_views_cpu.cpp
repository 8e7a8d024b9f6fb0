// Derived views of a kernel map for the output-stationary dataflow (implicit GEMM):
// the transposed table (for dgrad) and execution plans (bitmasks, sort orders, tile masks).
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <atomic>
#include <vector>

#include "checks_cpu.h"
#include "kmap_common.h"
#include "radix_sort.h"

namespace torchsparse_pp {

at::Tensor kmap_transpose_cpu(const at::Tensor& out_in, int64_t num_out, int64_t num_in,
                              int64_t pad_rows_to) {
  TORCH_CHECK(out_in.dim() == 2, "out_in must be [rows, K], got ", out_in.sizes());
  const int64_t K = out_in.size(1);
  check_table(out_in, num_out, K, num_in);
  TORCH_CHECK(pad_rows_to >= 1, "pad_rows_to must be >= 1, got ", pad_rows_to);
  const int64_t rows = (num_in + pad_rows_to - 1) / pad_rows_to * pad_rows_to;
  auto in_out = at::full({rows, K}, -1, out_in.options());
  const int32_t* m = out_in.data_ptr<int32_t>();
  int32_t* t = in_out.data_ptr<int32_t>();
  // Within one offset an input feeds at most one output; a second claim means a corrupt map.
  std::atomic<bool> clash{false};
  at::parallel_for(0, num_out, 1024, [&](int64_t begin, int64_t end) {
    for (int64_t q = begin; q < end; ++q)
      for (int64_t k = 0; k < K; ++k) {
        const int32_t p = m[q * K + k];
        if (p < 0) continue;
        int32_t expected = -1;
        if (!__atomic_compare_exchange_n(&t[p * K + k], &expected, static_cast<int32_t>(q), false,
                                         __ATOMIC_RELAXED, __ATOMIC_RELAXED))
          clash = true;
      }
  });
  TORCH_CHECK(!clash.load(), "kmap_transpose: an input is read twice through one offset");
  return in_out;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> kmap_plan_cpu(const at::Tensor& table,
                                                             int64_t num_rows,
                                                             int64_t split_mask_num,
                                                             int64_t tile_rows,
                                                             int64_t sort_window) {
  TORCH_CHECK(table.dim() == 2, "the map must be [rows, K], got ", table.sizes());
  const int64_t K = table.size(1);
  check_table(table, num_rows, K, std::numeric_limits<int32_t>::max());
  const PlanShape shape = plan_shape(K, num_rows, split_mask_num, tile_rows, sort_window);
  const bool sorted = shape.sorted;
  const int64_t splits = shape.splits, window = shape.window, words = shape.words, tiles = shape.tiles;
  const int64_t padded = shape.padded;
  const std::vector<int64_t>& b = shape.bounds;
  const auto bounds = at::tensor(b, table.options().dtype(at::kLong));
  auto order = at::full({sorted ? splits : 0, padded}, -1, table.options());
  auto tile_masks = at::zeros({splits, tiles, words}, table.options().dtype(at::kLong));
  const int32_t* m = table.data_ptr<int32_t>();

  std::vector<uint64_t> row_masks(num_rows * words);
  for (int64_t s = 0; s < splits; ++s) {
    const int64_t b0 = b[s], b1 = b[s + 1];
    std::fill(row_masks.begin(), row_masks.end(), 0);
    at::parallel_for(0, num_rows, 4096, [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r)
        for (int64_t k = b0; k < b1; ++k)
          if (m[r * K + k] >= 0) row_masks[r * words + (k - b0) / 64] |= uint64_t(1) << ((k - b0) % 64);
    });
    std::vector<int32_t> rows(num_rows);
    for (int64_t r = 0; r < num_rows; ++r) rows[r] = static_cast<int32_t>(r);
    if (sorted) {
      // Descending masks, lexicographic over words: LSD passes from the last word to the first.
      // Stable, so rows with equal masks keep their (spatially coherent) order.
      at::parallel_for(0, (num_rows + window - 1) / window, 1, [&](int64_t wb, int64_t we) {
        for (int64_t win = wb; win < we; ++win) {
          const int64_t r0 = win * window, r1 = std::min(num_rows, r0 + window);
          std::vector<int32_t> part(rows.begin() + r0, rows.begin() + r1);
          std::vector<uint64_t> keys(r1 - r0);
          for (int64_t w = words - 1; w >= 0; --w) {
            for (int64_t i = 0; i < r1 - r0; ++i) keys[i] = ~row_masks[part[i] * words + w];
            radix_sort(keys, &part);
          }
          std::copy(part.begin(), part.end(), rows.begin() + r0);
        }
      });
      std::copy(rows.begin(), rows.end(), order.data_ptr<int32_t>() + s * padded);
    }
    int64_t* tm = tile_masks.data_ptr<int64_t>() + s * tiles * words;
    at::parallel_for(0, tiles, 64, [&](int64_t begin, int64_t end) {
      for (int64_t t = begin; t < end; ++t)
        for (int64_t i = t * tile_rows; i < std::min(num_rows, (t + 1) * tile_rows); ++i)
          for (int64_t w = 0; w < words; ++w)
            tm[t * words + w] |= static_cast<int64_t>(row_masks[rows[i] * words + w]);
    });
  }
  return {bounds, order, tile_masks};
}

TORCH_LIBRARY_IMPL(torchsparse_pp, CPU, m) {
  m.impl("kmap_transpose", &kmap_transpose_cpu);
  m.impl("kmap_plan", &kmap_plan_cpu);
}

}  // namespace torchsparse_pp
