// Downsampling maps with kernel == stride (power of two, dilation 1: MinkUNet's k2 s2) built on
// a bitmap of the output cells instead of a sort, when the outputs' bounding box is small next
// to the input count (the coarse levels of a scan).
#pragma once

#include <ATen/ATen.h>

#include <optional>
#include <tuple>

namespace torchsparse_pp {

// One axis of such a map: input p reaches q = (p + pad) >> shift through tap (p + pad) & mask;
// with range >= 0, only q in [0, range) is reached.
struct ShiftAxis {
  int64_t pad, shift, mask, range;
};

// Bitmap cells allowed per input, 1.5 bits each with the word ranks: 48 bytes per input at most,
// against the 32 the sort moves. On a scan's k2 s2 maps (Zen 3) the bitmap was 1.8-2.5x faster
// at 29 and 101 cells per input, 5-10 % faster at 388 and 2.5x slower at 1767.
constexpr int64_t kGridCellsPerInput = 256;

// (out_coords, out_in) as kmap_downsample returns them (outputs in canonical order), or nothing
// when the bitmap would be too large or an input or output falls outside the packable range
// (the caller's sort path handles, or rejects, those). Duplicate inputs raise.
std::optional<std::tuple<at::Tensor, at::Tensor>> downsample_on_grid(const at::Tensor& coords, const ShiftAxis (&axes)[3],
                                                                     int64_t ky, int64_t kz, int64_t K,
                                                                     int64_t pad_rows_to);

}  // namespace torchsparse_pp
