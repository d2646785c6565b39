// searchsorted's binary search, written once for the CPU and the CUDA kernels (core/cpu/index.cpp,
// cuda/index.cu), so both find the same position.
#pragma once

#include <cstdint>

#include "core/host_device.h"

namespace linea {

// The number of elements of the non-decreasing row[0, n) below x (right: at or below x); a NaN x
// sorts after every element (n), as in torch.searchsorted.
template <typename T> LINEA_HD int64_t sorted_position(const T* row, int64_t n, T x, bool right) {
  const bool nan = x != x;
  int64_t lo = 0, hi = n;
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo) / 2;
    const bool before = nan || (right ? !(x < row[mid]) : row[mid] < x);
    if (before)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo;
}

}  // namespace linea
