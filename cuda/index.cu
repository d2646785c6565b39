// CUDA kernels for indexing and prefix sums: index_select, index_add, embed_tokens,
// prepend_and_add_positions, gather,
// scatter_add, cumsum, searchsorted (namespace linea::cuda, contracts in core/kernels.h; CPU
// reference core/cpu/index.cpp). All tensors are contiguous (but index_select's, whose
// SelectLayout says where its values lie).
//
// Index values are not checked on the host for CUDA tensors (that would need a host sync):
// a kernel that meets an index outside [0, size) reads 0 (or skips the addition) and files a
// report that the host turns into linea::Error at the next synchronization (see
// DeviceErrorReport in cuda/context.h).
// index_add and scatter_add are deterministic and equal the CPU's results bit for bit: the
// source positions are sorted by target with CUB's radix sort, which is stable (equal targets
// keep their positions' order), and one thread per target adds its sources in that order, the
// CPU's. An embedding's backward is one of these, so training runs repeat exactly (with
// atomicAdd the order, hence the rounding, changed from run to run: seen on an H100).
// Kernels that only move data (index_select, gather) are instantiated per element size.
// Not here: argument checks, dim handling, allocation (core/ops_index.cpp).
#include <cub/device/device_radix_sort.cuh>

#include <type_traits>

#include "core/kernels.h"
#include "core/search_math.h"
#include "cuda/common.cuh"

namespace linea::cuda {

using namespace linea::cuda::detail;

namespace {

// out = x at index where `at` says they lie (core/kernels.h, SelectLayout)
template <typename E>
__global__ void index_select_kernel(const E* x, const int64_t* index, E* out, int64_t n, SelectLayout at,
                                    DeviceErrorReport* rep) {
  const int64_t total = at.outer * n * at.runs * at.run;
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < total;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t i = e % at.run, r = e / at.run, h = r % at.runs, j = r / at.runs % n, o = r / (at.runs * n);
    const int64_t idx = index[j];
    E* dst = out + o * at.out_outer + j * at.out_row + h * at.out_run + i;
    if (idx < 0 || idx >= at.size) {
      report_device_error(rep, DeviceErrorCode::IndexSelect, idx, at.size);
      *dst = E(0);
      continue;
    }
    *dst = x[o * at.x_outer + idx * at.x_row + h * at.x_run + i];
  }
}

__global__ void iota_kernel(int64_t* p, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    p[i] = i;
}

// pos[0, n) = the positions 0..n-1 ordered by (key, position); key: n int64 on the device. CUB's
// radix sort of the pairs (key, position) is stable, hence the position order among equal keys.
void sort_positions(const int64_t* key, int64_t n, int64_t* pos) {
  DeviceScratch<int64_t> positions(n), sorted_keys(n);
  iota_kernel<<<grid_for(n), kBlockSize, 0, stream()>>>(positions.p, n);
  LINEA_KERNEL_LAUNCH_CHECK();
  size_t bytes = 0;
  LINEA_CUDA_CHECK(
      cub::DeviceRadixSort::SortPairs(nullptr, bytes, key, sorted_keys.p, positions.p, pos, n, 0, 64, stream()));
  DeviceScratch<unsigned char> temp(static_cast<int64_t>(bytes));
  LINEA_CUDA_CHECK(
      cub::DeviceRadixSort::SortPairs(temp.p, bytes, key, sorted_keys.p, positions.p, pos, n, 0, 64, stream()));
}

// acc + a * b rounded as the CPU rounds it, the product and then the sum: nvcc would fuse the two
// into one fma, and a scaled sum's last bits would differ from the CPU's.
template <typename T> __device__ T add_product_unfused(T acc, T a, T b) {
#ifdef __CUDA_ARCH__
  if constexpr (std::is_same_v<T, float>) return __fadd_rn(acc, __fmul_rn(a, b));
  if constexpr (std::is_same_v<T, double>) return __dadd_rn(acc, __dmul_rn(a, b));
#endif
  return acc + a * b;
}

// out [outer, size, inner] += alpha * src [outer, n, inner] at index [n], pos the positions 0..n-1
// sorted by (index, position): the thread of (o, p, i) where sorted position p starts a run of
// one index adds the run's sources to out in position order (the other threads have nothing to
// do).
template <typename T>
__global__ void index_add_sorted_kernel(T* out, const int64_t* index, const int64_t* pos, const T* src, int64_t outer,
                                        int64_t size, int64_t n, int64_t inner, T alpha, DeviceErrorReport* rep) {
  const int64_t total = outer * n * inner;
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < total;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t i = e % inner, p = (e / inner) % n, o = e / (inner * n);
    const int64_t idx = index[pos[p]];
    if (p > 0 && index[pos[p - 1]] == idx) continue;  // inside a run
    if (idx < 0 || idx >= size) {
      report_device_error(rep, DeviceErrorCode::IndexAdd, idx, size);
      continue;
    }
    T* dst = out + (o * size + idx) * inner + i;
    T acc = *dst;
    for (int64_t q = p; q < n && index[pos[q]] == idx; ++q)
      acc = add_product_unfused(acc, alpha, src[(o * n + pos[q]) * inner + i]);
    *dst = acc;
  }
}

