// CUDA elementwise kernels: fill, copy (with dtype conversion), pad, arange, unary ops and their
// derivatives, binary ops, where (namespace linea::cuda, contracts in core/kernels.h).
// The math is the CPU reference's: unary and binary ops call the functors of core/unary_math.h
// and core/binary_math.h (generated switches over the op tables of core/kernels.h);
// conversions are written exactly as in core/cpu/elementwise.cpp.
//
// Every kernel goes through launch_elementwise (cuda/common.cuh): operands of any layout are
// addressed by a strided offset calculator; when all are contiguous a plain-index kernel runs.
// To keep compile time low, the op is a runtime switch inside the kernel (uniform across a
// warp) rather than a template parameter, and ops that only move bytes (fill, same-dtype copy,
// pad, where) are instantiated per element size, not per dtype.
// Not here: argument checks, broadcasting and allocation (linea::raw in core/ops.cpp).
#include <cstring>
#include <type_traits>

#include "core/binary_math.h"
#include "core/kernels.h"
#include "core/unary_math.h"
#include "cuda/common.cuh"

namespace linea::cuda {

using namespace linea::cuda::detail;

namespace {

// Unsigned type of a given element size (for kernels that only move bytes).
template <size_t Bytes> struct Bits;
template <> struct Bits<1> { using type = uint8_t; };
template <> struct Bits<4> { using type = uint32_t; };
template <> struct Bits<8> { using type = uint64_t; };

// ---- fill ------------------------------------------------------------------------------------
template <typename E> struct FillF {
  E* out;
  E value;
  __device__ void operator()(const int64_t (&off)[1]) const { out[off[0]] = value; }
};

template <typename E> void fill_bits(const Tensor& out, const void* value_bits) {
  FillF<E> f{ptr<E>(out), E()};
  std::memcpy(&f.value, value_bits, sizeof(E));
  launch_elementwise<1>("fill", out.shape(), {&out.strides()}, f);
}

// ---- copy --------------------------------------------------------------------------------------
// Conversions are static_casts, except to Bool (D = uint8_t from another type): x != 0, as in
// PyTorch and the CPU kernel.
template <typename D, typename S> struct CopyF {
  D* dst;
  const S* src;
  __device__ void operator()(const int64_t (&off)[2]) const {
    if constexpr (std::is_same_v<D, uint8_t> && !std::is_same_v<S, uint8_t>) {
      dst[off[0]] = src[off[1]] != S(0) ? uint8_t(1) : uint8_t(0);
    } else {
      dst[off[0]] = static_cast<D>(src[off[1]]);
    }
  }
};

template <typename D, typename S> void copy_typed(const Tensor& dst, const Tensor& src) {
  CopyF<D, S> f{ptr<D>(dst), cptr<S>(src)};
  // (one dtype: copy took two contiguous tensors by memcpy)
  launch_elementwise<2, !std::is_same_v<D, S>>("copy", dst.shape(), {&dst.strides(), &src.strides()}, f);
}

// ---- pad ---------------------------------------------------------------------------------------
// Operands: out, x addressed with out's coordinates (shift: its offset of `before` rows along
// dim), and the coordinate along dim itself (a stride of 1 there, 0 elsewhere).
template <typename E> struct PadF {
  E* out;
  const E* x;
  E value;
  int64_t before, n, shift;
  __device__ void operator()(const int64_t (&off)[3]) const {
    const int64_t i = off[2] - before;
    out[off[0]] = i >= 0 && i < n ? x[off[1] - shift] : value;
  }
};

// ---- arange ------------------------------------------------------------------------------------
template <typename T> __global__ void arange_kernel(T* out, int64_t n, double start, double step) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    out[i] = static_cast<T>(start + static_cast<double>(i) * step);
}

// ---- unary ---------------------------------------------------------------------------------------
// The op switches are core/unary_math.h's, generated from the op table.
template <typename T> struct UnaryF {  // operands: out, x
  T* out;
  const T* x;
  UnaryOp op;
  T a, b;
  __device__ void operator()(const int64_t (&off)[2]) const {
    out[off[0]] = linea::detail::unary_forward_switch(op, x[off[1]], a, b);
  }
};

struct UnaryIntF {
  int64_t* out;
  const int64_t* x;
  UnaryOp op;
  int64_t a, b;
  __device__ void operator()(const int64_t (&off)[2]) const {
    out[off[0]] = linea::detail::unary_forward_switch(op, x[off[1]], a, b);
  }
};

template <typename T> struct UnaryBackwardF {  // operands: dx, grad, x, y
  T* dx;
  const T* g;
  const T* x;
  const T* y;
  UnaryOp op;
  T a, b;
  __device__ void operator()(const int64_t (&off)[4]) const {
    dx[off[0]] = linea::detail::unary_backward_switch(op, g[off[1]], x[off[2]], y[off[3]], a, b);
  }
};

// ---- binary ------------------------------------------------------------------------------------
// The math is core/binary_math.h's (binary_apply: a runtime switch generated from the op table).
template <typename T> struct BinaryF {  // operands: out, a, b
  T* out;
  const T* a;
  const T* b;
  BinaryOp op;
  __device__ void operator()(const int64_t (&off)[3]) const {
    out[off[0]] = linea::detail::binary_apply<T>(op, a[off[1]], b[off[2]]);
  }
};

template <typename T> struct CompareF {
  uint8_t* out;
  const T* a;
  const T* b;
  BinaryOp op;
  __device__ void operator()(const int64_t (&off)[3]) const {
    out[off[0]] = linea::detail::binary_apply<uint8_t>(op, a[off[1]], b[off[2]]);
  }
};

// ---- where ---------------------------------------------------------------------------------------
template <typename E> struct WhereF {  // operands: out, cond, a, b
  E* out;
  const uint8_t* cond;
  const E* a;
  const E* b;
  __device__ void operator()(const int64_t (&off)[4]) const { out[off[0]] = cond[off[1]] ? a[off[2]] : b[off[3]]; }
};

}  // namespace

