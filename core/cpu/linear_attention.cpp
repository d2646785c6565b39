// Bidirectional linear attention, fused (see attention.h). Work items are blocks of kRows rows
// (of the keys, then of the queries) of one (b, h), so two (b, h) pairs or one long sequence
// both keep every thread busy:
//   forward   KVz = phi_k^T [v, 1]                       per key block, summed per (b, h)
//             [num, den] = phi_q KVz, out = num / den~   per query block
//   backward  G = [g / den~, -(g . out) / den~ (0 where guarded)]
//             dphi_q = G KVz^T, dKVz = phi_q^T G          per query block, dKVz summed per (b, h)
//             dphi_k = [v, 1] dKVz^T, dv = phi_k dKV      per key block
// where den~ is den with |den| < guard replaced by guard with den's sign (0 counting as +).
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
      for (int64_t r = 0; r < rows; ++r) {
        const T raw = nd[r * d.E1() + d.E], inv = T(1) / guarded(raw, guard);
        den[bh * d.N + n0 + r] = raw;
        T* o = out + (bh * d.N + n0 + r) * d.E;
        for (int64_t e = 0; e < d.E; ++e) o[e] = nd[r * d.E1() + e] * inv;
      }
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
        const T raw = den[row], dg = guarded(raw, guard), inv = T(1) / dg;
        const T* gr = g + row * d.E;
        const T* o = out + row * d.E;
        T dot = 0;
        for (int64_t e = 0; e < d.E; ++e) {
          G[r * d.E1() + e] = gr[e] * inv;
          dot += gr[e] * o[e];
        }
        G[r * d.E1() + d.E] = dg == raw ? -dot * inv : T(0);  // the guard is a constant
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

}  // namespace linea::cpu
