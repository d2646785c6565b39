// FAVOR+ attention on CUDA in one pass over each operand (core/kernels.h; raw::favor_attention
// composes positive_features and linear_attention where favor_attention_fused says no, and on
// the CPU: the same formulas). Per (b, h), in tiles of kRows rows, with x~ = scale x:
//   forward   1. key logits  l = x~ W^T - |x~|^2/2 into phi_k, and each tile's max over its
//                            unpadded rows
//             2. key sums    c = the max of the tiles' maxima; phi_k = exp(l - c) / sqrt(S) (0 on
//                            padded rows); over a run of tiles, KV += phi_k^T v, z += phi_k^T 1;
//                            the runs' parts added in order (sum_runs_kernel) into kvz = [KV, z]
//             3. queries     phi_q = exp(l - the row's max) / sqrt(S), den = phi_q . z, out =
//                            phi_q KV / den~
//   backward  4. queries     G = g / den~, G_z = -(g . out) / den~ (0 where guarded); dl =
//                            (G KV^T + G_z z^T) * phi_q; dq = scale (dl W - rowsum(dl) x~); over a
//                            run of tiles dKV += phi_q^T G, dz += phi_q^T G_z; the runs added in order
//             5. keys        dl = (v dKV^T + 1 dz^T) * phi_k, dv = phi_k dKV, dk as dq
// Causal (self-attention, N = M; causal_linear_attention's chunked form, chunks = the 64-row tiles):
//   forward   1. as above;  2. as above, a run a tile, into the chunk states, then an exclusive
//             scan over the chunks (scan_chunks);  3. each query tile from its chunk's state plus
//             its own keys: [num, den] = phi_q S + tril(phi_q phi_k^T) [v, 1]
//   backward  6. query tiles: dq, and each chunk's phi_q^T [G, G_z], reverse-scanned into R
//             7. key tiles: dk and dv from R and the chunk's own queries (formulas at 6.)
//   decoding  (favor_attention_step) the causal forward with a running stabilizer and sums in:
//             c = the max with it, the sums rescaled to c as the scan's start, its total out
// Seven launches for a forward and backward where the composed ops take about 30 (positive
// features, the scaling of q and k, linear attention's GEMMs and row passes; causal 43), and q,
// k, v, out and their gradients are read and written in place as the heads of a projection
// (HeadRows).
// The products are each block's own, in shared memory, 64 x 64 blocks of the output at a time
// (block_product); operands padded with zeros to whole 64-wide blocks. How they multiply is the
// kernels' parameter P (the same for all of a call's kernels):
//   Tf32Products<3>  float32 from sm_80 on, the default precision: on the tensor cores, m16n8k8
//                    with each operand split as big + small TF32 parts, three mma per product
//                    (about 2^-21 relative, as the softmax kernels' float32: cuda/attention.cu);
//   Tf32Products<1>  --precision tf32: one TF32 mma;  Bf16Products  --precision bf16: m16n8k16
//                    on operands rounded to bf16 as they are read;
//   SimtProducts     float64, and float32 before sm_80: 256 threads, each a 4 x 4 patch.
// The tensor-core formats give warp w the 16 rows 16 (w % 4).. and the 32 columns 32 (w / 4)..
// of a block (four m16n8 tiles) and read their fragments from the shared tiles element by element
// (the tiles hold float32, rows 4 banks apart: at most two of a fragment load's 32 addresses share
// a bank, along a tile's rows or down its columns). Only the products' inputs are rounded: sums,
// exponentials and the kept features stay float32.
// Every sum has a fixed order: the same bits every run. Sizes whose operands do not fit a block's
// shared memory are not fused (favor_attention_fused): on an H100 (227 KB a block), float32 takes
// S = 128 with D = E = 64 (187 KB for the query gradients in the tensor cores' tiles; causal 220
// KB) but not S = D = 128 (235 KB); float64 S, D, E <= 64, and never causal (262 KB).
#include <cmath>
#include <type_traits>

#include "core/kernels.h"
#include "core/precision.h"
#include "cuda/common.cuh"
#include "cuda/mma.cuh"

