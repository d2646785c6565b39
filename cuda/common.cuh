// Helpers shared by the kernels in cuda/*.cu: launch geometry, typed device pointers, the
// strided offset calculator used by every "any layout" kernel, and the column-reduction skeleton.
// Not a kernel file: the kernels sit beside their launchers in elementwise.cu, reduce.cu, ...
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <vector>

#include "core/cuda_counters.h"
#include "core/cuda_interface.h"
#include "core/error.h"
#include "core/tensor.h"
#include "cuda/check.h"
#include "cuda/context.h"
#include "cuda/divider.h"

namespace linea::cuda::detail {

constexpr int kBlockSize = 256;
// Grid-stride loops cover what does not fit in this many blocks. (On the emulator, EMU_MAX_BLOCKS
// lowers it, so that the tests' small tensors take those loops round more than once.)
#if defined(LINEA_CUDA_EMULATOR)
inline const int64_t kMaxBlocks = emu::max_blocks();
#else
constexpr int64_t kMaxBlocks = 1 << 16;
#endif
// Most dims a strided operand may have after merging contiguous dims.
constexpr int kMaxDims = 10;

inline unsigned grid_for(int64_t n, int block = kBlockSize) {
  return static_cast<unsigned>(std::min<int64_t>((n + block - 1) / block, kMaxBlocks));
}

// Device pointer to the first element of t as T (the caller dispatched on t's dtype;
// Bool is stored as uint8_t).
template <typename T> T* ptr(const Tensor& t) { return static_cast<T*>(t.data_ptr()); }
template <typename T> const T* cptr(const Tensor& t) { return static_cast<const T*>(t.data_ptr()); }
// The same, null for an undefined tensor (an optional operand).
template <typename T> T* ptr_or_null(const Tensor& t) { return t.defined() ? ptr<T>(t) : nullptr; }
template <typename T> const T* cptr_or_null(const Tensor& t) { return t.defined() ? cptr<T>(t) : nullptr; }

// Smallest power of two >= n, clamped to [lo, hi].
inline int pow2_clamp(int64_t n, int lo, int hi) {
  int p = lo;
  while (p < hi && p < n) p *= 2;
  return p;
}

// ---- strided offsets ----------------------------------------------------------------------------
// Maps a linear index over `sizes` (row-major) to element offsets into N operands.
template <int N> struct OffsetCalc {
  int ndim = 0;
  int64_t sizes[kMaxDims] = {};
  int64_t strides[N][kMaxDims] = {};
  // Where every linear index fits in 31 bits (the product of the sizes does): the sizes as
  // Dividers, each dim's coordinate by 32-bit multiply-highs instead of 64-bit / and %.
  bool narrow = false;
  Divider dividers[kMaxDims];

  __device__ __forceinline__ void get(int64_t linear, int64_t (&off)[N]) const {
#pragma unroll
    for (int k = 0; k < N; ++k) off[k] = 0;
    if (narrow) {
      uint32_t rest = static_cast<uint32_t>(linear);
#pragma unroll
      for (int d = kMaxDims - 1; d >= 0; --d) {
        if (d < ndim) {
          const uint32_t q = dividers[d].div(rest), c = rest - q * dividers[d].divisor;
          rest = q;
#pragma unroll
          for (int k = 0; k < N; ++k) off[k] += static_cast<int64_t>(c) * strides[k][d];
        }
      }
      return;
    }
#pragma unroll
    for (int d = kMaxDims - 1; d >= 0; --d) {
      if (d < ndim) {
        int64_t c = linear % sizes[d];
        linear /= sizes[d];
#pragma unroll
        for (int k = 0; k < N; ++k) off[k] += c * strides[k][d];
      }
    }
  }
};

// Builds the calculator for iterating over `shape` with each operand's strides: drops size-1
// dims and merges neighbours that are contiguous with each other in every operand.
// `contiguous` is set when the result is one dim with stride 1 everywhere (the fast path).
template <int N>
OffsetCalc<N> make_offset_calc(const Shape& shape, const std::array<const Strides*, N>& strides, const char* op,
                               bool* contiguous) {
  std::vector<int64_t> sz;
  std::vector<std::array<int64_t, N>> st;
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] == 1) continue;
    std::array<int64_t, N> s{};
    for (int k = 0; k < N; ++k) s[k] = (*strides[k])[d];
    if (!sz.empty()) {
      bool mergeable = true;
      for (int k = 0; k < N; ++k) mergeable = mergeable && st.back()[k] == s[k] * shape[d];
      if (mergeable) {
        sz.back() *= shape[d];
        st.back() = s;
        continue;
      }
    }
    sz.push_back(shape[d]);
    st.push_back(s);
  }
  if (sz.empty()) {
    sz.push_back(1);
    st.push_back({});
    for (int k = 0; k < N; ++k) st.back()[k] = 1;
  }
  LINEA_CHECK(static_cast<int>(sz.size()) <= kMaxDims, op, ": the CUDA backend handles at most ", kMaxDims,
              " non-mergeable dims per strided operand, got shape ", shape_str(shape), " (make it contiguous first)");
  OffsetCalc<N> oc;
  oc.ndim = static_cast<int>(sz.size());
  const int64_t numel = shape_numel(shape);
  oc.narrow = numel > 0 && numel < (int64_t{1} << 31);
  bool contig = oc.ndim == 1;
  for (int d = 0; d < oc.ndim; ++d) {
    oc.sizes[d] = sz[d];
    if (oc.narrow) oc.dividers[d] = Divider(static_cast<uint32_t>(sz[d]));
    for (int k = 0; k < N; ++k) {
      oc.strides[k][d] = st[d][k];
      contig = contig && st[d][k] == 1;
    }
  }
  *contiguous = contig;
  return oc;
}

