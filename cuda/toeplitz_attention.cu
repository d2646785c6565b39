// Toeplitz-modulated linear attention on CUDA (core/kernels.h; nprf_rpe's FFT path; the CPU
// twin in core/cpu/toeplitz_attention.cpp has the derivation):
//   y_n = sum_s phi_q_ns sum_m c_{m-n} phi_k_ms v_m
// With g the circulant embedding of c over n >= N + M - 1 (g[t mod n] = c_t), the inner sum is
// a cross-correlation, IDFT(X conj(G)) for x = phi_k[:, s] v[:, e]; its adjoint (to x) the
// convolution IDFT(P G); the gradient of g the cross-correlation IDFT(conj(P) X).
//
// The work is items (b, h, e, s), one real transform of length n each (batched cuFFT R2C / C2R),
// taken a chunk of whole groups (b, h, e) at a time so that memory stays O(chunk), bounded by
// chunk_bytes() rather than the O(B H E S n) of every channel's spectrum at once. Sums over s and
// over the channels e run in kernels in a fixed order (chunk by chunk, item by item): no
// atomics, the same bits every run. fft_len == 0 takes the direct path (below) instead.
#include <algorithm>
#include <cstdlib>

#include "core/kernels.h"
#include "cuda/common.cuh"

namespace linea::cuda {

using namespace detail;

namespace {

// Scratch a chunk may use per buffer (items x n values): 64 MiB, or LINEA_TOEPLITZ_CHUNK_BYTES
// (read at every call; the parity tests make chunks of one and two groups with it).
int64_t chunk_bytes() {
  const char* s = std::getenv("LINEA_TOEPLITZ_CHUNK_BYTES");
  return s && std::atoll(s) > 0 ? std::atoll(s) : int64_t(64) << 20;
}

struct ToeplitzDims {
  int64_t B, H, N, M, S, E, n;
  bool c_per_batch;  // c [B*H, L] rather than [H, L]
  __host__ __device__ int64_t nf() const { return n / 2 + 1; }
  __host__ __device__ int64_t L() const { return N + M - 1; }
  __host__ __device__ int64_t row_of(int64_t bh) const { return c_per_batch ? bh : bh % H; }
  __host__ __device__ int64_t rows() const { return c_per_batch ? B * H : H; }
};

// A chunk: groups [g0, g1) of (bh, e) = (g / E, g % E), each with its S items (s fastest).
struct Chunk {
  int64_t g0, g1;
  __host__ __device__ int64_t items(const ToeplitzDims& d) const { return (g1 - g0) * d.S; }
  // The heads bh the chunk touches, [head0, head1), and head bh's groups in it, [first, last).
  __host__ __device__ int64_t head0(const ToeplitzDims& d) const { return g0 / d.E; }
  __host__ __device__ int64_t head1(const ToeplitzDims& d) const { return (g1 - 1) / d.E + 1; }
  __device__ int64_t first(const ToeplitzDims& d, int64_t bh) const { return bh * d.E > g0 ? bh * d.E : g0; }
  __device__ int64_t last(const ToeplitzDims& d, int64_t bh) const { return (bh + 1) * d.E < g1 ? (bh + 1) * d.E : g1; }
};

// Groups per chunk: as many as fit in chunk_bytes() per buffer, at least one.
template <typename T> int64_t groups_per_chunk(const ToeplitzDims& d) {
  const int64_t per_group = d.S * 2 * d.nf() * static_cast<int64_t>(sizeof(T));
  return std::max<int64_t>(1, std::min<int64_t>(d.B * d.H * d.E, chunk_bytes() / per_group));
}

#define LINEA_GRID_LOOP(i, total)                                                            \
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < (total); \
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)

// A pass over [rows, cols] on the grid of rows_grid: blockIdx.y walks the rows, the x threads a
// row's columns, so a kernel finds what its row belongs to once a row. Per element, the 64-bit
// divisions and remainders of a flat index take tens of instructions each, for the 16 bytes such
// a pass moves: filter_kernel, so written, moved its 26 GB at about 1.7 TB/s on an H200 (L =
// 4096, S = 64, E = 65; 16% of the FFT path's kernel time).
#define LINEA_ROWS_LOOP(row, rows, col, cols)                                                     \
  for (int64_t row = blockIdx.y; row < (rows); row += gridDim.y)                                  \
    for (int64_t col = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; col < (cols); \
         col += static_cast<int64_t>(gridDim.x) * blockDim.x)

inline dim3 rows_grid(int64_t rows, int64_t cols) {
  const unsigned x = grid_for(cols);
  return dim3(x, static_cast<unsigned>(std::max<int64_t>(1, std::min<int64_t>({rows, 65535, kMaxBlocks / x}))));
}

// g of every row of c, real [rows, n]: c_0..c_{M-1} at 0..M-1, c_{-t} at n - t, zeros between.
template <typename T> __global__ void embed_kernel(const T* c, ToeplitzDims d, T* g) {
  LINEA_GRID_LOOP(i, d.rows() * d.n) {
    const int64_t r = i / d.n, t = i % d.n;
    const T* cr = c + r * d.L();
    T v = T(0);
    if (t < d.M)
      v = cr[d.N - 1 + t];
    else if (t > d.n - d.N)
      v = cr[d.N - 1 - (d.n - t)];
    g[i] = v;
  }
}

// u [items, n] = w[:, s] x[:, e] over `len` rows (w [BH, len, S], x [BH, len, E]), zeros past len.
// u's rows run along t and w's along s: one thread per element of u read w with a stride of S
// (25% of the FFT path's kernel time on an H200 at L = 4096). A block takes kTile rows t by kTile
// features s of one head instead: w's tile goes through shared memory (read along s, written
// along t) once for every group (b, h, e) of that head in the chunk.
constexpr int kTile = 32;
// Tiles of kTile covering n rows or features (the tiled kernels' block counts per head).
__host__ __device__ inline int64_t tile_count(int64_t n) { return (n + kTile - 1) / kTile; }

template <typename T>
__global__ void __launch_bounds__(kBlockSize)
    weighted_rows_kernel(const T* w, const T* x, int64_t len, ToeplitzDims d, Chunk ch, T* u) {
  constexpr int kRowsPerPass = kBlockSize / kTile;
  T* tile = shared_mem<T>();  // [kTile s, kTile + 1 t]
  const int64_t s_tiles = tile_count(d.S), t_tiles = tile_count(d.n);
  const int lx = static_cast<int>(threadIdx.x) % kTile, ly = static_cast<int>(threadIdx.x) / kTile;
  for (int64_t blk = blockIdx.x; blk < (ch.head1(d) - ch.head0(d)) * s_tiles * t_tiles; blk += gridDim.x) {
    const int64_t bh = ch.head0(d) + blk / (s_tiles * t_tiles), s0 = blk / t_tiles % s_tiles * kTile,
                  t0 = blk % t_tiles * kTile;
    __syncthreads();  // the previous tile is written out
    for (int i = ly; i < kTile; i += kRowsPerPass) {
      const int64_t t = t0 + i, s = s0 + lx;
      tile[lx * (kTile + 1) + i] = t < len && s < d.S ? w[(bh * len + t) * d.S + s] : T(0);
    }
    __syncthreads();
    const int64_t t = t0 + lx;
    if (t >= d.n) continue;
    for (int64_t g = ch.first(d, bh); g < ch.last(d, bh); ++g) {
      const T xv = t < len ? x[(bh * len + t) * d.E + g % d.E] : T(0);
      for (int j = ly; j < kTile && s0 + j < d.S; j += kRowsPerPass)
        u[((g - ch.g0) * d.S + s0 + j) * d.n + t] = tile[j * (kTile + 1) + lx] * xv;
    }
  }
}

// The launch of weighted_rows_kernel for a chunk.
template <typename T>
void weighted_rows(const T* w, const T* x, int64_t len, const ToeplitzDims& d, const Chunk& ch, T* u) {
  const int64_t tiles = (ch.head1(d) - ch.head0(d)) * tile_count(d.S) * tile_count(d.n);
  weighted_rows_kernel<T>
      <<<grid_for(tiles * kBlockSize), kBlockSize, sizeof(T) * kTile*(kTile + 1), stream()>>>(w, x, len, d, ch, u);
  LINEA_KERNEL_LAUNCH_CHECK();
}

// dst [items, nf] = src * (conj ? conj(G) : G) / n for G the item's row of spec [rows, nf]
// (complex interleaved); the imaginary parts of bin 0 and (n even) bin n/2 set to 0 for C2R.
// One row of threads per item (rows_grid).
template <typename T>
__global__ void filter_kernel(const T* src, const T* spec, ToeplitzDims d, Chunk ch, bool conj, T* dst) {
  const int64_t nf = d.nf();
  const T inv_n = T(1) / static_cast<T>(d.n), sign = conj ? T(-1) : T(1);
  LINEA_ROWS_LOOP(item, ch.items(d), k, nf) {
    const int64_t bh = (ch.g0 + item / d.S) / d.E, i = item * nf + k;
    const T* G = spec + 2 * (d.row_of(bh) * nf + k);
    const T gr = G[0] * inv_n, gi = sign * G[1] * inv_n, xr = src[2 * i], xi = src[2 * i + 1];
    const bool real_bin = k == 0 || (d.n % 2 == 0 && k == d.n / 2);
    dst[2 * i] = xr * gr - xi * gi;
    dst[2 * i + 1] = real_bin ? T(0) : xr * gi + xi * gr;
  }
}

// out[bh, i, e] = sum_s w[bh, i, s] y[(g, s), i] for i < len, one thread per (g, i): the forward's
// output (w = phi_q, len N) and the backward's dv (w = phi_k, len M).
template <typename T>
__global__ void contract_features_kernel(const T* w, const T* y, int64_t len, ToeplitzDims d, Chunk ch, T* out) {
  LINEA_GRID_LOOP(j, (ch.g1 - ch.g0) * len) {
    const int64_t gi = j / len, i = j % len, g = ch.g0 + gi, bh = g / d.E, e = g % d.E;
    const T* wr = w + (bh * len + i) * d.S;
    const T* yg = y + gi * d.S * d.n + i;
    T acc = T(0);
    for (int64_t s = 0; s < d.S; ++s) acc += wr[s] * yg[s * d.n];
    out[(bh * len + i) * d.E + e] = acc;
  }
}

// dw[bh, i, s] += sum_e x[bh, i, e] y[(g, s), i] over the chunk's groups g = (bh, e) of bh
// (dphi_q: x = dy, len N; dphi_k: x = v, len M), e in order. y's rows run along i and dw's along
// s: one thread per (bh, i, s) read y with a stride of n (a sector of 32 bytes for each 4 used).
// A block takes kTile rows i by kTile features s of one head instead, its threads reading y
// along i, and writes dw along s through a shared tile (weighted_rows_kernel's transpose, back).
template <typename T>
__global__ void __launch_bounds__(kBlockSize)
    accumulate_features_kernel(const T* x, const T* y, int64_t len, ToeplitzDims d, Chunk ch, T* dw) {
  constexpr int kRowsPerPass = kBlockSize / kTile, kPer = kTile / kRowsPerPass;
  T* tile = shared_mem<T>();  // [kTile i, kTile + 1 s]
  const int64_t s_tiles = tile_count(d.S), i_tiles = tile_count(len);
  const int lx = static_cast<int>(threadIdx.x) % kTile, ly = static_cast<int>(threadIdx.x) / kTile;
  for (int64_t blk = blockIdx.x; blk < (ch.head1(d) - ch.head0(d)) * s_tiles * i_tiles; blk += gridDim.x) {
    const int64_t bh = ch.head0(d) + blk / (s_tiles * i_tiles), s0 = blk / i_tiles % s_tiles * kTile,
                  i0 = blk % i_tiles * kTile, i = i0 + lx;
    T acc[kPer] = {};
    if (i < len)
      for (int64_t g = ch.first(d, bh); g < ch.last(d, bh); ++g) {
        const T xv = x[(bh * len + i) * d.E + g - bh * d.E];
        const T* yg = y + (g - ch.g0) * d.S * d.n + i;
#pragma unroll
        for (int p = 0; p < kPer; ++p) {
          const int64_t s = s0 + ly + p * kRowsPerPass;
          if (s < d.S) acc[p] += xv * yg[s * d.n];
        }
      }
    __syncthreads();  // the previous tile is written out
#pragma unroll
    for (int p = 0; p < kPer; ++p) tile[lx * (kTile + 1) + ly + p * kRowsPerPass] = acc[p];
    __syncthreads();
    for (int r = ly; r < kTile; r += kRowsPerPass) {
      const int64_t row = i0 + r, s = s0 + lx;
      if (row < len && s < d.S) dw[(bh * len + row) * d.S + s] += tile[r * (kTile + 1) + lx];
    }
  }
}

// The launch of accumulate_features_kernel for a chunk.
template <typename T>
void accumulate_features(const T* x, const T* y, int64_t len, const ToeplitzDims& d, const Chunk& ch, T* dw) {
  const int64_t tiles = (ch.head1(d) - ch.head0(d)) * tile_count(d.S) * tile_count(len);
  accumulate_features_kernel<T>
      <<<grid_for(tiles * kBlockSize), kBlockSize, sizeof(T) * kTile*(kTile + 1), stream()>>>(x, y, len, d, ch, dw);
  LINEA_KERNEL_LAUNCH_CHECK();
}

// dG[bh, k] += sum over the chunk's items of bh of conj(P_k) X_k: per head, column sums over its
// items of [items, nf] by the column skeleton (32 bins per block, coalesced; its 8 rows of
// threads split the items; tree_reduce_y adds them in a fixed order: the same bits every run).
// A chunk often holds one head only: one thread per (bh, k) left most of the GPU idle (17 blocks
// at L = 4096 on an H200, 28% of forward+backward kernel time).
template <typename T>
__global__ void accumulate_spectrum_kernel(const T* P, const T* X, ToeplitzDims d, Chunk ch, T* dG) {
  T* sh = shared_mem<T>();
  const int64_t nf = d.nf(), h0 = ch.head0(d), columns = (ch.head1(d) - h0) * nf;
  for (int64_t cb = blockIdx.x; cb * blockDim.x < columns; cb += gridDim.x) {
    // Column (bh, k); its base is not used: where a head's items start depends on the chunk.
    const Column col = column_at(cb, columns, 0, nf);
    const int64_t bh = h0 + col.c / nf, k = col.c % nf;
    T re = T(0), im = T(0);
    if (col.active)
      for (int64_t item = (ch.first(d, bh) - ch.g0) * d.S + threadIdx.y; item < (ch.last(d, bh) - ch.g0) * d.S;
           item += blockDim.y) {
        const T* p = P + 2 * (item * nf + k);
        const T* x = X + 2 * (item * nf + k);
        re += p[0] * x[0] + p[1] * x[1];
        im += p[0] * x[1] - p[1] * x[0];
      }
    re = tree_reduce_y(re, SumOp(), sh);
    im = tree_reduce_y(im, SumOp(), sh);
    if (col.active && threadIdx.y == 0) {
      dG[2 * (bh * nf + k)] += re;
      dG[2 * (bh * nf + k) + 1] += im;
    }
  }
}

// dc's spectrum per row of c: dG summed over the batch when c is per head (b in order), the
// imaginary parts of bin 0 and n/2 zeroed. spec [rows, nf].
template <typename T> __global__ void row_spectrum_kernel(const T* dG, ToeplitzDims d, T* spec) {
  const int64_t nf = d.nf();
  LINEA_GRID_LOOP(j, d.rows() * nf) {
    const int64_t r = j / nf, k = j % nf;
    T re = T(0), im = T(0);
    if (d.c_per_batch) {
      re = dG[2 * j];
      im = dG[2 * j + 1];
    } else {
      for (int64_t b = 0; b < d.B; ++b) {
        re += dG[2 * ((b * d.H + r) * nf + k)];
        im += dG[2 * ((b * d.H + r) * nf + k) + 1];
      }
    }
    const bool real_bin = k == 0 || (d.n % 2 == 0 && k == d.n / 2);
    spec[2 * j] = re;
    spec[2 * j + 1] = real_bin ? T(0) : im;
  }
}

// dc[r, t + N - 1] = dg[r, t mod n] / n for t = -(N-1)..M-1.
template <typename T> __global__ void extract_kernel(const T* dg, ToeplitzDims d, T* dc) {
  const T inv_n = T(1) / static_cast<T>(d.n);
  LINEA_GRID_LOOP(j, d.rows() * d.L()) {
    const int64_t r = j / d.L(), t = j % d.L() - (d.N - 1);
    dc[j] = dg[r * d.n + (t >= 0 ? t : d.n + t)] * inv_n;
  }
}

// ---- the direct path (fft_len == 0) --------------------------------------------------------------
// The same sums term by term. In float32 from sm_80 on, in the softmax kernels' tensor-core tiles
// (toeplitz_forward_mma, toeplitz_backward_mma: cuda/attention.cu; O(N + M) memory); elsewhere
// as batched GEMMs over a chunk of query rows
// at a time (all (b, h)): A = phi_q phi_k^T [rows, M], each entry times c_{m-n} (the bias table),
// y = A v. Exact, O(N M) work at the matmul precision, O(chunk) memory: the faster path for short
// sequences.

// a[bh, i, m] (and b[bh, i, m]) *= c_{m - (n0 + i)} for the chunk's rows i < rows: one row of
// threads per (bh, i) (rows_grid).
template <typename T>
__global__ void bias_weight_kernel(T* a, T* b, const T* c, ToeplitzDims d, int64_t n0, int64_t rows) {
  LINEA_ROWS_LOOP(r, d.B * d.H * rows, m, d.M) {
    const int64_t i = r % rows, j = r * d.M + m;
    const T w = c[d.row_of(r / rows) * d.L() + m - (n0 + i) + d.N - 1];
    a[j] *= w;
    if (b) b[j] *= w;
  }
}

// dcb[bh, t + N - 1] += sum over the chunk's rows n of k[bh, n, n + t] g[bh, n, n + t]: one thread
// per (bh, t), its rows in order (no atomics).
template <typename T>
__global__ void diagonal_sums_kernel(const T* k, const T* g, ToeplitzDims d, int64_t n0, int64_t rows, T* dcb) {
  LINEA_GRID_LOOP(j, d.B * d.H * d.L()) {
    const int64_t bh = j / d.L(), t = j % d.L() - (d.N - 1);
    T acc = T(0);
    for (int64_t i = 0; i < rows; ++i) {
      const int64_t m = n0 + i + t;
      if (m >= 0 && m < d.M) acc += k[(bh * rows + i) * d.M + m] * g[(bh * rows + i) * d.M + m];
    }
    dcb[j] += acc;
  }
}

// dc per row of c from each (b, h)'s sums: its own, or per head the batch's in order.
template <typename T> __global__ void batch_sums_kernel(const T* dcb, ToeplitzDims d, T* dc) {
  LINEA_GRID_LOOP(j, d.rows() * d.L()) {
    if (d.c_per_batch) {
      dc[j] = dcb[j];
      continue;
    }
    const int64_t h = j / d.L(), t = j % d.L();
    T acc = T(0);
    for (int64_t b = 0; b < d.B; ++b) acc += dcb[(b * d.H + h) * d.L() + t];
    dc[j] = acc;
  }
}

#undef LINEA_GRID_LOOP
#undef LINEA_ROWS_LOOP

// Query rows per chunk of the direct path: its [B H, rows, M] tiles within chunk_bytes().
template <typename T> int64_t direct_rows(const ToeplitzDims& d) {
  const int64_t per_row = d.B * d.H * d.M * static_cast<int64_t>(sizeof(T));
  return std::max<int64_t>(1, std::min<int64_t>(d.N, chunk_bytes() / per_row));
}

template <typename T>
void direct_forward(const ToeplitzDims& d, const T* c, const T* pq, const T* pk, const T* v, T* y) {
  const int64_t BH = d.B * d.H, nc = direct_rows<T>(d);
  DeviceScratch<T> a(BH * nc * d.M);
  for (int64_t n0 = 0; n0 < d.N; n0 += nc) {
    const int64_t r = std::min(nc, d.N - n0);
    gemm_strided<T>(pq + n0 * d.S, false, d.S, d.N * d.S, pk, true, d.S, d.M * d.S, a.p, d.M, r * d.M, r, d.M, d.S, BH,
                    1.0);
    bias_weight_kernel<T><<<rows_grid(BH * r, d.M), kBlockSize, 0, stream()>>>(a.p, nullptr, c, d, n0, r);
    LINEA_KERNEL_LAUNCH_CHECK();
    gemm_strided<T>(a.p, false, d.M, r * d.M, v, false, d.E, d.M * d.E, y + n0 * d.E, d.E, d.N * d.E, r, d.E, d.M, BH,
                    1.0);
  }
}

// Per chunk: K = phi_q phi_k^T, G = dy v^T; dc_{m-n} += K G along the diagonals; with W = c K,
// Z = c G: dv += W^T dy, dphi_q = Z phi_k, dphi_k += Z^T phi_q.
template <typename T>
void direct_backward(const ToeplitzDims& d, const T* c, const T* pq, const T* pk, const T* v, const T* dy, T* dc,
                     T* dpq, T* dpk, T* dv) {
  const int64_t BH = d.B * d.H, nc = direct_rows<T>(d);
  DeviceScratch<T> K(BH * nc * d.M), G(BH * nc * d.M), dcb(BH * d.L());
  count_work(counter_cells().device_copies);
  LINEA_CUDA_CHECK(cudaMemsetAsync(dcb.p, 0, sizeof(T) * static_cast<size_t>(BH * d.L()), stream()));
  for (int64_t n0 = 0; n0 < d.N; n0 += nc) {
    const int64_t r = std::min(nc, d.N - n0);
    const double acc = n0 > 0 ? 1.0 : 0.0;  // dv, dphi_k: the first chunk overwrites
    gemm_strided<T>(pq + n0 * d.S, false, d.S, d.N * d.S, pk, true, d.S, d.M * d.S, K.p, d.M, r * d.M, r, d.M, d.S, BH,
                    1.0);
    gemm_strided<T>(dy + n0 * d.E, false, d.E, d.N * d.E, v, true, d.E, d.M * d.E, G.p, d.M, r * d.M, r, d.M, d.E, BH,
                    1.0);
    diagonal_sums_kernel<T><<<grid_for(BH * d.L()), kBlockSize, 0, stream()>>>(K.p, G.p, d, n0, r, dcb.p);
    LINEA_KERNEL_LAUNCH_CHECK();
    bias_weight_kernel<T><<<rows_grid(BH * r, d.M), kBlockSize, 0, stream()>>>(K.p, G.p, c, d, n0, r);
    LINEA_KERNEL_LAUNCH_CHECK();
    gemm_strided<T>(K.p, true, d.M, r * d.M, dy + n0 * d.E, false, d.E, d.N * d.E, dv, d.E, d.M * d.E, d.M, d.E, r, BH,
                    1.0, acc);
    gemm_strided<T>(G.p, false, d.M, r * d.M, pk, false, d.S, d.M * d.S, dpq + n0 * d.S, d.S, d.N * d.S, r, d.S, d.M,
                    BH, 1.0);
    gemm_strided<T>(G.p, true, d.M, r * d.M, pq + n0 * d.S, false, d.S, d.N * d.S, dpk, d.S, d.M * d.S, d.M, d.S, r, BH,
                    1.0, acc);
  }
  batch_sums_kernel<T><<<grid_for(d.rows() * d.L()), kBlockSize, 0, stream()>>>(dcb.p, d, dc);
  LINEA_KERNEL_LAUNCH_CHECK();
}

ToeplitzDims dims_of(const Tensor& c, const Tensor& pq, const Tensor& pk, const Tensor& v, int64_t fft_len) {
  return {pq.size(0), pq.size(1), pq.size(2), pk.size(2), pq.size(3), v.size(3), fft_len, c.dim() == 3};
}

// The spectrum of every row of c's embedding, [rows, nf] complex (unnormalized).
template <typename T> void c_spectrum(const T* c, const ToeplitzDims& d, T* spec) {
  DeviceScratch<T> g(d.rows() * d.n);
  embed_kernel<T><<<grid_for(d.rows() * d.n), kBlockSize, 0, stream()>>>(c, d, g.p);
  LINEA_KERNEL_LAUNCH_CHECK();
  rfft_rows<T>(g.p, spec, d.rows(), d.n);
}

// The chunks of groups, in order.
template <typename T, typename F> void for_each_chunk(const ToeplitzDims& d, F&& f) {
  const int64_t groups = d.B * d.H * d.E, per = groups_per_chunk<T>(d);
  for (int64_t g0 = 0; g0 < groups; g0 += per) f(Chunk{g0, std::min(groups, g0 + per)});
}

}  // namespace

