// LARA's mixture weights on CUDA (core/kernels.h; the CPU twin in core/cpu/lara_mixture.cpp,
// same formulas; q~ = s q is never formed: s rides in the GEMMs' alpha, and the softmax over c
// drops log xi's -|q~_n|^2/2, the same for every c of a row). Per (b, h), [N, C] blocks:
//   forward   t = q~ qbar^T and l = q~ w^T (strided-batched GEMMs), t = softmax over n (the
//             column softmax kernel), then one warp per row: a = self_w + beta (t - mean_c t),
//             log u = log max(a, floor) + l + bias, mix = softmax_c(log u)
//   backward  one warp per row: dlu = mix (g - rowsum(g mix)), dt = beta (dalpha - mean_c dalpha)
//             column sums over n in runs of rows on many blocks, added in order (ColumnRuns):
//             dbias = colsum(dlu), dself_w = colsum(dalpha); then ds = t (dt - colsum(dt t))
//             GEMMs: dq~ = dlu w + ds qbar, dw = dlu^T q~, dqbar = ds^T q~ (all times s for q's)
// and the proposals' weights the mixture takes (self_w, bias), a warp per row of [C, C] (below).
// Every sum is a GEMM's or a fixed tree (a warp's butterfly for the rows), or one lane's in order:
// the same bits every run.
#include "core/kernels.h"
#include "cuda/common.cuh"

