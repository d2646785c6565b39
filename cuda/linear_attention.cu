// Bidirectional linear attention on CUDA (core/kernels.h; the CPU twin in
// core/cpu/linear_attention.cpp, same formulas): five strided-batched GEMMs over (b, h) at the
// matmul precision, and small kernels for the sums, the division and the ones column.
//   forward   KV = phi_k^T v and z = sum_m phi_k_m, into kvz [S, E + 1]
//             [num, den] = phi_q kvz, out = num / den~
//   backward  G = [g / den~, -(g . out) / den~ (0 where guarded)]
//             dphi_q = G kvz^T, dkvz = phi_q^T G
//             dphi_k = v dKV^T + dz (every row), dv = phi_k dKV
// den~ is den with |den| < guard replaced by guard with den's sign (0 counting as +). Every sum
// is a GEMM's or one thread's loop: the same bits every run.
#include <cmath>

#include "core/kernels.h"
#include "cuda/common.cuh"

namespace linea::cuda {

using namespace detail;

namespace {

struct LinearDims {
  int64_t BH, N, M, S, E;
  __host__ __device__ int64_t E1() const { return E + 1; }
};

template <typename T> __device__ __forceinline__ T guarded(T den, T guard) {
  return fabs(den) < guard ? (den >= T(0) ? guard : -guard) : den;
}

// kvz[bh, s, E] = sum_m phi_k[bh, m, s]: one thread per (bh, s), the m loop in order.
template <typename T> __global__ void key_sums_kernel(const T* pk, LinearDims d, T* kvz) {
  const int64_t total = d.BH * d.S;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t bh = i / d.S, s = i % d.S;
    const T* k = pk + bh * d.M * d.S + s;
    T acc = T(0);
    for (int64_t m = 0; m < d.M; ++m) acc += k[m * d.S];
    kvz[(bh * d.S + s) * d.E1() + d.E] = acc;
  }
}

// out = num / den~, den = the raw denominator, from nd [BH N, E + 1].
template <typename T> __global__ void divide_kernel(const T* nd, LinearDims d, T guard, T* out, T* den) {
  const int64_t rows = d.BH * d.N;
  for (int64_t r = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; r < rows;
       r += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const T raw = nd[r * d.E1() + d.E], inv = T(1) / guarded(raw, guard);
    den[r] = raw;
    for (int64_t e = 0; e < d.E; ++e) out[r * d.E + e] = nd[r * d.E1() + e] * inv;
  }
}

// G [BH N, E + 1] from the gradient g, out and den.
template <typename T> __global__ void g_kernel(const T* g, const T* out, const T* den, LinearDims d, T guard, T* G) {
  const int64_t rows = d.BH * d.N;
  for (int64_t r = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; r < rows;
       r += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const T raw = den[r], dg = guarded(raw, guard), inv = T(1) / dg;
    T dot = T(0);
    for (int64_t e = 0; e < d.E; ++e) {
      G[r * d.E1() + e] = g[r * d.E + e] * inv;
      dot += g[r * d.E + e] * out[r * d.E + e];
    }
    G[r * d.E1() + d.E] = dg == raw ? -dot * inv : T(0);  // the guard is a constant
  }
}

// dphi_k[bh, m, s] += dkvz[bh, s, E] (the ones column of [v, 1]).
template <typename T> __global__ void add_ones_column_kernel(const T* dkvz, LinearDims d, T* dpk) {
  const int64_t total = d.BH * d.M * d.S;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t bh = i / (d.M * d.S), s = i % d.S;
    dpk[i] += dkvz[(bh * d.S + s) * d.E1() + d.E];
  }
}

LinearDims dims_of(const Tensor& pq, const Tensor& pk, const Tensor& v) {
  return {pq.size(0) * pq.size(1), pq.size(2), pk.size(2), pq.size(3), v.size(3)};
}


}  // namespace