// ---- elementwise launch over N strided operands ---------------------------------------------------
// F is a functor with  __device__ void operator()(const int64_t (&off)[N]) const  that reads and
// writes its operands at the given element offsets.
template <int N, typename F> __global__ void strided_kernel(int64_t n, OffsetCalc<N> oc, F f) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t off[N];
    oc.get(i, off);
    f(off);
  }
}

template <int N, typename F> __global__ void contiguous_kernel(int64_t n, F f) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t off[N];
#pragma unroll
    for (int k = 0; k < N; ++k) off[k] = i;
    f(off);
  }
}

// Contiguous = false where the caller takes the all-contiguous case another way (a memcpy): only
// the strided kernel is compiled (it is correct for any layout).
template <int N, bool Contiguous = true, typename F>
void launch_elementwise(const char* op, const Shape& shape, const std::array<const Strides*, N>& strides, const F& f) {
  const int64_t n = shape_numel(shape);
  if (n == 0) return;
  bool contig = false;
  OffsetCalc<N> oc = make_offset_calc<N>(shape, strides, op, &contig);
  if constexpr (Contiguous) {
    if (contig) {
      contiguous_kernel<N, F><<<grid_for(n), kBlockSize, 0, stream()>>>(n, f);
      LINEA_KERNEL_LAUNCH_CHECK();
      return;
    }
  }
  strided_kernel<N, F><<<grid_for(n), kBlockSize, 0, stream()>>>(n, oc, f);
  LINEA_KERNEL_LAUNCH_CHECK();
}

// ---- reductions ------------------------------------------------------------------------------------
struct SumOp {
  template <typename T> __device__ __forceinline__ T operator()(T a, T b) const { return a + b; }
};
struct MaxOp {  // NaN propagates
  template <typename T> __device__ __forceinline__ T operator()(T a, T b) const { return (a != a || a > b) ? a : b; }
};
struct MinOp {
  template <typename T> __device__ __forceinline__ T operator()(T a, T b) const { return (a != a || a < b) ? a : b; }
};

