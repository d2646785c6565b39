// sums_ratio's per-row rules, written once for the CPU and the CUDA kernels (core/cpu/nn.cpp,
// cuda/nn.cu), so both hide the same rows and clamp the same dens.
#pragma once

#include <cstdint>

#include "core/host_device.h"
#include "core/tensor.h"

namespace linea {

// Which rows of y [rows, cols + 1] see a key: visible Bool [groups, per] gives row r's flag at
// (r / group_rows) per + r % per (a flag per batch: per = 1; per query: per = N); every row
// without a mask.
struct RowFlags {
  const uint8_t* vis = nullptr;
  int64_t per = 1, group_rows = 1;

  RowFlags(const Tensor& visible, int64_t group_rows_)
      : vis(visible.defined() ? static_cast<const uint8_t*>(visible.data_ptr()) : nullptr),
        per(visible.defined() ? visible.size(1) : 1),
        group_rows(group_rows_) {}
  LINEA_HD bool shown(int64_t r) const { return !vis || vis[(r / group_rows) * per + r % per]; }
};

// The den a row divides by, max(den, tiny); a NaN den stays NaN.
template <typename T> LINEA_HD T guarded_den(T den, T tiny) { return den < tiny ? tiny : den; }

}  // namespace linea
