// Shape and stride helpers. Shapes and strides are counted in elements; a 0-d tensor has an
// empty shape. Negative dims count from the end, as in PyTorch.
#pragma once

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

namespace linea {

using Shape = std::vector<int64_t>;
using Strides = std::vector<int64_t>;

// Elements of a shape (0 when a dim is 0), and its row-major strides. Both throw when a count
// they need overflows int64 (say a shape read from a corrupt file: [0, 2^32, 2^32] has no
// elements, but its first stride would be 2^64).
int64_t shape_numel(const Shape& s);
Strides contiguous_strides(const Shape& s);
// Whether shape_numel and contiguous_strides can represent s: the product of its dims, zeros
// counted as 1, fits in int64. For readers, which refuse such a shape naming the file.
bool shape_fits(const Shape& s);
// "[2, 3, 4]"
std::string shape_str(const Shape& s);
// Wraps a possibly negative dim into [0, ndim); throws naming `op` when out of range.
int64_t wrap_dim(int64_t dim, int64_t ndim, const char* op);
// NumPy broadcasting of two shapes; throws naming `op` and both shapes when incompatible.
Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op);

struct ShapePrinter {
  const Shape& s;
};
inline std::ostream& operator<<(std::ostream& os, ShapePrinter p) { return os << shape_str(p.s); }

}  // namespace linea
