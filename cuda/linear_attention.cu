// Bidirectional linear attention on CUDA (core/kernels.h; the CPU twin in
// core/cpu/linear_attention.cpp, same formulas): five strided-batched GEMMs over (b, h) at the
// matmul precision, and small kernels for the sums, the division and the ones column. The
// [*, E + 1] matrices (kvz, [num, den], G, dkvz) are kept in rows of E1p = E + 1 rounded up to 4
// values: rows of 65 floats would leave cuBLAS its unaligned kernels (no 16-byte loads, no
// tensor cores under --precision tf32/bf16); kvz is copied out to (and in from) its [S, E + 1].
//   forward   KV = phi_k^T v and z = sum_m phi_k_m, into kvz [S, E + 1]
//             [num, den] = phi_q kvz, out = num / den~
//   backward  G = [g / den~, -(g . out) / den~ (0 where guarded)]
//             dphi_q = G kvz^T, dkvz = phi_q^T G
//             dphi_k = v dKV^T + dz (every row), dv = phi_k dKV
// den~ is den with |den| < guard replaced by guard with den's sign (0 counting as +). Every sum
// is a GEMM's or a kernel's in a fixed order: the same bits every run.
//
// Causal linear attention (the CPU twin's chunked formulas, core/cpu/linear_attention.cpp): the
// rows of each (b, h) padded with zero rows to C whole chunks of T (skipped when T divides N), so
// every per-chunk product is one strided-batched GEMM over (b, h, chunk); the chunk states by a
// scan kernel (scan_chunks, common.cuh); tril by a masking kernel. The internal [*, E + 1]
// matrices ([v, 1], [num, den], G, d[v, 1], R) in rows of E1p as above; the states [S, E + 1] of
// the op's contract stay as they are (the GEMMs that read or write them are the unaligned ones
// left).
#include <algorithm>
#include <cmath>

#include "core/kernels.h"
#include "cuda/common.cuh"

