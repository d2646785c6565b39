// CUDA kernels of the fused attention ops (core/kernels.h; the CPU twins in core/cpu/attention.cpp).
//
// Softmax attention, tiled with an online softmax (the FlashAttention-2 order of work), memory
// O(B H N (E + 1)) whatever M is: no [N, M] score matrix exists anywhere.
//   forward   one block per (BR query rows, b, h); it walks the key tiles the rows may see,
//             keeping per row the running max m, the running sum l of exp(s - m) and the
//             unnormalized output in registers; out = o / l, lse = m + log l.
//   backward  one block per (BR queries, b, h) accumulates dq over the key tiles, computing its
//             rows' delta_n = dout_n . out_n first (Deltas); then one block per (BC keys, b, h)
//             dk and dv over the query tiles, reading those deltas. Each sum is taken by one
//             block in a fixed order: no atomics, so the result is the same bits every run
//             (FlashAttention's single backward kernel adds dq with atomics; ours recomputes the
//             scores once more for dq instead).
//   key ranges where the query tiles are too few to fill the GPU over many keys (LARA's C
//             landmarks over L keys, a decoding step): the forward and dq blocks each walk one
//             range of the keys (grid z), into parts merged (out and lse) or summed (dq) in order
//             afterwards, as flash-decoding splits them (key_ranges).
// Tiles live in dynamic shared memory (at most 48 KB, but the bf16 tensor-core forward's at head
// dims of 128, which opts in to 70 KB); each of the 128 threads owns a (BR/16) x (BC/8) patch of a
// score tile and a (rows) x (DM/8) patch of an output tile, its accumulators in registers. DM,
// the head dims rounded up to a power of two, is a template parameter; BR = BC is chosen so that
// the backward's tiles fit.
// A hidden key gets score -inf; a row that sees no key gets out = 0 and lse = -inf, and adds
// nothing to dk, dv (the CPU kernel's convention); a row of NaN scores gets NaN.
// On sm_80 and newer, float32 tensors take the same passes on the tensor cores (the mma kernels
// below, FlashAttention-2's register layout): in bf16 under the BF16 matmul precision (head dims
// up to 128), in TF32 under TF32, and as three TF32 products per product (3xTF32, about float32's
// accuracy, as PyTorch's SDPA in float32) under the default precision (both up to 128 too). The
// SIMT kernels take float64, older GPUs and the head dims past those. The tensor-core kernels'
// TOEPLITZ instantiations are nprf_rpe's dense path (ToeplitzTiles): the same tiles and walks with
// p = (phi_q . phi_k) c_{m-n} in place of the softmax.
#include <algorithm>
#include <cmath>
#include <type_traits>

#include "core/kernels.h"
#include "core/precision.h"
#include "cuda/common.cuh"
#include "cuda/mma.cuh"

