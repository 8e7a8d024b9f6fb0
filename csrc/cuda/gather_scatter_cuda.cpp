// Gather-GEMM-scatter dataflow on CUDA: checks, buffers, and cuBLAS GEMMs through ATen around
// the gather and scatter kernels of gather_scatter.cu.
//
// Per offset: gather the source rows into a contiguous buffer, one at::mm (or one at::bmm per
// adaptive group), scatter-add the products into the output by destination. Offsets run one
// after another on the current stream, and within one offset every destination appears at most
// once, so the scatter needs no atomics: stream order separates the offsets, and inside one
// launch no two threads write the same output element.
//
// The loop over offsets runs on the host, so it needs the per-offset pair counts and identity
// flags there. The library passes the host copies it keeps beside each pair view (offsets and
// identity as CPU tensors): then a call reads nothing back from the device and never
// synchronises. Given on the device, they are copied back (one synchronising read). Index values
// are not checked per call: the library validates a pair view once when it builds it
// (torchsparse_pp/ops/validate.py), and `backends.validate_plans = True` makes the Python
// wrappers validate before every call.
//
// Deterministic by construction: the offsets' order, the group shapes and every kernel's
// work split depend only on the map, no kernel uses atomics on data, and cuBLAS returns
// bit-identical results for fixed shapes on one stream and GPU model. The `deterministic` flag
// therefore needs nothing here. (Running convs on several streams that share a cuBLAS handle
// needs CUBLAS_WORKSPACE_CONFIG=:4096:8, as torch's reproducibility notes say.)
#include <ATen/ATen.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <algorithm>
#include <vector>

#include "../common/offset_groups.h"
#include "../cpu/checks_cpu.h"
#include "../cpu/kmap_common.h"
#include "gather_scatter.h"

namespace torchsparse_pp {

namespace {

namespace kernels = gather_scatter_kernels;

void check_feats_cuda(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.dim() == 2, name, " must be 2-D [N, C], got ", t.sizes());
  TORCH_CHECK(t.is_cuda(), name, " must be a CUDA tensor for this kernel, got one on ", t.device());
  check_rows(t.size(0), name);
  const auto st = t.scalar_type();
  TORCH_CHECK(st == at::kFloat || st == at::kDouble || st == at::kHalf || st == at::kBFloat16, name,
              ": the CUDA kernels support float32, float64, float16 and bfloat16, got ", st);
}

void check_same_device(const at::Tensor& t, const char* name, const at::Tensor& feats) {
  TORCH_CHECK(t.device() == feats.device(), name, " is on ", t.device(), " but feats are on ", feats.device());
}

// Offsets and identity flags on the host.
struct HostPairs {
  std::vector<int64_t> offsets;  // K + 1
  std::vector<bool> identity;    // K
};

// Shapes, dtypes and devices of the pairs; the offsets and identity flags on the host (read
// directly from CPU tensors, else copied back from the device), checked so that the host loop
// stays within the pair lists whatever the tensors hold.
HostPairs host_pairs(const at::Tensor& src_idx, const at::Tensor& dst_idx, const at::Tensor& offsets,
                     const at::Tensor& identity, int64_t K, int64_t num_src, int64_t num_dst,
                     const at::Device& device) {
  TORCH_CHECK(src_idx.scalar_type() == at::kInt && dst_idx.scalar_type() == at::kInt &&
                  src_idx.dim() == 1 && src_idx.sizes() == dst_idx.sizes(),
              "pair indices must be two int32 vectors of equal length");
  TORCH_CHECK(offsets.scalar_type() == at::kLong && offsets.dim() == 1 && offsets.size(0) == K + 1,
              "offsets must be an int64 vector of length K + 1 = ", K + 1, ", got ", offsets.sizes());
  TORCH_CHECK(identity.scalar_type() == at::kBool && identity.dim() == 1 && identity.size(0) == K,
              "identity must be a bool vector of length K = ", K);
  for (const auto* t : {&src_idx, &dst_idx})
    TORCH_CHECK(t->device() == device && t->is_contiguous(),
                "pair tensors must be contiguous tensors on the feats' device (", device, "), got one on ",
                t->device());
  for (const auto* t : {&offsets, &identity})
    TORCH_CHECK(t->device() == device || t->device().is_cpu(),
                "offsets and identity must be on the feats' device (", device, ") or host copies on the CPU, "
                "got one on ", t->device());
  TORCH_CHECK(num_dst >= 0, "num_dst must be >= 0, got ", num_dst);
  check_rows(num_src, "the source (num_src)");
  check_rows(num_dst, "the destination (num_dst)");

  const at::Tensor host = at::cat({offsets.cpu(), identity.cpu().to(at::kLong)});
  const int64_t* off = host.data_ptr<int64_t>();
  const int64_t* id = off + K + 1;
  const int64_t num_pairs = src_idx.size(0);
  // Same order and messages as the CPU's check_pairs.
  TORCH_CHECK(off[0] == 0 && off[K] == num_pairs, "offsets must start at 0 and end at the number of pairs (",
              num_pairs, "), got ", off[0], " and ", off[K]);
  for (int64_t k = 0; k < K; ++k)
    TORCH_CHECK(off[k] <= off[k + 1], "offsets must be non-decreasing, got offsets[", k, "] = ", off[k],
                " > offsets[", k + 1, "] = ", off[k + 1]);
  for (int64_t k = 0; k < K; ++k)
    TORCH_CHECK(!id[k] || (off[k + 1] - off[k] == num_src && num_src == num_dst), "identity[", k,
                "] is set but offset ", k, " does not pair all ", num_src, " sources with as many destinations");

  HostPairs pairs;
  pairs.offsets.assign(off, off + K + 1);
  pairs.identity.resize(K);
  for (int64_t k = 0; k < K; ++k) pairs.identity[k] = id[k] != 0;
  return pairs;
}

kernels::ScatterTypes scatter_types(at::ScalarType st) {
  switch (st) {
    case at::kFloat: return kernels::ScatterTypes::kFloat32;
    case at::kDouble: return kernels::ScatterTypes::kFloat64;
    case at::kHalf: return kernels::ScatterTypes::kFloat16ToFloat32;
    case at::kBFloat16: return kernels::ScatterTypes::kBFloat16ToFloat32;
    default: break;
  }
  TORCH_CHECK(false, "gather_scatter on CUDA: unsupported dtype ", st);
}

// Row `row` of a contiguous 2-D tensor as a raw pointer (64-bit byte offset).
char* row_ptr(const at::Tensor& t, int64_t row) {
  return static_cast<char*>(t.data_ptr()) + row * t.size(1) * static_cast<int64_t>(t.element_size());
}

void gather_rows_into(const at::Tensor& src, const int32_t* idx, int64_t valid, int64_t rows, const at::Tensor& buf,
            int64_t buf_row, cudaStream_t stream) {
  const int64_t row_bytes = src.size(1) * static_cast<int64_t>(src.element_size());
  C10_CUDA_CHECK(kernels::launch_gather_rows(src.data_ptr(), idx, valid, rows, row_bytes, row_ptr(buf, buf_row),
                                             stream));
}

}  // namespace

