// BatchNorm over [N, C] point features on the CPU (float32 / float64): batch statistics, the
// normalise-add-ReLU pass and its backward, each one sweep over the rows. ATen's CPU batch_norm
// treats [N, C] as N images of one pixel and makes several sweeps; a MinkUNet training step spends
// more time there than the bandwidth asks for.
//
// Sums are taken per fixed part of rows (independent of the thread count, so results do not
// depend on it), in the feature dtype over blocks of kBlockRows rows, folded into double.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <vector>

#include "batch_norm_simd.h"
#include "cpu_features.h"

namespace torchsparse_pp {

namespace {

constexpr int64_t kBlockRows = 64;
constexpr int64_t kPartRows = 2048;

template <typename T>
TSPP_INLINE_IN_CLONES void fold(const T* block, int64_t n, double* total) {
  for (int64_t j = 0; j < n; ++j) total[j] += static_cast<double>(block[j]);
}

// s1 / s2 += per-channel sums over `rows` rows of the two values add_row(i, p1, p2) adds for row
// i: taken in T over blocks of kBlockRows rows, each block folded into double.
template <typename T, typename AddRow>
TSPP_INLINE_IN_CLONES void block_sums(int64_t rows, int64_t n, double* s1, double* s2, const AddRow& add_row) {
  std::vector<T> b1(n), b2(n);
  for (int64_t r0 = 0; r0 < rows; r0 += kBlockRows) {
    std::fill(b1.begin(), b1.end(), T(0));
    std::fill(b2.begin(), b2.end(), T(0));
    for (int64_t i = r0; i < std::min(rows, r0 + kBlockRows); ++i) add_row(i, b1.data(), b2.data());
    fold(b1.data(), n, s1);
    fold(b2.data(), n, s2);
  }
}

// s1 += sum(x - shift), s2 += sum((x - shift)^2): shifted sums, so that the variance keeps its
// digits when the mean is large against the spread.
template <typename T>
TSPP_INLINE_IN_CLONES
void shifted_sums_impl(const T* __restrict__ x, int64_t rows, int64_t n, const T* __restrict__ shift,
                       double* __restrict__ s1, double* __restrict__ s2) {
  block_sums<T>(rows, n, s1, s2, [&](int64_t i, T* __restrict__ p1,
                                        T* __restrict__ p2) __attribute__((always_inline)) {
    const T* __restrict__ row = x + i * n;
    for (int64_t j = 0; j < n; ++j) {
      const T d = row[j] - shift[j];
      p1[j] += d;
      p2[j] += d * d;
    }
  });
}

// out[j] = dy[j] where bit j of the row's mask is set, else +0, for j < n: by ands on the
// values' bits (all ones or all zeros per column), 16 columns per mask word, so the compiler's
// clones run it as vectors; a select per column compiled to a branch per column, mispredicted
// on every other one (~10x slower).
template <typename T>
TSPP_INLINE_IN_CLONES void mask_row(const T* __restrict__ dy, const uint16_t* __restrict__ m_row, int64_t n,
                                    T* __restrict__ out) {
  using Bits = std::conditional_t<sizeof(T) == 4, uint32_t, uint64_t>;
  static_assert(sizeof(Bits) == sizeof(T));
  const auto keep = [](const T& v, Bits bit) __attribute__((always_inline)) {
    Bits b;
    std::memcpy(&b, &v, sizeof(T));
    b &= Bits(0) - bit;
    T r;
    std::memcpy(&r, &b, sizeof(T));
    return r;
  };
  int64_t j0 = 0;
  for (; j0 + 16 <= n; j0 += 16) {
    const Bits bits = m_row[j0 >> 4];
    for (int l = 0; l < 16; ++l) out[j0 + l] = keep(dy[j0 + l], (bits >> l) & 1u);
  }
  for (int64_t j = j0; j < n; ++j) out[j] = keep(dy[j], (m_row[j >> 4] >> (j & 15)) & 1u);
}

// For the backward: sg += sum(g), sgx += sum(g * (x - mean)), g = dy, or dy under the ReLU's mask.
template <bool Relu, typename T>
TSPP_INLINE_IN_CLONES
void grad_sums_impl(const T* __restrict__ dy, const T* __restrict__ x, const uint16_t* __restrict__ mask,
                    int64_t rows, int64_t n, const T* __restrict__ mean, double* __restrict__ sg,
                    double* __restrict__ sgx) {
  std::vector<T> masked(Relu ? n : 0);
  block_sums<T>(rows, n, sg, sgx, [&](int64_t i, T* __restrict__ p1,
                                        T* __restrict__ p2) __attribute__((always_inline)) {
    const T* __restrict__ g_row = dy + i * n;
    if constexpr (Relu) {
      mask_row(g_row, mask + i * mask_words(n), n, masked.data());
      g_row = masked.data();
    }
    const T* __restrict__ x_row = x + i * n;
    for (int64_t j = 0; j < n; ++j) {
      p1[j] += g_row[j];
      p2[j] += g_row[j] * (x_row[j] - mean[j]);
    }
  });
}

// y = act(x * scale + shift + residual), row by row.
template <bool Residual, bool Relu, typename T>
TSPP_INLINE_IN_CLONES
void apply_impl(const T* __restrict__ x, const T* __restrict__ residual, int64_t rows, int64_t n,
                const T* __restrict__ scale, const T* __restrict__ shift, T* __restrict__ y) {
  for (int64_t i = 0; i < rows; ++i) {
    const T* __restrict__ x_row = x + i * n;
    const T* __restrict__ r_row = Residual ? residual + i * n : nullptr;
    T* __restrict__ y_row = y + i * n;
    for (int64_t j = 0; j < n; ++j) {
      T v = x_row[j] * scale[j] + shift[j];
      if constexpr (Residual) v += r_row[j];
      if constexpr (Relu) v = v > T(0) ? v : T(0);
      y_row[j] = v;
    }
  }
}

// y = relu(x * scale + shift + residual) and its mask bits, row by row.
template <bool Residual, typename T>
TSPP_INLINE_IN_CLONES
void apply_masked_impl(const T* __restrict__ x, const T* __restrict__ residual, int64_t rows, int64_t n,
                       const T* __restrict__ scale, const T* __restrict__ shift, T* __restrict__ y,
                       uint16_t* __restrict__ mask) {
  const int64_t words = mask_words(n);
  for (int64_t i = 0; i < rows; ++i) {
    const T* __restrict__ x_row = x + i * n;
    const T* __restrict__ r_row = Residual ? residual + i * n : nullptr;
    T* __restrict__ y_row = y + i * n;
    for (int64_t w = 0; w < words; ++w) {
      uint32_t bits = 0;
      for (int64_t j = w * 16; j < std::min(n, w * 16 + 16); ++j) {
        T v = x_row[j] * scale[j] + shift[j];
        if constexpr (Residual) v += r_row[j];
        const bool positive = v > T(0);
        y_row[j] = positive ? v : T(0);
        bits |= uint32_t(positive) << (j - w * 16);
      }
      mask[i * words + w] = static_cast<uint16_t>(bits);
    }
  }
}

// dx = a * g + b * (x - mean) + c; masked_out[i] = g when asked (the residual's gradient).
template <bool Relu, typename T>
TSPP_INLINE_IN_CLONES
void grad_input_impl(const T* __restrict__ dy, const T* __restrict__ x, const uint16_t* __restrict__ mask,
                     int64_t rows, int64_t n, const T* __restrict__ mean, const T* __restrict__ a,
                     const T* __restrict__ b, const T* __restrict__ c, T* __restrict__ dx, T* __restrict__ masked_out) {
  std::vector<T> scratch(Relu && masked_out == nullptr ? n : 0);
  for (int64_t i = 0; i < rows; ++i) {
    const T* __restrict__ g_row = dy + i * n;
    if constexpr (Relu) {
      T* g_masked = masked_out != nullptr ? masked_out + i * n : scratch.data();
      mask_row(g_row, mask + i * mask_words(n), n, g_masked);
      g_row = g_masked;
    }
    const T* __restrict__ x_row = x + i * n;
    T* __restrict__ d_row = dx + i * n;
    for (int64_t j = 0; j < n; ++j) d_row[j] = a[j] * g_row[j] + b[j] * (x_row[j] - mean[j]) + c[j];
  }
}

// Multi-versioned entry points (target_clones needs plain functions).
TSPP_ROW_CLONES void shifted_sums_generic(const float* x, int64_t rows, int64_t n, const float* shift, double* s1,
                                          double* s2) {
  shifted_sums_impl(x, rows, n, shift, s1, s2);
}
void shifted_sums(const float* x, int64_t rows, int64_t n, const float* shift, double* s1, double* s2) {
  if (batch_norm_avx512_available() && bn_shifted_sums_avx512(x, rows, n, kBlockRows, shift, s1, s2)) return;
  if (batch_norm_avx2_available() && bn_shifted_sums_avx2(x, rows, n, kBlockRows, shift, s1, s2)) return;
  shifted_sums_generic(x, rows, n, shift, s1, s2);
}
TSPP_ROW_CLONES void shifted_sums(const double* x, int64_t rows, int64_t n, const double* shift, double* s1,
                                  double* s2) {
  shifted_sums_impl(x, rows, n, shift, s1, s2);
}

// The masked entry points take mask == nullptr for "no ReLU".
template <typename T>
TSPP_INLINE_IN_CLONES void grad_sums_dispatch(const T* dy, const T* x, const uint16_t* mask, int64_t rows,
                                              int64_t n, const T* mean, double* sg, double* sgx) {
  mask != nullptr ? grad_sums_impl<true>(dy, x, mask, rows, n, mean, sg, sgx)
                  : grad_sums_impl<false>(dy, x, mask, rows, n, mean, sg, sgx);
}
TSPP_ROW_CLONES void grad_sums_generic(const float* dy, const float* x, const uint16_t* mask, int64_t rows, int64_t n,
                                       const float* mean, double* sg, double* sgx) {
  grad_sums_dispatch(dy, x, mask, rows, n, mean, sg, sgx);
}
TSPP_ROW_CLONES void grad_sums(const double* dy, const double* x, const uint16_t* mask, int64_t rows, int64_t n,
                               const double* mean, double* sg, double* sgx) {
  grad_sums_dispatch(dy, x, mask, rows, n, mean, sg, sgx);
}
void grad_sums(const float* dy, const float* x, const uint16_t* mask, int64_t rows, int64_t n, const float* mean,
               double* sg, double* sgx) {
  if (batch_norm_avx512_available()) return bn_grad_sums_avx512(dy, x, mask, rows, n, kBlockRows, mean, sg, sgx);
  if (batch_norm_avx2_available()) return bn_grad_sums_avx2(dy, x, mask, rows, n, kBlockRows, mean, sg, sgx);
  grad_sums_generic(dy, x, mask, rows, n, mean, sg, sgx);
}

template <typename T>
TSPP_INLINE_IN_CLONES
void apply_dispatch(const T* x, const T* residual, int64_t rows, int64_t n, const T* scale, const T* shift,
                    bool relu, T* y) {
  if (residual != nullptr) {
    relu ? apply_impl<true, true>(x, residual, rows, n, scale, shift, y)
         : apply_impl<true, false>(x, residual, rows, n, scale, shift, y);
  } else {
    relu ? apply_impl<false, true>(x, residual, rows, n, scale, shift, y)
         : apply_impl<false, false>(x, residual, rows, n, scale, shift, y);
  }
}
TSPP_ROW_CLONES void apply_rows(const float* x, const float* residual, int64_t rows, int64_t n, const float* scale,
                                const float* shift, bool relu, float* y) {
  apply_dispatch(x, residual, rows, n, scale, shift, relu, y);
}
TSPP_ROW_CLONES void apply_rows(const double* x, const double* residual, int64_t rows, int64_t n,
                                const double* scale, const double* shift, bool relu, double* y) {
  apply_dispatch(x, residual, rows, n, scale, shift, relu, y);
}

template <typename T>
TSPP_INLINE_IN_CLONES void apply_masked_dispatch(const T* x, const T* residual, int64_t rows, int64_t n,
                                                 const T* scale, const T* shift, T* y, uint16_t* mask) {
  residual != nullptr ? apply_masked_impl<true>(x, residual, rows, n, scale, shift, y, mask)
                      : apply_masked_impl<false>(x, residual, rows, n, scale, shift, y, mask);
}
TSPP_ROW_CLONES void apply_masked_generic(const float* x, const float* residual, int64_t rows, int64_t n,
                                          const float* scale, const float* shift, float* y, uint16_t* mask) {
  apply_masked_dispatch(x, residual, rows, n, scale, shift, y, mask);
}
TSPP_ROW_CLONES void apply_masked_rows(const double* x, const double* residual, int64_t rows, int64_t n,
                                       const double* scale, const double* shift, double* y, uint16_t* mask) {
  apply_masked_dispatch(x, residual, rows, n, scale, shift, y, mask);
}
void apply_masked_rows(const float* x, const float* residual, int64_t rows, int64_t n, const float* scale,
                       const float* shift, float* y, uint16_t* mask) {
  if (batch_norm_avx512_available()) return bn_apply_masked_avx512(x, residual, rows, n, scale, shift, y, mask);
  if (batch_norm_avx2_available()) return bn_apply_masked_avx2(x, residual, rows, n, scale, shift, y, mask);
  apply_masked_generic(x, residual, rows, n, scale, shift, y, mask);
}

template <typename T>
TSPP_INLINE_IN_CLONES
void grad_input_dispatch(const T* dy, const T* x, const uint16_t* mask, int64_t rows, int64_t n, const T* mean,
                         const T* a, const T* b, const T* c, T* dx, T* masked_out) {
  mask != nullptr ? grad_input_impl<true>(dy, x, mask, rows, n, mean, a, b, c, dx, masked_out)
                  : grad_input_impl<false>(dy, x, mask, rows, n, mean, a, b, c, dx, masked_out);
}
TSPP_ROW_CLONES void grad_input_generic(const float* dy, const float* x, const uint16_t* mask, int64_t rows,
                                        int64_t n, const float* mean, const float* a, const float* b, const float* c,
                                        float* dx, float* masked_out) {
  grad_input_dispatch(dy, x, mask, rows, n, mean, a, b, c, dx, masked_out);
}
TSPP_ROW_CLONES void grad_input_rows(const double* dy, const double* x, const uint16_t* mask, int64_t rows, int64_t n,
                                     const double* mean, const double* a, const double* b, const double* c,
                                     double* dx, double* masked_out) {
  grad_input_dispatch(dy, x, mask, rows, n, mean, a, b, c, dx, masked_out);
}
void grad_input_rows(const float* dy, const float* x, const uint16_t* mask, int64_t rows, int64_t n,
                     const float* mean, const float* a, const float* b, const float* c, float* dx,
                     float* masked_out) {
  if (batch_norm_avx512_available()) return bn_grad_input_avx512(dy, x, mask, rows, n, mean, a, b, c, dx, masked_out);
  if (batch_norm_avx2_available()) return bn_grad_input_avx2(dy, x, mask, rows, n, mean, a, b, c, dx, masked_out);
  grad_input_generic(dy, x, mask, rows, n, mean, a, b, c, dx, masked_out);
}

// Per-part double sums of two per-channel quantities, added up in part order.
template <typename PartFn>
std::vector<double> part_sums(int64_t rows, int64_t n, const PartFn& part_fn) {
  const int64_t parts = (rows + kPartRows - 1) / kPartRows;
  std::vector<double> partial(static_cast<size_t>(parts * 2 * n), 0.0);
  at::parallel_for(0, parts, 1, [&](int64_t pb, int64_t pe) {
    for (int64_t p = pb; p < pe; ++p) {
      double* s = partial.data() + p * 2 * n;
      part_fn(p * kPartRows, std::min(rows, (p + 1) * kPartRows) - p * kPartRows, s, s + n);
    }
  });
  std::vector<double> total(static_cast<size_t>(2 * n), 0.0);
  for (int64_t p = 0; p < parts; ++p)
    for (int64_t j = 0; j < 2 * n; ++j) total[j] += partial[p * 2 * n + j];
  return total;
}

void check_features(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.device().is_cpu(), "batch_norm: ", name, " must be a CPU tensor");
  TORCH_CHECK(t.dim() == 2 && t.is_contiguous(), "batch_norm: ", name, " must be a contiguous [N, C] tensor, got ",
              t.sizes());
  TORCH_CHECK(t.scalar_type() == at::kFloat || t.scalar_type() == at::kDouble, "batch_norm: ", name,
              " must be float32 or float64, got ", t.scalar_type());
}

void check_like(const at::Tensor& t, const at::Tensor& like, const char* name) {
  TORCH_CHECK(t.scalar_type() == like.scalar_type() && t.device() == like.device(), "batch_norm: ", name,
              " must be ", like.scalar_type(), " on ", like.device());
  TORCH_CHECK(t.is_contiguous(), "batch_norm: ", name, " must be contiguous");
}

void check_channels(const at::Tensor& t, const at::Tensor& feats, const char* name) {
  check_like(t, feats, name);
  TORCH_CHECK(t.dim() == 1 && t.size(0) == feats.size(1), "batch_norm: ", name, " must have ", feats.size(1),
              " entries, got ", t.sizes());
}

// (mean, 1 / sqrt(var + eps), unbiased var) per channel, var the biased batch variance.
std::tuple<at::Tensor, at::Tensor, at::Tensor> batch_norm_stats_cpu(const at::Tensor& feats, double eps) {
  check_features(feats, "feats");
  const int64_t rows = feats.size(0), n = feats.size(1);
  TORCH_CHECK(rows > 1, "batch_norm: more than one point per channel is needed for batch statistics, got ", rows);
  auto mean = at::empty({n}, feats.options());
  auto invstd = at::empty({n}, feats.options());
  auto var = at::empty({n}, feats.options());
  AT_DISPATCH_FLOATING_TYPES(feats.scalar_type(), "batch_norm_stats", [&] {
    const scalar_t* x = feats.data_ptr<scalar_t>();
    const scalar_t* shift = x;  // the first row
    const auto sums = part_sums(rows, n, [&](int64_t r0, int64_t count, double* s1, double* s2) {
      shifted_sums(x + r0 * n, count, n, shift, s1, s2);
    });
    scalar_t* m = mean.data_ptr<scalar_t>();
    scalar_t* is = invstd.data_ptr<scalar_t>();
    scalar_t* v = var.data_ptr<scalar_t>();
    for (int64_t j = 0; j < n; ++j) {
      const double d = sums[j] / rows;
      const double biased = std::max(sums[n + j] / rows - d * d, 0.0);
      m[j] = static_cast<scalar_t>(static_cast<double>(shift[j]) + d);
      is[j] = static_cast<scalar_t>(1.0 / std::sqrt(biased + eps));
      v[j] = static_cast<scalar_t>(biased * rows / (rows - 1));
    }
  });
  return {mean, invstd, var};
}

void check_apply_arguments(const at::Tensor& feats, const at::Tensor& scale, const at::Tensor& shift,
                           const c10::optional<at::Tensor>& residual) {
  check_features(feats, "feats");
  check_channels(scale, feats, "scale");
  check_channels(shift, feats, "shift");
  if (residual.has_value()) {
    check_like(*residual, feats, "residual");
    TORCH_CHECK(residual->sizes() == feats.sizes(), "batch_norm: residual must be ", feats.sizes(), ", got ",
                residual->sizes());
  }
}

at::Tensor batch_norm_apply_cpu(const at::Tensor& feats, const at::Tensor& scale, const at::Tensor& shift,
                                const c10::optional<at::Tensor>& residual, bool relu) {
  check_apply_arguments(feats, scale, shift, residual);
  auto out = at::empty_like(feats);
  const int64_t rows = feats.size(0), n = feats.size(1);
  AT_DISPATCH_FLOATING_TYPES(feats.scalar_type(), "batch_norm_apply", [&] {
    const scalar_t* x = feats.data_ptr<scalar_t>();
    const scalar_t* r = residual.has_value() ? residual->data_ptr<scalar_t>() : nullptr;
    scalar_t* y = out.data_ptr<scalar_t>();
    at::parallel_for(0, rows, 256, [&](int64_t begin, int64_t end) {
      apply_rows(x + begin * n, r ? r + begin * n : nullptr, end - begin, n, scale.data_ptr<scalar_t>(),
                 shift.data_ptr<scalar_t>(), relu, y + begin * n);
    });
  });
  return out;
}

// relu(feats * scale + shift [+ residual]) and the ReLU's mask as bits (int16 [N, ceil(C / 16)]:
// bit j % 16 of word j / 16 set where the output is positive), which the backward reads instead
// of the residual.
std::tuple<at::Tensor, at::Tensor> batch_norm_apply_masked_cpu(const at::Tensor& feats, const at::Tensor& scale,
                                                               const at::Tensor& shift,
                                                               const c10::optional<at::Tensor>& residual) {
  check_apply_arguments(feats, scale, shift, residual);
  auto out = at::empty_like(feats);
  const int64_t rows = feats.size(0), n = feats.size(1);
  auto mask = at::empty({rows, mask_words(n)}, feats.options().dtype(at::kShort));
  AT_DISPATCH_FLOATING_TYPES(feats.scalar_type(), "batch_norm_apply_masked", [&] {
    const scalar_t* x = feats.data_ptr<scalar_t>();
    const scalar_t* r = residual.has_value() ? residual->data_ptr<scalar_t>() : nullptr;
    scalar_t* y = out.data_ptr<scalar_t>();
    auto* m = reinterpret_cast<uint16_t*>(mask.data_ptr<int16_t>());
    at::parallel_for(0, rows, 256, [&](int64_t begin, int64_t end) {
      apply_masked_rows(x + begin * n, r ? r + begin * n : nullptr, end - begin, n, scale.data_ptr<scalar_t>(),
                        shift.data_ptr<scalar_t>(), y + begin * n, m + begin * mask_words(n));
    });
  });
  return {out, mask};
}

// Gradients of out = act(bn(feats) * weight + bias [+ residual]) given the batch statistics.
// `relu_mask` (from batch_norm_apply_masked) is given when act is the ReLU. The fourth result is
// the residual's gradient (grad_out under the mask) when `residual_grad` and act is the ReLU,
// else empty.
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> batch_norm_backward_cpu(
    const at::Tensor& grad_out, const at::Tensor& feats, const at::Tensor& mean, const at::Tensor& invstd,
    const c10::optional<at::Tensor>& weight, const c10::optional<at::Tensor>& relu_mask, bool residual_grad) {
  check_features(feats, "feats");
  check_like(grad_out, feats, "grad_out");
  TORCH_CHECK(grad_out.sizes() == feats.sizes(), "batch_norm: grad_out must be ", feats.sizes());
  check_channels(mean, feats, "mean");
  check_channels(invstd, feats, "invstd");
  if (weight.has_value()) check_channels(*weight, feats, "weight");
  const int64_t rows = feats.size(0), n = feats.size(1);
  const bool relu = relu_mask.has_value();
  if (relu) {
    TORCH_CHECK(relu_mask->scalar_type() == at::kShort && relu_mask->device() == feats.device() &&
                    relu_mask->is_contiguous(),
                "batch_norm: relu_mask must be a contiguous int16 tensor on ", feats.device());
    TORCH_CHECK(relu_mask->dim() == 2 && relu_mask->size(0) == rows && relu_mask->size(1) == mask_words(n),
                "batch_norm: relu_mask must be [", rows, ", ", mask_words(n), "] (batch_norm_apply_masked's), got ",
                relu_mask->sizes());
  }
  auto grad_feats = at::empty_like(feats);
  auto grad_weight = at::empty({n}, feats.options());
  auto grad_bias = at::empty({n}, feats.options());
  auto masked_grad = residual_grad && relu ? at::empty_like(feats) : at::empty({0}, feats.options());
  AT_DISPATCH_FLOATING_TYPES(feats.scalar_type(), "batch_norm_backward", [&] {
    const scalar_t* dy = grad_out.data_ptr<scalar_t>();
    const scalar_t* x = feats.data_ptr<scalar_t>();
    const scalar_t* m = mean.data_ptr<scalar_t>();
    const scalar_t* is = invstd.data_ptr<scalar_t>();
    const auto* bits = relu ? reinterpret_cast<const uint16_t*>(relu_mask->data_ptr<int16_t>()) : nullptr;
    const auto bits_at = [&](int64_t r0) { return bits != nullptr ? bits + r0 * mask_words(n) : nullptr; };
    const auto sums = part_sums(rows, n, [&](int64_t r0, int64_t count, double* sg, double* sgx) {
      grad_sums(dy + r0 * n, x + r0 * n, bits_at(r0), count, n, m, sg, sgx);
    });
    std::vector<scalar_t> a(n), b(n), c(n);
    scalar_t* gw = grad_weight.data_ptr<scalar_t>();
    scalar_t* gb = grad_bias.data_ptr<scalar_t>();
    for (int64_t j = 0; j < n; ++j) {
      const double w = weight.has_value() ? static_cast<double>(weight->data_ptr<scalar_t>()[j]) : 1.0;
      const double s = is[j], sg = sums[j], sgx = sums[n + j];
      gb[j] = static_cast<scalar_t>(sg);
      gw[j] = static_cast<scalar_t>(sgx * s);
      a[j] = static_cast<scalar_t>(w * s);
      b[j] = static_cast<scalar_t>(-w * s * s * s * sgx / rows);
      c[j] = static_cast<scalar_t>(-w * s * sg / rows);
    }
    scalar_t* dx = grad_feats.data_ptr<scalar_t>();
    scalar_t* mk = masked_grad.numel() ? masked_grad.data_ptr<scalar_t>() : nullptr;
    at::parallel_for(0, rows, 256, [&](int64_t begin, int64_t end) {
      grad_input_rows(dy + begin * n, x + begin * n, bits_at(begin), end - begin, n, m, a.data(), b.data(), c.data(),
                      dx + begin * n, mk ? mk + begin * n : nullptr);
    });
  });
  return {grad_feats, grad_weight, grad_bias, masked_grad};
}

}  // namespace

TORCH_LIBRARY_IMPL(torchsparse_pp, CPU, m) {
  m.impl("batch_norm_stats", &batch_norm_stats_cpu);
  m.impl("batch_norm_apply", &batch_norm_apply_cpu);
  m.impl("batch_norm_apply_masked", &batch_norm_apply_masked_cpu);
  m.impl("batch_norm_backward", &batch_norm_backward_cpu);
}

}  // namespace torchsparse_pp
