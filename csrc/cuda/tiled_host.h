// Host helpers of the wrappers around the generated tiled kernels (implicit GEMM and
// fetch-on-demand): dtype / compute-path mapping, device attributes and tile choice. CUDA builds
// only. Device attributes are queried once per device and cached, so a call makes no driver query.
#pragma once

#include <ATen/ATen.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAMacros.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <mutex>

#include "gemm/types.h"

namespace torchsparse_pp {
namespace tiled {

using gemm::DType;
using gemm::Math;
using gemm::TileShape;

inline DType kernel_dtype(at::ScalarType st) {
  switch (st) {
    case at::kHalf: return DType::kHalf;
    case at::kBFloat16: return DType::kBFloat16;
    case at::kFloat: return DType::kFloat;
    case at::kDouble: return DType::kDouble;
    default: TORCH_CHECK(false, "the CUDA kernels support float16, bfloat16, float32 and float64, got ", st);
  }
}

// Accumulator partials: float, or double for float64 inputs.
inline at::ScalarType accumulator_dtype(at::ScalarType st) { return st == at::kDouble ? at::kDouble : at::kFloat; }

inline Math math_for(at::ScalarType st, bool allow_tf32) {
  return st == at::kFloat && allow_tf32 ? Math::kTF32 : Math::kDefault;
}

inline bool aligned16(const at::Tensor& t) { return reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0; }

// 16-byte vector loads need every row start aligned: channel counts multiples of 16 / element
// size and aligned base pointers.
inline bool wide_loads(const at::Tensor& a, const at::Tensor& b, int64_t c_a, int64_t c_b) {
  const int64_t vec = 16 / static_cast<int64_t>(a.element_size());
  return c_a % vec == 0 && c_b % vec == 0 && aligned16(a) && aligned16(b);
}

struct DeviceAttributes {
  int multiprocessors = 0;
  int major = 0;  // compute capability
};

// The attributes of a CUDA device, read on its first use (thread-safe) and kept.
inline const DeviceAttributes& device_attributes(const at::Device& device) {
  static std::array<std::once_flag, C10_COMPILE_TIME_MAX_GPUS> once;
  static std::array<DeviceAttributes, C10_COMPILE_TIME_MAX_GPUS> cached;
  const int index = device.index();
  TORCH_CHECK(device.is_cuda() && index >= 0 && index < C10_COMPILE_TIME_MAX_GPUS, "not a CUDA device: ", device);
  std::call_once(once[index], [&] {
    C10_CUDA_CHECK(cudaDeviceGetAttribute(&cached[index].multiprocessors, cudaDevAttrMultiProcessorCount, index));
    C10_CUDA_CHECK(cudaDeviceGetAttribute(&cached[index].major, cudaDevAttrComputeCapabilityMajor, index));
  });
  return cached[index];
}

inline int multiprocessor_count(const at::Device& device) { return device_attributes(device).multiprocessors; }

// cp.async, mma.sync m16n8k16 and TF32 need compute capability 8.0 (Ampere) or newer.
inline void check_architecture(const at::Device& device, const char* dataflow) {
  const int major = device_attributes(device).major;
  TORCH_CHECK(major >= 8, "the CUDA ", dataflow, " needs compute capability 8.0 or newer; ", device, " has ", major,
              ".x (use the gather_scatter dataflow there)");
}

inline cudaStream_t current_stream() { return c10::cuda::getCurrentCUDAStream().stream(); }

// A feature operand [N, C] of a supported dtype on `device` (`where` names what is there).
inline void check_operand(const at::Tensor& t, const char* name, const at::Device& device, const char* where) {
  TORCH_CHECK(t.dim() == 2, name, " must be 2-D [N, C], got ", t.sizes());
  TORCH_CHECK(t.device() == device, name, " is on ", t.device(), " but ", where, " on ", device);
  kernel_dtype(t.scalar_type());
}

// The weight [K, C_in, C_out] of a forward (or, with transpose_weight, W^T per offset for dgrad)
// as the kernels read it: contiguous [K, C_src, C_dst] (the weight is small: one copy keeps one
// kernel for both), checked against the features.
inline at::Tensor oriented_weight(const at::Tensor& weight, const at::Tensor& feats, bool transpose_weight,
                                  const char* where) {
  TORCH_CHECK(weight.dim() == 3, "weight must be [K, C_in, C_out], got ", weight.sizes());
  TORCH_CHECK(weight.device() == feats.device(), "weight is on ", weight.device(), " but ", where, " on ",
              feats.device());
  TORCH_CHECK(weight.scalar_type() == feats.scalar_type(), "weight dtype ", weight.scalar_type(),
              " does not match feats dtype ", feats.scalar_type());
  auto w = transpose_weight ? weight.transpose(1, 2).contiguous() : weight.contiguous();
  TORCH_CHECK(feats.size(1) == w.size(1), "feats have ", feats.size(1), " channels but the weight expects ",
              w.size(1));
  TORCH_CHECK(w.size(1) < (1 << 30) && w.size(2) <= (1 << 21), "channel counts must be below 2^30 (input) and "
              "2^21 (output: grid rows of at most 65535 tiles)");
  return w;
}

using TileShapes = int (*)(DType, Math, TileShape*, int);

// Tile choice from a generated table: the narrowest CTA_N that covers `cols` (else the widest),
// then the largest CTA_M that still gives two CTAs per SM over `rows`, else the smallest.
// k_multiple_of > 0 restricts to tiles whose K step divides it.
inline TileShape choose_tile(const at::Device& device, TileShapes tile_shapes, DType dtype, Math math, int64_t rows,
                             int64_t cols, int64_t k_multiple_of, int* index) {
  TileShape shapes[32];
  const int count = std::min(tile_shapes(dtype, math, shapes, 32), 32);
  TORCH_CHECK(count > 0, "no CUDA kernels were generated for this dtype and compute path");
  int widest = 0;
  for (int i = 0; i < count; ++i) widest = std::max(widest, shapes[i].cta_n);
  int want_n = widest;
  for (int i = 0; i < count; ++i)
    if (shapes[i].cta_n >= cols && shapes[i].cta_n < want_n) want_n = shapes[i].cta_n;
  const int64_t sms = multiprocessor_count(device);
  int largest_filling = -1, smallest = -1;
  for (int i = 0; i < count; ++i) {
    if (shapes[i].cta_n != want_n || (k_multiple_of > 0 && k_multiple_of % shapes[i].cta_k != 0)) continue;
    const int64_t ctas = (rows + shapes[i].cta_m - 1) / shapes[i].cta_m * ((cols + want_n - 1) / want_n);
    if (ctas >= 2 * sms && (largest_filling < 0 || shapes[i].cta_m > shapes[largest_filling].cta_m)) largest_filling = i;
    if (smallest < 0 || shapes[i].cta_m < shapes[smallest].cta_m) smallest = i;
  }
  const int best = largest_filling >= 0 ? largest_filling : smallest;
  TORCH_CHECK(best >= 0, "no tile fits (plan tile rows must be a multiple of the kernels' K step)");
  *index = best;
  return shapes[best];
}

}  // namespace tiled
}  // namespace torchsparse_pp
