// Strided and generative kernel maps on the GPU: what each input reaches, per kernel tap.
// The wrapper turns the reached keys into the new coordinate set (sort + unique) and then fills
// the map by binary search in that set. ATen-free launchers over raw device pointers.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace torchsparse_pp {
namespace kmap_kernels {

enum class Relation : int {
  kReadBy = 0,  // outputs q with q*s - pad + t*d = p (strided conv)
  kFloor = 1,   // q = floor(p / s) (minkowski output set; one tap)
  kWrites = 2,  // p*s - pad + t*d (conv_transpose3d)
};

// One relation per axis; range[a] < 0 means no clip, else q must lie in [0, range[a]).
struct ReachRule {
  Relation rel;
  int64_t taps[3];  // kernel size (1 for kFloor)
  int64_t s[3], d[3], pad[3], range[3];
};

// counts[i] = number of coordinates input i reaches.
cudaError_t reach_counts(const int32_t* coords, int64_t n, ReachRule rule, int64_t* counts,
                         cudaStream_t stream);

// Packed keys of what input i reaches, written at [starts[i], starts[i] + counts[i]). A key
// outside the packable range is written as -1 and lowers *bad_row to i (initialise INT64_MAX).
cudaError_t reach_keys(const int32_t* coords, int64_t n, ReachRule rule, const int64_t* starts,
                       int64_t* keys, int64_t* bad_row, cudaStream_t stream);

// Unpacks m keys into int32 [m, 4] coordinates.
cudaError_t unpack_keys(const int64_t* keys, int64_t m, int32_t* coords, cudaStream_t stream);

// What the fill does with each (input p, offset k) whose reached key is found at index f of the
// sorted unique keys (K = taps product columns; keys outside the range or set are skipped).
enum class FillMode : int {
  kClaim = 0,      // out_in[f, k] = p by CAS from -1; *flag = 1 when the cell was taken
  kClaimMin = 1,   // out_in[f, k] = min over claimants (cells start at INT32_MAX)
  kSecondClaim = 2,  // after kClaimMin: *flag = min p whose cell holds a smaller claimant
  kRowOfInput = 3,   // out_in[p, k] = f
};

cudaError_t reach_fill(const int32_t* coords, int64_t n, ReachRule rule, const int64_t* sorted_keys,
                       int64_t m, FillMode mode, int32_t* out_in, int64_t* flag, cudaStream_t stream);

}  // namespace kmap_kernels
}  // namespace torchsparse_pp
