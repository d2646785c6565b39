// Toeplitz-modulated linear attention on the CPU (see attention.h): the FFT path of nprf_rpe
// one random feature at a time, so that memory stays O((N + M) (S + E)) instead of holding the
// S * E channels of phi(k) v^T and their spectra.
//
// With g the circulant embedding of c (g[t mod n] = c_t for t = -(N-1)..M-1, zeros between) and
// n >= N + M - 1, sum_m c_{m-n} x_m = sum_m g[(m - n) mod n] x_m is a cross-correlation:
// DFT X_k conj(G_k), with no wrap-around. Its adjoint (the backward to x) is the convolution
// X_k G_k, and the gradient of g is the cross-correlation of the output gradient with x:
// dg = IDFT(sum conj(P_k) X_k).
//
// Work items: (b, h) pairs, or, with fewer pairs than threads, (b, h, a range of features); each
// item sums into its own [E, N] / [E, M] buffer (channels first, the FFTs' layout), summed and
// transposed afterwards. All scratch comes from one allocator workspace per call, in pieces
// aligned like fftw_malloc's (the cached plans were planned on fftw_malloc'ed arrays).
#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <vector>

#include "core/cpu/attention.h"
#include "core/cpu/fftw.h"
#include "core/cpu/workspace.h"
#include "core/kernels.h"

namespace linea::cpu {

namespace {

using detail::Workspace;
using fftw::Fftw;

struct Dims {
  int64_t B, H, N, M, S, E, n;
  bool c_per_batch;  // c [B*H, L] rather than [H, L]
  int64_t F() const { return n / 2 + 1; }
  int64_t L() const { return N + M - 1; }
};

// How the (b, h, feature) work is split: `chunks` feature ranges per (b, h).
struct Split {
  int64_t chunks, items;
  Split(const Dims& d, int nt) {
    const int64_t bh = d.B * d.H;
    chunks = bh >= nt ? 1 : std::min<int64_t>(d.S, (nt + bh - 1) / bh);
    items = bh * chunks;
  }
  int64_t s0(const Dims& d, int64_t chunk) const { return d.S * chunk / chunks; }
};

// The four plans a call uses, made (under the planner lock) before the parallel region.
template <typename T> struct Plans {
  typename Fftw<T>::Plan r2c_1, c2r_1, r2c_e, c2r_e;  // one channel / E interleaved channels
  explicit Plans(const Dims& d)
      : r2c_1(fftw::get_plan<T>(d.n, true).plan),
        c2r_1(fftw::get_plan<T>(d.n, false).plan),
        r2c_e(fftw::get_plan<T>(d.n, true, d.E).plan),
        c2r_e(fftw::get_plan<T>(d.n, false, d.E).plan) {}
};

// One thread's buffers, channels first: E real rows of n, E complex rows of F (twice each), g and
// its spectrum, v and the output gradient transposed to [E, M] and [E, N], one feature's column
// of phi_q and phi_k, and (backward) the weighted output gradient and its spectra.
template <typename T> struct Scratch {
  using Complex = typename Fftw<T>::Complex;
  T *x, *y, *xf, *yf, *g, *gf, *vt, *gt, *wq, *wk, *p, *pf;
  // Elements one thread's buffers take in a workspace.
  static int64_t size(const Dims& d) {
    auto r = [](int64_t n) { return Workspace<T>::rounded(n); };
    return 3 * r(d.n * d.E) + 3 * r(2 * d.F() * d.E) + r(d.n) + r(2 * d.F()) + r(d.E * d.M) + r(d.E * d.N) + r(d.N) +
           r(d.M);
  }
  Scratch(const Dims& d, Workspace<T>& ws)
      : x(ws.take(d.n * d.E)),
        y(ws.take(d.n * d.E)),
        xf(ws.take(2 * d.F() * d.E)),
        yf(ws.take(2 * d.F() * d.E)),
        g(ws.take(d.n)),
        gf(ws.take(2 * d.F())),
        vt(ws.take(d.E * d.M)),
        gt(ws.take(d.E * d.N)),
        wq(ws.take(d.N)),
        wk(ws.take(d.M)),
        p(ws.take(d.n * d.E)),
        pf(ws.take(2 * d.F() * d.E)) {}
  Complex* cx() { return reinterpret_cast<Complex*>(xf); }
  Complex* cy() { return reinterpret_cast<Complex*>(yf); }
  Complex* cg() { return reinterpret_cast<Complex*>(gf); }
  Complex* cp() { return reinterpret_cast<Complex*>(pf); }
};

// Every thread's Scratch, carved from ws before the parallel region.
template <typename T> std::vector<Scratch<T>> thread_scratch(const Dims& d, int nt, Workspace<T>& ws) {
  std::vector<Scratch<T>> all;
  for (int t = 0; t < nt; ++t) all.emplace_back(d, ws);
  return all;
}

// dst [cols, rows] = src [rows, cols]^T
template <typename T> void transpose_to(const T* src, int64_t rows, int64_t cols, T* dst) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) dst[c * rows + r] = src[r * cols + c];
}