void toeplitz_attention_forward(const Tensor& c, const Tensor& phi_q, const Tensor& phi_k, const Tensor& v,
                                int64_t fft_len, const Tensor& y) {
  const ToeplitzDims d = dims_of(c, phi_q, phi_k, v, fft_len);
  LINEA_DISPATCH_FLOAT(v.dtype(), "toeplitz_attention", [&] {
    using T = scalar_t;
    if (fft_len == 0) {
      if (toeplitz_forward_mma(c, phi_q, phi_k, v, y)) return;
      return direct_forward<T>(d, cptr<T>(c), cptr<T>(phi_q), cptr<T>(phi_k), cptr<T>(v), ptr<T>(y));
    }
    const int64_t nf = d.nf(), per = groups_per_chunk<T>(d) * d.S;
    DeviceScratch<T> spec(d.rows() * 2 * nf), u(per * d.n), X(per * 2 * nf);
    c_spectrum<T>(cptr<T>(c), d, spec.p);
    for_each_chunk<T>(d, [&](const Chunk& ch) {
      const int64_t items = ch.items(d);
      // y_s = IDFT(X conj(G)) for x = phi_k[:, s] v[:, e]; out = sum_s phi_q[:, s] y_s
      weighted_rows<T>(cptr<T>(phi_k), cptr<T>(v), d.M, d, ch, u.p);
      rfft_rows<T>(u.p, X.p, items, d.n);
      filter_kernel<T><<<rows_grid(items, nf), kBlockSize, 0, stream()>>>(X.p, spec.p, d, ch, /*conj=*/true, X.p);
      LINEA_KERNEL_LAUNCH_CHECK();
      irfft_rows<T>(X.p, u.p, items, d.n);
      contract_features_kernel<T>
          <<<grid_for((ch.g1 - ch.g0) * d.N), kBlockSize, 0, stream()>>>(cptr<T>(phi_q), u.p, d.N, d, ch, ptr<T>(y));
      LINEA_KERNEL_LAUNCH_CHECK();
    });
  });
}

