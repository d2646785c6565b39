// CUDA kernels of the fused neural-net ops: softmax / log_softmax, layer_norm and per-row
// cross-entropy, forward and backward (namespace linea::cuda, contracts in core/kernels.h).
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
// x, y [rows, cols]; w, b [cols] or null; mean, rstd [rows]
template <typename T>
__global__ void layer_norm_kernel(const T* x, const T* w, const T* b, T eps, T* y, T* mean, T* rstd, int64_t rows,
                                  int64_t cols) {
  T* sh = shared_mem<T>();
  const T inv_cols = T(1) / static_cast<T>(cols);
  for (int64_t cb = blockIdx.x; cb * blockDim.x < rows; cb += gridDim.x) {
    const Column row = column_at(cb, rows, cols, 1);
    const T* xr = x + row.base;
    T* yr = y + row.base;
    T s = 0;
    if (row.active)
      for (int64_t c = threadIdx.y; c < cols; c += blockDim.y) s += xr[c];
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

// With xhat = (x - mean) * rstd and gw = grad * w:
//   dx = rstd * (gw - mean_c(gw) - xhat * mean_c(gw * xhat))
template <typename T>
__global__ void layer_norm_backward_dx_kernel(const T* g, const T* x, const T* w, const T* mean, const T* rstd, T* dx,
                                              int64_t rows, int64_t cols) {
  T* sh = shared_mem<T>();
  const T inv_cols = T(1) / static_cast<T>(cols);
  for (int64_t cb = blockIdx.x; cb * blockDim.x < rows; cb += gridDim.x) {
    const Column row = column_at(cb, rows, cols, 1);
    const T* gr = g + row.base;
    const T* xr = x + row.base;
    T* dr = dx + row.base;
    const T mu = row.active ? mean[row.c] : T(0), rs = row.active ? rstd[row.c] : T(0);
    T sum_gw = 0, sum_gwx = 0;
    if (row.active)
      for (int64_t c = threadIdx.y; c < cols; c += blockDim.y) {
        const T gw = w ? gr[c] * w[c] : gr[c];
        sum_gw += gw;
        sum_gwx += gw * (xr[c] - mu) * rs;
      }
    sum_gw = tree_reduce_y(sum_gw, SumOp(), sh);
    sum_gwx = tree_reduce_y(sum_gwx, SumOp(), sh);
    if (!row.active) continue;
    const T a = sum_gw * inv_cols, q = sum_gwx * inv_cols;
    for (int64_t c = threadIdx.y; c < cols; c += blockDim.y) {
      const T gw = w ? gr[c] * w[c] : gr[c];
      dr[c] = rs * (gw - a - (xr[c] - mu) * rs * q);
    }
  }
}

// Pass 1 of dw = sum_rows grad * xhat, db = sum_rows grad: rows in chunks of `chunk`;
// pw[k, c], pb[k, c] (double) = the sums over chunk k (either may be null).
template <typename T>
__global__ void layer_norm_dwdb_partial_kernel(const T* g, const T* x, const T* mean, const T* rstd, double* pw,
                                               double* pb, int64_t rows, int64_t cols, int64_t nchunks, int64_t chunk) {
  double* sh = shared_mem<double>();
  const int64_t columns = nchunks * cols;
  for (int64_t cb = blockIdx.x; cb * blockDim.x < columns; cb += gridDim.x) {
    const int64_t cc = cb * blockDim.x + threadIdx.x;
    const bool active = cc < columns;
    const int64_t k = cc / cols, c = cc % cols;
    const int64_t r0 = k * chunk, r1 = min(rows, r0 + chunk);
    double sw = 0, sb = 0;
    if (active)
      for (int64_t i = r0 + threadIdx.y; i < r1; i += blockDim.y) {
        const T gv = g[i * cols + c];
        if (pw) sw += static_cast<double>(gv * (x[i * cols + c] - mean[i]) * rstd[i]);
        sb += static_cast<double>(gv);
      }
    if (pw) {
      sw = tree_reduce_y(sw, SumOp(), sh);
      if (active && threadIdx.y == 0) pw[cc] = sw;
    }
    if (pb) {
      sb = tree_reduce_y(sb, SumOp(), sh);
      if (active && threadIdx.y == 0) pb[cc] = sb;
    }
  }
}

// Pass 2: out[c] = sum_k part[k, c] (out null: nothing to do).
template <typename T> __global__ void sum_chunks_kernel(const double* part, T* out, int64_t nchunks, int64_t cols) {
  double* sh = shared_mem<double>();
  for (int64_t cb = blockIdx.x; cb * blockDim.x < cols; cb += gridDim.x) {
    const int64_t c = cb * blockDim.x + threadIdx.x;
    double s = 0;
    if (c < cols)
      for (int64_t k = threadIdx.y; k < nchunks; k += blockDim.y) s += part[k * cols + c];
    s = tree_reduce_y(s, SumOp(), sh);
    if (c < cols && threadIdx.y == 0) out[c] = static_cast<T>(s);
  }
}

// ---- cross-entropy ---------------------------------------------------------------------------------
// logits [N, C], target [N], loss and lse [N]:
//   loss_i = lse_i - (1 - s) * x[i, t_i] - s / C * sum_c x[i, c]   (0 where t_i == ignore_index)
// A target outside [0, C) (and not ignore_index) gets loss 0 and is reported to the host.
template <typename T>
__global__ void cross_entropy_kernel(const T* x, const int64_t* target, T* loss, T* lse, int64_t N, int64_t C,
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
    } else if (t < 0 || t >= C) {
      report_device_error(rep, DeviceErrorCode::CrossEntropyTarget, t, C);
      loss[row.c] = T(0);
    } else {
      loss[row.c] = l - (T(1) - s) * xr[t] - (s != T(0) ? s_over_c * sx : T(0));
    }
  }
}