namespace linea::cuda {

using namespace detail;

namespace {

constexpr int kRows = 64;      // rows of a tile, and the side of a product's blocks
constexpr int kThreads = 256;  // 16 x 16, each a 4 x 4 patch of a 64 x 64 block
constexpr int kSide = 16;

struct FavorDims {
  int64_t B, H, N, M, D, E, S;
  int Dp, Ep, Sp;  // D, E and S rounded up to whole 64-wide blocks
  __host__ __device__ int64_t BH() const { return B * H; }
};

// A matrix in shared memory, rows ld = cols + pad apart: pad 1 for the SIMT products (an odd
// pitch: a warp's 16 threads reading one column of 16 rows hit 16 banks), 4 for the tensor cores'
// fragments (lane (g, t) reading row g, column t: bank 4 g + t).
template <typename T> struct Mat {
  T* p;
  int ld;
  __device__ T& operator()(int r, int c) const { return p[r * ld + c]; }
};

// Matrices and vectors carved one after another out of dynamic shared memory (Carve) or only
// counted (Count, on the host): one layout function gives a kernel its pointers and its launch
// the size. (A carver that did both would leave the compiler a pointer that may be null, which it
// cannot place in shared memory: generic loads in the products.)
template <typename T> struct Carve {
  T* next;
  int pad;  // the products' P::kPad
  __host__ __device__ Mat<T> mat(int rows, int cols) { return {vec(rows * (cols + pad)), cols + pad}; }
  __host__ __device__ T* vec(int n) {
    T* p = next;
    next += n;
    return p;
  }
};
template <typename T> struct Count {
  int pad;
  int64_t used = 0;
  __host__ __device__ Mat<T> mat(int rows, int cols) { return {vec(rows * (cols + pad)), cols + pad}; }
  __host__ __device__ T* vec(int n) {
    used += n;
    return nullptr;
  }
};

// The shared memory of each kernel (the same call on the host sizes the launch).
template <typename T> struct KeyLogitsSmem {
  Mat<T> w, x;
  T *half, *red;
};
template <typename T, typename C> __host__ __device__ KeyLogitsSmem<T> key_logits_smem(C& c, const FavorDims& d) {
  return {c.mat(d.Sp, d.Dp), c.mat(kRows, d.Dp), c.vec(kRows), c.vec(kThreads / 32)};
}
template <typename T> struct KeySumsSmem {
  Mat<T> p, v, kv;
  T *z, *red;
};
template <typename T, typename C> __host__ __device__ KeySumsSmem<T> key_sums_smem(C& c, const FavorDims& d) {
  return {c.mat(kRows, d.Sp), c.mat(kRows, d.Ep), c.mat(d.Sp, d.Ep), c.vec(d.Sp), c.vec(kThreads / 32)};
}
// Causal: po holds the chunk's other side (the key features, or the query features in the key
// gradients), v its values, a the masked products within the chunk (in the forward, x's place).
template <typename T> struct QueriesSmem {
  Mat<T> w, kv, x, p, po, v;
  T *z, *half, *inv;  // inv: 1 / den~ per row
};
template <typename T, typename C>
__host__ __device__ QueriesSmem<T> queries_smem(C& c, const FavorDims& d, bool causal) {
  const Mat<T> none{nullptr, 0};
  return {c.mat(d.Sp, d.Dp),
          c.mat(d.Sp, d.Ep),
          c.mat(kRows, d.Dp),
          c.mat(kRows, d.Sp),
          causal ? c.mat(kRows, d.Sp) : none,
          causal ? c.mat(kRows, d.Ep) : none,
          c.vec(d.Sp),
          c.vec(kRows),
          c.vec(kRows)};
}
// The gradient kernels: G (queries) or v (keys) shares its space with x~, read after it.
template <typename T> struct GradSmem {
  Mat<T> w, kv, dkv, p, dl, gx, po, v, a;
  T *z, *dz, *gz, *rs, *inv;
};
template <typename T, typename C>
__host__ __device__ GradSmem<T> grad_smem(C& c, const FavorDims& d, bool queries, bool causal) {
  const int wide = d.Ep > d.Dp ? d.Ep : d.Dp;
  const Mat<T> none{nullptr, 0};
  return {c.mat(d.Sp, d.Dp),
          c.mat(d.Sp, d.Ep),
          queries && !causal ? c.mat(d.Sp, d.Ep) : none,
          c.mat(kRows, d.Sp),
          c.mat(kRows, d.Sp),
          c.mat(kRows, wide),
          causal ? c.mat(kRows, d.Sp) : none,
          causal ? c.mat(kRows, d.Ep) : none,
          causal ? c.mat(kRows, kRows) : none,
          c.vec(d.Sp),
          c.vec(d.Sp),
          c.vec(kRows),
          c.vec(kRows),
          c.vec(kRows)};
}
template <typename T, typename P, typename Layout> size_t smem_bytes(Layout layout) {
  Count<T> c{P::kPad};
  layout(c);
  return static_cast<size_t>(c.used) * sizeof(T);
}

// ---- the products ------------------------------------------------------------------------------
// acc += sum_{k < K} a(r, k) b(k, c) over a thread's rows r0 + ty + 16 i and columns c0 + tx + 16 j
// of a 64 x 64 block: 16 products for 8 shared loads (a warp's a loads are two broadcasts; its b
// loads 16 banks).
struct SimtProducts {
  static constexpr bool kMma = false;
  static constexpr int kPad = 1;
  template <typename T, typename A, typename B>
  __device__ static void accumulate(T (&acc)[4][4], int r0, int c0, int K, const A& a, const B& b) {
    const int tx = static_cast<int>(threadIdx.x) % kSide, ty = static_cast<int>(threadIdx.x) / kSide;
#pragma unroll 4
    for (int k = 0; k < K; ++k) {
      T x[4], y[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) x[i] = a(r0 + ty + kSide * i, k);
#pragma unroll
      for (int j = 0; j < 4; ++j) y[j] = b(k, c0 + tx + kSide * j);
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[i][j] += x[i] * y[j];
    }
  }
};

// acc[j] += the warp's 16 x 8 tile j of sum_{k < K} a(r, k) b(k, c) for rows r0.. and columns
// c0 + 8 j.. (cuda/mma.cuh's fragment layouts, g = lane / 4, t = lane % 4), K a multiple of 16.
template <int PASSES> struct Tf32Products {
  static_assert(PASSES == 1 || PASSES == 3);
  static constexpr bool kMma = true;
  static constexpr int kPad = 4;
  template <typename A, typename B>
  __device__ static void accumulate(float (&acc)[4][4], int r0, int c0, int K, const A& a, const B& b) {
    const int g = static_cast<int>(threadIdx.x) % 32 / 4, t = static_cast<int>(threadIdx.x) % 4;
#pragma unroll 1  // unrolled, ptxas spilled in the query gradients (sm_90)
    for (int k = 0; k < K; k += 8) {
      const uint32_t x[4] = {float_bits(a(r0 + g, k + t)), float_bits(a(r0 + g + 8, k + t)),
                             float_bits(a(r0 + g, k + t + 4)), float_bits(a(r0 + g + 8, k + t + 4))};
      uint32_t xb[4], xs[4];
      split_tf32(x, xb, xs);
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int c = c0 + 8 * j + g;
        const uint32_t y[2] = {float_bits(b(k + t, c)), float_bits(b(k + t + 4, c))};
        uint32_t yb[2], ys[2];
        split_tf32(y, yb, ys);
        if constexpr (PASSES == 3)
          mma_tf32x3_16x8x8(acc[j], xb, xs, yb, ys);
        else
          mma_tf32_16x8x8(acc[j], xb, yb);
      }
    }
  }
};
struct Bf16Products {
  static constexpr bool kMma = true;
  static constexpr int kPad = 4;
  template <typename A, typename B>
  __device__ static void accumulate(float (&acc)[4][4], int r0, int c0, int K, const A& a, const B& b) {
    const int g = static_cast<int>(threadIdx.x) % 32 / 4, t2 = 2 * (static_cast<int>(threadIdx.x) % 4);
    for (int k = 0; k < K; k += 16) {
      const uint32_t x[4] = {pack_bf16x2(a(r0 + g, k + t2), a(r0 + g, k + t2 + 1)),
                             pack_bf16x2(a(r0 + g + 8, k + t2), a(r0 + g + 8, k + t2 + 1)),
                             pack_bf16x2(a(r0 + g, k + t2 + 8), a(r0 + g, k + t2 + 9)),
                             pack_bf16x2(a(r0 + g + 8, k + t2 + 8), a(r0 + g + 8, k + t2 + 9))};
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int c = c0 + 8 * j + g;
        const uint32_t y[2] = {pack_bf16x2(b(k + t2, c), b(k + t2 + 1, c)),
                               pack_bf16x2(b(k + t2 + 8, c), b(k + t2 + 9, c))};
        mma_bf16_16x8x16(acc[j], x, y);
      }
    }
  }
};

// f(r, c, sum_{k < K} a(r, k) b(k, c) + sum_{k < K2} a2(r, k) b2(k, c)) for every (r, c) of an R x N
// product (R and N whole 64 blocks), each (r, c) by one thread, the same thread in every call of a
// kernel. All threads of the block call it.
template <typename P, typename T, typename A, typename B, typename A2, typename B2, typename F>
__device__ __forceinline__ void block_product2(int R, int N, int K, const A& a, const B& b, int K2, const A2& a2,
                                               const B2& b2, F&& f) {
  for (int r0 = 0; r0 < R; r0 += kRows)
    for (int c0 = 0; c0 < N; c0 += kRows) {
      T acc[4][4] = {};
      if constexpr (P::kMma) {  // warp w: rows 16 (w % 4).., columns 32 (w / 4)..; acc[j]: tile j's fragment
        static_assert(std::is_same_v<T, float>, "the tensor-core products take float32");
        const int w = static_cast<int>(threadIdx.x) / 32, g = static_cast<int>(threadIdx.x) % 32 / 4,
                  t = static_cast<int>(threadIdx.x) % 4;
        const int rw = r0 + 16 * (w % 4), cw = c0 + 32 * (w / 4);
        P::accumulate(acc, rw, cw, K, a, b);
        if (K2 > 0) P::accumulate(acc, rw, cw, K2, a2, b2);
#pragma unroll
        for (int j = 0; j < 4; ++j)
#pragma unroll
          for (int i = 0; i < 4; ++i) f(rw + g + 8 * (i / 2), cw + 8 * j + 2 * t + i % 2, acc[j][i]);
      } else {
        const int tx = static_cast<int>(threadIdx.x) % kSide, ty = static_cast<int>(threadIdx.x) / kSide;
        P::accumulate(acc, r0, c0, K, a, b);
        if (K2 > 0) P::accumulate(acc, r0, c0, K2, a2, b2);
#pragma unroll
        for (int i = 0; i < 4; ++i)
#pragma unroll
          for (int j = 0; j < 4; ++j) f(r0 + ty + kSide * i, c0 + tx + kSide * j, acc[i][j]);
      }
    }
}
// One product: f(r, c, sum_{k < K} a(r, k) b(k, c)).
template <typename P, typename T, typename A, typename B, typename F>
__device__ __forceinline__ void block_product(int R, int N, int K, const A& a, const B& b, F&& f) {
  block_product2<P, T>(R, N, K, a, b, 0, a, b, f);
}