namespace linea::cuda {

using namespace detail;

namespace {

struct LinearDims {
  int64_t BH, N, M, S, E;
  __host__ __device__ int64_t E1() const { return E + 1; }
  __host__ __device__ int64_t E1p() const { return (E + 4) / 4 * 4; }  // the padded row length
};

// The row-structured passes below take a warp per row (WarpRows), which finds what its row belongs
// to once: a flat index per element cost two or three 64-bit divisions an element, each a software
// routine of tens of instructions on a GPU, for the few bytes an element such a pass moves.

// dst [rows, cols] (rows dst_ld apart) = src [rows, cols] (rows src_ld apart).
template <typename T>
__global__ void copy_rows_kernel(const T* src, int64_t src_ld, int64_t rows, int64_t cols, int64_t dst_ld, T* dst) {
  const WarpRows w;
  for (int64_t r = w.first; r < rows; r += w.step)
    for (int64_t j = w.lane; j < cols; j += WarpRows::kLanes) dst[r * dst_ld + j] = src[r * src_ld + j];
}
template <typename T> void copy_rows(const T* src, int64_t src_ld, int64_t rows, int64_t cols, int64_t dst_ld, T* dst) {
  if (rows * cols == 0) return;
  copy_rows_kernel<T><<<grid_for_warp_rows(rows), kBlockSize, 0, stream()>>>(src, src_ld, rows, cols, dst_ld, dst);
  LINEA_KERNEL_LAUNCH_CHECK();
}

// The key sums z[bh, s] = sum_m phi_k[bh, m, s]: column sums of phi_k [BH, M, S] as [outer, r,
// inner] of the column skeleton (32 features of one (b, h) per block, coalesced, its 8 rows of
// threads splitting the keys, added by tree_reduce_y), over run blockIdx.y of the keys
// (ColumnRuns; sum_runs_kernel adds the runs in order): the same bits every run. One thread per
// (bh, s) left the GPU idle (0.4 ms at M = 4096, B = 4, H = 8, S = 64 on an H200, growing with M),
// and one block per 32 columns (64 blocks there) half of it.
template <typename T> __global__ void key_sums_kernel(const T* pk, LinearDims d, ColumnRuns runs, T* partial) {
  T* sh = shared_mem<T>();
  const int64_t columns = d.BH * d.S, m0 = runs.begin(), m1 = min(d.M, m0 + runs.rows);
  for (int64_t cb = blockIdx.x; cb * blockDim.x < columns; cb += gridDim.x) {
    const Column col = column_at(cb, columns, d.M, d.S);
    T acc = T(0);
    if (col.active)
      for (int64_t m = m0 + threadIdx.y; m < m1; m += blockDim.y) acc += pk[col.base + m * d.S];
    acc = tree_reduce_y(acc, SumOp(), sh);
    if (col.active && threadIdx.y == 0) partial[blockIdx.y * columns + col.c] = acc;
  }
}

// One row of the ratio by the lanes of a warp: out [E] = nd[0, E) / den~ from nd [E + 1] =
// [num, den]; returns den.
template <typename T> __device__ T divide_row(const T* nd, T guard, int64_t E, T* out, int lane) {
  const T raw = nd[E], inv = T(1) / guarded(raw, guard);
  for (int64_t e = lane; e < E; e += WarpRows::kLanes) out[e] = nd[e] * inv;
  return raw;
}

// One row of G [E + 1] = [g / den~, -(g . out) / den~] by the lanes of a warp, from the row's
// gradient g, output o and raw den; the last entry 0 where the guard is active (it is a constant).
template <typename T> __device__ void g_row(const T* g, const T* o, T raw, T guard, int64_t E, T* G, int lane) {
  const T dg = guarded(raw, guard), inv = T(1) / dg;
  T dot = T(0);
  for (int64_t e = lane; e < E; e += WarpRows::kLanes) {
    G[e] = g[e] * inv;
    dot += g[e] * o[e];
  }
  dot = warp_sum(dot);
  if (lane == 0) G[E] = dg == raw ? -dot * inv : T(0);
}

// out = num / den~, den = the raw denominator, from nd [BH N, E + 1] (rows E1p apart): a warp per
// row.
template <typename T> __global__ void divide_kernel(const T* nd, LinearDims d, T guard, T* out, T* den) {
  const WarpRows w;
  for (int64_t r = w.first; r < d.BH * d.N; r += w.step) {
    const T raw = divide_row(nd + r * d.E1p(), guard, d.E, out + r * d.E, w.lane);
    if (w.lane == 0) den[r] = raw;
  }
}

// G [BH N, E + 1] (rows E1p apart) from the gradient g, out and den: a warp per row.
template <typename T> __global__ void g_kernel(const T* g, const T* out, const T* den, LinearDims d, T guard, T* G) {
  const WarpRows w;
  for (int64_t r = w.first; r < d.BH * d.N; r += w.step)
    g_row(g + r * d.E, out + r * d.E, den[r], guard, d.E, G + r * d.E1p(), w.lane);
}

// dphi_k[bh, m, s] += dkvz[bh, s, E] (the ones column of [v, 1]; rows E1p apart).
template <typename T> __global__ void add_ones_column_kernel(const T* dkvz, LinearDims d, T* dpk) {
  const WarpRows w;
  for (int64_t r = w.first; r < d.BH * d.M; r += w.step) {
    const T* ones = dkvz + r / d.M * d.S * d.E1p() + d.E;  // column E of the (b, h)'s [S, E1p]
    for (int64_t s = w.lane; s < d.S; s += WarpRows::kLanes) dpk[r * d.S + s] += ones[s * d.E1p()];
  }
}

// ---- causal ---------------------------------------------------------------------------------------
struct CausalDims {
  int64_t BH, N, S, E, T;  // T: rows per chunk
  __host__ __device__ int64_t C() const { return (N + T - 1) / T; }
  __host__ __device__ int64_t P() const { return C() * T; }  // padded rows per (b, h)
  __host__ __device__ int64_t E1() const { return E + 1; }
  __host__ __device__ int64_t E1p() const { return (E + 4) / 4 * 4; }  // the internal row length
  int64_t chunks() const { return BH * C(); }
};

// dst [BH, P, cols] from src [BH, N, src_cols]: rows past N zero; column src_cols (when cols >
// src_cols) ones on real rows ([v, 1]), the columns after it zero.
template <typename T>
__global__ void pad_rows_kernel(const T* src, CausalDims d, int64_t src_cols, int64_t cols, T* dst) {
  const WarpRows w;
  for (int64_t row = w.first; row < d.BH * d.P(); row += w.step) {
    const int64_t bh = row / d.P(), r = row - bh * d.P();
    const T* s = src + (bh * d.N + r) * src_cols;
    for (int64_t j = w.lane; j < cols; j += WarpRows::kLanes)
      dst[row * cols + j] = r >= d.N ? T(0) : j < src_cols ? s[j] : T(j == src_cols);
  }
}

// dst [BH, N, cols] = the first cols columns of src [BH, P, src_cols]'s real rows.
template <typename T>
__global__ void unpad_rows_kernel(const T* src, CausalDims d, int64_t src_cols, int64_t cols, T* dst) {
  const WarpRows w;
  for (int64_t row = w.first; row < d.BH * d.N; row += w.step) {
    const int64_t bh = row / d.N, r = row - bh * d.N;
    const T* s = src + (bh * d.P() + r) * src_cols;
    for (int64_t j = w.lane; j < cols; j += WarpRows::kLanes) dst[row * cols + j] = s[j];
  }
}

// a [count, T, T]: zero above the diagonal (key m > query n within the chunk), a warp per row
// (its n found once, not by two 64-bit divisions an element).
template <typename T> __global__ void keep_lower_kernel(int64_t count, int64_t Tc, T* a) {
  const WarpRows w;
  for (int64_t r = w.first; r < count * Tc; r += w.step) {
    const int64_t n = r % Tc;
    for (int64_t m = n + 1 + w.lane; m < Tc; m += WarpRows::kLanes) a[r * Tc + m] = T(0);
  }
}

// out = num / den~, den raw, from the padded nd [BH, P, E + 1] (rows E1p apart): a warp per row.
template <typename T> __global__ void causal_divide_kernel(const T* nd, CausalDims d, T guard, T* out, T* den) {
  const WarpRows w;
  for (int64_t r = w.first; r < d.BH * d.N; r += w.step) {
    const T raw = divide_row(nd + ((r / d.N) * d.P() + r % d.N) * d.E1p(), guard, d.E, out + r * d.E, w.lane);
    if (w.lane == 0) den[r] = raw;
  }
}

// The padded G [BH, P, E + 1] (rows E1p apart, zero rows past N) from the gradient g, out and den:
// a warp per row.
template <typename T>
__global__ void causal_g_kernel(const T* g, const T* out, const T* den, CausalDims d, T guard, T* G) {
  const int64_t E1 = d.E1();
  const WarpRows w;
  for (int64_t p = w.first; p < d.BH * d.P(); p += w.step) {
    const int64_t i = p % d.P(), r = (p / d.P()) * d.N + i;
    T* Gr = G + p * d.E1p();
    if (i >= d.N) {
      for (int64_t e = w.lane; e < E1; e += WarpRows::kLanes) Gr[e] = T(0);
      continue;
    }
    g_row(g + r * d.E, out + r * d.E, den[r], guard, d.E, Gr, w.lane);
  }
}

// The chunk-aligned rows of phi_q, phi_k and [v, 1] (rows E1p apart): the inputs themselves where
// T divides N (and v's ones column is built either way), else zero-padded copies.
template <typename T> struct PaddedInputs {
  const CausalDims& d;
  DeviceScratch<T> qs, ks, v1;
  const T *q, *k;
  PaddedInputs(const CausalDims& dims, const Tensor& phi_q, const Tensor& phi_k, const Tensor& v)
      : d(dims),
        qs(whole() ? 0 : dims.BH * dims.P() * dims.S),
        ks(whole() ? 0 : dims.BH * dims.P() * dims.S),
        v1(dims.BH * dims.P() * dims.E1p()),
        q(whole() ? cptr<T>(phi_q) : qs.p),
        k(whole() ? cptr<T>(phi_k) : ks.p) {
    if (!whole()) {
      pad(cptr<T>(phi_q), d.S, d.S, qs.p);
      pad(cptr<T>(phi_k), d.S, d.S, ks.p);
    }
    pad(cptr<T>(v), d.E, d.E1p(), v1.p);
  }
  bool whole() const { return d.N % d.T == 0; }
  void pad(const T* src, int64_t src_cols, int64_t cols, T* dst) const {
    pad_rows_kernel<T><<<grid_for_warp_rows(d.BH * d.P()), kBlockSize, 0, stream()>>>(src, d, src_cols, cols, dst);
    LINEA_KERNEL_LAUNCH_CHECK();
  }
};

// c[i] (+)= op(a[i]) op(b[i]) for every chunk i, each operand a matrix of the chunk (rows of the
// padded inputs) or of its state: ld is the row length, the chunk stride follows from it.
struct ChunkOperand {
  int64_t ld, rows;  // a chunk's block: rows x ld, chunks rows * ld apart
  int64_t stride() const { return rows * ld; }
};

template <typename T>
void chunk_gemm(const CausalDims& d, const T* a, bool ta, ChunkOperand la, const T* b, bool tb, ChunkOperand lb, T* c,
                ChunkOperand lc, int64_t m, int64_t n, int64_t k, double beta = 0.0) {
  gemm_strided<T>(a, ta, la.ld, la.stride(), b, tb, lb.ld, lb.stride(), c, lc.ld, lc.stride(), m, n, k, d.chunks(), 1.0,
                  beta);
}

template <typename T> void keep_lower(const CausalDims& d, T* a) {
  keep_lower_kernel<T><<<grid_for_warp_rows(d.chunks() * d.T), kBlockSize, 0, stream()>>>(d.chunks(), d.T, a);
  LINEA_KERNEL_LAUNCH_CHECK();
}

// Chunks of at most N rows: N <= chunk is one chunk of N (a decoding step is not padded to 64).
CausalDims causal_dims(const Tensor& pq, const Tensor& v, int64_t chunk) {
  return {pq.size(0) * pq.size(1), pq.size(2), pq.size(3), v.size(3), std::min(chunk, pq.size(2))};
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
    const int64_t E1 = d.E1(), E1p = d.E1p();
    DeviceScratch<T> kvp(d.BH * d.S * E1p);  // kvz in rows of E1p
    // KV [S, E] = phi_k^T [S, M] v [M, E]
    gemm_strided<T>(cptr<T>(phi_k), true, d.S, d.M * d.S, cptr<T>(v), false, d.E, d.M * d.E, kvp.p, E1p, d.S * E1p, d.S,
                    d.E, d.M, d.BH, 1.0);
    // z [S] into kvz's last column
    const int64_t columns = d.BH * d.S;
    const dim3 block = column_block(d.M, d.S);
    const ColumnRuns runs = column_runs(columns, d.M, block);
    DeviceScratch<T> partial(runs.runs * columns);
    key_sums_kernel<T><<<column_runs_grid(columns, block, runs), block, kBlockSize * sizeof(T), stream()>>>(
        cptr<T>(phi_k), d, runs, partial.p);
    LINEA_KERNEL_LAUNCH_CHECK();
    sum_runs_kernel<T, 1><<<grid_for(columns), kBlockSize, 0, stream()>>>(partial.p, runs, columns,
                                                                          RunTotals<T, 1>{{kvp.p + d.E}, {E1p}});
    LINEA_KERNEL_LAUNCH_CHECK();
    // [num, den] [N, E + 1] = phi_q [N, S] kvz [S, E + 1]
    DeviceScratch<T> nd(d.BH * d.N * E1p);
    gemm_strided<T>(cptr<T>(phi_q), false, d.S, d.N * d.S, kvp.p, false, E1p, d.S * E1p, nd.p, E1p, d.N * E1p, d.N, E1,
                    d.S, d.BH, 1.0);
    divide_kernel<T><<<grid_for_warp_rows(d.BH * d.N), kBlockSize, 0, stream()>>>(nd.p, d, static_cast<T>(guard),
                                                                                  ptr<T>(out), ptr<T>(den));
    LINEA_KERNEL_LAUNCH_CHECK();
    copy_rows<T>(kvp.p, E1p, d.BH * d.S, E1, E1, ptr<T>(kvz));
  });
}

