// linea::raw matmul and the fused nn ops (softmax, layer_norm, normalize, sums_ratio, sq_norm, per-row
// cross-entropy): argument checks that name the op and the offending shapes/dtypes/values,
// output allocation, the [outer, r, inner] / [rows, cols] views the kernels work on, and
// dispatch to the CPU or CUDA kernels (core/kernels.h).
// Not here: the kernels themselves (core/cpu/blas.cpp, core/cpu/nn.cpp, cuda/) and autograd
// (autograd/nn_ops.cpp).
#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <vector>

#include "core/dispatch.h"
#include "core/ops.h"
#include "core/random.h"

namespace linea::raw {

namespace {

void check_floating(const char* op, const Tensor& t, const char* name) {
  LINEA_CHECK(is_floating(t.dtype()), op, ": expected ", name, " to be float32 or float64, got ", t.dtype(), " (shape ",
              shape_str(t.shape()), ")");
}

int64_t prod(const Shape& s, size_t begin, size_t end) {
  int64_t p = 1;
  for (size_t i = begin; i < end; ++i) p *= s[i];
  return p;
}

// The matrix part (last two dims) of t as a view BLAS can read in place: row-major
// (stride(-1) == 1, stride(-2) >= cols) or column-major (stride(-2) == 1, stride(-1) >= rows),
// with the strides of size-1 dims made canonical so that kernels may read the leading
// dimension straight from the strides. Anything else (e.g. a strided slice) is copied.
Tensor blas_operand(const Tensor& t) {
  const int64_t rows = t.size(-2), cols = t.size(-1);
  const int64_t sr = t.stride(-2), sc = t.stride(-1);
  Strides st = t.strides();
  if ((cols <= 1 || sc == 1) && (rows <= 1 || sr >= cols)) {
    st[st.size() - 1] = 1;
    st[st.size() - 2] = rows <= 1 ? std::max<int64_t>(cols, 1) : sr;
  } else if ((rows <= 1 || sr == 1) && (cols <= 1 || sc >= rows)) {
    st[st.size() - 2] = 1;
    st[st.size() - 1] = cols <= 1 ? std::max<int64_t>(rows, 1) : sc;
  } else {
    return contiguous(t);
  }
  if (st == t.strides()) return t;
  return as_strided(t, t.shape(), st, t.offset());
}

}  // namespace

// ---- linear -----------------------------------------------------------------------------------
// x [..., K] @ weight^T [K, N] + bias [N] -> [..., N]; x as [R, K] rows, one GEMM (with the bias
// in its epilogue on CUDA).
namespace {
void check_linear_args(const char* op, const Tensor& x, const Tensor& w, const Tensor& b) {
  check_defined(op, x, "x");
  check_defined(op, w, "weight");
  LINEA_CHECK(x.dim() >= 1 && w.dim() == 2 && x.size(-1) == w.size(1), op,
              ": expected x [..., K] and weight [N, K], got x ", shape_str(x.shape()), " and weight ",
              shape_str(w.shape()));
  check_floating(op, x, "x");
  check_same_dtype(op, x, w);
  check_same_device(op, x, w);
  if (b.defined()) {
    LINEA_CHECK(b.dim() == 1 && b.size(0) == w.size(0), op, ": bias must be [", w.size(0), "] (one per output), got ",
                shape_str(b.shape()));
    check_same_dtype(op, x, b);
    check_same_device(op, x, b);
  }
}
}  // namespace

Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  check_linear_args("linear", x, weight, bias);
  const int64_t K = x.size(-1), N = weight.size(0), R = prod(x.shape(), 0, x.shape().size() - 1);
  Shape out_shape(x.shape().begin(), x.shape().end() - 1);
  out_shape.push_back(N);
  Tensor out = empty({R, N}, x.options());
  if (out.numel() > 0 && K == 0) {
    if (bias.defined())
      copy_(out, bias);
    else
      LINEA_BACKEND(out.device(), fill, out, 0.0);
  } else if (out.numel() > 0) {
    LINEA_BACKEND(out.device(), linear, blas_operand(reshape(x, {R, K})), contiguous(weight),
                  bias.defined() ? contiguous(bias) : Tensor(), out);
  }
  return reshape(out, out_shape);
}

