// Gather-GEMM-scatter dataflow on the CPU.
// Per offset: a parallel gather of the source rows, one ATen GEMM, and a parallel scatter-add.
// Within one offset every destination row appears at most once, so the scatter needs no atomics.
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <atomic>
#include <cstring>

namespace torchsparse_pp {

namespace {

void check_pairs(const at::Tensor& src_idx, const at::Tensor& dst_idx, const at::Tensor& offsets,
                 const at::Tensor& identity, int64_t K) {
  TORCH_CHECK(src_idx.scalar_type() == at::kInt && dst_idx.scalar_type() == at::kInt &&
                  src_idx.dim() == 1 && src_idx.sizes() == dst_idx.sizes(),
              "pair indices must be two int32 vectors of equal length");
  TORCH_CHECK(offsets.scalar_type() == at::kLong && offsets.dim() == 1 && offsets.size(0) == K + 1,
              "offsets must be an int64 vector of length K + 1 = ", K + 1, ", got ",
              offsets.sizes());
  TORCH_CHECK(identity.scalar_type() == at::kBool && identity.dim() == 1 && identity.size(0) == K,
              "identity must be a bool vector of length K = ", K);
  for (const auto* t : {&src_idx, &dst_idx, &offsets, &identity})
    TORCH_CHECK(t->device().is_cpu() && t->is_contiguous(),
                "pair tensors must be contiguous CPU tensors");
  const int64_t* off = offsets.data_ptr<int64_t>();
  TORCH_CHECK(off[0] == 0 && off[K] == src_idx.size(0), "offsets must start at 0 and end at the "
              "number of pairs (", src_idx.size(0), "), got ", off[0], " and ", off[K]);
  for (int64_t k = 0; k < K; ++k)
    TORCH_CHECK(off[k] <= off[k + 1], "offsets must be non-decreasing, got offsets[", k, "] = ",
                off[k], " > offsets[", k + 1, "] = ", off[k + 1]);
  // An identity offset skips gather and scatter, so its flag must really mean (j, j) for all j.
  const bool* id = identity.data_ptr<bool>();
  const int32_t* src = src_idx.data_ptr<int32_t>();
  const int32_t* dst = dst_idx.data_ptr<int32_t>();
  for (int64_t k = 0; k < K; ++k) {
    if (!id[k]) continue;
    for (int64_t j = off[k]; j < off[k + 1]; ++j)
      TORCH_CHECK(src[j] == j - off[k] && dst[j] == j - off[k], "identity[", k,
                  "] is set but offset ", k, " does not map every row j to row j");
  }
}

void check_feats(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.dim() == 2, name, " must be 2-D [N, C], got ", t.sizes());
  const auto st = t.scalar_type();
  TORCH_CHECK(st == at::kFloat || st == at::kDouble || st == at::kBFloat16, name,
              ": the CPU kernels support float32, float64 and bfloat16, got ", st);
}

// buf[i] = src[idx[i]]; returns false if an index is out of [0, n_src).
template <typename T>
bool gather_rows(const T* src, int64_t n_src, const int32_t* idx, int64_t n, int64_t c, T* buf) {
  std::atomic<bool> ok{true};
  at::parallel_for(0, n, 256, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const int64_t r = idx[i];
      if (r < 0 || r >= n_src) {
        ok = false;
        continue;
      }
      std::memcpy(buf + i * c, src + r * c, sizeof(T) * c);
    }
  });
  return ok;
}

// dst[idx[i]] += rows[i]; indices are unique within one call, so rows never collide.
template <typename T, typename Acc>
bool scatter_add_rows(const T* rows, const int32_t* idx, int64_t n, int64_t c, Acc* dst,
                      int64_t n_dst) {
  std::atomic<bool> ok{true};
  at::parallel_for(0, n, 256, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const int64_t r = idx[i];
      if (r < 0 || r >= n_dst) {
        ok = false;
        continue;
      }
      Acc* d = dst + r * c;
      const T* s = rows + i * c;
      for (int64_t j = 0; j < c; ++j) d[j] += static_cast<Acc>(s[j]);
    }
  });
  return ok;
}

}  // namespace

