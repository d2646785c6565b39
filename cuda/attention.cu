// CUDA kernels of the fused attention ops (core/kernels.h; the CPU twins in core/cpu/attention.cpp).
//
// Softmax attention, tiled with an online softmax (the FlashAttention-2 order of work), memory
// O(B H N (E + 1)) whatever M is: no [N, M] score matrix exists anywhere.
//   forward   one block per (BR query rows, b, h); it walks the key tiles the rows may see,
//             keeping per row the running max m, the running sum l of exp(s - m) and the
//             unnormalized output in registers; out = o / l, lse = m + log l.
//   backward  delta_n = dout_n . out_n first; then one block per (BC keys, b, h) accumulates dk
//             and dv over the query tiles, and one block per (BR queries, b, h) dq over the key
//             tiles. Each sum is taken by one block in a fixed order: no atomics, so the result
//             is the same bits every run (FlashAttention's single backward kernel adds dq with
//             atomics; ours recomputes the scores once more for dq instead).
// Tiles live in dynamic shared memory (at most 48 KB: no opt-in attribute needed); each of the
// 128 threads owns a (BR/16) x (BC/8) patch of a score tile and a (rows) x (DM/8) patch of an
// output tile, its accumulators in registers. DM, the head dims rounded up to a power of two,
// is a template parameter; BR = BC is chosen so that the backward's tiles fit.
// A hidden key gets score -inf; a row that sees no key gets out = 0 and lse = -inf, and adds
// nothing to dk, dv (the CPU kernel's convention).
#include <cmath>

#include "core/kernels.h"
#include "cuda/common.cuh"

