// Argument checks shared by the CPU dataflow kernels.
#include "checks_cpu.h"

#include <ATen/Parallel.h>

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <cstdio>
#include <fstream>
#include <limits>
#include <mutex>
#include <sstream>
#include <string>
#include <vector>

#include "cpu_features.h"
#include "kmap_common.h"

namespace torchsparse_pp {

namespace {

// lo / hi narrowed to the smallest / largest of v[0, n): branch-free, one clone per instruction
// set (the baseline's SSE2 has no 32-bit min / max; AVX-512 takes 16 values a step).
TSPP_ROW_CLONES void narrow_bounds(const int32_t* v, int64_t n, int32_t& lo, int32_t& hi) {
  int32_t mn = lo, mx = hi;
  for (int64_t i = 0; i < n; ++i) {
    mn = std::min(mn, v[i]);
    mx = std::max(mx, v[i]);
  }
  lo = mn;
  hi = mx;
}

// True when every value of a contiguous int32 tensor lies in [lo, hi). Min / max per range
// (branch-free, so it vectorises); the checks run on every call of the public ops.
bool all_in_range(const at::Tensor& t, int64_t lo, int64_t hi) {
  const int32_t* v = t.data_ptr<int32_t>();
  std::atomic<bool> ok{true};
  at::parallel_for(0, t.numel(), 1 << 16, [&](int64_t begin, int64_t end) {
    int32_t mn = std::numeric_limits<int32_t>::max(), mx = std::numeric_limits<int32_t>::min();
    narrow_bounds(v + begin, end - begin, mn, mx);
    if (begin < end && (mn < lo || mx >= hi)) ok = false;
  });
  return ok;
}

// The first offset (of K) whose pairs name some destination more than once, or K. Offsets whose
// destinations ascend (as kmap_pairs builds them) need one comparison per pair; others are
// checked with a per-thread stamp per destination row.
int64_t first_repeated_destination(const int32_t* dst, const int64_t* off, int64_t K, int64_t num_dst) {
  std::atomic<int64_t> first{K};
  at::parallel_for(0, K, 1, [&](int64_t kb, int64_t ke) {
    std::vector<int32_t> stamp;  // offset + 1 that last named each row (K <= 32^3)
    for (int64_t k = kb; k < ke; ++k) {
      bool ascending = true;
      for (int64_t j = off[k] + 1; j < off[k + 1]; ++j) ascending &= dst[j] > dst[j - 1];
      if (ascending) continue;
      if (stamp.empty()) stamp.assign(num_dst, 0);
      for (int64_t j = off[k]; j < off[k + 1]; ++j) {
        if (stamp[dst[j]] == static_cast<int32_t>(k + 1)) {
          int64_t seen = first.load();
          while (k < seen && !first.compare_exchange_weak(seen, k)) {
          }
          break;
        }
        stamp[dst[j]] = static_cast<int32_t>(k + 1);
      }
    }
  });
  return first.load();
}

// One pass over the pairs: the source indices' bounds, and how often a destination does not
// exceed the one before it (descents; at offset boundaries that is allowed).
struct PairScan {
  int32_t src_lo, src_hi;
  int64_t descents;
};

TSPP_ROW_CLONES void scan_pair_range(const int32_t* src, const int32_t* dst, int64_t begin, int64_t end,
                                     PairScan& out) {
  narrow_bounds(src + begin, end - begin, out.src_lo, out.src_hi);
  int64_t descents = 0;
  for (int64_t j = std::max<int64_t>(begin, 1); j < end; ++j) descents += dst[j] <= dst[j - 1];
  out.descents += descents;
}

PairScan scan_pairs(const int32_t* src, const int32_t* dst, int64_t n) {
  PairScan all{std::numeric_limits<int32_t>::max(), std::numeric_limits<int32_t>::min(), 0};
  std::mutex merge;
  at::parallel_for(0, n, 1 << 16, [&](int64_t begin, int64_t end) {
    PairScan part{std::numeric_limits<int32_t>::max(), std::numeric_limits<int32_t>::min(), 0};
    scan_pair_range(src, dst, begin, end, part);
    std::lock_guard<std::mutex> lock(merge);
    all.src_lo = std::min(all.src_lo, part.src_lo);
    all.src_hi = std::max(all.src_hi, part.src_hi);
    all.descents += part.descents;
  });
  return all;
}

// Descents at the first pair of each offset (each position once: empty offsets share one).
int64_t descents_between_offsets(const int32_t* dst, const int64_t* off, int64_t K) {
  int64_t descents = 0, last = 0;
  for (int64_t k = 1; k < K; ++k) {
    const int64_t j = off[k];
    if (j == last || j >= off[K]) continue;
    last = j;
    descents += dst[j] <= dst[j - 1];
  }
  return descents;
}

}  // namespace

void check_feats(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.dim() == 2, name, " must be 2-D [N, C], got ", t.sizes());
  TORCH_CHECK(t.device().is_cpu(), name, " must be on the CPU for this kernel");
  check_rows(t.size(0), name);
  const auto st = t.scalar_type();
  TORCH_CHECK(st == at::kFloat || st == at::kDouble || st == at::kBFloat16, name,
              ": the CPU kernels support float32, float64 and bfloat16, got ", st);
}

