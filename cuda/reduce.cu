// CUDA reductions over the middle axis of a contiguous [outer, r, inner] view: sum (of a Bool
// tensor: the count of true, into Int64), max, min, logsumexp, and argmax/argmin (first index on
// ties; NaN wins, as on the CPU). Contracts in core/kernels.h; the CPU reference is
// core/cpu/reduce.cpp.
//
// One kernel skeleton serves both layouts (cuda/common.cuh, "column reductions"): each
// output is a column of r elements; threadIdx.x picks columns, threadIdx.y splits r, and the
// partial results meet in a shared-memory tree. When inner == 1 a column is a contiguous row
// (a block per row for long rows, several rows per block for short ones); when inner > 1
// neighbouring threads read neighbouring columns (coalesced).
// Long reductions over few outputs (e.g. a bias gradient, a full sum) are split along r into
// chunks reduced by many blocks, then combined by a second pass (still deterministic).
// Sums and logsumexp accumulate in double for floating types, as the CPU does.
// Not here: dims handling, keepdim and allocation (linea::raw::reduce in core/ops.cpp).
#include <limits>

#include "core/kernels.h"
#include "cuda/common.cuh"

namespace linea::cuda {

using namespace linea::cuda::detail;

namespace {

// Policies: acc_t, identity(), load(value, j), operator() (combine), finish(acc) -> output.
template <typename T> struct SumP {
  using acc_t = typename AccOf<T>::type;
  __device__ acc_t identity() const { return acc_t(0); }
  __device__ acc_t load(T v, int64_t) const { return static_cast<acc_t>(v); }
  __device__ acc_t operator()(acc_t a, acc_t b) const { return a + b; }
  __device__ T finish(acc_t a) const { return static_cast<T>(a); }
};

// The sum of a Bool tensor: the count of its true elements, into Int64.
struct CountP {
  using acc_t = int64_t;
  __device__ int64_t identity() const { return 0; }
  __device__ int64_t load(uint8_t v, int64_t) const { return v != 0; }
  __device__ int64_t operator()(int64_t a, int64_t b) const { return a + b; }
  __device__ int64_t finish(int64_t a) const { return a; }
};

template <typename T> struct MaxP {  // identity -inf (lowest() for integers), NaN propagates (as the CPU)
  using acc_t = T;
  __device__ T identity() const {
    return std::numeric_limits<T>::has_infinity ? -std::numeric_limits<T>::infinity()
                                                : std::numeric_limits<T>::lowest();
  }
  __device__ T load(T v, int64_t) const { return v; }
  __device__ T operator()(T a, T b) const { return MaxOp()(a, b); }
  __device__ T finish(T a) const { return a; }
};

template <typename T> struct MinP {
  using acc_t = T;
  __device__ T identity() const {
    return std::numeric_limits<T>::has_infinity ? std::numeric_limits<T>::infinity() : std::numeric_limits<T>::max();
  }
  __device__ T load(T v, int64_t) const { return v; }
  __device__ T operator()(T a, T b) const { return MinOp()(a, b); }
  __device__ T finish(T a) const { return a; }
};

template <typename T> struct ArgVal {
  T v;
  int64_t i;  // -1: empty
};

// Winner: the first NaN if any, else the first extreme value. Symmetric in its arguments,
// since the tree combines index sets in no particular order.
template <typename T, bool kMax> struct ArgP {
  using acc_t = ArgVal<T>;
  __device__ acc_t identity() const { return {T(0), -1}; }
  __device__ acc_t load(T v, int64_t j) const { return {v, j}; }
  __device__ acc_t operator()(acc_t a, acc_t b) const {
    if (a.i < 0) return b;
    if (b.i < 0) return a;
    const bool an = a.v != a.v, bn = b.v != b.v;
    if (an || bn) {
      if (an && bn) return a.i < b.i ? a : b;
      return an ? a : b;
    }
    if (a.v == b.v) return a.i < b.i ? a : b;
    return (kMax ? a.v > b.v : a.v < b.v) ? a : b;
  }
  __device__ int64_t finish(acc_t a) const { return a.i < 0 ? 0 : a.i; }
};

// Pass-1 policy of a split reduction: P's load and combine, writing raw accumulators.
template <typename P> struct PartialP {
  using acc_t = typename P::acc_t;
  P p;
  __device__ acc_t identity() const { return p.identity(); }
  template <typename T> __device__ acc_t load(T v, int64_t j) const { return p.load(v, j); }
  __device__ acc_t operator()(acc_t a, acc_t b) const { return p(a, b); }
  __device__ acc_t finish(acc_t a) const { return a; }
};

// Pass-2 policy: combines the accumulators of pass 1, then P's finish.
template <typename P> struct CombineP {
  using acc_t = typename P::acc_t;
  P p;
  __device__ acc_t identity() const { return p.identity(); }
  __device__ acc_t load(acc_t v, int64_t) const { return v; }
  __device__ acc_t operator()(acc_t a, acc_t b) const { return p(a, b); }
  __device__ auto finish(acc_t a) const { return p.finish(a); }
};

// x [outer, r, inner] viewed as [outer, nchunks, chunk, inner] (the last chunk may be short):
// out[o, k, i] = P over j in chunk k of x[o, j, i]. nchunks == 1 is the plain reduction.
template <typename In, typename Out, typename P>
__global__ void reduce_kernel(const In* x, Out* out, int64_t outer, int64_t r, int64_t inner, int64_t nchunks,
                              int64_t chunk, P p) {
  using A = typename P::acc_t;
  A* sh = shared_mem<A>();
  const int64_t columns = outer * nchunks * inner;
  for (int64_t cb = blockIdx.x; cb * blockDim.x < columns; cb += gridDim.x) {
    const int64_t c = cb * blockDim.x + threadIdx.x;
    const bool active = c < columns;
    const int64_t i = c % inner, k = (c / inner) % nchunks, o = c / (inner * nchunks);
    const int64_t j0 = k * chunk, j1 = min(r, j0 + chunk);
    const In* col = x + o * r * inner + i;
    A acc = p.identity();
    if (active)
      for (int64_t j = j0 + threadIdx.y; j < j1; j += blockDim.y) acc = p(acc, p.load(col[j * inner], j));
    acc = tree_reduce_y(acc, p, sh);
    if (active && threadIdx.y == 0) out[c] = p.finish(acc);
  }
}

template <typename In, typename Out, typename P>
void launch_reduce_pass(const In* x, Out* out, int64_t outer, int64_t r, int64_t inner, int64_t nchunks, int64_t chunk,
                        P p) {
  const dim3 block = column_block(std::min(r, chunk), inner);
  const size_t smem = sizeof(typename P::acc_t) * block.x * block.y;
  reduce_kernel<In, Out, P><<<column_grid(outer * nchunks * inner, block), block, smem, stream()>>>(
      x, out, outer, r, inner, nchunks, chunk, p);
  LINEA_KERNEL_LAUNCH_CHECK();
}

// Long reductions over few columns are split along r so that enough blocks run: pass 1
// reduces chunks of at least kMinChunk elements into accumulators [outer, nchunks, inner]
// (scratch), pass 2 combines them.
constexpr int64_t kMinChunk = 256;
constexpr int64_t kWantColumns = 1 << 16;

template <typename T, typename Out, typename P>
void launch_reduce(const Tensor& x, const Tensor& out, int64_t outer, int64_t r, int64_t inner, P p) {
  using A = typename P::acc_t;
  const int64_t columns = outer * inner;
  const int64_t nchunks = std::max<int64_t>(1, std::min(kWantColumns / columns, r / kMinChunk));
  if (nchunks <= 1) {
    launch_reduce_pass(cptr<T>(x), ptr<Out>(out), outer, r, inner, 1, std::max<int64_t>(r, 1), p);
    return;
  }
  const int64_t chunk = (r + nchunks - 1) / nchunks;
  DeviceBuffer partial(sizeof(A) * static_cast<size_t>(outer * nchunks * inner));
  launch_reduce_pass(cptr<T>(x), partial.as<A>(), outer, r, inner, nchunks, chunk, PartialP<P>{p});
  launch_reduce_pass(partial.as<A>(), ptr<Out>(out), outer, nchunks, inner, 1, nchunks, CombineP<P>{p});
}

// logsumexp: m = max; m + log(sum exp(x - m)); an infinite max is returned as is (all -inf,
// or +inf present), as on the CPU.
template <typename T> __global__ void logsumexp_kernel(const T* x, T* out, int64_t columns, int64_t r, int64_t inner) {
  using A = typename AccOf<T>::type;
  for (int64_t cb = blockIdx.x; cb * blockDim.x < columns; cb += gridDim.x) {
    const Column col = column_at(cb, columns, r, inner);
    T m = neg_inf<T>();
    if (col.active)
      for (int64_t j = threadIdx.y; j < r; j += blockDim.y) m = MaxOp()(m, x[col.base + j * inner]);
    m = tree_reduce_y(m, MaxOp(), shared_mem<T>());
    A s = 0;
    if (col.active && !isinf(static_cast<double>(m)))
      for (int64_t j = threadIdx.y; j < r; j += blockDim.y)
        s += exp(static_cast<double>(x[col.base + j * inner]) - static_cast<double>(m));
    s = tree_reduce_y(s, SumOp(), shared_mem<A>());
    if (col.active && threadIdx.y == 0)
      out[col.c] = isinf(static_cast<double>(m)) ? m : static_cast<T>(static_cast<double>(m) + log(s));
  }
}

void check_reduce_args(const char* op, const Tensor& x, const Tensor& out, int64_t outer, int64_t r, int64_t inner) {
  LINEA_CHECK(outer >= 0 && r >= 0 && inner >= 0 && x.numel() == outer * r * inner && out.numel() == outer * inner, op,
              ": x ", shape_str(x.shape()), " / out ", shape_str(out.shape()), " do not match [outer ", outer, ", r ",
              r, ", inner ", inner, "]");
  LINEA_CHECK(x.is_contiguous() && out.is_contiguous(), op, ": expected contiguous tensors");
}

}  // namespace

// x [outer, r, inner] -> out [outer, inner]
void reduce(ReduceOp op, const Tensor& x, const Tensor& out, int64_t outer, int64_t r, int64_t inner) {
  check_reduce_args("reduce", x, out, outer, r, inner);
  if (outer * inner == 0) return;
  if (x.dtype() == DType::Bool) {  // Sum: the count of true into Int64
    LINEA_CHECK(op == ReduceOp::Sum && out.dtype() == DType::Int64, "reduce: a bool tensor sums into int64 only");
    return launch_reduce<uint8_t, int64_t>(x, out, outer, r, inner, CountP());
  }
  LINEA_DISPATCH_NUMERIC(x.dtype(), "reduce", [&] {
    using T = scalar_t;
    switch (op) {
      case ReduceOp::Sum:
        return launch_reduce<T, T>(x, out, outer, r, inner, SumP<T>());
      case ReduceOp::Max:
        return launch_reduce<T, T>(x, out, outer, r, inner, MaxP<T>());
      case ReduceOp::Min:
        return launch_reduce<T, T>(x, out, outer, r, inner, MinP<T>());
      case ReduceOp::LogSumExp: {
        if constexpr (std::is_floating_point_v<T>) {
          const int64_t columns = outer * inner;
          const dim3 block = column_block(r, inner);
          const size_t smem = sizeof(double) * block.x * block.y;
          logsumexp_kernel<T>
              <<<column_grid(columns, block), block, smem, stream()>>>(cptr<T>(x), ptr<T>(out), columns, r, inner);
          LINEA_KERNEL_LAUNCH_CHECK();
          return;
        } else {
          LINEA_FAIL("logsumexp: expected a floating dtype, got ", x.dtype());
        }
      }
    }
  });
}

// index of the max (min) over r, first on ties; out Int64 [outer, inner]
void arg_reduce(bool is_max, const Tensor& x, const Tensor& out, int64_t outer, int64_t r, int64_t inner) {
  check_reduce_args(is_max ? "argmax" : "argmin", x, out, outer, r, inner);
  if (outer * inner == 0) return;
  LINEA_DISPATCH_NUMERIC(x.dtype(), "arg_reduce", [&] {
    using T = scalar_t;
    if (is_max)
      launch_reduce<T, int64_t>(x, out, outer, r, inner, ArgP<T, true>());
    else
      launch_reduce<T, int64_t>(x, out, outer, r, inner, ArgP<T, false>());
  });
}

}  // namespace linea::cuda
