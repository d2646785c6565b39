// CPU kernels for indexing and prefix sums: index_select, index_add, embed_tokens,
// prepend_and_add_positions, gather, scatter_add, cumsum, searchsorted (namespace linea::cpu,
// contracts in core/kernels.h). All tensors are contiguous (but index_select's, whose
// SelectLayout says where its values lie) and index values were range-checked by the raw op
// layer. Not the argument checking (core/ops_index.cpp) and not the FFTs (core/cpu/fft.cpp).
//
// Parallelism: work is split over independent (outer, inner-block) tasks. The accumulating
// kernels (index_add, scatter_add) give each task a disjoint set of output positions and walk
// the indexed dim in order inside the task, so they are race-free and their summation order
// (hence the result) does not depend on the number of threads.
#include <algorithm>
#include <cstdint>
#include <vector>

#include "core/cpu/strided.h"
#include "core/kernels.h"
#include "core/search_math.h"

namespace linea::cpu {

namespace {

using detail::kParallelGrain;

// Inner dims are processed in blocks of this many elements per task.
constexpr int64_t kInnerBlock = 512;

// Accumulator type of the prefix sum: float sums run in double.
template <typename T> struct AccOf { using type = T; };
template <> struct AccOf<float> { using type = double; };

// Dims of `idx_shape` split around `dim`: O = prod before, n = size at dim, I = prod after.
struct Split3 {
  int64_t O, n, I;
};
Split3 split3(const Shape& s, int64_t dim) {
  Split3 r{1, s[static_cast<size_t>(dim)], 1};
  for (int64_t d = 0; d < dim; ++d) r.O *= s[static_cast<size_t>(d)];
  for (size_t d = static_cast<size_t>(dim) + 1; d < s.size(); ++d) r.I *= s[d];
  return r;
}

// Offset in a contiguous tensor of shape `xs` (strides `xstr`) of the coordinates obtained by
// decomposing `lin` over idx_shape[lo:hi] (row-major).
int64_t offset_of(int64_t lin, const Shape& idx_shape, const Strides& xstr, int64_t lo, int64_t hi) {
  int64_t off = 0;
  for (int64_t d = hi - 1; d >= lo; --d) {
    const int64_t sz = idx_shape[static_cast<size_t>(d)];
    off += (lin % sz) * xstr[static_cast<size_t>(d)];
    lin /= sz;
  }
  return off;
}

// For i in [0, I): offset in x (strides xstr) of the index-shaped coordinates after dim.
std::vector<int64_t> inner_offsets(const Shape& idx_shape, const Strides& xstr, int64_t dim, int64_t I) {
  std::vector<int64_t> off(static_cast<size_t>(I));
  const int64_t nd = static_cast<int64_t>(idx_shape.size());
  for (int64_t i = 0; i < I; ++i) off[static_cast<size_t>(i)] = offset_of(i, idx_shape, xstr, dim + 1, nd);
  return off;
}

// out = x at index where `at` says they lie (core/kernels.h, SelectLayout): one task a run.
template <typename T>
void index_select_impl(const Tensor& x, const Tensor& index, const Tensor& out, const SelectLayout& at) {
  const T* xp = static_cast<const T*>(x.data_ptr());
  T* op = static_cast<T*>(out.data_ptr());
  const int64_t* ip = index.data<int64_t>();
  const int64_t n = index.numel(), pieces = at.outer * n * at.runs;
#pragma omp parallel for schedule(static) if (pieces * at.run >= kParallelGrain && pieces > 1)
  for (int64_t p = 0; p < pieces; ++p) {
    const int64_t h = p % at.runs, j = p / at.runs % n, o = p / (at.runs * n);
    const T* src = xp + o * at.x_outer + ip[j] * at.x_row + h * at.x_run;
    std::copy(src, src + at.run, op + o * at.out_outer + j * at.out_row + h * at.out_run);
  }
}

template <typename T>
void index_add_impl(const Tensor& out, const Tensor& index, const Tensor& src, int64_t outer, int64_t size,
                    int64_t inner, T alpha) {
  T* op = static_cast<T*>(out.data_ptr());
  const T* sp = static_cast<const T*>(src.data_ptr());
  const int64_t* ip = index.data<int64_t>();
  const int64_t n = index.numel();
  const int64_t blocks = (inner + kInnerBlock - 1) / kInnerBlock;
  const int64_t tasks = outer * blocks;
  // Task (o, block) owns out[o, :, block]: disjoint across tasks; j runs in order inside.
#pragma omp parallel for schedule(static) if (outer * n * inner >= kParallelGrain && tasks > 1)
  for (int64_t t = 0; t < tasks; ++t) {
    const int64_t o = t / blocks, b = t % blocks;
    const int64_t lo = b * kInnerBlock, hi = std::min(inner, lo + kInnerBlock);
    for (int64_t j = 0; j < n; ++j) {
      T* dst = op + (o * size + ip[j]) * inner;
      const T* s = sp + (o * n + j) * inner;
      for (int64_t i = lo; i < hi; ++i) dst[i] += alpha * s[i];
    }
  }
}

template <typename T>
void embed_tokens_impl(const Tensor& weight, const Tensor& index, T scale, const Tensor& positions, int64_t offset,
                       int64_t length, const Tensor& out) {
  const T* wp = static_cast<const T*>(weight.data_ptr());
  const T* pp = positions.defined() ? static_cast<const T*>(positions.data_ptr()) : nullptr;
  T* op = static_cast<T*>(out.data_ptr());
  const int64_t* ip = index.data<int64_t>();
  const int64_t n = index.numel(), D = weight.size(1);
#pragma omp parallel for schedule(static) if (n * D >= kParallelGrain && n > 1)
  for (int64_t j = 0; j < n; ++j) {
    const T* w = wp + ip[j] * D;
    T* o = op + j * D;
    if (pp) {
      const T* p = pp + (offset + j % length) * D;
      for (int64_t c = 0; c < D; ++c) o[c] = scale * w[c] + p[c];
    } else {
      for (int64_t c = 0; c < D; ++c) o[c] = scale * w[c];
    }
  }
}

// out [B, T, D] = (t < P ? prefix[t] : x[b, t - P]) + pos[t], rows of D
template <typename T>
void prepend_positions_impl(const T* x, const T* prefix, const T* pos, int64_t B, int64_t P, int64_t TT, int64_t D,
                            T* out) {
  const int64_t N = TT - P;
#pragma omp parallel for collapse(2) schedule(static) if (B * TT * D >= kParallelGrain)
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < TT; ++t) {
      const T* src = t < P ? prefix + t * D : x + (b * N + t - P) * D;
      const T* p = pos + t * D;
      T* o = out + (b * TT + t) * D;
      for (int64_t c = 0; c < D; ++c) o[c] = src[c] + p[c];
    }
}

// g [B, T, D] -> dx [B, N, D] (g's rows from P on), dpos [T, D] = sum over b from b = 0 up (the
// CUDA kernel's order: the same bits), dprefix [P, D] its first rows; null: not wanted.
template <typename T>
void prepend_positions_backward_impl(const T* g, int64_t B, int64_t P, int64_t TT, int64_t D, T* dx, T* dprefix,
                                     T* dpos) {
  const int64_t N = TT - P;
#pragma omp parallel for schedule(static) if (B * TT * D >= kParallelGrain)
  for (int64_t t = 0; t < TT; ++t) {
    std::vector<T> s(static_cast<size_t>(D), T(0));
    for (int64_t b = 0; b < B; ++b) {
      const T* gr = g + (b * TT + t) * D;
      for (int64_t c = 0; c < D; ++c) s[c] += gr[c];
      if (dx && t >= P) std::copy(gr, gr + D, dx + (b * N + t - P) * D);
    }
    if (dpos) std::copy(s.begin(), s.end(), dpos + t * D);
    if (dprefix && t < P) std::copy(s.begin(), s.end(), dprefix + t * D);
  }
}

template <typename T> void gather_impl(const Tensor& x, const Tensor& index, const Tensor& out, int64_t dim) {
  const T* xp = static_cast<const T*>(x.data_ptr());
  T* op = static_cast<T*>(out.data_ptr());
  const int64_t* ip = index.data<int64_t>();
  const Shape& is = index.shape();
  const Strides& xstr = x.strides();
  const Split3 s = split3(is, dim);
  const int64_t xs_dim = xstr[static_cast<size_t>(dim)];
  const std::vector<int64_t> ioff = inner_offsets(is, xstr, dim, s.I);
  const int64_t rows = s.O * s.n;
  // Row (o, j) of the index covers I contiguous elements of index/out.
#pragma omp parallel for schedule(static) if (rows * s.I >= kParallelGrain && rows > 1)
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t o = r / s.n;
    const int64_t base = offset_of(o, is, xstr, 0, dim);
    const int64_t* irow = ip + r * s.I;
    T* orow = op + r * s.I;
    for (int64_t i = 0; i < s.I; ++i) orow[i] = xp[base + irow[i] * xs_dim + ioff[static_cast<size_t>(i)]];
  }
}

