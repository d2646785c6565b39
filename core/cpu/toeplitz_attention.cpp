// Toeplitz-modulated linear attention on the CPU (see attention.h): the FFT path of nprf_rpe
// one random feature and one pair of value channels at a time, so that memory stays
// O((N + M) S) instead of holding the S * E channels of phi(k) v^T and their spectra.
//
// With g the circulant embedding of c (g[t mod n] = c_t for t = -(N-1)..M-1, zeros between) and
// n >= N + M - 1, sum_m c_{m-n} x_m = sum_m g[(m - n) mod n] x_m is a cross-correlation:
// DFT X_k conj(G_k), with no wrap-around. Its adjoint (the backward to x) is the convolution
// X_k G_k, and the gradient of g is the cross-correlation of the output gradient with x:
// dg = IDFT(sum conj(P_k) X_k).
//
// Two real channels per complex transform: g is real, so the product is real-linear and
// channels a, b go through it together as x_a + i x_b (their results come back as the real and
// imaginary parts). One complex transform of length n costs about what one real transform of n
// does, so this halves the transforms. For the gradient of g the real part of
// IDFT(conj(P_a + i P_b) (X_a + i X_b)) is the wanted sum over both channels (the cross terms are
// imaginary).
//
// Work items: (b, h) pairs, or, with fewer pairs than threads, (b, h, a range of channel pairs).
// Loops run channel pair outside, feature inside, so that the pair's accumulators stay in cache.
// All scratch comes from one allocator workspace per call, in pieces aligned like fftw_malloc's
// (the cached plans were planned on fftw_malloc'ed arrays).
//
// fft_len == 0 takes the direct path instead (below): the same sums, term by term in tiles.
#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "core/cpu/attention.h"
#include "core/cpu/fftw.h"
#include "core/cpu/gemm.h"
#include "core/cpu/vec_math.h"
#include "core/cpu/workspace.h"
#include "core/kernels.h"

namespace linea::cpu {

namespace {

using detail::Workspace;
using fftw::Fftw;

struct Dims {
  int64_t B, H, N, M, S, E, n;
  bool c_per_batch;  // c [B*H, L] rather than [H, L]
  int64_t P() const { return (E + 1) / 2; }  // channel pairs (the last one half empty if E is odd)
  int64_t L() const { return N + M - 1; }
};

// How the (b, h, channel pair) work is split: `chunks` ranges of pairs per (b, h).
struct Split {
  int64_t chunks, items;
  Split(const Dims& d, int nt) {
    const int64_t bh = d.B * d.H;
    chunks = bh >= nt ? 1 : std::max<int64_t>(1, std::min<int64_t>(d.P(), (nt + bh - 1) / bh));
    items = bh * chunks;
  }
  int64_t p0(const Dims& d, int64_t chunk) const { return d.P() * chunk / chunks; }
};

// The two complex plans of length n (out of place; the forward one keeps its input), made
// (under the planner lock) before any parallel region.
template <typename T> struct Plans {
  typename Fftw<T>::Plan fwd, bwd;
  explicit Plans(const Dims& d)
      : fwd(fftw::get_plan<T>(d.n, fftw::Kind::Forward).plan), bwd(fftw::get_plan<T>(d.n, fftw::Kind::Backward).plan) {}
};

// One thread's buffers (complex ones interleaved re, im): the spectrum of g, the transforms'
// inputs uk and uq (rows past M and N stay 0: the forward plan keeps its input), three more
// length-n rows, phi_q and phi_k transposed to [S, N] and [S, M] (a feature's column
// contiguous), a pair of value channels and of output gradients, and a pair's accumulator.
template <typename T> struct Scratch {
  T *G, *uk, *uq, *x, *t, *y, *p, *qt, *kt, *v2, *g2, *acc;
  static int64_t size(const Dims& d) {
    auto r = [](int64_t n) { return Workspace<T>::rounded(n); };
    return 7 * r(2 * d.n) + r(d.S * d.N) + r(d.S * d.M) + r(2 * d.M) + r(2 * d.N) + r(2 * std::max(d.N, d.M));
  }
  Scratch(const Dims& d, Workspace<T>& ws)
      : G(ws.take(2 * d.n)),
        uk(ws.take(2 * d.n)),
        uq(ws.take(2 * d.n)),
        x(ws.take(2 * d.n)),
        t(ws.take(2 * d.n)),
        y(ws.take(2 * d.n)),
        p(ws.take(2 * d.n)),
        qt(ws.take(d.S * d.N)),
        kt(ws.take(d.S * d.M)),
        v2(ws.take(2 * d.M)),
        g2(ws.take(2 * d.N)),
        acc(ws.take(2 * std::max(d.N, d.M))) {
    std::fill(uk, uk + 2 * d.n, T(0));
    std::fill(uq, uq + 2 * d.n, T(0));
  }
};

template <typename T> std::vector<Scratch<T>> thread_scratch(const Dims& d, int nt, Workspace<T>& ws) {
  std::vector<Scratch<T>> all;
  for (int t = 0; t < nt; ++t) all.emplace_back(d, ws);
  return all;
}

template <typename T> typename Fftw<T>::Complex* cplx(T* p) { return reinterpret_cast<typename Fftw<T>::Complex*>(p); }

// dst [cols, rows] = src [rows, cols]^T
template <typename T> void transpose_to(const T* src, int64_t rows, int64_t cols, T* dst) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) dst[c * rows + r] = src[r * cols + c];
}

