// Differentiable elementwise ops: unary (backward through the fused unary_backward kernel),
// binary with broadcasting (gradients reduced back with sum_to), where, masked_fill; and the
// ones without a gradient: comparisons, logical ops on Bool, in-place arithmetic (+=, ...).
#include <cmath>

#include "autograd/ops.h"

namespace linea {

namespace {
// Ops whose derivative is cheaper from the output y than from x; only y is saved for them.
bool backward_uses_output(UnaryOp op) {
  return op == UnaryOp::Exp || op == UnaryOp::Sqrt || op == UnaryOp::Rsqrt || op == UnaryOp::Tanh ||
         op == UnaryOp::Sigmoid;
}

Tensor unary_op(UnaryOp op, const Tensor& x, double a = 0.0, double b = 0.0) {
  Tensor y = raw::unary(op, x, a, b);
  if (!needs_grad({&x})) return y;
  // Saved: x or y (detached), never both. The kernel receives the saved one in both slots.
  Tensor saved = backward_uses_output(op) ? y.detach() : x.detach();
  return attach(y, unary_op_name(op), {x}, [op, saved, a, b](const Tensor& g) -> std::vector<Tensor> {
    return {raw::unary_backward(op, g, saved, saved, a, b)};  // dx = g * f'(.)
  });
}

}  // namespace

Tensor neg(const Tensor& x) { return unary_op(UnaryOp::Neg, x); }
Tensor exp(const Tensor& x) { return unary_op(UnaryOp::Exp, x); }
Tensor log(const Tensor& x) { return unary_op(UnaryOp::Log, x); }
Tensor sqrt(const Tensor& x) { return unary_op(UnaryOp::Sqrt, x); }
Tensor rsqrt(const Tensor& x) { return unary_op(UnaryOp::Rsqrt, x); }
Tensor abs(const Tensor& x) { return unary_op(UnaryOp::Abs, x); }
Tensor tanh(const Tensor& x) { return unary_op(UnaryOp::Tanh, x); }
Tensor sigmoid(const Tensor& x) { return unary_op(UnaryOp::Sigmoid, x); }
Tensor relu(const Tensor& x) { return unary_op(UnaryOp::Relu, x); }
Tensor gelu(const Tensor& x, bool approximate) {
  return unary_op(approximate ? UnaryOp::GeluTanh : UnaryOp::GeluErf, x);
}
Tensor sin(const Tensor& x) { return unary_op(UnaryOp::Sin, x); }
Tensor cos(const Tensor& x) { return unary_op(UnaryOp::Cos, x); }
Tensor pow(const Tensor& x, double e) { return unary_op(UnaryOp::Pow, x, e); }
Tensor square(const Tensor& x) { return unary_op(UnaryOp::Square, x); }
Tensor clamp(const Tensor& x, double lo, double hi) {
  LINEA_CHECK(!(lo > hi), "clamp: lo ", lo, " is greater than hi ", hi);
  return unary_op(UnaryOp::Clamp, x, lo, hi);
}
Tensor sign(const Tensor& x) { return raw::unary(UnaryOp::Sign, x); }

// ---- binary ------------------------------------------------------------------------------------
// Backward functions run under NoGradGuard, so the ops they call record nothing.
Tensor add(const Tensor& a, const Tensor& b) {
  Tensor out = raw::binary(BinaryOp::Add, a, b);
  if (!needs_grad({&a, &b})) return out;
  // Only the sides that require grad: a constant side's sum_to would be a wasted reduction (a
  // positional table under a batch of tokens).
  const bool ga = a.requires_grad(), gb = b.requires_grad();
  return attach(out, "add", {a, b}, [sa = a.shape(), sb = b.shape(), ga, gb](const Tensor& g) -> std::vector<Tensor> {
    return {ga ? sum_to(g, sa) : Tensor(), gb ? sum_to(g, sb) : Tensor()};
  });
}

Tensor sub(const Tensor& a, const Tensor& b) {
  Tensor out = raw::binary(BinaryOp::Sub, a, b);
  if (!needs_grad({&a, &b})) return out;
  const bool ga = a.requires_grad(), gb = b.requires_grad();
  return attach(out, "sub", {a, b}, [sa = a.shape(), sb = b.shape(), ga, gb](const Tensor& g) -> std::vector<Tensor> {
    return {ga ? sum_to(g, sa) : Tensor(), gb ? sum_to(-g, sb) : Tensor()};
  });
}

Tensor mul(const Tensor& a, const Tensor& b) {
  Tensor out = raw::binary(BinaryOp::Mul, a, b);
  if (!needs_grad({&a, &b})) return out;
  bool ga = a.requires_grad(), gb = b.requires_grad();
  // d(ab)/da = b, d(ab)/db = a; save only what the other side needs.
  Tensor sa = gb ? a.detach() : Tensor(), sb = ga ? b.detach() : Tensor();
  return attach(out, "mul", {a, b}, [sa, sb, sha = a.shape(), shb = b.shape()](const Tensor& g) -> std::vector<Tensor> {
    return {sb.defined() ? sum_to(g * sb, sha) : Tensor(), sa.defined() ? sum_to(g * sa, shb) : Tensor()};
  });
}

Tensor div(const Tensor& a, const Tensor& b) {
  Tensor out = raw::binary(BinaryOp::Div, a, b);
  if (!needs_grad({&a, &b})) return out;
  const bool ga = a.requires_grad(), gb = b.requires_grad();
  Tensor sb = b.detach(), so = gb ? out.detach() : Tensor();
  // d(a/b)/da = 1/b; d(a/b)/db = -a/b^2 = -out/b
  return attach(
      out, "div", {a, b}, [sb, so, ga, sha = a.shape(), shb = b.shape()](const Tensor& g) -> std::vector<Tensor> {
        Tensor g_over_b = g / sb;
        return {ga ? sum_to(g_over_b, sha) : Tensor(), so.defined() ? sum_to(-(g_over_b * so), shb) : Tensor()};
      });
}

namespace {
// maximum/minimum: the gradient goes to the winner; ties split it evenly (as PyTorch).
Tensor extremum(BinaryOp op, const char* name, const Tensor& a, const Tensor& b) {
  Tensor out = raw::binary(op, a, b);
  if (!needs_grad({&a, &b})) return out;
  const bool is_max = op == BinaryOp::Maximum, need_a = a.requires_grad(), need_b = b.requires_grad();
  return attach(out, name, {a, b},
                [is_max, need_a, need_b, sa = a.detach(), sb = b.detach()](const Tensor& g) -> std::vector<Tensor> {
                  Tensor tie_half = where(sa == sb, g * 0.5, 0.0);
                  Tensor ga = need_a ? sum_to(where(is_max ? sa > sb : sa < sb, g, tie_half), sa.shape()) : Tensor();
                  Tensor gb = need_b ? sum_to(where(is_max ? sa < sb : sa > sb, g, tie_half), sb.shape()) : Tensor();
                  return {ga, gb};
                });
}

// s as a 0-d tensor of a's dtype and device, for a comparison or an in-place op with a. When
// a's dtype cannot hold s exactly (0.5 for an Int64 tensor), the comparison would be wrong:
// returns an undefined tensor then, and the caller compares in float64.
Tensor scalar_like(const Tensor& a, double s, const char* op) {
  raw::check_defined(op, a, "a");
  if (a.dtype() == DType::Bool && s != 0.0 && s != 1.0) return Tensor();
  if (a.dtype() == DType::Int64 && !(s == std::trunc(s) && s >= -9.2233720368547758e18 && s < 9.2233720368547758e18))
    return Tensor();
  return full({}, s, a.options());
}

Tensor compare(BinaryOp op, const Tensor& a, double s) {
  Tensor t = scalar_like(a, s, binary_op_name(op));
  if (t.defined()) return raw::binary(op, a, t);
  return raw::binary(op, raw::to_dtype(a, DType::Float64), full({}, s, TensorOptions(DType::Float64, a.device())));
}
}  // namespace

Tensor maximum(const Tensor& a, const Tensor& b) { return extremum(BinaryOp::Maximum, "maximum", a, b); }
Tensor minimum(const Tensor& a, const Tensor& b) { return extremum(BinaryOp::Minimum, "minimum", a, b); }

Tensor add(const Tensor& a, double s) { return unary_op(UnaryOp::AddScalar, a, s); }
Tensor sub(const Tensor& a, double s) { return unary_op(UnaryOp::AddScalar, a, -s); }
Tensor sub(double s, const Tensor& a) { return add(neg(a), s); }
Tensor mul(const Tensor& a, double s) { return unary_op(UnaryOp::MulScalar, a, s); }
Tensor div(const Tensor& a, double s) { return unary_op(UnaryOp::MulScalar, a, 1.0 / s); }
Tensor div(double s, const Tensor& a) { return mul(pow(a, -1.0), s); }

Tensor eq(const Tensor& a, const Tensor& b) { return raw::binary(BinaryOp::Eq, a, b); }
Tensor ne(const Tensor& a, const Tensor& b) { return raw::binary(BinaryOp::Ne, a, b); }
Tensor lt(const Tensor& a, const Tensor& b) { return raw::binary(BinaryOp::Lt, a, b); }
Tensor le(const Tensor& a, const Tensor& b) { return raw::binary(BinaryOp::Le, a, b); }
Tensor gt(const Tensor& a, const Tensor& b) { return raw::binary(BinaryOp::Gt, a, b); }
Tensor ge(const Tensor& a, const Tensor& b) { return raw::binary(BinaryOp::Ge, a, b); }
Tensor eq(const Tensor& a, double s) { return compare(BinaryOp::Eq, a, s); }
Tensor ne(const Tensor& a, double s) { return compare(BinaryOp::Ne, a, s); }
Tensor lt(const Tensor& a, double s) { return compare(BinaryOp::Lt, a, s); }
Tensor le(const Tensor& a, double s) { return compare(BinaryOp::Le, a, s); }
Tensor gt(const Tensor& a, double s) { return compare(BinaryOp::Gt, a, s); }
Tensor ge(const Tensor& a, double s) { return compare(BinaryOp::Ge, a, s); }

// ---- logical (Bool) ----------------------------------------------------------------------------
namespace {
void check_bool(const char* op, const Tensor& x) {
  raw::check_defined(op, x, "x");
  LINEA_CHECK(x.dtype() == DType::Bool, op, ": expected a bool tensor, got ", dtype_name(x.dtype()), " (shape ",
              shape_str(x.shape()), "); compare first, e.g. x > 0");
}
}  // namespace

Tensor logical_and(const Tensor& a, const Tensor& b) { return raw::binary(BinaryOp::And, a, b); }
Tensor logical_or(const Tensor& a, const Tensor& b) { return raw::binary(BinaryOp::Or, a, b); }
Tensor logical_not(const Tensor& x) {
  check_bool("logical_not", x);
  return raw::binary(BinaryOp::Eq, x, full({}, 0.0, x.options()));
}

// ---- where, masked_fill ------------------------------------------------------------------------
Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b) {
  Tensor out = raw::where(cond, a, b);
  if (!needs_grad({&a, &b})) return out;
  const bool ga = a.requires_grad(), gb = b.requires_grad();
  return attach(
      out, "where", {cond, a, b},
      [c = cond.detach(), sa = a.shape(), sb = b.shape(), ga, gb](const Tensor& g) -> std::vector<Tensor> {
        return {Tensor(), ga ? sum_to(where(c, g, 0.0), sa) : Tensor(), gb ? sum_to(where(c, 0.0, g), sb) : Tensor()};
      });
}
Tensor where(const Tensor& cond, const Tensor& a, double b) {
  raw::check_defined("where", a, "a");
  return where(cond, a, full({}, b, a.options()));
}
Tensor where(const Tensor& cond, double a, const Tensor& b) {
  raw::check_defined("where", b, "b");
  return where(cond, full({}, a, b.options()), b);
}

