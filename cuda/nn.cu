// CUDA kernels of the fused neural-net ops: softmax / log_softmax, layer_norm, normalize, sums_ratio,
// sq_norm and per-row cross-entropy, forward and backward (namespace linea::cuda, contracts in core/kernels.h).
// The formulas, their order of operations and the edge cases (an all -inf row, an absent
// weight or bias, ignored rows) are those of the CPU reference, core/cpu/nn.cpp.
//
// Row work uses the column-reduction skeleton of cuda/common.cuh: a "column" is one softmax
// slice over r (or one row of layer_norm / cross_entropy); threadIdx.y splits it, partial
// results meet in a shared-memory tree, then the same threads write the outputs.
// layer_norm's dw/db are reduced over rows without atomics (deterministic): pass 1 sums
// chunks of rows per column into a scratch [chunks, cols] buffer, pass 2 sums the chunks.
// Not here: argument checks, reshaping to [outer, r, inner] / [rows, cols], allocation
// (raw ops in core/ops_nn.cpp), autograd.
#include "core/kernels.h"
#include "core/random_math.h"
#include "core/sums_ratio_math.h"
#include "cuda/common.cuh"

namespace linea::cuda {

using namespace linea::cuda::detail;

namespace {

// ---- softmax ---------------------------------------------------------------------------------------
// x, y [outer, r, inner]
template <typename T>
__global__ void softmax_kernel(const T* x, T* y, int64_t columns, int64_t r, int64_t inner, bool log) {
  T* sh = shared_mem<T>();
  for (int64_t cb = blockIdx.x; cb * blockDim.x < columns; cb += gridDim.x) {
    const Column col = column_at(cb, columns, r, inner);
    const T* xc = x + col.base;
    T* yc = y + col.base;
    T m = neg_inf<T>();
    if (col.active)
      for (int64_t k = threadIdx.y; k < r; k += blockDim.y) m = MaxOp()(m, xc[k * inner]);
    m = tree_reduce_y(m, MaxOp(), sh);
    if (m == neg_inf<T>()) m = T(0);  // all -inf: exp(x - m) = 0 rather than NaN
    T s = 0;
    if (col.active)
      for (int64_t k = threadIdx.y; k < r; k += blockDim.y) s += d_exp(xc[k * inner] - m);
    s = tree_reduce_y(s, SumOp(), sh);
    if (!col.active) continue;
    if (log) {
      const T shift = m + d_log(s);
      for (int64_t k = threadIdx.y; k < r; k += blockDim.y) yc[k * inner] = xc[k * inner] - shift;
    } else {
      const T inv = T(1) / s;
      for (int64_t k = threadIdx.y; k < r; k += blockDim.y) yc[k * inner] = d_exp(xc[k * inner] - m) * inv;
    }
  }
}

// softmax:     dx = y * (g - sum_r(g * y))
// log_softmax: dx = g - exp(y) * sum_r(g)
template <typename T>
__global__ void softmax_backward_kernel(const T* g, const T* y, T* dx, int64_t columns, int64_t r, int64_t inner,
                                        bool log) {
  T* sh = shared_mem<T>();
  for (int64_t cb = blockIdx.x; cb * blockDim.x < columns; cb += gridDim.x) {
    const Column col = column_at(cb, columns, r, inner);
    const T* gc = g + col.base;
    const T* yc = y + col.base;
    T* dc = dx + col.base;
    T s = 0;
    if (col.active)
      for (int64_t k = threadIdx.y; k < r; k += blockDim.y) s += log ? gc[k * inner] : gc[k * inner] * yc[k * inner];
    s = tree_reduce_y(s, SumOp(), sh);
    if (!col.active) continue;
    if (log) {
      for (int64_t k = threadIdx.y; k < r; k += blockDim.y) dc[k * inner] = gc[k * inner] - d_exp(yc[k * inner]) * s;
    } else {
      for (int64_t k = threadIdx.y; k < r; k += blockDim.y) dc[k * inner] = yc[k * inner] * (gc[k * inner] - s);
    }
  }
}

// ---- layer norm ------------------------------------------------------------------------------------
// add_layer_norm's dropout of the residual branch: element e (row-major over r [batch, ...], len
// elements per example) times its dropout_rows factor (core/random_math.h).
template <typename T> struct Dropout {
  linea::detail::ExampleDropout<T> ex;
  int64_t len = 1;
  const uint64_t* base = nullptr;
  __device__ T factor(int64_t e) const { return ex.factor(e / len, e % len); }
};
// x, y [rows, cols]; w, b [cols] or null; mean, rstd [rows]. With a residual r (and sum, both
// [rows, cols]; else null): sum = x + r, and the norm is sum's (each thread reads back the
// elements it wrote).
template <typename T>
__global__ void layer_norm_kernel(const T* x, const T* r, Dropout<T> drop, T* sum, const T* w, const T* b, T eps, T* y,
                                  T* mean, T* rstd, int64_t rows, int64_t cols) {
  T* sh = shared_mem<T>();
  const T inv_cols = T(1) / static_cast<T>(cols);
  if (drop.ex.on && drop.base) drop.ex.draw += *drop.base;
  for (int64_t cb = blockIdx.x; cb * blockDim.x < rows; cb += gridDim.x) {
    const Column row = column_at(cb, rows, cols, 1);
    const T* xr = x + row.base;
    T* yr = y + row.base;
    T s = 0;
    if (row.active && r) {
      const T* rr = r + row.base;
      T* sr = sum + row.base;
      for (int64_t c = threadIdx.y; c < cols; c += blockDim.y) {
        const T v = xr[c] + (drop.ex.on ? rr[c] * drop.factor(row.c * cols + c) : rr[c]);
        sr[c] = v;
        s += v;
      }
      xr = sr;
    } else if (row.active) {
      for (int64_t c = threadIdx.y; c < cols; c += blockDim.y) s += xr[c];
    }
    const T mu = tree_reduce_y(s, SumOp(), sh) * inv_cols;
    T v = 0;
    if (row.active)
      for (int64_t c = threadIdx.y; c < cols; c += blockDim.y) {
        const T d = xr[c] - mu;
        v += d * d;
      }
    v = tree_reduce_y(v, SumOp(), sh);
    if (!row.active) continue;
    const T rs = T(1) / sqrt(v * inv_cols + eps);
    if (threadIdx.y == 0) {
      mean[row.c] = mu;
      rstd[row.c] = rs;
    }
    for (int64_t c = threadIdx.y; c < cols; c += blockDim.y) {
      T t = (xr[c] - mu) * rs;
      if (w) t = t * w[c];
      if (b) t = t + b[c];
      yr[c] = t;
    }
  }
}

// The whole backward in one launch. Block k takes rows [k * chunk, (k + 1) * chunk); with xhat =
// (x - mean) * rstd and gw = grad * w:
//   dx = rstd * (gw - mean_c(gw) - xhat * mean_c(gw * xhat))       (rows in groups of blockDim.x,
//                                                                    threadIdx.y splitting a row)
// (add_layer_norm's: plus gsum, the sum's own gradient, where not null; and dres = dx through the
// residual's dropout where not null, with the forward's factors)
// then, when dw or db is wanted, the chunk's column sums pw[k, c] = sum grad * xhat and pb[k, c]
// = sum grad (double), and the last block to finish (a device counter, reset by that block) adds
// the chunks in order: dw[c] = sum_k pw[k, c], db[c] = sum_k pb[k, c]. Deterministic: no atomics
// on the sums.
template <typename T>
__global__ void layer_norm_backward_kernel(const T* g, const T* gsum, const T* x, const T* w, const T* mean,
                                           const T* rstd, Dropout<T> drop, T* dx, T* dres, double* pw, double* pb,
                                           T* dw, T* db, int64_t rows, int64_t cols, int64_t chunk,
                                           unsigned int* blocks_done) {
  T* sh = shared_mem<T>();
  const T inv_cols = T(1) / static_cast<T>(cols);
  if (dres && drop.base) drop.ex.draw += *drop.base;
  const int64_t r0 = blockIdx.x * chunk, r1 = min(rows, r0 + chunk);
  for (int64_t first = r0; first < r1; first += blockDim.x) {
    const int64_t r = first + threadIdx.x;
    const bool active = r < r1;
    const T* gr = g + r * cols;
    const T* xr = x + r * cols;
    T* dr = dx + r * cols;
    const T mu = active ? mean[r] : T(0), rs = active ? rstd[r] : T(0);
    T sum_gw = 0, sum_gwx = 0;
    if (active)
      for (int64_t c = threadIdx.y; c < cols; c += blockDim.y) {
        const T gw = w ? gr[c] * w[c] : gr[c];
        sum_gw += gw;
        sum_gwx += gw * (xr[c] - mu) * rs;
      }
    sum_gw = tree_reduce_y(sum_gw, SumOp(), sh);
    sum_gwx = tree_reduce_y(sum_gwx, SumOp(), sh);
    if (!active) continue;
    const T a = sum_gw * inv_cols, q = sum_gwx * inv_cols;
    for (int64_t c = threadIdx.y; c < cols; c += blockDim.y) {
      const T gw = w ? gr[c] * w[c] : gr[c];
      T d = rs * (gw - a - (xr[c] - mu) * rs * q);
      if (gsum) d += gsum[r * cols + c];
      dr[c] = d;
      if (dres) dres[r * cols + c] = d * drop.factor(r * cols + c);
    }
  }
  if (!pw && !pb) return;
  // This chunk's column sums: thread t owns columns t, t + nthreads, ...
  const int64_t nthreads = blockDim.x * blockDim.y, t = threadIdx.y * blockDim.x + threadIdx.x;
  for (int64_t c = t; c < cols; c += nthreads) {
    double sw = 0, sb = 0;
    for (int64_t r = r0; r < r1; ++r) {
      const T gv = g[r * cols + c];
      if (pw) sw += static_cast<double>(gv * (x[r * cols + c] - mean[r]) * rstd[r]);
      sb += static_cast<double>(gv);
    }
    if (pw) pw[blockIdx.x * cols + c] = sw;
    if (pb) pb[blockIdx.x * cols + c] = sb;
  }
  // The last block adds the chunks, in chunk order.
  int* is_last = reinterpret_cast<int*>(sh);
  __syncthreads();  // the block's partial sums are written (and sh is free again)
  if (t == 0) {
    __threadfence();
    *is_last = atomicAdd(blocks_done, 1u) == gridDim.x - 1;
  }
  __syncthreads();
  if (!*is_last) return;
  __threadfence();
  for (int64_t c = t; c < cols; c += nthreads) {
    double sw = 0, sb = 0;
    for (int64_t k = 0; k < static_cast<int64_t>(gridDim.x); ++k) {
      if (pw) sw += pw[k * cols + c];
      if (pb) sb += pb[k * cols + c];
    }
    if (dw) dw[c] = static_cast<T>(sw);
    if (db) db[c] = static_cast<T>(sb);
  }
  if (t == 0) *blocks_done = 0;
}

// ---- cross-entropy ---------------------------------------------------------------------------------
// logits [N, C], target [N], loss and lse [N], nll [N] or null:
//   loss_i = lse_i - (1 - s) * x[i, t_i] - s / C * sum_c x[i, c]   (0 where t_i == ignore_index)
//   nll_i = lse_i - x[i, t_i]   (the loss at s = 0, rounded as it is)
// A target outside [0, C) (and not ignore_index) gets loss 0 and is reported to the host.
template <typename T>
__global__ void cross_entropy_kernel(const T* x, const int64_t* target, T* loss, T* lse, T* nll, int64_t N, int64_t C,
                                     int64_t ignore_index, T s, DeviceErrorReport* rep) {
  T* sh = shared_mem<T>();
  const T s_over_c = s / static_cast<T>(C);
  for (int64_t cb = blockIdx.x; cb * blockDim.x < N; cb += gridDim.x) {
    const Column row = column_at(cb, N, C, 1);
    const T* xr = x + row.base;
    T m = neg_inf<T>();
    if (row.active)
      for (int64_t c = threadIdx.y; c < C; c += blockDim.y) m = MaxOp()(m, xr[c]);
    m = tree_reduce_y(m, MaxOp(), sh);
    if (m == neg_inf<T>()) m = T(0);
    T se = 0, sx = 0;
    if (row.active)
      for (int64_t c = threadIdx.y; c < C; c += blockDim.y) {
        se += d_exp(xr[c] - m);
        sx += xr[c];
      }
    se = tree_reduce_y(se, SumOp(), sh);
    sx = tree_reduce_y(sx, SumOp(), sh);
    if (!row.active || threadIdx.y != 0) continue;
    const T l = m + d_log(se);
    lse[row.c] = l;
    const int64_t t = target[row.c];
    if (t == ignore_index) {
      loss[row.c] = T(0);
      if (nll) nll[row.c] = T(0);
    } else if (t < 0 || t >= C) {
      report_device_error(rep, DeviceErrorCode::CrossEntropyTarget, t, C);
      loss[row.c] = T(0);
      if (nll) nll[row.c] = T(0);
    } else {
      loss[row.c] = l - (T(1) - s) * xr[t] - (s != T(0) ? s_over_c * sx : T(0));
      if (nll) nll[row.c] = l - xr[t];
    }
  }
}

//   dlogits[i, c] = (exp(x[i, c] - lse_i) - s / C) * grad_i - (c == t_i) * (1 - s) * grad_i
// (0 for ignored rows and rows with a bad target)
template <typename T>
__global__ void cross_entropy_backward_kernel(const T* g, int64_t gs, const T* x, const int64_t* target, const T* lse,
                                              T* dx, int64_t N, int64_t C, int64_t ignore_index, T s) {
  const T s_over_c = s / static_cast<T>(C);
  const int64_t n = N * C;
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < n;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t i = e / C, c = e % C;
    const int64_t t = target[i];
    if (t == ignore_index || t < 0 || t >= C) {
      dx[e] = T(0);
      continue;
    }
    const T gi = g[i * gs];
    T d = (d_exp(x[e] - lse[i]) - s_over_c) * gi;
    if (c == t) d -= (T(1) - s) * gi;
    dx[e] = d;
  }
}

// The mean loss over the rows kept, by one block of kBlockSize threads (blockDim.y): each sums
// its rows in order, then the tree; the count of kept rows likewise. out = sum / max(count, 1).
template <typename T>
__global__ void cross_entropy_mean_kernel(const T* loss, const int64_t* target, int64_t N, int64_t ignore_index, T* out,
                                          T* count) {
  T s = 0;
  int64_t kept = 0;
  for (int64_t i = threadIdx.y; i < N; i += blockDim.y) {
    s += loss[i];
    kept += target[i] != ignore_index;
  }
  s = tree_reduce_y(s, SumOp(), shared_mem<T>());  // the sum's tree, then the count's (8 bytes a thread)
  kept = tree_reduce_y(kept, SumOp(), shared_mem<int64_t>());
  if (threadIdx.y != 0) return;
  const T c = static_cast<T>(kept > 0 ? kept : 1);
  *count = c;
  *out = s / c;
}

// Long columns on many blocks (ColumnRuns, cuda/common.cuh): each run's max m_k and sum s_k of
// exp(x - m_k) into partial [run, 2, columns]; merged per column in order (M = max m_k, S = sum
// s_k exp(m_k - M)) into stats [2, columns]; then every element from its column's (M, S). The
// same expressions as softmax_kernel's (an all -inf column counts its max as 0).
template <typename T>
__global__ void softmax_runs_kernel(const T* x, int64_t columns, int64_t r, int64_t inner, ColumnRuns runs,
                                    T* partial) {
  T* sh = shared_mem<T>();
  const int64_t k0 = runs.begin(), k1 = min(r, k0 + runs.rows);
  for (int64_t cb = blockIdx.x; cb * blockDim.x < columns; cb += gridDim.x) {
    const Column col = column_at(cb, columns, r, inner);
    const T* xc = x + col.base;
    T m = neg_inf<T>();
    if (col.active)
      for (int64_t k = k0 + threadIdx.y; k < k1; k += blockDim.y) m = MaxOp()(m, xc[k * inner]);
    m = tree_reduce_y(m, MaxOp(), sh);
    const T shift = m == neg_inf<T>() ? T(0) : m;
    T s = 0;
    if (col.active)
      for (int64_t k = k0 + threadIdx.y; k < k1; k += blockDim.y) s += d_exp(xc[k * inner] - shift);
    s = tree_reduce_y(s, SumOp(), sh);
    if (!col.active || threadIdx.y != 0) continue;
    partial[2 * blockIdx.y * columns + col.c] = m;
    partial[(2 * blockIdx.y + 1) * columns + col.c] = s;
  }
}

template <typename T>
__global__ void softmax_merge_runs_kernel(const T* partial, ColumnRuns runs, int64_t columns, T* stats) {
  for (int64_t c = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; c < columns;
       c += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    T m = neg_inf<T>();
    for (int64_t k = 0; k < runs.runs; ++k) m = MaxOp()(m, partial[2 * k * columns + c]);
    const T shift = m == neg_inf<T>() ? T(0) : m;
    T s = 0;
    for (int64_t k = 0; k < runs.runs; ++k) {
      const T mk = partial[2 * k * columns + c];
      s += partial[(2 * k + 1) * columns + c] * d_exp((mk == neg_inf<T>() ? T(0) : mk) - shift);
    }
    stats[c] = shift;
    stats[columns + c] = s;
  }
}

template <typename T>
__global__ void softmax_apply_kernel(const T* x, const T* stats, int64_t columns, int64_t r, int64_t inner, bool log,
                                     T* y) {
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < columns * r;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t c = column_of(e, r, inner);
    const T shift = stats[c], s = stats[columns + c];
    y[e] = log ? x[e] - (shift + d_log(s)) : d_exp(x[e] - shift) * (T(1) / s);
  }
}