void linear_attention_forward(const Tensor& phi_q, const Tensor& phi_k, const Tensor& v, double guard,
                              const Tensor& out, const Tensor& den, const Tensor& kvz) {
  const LinearDims d = dims_of(phi_q, phi_k, v);
  LINEA_DISPATCH_FLOAT(v.dtype(), "linear_attention", [&] {
    using T = scalar_t;
    const int64_t E1 = d.E1();
    T* kv = ptr<T>(kvz);
    // KV [S, E] (rows E + 1 apart) = phi_k^T [S, M] v [M, E]
    gemm_strided<T>(cptr<T>(phi_k), true, d.S, d.M * d.S, cptr<T>(v), false, d.E, d.M * d.E, kv, E1, d.S * E1, d.S, d.E,
                    d.M, d.BH, 1.0);
    key_sums_kernel<T><<<grid_for(d.BH * d.S), kBlockSize, 0, stream()>>>(cptr<T>(phi_k), d, kv);
    LINEA_KERNEL_LAUNCH_CHECK();
    // [num, den] [N, E + 1] = phi_q [N, S] kvz [S, E + 1]
    DeviceScratch<T> nd(d.BH * d.N * E1);
    gemm_strided<T>(cptr<T>(phi_q), false, d.S, d.N * d.S, kv, false, E1, d.S * E1, nd.p, E1, d.N * E1, d.N, E1, d.S,
                    d.BH, 1.0);
    divide_kernel<T>
        <<<grid_for(d.BH * d.N), kBlockSize, 0, stream()>>>(nd.p, d, static_cast<T>(guard), ptr<T>(out), ptr<T>(den));
    LINEA_KERNEL_LAUNCH_CHECK();
  });
}

void linear_attention_backward(const Tensor& phi_q, const Tensor& phi_k, const Tensor& v, const Tensor& out,
                               const Tensor& den, const Tensor& kvz, const Tensor& dout, double guard,
                               const Tensor& dphi_q, const Tensor& dphi_k, const Tensor& dv) {
  const LinearDims d = dims_of(phi_q, phi_k, v);
  LINEA_DISPATCH_FLOAT(v.dtype(), "linear_attention_backward", [&] {
    using T = scalar_t;
    const int64_t E1 = d.E1();
    DeviceScratch<T> G(d.BH * d.N * E1), dkvz(d.BH * d.S * E1);
    g_kernel<T><<<grid_for(d.BH * d.N), kBlockSize, 0, stream()>>>(cptr<T>(dout), cptr<T>(out), cptr<T>(den), d,
                                                                   static_cast<T>(guard), G.p);
    LINEA_KERNEL_LAUNCH_CHECK();
    // dphi_q [N, S] = G [N, E + 1] kvz^T [E + 1, S]
    gemm_strided<T>(G.p, false, E1, d.N * E1, cptr<T>(kvz), true, E1, d.S * E1, ptr<T>(dphi_q), d.S, d.N * d.S, d.N,
                    d.S, E1, d.BH, 1.0);
    // dkvz [S, E + 1] = phi_q^T [S, N] G [N, E + 1]
    gemm_strided<T>(cptr<T>(phi_q), true, d.S, d.N * d.S, G.p, false, E1, d.N * E1, dkvz.p, E1, d.S * E1, d.S, E1, d.N,
                    d.BH, 1.0);
    // dphi_k [M, S] = v [M, E] dKV^T [E, S], then + dz on every row
    gemm_strided<T>(cptr<T>(v), false, d.E, d.M * d.E, dkvz.p, true, E1, d.S * E1, ptr<T>(dphi_k), d.S, d.M * d.S, d.M,
                    d.S, d.E, d.BH, 1.0);
    add_ones_column_kernel<T><<<grid_for(d.BH * d.M * d.S), kBlockSize, 0, stream()>>>(dkvz.p, d, ptr<T>(dphi_k));
    LINEA_KERNEL_LAUNCH_CHECK();
    // dv [M, E] = phi_k [M, S] dKV [S, E] (rows E + 1 apart)
    gemm_strided<T>(cptr<T>(phi_k), false, d.S, d.M * d.S, dkvz.p, false, E1, d.S * E1, ptr<T>(dv), d.E, d.M * d.E, d.M,
                    d.E, d.S, d.BH, 1.0);
  });
}

}  // namespace linea::cuda