// ---- column reductions over [outer, r, inner] ----------------------------------------------------
// A "column" is one (o, i) position, c = o * inner + i, whose r elements sit at
// base + j * inner (base = o * r * inner + i). A block of kBlockSize threads is (bx, by):
// threadIdx.x picks consecutive columns (coalesced when inner > 1, several short rows per
// block when inner == 1), threadIdx.y splits r. by is a power of two.
inline dim3 column_block(int64_t r, int64_t inner) {
  const int bx_pref = pow2_clamp(inner, 1, 32);
  const int by = pow2_clamp(r, 1, kBlockSize / bx_pref);
  return dim3(kBlockSize / by, by);
}
inline unsigned column_grid(int64_t columns, dim3 block) {
  return static_cast<unsigned>(std::min<int64_t>((columns + block.x - 1) / block.x, kMaxBlocks));
}

struct Column {
  bool active;   // this thread's column exists
  int64_t c;     // column index o * inner + i
  int64_t base;  // element offset of (o, 0, i)
};
// Column of this thread in column-block cb.
__device__ __forceinline__ Column column_at(int64_t cb, int64_t columns, int64_t r, int64_t inner) {
  Column col;
  col.c = cb * blockDim.x + threadIdx.x;
  col.active = col.c < columns;
  const int64_t o = col.c / inner, i = col.c % inner;
  col.base = o * r * inner + i;
  return col;
}
// The column o * inner + i of element e = (o, j, i) of [outer, r, inner]: an elementwise pass
// reading a per-column value.
__device__ __forceinline__ int64_t column_of(int64_t e, int64_t r, int64_t inner) {
  return e / (r * inner) * inner + e % inner;
}

// Long columns on many blocks. Where the columns are few (2,048 are 64 blocks of 32: half an
// H200 idle, each block walking every row), a kernel takes each column's r rows in runs of `rows`
// (gridDim.y = runs), a block summing one run of its columns into partial [run, V, columns], and
// sum_runs_kernel adds the runs in order. The split depends on the shape only: the same bits
// every run. (cuda/reduce.cu splits its reductions along r alike, with a combine of its own.)
struct ColumnRuns {
  int64_t runs, rows;  // runs per column; rows per run (the last may be shorter)
  __device__ int64_t begin() const { return blockIdx.y * rows; }
};
inline ColumnRuns column_runs(int64_t columns, int64_t r, dim3 block) {
  // About 8 blocks of 256 threads per SM of a 132-SM GPU; runs of at least 256 rows; one run
  // where the columns alone make a quarter of that.
  constexpr int64_t kTargetBlocks = 1024, kMinRows = 256;
  const int64_t column_blocks = std::max<int64_t>(1, (columns + block.x - 1) / block.x);
  if (4 * column_blocks >= kTargetBlocks) return {1, std::max<int64_t>(1, r)};
  const int64_t want = std::max<int64_t>(
      1, std::min((kTargetBlocks + column_blocks - 1) / column_blocks, (r + kMinRows - 1) / kMinRows));
  const int64_t rows = std::max<int64_t>(1, (r + want - 1) / want);
  return {std::max<int64_t>(1, (r + rows - 1) / rows), rows};
}
inline dim3 column_runs_grid(int64_t columns, dim3 block, const ColumnRuns& runs) {
  return dim3(column_grid(columns, block), static_cast<unsigned>(runs.runs));
}
// Where sum_runs_kernel puts column c's total of value v: out[v][c * stride[v]].
template <typename T, int V> struct RunTotals {
  T* out[V];
  int64_t stride[V];
};
template <typename T, int V>
__global__ void sum_runs_kernel(const T* partial, ColumnRuns runs, int64_t columns, RunTotals<T, V> dst) {
  for (int64_t c = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; c < columns;
       c += static_cast<int64_t>(gridDim.x) * blockDim.x)
#pragma unroll
    for (int v = 0; v < V; ++v) {
      T acc = T(0);
      for (int64_t k = 0; k < runs.runs; ++k) acc += partial[(k * V + v) * columns + c];
      dst.out[v][c * dst.stride[v]] = acc;
    }
}