std::vector<Tensor> linear_weight_grad(const Tensor& grad, const Tensor& x, bool want_bias) {
  const char* op = "linear_weight_grad";
  check_defined(op, grad, "grad");
  check_defined(op, x, "x");
  LINEA_CHECK(
      x.dim() >= 1 && grad.dim() == x.dim() && std::equal(x.shape().begin(), x.shape().end() - 1, grad.shape().begin()),
      op, ": grad ", shape_str(grad.shape()), " does not match x ", shape_str(x.shape()),
      " (expected [..., N] over x's rows)");
  const int64_t K = x.size(-1), N = grad.size(-1), R = prod(x.shape(), 0, x.shape().size() - 1);
  check_same_dtype(op, x, grad);
  check_same_device(op, x, grad);
  Tensor dw = empty({N, K}, x.options());
  Tensor db = want_bias ? empty({N}, x.options()) : Tensor();
  if (R == 0) {
    LINEA_BACKEND(dw.device(), fill, dw, 0.0);
    if (db.defined()) LINEA_BACKEND(db.device(), fill, db, 0.0);
  } else if (dw.numel() > 0 || (db.defined() && db.numel() > 0)) {
    LINEA_BACKEND(dw.device(), linear_weight_grad, contiguous(reshape(grad, {R, N})), blas_operand(reshape(x, {R, K})),
                  dw, db);
  }
  return {dw, db};
}

// ---- matmul ---------------------------------------------------------------------------------
namespace {
void check_matmul_args(const Tensor& a, const Tensor& b) {
  check_defined("matmul", a, "a");
  check_defined("matmul", b, "b");
  LINEA_CHECK(a.dim() >= 1 && b.dim() >= 1, "matmul: both arguments need at least 1 dimension, got ",
              shape_str(a.shape()), " and ", shape_str(b.shape()));
  check_same_device("matmul", a, b);
  check_same_dtype("matmul", a, b);
  check_floating("matmul", a, "a");
  const int64_t K = a.size(-1);
  const int64_t Kb = b.dim() == 1 ? b.size(0) : b.size(-2);
  LINEA_CHECK(K == Kb, "matmul: shapes cannot be multiplied (", shape_str(a.shape()), " and ", shape_str(b.shape()),
              ")");
}

// The broadcast batch shape of a2 [..., M, K] and b2 [..., K, N], followed by M, N.
Shape matmul_shape(const Tensor& a2, const Tensor& b2) {
  const Shape ba(a2.shape().begin(), a2.shape().end() - 2), bb(b2.shape().begin(), b2.shape().end() - 2);
  Shape out_shape = broadcast_shapes(ba, bb, "matmul");
  out_shape.push_back(a2.size(-2));
  out_shape.push_back(b2.size(-1));
  return out_shape;
}

// out (+)= alpha a2 @ b2 for 2-D or more operands; out [batch..., M, N] with row-major matrices.
void matmul_2d(Tensor a2, Tensor b2, const Tensor& out, double alpha, bool accumulate) {
  const int64_t M = a2.size(-2), N = b2.size(-1), K = a2.size(-1);
  LINEA_CHECK(M <= INT_MAX && N <= INT_MAX && K <= INT_MAX, "matmul: matrix dims above 2^31 are not supported (",
              shape_str(a2.shape()), " and ", shape_str(b2.shape()), ")");
  if (out.numel() == 0) return;
  if (K == 0) {
    if (!accumulate) LINEA_BACKEND(out.device(), fill, out, 0.0);  // an empty sum
    return;
  }
  // Layout first (a copy, if one is needed, is made before broadcasting), then expand.
  const Shape batch(out.shape().begin(), out.shape().end() - 2);
  a2 = blas_operand(a2);
  b2 = blas_operand(b2);
  Shape sa = batch, sb = batch;
  sa.insert(sa.end(), {M, K});
  sb.insert(sb.end(), {K, N});
  if (a2.shape() != sa) a2 = expand(a2, sa);
  if (b2.shape() != sb) b2 = expand(b2, sb);
  LINEA_BACKEND(out.device(), matmul, a2, b2, out, alpha, accumulate);
}
}  // namespace

