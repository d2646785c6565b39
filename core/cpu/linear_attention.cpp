// Bidirectional linear attention, fused (see attention.h). Work items are blocks of kRows rows
// (of the keys, then of the queries) of one (b, h), so two (b, h) pairs or one long sequence
// both keep every thread busy:
//   forward   KVz = phi_k^T [v, 1]                       per key block, summed per (b, h)
//             [num, den] = phi_q KVz, out = num / den~   per query block
//   backward  G = [g / den~, -(g . out) / den~ (0 where guarded)]
//             dphi_q = G KVz^T, dKVz = phi_q^T G          per query block, dKVz summed per (b, h)
//             dphi_k = [v, 1] dKVz^T, dv = phi_k dKV      per key block
// where den~ is den with |den| < guard replaced by guard with den's sign (0 counting as +).
//
// Causal linear attention in chunks of T rows (c = 0..C-1 per (b, h); S_c = the sums before
// chunk c, R_c = the sum over the later chunks of phi_q^T G; tril keeps m <= n in a chunk):
//   forward   KV_c = phi_k_c^T [v_c, 1]                        per chunk
//             S_c = state + sum_{c' < c} KV_c'                  scan per (b, h, entry), in order
//             [num, den]_c = phi_q_c S_c + tril(phi_q_c phi_k_c^T) [v_c, 1]   per chunk
//   backward  G as above, QG_c = phi_q_c^T G_c                  per chunk
//             R_c = sum_{c' > c} QG_c', dstate = sum_c QG_c     scan per (b, h, entry), in order
//             A = tril(G_c [v_c, 1]^T), P = tril(phi_q_c phi_k_c^T)
//             dphi_q_c = G_c S_c^T + A phi_k_c, dphi_k_c = [v_c, 1] R_c^T + A^T phi_q_c,
//             d[v, 1]_c = phi_k_c R_c + P^T G_c                  per chunk
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/cpu/attention.h"
#include "core/cpu/gemm.h"
#include "core/cpu/workspace.h"
#include "core/kernels.h"