// The backward's column sums in runs (partial [run, columns], added by sum_runs_kernel), then
// every element from its column's sum.
template <typename T>
__global__ void softmax_backward_runs_kernel(const T* g, const T* y, int64_t columns, int64_t r, int64_t inner,
                                             bool log, ColumnRuns runs, T* partial) {
  T* sh = shared_mem<T>();
  const int64_t k0 = runs.begin(), k1 = min(r, k0 + runs.rows);
  for (int64_t cb = blockIdx.x; cb * blockDim.x < columns; cb += gridDim.x) {
    const Column col = column_at(cb, columns, r, inner);
    T s = 0;
    if (col.active)
      for (int64_t k = k0 + threadIdx.y; k < k1; k += blockDim.y) {
        const int64_t e = col.base + k * inner;
        s += log ? g[e] : g[e] * y[e];
      }
    s = tree_reduce_y(s, SumOp(), sh);
    if (col.active && threadIdx.y == 0) partial[blockIdx.y * columns + col.c] = s;
  }
}

template <typename T>
__global__ void softmax_backward_apply_kernel(const T* g, const T* y, const T* sums, int64_t columns, int64_t r,
                                              int64_t inner, bool log, T* dx) {
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < columns * r;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const T s = sums[column_of(e, r, inner)];
    dx[e] = log ? g[e] - d_exp(y[e]) * s : y[e] * (g[e] - s);
  }
}