// a [..., M, K] (or [K]) @ b [..., K, N] (or [K]) -> [broadcast(...), M, N], 1-D dims removed.
Tensor matmul(const Tensor& a, const Tensor& b, double alpha) {
  check_matmul_args(a, b);
  LINEA_CHECK(std::isfinite(alpha), "matmul: alpha must be finite, got ", alpha);
  // 1-D promotion: [K] -> [1, K] on the left, [K] -> [K, 1] on the right.
  const Tensor a2 = a.dim() == 1 ? unsqueeze(a, 0) : a;  // [..., M, K]
  const Tensor b2 = b.dim() == 1 ? unsqueeze(b, 1) : b;  // [..., K, N]
  Tensor out = empty(matmul_shape(a2, b2), TensorOptions(a.dtype(), a.device()));
  matmul_2d(a2, b2, out, alpha, false);
  // Drop the promoted dims.
  if (a.dim() == 1 && b.dim() == 1) return view(out, {});
  if (a.dim() == 1) return squeeze(out, -2);
  if (b.dim() == 1) return squeeze(out, -1);
  return out;
}

void matmul_into(const Tensor& a, const Tensor& b, const Tensor& out, double alpha, bool accumulate) {
  check_matmul_args(a, b);
  check_defined("matmul", out, "out");
  LINEA_CHECK(a.dim() >= 2 && b.dim() >= 2, "matmul: writing into out needs a and b of at least 2 dims, got ",
              shape_str(a.shape()), " @ ", shape_str(b.shape()));
  LINEA_CHECK(out.shape() == matmul_shape(a, b), "matmul: out has shape ", shape_str(out.shape()), ", expected ",
              shape_str(matmul_shape(a, b)), " for ", shape_str(a.shape()), " @ ", shape_str(b.shape()));
  check_same_device("matmul", a, out);
  check_same_dtype("matmul", a, out);
  LINEA_CHECK(out.size(-1) <= 1 || out.stride(-1) == 1, "matmul: out's matrices must be row-major, got strides ",
              shape_str(out.strides()));
  ++out.impl().storage->version;
  matmul_2d(a, b, out, alpha, accumulate);
}

Tensor empty_like_layout(const Tensor& t) {
  check_defined("empty_like_layout", t, "t");
  // Dims by decreasing stride (size-1 dims anywhere): t is a permutation of a dense tensor when
  // each stride is the product of the sizes after it in that order.
  std::vector<int64_t> order(static_cast<size_t>(t.dim()));
  for (int64_t d = 0; d < t.dim(); ++d) order[static_cast<size_t>(d)] = d;
  std::stable_sort(order.begin(), order.end(), [&](int64_t x, int64_t y) { return t.stride(x) > t.stride(y); });
  int64_t expected = 1;
  bool dense = true;
  for (size_t i = order.size(); i-- > 0;) {
    const int64_t d = order[i];
    if (t.size(d) == 1) continue;
    dense = dense && t.stride(d) == expected;
    expected *= t.size(d);
  }
  if (!dense || t.is_contiguous()) return empty(t.shape(), t.options());
  Shape stored;
  for (int64_t d : order) stored.push_back(t.size(d));
  const Tensor base = empty(stored, t.options());  // [sizes in stride order], contiguous
  Strides st(static_cast<size_t>(t.dim()));
  for (size_t i = 0; i < order.size(); ++i) st[static_cast<size_t>(order[i])] = base.stride(static_cast<int64_t>(i));
  return as_strided(base, t.shape(), st, 0);
}

// ---- softmax --------------------------------------------------------------------------------
namespace {
struct Dims3 {
  int64_t outer, r, inner;
};
Dims3 split_at(const Shape& s, int64_t dim) {
  if (s.empty()) return {1, 1, 1};  // a 0-d tensor is one row of length 1
  const size_t d = static_cast<size_t>(dim);
  return {prod(s, 0, d), s[d], prod(s, d + 1, s.size())};
}
}  // namespace

Tensor softmax(const Tensor& x, int64_t dim, bool log) {
  const char* op = log ? "log_softmax" : "softmax";
  check_defined(op, x, "x");
  check_floating(op, x, "x");
  const int64_t d = wrap_dim(dim, std::max<int64_t>(x.dim(), 1), op);
  const Dims3 v = split_at(x.shape(), d);
  Tensor xc = contiguous(x);
  Tensor out = empty(x.shape(), TensorOptions(x.dtype(), x.device()));
  if (out.numel() > 0) LINEA_BACKEND(x.device(), softmax, xc, out, v.outer, v.r, v.inner, log);
  return out;
}