// Column s of phi [rows, S] into w.
template <typename T> void column(const T* phi, int64_t rows, int64_t S, int64_t s, T* w) {
  for (int64_t r = 0; r < rows; ++r) w[r] = phi[r * S + s];
}

// The spectrum of (b, h)'s circulant embedding into s.gf.
template <typename T>
void embed_c(const Dims& d, const Plans<T>& pl, const T* c, int64_t b, int64_t h, Scratch<T>& s) {
  const T* ch = c + (d.c_per_batch ? b * d.H + h : h) * d.L();
  T* g = s.g;
  std::fill(g, g + d.n, T(0));
  for (int64_t t = 0; t < d.M; ++t) g[t] = ch[d.N - 1 + t];       // c_0 .. c_{M-1}
  for (int64_t t = 1; t < d.N; ++t) g[d.n - t] = ch[d.N - 1 - t];  // c_{-1} .. c_{-(N-1)}
  Fftw<T>::exec_r2c(pl.r2c_1, g, s.cg());
}

// x_e = w * v_e (w = phi_k[:, s], rows m < M, zeros to n) for every channel e; xf = the spectra.
template <typename T> void feature_spectrum(const Dims& d, const Plans<T>& pl, Scratch<T>& b) {
  for (int64_t e = 0; e < d.E; ++e) {
    T* x = b.x + e * d.n;
    const T* ve = b.vt + e * d.M;
    for (int64_t m = 0; m < d.M; ++m) x[m] = b.wk[m] * ve[m];
    std::fill(x + d.M, x + d.n, T(0));
  }
  Fftw<T>::exec_r2c(pl.r2c_e, b.x, b.cx());
}

// y = IDFT(src_k * (conj ? conj(G_k) : G_k)) for every channel, scaled by 1/n (src kept).
template <typename T>
void filtered_inverse(const Dims& d, const Plans<T>& pl, const typename Fftw<T>::Complex* src, bool conj, T* y,
                      Scratch<T>& b) {
  auto* dst = b.cy();
  const auto* G = b.cg();
  const int64_t F = d.F();
  const T sign = conj ? T(-1) : T(1), inv_n = T(1) / static_cast<T>(d.n);
  for (int64_t e = 0; e < d.E; ++e)
    for (int64_t k = 0; k < F; ++k) {
      const T gr = G[k][0] * inv_n, gi = sign * G[k][1] * inv_n;
      const T xr = src[e * F + k][0], xi = src[e * F + k][1];
      dst[e * F + k][0] = xr * gr - xi * gi;
      dst[e * F + k][1] = xr * gi + xi * gr;
    }
  Fftw<T>::exec_c2r(pl.c2r_e, dst, y);  // destroys dst, not src
}

// Feature s of one (b, h): its columns of phi_q, phi_k into b.wq, b.wk, the spectra of
// phi_k[:, s] v into b.xf and y_s = sum_m c_{m-n} phi_k[m, s] v_m into b.y (channels first).
template <typename T>
void feature_output(const Dims& d, const Plans<T>& pl, const T* pqb, const T* pkb, int64_t s, Scratch<T>& b) {
  column(pkb, d.M, d.S, s, b.wk);
  column(pqb, d.N, d.S, s, b.wq);
  feature_spectrum(d, pl, b);
  filtered_inverse<T>(d, pl, b.cx(), /*conj=*/true, b.y, b);
}