// Columns 2p and 2p+1 of src [rows, E] as one complex row (imaginary part 0 past the last column).
template <typename T> void pair_of(const T* src, int64_t rows, int64_t E, int64_t p, T* dst) {
  const int64_t a = 2 * p, b = 2 * p + 1;
  for (int64_t r = 0; r < rows; ++r) {
    dst[2 * r] = src[r * E + a];
    dst[2 * r + 1] = b < E ? src[r * E + b] : T(0);
  }
}

// The complex row src [rows] back into columns 2p and 2p+1 of dst [rows, E].
template <typename T> void unpair_to(const T* src, int64_t rows, int64_t E, int64_t p, T* dst) {
  const int64_t a = 2 * p, b = 2 * p + 1;
  for (int64_t r = 0; r < rows; ++r) {
    dst[r * E + a] = src[2 * r];
    if (b < E) dst[r * E + b] = src[2 * r + 1];
  }
}

// The spectrum of (b, h)'s circulant embedding into s.G (a real row as a complex one), over n.
template <typename T>
void embed_c(const Dims& d, const Plans<T>& pl, const T* c, int64_t b, int64_t h, Scratch<T>& s) {
  const T* ch = c + (d.c_per_batch ? b * d.H + h : h) * d.L();
  T* g = s.t;
  std::fill(g, g + 2 * d.n, T(0));
  for (int64_t t = 0; t < d.M; ++t) g[2 * t] = ch[d.N - 1 + t];             // c_0 .. c_{M-1}
  for (int64_t t = 1; t < d.N; ++t) g[2 * (d.n - t)] = ch[d.N - 1 - t];  // c_{-1} .. c_{-(N-1)}
  Fftw<T>::exec_c2c(pl.fwd, cplx(g), cplx(s.G));
  const T inv_n = T(1) / static_cast<T>(d.n);  // the inverse transform's normalization, once
  for (int64_t k = 0; k < 2 * d.n; ++k) s.G[k] *= inv_n;
}

// The elementwise steps, on complex rows stored (re, im) interleaved; simple loops that GCC
// vectorizes, compiled for AVX2 as well (LINEA_VEC_CLONES).

// dst_r = w_r src_r (a real weight times a complex row).
template <typename T> LINEA_VEC_CLONES void weight(const T* w, const T* src, int64_t rows, T* dst) {
  for (int64_t r = 0; r < rows; ++r) {
    dst[2 * r] = w[r] * src[2 * r];
    dst[2 * r + 1] = w[r] * src[2 * r + 1];
  }
}