Tensor masked_fill(const Tensor& x, const Tensor& mask, double value) {
  Tensor out = raw::masked_fill(x, mask, value);
  if (!needs_grad({&x})) return out;
  return attach(out, "masked_fill", {x, mask}, [m = mask.detach()](const Tensor& g) -> std::vector<Tensor> {
    return {masked_fill(g, m, 0.0), Tensor()};
  });
}

// ---- in-place arithmetic -------------------------------------------------------------------------
namespace {
// In-place ops are not recorded by autograd: refused where a graph would need them.
void check_inplace(const char* op, const Tensor& a, const Tensor& b) {
  raw::check_defined(op, a, "a");
  const bool grad = GradMode::is_enabled() && (a.requires_grad() || (b.defined() && b.requires_grad()));
  LINEA_CHECK(!grad, op, ": in-place arithmetic on a tensor that requires grad (", a.requires_grad() ? "a" : "b",
              ", shape ", shape_str(a.requires_grad() ? a.shape() : b.shape()),
              ") is not recorded by autograd; write a = a op b, or run it under NoGradGuard");
}
const Tensor& inplace(BinaryOp op, const char* name, const Tensor& a, const Tensor& b) {
  check_inplace(name, a, b);
  raw::binary_(op, a, b);  // bumps a's storage version
  return a;
}
const Tensor& inplace(BinaryOp op, const char* name, const Tensor& a, double s) {
  check_inplace(name, a, Tensor());
  Tensor t = scalar_like(a, s, name);
  LINEA_CHECK(t.defined(), name, ": ", s, " cannot be written into a ", dtype_name(a.dtype()), " tensor (shape ",
              shape_str(a.shape()), ")");
  raw::binary_(op, a, t);
  return a;
}
}  // namespace