void linear_attention_backward(const Tensor& phi_q, const Tensor& phi_k, const Tensor& v, const Tensor& out,
                               const Tensor& den, const Tensor& kvz, const Tensor& dout, double guard,
                               const Tensor& dphi_q, const Tensor& dphi_k, const Tensor& dv) {
  const LinearDims d = dims_of(phi_q, phi_k, v);
  LINEA_DISPATCH_FLOAT(v.dtype(), "linear_attention_backward", [&] {
    using T = scalar_t;
    const int64_t E1 = d.E1(), E1p = d.E1p();
    DeviceScratch<T> kvp(d.BH * d.S * E1p), G(d.BH * d.N * E1p), dkvz(d.BH * d.S * E1p);
    copy_rows<T>(cptr<T>(kvz), E1, d.BH * d.S, E1, E1p, kvp.p);
    g_kernel<T><<<grid_for_warp_rows(d.BH * d.N), kBlockSize, 0, stream()>>>(cptr<T>(dout), cptr<T>(out), cptr<T>(den),
                                                                             d, static_cast<T>(guard), G.p);
    LINEA_KERNEL_LAUNCH_CHECK();
    // dphi_q [N, S] = G [N, E + 1] kvz^T [E + 1, S]
    gemm_strided<T>(G.p, false, E1p, d.N * E1p, kvp.p, true, E1p, d.S * E1p, ptr<T>(dphi_q), d.S, d.N * d.S, d.N, d.S,
                    E1, d.BH, 1.0);
    // dkvz [S, E + 1] = phi_q^T [S, N] G [N, E + 1]
    gemm_strided<T>(cptr<T>(phi_q), true, d.S, d.N * d.S, G.p, false, E1p, d.N * E1p, dkvz.p, E1p, d.S * E1p, d.S, E1,
                    d.N, d.BH, 1.0);
    // dphi_k [M, S] = v [M, E] dKV^T [E, S], then + dz on every row
    gemm_strided<T>(cptr<T>(v), false, d.E, d.M * d.E, dkvz.p, true, E1p, d.S * E1p, ptr<T>(dphi_k), d.S, d.M * d.S,
                    d.M, d.S, d.E, d.BH, 1.0);
    add_ones_column_kernel<T><<<grid_for_warp_rows(d.BH * d.M), kBlockSize, 0, stream()>>>(dkvz.p, d, ptr<T>(dphi_k));
    LINEA_KERNEL_LAUNCH_CHECK();
    // dv [M, E] = phi_k [M, S] dKV [S, E]
    gemm_strided<T>(cptr<T>(phi_k), false, d.S, d.M * d.S, dkvz.p, false, E1p, d.S * E1p, ptr<T>(dv), d.E, d.M * d.E,
                    d.M, d.E, d.S, d.BH, 1.0);
  });
}