// The 4 threads of row r = threadIdx.x / 4 combine f(r, c) over c < n by op (in a fixed order);
// each of them gets the result.
template <typename T, typename Op, typename F> __device__ __forceinline__ T row_reduce(int n, T init, Op op, F&& f) {
  const int r = static_cast<int>(threadIdx.x) / 4;
  T acc = init;
  for (int c = static_cast<int>(threadIdx.x) % 4; c < n; c += 4) acc = op(acc, f(r, c));
  acc = op(acc, __shfl_xor_sync(0xffffffffu, acc, 1));
  return op(acc, __shfl_xor_sync(0xffffffffu, acc, 2));
}
struct Add {
  template <typename T> __device__ T operator()(T a, T b) const { return a + b; }
};
struct Max {
  template <typename T> __device__ T operator()(T a, T b) const { return a > b ? a : b; }
};

// The max of every thread's x, to all threads (red: kThreads / 32 values). Barriers inside.
template <typename T> __device__ T block_max(T x, T* red) {
  x = warp_max(x);
  if (threadIdx.x % 32 == 0) red[threadIdx.x / 32] = x;
  __syncthreads();
  T m = red[0];
  for (int w = 1; w < kThreads / 32; ++w) m = m > red[w] ? m : red[w];
  __syncthreads();
  return m;
}

// m [rows, cols] (cols whole blocks) = f(r, c) for r < n, c < width; 0 elsewhere. Consecutive
// threads take consecutive columns (coalesced global reads).
template <typename T, typename F> __device__ void fill_mat(Mat<T> m, int rows, int cols, int n, int width, F&& f) {
  for (int i = static_cast<int>(threadIdx.x); i < rows * cols; i += kThreads) {
    const int r = i / cols, c = i - r * cols;
    m(r, c) = r < n && c < width ? f(r, c) : T(0);
  }
}

// W_h [S, D] into w [Sp, Dp].
template <typename T> __device__ void load_omega(const T* omega, const FavorDims& d, Mat<T> w) {
  const T* wh = omega + blockIdx.y % d.H * d.S * d.D;
  fill_mat(w, d.Sp, d.Dp, static_cast<int>(d.S), static_cast<int>(d.D), [&](int s, int j) { return wh[s * d.D + j]; });
}
// n rows of a head (its rows from r0) times `scale` into m [kRows, cols].
template <typename T>
__device__ void load_rows(Rows<const T> src, int64_t r0, int n, int width, int cols, T scale, Mat<T> m) {
  fill_mat(m, kRows, cols, n, width, [&](int r, int c) { return src.p[(r0 + r) * src.row + c] * scale; });
}
// [S, E + 1] rows (kvz's layout, at p) into kv [Sp, Ep] and z [Sp].
template <typename T> __device__ void load_kvz(const T* p, const FavorDims& d, Mat<T> kv, T* z) {
  const int64_t E1 = d.E + 1;
  fill_mat(kv, d.Sp, d.Ep, static_cast<int>(d.S), static_cast<int>(d.E), [&](int s, int e) { return p[s * E1 + e]; });
  for (int s = static_cast<int>(threadIdx.x); s < d.Sp; s += kThreads) z[s] = s < d.S ? p[s * E1 + d.E] : T(0);
}
// half[r] = |x_r|^2 / 2 for the rows of x [kRows, Dp].
template <typename T> __device__ void half_norms(Mat<T> x, int Dp, T* half) {
  const T h = row_reduce(Dp, T(0), Add(), [&](int r, int c) { return x(r, c) * x(r, c); }) * T(0.5);
  if (threadIdx.x % 4 == 0) half[threadIdx.x / 4] = h;
}

int64_t tiles_of(int64_t rows) { return (rows + kRows - 1) / kRows; }

// ---- forward ------------------------------------------------------------------------------------
// 1. l = k~ W^T - |k~|^2/2 of tile blockIdx.x of head blockIdx.y into lg [BH, M, S]; tile_max
//    [BH, tiles] = the max over the tile's unpadded rows (lowest where every row is padded).
template <typename T, typename P>
__global__ void __launch_bounds__(kThreads)
    key_logits_kernel(HeadRows<const T> k, const T* omega, Rows<const uint8_t> pad, FavorDims d, T scale, T* lg,
                      T* tile_max) {
  Carve<T> carve{shared_mem<T>(), P::kPad};
  const KeyLogitsSmem<T> sm = key_logits_smem<T>(carve, d);
  const int64_t bh = blockIdx.y, m0 = blockIdx.x * static_cast<int64_t>(kRows);
  const int n = static_cast<int>(min(int64_t(kRows), d.M - m0));
  load_omega(omega, d, sm.w);
  load_rows(k.rows(bh, d.H), m0, n, static_cast<int>(d.D), d.Dp, scale, sm.x);
  __syncthreads();
  half_norms(sm.x, d.Dp, sm.half);
  __syncthreads();
  const uint8_t* pb = pad.p ? pad.p + bh / d.H * pad.row + m0 : nullptr;
  T* out = lg + (bh * d.M + m0) * d.S;
  T mx = lowest<T>();
  block_product<P, T>(
      kRows, d.Sp, d.Dp, [&](int r, int j) { return sm.x(r, j); }, [&](int j, int s) { return sm.w(s, j); },
      [&](int r, int s, T acc) {
        if (r >= n || s >= d.S) return;
        const T l = acc - sm.half[r];
        out[r * d.S + s] = l;
        if (!(pb && pb[r])) mx = l > mx ? l : mx;
      });
  mx = block_max(mx, sm.red);
  if (threadIdx.x == 0) tile_max[bh * gridDim.x + blockIdx.x] = mx;
}

// A decoding step's running sums (favor_attention_step): the stabilizer c [BH] and the sums [BH, S,
// E + 1] of the earlier keys (null before the first step); the step's c' = max(c, its keys' max)
// and the earlier sums rescaled to it (init, the scan's start).
template <typename T> struct RunningSums {
  const T *c, *sums;
  T *c_out, *init;
};

