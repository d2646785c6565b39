// LARA's mixture weights, fused (see attention.h), and at the end the proposals' weights it
// takes. One work item per (b, h): the softmax over queries needs every row of the head before
// any row's weights, and the [N, C] blocks stay in this thread's cache between the passes.
// q~ = s q is never formed: s rides in the GEMMs' alpha.
// log xi(q~_n, w_c) = q~ w^T - |q~_n|^2/2 and the -|q~_n|^2/2 is the same for every c of row n,
// so the softmax over c drops it (and with it dq~'s term -rowsum(dlu) q~: rowsum(dlu) is 0).
// Forward, per (b, h):
//   s = q~ qbar^T, t = softmax over n of s (column-wise), a = self_w + beta (t - mean_c t),
//   alpha = max(a, 1e-8), log u = log alpha + q~ w^T + bias, mix = softmax_c(log u)
// keeping t, a and mix [B, H, N, C]. Backward (g = dmix):
//   dlu = mix (g - rowsum(g mix)),  dbias = colsum(dlu),  dw = dlu^T q~,
//   dalpha = dlu / alpha (0 where clamped),  dself_w = colsum(dalpha),
//   dt = beta (dalpha - mean_c dalpha),  ds = t (dt - colsum(dt t)),
//   dq~ = dlu w + ds qbar,  dqbar = ds^T q~,  and dq = s dq~.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "core/cpu/attention.h"
#include "core/cpu/gemm.h"
#include "core/cpu/workspace.h"
#include "core/kernels.h"