// ---- normalize ----------------------------------------------------------------------------------
// x, y [rows, cols], a warp per row (its lanes along the row; the butterfly's sum, the same bits
// every run): y = x / max(|x|, eps).
template <typename T> __global__ void normalize_kernel(const T* x, T eps, int64_t rows, int64_t cols, T* y) {
  const WarpRows w;
  for (int64_t r = w.first; r < rows; r += w.step) {
    const T* xr = x + r * cols;
    T sq = 0;
    for (int64_t c = w.lane; c < cols; c += WarpRows::kLanes) sq += xr[c] * xr[c];
    sq = warp_sum(sq);
    const T norm = sqrt(sq);
    const T inv = T(1) / (norm < eps ? eps : norm);  // a NaN stays
    for (int64_t c = w.lane; c < cols; c += WarpRows::kLanes) y[r * cols + c] = xr[c] * inv;
  }
}

// dx = g inv - x (x . g) inv^3 (inv = 1 / |x|), or g / eps where the norm was clamped.
template <typename T>
__global__ void normalize_backward_kernel(const T* g, const T* x, T eps, int64_t rows, int64_t cols, T* dx) {
  const WarpRows w;
  for (int64_t r = w.first; r < rows; r += w.step) {
    const T *xr = x + r * cols, *gr = g + r * cols;
    T sq = 0, xg = 0;
    for (int64_t c = w.lane; c < cols; c += WarpRows::kLanes) {
      sq += xr[c] * xr[c];
      xg += xr[c] * gr[c];
    }
    sq = warp_sum(sq);
    xg = warp_sum(xg);
    const T norm = sqrt(sq);
    const bool clamped = norm < eps;
    const T inv = T(1) / (clamped ? eps : norm);
    const T along = clamped ? T(0) : xg * inv * inv * inv;
    for (int64_t c = w.lane; c < cols; c += WarpRows::kLanes) dx[r * cols + c] = gr[c] * inv - xr[c] * along;
  }
}

