// Helpers shared by the CPU kernel-map builders.
#include "kmap_common.h"

#include <ATen/Parallel.h>

#include <atomic>
#include <string>

#include "hash_cpu.h"
#include "radix_sort.h"

namespace torchsparse_pp {

namespace {

// Rows per parallel chunk when packing: below this, one thread packs faster than two can be
// woken (packing costs about a nanosecond per row).
constexpr int64_t kPackGrain = 32768;

// Packs every row into `keys` (unless null) and says whether the keys are strictly increasing
// (sorted and unique: what coordinates made by the library are). False also when a row is out
// of range.
bool pack_strictly_increasing(const int32_t* c, int64_t n, uint64_t* keys) {
  std::atomic<bool> ascending{true};
  at::parallel_for(0, n, kPackGrain, [&](int64_t begin, int64_t end) {
    bool ok = true;
    // The row before the chunk, packed again so that chunks need not wait for each other.
    const int32_t* before = c + 4 * (begin - 1);
    int64_t prev = begin > 0 && coord_in_range(before[0], before[1], before[2], before[3])
                       ? pack_coord(before[0], before[1], before[2], before[3])
                       : -1;
    for (int64_t i = begin; i < end; ++i) {
      const int32_t* r = c + 4 * i;
      const bool in_range = coord_in_range(r[0], r[1], r[2], r[3]);
      const int64_t key = in_range ? pack_coord(r[0], r[1], r[2], r[3]) : kEmptyKey;
      ok = ok && in_range && key > prev;
      if (keys != nullptr) keys[i] = static_cast<uint64_t>(key);
      prev = key;
    }
    if (!ok) ascending = false;
  });
  return ascending.load();
}

}  // namespace

SortedCoords sort_coords_checked(const at::Tensor& coords) {
  const int64_t n = coords.size(0);
  TORCH_CHECK(n <= std::numeric_limits<int32_t>::max(),
              "at most 2^31-1 coordinates are supported, got ", n);
  SortedCoords out;
  // Coordinates made by the library arrive sorted and unique: one pass packs and proves it.
  out.keys.resize(n);
  const bool ascending = pack_strictly_increasing(coords.data_ptr<int32_t>(), n, out.keys.data());
  if (!ascending) {
    // Raises for the first row out of range; then sort and look for duplicates.
    const auto packed = pack_coords_cpu(coords, "coords");
    const int64_t* pk = packed.data_ptr<int64_t>();
    out.keys.assign(pk, pk + n);
  }
  out.rows.resize(n);
  for (int64_t i = 0; i < n; ++i) out.rows[i] = static_cast<int32_t>(i);
  if (ascending) return out;
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

void check_coords_unique(const at::Tensor& coords) {
  const int64_t n = coords.size(0);
  if (n > std::numeric_limits<int32_t>::max() || !pack_strictly_increasing(coords.data_ptr<int32_t>(), n, nullptr))
    sort_coords_checked(coords);  // raises, naming the offending rows, unless merely unsorted
}

}  // namespace torchsparse_pp