template <typename T> void scatter_add_impl(const Tensor& out, const Tensor& index, const Tensor& src, int64_t dim) {
  T* op = static_cast<T*>(out.data_ptr());
  const T* sp = static_cast<const T*>(src.data_ptr());
  const int64_t* ip = index.data<int64_t>();
  const Shape& is = index.shape();
  const Strides& ostr = out.strides();
  const Split3 s = split3(is, dim);
  const int64_t os_dim = ostr[static_cast<size_t>(dim)];
  const std::vector<int64_t> ioff = inner_offsets(is, ostr, dim, s.I);
  const int64_t blocks = (s.I + kInnerBlock - 1) / kInnerBlock;
  const int64_t tasks = s.O * blocks;
  // Positions with different (o, i) never collide (they differ off dim), so task (o, block)
  // owns its targets; j runs in order inside a task.
#pragma omp parallel for schedule(static) if (s.O * s.n * s.I >= kParallelGrain && tasks > 1)
  for (int64_t t = 0; t < tasks; ++t) {
    const int64_t o = t / blocks, b = t % blocks;
    const int64_t lo = b * kInnerBlock, hi = std::min(s.I, lo + kInnerBlock);
    const int64_t base = offset_of(o, is, ostr, 0, dim);
    for (int64_t j = 0; j < s.n; ++j) {
      const int64_t row = (o * s.n + j) * s.I;
      for (int64_t i = lo; i < hi; ++i) op[base + ip[row + i] * os_dim + ioff[static_cast<size_t>(i)]] += sp[row + i];
    }
  }
}