// ---- sums_ratio ----------------------------------------------------------------------------------
// y [rows, cols + 1] holding [num, den] -> out [rows, cols] = num / max(den, tiny), a hidden row 0
// (core/sums_ratio_math.h). A thread an element: each reads its row's den and flag (cached, one
// line a row).
template <typename T>
__global__ void sums_ratio_kernel(const T* y, RowFlags flags, T tiny, int64_t rows, int64_t cols, T* out) {
  const int64_t n = rows * cols;
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < n;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = e / cols, c = e - r * cols;
    const T* yr = y + r * (cols + 1);
    out[e] = flags.shown(r) ? yr[c] / guarded_den(yr[cols], tiny) : T(0);
  }
}

// dy = [g / d, -(g . num) / d^2] (0 at den where den < tiny), a hidden row 0; a warp per row (the
// butterfly's sum).
template <typename T>
__global__ void sums_ratio_backward_kernel(const T* g, const T* y, RowFlags flags, T tiny, int64_t rows, int64_t cols,
                                           T* dy) {
  const WarpRows w;
  for (int64_t r = w.first; r < rows; r += w.step) {
    const T *gr = g + r * cols, *yr = y + r * (cols + 1);
    T* dr = dy + r * (cols + 1);
    if (!flags.shown(r)) {
      for (int64_t c = w.lane; c <= cols; c += WarpRows::kLanes) dr[c] = 0;
      continue;
    }
    const T den = yr[cols], d = guarded_den(den, tiny);
    T gy = 0;
    for (int64_t c = w.lane; c < cols; c += WarpRows::kLanes) {
      dr[c] = gr[c] / d;
      gy += gr[c] * yr[c];
    }
    gy = warp_sum(gy);
    if (w.lane == 0) dr[cols] = den < tiny ? T(0) : -gy / (d * d);
  }
}