// 2. Over run blockIdx.x of head blockIdx.y's tiles (`per_run` of them): phi_k = exp(l - c) /
//    sqrt(S) in place of the logits (0 on padded rows), c = the max of the head's tile_max (and of
//    the running c); and the run's [phi_k^T v, phi_k^T 1] [S, E + 1] at part + run run_ld + bh
//    head_ld ([run, BH, S, E + 1]; causal, a run a tile: [BH, tile, S, E + 1]).
template <typename T, typename P>
__global__ void __launch_bounds__(kThreads)
    key_sums_kernel(HeadRows<const T> v, Rows<const uint8_t> pad, FavorDims d, int64_t tiles, int64_t per_run,
                    const T* tile_max, T inv_sqrt_s, T* phi_k, T* part, int64_t run_ld, int64_t head_ld,
                    RunningSums<T> run) {
  Carve<T> carve{shared_mem<T>(), P::kPad};
  const KeySumsSmem<T> sm = key_sums_smem<T>(carve, d);
  const int64_t bh = blockIdx.y;
  T c = lowest<T>();
  for (int64_t t = threadIdx.x; t < tiles; t += kThreads) c = max(c, tile_max[bh * tiles + t]);
  c = block_max(c, sm.red);
  if (run.c) {
    c = max(c, run.c[bh]);
    if (blockIdx.x == 0) {
      const int64_t n = d.S * (d.E + 1);
      const T f = d_exp(run.c[bh] - c);
      if (threadIdx.x == 0) run.c_out[bh] = c;
      for (int64_t i = threadIdx.x; i < n; i += kThreads) run.init[bh * n + i] = run.sums[bh * n + i] * f;
    }
  } else if (run.c_out && blockIdx.x == 0 && threadIdx.x == 0) {
    run.c_out[bh] = c;
  }
  fill_mat(sm.kv, d.Sp, d.Ep, 0, 0, [](int, int) { return T(0); });
  for (int s = static_cast<int>(threadIdx.x); s < d.Sp; s += kThreads) sm.z[s] = T(0);
  const Rows<const T> vr = v.rows(bh, d.H);
  const uint8_t* pb = pad.p ? pad.p + bh / d.H * pad.row : nullptr;
  const int64_t t1 = min(tiles, (blockIdx.x + 1) * per_run);
  for (int64_t t = blockIdx.x * per_run; t < t1; ++t) {
    const int64_t m0 = t * kRows;
    const int n = static_cast<int>(min(int64_t(kRows), d.M - m0));
    T* rows = phi_k + (bh * d.M + m0) * d.S;
    fill_mat(sm.p, kRows, d.Sp, n, static_cast<int>(d.S), [&](int r, int s) {
      const T phi = pb && pb[m0 + r] ? T(0) : d_exp(rows[r * d.S + s] - c) * inv_sqrt_s;
      rows[r * d.S + s] = phi;
      return phi;
    });
    load_rows(vr, m0, n, static_cast<int>(d.E), d.Ep, T(1), sm.v);
    __syncthreads();
    block_product<P, T>(
        d.Sp, d.Ep, kRows, [&](int s, int m) { return sm.p(m, s); }, [&](int m, int e) { return sm.v(m, e); },
        [&](int s, int e, T acc) { sm.kv(s, e) += acc; });
    for (int s = static_cast<int>(threadIdx.x); s < d.Sp; s += kThreads) {
      T acc = T(0);
      for (int m = 0; m < kRows; ++m) acc += sm.p(m, s);
      sm.z[s] += acc;
    }
    __syncthreads();
  }
  T* out = part + blockIdx.x * run_ld + bh * head_ld;
  for (int64_t i = threadIdx.x; i < d.S * (d.E + 1); i += kThreads) {
    const int s = static_cast<int>(i / (d.E + 1)), e = static_cast<int>(i % (d.E + 1));
    out[i] = e < d.E ? sm.kv(s, e) : sm.z[s];
  }
}

// n rows of [*, S] features (a head's, its row r0 at p) into m [kRows, Sp].
template <typename T> __device__ void load_features(const T* p, int64_t r0, int n, const FavorDims& d, Mat<T> m) {
  fill_mat(m, kRows, d.Sp, n, static_cast<int>(d.S), [&](int r, int s) { return p[(r0 + r) * d.S + s]; });
}

// 3. Query tile blockIdx.x of head blockIdx.y: phi_q (per-row stabilizer), den = phi_q . z (raw)
//    and out = phi_q KV / den~. Causal (kvz: the chunk states [BH, tiles, S, E + 1], N = M): the
//    tile's state, and its own keys through A = tril(phi_q phi_k^T): [num, den] += A [v, 1].
template <typename T, typename P, bool kCausal>
__global__ void __launch_bounds__(kThreads)
    queries_kernel(HeadRows<const T> q, const T* omega, const T* kvz, FavorDims d, T scale, T inv_sqrt_s, T guard,
                   const T* phi_k, HeadRows<const T> v, HeadRows<T> out, T* den, T* phi_q) {
  Carve<T> carve{shared_mem<T>(), P::kPad};
  const QueriesSmem<T> sm = queries_smem<T>(carve, d, kCausal);
  const int64_t bh = blockIdx.y, n0 = blockIdx.x * static_cast<int64_t>(kRows);
  const int n = static_cast<int>(min(int64_t(kRows), d.N - n0));
  load_omega(omega, d, sm.w);
  load_kvz(kvz + (kCausal ? bh * gridDim.x + blockIdx.x : bh) * d.S * (d.E + 1), d, sm.kv, sm.z);
  load_rows(q.rows(bh, d.H), n0, n, static_cast<int>(d.D), d.Dp, scale, sm.x);
  if constexpr (kCausal) {
    load_features(phi_k + bh * d.M * d.S, n0, n, d, sm.po);
    load_rows(v.rows(bh, d.H), n0, n, static_cast<int>(d.E), d.Ep, T(1), sm.v);
  }
  __syncthreads();
  half_norms(sm.x, d.Dp, sm.half);
  __syncthreads();
  block_product<P, T>(
      kRows, d.Sp, d.Dp, [&](int r, int j) { return sm.x(r, j); }, [&](int j, int s) { return sm.w(s, j); },
      [&](int r, int s, T acc) { sm.p(r, s) = acc - sm.half[r]; });
  __syncthreads();
  const int S = static_cast<int>(d.S);
  const T mx = row_reduce(S, lowest<T>(), Max(), [&](int r, int s) { return sm.p(r, s); });
  __syncthreads();  // every row's max read before any of its entries changes
  T* pq = phi_q + (bh * d.N + n0) * d.S;
  {
    const int r = static_cast<int>(threadIdx.x) / 4;
    for (int s = static_cast<int>(threadIdx.x) % 4; s < d.Sp; s += 4) {
      const T phi = s < S ? d_exp(sm.p(r, s) - mx) * inv_sqrt_s : T(0);
      sm.p(r, s) = phi;
      if (r < n && s < S) pq[r * d.S + s] = phi;
    }
  }
  __syncthreads();
  const Mat<T> a = sm.x;  // causal: A in place of x~ (read only by the logits)
  if constexpr (kCausal) {
    block_product<P, T>(
        kRows, kRows, d.Sp, [&](int r, int s) { return sm.p(r, s); }, [&](int s, int m) { return sm.po(m, s); },
        [&](int r, int m, T acc) { a(r, m) = m <= r ? acc : T(0); });
    __syncthreads();
  }
  T raw = row_reduce(S, T(0), Add(), [&](int r, int s) { return sm.p(r, s) * sm.z[s]; });
  if constexpr (kCausal) raw += row_reduce(kRows, T(0), Add(), [&](int r, int m) { return a(r, m); });
  if (threadIdx.x % 4 == 0) {
    const int r = static_cast<int>(threadIdx.x) / 4;
    sm.inv[r] = T(1) / guarded(raw, guard);
    if (r < n) den[bh * d.N + n0 + r] = raw;
  }
  __syncthreads();
  const Rows<T> o = out.rows(bh, d.H);
  block_product2<P, T>(
      kRows, d.Ep, d.Sp, [&](int r, int s) { return sm.p(r, s); }, [&](int s, int e) { return sm.kv(s, e); },
      kCausal ? kRows : 0, [&](int r, int m) { return a(r, m); }, [&](int m, int e) { return sm.v(m, e); },
      [&](int r, int e, T acc) {
        if (r < n && e < d.E) o.p[(n0 + r) * o.row + e] = acc * sm.inv[r];
      });
}