// acc_r += w_r x_r
template <typename T> LINEA_VEC_CLONES void add_weighted(const T* w, const T* x, int64_t rows, T* acc) {
  for (int64_t r = 0; r < rows; ++r) {
    acc[2 * r] += w[r] * x[2 * r];
    acc[2 * r + 1] += w[r] * x[2 * r + 1];
  }
}

// acc_r += Re(conj(a_r) b_r): the two channels' products summed.
template <typename T> LINEA_VEC_CLONES void add_real_dot(const T* a, const T* b, int64_t rows, T* acc) {
  for (int64_t r = 0; r < rows; ++r) acc[r] += a[2 * r] * b[2 * r] + a[2 * r + 1] * b[2 * r + 1];
}

// dst_k = x_k G_k, or x_k conj(G_k) (dst may be x).
template <typename T> LINEA_VEC_CLONES void multiply(const T* G, const T* x, int64_t n, bool conj, T* dst) {
  const T sign = conj ? T(-1) : T(1);
  for (int64_t k = 0; k < n; ++k) {
    const T gr = G[2 * k], gi = sign * G[2 * k + 1], xr = x[2 * k], xi = x[2 * k + 1];
    dst[2 * k] = xr * gr - xi * gi;
    dst[2 * k + 1] = xr * gi + xi * gr;
  }
}

// acc_k += conj(P_k) X_k
template <typename T> LINEA_VEC_CLONES void add_conj_product(const T* P, const T* X, int64_t n, T* acc) {
  for (int64_t k = 0; k < n; ++k) {
    const T pr = P[2 * k], pi = P[2 * k + 1], xr = X[2 * k], xi = X[2 * k + 1];
    acc[2 * k] += pr * xr + pi * xi;
    acc[2 * k + 1] += pr * xi - pi * xr;
  }
}

// dst = DFT of w * src (complex src of `rows`; u holds it, its rows past `rows` are 0).
template <typename T>
void weighted_spectrum(const Plans<T>& pl, const T* w, const T* src, int64_t rows, T* u, T* dst) {
  weight(w, src, rows, u);
  Fftw<T>::exec_c2c(pl.fwd, cplx(u), cplx(dst));
}

// dst = IDFT(src_k * (conj ? conj(G_k) : G_k)), G already over n (through b.t; src kept).
template <typename T>
void filtered_inverse(const Dims& d, const Plans<T>& pl, const T* src, bool conj, T* dst, Scratch<T>& b) {
  multiply(b.G, src, d.n, conj, b.t);
  Fftw<T>::exec_c2c(pl.bwd, cplx(b.t), cplx(dst));
}

// phi_q and phi_k of item bh transposed into the thread's scratch.
template <typename T> void load_features(const Dims& d, const T* pq, const T* pk, int64_t bh, Scratch<T>& b) {
  transpose_to(pq + bh * d.N * d.S, d.N, d.S, b.qt);
  transpose_to(pk + bh * d.M * d.S, d.M, d.S, b.kt);
}