// ---- sq_norm -------------------------------------------------------------------------------------
// x [rows, cols] -> y [rows], a warp per row: y_r = scale |x_r|^2 (the butterfly's sum).
template <typename T> __global__ void sq_norm_kernel(const T* x, T scale, int64_t rows, int64_t cols, T* y) {
  const WarpRows w;
  for (int64_t r = w.first; r < rows; r += w.step) {
    const T* xr = x + r * cols;
    T sq = 0;
    for (int64_t c = w.lane; c < cols; c += WarpRows::kLanes) sq += xr[c] * xr[c];
    sq = warp_sum(sq);
    if (w.lane == 0) y[r] = scale * sq;
  }
}

// dx [rows, cols] = 2 scale g_r x_r, a thread an element.
template <typename T>
__global__ void sq_norm_backward_kernel(const T* g, const T* x, T scale, int64_t rows, int64_t cols, T* dx) {
  const int64_t n = rows * cols;
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < n;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x)
    dx[e] = 2 * scale * g[e / cols] * x[e];
}

}  // namespace

// x, out [outer, r, inner]
void softmax(const Tensor& x, const Tensor& out, int64_t outer, int64_t r, int64_t inner, bool log) {
  LINEA_CHECK(x.numel() == outer * r * inner && out.numel() == x.numel(), "softmax: x ", shape_str(x.shape()),
              " does not match [", outer, ", ", r, ", ", inner, "]");
  if (outer * r * inner == 0) return;
  LINEA_DISPATCH_FLOAT(x.dtype(), "softmax", [&] {
    using T = scalar_t;
    const int64_t columns = outer * inner;
    const dim3 block = column_block(r, inner);
    const ColumnRuns runs = column_runs(columns, r, block);
    if (runs.runs == 1) {
      softmax_kernel<T><<<column_grid(columns, block), block, sizeof(T) * kBlockSize, stream()>>>(
          cptr<T>(x), ptr<T>(out), columns, r, inner, log);
      LINEA_KERNEL_LAUNCH_CHECK();
      return;
    }
    DeviceScratch<T> partial(2 * runs.runs * columns), stats(2 * columns);
    softmax_runs_kernel<T><<<column_runs_grid(columns, block, runs), block, sizeof(T) * kBlockSize, stream()>>>(
        cptr<T>(x), columns, r, inner, runs, partial.p);
    LINEA_KERNEL_LAUNCH_CHECK();
    softmax_merge_runs_kernel<T><<<grid_for(columns), kBlockSize, 0, stream()>>>(partial.p, runs, columns, stats.p);
    LINEA_KERNEL_LAUNCH_CHECK();
    softmax_apply_kernel<T>
        <<<grid_for(columns * r), kBlockSize, 0, stream()>>>(cptr<T>(x), stats.p, columns, r, inner, log, ptr<T>(out));
    LINEA_KERNEL_LAUNCH_CHECK();
  });
}