void check_wgrad_operands(const at::Tensor& feats, const at::Tensor& grad) {
  check_feats(feats, "feats");
  check_feats(grad, "grad_out");
  TORCH_CHECK(feats.scalar_type() == grad.scalar_type(), "feats dtype ", feats.scalar_type(),
              " does not match grad_out dtype ", grad.scalar_type());
}

std::pair<int64_t, int64_t> check_weight(const at::Tensor& weight, const at::Tensor& feats,
                                         bool transpose_weight) {
  TORCH_CHECK(weight.dim() == 3, "weight must be [K, C_in, C_out], got ", weight.sizes());
  TORCH_CHECK(weight.scalar_type() == feats.scalar_type(), "weight dtype ", weight.scalar_type(),
              " does not match feats dtype ", feats.scalar_type());
  const int64_t c_src = transpose_weight ? weight.size(2) : weight.size(1);
  const int64_t c_dst = transpose_weight ? weight.size(1) : weight.size(2);
  TORCH_CHECK(feats.size(1) == c_src, "feats have ", feats.size(1),
              " channels but the weight expects ", c_src);
  return {c_src, c_dst};
}

bool check_pairs(const at::Tensor& src_idx, const at::Tensor& dst_idx, const at::Tensor& offsets,
                 const at::Tensor& identity, int64_t K, int64_t num_src, int64_t num_dst) {
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
  TORCH_CHECK(num_dst >= 0, "num_dst must be >= 0, got ", num_dst);
  check_rows(num_src, "the source (num_src)");
  check_rows(num_dst, "the destination (num_dst)");
  const int64_t* off = offsets.data_ptr<int64_t>();
  const int64_t n = src_idx.size(0);
  TORCH_CHECK(off[0] == 0 && off[K] == n, "offsets must start at 0 and end at the "
              "number of pairs (", n, "), got ", off[0], " and ", off[K]);
  for (int64_t k = 0; k < K; ++k)
    TORCH_CHECK(off[k] <= off[k + 1], "offsets must be non-decreasing, got offsets[", k, "] = ",
                off[k], " > offsets[", k + 1, "] = ", off[k + 1]);
  const int32_t* src = src_idx.data_ptr<int32_t>();
  const int32_t* dst = dst_idx.data_ptr<int32_t>();
  const PairScan scan = scan_pairs(src, dst, n);
  const bool ascending = scan.descents == descents_between_offsets(dst, off, K);
  TORCH_CHECK(n == 0 || (scan.src_lo >= 0 && scan.src_hi < num_src), "a source index is out of range [0, ",
              num_src, ")");
  // Ascending destinations are in range when each offset's first and last are.
  bool dst_in_range = true;
  if (ascending) {
    for (int64_t k = 0; k < K; ++k)
      if (off[k] < off[k + 1]) dst_in_range &= dst[off[k]] >= 0 && dst[off[k + 1] - 1] < num_dst;
  } else {
    dst_in_range = all_in_range(dst_idx, 0, num_dst);
  }
  TORCH_CHECK(dst_in_range, "a destination index is out of range [0, ", num_dst, ")");
  // An identity offset skips gather and scatter, so its flag must really mean (j, j) for all j.
  const bool* id = identity.data_ptr<bool>();
  for (int64_t k = 0; k < K; ++k) {
    if (!id[k]) continue;
    TORCH_CHECK(off[k + 1] - off[k] == num_src && num_src == num_dst, "identity[", k,
                "] is set but offset ", k, " does not pair all ", num_src, " sources with as many "
                "destinations");
    bool mismatch = false;
    for (int64_t j = off[k]; j < off[k + 1]; ++j)
      mismatch |= (src[j] != j - off[k]) | (dst[j] != j - off[k]);
    TORCH_CHECK(!mismatch, "identity[", k, "] is set but offset ", k, " does not map every row j to row j");
  }
  // Scatters within one offset run in parallel: a destination named twice would be a race.
  // Ascending destinations repeat none.
  const int64_t k = ascending ? K : first_repeated_destination(dst, off, K, num_dst);
  TORCH_CHECK(k == K, "offset ", k, " pairs some destination row more than once; the pairs of one offset must "
              "name each destination at most once (as kmap_pairs builds them)");
  return ascending;
}

