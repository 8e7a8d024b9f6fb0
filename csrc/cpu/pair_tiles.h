// Tiled kernels over per-offset pair lists: the fetch-on-demand dataflow, and the deterministic
// weight gradient that gather-scatter also uses.
//
// Forward works block by block of destination rows. Within a block, each offset's pairs (a
// contiguous range, since pairs are sorted by destination within an offset) go chunk by chunk
// through thread-local tiles: gather the source rows, multiply by W[k], scatter-add into the
// block. The block stays in cache across all offsets, and its sources are spatial neighbours.
// Blocks own disjoint rows, so they run in parallel without atomics, and every row sums its
// offsets in one fixed order on any thread count. Tiles follow a tile policy (tile_policy.h):
// float math, or bfloat16 dot products where the CPU has them.
#pragma once

#include <ATen/ATen.h>

#include <algorithm>
#include <vector>

#include "pair_wgrad.h"
#include "tile_policy.h"

namespace torchsparse_pp {

// Rows per chunk: the gathered tile and its product stay within ~256 KiB (L2).
inline int64_t pair_chunk_rows(int64_t c_src, int64_t c_dst) {
  const int64_t rows = (int64_t(1) << 16) / std::max<int64_t>(1, c_src + c_dst);
  return std::clamp<int64_t>(rows / 16 * 16, 16, 1024);
}

// Destination rows per block: blocks of at most ~256 KiB of float output (it stays in L2 across
// the offsets, with room for the gathered rows: on a Zen 5's 1 MiB L2, 48-wide layers ran 3-9 %
// faster than with 512 KiB blocks, 128-wide ones 1 % slower), equal in size and as many as a
// multiple of the threads, so that no thread waits on a last odd block. Small outputs (coarse
// levels, small scenes) get up to kBlocksPerThread blocks per thread (1-3 blocks once left
// threads idle) while each keeps its work above kMinBlockMacs and kBlockMacsPerWeight x the
// weight, which every block reads whole.
constexpr int64_t kBlocksPerThread = 4;
constexpr int64_t kMinBlockMacs = int64_t(1) << 20;
constexpr int64_t kBlockMacsPerWeight = 256;
inline int64_t pair_block_rows(int64_t K, int64_t c_src, int64_t c_dst, int64_t num_dst, int64_t pairs) {
  const int64_t in_cache = std::clamp<int64_t>((int64_t(1) << 16) / std::max<int64_t>(1, c_dst), 64, 8192);
  if (num_dst < 1) return 1;
  const int64_t threads = at::get_num_threads();
  const int64_t macs = pairs * c_src * c_dst;
  const int64_t by_work = macs / std::max(kMinBlockMacs, kBlockMacsPerWeight * K * c_src * c_dst);
  int64_t blocks = std::max((num_dst + in_cache - 1) / in_cache, std::min(kBlocksPerThread * threads, by_work));
  if (blocks > 1 && blocks % threads) blocks += threads - blocks % threads;
  return std::max<int64_t>(16, (num_dst + blocks - 1) / blocks);
}

// What a forward adds to each finished block of output rows while it is still in cache:
// out = act(out + bias + residual) (an eval-time fused conv, BatchNorm folded into weight and bias).
struct Epilogue {
  at::Tensor bias;      // [C_dst] or undefined
  at::Tensor residual;  // [num_dst, C_dst] in the input dtype, or undefined
  bool relu = false;