namespace linea::cuda {

using namespace detail;
using linea::detail::ExampleDropout;

namespace {

constexpr int kThreads = 128, kRowThreads = 16, kColThreads = 8;

struct SdpaShape {
  int64_t N, M, D, E;  // query rows, keys, q/k head dim, v head dim
  int64_t offset;      // query n sits at position n + offset (causal masking)
  bool causal;
  int64_t pad_ld;  // the key padding's rows lie pad_ld apart (a decoding cache's padding: its buffer's width)
};

// The keys [begin, end) that block z of the forward or dq kernel walks: its range of `split` keys,
// cut at `horizon` (past it every key is hidden from the block's rows). With more than one range
// (few query tiles, many keys: as flash-decoding splits them) each writes its own partial result
// at head range_head() = bh + z BH, and the ranges are merged afterwards in order.
struct KeyRange {
  int64_t begin, end;
};
// RANGES: the kernel's instantiation for more than one range (the one-range kernels stay as they
// were: ptxas gave some of them 30 to 90 more registers, or spills, for a range's bounds).
template <bool RANGES> __device__ __forceinline__ KeyRange key_range(int64_t split, int64_t horizon) {
  if (!RANGES) return {0, horizon};
  const int64_t begin = static_cast<int64_t>(blockIdx.z) * split;
  return {begin, min(horizon, begin + split)};
}
template <bool RANGES> __device__ __forceinline__ int64_t range_head() {
  return RANGES ? blockIdx.y + static_cast<int64_t>(blockIdx.z) * gridDim.y : blockIdx.y;
}

// Each query row's delta_n = dout_n . out_n - dlse_n, which both backward kernels subtract from
// dP. The dq kernel runs first and computes its rows' (computed(): a warp per row, lanes along it,
// as a kernel of its own did before: one launch less per backward); its blocks of key range 0
// write them for the dk/dv kernel after it. The Toeplitz backward gives its own (out.p null).
template <typename T> struct Deltas {
  T* rows = nullptr;            // [B H N]: written (computed) or read (given)
  HeadRows<const T> dout, out;  // out.p null: `rows` given
  const T* dlse = nullptr;      // [B H N], null: none
  int64_t E = 0;
  static Deltas given(T* rows) {
    Deltas d;
    d.rows = rows;
    return d;
  }
  __device__ bool computed() const { return out.p != nullptr; }
  // Rows [n0, n0 + count) of head bh into shared memory sh[0, count) (0 past N), a warp a row;
  // and into `rows` where the block writes them (key range 0). Ends in a __syncthreads.
  template <bool RANGES>
  __device__ void block_rows(int64_t bh, int64_t heads, int64_t N, int64_t n0, int count, T* sh) const {
    const int lane = threadIdx.x % 32;
    const T* db = dout.at(bh, heads);
    const T* ob = out.at(bh, heads);
    const bool write = !RANGES || blockIdx.z == 0;
#pragma unroll 1
    for (int r = threadIdx.x / 32; r < count; r += blockDim.x / 32) {
      const int64_t n = n0 + r;
      T acc = T(0);
      if (n < N)
        for (int64_t e = lane; e < E; e += 32) acc += db[n * dout.row + e] * ob[n * out.row + e];
      acc = warp_sum(acc);
      if (n < N && dlse) acc -= dlse[bh * N + n];
      if (lane == 0) sh[r] = acc;
      if (lane == 0 && write && n < N) rows[bh * N + n] = acc;
    }
    __syncthreads();
  }
};

// The first query row of `n0..` that may see key m, and whether key m is hidden from row n.
__device__ __forceinline__ bool hidden(const SdpaShape& s, const uint8_t* pad, int64_t n, int64_t m) {
  return (s.causal && m > n + s.offset) || (pad && pad[m]);
}

// The row stride of the q, k, v and dout tiles: one past DM, so that the 8 (and 4) rows a warp
// reads at one d in dot_patch sit in different banks (a stride of DM put them all in one bank: an
// 8-way conflict on every load of the key tile).
template <int DM> constexpr int pitch() { return DM + 1; }

// The SIMT kernels' tile loads issue kLoadBatch global loads per thread before their first store
// to shared memory. A loop that stores each element before loading the next may wait one load
// latency per element (nothing tells the compiler that the tile and the source do not overlap):
// per tile a chain of 16 to 64 round trips to memory per thread, with few warps to hide them.
// On an H200 (2026-11-28) the bf16 forward, then loading its tiles so, took 4.15 ms at B = 4,
// H = 8, L = 4096, D = 64, about 25,000 cycles per key tile and block: what such a chain
// predicts, not what 64 mma.sync do. (The tensor-core kernels now copy staged tiles by cp.async.)
constexpr int kLoadBatch = 16;

// Loads rows [r0, r0 + ROWS) of a [count, dim] matrix (rows ld apart) into a [ROWS, DM] tile (row
// stride pitch<DM>()), zeros past the end. Thread x takes column x % DM of rows x / DM, x / DM + kStep,
// ... (kStep = THREADS / DM rows per pass of the block: coalesced, as consecutive threads take
// consecutive columns).
template <int THREADS, int DM, int ROWS, typename T, typename Store>
__device__ __forceinline__ void load_rows(const T* src, int64_t ld, int64_t r0, int64_t count, int64_t dim,
                                          Store&& store) {
  static_assert(THREADS % DM == 0 && ROWS % (THREADS / DM) == 0, "whole rows per pass");
  constexpr int kStep = THREADS / DM, kPasses = ROWS / kStep;
  const int d = static_cast<int>(threadIdx.x) % DM, r1 = static_cast<int>(threadIdx.x) / DM;
  const bool in = d < dim;
#pragma unroll 1  // one batch in flight at a time: unrolled, the compiler hoists every load (spills)
  for (int p0 = 0; p0 < kPasses; p0 += kLoadBatch) {
    T x[kLoadBatch];
#pragma unroll
    for (int j = 0; j < kLoadBatch; ++j) {
      const int r = r1 + (p0 + j) * kStep;
      x[j] = p0 + j < kPasses && in && r0 + r < count ? src[(r0 + r) * ld + d] : T(0);
    }
#pragma unroll
    for (int j = 0; j < kLoadBatch; ++j)
      if (p0 + j < kPasses) store(r1 + (p0 + j) * kStep, d, x[j]);
  }
}

template <typename T, int DM, int ROWS>
__device__ __forceinline__ void load_tile(T* tile, Rows<const T> x, int64_t r0, int64_t count, int64_t dim) {
  load_rows<kThreads, DM, ROWS>(x.p, x.row, r0, count, dim,
                                [&](int r, int d, T val) { tile[r * pitch<DM>() + d] = val; });
}

// acc[i][j] = sum_d a[row_i][d] b[col_j][d] for the thread's patch of a [R, DM] x [C, DM]^T
// product (row stride pitch<DM>()), rows ty + 16 i, columns tx + 8 j.
template <typename T, int DM, int TR, int TC>
__device__ __forceinline__ void dot_patch(const T* a, const T* b, T (&acc)[TR][TC], int ty, int tx) {
#pragma unroll
  for (int i = 0; i < TR; ++i)
#pragma unroll
    for (int j = 0; j < TC; ++j) acc[i][j] = T(0);
  for (int d = 0; d < DM; ++d) {
    T av[TR], bv[TC];
#pragma unroll
    for (int i = 0; i < TR; ++i) av[i] = a[(ty + kRowThreads * i) * pitch<DM>() + d];
#pragma unroll
    for (int j = 0; j < TC; ++j) bv[j] = b[(tx + kColThreads * j) * pitch<DM>() + d];
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
      const T xv = x[k * pitch<DM>() + tx + kColThreads * c];
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
      const T xv = x[r * pitch<DM>() + tx + kColThreads * c];
#pragma unroll
      for (int i = 0; i < TK; ++i) acc[i][c] += pv[i] * xv;
    }
  }
}

template <typename T, int DM, int B, bool RANGES>
__global__ void sdpa_forward_kernel(HeadRows<const T> q, HeadRows<const T> k, HeadRows<const T> v, const uint8_t* pad,
                                    const T* bias, T scale, SdpaShape s, int64_t heads, ExampleDropout<T> drop,
                                    const uint64_t* draw_base, HeadRows<T> out, T* lse, int64_t split) {
  constexpr int TR = B / kRowThreads, TC = B / kColThreads, TD = DM / kColThreads;
  static_assert(4 * B <= kThreads && (4 * B) % 32 == 0, "the softmax pass takes whole warps of quads");
  constexpr int P = pitch<DM>();
  T* qs = shared_mem<T>();      // [B, P]
  T* ks = qs + B * P;           // [B, P]
  T* vs = ks + B * P;           // [B, P]
  T* ps = vs + B * P;           // [B, B + 1]: the tile's probabilities
  T* row_m = ps + B * (B + 1);  // [B] running max
  T* row_l = row_m + B;         // [B] running sum
  T* row_a = row_l + B;         // [B] this tile's rescaling of the old sums
  const int tid = threadIdx.x, ty = tid / kColThreads, tx = tid % kColThreads;
  const int64_t bh = blockIdx.y, n0 = static_cast<int64_t>(blockIdx.x) * B;
  const uint8_t* pad_b = pad ? pad + (bh / heads) * s.pad_ld : nullptr;
  const T* bias_b = bias ? bias + bh * s.M : nullptr;
  if (drop.on && draw_base) drop.draw += *draw_base;
  const Rows<const T> kb = k.rows(bh, heads), vb = v.rows(bh, heads);
  load_tile<T, DM, B>(qs, q.rows(bh, heads), n0, s.N, s.D);
  for (int r = tid; r < B; r += kThreads) row_m[r] = neg_inf<T>(), row_l[r] = T(0);
  T o[TR][TD];
#pragma unroll
  for (int i = 0; i < TR; ++i)
#pragma unroll
    for (int c = 0; c < TD; ++c) o[i][c] = T(0);
  // Keys past the last row's causal horizon are hidden from the whole tile.
  const KeyRange keys = key_range<RANGES>(split, s.causal ? min(s.M, min(n0 + B, s.N) + s.offset) : s.M);
  for (int64_t m0 = keys.begin; m0 < keys.end; m0 += B) {
    __syncthreads();  // the previous tile's k, v, p are used up
    load_tile<T, DM, B>(ks, kb, m0, s.M, s.D);
    load_tile<T, DM, B>(vs, vb, m0, s.M, s.E);
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
    // Four lanes of a quad per row (columns q, q + 4, ...): the new max, the rescaling and the
    // tile's exp(s - m), the row's max and sum by two shuffles each. 4 B is a whole number of
    // warps, so the lanes that skip are whole warps.
    if (tid < 4 * B) {
      const int r = tid / 4, q = tid % 4;
      T* row = ps + r * (B + 1);
      const T m_old = row_m[r];  // read by the quad's four lanes before its first lane writes it
      T mx = neg_inf<T>();
      for (int c = q; c < B; c += 4) mx = max_nan(mx, row[c]);
      mx = max_nan(m_old, quad_max(mx));
      T sum = T(0);
      if (mx == neg_inf<T>()) {  // nothing visible yet
        for (int c = q; c < B; c += 4) row[c] = T(0);
      } else {
        for (int c = q; c < B; c += 4) {
          row[c] = d_exp(row[c] - mx);
          sum += row[c];
        }
        if (drop.on && n0 + r < s.N) {  // the sum (and lse) stay the undropped ones
          const int64_t j0 = ((bh % heads) * s.N + n0 + r) * s.M + m0;
          for (int c = q; c < B && m0 + c < s.M; c += 4) row[c] *= drop.factor(bh / heads, j0 + c);
        }
      }
      sum = quad_sum(sum);
      __syncwarp();  // a shuffle orders no shared-memory accesses (compute-sanitizer's racecheck)
      if (q == 0) {
        row_a[r] = mx == neg_inf<T>() ? T(1) : d_exp(m_old - mx);
        row_l[r] = row_l[r] * row_a[r] + sum;
        row_m[r] = mx;
      }
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
  T* out_b = out.at(range_head<RANGES>(), heads);
#pragma unroll
  for (int i = 0; i < TR; ++i) {
    const int r = ty + kRowThreads * i;
    const int64_t n = n0 + r;
    if (n >= s.N) continue;
    const T l = row_l[r], inv = l > T(0) ? T(1) / l : T(0);
#pragma unroll
    for (int c = 0; c < TD; ++c) {
      const int e = tx + kColThreads * c;
      if (e < s.E) out_b[n * out.row + e] = o[i][c] * inv;
    }
    if (tx == 0) lse[range_head<RANGES>() * s.N + n] = l == T(0) ? neg_inf<T>() : row_m[r] + d_log(l);  // NaN stays NaN
  }
}

// ---- the tensor-core kernels (float32 tensors, sm_80 and newer) ----------------------------------
// The FlashAttention-2 layout on mma.sync (cuda/mma.cuh): 4 warps, each owning 16 of the block's
// 64 query rows for the whole pass, walk key tiles of 64 (32 in 3xTF32 at DM = 64: registers).
// Per tile a warp computes its scores S [16, 64] = Q K^T as 8 accumulator tiles of 8 keys,
// applies the mask, scale and bias, updates the online softmax in registers (a row's values sit
// in the 4 lanes of a quad: max and sum by two shuffles each) and adds P V into its output
// accumulators, P's accumulators reused as the A operand. Scores, sums and the output stay
// float32. Shared memory holds the walked tiles in two stages (the next tile's copies in flight
// during this one's products, by cp.async); a tile that no mask touches skips the per-element
// checks.
//
// The kernels are written once over an operand format F: what their tiles hold and how a fragment
// is read and multiplied.
//   Bf16Format     --precision bf16 (head dims up to 128): q, k, v, dout rounded to bf16 once per
//                  call into rows of DM (StagedCopies); m16n8k16, two elements per register. P and dS are rounded to
//                  bf16 before their products.
//   Tf32Format<3>  float32, the default precision (head dims up to 128): the tensors' own rows;
//                  m16n8k8 on TF32 with each operand split as x = big + small (big: x rounded to
//                  TF32, small: x - big rounded) and multiplied as big small + small big + big big:
//                  a product's relative error about 2^-21 instead of float32's 2^-24. PyTorch's
//                  memory-efficient SDPA does the same in float32 (CUTLASS's 3xTF32).
//   Tf32Format<1>  --precision tf32 (head dims up to 128): big big only.
// Fragments are read from shared memory by ldmatrix (four registers of the warp in one
// instruction: A fragments, and B fragments of two 8-column tiles at once). Where an accumulator
// tile is the A operand (P V, dS K, P^T dout, dS^T q), B is read down the columns of a row-major
// tile. bf16: two neighbouring 8-column accumulator tiles are one A fragment (k-step 16), b[0] =
// rows 2t, 2t+1 and b[1] = rows 2t+8, 2t+9 of the k-step, by ldmatrix.trans (as FlashAttention-2
// reads V). TF32 (ldmatrix transposes 16-bit elements only): one accumulator tile is an A fragment
// whose columns are permuted (A column t holds accumulator column 2t, column t+4 holds 2t+1), b[0]
// = row 2t and b[1] = row 2t+1 by plain loads: the same permutation of the sum's terms on both
// sides, so no shuffle is needed.
constexpr int kMmaRows = 64, kMmaKeys = 64, kMmaThreads = 128;
constexpr float kLog2e = 1.4426950408889634f, kLn2 = 0.6931471805599453f;

struct Bf16Format {
  using Elem = uint16_t;
  static constexpr int K = 16;       // the mma's k-step
  static constexpr int PAD = 8;      // row pad of the tiles (elements): ldmatrix's 8 rows hit 8 bank groups
  static constexpr int kPasses = 1;  // mma per product
  __device__ static void mma(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
    mma_bf16_16x8x16(d, a, b);
  }
  // k-step kk of accumulator tiles x [16, 8] each as an A fragment.
  template <int NT> __device__ static void accumulator_a(uint32_t (&a)[4], const float (&x)[NT][4], int kk) {
    a[0] = pack_bf16x2(x[2 * kk][0], x[2 * kk][1]);
    a[1] = pack_bf16x2(x[2 * kk][2], x[2 * kk][3]);
    a[2] = pack_bf16x2(x[2 * kk + 1][0], x[2 * kk + 1][1]);
    a[3] = pack_bf16x2(x[2 * kk + 1][2], x[2 * kk + 1][3]);
  }
  // The B fragments of one k-step for the 8-column tiles at `cols` and cols + 8, read down the
  // columns of a tile (rows ld apart; cols at the k-step's first row): b[0..1] and b[2..3].
  // ldmatrix.trans: matrix j holds rows 8 (j % 2).. of the k-step, columns 8 (j / 2)..
  __device__ static void column_b(uint32_t (&b)[4], const Elem* cols, int ld, int lane) {
    ldmatrix_x4<true>(b, cols + (lane % 8 + 8 * (lane / 8 % 2)) * ld + 8 * (lane / 16));
  }
};

template <int PASSES> struct Tf32Format {
  static_assert(PASSES == 1 || PASSES == 3);
  using Elem = float;
  static constexpr int K = 8, PAD = 4;
  static constexpr int kPasses = PASSES;
  __device__ static void mma(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
    uint32_t ab[4], bb[2];  // the big parts
#pragma unroll
    for (int i = 0; i < 4; ++i) ab[i] = round_tf32(bits_to_float(a[i]));
#pragma unroll
    for (int i = 0; i < 2; ++i) bb[i] = round_tf32(bits_to_float(b[i]));
    if constexpr (PASSES == 3) {
      uint32_t as[4], bs[2];  // the small parts
#pragma unroll
      for (int i = 0; i < 4; ++i) as[i] = round_tf32(bits_to_float(a[i]) - bits_to_float(ab[i]));
#pragma unroll
      for (int i = 0; i < 2; ++i) bs[i] = round_tf32(bits_to_float(b[i]) - bits_to_float(bb[i]));
      mma_tf32x3_16x8x8(d, ab, as, bb, bs);
    } else {
      mma_tf32_16x8x8(d, ab, bb);
    }
  }
  template <int NT> __device__ static void accumulator_a(uint32_t (&a)[4], const float (&x)[NT][4], int kk) {
    a[0] = float_bits(x[kk][0]);  // row g, column 2t -> A column t
    a[1] = float_bits(x[kk][2]);  // row g + 8
    a[2] = float_bits(x[kk][1]);  // row g, column 2t + 1 -> A column t + 4
    a[3] = float_bits(x[kk][3]);
  }
  __device__ static void column_b(uint32_t (&b)[4], const Elem* cols, int ld, int lane) {
    const Elem* c = cols + 2 * (lane % 4) * ld + lane / 4;  // row 2t, column g
    b[0] = float_bits(c[0]), b[1] = float_bits(c[ld]);
    b[2] = float_bits(c[8]), b[3] = float_bits(c[ld + 8]);
  }
};

// ---- the operands -------------------------------------------------------------------------------
// What the kernels copy their tiles from: each head's rows (the float32 tensors where they lie, or
// their dense bf16 copies with dim = DM).
template <typename Elem> struct MmaOperands {
  HeadRows<const Elem> q, k, v, dout;
  int64_t qk_dim = 0, v_dim = 0;  // row lengths: q and k; v and dout
  bool vec = true;  // every row starts on 16 bytes: tiles copied in 16-byte pieces (else 4-byte)
};

// bf16 operands, staged once per call. The bf16 kernels read q, k, v (and dout) as bf16 copies
// made by one pass before them: rows of DM values (zeros past the head dims), so that a tile is
// whole 16-byte pieces that cp.async copies into shared memory while the warps compute on the tile
// before. Rounding at every tile load made each key tile a chain of global loads, conversions and
// stores (about 25,000 cycles per key tile and block on an H200 at L = 4096, D = 64).
struct StageJob {
  HeadRows<const float> src;  // [B, H] heads of [rows, dim]
  int64_t rows, dim;
  uint16_t* dst;  // [B, H, rows, DM]
};
struct StageJobs {
  StageJob job[4];  // blockIdx.y picks one
  int64_t heads;
};

// blockIdx.z: the (batch, head) pair.
template <int DM> __global__ void stage_rows_kernel(StageJobs jobs) {
  const StageJob j = jobs.job[blockIdx.y];
  constexpr int kPairs = DM / 2;
  const int64_t bh = blockIdx.z;
  const float* src = j.src.at(bh, jobs.heads);
  uint32_t* dst = reinterpret_cast<uint32_t*>(j.dst) + bh * j.rows * kPairs;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < j.rows * kPairs;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t d = 2 * (i % kPairs);
    const float* x = src + i / kPairs * j.src.row;
    dst[i] = pack_bf16x2(d < j.dim ? x[d] : 0.f, d + 1 < j.dim ? x[d + 1] : 0.f);
  }
}

// Copies rows [r0, r0 + ROWS) x columns [c0, c0 + COLS) of a row-major matrix (rows x cols, rows
// src_ld apart) into a tile of row stride ld by cp.async; zeros outside the matrix. With vec, 16
// bytes a copy (cols, c0 and COLS whole pieces: a copy is wholly inside or outside); without
// (float32 rows off 16-byte boundaries), 4.
template <int ROWS, int COLS, typename Elem>
__device__ __forceinline__ void copy_tile_async(Elem* tile, int ld, const Elem* src, int64_t src_ld, int64_t r0,
                                                int64_t rows, int64_t c0, int64_t cols, bool vec) {
  const auto copy = [&](auto piece) {
    constexpr int kPer = decltype(piece)::value / static_cast<int>(sizeof(Elem));
    constexpr int kPieces = COLS / kPer, kTotal = ROWS * kPieces;
#pragma unroll
    for (int j = 0; j < (kTotal + kMmaThreads - 1) / kMmaThreads; ++j) {
      const int i = static_cast<int>(threadIdx.x) + j * kMmaThreads;
      if (kTotal % kMmaThreads != 0 && i >= kTotal) break;
      const int r = i / kPieces, c = i % kPieces * kPer;
      const bool in = r0 + r < rows && c0 + c < cols;
      cp_async<decltype(piece)::value>(tile + r * ld + c, in ? src + (r0 + r) * src_ld + c0 + c : src, in);
    }
  };
  if (sizeof(Elem) == 2 || vec)
    copy(std::integral_constant<int, 16>{});
  else if constexpr (sizeof(Elem) == 4)
    copy(std::integral_constant<int, 4>{});
}
// Rows [r0, r0 + ROWS) of a [count, dim] operand (rows src_ld apart) into a tile of DM columns,
// row stride ld.
template <int DM, int ROWS, typename Elem>
__device__ __forceinline__ void copy_rows_async(Elem* tile, int ld, const Elem* src, int64_t src_ld, int64_t dim,
                                                int64_t r0, int64_t count, bool vec) {
  copy_tile_async<ROWS, DM>(tile, ld, src, src_ld, r0, count, 0, dim, vec);
}

// The fragments of k-step kk from 16 rows (rows16) of a tile with row stride ld, by one ldmatrix:
// matrix j holds rows 8 (j % 2).. and the k-step's half j / 2 (K / 2 elements, 16 bytes). As an
// A operand: a[0] = rows g, a[1] = rows g + 8, each half in turn (the PTX layouts above). As B
// operands of two 8-row tiles (B[k][n] = rows16[n][k]): rows 8 (j / 2).., half j % 2, so that
// b[0..1] serve rows 0-7 and b[2..3] rows 8-15.
template <typename F, bool AS_B = false>
__device__ __forceinline__ void row_fragments(uint32_t (&a)[4], const typename F::Elem* rows16, int ld, int kk,
                                              int lane) {
  const int j = lane / 8, half = AS_B ? j % 2 : j / 2, row = lane % 8 + 8 * (AS_B ? j / 2 : j % 2);
  ldmatrix_x4(a, rows16 + row * ld + kk * F::K + half * (F::K / 2));
}

// The warp's 16 rows that stay for a whole pass (queries in the forward and in dq, keys and values
// in dk/dv) as A fragments: in registers, or where those would not fit beside the accumulators
// in 255 registers read from their shared-memory tile at every k-step (one ldmatrix): TF32 at
// DM = 128 (64 registers a row block), and 3xTF32 at DM = 64, whose split of each k-step's
// operands left the dk/dv kernel spilling at 255 registers (kept there: 166, no spill; the
// forward 220 -> 162 and dq 246 -> 126, ptxas sm_90).
template <typename F, int DM> constexpr bool kept_in_smem() {
  return F::K == 8 && (DM == 128 || (F::kPasses == 3 && DM == 64));
}
template <typename F, int DM, bool SMEM = kept_in_smem<F, DM>()> struct KeptRows {
  uint32_t a[DM / F::K][4];
  __device__ void keep(const typename F::Elem* rows16, int ld, int g, int t) {
#pragma unroll
    for (int kk = 0; kk < DM / F::K; ++kk) row_fragments<F>(a[kk], rows16, ld, kk, 4 * g + t);
  }
  __device__ void step(uint32_t (&out)[4], int kk) const {
#pragma unroll
    for (int i = 0; i < 4; ++i) out[i] = a[kk][i];
  }
};
template <typename F, int DM> struct KeptRows<F, DM, true> {
  const typename F::Elem* rows16;
  int ld, g, t;
  __device__ void keep(const typename F::Elem* rows, int ld_, int g_, int t_) {
    rows16 = rows, ld = ld_, g = g_, t = t_;
  }
  __device__ void step(uint32_t (&out)[4], int kk) const { row_fragments<F>(out, rows16, ld, kk, 4 * g + t); }
};
// Elements of shared memory before the walked tiles' stages: the kept rows' tiles where they stay
// there (else the stages reuse their space).
template <typename F, int DM> constexpr int kept_space(int rows_tiles) {
  return kept_in_smem<F, DM>() ? rows_tiles * kMmaRows * (DM + F::PAD) : 0;
}

// d += A B for the B fragments of two neighbouring tiles read together, b[0..1] and b[2..3].
template <typename F>
__device__ __forceinline__ void mma_pair(float (&d0)[4], float (&d1)[4], const uint32_t (&a)[4],
                                         const uint32_t (&b)[4]) {
  const uint32_t b0[2] = {b[0], b[1]}, b1[2] = {b[2], b[3]};
  F::mma(d0, a, b0);
  F::mma(d1, a, b1);
}

// acc[nt] = A B^T for NT tiles of 8 rows of `other` (row-major, stride ld): B[k][n] = other[n][k].
// k-steps outermost: what a format derives from a k-step of A (TF32's split) is live for one step.
template <typename F, int DM, int NT>
__device__ __forceinline__ void mma_rows(float (&acc)[NT][4], const KeptRows<F, DM>& a, const typename F::Elem* other,
                                         int ld, int g, int t) {
  static_assert(NT % 2 == 0, "B fragments are read for two tiles at a time");
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0.f;
#pragma unroll
  for (int kk = 0; kk < DM / F::K; ++kk) {
    uint32_t ak[4];
    a.step(ak, kk);
#pragma unroll
    for (int nt = 0; nt < NT; nt += 2) {
      uint32_t b[4];
      row_fragments<F, /*AS_B=*/true>(b, other + nt * 8 * ld, ld, kk, 4 * g + t);
      mma_pair<F>(acc[nt], acc[nt + 1], ak, b);
    }
  }
}

// acc[e] += X Y for X the warp's [16, 8 NT] accumulators (as A operands) and Y [8 NT, 8 ET] the
// rows of a row-major tile (stride ld) read down its columns.
template <typename F, int NT, int ET>
__device__ __forceinline__ void mma_accumulated(float (&acc)[ET][4], const float (&x)[NT][4], const typename F::Elem* y,
                                                int ld, int g, int t) {
  static_assert(ET % 2 == 0, "B fragments are read for two tiles at a time");
#pragma unroll
  for (int kk = 0; kk < NT * 8 / F::K; ++kk) {
    uint32_t a[4];
    F::template accumulator_a<NT>(a, x, kk);
#pragma unroll
    for (int e = 0; e < ET; e += 2) {
      uint32_t b[4];
      F::column_b(b, y + kk * F::K * ld + e * 8, ld, 4 * g + t);
      mma_pair<F>(acc[e], acc[e + 1], a, b);
    }
  }
}

// What every lane of the tensor-core kernels starts from (a block of kMmaThreads = 4 warps per
// (tile, bh)): its warp, its group g = lane / 4 and place t = lane % 4 in the PTX fragment
// layouts, the (b, h) and the example's key padding and key bias rows (null: none). Folds a
// captured graph's draw base into the dropout's draw.
struct MmaLane {
  int warp, g, t;
  int64_t bh;
  const uint8_t* pad_b;
  const float* bias_b;
  __device__ MmaLane(const uint8_t* pad, const float* bias, const SdpaShape& s, int64_t heads,
                     ExampleDropout<float>& drop, const uint64_t* draw_base)
      : warp(threadIdx.x / 32),
        g(threadIdx.x % 32 / 4),
        t(threadIdx.x % 4),
        bh(blockIdx.y),
        pad_b(pad ? pad + (bh / heads) * s.pad_ld : nullptr),
        bias_b(bias ? bias + bh * s.M : nullptr) {
    if (drop.on && draw_base) drop.draw += *draw_base;
  }
};

// Whether some pair of query rows n0.. and keys [m0, m0 + keys) may be hidden or out of range; a
// tile without any skips the per-element checks.
__device__ __forceinline__ bool tile_masked(const SdpaShape& s, const uint8_t* pad_b, int64_t n0, int64_t m0,
                                            int keys) {
  return pad_b || m0 + keys > s.M || (s.causal && m0 + keys - 1 > n0 + s.offset);
}

// The forward's key tiles are double-buffered: the next tile's copies are in flight while the
// warps compute on this one. Elements per stage: a key tile and a value tile, [NK, DM + PAD] each.
// NK = 32 where the query tile stays in shared memory (kept_in_smem): at DM = 128 for space, and
// in 3xTF32 at 64 for registers too (64 keys: 218 registers, 2 blocks an SM instead of 3).
template <typename F, int DM> constexpr int forward_keys() {
  return (F::kPasses == 3 && DM == 64) || kept_in_smem<F, DM>() ? 32 : kMmaKeys;
}
template <typename F, int DM> constexpr int mma_forward_stage() { return 2 * forward_keys<F, DM>() * (DM + F::PAD); }

// nprf_rpe's dense path in the same tiles (the forward kernel's TOEPLITZ instantiation; the
// CPU twin in core/cpu/toeplitz_attention.cpp): y_n = sum_m (q_n . k_m) c_{m-n} v_m with q, k
// the positive features phi_q, phi_k and v [M, E] whose last column w enters as a per-key weight
// of a row sum: the first E - 1 columns by the tensor cores (v_dim = E - 1), y's last column
// sum_m p_nm w_m beside them, so that nprf_rpe's column of ones (the denominator) does not double
// DM. No mask, scale or normalization: causality and padding are in c and phi_k.
struct ToeplitzTiles {
  const float* c = nullptr;  // [rows, N + M - 1], c_t at t + N - 1; rows H (c_rows == heads) or B H
  int64_t c_rows = 0;
  HeadRows<const float> w;  // v's last column: w_m at w.at(bh)[m * w.row]
  HeadRows<float> den;      // the forward's: y's last column, likewise
  HeadRows<float> dw;       // the backward's: dv's last column
  __device__ const float* c_row(int64_t bh, const SdpaShape& s) const { return c + bh % c_rows * (s.N + s.M - 1); }
  // c_{m-n} for query n and key m; 0 past the ends (the tiles' zero rows).
  __device__ float at(const float* row, const SdpaShape& s, int64_t n, int64_t m) const {
    return n < s.N && m < s.M ? row[m - n + s.N - 1] : 0.f;
  }
};

// The tiles [begin, end), `step` rows apart, through two stages of shared memory: issue(x0, st)
// starts tile x0's copies into stage st (one commit group), body(x0, st) computes on it while the
// next tile's copies are in flight. A barrier before the body (its tile has landed) and one after
// (its stage is read: the copies of the tile after next may overwrite it).
template <typename Issue, typename Body>
__device__ __forceinline__ void walk_staged(int64_t begin, int64_t end, int64_t step, Issue&& issue, Body&& body) {
  if (begin < end) issue(begin, 0);
  for (int64_t x0 = begin, it = 0; x0 < end; x0 += step, ++it) {
    const int stage = static_cast<int>(it % 2);
    if (x0 + step < end) {
      issue(x0 + step, stage ^ 1);
      cp_async_wait<1>();  // this tile's group is done, the next one's may still be in flight
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    body(x0, stage);
    __syncthreads();
  }
}

template <typename F, int DM, bool RANGES, bool TOEPLITZ = false>
__global__ void __launch_bounds__(kMmaThreads)
    sdpa_forward_mma_kernel(MmaOperands<typename F::Elem> in, const uint8_t* pad, const float* bias, float scale,
                            SdpaShape s, int64_t heads, ExampleDropout<float> drop, const uint64_t* draw_base,
                            HeadRows<float> out, float* lse, int64_t split, ToeplitzTiles tz) {
  using Elem = typename F::Elem;
  constexpr int NK = forward_keys<F, DM>(), NT = NK / 8, ET = DM / 8;
  constexpr int KS = DM + F::PAD;  // the tiles' row stride
  // The query tile, then 2 x [key tile, value tile] (the first stage over the query tile unless
  // it stays: kept_in_smem).
  Elem* smem = shared_mem<Elem>();
  Elem* stages = smem + kept_space<F, DM>(1);
  const MmaLane lane(pad, bias, s, heads, drop, draw_base);
  const int warp = lane.warp, g = lane.g, t = lane.t;  // named apart: lambdas capture them (C++17)
  const int64_t bh = lane.bh;
  const uint8_t* pad_b = lane.pad_b;
  const float* bias_b = lane.bias_b;
  const int64_t n0 = static_cast<int64_t>(blockIdx.x) * kMmaRows;
  const int64_t rows[2] = {n0 + warp * 16 + g, n0 + warp * 16 + g + 8};  // this lane's two rows
  const Elem* kb = in.k.at(bh, heads);
  const Elem* vb = in.v.at(bh, heads);
  // Key tile m0 (and its values) into stage `st`, one commit group.
  const auto issue = [&](int64_t m0, int st) {
    Elem* ks = stages + st * mma_forward_stage<F, DM>();
    copy_rows_async<DM, NK>(ks, KS, kb, in.k.row, in.qk_dim, m0, s.M, in.vec);
    copy_rows_async<DM, NK>(ks + NK * KS, KS, vb, in.v.row, in.v_dim, m0, s.M, in.vec);
    cp_async_commit();
  };

  copy_rows_async<DM, kMmaRows>(smem, KS, in.q.at(bh, heads), in.q.row, in.qk_dim, n0, s.N, in.vec);
  cp_async_commit();
  cp_async_wait<0>();
  __syncthreads();
  KeptRows<F, DM> qa;  // the warp's 16 query rows as A fragments, for the whole pass
  qa.keep(smem + warp * 16 * KS, KS, g, t);
  float o[ET][4];
#pragma unroll
  for (int e = 0; e < ET; ++e) o[e][0] = o[e][1] = o[e][2] = o[e][3] = 0.f;
  // row_m in log2 units (scores times log2 e: exp2 is one instruction, exp a few more); row_l:
  // this lane's part of the sum.
  float row_m[2] = {neg_inf<float>(), neg_inf<float>()}, row_l[2] = {0.f, 0.f};
  const float scale2 = scale * kLog2e;
  // TOEPLITZ: head bh's row of c and its key weights.
  const float* c_row = TOEPLITZ ? tz.c_row(bh, s) : nullptr;
  const Rows<const float> w_rows = TOEPLITZ ? tz.w.rows(bh, heads) : Rows<const float>{nullptr, 0};

  const KeyRange keys = key_range<RANGES>(split, s.causal ? min(s.M, min(n0 + kMmaRows, s.N) + s.offset) : s.M);
  __syncthreads();  // the query tile's fragments are read: its space may be the first key tile's
  walk_staged(keys.begin, keys.end, NK, issue, [&](int64_t m0, int stage) {
    const Elem* ks = stages + stage * mma_forward_stage<F, DM>();
    const Elem* vs = ks + NK * KS;
    float sc[NT][4];
    mma_rows<F, DM, NT>(sc, qa, ks, KS, g, t);
    if constexpr (TOEPLITZ) {  // p = s c_{m-n}; row_l: sum_m p w_m
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int64_t n = rows[i / 2], m = m0 + nt * 8 + 2 * t + i % 2;
          float& x = sc[nt][i];
          x *= tz.at(c_row, s, n, m);
          if (m < s.M) row_l[i / 2] += x * w_rows.p[m * w_rows.row];
        }
      mma_accumulated<F, NT, ET>(o, sc, vs, KS, g, t);
      return;
    }
    // Element (nt, i) of a lane: row rows[i / 2], key m0 + nt * 8 + 2 t + i % 2.
    const bool masked = tile_masked(s, pad_b, n0, m0, NK);
    float tile_max[2] = {neg_inf<float>(), neg_inf<float>()};
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int64_t n = rows[i / 2], m = m0 + nt * 8 + 2 * t + i % 2;
        float& x = sc[nt][i];
        x = masked && (m >= s.M || hidden(s, pad_b, n, m)) ? neg_inf<float>()
                                                           : x * scale2 + (bias_b ? bias_b[m] * kLog2e : 0.f);
        tile_max[i / 2] = max_nan(tile_max[i / 2], x);
      }
    float alpha[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float mx = max_nan(row_m[h], quad_max(tile_max[h]));
      alpha[h] = mx == neg_inf<float>() ? 1.f : exp2f(row_m[h] - mx);  // nothing visible yet: keep zeros
      row_m[h] = mx;
      row_l[h] *= alpha[h];
    }
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int h = i / 2;
        float& x = sc[nt][i];
        x = row_m[h] == neg_inf<float>() ? 0.f : exp2f(x - row_m[h]);
        row_l[h] += x;  // the sum (and lse) stay the undropped ones
        const int64_t n = rows[h], m = m0 + nt * 8 + 2 * t + i % 2;
        if (drop.on && n < s.N && m < s.M) x *= drop.factor(bh / heads, ((bh % heads) * s.N + n) * s.M + m);
      }
#pragma unroll
    for (int e = 0; e < ET; ++e) o[e][0] *= alpha[0], o[e][1] *= alpha[0], o[e][2] *= alpha[1], o[e][3] *= alpha[1];
    mma_accumulated<F, NT, ET>(o, sc, vs, KS, g, t);
  });
  float* out_b = out.at(range_head<RANGES>(), heads);
  // TOEPLITZ: y unnormalized, the first E - 1 columns, then the row sums in its last.
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const float l = quad_sum(row_l[h]), inv = TOEPLITZ ? 1.f : l > 0.f ? 1.f / l : 0.f;
    const int64_t n = rows[h];
    if (n >= s.N) continue;
#pragma unroll
    for (int e = 0; e < ET; ++e)
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const int c = e * 8 + 2 * t + j;
        if (c < s.E) out_b[n * out.row + c] = o[e][2 * h + j] * inv;
      }
    if (t != 0) continue;
    if constexpr (TOEPLITZ)
      tz.den.at(bh, heads)[n * tz.den.row] = l;
    else
      lse[range_head<RANGES>() * s.N + n] = l == 0.f ? neg_inf<float>() : row_m[h] * kLn2 + d_log(l);  // NaN stays NaN
  }
}