template <typename T> void forward_impl(const Dims& d, const T* c, const T* pq, const T* pk, const T* v, T* y) {
  const int nt = omp_get_max_threads();
  const Split sp(d, nt);
  const Plans<T> pl(d);
  Workspace<T> ws(nt * Scratch<T>::size(d));
  std::vector<Scratch<T>> scratch = thread_scratch(d, nt, ws);
#pragma omp parallel num_threads(nt)
  {
    Scratch<T>& b = scratch[static_cast<size_t>(omp_get_thread_num())];
#pragma omp for schedule(dynamic)
    for (int64_t it = 0; it < sp.items; ++it) {
      const int64_t bh = it / sp.chunks, chunk = it % sp.chunks;
      load_features(d, pq, pk, bh, b);
      embed_c(d, pl, c, bh / d.H, bh % d.H, b);
      for (int64_t p = sp.p0(d, chunk); p < sp.p0(d, chunk + 1); ++p) {
        pair_of(v + bh * d.M * d.E, d.M, d.E, p, b.v2);
        std::fill(b.acc, b.acc + 2 * d.N, T(0));
        for (int64_t s = 0; s < d.S; ++s) {
          // y_s = sum_m c_{m-n} phi_k[m, s] v_m for the pair; out += phi_q[:, s] y_s.
          weighted_spectrum(pl, b.kt + s * d.M, b.v2, d.M, b.uk, b.x);
          filtered_inverse(d, pl, b.x, /*conj=*/true, b.y, b);
          add_weighted(b.qt + s * d.N, b.y, d.N, b.acc);
        }
        unpair_to(b.acc, d.N, d.E, p, y + bh * d.N * d.E);
      }
    }
  }
}

