// CPU iteration over N same-shaped strided operands (elementwise kernels, copies).
// Dims are coalesced where every operand allows it, size-1 dims dropped, and the loop runs
// row by row over the innermost dim, rows split across OpenMP threads for large tensors.
// Internal to core/cpu.
#pragma once

#include <omp.h>

#include <array>
#include <cstdint>
#include <vector>

#include "core/shape.h"

namespace linea::cpu::detail {

// Below this many elements an op runs on one thread (thread start-up costs more).
constexpr int64_t kParallelGrain = 32768;

template <int N> struct StridedLayout {
  std::vector<int64_t> sizes;                   // coalesced, innermost last
  std::array<std::vector<int64_t>, N> strides;  // per operand, aligned with sizes
};

template <int N> StridedLayout<N> coalesce(const Shape& shape, const std::array<const Strides*, N>& strides) {
  StridedLayout<N> L;
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] == 1) continue;
    if (!L.sizes.empty()) {
      bool merge = true;
      for (int k = 0; k < N; ++k)
        if (L.strides[k].back() != (*strides[k])[d] * shape[d]) merge = false;
      if (merge) {
        L.sizes.back() *= shape[d];
        for (int k = 0; k < N; ++k) L.strides[k].back() = (*strides[k])[d];
        continue;
      }
    }
    L.sizes.push_back(shape[d]);
    for (int k = 0; k < N; ++k) L.strides[k].push_back((*strides[k])[d]);
  }
  if (L.sizes.empty()) {  // 0-d or all-ones: one element
    L.sizes.push_back(1);
    for (int k = 0; k < N; ++k) L.strides[k].push_back(0);
  }
  return L;
}

// Calls body(offsets, n, inner_strides) for each innermost row: offsets[k] is operand k's
// element offset of the row's first element, n the row length.
template <int N, typename Body>
void for_each_row(const Shape& shape, const std::array<const Strides*, N>& strides, Body&& body) {
  int64_t numel = shape_numel(shape);
  if (numel == 0) return;
  StridedLayout<N> L = coalesce<N>(shape, strides);
  const int nd = static_cast<int>(L.sizes.size());
  const int64_t n = L.sizes[nd - 1];
  std::array<int64_t, N> inner;
  for (int k = 0; k < N; ++k) inner[k] = L.strides[k][nd - 1];
  const int64_t rows = numel / n;
  auto row_offsets = [&](int64_t row, std::array<int64_t, N>& off) {
    off.fill(0);
    for (int d = nd - 2; d >= 0; --d) {
      int64_t i = row % L.sizes[d];
      row /= L.sizes[d];
      for (int k = 0; k < N; ++k) off[k] += i * L.strides[k][d];
    }
  };
  if (rows == 1) {
    std::array<int64_t, N> off{};
    if (numel >= kParallelGrain) {
      // One long row: split it into chunks.
#pragma omp parallel
      {
        int nt = omp_get_num_threads(), t = omp_get_thread_num();
        int64_t lo = n * t / nt, hi = n * (t + 1) / nt;
        std::array<int64_t, N> o;
        for (int k = 0; k < N; ++k) o[k] = lo * inner[k];
        if (hi > lo) body(o, hi - lo, inner);
      }
    } else {
      body(off, n, inner);
    }
    return;
  }
#pragma omp parallel for schedule(static) if (numel >= kParallelGrain)
  for (int64_t r = 0; r < rows; ++r) {
    std::array<int64_t, N> off;
    row_offsets(r, off);
    body(off, n, inner);
  }
}

}  // namespace linea::cpu::detail