// grad, y, dx [outer, r, inner]; y is the forward output (log-probabilities when log)
void softmax_backward(const Tensor& grad, const Tensor& y, const Tensor& dx, int64_t outer, int64_t r, int64_t inner,
                      bool log) {
  LINEA_CHECK(y.numel() == outer * r * inner && grad.numel() == y.numel() && dx.numel() == y.numel(),
              "softmax_backward: y ", shape_str(y.shape()), " does not match [", outer, ", ", r, ", ", inner, "]");
  if (outer * r * inner == 0) return;
  LINEA_DISPATCH_FLOAT(y.dtype(), "softmax_backward", [&] {
    using T = scalar_t;
    const int64_t columns = outer * inner;
    const dim3 block = column_block(r, inner);
    const ColumnRuns runs = column_runs(columns, r, block);
    if (runs.runs == 1) {
      softmax_backward_kernel<T><<<column_grid(columns, block), block, sizeof(T) * kBlockSize, stream()>>>(
          cptr<T>(grad), cptr<T>(y), ptr<T>(dx), columns, r, inner, log);
      LINEA_KERNEL_LAUNCH_CHECK();
      return;
    }
    DeviceScratch<T> partial(runs.runs * columns), sums(columns);
    softmax_backward_runs_kernel<T>
        <<<column_runs_grid(columns, block, runs), block, sizeof(T) * kBlockSize, stream()>>>(
            cptr<T>(grad), cptr<T>(y), columns, r, inner, log, runs, partial.p);
    LINEA_KERNEL_LAUNCH_CHECK();
    sum_runs_kernel<T, 1>
        <<<grid_for(columns), kBlockSize, 0, stream()>>>(partial.p, runs, columns, RunTotals<T, 1>{{sums.p}, {1}});
    LINEA_KERNEL_LAUNCH_CHECK();
    softmax_backward_apply_kernel<T><<<grid_for(columns * r), kBlockSize, 0, stream()>>>(
        cptr<T>(grad), cptr<T>(y), sums.p, columns, r, inner, log, ptr<T>(dx));
    LINEA_KERNEL_LAUNCH_CHECK();
  });
}

// x, out [rows, cols]; w, b [cols] or undefined; mean, rstd [rows]
void layer_norm(const Tensor& x, const Tensor& w, const Tensor& b, double eps, const Tensor& out, const Tensor& mean,
                const Tensor& rstd, int64_t rows, int64_t cols) {
  LINEA_CHECK(x.numel() == rows * cols && out.numel() == x.numel() && mean.numel() == rows && rstd.numel() == rows,
              "layer_norm: x ", shape_str(x.shape()), " does not match [", rows, ", ", cols, "]");
  if (rows == 0 || cols == 0) return;
  LINEA_DISPATCH_FLOAT(x.dtype(), "layer_norm", [&] {
    using T = scalar_t;
    const dim3 block = column_block(cols, 1);
    layer_norm_kernel<T><<<column_grid(rows, block), block, sizeof(T) * kBlockSize, stream()>>>(
        cptr<T>(x), nullptr, Dropout<T>(), nullptr, cptr_or_null<T>(w), cptr_or_null<T>(b), static_cast<T>(eps),
        ptr<T>(out), ptr<T>(mean), ptr<T>(rstd), rows, cols);
    LINEA_KERNEL_LAUNCH_CHECK();
  });
}

// x, r, sum, out [rows, cols] (r [batch, ...] for its dropout); w, b [cols] or undefined; mean, rstd [rows]
void add_layer_norm(const Tensor& x, const Tensor& r, const FoldedDropout& drop, const Tensor& w, const Tensor& b,
                    double eps, const Tensor& sum, const Tensor& out, const Tensor& mean, const Tensor& rstd,
                    int64_t rows, int64_t cols) {
  LINEA_CHECK(
      x.numel() == rows * cols && r.numel() == x.numel() && sum.numel() == x.numel() && out.numel() == x.numel(),
      "add_layer_norm: x ", shape_str(x.shape()), " and r ", shape_str(r.shape()), " do not match [", rows, ", ", cols,
      "]");
  if (rows == 0 || cols == 0) return;
  LINEA_DISPATCH_FLOAT(x.dtype(), "add_layer_norm", [&] {
    using T = scalar_t;
    Dropout<T> d;
    d.ex = example_dropout<T>(drop);
    d.len = r.numel() / std::max<int64_t>(r.size(0), 1);
    d.base = drop.draw_base;
    const dim3 block = column_block(cols, 1);
    layer_norm_kernel<T><<<column_grid(rows, block), block, sizeof(T) * kBlockSize, stream()>>>(
        cptr<T>(x), cptr<T>(r), d, ptr<T>(sum), cptr_or_null<T>(w), cptr_or_null<T>(b), static_cast<T>(eps),
        ptr<T>(out), ptr<T>(mean), ptr<T>(rstd), rows, cols);
    LINEA_KERNEL_LAUNCH_CHECK();
  });
}

namespace {
// layer_norm_backward's launch; add_layer_norm's with gsum, dres and drop (else null, off).
template <typename T>
void launch_layer_norm_backward(const Tensor& grad, const T* gsum, const Tensor& x, const Tensor& w, const Tensor& mean,
                                const Tensor& rstd, const Dropout<T>& drop, const Tensor& dx, T* dres, const Tensor& dw,
                                const Tensor& db, int64_t rows, int64_t cols) {
  const bool sums = dw.defined() || db.defined();
  if (rows == 0) {  // empty sums
    if (dw.defined()) fill(dw, 0.0);
    if (db.defined()) fill(db, 0.0);
    return;
  }
  // Chunks of at least 64 rows, at most 1024 of them (the last block adds that many partials).
  constexpr int64_t kMinChunk = 64, kMaxChunks = 1024;
  const int64_t chunk = std::max<int64_t>(kMinChunk, (rows + kMaxChunks - 1) / kMaxChunks);
  const int64_t nchunks = (rows + chunk - 1) / chunk;
  const size_t part_bytes = sums ? sizeof(double) * static_cast<size_t>(nchunks * cols) : 0;
  DeviceBuffer part_w(dw.defined() ? part_bytes : 0), part_b(db.defined() ? part_bytes : 0);
  const dim3 block = column_block(cols, 1);
  layer_norm_backward_kernel<T><<<static_cast<unsigned>(nchunks), block, sizeof(T) * kBlockSize, stream()>>>(
      cptr<T>(grad), gsum, cptr<T>(x), cptr_or_null<T>(w), cptr<T>(mean), cptr<T>(rstd), drop, ptr<T>(dx), dres,
      dw.defined() ? part_w.as<double>() : nullptr, db.defined() ? part_b.as<double>() : nullptr, ptr_or_null<T>(dw),
      ptr_or_null<T>(db), rows, cols, chunk, sums ? blocks_done_counter() : nullptr);
  LINEA_KERNEL_LAUNCH_CHECK();
}
}  // namespace

