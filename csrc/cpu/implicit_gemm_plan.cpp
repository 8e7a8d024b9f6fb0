// Checks of the CPU implicit-GEMM plan (implicit_gemm_plan.h).
#include "implicit_gemm_plan.h"

#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <vector>

#include "cpu_features.h"
#include "pair_gemm.h"

namespace torchsparse_pp {

KmapPlan make_kmap_plan(const at::Tensor& bounds, const at::Tensor& order, const at::Tensor& tile_masks,
                        int64_t K, int64_t num_rows, int64_t tile_rows) {
  TORCH_CHECK(tile_rows >= 1, "tile_rows must be >= 1, got ", tile_rows);
  TORCH_CHECK(bounds.scalar_type() == at::kLong && bounds.dim() == 1 && bounds.size(0) >= 2 &&
                  bounds.is_contiguous(),
              "plan bounds must be an int64 vector [splits + 1] from kmap_plan");
  const int64_t splits = bounds.size(0) - 1;
  const int64_t* b = bounds.data_ptr<int64_t>();
  TORCH_CHECK(b[0] == 0 && b[splits] == K, "plan bounds must run from 0 to K = ", K);
  int64_t longest = 0;
  for (int64_t s = 0; s < splits; ++s) {
    TORCH_CHECK(b[s] < b[s + 1], "plan bounds must increase");
    longest = std::max(longest, b[s + 1] - b[s]);
  }
  const int64_t tiles = (num_rows + tile_rows - 1) / tile_rows;
  const int64_t words = (longest + 63) / 64;
  TORCH_CHECK(tile_masks.scalar_type() == at::kLong && tile_masks.is_contiguous() &&
                  tile_masks.sizes() == at::IntArrayRef({splits, tiles, words}),
              "plan tile masks must be int64 [splits, tiles, words] = [", splits, ", ", tiles, ", ",
              words, "], got ", tile_masks.sizes());
  const int32_t* ord = nullptr;
  if (order.numel() > 0) {
    TORCH_CHECK(order.scalar_type() == at::kInt && order.is_contiguous() &&
                    order.sizes() == at::IntArrayRef({splits, tiles * tile_rows}),
                "plan order must be int32 [splits, tiles * tile_rows], got ", order.sizes());
    // Each split's order must be a permutation of the rows, padded with -1.
    std::vector<char> seen(num_rows);
    for (int64_t s = 0; s < splits; ++s) {
      std::fill(seen.begin(), seen.end(), 0);
      const int32_t* o = order.data_ptr<int32_t>() + s * tiles * tile_rows;
      for (int64_t i = 0; i < tiles * tile_rows; ++i) {
        TORCH_CHECK(o[i] >= -1 && o[i] < num_rows && (o[i] < 0 || !seen[o[i]]),
                    "plan order must be a permutation of the rows");
        if (o[i] >= 0) seen[o[i]] = 1;
      }
      for (int64_t r = 0; r < num_rows; ++r)
        TORCH_CHECK(seen[r], "plan order misses row ", r);
    }
    ord = order.data_ptr<int32_t>();
  }
  return KmapPlan{splits, tiles, words, tile_rows, tiles * tile_rows, b, ord,
                  reinterpret_cast<const uint64_t*>(tile_masks.data_ptr<int64_t>()), num_rows};
}

namespace {

// Bit j set where table row `m` has a neighbour through offset k0 + j, for j < n <= 64.
TSPP_ROW_CLONES uint64_t present_bits(const int32_t* m, int64_t n) {
  uint64_t bits = 0;
  for (int64_t j = 0; j < n; ++j) bits |= static_cast<uint64_t>(m[j] >= 0) << j;
  return bits;
}

// present_bits by AVX-512 compares, 16 offsets at a time (every forward reads every table row:
// one bit at a time took ~1 ms per 90k-row, 27-offset map).
TSPP_AVX512_TARGET uint64_t present_bits_avx512(const int32_t* m, int64_t n) {
  uint64_t bits = 0;
  for (int64_t j = 0; j < n; j += 16) {
    const __mmask16 k = n - j >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << (n - j)) - 1u);
    const __m512i v = _mm512_maskz_loadu_epi32(k, m + j);
    bits |= uint64_t(_mm512_mask_cmpge_epi32_mask(k, v, _mm512_setzero_si512())) << j;
  }
  return bits;
}

// PresentBits (implicit_gemm_plan.h): one call per row group.
TSPP_ROW_CLONES void present_bits_rows(const int32_t* const* rows, int64_t count, int64_t k0, int64_t n,
                                       uint64_t* bits) {
  for (int64_t m = 0; m < count; ++m) bits[m] = rows[m] == nullptr ? 0 : present_bits(rows[m] + k0, n);
}
TSPP_AVX512_TARGET void present_bits_rows_avx512(const int32_t* const* rows, int64_t count, int64_t k0, int64_t n,
                                                 uint64_t* bits) {
  for (int64_t m = 0; m < count; ++m) bits[m] = rows[m] == nullptr ? 0 : present_bits_avx512(rows[m] + k0, n);
}

}  // namespace

PresentBits present_bits_function() {
  return register_isa() == RegisterIsa::kAvx512 ? present_bits_rows_avx512 : present_bits_rows;
}

const char* const kPlanMissesOffsets =
    "plan tile masks miss offsets that their rows have: the plan does not belong to this map (make it "
    "with kmap_plan on the same table)";

// A tile skips the offsets outside its mask: a mask that misses a neighbour one of its rows has
// would drop that term silently, so every present table entry must be covered. Per row and 64
// offsets: one word of present neighbours, which must lie within the tile's mask word. (The
// register forward's row groups check the same as they are built, so it skips this scan.)
void check_plan_covers_table(const KmapPlan& plan, const at::Tensor& table) {
  const int64_t K = table.size(1);
  const int32_t* map = table.data_ptr<int32_t>();
  std::atomic<bool> covered{true};
  const PresentBits bits_of = present_bits_function();
  at::parallel_for(0, plan.splits * plan.tiles, 64, [&](int64_t begin, int64_t end) {
    bool ok = true;
    for (int64_t st = begin; st < end; ++st) {
      const int64_t s = st / plan.tiles, t = st % plan.tiles, b0 = plan.bounds[s], b1 = plan.bounds[s + 1];
      const uint64_t* mask = plan.mask(s, t);
      for (int64_t i = 0; i < plan.tile_rows; ++i) {
        const int64_t r = plan.row(s, t * plan.tile_rows + i);
        const int32_t* row = r < 0 ? nullptr : map + r * K;
        for (int64_t k0 = b0; k0 < b1; k0 += 64) {
          uint64_t bits;
          bits_of(&row, 1, k0, std::min<int64_t>(64, b1 - k0), &bits);
          ok &= (bits & ~mask[(k0 - b0) / 64]) == 0;
        }
      }
    }
    if (!ok) covered = false;
  });
  TORCH_CHECK(covered.load(), kPlanMissesOffsets);
}

}  // namespace torchsparse_pp
