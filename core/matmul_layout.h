// How one matmul operand [..., rows, cols] is laid out for a BLAS call: row-major (strides
// (ld, 1)) or column-major (strides (1, ld), i.e. a transposed view, passed as "transpose"
// with its leading dimension instead of being copied). Shared by the CPU (OpenBLAS) and CUDA
// (cuBLAS) matmul kernels; raw::matmul guarantees one of the two layouts.
#pragma once

#include <algorithm>
#include <cstdint>

#include "core/tensor.h"

namespace linea::detail {

struct MatLayout {
  bool trans = false;  // stored column-major
  int64_t ld = 1;      // leading dimension (elements)
};

// Size-1 dims may carry any stride; only the strides of dims longer than 1 matter.
inline MatLayout matmul_layout(const Tensor& t) {
  const int64_t rows = t.size(-2), cols = t.size(-1);
  const int64_t sr = t.stride(-2), sc = t.stride(-1);
  if ((cols <= 1 || sc == 1) && (rows <= 1 || sr >= cols))
    return {false, std::max<int64_t>({rows <= 1 ? cols : sr, cols, 1})};
  if ((rows <= 1 || sr == 1) && (cols <= 1 || sc >= rows))
    return {true, std::max<int64_t>({cols <= 1 ? rows : sc, rows, 1})};
  LINEA_FAIL("matmul: operand of shape ", shape_str(t.shape()), " with strides ", shape_str(t.strides()),
             " is neither row- nor column-major (raw::matmul should have made it contiguous)");
}

}  // namespace linea::detail
