// Positive random features, fused (see attention.h): per block of rows of one (b, h), the
// projections x W^T by one GEMM straight into phi, then per row the |x|^2/2 shift, the
// stabilizer and the exp in place; the backward forms dl = dphi * phi per block and takes dx
// (and dW) by GEMM. No [B, H, L, S] temporaries either way, and one parallel region per call
// where the composed formula ran about twenty small ops.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "core/cpu/attention.h"
#include "core/cpu/gemm.h"
#include "core/cpu/vec_math.h"
#include "core/cpu/workspace.h"
#include "core/kernels.h"

namespace linea::cpu {

namespace {

using detail::gemm;
using detail::Workspace;

// Rows per work item: the item's phi block [rows, S] and x block stay in cache between the GEMM
// and the row loop.
constexpr int64_t kRows = 256;

struct Dims {
  int64_t B, H, L, D, S;
  int64_t blocks() const { return (L + kRows - 1) / kRows; }
  int64_t items() const { return B * H * blocks(); }
};

// l[j] = exp(l[j] - shift) * scale: float32 through the vectorizable vm::exp, float64 by libm.
LINEA_VEC_CLONES void exp_row(float* l, int64_t n, float shift, float scale) {
#pragma omp simd
  for (int64_t j = 0; j < n; ++j) l[j] = vm::exp(l[j] - shift) * scale;
}
void exp_row(double* l, int64_t n, double shift, double scale) {
  for (int64_t j = 0; j < n; ++j) l[j] = std::exp(l[j] - shift) * scale;
}

// The largest non-NaN entry (lowest when there is none).
template <typename T> T row_max(const T* l, int64_t n) {
  T mx = std::numeric_limits<T>::lowest();
  for (int64_t j = 0; j < n; ++j) mx = l[j] > mx ? l[j] : mx;
  return mx;
}

template <typename T> T half_sq_norm(const T* x, int64_t n) {
  T s = 0;
  for (int64_t j = 0; j < n; ++j) s += x[j] * x[j];
  return s * T(0.5);
}

template <typename T>
void forward_impl(const Dims& d, const T* x, const T* w, bool per_row, const uint8_t* pad, T* phi) {
  const int64_t nb = d.blocks(), items = d.items();
  const T inv_sqrt_s = static_cast<T>(1.0 / std::sqrt(static_cast<double>(d.S)));
  // Per item: the max of its unpadded log-features (the sequence stabilizer is their max per (b, h)).
  std::vector<T> block_max(static_cast<size_t>(items), std::numeric_limits<T>::lowest());
  auto padded = [&](int64_t b, int64_t row) { return pad != nullptr && pad[b * d.L + row] != 0; };
#pragma omp parallel
  {
#pragma omp for schedule(dynamic)
    for (int64_t it = 0; it < items; ++it) {
      const int64_t bh = it / nb, b = bh / d.H, h = bh % d.H, r0 = (it % nb) * kRows, rows = std::min(kRows, d.L - r0);
      const T* xb = x + (bh * d.L + r0) * d.D;
      T* pb = phi + (bh * d.L + r0) * d.S;
      gemm(false, true, rows, d.S, d.D, T(1), xb, d.D, w + h * d.S * d.D, d.D, T(0), pb, d.S);  // x W^T
      T mx = std::numeric_limits<T>::lowest();
      for (int64_t r = 0; r < rows; ++r) {
        T* l = pb + r * d.S;
        if (padded(b, r0 + r)) {  // a padded row's features are 0
          std::fill(l, l + d.S, T(0));
          continue;
        }
        const T half = half_sq_norm(xb + r * d.D, d.D);
        for (int64_t s = 0; s < d.S; ++s) l[s] -= half;
        if (per_row)
          exp_row(l, d.S, row_max(l, d.S), inv_sqrt_s);
        else
          mx = std::max(mx, row_max(l, d.S));
      }
      block_max[static_cast<size_t>(it)] = mx;
    }
    if (!per_row) {  // after the loop's barrier: every block's max is in
#pragma omp for schedule(dynamic)
      for (int64_t it = 0; it < items; ++it) {
        const int64_t bh = it / nb, b = bh / d.H, r0 = (it % nb) * kRows, rows = std::min(kRows, d.L - r0);
        const T c = *std::max_element(block_max.begin() + bh * nb, block_max.begin() + (bh + 1) * nb);
        T* pb = phi + (bh * d.L + r0) * d.S;
        for (int64_t r = 0; r < rows; ++r)
          if (!padded(b, r0 + r)) exp_row(pb + r * d.S, d.S, c, inv_sqrt_s);
      }
    }
  }
}

template <typename T>
void backward_impl(const Dims& d, const T* x, const T* w, const T* phi, const T* dphi, T* dx, T* dw) {
  const int64_t nb = d.blocks(), items = d.items(), wsize = d.H * d.S * d.D;
  const int nt = omp_get_max_threads();
  // Per thread: dl [kRows, S], its row sums, and (for dW) an accumulator of every head's dW.
  const int64_t per_thread =
      Workspace<T>::rounded(kRows * d.S) + Workspace<T>::rounded(kRows) + (dw ? Workspace<T>::rounded(wsize) : 0);
  Workspace<T> ws(nt * per_thread);
  std::vector<T*> dl(static_cast<size_t>(nt)), rs(dl.size()), acc(dl.size(), nullptr);
  for (size_t t = 0; t < dl.size(); ++t) {
    dl[t] = ws.take(kRows * d.S);
    rs[t] = ws.take(kRows);
    if (dw) acc[t] = ws.take(wsize);
  }
#pragma omp parallel num_threads(nt)
  {
    const size_t t = static_cast<size_t>(omp_get_thread_num());
    // Static (below): which rows a thread sums into its dw copy must not depend on timing, or dw's
    // bits would (as the CPU sdpa backward's dk and dv did under load; AttentionSuite.SameBitsUnderLoad).
    if (dw) std::fill(acc[t], acc[t] + wsize, T(0));
#pragma omp for schedule(static)
    for (int64_t it = 0; it < items; ++it) {
      const int64_t bh = it / nb, h = bh % d.H, r0 = (it % nb) * kRows, rows = std::min(kRows, d.L - r0);
      const int64_t off = (bh * d.L + r0) * d.S;
      const T* xb = x + (bh * d.L + r0) * d.D;
      T* dxb = dx + (bh * d.L + r0) * d.D;
      T* g = dl[t];
      for (int64_t r = 0; r < rows; ++r) {  // dl = dphi * phi (the stabilizer is a constant)
        T sum = 0;
        for (int64_t s = 0; s < d.S; ++s) {
          g[r * d.S + s] = dphi[off + r * d.S + s] * phi[off + r * d.S + s];
          sum += g[r * d.S + s];
        }
        rs[t][r] = sum;
      }
      // dx = dl W - (sum_s dl) x
      gemm(false, false, rows, d.D, d.S, T(1), g, d.S, w + h * d.S * d.D, d.D, T(0), dxb, d.D);
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t j = 0; j < d.D; ++j) dxb[r * d.D + j] -= rs[t][r] * xb[r * d.D + j];
      if (dw) gemm(true, false, d.S, d.D, rows, T(1), g, d.S, xb, d.D, T(1), acc[t] + h * d.S * d.D, d.D);  // dl^T x
    }
  }
  if (!dw) return;
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < wsize; ++i) {
    T sum = 0;
    for (size_t t = 0; t < acc.size(); ++t) sum += acc[t][i];
    dw[i] = sum;
  }
}

