// Kernel maps on the CPU by hash lookup between any two coordinate sets (kmap_out_in), and the
// weight-stationary pairs view of any map (kmap_pairs).
#include <ATen/Parallel.h>
#include <immintrin.h>
#include <torch/library.h>

#include <algorithm>
#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "checks_cpu.h"
#include "cpu_features.h"
#include "hash_cpu.h"
#include "kmap_common.h"

namespace torchsparse_pp {

namespace {

// Axis inputs q*s - pad + t*d for every tap t of one output coordinate.
void axis_inputs(const KernelGeometry& g, const int32_t* q, int64_t (*p)[kMaxKernelAxis]) {
  for (int a = 0; a < 3; ++a)
    for (int64_t t = 0; t < g.k[a]; ++t) p[a][t] = g.input_of(a, q[1 + a], t);
}

}  // namespace

at::Tensor kmap_out_in_cpu(const at::Tensor& table_in, const at::Tensor& out_coords_in,
                           at::IntArrayRef kernel_size, at::IntArrayRef stride,
                           at::IntArrayRef dilation, at::IntArrayRef padding, int64_t pad_rows_to,
                           bool submanifold) {
  const auto table = table_view(table_in);
  const auto out_coords = checked_coords(out_coords_in, "out_coords");
  const auto g = make_geometry(kernel_size, stride, dilation, padding);
  TORCH_CHECK(!submanifold || is_centred_submanifold(g),
              "kmap_out_in: submanifold=True needs stride 1 and odd kernels with centred padding");
  const int64_t n_out = out_coords.size(0);
  const int64_t K = g.volume();
  auto out_in = at::full({padded_rows(n_out, pad_rows_to), K}, -1, out_coords.options());
  const int32_t* c = out_coords.data_ptr<int32_t>();
  int32_t* m = out_in.data_ptr<int32_t>();
  // A centred submanifold map is symmetric: q reads p through offset k exactly when p reads q
  // through offset K-1-k. So only offsets before the centre are looked up; the rest are mirrored,
  // and each mirrored cell has exactly one writer.
  const int64_t searched = submanifold ? K / 2 : K;
  std::atomic<bool> foreign_rows{false};
  at::parallel_for(0, n_out, 1024, [&](int64_t begin, int64_t end) {
    int64_t p[3][kMaxKernelAxis];
    for (int64_t row = begin; row < end; ++row) {
      const int32_t* q = c + 4 * row;
      axis_inputs(g, q, p);
      int32_t* dst = m + row * K;
      for (int64_t i = 0; i < g.k[0]; ++i)
        for (int64_t j = 0; j < g.k[1]; ++j)
          for (int64_t l = 0; l < g.k[2]; ++l) {
            const int64_t k = g.offset_index(i, j, l);
            if (k >= searched) continue;
            const int64_t b = q[0], x = p[0][i], y = p[1][j], z = p[2][l];
            // Neighbours outside the packable range cannot exist in the table.
            const int32_t found = coord_in_range(b, x, y, z)
                                      ? static_cast<int32_t>(table.find(pack_coord(b, x, y, z)))
                                      : -1;
            dst[k] = found;
            if (submanifold && found >= 0) {
              if (found >= n_out) {
                foreign_rows = true;
                continue;
              }
              m[found * K + (K - 1 - k)] = static_cast<int32_t>(row);
            }
          }
      if (submanifold) {
        // The centre reads the output itself; checking it proves out_coords is the table's set.
        const int64_t self = coord_in_range(q[0], q[1], q[2], q[3])
                                 ? table.find(pack_coord(q[0], q[1], q[2], q[3]))
                                 : -1;
        if (self != row) foreign_rows = true;
        dst[K / 2] = static_cast<int32_t>(row);
      }
    }
  });
  TORCH_CHECK(!foreign_rows.load(),
              "kmap_out_in: submanifold=True needs out_coords to be the coordinates the table holds, "
              "in the same order");
  return out_in;
}

namespace {

// Counts the pairs of map rows [r0, r1) per offset into `cnt` and returns the largest input row
// they read. With `masks` (K <= 64) it also keeps each row's present offsets as a bitmask, so
// that emitting visits only the cells that hold a pair. (Arguments by value: captured by
// reference, K and the pointers would be reloaded after every counter store.)
int32_t count_pairs(const int32_t* m, int64_t K, int64_t r0, int64_t r1, int64_t* cnt, uint64_t* masks) {
  int32_t largest = -1;
  for (int64_t r = r0; r < r1; ++r) {
    const int32_t* row = m + r * K;
    if (masks != nullptr) {
      uint64_t present = 0;
      for (int64_t k = 0; k < K; ++k) {
        present |= uint64_t(row[k] >= 0) << k;
        largest = std::max(largest, row[k]);
      }
      masks[r] = present;
      for (; present != 0; present &= present - 1) ++cnt[__builtin_ctzll(present)];
    } else {
      for (int64_t k = 0; k < K; ++k) {
        cnt[k] += row[k] >= 0;
        largest = std::max(largest, row[k]);
      }
    }
  }
  return largest;
}

// count_pairs for K <= 32 with AVX-512: a row is two vector loads, its present offsets one
// compare each, and the counters two vectors of lanes (no loop over the row's set bits, whose
// exit mispredicts). Lanes past K read as -1 (absent). (GCC 12 warns of the intrinsic headers'
// own undefined operands, _mm512_undefined_*, in it: silenced for this function.)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
TSPP_AVX512_TARGET int32_t count_pairs_avx512(const int32_t* m, int64_t K, int64_t r0, int64_t r1, int64_t* cnt,
                                              uint64_t* masks) {
  const __mmask16 low = K >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << K) - 1);
  const __mmask16 high = K > 16 ? __mmask16((1u << (K - 16)) - 1) : __mmask16(0);
  const __m512i absent = _mm512_set1_epi32(-1), zero = _mm512_setzero_si512(), one = _mm512_set1_epi32(1);
  __m512i c0 = zero, c1 = zero, largest = absent;
  for (int64_t r = r0; r < r1; ++r) {
    const int32_t* row = m + r * K;
    const __m512i a = _mm512_mask_loadu_epi32(absent, low, row);
    const __m512i b = _mm512_mask_loadu_epi32(absent, high, row + 16);
    const __mmask16 pa = _mm512_cmpge_epi32_mask(a, zero), pb = _mm512_cmpge_epi32_mask(b, zero);
    masks[r] = uint64_t(pa) | (uint64_t(pb) << 16);
    c0 = _mm512_mask_add_epi32(c0, pa, c0, one);
    c1 = _mm512_mask_add_epi32(c1, pb, c1, one);
    largest = _mm512_max_epi32(largest, _mm512_max_epi32(a, b));
  }
  alignas(64) int32_t lanes[32];
  _mm512_store_si512(lanes, c0);
  _mm512_store_si512(lanes + 16, c1);
  for (int64_t k = 0; k < K; ++k) cnt[k] += lanes[k];
  return _mm512_reduce_max_epi32(largest);
}
#pragma GCC diagnostic pop