// grad, x, dx [rows, cols]; w [cols] or undefined; mean, rstd [rows]; dw, db [cols] or undefined
void layer_norm_backward(const Tensor& grad, const Tensor& x, const Tensor& w, const Tensor& mean, const Tensor& rstd,
                         const Tensor& dx, const Tensor& dw, const Tensor& db, int64_t rows, int64_t cols) {
  LINEA_CHECK(x.numel() == rows * cols && grad.numel() == x.numel() && dx.numel() == x.numel(),
              "layer_norm_backward: x ", shape_str(x.shape()), " does not match [", rows, ", ", cols, "]");
  if (cols == 0) return;
  LINEA_DISPATCH_FLOAT(x.dtype(), "layer_norm_backward", [&] {
    launch_layer_norm_backward<scalar_t>(grad, nullptr, x, w, mean, rstd, Dropout<scalar_t>(), dx, nullptr, dw, db,
                                         rows, cols);
  });
}

// grad, grad_sum (or undefined), x, dx, dr (or undefined) [rows, cols], x's first dim the batch of
// the dropout's draw; w [cols] or undefined; mean, rstd [rows]; dw, db [cols] or undefined
void add_layer_norm_backward(const Tensor& grad, const Tensor& grad_sum, const Tensor& x, const Tensor& w,
                             const Tensor& mean, const Tensor& rstd, const FoldedDropout& drop, const Tensor& dx,
                             const Tensor& dr, const Tensor& dw, const Tensor& db, int64_t rows, int64_t cols) {
  LINEA_CHECK(x.numel() == rows * cols && grad.numel() == x.numel() && dx.numel() == x.numel() &&
                  (!grad_sum.defined() || grad_sum.numel() == x.numel()) && (!dr.defined() || dr.numel() == x.numel()),
              "add_layer_norm_backward: x ", shape_str(x.shape()), " does not match [", rows, ", ", cols, "]");
  if (cols == 0) return;
  LINEA_DISPATCH_FLOAT(x.dtype(), "add_layer_norm_backward", [&] {
    using T = scalar_t;
    Dropout<T> d;  // the forward's (add_layer_norm above)
    if (dr.defined()) {
      d.ex = example_dropout<T>(drop);
      d.len = x.numel() / std::max<int64_t>(x.size(0), 1);
      d.base = drop.draw_base;
    }
    launch_layer_norm_backward<T>(grad, grad_sum.defined() ? cptr<T>(grad_sum) : nullptr, x, w, mean, rstd, d, dx,
                                  dr.defined() ? ptr<T>(dr) : nullptr, dw, db, rows, cols);
  });
}

// x, out [rows, cols]
void normalize(const Tensor& x, double eps, const Tensor& out, int64_t rows, int64_t cols) {
  if (rows == 0 || cols == 0) return;
  LINEA_DISPATCH_FLOAT(x.dtype(), "normalize", [&] {
    using T = scalar_t;
    normalize_kernel<T><<<grid_for_warp_rows(rows), kBlockSize, 0, stream()>>>(cptr<T>(x), static_cast<T>(eps), rows,
                                                                               cols, ptr<T>(out));
    LINEA_KERNEL_LAUNCH_CHECK();
  });
}

// grad, x, dx [rows, cols]
void normalize_backward(const Tensor& grad, const Tensor& x, double eps, const Tensor& dx, int64_t rows, int64_t cols) {
  if (rows == 0 || cols == 0) return;
  LINEA_DISPATCH_FLOAT(x.dtype(), "normalize_backward", [&] {
    using T = scalar_t;
    normalize_backward_kernel<T><<<grid_for_warp_rows(rows), kBlockSize, 0, stream()>>>(
        cptr<T>(grad), cptr<T>(x), static_cast<T>(eps), rows, cols, ptr<T>(dx));
    LINEA_KERNEL_LAUNCH_CHECK();
  });
}

// y [rows, cols + 1], out [rows, cols], visible Bool [groups, per] or undefined
void sums_ratio(const Tensor& y, const Tensor& visible, int64_t group_rows, double tiny, const Tensor& out,
                int64_t rows, int64_t cols) {
  if (rows == 0 || cols == 0) return;
  LINEA_DISPATCH_FLOAT(y.dtype(), "sums_ratio", [&] {
    using T = scalar_t;
    sums_ratio_kernel<T><<<grid_for(rows * cols), kBlockSize, 0, stream()>>>(
        cptr<T>(y), RowFlags(visible, group_rows), static_cast<T>(tiny), rows, cols, ptr<T>(out));
    LINEA_KERNEL_LAUNCH_CHECK();
  });
}

