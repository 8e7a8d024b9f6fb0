// Kernel geometry shared by map construction on every device.
#pragma once

#include <cstdint>

#include "coords.h"

namespace torchsparse_pp {

// Per-axis kernel sizes are bounded so that per-point scratch lives on the stack.
constexpr int kMaxKernelAxis = 32;

struct KernelGeometry {
  int64_t k[3];    // kernel size per axis
  int64_t s[3];    // stride
  int64_t d[3];    // dilation
  int64_t pad[3];  // padding

  TSPP_HOST_DEVICE int64_t volume() const { return k[0] * k[1] * k[2]; }

  // Offset index of (i, j, l) with z fastest, as DESIGN.md fixes it.
  TSPP_HOST_DEVICE int64_t offset_index(int64_t i, int64_t j, int64_t l) const {
    return (i * k[1] + j) * k[2] + l;
  }

  // Input coordinate read by output q through kernel tap t on one axis: q*s - pad + t*d.
  TSPP_HOST_DEVICE int64_t input_of(int axis, int64_t q, int64_t t) const {
    return q * s[axis] - pad[axis] + t * d[axis];
  }
};

}  // namespace torchsparse_pp