// count_pairs for K <= 8 * Parts with AVX2: the same scheme in 8-lane vectors. Masked loads keep
// the last row's reads inside the table; their masked-off lanes read 0, so they are set to -1.
template <int Parts>
TSPP_AVX2_TARGET int32_t count_pairs_avx2(const int32_t* m, int64_t K, int64_t r0, int64_t r1, int64_t* cnt,
                                          uint64_t* masks) {
  const __m256i absent = _mm256_set1_epi32(-1), lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  __m256i load[Parts], outside[Parts], c[Parts], largest = absent;
  for (int j = 0; j < Parts; ++j) {
    load[j] = _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int32_t>(K - 8 * j)), lane);
    outside[j] = _mm256_xor_si256(load[j], absent);
    c[j] = _mm256_setzero_si256();
  }
  for (int64_t r = r0; r < r1; ++r) {
    const int32_t* row = m + r * K;
    uint64_t present = 0;
    for (int j = 0; j < Parts; ++j) {
      const __m256i v = _mm256_or_si256(_mm256_maskload_epi32(row + 8 * j, load[j]), outside[j]);
      const __m256i here = _mm256_cmpgt_epi32(v, absent);
      c[j] = _mm256_sub_epi32(c[j], here);  // a true lane is -1
      present |= uint64_t(static_cast<uint32_t>(_mm256_movemask_ps(_mm256_castsi256_ps(here)))) << (8 * j);
      largest = _mm256_max_epi32(largest, v);
    }
    masks[r] = present;
  }
  alignas(32) int32_t lanes[8 * Parts];
  for (int j = 0; j < Parts; ++j) _mm256_store_si256(reinterpret_cast<__m256i*>(lanes + 8 * j), c[j]);
  for (int64_t k = 0; k < K; ++k) cnt[k] += lanes[k];
  alignas(32) int32_t top[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(top), largest);
  return *std::max_element(top, top + 8);
}

// The vector pair counter this CPU runs for K <= 32 (TSPP_DISABLE_KMAP_AVX512=1 and
// TSPP_DISABLE_KMAP_AVX2=1 turn them off, for tests and comparisons).
enum class PairCounter { kScalar, kAvx2, kAvx512 };

PairCounter pair_counter() {
  static const PairCounter counter = [] {
    if (cpu_has_avx512(/*bf16=*/false) && !disabled_by_env("TSPP_DISABLE_KMAP_AVX512")) return PairCounter::kAvx512;
    if (cpu_has_avx2_fma() && !disabled_by_env("TSPP_DISABLE_KMAP_AVX2")) return PairCounter::kAvx2;
    return PairCounter::kScalar;
  }();
  return counter;
}

int32_t count_pairs_fastest(const int32_t* m, int64_t K, int64_t r0, int64_t r1, int64_t* cnt, uint64_t* masks) {
  if (K <= 32 && pair_counter() == PairCounter::kAvx512) return count_pairs_avx512(m, K, r0, r1, cnt, masks);
  if (K <= 32 && pair_counter() == PairCounter::kAvx2) {
    switch ((K + 7) / 8) {
      case 1: return count_pairs_avx2<1>(m, K, r0, r1, cnt, masks);
      case 2: return count_pairs_avx2<2>(m, K, r0, r1, cnt, masks);
      case 3: return count_pairs_avx2<3>(m, K, r0, r1, cnt, masks);
      default: return count_pairs_avx2<4>(m, K, r0, r1, cnt, masks);
    }
  }
  return count_pairs(m, K, r0, r1, cnt, masks);
}