// out (any layout) = value
void fill(const Tensor& out, double value) {
  if (out.numel() == 0) return;
  LINEA_DISPATCH_ALL(out.dtype(), "fill", [&] {
    const scalar_t v = static_cast<scalar_t>(value);
    const scalar_t zero = scalar_t(0);
    if (std::memcmp(&v, &zero, sizeof(v)) == 0 && out.is_contiguous()) {  // all-zero bits (not -0.0)
      count_work(counter_cells().device_copies);
      LINEA_CUDA_CHECK(
          cudaMemsetAsync(out.data_ptr(), 0, static_cast<size_t>(out.numel()) * sizeof(scalar_t), stream()));
      return;
    }
    fill_bits<typename Bits<sizeof(scalar_t)>::type>(out, &v);
  });
}

// dst = src, same shape, any layouts, dtypes may differ
void copy(const Tensor& dst, const Tensor& src) {
  LINEA_CHECK(dst.shape() == src.shape(), "copy: shapes differ: dst ", shape_str(dst.shape()), ", src ",
              shape_str(src.shape()));
  if (dst.numel() == 0) return;
  if (dst.dtype() == src.dtype()) {
    if (dst.is_contiguous() && src.is_contiguous()) {
      count_work(counter_cells().device_copies);
      LINEA_CUDA_CHECK(cudaMemcpyAsync(dst.data_ptr(), src.data_ptr(),
                                       static_cast<size_t>(dst.numel()) * dst.element_size(), cudaMemcpyDeviceToDevice,
                                       stream()));
      return;
    }
    dispatch_bits(dst.element_size(), "copy", [&](auto bits) {
      using E = decltype(bits);
      copy_typed<E, E>(dst, src);
    });
    return;
  }
  LINEA_DISPATCH_ALL(dst.dtype(), "copy", [&] {
    using dst_t = scalar_t;
    LINEA_DISPATCH_ALL(src.dtype(), "copy", [&] {
      // (one dtype moved bits above: no conversion kernels of a type to itself)
      if constexpr (!std::is_same_v<dst_t, scalar_t>) copy_typed<dst_t, scalar_t>(dst, src);
    });
  });
}

// out = x with value before and after it along dim; one kernel whatever x's layout
void pad(const Tensor& x, int64_t dim, int64_t before, double value, const Tensor& out) {
  LINEA_CHECK(x.dtype() == out.dtype(), "pad: dtypes differ: x ", dtype_name(x.dtype()), ", out ",
              dtype_name(out.dtype()));
  if (out.numel() == 0) return;
  Strides along(out.shape().size(), 0);
  along[static_cast<size_t>(dim)] = 1;
  LINEA_DISPATCH_ALL(out.dtype(), "pad", [&] {
    const scalar_t v = static_cast<scalar_t>(value);
    dispatch_bits(sizeof(scalar_t), "pad", [&](auto bits) {
      using E = decltype(bits);
      PadF<E> f{ptr<E>(out), cptr<E>(x), E(), before, x.size(dim), before * x.strides()[static_cast<size_t>(dim)]};
      std::memcpy(&f.value, &v, sizeof(E));
      launch_elementwise<3>("pad", out.shape(), {&out.strides(), &x.strides(), &along}, f);
    });
  });
}

// out[i] = start + i * step (out contiguous)
void arange(const Tensor& out, double start, double step) {
  const int64_t n = out.numel();
  if (n == 0) return;
  LINEA_CHECK(out.is_contiguous(), "arange: expected a contiguous output");
  LINEA_DISPATCH_NUMERIC(out.dtype(), "arange", [&] {
    arange_kernel<scalar_t><<<grid_for(n), kBlockSize, 0, stream()>>>(ptr<scalar_t>(out), n, start, step);
    LINEA_KERNEL_LAUNCH_CHECK();
  });
}

