// The math of every UnaryOp: forward f(x) and backward g * f'(x), one functor per op,
// usable from host and device code (the CPU kernels are the reference; the CUDA kernels
// include this same file, so both compute the same formulas).
// with_unary_op(op, body) calls body with the functor of op (a runtime-to-compile-time switch);
// the op list itself (enum, names, Int64 support) is the table LINEA_UNARY_OPS in core/kernels.h.
#pragma once

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "core/host_device.h"
#include "core/kernels.h"


namespace linea::detail {

namespace um {
template <typename T> LINEA_HD T sigmoid(T x) {
  // Stable on both tails.
  if (x >= T(0)) {
    T z = std::exp(-x);
    return T(1) / (T(1) + z);
  }
  T z = std::exp(x);
  return z / (T(1) + z);
}
constexpr double kSqrt2OverPi = 0.7978845608028654;  // sqrt(2/pi)
constexpr double kInvSqrt2 = 0.7071067811865476;
constexpr double kInvSqrt2Pi = 0.3989422804014327;  // 1/sqrt(2 pi)
constexpr double kGeluC = 0.044715;
}  // namespace um

// Each functor: forward(x, a, b), backward(g, x, y, a, b) with y = forward(x).
struct NegOp {
  template <typename T> LINEA_HD T forward(T x, T, T) const { return -x; }
  template <typename T> LINEA_HD T backward(T g, T, T, T, T) const { return -g; }
};
struct ExpOp {
  template <typename T> LINEA_HD T forward(T x, T, T) const { return std::exp(x); }
  template <typename T> LINEA_HD T backward(T g, T, T y, T, T) const { return g * y; }
};
struct LogOp {
  template <typename T> LINEA_HD T forward(T x, T, T) const { return std::log(x); }
  template <typename T> LINEA_HD T backward(T g, T x, T, T, T) const { return g / x; }
};
struct SqrtOp {
  template <typename T> LINEA_HD T forward(T x, T, T) const { return std::sqrt(x); }
  template <typename T> LINEA_HD T backward(T g, T, T y, T, T) const { return g * T(0.5) / y; }
};
struct RsqrtOp {
  template <typename T> LINEA_HD T forward(T x, T, T) const { return T(1) / std::sqrt(x); }
  template <typename T> LINEA_HD T backward(T g, T, T y, T, T) const { return g * T(-0.5) * y * y * y; }
};
struct AbsOp {
  template <typename T> LINEA_HD T forward(T x, T, T) const { return x < T(0) ? -x : x; }
  template <typename T> LINEA_HD T backward(T g, T x, T, T, T) const { return x > T(0) ? g : (x < T(0) ? -g : T(0)); }
};
struct TanhOp {
  template <typename T> LINEA_HD T forward(T x, T, T) const { return std::tanh(x); }
  template <typename T> LINEA_HD T backward(T g, T, T y, T, T) const { return g * (T(1) - y * y); }
};
struct SigmoidOp {
  template <typename T> LINEA_HD T forward(T x, T, T) const { return um::sigmoid(x); }
  template <typename T> LINEA_HD T backward(T g, T, T y, T, T) const { return g * y * (T(1) - y); }
};
struct ReluOp {
  template <typename T> LINEA_HD T forward(T x, T, T) const { return x > T(0) ? x : T(0); }
  template <typename T> LINEA_HD T backward(T g, T x, T, T, T) const { return x > T(0) ? g : T(0); }
};
struct GeluTanhOp {  // 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
  template <typename T> LINEA_HD T forward(T x, T, T) const {
    T u = T(um::kSqrt2OverPi) * (x + T(um::kGeluC) * x * x * x);
    return T(0.5) * x * (T(1) + std::tanh(u));
  }
  template <typename T> LINEA_HD T backward(T g, T x, T, T, T) const {
    T u = T(um::kSqrt2OverPi) * (x + T(um::kGeluC) * x * x * x);
    T t = std::tanh(u);
    T du = T(um::kSqrt2OverPi) * (T(1) + T(3 * um::kGeluC) * x * x);
    return g * (T(0.5) * (T(1) + t) + T(0.5) * x * (T(1) - t * t) * du);
  }
};
struct GeluErfOp {  // x Phi(x)
  template <typename T> LINEA_HD T forward(T x, T, T) const {
    return T(0.5) * x * (T(1) + std::erf(x * T(um::kInvSqrt2)));
  }
  template <typename T> LINEA_HD T backward(T g, T x, T, T, T) const {
    T cdf = T(0.5) * (T(1) + std::erf(x * T(um::kInvSqrt2)));
    T pdf = T(um::kInvSqrt2Pi) * std::exp(T(-0.5) * x * x);
    return g * (cdf + x * pdf);
  }
};
struct SinOp {
  template <typename T> LINEA_HD T forward(T x, T, T) const { return std::sin(x); }
  template <typename T> LINEA_HD T backward(T g, T x, T, T, T) const { return g * std::cos(x); }
};
struct CosOp {
  template <typename T> LINEA_HD T forward(T x, T, T) const { return std::cos(x); }
  template <typename T> LINEA_HD T backward(T g, T x, T, T, T) const { return -g * std::sin(x); }
};
struct PowOp {  // x^a
  template <typename T> LINEA_HD T forward(T x, T a, T) const { return std::pow(x, a); }
  template <typename T> LINEA_HD T backward(T g, T x, T, T a, T) const {
    return a == T(0) ? T(0) : g * a * std::pow(x, a - T(1));
  }
};
struct SquareOp {  // x^2 as x * x: pow(x, 2) goes through powf, far slower per element on a CPU
  template <typename T> LINEA_HD T forward(T x, T, T) const { return x * x; }
  template <typename T> LINEA_HD T backward(T g, T x, T, T, T) const { return g * T(2) * x; }
};
struct ClampOp {  // min(max(x, lo), hi); gradient passes where lo <= x <= hi
  template <typename T> LINEA_HD T forward(T x, T lo, T hi) const { return x < lo ? lo : (x > hi ? hi : x); }
  template <typename T> LINEA_HD T backward(T g, T x, T, T lo, T hi) const { return (x >= lo && x <= hi) ? g : T(0); }
};
struct AddScalarOp {
  template <typename T> LINEA_HD T forward(T x, T a, T) const { return x + a; }
  template <typename T> LINEA_HD T backward(T g, T, T, T, T) const { return g; }
};
struct MulScalarOp {
  template <typename T> LINEA_HD T forward(T x, T a, T) const { return x * a; }
  template <typename T> LINEA_HD T backward(T g, T, T, T a, T) const { return g * a; }
};
struct SignOp {
  template <typename T> LINEA_HD T forward(T x, T, T) const { return T((x > T(0)) - (x < T(0))); }
  template <typename T> LINEA_HD T backward(T, T, T, T, T) const { return T(0); }
};

// The op switches, generated from the table LINEA_UNARY_OPS (core/kernels.h).
template <typename Body> inline void with_unary_op(UnaryOp op, Body&& body) {
  switch (op) {
#define LINEA_UNARY_CASE(name, str, functor, ints) \
  case UnaryOp::name:                              \
    return body(functor{});
    LINEA_UNARY_OPS(LINEA_UNARY_CASE)
#undef LINEA_UNARY_CASE
  }
}

// Runtime-switch forms for device kernels (one kernel for all ops). For integer T only the
// ops marked for Int64 in the table are instantiated; the others return x (never reached:
// the launcher checks unary_supports_integers).
template <typename T> LINEA_HD T unary_forward_switch(UnaryOp op, T x, T a, T b) {
  switch (op) {
#define LINEA_UNARY_CASE(name, str, functor, ints)  \
  case UnaryOp::name:                               \
    if constexpr (std::is_integral_v<T> && !(ints)) \
      break;                                        \
    else                                            \
      return functor{}.forward(x, a, b);
    LINEA_UNARY_OPS(LINEA_UNARY_CASE)
#undef LINEA_UNARY_CASE
  }
  return x;
}
template <typename T> LINEA_HD T unary_backward_switch(UnaryOp op, T g, T x, T y, T a, T b) {
  switch (op) {
#define LINEA_UNARY_CASE(name, str, functor, ints) \
  case UnaryOp::name:                              \
    return functor{}.backward(g, x, y, a, b);
    LINEA_UNARY_OPS(LINEA_UNARY_CASE)
#undef LINEA_UNARY_CASE
  }
  return g;
}

// A double op parameter as T; for integer T saturated to T's range (a one-sided clamp passes
// +-inf, and casting inf to an integer is undefined).
template <typename T> LINEA_HD T scalar_param(double v) {
  if constexpr (std::is_integral_v<T>) {
    if (!(v < 9.2233720368547748e18)) return T(INT64_MAX);
    if (!(v > -9.2233720368547748e18)) return T(INT64_MIN);
  }
  return static_cast<T>(v);
}

}  // namespace linea::detail