namespace linea::cuda {

using namespace detail;

namespace {

struct MixDims {
  int64_t BH, N, C, D;
};

// t (already the column softmax), l (in mix) -> a and mix, one warp per (bh, n) row, its lanes
// along c.
template <typename T>
__global__ void mixture_rows_kernel(const T* self_w, const T* bias, const T* t, MixDims d, T beta, T floor, T* a,
                                    T* mix) {
  const WarpRows w;
  constexpr int kL = WarpRows::kLanes;
  for (int64_t r = w.first; r < d.BH * d.N; r += w.step) {
    const int64_t bh = r / d.N;
    const T* tn = t + r * d.C;
    const T* sw = self_w + bh * d.C;
    const T* bb = bias + bh * d.C;
    T* an = a + r * d.C;
    T* mn = mix + r * d.C;  // holds l = q~ w^T on entry
    T mean = 0;
    for (int64_t c = w.lane; c < d.C; c += kL) mean += tn[c];
    mean = warp_sum(mean) / static_cast<T>(d.C);
    T mx = neg_inf<T>();
    for (int64_t c = w.lane; c < d.C; c += kL) {
      an[c] = sw[c] + beta * (tn[c] - mean);
      mn[c] = d_log(an[c] > floor ? an[c] : floor) + mn[c] + bb[c];
      mx = mn[c] > mx ? mn[c] : mx;
    }
    mx = warp_max(mx);
    T sum = 0;
    for (int64_t c = w.lane; c < d.C; c += kL) sum += (mn[c] = d_exp(mn[c] - mx));
    sum = warp_sum(sum);
    for (int64_t c = w.lane; c < d.C; c += kL) mn[c] /= sum;
  }
}

// dlu and dt (into ds) from g, mix and a, one warp per (bh, n) row.
template <typename T>
__global__ void mixture_grad_rows_kernel(const T* mix, const T* a, const T* g, MixDims d, T beta, T floor, T* lu,
                                         T* ds) {
  const WarpRows w;
  constexpr int kL = WarpRows::kLanes;
  for (int64_t r = w.first; r < d.BH * d.N; r += w.step) {
    const T *mn = mix + r * d.C, *gn = g + r * d.C, *an = a + r * d.C;
    T* ln = lu + r * d.C;
    T* dn = ds + r * d.C;
    T dot = 0;
    for (int64_t c = w.lane; c < d.C; c += kL) dot += gn[c] * mn[c];
    dot = warp_sum(dot);
    T dmean = 0;
    for (int64_t c = w.lane; c < d.C; c += kL) {
      ln[c] = mn[c] * (gn[c] - dot);
      dn[c] = an[c] < floor ? T(0) : ln[c] / an[c];  // dalpha for now
      dmean += dn[c];
    }
    dmean = warp_sum(dmean) / static_cast<T>(d.C);
    for (int64_t c = w.lane; c < d.C; c += kL) dn[c] = beta * (dn[c] - dmean);
  }
}

// Per column (bh, c), over run blockIdx.y of its n (ColumnRuns): the sums of dlu, dalpha and dt t
// into partial [run, 3, BH C]. [BH, N, C] as [outer, r, inner] of the column skeleton.
template <typename T>
__global__ void mixture_grad_runs_kernel(const T* lu, const T* a, const T* t, const T* ds, MixDims d, T floor,
                                         ColumnRuns runs, T* partial) {
  T* sh = shared_mem<T>();
  const int64_t columns = d.BH * d.C, k0 = runs.begin(), k1 = min(d.N, k0 + runs.rows);
  for (int64_t cb = blockIdx.x; cb * blockDim.x < columns; cb += gridDim.x) {
    const Column col = column_at(cb, columns, d.N, d.C);
    T sb = 0, sw = 0, st = 0;
    if (col.active)
      for (int64_t k = k0 + threadIdx.y; k < k1; k += blockDim.y) {
        const int64_t e = col.base + k * d.C;
        sb += lu[e];
        sw += a[e] < floor ? T(0) : lu[e] / a[e];
        st += ds[e] * t[e];
      }
    sb = tree_reduce_y(sb, SumOp(), sh);
    sw = tree_reduce_y(sw, SumOp(), sh);
    st = tree_reduce_y(st, SumOp(), sh);
    if (!col.active || threadIdx.y != 0) continue;
    T* p = partial + blockIdx.y * 3 * columns + col.c;
    p[0] = sb, p[columns] = sw, p[2 * columns] = st;
  }
}

// ds = t (dt - st[column]) in place of dt, st the column sums of dt t; a warp per row (its
// columns' sums at st + bh C, found once a row).
template <typename T> __global__ void mixture_ds_kernel(const T* t, const T* st, MixDims d, T* ds) {
  const WarpRows w;
  for (int64_t r = w.first; r < d.BH * d.N; r += w.step) {
    const T* st_bh = st + r / d.N * d.C;
    for (int64_t c = w.lane; c < d.C; c += WarpRows::kLanes)
      ds[r * d.C + c] = t[r * d.C + c] * (ds[r * d.C + c] - st_bh[c]);
  }
}

// ---- the proposal weights (core/cpu/lara_mixture.cpp's formulas) ----
// [C, C] per (b, h), one warp per row (bh, c): no GEMM, the products w_c.mu_c' are D long and
// C x C small, so each lane takes its c' (forward) or its d (backward) and sums in order.

// l_cc' = mu_c'.(w_c - mu_c'/2), p = softmax_c'(l), self_w_c = p_cc, bias_c = lse_k_c - l_cc.
template <typename T>
__global__ void proposals_kernel(const T* w, const T* mu, const T* lse_k, int64_t BH, int64_t C, int64_t D, T* p,
                                 T* self_w, T* bias) {
  const WarpRows wr;
  constexpr int kL = WarpRows::kLanes;
  for (int64_t r = wr.first; r < BH * C; r += wr.step) {
    const T* wc = w + r * D;
    const T* mb = mu + (r - r % C) * D;  // this head's mu [C, D]
    T* pr = p + r * C;
    const int64_t c = r % C;
    T mx = neg_inf<T>(), own = 0;  // own: l_cc, on the lane of c' = c
    for (int64_t j = wr.lane; j < C; j += kL) {
      T l = 0;
      for (int64_t e = 0; e < D; ++e) l += mb[j * D + e] * (wc[e] - mb[j * D + e] / 2);
      pr[j] = l;
      mx = l > mx ? l : mx;
      if (j == c) own = l;
    }
    mx = warp_max(mx);
    const T l_diag = __shfl_sync(0xffffffffu, own, static_cast<int>(c % kL));
    T sum = 0;
    for (int64_t j = wr.lane; j < C; j += kL) sum += (pr[j] = d_exp(pr[j] - mx));
    sum = warp_sum(sum);
    for (int64_t j = wr.lane; j < C; j += kL) pr[j] /= sum;
    if (wr.lane == 0) {
      const T lse = mx + d_log(sum);
      self_w[r] = d_exp(l_diag - lse);
      bias[r] = lse_k[r] - l_diag;
    }
  }
}

// With a_c = gs_c p_cc and dl_cc' = -a_c p_cc' + [c = c'] (a_c - gb_c), row c's
//   dw_c = sum_c' dl_cc' mu_c'  and  dmu_c = sum_c2 dl_c2c (w_c2 - mu_c),
// the lanes along d, the sums over c' and c2 in order (p read along row c and down column c).
template <typename T>
__global__ void proposals_grad_kernel(const T* w, const T* mu, const T* p, const T* gs, const T* gb, int64_t BH,
                                      int64_t C, int64_t D, T* dw, T* dmu) {
  const WarpRows wr;
  for (int64_t r = wr.first; r < BH * C; r += wr.step) {
    const int64_t c = r % C, head = r - c;
    const T *pb = p + head * C, *mb = mu + head * D, *wb = w + head * D;
    const T a = gs[r] * pb[c * C + c], diag = a - gb[r];
    for (int64_t e = wr.lane; e < D; e += WarpRows::kLanes) {
      T sw = 0, sm = 0;
      for (int64_t j = 0; j < C; ++j) {
        sw += pb[c * C + j] * mb[j * D + e];
        sm += gs[head + j] * pb[j * C + j] * pb[j * C + c] * (wb[j * D + e] - mb[c * D + e]);
      }
      dw[r * D + e] = diag * mb[c * D + e] - a * sw;
      dmu[r * D + e] = diag * (wb[c * D + e] - mb[c * D + e]) - sm;
    }
  }
}

MixDims dims_of(const Tensor& q, const Tensor& qbar) {
  return {q.size(0) * q.size(1), q.size(2), qbar.size(2), q.size(3)};
}

}  // namespace

void lara_mixture_forward(const Tensor& q, const Tensor& qbar, const Tensor& w, const Tensor& self_w,
                          const Tensor& bias, double beta, double floor, double q_scale, const Tensor& mix,
                          const Tensor& t, const Tensor& a) {
  const MixDims d = dims_of(q, qbar);
  LINEA_DISPATCH_FLOAT(q.dtype(), "lara_mixture", [&] {
    using T = scalar_t;
    // t [N, C] = q~ [N, D] qbar^T, l [N, C] = q~ w^T (into mix)
    gemm_strided<T>(cptr<T>(q), false, d.D, d.N * d.D, cptr<T>(qbar), true, d.D, d.C * d.D, ptr<T>(t), d.C, d.N * d.C,
                    d.N, d.C, d.D, d.BH, q_scale);
    gemm_strided<T>(cptr<T>(q), false, d.D, d.N * d.D, cptr<T>(w), true, d.D, d.C * d.D, ptr<T>(mix), d.C, d.N * d.C,
                    d.N, d.C, d.D, d.BH, q_scale);
    softmax(t, t, d.BH, d.N, d.C, /*log=*/false);  // over n: [BH, N, C] with r = N
    mixture_rows_kernel<T><<<grid_for_warp_rows(d.BH * d.N), kBlockSize, 0, stream()>>>(
        cptr<T>(self_w), cptr<T>(bias), cptr<T>(t), d, static_cast<T>(beta), static_cast<T>(floor), ptr<T>(a),
        ptr<T>(mix));
    LINEA_KERNEL_LAUNCH_CHECK();
  });
}

void lara_mixture_backward(const Tensor& q, const Tensor& qbar, const Tensor& w, const Tensor& mix, const Tensor& t,
                           const Tensor& a, const Tensor& dmix, double beta, double floor, double q_scale,
                           const Tensor& dq, const Tensor& dqbar, const Tensor& dw, const Tensor& dself_w,
                           const Tensor& dbias) {
  const MixDims d = dims_of(q, qbar);
  LINEA_DISPATCH_FLOAT(q.dtype(), "lara_mixture_backward", [&] {
    using T = scalar_t;
    const T fl = static_cast<T>(floor);
    DeviceScratch<T> lu(d.BH * d.N * d.C), ds(d.BH * d.N * d.C);
    mixture_grad_rows_kernel<T><<<grid_for_warp_rows(d.BH * d.N), kBlockSize, 0, stream()>>>(
        cptr<T>(mix), cptr<T>(a), cptr<T>(dmix), d, static_cast<T>(beta), fl, lu.p, ds.p);
    LINEA_KERNEL_LAUNCH_CHECK();
    // Column sums over n in runs, added in order; then ds.
    const int64_t columns = d.BH * d.C;
    const dim3 block = column_block(d.N, d.C);
    const ColumnRuns runs = column_runs(columns, d.N, block);
    DeviceScratch<T> partial(runs.runs * 3 * columns), st(columns);
    mixture_grad_runs_kernel<T><<<column_runs_grid(columns, block, runs), block, sizeof(T) * kBlockSize, stream()>>>(
        lu.p, cptr<T>(a), cptr<T>(t), ds.p, d, fl, runs, partial.p);
    LINEA_KERNEL_LAUNCH_CHECK();
    sum_runs_kernel<T, 3><<<grid_for(columns), kBlockSize, 0, stream()>>>(
        partial.p, runs, columns, RunTotals<T, 3>{{ptr<T>(dbias), ptr<T>(dself_w), st.p}, {1, 1, 1}});
    LINEA_KERNEL_LAUNCH_CHECK();
    if (d.N > 0) {
      mixture_ds_kernel<T><<<grid_for_warp_rows(d.BH * d.N), kBlockSize, 0, stream()>>>(cptr<T>(t), st.p, d, ds.p);
      LINEA_KERNEL_LAUNCH_CHECK();
    }
    // dq [N, D] = s (dlu [N, C] w [C, D] + ds qbar)
    gemm_strided<T>(lu.p, false, d.C, d.N * d.C, cptr<T>(w), false, d.D, d.C * d.D, ptr<T>(dq), d.D, d.N * d.D, d.N,
                    d.D, d.C, d.BH, q_scale);
    gemm_strided<T>(ds.p, false, d.C, d.N * d.C, cptr<T>(qbar), false, d.D, d.C * d.D, ptr<T>(dq), d.D, d.N * d.D, d.N,
                    d.D, d.C, d.BH, q_scale, 1.0);
    // dw [C, D] = dlu^T [C, N] q~ [N, D], dqbar = ds^T q~
    gemm_strided<T>(lu.p, true, d.C, d.N * d.C, cptr<T>(q), false, d.D, d.N * d.D, ptr<T>(dw), d.D, d.C * d.D, d.C, d.D,
                    d.N, d.BH, q_scale);
    gemm_strided<T>(ds.p, true, d.C, d.N * d.C, cptr<T>(q), false, d.D, d.N * d.D, ptr<T>(dqbar), d.D, d.C * d.D, d.C,
                    d.D, d.N, d.BH, q_scale);
  });
}

void lara_proposals_forward(const Tensor& w, const Tensor& mu, const Tensor& lse_k, const Tensor& p,
                            const Tensor& self_w, const Tensor& bias) {
  const int64_t BH = w.size(0) * w.size(1), C = w.size(2), D = w.size(3);
  LINEA_DISPATCH_FLOAT(w.dtype(), "lara_proposals", [&] {
    using T = scalar_t;
    proposals_kernel<T><<<grid_for_warp_rows(BH * C), kBlockSize, 0, stream()>>>(
        cptr<T>(w), cptr<T>(mu), cptr<T>(lse_k), BH, C, D, ptr<T>(p), ptr<T>(self_w), ptr<T>(bias));
    LINEA_KERNEL_LAUNCH_CHECK();
  });
}

void lara_proposals_backward(const Tensor& w, const Tensor& mu, const Tensor& p, const Tensor& dself_w,
                             const Tensor& dbias, const Tensor& dw, const Tensor& dmu) {
  const int64_t BH = w.size(0) * w.size(1), C = w.size(2), D = w.size(3);
  LINEA_DISPATCH_FLOAT(w.dtype(), "lara_proposals_backward", [&] {
    using T = scalar_t;
    proposals_grad_kernel<T><<<grid_for_warp_rows(BH * C), kBlockSize, 0, stream()>>>(
        cptr<T>(w), cptr<T>(mu), cptr<T>(p), cptr<T>(dself_w), cptr<T>(dbias), BH, C, D, ptr<T>(dw), ptr<T>(dmu));
    LINEA_KERNEL_LAUNCH_CHECK();
  });
}

}  // namespace linea::cuda