// Writes the pairs of map rows [r0, r1), each offset's at its cursor in `pos`.
void emit_pairs(const int32_t* m, int64_t K, int64_t r0, int64_t r1, const uint64_t* masks, int64_t* pos,
                int32_t* in_idx, int32_t* out_idx) {
  for (int64_t r = r0; r < r1; ++r) {
    const int32_t* row = m + r * K;
    auto emit = [&](int64_t k) {
      in_idx[pos[k]] = row[k];
      out_idx[pos[k]] = static_cast<int32_t>(r);
      ++pos[k];
    };
    if (masks != nullptr) {
      for (uint64_t present = masks[r]; present != 0; present &= present - 1) emit(__builtin_ctzll(present));
    } else {
      for (int64_t k = 0; k < K; ++k)
        if (row[k] >= 0) emit(k);
    }
  }
}

}  // namespace

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> kmap_pairs_cpu(
    const at::Tensor& out_in_in, int64_t num_in, int64_t num_out) {
  check_pairs_arguments(out_in_in, num_in, num_out);
  const auto out_in = out_in_in.contiguous();
  const int64_t K = out_in.size(1);
  const int32_t* m = out_in.data_ptr<int32_t>();

  // Fixed row chunks make the pair order (offset, then output row) independent of threads.
  const int64_t chunk = std::max<int64_t>(256, (num_out + 255) / 256);
  const int64_t num_chunks = (num_out + chunk - 1) / chunk;
  // Chunks per thread: at least ~64K map cells each (a few tens of microseconds), since waking
  // a thread costs about as much as a small map's whole pass.
  const int64_t chunk_grain = std::max<int64_t>(1, (int64_t(1) << 16) / (chunk * K));
  std::vector<int64_t> counts(num_chunks * K, 0);
  std::unique_ptr<uint64_t[]> masks;
  if (K <= 64) masks = std::make_unique_for_overwrite<uint64_t[]>(num_out);
  std::atomic<bool> in_range{true};
  // Chunks hold at most 2^31 / 256 rows each, so the vector kernels' int32 lanes do not overflow.
  at::parallel_for(0, num_chunks, chunk_grain, [&](int64_t cb, int64_t ce) {
    for (int64_t ch = cb; ch < ce; ++ch) {
      const int64_t r0 = ch * chunk, r1 = std::min(num_out, (ch + 1) * chunk);
      int64_t* cnt = counts.data() + ch * K;
      const int32_t largest = count_pairs_fastest(m, K, r0, r1, cnt, masks.get());
      if (largest >= num_in) in_range = false;
    }
  });
  TORCH_CHECK(in_range.load(), "out_in holds input rows >= num_in (", num_in, ")");
  auto offsets = at::empty({K + 1}, out_in.options().dtype(at::kLong));
  int64_t* off = offsets.data_ptr<int64_t>();
  std::vector<int64_t> pos(num_chunks * K);
  int64_t total = 0;
  for (int64_t k = 0; k < K; ++k) {
    off[k] = total;
    for (int64_t ch = 0; ch < num_chunks; ++ch) {
      pos[ch * K + k] = total;
      total += counts[ch * K + k];
    }
  }
  off[K] = total;
  check_memory(total * 8, "the kernel map's pair lists (" + std::to_string(total) + " (input, output) pairs over " +
                              std::to_string(K) + " kernel offsets, int32)");
  auto in_idx = at::empty({total}, out_in.options());
  auto out_idx = at::empty({total}, out_in.options());
  int32_t* ii = in_idx.data_ptr<int32_t>();
  int32_t* oi = out_idx.data_ptr<int32_t>();
  at::parallel_for(0, num_chunks, chunk_grain, [&](int64_t cb, int64_t ce) {
    for (int64_t ch = cb; ch < ce; ++ch)
      emit_pairs(m, K, ch * chunk, std::min(num_out, (ch + 1) * chunk), masks.get(), pos.data() + ch * K, ii, oi);
  });

  // An offset whose pairs are (j, j) for every row needs no gather or scatter.
  auto identity = at::zeros({K}, out_in.options().dtype(at::kBool));
  bool* id = identity.data_ptr<bool>();
  for (int64_t k = 0; k < K; ++k) {
    if (num_in != num_out || off[k + 1] - off[k] != num_out || num_out == 0) continue;
    bool same = true;
    for (int64_t j = 0; j < num_out && same; ++j) same = ii[off[k] + j] == j;
    id[k] = same;
  }
  return {in_idx, out_idx, offsets, identity};
}

TORCH_LIBRARY_IMPL(torchsparse_pp, CPU, m) {
  m.impl("kmap_out_in", &kmap_out_in_cpu);
  m.impl("kmap_pairs", &kmap_pairs_cpu);
}

}  // namespace torchsparse_pp