// grad, y [x's shape] -> dx; y is the forward output.
Tensor softmax_backward(const Tensor& grad, const Tensor& y, int64_t dim, bool log) {
  const char* op = log ? "log_softmax_backward" : "softmax_backward";
  check_defined(op, grad, "grad");
  check_defined(op, y, "y");
  check_same_device(op, grad, y);
  check_same_dtype(op, grad, y);
  check_floating(op, y, "y");
  LINEA_CHECK(grad.shape() == y.shape(), op, ": grad ", shape_str(grad.shape()), " and output ", shape_str(y.shape()),
              " differ in shape");
  const int64_t d = wrap_dim(dim, std::max<int64_t>(y.dim(), 1), op);
  const Dims3 v = split_at(y.shape(), d);
  Tensor gc = contiguous(grad), yc = contiguous(y);
  Tensor dx = empty(y.shape(), TensorOptions(y.dtype(), y.device()));
  if (dx.numel() > 0) LINEA_BACKEND(y.device(), softmax_backward, gc, yc, dx, v.outer, v.r, v.inner, log);
  return dx;
}

// ---- layer norm -----------------------------------------------------------------------------
namespace {
// Checks x and the optional affine params; returns {rows, cols}.
std::pair<int64_t, int64_t> layer_norm_dims(const char* op, const Tensor& x, int64_t normalized_ndim, const Tensor& w,
                                            const Tensor& b) {
  check_defined(op, x, "x");
  check_floating(op, x, "x");
  LINEA_CHECK(normalized_ndim >= 1 && normalized_ndim <= x.dim(), op, ": cannot normalize over the last ",
              normalized_ndim, " dims of a tensor of shape ", shape_str(x.shape()));
  const size_t start = static_cast<size_t>(x.dim() - normalized_ndim);
  const Shape norm_shape(x.shape().begin() + start, x.shape().end());
  for (const Tensor* p : {&w, &b}) {
    if (!p->defined()) continue;
    const char* name = p == &w ? "weight" : "bias";
    check_same_device(op, x, *p);
    check_same_dtype(op, x, *p);
    LINEA_CHECK(p->shape() == norm_shape, op, ": ", name, " has shape ", shape_str(p->shape()),
                " but the normalized shape is ", shape_str(norm_shape), " (input ", shape_str(x.shape()), ")");
  }
  const int64_t cols = shape_numel(norm_shape);
  return {cols == 0 ? 0 : x.numel() / cols, cols};
}
}  // namespace

// x [..., *norm] -> {out [x's shape], mean [rows], rstd [rows]}
std::vector<Tensor> layer_norm(const Tensor& x, int64_t normalized_ndim, const Tensor& w, const Tensor& b, double eps) {
  const auto [rows, cols] = layer_norm_dims("layer_norm", x, normalized_ndim, w, b);
  LINEA_CHECK(eps >= 0, "layer_norm: eps must be >= 0, got ", eps);
  const TensorOptions opts(x.dtype(), x.device());
  Tensor out = empty(x.shape(), opts);
  Tensor mean = empty({rows}, opts), rstd = empty({rows}, opts);
  if (rows > 0 && cols > 0) {
    Tensor xc = contiguous(x);
    Tensor wc = w.defined() ? contiguous(w) : Tensor(), bc = b.defined() ? contiguous(b) : Tensor();
    LINEA_BACKEND(x.device(), layer_norm, xc, wc, bc, eps, out, mean, rstd, rows, cols);
  }
  return {out, mean, rstd};
}

// x, r [..., *norm] (same shape) -> {sum = x + r, out = layer_norm(sum), mean [rows], rstd [rows]}
std::vector<Tensor> add_layer_norm(const Tensor& x, const Tensor& r, const FoldedDropout& dropout,
                                   int64_t normalized_ndim, const Tensor& w, const Tensor& b, double eps) {
  const auto [rows, cols] = layer_norm_dims("add_layer_norm", x, normalized_ndim, w, b);
  check_defined("add_layer_norm", r, "r");
  check_same_device("add_layer_norm", x, r);
  check_same_dtype("add_layer_norm", x, r);
  LINEA_CHECK(r.shape() == x.shape(), "add_layer_norm: x ", shape_str(x.shape()), " and r ", shape_str(r.shape()),
              " differ in shape (the residual sum does not broadcast)");
  LINEA_CHECK(eps >= 0, "add_layer_norm: eps must be >= 0, got ", eps);
  LINEA_CHECK(dropout.p >= 0 && dropout.p <= 1 && (dropout.p == 0 || x.dim() >= 1), "add_layer_norm: dropout ",
              dropout.p, " must be in [0, 1] (on a tensor whose first dim is the batch)");
  const TensorOptions opts(x.dtype(), x.device());
  Tensor sum = empty(x.shape(), opts), out = empty(x.shape(), opts);
  Tensor mean = empty({rows}, opts), rstd = empty({rows}, opts);
  if (rows > 0 && cols > 0) {
    Tensor wc = w.defined() ? contiguous(w) : Tensor(), bc = b.defined() ? contiguous(b) : Tensor();
    LINEA_BACKEND(x.device(), add_layer_norm, contiguous(x), contiguous(r), dropout, wc, bc, eps, sum, out, mean, rstd,
                  rows, cols);
  } else if (sum.numel() > 0) {  // nothing to normalize (cols == 0 leaves an empty sum)
    LINEA_BACKEND(x.device(), binary, BinaryOp::Add, x, r, sum);
  }
  return {sum, out, mean, rstd};
}