namespace linea::cpu {

namespace {

using detail::gemm;
using detail::Workspace;

constexpr int64_t kRows = 512;

struct Dims {
  int64_t BH, N, M, S, E;
  int64_t blocks(int64_t rows) const { return (rows + kRows - 1) / kRows; }
  int64_t E1() const { return E + 1; }
  int64_t kvz() const { return S * E1(); }
};

template <typename T> T guarded(T den, double guard) {
  const T g = static_cast<T>(guard);
  return std::abs(den) < g ? (den >= T(0) ? g : -g) : den;
}

// One row of the ratio: out [E] = nd[0, E) / den~ from nd [E + 1] = [num, den]; returns den.
template <typename T> T divide_row(const T* nd, double guard, int64_t E, T* out) {
  const T raw = nd[E], inv = T(1) / guarded(raw, guard);
  for (int64_t e = 0; e < E; ++e) out[e] = nd[e] * inv;
  return raw;
}

// One row of G [E + 1] = [g / den~, -(g . out) / den~] from the row's gradient g, output o and
// raw den; the last entry 0 where the guard is active (it is a constant).
template <typename T> void g_row(const T* g, const T* o, T raw, double guard, int64_t E, T* G) {
  const T dg = guarded(raw, guard), inv = T(1) / dg;
  T dot = 0;
  for (int64_t e = 0; e < E; ++e) {
    G[e] = g[e] * inv;
    dot += g[e] * o[e];
  }
  G[E] = dg == raw ? -dot * inv : T(0);
}

// Sums parts [BH * nb, n] into dst [BH, n] (block parts of one (b, h) are consecutive).
template <typename T> void sum_parts(const T* parts, int64_t BH, int64_t nb, int64_t n, T* dst) {
#pragma omp for schedule(static)
  for (int64_t i = 0; i < BH * n; ++i) {
    const int64_t bh = i / n, j = i % n;
    T acc = 0;
    for (int64_t blk = 0; blk < nb; ++blk) acc += parts[(bh * nb + blk) * n + j];
    dst[i] = acc;
  }
}

template <typename T>
void forward_impl(const Dims& d, double guard, const T* pq, const T* pk, const T* v, T* out, T* den, T* kvz) {
  const int64_t nbm = d.blocks(d.M), nbn = d.blocks(d.N), n = d.kvz();
  Workspace<T> ws(Workspace<T>::rounded(d.BH * nbm * n) +
                  omp_get_max_threads() * Workspace<T>::rounded(kRows * d.E1()));
  T* parts = ws.take(d.BH * nbm * n);
  std::vector<T*> scratch(static_cast<size_t>(omp_get_max_threads()));
  for (T*& s : scratch) s = ws.take(kRows * d.E1());
#pragma omp parallel
  {
    T* nd = scratch[static_cast<size_t>(omp_get_thread_num())];
#pragma omp for schedule(dynamic)
    for (int64_t it = 0; it < d.BH * nbm; ++it) {  // KVz parts: [phi_k^T v, sum_m phi_k] of a key block
      const int64_t bh = it / nbm, m0 = (it % nbm) * kRows, rows = std::min(kRows, d.M - m0);
      const T* k = pk + (bh * d.M + m0) * d.S;
      T* part = parts + it * n;
      gemm(true, false, d.S, d.E, rows, T(1), k, d.S, v + (bh * d.M + m0) * d.E, d.E, T(0), part, d.E1());
      for (int64_t s = 0; s < d.S; ++s) {
        T z = 0;
        for (int64_t r = 0; r < rows; ++r) z += k[r * d.S + s];
        part[s * d.E1() + d.E] = z;
      }
    }
    sum_parts(parts, d.BH, nbm, n, kvz);
#pragma omp for schedule(dynamic)
    for (int64_t it = 0; it < d.BH * nbn; ++it) {  // [num, den] = phi_q KVz, out = num / den~
      const int64_t bh = it / nbn, n0 = (it % nbn) * kRows, rows = std::min(kRows, d.N - n0);
      gemm(false, false, rows, d.E1(), d.S, T(1), pq + (bh * d.N + n0) * d.S, d.S, kvz + bh * n, d.E1(), T(0), nd,
           d.E1());
      for (int64_t r = 0; r < rows; ++r)
        den[bh * d.N + n0 + r] = divide_row(nd + r * d.E1(), guard, d.E, out + (bh * d.N + n0 + r) * d.E);
    }
  }
}

template <typename T>
void backward_impl(const Dims& d, double guard, const T* pq, const T* pk, const T* v, const T* out, const T* den,
                   const T* kvz, const T* g, T* dpq, T* dpk, T* dv) {
  const int64_t nbm = d.blocks(d.M), nbn = d.blocks(d.N), n = d.kvz();
  const int nt = omp_get_max_threads();
  Workspace<T> ws(2 * Workspace<T>::rounded(d.BH * nbn * n) + nt * Workspace<T>::rounded(kRows * d.E1()));
  T* parts = ws.take(d.BH * nbn * n);
  T* dkvz = ws.take(d.BH * n);
  std::vector<T*> scratch(static_cast<size_t>(nt));
  for (T*& s : scratch) s = ws.take(kRows * d.E1());
#pragma omp parallel num_threads(nt)
  {
    T* G = scratch[static_cast<size_t>(omp_get_thread_num())];
#pragma omp for schedule(dynamic)
    for (int64_t it = 0; it < d.BH * nbn; ++it) {
      const int64_t bh = it / nbn, n0 = (it % nbn) * kRows, rows = std::min(kRows, d.N - n0);
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t row = bh * d.N + n0 + r;
        g_row(g + row * d.E, out + row * d.E, den[row], guard, d.E, G + r * d.E1());
      }
      const T* q = pq + (bh * d.N + n0) * d.S;
      gemm(false, true, rows, d.S, d.E1(), T(1), G, d.E1(), kvz + bh * n, d.E1(), T(0), dpq + (bh * d.N + n0) * d.S,
           d.S);
      gemm(true, false, d.S, d.E1(), rows, T(1), q, d.S, G, d.E1(), T(0), parts + it * n, d.E1());
    }
    sum_parts(parts, d.BH, nbn, n, dkvz);
#pragma omp for schedule(dynamic)
    for (int64_t it = 0; it < d.BH * nbm; ++it) {
      const int64_t bh = it / nbm, m0 = (it % nbm) * kRows, rows = std::min(kRows, d.M - m0);
      const T* dk = dkvz + bh * n;
      T* dkb = dpk + (bh * d.M + m0) * d.S;
      gemm(false, true, rows, d.S, d.E, T(1), v + (bh * d.M + m0) * d.E, d.E, dk, d.E1(), T(0), dkb, d.S);
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t s = 0; s < d.S; ++s) dkb[r * d.S + s] += dk[s * d.E1() + d.E];  // the ones column
      gemm(false, false, rows, d.E, d.S, T(1), pk + (bh * d.M + m0) * d.S, d.S, dk, d.E1(), T(0),
           dv + (bh * d.M + m0) * d.E, d.E);
    }
  }
}