// ---- the tensor-core backward (same layout) --------------------------------------------------------
// Two kernels as in float32, each sum taken by one warp in a fixed order (no atomics):
//   dk, dv  4 warps own 16 keys each (64 per block) and walk query tiles of 32 (16 at DM = 128,
//           and in 3xTF32 at DM = 64): S^T = K Q^T and dP^T = V dout^T from the warp's key and
//           value rows, kept as A fragments; then dv += (z P)^T dout and dk += dS^T q with those
//           accumulators reused as A operands.
//   dq      4 warps own 16 queries each and walk key tiles of 64 (32 at DM = 128 and in TF32, 16
//           in 3xTF32 at DM = 64): S = Q K^T, dP = dout V^T, dq += dS k.
// The walked tiles are double-buffered (cp.async). The B operands of the second products are
// read down the columns of row-major tiles (dout, q, k). P and dS enter their products as the
// format rounds them (bf16, as FlashAttention-2 does; TF32 split in two); delta, the sums of exp
// and dbias stay float32.
//
// The dk/dv kernel's query tile and the dq kernel's key tile: the score tiles are what is left of
// 255 registers after the kept fragments and the accumulators (at DM = 128: 64 + 128 in dk/dv;
// 3xTF32 also keeps each k-step's split of A); the TF32 dq kernel's 32 keys keep its stages under
// 48 KB of shared memory, its 16 at DM = 128 the whole kernel's under 99 KB (kept_in_smem). In
// 3xTF32 at DM = 64 (kept in shared memory) 32 would fit too (dk/dv 212 registers, dq 168) at
// fewer blocks an SM: 16 keeps 3 and 4 (166 and 126).
template <typename F, int DM> constexpr int dkv_queries() {
  return DM == 128 || (F::kPasses == 3 && DM == 64) ? 16 : 32;
}
template <typename F, int DM> constexpr int dq_keys() {
  if constexpr (sizeof(typename F::Elem) == 4) return (F::kPasses == 3 && DM == 64) || DM == 128 ? 16 : 32;
  return DM == 128 ? 32 : 64;
}
// Elements per stage of the walked tiles (two of them: q and dout, or k and v); the kept rows'
// two [64, DM + PAD] tiles are staged first, in the same space unless they stay (kept_in_smem).
template <typename F, int DM> constexpr int dkv_stage() { return 2 * dkv_queries<F, DM>() * (DM + F::PAD); }
template <typename F, int DM> constexpr int dq_stage() { return 2 * dq_keys<F, DM>() * (DM + F::PAD); }
template <typename F, int DM> constexpr int kept_tiles() { return 2 * kMmaRows * (DM + F::PAD); }