// ---- backward -----------------------------------------------------------------------------------
// G of the query tile at n0 (n rows) into sm.gx: g / den~, and sm.gz = G_z = -(g . out) / den~, 0
// where the guard holds den~ (a constant); rows past n 0. Barriers inside.
template <typename T>
__device__ void g_tile(const GradSmem<T>& sm, const FavorDims& d, int64_t n0, int n, Rows<const T> gr,
                       Rows<const T> outr, const T* den, T guard) {
  const int E = static_cast<int>(d.E);
  load_rows(gr, n0, n, E, d.Ep, T(1), sm.gx);
  __syncthreads();
  const T dot = row_reduce(E, T(0), Add(),
                           [&](int r, int e) { return r < n ? sm.gx(r, e) * outr.p[(n0 + r) * outr.row + e] : T(0); });
  if (threadIdx.x % 4 == 0) {
    const int r = static_cast<int>(threadIdx.x) / 4;
    const T raw = r < n ? den[n0 + r] : T(1), dg = guarded(raw, guard);
    sm.inv[r] = T(1) / dg;
    sm.gz[r] = dg == raw ? -dot / dg : T(0);
  }
  __syncthreads();
  for (int i = static_cast<int>(threadIdx.x); i < kRows * d.Ep; i += kThreads) {
    const int r = i / d.Ep, e = i - r * d.Ep;
    sm.gx(r, e) *= sm.inv[r];
  }
  __syncthreads();
}
// dl = dphi * phi into sm.dl and its row sums into sm.rs, with dphi = a(r, e) kv(s, e)^T over e +
// bias(r, s) [+ a2(r, m) b2(m, s) over m < K2]: the queries' G KV^T + G_z z^T [+ B phi_k], the
// keys' v dKV^T + dz^T [+ B^T phi_q].
template <typename P, typename T, typename A, typename Bias, typename A2, typename B2>
__device__ void feature_grads(const GradSmem<T>& sm, const FavorDims& d, Mat<T> kv, const A& a, const Bias& bias,
                              int K2, const A2& a2, const B2& b2) {
  block_product2<P, T>(
      kRows, d.Sp, d.Ep, a, [&](int e, int s) { return kv(s, e); }, K2, a2, b2,
      [&](int r, int s, T acc) { sm.dl(r, s) = (acc + bias(r, s)) * sm.p(r, s); });
  __syncthreads();
  const T rs = row_reduce(d.Sp, T(0), Add(), [&](int r, int s) { return sm.dl(r, s); });
  if (threadIdx.x % 4 == 0) sm.rs[threadIdx.x / 4] = rs;
}
template <typename P, typename T, typename A, typename Bias>
__device__ void feature_grads(const GradSmem<T>& sm, const FavorDims& d, Mat<T> kv, const A& a, const Bias& bias) {
  feature_grads<P>(sm, d, kv, a, bias, 0, a, a);
}
// dx = scale (dl W - rowsum(dl) x~) for the tile's n rows from sm.dl, sm.rs and x~ in sm.gx.
template <typename P, typename T>
__device__ void input_grads(const GradSmem<T>& sm, const FavorDims& d, int64_t r0, int n, T scale, Rows<T> dx) {
  block_product<P, T>(
      kRows, d.Dp, d.Sp, [&](int r, int s) { return sm.dl(r, s); }, [&](int s, int j) { return sm.w(s, j); },
      [&](int r, int j, T acc) {
        if (r < n && j < d.D) dx.p[(r0 + r) * dx.row + j] = scale * (acc - sm.rs[r] * sm.gx(r, j));
      });
}

// 4. Over run blockIdx.x of head blockIdx.y's query tiles: dq, and part [run, BH, S, E + 1] =
//    [phi_q^T G, phi_q^T G_z] over the run.
template <typename T, typename P>
__global__ void __launch_bounds__(kThreads)
    query_grads_kernel(HeadRows<const T> q, HeadRows<const T> out, HeadRows<const T> dout, const T* omega, const T* kvz,
                       const T* den, const T* phi_q, FavorDims d, int64_t tiles, int64_t per_run, T scale, T guard,
                       HeadRows<T> dq, T* part) {
  Carve<T> carve{shared_mem<T>(), P::kPad};
  const GradSmem<T> sm = grad_smem<T>(carve, d, true, false);
  const int64_t bh = blockIdx.y;
  load_omega(omega, d, sm.w);
  load_kvz(kvz + bh * d.S * (d.E + 1), d, sm.kv, sm.z);
  fill_mat(sm.dkv, d.Sp, d.Ep, 0, 0, [](int, int) { return T(0); });
  for (int s = static_cast<int>(threadIdx.x); s < d.Sp; s += kThreads) sm.dz[s] = T(0);
  const Rows<const T> qr = q.rows(bh, d.H), outr = out.rows(bh, d.H), gr = dout.rows(bh, d.H);
  const Rows<T> dqr = dq.rows(bh, d.H);
  const int E = static_cast<int>(d.E);
  const int64_t t1 = min(tiles, (blockIdx.x + 1) * per_run);
  for (int64_t t = blockIdx.x * per_run; t < t1; ++t) {
    const int64_t n0 = t * kRows;
    const int n = static_cast<int>(min(int64_t(kRows), d.N - n0));
    load_features(phi_q + bh * d.N * d.S, n0, n, d, sm.p);
    g_tile(sm, d, n0, n, gr, outr, den + bh * d.N, guard);
    feature_grads<P>(
        sm, d, sm.kv, [&](int r, int e) { return sm.gx(r, e); }, [&](int r, int s) { return sm.gz[r] * sm.z[s]; });
    block_product<P, T>(
        d.Sp, d.Ep, kRows, [&](int s, int m) { return sm.p(m, s); }, [&](int m, int e) { return sm.gx(m, e); },
        [&](int s, int e, T acc) { sm.dkv(s, e) += acc; });
    for (int s = static_cast<int>(threadIdx.x); s < d.Sp; s += kThreads) {
      T acc = T(0);
      for (int m = 0; m < kRows; ++m) acc += sm.p(m, s) * sm.gz[m];
      sm.dz[s] += acc;
    }
    __syncthreads();  // G read by all: x~ may take its place
    load_rows(qr, n0, n, static_cast<int>(d.D), d.Dp, scale, sm.gx);
    __syncthreads();
    input_grads<P>(sm, d, n0, n, scale, dqr);
    __syncthreads();
  }
  T* o = part + (blockIdx.x * d.BH() + bh) * d.S * (d.E + 1);
  for (int64_t i = threadIdx.x; i < d.S * (d.E + 1); i += kThreads) {
    const int s = static_cast<int>(i / (d.E + 1)), e = static_cast<int>(i % (d.E + 1));
    o[i] = e < E ? sm.dkv(s, e) : sm.dz[s];
  }
}

// The end of both key-gradient kernels, for the key tile of head blockIdx.y at m0 (n rows):
// dv = phi_k dKV plus a second product over K2 (the causal chunk's A^T G; none: K2 = 0), then
// dk from k~, read into G's (or v's) place once the product is done.
template <typename P, typename T, typename A2, typename B2>
__device__ void key_grads_end(const GradSmem<T>& sm, const FavorDims& d, int64_t m0, int n, int K2, const A2& a2,
                              const B2& b2, HeadRows<const T> k, T scale, HeadRows<T> dk, HeadRows<T> dv) {
  const int64_t bh = blockIdx.y;
  const Rows<T> dvr = dv.rows(bh, d.H);
  block_product2<P, T>(
      kRows, d.Ep, d.Sp, [&](int m, int s) { return sm.p(m, s); }, [&](int s, int e) { return sm.kv(s, e); }, K2, a2,
      b2,
      [&](int m, int e, T acc) {
        if (m < n && e < d.E) dvr.p[(m0 + m) * dvr.row + e] = acc;
      });
  __syncthreads();  // G (or v) read by all: k~ takes its place
  load_rows(k.rows(bh, d.H), m0, n, static_cast<int>(d.D), d.Dp, scale, sm.gx);
  __syncthreads();
  input_grads<P>(sm, d, m0, n, scale, dk.rows(bh, d.H));
}