// ---- causal ---------------------------------------------------------------------------------------
struct CausalDims {
  int64_t BH, N, S, E, T;  // T: rows per chunk
  int64_t C() const { return (N + T - 1) / T; }
  int64_t E1() const { return E + 1; }
  int64_t n() const { return S * E1(); }  // entries of one state
  int64_t rows(int64_t c) const { return std::min(T, N - c * T); }
  // Threads for a call: one below ~1 MFLOP (a decoding step), where a parallel region's barriers
  // would cost more than they save.
  int threads() const {
    const int64_t flops = 2 * BH * N * (2 * S * E1() + std::min(T, N) * (S + E1()));
    return flops < (int64_t{1} << 20) ? 1 : omp_get_max_threads();
  }
};

// Runs body on nt threads, or with nt = 1 on this thread outside any OpenMP region (inside one,
// even an inactive one, each OpenBLAS GEMM would start a nested team: see blas.cpp). The
// body's `omp for` loops bind to whichever it is.
template <typename F> void run_team(int nt, const F& body) {
  if (nt == 1) return body();
#pragma omp parallel num_threads(nt)
  body();
}

// [v, 1] of chunk rows [n0, n0 + rows) of one (b, h) into v1 [rows, E + 1].
template <typename T> void ones_column(const T* v, int64_t rows, int64_t E, T* v1) {
  for (int64_t r = 0; r < rows; ++r) {
    std::copy(v + r * E, v + (r + 1) * E, v1 + r * (E + 1));
    v1[r * (E + 1) + E] = T(1);
  }
}

// a [rows, rows] (leading dim ld): zero above the diagonal (key m > query n within the chunk).
template <typename T> void keep_lower(T* a, int64_t rows, int64_t ld) {
  for (int64_t r = 0; r < rows; ++r) std::fill(a + r * ld + r + 1, a + r * ld + rows, T(0));
}

// parts [BH, C, n] in place: the exclusive prefix sums over c (reverse: the suffix sums over the
// later chunks), starting from init [BH, n] (or 0); the total into total [BH, n] when given.
// Work items are blocks of entries of one (b, h), each summed chunk after chunk into a running
// block (contiguous inner loops).
template <typename T> void scan_chunks(const CausalDims& d, bool reverse, const T* init, T* parts, T* total) {
  constexpr int64_t kBlock = 512;
  const int64_t C = d.C(), n = d.n(), nb = (n + kBlock - 1) / kBlock;
#pragma omp for schedule(static)
  for (int64_t it = 0; it < d.BH * nb; ++it) {
    const int64_t bh = it / nb, j0 = (it % nb) * kBlock, len = std::min(kBlock, n - j0);
    T acc[kBlock];
    if (init)
      std::copy(init + bh * n + j0, init + bh * n + j0 + len, acc);
    else
      std::fill(acc, acc + len, T(0));
    for (int64_t k = 0; k < C; ++k) {
      T* p = parts + (bh * C + (reverse ? C - 1 - k : k)) * n + j0;
      for (int64_t j = 0; j < len; ++j) {
        const T x = p[j];
        p[j] = acc[j];
        acc[j] += x;
      }
    }
    if (total) std::copy(acc, acc + len, total + bh * n + j0);
  }
}