template <typename T>
void backward_impl(const Dims& d, const T* c, const T* pq, const T* pk, const T* v, const T* dy, T* dc, T* dpq, T* dpk,
                   T* dv) {
  const int nt = omp_get_max_threads();
  const Split sp(d, nt);
  const int64_t sn = d.S * d.N, sm = d.S * d.M;
  const Plans<T> pl(d);
  // Each item's sum of conj(P_k) X_k [n complex]; with more than one chunk per (b, h), each
  // item's dphi_q^T [S, N] and dphi_k^T [S, M] too (summed in a fixed order afterwards), else
  // one such pair per thread; every thread's buffers, and the dc transform's rows.
  const int64_t parts = sp.chunks > 1 ? sp.items : 0;
  const int64_t per_thread = parts ? 0 : nt;
  Workspace<T> ws(sp.items * Workspace<T>::rounded(2 * d.n) + (parts + per_thread) * Workspace<T>::rounded(sn + sm) +
                  nt * Scratch<T>::size(d) + 2 * Workspace<T>::rounded(2 * d.n));
  std::vector<T*> dgs(static_cast<size_t>(sp.items)), dparts(static_cast<size_t>(parts)),
      dthread(static_cast<size_t>(per_thread));
  for (T*& q : dgs) q = ws.take(2 * d.n);
  for (T*& q : dparts) q = ws.take(sn + sm);
  for (T*& q : dthread) q = ws.take(sn + sm);
  std::vector<Scratch<T>> scratch = thread_scratch(d, nt, ws);
  T* spec = ws.take(2 * d.n);
  T* dg_row = ws.take(2 * d.n);
#pragma omp parallel num_threads(nt)
  {
    const int tid = omp_get_thread_num();
    Scratch<T>& b = scratch[static_cast<size_t>(tid)];
#pragma omp for schedule(dynamic)
    for (int64_t it = 0; it < sp.items; ++it) {
      const int64_t bh = it / sp.chunks, chunk = it % sp.chunks;
      T* dq = parts ? dparts[static_cast<size_t>(it)] : dthread[static_cast<size_t>(tid)];  // [S, N] then [S, M]
      T* dk = dq + sn;
      T* dg = dgs[static_cast<size_t>(it)];
      std::fill(dq, dq + sn + sm, T(0));
      std::fill(dg, dg + 2 * d.n, T(0));
      load_features(d, pq, pk, bh, b);
      embed_c(d, pl, c, bh / d.H, bh % d.H, b);
      for (int64_t p = sp.p0(d, chunk); p < sp.p0(d, chunk + 1); ++p) {
        pair_of(v + bh * d.M * d.E, d.M, d.E, p, b.v2);
        pair_of(dy + bh * d.N * d.E, d.N, d.E, p, b.g2);
        std::fill(b.acc, b.acc + 2 * d.M, T(0));  // the pair's dv
        for (int64_t s = 0; s < d.S; ++s) {
          const T* wq = b.qt + s * d.N;
          const T* wk = b.kt + s * d.M;
          // The forward's X_s and y_s again: dphi_q[n, s] += Re(conj(dy_n) y_s,n) over the pair.
          weighted_spectrum(pl, wk, b.v2, d.M, b.uk, b.x);
          filtered_inverse(d, pl, b.x, /*conj=*/true, b.y, b);
          add_real_dot(b.g2, b.y, d.N, dq + s * d.N);
          // P = the spectrum of phi_q[:, s] dy; dg += conj(P_k) X_k.
          weighted_spectrum(pl, wq, b.g2, d.N, b.uq, b.p);
          add_conj_product(b.p, b.x, d.n, dg);
          // z = the adjoint applied to P (a convolution with g), the gradient of phi_k[:, s] v:
          // dphi_k[m, s] += Re(conj(v_m) z_m), dv_m += phi_k[m, s] z_m.
          filtered_inverse(d, pl, b.p, /*conj=*/false, b.y, b);
          add_real_dot(b.v2, b.y, d.M, dk + s * d.M);
          add_weighted(wk, b.y, d.M, b.acc);
        }
        unpair_to(b.acc, d.M, d.E, p, dv + bh * d.M * d.E);
      }
      if (!parts) {  // the item is all of (b, h): transpose straight into dphi_q, dphi_k
        transpose_to(dq, d.S, d.N, dpq + bh * sn);
        transpose_to(dk, d.S, d.M, dpk + bh * sm);
      }
    }
  }
  // With chunks: each (b, h)'s parts summed in chunk order and transposed back.
  if (parts) {
#pragma omp parallel for schedule(static)
    for (int64_t bh = 0; bh < d.B * d.H; ++bh) {
      for (int64_t s = 0; s < d.S; ++s) {
        for (int64_t i = 0; i < d.N; ++i) {
          T sum = 0;
          for (int64_t ch = 0; ch < sp.chunks; ++ch) sum += dparts[static_cast<size_t>(bh * sp.chunks + ch)][s * d.N + i];
          dpq[(bh * d.N + i) * d.S + s] = sum;
        }
        for (int64_t m = 0; m < d.M; ++m) {
          T sum = 0;
          for (int64_t ch = 0; ch < sp.chunks; ++ch)
            sum += dparts[static_cast<size_t>(bh * sp.chunks + ch)][sn + s * d.M + m];
          dpk[(bh * d.M + m) * d.S + s] = sum;
        }
      }
    }
  }
  // dc: the items' spectra summed per row of c (per head: over the batch too), one inverse
  // transform each, its real part read back at the offsets t = -(N-1)..M-1.
  const int64_t rows = d.c_per_batch ? d.B * d.H : d.H;
  const T inv_n = T(1) / static_cast<T>(d.n);
  for (int64_t r = 0; r < rows; ++r) {
    std::fill(spec, spec + 2 * d.n, T(0));
    for (int64_t it = 0; it < sp.items; ++it) {
      const int64_t bh = it / sp.chunks;
      if ((d.c_per_batch ? bh : bh % d.H) != r) continue;
      const T* dg = dgs[static_cast<size_t>(it)];
      for (int64_t k = 0; k < 2 * d.n; ++k) spec[k] += dg[k];
    }
    Fftw<T>::exec_c2c(pl.bwd, cplx(spec), cplx(dg_row));
    T* dcr = dc + r * d.L();
    for (int64_t t = 0; t < d.M; ++t) dcr[d.N - 1 + t] = dg_row[2 * t] * inv_n;
    for (int64_t t = 1; t < d.N; ++t) dcr[d.N - 1 - t] = dg_row[2 * (d.n - t)] * inv_n;
  }
}

// ---- the direct path (fft_len == 0) --------------------------------------------------------------
// The same sums taken term by term in tiles of R query rows by C keys: A = phi_q phi_k^T (a GEMM
// over S), each entry times c_{m-n} (the bias table), y += A v. Exact (no transform's rounding),
// O(N M (S + E)) work in GEMMs and O(R C) memory per thread: the faster path for short sequences.
constexpr int64_t kRows = 64, kKeys = 256;