at::Tensor gather_scatter_forward_cuda(const at::Tensor& feats_in, const at::Tensor& weight_in,
                                       const at::Tensor& src_idx, const at::Tensor& dst_idx,
                                       const at::Tensor& offsets, const at::Tensor& identity, int64_t num_dst,
                                       bool transpose_weight, double epsilon, int64_t mm_thresh,
                                       bool deterministic) {
  // `deterministic` asks for run-to-run bit-identical results; this dataflow gives them on
  // CUDA with or without it (see the top of this file), so the flag selects nothing.
  (void)deterministic;
  check_feats_cuda(feats_in, "feats");
  check_weight(weight_in, feats_in, transpose_weight);
  check_same_device(weight_in, "weight", feats_in);
  TORCH_CHECK(epsilon >= 0 && epsilon <= 1, "epsilon must be in [0, 1], got ", epsilon);
  TORCH_CHECK(mm_thresh >= 0, "mm_thresh must be >= 0, got ", mm_thresh);
  const c10::cuda::CUDAGuard guard(feats_in.device());
  const int64_t K = weight_in.size(0);
  const HostPairs pairs =
      host_pairs(src_idx, dst_idx, offsets, identity, K, feats_in.size(0), num_dst, feats_in.device());

  const at::Tensor feats = feats_in.contiguous();
  const at::Tensor weight = weight_in.contiguous();
  const at::Tensor w = transpose_weight ? weight.transpose(1, 2) : weight;
  const int64_t c_src = w.size(1), c_dst = w.size(2);
  const auto& off = pairs.offsets;
  // fp16 / bf16 products are summed in float32 and rounded once at the end: 27 half-precision
  // additions per row would lose several bits.
  const bool widen = feats.scalar_type() == at::kHalf || feats.scalar_type() == at::kBFloat16;
  const auto acc_type = widen ? at::kFloat : feats.scalar_type();
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();

  // Pairs (j, j) multiply the features as they are, without gather or scatter; the first such
  // product initialises the output.
  at::Tensor out;
  for (int64_t k = 0; k < K; ++k) {
    if (!pairs.identity[k] || off[k + 1] == off[k]) continue;
    at::Tensor prod = at::mm(feats, w[k]);
    if (out.defined()) out.add_(prod);
    else out = widen ? prod.to(at::kFloat) : prod;
  }
  if (!out.defined()) out = at::zeros({num_dst, c_dst}, feats.options().dtype(acc_type));

  const auto groups = plan_offset_groups(off.data(), static_cast<int64_t>(pairs.identity.size()),
                                         [&](int64_t k) { return bool(pairs.identity[k]); }, epsilon, mm_thresh);
  int64_t max_rows = 0;
  for (const auto& g : groups) max_rows = std::max<int64_t>(max_rows, g.rows * static_cast<int64_t>(g.members.size()));
  const at::Tensor gathered = at::empty({max_rows, c_src}, feats.options());
  const at::Tensor product = at::empty({max_rows, c_dst}, feats.options());
  const int32_t* src = src_idx.data_ptr<int32_t>();
  const int32_t* dst = dst_idx.data_ptr<int32_t>();
  const auto types = scatter_types(feats.scalar_type());

  for (const auto& group : groups) {
    const int64_t L = group.rows, members = static_cast<int64_t>(group.members.size());
    for (int64_t j = 0; j < members; ++j) {
      const int64_t k = group.members[j];
      gather_rows_into(feats, src + off[k], off[k + 1] - off[k], L, gathered, j * L, stream);
    }
    const at::Tensor g = gathered.narrow(0, 0, members * L);
    at::Tensor p = product.narrow(0, 0, members * L);
    if (members == 1) {
      at::mm_out(p, g, w[group.members[0]]);
    } else {
      // The members' weights stacked on the device (an index tensor would need a host-to-device
      // copy, which synchronises with pageable memory and cannot be captured in a CUDA graph).
      std::vector<at::Tensor> member_weights;
      for (const int64_t k : group.members) member_weights.push_back(w[k]);
      at::Tensor batched = p.view({members, L, c_dst});
      at::bmm_out(batched, g.view({members, L, c_src}), at::stack(member_weights));
    }
    for (int64_t j = 0; j < members; ++j) {
      const int64_t k = group.members[j];
      C10_CUDA_CHECK(kernels::launch_scatter_add_rows(row_ptr(p, j * L), types, dst + off[k], off[k + 1] - off[k],
                                                      c_dst, out.data_ptr(), stream));
    }
  }
  return widen ? out.to(feats.scalar_type()) : out;
}