namespace {
// A gradient `what` of x's shape, device and dtype.
void check_like_x(const char* op, const Tensor& g, const char* what, const Tensor& x) {
  check_defined(op, g, what);
  check_same_device(op, g, x);
  check_same_dtype(op, g, x);
  LINEA_CHECK(g.shape() == x.shape(), op, ": ", what, " ", shape_str(g.shape()), " and input ", shape_str(x.shape()),
              " differ in shape");
}

// layer_norm_backward's checks; returns {rows, cols}.
std::pair<int64_t, int64_t> norm_backward_dims(const char* op, const Tensor& grad, const Tensor& x,
                                               int64_t normalized_ndim, const Tensor& w, const Tensor& b,
                                               const Tensor& mean, const Tensor& rstd) {
  const auto [rows, cols] = layer_norm_dims(op, x, normalized_ndim, w, b);
  check_like_x(op, grad, "grad", x);
  LINEA_CHECK(mean.numel() == rows && rstd.numel() == rows, op, ": mean/rstd ", shape_str(mean.shape()), "/",
              shape_str(rstd.shape()), " do not have ", rows, " rows");
  return {rows, cols};
}
}  // namespace

// grad, x [..., *norm]; w, b [*norm] or undefined; mean, rstd [rows] -> {dx, dw, db}
std::vector<Tensor> layer_norm_backward(const Tensor& grad, const Tensor& x, int64_t normalized_ndim, const Tensor& w,
                                        const Tensor& b, const Tensor& mean, const Tensor& rstd) {
  const auto [rows, cols] = norm_backward_dims("layer_norm_backward", grad, x, normalized_ndim, w, b, mean, rstd);
  const TensorOptions opts(x.dtype(), x.device());
  Tensor dx = empty(x.shape(), opts);
  Tensor dw = w.defined() ? empty(w.shape(), opts) : Tensor();
  Tensor db = b.defined() ? empty(b.shape(), opts) : Tensor();
  if (rows == 0 || cols == 0) {
    if (dx.numel() > 0) dx.zero_();
    if (dw.defined()) dw.zero_();
    if (db.defined()) db.zero_();
    return {dx, dw, db};
  }
  Tensor gc = contiguous(grad), xc = contiguous(x);
  Tensor wc = w.defined() ? contiguous(w) : Tensor();
  Tensor mc = contiguous(mean), rc = contiguous(rstd);
  LINEA_BACKEND(x.device(), layer_norm_backward, gc, xc, wc, mc, rc, dx, dw, db, rows, cols);
  return {dx, dw, db};
}

