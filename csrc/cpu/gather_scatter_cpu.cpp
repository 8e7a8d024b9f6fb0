// Gather-GEMM-scatter dataflow on the CPU.
//
// Per offset: a parallel gather of the source rows into a buffer, one GEMM, and a parallel
// scatter-add. Within one offset every destination row appears at most once, so the scatter
// needs no atomics. Adaptive grouping (TorchSparse, MLSys'22) pads offsets of similar pair
// counts to one size and multiplies them with one batched GEMM.
//
// GEMMs go to ATen (MKL), whose summation order can change with the thread count. In
// deterministic mode they run as fixed row tiles, one thread per tile, and the weight gradient
// uses the fixed-order partial sums of the tiled dataflows.
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <torch/library.h>

#include <algorithm>
#include <type_traits>
#include <vector>

#include "../common/offset_groups.h"
#include "checks_cpu.h"
#include "pair_tiles.h"
#include "row_ops.h"

namespace torchsparse_pp {

namespace {

constexpr int64_t kDeterministicTileRows = 64;

// C[m, n] = A[m, k] B[k, n] as fixed 64-row tiles, each on one thread.
template <typename M>
void tiled_gemm(int64_t m, int64_t n, int64_t k, const M* A, const M* B, M* C) {
  parallel_items((m + kDeterministicTileRows - 1) / kDeterministicTileRows, [&](int64_t t) {
    const int64_t r0 = t * kDeterministicTileRows, rows = std::min(kDeterministicTileRows, m - r0);
    tile_gemm(rows, n, k, A + r0 * k, k, B, n, C + r0 * n, n, false);
  });
}

// Gathers and scatter-adds rows in parallel; rows at or beyond `valid` are padding (zeros).
template <typename T, typename G>
void gather_rows_parallel(const T* src, const int32_t* idx, int64_t valid, int64_t rows, int64_t c, G* buf) {
  at::parallel_for(0, rows, 256, [&](int64_t begin, int64_t end) {
    const int64_t copied = std::max<int64_t>(0, std::min(end, valid) - begin);
    if constexpr (std::is_same_v<T, G>) {
      gather_rows(src, idx + begin, copied, c, buf + begin * c);
    } else {
      // Deterministic bfloat16 gathers into float tiles.
      static_assert(std::is_same_v<T, c10::BFloat16> && std::is_same_v<G, float>);
      for (int64_t i = begin; i < begin + copied; ++i) widen_row(src + static_cast<int64_t>(idx[i]) * c, c, buf + i * c);
    }
    std::fill(buf + (begin + copied) * c, buf + end * c, G(0));
  });
}

// Within one offset every destination appears once, so chunks of pairs never share a row.
template <typename G, typename Acc>
void scatter_add_parallel(const G* rows, const int32_t* idx, int64_t n, int64_t c, Acc* dst) {
  at::parallel_for(0, n, 256, [&](int64_t begin, int64_t end) {
    scatter_add_rows(rows + begin * c, end - begin, c, idx + begin, dst);
  });
}

template <typename T, bool deterministic>
at::Tensor forward_impl(const at::Tensor& feats, const at::Tensor& weight, const at::Tensor& src_idx,
                        const at::Tensor& dst_idx, const at::Tensor& offsets,
                        const at::Tensor& identity, int64_t num_dst, bool transpose_weight,
                        double epsilon, int64_t mm_thresh) {
  using Acc = at::opmath_type<T>;
  // Buffers hold the input type for ATen GEMMs, the tile math type for deterministic tiles.
  using G = std::conditional_t<deterministic, typename TileMath<T>::type, T>;
  const auto buffer_type = c10::CppTypeToScalarType<G>::value;
  const int64_t K = weight.size(0);
  const auto w = deterministic ? tile_weight(weight, transpose_weight)
                               : (transpose_weight ? weight.transpose(1, 2) : weight);
  const int64_t c_src = w.size(1), c_dst = w.size(2);
  const int64_t* off = offsets.data_ptr<int64_t>();
  const bool* is_identity = identity.data_ptr<bool>();
  const auto groups =
      plan_offset_groups(off, K, [&](int64_t k) { return is_identity[k]; }, epsilon, mm_thresh);
  int64_t max_rows = 0;
  for (const auto& g : groups) max_rows = std::max<int64_t>(max_rows, g.rows * g.members.size());
  at::Tensor gathered = at::empty({max_rows, c_src}, feats.options().dtype(buffer_type));
  at::Tensor product = at::empty({max_rows, c_dst}, feats.options().dtype(buffer_type));
  const auto acc_type = c10::CppTypeToScalarType<Acc>::value;
  const int32_t* src = src_idx.data_ptr<int32_t>();
  const int32_t* dst = dst_idx.data_ptr<int32_t>();

  // Pairs (j, j) multiply the features as they are, without gather or scatter; the first such
  // product initialises the output.
  at::Tensor out;
  for (int64_t k = 0; k < K; ++k) {
    if (!is_identity[k] || off[k + 1] == off[k]) continue;
    at::Tensor prod;
    if constexpr (deterministic) {
      const at::Tensor rows = feats.to(buffer_type);
      prod = at::empty({num_dst, c_dst}, feats.options().dtype(buffer_type));
      tiled_gemm(num_dst, c_dst, c_src, rows.template data_ptr<G>(), w[k].template data_ptr<G>(),
                 prod.template data_ptr<G>());
    } else {
      prod = at::mm(feats, w[k]);
    }
    if (out.defined()) out.add_(prod);
    else out = prod.to(acc_type);
  }
  if (!out.defined()) out = at::zeros({num_dst, c_dst}, feats.options().dtype(acc_type));
  for (const auto& group : groups) {
    const int64_t L = group.rows, members = static_cast<int64_t>(group.members.size());
    for (int64_t j = 0; j < members; ++j) {
      const int64_t k = group.members[j];
      gather_rows_parallel(feats.data_ptr<T>(), src + off[k], off[k + 1] - off[k], L, c_src,
                           gathered.data_ptr<G>() + j * L * c_src);
    }
    at::Tensor g = gathered.narrow(0, 0, members * L);
    at::Tensor p = product.narrow(0, 0, members * L);
    if constexpr (deterministic) {
      for (int64_t j = 0; j < members; ++j)
        tiled_gemm(L, c_dst, c_src, g.template data_ptr<G>() + j * L * c_src,
                   w[group.members[j]].template data_ptr<G>(), p.template data_ptr<G>() + j * L * c_dst);
    } else if (members == 1) {
      at::mm_out(p, g, w[group.members[0]]);
    } else {
      auto index = at::tensor(group.members, offsets.options());
      auto batched = p.view({members, L, c_dst});
      at::bmm_out(batched, g.view({members, L, c_src}), w.index_select(0, index));
    }
    for (int64_t j = 0; j < members; ++j) {
      const int64_t k = group.members[j];
      scatter_add_parallel(p.template data_ptr<G>() + j * L * c_dst, dst + off[k], off[k + 1] - off[k], c_dst,
                           out.data_ptr<Acc>());
    }
  }
  return out.scalar_type() == feats.scalar_type() ? out : out.to(feats.scalar_type());
}

template <typename T>
at::Tensor wgrad_impl(const at::Tensor& feats, const at::Tensor& grad, const at::Tensor& src_idx,
                      const at::Tensor& dst_idx, const at::Tensor& offsets,
                      const at::Tensor& identity) {
  const int64_t K = identity.size(0), c_src = feats.size(1), c_dst = grad.size(1);
  at::Tensor dweight = at::zeros({K, c_src, c_dst}, feats.options());
  const int64_t* off = offsets.data_ptr<int64_t>();
  const bool* is_identity = identity.data_ptr<bool>();
  int64_t max_pairs = 0;
  for (int64_t k = 0; k < K; ++k)
    if (!is_identity[k]) max_pairs = std::max(max_pairs, off[k + 1] - off[k]);
  auto gathered_src = at::empty({max_pairs, c_src}, feats.options());
  auto gathered_dst = at::empty({max_pairs, c_dst}, feats.options());
  for (int64_t k = 0; k < K; ++k) {
    const int64_t n = off[k + 1] - off[k];
    if (n == 0) continue;
    auto dw = dweight[k];
    if (is_identity[k]) {
      at::mm_out(dw, feats.t(), grad);
      continue;
    }
    auto a = gathered_src.narrow(0, 0, n);
    auto b = gathered_dst.narrow(0, 0, n);
    gather_rows_parallel(feats.data_ptr<T>(), src_idx.data_ptr<int32_t>() + off[k], n, n, c_src, a.data_ptr<T>());
    gather_rows_parallel(grad.data_ptr<T>(), dst_idx.data_ptr<int32_t>() + off[k], n, n, c_dst, b.data_ptr<T>());
    at::mm_out(dw, a.t(), b);
  }
  return dweight;
}

}  // namespace

at::Tensor gather_scatter_forward_cpu(const at::Tensor& feats_in, const at::Tensor& weight_in,
                                      const at::Tensor& src_idx, const at::Tensor& dst_idx,
                                      const at::Tensor& offsets, const at::Tensor& identity,
                                      int64_t num_dst, bool transpose_weight, double epsilon,
                                      int64_t mm_thresh, bool deterministic) {
  check_feats(feats_in, "feats");
  check_weight(weight_in, feats_in, transpose_weight);
  check_pairs(src_idx, dst_idx, offsets, identity, weight_in.size(0), feats_in.size(0), num_dst);
  TORCH_CHECK(epsilon >= 0 && epsilon <= 1, "epsilon must be in [0, 1], got ", epsilon);
  TORCH_CHECK(mm_thresh >= 0, "mm_thresh must be >= 0, got ", mm_thresh);
  const auto feats = feats_in.contiguous();
  const auto weight = weight_in.contiguous();
  at::Tensor out;
  AT_DISPATCH_FLOATING_TYPES_AND(at::kBFloat16, feats.scalar_type(), "gather_scatter_forward_cpu", [&] {
    out = deterministic
              ? forward_impl<scalar_t, true>(feats, weight, src_idx, dst_idx, offsets, identity, num_dst,
                                             transpose_weight, epsilon, mm_thresh)
              : forward_impl<scalar_t, false>(feats, weight, src_idx, dst_idx, offsets, identity, num_dst,
                                              transpose_weight, epsilon, mm_thresh);
  });
  return out;
}

at::Tensor gather_scatter_wgrad_cpu(const at::Tensor& feats_in, const at::Tensor& grad_in,
                                    const at::Tensor& src_idx, const at::Tensor& dst_idx,
                                    const at::Tensor& offsets, const at::Tensor& identity,
                                    bool deterministic) {
  if (deterministic) return fetch_on_demand_wgrad_cpu(feats_in, grad_in, src_idx, dst_idx, offsets, identity);
  check_wgrad_operands(feats_in, grad_in);
  const int64_t K = identity.size(0);
  check_pairs(src_idx, dst_idx, offsets, identity, K, feats_in.size(0), grad_in.size(0));
  const auto feats = feats_in.contiguous();
  const auto grad = grad_in.contiguous();
  at::Tensor dweight;
  AT_DISPATCH_FLOATING_TYPES_AND(at::kBFloat16, feats.scalar_type(), "gather_scatter_wgrad_cpu", [&] {
    dweight = wgrad_impl<scalar_t>(feats, grad, src_idx, dst_idx, offsets, identity);
  });
  return dweight;
}

TORCH_LIBRARY_IMPL(torchsparse_pp, CPU, m) {
  m.impl("gather_scatter_forward", &gather_scatter_forward_cpu);
  m.impl("gather_scatter_wgrad", &gather_scatter_wgrad_cpu);
}

}  // namespace torchsparse_pp
