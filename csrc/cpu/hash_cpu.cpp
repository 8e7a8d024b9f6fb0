// Exact coordinate hash table on the CPU: build and query, parallel over rows.
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <limits>
#include <string>

#include "hash_cpu.h"
#include "kmap_common.h"

namespace torchsparse_pp {

namespace {

constexpr int64_t kNoRow = std::numeric_limits<int64_t>::max();

std::string row_string(const int32_t* c) {
  return "(" + std::to_string(c[0]) + ", " + std::to_string(c[1]) + ", " + std::to_string(c[2]) +
         ", " + std::to_string(c[3]) + ")";
}

}  // namespace

at::Tensor empty_table(int64_t n, const at::TensorOptions& options) {
  TORCH_CHECK(n <= std::numeric_limits<int32_t>::max(),
              "coordinate hash table: at most 2^31-1 coordinates are supported, got ", n);
  return at::full({hash_capacity_for(n), 2}, kEmptyKey, options.dtype(at::kLong));
}

CoordHashView table_view(const at::Tensor& table) {
  const int64_t cap = table.dim() == 2 ? table.size(0) : 0;
  TORCH_CHECK(table.scalar_type() == at::kLong && table.dim() == 2 && table.size(1) == 2 &&
                  table.is_contiguous() && cap >= 16 && (cap & (cap - 1)) == 0,
              "the hash table must be the [capacity, 2] int64 tensor that hash_build returns");
  return CoordHashView{table.data_ptr<int64_t>(), cap};
}

at::Tensor checked_coords(const at::Tensor& coords, const char* name) {
  TORCH_CHECK(coords.scalar_type() == at::kInt, name, " must be int32 (batch, x, y, z), got ",
              coords.scalar_type());
  TORCH_CHECK(coords.dim() == 2 && coords.size(1) == 4, name,
              " must have shape [N, 4] (batch, x, y, z), got ", coords.sizes());
  TORCH_CHECK(coords.device().is_cpu(), name, " must be on the CPU for this kernel");
  check_rows(coords.size(0), name);  // before the copy: an expanded view past the limit would allocate first
  return coords.contiguous();
}

at::Tensor pack_coords_cpu(const at::Tensor& coords, const char* name) {
  const int64_t n = coords.size(0);
  auto packed = at::empty({n}, coords.options().dtype(at::kLong));
  const int32_t* c = coords.data_ptr<int32_t>();
  int64_t* p = packed.data_ptr<int64_t>();
  std::atomic<int64_t> bad{kNoRow};
  at::parallel_for(0, n, 4096, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const int32_t* r = c + 4 * i;
      if (!coord_in_range(r[0], r[1], r[2], r[3])) {
        atomic_min(bad, i);
        p[i] = kEmptyKey;
        continue;
      }
      p[i] = pack_coord(r[0], r[1], r[2], r[3]);
    }
  });
  const int64_t row = bad.load();
  TORCH_CHECK(row == kNoRow, name, " row ", row, " = ", row_string(c + 4 * row),
              " is outside the supported coordinate range: batch in [0, ", kBatchMax,
              "], x/y/z in [", kSpatialMin, ", ", kSpatialMax, "]");
  return packed;
}

void throw_probe_limit(int64_t capacity) {
  TORCH_CHECK(false, "coordinate hash table: an insert exceeded the probe bound of ",
              probe_limit(capacity), " slots (capacity ", capacity,
              "); the keys are pathological for the hash function");
  __builtin_unreachable();
}

at::Tensor hash_build_from_keys_cpu(const at::Tensor& packed, const at::Tensor& coords) {
  const int64_t n = packed.size(0);
  auto table = empty_table(n, packed.options());
  const int64_t cap = table.size(0);
  const int64_t* p = packed.data_ptr<int64_t>();
  int64_t* slots = table.data_ptr<int64_t>();
  std::atomic<int64_t> dup_row{kNoRow};
  std::atomic<bool> full{false};
  at::parallel_for(0, n, 4096, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const auto r = hash_insert(slots, cap, p[i], i);
      if (r == InsertResult::kExists) atomic_min(dup_row, i);
      if (r == InsertResult::kFull) full = true;
    }
  });
  if (full) throw_probe_limit(cap);
  const int64_t row = dup_row.load();
  if (row != kNoRow) {
    const int32_t* c = coords.data_ptr<int32_t>();
    TORCH_CHECK(false, "duplicate coordinate ", row_string(c + 4 * row), " at row ", row,
                ": the coordinates of a SparseTensor must be unique "
                "(torchsparse_pp.utils.sparse_quantize removes duplicates)");
  }
  return table;
}

at::Tensor hash_build_cpu(const at::Tensor& coords_in) {
  auto coords = checked_coords(coords_in, "coords");
  return hash_build_from_keys_cpu(pack_coords_cpu(coords, "coords"), coords);
}

at::Tensor hash_query_cpu(const at::Tensor& table, const at::Tensor& query_in) {
  const auto view = table_view(table);
  auto query = checked_coords(query_in, "query");
  const int64_t n = query.size(0);
  auto out = at::empty({n}, query.options());
  const int32_t* q = query.data_ptr<int32_t>();
  int32_t* o = out.data_ptr<int32_t>();
  at::parallel_for(0, n, 4096, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const int32_t* r = q + 4 * i;
      // Keys outside the packable range cannot be in the table.
      o[i] = coord_in_range(r[0], r[1], r[2], r[3])
                 ? static_cast<int32_t>(view.find(pack_coord(r[0], r[1], r[2], r[3])))
                 : -1;
    }
  });
  return out;
}

TORCH_LIBRARY_IMPL(torchsparse_pp, CPU, m) {
  m.impl("hash_build", &hash_build_cpu);
  m.impl("hash_query", &hash_query_cpu);
}

}  // namespace torchsparse_pp
