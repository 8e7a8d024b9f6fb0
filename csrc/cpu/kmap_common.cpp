// Helpers shared by the CPU kernel-map builders.
#include "kmap_common.h"

#include <string>

#include "hash_cpu.h"
#include "radix_sort.h"

namespace torchsparse_pp {

SortedCoords sort_coords_checked(const at::Tensor& coords) {
  const int64_t n = coords.size(0);
  TORCH_CHECK(n <= std::numeric_limits<int32_t>::max(),
              "at most 2^31-1 coordinates are supported, got ", n);
  const auto packed = pack_coords_cpu(coords, "coords");
  const int64_t* pk = packed.data_ptr<int64_t>();
  SortedCoords out{std::vector<uint64_t>(pk, pk + n), std::vector<int32_t>(n)};
  for (int64_t i = 0; i < n; ++i) out.rows[i] = static_cast<int32_t>(i);
  // Coordinates made by the library arrive sorted already.
  if (!std::is_sorted(out.keys.begin(), out.keys.end())) radix_sort(out.keys, &out.rows);
  for (int64_t i = 1; i < n; ++i) {
    if (out.keys[i] != out.keys[i - 1]) continue;
    const int32_t a = std::min(out.rows[i], out.rows[i - 1]), b = std::max(out.rows[i], out.rows[i - 1]);
    const int32_t* c = coords.data_ptr<int32_t>() + 4 * static_cast<int64_t>(b);
    TORCH_CHECK(false, "duplicate coordinate (", c[0], ", ", c[1], ", ", c[2], ", ", c[3], ") at rows ", a,
                " and ", b, ": the coordinates of a SparseTensor must be unique "
                "(torchsparse_pp.utils.sparse_quantize removes duplicates)");
  }
  return out;
}

}  // namespace torchsparse_pp
