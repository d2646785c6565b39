// CPU elementwise kernels: fill, copy (with dtype conversion), pad, arange, unary ops and their
// derivatives, binary ops, where. The op math is core/unary_math.h's and core/binary_math.h's
// (shared with the CUDA kernels); this is the reference the CUDA kernels reproduce,
// except for the float32 forms of Exp, Sigmoid and the two GELUs, which use the vectorizable
// exp/erf of core/cpu/vec_math.h instead of libm (same formulas, within a few float ulps).
#include <omp.h>

#include <cmath>
#include <type_traits>

#include "core/binary_math.h"
#include "core/cpu/strided.h"
#include "core/cpu/vec_math.h"
#include "core/kernels.h"
#include "core/unary_math.h"

namespace linea::cpu {

using detail::for_each_row;

namespace {
// CPU-only float32 functors (same interface as core/unary_math.h's) for the ops whose float
// math is a libm call, which would keep the loops scalar.
struct ExpF32 {
  float forward(float x, float, float) const { return vm::exp(x); }
  float backward(float g, float, float y, float, float) const { return g * y; }
};
struct SigmoidF32 {
  float forward(float x, float, float) const { return vm::sigmoid(x); }
  float backward(float g, float, float y, float, float) const { return g * y * (1.0f - y); }
};
struct GeluErfF32 {
  float forward(float x, float, float) const { return vm::gelu_erf(x); }
  float backward(float g, float x, float, float, float) const { return g * vm::gelu_erf_grad(x); }
};
struct GeluTanhF32 {
  float forward(float x, float, float) const { return vm::gelu_tanh(x); }
  float backward(float g, float x, float, float, float) const { return g * vm::gelu_tanh_grad(x); }
};

// The functor the CPU uses for op functor F on dtype T: the float32 replacement where there
// is one, F itself otherwise (float64 keeps libm: gradchecks run in float64).
template <typename T, typename F> auto cpu_functor(F f) {
  namespace ud = linea::detail;
  if constexpr (!std::is_same_v<T, float>) {
    return f;
  } else if constexpr (std::is_same_v<F, ud::ExpOp>) {
    return ExpF32{};
  } else if constexpr (std::is_same_v<F, ud::SigmoidOp>) {
    return SigmoidF32{};
  } else if constexpr (std::is_same_v<F, ud::GeluErfOp>) {
    return GeluErfF32{};
  } else if constexpr (std::is_same_v<F, ud::GeluTanhOp>) {
    return GeluTanhF32{};
  } else {
    return f;
  }
}
// A contiguous row of unary(). d == q (in place) is fine: element i only reads q[i].
template <typename T, typename F>
LINEA_VEC_CLONES void unary_contiguous(const F& f, const T* q, T* d, T A, T B, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) d[i] = f.forward(q[i], A, B);
}
}  // namespace

void fill(const Tensor& out, double value) {
  dispatch_all(out.dtype(), "fill", [&](auto tag_) {
    using scalar_t = decltype(tag_);
    scalar_t v = static_cast<scalar_t>(value);
    scalar_t* p = static_cast<scalar_t*>(out.data_ptr());
    for_each_row<1>(out.shape(), {&out.strides()},
                    [&](const std::array<int64_t, 1>& o, int64_t n, const std::array<int64_t, 1>& s) {
                      scalar_t* q = p + o[0];
                      if (s[0] == 1) {
                        for (int64_t i = 0; i < n; ++i) q[i] = v;
                      } else {
                        for (int64_t i = 0; i < n; ++i) q[i * s[0]] = v;
                      }
                    });
  });
}