// One probability and its score gradient (probs_and_dscores' formulas): x the unscaled score,
// dp = dout . v; returns z p in *pz. masked: the pair may be hidden (tile_masked).
__device__ __forceinline__ float mma_dscore(float x, float dp, int64_t n, int64_t m, float row_lse, float row_delta,
                                            float scale, const SdpaShape& s, bool masked, const uint8_t* pad_b,
                                            const float* bias_b, const ExampleDropout<float>& drop, int64_t bh,
                                            int64_t heads, float* pz) {
  const bool off = n >= s.N || m >= s.M || row_lse == neg_inf<float>() || (masked && hidden(s, pad_b, n, m));
  const float p = off ? 0.f : exp2f((x * scale + (bias_b ? bias_b[m] : 0.f) - row_lse) * kLog2e);
  const float z = drop.on && !off ? drop.factor(bh / heads, ((bh % heads) * s.N + n) * s.M + m) : 1.f;
  *pz = z * p;
  return p * (z * dp - row_delta);
}

// Stores a warp's [16, DM] accumulators times `scale` into rows r0.. of a [count, dim] matrix whose
// rows are ld apart.
template <int ET>
__device__ __forceinline__ void store_rows(float* dst, int64_t ld, const float (&acc)[ET][4], float scale, int64_t r0,
                                           int64_t count, int64_t dim, int g, int t) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int64_t r = r0 + g + 8 * h;
    if (r >= count) continue;
#pragma unroll
    for (int e = 0; e < ET; ++e)
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const int c = e * 8 + 2 * t + j;
        if (c < dim) dst[r * ld + c] = acc[e][2 * h + j] * scale;
      }
  }
}

// Where the backward kernels' stages start (elements past the shared memory's start) and where the
// dk/dv kernel's row statistics do.
template <typename F, int DM> constexpr int backward_stages() { return kept_space<F, DM>(2); }
template <typename F, int DM> constexpr int dkv_stats() {
  return kept_in_smem<F, DM>() ? backward_stages<F, DM>() + 2 * dkv_stage<F, DM>()
                               : std::max(kept_tiles<F, DM>(), 2 * dkv_stage<F, DM>());
}

// The backward kernels' kept operands: rows [r0, r0 + 64) of head bh of x0 [count, dim0] and x1
// [count, dim1] copied into tiles t0 and t1 (row stride DM + PAD), and the warp's 16 of them kept as A
// fragments a0 and a1 for the whole pass. Ends with the tiles read (their space is free unless
// the fragments are read from them: kept_in_smem).
template <typename F, int DM>
__device__ __forceinline__ void keep_warp_rows(KeptRows<F, DM>& a0, KeptRows<F, DM>& a1, typename F::Elem* t0,
                                               typename F::Elem* t1, const HeadRows<const typename F::Elem>& x0,
                                               int64_t dim0, const HeadRows<const typename F::Elem>& x1, int64_t dim1,
                                               int64_t heads, int64_t r0, int64_t count, bool vec,
                                               const MmaLane& lane) {
  constexpr int LD = DM + F::PAD;
  copy_rows_async<DM, kMmaRows>(t0, LD, x0.at(lane.bh, heads), x0.row, dim0, r0, count, vec);
  copy_rows_async<DM, kMmaRows>(t1, LD, x1.at(lane.bh, heads), x1.row, dim1, r0, count, vec);
  cp_async_commit();
  cp_async_wait<0>();
  __syncthreads();
  a0.keep(t0 + lane.warp * 16 * LD, LD, lane.g, lane.t);
  a1.keep(t1 + lane.warp * 16 * LD, LD, lane.g, lane.t);
  __syncthreads();
}

// The backward kernels' blocks an SM at DM = 16 (the ViT's heads; 0: unbounded), held to what
// they were before the strided operands (HeadRows) moved ptxas to 166 registers in the 3xTF32 dq
// kernel (3 blocks an SM: the ViT's 512 (b, h) tiles at batch 128 in two waves on 132 SMs instead
// of one) and 204 in the bf16 dk/dv kernel (2): 4 and 3 (ptxas -v, sm_90: 128 and 154 registers
// in 3xTF32, 120 and 136 in bf16, no more spilled than before).
template <int DM> constexpr int dkv_min_blocks() { return DM == 16 ? 3 : 0; }
template <int DM> constexpr int dq_min_blocks() { return DM == 16 ? 4 : 0; }

// TOEPLITZ (ToeplitzTiles; delta: dy's last column r_n, lse unused): p = s c_{m-n}, dp = dout . v
// over the first E - 1 columns plus r_n w_m, ds = c_{m-n} dp; dv's last column sum_n p r_n.
template <typename F, int DM, bool TOEPLITZ = false>
__global__ void __launch_bounds__(kMmaThreads, dkv_min_blocks<DM>())
    sdpa_backward_dkv_mma_kernel(MmaOperands<typename F::Elem> in, const float* lse, const float* delta,
                                 const uint8_t* pad, const float* bias, float scale, SdpaShape s, int64_t heads,
                                 ExampleDropout<float> drop, const uint64_t* draw_base, HeadRows<float> dk,
                                 HeadRows<float> dv, float* dbias, ToeplitzTiles tz) {
  using Elem = typename F::Elem;
  constexpr int LD = DM + F::PAD, ET = DM / 8, NQ = dkv_queries<F, DM>(), NT = NQ / 8;
  Elem* smem = shared_mem<Elem>();  // the kept tiles; 2 x [q tile [NQ, LD], dout tile [NQ, LD]]
  Elem* stages = smem + backward_stages<F, DM>();
  float* stats = reinterpret_cast<float*>(smem + dkv_stats<F, DM>());  // 2 x [lse, delta]
  const MmaLane lane(pad, bias, s, heads, drop, draw_base);
  const int warp = lane.warp, g = lane.g, t = lane.t;  // named apart: lambdas capture them (C++17)
  const int64_t bh = lane.bh;
  const uint8_t* pad_b = lane.pad_b;
  const float* bias_b = lane.bias_b;
  const int64_t m0 = static_cast<int64_t>(blockIdx.x) * kMmaKeys, mw = m0 + warp * 16;
  KeptRows<F, DM> ka, va;  // the warp's 16 keys and values
  keep_warp_rows<F, DM>(ka, va, smem, smem + kMmaKeys * LD, in.k, in.qk_dim, in.v, in.v_dim, heads, m0, s.M, in.vec,
                        lane);
  float dk_acc[ET][4], dv_acc[ET][4], db[2] = {0.f, 0.f};
#pragma unroll
  for (int e = 0; e < ET; ++e)
#pragma unroll
    for (int i = 0; i < 4; ++i) dk_acc[e][i] = dv_acc[e][i] = 0.f;
  const Elem* qb = in.q.at(bh, heads);
  const Elem* dob = in.dout.at(bh, heads);
  const float* stat_rows[2] = {lse + bh * s.N, delta + bh * s.N};
  const float* c_row = TOEPLITZ ? tz.c_row(bh, s) : nullptr;
  float wk[2] = {0.f, 0.f};  // TOEPLITZ: the weights w_m of the lane's two keys
  if constexpr (TOEPLITZ) {
    const Rows<const float> w = tz.w.rows(bh, heads);
    for (int h = 0; h < 2; ++h)
      if (mw + g + 8 * h < s.M) wk[h] = w.p[(mw + g + 8 * h) * w.row];
  }
  // Query tile n0 (q, dout, lse, delta; zeros past N) into stage `st`, one commit group.
  const auto issue = [&](int64_t n0, int st) {
    Elem* qs = stages + st * dkv_stage<F, DM>();
    copy_rows_async<DM, NQ>(qs, LD, qb, in.q.row, in.qk_dim, n0, s.N, in.vec);
    copy_rows_async<DM, NQ>(qs + NQ * LD, LD, dob, in.dout.row, in.v_dim, n0, s.N, in.vec);
    const int i = threadIdx.x, r = i % NQ;
    const float* src = stat_rows[i < NQ ? 0 : 1];
    if (i < 2 * NQ) cp_async<4>(stats + st * 2 * NQ + i, n0 + r < s.N ? src + n0 + r : src, n0 + r < s.N);
    cp_async_commit();
  };

  const int64_t n_begin = s.causal && m0 > s.offset ? (m0 - s.offset) / NQ * NQ : int64_t{0};
  walk_staged(n_begin, s.N, NQ, issue, [&](int64_t n0, int stage) {
    const Elem* qs = stages + stage * dkv_stage<F, DM>();
    const Elem* ds = qs + NQ * LD;
    const float* row_lse = stats + stage * 2 * NQ;
    const float* row_delta = row_lse + NQ;
    const bool masked = tile_masked(s, pad_b, n0, m0, kMmaKeys);
    float sT[NT][4], dpt[NT][4];  // S^T and dP^T: rows the warp's keys, columns the tile's queries
    mma_rows<F, DM, NT>(sT, ka, qs, LD, g, t);
    mma_rows<F, DM, NT>(dpt, va, ds, LD, g, t);
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int c = nt * 8 + 2 * t + i % 2;
        if constexpr (TOEPLITZ) {
          const float cc = tz.at(c_row, s, n0 + c, mw + g + 8 * (i / 2));
          sT[nt][i] *= cc;
          dpt[nt][i] = cc * (dpt[nt][i] + row_delta[c] * wk[i / 2]);
          db[i / 2] += sT[nt][i] * row_delta[c];
          continue;
        }
        float pz;
        const float d = mma_dscore(sT[nt][i], dpt[nt][i], n0 + c, mw + g + 8 * (i / 2), row_lse[c], row_delta[c], scale,
                                   s, masked, pad_b, bias_b, drop, bh, heads, &pz);
        sT[nt][i] = pz;
        dpt[nt][i] = d;
        db[i / 2] += d;
      }
    mma_accumulated<F, NT, ET>(dv_acc, sT, ds, LD, g, t);   // dv += (z p)^T dout
    mma_accumulated<F, NT, ET>(dk_acc, dpt, qs, LD, g, t);  // dk += ds^T q (scaled below)
  });
  store_rows<ET>(dk.at(bh, heads), dk.row, dk_acc, scale, mw, s.M, s.D, g, t);
  store_rows<ET>(dv.at(bh, heads), dv.row, dv_acc, 1.f, mw, s.M, s.E, g, t);
  if constexpr (TOEPLITZ) {
    const Rows<float> dw = tz.dw.rows(bh, heads);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float sum = quad_sum(db[h]);
      const int64_t m = mw + g + 8 * h;
      if (t == 0 && m < s.M) dw.p[m * dw.row] = sum;
    }
    return;
  }
  if (dbias) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float sum = quad_sum(db[h]);
      const int64_t m = mw + g + 8 * h;
      if (t == 0 && m < s.M) dbias[bh * s.M + m] = sum;
    }
  }
}