// Reduces v over threadIdx.y (per threadIdx.x) through shared memory `sh` (blockDim.x *
// blockDim.y values); every thread of the column gets the result. All threads of the block
// must call it (it has barriers).
template <typename A, typename Op> __device__ A tree_reduce_y(A v, Op op, A* sh) {
  const int tx = threadIdx.x, ty = threadIdx.y, bx = blockDim.x;
  sh[ty * bx + tx] = v;
  __syncthreads();
  for (int s = blockDim.y / 2; s > 0; s /= 2) {
    if (ty < s) sh[ty * bx + tx] = op(sh[ty * bx + tx], sh[(ty + s) * bx + tx]);
    __syncthreads();
  }
  A result = sh[tx];
  __syncthreads();
  return result;
}

// C_i [M, N] (row-major, rows ldc apart) = alpha op(A_i) [M, K] op(B_i) [K, N] + beta C_i for
// i < count, operand i at a + i*sa, b + i*sb, c + i*sc; an operand is row-major with rows ld
// apart, or column-major (trans) with columns ld apart: one cuBLAS strided-batched call at the
// matmul precision (cuda/blas.cu). For kernels that are GEMMs with a little around them.
template <typename T>
void gemm_strided(const T* a, bool a_trans, int64_t lda, int64_t sa, const T* b, bool b_trans, int64_t ldb, int64_t sb,
                  T* c, int64_t ldc, int64_t sc, int64_t M, int64_t N, int64_t K, int64_t count, double alpha,
                  double beta = 0.0);

// Batched real transforms of length n on device arrays, rows packed (cuda/fft.cu's cached cuFFT
// plans): rfft_rows in [batch, n] -> out [batch, n/2+1] complex (interleaved), irfft_rows back,
// unnormalized (the caller scales). Both may overwrite `in` (cuFFT's out-of-place C2R does);
// irfft_rows assumes zero imaginary parts at bin 0 and (n even) bin n/2.
template <typename T> void rfft_rows(T* in, T* out, int64_t batch, int64_t n);
template <typename T> void irfft_rows(T* in, T* out, int64_t batch, int64_t n);

// nprf_rpe's dense path (toeplitz_attention with fft_len 0) on the tensor cores (cuda/attention.cu:
// the softmax kernels' tiles with p = (phi_q . phi_k) c_{m-n}): the forward's y [B, H, N, E], the
// backward's dc, dphi_q, dphi_k and dv, from contiguous c, phi_q, phi_k, v, dy (float32); false
// (nothing written) where those kernels do not take the call (not float32, before sm_80, S or
// E - 1 past 128, E < 2).
bool toeplitz_forward_mma(const Tensor& c, const Tensor& phi_q, const Tensor& phi_k, const Tensor& v, const Tensor& y);
bool toeplitz_backward_mma(const Tensor& c, const Tensor& phi_q, const Tensor& phi_k, const Tensor& v, const Tensor& dy,
                           const Tensor& dc, const Tensor& dphi_q, const Tensor& dphi_k, const Tensor& dv);

// Scratch device memory of n T's from the caching allocator for the work queued while it lives;
// freed at the end of the scope, its blocks then go only to work queued later on the same stream.
template <typename T> struct DeviceScratch {
  T* p;
  explicit DeviceScratch(int64_t n)
      : p(static_cast<T*>(allocator().allocate(sizeof(T) * static_cast<size_t>(n > 0 ? n : 1)))) {}
  ~DeviceScratch() { allocator().deallocate(p); }
  DeviceScratch(const DeviceScratch&) = delete;
  DeviceScratch& operator=(const DeviceScratch&) = delete;
};

// Accumulator of sums: double for floating types (as the CPU kernels), int64 for int64.
template <typename T> struct AccOf { using type = double; };
template <> struct AccOf<int64_t> { using type = int64_t; };