template <typename T>
void cumsum_impl(const Tensor& x, const Tensor& out, int64_t outer, int64_t r, int64_t inner, bool reverse) {
  using acc_t = typename AccOf<T>::type;
  const T* xp = static_cast<const T*>(x.data_ptr());
  T* op = static_cast<T*>(out.data_ptr());
  const int64_t blocks = (inner + kInnerBlock - 1) / kInnerBlock;
  const int64_t tasks = outer * blocks;
#pragma omp parallel for schedule(static) if (outer * r * inner >= kParallelGrain && tasks > 1)
  for (int64_t t = 0; t < tasks; ++t) {
    const int64_t o = t / blocks, b = t % blocks;
    const int64_t lo = b * kInnerBlock, hi = std::min(inner, lo + kInnerBlock);
    acc_t acc[kInnerBlock];
    std::fill(acc, acc + (hi - lo), acc_t(0));
    for (int64_t k = 0; k < r; ++k) {
      const int64_t kk = reverse ? r - 1 - k : k;
      const int64_t row = (o * r + kk) * inner;
      for (int64_t i = lo; i < hi; ++i) {
        acc[i - lo] += static_cast<acc_t>(xp[row + i]);
        op[row + i] = static_cast<T>(acc[i - lo]);
      }
    }
  }
}

// out[i] = the position of values[i] in its row of sorted [R, M] (S values per row).
template <typename T>
void searchsorted_impl(const T* sorted, const T* values, int64_t n, int64_t M, int64_t S, bool right, int64_t* out) {
#pragma omp parallel for schedule(static) if (n * 8 >= kParallelGrain)
  for (int64_t i = 0; i < n; ++i) out[i] = sorted_position(sorted + (i / S) * M, M, values[i], right);
}

}  // namespace

