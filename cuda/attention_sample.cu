// Keys drawn from softmax attention on CUDA (core/kernels.h sdpa_sample; the CPU twin in
// core/cpu/attention.cpp): RA's draw, without its [N, M] probabilities and their running sums in
// memory. A block owns 64 query rows of one (b, h) and walks the keys in tiles of 64, each tile's
// scores computed into shared memory, the head dims 32 at a time (float on sm_80+: the tensor
// cores in 3xTF32; else a thread 4 rows by 4 keys):
//   pass 1  each row's max and its sum of exp(s - max), online (a warp per row: butterflies)
//   pass 2  the running sums E_m in key order (the warp's scan of the tile, on the row's sum so
//           far) and, for up to 32 draws at once (lane s keeps draw s), each draw's count of
//           E_m <= u_s total: a whole tile's keys or none, by one compare, unless u_s total falls
//           within the tile's sums (then by ballots); the pass again for each further 32 draws
// Every sum has a fixed order: the same keys every run.
#include "core/kernels.h"
#include "cuda/common.cuh"
#include "cuda/context.h"
#include "cuda/mma.cuh"

namespace linea::cuda {

using namespace detail;

namespace {

constexpr int kRows = 64, kKeys = 64, kChunk = 32, kThreads = 256;
constexpr int kWarps = kThreads / 32, kRowsPerWarp = kRows / kWarps;
// The q and k chunks [64][pitch] each: 33 for the SIMT products (16 keys of a column in 16
// banks), 36 for the tensor cores' fragments (lane (g, t) reads row g, column t: bank 4 g + t, 32
// banks for 32 lanes).
constexpr int pitch(bool mma) { return mma ? kChunk + 4 : kChunk + 1; }
constexpr int kScorePitch = kKeys + 1;  // the scores [64][65], over the chunks
constexpr int smem_elems(bool mma) { return 2 * kRows * pitch(mma); }  // the chunks, or the scores over them
static_assert(smem_elems(false) >= kRows * kScorePitch, "the scores fit over the chunks");
constexpr unsigned kFull = 0xffffffffu;
// Blocks an SM keeps: 2 in float (128 registers a thread, no spill, so one block's tile loads
// overlap the other's products), 1 in double (218 registers).
template <typename T> constexpr int kMinBlocks = sizeof(T) == 4 ? 2 : 1;

struct SampleShape {
  int64_t BH, H, N, M, D, S;
};

// acc += the products of this chunk's q rows and keys: a thread 4 rows (4 ty + i) by 4 keys
// (tx + 16 j), in T's own arithmetic.
template <typename T> __device__ void chunk_products(const T* qs, const T* ks, T (&acc)[4][4]) {
  const int ty = threadIdx.x / 16, tx = threadIdx.x % 16;
  constexpr int P = pitch(false);
#pragma unroll 4
  for (int c = 0; c < kChunk; ++c) {
    T a[4], b[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) a[i] = qs[(4 * ty + i) * P + c];
#pragma unroll
    for (int j = 0; j < 4; ++j) b[j] = ks[(tx + 16 * j) * P + c];
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
      for (int j = 0; j < 4; ++j) acc[i][j] += a[i] * b[j];
  }
}

// The same on the tensor cores (float, sm_80+; cuda/mma.cuh): warp w takes rows 16 (w % 4).. and
// keys 32 (w / 4).., four m16n8 tiles, by m16n8k8 in 3xTF32 (a product's relative error about
// 2^-21, as the softmax kernels' default float32). acc[j] is key tile j's accumulator fragment.
__device__ void chunk_products_mma(const float* qs, const float* ks, float (&acc)[4][4]) {
  const int warp = threadIdx.x / 32, g = threadIdx.x % 32 / 4, t = threadIdx.x % 4;
  constexpr int P = pitch(true);
  const float* qa = qs + (16 * (warp % 4) + g) * P + t;  // A = q rows: a[0] = A[g][t] ...
  const float* kb = ks + (32 * (warp / 4) + g) * P + t;  // B = k^T: b[0] = B[t][g] = k[g][t]
#pragma unroll
  for (int k0 = 0; k0 < kChunk; k0 += 8) {
    const uint32_t a[4] = {float_bits(qa[k0]), float_bits(qa[8 * P + k0]), float_bits(qa[k0 + 4]),
                           float_bits(qa[8 * P + k0 + 4])};
    uint32_t ab[4], as[4];
    split_tf32(a, ab, as);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const uint32_t b[2] = {float_bits(kb[8 * j * P + k0]), float_bits(kb[8 * j * P + k0 + 4])};
      uint32_t bb[2], bs[2];
      split_tf32(b, bb, bs);
      mma_tf32x3_16x8x8(acc[j], ab, as, bb, bs);
    }
  }
}

// The scaled scores of query rows [n0, n0 + 64) and keys [m0, m0 + 64) of one (b, h) into
// sc [64][65] (shared memory, over the operand chunks); -inf for padded keys and keys past M.
template <typename T, bool MMA>
__device__ void score_tile(const T* qb, const T* kb, const uint8_t* padb, const SampleShape& sh, int64_t n0, int64_t m0,
                           T scale, T* smem) {
  constexpr int P = pitch(MMA);
  T* qs = smem;
  T* ks = smem + kRows * P;
  const int tid = threadIdx.x;
  T acc[4][4] = {};
  for (int64_t d0 = 0; d0 < sh.D; d0 += kChunk) {
    __syncthreads();  // the last chunk (or the last tile's scores) read
    for (int i = tid; i < kRows * kChunk; i += kThreads) {
      const int r = i / kChunk, c = i % kChunk;
      const int64_t d = d0 + c;
      qs[r * P + c] = n0 + r < sh.N && d < sh.D ? qb[(n0 + r) * sh.D + d] : T(0);
      ks[r * P + c] = m0 + r < sh.M && d < sh.D ? kb[(m0 + r) * sh.D + d] : T(0);
    }
    __syncthreads();
    if constexpr (MMA)
      chunk_products_mma(qs, ks, acc);
    else
      chunk_products(qs, ks, acc);
  }
  __syncthreads();
  T* sc = smem;
  const auto put = [&](int row, int key, T value) {
    const int64_t m = m0 + key;
    const bool hidden = m >= sh.M || (padb && padb[m]);
    sc[row * kScorePitch + key] = hidden ? neg_inf<T>() : scale * value;
  };
  if constexpr (MMA) {  // the accumulator fragments: d[0], d[1] = D[g][2t, 2t + 1], d[2], d[3] = row g + 8
    const int warp = tid / 32, row = 16 * (warp % 4) + tid % 32 / 4, key = 32 * (warp / 4) + 2 * (tid % 4);
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int i = 0; i < 4; ++i) put(row + 8 * (i / 2), key + 8 * j + i % 2, acc[j][i]);
  } else {
    const int ty = tid / 16, tx = tid % 16;
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int i = 0; i < 4; ++i) put(4 * ty + i, tx + 16 * j, acc[i][j]);
  }
  __syncthreads();
}