void causal_linear_attention_forward(const Tensor& phi_q, const Tensor& phi_k, const Tensor& v, const Tensor& state,
                                     int64_t chunk, double guard, const Tensor& out, const Tensor& den,
                                     const Tensor& states, const Tensor& final) {
  const CausalDims d = causal_dims(phi_q, v, chunk);
  LINEA_DISPATCH_FLOAT(v.dtype(), "causal_linear_attention", [&] {
    using T = scalar_t;
    const int64_t S = d.S, E1 = d.E1(), E1p = d.E1p(), Tc = d.T;
    // rows_e1: a chunk of an internal [*, E + 1] matrix; state_op: a state of the contract's states
    const ChunkOperand rows_s{S, Tc}, rows_e1{E1p, Tc}, tt{Tc, Tc}, state_op{E1, S};
    PaddedInputs<T> in(d, phi_q, phi_k, v);
    T* st = ptr<T>(states);
    chunk_gemm<T>(d, in.k, true, rows_s, in.v1.p, false, rows_e1, st, state_op, S, E1, Tc);  // KV_c
    scan_chunks<T>(d.BH, d.C(), S, E1, E1, false, state.defined() ? cptr<T>(state) : nullptr, st, ptr<T>(final));
    // [num, den]_c = phi_q_c S_c + tril(phi_q_c phi_k_c^T) [v_c, 1]
    DeviceScratch<T> nd(d.BH * d.P() * E1p), a(d.chunks() * Tc * Tc);
    chunk_gemm<T>(d, in.q, false, rows_s, st, false, state_op, nd.p, rows_e1, Tc, E1, S);
    chunk_gemm<T>(d, in.q, false, rows_s, in.k, true, rows_s, a.p, tt, Tc, Tc, S);
    keep_lower<T>(d, a.p);
    chunk_gemm<T>(d, a.p, false, tt, in.v1.p, false, rows_e1, nd.p, rows_e1, Tc, E1, Tc, 1.0);
    causal_divide_kernel<T><<<grid_for_warp_rows(d.BH * d.N), kBlockSize, 0, stream()>>>(nd.p, d, static_cast<T>(guard),
                                                                                         ptr<T>(out), ptr<T>(den));
    LINEA_KERNEL_LAUNCH_CHECK();
  });
}