// 5. Key tile blockIdx.x of head blockIdx.y: dv = phi_k dKV and dk (padded rows: phi_k = 0, so 0).
template <typename T, typename P>
__global__ void __launch_bounds__(kThreads)
    key_grads_kernel(HeadRows<const T> k, HeadRows<const T> v, const T* omega, const T* dkvz, const T* phi_k,
                     FavorDims d, T scale, HeadRows<T> dk, HeadRows<T> dv) {
  Carve<T> carve{shared_mem<T>(), P::kPad};
  const GradSmem<T> sm = grad_smem<T>(carve, d, false, false);
  const int64_t bh = blockIdx.y, m0 = blockIdx.x * static_cast<int64_t>(kRows);
  const int n = static_cast<int>(min(int64_t(kRows), d.M - m0));
  load_omega(omega, d, sm.w);
  load_kvz(dkvz + bh * d.S * (d.E + 1), d, sm.kv, sm.dz);  // dKV and dz
  load_rows(v.rows(bh, d.H), m0, n, static_cast<int>(d.E), d.Ep, T(1), sm.gx);
  load_features(phi_k + bh * d.M * d.S, m0, n, d, sm.p);
  __syncthreads();
  feature_grads<P>(
      sm, d, sm.kv, [&](int r, int e) { return sm.gx(r, e); }, [&](int, int s) { return sm.dz[s]; });
  key_grads_end<P>(
      sm, d, m0, n, 0, [&](int r, int s) { return sm.p(r, s); }, [&](int s, int e) { return sm.kv(s, e); }, k, scale,
      dk, dv);
}

// ---- causal backward (N = M; chunk t = query and key tile t) ------------------------------------
// With G = [g / den~, G_z] of the chunk's queries, R = dstates' entry for the chunk (the sum over
// the later chunks of phi_q^T G), A = tril(phi_q phi_k^T) and B = tril(G [v, 1]^T) within it:
//   dphi_q = G S^T + B phi_k,   dphi_k = [v, 1] R^T + B^T phi_q,   dv = phi_k R + A^T G.
// The start of both causal gradient kernels, for the chunk of head blockIdx.y at r0 (n rows): W,
// the chunk's [S, E + 1] entry (states or R) into kv and z, the chunk's own features (phi_q or
// phi_k) into p and the other side's into po, its values into v, and its G (g_tile).
template <typename T>
__device__ void load_chunk(const GradSmem<T>& sm, const FavorDims& d, int64_t r0, int n, const T* omega, const T* entry,
                           T* z, const T* own, const T* other, HeadRows<const T> v, HeadRows<const T> out,
                           HeadRows<const T> dout, const T* den, T guard) {
  const int64_t bh = blockIdx.y;
  load_omega(omega, d, sm.w);
  load_kvz(entry, d, sm.kv, z);
  load_features(own + bh * d.N * d.S, r0, n, d, sm.p);  // N = M
  load_features(other + bh * d.N * d.S, r0, n, d, sm.po);
  load_rows(v.rows(bh, d.H), r0, n, static_cast<int>(d.E), d.Ep, T(1), sm.v);
  g_tile(sm, d, r0, n, dout.rows(bh, d.H), out.rows(bh, d.H), den + bh * d.N, guard);
}

// 6. Chunk blockIdx.x of head blockIdx.y, its queries: dq, and its phi_q^T [G, G_z] [S, E + 1] into
//    part [BH, chunks, S, E + 1] (the reverse scan makes them R).
template <typename T, typename P>
__global__ void __launch_bounds__(kThreads)
    causal_query_grads_kernel(HeadRows<const T> q, HeadRows<const T> v, HeadRows<const T> out, HeadRows<const T> dout,
                              const T* omega, const T* states, const T* den, const T* phi_q, const T* phi_k,
                              FavorDims d, T scale, T guard, HeadRows<T> dq, T* part) {
  Carve<T> carve{shared_mem<T>(), P::kPad};
  const GradSmem<T> sm = grad_smem<T>(carve, d, true, true);
  const int64_t bh = blockIdx.y, n0 = blockIdx.x * static_cast<int64_t>(kRows);
  const int n = static_cast<int>(min(int64_t(kRows), d.N - n0));
  const int64_t chunk = bh * gridDim.x + blockIdx.x;
  load_chunk(sm, d, n0, n, omega, states + chunk * d.S * (d.E + 1), sm.z, phi_q, phi_k, v, out, dout, den, guard);
  block_product<P, T>(  // B
      kRows, kRows, d.Ep, [&](int r, int e) { return sm.gx(r, e); }, [&](int e, int m) { return sm.v(m, e); },
      [&](int r, int m, T acc) { sm.a(r, m) = m <= r ? acc + sm.gz[r] : T(0); });
  __syncthreads();
  feature_grads<P>(
      sm, d, sm.kv, [&](int r, int e) { return sm.gx(r, e); }, [&](int r, int s) { return sm.gz[r] * sm.z[s]; }, kRows,
      [&](int r, int m) { return sm.a(r, m); }, [&](int m, int s) { return sm.po(m, s); });
  T* o = part + chunk * d.S * (d.E + 1);
  const int E = static_cast<int>(d.E), S = static_cast<int>(d.S);
  block_product<P, T>(
      d.Sp, d.Ep, kRows, [&](int s, int m) { return sm.p(m, s); }, [&](int m, int e) { return sm.gx(m, e); },
      [&](int s, int e, T acc) {
        if (s < S && e < E) o[s * (E + 1) + e] = acc;
      });
  for (int s = static_cast<int>(threadIdx.x); s < S; s += kThreads) {
    T acc = T(0);
    for (int m = 0; m < kRows; ++m) acc += sm.p(m, s) * sm.gz[m];
    o[s * (E + 1) + E] = acc;
  }
  __syncthreads();  // G read by all: x~ takes its place
  load_rows(q.rows(bh, d.H), n0, n, static_cast<int>(d.D), d.Dp, scale, sm.gx);
  __syncthreads();
  input_grads<P>(sm, d, n0, n, scale, dq.rows(bh, d.H));
}

// 7. Chunk blockIdx.x of head blockIdx.y, its keys: dk and dv from R (dstates) and the chunk's
//    queries (padded rows: phi_k = 0, so 0).
template <typename T, typename P>
__global__ void __launch_bounds__(kThreads)
    causal_key_grads_kernel(HeadRows<const T> k, HeadRows<const T> v, HeadRows<const T> out, HeadRows<const T> dout,
                            const T* omega, const T* dstates, const T* den, const T* phi_q, const T* phi_k, FavorDims d,
                            T scale, T guard, HeadRows<T> dk, HeadRows<T> dv) {
  Carve<T> carve{shared_mem<T>(), P::kPad};
  const GradSmem<T> sm = grad_smem<T>(carve, d, false, true);
  const int64_t bh = blockIdx.y, m0 = blockIdx.x * static_cast<int64_t>(kRows);
  const int n = static_cast<int>(min(int64_t(kRows), d.M - m0));
  load_chunk(sm, d, m0, n, omega, dstates + (bh * gridDim.x + blockIdx.x) * d.S * (d.E + 1), sm.dz, phi_k, phi_q, v,
             out, dout, den, guard);  // R: dKV and dz
  // B^T
  block_product<P, T>(
      kRows, kRows, d.Ep, [&](int m, int e) { return sm.v(m, e); }, [&](int e, int r) { return sm.gx(r, e); },
      [&](int m, int r, T acc) { sm.a(m, r) = r >= m ? acc + sm.gz[r] : T(0); });
  __syncthreads();
  feature_grads<P>(
      sm, d, sm.kv, [&](int m, int e) { return sm.v(m, e); }, [&](int, int s) { return sm.dz[s]; }, kRows,
      [&](int m, int r) { return sm.a(m, r); }, [&](int r, int s) { return sm.po(r, s); });
  block_product<P, T>(  // A^T, in B^T's place (read before feature_grads' barrier)
      kRows, kRows, d.Sp, [&](int m, int s) { return sm.p(m, s); }, [&](int s, int r) { return sm.po(r, s); },
      [&](int m, int r, T acc) { sm.a(m, r) = r >= m ? acc : T(0); });
  __syncthreads();
  key_grads_end<P>(
      sm, d, m0, n, kRows, [&](int m, int r) { return sm.a(m, r); }, [&](int r, int e) { return sm.gx(r, e); }, k,
      scale, dk, dv);
}