// grad (the norm's; undefined: none), grad_sum (the sum's own; undefined: none), sum [..., *norm];
// w, b [*norm] or undefined; mean, rstd [rows] -> {dx, dr, dw, db}
std::vector<Tensor> add_layer_norm_backward(const Tensor& grad, const Tensor& grad_sum, const Tensor& sum,
                                            int64_t normalized_ndim, const Tensor& w, const Tensor& b,
                                            const Tensor& mean, const Tensor& rstd, const FoldedDropout& dropout) {
  const char* op = "add_layer_norm_backward";
  LINEA_CHECK(grad.defined() || grad_sum.defined(), op, ": neither the norm nor the sum has a gradient");
  if (grad_sum.defined()) check_like_x(op, grad_sum, "grad_sum", sum);
  const ExampleDraw draw{dropout.seed, dropout.draw, dropout.first_row, dropout.draw_base};
  if (!grad.defined())  // the norm got none: the sum's goes to x, and through the dropout to r
    return {grad_sum, dropout.p > 0 ? dropout_rows(grad_sum, dropout.p, draw) : Tensor(), Tensor(), Tensor()};
  const auto [rows, cols] = norm_backward_dims(op, grad, sum, normalized_ndim, w, b, mean, rstd);
  if (rows == 0 || cols == 0) {  // nothing normalized: layer_norm_backward's zeros
    std::vector<Tensor> d = layer_norm_backward(grad, sum, normalized_ndim, w, b, mean, rstd);
    const Tensor dx = grad_sum.defined() ? binary(BinaryOp::Add, d[0], grad_sum) : d[0];
    return {dx, dropout.p > 0 ? dropout_rows(dx, dropout.p, draw) : Tensor(), d[1], d[2]};
  }
  const TensorOptions opts(sum.dtype(), sum.device());
  Tensor dx = empty(sum.shape(), opts), dr = dropout.p > 0 ? empty(sum.shape(), opts) : Tensor();
  Tensor dw = w.defined() ? empty(w.shape(), opts) : Tensor(), db = b.defined() ? empty(b.shape(), opts) : Tensor();
  LINEA_BACKEND(sum.device(), add_layer_norm_backward, contiguous(grad),
                grad_sum.defined() ? contiguous(grad_sum) : Tensor(), contiguous(sum),
                w.defined() ? contiguous(w) : Tensor(), contiguous(mean), contiguous(rstd), dropout, dx, dr, dw, db,
                rows, cols);
  return {dx, dr, dw, db};
}

// ---- normalize ------------------------------------------------------------------------------
namespace {
// Checks x and eps; returns {rows, cols} over x's last dim.
std::pair<int64_t, int64_t> normalize_dims(const char* op, const Tensor& x, double eps) {
  check_defined(op, x, "x");
  check_floating(op, x, "x");
  LINEA_CHECK(x.dim() >= 1, op, ": needs a dim to normalize over, got a tensor of shape ", shape_str(x.shape()));
  LINEA_CHECK(eps > 0 && std::isfinite(eps), op, ": eps must be positive and finite, got ", eps);
  LINEA_CHECK(x.dtype() != DType::Float32 || static_cast<float>(eps) > 0, op, ": eps ", eps,
              " rounds to 0 in float32 (a zero row would give 0 / 0)");
  const int64_t cols = x.size(-1);
  return {cols == 0 ? 0 : x.numel() / cols, cols};
}
}  // namespace

Tensor normalize(const Tensor& x, double eps) {
  const auto [rows, cols] = normalize_dims("normalize", x, eps);
  Tensor out = empty(x.shape(), TensorOptions(x.dtype(), x.device()));
  if (out.numel() > 0) LINEA_BACKEND(x.device(), normalize, contiguous(x), eps, out, rows, cols);
  return out;
}

Tensor normalize_backward(const Tensor& grad, const Tensor& x, double eps) {
  const auto [rows, cols] = normalize_dims("normalize_backward", x, eps);
  check_defined("normalize_backward", grad, "grad");
  check_same_device("normalize_backward", grad, x);
  check_same_dtype("normalize_backward", grad, x);
  LINEA_CHECK(grad.shape() == x.shape(), "normalize_backward: grad ", shape_str(grad.shape()), " and x ",
              shape_str(x.shape()), " differ in shape");
  Tensor dx = empty(x.shape(), TensorOptions(x.dtype(), x.device()));
  if (dx.numel() > 0)
    LINEA_BACKEND(x.device(), normalize_backward, contiguous(grad), contiguous(x), eps, dx, rows, cols);
  return dx;
}

// ---- sums_ratio -----------------------------------------------------------------------------
namespace {
// Checks y [B, H, N, E + 1] (E >= 1) and visible (undefined, or Bool [B, 1, N or 1, 1]); returns
// visible as [B, N or 1], contiguous.
Tensor sums_ratio_visible(const char* op, const Tensor& y, const Tensor& visible) {
  check_defined(op, y, "y");
  check_floating(op, y, "y");
  LINEA_CHECK(y.dim() == 4 && y.size(3) >= 2, op, ": expected y [B, H, N, E + 1] holding [num, den] (E >= 1), got ",
              shape_str(y.shape()));
  if (!visible.defined()) return Tensor();
  const int64_t B = y.size(0), N = y.size(2);
  LINEA_CHECK(visible.dtype() == DType::Bool && visible.dim() == 4 && visible.size(0) == B && visible.size(1) == 1 &&
                  (visible.size(2) == N || visible.size(2) == 1) && visible.size(3) == 1,
              op, ": visible must be Bool [B, 1, N or 1, 1] = [", B, ", 1, ", N, " or 1, 1] for y ",
              shape_str(y.shape()), ", got ", dtype_name(visible.dtype()), " ", shape_str(visible.shape()));
  check_same_device(op, y, visible);
  return contiguous(reshape(visible, {B, visible.size(2)}));
}
}  // namespace