template <typename T>
void causal_forward_impl(const CausalDims& d, double guard, const T* pq, const T* pk, const T* v, const T* state,
                         T* out, T* den, T* states, T* final) {
  const int64_t C = d.C(), E1 = d.E1(), n = d.n(), S = d.S;
  const int nt = d.threads();
  const int64_t per_thread = Workspace<T>::rounded(d.T * E1) * 2 + Workspace<T>::rounded(d.T * d.T);
  Workspace<T> ws(nt * per_thread);
  std::vector<T*> scratch(static_cast<size_t>(nt));
  for (T*& p : scratch) p = ws.take(per_thread);
  run_team(nt, [&] {
    T* v1 = scratch[static_cast<size_t>(omp_get_thread_num())];
    T* nd = v1 + Workspace<T>::rounded(d.T * E1);
    T* a = nd + Workspace<T>::rounded(d.T * E1);
#pragma omp for schedule(dynamic)
    for (int64_t it = 0; it < d.BH * C; ++it) {  // KV_c, into the chunk's state slot
      const int64_t bh = it / C, n0 = (it % C) * d.T, rows = d.rows(it % C);
      ones_column(v + (bh * d.N + n0) * d.E, rows, d.E, v1);
      gemm(true, false, S, E1, rows, T(1), pk + (bh * d.N + n0) * S, S, v1, E1, T(0), states + it * n, E1);
    }
    scan_chunks(d, /*reverse=*/false, state, states, final);
#pragma omp for schedule(dynamic)
    for (int64_t it = 0; it < d.BH * C; ++it) {  // [num, den] = phi_q_c S_c + tril(phi_q_c phi_k_c^T) [v_c, 1]
      const int64_t bh = it / C, n0 = (it % C) * d.T, rows = d.rows(it % C);
      const T* q = pq + (bh * d.N + n0) * S;
      const T* k = pk + (bh * d.N + n0) * S;
      ones_column(v + (bh * d.N + n0) * d.E, rows, d.E, v1);
      gemm(false, false, rows, E1, S, T(1), q, S, states + it * n, E1, T(0), nd, E1);
      gemm(false, true, rows, rows, S, T(1), q, S, k, S, T(0), a, d.T);
      keep_lower(a, rows, d.T);
      gemm(false, false, rows, E1, rows, T(1), a, d.T, v1, E1, T(1), nd, E1);
      for (int64_t r = 0; r < rows; ++r)
        den[bh * d.N + n0 + r] = divide_row(nd + r * E1, guard, d.E, out + (bh * d.N + n0 + r) * d.E);
    }
  });
}