template <typename T> const T* c_row(const Dims& d, const T* c, int64_t bh) {
  return c + (d.c_per_batch ? bh : bh % d.H) * d.L();
}

template <typename T> void direct_forward_impl(const Dims& d, const T* c, const T* pq, const T* pk, const T* v, T* y) {
  const int64_t blocks = (d.N + kRows - 1) / kRows;
  const int nt = omp_get_max_threads();
  Workspace<T> ws(nt * Workspace<T>::rounded(kRows * kKeys));
  std::vector<T*> tiles(static_cast<size_t>(nt));
  for (T*& t : tiles) t = ws.take(kRows * kKeys);
#pragma omp parallel for schedule(dynamic) num_threads(nt)
  for (int64_t it = 0; it < d.B * d.H * blocks; ++it) {
    const int64_t bh = it / blocks, n0 = it % blocks * kRows, r = std::min(kRows, d.N - n0);
    T* a = tiles[static_cast<size_t>(omp_get_thread_num())];
    const T* cr = c_row(d, c, bh) + d.N - 1 - n0;  // c_{m-n} at cr[m - (n - n0)]
    for (int64_t m0 = 0; m0 < d.M; m0 += kKeys) {
      const int64_t k = std::min(kKeys, d.M - m0);
      detail::gemm(false, true, r, k, d.S, T(1), pq + (bh * d.N + n0) * d.S, d.S, pk + (bh * d.M + m0) * d.S, d.S, T(0),
                   a, k);
      for (int64_t i = 0; i < r; ++i)
        for (int64_t j = 0; j < k; ++j) a[i * k + j] *= cr[m0 + j - i];
      detail::gemm(false, false, r, d.E, k, T(1), a, k, v + (bh * d.M + m0) * d.E, d.E, T(m0 > 0),
                   y + (bh * d.N + n0) * d.E, d.E);
    }
  }
}