// TOEPLITZ as the dk/dv kernel: ds = c_{m-n} (dout . v + r_n w_m), no scores needed.
template <typename F, int DM, bool RANGES, bool TOEPLITZ = false>
__global__ void __launch_bounds__(kMmaThreads, dq_min_blocks<DM>())
    sdpa_backward_dq_mma_kernel(MmaOperands<typename F::Elem> in, const float* lse, Deltas<float> delta,
                                const uint8_t* pad, const float* bias, float scale, SdpaShape s, int64_t heads,
                                ExampleDropout<float> drop, const uint64_t* draw_base, HeadRows<float> dq,
                                int64_t split, ToeplitzTiles tz) {
  using Elem = typename F::Elem;
  constexpr int LD = DM + F::PAD, ET = DM / 8, NK = dq_keys<F, DM>(), NT = NK / 8;
  Elem* smem = shared_mem<Elem>();  // the kept tiles; 2 x [k tile [NK, LD], v tile [NK, LD]]
  Elem* stages = smem + backward_stages<F, DM>();
  const MmaLane lane(pad, bias, s, heads, drop, draw_base);
  const int warp = lane.warp, g = lane.g, t = lane.t;  // named apart: lambdas capture them (C++17)
  const int64_t bh = lane.bh;
  const uint8_t* pad_b = lane.pad_b;
  const float* bias_b = lane.bias_b;
  const int64_t n0 = static_cast<int64_t>(blockIdx.x) * kMmaRows, nw = n0 + warp * 16;
  float row_lse[2], row_delta[2], dq_acc[ET][4];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int64_t n = nw + g + 8 * h;
    row_lse[h] = n < s.N ? lse[bh * s.N + n] : neg_inf<float>();
    row_delta[h] = n < s.N && !delta.computed() ? delta.rows[bh * s.N + n] : 0.f;
  }
  // The block's rows' deltas through shared memory (the stages, not yet in use), before the kept
  // rows take the registers (each warp's own 16 rows beside them: ptxas spilled 100 bytes at
  // DM = 16 in 3xTF32).
  if (delta.computed()) {
    float* rows_delta = reinterpret_cast<float*>(stages);
    delta.block_rows<RANGES>(bh, heads, s.N, n0, kMmaRows, rows_delta);
    row_delta[0] = rows_delta[warp * 16 + g];
    row_delta[1] = rows_delta[warp * 16 + g + 8];
    __syncthreads();  // read: the stages are the key tiles' from here
  }
  KeptRows<F, DM> qa, da;  // the warp's 16 queries and their output gradients
  keep_warp_rows<F, DM>(qa, da, smem, smem + kMmaRows * LD, in.q, in.qk_dim, in.dout, in.v_dim, heads, n0, s.N, in.vec,
                        lane);
#pragma unroll
  for (int e = 0; e < ET; ++e) dq_acc[e][0] = dq_acc[e][1] = dq_acc[e][2] = dq_acc[e][3] = 0.f;
  const Elem* kb = in.k.at(bh, heads);
  const Elem* vb = in.v.at(bh, heads);
  // Key tile m0 (k and v) into stage `st`, one commit group.
  const auto issue = [&](int64_t m0, int st) {
    Elem* ks = stages + st * dq_stage<F, DM>();
    copy_rows_async<DM, NK>(ks, LD, kb, in.k.row, in.qk_dim, m0, s.M, in.vec);
    copy_rows_async<DM, NK>(ks + NK * LD, LD, vb, in.v.row, in.v_dim, m0, s.M, in.vec);
    cp_async_commit();
  };

  const KeyRange keys = key_range<RANGES>(split, s.causal ? min(s.M, min(n0 + kMmaRows, s.N) + s.offset) : s.M);
  walk_staged(keys.begin, keys.end, NK, issue, [&](int64_t m0, int stage) {
    const Elem* ks = stages + stage * dq_stage<F, DM>();
    const Elem* vs = ks + NK * LD;
    float sc[NT][4], dp[NT][4];
    if constexpr (TOEPLITZ) {
      mma_rows<F, DM, NT>(dp, da, vs, LD, g, t);
      const float* c_row = tz.c_row(bh, s);
      const Rows<const float> w = tz.w.rows(bh, heads);
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int64_t n = nw + g + 8 * (i / 2), m = m0 + nt * 8 + 2 * t + i % 2;
          sc[nt][i] = m < s.M ? tz.at(c_row, s, n, m) * (dp[nt][i] + row_delta[i / 2] * w.p[m * w.row]) : 0.f;
        }
      mma_accumulated<F, NT, ET>(dq_acc, sc, ks, LD, g, t);
      return;
    }
    const bool masked = tile_masked(s, pad_b, n0, m0, NK);
    mma_rows<F, DM, NT>(sc, qa, ks, LD, g, t);
    mma_rows<F, DM, NT>(dp, da, vs, LD, g, t);
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        float pz;
        sc[nt][i] = mma_dscore(sc[nt][i], dp[nt][i], nw + g + 8 * (i / 2), m0 + nt * 8 + 2 * t + i % 2, row_lse[i / 2],
                               row_delta[i / 2], scale, s, masked, pad_b, bias_b, drop, bh, heads, &pz);
      }
    mma_accumulated<F, NT, ET>(dq_acc, sc, ks, LD, g, t);  // dq += ds k (scaled below)
  });
  store_rows<ET>(dq.at(range_head<RANGES>(), heads), dq.row, dq_acc, scale, nw, s.N, s.D, g, t);
}

// The dc kernel's shared memory: dq's kept tiles and stages (elements), then its [64, 65] band
// tile (floats).
template <typename F, int DM> constexpr int toeplitz_band_space() {
  return kept_in_smem<F, DM>() ? backward_stages<F, DM>() + 2 * dq_stage<F, DM>()
                               : std::max(kept_tiles<F, DM>(), 2 * dq_stage<F, DM>());
}

// dc of the TOEPLITZ backward, a band of 64 diagonals a block: block (band, row of c) owns t = m - n
// in [t0, t0 + 64), t0 = 64 band - (N - 1), and walks the query tiles the band meets, for each
// (b, h) that row of c serves (one, or the batch in order: c per head). Per query tile its warps
// keep their 16 queries and dout rows (as dq's kernel) and take S = Q K^T and dP = dout V^T over
// the keys [n0 + t0, n0 + t0 + 128) in dq's key tiles (a warp only over the tiles that meet its
// rows' 79 keys); each element on a band diagonal, s (dp + r_n w_m), goes to its place in a
// [64 rows, 64 diagonals] tile of shared memory (each place once), whose columns thread j < 64
// then adds in row order into diagonal t0 + j's sum. No atomics: the same bits every run, dc
// written once.
template <typename F, int DM>
__global__ void __launch_bounds__(kMmaThreads)
    toeplitz_dc_mma_kernel(MmaOperands<typename F::Elem> in, const float* r, SdpaShape s, int64_t heads,
                           int64_t batches, ToeplitzTiles tz, float* dc) {
  using Elem = typename F::Elem;
  constexpr int LD = DM + F::PAD, NK = dq_keys<F, DM>(), NT = NK / 8, kBand = 64, DP = kBand + 1;
  Elem* smem = shared_mem<Elem>();
  Elem* stages = smem + backward_stages<F, DM>();
  float* band = reinterpret_cast<float*>(smem + toeplitz_band_space<F, DM>());  // [64 rows, DP]
  ExampleDropout<float> off;
  MmaLane lane(nullptr, nullptr, s, heads, off, nullptr);
  const int warp = lane.warp, g = lane.g, t = lane.t, tid = threadIdx.x;
  const int64_t L = s.N + s.M - 1, t0 = static_cast<int64_t>(blockIdx.x) * kBand - (s.N - 1);
  // The queries with a key on a band diagonal: m = n + t in [0, M).
  const int64_t n_lo = max(int64_t{0}, -t0 - (kBand - 1)), n_hi = min(s.N, s.M - t0);
  float sum = 0.f;  // thread j < 64: diagonal t0 + j
  // c per (b, h): one head; per head: the batch's heads h, H + h, ... in order.
  for (int64_t b = 0; b < (tz.c_rows == heads ? batches : 1); ++b) {
    const int64_t bh = tz.c_rows == heads ? b * heads + blockIdx.y : blockIdx.y;
    lane.bh = bh;
    const Rows<const float> w = tz.w.rows(bh, heads);
    const Elem* kb = in.k.at(bh, heads);
    const Elem* vb = in.v.at(bh, heads);
    for (int64_t n0 = n_lo / kMmaRows * kMmaRows; n0 < n_hi; n0 += kMmaRows) {
      const int64_t nw = n0 + warp * 16;
      KeptRows<F, DM> qa, da;
      keep_warp_rows<F, DM>(qa, da, smem, smem + kMmaRows * LD, in.q, in.qk_dim, in.dout, in.v_dim, heads, n0, s.N,
                            in.vec, lane);
      float row_r[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) row_r[h] = nw + g + 8 * h < s.N ? r[bh * s.N + nw + g + 8 * h] : 0.f;
      for (int i = tid; i < kBand * DP; i += kMmaThreads) band[i] = 0.f;
      // The window's keys, clipped to [0, M).
      const int64_t k_begin = max(int64_t{0}, n0 + t0), k_end = min(s.M, n0 + t0 + kMmaRows + kBand - 1);
      const auto issue = [&](int64_t m0, int st) {
        Elem* ks = stages + st * dq_stage<F, DM>();
        copy_rows_async<DM, NK>(ks, LD, kb, in.k.row, in.qk_dim, m0, s.M, in.vec);
        copy_rows_async<DM, NK>(ks + NK * LD, LD, vb, in.v.row, in.v_dim, m0, s.M, in.vec);
        cp_async_commit();
      };
      walk_staged(k_begin, k_end, NK, issue, [&](int64_t m0, int stage) {
        // The warp's rows meet the band at keys [nw + t0, nw + t0 + 15 + 63]: a tile outside
        // them holds none of its elements (16-key tiles: 3 of 8 skipped, 32-key: 1 of 4; every
        // warp meets both 64-key tiles).
        if constexpr (NK < 64)
          if (m0 + NK <= nw + t0 || m0 > nw + t0 + 15 + kBand - 1) return;
        const Elem* ks = stages + stage * dq_stage<F, DM>();
        const Elem* vs = ks + NK * LD;
        float sc[NT][4], dp[NT][4];
        mma_rows<F, DM, NT>(sc, qa, ks, LD, g, t);
        mma_rows<F, DM, NT>(dp, da, vs, LD, g, t);
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            const int64_t n = nw + g + 8 * (i / 2), m = m0 + nt * 8 + 2 * t + i % 2, j = m - n - t0;
            if (j >= 0 && j < kBand && n < s.N && m < k_end)
              band[(n - n0) * DP + j] = sc[nt][i] * (dp[nt][i] + row_r[i / 2] * w.p[m * w.row]);
          }
      });
      if (tid < kBand)
        for (int i = 0; i < kMmaRows; ++i) sum += band[i * DP + tid];
      __syncthreads();  // the band tile is read: the next query tile may reuse it and the kept tiles
    }
  }
  if (tid < kBand && t0 + tid < s.M) dc[blockIdx.y * L + t0 + tid + s.N - 1] = sum;
}