  bool empty() const { return !bias.defined() && !residual.defined() && !relu; }
};

template <typename T, typename Acc>
void apply_epilogue(const Epilogue& e, Acc* rows, int64_t r0, int64_t count, int64_t n, const Acc* bias) {
  if (e.empty()) return;
  const T* residual = e.residual.defined() ? e.residual.data_ptr<T>() + r0 * n : nullptr;
  epilogue_rows(rows, count, n, bias, residual, e.relu);
}

template <typename T, typename Tiles>
at::Tensor pairs_forward_with(Tiles, const at::Tensor& feats, const at::Tensor& weight, const at::Tensor& src_idx,
                              const at::Tensor& dst_idx, const at::Tensor& offsets, const at::Tensor& identity,
                              int64_t num_dst, bool transpose_weight, const Epilogue& epilogue = {}) {
  using A = typename Tiles::A;
  using Acc = typename Tiles::Acc;
  const at::Tensor w = Tiles::weights(weight, transpose_weight);
  const int64_t K = weight.size(0);
  const int64_t c_src = weight.size(transpose_weight ? 2 : 1), c_dst = weight.size(transpose_weight ? 1 : 2);
  const int64_t k_len = Tiles::k_len(c_src);
  // bfloat16 inputs sum in float: each block sums in a float scratch and is narrowed into the
  // bfloat16 output while in cache (no float output in memory, no conversion pass after).
  constexpr bool narrow = !std::is_same_v<Acc, T>;
  const auto acc_type = c10::CppTypeToScalarType<Acc>::value;
  at::Tensor out = at::empty({num_dst, c_dst}, feats.options().dtype(narrow ? feats.scalar_type() : acc_type));
  const int64_t chunk = pair_chunk_rows(c_src, c_dst);
  const int64_t block = pair_block_rows(K, c_src, c_dst, num_dst, offsets.data_ptr<int64_t>()[K]);
  const T* f = feats.data_ptr<T>();
  const A* wp = w.data_ptr<A>();
  const at::Tensor bias = epilogue.bias.defined() ? epilogue.bias.to(acc_type).contiguous() : at::Tensor();
  const Acc* bias_p = bias.defined() ? bias.data_ptr<Acc>() : nullptr;
  const int32_t* src = src_idx.data_ptr<int32_t>();
  const int32_t* dst = dst_idx.data_ptr<int32_t>();
  const int64_t* off = offsets.data_ptr<int64_t>();
  const bool* is_identity = identity.data_ptr<bool>();
  // An identity offset initialises the output (it covers every row); it goes first.
  int64_t first = -1;
  for (int64_t k = 0; k < K && first < 0; ++k)
    if (is_identity[k] && off[k + 1] > off[k]) first = k;
  // With the register kernel no tile goes through memory: each offset's pairs of the block go
  // through it in one call.
  bool registers = false;
  if constexpr (kPairKernel<T, Tiles>) registers = pair_gemm_available();
  parallel_items((num_dst + block - 1) / block, [&](int64_t b) {
    const int64_t b0 = b * block, b1 = std::min(num_dst, b0 + block);
    // Rows b0..b1 of the sums are o[b0 * c_dst ..]: the output itself, or with `narrow` this
    // thread's float block (o is offset so that destination rows index it unchanged).
    Acc* o = nullptr;
    if constexpr (narrow) o = scratch<Acc, 2>(block * c_dst) - b0 * c_dst;
    else o = out.data_ptr<Acc>();
    const auto finish = [&] {
      if constexpr (narrow) {
        const T* residual = epilogue.residual.defined() ? epilogue.residual.data_ptr<T>() + b0 * c_dst : nullptr;
        epilogue_narrow_rows(o + b0 * c_dst, b1 - b0, c_dst, bias_p, residual, epilogue.relu,
                             out.data_ptr<T>() + b0 * c_dst);
      } else {
        apply_epilogue<T>(epilogue, o + b0 * c_dst, b0, b1 - b0, c_dst, bias_p);
      }
    };
    if constexpr (kPairKernel<T, Tiles>) {
      if (registers) {
        if (first >= 0) {
          const int64_t r = off[first] + b0;
          pair_gemm(b1 - b0, src + r, dst + r, f, c_src, c_src, wp + first * k_len * c_dst, c_dst, o, c_dst, false);
        } else {
          std::fill(o + b0 * c_dst, o + b1 * c_dst, Acc(0));
        }
        for (int64_t k = 0; k < K; ++k) {
          if (k == first) continue;
          const int32_t* lo = std::lower_bound(dst + off[k], dst + off[k + 1], static_cast<int32_t>(b0));
          const int32_t* hi = std::lower_bound(lo, dst + off[k + 1], static_cast<int32_t>(b1));
          pair_gemm(hi - lo, src + (lo - dst), lo, f, c_src, c_src, wp + k * k_len * c_dst, c_dst, o, c_dst, true);
        }
        finish();
        return;
      }
    }
    A* a = scratch<A, 0>(std::max(chunk, b1 - b0) * k_len);
    Acc* c = scratch<Acc, 1>(chunk * c_dst);
    if (first >= 0) {
      const A* rows = a;
      if constexpr (std::is_same_v<T, A>) {
        if (k_len == c_src) rows = f + b0 * c_src;
      }
      if (rows == a) Tiles::gather_rows(f, c_src, b1 - b0, [&](int64_t i) { return b0 + i; }, a, k_len);
      Tiles::gemm(b1 - b0, c_dst, k_len, rows, k_len, wp + first * k_len * c_dst, o + b0 * c_dst, c_dst, false);
    } else {
      std::fill(o + b0 * c_dst, o + b1 * c_dst, Acc(0));
    }
    for (int64_t k = 0; k < K; ++k) {
      if (k == first) continue;
      // This block's pairs of offset k: destinations are sorted within the offset.
      const int32_t* lo = std::lower_bound(dst + off[k], dst + off[k + 1], static_cast<int32_t>(b0));
      const int32_t* hi = std::lower_bound(lo, dst + off[k + 1], static_cast<int32_t>(b1));
      const int64_t r_begin = lo - dst, r_end = hi - dst;
      const A* wk = wp + k * k_len * c_dst;
      for (int64_t r0 = r_begin; r0 < r_end; r0 += chunk) {
        const int64_t rows = std::min(chunk, r_end - r0);
        Tiles::gather_rows(f, c_src, rows, [&](int64_t i) { return src[r0 + i]; }, a, k_len);
        Tiles::gemm(rows, c_dst, k_len, a, k_len, wk, c, c_dst, false);
        scatter_add_rows(c, rows, c_dst, dst + r0, o);
      }
    }
    finish();
  });
  return out;
}

template <typename T>
at::Tensor pairs_forward_tiled(const at::Tensor& feats, const at::Tensor& weight,
                               const at::Tensor& src_idx, const at::Tensor& dst_idx,
                               const at::Tensor& offsets, const at::Tensor& identity,
                               int64_t num_dst, bool transpose_weight, const Epilogue& epilogue = {}) {
  at::Tensor out;
  with_tiles<T>([&](auto tiles) {
    out = pairs_forward_with<T>(tiles, feats, weight, src_idx, dst_idx, offsets, identity, num_dst, transpose_weight,
                                epilogue);
  });
  return out;
}

template <typename T, typename Tiles>
at::Tensor pairs_wgrad_with(Tiles, const at::Tensor& feats, const at::Tensor& grad, const at::Tensor& src_idx,
                            const at::Tensor& dst_idx, const at::Tensor& offsets, int64_t K) {
  using A = typename Tiles::A;
  using Acc = typename Tiles::Acc;
  const auto math = c10::CppTypeToScalarType<Acc>::value;
  const int64_t c_src = feats.size(1), c_dst = grad.size(1);
  // bf16 tiles hold half the bytes per value: twice the rows fill the same cache.
  const int64_t chunk = pair_chunk_rows(c_src, c_dst) * (std::is_same_v<Tiles, Bf16DotTiles> ? 2 : 1);
  const int64_t* off = offsets.data_ptr<int64_t>();
  int64_t total_chunks = 0;
  for (int64_t k = 0; k < K; ++k) total_chunks += (off[k + 1] - off[k] + chunk - 1) / chunk;
  // Bound the partials to ~32 MiB by grouping more chunks per item when weights are large.
  const int64_t partial_bytes = c_src * c_dst * static_cast<int64_t>(sizeof(Acc));
  const int64_t per_item = std::max<int64_t>(2, (total_chunks * partial_bytes >> 25) + 1);
  struct Item {
    int64_t k, begin, end;  // pair range within the offset's list
  };
  std::vector<Item> items;
  std::vector<int64_t> first_item(K + 1);
  for (int64_t k = 0; k < K; ++k) {
    first_item[k] = static_cast<int64_t>(items.size());
    const int64_t n = off[k + 1] - off[k];
    for (int64_t r = 0; r < n; r += per_item * chunk) items.push_back({k, r, std::min(n, r + per_item * chunk)});
  }
  first_item[K] = static_cast<int64_t>(items.size());
  // Items run in order of their first destination row, offsets interleaved: threads sweep the
  // rows once with every offset's pairs of a region close together in time (the rows stay in
  // cache across offsets). Each item sums into its own partial, so the order changes no bits.
  std::vector<int64_t> order(items.size());
  for (size_t i = 0; i < items.size(); ++i) order[i] = static_cast<int64_t>(i);
  const int32_t* dst_all = dst_idx.data_ptr<int32_t>();
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
    return dst_all[off[items[a].k] + items[a].begin] < dst_all[off[items[b].k] + items[b].begin];
  });
  at::Tensor partials = at::empty({static_cast<int64_t>(items.size()), c_src, c_dst}, feats.options().dtype(math));
  const T* f = feats.data_ptr<T>();
  const T* g = grad.data_ptr<T>();
  Acc* part = partials.data_ptr<Acc>();
  // Float32, and bfloat16 with the bf16 dot product, by the register kernels: no transposed tile
  // is gathered (pair_wgrad.h).
  constexpr bool kFloatWgrad = std::is_same_v<T, float> && std::is_same_v<Tiles, FloatTiles<float>>;
  constexpr bool kRegisterWgrad = kFloatWgrad || std::is_same_v<Tiles, Bf16DotTiles>;
  bool registers = false;
  if constexpr (kFloatWgrad) registers = pair_gemm_available() && pair_wgrad_pays(c_src, c_dst);
  else if constexpr (kRegisterWgrad) registers = pair_gemm_available() && bf16_pair_wgrad_pays(c_src, c_dst);
  parallel_items(static_cast<int64_t>(items.size()), [&](int64_t next) {
    const int64_t it = order[next];
    const Item item = items[it];
    const int32_t* src = src_idx.data_ptr<int32_t>() + off[item.k];
    const int32_t* dst = dst_idx.data_ptr<int32_t>() + off[item.k];
    if constexpr (kRegisterWgrad) {
      if (registers) {
        for (int64_t r0 = item.begin; r0 < item.end; r0 += chunk)
          pair_wgrad(std::min(chunk, item.end - r0), src + r0, dst + r0, f, c_src, g, c_dst,
                     part + it * c_src * c_dst, r0 != item.begin);
        return;
      }
    }
    // The transposed tile's rows are padded off a power of two: a 4 KiB stride would map
    // every column write of one source row to the same L1 set.
    const int64_t ld = Tiles::k_len(chunk) + 16;
    A* a_t = scratch<A, 0>(c_src * ld);
    A* b = scratch<A, 1>(Tiles::k_len(chunk) * c_dst);
    Acc* p = part + it * c_src * c_dst;
    for (int64_t r0 = item.begin; r0 < item.end; r0 += chunk) {
      const int64_t rows = std::min(chunk, item.end - r0);
      Tiles::gather_rows_t(f, c_src, rows, [&](int64_t i) { return src[r0 + i]; }, a_t, ld);
      Tiles::gather_rhs(g, c_dst, rows, [&](int64_t i) { return dst[r0 + i]; }, b);
      Tiles::gemm_t(1, c_src, c_dst, Tiles::k_len(rows), a_t, ld, b, p, c_dst, r0 != item.begin);
    }
  });
  at::Tensor dweight = at::zeros({K, c_src, c_dst}, feats.options().dtype(math));
  Acc* dw = dweight.data_ptr<Acc>();
  at::parallel_for(0, K, 1, [&](int64_t kb, int64_t ke) {
    for (int64_t k = kb; k < ke; ++k)
      for (int64_t it = first_item[k]; it < first_item[k + 1]; ++it) {
        const Acc* p = part + it * c_src * c_dst;
        Acc* d = dw + k * c_src * c_dst;
        for (int64_t j = 0; j < c_src * c_dst; ++j) d[j] += p[j];
      }
  });
  return dweight.scalar_type() == feats.scalar_type() ? dweight : dweight.to(feats.scalar_type());
}

// dW[k] = feats[src]^T grad[dst] over the pairs of offset k. Work items are fixed groups of
// consecutive chunks of one offset; each sums into its own partial in chunk order, and the
// partials are added in item order, so the result does not depend on the thread count.
template <typename T>
at::Tensor pairs_wgrad_tiled(const at::Tensor& feats, const at::Tensor& grad,
                             const at::Tensor& src_idx, const at::Tensor& dst_idx,
                             const at::Tensor& offsets, int64_t K) {
  at::Tensor dweight;
  with_tiles<T>([&](auto tiles) { dweight = pairs_wgrad_with<T>(tiles, feats, grad, src_idx, dst_idx, offsets, K); });
  return dweight;
}

// The fetch_on_demand weight-gradient op (checks, then pairs_wgrad_tiled); gather_scatter's
// deterministic weight gradient is the same computation.
at::Tensor fetch_on_demand_wgrad_cpu(const at::Tensor& feats_in, const at::Tensor& grad_in,
                                     const at::Tensor& src_idx, const at::Tensor& dst_idx,
                                     const at::Tensor& offsets, const at::Tensor& identity);

}  // namespace torchsparse_pp