// out [n, D] = scale * weight [V, D] at index [n] + positions at offset + (j % length) for row j
// (positions null: none).
template <typename T>
__global__ void embed_tokens_kernel(const T* weight, const int64_t* index, T scale, const T* positions, int64_t offset,
                                    int64_t length, T* out, int64_t n, int64_t V, int64_t D, DeviceErrorReport* rep) {
  const int64_t total = n * D;
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < total;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t c = e % D, j = e / D;
    const int64_t idx = index[j];
    if (idx < 0 || idx >= V) {
      report_device_error(rep, DeviceErrorCode::EmbedTokens, idx, V);
      out[e] = T(0);
      continue;
    }
    const T w = weight[idx * D + c];  // no table: the product alone (0 + it would turn -0 into +0)
    out[e] = positions ? add_product_unfused(positions[(offset + j % length) * D + c], scale, w) : scale * w;
  }
}

// out [B, T, D] = (t < P ? prefix[t] : x[b, t - P]) + pos[t] (prefix null: P = 0)
template <typename T>
__global__ void prepend_positions_kernel(const T* x, const T* prefix, const T* pos, int64_t B, int64_t P, int64_t TT,
                                         int64_t D, T* out) {
  const int64_t total = B * TT * D, row = TT * D;
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < total;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t b = e / row, te = e % row, t = te / D;  // te = t * D + c
    const T v = t < P ? prefix[te] : x[b * (TT - P) * D + te - P * D];
    out[e] = v + pos[te];
  }
}

// A thread per (t, c) of [T, D]: g's column summed over b from b = 0 up (the CPU's order: the same
// bits) into dpos (and dprefix for t < P), and copied into dx for t >= P; null: not wanted. B
// steps of coalesced reads per thread: for the few hundred rows of a ViT's batch.
template <typename T>
__global__ void prepend_positions_backward_kernel(const T* g, int64_t B, int64_t P, int64_t TT, int64_t D, T* dx,
                                                  T* dprefix, T* dpos) {
  const int64_t row = TT * D;
  for (int64_t te = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; te < row;
       te += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const bool copy = dx && te >= P * D;
    T s = 0;
    for (int64_t b = 0; b < B; ++b) {
      const T v = g[b * row + te];
      s += v;
      if (copy) dx[b * (TT - P) * D + te - P * D] = v;
    }
    if (dpos) dpos[te] = s;
    if (dprefix && te < P * D) dprefix[te] = s;
  }
}

// out (index's shape I) = x at index along dim. oc maps a position of I to x's offset with
// dim's coordinate left out; xs_dim is x's stride along dim, size its length.
template <typename E>
__global__ void gather_kernel(const E* x, const int64_t* index, E* out, int64_t total, OffsetCalc<1> oc, int64_t xs_dim,
                              int64_t size, DeviceErrorReport* rep) {
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < total;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t idx = index[e];
    if (idx < 0 || idx >= size) {
      report_device_error(rep, DeviceErrorCode::Gather, idx, size);
      out[e] = E(0);
      continue;
    }
    int64_t off[1];
    oc.get(e, off);
    out[e] = x[off[0] + idx * xs_dim];
  }
}