// Dynamic shared memory of a kernel that uses it as an array of T (declared as raw bytes,
// so templates on different T can share one extern declaration).
template <typename T> __device__ __forceinline__ T* shared_mem() {
  extern __shared__ __align__(16) unsigned char linea_smem_[];
  return reinterpret_cast<T*>(linea_smem_);
}

// Files a report of a bad value (see DeviceErrorReport in cuda/context.h). Racy on purpose:
// when several threads report, one of their values is kept.
__device__ __forceinline__ void report_device_error(DeviceErrorReport* rep, DeviceErrorCode code, int64_t value,
                                                    int64_t bound) {
  volatile DeviceErrorReport* r = rep;
  if (r->code != 0) return;
  r->value = value;
  r->bound = bound;
  __threadfence_system();
  r->code = static_cast<int>(code);
}

// The lowest finite value of T (a max's start that no finite value loses to).
template <typename T> __device__ __forceinline__ T lowest() { return sizeof(T) == 4 ? T(-FLT_MAX) : T(-DBL_MAX); }
// A linear attention's guarded denominator den~: den where |den| >= guard, else guard with den's
// sign (0 counting as +).
template <typename T> __device__ __forceinline__ T guarded(T den, T guard) {
  return fabs(den) < guard ? (den >= T(0) ? guard : -guard) : den;
}

// Device math that picks the float or double overload explicitly.
__device__ __forceinline__ float d_exp(float x) { return expf(x); }
__device__ __forceinline__ double d_exp(double x) { return exp(x); }
__device__ __forceinline__ float d_log(float x) { return logf(x); }
__device__ __forceinline__ double d_log(double x) { return log(x); }