void toeplitz_attention_backward(const Tensor& c, const Tensor& phi_q, const Tensor& phi_k, const Tensor& v,
                                 const Tensor& dy, int64_t fft_len, const Tensor& dc, const Tensor& dphi_q,
                                 const Tensor& dphi_k, const Tensor& dv) {
  const ToeplitzDims d = dims_of(c, phi_q, phi_k, v, fft_len);
  LINEA_DISPATCH_FLOAT(v.dtype(), "toeplitz_attention_backward", [&] {
    using T = scalar_t;
    if (fft_len == 0) {
      if (toeplitz_backward_mma(c, phi_q, phi_k, v, dy, dc, dphi_q, dphi_k, dv)) return;
      return direct_backward<T>(d, cptr<T>(c), cptr<T>(phi_q), cptr<T>(phi_k), cptr<T>(v), cptr<T>(dy), ptr<T>(dc),
                                ptr<T>(dphi_q), ptr<T>(dphi_k), ptr<T>(dv));
    }
    const int64_t nf = d.nf(), per = groups_per_chunk<T>(d) * d.S;
    DeviceScratch<T> spec(d.rows() * 2 * nf), dG(d.B * d.H * 2 * nf), u(per * d.n), X(per * 2 * nf), P(per * 2 * nf),
        W(per * 2 * nf);
    c_spectrum<T>(cptr<T>(c), d, spec.p);
    fill(dphi_q, 0.0);
    fill(dphi_k, 0.0);
    count_work(counter_cells().device_copies);
    LINEA_CUDA_CHECK(cudaMemsetAsync(dG.p, 0, sizeof(T) * static_cast<size_t>(d.B * d.H * 2 * nf), stream()));
    for_each_chunk<T>(d, [&](const Chunk& ch) {
      const int64_t items = ch.items(d), groups = ch.g1 - ch.g0;
      // The forward's X and y_s again: dphi_q[:, s] += sum_e dy[:, e] y_s.
      weighted_rows<T>(cptr<T>(phi_k), cptr<T>(v), d.M, d, ch, u.p);
      rfft_rows<T>(u.p, X.p, items, d.n);
      filter_kernel<T><<<rows_grid(items, nf), kBlockSize, 0, stream()>>>(X.p, spec.p, d, ch, /*conj=*/true, W.p);
      LINEA_KERNEL_LAUNCH_CHECK();
      irfft_rows<T>(W.p, u.p, items, d.n);
      accumulate_features<T>(cptr<T>(dy), u.p, d.N, d, ch, ptr<T>(dphi_q));
      // P = DFT(phi_q[:, s] dy[:, e]); dG += conj(P) X.
      weighted_rows<T>(cptr<T>(phi_q), cptr<T>(dy), d.N, d, ch, u.p);
      rfft_rows<T>(u.p, P.p, items, d.n);
      const int64_t bh_count = ch.head1(d) - ch.head0(d);
      const dim3 block = column_block(d.E * d.S, nf);  // at most E * S items per head
      accumulate_spectrum_kernel<T>
          <<<column_grid(bh_count * nf, block), block, kBlockSize * sizeof(T), stream()>>>(P.p, X.p, d, ch, dG.p);
      LINEA_KERNEL_LAUNCH_CHECK();
      // z_s = IDFT(P G), the gradient of phi_k[:, s] v[:, e]: dphi_k[:, s] += sum_e v[:, e] z_s,
      // dv[:, e] = sum_s phi_k[:, s] z_s.
      filter_kernel<T><<<rows_grid(items, nf), kBlockSize, 0, stream()>>>(P.p, spec.p, d, ch, /*conj=*/false, W.p);
      LINEA_KERNEL_LAUNCH_CHECK();
      irfft_rows<T>(W.p, u.p, items, d.n);
      accumulate_features<T>(cptr<T>(v), u.p, d.M, d, ch, ptr<T>(dphi_k));
      contract_features_kernel<T>
          <<<grid_for(groups * d.M), kBlockSize, 0, stream()>>>(cptr<T>(phi_k), u.p, d.M, d, ch, ptr<T>(dv));
      LINEA_KERNEL_LAUNCH_CHECK();
    });
    // dc = IDFT(dG) / n per row of c, read at the offsets t = -(N-1)..M-1.
    row_spectrum_kernel<T><<<grid_for(d.rows() * nf), kBlockSize, 0, stream()>>>(dG.p, d, spec.p);
    LINEA_KERNEL_LAUNCH_CHECK();
    DeviceScratch<T> g(d.rows() * d.n);
    irfft_rows<T>(spec.p, g.p, d.rows(), d.n);
    extract_kernel<T><<<grid_for(d.rows() * d.L()), kBlockSize, 0, stream()>>>(g.p, d, ptr<T>(dc));
    LINEA_KERNEL_LAUNCH_CHECK();
  });
}

}  // namespace linea::cuda
