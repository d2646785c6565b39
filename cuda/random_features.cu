// Positive random features on CUDA (core/kernels.h; the CPU twin in core/cpu/random_features.cpp,
// same formulas): phi = exp(x W_h^T - |x|^2/2 - c) / sqrt(S).
//   forward   l = x W_h^T, one strided-batched GEMM over (b, h) against W repeated per example
//             (B H S D values: a copy beside the GEMM in place of one GEMM per head); one warp per
//             row subtracts |x|^2/2, zeroes padded rows and, per_row, takes c = the row's max
//             and the exp; otherwise one block per (b, h) takes c = the max of its unpadded
//             rows and an elementwise pass the exp.
//   backward  dl = dphi * phi with its row sums; dx = dl W_h (one GEMM, as the forward's) -
//             (sum_s dl) x; dW_h = sum_b dl_bh^T x_bh: one GEMM into per-(b, h) parts, summed
//             over b in order.
// Every sum is a GEMM's, a fixed tree or a warp's butterfly: the same bits every run.
#include <cmath>

#include "core/kernels.h"
#include "cuda/common.cuh"

namespace linea::cuda {

using namespace detail;

namespace {

struct FeatureDims {
  int64_t B, H, L, D, S;
};

// Per row of l [B H L, S]: l -= |x|^2 / 2; padded rows get 0 (and rowmax lowest); per_row: the exp
// with the row's max; else rowmax[row] = the row's max for the sequence stabilizer.
template <typename T>
__global__ void shift_rows_kernel(const T* x, const uint8_t* pad, FeatureDims d, bool per_row, T inv_sqrt_s, T* phi,
                                  T* rowmax) {
  const WarpRows w;
  const int lane = w.lane, lanes = WarpRows::kLanes;
  for (int64_t r = w.first; r < d.B * d.H * d.L; r += w.step) {
    const int64_t b = r / (d.H * d.L), pos = r % d.L;
    T* l = phi + r * d.S;
    if (pad && pad[b * d.L + pos]) {
      for (int64_t s = lane; s < d.S; s += lanes) l[s] = T(0);
      if (!per_row && lane == 0) rowmax[r] = lowest<T>();
      continue;
    }
    T half = T(0);
    for (int64_t j = lane; j < d.D; j += lanes) half += x[r * d.D + j] * x[r * d.D + j];
    half = warp_sum(half) * T(0.5);
    T mx = lowest<T>();
    for (int64_t s = lane; s < d.S; s += lanes) {
      l[s] -= half;
      mx = l[s] > mx ? l[s] : mx;
    }
    mx = warp_max(mx);
    if (per_row) {
      for (int64_t s = lane; s < d.S; s += lanes) l[s] = d_exp(l[s] - mx) * inv_sqrt_s;
    } else if (lane == 0) {
      rowmax[r] = mx;
    }
  }
}

// c[bh] = the max of rowmax over the (b, h)'s L rows: one block per (b, h).
template <typename T> __global__ void sequence_max_kernel(const T* rowmax, int64_t L, T* c) {
  T* sh = shared_mem<T>();
  const int64_t bh = blockIdx.x;
  T mx = lowest<T>();
  for (int64_t r = threadIdx.x; r < L; r += blockDim.x) mx = max(mx, rowmax[bh * L + r]);
  sh[threadIdx.x] = mx;
  __syncthreads();
  for (unsigned s = blockDim.x / 2; s > 0; s /= 2) {
    if (threadIdx.x < s) sh[threadIdx.x] = max(sh[threadIdx.x], sh[threadIdx.x + s]);
    __syncthreads();
  }
  if (threadIdx.x == 0) c[bh] = sh[0];
}

// phi = exp(l - c[bh]) / sqrt(S) on the unpadded rows; a warp per row, which finds its (b, h) and
// position once (a flat index per element took four 64-bit divisions an element, each a software
// routine of tens of instructions on a GPU).
template <typename T>
__global__ void exp_sequence_kernel(const uint8_t* pad, const T* c, FeatureDims d, T inv_sqrt_s, T* phi) {
  const WarpRows w;
  for (int64_t r = w.first; r < d.B * d.H * d.L; r += w.step) {
    const int64_t bh = r / d.L, pos = r - bh * d.L;
    if (pad && pad[bh / d.H * d.L + pos]) continue;
    const T cb = c[bh];
    T* row = phi + r * d.S;
    for (int64_t s = w.lane; s < d.S; s += WarpRows::kLanes) row[s] = d_exp(row[s] - cb) * inv_sqrt_s;
  }
}

// dl = dphi * phi and its row sums rs.
template <typename T> __global__ void dl_kernel(const T* dphi, const T* phi, FeatureDims d, T* dl, T* rs) {
  const WarpRows w;
  for (int64_t r = w.first; r < d.B * d.H * d.L; r += w.step) {
    T sum = T(0);
    for (int64_t s = w.lane; s < d.S; s += WarpRows::kLanes) {
      const T g = dphi[r * d.S + s] * phi[r * d.S + s];
      dl[r * d.S + s] = g;
      sum += g;
    }
    sum = warp_sum(sum);
    if (w.lane == 0) rs[r] = sum;
  }
}

// w_rep [B, H S D] = w [H S D] for every example b: the GEMMs' per-(b, h) right operand.
template <typename T> __global__ void repeat_batches_kernel(const T* w, int64_t B, int64_t n, T* w_rep) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < B * n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    w_rep[i] = w[i % n];
}

// W repeated for each example, [B, H, S, D] (scratch for one call's GEMMs).
template <typename T> struct RepeatedOmega {
  DeviceScratch<T> w;
  RepeatedOmega(const Tensor& omega, int64_t B) : w(B * omega.numel()) {
    repeat_batches_kernel<T>
        <<<grid_for(B * omega.numel()), kBlockSize, 0, stream()>>>(cptr<T>(omega), B, omega.numel(), w.p);
    LINEA_KERNEL_LAUNCH_CHECK();
  }
};

// dw [H S D] = sum over b of parts [B, H S D], in order of b.
template <typename T> __global__ void sum_batches_kernel(const T* parts, int64_t B, int64_t n, T* dw) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    T acc = T(0);
    for (int64_t b = 0; b < B; ++b) acc += parts[b * n + i];
    dw[i] = acc;
  }
}