at::Tensor gather_scatter_wgrad_cuda(const at::Tensor& feats_in, const at::Tensor& grad_in,
                                     const at::Tensor& src_idx, const at::Tensor& dst_idx,
                                     const at::Tensor& offsets, const at::Tensor& identity, bool deterministic) {
  // Deterministic by construction, as the forward (one at::mm per offset, in offset order).
  (void)deterministic;
  check_feats_cuda(feats_in, "feats");
  check_feats_cuda(grad_in, "grad_out");
  TORCH_CHECK(feats_in.scalar_type() == grad_in.scalar_type(), "feats dtype ", feats_in.scalar_type(),
              " does not match grad_out dtype ", grad_in.scalar_type());
  check_same_device(grad_in, "grad_out", feats_in);
  TORCH_CHECK(identity.dim() == 1, "identity must be a bool vector of length K, got shape ", identity.sizes());
  const c10::cuda::CUDAGuard guard(feats_in.device());
  const int64_t K = identity.size(0);
  const HostPairs pairs =
      host_pairs(src_idx, dst_idx, offsets, identity, K, feats_in.size(0), grad_in.size(0), feats_in.device());

  const at::Tensor feats = feats_in.contiguous();
  const at::Tensor grad = grad_in.contiguous();
  const int64_t c_src = feats.size(1), c_dst = grad.size(1);
  const auto& off = pairs.offsets;
  at::Tensor dweight = at::zeros({K, c_src, c_dst}, feats.options());
  int64_t max_pairs = 0;
  for (int64_t k = 0; k < K; ++k)
    if (!pairs.identity[k]) max_pairs = std::max(max_pairs, off[k + 1] - off[k]);
  const at::Tensor gathered_src = at::empty({max_pairs, c_src}, feats.options());
  const at::Tensor gathered_dst = at::empty({max_pairs, c_dst}, feats.options());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();

  // dW[k] = gather(feats, src)^T @ gather(grad, dst); identity offsets use the rows as they are.
  for (int64_t k = 0; k < K; ++k) {
    const int64_t n = off[k + 1] - off[k];
    if (n == 0) continue;
    at::Tensor dw = dweight[k];
    if (pairs.identity[k]) {
      at::mm_out(dw, feats.t(), grad);
      continue;
    }
    gather_rows_into(feats, src_idx.data_ptr<int32_t>() + off[k], n, n, gathered_src, 0, stream);
    gather_rows_into(grad, dst_idx.data_ptr<int32_t>() + off[k], n, n, gathered_dst, 0, stream);
    at::mm_out(dw, gathered_src.narrow(0, 0, n).t(), gathered_dst.narrow(0, 0, n));
  }
  return dweight;
}

TORCH_LIBRARY_IMPL(torchsparse_pp, CUDA, m) {
  m.impl("gather_scatter_forward", &gather_scatter_forward_cuda);
  m.impl("gather_scatter_wgrad", &gather_scatter_wgrad_cuda);
}

}  // namespace torchsparse_pp