//   dlogits[i, c] = (exp(x[i, c] - lse_i) - s / C) * grad_i - (c == t_i) * (1 - s) * grad_i
// (0 for ignored rows and rows with a bad target)
template <typename T>
__global__ void cross_entropy_backward_kernel(const T* g, const T* x, const int64_t* target, const T* lse, T* dx,
                                              int64_t N, int64_t C, int64_t ignore_index, T s) {
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
    const T gi = g[i];
    T d = (d_exp(x[e] - lse[i]) - s_over_c) * gi;
    if (c == t) d -= (T(1) - s) * gi;
    dx[e] = d;
  }
}

template <typename T> const T* cptr_or_null(const Tensor& t) { return t.defined() ? cptr<T>(t) : nullptr; }
template <typename T> T* ptr_or_null(const Tensor& t) { return t.defined() ? ptr<T>(t) : nullptr; }

}  // namespace

// x, out [outer, r, inner]
void softmax(const Tensor& x, const Tensor& out, int64_t outer, int64_t r, int64_t inner, bool log) {
  LINEA_CHECK(x.numel() == outer * r * inner && out.numel() == x.numel(), "softmax: x ", shape_str(x.shape()),
              " does not match [", outer, ", ", r, ", ", inner, "]");
  if (outer * r * inner == 0) return;
  LINEA_DISPATCH_FLOAT(x.dtype(), "softmax", [&] {
    const int64_t columns = outer * inner;
    const dim3 block = column_block(r, inner);
    softmax_kernel<scalar_t><<<column_grid(columns, block), block, sizeof(scalar_t) * kBlockSize, stream()>>>(
        cptr<scalar_t>(x), ptr<scalar_t>(out), columns, r, inner, log);
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
    const int64_t columns = outer * inner;
    const dim3 block = column_block(r, inner);
    softmax_backward_kernel<scalar_t><<<column_grid(columns, block), block, sizeof(scalar_t) * kBlockSize, stream()>>>(
        cptr<scalar_t>(grad), cptr<scalar_t>(y), ptr<scalar_t>(dx), columns, r, inner, log);
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
        cptr<T>(x), cptr_or_null<T>(w), cptr_or_null<T>(b), static_cast<T>(eps), ptr<T>(out), ptr<T>(mean),
        ptr<T>(rstd), rows, cols);
    LINEA_KERNEL_LAUNCH_CHECK();
  });
}