// scatter_add's targets: key[e] = out's offset that position e of index adds to, or -1 for an
// index outside [0, size) (reported; such positions are skipped). oc as in gather, for out.
__global__ void scatter_targets_kernel(const int64_t* index, int64_t* key, int64_t total, OffsetCalc<1> oc,
                                       int64_t os_dim, int64_t size, DeviceErrorReport* rep) {
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < total;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t idx = index[e];
    if (idx < 0 || idx >= size) {
      report_device_error(rep, DeviceErrorCode::ScatterAdd, idx, size);
      key[e] = -1;
      continue;
    }
    int64_t off[1];
    oc.get(e, off);
    key[e] = off[0] + idx * os_dim;
  }
}

// out at key[pos[p]] += src[pos[p]], each target's sources added in position order by the thread
// of the sorted position that starts its run (positions of one target differ only along dim, so
// this is the CPU's order).
template <typename T>
__global__ void scatter_add_sorted_kernel(T* out, const int64_t* key, const int64_t* pos, const T* src, int64_t total) {
  for (int64_t p = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; p < total;
       p += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t target = key[pos[p]];
    if (target < 0 || (p > 0 && key[pos[p - 1]] == target)) continue;
    T acc = out[target];
    for (int64_t q = p; q < total && key[pos[q]] == target; ++q) acc += src[pos[q]];
    out[target] = acc;
  }
}

// Inclusive prefix sum over r for each column (o, i) of [outer, r, inner], one thread per
// column walking r in order (reverse: from the end), accumulating in AccOf<T> as the CPU.
template <typename T>
__global__ void cumsum_kernel(const T* x, T* out, int64_t outer, int64_t r, int64_t inner, bool reverse) {
  using A = typename AccOf<T>::type;
  const int64_t columns = outer * inner;
  for (int64_t c = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; c < columns;
       c += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t o = c / inner, i = c % inner;
    const int64_t base = o * r * inner + i;
    A acc = 0;
    for (int64_t k = 0; k < r; ++k) {
      const int64_t kk = reverse ? r - 1 - k : k;
      acc += static_cast<A>(x[base + kk * inner]);
      out[base + kk * inner] = static_cast<T>(acc);
    }
  }
}

// out[i] = the position of values[i] in its row of sorted [R, M] (S values per row).
template <typename T>
__global__ void searchsorted_kernel(const T* sorted, const T* values, int64_t n, int64_t M, int64_t S, bool right,
                                    int64_t* out) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    out[i] = sorted_position(sorted + (i / S) * M, M, values[i], right);
}

// The calculator of gather/scatter_add: positions of `index_shape` (row-major) to offsets in a
// contiguous tensor with strides `strides`, dim's coordinate contributing 0.
OffsetCalc<1> dim_skipping_calc(const Shape& index_shape, const Strides& strides, int64_t dim, const char* op) {
  Strides s = strides;
  s[static_cast<size_t>(dim)] = 0;
  bool contiguous = false;
  return make_offset_calc<1>(index_shape, {&s}, op, &contiguous);
}

void check_index_tensor(const char* op, const Tensor& index) {
  LINEA_CHECK(index.dtype() == DType::Int64 && index.is_contiguous(), op, ": expected a contiguous int64 index, got ",
              dtype_name(index.dtype()), " ", shape_str(index.shape()));
}

}  // namespace

// out = x at index (Int64 [n]) where `at` says they lie
void index_select(const Tensor& x, const Tensor& index, const Tensor& out, const SelectLayout& at) {
  check_index_tensor("index_select", index);
  const int64_t n = index.numel(), total = at.outer * n * at.runs * at.run;
  if (total == 0) return;
  auto run = [&](auto bits) {
    using E = decltype(bits);
    index_select_kernel<E><<<grid_for(total), kBlockSize, 0, stream()>>>(cptr<E>(x), cptr<int64_t>(index), ptr<E>(out),
                                                                         n, at, device_error_report());
    LINEA_KERNEL_LAUNCH_CHECK();
  };
  dispatch_bits(x.element_size(), "index_select", run);
}