at::Tensor gather_scatter_forward_cpu(const at::Tensor& feats_in, const at::Tensor& weight_in,
                                      const at::Tensor& src_idx, const at::Tensor& dst_idx,
                                      const at::Tensor& offsets, const at::Tensor& identity,
                                      int64_t num_dst, bool transpose_weight) {
  check_feats(feats_in, "feats");
  TORCH_CHECK(weight_in.dim() == 3, "weight must be [K, C_in, C_out], got ", weight_in.sizes());
  TORCH_CHECK(weight_in.scalar_type() == feats_in.scalar_type(), "weight dtype ",
              weight_in.scalar_type(), " does not match feats dtype ", feats_in.scalar_type());
  const int64_t K = weight_in.size(0);
  check_pairs(src_idx, dst_idx, offsets, identity, K);
  const auto feats = feats_in.contiguous();
  const auto weight = weight_in.contiguous();
  const int64_t c_src = transpose_weight ? weight.size(2) : weight.size(1);
  const int64_t c_dst = transpose_weight ? weight.size(1) : weight.size(2);
  TORCH_CHECK(feats.size(1) == c_src, "feats have ", feats.size(1), " channels but the weight expects ",
              c_src);
  TORCH_CHECK(num_dst >= 0, "num_dst must be >= 0");
  const int64_t n_src = feats.size(0);
  const auto st = feats.scalar_type();
  const auto acc_type = st == at::kBFloat16 ? at::kFloat : st;
  const int64_t* off = offsets.data_ptr<int64_t>();
  const bool* is_identity = identity.data_ptr<bool>();
  auto offset_weight = [&](int64_t k) { return transpose_weight ? weight[k].t() : weight[k]; };
  auto check_identity = [&](int64_t n) {
    TORCH_CHECK(n == n_src && n_src == num_dst,
                "an identity offset needs as many pairs as sources and destinations");
  };
  int64_t max_pairs = 0, seed = -1;
  for (int64_t k = 0; k < K; ++k) {
    if (!is_identity[k]) max_pairs = std::max(max_pairs, off[k + 1] - off[k]);
    else if (seed < 0) seed = k;
  }
  // The identity offset's GEMM initialises the output, which saves zeroing it and one add pass.
  at::Tensor out;
  if (seed >= 0) {
    check_identity(off[seed + 1] - off[seed]);
    out = at::mm(feats, offset_weight(seed)).to(acc_type);
  } else {
    out = at::zeros({num_dst, c_dst}, feats.options().dtype(acc_type));
  }
  auto gathered = at::empty({max_pairs, c_src}, feats.options());
  auto product = at::empty({max_pairs, c_dst}, feats.options());
  bool ok = true;

  AT_DISPATCH_FLOATING_TYPES_AND(at::kBFloat16, st, "gather_scatter_forward_cpu", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    for (int64_t k = 0; k < K; ++k) {
      const int64_t n = off[k + 1] - off[k];
      if (n == 0 || k == seed) continue;
      const auto w = offset_weight(k);
      if (is_identity[k]) {
        check_identity(n);
        out.add_(at::mm(feats, w));
        continue;
      }
      auto g = gathered.narrow(0, 0, n);
      auto p = product.narrow(0, 0, n);
      ok = ok && gather_rows(feats.data_ptr<scalar_t>(), n_src, src_idx.data_ptr<int32_t>() + off[k],
                             n, c_src, g.data_ptr<scalar_t>());
      TORCH_CHECK(ok, "gather_scatter: a source index is out of range [0, ", n_src, ")");
      at::mm_out(p, g, w);
      ok = ok && scatter_add_rows(p.data_ptr<scalar_t>(), dst_idx.data_ptr<int32_t>() + off[k], n,
                                  c_dst, out.data_ptr<acc_t>(), num_dst);
      TORCH_CHECK(ok, "gather_scatter: a destination index is out of range [0, ", num_dst, ")");
    }
  });
  return acc_type == st ? out : out.to(st);
}

at::Tensor gather_scatter_wgrad_cpu(const at::Tensor& feats_in, const at::Tensor& grad_in,
                                    const at::Tensor& src_idx, const at::Tensor& dst_idx,
                                    const at::Tensor& offsets, const at::Tensor& identity) {
  check_feats(feats_in, "feats");
  check_feats(grad_in, "grad_out");
  TORCH_CHECK(feats_in.scalar_type() == grad_in.scalar_type(), "feats dtype ",
              feats_in.scalar_type(), " does not match grad_out dtype ", grad_in.scalar_type());
  const int64_t K = identity.size(0);
  check_pairs(src_idx, dst_idx, offsets, identity, K);
  const auto feats = feats_in.contiguous();
  const auto grad = grad_in.contiguous();
  const int64_t c_src = feats.size(1), c_dst = grad.size(1);
  const int64_t n_src = feats.size(0), n_dst = grad.size(0);
  auto dweight = at::zeros({K, c_src, c_dst}, feats.options());
  const int64_t* off = offsets.data_ptr<int64_t>();
  const bool* is_identity = identity.data_ptr<bool>();
  int64_t max_pairs = 0;
  for (int64_t k = 0; k < K; ++k)
    if (!is_identity[k]) max_pairs = std::max(max_pairs, off[k + 1] - off[k]);
  auto gathered_src = at::empty({max_pairs, c_src}, feats.options());
  auto gathered_dst = at::empty({max_pairs, c_dst}, feats.options());

  AT_DISPATCH_FLOATING_TYPES_AND(at::kBFloat16, feats.scalar_type(), "gather_scatter_wgrad_cpu", [&] {
    for (int64_t k = 0; k < K; ++k) {
      const int64_t n = off[k + 1] - off[k];
      if (n == 0) continue;
      auto dw = dweight[k];
      if (is_identity[k]) {
        TORCH_CHECK(n == n_src && n_src == n_dst,
                    "an identity offset needs as many pairs as sources and destinations");
        at::mm_out(dw, feats.t(), grad);
        continue;
      }
      auto a = gathered_src.narrow(0, 0, n);
      auto b = gathered_dst.narrow(0, 0, n);
      TORCH_CHECK(gather_rows(feats.data_ptr<scalar_t>(), n_src, src_idx.data_ptr<int32_t>() + off[k],
                              n, c_src, a.data_ptr<scalar_t>()),
                  "gather_scatter: a source index is out of range [0, ", n_src, ")");
      TORCH_CHECK(gather_rows(grad.data_ptr<scalar_t>(), n_dst, dst_idx.data_ptr<int32_t>() + off[k],
                              n, c_dst, b.data_ptr<scalar_t>()),
                  "gather_scatter: a destination index is out of range [0, ", n_dst, ")");
      at::mm_out(dw, a.t(), b);
    }
  });
  return dweight;
}

TORCH_LIBRARY_IMPL(torchsparse_pp, CPU, m) {
  m.impl("gather_scatter_forward", &gather_scatter_forward_cpu);
  m.impl("gather_scatter_wgrad", &gather_scatter_wgrad_cpu);
}

}  // namespace torchsparse_pp