// Inclusive sum over lanes 0..lane, always in the same order.
template <typename T> __device__ __forceinline__ T warp_scan(T x, int lane) {
#pragma unroll
  for (int o = 1; o < 32; o *= 2) {
    const T y = __shfl_up_sync(kFull, x, o);
    if (lane >= o) x += y;
  }
  return x;
}

// grid.x: (query block, (b, h)), the query blocks of a head together.
template <typename T, bool MMA>
__global__ void __launch_bounds__(kThreads, kMinBlocks<T>)
    sample_kernel(const T* q, const T* k, const uint8_t* pad, const T* u, SampleShape sh, T scale, int64_t* out) {
  T* smem = shared_mem<T>();
  const int64_t blocks = (sh.N + kRows - 1) / kRows;
  const int64_t bh = blockIdx.x / blocks, n0 = blockIdx.x % blocks * kRows;
  const T* qb = q + bh * sh.N * sh.D;
  const T* kb = k + bh * sh.M * sh.D;
  const uint8_t* padb = pad ? pad + bh / sh.H * sh.M : nullptr;
  const int lane = threadIdx.x % 32, r0 = threadIdx.x / 32 * kRowsPerWarp;  // the warp's rows r0 + rr
  const T* sc = smem;

  // Pass 1: each row's max mx and sum of exp(s - mx), rescaled as the max grows.
  T mx[kRowsPerWarp], total[kRowsPerWarp];
#pragma unroll
  for (int rr = 0; rr < kRowsPerWarp; ++rr) {
    mx[rr] = neg_inf<T>();
    total[rr] = 0;
  }
  for (int64_t m0 = 0; m0 < sh.M; m0 += kKeys) {
    score_tile<T, MMA>(qb, kb, padb, sh, n0, m0, scale, smem);
#pragma unroll
    for (int rr = 0; rr < kRowsPerWarp; ++rr) {
      const T a = sc[(r0 + rr) * kScorePitch + lane], b = sc[(r0 + rr) * kScorePitch + lane + 32];
      const T top = warp_max(a > b ? a : b), now = top > mx[rr] ? top : mx[rr];
      if (now == neg_inf<T>()) continue;  // nothing visible yet (the same on every lane)
      const T part = warp_sum(d_exp(a - now) + d_exp(b - now));
      total[rr] = total[rr] * d_exp(mx[rr] - now) + part;
      mx[rr] = now;
    }
  }

  // Pass 2, draws [s0, s0 + 32) at a time (lane s - s0 keeps draw s): each draw's count of the keys
  // whose running sum is at most x = u_s total, and each row's last key with e_m > 0. A tile's
  // running sums lie in [base, top]: a draw with x < base counts none of its keys, one with x >= top
  // all 64 (keys past M too: `last` clips them), and only the draws in between, about S 64 / M a
  // tile, count by ballots. (top is a max: the scan's sums need not grow in their last bits.)
  for (int64_t s0 = 0; s0 < sh.S; s0 += 32) {
    const int64_t s = s0 + lane;
    T x[kRowsPerWarp], base[kRowsPerWarp];
    int count[kRowsPerWarp], last[kRowsPerWarp];  // M < 2^31 (checked)
#pragma unroll
    for (int rr = 0; rr < kRowsPerWarp; ++rr) {
      const int64_t n = n0 + r0 + rr;
      x[rr] = n < sh.N && s < sh.S ? u[((bh * sh.N) + n) * sh.S + s] * total[rr] : T(-1);  // -1: no draw
      base[rr] = 0;
      count[rr] = 0;
      last[rr] = 0;
    }
    for (int64_t m0 = 0; m0 < sh.M; m0 += kKeys) {
      score_tile<T, MMA>(qb, kb, padb, sh, n0, m0, scale, smem);
#pragma unroll
      for (int rr = 0; rr < kRowsPerWarp; ++rr) {
        const bool none = mx[rr] == neg_inf<T>();
        const T e0 = none ? T(0) : d_exp(sc[(r0 + rr) * kScorePitch + lane] - mx[rr]);
        const T e1 = none ? T(0) : d_exp(sc[(r0 + rr) * kScorePitch + lane + 32] - mx[rr]);
        const T below = base[rr];
        const T run0 = below + warp_scan(e0, lane);
        const T mid = __shfl_sync(kFull, run0, 31);
        const T run1 = mid + warp_scan(e1, lane);
        base[rr] = __shfl_sync(kFull, run1, 31);
        const T top = warp_max(run0 > run1 ? run0 : run1);
        const unsigned seen0 = __ballot_sync(kFull, e0 > T(0)), seen1 = __ballot_sync(kFull, e1 > T(0));
        if (seen1)
          last[rr] = static_cast<int>(m0) + 63 - __clz(seen1);
        else if (seen0)
          last[rr] = static_cast<int>(m0) + 31 - __clz(seen0);
        if (x[rr] >= top) count[rr] += kKeys;
        for (unsigned todo = __ballot_sync(kFull, x[rr] >= below && x[rr] < top); todo; todo &= todo - 1) {
          const int j = __ffs(static_cast<int>(todo)) - 1;
          const T xj = __shfl_sync(kFull, x[rr], j);
          const int c = __popc(__ballot_sync(kFull, run0 <= xj)) + __popc(__ballot_sync(kFull, run1 <= xj));
          if (lane == j) count[rr] += c;
        }
      }
    }
#pragma unroll
    for (int rr = 0; rr < kRowsPerWarp; ++rr) {
      const int64_t n = n0 + r0 + rr;
      if (n < sh.N && s < sh.S) out[((bh * sh.N) + n) * sh.S + s] = min(count[rr], last[rr]);
    }
  }
}