// out [outer, size, inner] += alpha * src [outer, n, inner] at index (Int64 [n])
void index_add(const Tensor& out, const Tensor& index, const Tensor& src, int64_t outer, int64_t size, int64_t inner,
               double alpha) {
  check_index_tensor("index_add", index);
  const int64_t n = index.numel();
  LINEA_CHECK(out.numel() == outer * size * inner && src.numel() == outer * n * inner, "index_add: out ",
              shape_str(out.shape()), ", src ", shape_str(src.shape()), " do not match [", outer, ", ", size, "/", n,
              ", ", inner, "]");
  const int64_t total = src.numel();
  if (total == 0) return;
  DeviceBuffer pos(sizeof(int64_t) * static_cast<size_t>(n));
  sort_positions(cptr<int64_t>(index), n, pos.as<int64_t>());
  LINEA_DISPATCH_NUMERIC(out.dtype(), "index_add", [&] {
    index_add_sorted_kernel<scalar_t><<<grid_for(total), kBlockSize, 0, stream()>>>(
        ptr<scalar_t>(out), cptr<int64_t>(index), pos.as<int64_t>(), cptr<scalar_t>(src), outer, size, n, inner,
        static_cast<scalar_t>(alpha), device_error_report());
    LINEA_KERNEL_LAUNCH_CHECK();
  });
}

// out [n, D] = scale * weight [V, D] at index (Int64 [n]) + positions [max_len, D] at offset +
// (j % length) for row j (positions undefined: none)
void embed_tokens(const Tensor& weight, const Tensor& index, double scale, const Tensor& positions, int64_t offset,
                  int64_t length, const Tensor& out) {
  check_index_tensor("embed_tokens", index);
  const int64_t n = index.numel(), V = weight.size(0), D = weight.size(1);
  LINEA_CHECK(out.numel() == n * D && length > 0 && n % length == 0 &&
                  (!positions.defined() || (positions.size(1) == D && offset + length <= positions.size(0))),
              "embed_tokens: weight ", shape_str(weight.shape()), ", ", n, " indices in rows of ", length,
              ", positions ", positions.defined() ? shape_str(positions.shape()) : std::string("none"), " at offset ",
              offset, ", out ", shape_str(out.shape()));
  if (out.numel() == 0) return;
  LINEA_DISPATCH_FLOAT(weight.dtype(), "embed_tokens", [&] {
    embed_tokens_kernel<scalar_t><<<grid_for(out.numel()), kBlockSize, 0, stream()>>>(
        cptr<scalar_t>(weight), cptr<int64_t>(index), static_cast<scalar_t>(scale), cptr_or_null<scalar_t>(positions),
        offset, length, ptr<scalar_t>(out), n, V, D, device_error_report());
    LINEA_KERNEL_LAUNCH_CHECK();
  });
}

// out [B, P + N, D] = prefix or x, plus positions (prefix undefined: P = 0)
void prepend_and_add_positions(const Tensor& x, const Tensor& prefix, const Tensor& positions, const Tensor& out) {
  const int64_t B = out.size(0), TT = out.size(1), D = out.size(2), P = prefix.defined() ? prefix.size(0) : 0;
  if (out.numel() == 0) return;
  LINEA_DISPATCH_FLOAT(out.dtype(), "prepend_and_add_positions", [&] {
    using T = scalar_t;
    prepend_positions_kernel<T><<<grid_for(out.numel()), kBlockSize, 0, stream()>>>(
        cptr<T>(x), cptr_or_null<T>(prefix), cptr<T>(positions), B, P, TT, D, ptr<T>(out));
    LINEA_KERNEL_LAUNCH_CHECK();
  });
}

// dx, dprefix, dpositions (each undefined: not wanted) from g [B, P + N, D]
void prepend_and_add_positions_backward(const Tensor& g, int64_t prefix_len, const Tensor& dx, const Tensor& dprefix,
                                        const Tensor& dpositions) {
  const int64_t B = g.size(0), TT = g.size(1), D = g.size(2);
  if (TT * D == 0) return;
  LINEA_DISPATCH_FLOAT(g.dtype(), "prepend_and_add_positions_backward", [&] {
    using T = scalar_t;
    prepend_positions_backward_kernel<T><<<grid_for(TT * D), kBlockSize, 0, stream()>>>(
        cptr<T>(g), B, prefix_len, TT, D, ptr_or_null<T>(dx), ptr_or_null<T>(dprefix), ptr_or_null<T>(dpositions));
    LINEA_KERNEL_LAUNCH_CHECK();
  });
}