// grad, x, dx [rows, cols]; w [cols] or undefined; mean, rstd [rows]; dw, db [cols] or undefined
void layer_norm_backward(const Tensor& grad, const Tensor& x, const Tensor& w, const Tensor& mean, const Tensor& rstd,
                         const Tensor& dx, const Tensor& dw, const Tensor& db, int64_t rows, int64_t cols) {
  LINEA_CHECK(x.numel() == rows * cols && grad.numel() == x.numel() && dx.numel() == x.numel(),
              "layer_norm_backward: x ", shape_str(x.shape()), " does not match [", rows, ", ", cols, "]");
  if (cols == 0) return;
  LINEA_DISPATCH_FLOAT(x.dtype(), "layer_norm_backward", [&] {
    using T = scalar_t;
    if (rows > 0) {
      const dim3 block = column_block(cols, 1);
      layer_norm_backward_dx_kernel<T><<<column_grid(rows, block), block, sizeof(T) * kBlockSize, stream()>>>(
          cptr<T>(grad), cptr<T>(x), cptr_or_null<T>(w), cptr<T>(mean), cptr<T>(rstd), ptr<T>(dx), rows, cols);
      LINEA_KERNEL_LAUNCH_CHECK();
    }
    if (!dw.defined() && !db.defined()) return;
    if (rows == 0) {  // empty sums
      if (dw.defined()) fill(dw, 0.0);
      if (db.defined()) fill(db, 0.0);
      return;
    }
    // Pass 1 over chunks of rows, pass 2 over the chunks (both column reductions).
    constexpr int64_t kRowsPerChunk = 64, kMaxChunks = 1024;
    const int64_t nchunks = std::min<int64_t>((rows + kRowsPerChunk - 1) / kRowsPerChunk, kMaxChunks);
    const int64_t chunk = (rows + nchunks - 1) / nchunks;
    const size_t part_bytes = sizeof(double) * static_cast<size_t>(nchunks * cols);
    DeviceBuffer part_w(dw.defined() ? part_bytes : 0), part_b(db.defined() ? part_bytes : 0);
    const dim3 block1 = column_block(chunk, cols);
    layer_norm_dwdb_partial_kernel<T>
        <<<column_grid(nchunks * cols, block1), block1, sizeof(double) * kBlockSize, stream()>>>(
            cptr<T>(grad), cptr<T>(x), cptr<T>(mean), cptr<T>(rstd), part_w.as<double>(), part_b.as<double>(), rows,
            cols, nchunks, chunk);
    LINEA_KERNEL_LAUNCH_CHECK();
    const dim3 block2 = column_block(nchunks, cols);
    if (dw.defined()) {
      sum_chunks_kernel<T><<<column_grid(cols, block2), block2, sizeof(double) * kBlockSize, stream()>>>(
          part_w.as<double>(), ptr<T>(dw), nchunks, cols);
      LINEA_KERNEL_LAUNCH_CHECK();
    }
    if (db.defined()) {
      sum_chunks_kernel<T><<<column_grid(cols, block2), block2, sizeof(double) * kBlockSize, stream()>>>(
          part_b.as<double>(), ptr<T>(db), nchunks, cols);
      LINEA_KERNEL_LAUNCH_CHECK();
    }
  });
}

// logits [N, C], target Int64 [N], loss and lse [N]
void cross_entropy(const Tensor& logits, const Tensor& target, int64_t ignore_index, double smoothing,
                   const Tensor& loss, const Tensor& lse) {
  LINEA_CHECK(logits.dim() == 2 && target.numel() == logits.size(0) && loss.numel() == logits.size(0) &&
                  lse.numel() == logits.size(0),
              "cross_entropy: logits ", shape_str(logits.shape()), ", target ", shape_str(target.shape()));
  const int64_t N = logits.size(0), C = logits.size(1);
  if (N == 0 || C == 0) return;
  LINEA_DISPATCH_FLOAT(logits.dtype(), "cross_entropy", [&] {
    using T = scalar_t;
    const dim3 block = column_block(C, 1);
    cross_entropy_kernel<T><<<column_grid(N, block), block, sizeof(T) * kBlockSize, stream()>>>(
        cptr<T>(logits), cptr<int64_t>(target), ptr<T>(loss), ptr<T>(lse), N, C, ignore_index,
        static_cast<T>(smoothing), device_error_report());
    LINEA_KERNEL_LAUNCH_CHECK();
  });
}

// grad [N], logits and dlogits [N, C], target Int64 [N], lse [N]
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
        cptr<T>(grad), cptr<T>(logits), cptr<int64_t>(target), cptr<T>(lse), ptr<T>(dlogits), N, C, ignore_index,
        static_cast<T>(smoothing));
    LINEA_KERNEL_LAUNCH_CHECK();
  });
}

}  // namespace linea::cuda