namespace linea::cpu {

namespace {

using detail::gemm;
using detail::Workspace;

struct Dims {
  int64_t BH, N, C, D;
};

template <typename T>
void forward_impl(const Dims& d, double beta, double floor, double s, const T* q, const T* qbar, const T* w,
                  const T* self_w, const T* bias, T* mix, T* t_out, T* a_out) {
  const int64_t nc = d.N * d.C;
  const int nt = omp_get_max_threads();
  Workspace<T> ws(nt * Workspace<T>::rounded(nc));
  std::vector<T*> lq(static_cast<size_t>(nt));
  for (T*& p : lq) p = ws.take(nc);
#pragma omp parallel for schedule(dynamic) num_threads(nt)
  for (int64_t bh = 0; bh < d.BH; ++bh) {
    T* l = lq[static_cast<size_t>(omp_get_thread_num())];
    const T* qb = q + bh * d.N * d.D;
    const T* sw = self_w + bh * d.C;
    const T* bb = bias + bh * d.C;
    T* t = t_out + bh * nc;
    T* a = a_out + bh * nc;
    T* m = mix + bh * nc;
    gemm(false, true, d.N, d.C, d.D, T(s), qb, d.D, qbar + bh * d.C * d.D, d.D, T(0), t, d.C);  // q~ qbar^T
    gemm(false, true, d.N, d.C, d.D, T(s), qb, d.D, w + bh * d.C * d.D, d.D, T(0), l, d.C);     // q~ w^T
    // t = softmax over n, column by column (max and sum in one sweep over the rows each)
    std::vector<T> cmax(static_cast<size_t>(d.C), -std::numeric_limits<T>::infinity());
    std::vector<double> csum(static_cast<size_t>(d.C), 0.0);
    for (int64_t n = 0; n < d.N; ++n)
      for (int64_t c = 0; c < d.C; ++c) cmax[c] = std::max(cmax[c], t[n * d.C + c]);
    for (int64_t n = 0; n < d.N; ++n)
      for (int64_t c = 0; c < d.C; ++c) {
        t[n * d.C + c] = std::exp(t[n * d.C + c] - cmax[c]);
        csum[c] += t[n * d.C + c];
      }
    for (int64_t c = 0; c < d.C; ++c) cmax[c] = static_cast<T>(1.0 / csum[c]);  // reused: 1 / column sum
    for (int64_t n = 0; n < d.N; ++n) {
      T* tn = t + n * d.C;
      T mean = 0;
      for (int64_t c = 0; c < d.C; ++c) {
        tn[c] *= cmax[c];
        mean += tn[c];
      }
      mean /= static_cast<T>(d.C);
      T* mn = m + n * d.C;
      T mx = -std::numeric_limits<T>::infinity();
      for (int64_t c = 0; c < d.C; ++c) {
        a[n * d.C + c] = sw[c] + static_cast<T>(beta) * (tn[c] - mean);
        mn[c] = std::log(std::max(a[n * d.C + c], static_cast<T>(floor))) + l[n * d.C + c] + bb[c];
        mx = std::max(mx, mn[c]);
      }
      T sum = 0;
      for (int64_t c = 0; c < d.C; ++c) sum += (mn[c] = std::exp(mn[c] - mx));
      for (int64_t c = 0; c < d.C; ++c) mn[c] /= sum;
    }
  }
}

template <typename T>
void backward_impl(const Dims& d, double beta, double floor, double s, const T* q, const T* qbar, const T* w,
                   const T* mix, const T* t_in, const T* a_in, const T* g, T* dq, T* dqbar, T* dw, T* dself_w,
                   T* dbias) {
  const int64_t nc = d.N * d.C;
  const int nt = omp_get_max_threads();
  Workspace<T> ws(nt * 2 * Workspace<T>::rounded(nc));
  std::vector<T*> dlu(static_cast<size_t>(nt)), ds(dlu.size());
  for (size_t i = 0; i < dlu.size(); ++i) {
    dlu[i] = ws.take(nc);
    ds[i] = ws.take(nc);
  }
#pragma omp parallel for schedule(dynamic) num_threads(nt)
  for (int64_t bh = 0; bh < d.BH; ++bh) {
    const size_t th = static_cast<size_t>(omp_get_thread_num());
    T* lu = dlu[th];
    T* dsb = ds[th];
    const T* qb = q + bh * d.N * d.D;
    const T *m = mix + bh * nc, *t = t_in + bh * nc, *a = a_in + bh * nc, *gb = g + bh * nc;
    T* dsw = dself_w + bh * d.C;
    T* db = dbias + bh * d.C;
    std::fill(dsw, dsw + d.C, T(0));
    std::fill(db, db + d.C, T(0));
    std::vector<T> col(static_cast<size_t>(d.C), T(0));  // colsum(dt * t)
    for (int64_t n = 0; n < d.N; ++n) {
      const T *mn = m + n * d.C, *gn = gb + n * d.C, *an = a + n * d.C, *tn = t + n * d.C;
      T* ln = lu + n * d.C;
      T* dn = dsb + n * d.C;  // dt for now
      T dot = 0;
      for (int64_t c = 0; c < d.C; ++c) dot += gn[c] * mn[c];
      T dmean = 0;
      for (int64_t c = 0; c < d.C; ++c) {
        ln[c] = mn[c] * (gn[c] - dot);
        db[c] += ln[c];
        const T da = an[c] < static_cast<T>(floor) ? T(0) : ln[c] / an[c];
        dn[c] = da;
        dsw[c] += da;
        dmean += da;
      }
      dmean /= static_cast<T>(d.C);
      for (int64_t c = 0; c < d.C; ++c) {
        dn[c] = static_cast<T>(beta) * (dn[c] - dmean);
        col[c] += dn[c] * tn[c];
      }
    }
    for (int64_t n = 0; n < d.N; ++n)
      for (int64_t c = 0; c < d.C; ++c) dsb[n * d.C + c] = t[n * d.C + c] * (dsb[n * d.C + c] - col[c]);
    T* dqb = dq + bh * d.N * d.D;
    gemm(false, false, d.N, d.D, d.C, T(s), lu, d.C, w + bh * d.C * d.D, d.D, T(0), dqb, d.D);      // dlu w
    gemm(false, false, d.N, d.D, d.C, T(s), dsb, d.C, qbar + bh * d.C * d.D, d.D, T(1), dqb, d.D);  // + ds qbar
    gemm(true, false, d.C, d.D, d.N, T(s), lu, d.C, qb, d.D, T(0), dw + bh * d.C * d.D, d.D);       // dlu^T q~
    gemm(true, false, d.C, d.D, d.N, T(s), dsb, d.C, qb, d.D, T(0), dqbar + bh * d.C * d.D, d.D);   // ds^T q~
  }
}

Dims dims_of(const Tensor& q, const Tensor& qbar) {
  return {q.size(0) * q.size(1), q.size(2), qbar.size(2), q.size(3)};
}

}  // namespace

void lara_mixture_forward(const Tensor& q, const Tensor& qbar, const Tensor& w, const Tensor& self_w,
                          const Tensor& bias, double beta, double floor, double q_scale, const Tensor& mix,
                          const Tensor& t, const Tensor& a) {
  const Dims d = dims_of(q, qbar);
  LINEA_DISPATCH_FLOAT(q.dtype(), "lara_mixture", [&] {
    forward_impl<scalar_t>(d, beta, floor, q_scale, q.data<scalar_t>(), qbar.data<scalar_t>(), w.data<scalar_t>(),
                           self_w.data<scalar_t>(), bias.data<scalar_t>(), mix.data<scalar_t>(), t.data<scalar_t>(),
                           a.data<scalar_t>());
  });
}

void lara_mixture_backward(const Tensor& q, const Tensor& qbar, const Tensor& w, const Tensor& mix, const Tensor& t,
                           const Tensor& a, const Tensor& dmix, double beta, double floor, double q_scale,
                           const Tensor& dq, const Tensor& dqbar, const Tensor& dw, const Tensor& dself_w,
                           const Tensor& dbias) {
  const Dims d = dims_of(q, qbar);
  LINEA_DISPATCH_FLOAT(q.dtype(), "lara_mixture_backward", [&] {
    backward_impl<scalar_t>(d, beta, floor, q_scale, q.data<scalar_t>(), qbar.data<scalar_t>(), w.data<scalar_t>(),
                            mix.data<scalar_t>(), t.data<scalar_t>(), a.data<scalar_t>(), dmix.data<scalar_t>(),
                            dq.data<scalar_t>(), dqbar.data<scalar_t>(), dw.data<scalar_t>(), dself_w.data<scalar_t>(),
                            dbias.data<scalar_t>());
  });
}

// ---- the proposal weights ----------------------------------------------------------------
// Per (b, h), [C, C] blocks: l = w mu^T - |mu_c'|^2/2 by a GEMM, p = softmax_c'(l) row by row,
// self_w_c = p_cc, bias_c = lse_k_c - l_cc. Backward (gs = dself_w, gb = dbias), a_c = gs_c p_cc:
//   dl_cc' = -a_c p_cc' + [c = c'] (a_c - gb_c),  dw = dl mu,  dmu = dl^T w - colsum(dl) mu.

namespace {

template <typename T>
void proposals_forward_impl(int64_t BH, int64_t C, int64_t D, const T* w, const T* mu, const T* lse_k, T* p_out,
                            T* self_w, T* bias) {
#pragma omp parallel for schedule(dynamic)
  for (int64_t bh = 0; bh < BH; ++bh) {
    const T* mb = mu + bh * C * D;
    T* p = p_out + bh * C * C;
    gemm(false, true, C, C, D, T(1), w + bh * C * D, D, mb, D, T(0), p, C);  // w mu^T
    std::vector<T> half_sq(static_cast<size_t>(C));
    for (int64_t j = 0; j < C; ++j) {
      T sq = 0;
      for (int64_t e = 0; e < D; ++e) sq += mb[j * D + e] * mb[j * D + e];
      half_sq[j] = sq / 2;
    }
    for (int64_t c = 0; c < C; ++c) {
      T* pc = p + c * C;
      T mx = -std::numeric_limits<T>::infinity();
      for (int64_t j = 0; j < C; ++j) mx = std::max(mx, pc[j] -= half_sq[j]);
      const T l_diag = pc[c];
      T sum = 0;
      for (int64_t j = 0; j < C; ++j) sum += (pc[j] = std::exp(pc[j] - mx));
      for (int64_t j = 0; j < C; ++j) pc[j] /= sum;
      const T lse = mx + std::log(sum);
      self_w[bh * C + c] = std::exp(l_diag - lse);
      bias[bh * C + c] = lse_k[bh * C + c] - l_diag;
    }
  }
}

template <typename T>
void proposals_backward_impl(int64_t BH, int64_t C, int64_t D, const T* w, const T* mu, const T* p_in, const T* gs,
                             const T* gb, T* dw, T* dmu) {
  const int nt = omp_get_max_threads();
  Workspace<T> ws(nt * Workspace<T>::rounded(C * C));
  std::vector<T*> dl_of(static_cast<size_t>(nt));
  for (T*& x : dl_of) x = ws.take(C * C);
#pragma omp parallel for schedule(dynamic) num_threads(nt)
  for (int64_t bh = 0; bh < BH; ++bh) {
    T* dl = dl_of[static_cast<size_t>(omp_get_thread_num())];
    const T *p = p_in + bh * C * C, *wb = w + bh * C * D, *mb = mu + bh * C * D;
    std::vector<T> colsum(static_cast<size_t>(C), T(0));
    for (int64_t c = 0; c < C; ++c) {
      const T a = gs[bh * C + c] * p[c * C + c];
      for (int64_t j = 0; j < C; ++j) colsum[j] += (dl[c * C + j] = -a * p[c * C + j]);
      dl[c * C + c] += a - gb[bh * C + c];
      colsum[c] += a - gb[bh * C + c];
    }
    T* dmb = dmu + bh * C * D;
    gemm(false, false, C, D, C, T(1), dl, C, mb, D, T(0), dw + bh * C * D, D);  // dl mu
    gemm(true, false, C, D, C, T(1), dl, C, wb, D, T(0), dmb, D);               // dl^T w
    for (int64_t j = 0; j < C; ++j)
      for (int64_t e = 0; e < D; ++e) dmb[j * D + e] -= colsum[j] * mb[j * D + e];
  }
}

}  // namespace

void lara_proposals_forward(const Tensor& w, const Tensor& mu, const Tensor& lse_k, const Tensor& p,
                            const Tensor& self_w, const Tensor& bias) {
  LINEA_DISPATCH_FLOAT(w.dtype(), "lara_proposals", [&] {
    proposals_forward_impl<scalar_t>(w.size(0) * w.size(1), w.size(2), w.size(3), w.data<scalar_t>(),
                                     mu.data<scalar_t>(), lse_k.data<scalar_t>(), p.data<scalar_t>(),
                                     self_w.data<scalar_t>(), bias.data<scalar_t>());
  });
}

void lara_proposals_backward(const Tensor& w, const Tensor& mu, const Tensor& p, const Tensor& dself_w,
                             const Tensor& dbias, const Tensor& dw, const Tensor& dmu) {
  LINEA_DISPATCH_FLOAT(w.dtype(), "lara_proposals_backward", [&] {
    proposals_backward_impl<scalar_t>(w.size(0) * w.size(1), w.size(2), w.size(3), w.data<scalar_t>(),
                                      mu.data<scalar_t>(), p.data<scalar_t>(), dself_w.data<scalar_t>(),
                                      dbias.data<scalar_t>(), dw.data<scalar_t>(), dmu.data<scalar_t>());
  });
}

}  // namespace linea::cpu