template <typename T>
void forward_impl(const Dims& d, const T* c, const T* pq, const T* pk, const T* v, T* y) {
  const int nt = omp_get_max_threads();
  const Split sp(d, nt);
  const int64_t ne = d.N * d.E;
  const Plans<T> pl(d);
  // Each item's sum [E, N] (channels first, transposed into y at the end), every thread's buffers.
  Workspace<T> ws(Workspace<T>::rounded(sp.items * ne) + nt * Scratch<T>::size(d));
  T* part = ws.take(sp.items * ne);
  std::vector<Scratch<T>> scratch = thread_scratch(d, nt, ws);
#pragma omp parallel num_threads(nt)
  {
    Scratch<T>& b = scratch[static_cast<size_t>(omp_get_thread_num())];
#pragma omp for schedule(dynamic)
    for (int64_t it = 0; it < sp.items; ++it) {
      const int64_t bh = it / sp.chunks, chunk = it % sp.chunks;
      const T* pqb = pq + bh * d.N * d.S;
      const T* pkb = pk + bh * d.M * d.S;
      T* out = part + it * ne;
      std::fill(out, out + ne, T(0));
      transpose_to(v + bh * d.M * d.E, d.M, d.E, b.vt);
      embed_c(d, pl, c, bh / d.H, bh % d.H, b);
      for (int64_t s = sp.s0(d, chunk); s < sp.s0(d, chunk + 1); ++s) {
        feature_output(d, pl, pqb, pkb, s, b);
        for (int64_t e = 0; e < d.E; ++e) {
          const T* ye = b.y + e * d.n;
          T* oe = out + e * d.N;
          for (int64_t i = 0; i < d.N; ++i) oe[i] += b.wq[i] * ye[i];
        }
      }
    }
  }
#pragma omp parallel for schedule(static)
  for (int64_t bh = 0; bh < d.B * d.H; ++bh)
    for (int64_t e = 0; e < d.E; ++e)
      for (int64_t i = 0; i < d.N; ++i) {
        T acc = 0;
        for (int64_t ch = 0; ch < sp.chunks; ++ch) acc += part[(bh * sp.chunks + ch) * ne + e * d.N + i];
        y[(bh * d.N + i) * d.E + e] = acc;
      }
}

template <typename T>
void backward_impl(const Dims& d, const T* c, const T* pq, const T* pk, const T* v, const T* dy, T* dc, T* dpq, T* dpk,
                   T* dv) {
  using Complex = typename Fftw<T>::Complex;
  const int nt = omp_get_max_threads();
  const Split sp(d, nt);
  const int64_t me = d.M * d.E, F = d.F();
  const Plans<T> pl(d);
  // Each item's dv [E, M] and sum of conj(P_k) X_k, every thread's buffers, the dc transform's.
  Workspace<T> ws(Workspace<T>::rounded(sp.items * me) + Workspace<T>::rounded(sp.items * 2 * F) +
                  nt * Scratch<T>::size(d) + Workspace<T>::rounded(2 * F) + Workspace<T>::rounded(d.n));
  T* dv_part = ws.take(sp.items * me);
  T* dg_spec = ws.take(sp.items * 2 * F);
  std::vector<Scratch<T>> scratch = thread_scratch(d, nt, ws);
  T* spec = ws.take(2 * F);
  T* dg = ws.take(d.n);
#pragma omp parallel num_threads(nt)
  {
    Scratch<T>& b = scratch[static_cast<size_t>(omp_get_thread_num())];
    Complex* cpf = b.cp();  // the spectra of the output gradient weighted by phi_q[:, s]
#pragma omp for schedule(dynamic)
    for (int64_t it = 0; it < sp.items; ++it) {
      const int64_t bh = it / sp.chunks, chunk = it % sp.chunks;
      const T* pqb = pq + bh * d.N * d.S;
      const T* pkb = pk + bh * d.M * d.S;
      T* dpqb = dpq + bh * d.N * d.S;
      T* dpkb = dpk + bh * d.M * d.S;
      T* dvb = dv_part + it * me;
      T* acc = dg_spec + it * 2 * F;
      std::fill(dvb, dvb + me, T(0));
      std::fill(acc, acc + 2 * F, T(0));
      transpose_to(v + bh * me, d.M, d.E, b.vt);
      transpose_to(dy + bh * d.N * d.E, d.N, d.E, b.gt);
      embed_c(d, pl, c, bh / d.H, bh % d.H, b);
      for (int64_t s = sp.s0(d, chunk); s < sp.s0(d, chunk + 1); ++s) {
        // The forward's y_s again: dphi_q[n, s] = dy_n . y_s,n
        feature_output(d, pl, pqb, pkb, s, b);
        for (int64_t i = 0; i < d.N; ++i) dpqb[i * d.S + s] = T(0);
        for (int64_t e = 0; e < d.E; ++e) {
          const T* ye = b.y + e * d.n;
          const T* ge = b.gt + e * d.N;
          for (int64_t i = 0; i < d.N; ++i) dpqb[i * d.S + s] += ge[i] * ye[i];
        }
        // P_e = phi_q[:, s] * dy_e (rows n < N), the spectra; dg += sum_e conj(P_k) X_k.
        for (int64_t e = 0; e < d.E; ++e) {
          T* pe = b.p + e * d.n;
          const T* ge = b.gt + e * d.N;
          for (int64_t i = 0; i < d.N; ++i) pe[i] = b.wq[i] * ge[i];
          std::fill(pe + d.N, pe + d.n, T(0));
        }
        Fftw<T>::exec_r2c(pl.r2c_e, b.p, cpf);
        const Complex* X = b.cx();
        for (int64_t e = 0; e < d.E; ++e)
          for (int64_t k = 0; k < F; ++k) {
            const T pr = cpf[e * F + k][0], pi = cpf[e * F + k][1];
            const T xr = X[e * F + k][0], xi = X[e * F + k][1];
            acc[2 * k] += pr * xr + pi * xi;  // conj(P) X
            acc[2 * k + 1] += pr * xi - pi * xr;
          }
        // z = the adjoint applied to P (a convolution with g): the gradient of x = phi_k[:, s] v.
        filtered_inverse<T>(d, pl, cpf, /*conj=*/false, b.y, b);
        for (int64_t m = 0; m < d.M; ++m) dpkb[m * d.S + s] = T(0);
        for (int64_t e = 0; e < d.E; ++e) {
          const T* ze = b.y + e * d.n;
          const T* ve = b.vt + e * d.M;
          T* dve = dvb + e * d.M;
          for (int64_t m = 0; m < d.M; ++m) {
            dpkb[m * d.S + s] += ze[m] * ve[m];
            dve[m] += b.wk[m] * ze[m];
          }
        }
      }
    }
  }
#pragma omp parallel for schedule(static)
  for (int64_t bh = 0; bh < d.B * d.H; ++bh)
    for (int64_t m = 0; m < d.M; ++m)
      for (int64_t e = 0; e < d.E; ++e) {
        T sum = 0;
        for (int64_t ch = 0; ch < sp.chunks; ++ch) sum += dv_part[(bh * sp.chunks + ch) * me + e * d.M + m];
        dv[bh * me + m * d.E + e] = sum;
      }
  // dc: the items' spectra summed per row of c (per head: over the batch too), one inverse
  // transform each, read back at the offsets t = -(N-1)..M-1.
  const int64_t rows = d.c_per_batch ? d.B * d.H : d.H;
  const T inv_n = T(1) / static_cast<T>(d.n);
  for (int64_t r = 0; r < rows; ++r) {
    std::fill(spec, spec + 2 * F, T(0));
    for (int64_t it = 0; it < sp.items; ++it) {
      const int64_t bh = it / sp.chunks;
      if ((d.c_per_batch ? bh : bh % d.H) != r) continue;
      for (int64_t k = 0; k < 2 * F; ++k) spec[k] += dg_spec[it * 2 * F + k];
    }
    Fftw<T>::exec_c2r(pl.c2r_1, reinterpret_cast<Complex*>(spec), dg);
    T* dcr = dc + r * d.L();
    for (int64_t t = 0; t < d.M; ++t) dcr[d.N - 1 + t] = dg[t] * inv_n;
    for (int64_t t = 1; t < d.N; ++t) dcr[d.N - 1 - t] = dg[d.n - t] * inv_n;
  }
}

