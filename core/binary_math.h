// The math of every BinaryOp: one functor per op, f(x, y), usable from host and device code.
// The CPU kernels (core/cpu/elementwise.cpp) and the CUDA kernels (cuda/elementwise.cu) both
// call these, so an op's formula is written once. Which ops exist, their names and the dtypes
// they accept are the table LINEA_BINARY_OPS in core/kernels.h.
//   with_binary_op(op, body)   calls body with op's functor (compile-time form, for CPU loops)
//   binary_apply<Out>(op, x, y) a runtime switch (for CUDA kernels, one kernel for all ops)
// Comparisons return uint8_t (Bool); the others return T. Not here: the unary ops
// (core/unary_math.h), argument checks (core/ops.cpp).
#pragma once

#include <cstdint>

#include "core/host_device.h"
#include "core/kernels.h"


namespace linea::detail {

struct AddOp {
  template <typename T> LINEA_HD T operator()(T x, T y) const { return static_cast<T>(x + y); }
};
struct SubOp {
  template <typename T> LINEA_HD T operator()(T x, T y) const { return static_cast<T>(x - y); }
};
struct MulOp {
  template <typename T> LINEA_HD T operator()(T x, T y) const { return static_cast<T>(x * y); }
};
struct DivOp {
  template <typename T> LINEA_HD T operator()(T x, T y) const { return static_cast<T>(x / y); }
};
// NaN propagates from x (x != x); from y it wins only when x does not compare greater.
struct MaximumOp {
  template <typename T> LINEA_HD T operator()(T x, T y) const { return (x != x || x > y) ? x : y; }
};
struct MinimumOp {
  template <typename T> LINEA_HD T operator()(T x, T y) const { return (x != x || x < y) ? x : y; }
};
struct EqOp {
  template <typename T> LINEA_HD uint8_t operator()(T x, T y) const { return uint8_t(x == y); }
};
struct NeOp {
  template <typename T> LINEA_HD uint8_t operator()(T x, T y) const { return uint8_t(x != y); }
};
struct LtOp {
  template <typename T> LINEA_HD uint8_t operator()(T x, T y) const { return uint8_t(x < y); }
};
struct LeOp {
  template <typename T> LINEA_HD uint8_t operator()(T x, T y) const { return uint8_t(x <= y); }
};
struct GtOp {
  template <typename T> LINEA_HD uint8_t operator()(T x, T y) const { return uint8_t(x > y); }
};
struct GeOp {
  template <typename T> LINEA_HD uint8_t operator()(T x, T y) const { return uint8_t(x >= y); }
};
// Logical ops (Bool only, checked by linea::raw): any nonzero byte is true.
struct AndOp {
  template <typename T> LINEA_HD T operator()(T x, T y) const { return static_cast<T>(x != T(0) && y != T(0)); }
};
struct OrOp {
  template <typename T> LINEA_HD T operator()(T x, T y) const { return static_cast<T>(x != T(0) || y != T(0)); }
};

template <typename Body> inline void with_binary_op(BinaryOp op, Body&& body) {
  switch (op) {
#define LINEA_BINARY_CASE(name, str, functor, cmp, dtypes) \
  case BinaryOp::name:                                     \
    return body(functor{});
    LINEA_BINARY_OPS(LINEA_BINARY_CASE)
#undef LINEA_BINARY_CASE
  }
}

// Out = T for arithmetic ops, uint8_t for comparisons (the caller picks by is_comparison).
template <typename Out, typename T> LINEA_HD Out binary_apply(BinaryOp op, T x, T y) {
  switch (op) {
#define LINEA_BINARY_CASE(name, str, functor, cmp, dtypes) \
  case BinaryOp::name:                                     \
    return static_cast<Out>(functor{}(x, y));
    LINEA_BINARY_OPS(LINEA_BINARY_CASE)
#undef LINEA_BINARY_CASE
  }
  return Out();
}

}  // namespace linea::detail