// The forward's key ranges merged in order (parts at heads bh + z BH, z < ranges): lse = log
// sum_z exp(lse_z), out = sum_z exp(lse_z - lse) out_z (each part normalized by its own sum); a
// row that no range saw: out 0, lse -inf. A warp per row.
template <typename T>
__global__ void sdpa_merge_ranges_kernel(HeadRows<const T> part_out, const T* part_lse, int64_t ranges, int64_t heads,
                                         int64_t N, int64_t rows, int64_t E, HeadRows<T> out, T* lse) {
  const WarpRows w;
  const int64_t BH = rows / N;
  for (int64_t r = w.first; r < rows; r += w.step) {
    const int64_t bh = r / N, n = r - bh * N;
    T mx = neg_inf<T>();
    for (int64_t z = 0; z < ranges; ++z) mx = max_nan(mx, part_lse[z * rows + r]);
    T sum = T(0);
    if (mx != neg_inf<T>())
      for (int64_t z = 0; z < ranges; ++z) sum += d_exp(part_lse[z * rows + r] - mx);
    const T total = mx == neg_inf<T>() ? mx : mx + d_log(sum);
    T* o = out.at(bh, heads) + n * out.row;
    for (int64_t e = w.lane; e < E; e += WarpRows::kLanes) {
      T acc = T(0);
      for (int64_t z = 0; z < ranges; ++z) {
        const T l = part_lse[z * rows + r];
        if (l != neg_inf<T>()) acc += d_exp(l - total) * part_out.at(bh + z * BH, heads)[n * part_out.row + e];
      }
      o[e] = acc;
    }
    if (w.lane == 0) lse[r] = total;
  }
}