template <typename T> __device__ __forceinline__ T neg_inf() { return -static_cast<T>(INFINITY); }
// max(a, b), NaN if either is (fmax drops a NaN: a row of NaN scores would pass for an empty one).
template <typename T> __device__ __forceinline__ T max_nan(T a, T b) { return (a > b || a != a) ? a : b; }
// Max (NaN-propagating) and sum over the 4 lanes of a quad (lanes 4i..4i+3; every lane of the
// warp calls them).
template <typename T> __device__ __forceinline__ T quad_max(T x) {
  x = max_nan(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return max_nan(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
template <typename T> __device__ __forceinline__ T quad_sum(T x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}
// Sum over the 32 lanes of a warp by a butterfly: every lane gets the same bits, in the same
// order every run (every lane of the warp calls it).
template <typename T> __device__ __forceinline__ T warp_sum(T x) {
#pragma unroll
  for (int o = 16; o > 0; o /= 2) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}
// Max over the 32 lanes, by `a > b ? a : b` as the row loops that call it: a NaN would not
// propagate, and those loops keep NaN out of their running max.
template <typename T> __device__ __forceinline__ T warp_max(T x) {
#pragma unroll
  for (int o = 16; o > 0; o /= 2) {
    const T y = __shfl_xor_sync(0xffffffffu, x, o);
    x = y > x ? y : x;
  }
  return x;
}

// ---- attention heads ---------------------------------------------------------------------------
// One head's rows: the first at p, `row` apart.
template <typename T> struct Rows {
  T* p;
  int64_t row;
};

// Where an operand's heads lie: head (b, h) starts at p + b * batch + h * head, its rows `row`
// apart, a row's values contiguous. The attention kernels read and write q, k, v, out and their
// gradients so: the heads of a [B, L, H, D] projection in place (batch L H D, head D, row H D), as
// PyTorch's SDPA kernels do, instead of strided copies into [B, H, L, D] before each call and back
// after (8 launches a layer and training step).
template <typename T> struct HeadRows {
  T* p = nullptr;
  int64_t batch = 0, head = 0, row = 0;
  __host__ __device__ T* at(int64_t bh, int64_t heads) const { return p + bh / heads * batch + bh % heads * head; }
  // Head bh's rows, found once a block (a 64-bit division) rather than once a tile.
  __device__ Rows<T> rows(int64_t bh, int64_t heads) const { return {at(bh, heads), row}; }
};
// The layout the kernels' entries check (check_head_rows, core/kernels.h).
template <typename T> HeadRows<const T> rows_in(const Tensor& t) {
  return {cptr<T>(t), t.stride(0), t.stride(1), t.stride(2)};
}
template <typename T> HeadRows<T> rows_out(const Tensor& t) {
  return {ptr<T>(t), t.stride(0), t.stride(1), t.stride(2)};
}
// Row kernels whose rows are contiguous runs of elements take one warp per row, the lanes
// striding along it: one thread per row made each load instruction touch 32 rows' cache lines
// (the performer's row kernels moved 250-340 GB/s on an H200, which copies at about 4,300).
// WarpRows gives a thread its lane and walks the warps of the grid over `rows`.
struct WarpRows {
  static constexpr int kLanes = 32;
  int lane;
  int64_t first, step;
  __device__ WarpRows()
      : lane(static_cast<int>(threadIdx.x) % kLanes),
        first((blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) / kLanes),
        step(static_cast<int64_t>(gridDim.x) * blockDim.x / kLanes) {}
};
// Blocks for one warp per row.
inline unsigned grid_for_warp_rows(int64_t rows) { return grid_for(rows * WarpRows::kLanes); }

// x[r, :] -= s[r] y[r, :] over [rows, cols] (the part of a row normalization's gradient along its
// row), a warp per row: s[r] read once a row, no division per element. Launch on
// grid_for_warp_rows(rows).
template <typename T>
__global__ void subtract_scaled_rows_kernel(const T* s, const T* y, int64_t rows, int64_t cols, T* x) {
  const WarpRows w;
  for (int64_t r = w.first; r < rows; r += w.step) {
    const T sr = s[r];
    for (int64_t c = w.lane; c < cols; c += WarpRows::kLanes) x[r * cols + c] -= sr * y[r * cols + c];
  }
}

// Causal linear attention's chunk states (cuda/linear_attention.cu; causal FAVOR+ in
// cuda/favor_attention.cu): parts [BH, C, S, E1] (rows ld >= E1 apart, each chunk's own sums) in
// place to the exclusive prefix sums over the chunks (reverse: over the later chunks), from init
// [BH, S, E1] (or 0), the total into total [BH, S, E1] (or nowhere). One thread per (bh, entry),
// the chunks in order: the same bits every run.
template <typename T>
__global__ void scan_chunks_kernel(int64_t BH, int64_t C, int64_t S, int64_t E1, int64_t ld, bool reverse,
                                   const T* init, T* parts, T* total) {
  const int64_t n = S * E1;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < BH * n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t bh = i / n, j = i % n / E1 * ld + i % E1;
    T acc = init ? init[i] : T(0);
    for (int64_t k = 0; k < C; ++k) {
      T& p = parts[(bh * C + (reverse ? C - 1 - k : k)) * S * ld + j];
      const T x = p;
      p = acc;
      acc += x;
    }
    if (total) total[i] = acc;
  }
}
template <typename T>
void scan_chunks(int64_t BH, int64_t C, int64_t S, int64_t E1, int64_t ld, bool reverse, const T* init, T* parts,
                 T* total) {
  scan_chunks_kernel<T>
      <<<grid_for(BH * S * E1), kBlockSize, 0, stream()>>>(BH, C, S, E1, ld, reverse, init, parts, total);
  LINEA_KERNEL_LAUNCH_CHECK();
}

// For kernels that only move elements (copies, where, gathers): calls f(E{}) with E the
// unsigned integer type of the given element size (1, 4 or 8 bytes).
template <typename F> void dispatch_bits(size_t element_size, const char* op, F&& f) {
  switch (element_size) {
    case 1:
      return f(uint8_t{});
    case 4:
      return f(uint32_t{});
    case 8:
      return f(uint64_t{});
    default:
      LINEA_FAIL(op, ": unsupported element size ", element_size);
  }
}

}  // namespace linea::cuda::detail