template <typename T, bool MMA>
void launch_sample(int64_t blocks, const Tensor& q, const Tensor& k, const Tensor& pad, const Tensor& u,
                   const SampleShape& sh, double scale, const Tensor& out) {
  sample_kernel<T, MMA><<<static_cast<unsigned>(blocks), kThreads, smem_elems(MMA) * sizeof(T), stream()>>>(
      cptr<T>(q), cptr<T>(k), pad.defined() ? cptr<uint8_t>(pad) : nullptr, cptr<T>(u), sh, static_cast<T>(scale),
      ptr<int64_t>(out));
  LINEA_KERNEL_LAUNCH_CHECK();
}

}  // namespace

void sdpa_sample(const Tensor& q, const Tensor& k, const Tensor& pad, const Tensor& u, double scale,
                 const Tensor& out) {
  const SampleShape sh{q.size(0) * q.size(1), q.size(1), q.size(2), k.size(2), q.size(3), u.size(3)};
  const int64_t blocks = (sh.N + kRows - 1) / kRows * sh.BH;
  LINEA_CHECK(blocks <= INT32_MAX && sh.M < INT32_MAX, "sdpa_sample: ", sh.N, " queries of ", sh.BH, " heads over ",
              sh.M, " keys is more than one launch takes");
  if (q.dtype() == DType::Float32 && compute_capability() >= 80)
    return launch_sample<float, true>(blocks, q, k, pad, u, sh, scale, out);
  LINEA_DISPATCH_FLOAT(q.dtype(), "sdpa_sample",
                       [&] { launch_sample<scalar_t, false>(blocks, q, k, pad, u, sh, scale, out); });
}

}  // namespace linea::cuda
