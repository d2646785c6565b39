// CPU kernels of the fused neural-net ops: softmax / log_softmax, layer_norm, normalize (rows to
// unit length), sums_ratio ([num, den] rows to num / den), sq_norm (a row's squared length) and
// per-row cross-entropy, forward and backward
// (namespace linea::cpu, API in core/kernels.h).
// Each works on contiguous tensors, one pass (or two) over a row, parallel over rows with
// OpenMP above a work threshold, and is numerically stable (the row max is subtracted
// before exp). float32 uses the vectorizable exp of core/cpu/vec_math.h (loops marked
// `omp simd`), float64 keeps std::exp (gradchecks run in float64).
// Not here: argument checks, reshaping to [outer, r, inner] / [rows, cols], and allocation
// (raw ops in core/ops_nn.cpp), nor any autograd.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <vector>

#include "core/cpu/vec_math.h"
#include "core/kernels.h"
#include "core/sums_ratio_math.h"

namespace linea::cpu {

namespace {

// Elements of work below which a kernel runs on one thread.
constexpr int64_t kParallelWork = 32768;
// Width of the block of the inner dim handled at once when the reduced dim is strided.
constexpr int64_t kInnerBlock = 256;

template <typename T> inline T neg_inf() { return -std::numeric_limits<T>::infinity(); }

template <typename T> inline T exp_(T x) {
  if constexpr (std::is_same_v<T, float>)
    return vm::exp(x);
  else
    return std::exp(x);
}

// ---- softmax over contiguous rows of length r ----------------------------------------------
// Rows are taken `n` at a time (at most kMaxRows, about kRowBlock elements): x - max per row,
// then one exp loop over the whole block, then per-row sums. One long exp loop rather than one
// per row: attention rows are short (50 in the ViT), and a vector loop over a short row spends
// much of its time in its scalar remainder.
constexpr int64_t kRowBlock = 4096;
constexpr int64_t kMaxRows = 256;

inline int64_t softmax_rows_per_block(int64_t r) { return std::max<int64_t>(1, std::min(kMaxRows, kRowBlock / r)); }

template <typename T> LINEA_VEC_CLONES void softmax_rows(const T* x, T* y, int64_t n, int64_t r, bool log) {
  T m[kMaxRows];
  for (int64_t i = 0; i < n; ++i) {
    const T* xr = x + i * r;
    T* yr = y + i * r;
    T mi = neg_inf<T>();
#pragma omp simd reduction(max : mi)
    for (int64_t k = 0; k < r; ++k) mi = xr[k] > mi ? xr[k] : mi;
    if (mi == neg_inf<T>()) mi = T(0);  // all -inf: keep exp(x - m) = 0 rather than NaN from inf - inf
    m[i] = mi;
#pragma omp simd
    for (int64_t k = 0; k < r; ++k) yr[k] = xr[k] - mi;
  }
#pragma omp simd
  for (int64_t k = 0; k < n * r; ++k) y[k] = exp_(y[k]);
  for (int64_t i = 0; i < n; ++i) {
    const T* xr = x + i * r;
    T* yr = y + i * r;
    T s = 0;
#pragma omp simd reduction(+ : s)
    for (int64_t k = 0; k < r; ++k) s += yr[k];
    if (log) {
      const T shift = m[i] + std::log(s);
#pragma omp simd
      for (int64_t k = 0; k < r; ++k) yr[k] = xr[k] - shift;
    } else {
      const T inv = T(1) / s;
#pragma omp simd
      for (int64_t k = 0; k < r; ++k) yr[k] *= inv;
    }
  }
}

// Softmax over r for a block of `w` consecutive inner positions: x, y point at [0, j0] of
// one outer slice [r, inner].
template <typename T>
LINEA_VEC_CLONES void softmax_block(const T* x, T* y, int64_t r, int64_t inner, int64_t w, bool log) {
  T m[kInnerBlock], s[kInnerBlock];
  for (int64_t j = 0; j < w; ++j) {
    m[j] = neg_inf<T>();
    s[j] = 0;
  }
  for (int64_t k = 0; k < r; ++k)
    for (int64_t j = 0; j < w; ++j) m[j] = std::max(m[j], x[k * inner + j]);
  for (int64_t j = 0; j < w; ++j)
    if (m[j] == neg_inf<T>()) m[j] = T(0);
  if (log) {
    for (int64_t k = 0; k < r; ++k)
#pragma omp simd
      for (int64_t j = 0; j < w; ++j) s[j] += exp_(x[k * inner + j] - m[j]);
    for (int64_t j = 0; j < w; ++j) m[j] += std::log(s[j]);
    for (int64_t k = 0; k < r; ++k)
      for (int64_t j = 0; j < w; ++j) y[k * inner + j] = x[k * inner + j] - m[j];
  } else {
    for (int64_t k = 0; k < r; ++k)
#pragma omp simd
      for (int64_t j = 0; j < w; ++j) {
        const T e = exp_(x[k * inner + j] - m[j]);
        y[k * inner + j] = e;
        s[j] += e;
      }
    for (int64_t j = 0; j < w; ++j) s[j] = T(1) / s[j];
    for (int64_t k = 0; k < r; ++k)
      for (int64_t j = 0; j < w; ++j) y[k * inner + j] *= s[j];
  }
}

// softmax:     dx = y * (g - sum_r(g * y))
// log_softmax: dx = g - exp(y) * sum_r(g)
template <typename T> LINEA_VEC_CLONES void softmax_backward_row(const T* g, const T* y, T* dx, int64_t r, bool log) {
  T s = 0;
  if (log) {
#pragma omp simd reduction(+ : s)
    for (int64_t k = 0; k < r; ++k) s += g[k];
#pragma omp simd
    for (int64_t k = 0; k < r; ++k) dx[k] = g[k] - exp_(y[k]) * s;
  } else {
#pragma omp simd reduction(+ : s)
    for (int64_t k = 0; k < r; ++k) s += g[k] * y[k];
    for (int64_t k = 0; k < r; ++k) dx[k] = y[k] * (g[k] - s);
  }
}

template <typename T>
LINEA_VEC_CLONES void softmax_backward_block(const T* g, const T* y, T* dx, int64_t r, int64_t inner, int64_t w,
                                             bool log) {
  T s[kInnerBlock];
  for (int64_t j = 0; j < w; ++j) s[j] = 0;
  if (log) {
    for (int64_t k = 0; k < r; ++k)
      for (int64_t j = 0; j < w; ++j) s[j] += g[k * inner + j];
    for (int64_t k = 0; k < r; ++k)
#pragma omp simd
      for (int64_t j = 0; j < w; ++j) dx[k * inner + j] = g[k * inner + j] - exp_(y[k * inner + j]) * s[j];
  } else {
    for (int64_t k = 0; k < r; ++k)
      for (int64_t j = 0; j < w; ++j) s[j] += g[k * inner + j] * y[k * inner + j];
    for (int64_t k = 0; k < r; ++k)
      for (int64_t j = 0; j < w; ++j) dx[k * inner + j] = y[k * inner + j] * (g[k * inner + j] - s[j]);
  }
}

template <typename T> void softmax_impl(const T* px, T* py, int64_t outer, int64_t r, int64_t inner, bool log) {
  const bool par = outer * r * inner > kParallelWork;
  if (inner == 1) {
    const int64_t rows = softmax_rows_per_block(r), nrb = (outer + rows - 1) / rows;
#pragma omp parallel for schedule(static) if (par)
    for (int64_t t = 0; t < nrb; ++t) {
      const int64_t o = t * rows;
      softmax_rows(px + o * r, py + o * r, std::min(rows, outer - o), r, log);
    }
    return;
  }
  const int64_t nblk = (inner + kInnerBlock - 1) / kInnerBlock;
#pragma omp parallel for schedule(static) if (par)
  for (int64_t t = 0; t < outer * nblk; ++t) {
    const int64_t o = t / nblk, j0 = (t % nblk) * kInnerBlock;
    const int64_t base = o * r * inner + j0;
    softmax_block(px + base, py + base, r, inner, std::min(kInnerBlock, inner - j0), log);
  }
}

template <typename T>
void softmax_backward_impl(const T* pg, const T* py, T* pd, int64_t outer, int64_t r, int64_t inner, bool log) {
  const bool par = outer * r * inner > kParallelWork;
  if (inner == 1) {
#pragma omp parallel for schedule(static) if (par)
    for (int64_t o = 0; o < outer; ++o) softmax_backward_row(pg + o * r, py + o * r, pd + o * r, r, log);
    return;
  }
  const int64_t nblk = (inner + kInnerBlock - 1) / kInnerBlock;
#pragma omp parallel for schedule(static) if (par)
  for (int64_t t = 0; t < outer * nblk; ++t) {
    const int64_t o = t / nblk, j0 = (t % nblk) * kInnerBlock;
    const int64_t base = o * r * inner + j0;
    softmax_backward_block(pg + base, py + base, pd + base, r, inner, std::min(kInnerBlock, inner - j0), log);
  }
}

// x, y [rows, cols]; w, b [cols] or null; mean, rstd [rows]
template <typename T>
void layer_norm_impl(const T* px, const T* pw, const T* pb, T eps, T* py, T* pm, T* pr, int64_t rows, int64_t cols) {
  const bool par = rows * cols > kParallelWork;
  const T inv_cols = T(1) / static_cast<T>(cols);
#pragma omp parallel for schedule(static) if (par)
  for (int64_t i = 0; i < rows; ++i) {
    const T* xr = px + i * cols;
    T* yr = py + i * cols;
    T s = 0;
#pragma omp simd reduction(+ : s)
    for (int64_t c = 0; c < cols; ++c) s += xr[c];
    const T mu = s * inv_cols;
    T v = 0;
#pragma omp simd reduction(+ : v)
    for (int64_t c = 0; c < cols; ++c) {
      const T d = xr[c] - mu;
      v += d * d;
    }
    const T rs = T(1) / std::sqrt(v * inv_cols + eps);
    pm[i] = mu;
    pr[i] = rs;
    if (pw && pb) {
      for (int64_t c = 0; c < cols; ++c) yr[c] = (xr[c] - mu) * rs * pw[c] + pb[c];
    } else if (pw) {
      for (int64_t c = 0; c < cols; ++c) yr[c] = (xr[c] - mu) * rs * pw[c];
    } else if (pb) {
      for (int64_t c = 0; c < cols; ++c) yr[c] = (xr[c] - mu) * rs + pb[c];
    } else {
      for (int64_t c = 0; c < cols; ++c) yr[c] = (xr[c] - mu) * rs;
    }
  }
}

// With xhat = (x - mean) * rstd and gw = grad * w:
//   dx = rstd * (gw - mean_c(gw) - xhat * mean_c(gw * xhat)),  dw = sum_rows grad * xhat,  db = sum_rows grad.
// dw, db may be null. Per-thread partial sums of dw/db ([nthreads, cols], double) are reduced at the end.
template <typename T>
void layer_norm_backward_impl(const T* pg, const T* px, const T* pw, const T* pm, const T* pr, T* pd, T* pdw, T* pdb,
                              int64_t rows, int64_t cols) {
  const bool par = rows * cols > kParallelWork;
  const int nthreads = par ? omp_get_max_threads() : 1;
  const T inv_cols = T(1) / static_cast<T>(cols);
  std::vector<double> part_w(pdw ? static_cast<size_t>(nthreads * cols) : 0, 0.0);
  std::vector<double> part_b(pdb ? static_cast<size_t>(nthreads * cols) : 0, 0.0);
#pragma omp parallel num_threads(nthreads) if (par)
  {
    double* tw = pdw ? part_w.data() + omp_get_thread_num() * cols : nullptr;
    double* tb = pdb ? part_b.data() + omp_get_thread_num() * cols : nullptr;
#pragma omp for schedule(static)
    for (int64_t i = 0; i < rows; ++i) {
      const T* gr = pg + i * cols;
      const T* xr = px + i * cols;
      T* dr = pd + i * cols;
      const T mu = pm[i], rs = pr[i];
      T sum_gw = 0, sum_gwx = 0;
#pragma omp simd reduction(+ : sum_gw, sum_gwx)
      for (int64_t c = 0; c < cols; ++c) {
        const T gw = pw ? gr[c] * pw[c] : gr[c];
        sum_gw += gw;
        sum_gwx += gw * (xr[c] - mu) * rs;
      }
      const T a = sum_gw * inv_cols, q = sum_gwx * inv_cols;
      for (int64_t c = 0; c < cols; ++c) {
        const T gw = pw ? gr[c] * pw[c] : gr[c];
        dr[c] = rs * (gw - a - (xr[c] - mu) * rs * q);
      }
      if (tw)
        for (int64_t c = 0; c < cols; ++c) tw[c] += static_cast<double>(gr[c] * (xr[c] - mu) * rs);
      if (tb)
        for (int64_t c = 0; c < cols; ++c) tb[c] += static_cast<double>(gr[c]);
    }
  }
  for (int64_t c = 0; c < cols; ++c) {
    double sw = 0, sb = 0;
    for (int t = 0; t < nthreads; ++t) {
      if (pdw) sw += part_w[t * cols + c];
      if (pdb) sb += part_b[t * cols + c];
    }
    if (pdw) pdw[c] = static_cast<T>(sw);
    if (pdb) pdb[c] = static_cast<T>(sb);
  }
}

// x, y [rows, cols]: y = x / max(|x|, eps), a row at a time (the norm clamped, not its square:
// eps^2 can underflow where eps does not).
template <typename T> void normalize_impl(const T* px, T eps, T* py, int64_t rows, int64_t cols) {
#pragma omp parallel for schedule(static) if (rows * cols > kParallelWork)
  for (int64_t i = 0; i < rows; ++i) {
    const T* xr = px + i * cols;
    T* yr = py + i * cols;
    T sq = 0;
#pragma omp simd reduction(+ : sq)
    for (int64_t c = 0; c < cols; ++c) sq += xr[c] * xr[c];
    const T inv = T(1) / std::max(std::sqrt(sq), eps);  // a NaN stays
    for (int64_t c = 0; c < cols; ++c) yr[c] = xr[c] * inv;
  }
}

// dx = inv (g - y (y . g)) with inv = 1 / |x| and y = x inv, or g / eps where the norm was
// clamped (y = x / eps is linear there).
template <typename T> void normalize_backward_impl(const T* pg, const T* px, T eps, T* pd, int64_t rows, int64_t cols) {
#pragma omp parallel for schedule(static) if (rows * cols > kParallelWork)
  for (int64_t i = 0; i < rows; ++i) {
    const T* gr = pg + i * cols;
    const T* xr = px + i * cols;
    T* dr = pd + i * cols;
    T sq = 0, xg = 0;
#pragma omp simd reduction(+ : sq, xg)
    for (int64_t c = 0; c < cols; ++c) {
      sq += xr[c] * xr[c];
      xg += xr[c] * gr[c];
    }
    const T norm = std::sqrt(sq);
    const bool clamped = norm < eps;
    const T inv = T(1) / (clamped ? eps : norm);
    const T along = clamped ? T(0) : xg * inv * inv * inv;  // (y . g) inv, as a factor of x
    for (int64_t c = 0; c < cols; ++c) dr[c] = gr[c] * inv - xr[c] * along;
  }
}

// y [rows, cols + 1] holding [num, den] -> out [rows, cols] = num / max(den, tiny), a hidden row 0
// (core/sums_ratio_math.h).
template <typename T> void sums_ratio_impl(const T* py, RowFlags flags, T tiny, T* po, int64_t rows, int64_t cols) {
#pragma omp parallel for schedule(static) if (rows * cols > kParallelWork)
  for (int64_t i = 0; i < rows; ++i) {
    const T* yr = py + i * (cols + 1);
    T* o = po + i * cols;
    const bool shown = flags.shown(i);
    const T d = guarded_den(yr[cols], tiny);
    for (int64_t c = 0; c < cols; ++c) o[c] = shown ? yr[c] / d : T(0);
  }
}

// dy = [g / d, -(g . num) / d^2], the den's part 0 where den < tiny (clamped), a hidden row 0.
template <typename T>
void sums_ratio_backward_impl(const T* pg, const T* py, RowFlags flags, T tiny, T* pd, int64_t rows, int64_t cols) {
#pragma omp parallel for schedule(static) if (rows * cols > kParallelWork)
  for (int64_t i = 0; i < rows; ++i) {
    const T *gr = pg + i * cols, *yr = py + i * (cols + 1);
    T* dr = pd + i * (cols + 1);
    if (!flags.shown(i)) {
      std::fill(dr, dr + cols + 1, T(0));
      continue;
    }
    const T den = yr[cols], d = guarded_den(den, tiny);
    T gy = 0;
    for (int64_t c = 0; c < cols; ++c) {
      dr[c] = gr[c] / d;
      gy += gr[c] * yr[c];
    }
    dr[cols] = den < tiny ? T(0) : -gy / (d * d);
  }
}

// x [rows, cols], y [rows]: y_r = scale |x_r|^2.
template <typename T> void sq_norm_impl(const T* px, T scale, T* py, int64_t rows, int64_t cols) {
#pragma omp parallel for schedule(static) if (rows * cols > kParallelWork)
  for (int64_t i = 0; i < rows; ++i) {
    const T* xr = px + i * cols;
    T sq = 0;
#pragma omp simd reduction(+ : sq)
    for (int64_t c = 0; c < cols; ++c) sq += xr[c] * xr[c];
    py[i] = scale * sq;
  }
}

// dx_r = (2 scale g_r) x_r
template <typename T> void sq_norm_backward_impl(const T* pg, const T* px, T scale, T* pd, int64_t rows, int64_t cols) {
#pragma omp parallel for schedule(static) if (rows * cols > kParallelWork)
  for (int64_t i = 0; i < rows; ++i) {
    const T f = 2 * scale * pg[i];
    const T* xr = px + i * cols;
    T* dr = pd + i * cols;
#pragma omp simd
    for (int64_t c = 0; c < cols; ++c) dr[c] = f * xr[c];
  }
}

// logits [N, C], target [N], loss and lse [N]:
//   loss_i = lse_i - (1 - s) * x[i, t_i] - s / C * sum_c x[i, c]   (0 where t_i == ignore_index)
template <typename T>
void cross_entropy_impl(const T* px, const int64_t* pt, T* pl, T* pe, T* pn, int64_t N, int64_t C, int64_t ignore_index,
                        T s) {
  const bool par = N * C > kParallelWork;
  const T s_over_c = s / static_cast<T>(C);
#pragma omp parallel for schedule(static) if (par)
  for (int64_t i = 0; i < N; ++i) {
    const T* xr = px + i * C;
    T m = neg_inf<T>();
#pragma omp simd reduction(max : m)
    for (int64_t c = 0; c < C; ++c) m = xr[c] > m ? xr[c] : m;
    if (m == neg_inf<T>()) m = T(0);
    // exp in chunks through a stack buffer, then vectorized sums (as in softmax_row).
    T se = 0, sx = 0;
    T buf[kInnerBlock];
    for (int64_t c0 = 0; c0 < C; c0 += kInnerBlock) {
      const int64_t n = std::min(kInnerBlock, C - c0);
#pragma omp simd
      for (int64_t j = 0; j < n; ++j) buf[j] = exp_(xr[c0 + j] - m);
#pragma omp simd reduction(+ : se, sx)
      for (int64_t j = 0; j < n; ++j) {
        se += buf[j];
        sx += xr[c0 + j];
      }
    }
    const T l = m + std::log(se);
    pe[i] = l;
    const int64_t t = pt[i];
    pl[i] = t == ignore_index ? T(0) : l - (T(1) - s) * xr[t] - (s != 0 ? s_over_c * sx : T(0));
    if (pn) pn[i] = t == ignore_index ? T(0) : l - xr[t];  // as the loss with s = 0: the same bits
  }
}

//   dlogits[i, c] = (exp(x[i, c] - lse_i) - (1 - s) * [c == t_i] - s / C) * grad_i   (0 for ignored rows)
template <typename T>
void cross_entropy_backward_impl(const T* pg, int64_t gs, const T* px, const int64_t* pt, const T* pe, T* pd, int64_t N,
                                 int64_t C, int64_t ignore_index, T s) {
  const bool par = N * C > kParallelWork;
  const T s_over_c = s / static_cast<T>(C);
#pragma omp parallel for schedule(static) if (par)
  for (int64_t i = 0; i < N; ++i) {
    const T* xr = px + i * C;
    T* dr = pd + i * C;
    const int64_t t = pt[i];
    if (t == ignore_index) {
      for (int64_t c = 0; c < C; ++c) dr[c] = 0;
      continue;
    }
    const T g = pg[i * gs], l = pe[i];
#pragma omp simd
    for (int64_t c = 0; c < C; ++c) dr[c] = (exp_(xr[c] - l) - s_over_c) * g;
    dr[t] -= (T(1) - s) * g;
  }
}

}  // namespace

// ---- entry points (core/kernels.h) -----------------------------------------------------------

// x, out [outer, r, inner]
void softmax(const Tensor& x, const Tensor& out, int64_t outer, int64_t r, int64_t inner, bool log) {
  if (outer * r * inner == 0) return;
  LINEA_DISPATCH_FLOAT(x.dtype(), "softmax",
                       [&] { softmax_impl<scalar_t>(x.data<scalar_t>(), out.data<scalar_t>(), outer, r, inner, log); });
}

// grad, y, dx [outer, r, inner]; y is the forward output (log-probabilities when log)
void softmax_backward(const Tensor& grad, const Tensor& y, const Tensor& dx, int64_t outer, int64_t r, int64_t inner,
                      bool log) {
  if (outer * r * inner == 0) return;
  LINEA_DISPATCH_FLOAT(y.dtype(), "softmax_backward", [&] {
    softmax_backward_impl<scalar_t>(grad.data<scalar_t>(), y.data<scalar_t>(), dx.data<scalar_t>(), outer, r, inner,
                                    log);
  });
}

// x, out [rows, cols]; w, b [cols] or undefined; mean, rstd [rows]
// sum = x + dropout(r), then the layer norm of sum (the composed dropout + add + layer_norm)
void add_layer_norm(const Tensor& x, const Tensor& r, const FoldedDropout& drop, const Tensor& w, const Tensor& b,
                    double eps, const Tensor& sum, const Tensor& out, const Tensor& mean, const Tensor& rstd,
                    int64_t rows, int64_t cols) {
  if (drop.p > 0) {
    dropout_rows(r, sum, drop.p, drop.seed, drop.draw, drop.first_row, drop.draw_base);  // sum = dropout(r) first
    binary(BinaryOp::Add, x, sum, sum);
  } else {
    binary(BinaryOp::Add, x, r, sum);
  }
  layer_norm(sum, w, b, eps, out, mean, rstd, rows, cols);
}

void layer_norm(const Tensor& x, const Tensor& w, const Tensor& b, double eps, const Tensor& out, const Tensor& mean,
                const Tensor& rstd, int64_t rows, int64_t cols) {
  if (rows == 0 || cols == 0) return;
  LINEA_DISPATCH_FLOAT(x.dtype(), "layer_norm", [&] {
    layer_norm_impl<scalar_t>(x.data<scalar_t>(), w.defined() ? w.data<scalar_t>() : nullptr,
                              b.defined() ? b.data<scalar_t>() : nullptr, static_cast<scalar_t>(eps),
                              out.data<scalar_t>(), mean.data<scalar_t>(), rstd.data<scalar_t>(), rows, cols);
  });
}

// grad, x, dx [rows, cols]; w [cols] or undefined; mean, rstd [rows]; dw, db [cols] or undefined
void layer_norm_backward(const Tensor& grad, const Tensor& x, const Tensor& w, const Tensor& mean, const Tensor& rstd,
                         const Tensor& dx, const Tensor& dw, const Tensor& db, int64_t rows, int64_t cols) {
  if (cols == 0) return;
  LINEA_DISPATCH_FLOAT(x.dtype(), "layer_norm_backward", [&] {
    layer_norm_backward_impl<scalar_t>(
        grad.data<scalar_t>(), x.data<scalar_t>(), w.defined() ? w.data<scalar_t>() : nullptr, mean.data<scalar_t>(),
        rstd.data<scalar_t>(), dx.data<scalar_t>(), dw.defined() ? dw.data<scalar_t>() : nullptr,
        db.defined() ? db.data<scalar_t>() : nullptr, rows, cols);
  });
}

// As add_layer_norm, composed (the same bits as the three steps, which the CPU runs at memory speed
// anyway): the norm's backward, the sum's own gradient added, the dropout.
void add_layer_norm_backward(const Tensor& grad, const Tensor& grad_sum, const Tensor& x, const Tensor& w,
                             const Tensor& mean, const Tensor& rstd, const FoldedDropout& drop, const Tensor& dx,
                             const Tensor& dr, const Tensor& dw, const Tensor& db, int64_t rows, int64_t cols) {
  layer_norm_backward(grad, x, w, mean, rstd, dx, dw, db, rows, cols);
  if (grad_sum.defined()) binary(BinaryOp::Add, dx, grad_sum, dx);
  if (dr.defined()) dropout_rows(dx, dr, drop.p, drop.seed, drop.draw, drop.first_row, drop.draw_base);
}

// x, out [rows, cols]
void normalize(const Tensor& x, double eps, const Tensor& out, int64_t rows, int64_t cols) {
  if (rows == 0 || cols == 0) return;
  LINEA_DISPATCH_FLOAT(x.dtype(), "normalize", [&] {
    normalize_impl<scalar_t>(x.data<scalar_t>(), static_cast<scalar_t>(eps), out.data<scalar_t>(), rows, cols);
  });
}

// grad, x, dx [rows, cols]
void normalize_backward(const Tensor& grad, const Tensor& x, double eps, const Tensor& dx, int64_t rows, int64_t cols) {
  if (rows == 0 || cols == 0) return;
  LINEA_DISPATCH_FLOAT(x.dtype(), "normalize_backward", [&] {
    normalize_backward_impl<scalar_t>(grad.data<scalar_t>(), x.data<scalar_t>(), static_cast<scalar_t>(eps),
                                      dx.data<scalar_t>(), rows, cols);
  });
}

// y [rows, cols + 1], out [rows, cols], visible Bool [groups, per] or undefined
void sums_ratio(const Tensor& y, const Tensor& visible, int64_t group_rows, double tiny, const Tensor& out,
                int64_t rows, int64_t cols) {
  if (rows == 0) return;
  LINEA_DISPATCH_FLOAT(y.dtype(), "sums_ratio", [&] {
    sums_ratio_impl<scalar_t>(y.data<scalar_t>(), RowFlags(visible, group_rows), static_cast<scalar_t>(tiny),
                              out.data<scalar_t>(), rows, cols);
  });
}

// grad [rows, cols], y and dy [rows, cols + 1]
void sums_ratio_backward(const Tensor& grad, const Tensor& y, const Tensor& visible, int64_t group_rows, double tiny,
                         const Tensor& dy, int64_t rows, int64_t cols) {
  if (rows == 0) return;
  LINEA_DISPATCH_FLOAT(y.dtype(), "sums_ratio_backward", [&] {
    sums_ratio_backward_impl<scalar_t>(grad.data<scalar_t>(), y.data<scalar_t>(), RowFlags(visible, group_rows),
                                       static_cast<scalar_t>(tiny), dy.data<scalar_t>(), rows, cols);
  });
}

// x [rows, cols], out [rows]
void sq_norm(const Tensor& x, double scale, const Tensor& out, int64_t rows, int64_t cols) {
  if (rows == 0) return;
  LINEA_DISPATCH_FLOAT(x.dtype(), "sq_norm", [&] {
    sq_norm_impl<scalar_t>(x.data<scalar_t>(), static_cast<scalar_t>(scale), out.data<scalar_t>(), rows, cols);
  });
}

// grad [rows], x and dx [rows, cols]
void sq_norm_backward(const Tensor& grad, const Tensor& x, double scale, const Tensor& dx, int64_t rows, int64_t cols) {
  if (rows == 0 || cols == 0) return;
  LINEA_DISPATCH_FLOAT(x.dtype(), "sq_norm_backward", [&] {
    sq_norm_backward_impl<scalar_t>(grad.data<scalar_t>(), x.data<scalar_t>(), static_cast<scalar_t>(scale),
                                    dx.data<scalar_t>(), rows, cols);
  });
}

// logits [N, C], target Int64 [N] (values checked by the caller), loss and lse [N]
void cross_entropy(const Tensor& logits, const Tensor& target, int64_t ignore_index, double smoothing,
                   const Tensor& loss, const Tensor& lse, const Tensor& nll) {
  const int64_t N = logits.size(0), C = logits.size(1);
  if (N == 0 || C == 0) return;
  LINEA_DISPATCH_FLOAT(logits.dtype(), "cross_entropy", [&] {
    cross_entropy_impl<scalar_t>(logits.data<scalar_t>(), target.data<int64_t>(), loss.data<scalar_t>(),
                                 lse.data<scalar_t>(), nll.defined() ? nll.data<scalar_t>() : nullptr, N, C,
                                 ignore_index, static_cast<scalar_t>(smoothing));
  });
}

// loss and target Int64 [N]; out and count 0-d. The sum as the reduction kernel sums (the bits
// of sum(loss)), the count exact.
void cross_entropy_mean(const Tensor& loss, const Tensor& target, int64_t ignore_index, const Tensor& out,
                        const Tensor& count) {
  const int64_t N = loss.numel();
  reduce(ReduceOp::Sum, loss, out, 1, N, 1);
  const int64_t* pt = target.data<int64_t>();
  int64_t kept = 0;
  for (int64_t i = 0; i < N; ++i) kept += pt[i] != ignore_index;
  LINEA_DISPATCH_FLOAT(loss.dtype(), "cross_entropy_mean", [&] {
    const scalar_t c = static_cast<scalar_t>(std::max<int64_t>(kept, 1));
    *count.data<scalar_t>() = c;
    *out.data<scalar_t>() = *out.data<scalar_t>() / c;
  });
}

// grad [N] (any stride), logits and dlogits [N, C], target Int64 [N], lse [N]
void cross_entropy_backward(const Tensor& grad, const Tensor& logits, const Tensor& target, const Tensor& lse,
                            int64_t ignore_index, double smoothing, const Tensor& dlogits) {
  const int64_t N = logits.size(0), C = logits.size(1);
  if (N == 0 || C == 0) return;
  LINEA_DISPATCH_FLOAT(logits.dtype(), "cross_entropy_backward", [&] {
    cross_entropy_backward_impl<scalar_t>(grad.data<scalar_t>(), grad.stride(0), logits.data<scalar_t>(),
                                          target.data<int64_t>(), lse.data<scalar_t>(), dlogits.data<scalar_t>(), N, C,
                                          ignore_index, static_cast<scalar_t>(smoothing));
  });
}

}  // namespace linea::cpu