namespace linea::cuda {

using namespace detail;
using linea::detail::ExampleDropout;

namespace {

constexpr int kThreads = 128, kRowThreads = 16, kColThreads = 8;

struct SdpaShape {
  int64_t N, M, D, E;  // query rows, keys, q/k head dim, v head dim
  int64_t offset;      // query n sits at position n + offset (causal masking)
  bool causal;
};

// The first query row of `n0..` that may see key m, and whether key m is hidden from row n.
__device__ __forceinline__ bool hidden(const SdpaShape& s, const uint8_t* pad, int64_t n, int64_t m) {
  return (s.causal && m > n + s.offset) || (pad && pad[m]);
}

// Loads rows [r0, r0 + rows) of a [count, dim] matrix into a [rows, DM] tile, zeros past the end.
template <typename T, int DM>
__device__ __forceinline__ void load_tile(T* tile, const T* src, int64_t r0, int rows, int64_t count, int64_t dim) {
  for (int i = threadIdx.x; i < rows * DM; i += kThreads) {
    const int r = i / DM, d = i % DM;
    tile[i] = (r0 + r < count && d < dim) ? src[(r0 + r) * dim + d] : T(0);
  }
}

// acc[i][j] = sum_d a[row_i][d] b[col_j][d] for the thread's patch of a [R, DM] x [C, DM]^T
// product, rows ty + 16 i, columns tx + 8 j.
template <typename T, int DM, int TR, int TC>
__device__ __forceinline__ void dot_patch(const T* a, const T* b, T (&acc)[TR][TC], int ty, int tx) {
#pragma unroll
  for (int i = 0; i < TR; ++i)
#pragma unroll
    for (int j = 0; j < TC; ++j) acc[i][j] = T(0);
  for (int d = 0; d < DM; ++d) {
    T av[TR], bv[TC];
#pragma unroll
    for (int i = 0; i < TR; ++i) av[i] = a[(ty + kRowThreads * i) * DM + d];
#pragma unroll
    for (int j = 0; j < TC; ++j) bv[j] = b[(tx + kColThreads * j) * DM + d];
#pragma unroll
    for (int i = 0; i < TR; ++i)
#pragma unroll
      for (int j = 0; j < TC; ++j) acc[i][j] += av[i] * bv[j];
  }
}

// acc[i][c] += sum_k p[row_i][k] x[k][col_c] for rows ty + 16 i, columns tx + 8 c of a
// [R, K] x [K, DM] product (p with row stride K + 1).
template <typename T, int DM, int TR, int K>
__device__ __forceinline__ void accumulate_patch(const T* p, const T* x, T (&acc)[TR][DM / kColThreads], int ty,
                                                 int tx) {
  constexpr int TD = DM / kColThreads;
  for (int k = 0; k < K; ++k) {
    T pv[TR];
#pragma unroll
    for (int i = 0; i < TR; ++i) pv[i] = p[(ty + kRowThreads * i) * (K + 1) + k];
#pragma unroll
    for (int c = 0; c < TD; ++c) {
      const T xv = x[k * DM + tx + kColThreads * c];
#pragma unroll
      for (int i = 0; i < TR; ++i) acc[i][c] += pv[i] * xv;
    }
  }
}

// acc[i][c] += sum_r p[r][col_i] x[r][c] (the transposed product: p [R, C] with row stride C + 1,
// x [R, DM]) for key rows ty + 16 i.
template <typename T, int DM, int TK, int R, int C>
__device__ __forceinline__ void accumulate_patch_t(const T* p, const T* x, T (&acc)[TK][DM / kColThreads], int ty,
                                                   int tx) {
  constexpr int TD = DM / kColThreads;
  for (int r = 0; r < R; ++r) {
    T pv[TK];
#pragma unroll
    for (int i = 0; i < TK; ++i) pv[i] = p[r * (C + 1) + ty + kRowThreads * i];
#pragma unroll
    for (int c = 0; c < TD; ++c) {
      const T xv = x[r * DM + tx + kColThreads * c];
#pragma unroll
      for (int i = 0; i < TK; ++i) acc[i][c] += pv[i] * xv;
    }
  }
}

template <typename T, int DM, int B>
__global__ void sdpa_forward_kernel(const T* q, const T* k, const T* v, const uint8_t* pad, const T* bias, T scale,
                                    SdpaShape s, int64_t heads, ExampleDropout<T> drop, const uint64_t* draw_base,
                                    T* out, T* lse) {
  constexpr int TR = B / kRowThreads, TC = B / kColThreads, TD = DM / kColThreads;
  T* qs = shared_mem<T>();      // [B, DM]
  T* ks = qs + B * DM;          // [B, DM]
  T* vs = ks + B * DM;          // [B, DM]
  T* ps = vs + B * DM;          // [B, B + 1]: the tile's probabilities
  T* row_m = ps + B * (B + 1);  // [B] running max
  T* row_l = row_m + B;         // [B] running sum
  T* row_a = row_l + B;         // [B] this tile's rescaling of the old sums
  const int tid = threadIdx.x, ty = tid / kColThreads, tx = tid % kColThreads;
  const int64_t bh = blockIdx.y, n0 = static_cast<int64_t>(blockIdx.x) * B;
  const uint8_t* pad_b = pad ? pad + (bh / heads) * s.M : nullptr;
  const T* bias_b = bias ? bias + bh * s.M : nullptr;
  if (drop.on && draw_base) drop.draw += *draw_base;
  load_tile<T, DM>(qs, q + bh * s.N * s.D, n0, B, s.N, s.D);
  for (int r = tid; r < B; r += kThreads) row_m[r] = neg_inf<T>(), row_l[r] = T(0);
  T o[TR][TD];
#pragma unroll
  for (int i = 0; i < TR; ++i)
#pragma unroll
    for (int c = 0; c < TD; ++c) o[i][c] = T(0);
  // Keys past the last row's causal horizon are hidden from the whole tile.
  const int64_t m_end = s.causal ? min(s.M, min(n0 + B, s.N) + s.offset) : s.M;
  for (int64_t m0 = 0; m0 < m_end; m0 += B) {
    __syncthreads();  // the previous tile's k, v, p are used up
    load_tile<T, DM>(ks, k + bh * s.M * s.D, m0, B, s.M, s.D);
    load_tile<T, DM>(vs, v + bh * s.M * s.E, m0, B, s.M, s.E);
    __syncthreads();
    T sc[TR][TC];
    dot_patch<T, DM, TR, TC>(qs, ks, sc, ty, tx);
#pragma unroll
    for (int i = 0; i < TR; ++i)
#pragma unroll
      for (int j = 0; j < TC; ++j) {
        const int r = ty + kRowThreads * i, c = tx + kColThreads * j;
        const int64_t m = m0 + c;
        ps[r * (B + 1) + c] =
            (m >= s.M || hidden(s, pad_b, n0 + r, m)) ? neg_inf<T>() : sc[i][j] * scale + (bias_b ? bias_b[m] : T(0));
      }
    __syncthreads();
    // One thread per row: the new max, the rescaling and the tile's exp(s - m).
    for (int r = tid; r < B; r += kThreads) {
      T* row = ps + r * (B + 1);
      T mx = row_m[r];
      for (int c = 0; c < B; ++c) mx = max(mx, row[c]);
      T sum = T(0);
      if (mx == neg_inf<T>()) {  // nothing visible yet
        for (int c = 0; c < B; ++c) row[c] = T(0);
        row_a[r] = T(1);
      } else {
        for (int c = 0; c < B; ++c) {
          row[c] = d_exp(row[c] - mx);
          sum += row[c];
        }
        if (drop.on && n0 + r < s.N) {  // the sum (and lse) stay the undropped ones
          const int64_t j0 = ((bh % heads) * s.N + n0 + r) * s.M + m0;
          for (int c = 0; c < B && m0 + c < s.M; ++c) row[c] *= drop.factor(bh / heads, j0 + c);
        }
        row_a[r] = d_exp(row_m[r] - mx);
      }
      row_l[r] = row_l[r] * row_a[r] + sum;
      row_m[r] = mx;
    }
    __syncthreads();
#pragma unroll
    for (int i = 0; i < TR; ++i) {
      const T a = row_a[ty + kRowThreads * i];
#pragma unroll
      for (int c = 0; c < TD; ++c) o[i][c] *= a;
    }
    accumulate_patch<T, DM, TR, B>(ps, vs, o, ty, tx);
  }
  __syncthreads();
#pragma unroll
  for (int i = 0; i < TR; ++i) {
    const int r = ty + kRowThreads * i;
    const int64_t n = n0 + r;
    if (n >= s.N) continue;
    const T l = row_l[r], inv = l > T(0) ? T(1) / l : T(0);
#pragma unroll
    for (int c = 0; c < TD; ++c) {
      const int e = tx + kColThreads * c;
      if (e < s.E) out[(bh * s.N + n) * s.E + e] = o[i][c] * inv;
    }
    if (tx == 0) lse[bh * s.N + n] = l > T(0) ? row_m[r] + d_log(l) : neg_inf<T>();
  }
}

// delta [B H N] = rowwise dout . out
template <typename T>
__global__ void sdpa_delta_kernel(const T* dout, const T* out, int64_t rows, int64_t E, T* delta) {
  for (int64_t r = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; r < rows;
       r += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    T acc = T(0);
    for (int64_t e = 0; e < E; ++e) acc += dout[r * E + e] * out[r * E + e];
    delta[r] = acc;
  }
}

// For a query tile (qs, dos, row lse and delta) against a key tile (ks, vs): p = exp(scale s - lse)
// and ds = p (dout . v - delta), both [B, B + 1] in shared memory, 0 where hidden. With dropout
// factors z: z p (what multiplied v) and ds = p (z dout . v - delta).
template <typename T, int DM, int B>
__device__ __forceinline__ void probs_and_dscores(const T* qs, const T* ks, const T* vs, const T* dos, const T* row_lse,
                                                  const T* row_delta, T* ps, T* dss, T scale, const SdpaShape& s,
                                                  const uint8_t* pad_b, const T* bias_b, const ExampleDropout<T>& drop,
                                                  int64_t bh, int64_t heads, int64_t n0, int64_t m0, int ty, int tx) {
  constexpr int TR = B / kRowThreads, TC = B / kColThreads;
  T sc[TR][TC], dp[TR][TC];
  dot_patch<T, DM, TR, TC>(qs, ks, sc, ty, tx);
  dot_patch<T, DM, TR, TC>(dos, vs, dp, ty, tx);
#pragma unroll
  for (int i = 0; i < TR; ++i)
#pragma unroll
    for (int j = 0; j < TC; ++j) {
      const int r = ty + kRowThreads * i, c = tx + kColThreads * j;
      const int64_t n = n0 + r, m = m0 + c;
      const T l = row_lse[r];
      const bool off = n >= s.N || m >= s.M || l == neg_inf<T>() || hidden(s, pad_b, n, m);
      const T p = off ? T(0) : d_exp(sc[i][j] * scale + (bias_b ? bias_b[m] : T(0)) - l);
      const T z = drop.on && !off ? drop.factor(bh / heads, ((bh % heads) * s.N + n) * s.M + m) : T(1);
      ps[r * (B + 1) + c] = z * p;
      dss[r * (B + 1) + c] = p * (z * dp[i][j] - row_delta[r]);
    }
}

// The backward kernels' shared memory: a query tile (q, dout, each row's lse and delta), a key
// tile (k, v) and the tile pair's p and ds [B, B + 1].
template <typename T, int DM, int B> struct BackwardTiles {
  T *qs, *dos, *ks, *vs, *ps, *dss, *row_lse, *row_delta;
  __device__ BackwardTiles() {
    qs = shared_mem<T>();
    dos = qs + B * DM;
    ks = dos + B * DM;
    vs = ks + B * DM;
    ps = vs + B * DM;
    dss = ps + B * (B + 1);
    row_lse = dss + B * (B + 1);
    row_delta = row_lse + B;
  }
  // Query rows [n0, n0 + B) of head bh (past N: lse -inf, delta 0, zero rows).
  __device__ void load_queries(const T* q, const T* dout, const T* lse, const T* delta, const SdpaShape& s,
                               int64_t bh, int64_t n0) {
    load_tile<T, DM>(qs, q + bh * s.N * s.D, n0, B, s.N, s.D);
    load_tile<T, DM>(dos, dout + bh * s.N * s.E, n0, B, s.N, s.E);
    for (int r = threadIdx.x; r < B; r += kThreads) {
      const bool in = n0 + r < s.N;
      row_lse[r] = in ? lse[bh * s.N + n0 + r] : neg_inf<T>();
      row_delta[r] = in ? delta[bh * s.N + n0 + r] : T(0);
    }
  }
  // Key rows [m0, m0 + B) of head bh.
  __device__ void load_keys(const T* k, const T* v, const SdpaShape& s, int64_t bh, int64_t m0) {
    load_tile<T, DM>(ks, k + bh * s.M * s.D, m0, B, s.M, s.D);
    load_tile<T, DM>(vs, v + bh * s.M * s.E, m0, B, s.M, s.E);
  }
  // p and ds of the loaded tiles (probs_and_dscores).
  __device__ void scores(T scale, const SdpaShape& s, const uint8_t* pad_b, const T* bias_b,
                         const ExampleDropout<T>& drop, int64_t bh, int64_t heads, int64_t n0, int64_t m0, int ty,
                         int tx) {
    probs_and_dscores<T, DM, B>(qs, ks, vs, dos, row_lse, row_delta, ps, dss, scale, s, pad_b, bias_b, drop, bh, heads,
                                n0, m0, ty, tx);
  }
};

// dk, dv (and dbias, the column sums of ds) for BC = B keys: over the query tiles that may see them.
template <typename T, int DM, int B>
__global__ void sdpa_backward_dkv_kernel(const T* q, const T* k, const T* v, const T* dout, const T* lse,
                                         const T* delta, const uint8_t* pad, const T* bias, T scale, SdpaShape s,
                                         int64_t heads, ExampleDropout<T> drop, const uint64_t* draw_base, T* dk, T* dv,
                                         T* dbias) {
  constexpr int TK = B / kRowThreads, TD = DM / kColThreads;
  BackwardTiles<T, DM, B> t;
  const int tid = threadIdx.x, ty = tid / kColThreads, tx = tid % kColThreads;
  const int64_t bh = blockIdx.y, m0 = static_cast<int64_t>(blockIdx.x) * B;
  const uint8_t* pad_b = pad ? pad + (bh / heads) * s.M : nullptr;
  const T* bias_b = bias ? bias + bh * s.M : nullptr;
  if (drop.on && draw_base) drop.draw += *draw_base;
  t.load_keys(k, v, s, bh, m0);
  T dk_acc[TK][TD], dv_acc[TK][TD], db_acc = T(0);  // db_acc: key m0 + tid's (tid < B)
#pragma unroll
  for (int i = 0; i < TK; ++i)
#pragma unroll
    for (int c = 0; c < TD; ++c) dk_acc[i][c] = dv_acc[i][c] = T(0);
  // The first query that sees key m0 causally sits at m0 - offset.
  const int64_t n_begin = s.causal && m0 > s.offset ? (m0 - s.offset) / B * B : int64_t{0};
  for (int64_t n0 = n_begin; n0 < s.N; n0 += B) {
    __syncthreads();
    t.load_queries(q, dout, lse, delta, s, bh, n0);
    __syncthreads();
    t.scores(scale, s, pad_b, bias_b, drop, bh, heads, n0, m0, ty, tx);
    __syncthreads();
    if (dbias && tid < B)
      for (int r = 0; r < B; ++r) db_acc += t.dss[r * (B + 1) + tid];
    accumulate_patch_t<T, DM, TK, B, B>(t.ps, t.dos, dv_acc, ty, tx);  // dv += p^T dout
    accumulate_patch_t<T, DM, TK, B, B>(t.dss, t.qs, dk_acc, ty, tx);  // dk += ds^T q (scaled below)
  }
#pragma unroll
  for (int i = 0; i < TK; ++i) {
    const int64_t m = m0 + ty + kRowThreads * i;
    if (m >= s.M) continue;
#pragma unroll
    for (int c = 0; c < TD; ++c) {
      const int d = tx + kColThreads * c;
      if (d < s.D) dk[(bh * s.M + m) * s.D + d] = dk_acc[i][c] * scale;
      if (d < s.E) dv[(bh * s.M + m) * s.E + d] = dv_acc[i][c];
    }
  }
  if (dbias && tid < B && m0 + tid < s.M) dbias[bh * s.M + m0 + tid] = db_acc;
}

// dq for BR = B queries: over the key tiles they may see.
template <typename T, int DM, int B>
__global__ void sdpa_backward_dq_kernel(const T* q, const T* k, const T* v, const T* dout, const T* lse, const T* delta,
                                        const uint8_t* pad, const T* bias, T scale, SdpaShape s, int64_t heads,
                                        ExampleDropout<T> drop, const uint64_t* draw_base, T* dq) {
  constexpr int TR = B / kRowThreads, TD = DM / kColThreads;
  BackwardTiles<T, DM, B> t;
  const int tid = threadIdx.x, ty = tid / kColThreads, tx = tid % kColThreads;
  const int64_t bh = blockIdx.y, n0 = static_cast<int64_t>(blockIdx.x) * B;
  const uint8_t* pad_b = pad ? pad + (bh / heads) * s.M : nullptr;
  const T* bias_b = bias ? bias + bh * s.M : nullptr;
  if (drop.on && draw_base) drop.draw += *draw_base;
  t.load_queries(q, dout, lse, delta, s, bh, n0);
  T dq_acc[TR][TD];
#pragma unroll
  for (int i = 0; i < TR; ++i)
#pragma unroll
    for (int c = 0; c < TD; ++c) dq_acc[i][c] = T(0);
  const int64_t m_end = s.causal ? min(s.M, min(n0 + B, s.N) + s.offset) : s.M;
  for (int64_t m0 = 0; m0 < m_end; m0 += B) {
    __syncthreads();
    t.load_keys(k, v, s, bh, m0);
    __syncthreads();
    t.scores(scale, s, pad_b, bias_b, drop, bh, heads, n0, m0, ty, tx);
    __syncthreads();
    accumulate_patch<T, DM, TR, B>(t.dss, t.ks, dq_acc, ty, tx);  // dq += ds k (scaled below)
  }
#pragma unroll
  for (int i = 0; i < TR; ++i) {
    const int64_t n = n0 + ty + kRowThreads * i;
    if (n >= s.N) continue;
#pragma unroll
    for (int c = 0; c < TD; ++c) {
      const int d = tx + kColThreads * c;
      if (d < s.D) dq[(bh * s.N + n) * s.D + d] = dq_acc[i][c] * scale;
    }
  }
}

// Shared memory of the forward and of the backward kernels for tiles of B rows.
template <typename T, int DM, int B> constexpr size_t forward_smem() {
  return sizeof(T) * (3 * B * DM + B * (B + 1) + 3 * B);
}
template <typename T, int DM, int B> constexpr size_t backward_smem() {
  return sizeof(T) * (4 * B * DM + 2 * B * (B + 1) + 2 * B);
}
constexpr size_t kMaxSmem = 48 * 1024;

struct SdpaArgs {
  const Tensor &q, &k, &v, &pad, &bias;
  double scale;
  SdpaShape s;
  const FoldedDropout& drop;
};

template <typename T, int DM, int B> void forward_tiles(const SdpaArgs& a, const Tensor& out, const Tensor& lse) {
  const dim3 grid(static_cast<unsigned>((a.s.N + B - 1) / B), static_cast<unsigned>(a.q.size(0) * a.q.size(1)));
  sdpa_forward_kernel<T, DM, B><<<grid, kThreads, forward_smem<T, DM, B>(), stream()>>>(
      cptr<T>(a.q), cptr<T>(a.k), cptr<T>(a.v), a.pad.defined() ? cptr<uint8_t>(a.pad) : nullptr,
      a.bias.defined() ? cptr<T>(a.bias) : nullptr, static_cast<T>(a.scale), a.s, a.q.size(1),
      example_dropout<T>(a.drop), a.drop.draw_base, ptr<T>(out), ptr<T>(lse));
  LINEA_KERNEL_LAUNCH_CHECK();
}

template <typename T, int DM, int B>
void backward_tiles(const SdpaArgs& a, const Tensor& dout, const Tensor& lse, const T* delta, const Tensor& dq,
                    const Tensor& dk, const Tensor& dv, const Tensor& dbias) {
  const T* bias = a.bias.defined() ? cptr<T>(a.bias) : nullptr;
  const unsigned BH = static_cast<unsigned>(a.q.size(0) * a.q.size(1));
  const uint8_t* pad = a.pad.defined() ? cptr<uint8_t>(a.pad) : nullptr;
  const T scale = static_cast<T>(a.scale);
  const ExampleDropout<T> drop = example_dropout<T>(a.drop);
  sdpa_backward_dkv_kernel<T, DM, B>
      <<<dim3(static_cast<unsigned>((a.s.M + B - 1) / B), BH), kThreads, backward_smem<T, DM, B>(), stream()>>>(
          cptr<T>(a.q), cptr<T>(a.k), cptr<T>(a.v), cptr<T>(dout), cptr<T>(lse), delta, pad, bias, scale, a.s,
          a.q.size(1), drop, a.drop.draw_base, ptr<T>(dk), ptr<T>(dv), dbias.defined() ? ptr<T>(dbias) : nullptr);
  LINEA_KERNEL_LAUNCH_CHECK();
  sdpa_backward_dq_kernel<T, DM, B>
      <<<dim3(static_cast<unsigned>((a.s.N + B - 1) / B), BH), kThreads, backward_smem<T, DM, B>(), stream()>>>(
          cptr<T>(a.q), cptr<T>(a.k), cptr<T>(a.v), cptr<T>(dout), cptr<T>(lse), delta, pad, bias, scale, a.s,
          a.q.size(1), drop, a.drop.draw_base, ptr<T>(dq));
  LINEA_KERNEL_LAUNCH_CHECK();
}

// Calls f(Tiles<DM, B>{}) with DM the head dims rounded up to 32, 64 or 128 and B = 32 or 16,
// the tile rows whose backward fits in kMaxSmem.
template <int DM_, int B_> struct Tiles { static constexpr int DM = DM_, B = B_; };
template <typename T, int DM, typename F> void with_rows(F&& f) {
  if constexpr (backward_smem<T, DM, 32>() <= kMaxSmem)
    f(Tiles<DM, 32>{});
  else
    f(Tiles<DM, 16>{});
}
template <typename T, typename F> void with_tiles(const SdpaShape& s, const char* op, F&& f) {
  const int64_t dim = std::max(s.D, s.E);
  if (dim <= 32) return with_rows<T, 32>(f);
  if (dim <= 64) return with_rows<T, 64>(f);
  if constexpr (backward_smem<T, 128, 16>() <= kMaxSmem)
    if (dim <= 128) return with_rows<T, 128>(f);
  LINEA_FAIL(op, ": the CUDA kernel takes head dims up to ", sizeof(T) == 4 ? 128 : 64, " in ",
             sizeof(T) == 4 ? "float32" : "float64", ", got q/k ", s.D, " and v ", s.E);
}

SdpaShape sdpa_shape(const Tensor& q, const Tensor& k, const Tensor& v, bool causal, int64_t offset) {
  LINEA_CHECK(q.size(0) * q.size(1) <= 65535, "sdpa: B * H = ", q.size(0) * q.size(1),
              " exceeds the 65,535 (batch, head) pairs of one CUDA launch");
  return {q.size(2), k.size(2), q.size(3), v.size(3), offset, causal};
}

}  // namespace

void sdpa_forward(const Tensor& q, const Tensor& k, const Tensor& v, double scale, bool causal, int64_t offset,
                  const Tensor& pad, const Tensor& bias, const FoldedDropout& drop, const Tensor& out,
                  const Tensor& lse, const Tensor& probs) {
  LINEA_CHECK(!probs.defined(), "sdpa: the CUDA kernel keeps no probabilities (its backward recomputes them)");
  const SdpaArgs a{q, k, v, pad, bias, scale, sdpa_shape(q, k, v, causal, offset), drop};
  if (q.size(0) * q.size(1) == 0 || a.s.N == 0) return;
  LINEA_DISPATCH_FLOAT(q.dtype(), "sdpa", [&] {
    with_tiles<scalar_t>(a.s, "sdpa",
                         [&](auto t) { forward_tiles<scalar_t, decltype(t)::DM, decltype(t)::B>(a, out, lse); });
  });
}

void sdpa_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                   const Tensor& probs, const Tensor& dout, double scale, bool causal, int64_t offset,
                   const Tensor& pad, const Tensor& bias, const FoldedDropout& drop, const Tensor& dq, const Tensor& dk,
                   const Tensor& dv, const Tensor& dbias) {
  LINEA_CHECK(!probs.defined(), "sdpa_backward: the CUDA kernel recomputes the probabilities; got kept ones");
  const SdpaArgs a{q, k, v, pad, bias, scale, sdpa_shape(q, k, v, causal, offset), drop};
  const int64_t rows = q.size(0) * q.size(1) * a.s.N;
  if (q.size(0) * q.size(1) == 0) return;
  if (a.s.N == 0 || a.s.M == 0) {  // nothing to sum: zero gradients
    for (const Tensor* t : {&dq, &dk, &dv, &dbias})
      if (t->defined()) fill(*t, 0.0);
    return;
  }
  LINEA_DISPATCH_FLOAT(q.dtype(), "sdpa_backward", [&] {
    using T = scalar_t;
    DeviceScratch<T> delta_scratch(rows);  // delta [B, H, N]
    T* delta = delta_scratch.p;
    sdpa_delta_kernel<T><<<grid_for(rows), kBlockSize, 0, stream()>>>(cptr<T>(dout), cptr<T>(out), rows, a.s.E, delta);
    LINEA_KERNEL_LAUNCH_CHECK();
    with_tiles<T>(a.s, "sdpa_backward", [&](auto t) {
      backward_tiles<T, decltype(t)::DM, decltype(t)::B>(a, dout, lse, delta, dq, dk, dv, dbias);
    });
  });
}

}  // namespace linea::cuda
