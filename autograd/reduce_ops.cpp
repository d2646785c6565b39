// Differentiable reductions: sum, mean, max/min (amax semantics), logsumexp, var (composed),
// sum_to; argmax/argmin, any/all (no gradient).
#include <algorithm>
#include <cmath>

#include "autograd/ops.h"

namespace linea {

namespace {
// The gradient of a reduction, reshaped to keepdim form and broadcast back to the input shape.
Tensor expand_back(const Tensor& g, const Shape& in_shape, const std::vector<int64_t>& rd) {
  Shape keep = in_shape;
  for (int64_t d : rd) keep[d] = 1;
  return expand(reshape(g, keep), in_shape);
}

int64_t reduced_count(const Shape& s, const std::vector<int64_t>& rd) {
  int64_t n = 1;
  for (int64_t d : rd) n *= s[d];
  return n;
}
}  // namespace

Tensor sum(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  Tensor y = raw::reduce(ReduceOp::Sum, x, dims, keepdim);
  if (!needs_grad({&x})) return y;
  auto rd = raw::reduction_dims(dims, x.dim(), "sum");
  return attach(y, "sum", {x},
                [s = x.shape(), rd](const Tensor& g) -> std::vector<Tensor> { return {expand_back(g, s, rd)}; });
}

Tensor mean(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  raw::check_defined("mean", x, "x");
  LINEA_CHECK(is_floating(x.dtype()), "mean: expected a floating dtype, got ", dtype_name(x.dtype()),
              "; convert with .to(DType::Float32)");
  auto rd = raw::reduction_dims(dims, x.dim(), "mean");
  int64_t n = reduced_count(x.shape(), rd);
  return mul(sum(x, dims, keepdim), n > 0 ? 1.0 / static_cast<double>(n) : NAN);
}

namespace {
Tensor extremum(ReduceOp op, const char* name, const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  Tensor y = raw::reduce(op, x, dims, keepdim);
  if (!needs_grad({&x})) return y;
  auto rd = raw::reduction_dims(dims, x.dim(), name);
  return attach(y, name, {x}, [sx = x.detach(), sy = y.detach(), rd](const Tensor& g) -> std::vector<Tensor> {
    // Gradient split evenly among the elements equal to the extremum.
    Tensor hit = sx == expand_back(sy, sx.shape(), rd);
    Tensor count = sum(hit.to(sx.dtype()), rd, true);
    Shape keep = sx.shape();
    for (int64_t d : rd) keep[d] = 1;
    Tensor share = g.reshape(keep) / count;
    return {where(hit, share.expand(sx.shape()), 0.0)};
  });
}
}  // namespace

Tensor max(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  return extremum(ReduceOp::Max, "max", x, dims, keepdim);
}
Tensor min(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  return extremum(ReduceOp::Min, "min", x, dims, keepdim);
}

Tensor argmax(const Tensor& x, int64_t dim, bool keepdim) { return raw::arg_reduce(true, x, dim, keepdim); }
Tensor argmin(const Tensor& x, int64_t dim, bool keepdim) { return raw::arg_reduce(false, x, dim, keepdim); }

Tensor logsumexp(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  Tensor y = raw::reduce(ReduceOp::LogSumExp, x, dims, keepdim);
  if (!needs_grad({&x})) return y;
  auto rd = raw::reduction_dims(dims, x.dim(), "logsumexp");
  // d lse / d x = softmax = exp(x - lse)
  return attach(y, "logsumexp", {x}, [sx = x.detach(), sy = y.detach(), rd](const Tensor& g) -> std::vector<Tensor> {
    Tensor p = exp(sx - expand_back(sy, sx.shape(), rd));
    return {p * expand_back(g, sx.shape(), rd)};
  });
}

Tensor var(const Tensor& x, const std::vector<int64_t>& dims, int64_t correction, bool keepdim) {
  raw::check_defined("var", x, "x");
  auto rd = raw::reduction_dims(dims, x.dim(), "var");
  int64_t n = reduced_count(x.shape(), rd);
  // Composed from differentiable ops: sum((x - mean)^2) / (n - correction).
  Tensor d = sub(x, mean(x, dims, true));
  double denom = static_cast<double>(std::max<int64_t>(n - correction, 0));
  return div(sum(mul(d, d), dims, keepdim), denom);
}

Tensor sum_to(const Tensor& x, const Shape& shape) {
  Tensor y = raw::sum_to(x, shape);
  if (!needs_grad({&x}) || y.same(x)) return y;
  return attach(y, "sum_to", {x}, [s = x.shape()](const Tensor& g) -> std::vector<Tensor> { return {expand(g, s)}; });
}

namespace {
// The number of true elements of a Bool x over dims, as Int64.
Tensor count_true(const char* op, const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  raw::check_defined(op, x, "x");
  LINEA_CHECK(x.dtype() == DType::Bool, op, ": expected a bool tensor, got ", dtype_name(x.dtype()), " (shape ",
              shape_str(x.shape()), "); compare first, e.g. any(x > 0)");
  return sum(x.to(DType::Int64), dims, keepdim);
}
}  // namespace

Tensor any(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  return count_true("any", x, dims, keepdim) > 0.0;
}
Tensor all(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  return count_true("all", logical_not(x), dims, keepdim) == 0.0;
}

}  // namespace linea