template <typename T>
void causal_backward_impl(const CausalDims& d, double guard, const T* pq, const T* pk, const T* v, const T* out,
                          const T* den, const T* states, const T* g, T* dpq, T* dpk, T* dv, T* dstate) {
  const int64_t C = d.C(), E1 = d.E1(), n = d.n(), S = d.S;
  const int nt = d.threads();
  const int64_t per_thread = Workspace<T>::rounded(d.T * E1) * 2 + Workspace<T>::rounded(d.T * d.T);
  Workspace<T> ws(Workspace<T>::rounded(d.BH * d.N * E1) + Workspace<T>::rounded(d.BH * C * n) + nt * per_thread);
  T* G = ws.take(d.BH * d.N * E1);
  T* R = ws.take(d.BH * C * n);
  std::vector<T*> scratch(static_cast<size_t>(nt));
  for (T*& p : scratch) p = ws.take(per_thread);
  run_team(nt, [&] {
    T* v1 = scratch[static_cast<size_t>(omp_get_thread_num())];
    T* dv1 = v1 + Workspace<T>::rounded(d.T * E1);
    T* a = dv1 + Workspace<T>::rounded(d.T * E1);
#pragma omp for schedule(dynamic)
    for (int64_t it = 0; it < d.BH * C; ++it) {  // G_c, QG_c
      const int64_t bh = it / C, n0 = (it % C) * d.T, rows = d.rows(it % C);
      T* Gc = G + (bh * d.N + n0) * E1;
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t row = bh * d.N + n0 + r;
        g_row(g + row * d.E, out + row * d.E, den[row], guard, d.E, Gc + r * E1);
      }
      gemm(true, false, S, E1, rows, T(1), pq + (bh * d.N + n0) * S, S, Gc, E1, T(0), R + it * n, E1);
    }
    scan_chunks(d, /*reverse=*/true, static_cast<const T*>(nullptr), R, dstate);
#pragma omp for schedule(dynamic)
    for (int64_t it = 0; it < d.BH * C; ++it) {
      const int64_t bh = it / C, n0 = (it % C) * d.T, rows = d.rows(it % C), r0 = bh * d.N + n0;
      const T *q = pq + r0 * S, *k = pk + r0 * S, *Gc = G + r0 * E1, *Sc = states + it * n, *Rc = R + it * n;
      ones_column(v + r0 * d.E, rows, d.E, v1);
      // A = tril(G_c [v_c, 1]^T): dphi_q_c = G_c S_c^T + A phi_k_c, dphi_k_c = [v_c, 1] R_c^T + A^T phi_q_c
      gemm(false, true, rows, rows, E1, T(1), Gc, E1, v1, E1, T(0), a, d.T);
      keep_lower(a, rows, d.T);
      gemm(false, true, rows, S, E1, T(1), Gc, E1, Sc, E1, T(0), dpq + r0 * S, S);
      gemm(false, false, rows, S, rows, T(1), a, d.T, k, S, T(1), dpq + r0 * S, S);
      gemm(false, true, rows, S, E1, T(1), v1, E1, Rc, E1, T(0), dpk + r0 * S, S);
      gemm(true, false, rows, S, rows, T(1), a, d.T, q, S, T(1), dpk + r0 * S, S);
      // P = tril(phi_q_c phi_k_c^T): d[v, 1]_c = phi_k_c R_c + P^T G_c
      gemm(false, true, rows, rows, S, T(1), q, S, k, S, T(0), a, d.T);
      keep_lower(a, rows, d.T);
      gemm(false, false, rows, E1, S, T(1), k, S, Rc, E1, T(0), dv1, E1);
      gemm(true, false, rows, E1, rows, T(1), a, d.T, Gc, E1, T(1), dv1, E1);
      for (int64_t r = 0; r < rows; ++r) std::copy(dv1 + r * E1, dv1 + r * E1 + d.E, dv + (r0 + r) * d.E);
    }
  });
}

// Chunks of at most N rows: N <= chunk is one chunk of N (a decoding step is not padded to 64).
CausalDims causal_dims(const Tensor& pq, const Tensor& v, int64_t chunk) {
  return {pq.size(0) * pq.size(1), pq.size(2), pq.size(3), v.size(3), std::min(chunk, pq.size(2))};
}

Dims dims_of(const Tensor& pq, const Tensor& pk, const Tensor& v) {
  return {pq.size(0) * pq.size(1), pq.size(2), pk.size(2), pq.size(3), v.size(3)};
}

}  // namespace

void linear_attention_forward(const Tensor& phi_q, const Tensor& phi_k, const Tensor& v, double guard,
                              const Tensor& out, const Tensor& den, const Tensor& kvz) {
  const Dims d = dims_of(phi_q, phi_k, v);
  LINEA_DISPATCH_FLOAT(v.dtype(), "linear_attention", [&] {
    forward_impl<scalar_t>(d, guard, phi_q.data<scalar_t>(), phi_k.data<scalar_t>(), v.data<scalar_t>(),
                           out.data<scalar_t>(), den.data<scalar_t>(), kvz.data<scalar_t>());
  });
}

