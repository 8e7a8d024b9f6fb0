// Helpers shared by the tiled CPU dataflows.
#include "tile_gemm.h"

namespace torchsparse_pp {

at::Tensor tile_weight(const at::Tensor& weight, bool transpose) {
  const auto math = weight.scalar_type() == at::kBFloat16 ? at::kFloat : weight.scalar_type();
  auto w = transpose ? weight.transpose(1, 2) : weight;
  return w.to(math).contiguous();
}

}  // namespace torchsparse_pp