const Tensor& operator+=(const Tensor& a, const Tensor& b) { return inplace(BinaryOp::Add, "operator+=", a, b); }
const Tensor& operator-=(const Tensor& a, const Tensor& b) { return inplace(BinaryOp::Sub, "operator-=", a, b); }
const Tensor& operator*=(const Tensor& a, const Tensor& b) { return inplace(BinaryOp::Mul, "operator*=", a, b); }
const Tensor& operator/=(const Tensor& a, const Tensor& b) { return inplace(BinaryOp::Div, "operator/=", a, b); }
const Tensor& operator+=(const Tensor& a, double s) { return inplace(BinaryOp::Add, "operator+=", a, s); }
const Tensor& operator-=(const Tensor& a, double s) { return inplace(BinaryOp::Sub, "operator-=", a, s); }
const Tensor& operator*=(const Tensor& a, double s) { return inplace(BinaryOp::Mul, "operator*=", a, s); }
const Tensor& operator/=(const Tensor& a, double s) { return inplace(BinaryOp::Div, "operator/=", a, s); }

// ---- operators ---------------------------------------------------------------------------------
Tensor operator+(const Tensor& a, const Tensor& b) { return add(a, b); }
Tensor operator-(const Tensor& a, const Tensor& b) { return sub(a, b); }
Tensor operator*(const Tensor& a, const Tensor& b) { return mul(a, b); }
Tensor operator/(const Tensor& a, const Tensor& b) { return div(a, b); }
Tensor operator+(const Tensor& a, double s) { return add(a, s); }
Tensor operator-(const Tensor& a, double s) { return sub(a, s); }
Tensor operator*(const Tensor& a, double s) { return mul(a, s); }
Tensor operator/(const Tensor& a, double s) { return div(a, s); }
Tensor operator+(double s, const Tensor& a) { return add(a, s); }
Tensor operator-(double s, const Tensor& a) { return sub(s, a); }
Tensor operator*(double s, const Tensor& a) { return mul(a, s); }
Tensor operator/(double s, const Tensor& a) { return div(s, a); }
Tensor operator-(const Tensor& a) { return neg(a); }
Tensor operator==(const Tensor& a, const Tensor& b) { return eq(a, b); }
Tensor operator!=(const Tensor& a, const Tensor& b) { return ne(a, b); }
Tensor operator<(const Tensor& a, const Tensor& b) { return lt(a, b); }
Tensor operator<=(const Tensor& a, const Tensor& b) { return le(a, b); }
Tensor operator>(const Tensor& a, const Tensor& b) { return gt(a, b); }
Tensor operator>=(const Tensor& a, const Tensor& b) { return ge(a, b); }
Tensor operator==(const Tensor& a, double s) { return eq(a, s); }
Tensor operator!=(const Tensor& a, double s) { return ne(a, s); }
Tensor operator<(const Tensor& a, double s) { return lt(a, s); }
Tensor operator<=(const Tensor& a, double s) { return le(a, s); }
Tensor operator>(const Tensor& a, double s) { return gt(a, s); }
Tensor operator>=(const Tensor& a, double s) { return ge(a, s); }
Tensor operator==(double s, const Tensor& a) { return eq(a, s); }
Tensor operator!=(double s, const Tensor& a) { return ne(a, s); }
Tensor operator<(double s, const Tensor& a) { return gt(a, s); }
Tensor operator<=(double s, const Tensor& a) { return ge(a, s); }
Tensor operator>(double s, const Tensor& a) { return lt(a, s); }
Tensor operator>=(double s, const Tensor& a) { return le(a, s); }
Tensor operator&(const Tensor& a, const Tensor& b) { return logical_and(a, b); }
Tensor operator|(const Tensor& a, const Tensor& b) { return logical_or(a, b); }
Tensor operator~(const Tensor& a) { return logical_not(a); }

}  // namespace linea