FeatureDims dims_of(const Tensor& x, const Tensor& omega) {
  return {x.size(0), x.size(1), x.size(2), x.size(3), omega.size(1)};
}

}  // namespace

void positive_features_forward(const Tensor& x, const Tensor& omega, bool per_row, const Tensor& pad,
                               const Tensor& phi) {
  const FeatureDims d = dims_of(x, omega);
  const int64_t rows = d.B * d.H * d.L;
  LINEA_DISPATCH_FLOAT(x.dtype(), "positive_features", [&] {
    using T = scalar_t;
    const T inv_sqrt_s = static_cast<T>(1.0 / std::sqrt(static_cast<double>(d.S)));
    const uint8_t* pad_p = pad.defined() ? cptr<uint8_t>(pad) : nullptr;
    {  // l_bh [L, S] = x_bh [L, D] W_h^T [D, S]
      const RepeatedOmega<T> w(omega, d.B);
      gemm_strided<T>(cptr<T>(x), false, d.D, d.L * d.D, w.w.p, true, d.D, d.S * d.D, ptr<T>(phi), d.S, d.L * d.S, d.L,
                      d.S, d.D, d.B * d.H, 1.0);
    }
    DeviceScratch<T> rowmax(per_row ? 1 : rows), c(per_row ? 1 : d.B * d.H);
    shift_rows_kernel<T><<<grid_for_warp_rows(rows), kBlockSize, 0, stream()>>>(cptr<T>(x), pad_p, d, per_row,
                                                                                inv_sqrt_s, ptr<T>(phi), rowmax.p);
    LINEA_KERNEL_LAUNCH_CHECK();
    if (per_row) return;
    sequence_max_kernel<T>
        <<<static_cast<unsigned>(d.B * d.H), kBlockSize, sizeof(T) * kBlockSize, stream()>>>(rowmax.p, d.L, c.p);
    LINEA_KERNEL_LAUNCH_CHECK();
    exp_sequence_kernel<T>
        <<<grid_for_warp_rows(rows), kBlockSize, 0, stream()>>>(pad_p, c.p, d, inv_sqrt_s, ptr<T>(phi));
    LINEA_KERNEL_LAUNCH_CHECK();
  });
}

void positive_features_backward(const Tensor& x, const Tensor& omega, const Tensor& phi, const Tensor& dphi,
                                const Tensor& dx, const Tensor& domega) {
  const FeatureDims d = dims_of(x, omega);
  const int64_t rows = d.B * d.H * d.L;
  LINEA_DISPATCH_FLOAT(x.dtype(), "positive_features_backward", [&] {
    using T = scalar_t;
    DeviceScratch<T> dl(rows * d.S), rs(rows);
    dl_kernel<T><<<grid_for_warp_rows(rows), kBlockSize, 0, stream()>>>(cptr<T>(dphi), cptr<T>(phi), d, dl.p, rs.p);
    LINEA_KERNEL_LAUNCH_CHECK();
    {  // dx_bh [L, D] = dl_bh [L, S] W_h [S, D]
      const RepeatedOmega<T> w(omega, d.B);
      gemm_strided<T>(dl.p, false, d.S, d.L * d.S, w.w.p, false, d.D, d.S * d.D, ptr<T>(dx), d.D, d.L * d.D, d.L, d.D,
                      d.S, d.B * d.H, 1.0);
    }
    // dx -= rs x
    subtract_scaled_rows_kernel<T>
        <<<grid_for_warp_rows(rows), kBlockSize, 0, stream()>>>(rs.p, cptr<T>(x), rows, d.D, ptr<T>(dx));
    LINEA_KERNEL_LAUNCH_CHECK();
    if (!domega.defined()) return;
    const int64_t n = d.H * d.S * d.D;
    DeviceScratch<T> parts(d.B * n);
    // parts[b, h] [S, D] = dl_bh^T [S, L] x_bh [L, D]
    gemm_strided<T>(dl.p, true, d.S, d.L * d.S, cptr<T>(x), false, d.D, d.L * d.D, parts.p, d.D, d.S * d.D, d.S, d.D,
                    d.L, d.B * d.H, 1.0);
    sum_batches_kernel<T><<<grid_for(n), kBlockSize, 0, stream()>>>(parts.p, d.B, n, ptr<T>(domega));
    LINEA_KERNEL_LAUNCH_CHECK();
  });
}

}  // namespace linea::cuda