// ---- launch ---------------------------------------------------------------------------------------
int round_up(int64_t x) { return static_cast<int>((x + kRows - 1) / kRows * kRows); }

FavorDims favor_dims(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& omega) {
  const int64_t D = q.size(3), E = v.size(3), S = omega.size(1);
  return {q.size(0), q.size(1), q.size(2), k.size(2), D, E, S, round_up(D), round_up(E), round_up(S)};
}

// fn(P{}) with the products of T's kernels on this device at the matmul precision (see the top).
// Every tensor-core format pads its tiles alike, so what fits does not depend on the precision.
template <typename T, typename Fn> void with_products(Fn&& fn) {
  if constexpr (std::is_same_v<T, float>) {
    if (compute_capability() >= 80) {
      switch (matmul_precision()) {
        case MatmulPrecision::BF16:
          return fn(Bf16Products{});
        case MatmulPrecision::TF32:
          return fn(Tf32Products<1>{});
        default:
          return fn(Tf32Products<3>{});
      }
    }
  }
  fn(SimtProducts{});
}

// Whether every kernel's shared memory fits a block (and the grid its heads), for T and P.
template <typename T, typename P> bool fits(const FavorDims& d, bool causal) {
  if (causal && sizeof(T) == 8) return false;  // the gradients' eight 64 x 64 tiles: 262 KB at least
  const size_t most = std::max({smem_bytes<T, P>([&](Count<T>& c) { key_logits_smem<T>(c, d); }),
                                smem_bytes<T, P>([&](Count<T>& c) { key_sums_smem<T>(c, d); }),
                                smem_bytes<T, P>([&](Count<T>& c) { queries_smem<T>(c, d, causal); }),
                                smem_bytes<T, P>([&](Count<T>& c) { grad_smem<T>(c, d, true, causal); }),
                                smem_bytes<T, P>([&](Count<T>& c) { grad_smem<T>(c, d, false, causal); })});
  return d.BH() <= 65535 && most <= shared_memory_optin();
}

// Opts `kernel` in to `bytes` of shared memory past the default 48 KB (the attribute stays with
// the kernel; set again only when a call needs more than any before).
template <auto kernel> void allow_smem(size_t bytes) {
  static size_t allowed = 48 * 1024;
  if (bytes <= allowed) return;
  LINEA_CUDA_CHECK(cudaFuncSetAttribute(reinterpret_cast<const void*>(kernel),
                                        cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
  allowed = bytes;
}

// Runs of tiles per head for the kernels that sum over a head's rows: about two blocks per SM of
// a 132-SM GPU in all, at least 4 tiles a run. Depends on the shape only (the same bits every run).
int64_t tiles_per_run(int64_t tiles, int64_t heads) {
  constexpr int64_t kTargetBlocks = 264, kMinTiles = 4;
  const int64_t runs = std::max<int64_t>(1, std::min((kTargetBlocks + heads - 1) / heads, tiles / kMinTiles));
  return (tiles + runs - 1) / runs;
}

// dst [BH, S, E + 1] = the sum over runs of part [runs, BH, S, E + 1], in order of the runs.
template <typename T> void sum_parts(const T* part, int64_t runs, const FavorDims& d, T* dst) {
  const int64_t columns = d.BH() * d.S * (d.E + 1);
  sum_runs_kernel<T, 1>
      <<<grid_for(columns), kBlockSize, 0, stream()>>>(part, ColumnRuns{runs, 0}, columns, RunTotals<T, 1>{{dst}, {1}});
  LINEA_KERNEL_LAUNCH_CHECK();
}

}  // namespace

bool favor_attention_fused(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& omega, bool causal,
                           int64_t chunk) {
  const FavorDims d = favor_dims(q, k, v, omega);
  if (causal && (chunk != kRows || d.N != d.M)) return false;
  bool ok = false;
  LINEA_DISPATCH_FLOAT(q.dtype(), "favor_attention",
                       [&] { with_products<scalar_t>([&](auto p) { ok = fits<scalar_t, decltype(p)>(d, causal); }); });
  return ok;
}

namespace {
// The forward's kernels (the pointers of the tensors named as in favor_attention_forward): a
// decoding step's running sums come in as `running` (c null: none) and its sums after the step go
// to `total` (causal only; null: nowhere).
template <typename T, typename P>
void forward_kernels(const FavorDims& d, bool causal, const Tensor& q, const Tensor& k, const Tensor& v,
                     const Tensor& omega, double scale, const Tensor& pad, double guard, RunningSums<T> running,
                     T* total, const Tensor& out, T* den, T* kvz, T* phi_q, T* phi_k) {
  const T sc = static_cast<T>(scale), inv_sqrt_s = static_cast<T>(1.0 / std::sqrt(static_cast<double>(d.S)));
  // The key padding [B, M] (Bool; undefined: none), its rows pad.stride(0) apart (a decoding
  // step's column of the decoder's mask is read in place).
  const Rows<const uint8_t> pad_p =
      pad.defined() ? Rows<const uint8_t>{cptr<uint8_t>(pad), pad.stride(0)} : Rows<const uint8_t>{nullptr, 0};
  const unsigned BH = static_cast<unsigned>(d.BH());
  // Causal: a run a tile, its sums into kvz (the chunk states), then the exclusive scan.
  const int64_t ktiles = tiles_of(d.M), per_run = causal ? 1 : tiles_per_run(ktiles, d.BH()),
                runs = (ktiles + per_run - 1) / per_run, state = d.S * (d.E + 1);
  DeviceScratch<T> tile_max(d.BH() * ktiles), part(causal ? 0 : runs * d.BH() * state),
      init(running.c ? d.BH() * state : 0);
  running.init = init.p;
  size_t bytes = smem_bytes<T, P>([&](Count<T>& c) { key_logits_smem<T>(c, d); });
  allow_smem<key_logits_kernel<T, P>>(bytes);
  key_logits_kernel<T, P><<<dim3(static_cast<unsigned>(ktiles), BH), kThreads, bytes, stream()>>>(
      rows_in<T>(k), cptr<T>(omega), pad_p, d, sc, phi_k, tile_max.p);
  LINEA_KERNEL_LAUNCH_CHECK();
  bytes = smem_bytes<T, P>([&](Count<T>& c) { key_sums_smem<T>(c, d); });
  allow_smem<key_sums_kernel<T, P>>(bytes);
  key_sums_kernel<T, P><<<dim3(static_cast<unsigned>(runs), BH), kThreads, bytes, stream()>>>(
      rows_in<T>(v), pad_p, d, ktiles, per_run, tile_max.p, inv_sqrt_s, phi_k, causal ? kvz : part.p,
      causal ? state : d.BH() * state, causal ? ktiles * state : state, running);
  LINEA_KERNEL_LAUNCH_CHECK();
  if (causal)
    scan_chunks<T>(d.BH(), ktiles, d.S, d.E + 1, d.E + 1, false, running.c ? init.p : nullptr, kvz, total);
  else
    sum_parts(part.p, runs, d, kvz);
  bytes = smem_bytes<T, P>([&](Count<T>& c) { queries_smem<T>(c, d, causal); });
  // float64 is never fused causal (fits): no such kernels are built.
  const auto queries = causal ? queries_kernel<T, P, sizeof(T) == 4> : queries_kernel<T, P, false>;
  if (causal)
    allow_smem<queries_kernel<T, P, sizeof(T) == 4>>(bytes);
  else
    allow_smem<queries_kernel<T, P, false>>(bytes);
  queries<<<dim3(static_cast<unsigned>(tiles_of(d.N)), BH), kThreads, bytes, stream()>>>(
      rows_in<T>(q), cptr<T>(omega), kvz, d, sc, inv_sqrt_s, static_cast<T>(guard), phi_k, rows_in<T>(v),
      rows_out<T>(out), den, phi_q);
  LINEA_KERNEL_LAUNCH_CHECK();
}
}  // namespace

void favor_attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& omega, double scale,
                             const Tensor& pad, double guard, bool causal, int64_t chunk, const Tensor& out,
                             const Tensor& den, const Tensor& kvz, const Tensor& phi_q, const Tensor& phi_k) {
  const FavorDims d = favor_dims(q, k, v, omega);
  check_head_rows("favor_attention", {&q, &k, &v, &out});
  LINEA_CHECK(favor_attention_fused(q, k, v, omega, causal, chunk),
              "favor_attention: no fused CUDA kernel for these sizes (see favor_attention_fused)");
  LINEA_DISPATCH_FLOAT(q.dtype(), "favor_attention", [&] {
    using T = scalar_t;
    with_products<T>([&](auto p) {
      forward_kernels<T, decltype(p)>(d, causal, q, k, v, omega, scale, pad, guard, RunningSums<T>{}, nullptr, out,
                                      ptr<T>(den), ptr<T>(kvz), ptr<T>(phi_q), ptr<T>(phi_k));
    });
  });
}