void copy(const Tensor& dst, const Tensor& src) {
  dispatch_all(dst.dtype(), "copy", [&](auto tag_) {
    using scalar_t = decltype(tag_);
    using dst_t = scalar_t;
    dst_t* pd = static_cast<dst_t*>(dst.data_ptr());
    dispatch_all(src.dtype(), "copy", [&](auto tag_) {
      using scalar_t = decltype(tag_);
      const scalar_t* ps = static_cast<const scalar_t*>(src.data_ptr());
      // Conversion to bool is x != 0 (as PyTorch, and as the CUDA kernel).
      auto conv = [](scalar_t v) {
        if constexpr (std::is_same_v<dst_t, uint8_t>)
          return static_cast<dst_t>(v != scalar_t(0));
        else
          return static_cast<dst_t>(v);
      };
      for_each_row<2>(dst.shape(), {&dst.strides(), &src.strides()},
                      [&](const std::array<int64_t, 2>& o, int64_t n, const std::array<int64_t, 2>& s) {
                        dst_t* d = pd + o[0];
                        const scalar_t* q = ps + o[1];
                        if (s[0] == 1 && s[1] == 1) {
                          for (int64_t i = 0; i < n; ++i) d[i] = conv(q[i]);
                        } else {
                          for (int64_t i = 0; i < n; ++i) d[i * s[0]] = conv(q[i * s[1]]);
                        }
                      });
    });
  });
}

// The pads filled, then x copied between them: views of out along dim.
void pad(const Tensor& x, int64_t dim, int64_t before, double value, const Tensor& out) {
  const int64_t n = x.size(dim), after = out.size(dim) - before - n;
  const auto part = [&](int64_t start, int64_t len) {
    Shape s = out.shape();
    s[static_cast<size_t>(dim)] = len;
    return as_strided(out, s, out.strides(), out.offset() + start * out.strides()[static_cast<size_t>(dim)]);
  };
  if (before > 0) fill(part(0, before), value);
  if (after > 0) fill(part(before + n, after), value);
  if (n > 0) copy(part(before, n), x);
}

void arange(const Tensor& out, double start, double step) {
  dispatch_numeric(out.dtype(), "arange", [&](auto tag_) {
    using scalar_t = decltype(tag_);
    scalar_t* p = static_cast<scalar_t*>(out.data_ptr());
    const int64_t n = out.numel();
    for (int64_t i = 0; i < n; ++i) p[i] = static_cast<scalar_t>(start + static_cast<double>(i) * step);
  });
}

void unary(UnaryOp op, const Tensor& x, const Tensor& out, double a, double b) {
  dispatch_numeric(x.dtype(), "unary", [&](auto tag_) {
    using scalar_t = decltype(tag_);
    const scalar_t* px = static_cast<const scalar_t*>(x.data_ptr());
    scalar_t* po = static_cast<scalar_t*>(out.data_ptr());
    const scalar_t A = linea::detail::scalar_param<scalar_t>(a), B = linea::detail::scalar_param<scalar_t>(b);
    linea::detail::with_unary_op(op, [&](auto f0) {
      const auto f = cpu_functor<scalar_t>(f0);
      for_each_row<2>(out.shape(), {&out.strides(), &x.strides()},
                      [&](const std::array<int64_t, 2>& o, int64_t n, const std::array<int64_t, 2>& s) {
                        scalar_t* d = po + o[0];
                        const scalar_t* q = px + o[1];
                        if (s[0] == 1 && s[1] == 1) {
                          unary_contiguous(f, q, d, A, B, n);
                        } else {
                          for (int64_t i = 0; i < n; ++i) d[i * s[0]] = f.forward(q[i * s[1]], A, B);
                        }
                      });
    });
  });
}

namespace {
// One thread's share of unary_backward. A function of its own, with the pointers as plain
// arguments: written inline in an `omp parallel for simd`, GCC reloads them from the region's
// closure on every iteration and does not vectorize.
template <typename T, typename F>
LINEA_VEC_CLONES void unary_backward_range(const F& f, const T* pg, const T* px, const T* py, T* pd, T A, T B,
                                           int64_t lo, int64_t hi) {
#pragma omp simd
  for (int64_t i = lo; i < hi; ++i) pd[i] = f.backward(pg[i], px[i], py[i], A, B);
}
}  // namespace