void linear_attention_backward(const Tensor& phi_q, const Tensor& phi_k, const Tensor& v, const Tensor& out,
                               const Tensor& den, const Tensor& kvz, const Tensor& dout, double guard,
                               const Tensor& dphi_q, const Tensor& dphi_k, const Tensor& dv) {
  const Dims d = dims_of(phi_q, phi_k, v);
  LINEA_DISPATCH_FLOAT(v.dtype(), "linear_attention_backward", [&] {
    backward_impl<scalar_t>(d, guard, phi_q.data<scalar_t>(), phi_k.data<scalar_t>(), v.data<scalar_t>(),
                            out.data<scalar_t>(), den.data<scalar_t>(), kvz.data<scalar_t>(), dout.data<scalar_t>(),
                            dphi_q.data<scalar_t>(), dphi_k.data<scalar_t>(), dv.data<scalar_t>());
  });
}

void causal_linear_attention_forward(const Tensor& phi_q, const Tensor& phi_k, const Tensor& v, const Tensor& state,
                                     int64_t chunk, double guard, const Tensor& out, const Tensor& den,
                                     const Tensor& states, const Tensor& final) {
  const CausalDims d = causal_dims(phi_q, v, chunk);
  LINEA_DISPATCH_FLOAT(v.dtype(), "causal_linear_attention", [&] {
    causal_forward_impl<scalar_t>(d, guard, phi_q.data<scalar_t>(), phi_k.data<scalar_t>(), v.data<scalar_t>(),
                                  state.defined() ? state.data<scalar_t>() : nullptr, out.data<scalar_t>(),
                                  den.data<scalar_t>(), states.data<scalar_t>(), final.data<scalar_t>());
  });
}

void causal_linear_attention_backward(const Tensor& phi_q, const Tensor& phi_k, const Tensor& v, const Tensor& out,
                                      const Tensor& den, const Tensor& states, const Tensor& dout, int64_t chunk,
                                      double guard, const Tensor& dphi_q, const Tensor& dphi_k, const Tensor& dv,
                                      const Tensor& dstate) {
  const CausalDims d = causal_dims(phi_q, v, chunk);
  LINEA_DISPATCH_FLOAT(v.dtype(), "causal_linear_attention_backward", [&] {
    causal_backward_impl<scalar_t>(d, guard, phi_q.data<scalar_t>(), phi_k.data<scalar_t>(), v.data<scalar_t>(),
                                   out.data<scalar_t>(), den.data<scalar_t>(), states.data<scalar_t>(),
                                   dout.data<scalar_t>(), dphi_q.data<scalar_t>(), dphi_k.data<scalar_t>(),
                                   dv.data<scalar_t>(), dstate.defined() ? dstate.data<scalar_t>() : nullptr);
  });
}

// FAVOR+ attention: the CPU's fused form is positive_features and (causal_)linear_attention one
// after the other (raw::favor_attention composes them), each already one pass of blocked GEMMs.
bool favor_attention_fused(const Tensor&, const Tensor&, const Tensor&, const Tensor&, bool, int64_t) { return false; }
void favor_attention_forward(const Tensor&, const Tensor&, const Tensor&, const Tensor&, double, const Tensor&, double,
                             bool, int64_t, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&) {
  LINEA_FAIL(
      "favor_attention: no fused CPU kernel (raw::favor_attention composes positive_features and "
      "linear_attention)");
}
void favor_attention_backward(const Tensor&, const Tensor&, const Tensor&, const Tensor&, double, bool, int64_t,
                              const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                              double, const Tensor&, const Tensor&, const Tensor&) {
  LINEA_FAIL(
      "favor_attention_backward: no fused CPU kernel (raw::favor_attention_backward composes the two ops' "
      "backwards)");
}

void favor_attention_step(const Tensor&, const Tensor&, const Tensor&, const Tensor&, double, const Tensor&, double,
                          const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&) {
  LINEA_FAIL(
      "favor_attention_step: no fused CPU kernel (raw::favor_attention_step composes positive_features and "
      "causal_linear_attention)");
}

}  // namespace linea::cpu