// out = x at index where `at` says they lie
void index_select(const Tensor& x, const Tensor& index, const Tensor& out, const SelectLayout& at) {
  LINEA_DISPATCH_ALL(x.dtype(), "index_select", [&] { index_select_impl<scalar_t>(x, index, out, at); });
}

// out [outer, size, inner] += alpha * src [outer, n, inner] at index [n]
void index_add(const Tensor& out, const Tensor& index, const Tensor& src, int64_t outer, int64_t size, int64_t inner,
               double alpha) {
  LINEA_DISPATCH_NUMERIC(out.dtype(), "index_add", [&] {
    index_add_impl<scalar_t>(out, index, src, outer, size, inner, static_cast<scalar_t>(alpha));
  });
}

// out [n, D] = scale * weight at index + positions at offset + (j % length) (the caller checked the
// index values)
void embed_tokens(const Tensor& weight, const Tensor& index, double scale, const Tensor& positions, int64_t offset,
                  int64_t length, const Tensor& out) {
  LINEA_DISPATCH_FLOAT(weight.dtype(), "embed_tokens", [&] {
    embed_tokens_impl<scalar_t>(weight, index, static_cast<scalar_t>(scale), positions, offset, length, out);
  });
}

// out [B, P + N, D] = prefix or x, plus positions (prefix undefined: P = 0)
void prepend_and_add_positions(const Tensor& x, const Tensor& prefix, const Tensor& positions, const Tensor& out) {
  const int64_t B = out.size(0), TT = out.size(1), D = out.size(2), P = prefix.defined() ? prefix.size(0) : 0;
  LINEA_DISPATCH_FLOAT(out.dtype(), "prepend_and_add_positions", [&] {
    prepend_positions_impl<scalar_t>(x.data<scalar_t>(), prefix.defined() ? prefix.data<scalar_t>() : nullptr,
                                     positions.data<scalar_t>(), B, P, TT, D, out.data<scalar_t>());
  });
}

// dx, dprefix, dpositions (each undefined: not wanted) from g [B, P + N, D]
void prepend_and_add_positions_backward(const Tensor& g, int64_t prefix_len, const Tensor& dx, const Tensor& dprefix,
                                        const Tensor& dpositions) {
  LINEA_DISPATCH_FLOAT(g.dtype(), "prepend_and_add_positions_backward", [&] {
    using T = scalar_t;
    const auto p = [](const Tensor& t) { return t.defined() ? t.data<T>() : nullptr; };
    prepend_positions_backward_impl<T>(g.data<T>(), g.size(0), prefix_len, g.size(1), g.size(2), p(dx), p(dprefix),
                                       p(dpositions));
  });
}

// out (index's shape) = x at index along dim
void gather(const Tensor& x, const Tensor& index, const Tensor& out, int64_t dim) {
  LINEA_DISPATCH_ALL(x.dtype(), "gather", [&] { gather_impl<scalar_t>(x, index, out, dim); });
}

// out along dim at index += src (index and src have the same shape)
void scatter_add(const Tensor& out, const Tensor& index, const Tensor& src, int64_t dim) {
  LINEA_DISPATCH_NUMERIC(out.dtype(), "scatter_add", [&] { scatter_add_impl<scalar_t>(out, index, src, dim); });
}

// inclusive prefix sum over r of x [outer, r, inner]; reverse sums from the end
void cumsum(const Tensor& x, const Tensor& out, int64_t outer, int64_t r, int64_t inner, bool reverse) {
  LINEA_DISPATCH_NUMERIC(x.dtype(), "cumsum", [&] { cumsum_impl<scalar_t>(x, out, outer, r, inner, reverse); });
}

void searchsorted(const Tensor& sorted, const Tensor& values, bool right, const Tensor& out) {
  LINEA_DISPATCH_FLOAT(values.dtype(), "searchsorted", [&] {
    searchsorted_impl<scalar_t>(sorted.data<scalar_t>(), values.data<scalar_t>(), values.numel(), sorted.size(-1),
                                values.size(-1), right, out.data<int64_t>());
  });
}

}  // namespace linea::cpu