void require_pairs_sorted_by_dst(bool ascending) {
  TORCH_CHECK(ascending, "fetch-on-demand needs the pairs of each offset sorted by destination "
              "(unique, ascending), as kmap_pairs returns them");
}

void check_table_layout(const at::Tensor& table, int64_t num_rows, int64_t K) {
  TORCH_CHECK(table.scalar_type() == at::kInt && table.dim() == 2 && table.size(1) == K &&
                  table.is_contiguous() && table.device().is_cpu(),
              "the map must be a contiguous int32 [rows, K = ", K, "] CPU tensor, got ",
              table.scalar_type(), " ", table.sizes());
  TORCH_CHECK(num_rows >= 0 && num_rows <= table.size(0), "num rows (", num_rows,
              ") must be in [0, ", table.size(0), "]");
  check_rows(num_rows, "the map (num rows)");
}

void check_table(const at::Tensor& table, int64_t num_rows, int64_t K, int64_t num_src) {
  check_table_layout(table, num_rows, K);
  check_rows(num_src, "the map's source (num_src)");
  TORCH_CHECK(all_in_range(table.narrow(0, 0, num_rows), -1, num_src),
              "the map holds a row index outside [-1, ", num_src, ")");
}

namespace {

// The first integer after `key` in a text file, or -1.
int64_t read_number(const char* file, const std::string& key) {
  std::ifstream in(file);
  std::string line;
  while (std::getline(in, line)) {
    if (line.compare(0, key.size(), key) != 0) continue;
    std::istringstream rest(line.substr(key.size()));
    int64_t value = -1;
    if (rest >> value) return value;
  }
  return -1;
}

// TSPP_MEMORY_LIMIT_BYTES (a byte count) caps the memory available to the checks below (a
// test hook, also a way to make a job fail fast well below the machine's memory); -1 when unset.
int64_t memory_limit_override() {
  const char* text = std::getenv("TSPP_MEMORY_LIMIT_BYTES");
  if (text == nullptr || *text == '\0') return -1;
  bool digits = std::strlen(text) <= 18;
  for (const char* c = text; *c != '\0'; ++c) digits = digits && *c >= '0' && *c <= '9';
  TORCH_CHECK(digits, "TSPP_MEMORY_LIMIT_BYTES must be a number of bytes (digits only, at most 18), got '",
              text, "'");
  return std::strtoll(text, nullptr, 10);
}

// Below this size the checks do not read /proc (every map build would pay for it), unless
// TSPP_MEMORY_LIMIT_BYTES is set.
constexpr int64_t kUncheckedBytes = int64_t(64) << 20;

std::string format_bytes(int64_t bytes) {
  char text[96];
  std::snprintf(text, sizeof(text), "%.2f GiB (%lld bytes)", bytes / 1073741824.0, static_cast<long long>(bytes));
  return text;
}

int64_t measured_available_bytes() {
  int64_t available = read_number("/proc/meminfo", "MemAvailable:");
  if (available >= 0) available *= 1024;  // kB
  if (available < 0) {
    const long pages = sysconf(_SC_AVPHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    if (pages > 0 && page > 0) available = static_cast<int64_t>(pages) * page;
  }
  // cgroup v2: memory.max ("max" when unlimited) minus memory.current.
  const int64_t limit = read_number("/sys/fs/cgroup/memory.max", "");
  const int64_t used = read_number("/sys/fs/cgroup/memory.current", "");
  if (limit > 0 && used >= 0) {
    const int64_t left = std::max<int64_t>(limit - used, 0);
    available = available < 0 ? left : std::min(available, left);
  }
  return available;
}

}  // namespace

int64_t available_memory_bytes() {
  const int64_t measured = measured_available_bytes(), cap = memory_limit_override();
  if (cap < 0) return measured;
  return measured < 0 ? cap : std::min(measured, cap);
}

void check_memory(int64_t bytes, const std::string& what) {
  const int64_t cap = memory_limit_override();
  if (cap < 0 && bytes < kUncheckedBytes) return;
  const int64_t measured = measured_available_bytes();
  const bool capped = cap >= 0 && (measured < 0 || cap <= measured);
  const int64_t available = capped ? cap : measured;
  if (available < 0 || bytes <= available) return;
  TORCH_CHECK(false, what, " needs ", format_bytes(bytes), ", but only ", format_bytes(available),
              " are available (", capped ? "TSPP_MEMORY_LIMIT_BYTES" : "MemAvailable and the cgroup limit",
              "): refused before allocating");
}

}  // namespace torchsparse_pp