Tensor sums_ratio(const Tensor& y, const Tensor& visible, double tiny) {
  const Tensor vis = sums_ratio_visible("sums_ratio", y, visible);
  const int64_t E = y.size(3) - 1, rows = y.numel() / (E + 1);
  Tensor out = empty({y.size(0), y.size(1), y.size(2), E}, y.options());
  LINEA_BACKEND(y.device(), sums_ratio, contiguous(y), vis, y.size(1) * y.size(2), tiny, out, rows, E);
  return out;
}

Tensor sums_ratio_backward(const Tensor& grad, const Tensor& y, const Tensor& visible, double tiny) {
  const char* op = "sums_ratio_backward";
  const Tensor vis = sums_ratio_visible(op, y, visible);
  check_defined(op, grad, "grad");
  check_same_device(op, grad, y);
  check_same_dtype(op, grad, y);
  const int64_t E = y.size(3) - 1, rows = y.numel() / (E + 1);
  LINEA_CHECK(grad.shape() == Shape({y.size(0), y.size(1), y.size(2), E}), op, ": grad ", shape_str(grad.shape()),
              " is not y ", shape_str(y.shape()), " less its last column");
  Tensor dy = empty(y.shape(), y.options());
  LINEA_BACKEND(y.device(), sums_ratio_backward, contiguous(grad), contiguous(y), vis, y.size(1) * y.size(2), tiny, dy,
                rows, E);
  return dy;
}

// ---- sq_norm --------------------------------------------------------------------------------
namespace {
// Checks x; returns {rows, cols} over x's last dim.
std::pair<int64_t, int64_t> sq_norm_dims(const char* op, const Tensor& x) {
  check_defined(op, x, "x");
  check_floating(op, x, "x");
  LINEA_CHECK(x.dim() >= 1, op, ": needs a dim to sum over, got a tensor of shape ", shape_str(x.shape()));
  Shape lead = x.shape();
  lead.pop_back();
  return {shape_numel(lead), x.size(-1)};
}
}  // namespace

Tensor sq_norm(const Tensor& x, double scale) {
  const auto [rows, cols] = sq_norm_dims("sq_norm", x);
  Shape shape = x.shape();
  shape.pop_back();
  Tensor out = empty(shape, TensorOptions(x.dtype(), x.device()));
  if (rows > 0) LINEA_BACKEND(x.device(), sq_norm, contiguous(x), scale, out, rows, cols);
  return out;
}

Tensor sq_norm_backward(const Tensor& grad, const Tensor& x, double scale) {
  const auto [rows, cols] = sq_norm_dims("sq_norm_backward", x);
  check_defined("sq_norm_backward", grad, "grad");
  check_same_device("sq_norm_backward", grad, x);
  check_same_dtype("sq_norm_backward", grad, x);
  LINEA_CHECK(grad.dim() == x.dim() - 1 && shape_numel(grad.shape()) == rows &&
                  std::equal(grad.shape().begin(), grad.shape().end(), x.shape().begin()),
              "sq_norm_backward: grad ", shape_str(grad.shape()), " is not x ", shape_str(x.shape()),
              " without its last dim");
  Tensor dx = empty(x.shape(), TensorOptions(x.dtype(), x.device()));
  if (dx.numel() > 0)
    LINEA_BACKEND(x.device(), sq_norm_backward, contiguous(grad), contiguous(x), scale, dx, rows, cols);
  return dx;
}