Dims dims_of(const Tensor& x, const Tensor& omega) {
  return {x.size(0), x.size(1), x.size(2), x.size(3), omega.size(1)};
}

}  // namespace

void positive_features_forward(const Tensor& x, const Tensor& omega, bool per_row, const Tensor& pad,
                               const Tensor& phi) {
  const Dims d = dims_of(x, omega);
  LINEA_DISPATCH_FLOAT(x.dtype(), "positive_features", [&] {
    forward_impl<scalar_t>(d, x.data<scalar_t>(), omega.data<scalar_t>(), per_row,
                           pad.defined() ? static_cast<const uint8_t*>(pad.data_ptr()) : nullptr, phi.data<scalar_t>());
  });
}

void positive_features_backward(const Tensor& x, const Tensor& omega, const Tensor& phi, const Tensor& dphi,
                                const Tensor& dx, const Tensor& domega) {
  const Dims d = dims_of(x, omega);
  LINEA_DISPATCH_FLOAT(x.dtype(), "positive_features_backward", [&] {
    backward_impl<scalar_t>(d, x.data<scalar_t>(), omega.data<scalar_t>(), phi.data<scalar_t>(), dphi.data<scalar_t>(),
                            dx.data<scalar_t>(), domega.defined() ? domega.data<scalar_t>() : nullptr);
  });
}

}  // namespace linea::cpu