// out = op(x); x, out any layout, same shape and dtype
void unary(UnaryOp op, const Tensor& x, const Tensor& out, double a, double b) {
  LINEA_CHECK(x.shape() == out.shape(), unary_op_name(op), ": shapes differ: x ", shape_str(x.shape()), ", out ",
              shape_str(out.shape()));
  if (x.dtype() == DType::Int64) {
    LINEA_CHECK(unary_supports_integers(op), unary_op_name(op), ": expected a floating dtype, got int64");
    UnaryIntF f{ptr<int64_t>(out), cptr<int64_t>(x), op, linea::detail::scalar_param<int64_t>(a),
                linea::detail::scalar_param<int64_t>(b)};
    launch_elementwise<2>(unary_op_name(op), out.shape(), {&out.strides(), &x.strides()}, f);
    return;
  }
  LINEA_DISPATCH_FLOAT(x.dtype(), unary_op_name(op), [&] {
    UnaryF<scalar_t> f{ptr<scalar_t>(out), cptr<scalar_t>(x), op, linea::detail::scalar_param<scalar_t>(a),
                       linea::detail::scalar_param<scalar_t>(b)};
    launch_elementwise<2>(unary_op_name(op), out.shape(), {&out.strides(), &x.strides()}, f);
  });
}

// dx = grad * op'(x), with y = op(x); all the same shape (any layout handled)
void unary_backward(UnaryOp op, const Tensor& grad, const Tensor& x, const Tensor& y, const Tensor& dx, double a,
                    double b) {
  const Tensor& yy = y.defined() ? y : x;  // every op's derivative reads y only when it was given
  LINEA_CHECK(grad.shape() == dx.shape() && x.shape() == dx.shape() && yy.shape() == dx.shape(), unary_op_name(op),
              " backward: shapes differ: grad ", shape_str(grad.shape()), ", x ", shape_str(x.shape()), ", dx ",
              shape_str(dx.shape()));
  LINEA_DISPATCH_FLOAT(x.dtype(), unary_op_name(op), [&] {
    UnaryBackwardF<scalar_t> f{ptr<scalar_t>(dx),
                               cptr<scalar_t>(grad),
                               cptr<scalar_t>(x),
                               cptr<scalar_t>(yy),
                               op,
                               linea::detail::scalar_param<scalar_t>(a),
                               linea::detail::scalar_param<scalar_t>(b)};
    launch_elementwise<4>(unary_op_name(op), dx.shape(), {&dx.strides(), &grad.strides(), &x.strides(), &yy.strides()},
                          f);
  });
}

// out = a op b; a, b already expanded to out's shape; any layouts
void binary(BinaryOp op, const Tensor& a, const Tensor& b, const Tensor& out) {
  LINEA_CHECK(a.shape() == out.shape() && b.shape() == out.shape(), binary_op_name(op), ": shapes differ: a ",
              shape_str(a.shape()), ", b ", shape_str(b.shape()), ", out ", shape_str(out.shape()));
  const std::array<const Strides*, 3> strides{&out.strides(), &a.strides(), &b.strides()};
  LINEA_DISPATCH_ALL(a.dtype(), binary_op_name(op), [&] {
    if (is_comparison(op)) {
      CompareF<scalar_t> f{ptr<uint8_t>(out), cptr<scalar_t>(a), cptr<scalar_t>(b), op};
      launch_elementwise<3>(binary_op_name(op), out.shape(), strides, f);
    } else {
      BinaryF<scalar_t> f{ptr<scalar_t>(out), cptr<scalar_t>(a), cptr<scalar_t>(b), op};
      launch_elementwise<3>(binary_op_name(op), out.shape(), strides, f);
    }
  });
}

// out = cond ? a : b; all expanded to out's shape; any layouts
void where(const Tensor& cond, const Tensor& a, const Tensor& b, const Tensor& out) {
  LINEA_CHECK(cond.shape() == out.shape() && a.shape() == out.shape() && b.shape() == out.shape(),
              "where: shapes differ: cond ", shape_str(cond.shape()), ", a ", shape_str(a.shape()), ", b ",
              shape_str(b.shape()), ", out ", shape_str(out.shape()));
  const std::array<const Strides*, 4> strides{&out.strides(), &cond.strides(), &a.strides(), &b.strides()};
  auto run = [&](auto bits) {
    using E = decltype(bits);
    WhereF<E> f{ptr<E>(out), cptr<uint8_t>(cond), cptr<E>(a), cptr<E>(b)};
    launch_elementwise<4>("where", out.shape(), strides, f);
  };
  dispatch_bits(out.element_size(), "where", run);
}

}  // namespace linea::cuda