Dims dims_of(const Tensor& c, const Tensor& pq, const Tensor& pk, const Tensor& v, int64_t fft_len) {
  return {pq.size(0), pq.size(1), pq.size(2), pk.size(2), pq.size(3), v.size(3), fft_len, c.dim() == 3};
}

}  // namespace

void toeplitz_attention_forward(const Tensor& c, const Tensor& phi_q, const Tensor& phi_k, const Tensor& v,
                                int64_t fft_len, const Tensor& y) {
  const Dims d = dims_of(c, phi_q, phi_k, v, fft_len);
  LINEA_DISPATCH_FLOAT(v.dtype(), "toeplitz_attention", [&] {
    forward_impl<scalar_t>(d, c.data<scalar_t>(), phi_q.data<scalar_t>(), phi_k.data<scalar_t>(), v.data<scalar_t>(),
                           y.data<scalar_t>());
  });
}

void toeplitz_attention_backward(const Tensor& c, const Tensor& phi_q, const Tensor& phi_k, const Tensor& v,
                                 const Tensor& dy, int64_t fft_len, const Tensor& dc, const Tensor& dphi_q,
                                 const Tensor& dphi_k, const Tensor& dv) {
  const Dims d = dims_of(c, phi_q, phi_k, v, fft_len);
  LINEA_DISPATCH_FLOAT(v.dtype(), "toeplitz_attention_backward", [&] {
    backward_impl<scalar_t>(d, c.data<scalar_t>(), phi_q.data<scalar_t>(), phi_k.data<scalar_t>(), v.data<scalar_t>(),
                            dy.data<scalar_t>(), dc.data<scalar_t>(), dphi_q.data<scalar_t>(), dphi_k.data<scalar_t>(),
                            dv.data<scalar_t>());
  });
}

}  // namespace linea::cpu