void favor_attention_step(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& omega, double scale,
                          const Tensor& pad, double guard, const Tensor& sums, const Tensor& c, const Tensor& out,
                          const Tensor& sums_out, const Tensor& c_out) {
  const FavorDims d = favor_dims(q, k, v, omega);
  check_head_rows("favor_attention_step", {&q, &k, &v, &out});
  LINEA_CHECK(favor_attention_fused(q, k, v, omega, true, kRows),
              "favor_attention_step: no fused CUDA kernel for these sizes (see favor_attention_fused)");
  LINEA_DISPATCH_FLOAT(q.dtype(), "favor_attention_step", [&] {
    using T = scalar_t;
    // The forward's other outputs, for no backward: scratch.
    DeviceScratch<T> den(d.BH() * d.N), states(d.BH() * tiles_of(d.N) * d.S * (d.E + 1)), phi_q(d.BH() * d.N * d.S),
        phi_k(d.BH() * d.M * d.S);
    const RunningSums<T> running{sums.defined() ? cptr<T>(c) : nullptr, sums.defined() ? cptr<T>(sums) : nullptr,
                                 ptr<T>(c_out), nullptr};
    with_products<T>([&](auto p) {
      forward_kernels<T, decltype(p)>(d, true, q, k, v, omega, scale, pad, guard, running, ptr<T>(sums_out), out, den.p,
                                      states.p, phi_q.p, phi_k.p);
    });
  });
}

namespace {
// The backward's kernels (the tensors named as in favor_attention_backward).
template <typename T, typename P>
void backward_kernels(const FavorDims& d, bool causal, const Tensor& q, const Tensor& k, const Tensor& v,
                      const Tensor& omega, double scale, const Tensor& out, const Tensor& den, const Tensor& kvz,
                      const Tensor& phi_q, const Tensor& phi_k, const Tensor& dout, double guard, const Tensor& dq,
                      const Tensor& dk, const Tensor& dv) {
  const T sc = static_cast<T>(scale), g = static_cast<T>(guard);
  const unsigned BH = static_cast<unsigned>(d.BH());
  const int64_t qtiles = tiles_of(d.N), state = d.S * (d.E + 1);
  if constexpr (sizeof(T) == 4)  // float64 is never fused causal (fits)
    if (causal) {                // the chunks' phi_q^T [G, G_z], reverse-scanned into R, then the keys
      DeviceScratch<T> dstates(d.BH() * qtiles * state);
      const unsigned chunks = static_cast<unsigned>(qtiles);
      size_t bytes = smem_bytes<T, P>([&](Count<T>& c) { grad_smem<T>(c, d, true, true); });
      allow_smem<causal_query_grads_kernel<T, P>>(bytes);
      causal_query_grads_kernel<T, P><<<dim3(chunks, BH), kThreads, bytes, stream()>>>(
          rows_in<T>(q), rows_in<T>(v), rows_in<T>(out), rows_in<T>(dout), cptr<T>(omega), cptr<T>(kvz), cptr<T>(den),
          cptr<T>(phi_q), cptr<T>(phi_k), d, sc, g, rows_out<T>(dq), dstates.p);
      LINEA_KERNEL_LAUNCH_CHECK();
      scan_chunks<T>(d.BH(), qtiles, d.S, d.E + 1, d.E + 1, true, nullptr, dstates.p, nullptr);
      bytes = smem_bytes<T, P>([&](Count<T>& c) { grad_smem<T>(c, d, false, true); });
      allow_smem<causal_key_grads_kernel<T, P>>(bytes);
      causal_key_grads_kernel<T, P><<<dim3(chunks, BH), kThreads, bytes, stream()>>>(
          rows_in<T>(k), rows_in<T>(v), rows_in<T>(out), rows_in<T>(dout), cptr<T>(omega), dstates.p, cptr<T>(den),
          cptr<T>(phi_q), cptr<T>(phi_k), d, sc, g, rows_out<T>(dk), rows_out<T>(dv));
      LINEA_KERNEL_LAUNCH_CHECK();
      return;
    }
  const int64_t per_run = tiles_per_run(qtiles, d.BH()), runs = (qtiles + per_run - 1) / per_run;
  DeviceScratch<T> part(runs * d.BH() * state), dkvz(d.BH() * state);
  size_t bytes = smem_bytes<T, P>([&](Count<T>& c) { grad_smem<T>(c, d, true, false); });
  allow_smem<query_grads_kernel<T, P>>(bytes);
  query_grads_kernel<T, P><<<dim3(static_cast<unsigned>(runs), BH), kThreads, bytes, stream()>>>(
      rows_in<T>(q), rows_in<T>(out), rows_in<T>(dout), cptr<T>(omega), cptr<T>(kvz), cptr<T>(den), cptr<T>(phi_q), d,
      qtiles, per_run, sc, g, rows_out<T>(dq), part.p);
  LINEA_KERNEL_LAUNCH_CHECK();
  sum_parts(part.p, runs, d, dkvz.p);
  bytes = smem_bytes<T, P>([&](Count<T>& c) { grad_smem<T>(c, d, false, false); });
  allow_smem<key_grads_kernel<T, P>>(bytes);
  key_grads_kernel<T, P><<<dim3(static_cast<unsigned>(tiles_of(d.M)), BH), kThreads, bytes, stream()>>>(
      rows_in<T>(k), rows_in<T>(v), cptr<T>(omega), dkvz.p, cptr<T>(phi_k), d, sc, rows_out<T>(dk), rows_out<T>(dv));
  LINEA_KERNEL_LAUNCH_CHECK();
}
}  // namespace

void favor_attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& omega, double scale,
                              bool causal, int64_t chunk, const Tensor& out, const Tensor& den, const Tensor& kvz,
                              const Tensor& phi_q, const Tensor& phi_k, const Tensor& dout, double guard,
                              const Tensor& dq, const Tensor& dk, const Tensor& dv) {
  const FavorDims d = favor_dims(q, k, v, omega);
  check_head_rows("favor_attention_backward", {&q, &k, &v, &out, &dout, &dq, &dk, &dv});
  LINEA_CHECK(favor_attention_fused(q, k, v, omega, causal, chunk),
              "favor_attention_backward: no fused CUDA kernel for these sizes (see favor_attention_fused)");
  LINEA_DISPATCH_FLOAT(q.dtype(), "favor_attention_backward", [&] {
    using T = scalar_t;
    with_products<T>([&](auto p) {
      backward_kernels<T, decltype(p)>(d, causal, q, k, v, omega, scale, out, den, kvz, phi_q, phi_k, dout, guard, dq,
                                       dk, dv);
    });
  });
}

}  // namespace linea::cuda
