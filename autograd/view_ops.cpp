// Differentiable views and copies (reshape, permute, narrow, expand, ..., to), and the
// Tensor member conveniences that forward to them.
#include <numeric>

#include "autograd/ops.h"

namespace linea {

namespace {
// Gradient of a view that picks a sub-block of x: zeros of x's shape with g copied into the
// same sub-block, described by `sub` (a function taking the zeros and returning the view).
template <typename SubView> Tensor scatter_into_zeros(const Tensor& g, const Shape& shape, SubView sub) {
  Tensor z = zeros(shape, g.options());
  sub(z).copy_(g);
  return z;
}
}  // namespace

Tensor reshape(const Tensor& x, const Shape& shape) {
  Tensor y = raw::reshape(x, shape);
  if (!needs_grad({&x})) return y;
  return attach(y, "reshape", {x}, [s = x.shape()](const Tensor& g) -> std::vector<Tensor> { return {reshape(g, s)}; });
}

Tensor view(const Tensor& x, const Shape& shape) {
  Tensor y = raw::view(x, shape);
  if (!needs_grad({&x})) return y;
  return attach(y, "view", {x}, [s = x.shape()](const Tensor& g) -> std::vector<Tensor> { return {reshape(g, s)}; });
}

Tensor flatten(const Tensor& x, int64_t start_dim, int64_t end_dim) {
  raw::check_defined("flatten", x, "x");
  if (x.dim() == 0) return reshape(x, {1});
  start_dim = wrap_dim(start_dim, x.dim(), "flatten");
  end_dim = wrap_dim(end_dim, x.dim(), "flatten");
  LINEA_CHECK(start_dim <= end_dim, "flatten: start_dim ", start_dim, " is after end_dim ", end_dim);
  Shape s;
  for (int64_t d = 0; d < start_dim; ++d) s.push_back(x.shape()[d]);
  int64_t m = 1;
  for (int64_t d = start_dim; d <= end_dim; ++d) m *= x.shape()[d];
  s.push_back(m);
  for (int64_t d = end_dim + 1; d < x.dim(); ++d) s.push_back(x.shape()[d]);
  return reshape(x, s);
}

Tensor permute(const Tensor& x, const std::vector<int64_t>& dims) {
  Tensor y = raw::permute(x, dims);
  if (!needs_grad({&x})) return y;
  std::vector<int64_t> inv(dims.size());
  for (size_t i = 0; i < dims.size(); ++i) inv[wrap_dim(dims[i], x.dim(), "permute")] = static_cast<int64_t>(i);
  return attach(y, "permute", {x}, [inv](const Tensor& g) -> std::vector<Tensor> { return {permute(g, inv)}; });
}

Tensor transpose(const Tensor& x, int64_t d0, int64_t d1) {
  Tensor y = raw::transpose(x, d0, d1);
  if (!needs_grad({&x})) return y;
  return attach(y, "transpose", {x},
                [d0, d1](const Tensor& g) -> std::vector<Tensor> { return {transpose(g, d0, d1)}; });
}

Tensor narrow(const Tensor& x, int64_t dim, int64_t start, int64_t length) {
  Tensor y = raw::narrow(x, dim, start, length);
  if (!needs_grad({&x})) return y;
  // Its gradient: g with zeros before and after, one kernel.
  const int64_t d = wrap_dim(dim, x.dim(), "narrow"), size = x.size(d), first = start < 0 ? start + size : start;
  return attach(y, "narrow", {x}, [d, first, after = size - first - length](const Tensor& g) -> std::vector<Tensor> {
    return {pad(g, d, first, after)};
  });
}

Tensor slice(const Tensor& x, int64_t dim, int64_t start, int64_t end, int64_t step) {
  Tensor y = raw::slice(x, dim, start, end, step);
  if (!needs_grad({&x})) return y;
  return attach(y, "slice", {x}, [s = x.shape(), dim, start, end, step](const Tensor& g) -> std::vector<Tensor> {
    return {scatter_into_zeros(g, s, [&](const Tensor& z) { return slice(z, dim, start, end, step); })};
  });
}

Tensor select(const Tensor& x, int64_t dim, int64_t index) {
  raw::check_defined("select", x, "x");
  LINEA_CHECK(x.dim() > 0, "select: cannot select on a 0-d tensor");
  int64_t d = wrap_dim(dim, x.dim(), "select");
  int64_t n = x.shape()[d];
  LINEA_CHECK(index >= -n && index < n, "select: index ", index, " out of range for dim ", d, " of size ", n);
  if (index < 0) index += n;
  return squeeze(narrow(x, d, index, 1), d);
}

Tensor unsqueeze(const Tensor& x, int64_t dim) {
  Tensor y = raw::unsqueeze(x, dim);
  if (!needs_grad({&x})) return y;
  return attach(y, "unsqueeze", {x},
                [s = x.shape()](const Tensor& g) -> std::vector<Tensor> { return {reshape(g, s)}; });
}

Tensor squeeze(const Tensor& x, int64_t dim) {
  Tensor y = raw::squeeze(x, dim);
  if (!needs_grad({&x})) return y;
  return attach(y, "squeeze", {x}, [s = x.shape()](const Tensor& g) -> std::vector<Tensor> { return {reshape(g, s)}; });
}

Tensor squeeze(const Tensor& x) {
  raw::check_defined("squeeze", x, "x");
  Shape s;
  for (int64_t d : x.shape())
    if (d != 1) s.push_back(d);
  return reshape(x, s);
}

Tensor expand(const Tensor& x, const Shape& shape) {
  Tensor y = raw::expand(x, shape);
  if (!needs_grad({&x})) return y;
  return attach(y, "expand", {x}, [s = x.shape()](const Tensor& g) -> std::vector<Tensor> { return {sum_to(g, s)}; });
}

Tensor contiguous(const Tensor& x) {
  Tensor y = raw::contiguous(x);
  if (y.same(x) || !needs_grad({&x})) return y;
  return attach(y, "contiguous", {x}, [](const Tensor& g) -> std::vector<Tensor> { return {g}; });
}

Tensor clone(const Tensor& x) {
  Tensor y = raw::clone(x);
  if (!needs_grad({&x})) return y;
  return attach(y, "clone", {x}, [](const Tensor& g) -> std::vector<Tensor> { return {g}; });
}

Tensor to(const Tensor& x, Device device) {
  Tensor y = raw::to_device(x, device);
  if (y.same(x) || !needs_grad({&x})) return y;
  return attach(y, "to_device", {x}, [d = x.device()](const Tensor& g) -> std::vector<Tensor> { return {to(g, d)}; });
}

Tensor to(const Tensor& x, DType dtype) {
  Tensor y = raw::to_dtype(x, dtype);
  if (y.same(x) || !needs_grad({&x}) || !is_floating(dtype)) return y;
  return attach(y, "to_dtype", {x}, [t = x.dtype()](const Tensor& g) -> std::vector<Tensor> { return {to(g, t)}; });
}

// ---- Tensor member conveniences -----------------------------------------------------------------
Tensor Tensor::reshape(const Shape& s) const { return linea::reshape(*this, s); }
Tensor Tensor::view(const Shape& s) const { return linea::view(*this, s); }
Tensor Tensor::flatten(int64_t a, int64_t b) const { return linea::flatten(*this, a, b); }
Tensor Tensor::permute(const std::vector<int64_t>& d) const { return linea::permute(*this, d); }
Tensor Tensor::transpose(int64_t a, int64_t b) const { return linea::transpose(*this, a, b); }
Tensor Tensor::narrow(int64_t d, int64_t s, int64_t l) const { return linea::narrow(*this, d, s, l); }
Tensor Tensor::slice(int64_t d, int64_t s, int64_t e, int64_t st) const { return linea::slice(*this, d, s, e, st); }
Tensor Tensor::select(int64_t d, int64_t i) const { return linea::select(*this, d, i); }
Tensor Tensor::unsqueeze(int64_t d) const { return linea::unsqueeze(*this, d); }
Tensor Tensor::squeeze(int64_t d) const { return linea::squeeze(*this, d); }
Tensor Tensor::squeeze() const { return linea::squeeze(*this); }
Tensor Tensor::expand(const Shape& s) const { return linea::expand(*this, s); }
Tensor Tensor::contiguous() const { return linea::contiguous(*this); }
Tensor Tensor::to(Device d) const { return linea::to(*this, d); }
Tensor Tensor::to(DType t) const { return linea::to(*this, t); }
Tensor Tensor::sum(const std::vector<int64_t>& d, bool k) const { return linea::sum(*this, d, k); }
Tensor Tensor::mean(const std::vector<int64_t>& d, bool k) const { return linea::mean(*this, d, k); }

}  // namespace linea