// out = x gathered along dim at index; index Int64 with x's ndim, out index's shape
void gather(const Tensor& x, const Tensor& index, const Tensor& out, int64_t dim) {
  check_index_tensor("gather", index);
  LINEA_CHECK(index.dim() == x.dim() && dim >= 0 && dim < x.dim() && out.shape() == index.shape(), "gather: x ",
              shape_str(x.shape()), ", index ", shape_str(index.shape()), ", out ", shape_str(out.shape()), ", dim ",
              dim);
  const int64_t total = index.numel();
  if (total == 0) return;
  const OffsetCalc<1> oc = dim_skipping_calc(index.shape(), x.strides(), dim, "gather");
  const int64_t xs_dim = x.stride(dim), size = x.size(dim);
  auto run = [&](auto bits) {
    using E = decltype(bits);
    gather_kernel<E><<<grid_for(total), kBlockSize, 0, stream()>>>(cptr<E>(x), cptr<int64_t>(index), ptr<E>(out), total,
                                                                   oc, xs_dim, size, device_error_report());
    LINEA_KERNEL_LAUNCH_CHECK();
  };
  dispatch_bits(x.element_size(), "gather", run);
}

// out (accumulated into) along dim at index += src; index and src have the same shape
void scatter_add(const Tensor& out, const Tensor& index, const Tensor& src, int64_t dim) {
  check_index_tensor("scatter_add", index);
  LINEA_CHECK(index.dim() == out.dim() && dim >= 0 && dim < out.dim() && src.shape() == index.shape(),
              "scatter_add: out ", shape_str(out.shape()), ", index ", shape_str(index.shape()), ", src ",
              shape_str(src.shape()), ", dim ", dim);
  const int64_t total = index.numel();
  if (total == 0) return;
  const OffsetCalc<1> oc = dim_skipping_calc(index.shape(), out.strides(), dim, "scatter_add");
  const int64_t os_dim = out.stride(dim), size = out.size(dim);
  DeviceBuffer key(sizeof(int64_t) * static_cast<size_t>(total));
  DeviceBuffer pos(sizeof(int64_t) * static_cast<size_t>(total));
  scatter_targets_kernel<<<grid_for(total), kBlockSize, 0, stream()>>>(cptr<int64_t>(index), key.as<int64_t>(), total,
                                                                      oc, os_dim, size, device_error_report());
  LINEA_KERNEL_LAUNCH_CHECK();
  sort_positions(key.as<int64_t>(), total, pos.as<int64_t>());
  LINEA_DISPATCH_NUMERIC(out.dtype(), "scatter_add", [&] {
    scatter_add_sorted_kernel<scalar_t><<<grid_for(total), kBlockSize, 0, stream()>>>(
        ptr<scalar_t>(out), key.as<int64_t>(), pos.as<int64_t>(), cptr<scalar_t>(src), total);
    LINEA_KERNEL_LAUNCH_CHECK();
  });
}

// inclusive prefix sum over r of x [outer, r, inner]; reverse sums from the end
void cumsum(const Tensor& x, const Tensor& out, int64_t outer, int64_t r, int64_t inner, bool reverse) {
  LINEA_CHECK(x.numel() == outer * r * inner && out.numel() == x.numel(), "cumsum: x ", shape_str(x.shape()),
              " does not match [", outer, ", ", r, ", ", inner, "]");
  const int64_t columns = outer * inner;
  if (columns == 0 || r == 0) return;
  LINEA_DISPATCH_NUMERIC(x.dtype(), "cumsum", [&] {
    cumsum_kernel<scalar_t><<<grid_for(columns), kBlockSize, 0, stream()>>>(cptr<scalar_t>(x), ptr<scalar_t>(out),
                                                                            outer, r, inner, reverse);
    LINEA_KERNEL_LAUNCH_CHECK();
  });
}

void searchsorted(const Tensor& sorted, const Tensor& values, bool right, const Tensor& out) {
  const int64_t n = values.numel();
  LINEA_DISPATCH_FLOAT(values.dtype(), "searchsorted", [&] {
    searchsorted_kernel<scalar_t><<<grid_for(n), kBlockSize, 0, stream()>>>(
        cptr<scalar_t>(sorted), cptr<scalar_t>(values), n, sorted.size(-1), values.size(-1), right, ptr<int64_t>(out));
    LINEA_KERNEL_LAUNCH_CHECK();
  });
}

}  // namespace linea::cuda
