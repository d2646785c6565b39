// CPU reductions over the middle axis of a contiguous [outer, r, inner] view: sum, max, min,
// logsumexp, and argmax/argmin. Sums accumulate in double whatever the dtype.
#include <cmath>
#include <limits>
#include <vector>

#include "core/cpu/strided.h"
#include "core/kernels.h"

namespace linea::cpu {

namespace {
constexpr int64_t kInnerBlock = 256;

// Identities of max/min: -inf/+inf for floats (so an all -inf row reduces to -inf).
template <typename T> T detail_lowest() {
  return std::numeric_limits<T>::has_infinity ? -std::numeric_limits<T>::infinity() : std::numeric_limits<T>::lowest();
}
template <typename T> T detail_highest() {
  return std::numeric_limits<T>::has_infinity ? std::numeric_limits<T>::infinity() : std::numeric_limits<T>::max();
}

// Generic driver: for each (o, block of inner), fold rows j = 0..r-1 with `step(acc[], row ptr, len)`.
template <typename T, typename Acc, typename Out, typename Init, typename Step, typename Finish>
void reduce_driver(const T* x, Out* out, int64_t outer, int64_t r, int64_t inner, Init init, Step step, Finish finish) {
  const int64_t blocks = (inner + kInnerBlock - 1) / kInnerBlock;
  const int64_t work = outer * r * inner;
  if (inner == 1) {
#pragma omp parallel for schedule(static) if (work >= detail::kParallelGrain)
    for (int64_t o = 0; o < outer; ++o) {
      Acc acc = init();
      const T* row = x + o * r;
      for (int64_t j = 0; j < r; ++j) acc = step(acc, row[j]);
      out[o] = finish(acc, x + o * r, int64_t(1));
    }
    return;
  }
#pragma omp parallel for collapse(2) schedule(static) if (work >= detail::kParallelGrain)
  for (int64_t o = 0; o < outer; ++o) {
    for (int64_t bk = 0; bk < blocks; ++bk) {
      const int64_t i0 = bk * kInnerBlock, i1 = std::min(inner, i0 + kInnerBlock);
      Acc acc[kInnerBlock];
      for (int64_t i = i0; i < i1; ++i) acc[i - i0] = init();
      for (int64_t j = 0; j < r; ++j) {
        const T* row = x + (o * r + j) * inner;
        for (int64_t i = i0; i < i1; ++i) acc[i - i0] = step(acc[i - i0], row[i]);
      }
      for (int64_t i = i0; i < i1; ++i) out[o * inner + i] = finish(acc[i - i0], x + o * r * inner + i, inner);
    }
  }
  (void)r;
}
// Sums of the rows of x [outer, r]. Eight running sums per row instead of one: a single chain of
// dependent double additions runs at one add per 4 cycles, eight interleaved chains fill the
// pipeline (the order is fixed, so the result is still deterministic).
template <typename T, typename Acc, typename Out> void sum_rows(const T* x, Out* out, int64_t outer, int64_t r) {
#pragma omp parallel for schedule(static) if (outer * r >= detail::kParallelGrain)
  for (int64_t o = 0; o < outer; ++o) {
    const T* row = x + o * r;
    Acc acc[8] = {};
    int64_t j = 0;
    for (; j + 8 <= r; j += 8)
      for (int k = 0; k < 8; ++k) acc[k] += static_cast<Acc>(row[j + k]);
    for (; j < r; ++j) acc[0] += static_cast<Acc>(row[j]);
    out[o] = static_cast<Out>(((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7])));
  }
}
}  // namespace

void reduce(ReduceOp op, const Tensor& x, const Tensor& out, int64_t outer, int64_t r, int64_t inner) {
  if (x.dtype() == DType::Bool) {  // Sum: the count of true (Bool is stored as 0 or 1) into Int64
    LINEA_CHECK(op == ReduceOp::Sum && out.dtype() == DType::Int64, "reduce: a bool tensor sums into int64 only");
    const uint8_t* px = static_cast<const uint8_t*>(x.data_ptr());
    int64_t* po = static_cast<int64_t*>(out.data_ptr());
    if (inner == 1) return sum_rows<uint8_t, int64_t>(px, po, outer, r);
    return reduce_driver<uint8_t, int64_t>(
        px, po, outer, r, inner, [] { return int64_t(0); }, [](int64_t a, uint8_t v) { return a + (v != 0); },
        [](int64_t a, const uint8_t*, int64_t) { return a; });
  }
  dispatch_numeric(x.dtype(), "reduce", [&](auto tag_) {
    using scalar_t = decltype(tag_);
    using T = scalar_t;
    const T* px = static_cast<const T*>(x.data_ptr());
    T* po = static_cast<T*>(out.data_ptr());
    auto none = [](auto acc, const T*, int64_t) { return static_cast<T>(acc); };
    switch (op) {
      case ReduceOp::Sum: {
        using Acc = std::conditional_t<std::is_floating_point_v<T>, double, int64_t>;
        if (inner == 1) {  // contiguous rows (sum over the last dim): see sum_rows
          sum_rows<T, Acc>(px, po, outer, r);
          break;
        }
        reduce_driver<T, Acc>(
            px, po, outer, r, inner, [] { return Acc(0); }, [](Acc a, T v) { return a + static_cast<Acc>(v); }, none);
        break;
      }
      case ReduceOp::Max:
        reduce_driver<T, T>(
            px, po, outer, r, inner, [] { return detail_lowest<T>(); },
            [](T a, T v) { return (v != v || v > a) ? v : a; }, none);
        break;
      case ReduceOp::Min:
        reduce_driver<T, T>(
            px, po, outer, r, inner, [] { return detail_highest<T>(); },
            [](T a, T v) { return (v != v || v < a) ? v : a; }, none);
        break;
      case ReduceOp::LogSumExp: {
        // Pass 1: max; finish: max + log sum exp(v - max), reading the column again.
        auto finish = [r](T m, const T* col, int64_t stride) {
          if (std::isinf(static_cast<double>(m))) return m;  // all -inf (or +inf present)
          double s = 0;
          for (int64_t j = 0; j < r; ++j) s += std::exp(static_cast<double>(col[j * stride]) - m);
          return static_cast<T>(m + std::log(s));
        };
        reduce_driver<T, T>(
            px, po, outer, r, inner, [] { return -std::numeric_limits<T>::infinity(); },
            [](T a, T v) { return (v != v || v > a) ? v : a; }, finish);
        break;
      }
    }
  });
}

void arg_reduce(bool is_max, const Tensor& x, const Tensor& out, int64_t outer, int64_t r, int64_t inner) {
  dispatch_numeric(x.dtype(), "arg_reduce", [&](auto tag_) {
    using scalar_t = decltype(tag_);
    using T = scalar_t;
    const T* px = static_cast<const T*>(x.data_ptr());
    int64_t* po = static_cast<int64_t*>(out.data_ptr());
#pragma omp parallel for collapse(2) schedule(static) if (outer * r * inner >= detail::kParallelGrain)
    for (int64_t o = 0; o < outer; ++o) {
      for (int64_t i = 0; i < inner; ++i) {
        const T* col = px + o * r * inner + i;
        int64_t best = 0;
        T bv = col[0];
        for (int64_t j = 1; j < r; ++j) {
          T v = col[j * inner];
          if (bv != bv) break;  // NaN wins, as in PyTorch
          if (v != v || (is_max ? v > bv : v < bv)) {
            bv = v;
            best = j;
          }
        }
        po[o * inner + i] = best;
      }
    }
  });
}

}  // namespace linea::cpu