void unary_backward(UnaryOp op, const Tensor& grad, const Tensor& x, const Tensor& y, const Tensor& dx, double a,
                    double b) {
  dispatch_float(x.dtype(), "unary_backward", [&](auto tag_) {
    using scalar_t = decltype(tag_);
    const scalar_t* pg = static_cast<const scalar_t*>(grad.data_ptr());
    const scalar_t* px = static_cast<const scalar_t*>(x.data_ptr());
    const scalar_t* py = static_cast<const scalar_t*>(y.data_ptr());
    scalar_t* pd = static_cast<scalar_t*>(dx.data_ptr());
    const scalar_t A = static_cast<scalar_t>(a), B = static_cast<scalar_t>(b);
    const int64_t n = dx.numel();
    linea::detail::with_unary_op(op, [&](auto f0) {
      const auto f = cpu_functor<scalar_t>(f0);
      if (n < detail::kParallelGrain) return unary_backward_range(f, pg, px, py, pd, A, B, 0, n);
#pragma omp parallel
      {
        const int64_t nt = omp_get_num_threads(), t = omp_get_thread_num();
        unary_backward_range(f, pg, px, py, pd, A, B, n * t / nt, n * (t + 1) / nt);
      }
    });
  });
}

namespace {
template <typename T, typename Out, typename F>
void binary_loop(const Tensor& a, const Tensor& b, const Tensor& out, F f) {
  const T* pa = static_cast<const T*>(a.data_ptr());
  const T* pb = static_cast<const T*>(b.data_ptr());
  Out* po = static_cast<Out*>(out.data_ptr());
  for_each_row<3>(out.shape(), {&out.strides(), &a.strides(), &b.strides()},
                  [&](const std::array<int64_t, 3>& o, int64_t n, const std::array<int64_t, 3>& s) {
                    Out* d = po + o[0];
                    const T* x = pa + o[1];
                    const T* y = pb + o[2];
                    if (s[0] == 1 && s[1] == 1 && s[2] == 1) {
                      for (int64_t i = 0; i < n; ++i) d[i] = f(x[i], y[i]);
                    } else if (s[0] == 1 && s[1] == 1 && s[2] == 0) {
                      const T yv = y[0];
                      for (int64_t i = 0; i < n; ++i) d[i] = f(x[i], yv);
                    } else {
                      for (int64_t i = 0; i < n; ++i) d[i * s[0]] = f(x[i * s[1]], y[i * s[2]]);
                    }
                  });
}
}  // namespace

void binary(BinaryOp op, const Tensor& a, const Tensor& b, const Tensor& out) {
  dispatch_all(a.dtype(), "binary", [&](auto tag_) {
    using T = decltype(tag_);
    // The functor's result type is the output's: T, or uint8_t (Bool) for comparisons.
    linea::detail::with_binary_op(op, [&](auto f) { binary_loop<T, decltype(f(T(), T()))>(a, b, out, f); });
  });
}

void where(const Tensor& cond, const Tensor& a, const Tensor& b, const Tensor& out) {
  dispatch_all(a.dtype(), "where", [&](auto tag_) {
    using scalar_t = decltype(tag_);
    const uint8_t* pc = static_cast<const uint8_t*>(cond.data_ptr());
    const scalar_t* pa = static_cast<const scalar_t*>(a.data_ptr());
    const scalar_t* pb = static_cast<const scalar_t*>(b.data_ptr());
    scalar_t* po = static_cast<scalar_t*>(out.data_ptr());
    for_each_row<4>(out.shape(), {&out.strides(), &cond.strides(), &a.strides(), &b.strides()},
                    [&](const std::array<int64_t, 4>& o, int64_t n, const std::array<int64_t, 4>& s) {
                      for (int64_t i = 0; i < n; ++i)
                        po[o[0] + i * s[0]] = pc[o[1] + i * s[1]] ? pa[o[2] + i * s[2]] : pb[o[3] + i * s[3]];
                    });
  });
}

}  // namespace linea::cpu
