// Keys drawn from softmax attention on CUDA (core/kernels.h sdpa_sample; the CPU twin in
// core/cpu/attention.cpp): RA's draw, without its [N, M] probabilities and their running sums in
// memory. A block owns 64 query rows of one (b, h) and walks the keys in tiles of 64, each tile's
// scores computed into shared memory (a thread 4 rows by 4 keys, the head dims 32 at a time):
//   pass 1  each row's max and its sum of exp(s - max), online (a warp per row: butterflies)
//   pass 2  the running sums E_m in key order (the warp's scan of the tile, on the row's sum so
//           far) and, for up to 32 draws at once (lane s keeps draw s), each draw's count of
//           E_m <= u_s total: a whole tile's keys or none, by one compare, unless u_s total falls
//           within the tile's sums (then by ballots); the pass again for each further 32 draws
// Every sum has a fixed order: the same keys every run.
#include "core/kernels.h"
#include "cuda/common.cuh"

namespace linea::cuda {

using namespace detail;

namespace {

constexpr int kRows = 64, kKeys = 64, kChunk = 32, kThreads = 256;
constexpr int kWarps = kThreads / 32, kRowsPerWarp = kRows / kWarps;
constexpr int kPitch = kChunk + 1;      // the q and k chunks: [64][33] each
constexpr int kScorePitch = kKeys + 1;  // the scores [64][65], over the chunks
constexpr int kSmemElems = 2 * kRows * kPitch;  // the chunks, or the scores over them
static_assert(kSmemElems >= kRows * kScorePitch, "the scores fit over the chunks");
constexpr unsigned kFull = 0xffffffffu;
// Blocks an SM keeps: 2 in float (128 registers a thread, no spill, so one block's tile loads
// overlap the other's products), 1 in double (216 registers).
template <typename T> constexpr int kMinBlocks = sizeof(T) == 4 ? 2 : 1;

struct SampleShape {
  int64_t BH, H, N, M, D, S;
};

// The scaled scores of query rows [n0, n0 + 64) and keys [m0, m0 + 64) of one (b, h) into
// sc [64][65] (shared memory, over the operand chunks); -inf for padded keys and keys past M.
template <typename T>
__device__ void score_tile(const T* qb, const T* kb, const uint8_t* padb, const SampleShape& sh, int64_t n0, int64_t m0,
                           T scale, T* smem) {
  T* qs = smem;
  T* ks = smem + kRows * kPitch;
  const int tid = threadIdx.x, ty = tid / 16, tx = tid % 16;  // rows 4 ty + i, keys tx + 16 j
  T acc[4][4] = {};
  for (int64_t d0 = 0; d0 < sh.D; d0 += kChunk) {
    __syncthreads();  // the last chunk (or the last tile's scores) read
    for (int i = tid; i < kRows * kChunk; i += kThreads) {
      const int r = i / kChunk, c = i % kChunk;
      const int64_t d = d0 + c;
      qs[r * kPitch + c] = n0 + r < sh.N && d < sh.D ? qb[(n0 + r) * sh.D + d] : T(0);
      ks[r * kPitch + c] = m0 + r < sh.M && d < sh.D ? kb[(m0 + r) * sh.D + d] : T(0);
    }
    __syncthreads();
#pragma unroll 4
    for (int c = 0; c < kChunk; ++c) {
      T a[4], b[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) a[i] = qs[(4 * ty + i) * kPitch + c];
#pragma unroll
      for (int j = 0; j < 4; ++j) b[j] = ks[(tx + 16 * j) * kPitch + c];
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[i][j] += a[i] * b[j];
    }
  }
  __syncthreads();
  T* sc = smem;
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const int64_t m = m0 + tx + 16 * j;
    const bool hidden = m >= sh.M || (padb && padb[m]);
#pragma unroll
    for (int i = 0; i < 4; ++i)
      sc[(4 * ty + i) * kScorePitch + tx + 16 * j] = hidden ? neg_inf<T>() : scale * acc[i][j];
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
template <typename T>
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
    score_tile(qb, kb, padb, sh, n0, m0, scale, smem);
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
      score_tile(qb, kb, padb, sh, n0, m0, scale, smem);
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

}  // namespace

void sdpa_sample(const Tensor& q, const Tensor& k, const Tensor& pad, const Tensor& u, double scale,
                 const Tensor& out) {
  const SampleShape sh{q.size(0) * q.size(1), q.size(1), q.size(2), k.size(2), q.size(3), u.size(3)};
  const int64_t blocks = (sh.N + kRows - 1) / kRows * sh.BH;
  LINEA_CHECK(blocks <= INT32_MAX && sh.M < INT32_MAX, "sdpa_sample: ", sh.N, " queries of ", sh.BH, " heads over ",
              sh.M, " keys is more than one launch takes");
  LINEA_DISPATCH_FLOAT(q.dtype(), "sdpa_sample", [&] {
    using T = scalar_t;
    sample_kernel<T><<<static_cast<unsigned>(blocks), kThreads, kSmemElems * sizeof(T), stream()>>>(
        cptr<T>(q), cptr<T>(k), pad.defined() ? cptr<uint8_t>(pad) : nullptr, cptr<T>(u), sh, static_cast<T>(scale),
        ptr<int64_t>(out));
    LINEA_KERNEL_LAUNCH_CHECK();
  });
}

}  // namespace linea::cuda