// ---- cross-entropy --------------------------------------------------------------------------
namespace {
void check_cross_entropy_args(const char* op, const Tensor& logits, const Tensor& target, int64_t ignore_index,
                              double smoothing) {
  check_defined(op, logits, "logits");
  check_defined(op, target, "target");
  check_floating(op, logits, "logits");
  LINEA_CHECK(logits.dim() == 2, op, ": expected logits [N, C], got ", shape_str(logits.shape()));
  LINEA_CHECK(target.dtype() == DType::Int64, op, ": expected target of dtype int64, got ", target.dtype(), " (shape ",
              shape_str(target.shape()), ")");
  LINEA_CHECK(target.dim() == 1 && target.size(0) == logits.size(0), op, ": target ", shape_str(target.shape()),
              " does not match logits ", shape_str(logits.shape()), " (expected [", logits.size(0), "])");
  check_same_device(op, logits, target);
  LINEA_CHECK(smoothing >= 0.0 && smoothing <= 1.0, op, ": label smoothing must be in [0, 1], got ", smoothing);
  if (target.is_cpu()) {  // on CUDA this would need a host sync; the kernel skips bad rows there
    const Tensor tc = contiguous(target);
    const int64_t* pt = tc.data<int64_t>();
    const int64_t C = logits.size(1);
    for (int64_t i = 0; i < tc.numel(); ++i)
      LINEA_CHECK(pt[i] == ignore_index || (pt[i] >= 0 && pt[i] < C), op, ": target value ", pt[i], " at index ", i,
                  " is out of range for ", C, " classes (ignore_index ", ignore_index, ")");
  }
}
}  // namespace

// logits [N, C], target Int64 [N] -> {loss [N], lse [N]} (+ nll [N])
std::vector<Tensor> cross_entropy_rows(const Tensor& logits, const Tensor& target, int64_t ignore_index,
                                       double smoothing, bool want_nll) {
  check_cross_entropy_args("cross_entropy", logits, target, ignore_index, smoothing);
  const int64_t N = logits.size(0);
  const TensorOptions opts(logits.dtype(), logits.device());
  Tensor loss = empty({N}, opts), lse = empty({N}, opts), nll = want_nll ? empty({N}, opts) : Tensor();
  if (N > 0) {
    LINEA_CHECK(logits.size(1) > 0, "cross_entropy: logits ", shape_str(logits.shape()), " have no classes");
    Tensor lc = contiguous(logits), tc = contiguous(target);
    LINEA_BACKEND(logits.device(), cross_entropy, lc, tc, ignore_index, smoothing, loss, lse, nll);
  }
  if (want_nll) return {loss, lse, nll};
  return {loss, lse};
}

// grad [N], logits [N, C], target [N], lse [N] -> dlogits [N, C]
Tensor cross_entropy_rows_backward(const Tensor& grad, const Tensor& logits, const Tensor& target, const Tensor& lse,
                                   int64_t ignore_index, double smoothing) {
  check_cross_entropy_args("cross_entropy_backward", logits, target, ignore_index, smoothing);
  check_defined("cross_entropy_backward", grad, "grad");
  check_same_device("cross_entropy_backward", grad, logits);
  check_same_dtype("cross_entropy_backward", grad, logits);
  check_same_dtype("cross_entropy_backward", lse, logits);
  const int64_t N = logits.size(0);
  LINEA_CHECK(grad.shape() == Shape{N} && lse.shape() == Shape{N}, "cross_entropy_backward: grad ",
              shape_str(grad.shape()), " and lse ", shape_str(lse.shape()), " must be [", N, "]");
  Tensor dlogits = empty(logits.shape(), TensorOptions(logits.dtype(), logits.device()));
  if (dlogits.numel() > 0) {
    Tensor gc = grad.stride(0) == 0 ? grad : contiguous(grad);  // an expanded mean's gradient, read in place
    Tensor lc = contiguous(logits), tc = contiguous(target), ec = contiguous(lse);
    LINEA_BACKEND(logits.device(), cross_entropy_backward, gc, lc, tc, ec, ignore_index, smoothing, dlogits);
  }
  return dlogits;
}

std::vector<Tensor> cross_entropy_mean(const Tensor& loss, const Tensor& target, int64_t ignore_index) {
  const char* op = "cross_entropy_mean";
  check_defined(op, loss, "loss");
  check_defined(op, target, "target");
  check_floating(op, loss, "loss");
  LINEA_CHECK(loss.dim() == 1 && target.dtype() == DType::Int64 && target.shape() == loss.shape(), op,
              ": expected loss [N] and an Int64 target [N], got loss ", shape_str(loss.shape()), " and target ",
              dtype_name(target.dtype()), " ", shape_str(target.shape()));
  check_same_device(op, loss, target);
  const TensorOptions opts(loss.dtype(), loss.device());
  Tensor out = empty({}, opts), count = empty({}, opts);
  LINEA_BACKEND(loss.device(), cross_entropy_mean, contiguous(loss), contiguous(target), ignore_index, out, count);
  return {out, count};
}

}  // namespace linea::raw