// dq [B, H, N, D] = the sum of the key ranges' parts (heads bh + z BH), in order of z. A warp per row.
template <typename T>
__global__ void sdpa_sum_ranges_kernel(HeadRows<const T> part, int64_t ranges, int64_t heads, int64_t N, int64_t rows,
                                       int64_t D, HeadRows<T> dq) {
  const WarpRows w;
  const int64_t BH = rows / N;
  for (int64_t r = w.first; r < rows; r += w.step) {
    const int64_t bh = r / N, n = r - bh * N;
    T* o = dq.at(bh, heads) + n * dq.row;
    for (int64_t d = w.lane; d < D; d += WarpRows::kLanes) {
      T acc = T(0);
      for (int64_t z = 0; z < ranges; ++z) acc += part.at(bh + z * BH, heads)[n * part.row + d];
      o[d] = acc;
    }
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
    dos = qs + B * pitch<DM>();
    ks = dos + B * pitch<DM>();
    vs = ks + B * pitch<DM>();
    ps = vs + B * pitch<DM>();
    dss = ps + B * (B + 1);
    row_lse = dss + B * (B + 1);
    row_delta = row_lse + B;
  }
  // Query rows [n0, n0 + B) of head bh (past N: lse -inf, delta 0, zero rows); delta null: the
  // caller fills row_delta.
  __device__ void load_queries(Rows<const T> q, Rows<const T> dout, const T* lse, const T* delta, const SdpaShape& s,
                               int64_t bh, int64_t n0) {
    load_tile<T, DM, B>(qs, q, n0, s.N, s.D);
    load_tile<T, DM, B>(dos, dout, n0, s.N, s.E);
    for (int r = threadIdx.x; r < B; r += kThreads) {
      const bool in = n0 + r < s.N;
      row_lse[r] = in ? lse[bh * s.N + n0 + r] : neg_inf<T>();
      if (delta) row_delta[r] = in ? delta[bh * s.N + n0 + r] : T(0);
    }
  }
  // Key rows [m0, m0 + B) of head bh.
  __device__ void load_keys(Rows<const T> k, Rows<const T> v, const SdpaShape& s, int64_t m0) {
    load_tile<T, DM, B>(ks, k, m0, s.M, s.D);
    load_tile<T, DM, B>(vs, v, m0, s.M, s.E);
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
__global__ void sdpa_backward_dkv_kernel(HeadRows<const T> q, HeadRows<const T> k, HeadRows<const T> v,
                                         HeadRows<const T> dout, const T* lse, const T* delta, const uint8_t* pad,
                                         const T* bias, T scale, SdpaShape s, int64_t heads, ExampleDropout<T> drop,
                                         const uint64_t* draw_base, HeadRows<T> dk, HeadRows<T> dv, T* dbias) {
  constexpr int TK = B / kRowThreads, TD = DM / kColThreads;
  BackwardTiles<T, DM, B> t;
  const int tid = threadIdx.x, ty = tid / kColThreads, tx = tid % kColThreads;
  const int64_t bh = blockIdx.y, m0 = static_cast<int64_t>(blockIdx.x) * B;
  const uint8_t* pad_b = pad ? pad + (bh / heads) * s.pad_ld : nullptr;
  const T* bias_b = bias ? bias + bh * s.M : nullptr;
  if (drop.on && draw_base) drop.draw += *draw_base;
  t.load_keys(k.rows(bh, heads), v.rows(bh, heads), s, m0);
  const Rows<const T> qb = q.rows(bh, heads), dob = dout.rows(bh, heads);
  T dk_acc[TK][TD], dv_acc[TK][TD], db_acc = T(0);  // db_acc: key m0 + tid's (tid < B)
#pragma unroll
  for (int i = 0; i < TK; ++i)
#pragma unroll
    for (int c = 0; c < TD; ++c) dk_acc[i][c] = dv_acc[i][c] = T(0);
  // The first query that sees key m0 causally sits at m0 - offset.
  const int64_t n_begin = s.causal && m0 > s.offset ? (m0 - s.offset) / B * B : int64_t{0};
  for (int64_t n0 = n_begin; n0 < s.N; n0 += B) {
    __syncthreads();
    t.load_queries(qb, dob, lse, delta, s, bh, n0);
    __syncthreads();
    t.scores(scale, s, pad_b, bias_b, drop, bh, heads, n0, m0, ty, tx);
    __syncthreads();
    if (dbias && tid < B)
      for (int r = 0; r < B; ++r) db_acc += t.dss[r * (B + 1) + tid];
    accumulate_patch_t<T, DM, TK, B, B>(t.ps, t.dos, dv_acc, ty, tx);  // dv += p^T dout
    accumulate_patch_t<T, DM, TK, B, B>(t.dss, t.qs, dk_acc, ty, tx);  // dk += ds^T q (scaled below)
  }
  T* dk_b = dk.at(bh, heads);
  T* dv_b = dv.at(bh, heads);
#pragma unroll
  for (int i = 0; i < TK; ++i) {
    const int64_t m = m0 + ty + kRowThreads * i;
    if (m >= s.M) continue;
#pragma unroll
    for (int c = 0; c < TD; ++c) {
      const int d = tx + kColThreads * c;
      if (d < s.D) dk_b[m * dk.row + d] = dk_acc[i][c] * scale;
      if (d < s.E) dv_b[m * dv.row + d] = dv_acc[i][c];
    }
  }
  if (dbias && tid < B && m0 + tid < s.M) dbias[bh * s.M + m0 + tid] = db_acc;
}

// dq for BR = B queries: over the key tiles they may see.
template <typename T, int DM, int B, bool RANGES>
__global__ void sdpa_backward_dq_kernel(HeadRows<const T> q, HeadRows<const T> k, HeadRows<const T> v,
                                        HeadRows<const T> dout, const T* lse, Deltas<T> delta, const uint8_t* pad,
                                        const T* bias, T scale, SdpaShape s, int64_t heads, ExampleDropout<T> drop,
                                        const uint64_t* draw_base, HeadRows<T> dq, int64_t split) {
  constexpr int TR = B / kRowThreads, TD = DM / kColThreads;
  BackwardTiles<T, DM, B> t;
  const int tid = threadIdx.x, ty = tid / kColThreads, tx = tid % kColThreads;
  const int64_t bh = blockIdx.y, n0 = static_cast<int64_t>(blockIdx.x) * B;
  const uint8_t* pad_b = pad ? pad + (bh / heads) * s.pad_ld : nullptr;
  const T* bias_b = bias ? bias + bh * s.M : nullptr;
  if (drop.on && draw_base) drop.draw += *draw_base;
  t.load_queries(q.rows(bh, heads), dout.rows(bh, heads), lse, delta.computed() ? nullptr : delta.rows, s, bh, n0);
  if (delta.computed()) delta.template block_rows<RANGES>(bh, heads, s.N, n0, B, t.row_delta);
  const Rows<const T> kb = k.rows(bh, heads), vb = v.rows(bh, heads);
  T dq_acc[TR][TD];
#pragma unroll
  for (int i = 0; i < TR; ++i)
#pragma unroll
    for (int c = 0; c < TD; ++c) dq_acc[i][c] = T(0);
  const KeyRange keys = key_range<RANGES>(split, s.causal ? min(s.M, min(n0 + B, s.N) + s.offset) : s.M);
  for (int64_t m0 = keys.begin; m0 < keys.end; m0 += B) {
    __syncthreads();
    t.load_keys(kb, vb, s, m0);
    __syncthreads();
    t.scores(scale, s, pad_b, bias_b, drop, bh, heads, n0, m0, ty, tx);
    __syncthreads();
    accumulate_patch<T, DM, TR, B>(t.dss, t.ks, dq_acc, ty, tx);  // dq += ds k (scaled below)
  }
  T* dq_b = dq.at(range_head<RANGES>(), heads);
#pragma unroll
  for (int i = 0; i < TR; ++i) {
    const int64_t n = n0 + ty + kRowThreads * i;
    if (n >= s.N) continue;
#pragma unroll
    for (int c = 0; c < TD; ++c) {
      const int d = tx + kColThreads * c;
      if (d < s.D) dq_b[n * dq.row + d] = dq_acc[i][c] * scale;
    }
  }
}

// Shared memory of the forward and of the backward kernels for tiles of B rows.
template <typename T, int DM, int B> constexpr size_t forward_smem() {
  return sizeof(T) * (3 * B * pitch<DM>() + B * (B + 1) + 3 * B);
}
template <typename T, int DM, int B> constexpr size_t backward_smem() {
  return sizeof(T) * (4 * B * pitch<DM>() + 2 * B * (B + 1) + 2 * B);
}
constexpr size_t kMaxSmem = 48 * 1024;

struct SdpaArgs {
  const Tensor &q, &k, &v, &pad, &bias;
  double scale;
  SdpaShape s;
  const FoldedDropout& drop;
};

// The key ranges of the forward and dq kernels (grid z): one, unless their query tiles leave most
// of the GPU idle (fewer than kTargetBlocks blocks) over many keys (LARA's C landmarks over L
// keys, a decoding step): then about kTargetBlocks blocks in all, each range at least
// kMinRangeKeys keys and a multiple of 128 (every kernel's key tile divides it). From the shape
// alone: the same bits every run.
struct KeyRanges {
  int64_t split, count;
};
KeyRanges key_ranges(int64_t query_tiles, int64_t BH, int64_t M) {
  constexpr int64_t kTargetBlocks = 264, kMinRangeKeys = 512, kAlign = 128;
  const int64_t blocks = query_tiles * BH;
  const int64_t count =
      blocks >= kTargetBlocks ? 1 : std::min((kTargetBlocks + blocks - 1) / blocks, M / kMinRangeKeys);
  if (count <= 1) return {std::max<int64_t>(M, 1), 1};
  const int64_t split = ((M + count - 1) / count + kAlign - 1) / kAlign * kAlign;
  return {split, (M + split - 1) / split};
}

// launch(split, ranges, dst, lse) over the key ranges of query tiles of `tile_rows`: one range
// straight into dst (out or dq) and lse; several into parts [ranges B, H, N, width] that are then
// merged (the forward: lse defined) or summed (dq), in order of the ranges.
template <typename T, typename Launch>
void over_key_ranges(const SdpaArgs& a, int64_t tile_rows, int64_t width, const Tensor& dst, const Tensor& lse,
                     Launch&& launch) {
  const int64_t H = a.q.size(1), BH = a.q.size(0) * H, N = a.s.N, rows = BH * N;
  const KeyRanges kr = key_ranges((N + tile_rows - 1) / tile_rows, BH, a.s.M);
  if (kr.count == 1) return launch(kr.split, 1u, rows_out<T>(dst), lse.defined() ? ptr<T>(lse) : nullptr);
  DeviceScratch<T> part(kr.count * rows * width), part_lse(lse.defined() ? kr.count * rows : 0);
  const HeadRows<T> parts{part.p, H * N * width, N * width, width};
  launch(kr.split, static_cast<unsigned>(kr.count), parts, lse.defined() ? part_lse.p : nullptr);
  const HeadRows<const T> done{part.p, parts.batch, parts.head, parts.row};
  if (lse.defined())
    sdpa_merge_ranges_kernel<T><<<grid_for_warp_rows(rows), kBlockSize, 0, stream()>>>(
        done, part_lse.p, kr.count, H, N, rows, width, rows_out<T>(dst), ptr<T>(lse));
  else
    sdpa_sum_ranges_kernel<T>
        <<<grid_for_warp_rows(rows), kBlockSize, 0, stream()>>>(done, kr.count, H, N, rows, width, rows_out<T>(dst));
  LINEA_KERNEL_LAUNCH_CHECK();
}

template <typename T, int DM, int B> void forward_tiles(const SdpaArgs& a, const Tensor& out, const Tensor& lse) {
  over_key_ranges<T>(a, B, a.s.E, out, lse, [&](int64_t split, unsigned ranges, HeadRows<T> o, T* l) {
    const dim3 grid(static_cast<unsigned>((a.s.N + B - 1) / B), static_cast<unsigned>(a.q.size(0) * a.q.size(1)),
                    ranges);
    const auto kernel = ranges > 1 ? sdpa_forward_kernel<T, DM, B, true> : sdpa_forward_kernel<T, DM, B, false>;
    kernel<<<grid, kThreads, forward_smem<T, DM, B>(), stream()>>>(
        rows_in<T>(a.q), rows_in<T>(a.k), rows_in<T>(a.v), a.pad.defined() ? cptr<uint8_t>(a.pad) : nullptr,
        a.bias.defined() ? cptr<T>(a.bias) : nullptr, static_cast<T>(a.scale), a.s, a.q.size(1),
        example_dropout<T>(a.drop), a.drop.draw_base, o, l, split);
    LINEA_KERNEL_LAUNCH_CHECK();
  });
}

// Shared memory of the three kernels (bytes). Past kMaxSmem a kernel opts in (allow_smem): 52 KB
// for 3xTF32 at DM = 64, 70 KB for bf16 at DM = 128 and TF32 at 64, about 99 KB for TF32 at 128;
// with_mma_kernels leaves to the SIMT kernels what the device cannot give.
template <typename F, int DM> constexpr size_t mma_forward_smem() {
  return sizeof(typename F::Elem) * (kept_space<F, DM>(1) + 2 * mma_forward_stage<F, DM>());
}
template <typename F, int DM> constexpr size_t mma_dkv_smem() {  // each stage's lse and delta last
  return sizeof(typename F::Elem) * dkv_stats<F, DM>() + sizeof(float) * 2 * 2 * dkv_queries<F, DM>();
}
template <typename F, int DM> constexpr size_t mma_dq_smem() {
  return sizeof(typename F::Elem) * (kept_in_smem<F, DM>() ? backward_stages<F, DM>() + 2 * dq_stage<F, DM>()
                                                           : std::max(kept_tiles<F, DM>(), 2 * dq_stage<F, DM>()));
}
template <typename F, int DM> constexpr size_t toeplitz_dc_smem() {
  return sizeof(typename F::Elem) * toeplitz_band_space<F, DM>() + sizeof(float) * 64 * 65;
}
template <typename F, int DM> constexpr size_t mma_smem_most() {
  return std::max({mma_forward_smem<F, DM>(), mma_dkv_smem<F, DM>(), mma_dq_smem<F, DM>()});
}

// Calls f(F{}, std::integral_constant<int, DM>{}) with F the tensor-core kernels' operand format
// for this call and DM its head-dim tile (16, 32, 64 or 128), and returns true; false where the
// SIMT kernels take the call: not float32, before sm_80, head dims past 128, or less shared memory
// than the kernels need (TF32 at DM = 128: about 99 KB).
template <typename Fn> bool with_mma_kernels(const Tensor& q, const SdpaShape& s, Fn&& f) {
  const int64_t dim = std::max(s.D, s.E);
  if (q.dtype() != DType::Float32 || compute_capability() < 80 || dim > 128) return false;
  const auto dims = [&](auto format) {
    using F = decltype(format);
    const auto take = [&](auto dm) {
      if (mma_smem_most<F, decltype(dm)::value>() > shared_memory_optin()) return false;
      f(format, dm);
      return true;
    };
    if (dim <= 16) return take(std::integral_constant<int, 16>{});
    if (dim <= 32) return take(std::integral_constant<int, 32>{});
    if (dim <= 64) return take(std::integral_constant<int, 64>{});
    return take(std::integral_constant<int, 128>{});
  };
  switch (matmul_precision()) {
    case MatmulPrecision::BF16:
      return dims(Bf16Format{});
    case MatmulPrecision::TF32:
      return dims(Tf32Format<1>{});
    default:
      return dims(Tf32Format<3>{});
  }
}

// The operands of a TF32 call: the float32 tensors as they are. 16-byte copies where every row of
// every operand starts on 16 bytes.
MmaOperands<float> tensor_operands(const SdpaArgs& a, const Tensor* dout) {
  MmaOperands<float> in;
  in.q = rows_in<float>(a.q);
  in.k = rows_in<float>(a.k);
  in.v = rows_in<float>(a.v);
  if (dout) in.dout = rows_in<float>(*dout);
  in.qk_dim = a.s.D;
  in.v_dim = a.s.E;
  const auto aligned = [](const HeadRows<const float>& x) {
    return reinterpret_cast<uintptr_t>(x.p) % 16 == 0 && x.batch % 4 == 0 && x.head % 4 == 0 && x.row % 4 == 0;
  };
  in.vec = a.s.D % 4 == 0 && a.s.E % 4 == 0 && aligned(in.q) && aligned(in.k) && aligned(in.v) &&
           (!dout || aligned(in.dout));
  return in;
}

// Rounds the call's operands to bf16 in the layout the bf16 kernels read (MmaOperands): q, k, v
// (and dout: the backward) as dense [B, H, rows, DM], in one launch.
template <int DM> struct StagedCopies {
  int64_t BH;  // (batch, head) pairs
  DeviceScratch<uint16_t> q, k, v, dout;
  MmaOperands<uint16_t> in;
  StagedCopies(const SdpaArgs& a, const Tensor* dout_t)
      : BH(a.q.size(0) * a.q.size(1)),
        q(BH * a.s.N * DM),
        k(BH * a.s.M * DM),
        v(BH * a.s.M * DM),
        dout(dout_t ? BH * a.s.N * DM : 0) {
    const int64_t H = a.q.size(1);
    const auto dense = [&](const uint16_t* p, int64_t rows) {
      return HeadRows<const uint16_t>{p, H * rows * DM, rows * DM, DM};
    };
    in.q = dense(q.p, a.s.N);
    in.k = dense(k.p, a.s.M);
    in.v = dense(v.p, a.s.M);
    in.qk_dim = in.v_dim = DM;
    StageJobs jobs{};
    jobs.heads = H;
    int count = 0;
    int64_t most = 0;
    const auto add = [&](const Tensor& src, int64_t rows, int64_t dim, uint16_t* dst) {
      jobs.job[count++] = {rows_in<float>(src), rows, dim, dst};
      most = std::max(most, rows * DM / 2);
    };
    add(a.q, a.s.N, a.s.D, q.p);
    add(a.k, a.s.M, a.s.D, k.p);
    add(a.v, a.s.M, a.s.E, v.p);
    if (dout_t) {
      in.dout = dense(dout.p, a.s.N);
      add(*dout_t, a.s.N, a.s.E, dout.p);
    }
    if (most == 0) return;
    // About as many blocks in all as one pass over everything would take.
    const unsigned per_head = std::max(1u, grid_for(BH * most) / static_cast<unsigned>(BH));
    stage_rows_kernel<DM>
        <<<dim3(per_head, static_cast<unsigned>(count), static_cast<unsigned>(BH)), kBlockSize, 0, stream()>>>(jobs);
    LINEA_KERNEL_LAUNCH_CHECK();
  }
};

// Lets `kernel` take `bytes` of dynamic shared memory past the 48 KB a kernel gets by default;
// once per process and kernel: the attribute stays with the kernel.
template <auto kernel> void allow_smem(size_t bytes) {
  if (bytes <= kMaxSmem) return;
  static const bool opted_in = [&] {
    LINEA_CUDA_CHECK(cudaFuncSetAttribute(reinterpret_cast<const void*>(kernel),
                                          cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
    return true;
  }();
  (void)opted_in;
}

template <typename F, int DM> void forward_mma(const SdpaArgs& a, const Tensor& out, const Tensor& lse) {
  static_assert(kept_in_smem<F, DM>() || kMmaRows * (DM + F::PAD) <= mma_forward_stage<F, DM>(),
                "the query tile fits in a stage");
  allow_smem<sdpa_forward_mma_kernel<F, DM, false>>(mma_forward_smem<F, DM>());
  allow_smem<sdpa_forward_mma_kernel<F, DM, true>>(mma_forward_smem<F, DM>());
  const auto launch = [&](const MmaOperands<typename F::Elem>& in) {
    over_key_ranges<float>(
        a, kMmaRows, a.s.E, out, lse, [&](int64_t split, unsigned ranges, HeadRows<float> o, float* l) {
          const dim3 grid(static_cast<unsigned>((a.s.N + kMmaRows - 1) / kMmaRows),
                          static_cast<unsigned>(a.q.size(0) * a.q.size(1)), ranges);
          const auto kernel = ranges > 1 ? sdpa_forward_mma_kernel<F, DM, true> : sdpa_forward_mma_kernel<F, DM, false>;
          kernel<<<grid, kMmaThreads, mma_forward_smem<F, DM>(), stream()>>>(
              in, a.pad.defined() ? cptr<uint8_t>(a.pad) : nullptr, a.bias.defined() ? cptr<float>(a.bias) : nullptr,
              static_cast<float>(a.scale), a.s, a.q.size(1), example_dropout<float>(a.drop), a.drop.draw_base, o, l,
              split, ToeplitzTiles{});
          LINEA_KERNEL_LAUNCH_CHECK();
        });
  };
  if constexpr (std::is_same_v<F, Bf16Format>)
    launch(StagedCopies<DM>(a, nullptr).in);  // the copies live to the end of the statement
  else
    launch(tensor_operands(a, nullptr));
}

template <typename F, int DM>
void backward_mma(const SdpaArgs& a, const Tensor& dout, const Tensor& lse, const Deltas<float>& delta,
                  const Tensor& dq, const Tensor& dk, const Tensor& dv, const Tensor& dbias) {
  allow_smem<sdpa_backward_dkv_mma_kernel<F, DM>>(mma_dkv_smem<F, DM>());
  allow_smem<sdpa_backward_dq_mma_kernel<F, DM, false>>(mma_dq_smem<F, DM>());
  allow_smem<sdpa_backward_dq_mma_kernel<F, DM, true>>(mma_dq_smem<F, DM>());
  const unsigned BH = static_cast<unsigned>(a.q.size(0) * a.q.size(1));
  const uint8_t* pad = a.pad.defined() ? cptr<uint8_t>(a.pad) : nullptr;
  const float* bias = a.bias.defined() ? cptr<float>(a.bias) : nullptr;
  const float scale = static_cast<float>(a.scale);
  const ExampleDropout<float> drop = example_dropout<float>(a.drop);
  const auto launch = [&](const MmaOperands<typename F::Elem>& in) {
    over_key_ranges<float>(
        a, kMmaRows, a.s.D, dq, Tensor(), [&](int64_t split, unsigned ranges, HeadRows<float> d, float*) {
          const auto kernel =
              ranges > 1 ? sdpa_backward_dq_mma_kernel<F, DM, true> : sdpa_backward_dq_mma_kernel<F, DM, false>;
          kernel<<<dim3(static_cast<unsigned>((a.s.N + kMmaRows - 1) / kMmaRows), BH, ranges), kMmaThreads,
                   mma_dq_smem<F, DM>(), stream()>>>(in, cptr<float>(lse), delta, pad, bias, scale, a.s, a.q.size(1),
                                                     drop, a.drop.draw_base, d, split, ToeplitzTiles{});
          LINEA_KERNEL_LAUNCH_CHECK();
        });
    // after dq's kernel: its deltas
    sdpa_backward_dkv_mma_kernel<F, DM><<<dim3(static_cast<unsigned>((a.s.M + kMmaKeys - 1) / kMmaKeys), BH),
                                          kMmaThreads, mma_dkv_smem<F, DM>(), stream()>>>(
        in, cptr<float>(lse), delta.rows, pad, bias, scale, a.s, a.q.size(1), drop, a.drop.draw_base,
        rows_out<float>(dk), rows_out<float>(dv), dbias.defined() ? ptr<float>(dbias) : nullptr, ToeplitzTiles{});
    LINEA_KERNEL_LAUNCH_CHECK();
  };
  if constexpr (std::is_same_v<F, Bf16Format>)
    launch(StagedCopies<DM>(a, &dout).in);
  else
    launch(tensor_operands(a, &dout));
}

// The Toeplitz forward (ToeplitzTiles) of y [B, H, N, E]: a.v's first E - 1 columns by the tensor
// cores, its last as the row sums' key weights.
template <typename F, int DM> void toeplitz_forward_tiles(const SdpaArgs& a, const ToeplitzTiles& tz, const Tensor& y) {
  const auto kernel = sdpa_forward_mma_kernel<F, DM, false, true>;
  allow_smem<sdpa_forward_mma_kernel<F, DM, false, true>>(mma_forward_smem<F, DM>());
  const auto launch = [&](const MmaOperands<typename F::Elem>& in) {
    const dim3 grid(static_cast<unsigned>((a.s.N + kMmaRows - 1) / kMmaRows),
                    static_cast<unsigned>(a.q.size(0) * a.q.size(1)));
    kernel<<<grid, kMmaThreads, mma_forward_smem<F, DM>(), stream()>>>(in, nullptr, nullptr, 1.f, a.s, a.q.size(1),
                                                                       ExampleDropout<float>{}, nullptr,
                                                                       rows_out<float>(y), nullptr, 0, tz);
    LINEA_KERNEL_LAUNCH_CHECK();
  };
  if constexpr (std::is_same_v<F, Bf16Format>)
    launch(StagedCopies<DM>(a, nullptr).in);
  else
    launch(tensor_operands(a, nullptr));
}

// r [B H, N] = column `col` of each head's N rows of x (grid y: the heads): the Toeplitz
// backward's dy's last column, contiguous as the kernels read delta.
__global__ void head_column_kernel(HeadRows<const float> x, int64_t heads, int64_t N, int64_t col, float* r) {
  const float* xb = x.at(blockIdx.y, heads);
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < N;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    r[blockIdx.y * N + i] = xb[i * x.row + col];
}

// The Toeplitz backward's dphi_q, dphi_k and dv (ToeplitzTiles; r: dy's last column).
template <typename F, int DM>
void toeplitz_backward_tiles(const SdpaArgs& a, const ToeplitzTiles& tz, const Tensor& dy, float* r, const Tensor& dc,
                             const Tensor& dpq, const Tensor& dpk, const Tensor& dv) {
  const auto dkv = sdpa_backward_dkv_mma_kernel<F, DM, true>;
  const auto dq = sdpa_backward_dq_mma_kernel<F, DM, false, true>;
  const auto bands = toeplitz_dc_mma_kernel<F, DM>;
  allow_smem<sdpa_backward_dkv_mma_kernel<F, DM, true>>(mma_dkv_smem<F, DM>());
  allow_smem<sdpa_backward_dq_mma_kernel<F, DM, false, true>>(mma_dq_smem<F, DM>());
  allow_smem<toeplitz_dc_mma_kernel<F, DM>>(toeplitz_dc_smem<F, DM>());
  const unsigned BH = static_cast<unsigned>(a.q.size(0) * a.q.size(1));
  const int64_t heads = a.q.size(1);
  const auto launch = [&](const MmaOperands<typename F::Elem>& in) {
    dkv<<<dim3(static_cast<unsigned>((a.s.M + kMmaKeys - 1) / kMmaKeys), BH), kMmaThreads, mma_dkv_smem<F, DM>(),
          stream()>>>(in, r, r, nullptr, nullptr, 1.f, a.s, heads, ExampleDropout<float>{}, nullptr,
                      rows_out<float>(dpk), rows_out<float>(dv), nullptr, tz);
    LINEA_KERNEL_LAUNCH_CHECK();
    dq<<<dim3(static_cast<unsigned>((a.s.N + kMmaRows - 1) / kMmaRows), BH), kMmaThreads, mma_dq_smem<F, DM>(),
         stream()>>>(in, r, Deltas<float>::given(r), nullptr, nullptr, 1.f, a.s, heads, ExampleDropout<float>{},
                     nullptr, rows_out<float>(dpq), 0, tz);
    LINEA_KERNEL_LAUNCH_CHECK();
    const int64_t L = a.s.N + a.s.M - 1;
    bands<<<dim3(static_cast<unsigned>((L + 63) / 64), static_cast<unsigned>(tz.c_rows)), kMmaThreads,
            toeplitz_dc_smem<F, DM>(), stream()>>>(in, r, a.s, heads, a.q.size(0), tz, ptr<float>(dc));
    LINEA_KERNEL_LAUNCH_CHECK();
  };
  if constexpr (std::is_same_v<F, Bf16Format>)
    launch(StagedCopies<DM>(a, &dy).in);
  else
    launch(tensor_operands(a, &dy));
}

template <typename T, int DM, int B>
void backward_tiles(const SdpaArgs& a, const Tensor& dout, const Tensor& lse, const Deltas<T>& delta, const Tensor& dq,
                    const Tensor& dk, const Tensor& dv, const Tensor& dbias) {
  const T* bias = a.bias.defined() ? cptr<T>(a.bias) : nullptr;
  const unsigned BH = static_cast<unsigned>(a.q.size(0) * a.q.size(1));
  const uint8_t* pad = a.pad.defined() ? cptr<uint8_t>(a.pad) : nullptr;
  const T scale = static_cast<T>(a.scale);
  const ExampleDropout<T> drop = example_dropout<T>(a.drop);
  over_key_ranges<T>(a, B, a.s.D, dq, Tensor(), [&](int64_t split, unsigned ranges, HeadRows<T> d, T*) {
    const auto kernel = ranges > 1 ? sdpa_backward_dq_kernel<T, DM, B, true> : sdpa_backward_dq_kernel<T, DM, B, false>;
    kernel<<<dim3(static_cast<unsigned>((a.s.N + B - 1) / B), BH, ranges), kThreads, backward_smem<T, DM, B>(),
             stream()>>>(rows_in<T>(a.q), rows_in<T>(a.k), rows_in<T>(a.v), rows_in<T>(dout), cptr<T>(lse), delta, pad,
                         bias, scale, a.s, a.q.size(1), drop, a.drop.draw_base, d, split);
    LINEA_KERNEL_LAUNCH_CHECK();
  });
  // after dq's kernel: its deltas
  sdpa_backward_dkv_kernel<T, DM, B>
      <<<dim3(static_cast<unsigned>((a.s.M + B - 1) / B), BH), kThreads, backward_smem<T, DM, B>(), stream()>>>(
          rows_in<T>(a.q), rows_in<T>(a.k), rows_in<T>(a.v), rows_in<T>(dout), cptr<T>(lse), delta.rows, pad, bias,
          scale, a.s, a.q.size(1), drop, a.drop.draw_base, rows_out<T>(dk), rows_out<T>(dv),
          dbias.defined() ? ptr<T>(dbias) : nullptr);
  LINEA_KERNEL_LAUNCH_CHECK();
}

// Calls f(Tiles<DM, B>{}) with DM the head dims rounded up to 16, 32, 64 or 128 and B = 32 or 16,
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
  if (dim <= 16) return with_rows<T, 16>(f);  // the ViT's heads
  if (dim <= 32) return with_rows<T, 32>(f);
  if (dim <= 64) return with_rows<T, 64>(f);
  if constexpr (backward_smem<T, 128, 16>() <= kMaxSmem)
    if (dim <= 128) return with_rows<T, 128>(f);
  LINEA_FAIL(op, ": the CUDA kernel takes head dims up to ", sizeof(T) == 4 ? 128 : 64, " in ",
             sizeof(T) == 4 ? "float32" : "float64", ", got q/k ", s.D, " and v ", s.E);
}

SdpaShape sdpa_shape(const Tensor& q, const Tensor& k, const Tensor& v, bool causal, int64_t offset,
                     const Tensor& pad) {
  LINEA_CHECK(q.size(0) * q.size(1) <= 65535, "sdpa: B * H = ", q.size(0) * q.size(1),
              " exceeds the 65,535 (batch, head) pairs of one CUDA launch");
  LINEA_CHECK(!pad.defined() || pad.size(1) <= 1 || pad.stride(1) == 1,
              "sdpa: the CUDA kernel reads key padding rows of contiguous values, got strides ",
              shape_str(pad.strides()));
  return {q.size(2), k.size(2), q.size(3), v.size(3), offset, causal, pad.defined() ? pad.stride(0) : 0};
}

}  // namespace

void sdpa_forward(const Tensor& q, const Tensor& k, const Tensor& v, double scale, bool causal, int64_t offset,
                  const Tensor& pad, const Tensor& bias, const FoldedDropout& drop, const Tensor& out,
                  const Tensor& lse, const Tensor& probs) {
  LINEA_CHECK(!probs.defined(), "sdpa: the CUDA kernel keeps no probabilities (its backward recomputes them)");
  check_head_rows("sdpa", {&q, &k, &v, &out});
  const SdpaArgs a{q, k, v, pad, bias, scale, sdpa_shape(q, k, v, causal, offset, pad), drop};
  if (q.size(0) * q.size(1) == 0 || a.s.N == 0) return;
  if (with_mma_kernels(q, a.s,
                       [&](auto format, auto dm) { forward_mma<decltype(format), decltype(dm)::value>(a, out, lse); }))
    return;
  LINEA_DISPATCH_FLOAT(q.dtype(), "sdpa", [&] {
    with_tiles<scalar_t>(a.s, "sdpa",
                         [&](auto t) { forward_tiles<scalar_t, decltype(t)::DM, decltype(t)::B>(a, out, lse); });
  });
}

void sdpa_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                   const Tensor& probs, const Tensor& dout, const Tensor& dlse, double scale, bool causal,
                   int64_t offset, const Tensor& pad, const Tensor& bias, const FoldedDropout& drop, const Tensor& dq,
                   const Tensor& dk, const Tensor& dv, const Tensor& dbias) {
  LINEA_CHECK(!probs.defined(), "sdpa_backward: the CUDA kernel recomputes the probabilities; got kept ones");
  check_head_rows("sdpa_backward", {&q, &k, &v, &out, &dout, &dq, &dk, &dv});
  const SdpaArgs a{q, k, v, pad, bias, scale, sdpa_shape(q, k, v, causal, offset, pad), drop};
  const int64_t rows = q.size(0) * q.size(1) * a.s.N;
  if (q.size(0) * q.size(1) == 0) return;
  if (a.s.N == 0 || a.s.M == 0) {  // nothing to sum: zero gradients
    for (const Tensor* t : {&dq, &dk, &dv, &dbias})
      if (t->defined()) fill(*t, 0.0);
    return;
  }
  LINEA_DISPATCH_FLOAT(q.dtype(), "sdpa_backward", [&] {
    using T = scalar_t;
    DeviceScratch<T> delta_rows(rows);  // [B, H, N]
    const Deltas<T> delta{delta_rows.p, rows_in<T>(dout), rows_in<T>(out), dlse.defined() ? cptr<T>(dlse) : nullptr,
                          a.s.E};
    if constexpr (std::is_same_v<T, float>)
      if (with_mma_kernels(q, a.s, [&](auto format, auto dm) {
            backward_mma<decltype(format), decltype(dm)::value>(a, dout, lse, delta, dq, dk, dv, dbias);
          }))
        return;
    with_tiles<T>(a.s, "sdpa_backward", [&](auto t) {
      backward_tiles<T, decltype(t)::DM, decltype(t)::B>(a, dout, lse, delta, dq, dk, dv, dbias);
    });
  });
}

namespace {
// The Toeplitz tiles' call (ToeplitzTiles): phi_q, phi_k as q, k; v's first E - 1 columns as v.
struct ToeplitzCall {
  Tensor none;
  FoldedDropout off;
  SdpaArgs a;
  ToeplitzTiles tz;
  ToeplitzCall(const Tensor& c, const Tensor& phi_q, const Tensor& phi_k, const Tensor& v)
      : a{phi_q, phi_k, v, none, none, 1.0, {phi_q.size(2), phi_k.size(2), phi_q.size(3), v.size(3) - 1, 0, false, 0},
          off} {
    const int64_t E = v.size(3);
    tz.c = cptr<float>(c);
    tz.c_rows = c.dim() == 3 ? phi_q.size(0) * phi_q.size(1) : phi_q.size(1);
    const HeadRows<const float> vr = rows_in<float>(v);
    tz.w = {vr.p + E - 1, vr.batch, vr.head, vr.row};
  }
  // Whether the tensor-core kernels take it, f(format, DM) if so.
  template <typename Fn> bool with_kernels(Fn&& f) const {
    const int64_t BH = a.q.size(0) * a.q.size(1);
    if (a.v.dtype() != DType::Float32 || a.s.E < 1 || BH == 0 || BH > 65535 || a.s.N == 0) return false;
    return with_mma_kernels(a.q, a.s, f);
  }
};
// The last column of the heads of x [B, H, L, E] as HeadRows.
HeadRows<float> last_column(const Tensor& x) {
  const HeadRows<float> r = rows_out<float>(x);
  return {r.p + x.size(3) - 1, r.batch, r.head, r.row};
}
}  // namespace

bool detail::toeplitz_forward_mma(const Tensor& c, const Tensor& phi_q, const Tensor& phi_k, const Tensor& v,
                                  const Tensor& y) {
  ToeplitzCall call(c, phi_q, phi_k, v);
  call.tz.den = last_column(y);
  return call.with_kernels(
      [&](auto format, auto dm) { toeplitz_forward_tiles<decltype(format), decltype(dm)::value>(call.a, call.tz, y); });
}

bool detail::toeplitz_backward_mma(const Tensor& c, const Tensor& phi_q, const Tensor& phi_k, const Tensor& v,
                                   const Tensor& dy, const Tensor& dc, const Tensor& dphi_q, const Tensor& dphi_k,
                                   const Tensor& dv) {
  ToeplitzCall call(c, phi_q, phi_k, v);
  call.tz.dw = last_column(dv);
  bool fits = true;  // dc's band tile beside the dq kernel's stages: 16.6 KB more shared memory
  const bool taken = call.with_kernels([&](auto format, auto dm) {
    if (toeplitz_dc_smem<decltype(format), decltype(dm)::value>() > shared_memory_optin()) {
      fits = false;
      return;
    }
    const int64_t BH = phi_q.size(0) * phi_q.size(1), N = phi_q.size(2);
    DeviceScratch<float> r(BH * N);
    head_column_kernel<<<dim3(std::max(1u, grid_for(N)), static_cast<unsigned>(BH)), kBlockSize, 0, stream()>>>(
        rows_in<float>(dy), phi_q.size(1), N, dy.size(3) - 1, r.p);
    LINEA_KERNEL_LAUNCH_CHECK();
    toeplitz_backward_tiles<decltype(format), decltype(dm)::value>(call.a, call.tz, dy, r.p, dc, dphi_q, dphi_k, dv);
  });
  return taken && fits;
}

}  // namespace linea::cuda
