// Element types, compute paths and tile shapes shared by the tiled CUDA kernels (implicit GEMM,
// fetch-on-demand), their generated dispatch tables and the ATen wrappers. ATen-free.
#pragma once

namespace torchsparse_pp {
namespace gemm {

enum class DType { kHalf, kBFloat16, kFloat, kDouble };

// kDefault: tensor cores for fp16 / bf16 (float accumulators), SIMT for float32 / float64 (exact).
// kTF32: float32 on TF32 tensor cores, only when the user allows it.
enum class Math { kDefault, kTF32 };

// A tile shape of the generated table (tools/generate_kernels.py): CTA_M x CTA_N outputs, CTA_K
// per reduction step.
struct TileShape {
  int cta_m, cta_n, cta_k;
};

}  // namespace gemm
}  // namespace torchsparse_pp