void causal_linear_attention_backward(const Tensor& phi_q, const Tensor& phi_k, const Tensor& v, const Tensor& out,
                                      const Tensor& den, const Tensor& states, const Tensor& dout, int64_t chunk,
                                      double guard, const Tensor& dphi_q, const Tensor& dphi_k, const Tensor& dv,
                                      const Tensor& dstate) {
  const CausalDims d = causal_dims(phi_q, v, chunk);
  LINEA_DISPATCH_FLOAT(v.dtype(), "causal_linear_attention_backward", [&] {
    using T = scalar_t;
    const int64_t S = d.S, E1 = d.E1(), E1p = d.E1p(), Tc = d.T;
    // rows_e1: a chunk of an internal [*, E + 1] matrix; state_op: a state of the contract's
    // states, padded_state: one of R's
    const ChunkOperand rows_s{S, Tc}, rows_e1{E1p, Tc}, tt{Tc, Tc}, state_op{E1, S}, padded_state{E1p, S};
    PaddedInputs<T> in(d, phi_q, phi_k, v);
    const bool whole = in.whole();
    DeviceScratch<T> G(d.BH * d.P() * E1p), R(d.chunks() * S * E1p), a(d.chunks() * Tc * Tc);
    causal_g_kernel<T><<<grid_for_warp_rows(d.BH * d.P()), kBlockSize, 0, stream()>>>(
        cptr<T>(dout), cptr<T>(out), cptr<T>(den), d, static_cast<T>(guard), G.p);
    LINEA_KERNEL_LAUNCH_CHECK();
    // R_c = sum over the later chunks of phi_q^T G, dstate = the sum over all of them
    chunk_gemm<T>(d, in.q, true, rows_s, G.p, false, rows_e1, R.p, padded_state, S, E1, Tc);
    scan_chunks<T>(d.BH, d.C(), S, E1, E1p, true, nullptr, R.p, dstate.defined() ? ptr<T>(dstate) : nullptr);
    // A = tril(G_c [v_c, 1]^T): dphi_q_c = G_c S_c^T + A phi_k_c, dphi_k_c = [v_c, 1] R_c^T + A^T phi_q_c
    DeviceScratch<T> dqs(whole ? 0 : d.BH * d.P() * S), dks(whole ? 0 : d.BH * d.P() * S);
    T* dq = whole ? ptr<T>(dphi_q) : dqs.p;
    T* dk = whole ? ptr<T>(dphi_k) : dks.p;
    chunk_gemm<T>(d, G.p, false, rows_e1, in.v1.p, true, rows_e1, a.p, tt, Tc, Tc, E1);
    keep_lower<T>(d, a.p);
    chunk_gemm<T>(d, G.p, false, rows_e1, cptr<T>(states), true, state_op, dq, rows_s, Tc, S, E1);
    chunk_gemm<T>(d, a.p, false, tt, in.k, false, rows_s, dq, rows_s, Tc, S, Tc, 1.0);
    chunk_gemm<T>(d, in.v1.p, false, rows_e1, R.p, true, padded_state, dk, rows_s, Tc, S, E1);
    chunk_gemm<T>(d, a.p, true, tt, in.q, false, rows_s, dk, rows_s, Tc, S, Tc, 1.0);
    // P = tril(phi_q_c phi_k_c^T): d[v, 1]_c = phi_k_c R_c + P^T G_c
    DeviceScratch<T> dv1(d.BH * d.P() * E1p);
    chunk_gemm<T>(d, in.q, false, rows_s, in.k, true, rows_s, a.p, tt, Tc, Tc, S);
    keep_lower<T>(d, a.p);
    chunk_gemm<T>(d, in.k, false, rows_s, R.p, false, padded_state, dv1.p, rows_e1, Tc, E1, S);
    chunk_gemm<T>(d, a.p, true, tt, G.p, false, rows_e1, dv1.p, rows_e1, Tc, E1, Tc, 1.0);
    const auto unpad = [&](const T* src, int64_t src_cols, int64_t cols, T* dst) {
      unpad_rows_kernel<T><<<grid_for_warp_rows(d.BH * d.N), kBlockSize, 0, stream()>>>(src, d, src_cols, cols, dst);
      LINEA_KERNEL_LAUNCH_CHECK();
    };
    if (!whole) {
      unpad(dq, S, S, ptr<T>(dphi_q));
      unpad(dk, S, S, ptr<T>(dphi_k));
    }
    unpad(dv1.p, E1p, d.E, ptr<T>(dv));
  });
}

}  // namespace linea::cuda