// grad [rows, cols], y and dy [rows, cols + 1]
void sums_ratio_backward(const Tensor& grad, const Tensor& y, const Tensor& visible, int64_t group_rows, double tiny,
                         const Tensor& dy, int64_t rows, int64_t cols) {
  if (rows == 0) return;
  LINEA_DISPATCH_FLOAT(y.dtype(), "sums_ratio_backward", [&] {
    using T = scalar_t;
    sums_ratio_backward_kernel<T><<<grid_for_warp_rows(rows), kBlockSize, 0, stream()>>>(
        cptr<T>(grad), cptr<T>(y), RowFlags(visible, group_rows), static_cast<T>(tiny), rows, cols, ptr<T>(dy));
    LINEA_KERNEL_LAUNCH_CHECK();
  });
}

// x [rows, cols], out [rows]
void sq_norm(const Tensor& x, double scale, const Tensor& out, int64_t rows, int64_t cols) {
  if (rows == 0) return;
  LINEA_DISPATCH_FLOAT(x.dtype(), "sq_norm", [&] {
    using T = scalar_t;
    sq_norm_kernel<T><<<grid_for_warp_rows(rows), kBlockSize, 0, stream()>>>(cptr<T>(x), static_cast<T>(scale), rows,
                                                                             cols, ptr<T>(out));
    LINEA_KERNEL_LAUNCH_CHECK();
  });
}

// grad [rows], x and dx [rows, cols]
void sq_norm_backward(const Tensor& grad, const Tensor& x, double scale, const Tensor& dx, int64_t rows, int64_t cols) {
  if (rows == 0 || cols == 0) return;
  LINEA_DISPATCH_FLOAT(x.dtype(), "sq_norm_backward", [&] {
    using T = scalar_t;
    sq_norm_backward_kernel<T><<<grid_for(rows * cols), kBlockSize, 0, stream()>>>(
        cptr<T>(grad), cptr<T>(x), static_cast<T>(scale), rows, cols, ptr<T>(dx));
    LINEA_KERNEL_LAUNCH_CHECK();
  });
}

// logits [N, C], target Int64 [N], loss and lse [N], nll [N] or undefined
void cross_entropy(const Tensor& logits, const Tensor& target, int64_t ignore_index, double smoothing,
                   const Tensor& loss, const Tensor& lse, const Tensor& nll) {
  LINEA_CHECK(logits.dim() == 2 && target.numel() == logits.size(0) && loss.numel() == logits.size(0) &&
                  lse.numel() == logits.size(0) && (!nll.defined() || nll.numel() == logits.size(0)),
              "cross_entropy: logits ", shape_str(logits.shape()), ", target ", shape_str(target.shape()));
  const int64_t N = logits.size(0), C = logits.size(1);
  if (N == 0 || C == 0) return;
  LINEA_DISPATCH_FLOAT(logits.dtype(), "cross_entropy", [&] {
    using T = scalar_t;
    const dim3 block = column_block(C, 1);
    cross_entropy_kernel<T><<<column_grid(N, block), block, sizeof(T) * kBlockSize, stream()>>>(
        cptr<T>(logits), cptr<int64_t>(target), ptr<T>(loss), ptr<T>(lse), ptr_or_null<T>(nll), N, C, ignore_index,
        static_cast<T>(smoothing), device_error_report());
    LINEA_KERNEL_LAUNCH_CHECK();
  });
}

// loss and target Int64 [N]; out and count 0-d
void cross_entropy_mean(const Tensor& loss, const Tensor& target, int64_t ignore_index, const Tensor& out,
                        const Tensor& count) {
  LINEA_DISPATCH_FLOAT(loss.dtype(), "cross_entropy_mean", [&] {
    using T = scalar_t;
    cross_entropy_mean_kernel<T><<<1, dim3(1, kBlockSize), sizeof(int64_t) * kBlockSize, stream()>>>(
        cptr<T>(loss), cptr<int64_t>(target), loss.numel(), ignore_index, ptr<T>(out), ptr<T>(count));
    LINEA_KERNEL_LAUNCH_CHECK();
  });
}

// grad [N] (any stride), logits and dlogits [N, C], target Int64 [N], lse [N]
void cross_entropy_backward(const Tensor& grad, const Tensor& logits, const Tensor& target, const Tensor& lse,
                            int64_t ignore_index, double smoothing, const Tensor& dlogits) {
  LINEA_CHECK(logits.dim() == 2 && dlogits.numel() == logits.numel() && grad.numel() == logits.size(0) &&
                  target.numel() == logits.size(0) && lse.numel() == logits.size(0),
              "cross_entropy_backward: logits ", shape_str(logits.shape()), ", grad ", shape_str(grad.shape()));
  const int64_t N = logits.size(0), C = logits.size(1);
  if (N == 0 || C == 0) return;
  LINEA_DISPATCH_FLOAT(logits.dtype(), "cross_entropy_backward", [&] {
    using T = scalar_t;
    cross_entropy_backward_kernel<T><<<grid_for(N * C), kBlockSize, 0, stream()>>>(
        cptr<T>(grad), grad.stride(0), cptr<T>(logits), cptr<int64_t>(target), cptr<T>(lse), ptr<T>(dlogits), N, C,
        ignore_index, static_cast<T>(smoothing));
    LINEA_KERNEL_LAUNCH_CHECK();
  });
}

}  // namespace linea::cuda
