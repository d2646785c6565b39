// Differentiable elementwise ops: unary (backward through the fused unary_backward kernel),
// binary with broadcasting (gradients reduced back with sum_to), where, masked_fill.
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

Tensor zero_like_scalar(const Tensor& g) { return full({}, 0.0, g.options()); }
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
Tensor square(const Tensor& x) { return unary_op(UnaryOp::Pow, x, 2.0); }
Tensor clamp(const Tensor& x, double lo, double hi) {
  LINEA_CHECK(!(lo > hi), "clamp: lo ", lo, " is greater than hi ", hi);
  return unary_op(UnaryOp::Clamp, x, lo, hi);
}
Tensor sign(const Tensor& x) { return raw::unary(UnaryOp::Sign, x); }

// ---- binary ------------------------------------------------------------------------------------
Tensor add(const Tensor& a, const Tensor& b) {
  Tensor out = raw::binary(BinaryOp::Add, a, b);
  if (!needs_grad({&a, &b})) return out;
  return attach(out, "add", {a, b}, [sa = a.shape(), sb = b.shape()](const Tensor& g) -> std::vector<Tensor> {
    return {raw::sum_to(g, sa), raw::sum_to(g, sb)};
  });
}

Tensor sub(const Tensor& a, const Tensor& b) {
  Tensor out = raw::binary(BinaryOp::Sub, a, b);
  if (!needs_grad({&a, &b})) return out;
  bool gb = b.requires_grad();
  return attach(out, "sub", {a, b}, [sa = a.shape(), sb = b.shape(), gb](const Tensor& g) -> std::vector<Tensor> {
    return {raw::sum_to(g, sa), gb ? raw::sum_to(raw::unary(UnaryOp::Neg, g), sb) : Tensor()};
  });
}

Tensor mul(const Tensor& a, const Tensor& b) {
  Tensor out = raw::binary(BinaryOp::Mul, a, b);
  if (!needs_grad({&a, &b})) return out;
  bool ga = a.requires_grad(), gb = b.requires_grad();
  // d(ab)/da = b, d(ab)/db = a; save only what the other side needs.
  Tensor sa = gb ? a.detach() : Tensor(), sb = ga ? b.detach() : Tensor();
  return attach(out, "mul", {a, b}, [sa, sb, sha = a.shape(), shb = b.shape()](const Tensor& g) -> std::vector<Tensor> {
    return {sb.defined() ? raw::sum_to(raw::binary(BinaryOp::Mul, g, sb), sha) : Tensor(),
            sa.defined() ? raw::sum_to(raw::binary(BinaryOp::Mul, g, sa), shb) : Tensor()};
  });
}

Tensor div(const Tensor& a, const Tensor& b) {
  Tensor out = raw::binary(BinaryOp::Div, a, b);
  if (!needs_grad({&a, &b})) return out;
  bool gb = b.requires_grad();
  Tensor sb = b.detach(), so = gb ? out.detach() : Tensor();
  // d(a/b)/da = 1/b; d(a/b)/db = -a/b^2 = -out/b
  return attach(out, "div", {a, b}, [sb, so, sha = a.shape(), shb = b.shape()](const Tensor& g) -> std::vector<Tensor> {
    Tensor g_over_b = raw::binary(BinaryOp::Div, g, sb);
    Tensor gb =
        so.defined() ? raw::sum_to(raw::unary(UnaryOp::Neg, raw::binary(BinaryOp::Mul, g_over_b, so)), shb) : Tensor();
    return {raw::sum_to(g_over_b, sha), gb};
  });
}

namespace {
// maximum/minimum: the gradient goes to the winner; ties split it evenly (as PyTorch).
Tensor extremum(BinaryOp op, const char* name, const Tensor& a, const Tensor& b) {
  Tensor out = raw::binary(op, a, b);
  if (!needs_grad({&a, &b})) return out;
  return attach(out, name, {a, b}, [op, sa = a.detach(), sb = b.detach()](const Tensor& g) -> std::vector<Tensor> {
    Tensor a_wins = raw::binary(op == BinaryOp::Maximum ? BinaryOp::Gt : BinaryOp::Lt, sa, sb);
    Tensor tie = raw::binary(BinaryOp::Eq, sa, sb);
    Tensor half = raw::unary(UnaryOp::MulScalar, g, 0.5);
    Tensor z = zero_like_scalar(g);
    Tensor ga = raw::where(a_wins, g, raw::where(tie, half, z));
    Tensor b_wins = raw::binary(op == BinaryOp::Maximum ? BinaryOp::Lt : BinaryOp::Gt, sa, sb);
    Tensor gb = raw::where(b_wins, g, raw::where(tie, half, z));
    return {raw::sum_to(ga, sa.shape()), raw::sum_to(gb, sb.shape())};
  });
}
Tensor scalar_like(const Tensor& a, double s) {
  raw::check_defined("scalar op", a, "a");
  return full({}, s, a.options());
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
Tensor eq(const Tensor& a, double s) { return eq(a, scalar_like(a, s)); }
Tensor ne(const Tensor& a, double s) { return ne(a, scalar_like(a, s)); }
Tensor lt(const Tensor& a, double s) { return lt(a, scalar_like(a, s)); }
Tensor le(const Tensor& a, double s) { return le(a, scalar_like(a, s)); }
Tensor gt(const Tensor& a, double s) { return gt(a, scalar_like(a, s)); }
Tensor ge(const Tensor& a, double s) { return ge(a, scalar_like(a, s)); }

Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b) {
  Tensor out = raw::where(cond, a, b);
  if (!needs_grad({&a, &b})) return out;
  return attach(out, "where", {cond, a, b},
                [c = cond.detach(), sa = a.shape(), sb = b.shape()](const Tensor& g) -> std::vector<Tensor> {
                  Tensor z = zero_like_scalar(g);
                  return {Tensor(), raw::sum_to(raw::where(c, g, z), sa), raw::sum_to(raw::where(c, z, g), sb)};
                });
}

Tensor masked_fill(const Tensor& x, const Tensor& mask, double value) {
  Tensor out = raw::masked_fill(x, mask, value);
  if (!needs_grad({&x})) return out;
  return attach(out, "masked_fill", {x, mask}, [m = mask.detach()](const Tensor& g) -> std::vector<Tensor> {
    return {raw::masked_fill(g, m, 0.0), Tensor()};
  });
}

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
Tensor operator<(const Tensor& a, const Tensor& b) { return lt(a, b); }
Tensor operator<=(const Tensor& a, const Tensor& b) { return le(a, b); }
Tensor operator>(const Tensor& a, const Tensor& b) { return gt(a, b); }
Tensor operator>=(const Tensor& a, const Tensor& b) { return ge(a, b); }

}  // namespace linea