// Per (b, h), tile by tile: K = phi_q phi_k^T and G = dy v^T; dc_{m-n} += K G (entrywise, along
// the tile's diagonals); with W = c K and Z = c G: dv += W^T dy, dphi_q += Z phi_k,
// dphi_k += Z^T phi_q. One thread owns a (b, h): every sum in a fixed order, no atomics.
template <typename T>
void direct_backward_impl(const Dims& d, const T* c, const T* pq, const T* pk, const T* v, const T* dy, T* dc, T* dpq,
                          T* dpk, T* dv) {
  const int nt = omp_get_max_threads();
  const int64_t L = d.L(), BH = d.B * d.H;
  Workspace<T> ws(nt * 2 * Workspace<T>::rounded(kRows * kKeys) + Workspace<T>::rounded(BH * L));
  std::vector<T*> tiles(static_cast<size_t>(2 * nt));
  for (T*& t : tiles) t = ws.take(kRows * kKeys);
  T* dcs = ws.take(BH * L);  // each (b, h)'s dc
#pragma omp parallel for schedule(dynamic) num_threads(nt)
  for (int64_t bh = 0; bh < BH; ++bh) {
    T* kt = tiles[static_cast<size_t>(2 * omp_get_thread_num())];
    T* gt = tiles[static_cast<size_t>(2 * omp_get_thread_num() + 1)];
    T* dcb = dcs + bh * L;
    std::fill(dcb, dcb + L, T(0));
    std::fill(dpk + bh * d.M * d.S, dpk + (bh + 1) * d.M * d.S, T(0));
    std::fill(dv + bh * d.M * d.E, dv + (bh + 1) * d.M * d.E, T(0));
    for (int64_t n0 = 0; n0 < d.N; n0 += kRows) {
      const int64_t r = std::min(kRows, d.N - n0);
      const T* pqn = pq + (bh * d.N + n0) * d.S;
      const T* dyn = dy + (bh * d.N + n0) * d.E;
      const T* cr = c_row(d, c, bh) + d.N - 1 - n0;
      T* dcr = dcb + d.N - 1 - n0;
      for (int64_t m0 = 0; m0 < d.M; m0 += kKeys) {
        const int64_t k = std::min(kKeys, d.M - m0);
        const T* pkm = pk + (bh * d.M + m0) * d.S;
        detail::gemm(false, true, r, k, d.S, T(1), pqn, d.S, pkm, d.S, T(0), kt, k);
        detail::gemm(false, true, r, k, d.E, T(1), dyn, d.E, v + (bh * d.M + m0) * d.E, d.E, T(0), gt, k);
        for (int64_t i = 0; i < r; ++i)
          for (int64_t j = 0; j < k; ++j) {
            const T w = cr[m0 + j - i];
            dcr[m0 + j - i] += kt[i * k + j] * gt[i * k + j];
            kt[i * k + j] *= w;
            gt[i * k + j] *= w;
          }
        detail::gemm(true, false, k, d.E, r, T(1), kt, k, dyn, d.E, T(1), dv + (bh * d.M + m0) * d.E, d.E);
        detail::gemm(false, false, r, d.S, k, T(1), gt, k, pkm, d.S, T(m0 > 0), dpq + (bh * d.N + n0) * d.S, d.S);
        detail::gemm(true, false, k, d.S, r, T(1), gt, k, pqn, d.S, T(1), dpk + (bh * d.M + m0) * d.S, d.S);
      }
    }
  }
  // dc per row of c: a (b, h)'s own, or per head the batch's summed in order.
  if (d.c_per_batch) {
    std::copy(dcs, dcs + BH * L, dc);
    return;
  }
  for (int64_t h = 0; h < d.H; ++h) {
    std::fill(dc + h * L, dc + (h + 1) * L, T(0));
    for (int64_t b = 0; b < d.B; ++b)
      for (int64_t t = 0; t < L; ++t) dc[h * L + t] += dcs[(b * d.H + h) * L + t];
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
    if (fft_len == 0)
      return direct_forward_impl<scalar_t>(d, c.data<scalar_t>(), phi_q.data<scalar_t>(), phi_k.data<scalar_t>(),
                                           v.data<scalar_t>(), y.data<scalar_t>());
    forward_impl<scalar_t>(d, c.data<scalar_t>(), phi_q.data<scalar_t>(), phi_k.data<scalar_t>(), v.data<scalar_t>(),
                           y.data<scalar_t>());
  });
}

void toeplitz_attention_backward(const Tensor& c, const Tensor& phi_q, const Tensor& phi_k, const Tensor& v,
                                 const Tensor& dy, int64_t fft_len, const Tensor& dc, const Tensor& dphi_q,
                                 const Tensor& dphi_k, const Tensor& dv) {
  const Dims d = dims_of(c, phi_q, phi_k, v, fft_len);
  LINEA_DISPATCH_FLOAT(v.dtype(), "toeplitz_attention_backward", [&] {
    if (fft_len == 0)
      return direct_backward_impl<scalar_t>(d, c.data<scalar_t>(), phi_q.data<scalar_t>(), phi_k.data<scalar_t>(),
                                            v.data<scalar_t>(), dy.data<scalar_t>(), dc.data<scalar_t>(),
                                            dphi_q.data<scalar_t>(), dphi_k.data<scalar_t>(), dv.data<scalar_t>());
    backward_impl<scalar_t>(d, c.data<scalar_t>(), phi_q.data<scalar_t>(), phi_k.data<scalar_t>(), v.data<scalar_t>(),
                            dy.data<scalar_t>(), dc.data<scalar_t>(), dphi_q.data<scalar_t>(), dphi_k.data<scalar_t>(),
                            dv.data<scalar_t>());
  });
}

}  // namespace linea::cpu
