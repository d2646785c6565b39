// Element types. float32 everywhere, float64 on CPU (gradcheck), int64 for indices/labels,
// bool (one byte, 0/1) for masks produced by comparisons.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <ostream>
#include <string>

#include "core/error.h"

namespace linea {

enum class DType : uint8_t { Float32, Float64, Int64, Bool };

inline size_t dtype_size(DType t) {
  switch (t) {
    case DType::Float32:
      return 4;
    case DType::Float64:
      return 8;
    case DType::Int64:
      return 8;
    case DType::Bool:
      return 1;
  }
  return 0;
}

inline const char* dtype_name(DType t) {
  switch (t) {
    case DType::Float32:
      return "float32";
    case DType::Float64:
      return "float64";
    case DType::Int64:
      return "int64";
    case DType::Bool:
      return "bool";
  }
  return "?";
}

inline bool is_floating(DType t) { return t == DType::Float32 || t == DType::Float64; }

// The lowest finite value of a floating dtype (e.g. a mask's fill before a softmax: it stays
// finite, so a fully masked row gives a uniform result instead of NaN).
inline double dtype_lowest(DType t) {
  LINEA_CHECK(is_floating(t), "dtype_lowest: expected a floating dtype, got ", dtype_name(t));
  return t == DType::Float32 ? static_cast<double>(std::numeric_limits<float>::lowest())
                             : std::numeric_limits<double>::lowest();
}

inline std::ostream& operator<<(std::ostream& os, DType t) { return os << dtype_name(t); }

template <typename T> struct DTypeOf;
template <> struct DTypeOf<float> { static constexpr DType value = DType::Float32; };
template <> struct DTypeOf<double> { static constexpr DType value = DType::Float64; };
template <> struct DTypeOf<int64_t> { static constexpr DType value = DType::Int64; };
template <> struct DTypeOf<bool> { static constexpr DType value = DType::Bool; };

// Type dispatch: calls f(scalar_t{}) with scalar_t the C++ type of dt. Write kernels as
//   dispatch_float(x.dtype(), "op", [&](auto tag) { using scalar_t = decltype(tag); ... });
// (functions, not macros, so that #pragma omp lines may appear in the body).
// Bool tensors are stored as uint8_t.
template <typename F> decltype(auto) dispatch_float(DType dt, const char* op, F&& f) {
  switch (dt) {
    case DType::Float32:
      return f(float{});
    case DType::Float64:
      return f(double{});
    default:
      break;
  }
  LINEA_FAIL(op, ": expected a floating dtype (float32/float64), got ", dtype_name(dt));
}
template <typename F> decltype(auto) dispatch_numeric(DType dt, const char* op, F&& f) {
  switch (dt) {
    case DType::Float32:
      return f(float{});
    case DType::Float64:
      return f(double{});
    case DType::Int64:
      return f(int64_t{});
    default:
      break;
  }
  LINEA_FAIL(op, ": expected a numeric dtype (float32/float64/int64), got ", dtype_name(dt));
}
template <typename F> decltype(auto) dispatch_all(DType dt, const char* op, F&& f) {
  switch (dt) {
    case DType::Float32:
      return f(float{});
    case DType::Float64:
      return f(double{});
    case DType::Int64:
      return f(int64_t{});
    case DType::Bool:
      return f(uint8_t{});
  }
  LINEA_FAIL(op, ": unknown dtype");
}

}  // namespace linea

// Macro forms of the same dispatch, binding `scalar_t` for a body written as a lambda:
//   LINEA_DISPATCH_FLOAT(x.dtype(), "op", [&] { ... scalar_t ... });
// A #pragma cannot appear inside a macro argument (a preprocessor rule), so bodies with OpenMP
// pragmas must use the dispatch_* functions above instead.
#define LINEA_DISPATCH_IMPL_(fn, dt, opname, ...) \
  ::linea::fn(dt, opname, [&](auto linea_tag_) {  \
    using scalar_t = decltype(linea_tag_);        \
    return (__VA_ARGS__)();                       \
  })
#define LINEA_DISPATCH_FLOAT(dt, opname, ...) LINEA_DISPATCH_IMPL_(dispatch_float, dt, opname, __VA_ARGS__)
#define LINEA_DISPATCH_NUMERIC(dt, opname, ...) LINEA_DISPATCH_IMPL_(dispatch_numeric, dt, opname, __VA_ARGS__)
#define LINEA_DISPATCH_ALL(dt, opname, ...) LINEA_DISPATCH_IMPL_(dispatch_all, dt, opname, __VA_ARGS__)
