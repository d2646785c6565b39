// The backend kernel interface: one list of functions, implemented once for the CPU
// (namespace linea::cpu, core/cpu/) and once for CUDA (namespace linea::cuda, cuda/).
// Dispatch by device happens in one place, core/ops.cpp and friends (linea::raw).
//
// Conventions for every function below:
//  - all tensors are on the backend's device and their dtypes were checked by the caller;
//  - "any layout" inputs may be strided views (stride 0 for broadcast dims);
//  - everything else, outputs included, is contiguous unless stated otherwise;
//  - shapes in comments are what the caller guarantees.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <vector>

#include "core/random_math.h"
#include "core/tensor.h"

namespace linea {

// ---- op tables ---------------------------------------------------------------------------------
// One line per elementwise op; the enum, the op's name, the dtypes it accepts and the dispatch
// to its math (core/unary_math.h, core/binary_math.h: one functor per op, shared by the CPU and
// CUDA kernels) are all generated from these lists. A new elementwise op is one line here plus
// its functor.

// Unary: X(Enum, "name", Functor, supports Int64). Parameters a, b: Pow (a = exponent), Clamp
// (a = lo, b = hi; +-inf when absent), AddScalar (a), MulScalar (a). GeluTanh/GeluErf: the two
// GELU forms.
#define LINEA_UNARY_OPS(X)                     \
  X(Neg, "neg", NegOp, true)                   \
  X(Exp, "exp", ExpOp, false)                  \
  X(Log, "log", LogOp, false)                  \
  X(Sqrt, "sqrt", SqrtOp, false)               \
  X(Rsqrt, "rsqrt", RsqrtOp, false)            \
  X(Abs, "abs", AbsOp, true)                   \
  X(Tanh, "tanh", TanhOp, false)               \
  X(Sigmoid, "sigmoid", SigmoidOp, false)      \
  X(Relu, "relu", ReluOp, false)               \
  X(GeluTanh, "gelu(tanh)", GeluTanhOp, false) \
  X(GeluErf, "gelu", GeluErfOp, false)         \
  X(Sin, "sin", SinOp, false)                  \
  X(Cos, "cos", CosOp, false)                  \
  X(Pow, "pow", PowOp, false)                  \
  X(Square, "square", SquareOp, true)          \
  X(Clamp, "clamp", ClampOp, true)             \
  X(AddScalar, "add", AddScalarOp, true)       \
  X(MulScalar, "mul", MulScalarOp, true)       \
  X(Sign, "sign", SignOp, true)

// Which dtypes a binary op accepts (a mask of these bits).
namespace binary_dtypes {
constexpr unsigned kFloat = 1, kInt = 2, kBool = 4, kNumeric = kFloat | kInt, kAll = kNumeric | kBool;
}  // namespace binary_dtypes

// Binary: X(Enum, "name", Functor, comparison (Bool output), accepted dtypes). On Bool, mul is
// "and", maximum "or", minimum "and"; and/or are the logical ops of Bool masks.
#define LINEA_BINARY_OPS(X)                                    \
  X(Add, "add", AddOp, false, binary_dtypes::kNumeric)         \
  X(Sub, "sub", SubOp, false, binary_dtypes::kNumeric)         \
  X(Mul, "mul", MulOp, false, binary_dtypes::kAll)             \
  X(Div, "div", DivOp, false, binary_dtypes::kFloat)           \
  X(Maximum, "maximum", MaximumOp, false, binary_dtypes::kAll) \
  X(Minimum, "minimum", MinimumOp, false, binary_dtypes::kAll) \
  X(Eq, "eq", EqOp, true, binary_dtypes::kAll)                 \
  X(Ne, "ne", NeOp, true, binary_dtypes::kAll)                 \
  X(Lt, "lt", LtOp, true, binary_dtypes::kNumeric)             \
  X(Le, "le", LeOp, true, binary_dtypes::kNumeric)             \
  X(Gt, "gt", GtOp, true, binary_dtypes::kNumeric)             \
  X(Ge, "ge", GeOp, true, binary_dtypes::kNumeric)             \
  X(And, "logical_and", AndOp, false, binary_dtypes::kBool)    \
  X(Or, "logical_or", OrOp, false, binary_dtypes::kBool)

enum class UnaryOp {
#define LINEA_OP_ENUM(name, ...) name,
  LINEA_UNARY_OPS(LINEA_OP_ENUM)
};
enum class BinaryOp { LINEA_BINARY_OPS(LINEA_OP_ENUM) };
#undef LINEA_OP_ENUM

inline const char* unary_op_name(UnaryOp op) {
  switch (op) {
#define LINEA_OP_NAME(name, str, ...) \
  case UnaryOp::name:                 \
    return str;
    LINEA_UNARY_OPS(LINEA_OP_NAME)
#undef LINEA_OP_NAME
  }
  return "unary";
}
// Ops defined on Int64 too; the others need a floating dtype.
inline bool unary_supports_integers(UnaryOp op) {
  switch (op) {
#define LINEA_OP_INTS(name, str, functor, ints) \
  case UnaryOp::name:                           \
    return ints;
    LINEA_UNARY_OPS(LINEA_OP_INTS)
#undef LINEA_OP_INTS
  }
  return false;
}

inline const char* binary_op_name(BinaryOp op) {
  switch (op) {
#define LINEA_OP_NAME(name, str, ...) \
  case BinaryOp::name:                \
    return str;
    LINEA_BINARY_OPS(LINEA_OP_NAME)
#undef LINEA_OP_NAME
  }
  return "binary";
}
// Comparisons produce Bool whatever their inputs' dtype.
inline bool is_comparison(BinaryOp op) {
  switch (op) {
#define LINEA_OP_CMP(name, str, functor, cmp, dtypes) \
  case BinaryOp::name:                                \
    return cmp;
    LINEA_BINARY_OPS(LINEA_OP_CMP)
#undef LINEA_OP_CMP
  }
  return false;
}
inline bool binary_supports(BinaryOp op, DType t) {
  const unsigned bit = is_floating(t)      ? binary_dtypes::kFloat
                       : t == DType::Int64 ? binary_dtypes::kInt
                                           : binary_dtypes::kBool;
  switch (op) {
#define LINEA_OP_DTYPES(name, str, functor, cmp, dtypes) \
  case BinaryOp::name:                                   \
    return (dtypes & bit) != 0;
    LINEA_BINARY_OPS(LINEA_OP_DTYPES)
#undef LINEA_OP_DTYPES
  }
  return false;
}

enum class ReduceOp { Sum, Max, Min, LogSumExp };

// A per-example dropout folded into the op next to it (add_layer_norm's residual branch, the
// activation before it in activation_dropout): the draw core/random.h reserved for it
// (ExampleDraw), p = 0 for none.
struct FoldedDropout {
  double p = 0;
  uint64_t seed = 0, draw = 0;
  int64_t first_row = 0;
  const uint64_t* draw_base = nullptr;  // a captured CUDA graph's base counter (see uniform_rows)
};

// The per-element form of a FoldedDropout (off when p == 0); draw_base is the caller's to add.
template <typename T> detail::ExampleDropout<T> example_dropout(const FoldedDropout& d) {
  detail::ExampleDropout<T> e;
  if (d.p <= 0) return e;
  e.on = true;
  e.keep = static_cast<T>(1.0 - d.p);
  e.scale = static_cast<T>(1.0 / (1.0 - d.p));
  e.seed = d.seed;
  e.draw = d.draw;
  e.first_row = d.first_row;
  return e;
}

// Where index_select's values lie: out [outer, n, runs, run] = x [outer, size, runs, run] at index
// (Int64 [n]) along dim 1, n = index.numel(). x's outer entries lie x_outer values apart, its rows
// x_row, its runs x_run (out's likewise), a run's values contiguous: a contiguous tensor selected
// along a middle dim is one run per row; a cache buffer's filled part [B, H, L, E] of
// [B, H, cap, E], selected along B, is H runs of L·E values, cap·E apart.
struct SelectLayout {
  int64_t outer = 1, size = 0, runs = 1, run = 1;
  int64_t x_outer = 0, x_row = 0, x_run = 0;
  int64_t out_outer = 0, out_row = 0, out_run = 0;
};

// The layout of the fused attention kernels' q, k, v, out and gradients, [B, H, L, X] (rows of
// heads): any batch, head and row strides, a row's X values contiguous, rows not overlapping (BLAS
// refuses an ld below the row's length; overlapping output rows would race). raw::as_head_rows
// copies what breaks it; each backend checks it at its entry, so that a kernel called directly
// with another layout names the op and the strides rather than misreading them.
inline bool is_head_rows(const Tensor& t) {
  const bool row = t.size(3) <= 1 || t.stride(3) == 1;
  const bool apart = t.size(2) <= 1 || t.stride(2) >= t.size(3);
  return row && apart;
}
inline void check_head_rows(const char* op, std::initializer_list<const Tensor*> operands) {
  for (const Tensor* t : operands)
    LINEA_CHECK(is_head_rows(*t), op, ": the ", t->is_cuda() ? "CUDA" : "CPU",
                " kernel reads and writes rows of contiguous values, rows apart, got ", shape_str(t->shape()),
                " with strides ", shape_str(t->strides()));
}

#define LINEA_KERNEL_API                                                                                             \
  /* out (any layout) = value */                                                                                     \
  void fill(const Tensor& out, double value);                                                                        \
  /* dst = src, same shape, both any layout, dtypes may differ (converted) */                                        \
  void copy(const Tensor& dst, const Tensor& src);                                                                   \
  /* out (contiguous) = x (any layout) with value at the positions before and after x's along dim: */                \
  /* out[.., i, ..] = x[.., i - before, ..] */                                                                       \
  void pad(const Tensor& x, int64_t dim, int64_t before, double value, const Tensor& out);                           \
  /* out[i] = start + i * step */                                                                                    \
  void arange(const Tensor& out, double start, double step);                                                         \
  /* out = op(x); x, out any layout, same shape and dtype (float ops: float dtypes) */                               \
  void unary(UnaryOp op, const Tensor& x, const Tensor& out, double a, double b);                                    \
  /* dx = grad * op'(x) (y = op(x) given too, for ops whose derivative is cheaper from y);  */                        \
  /* grad, x, y contiguous on the CPU, any layout on CUDA */                                                         \
  void unary_backward(UnaryOp op, const Tensor& grad, const Tensor& x, const Tensor& y, const Tensor& dx, double a,  \
                      double b);                                                                                     \
  /* out = a op b; a, b any layout already expanded to out's shape; out any layout */                                \
  void binary(BinaryOp op, const Tensor& a, const Tensor& b, const Tensor& out);                                     \
  /* out = cond ? a : b; cond Bool; all any layout, expanded to out's shape */                                       \
  void where(const Tensor& cond, const Tensor& a, const Tensor& b, const Tensor& out);                               \
  /* x [outer, r, inner] -> out [outer, inner]; a Bool x: Sum only, the count of true into Int64 out */              \
  void reduce(ReduceOp op, const Tensor& x, const Tensor& out, int64_t outer, int64_t r, int64_t inner);             \
  /* index of the max (min) over r, first one on ties; out Int64 [outer, inner] */                                   \
  void arg_reduce(bool is_max, const Tensor& x, const Tensor& out, int64_t outer, int64_t r, int64_t inner);         \
  /* out [batch..., M, N] = alpha * a [batch..., M, K] @ b [batch..., K, N], or += when accumulate (the GEMM's      \
     beta = 1). Batch dims of a, b already expanded to out's (any strides, 0 allowed); each matrix of a and b is     \
     row-major (stride(-1) == 1) or column-major (stride(-2) == 1); out's matrices are row-major, its                \
     batch dims any non-overlapping strides (a gradient written in its input's layout). */                           \
  void matmul(const Tensor& a, const Tensor& b, const Tensor& out, double alpha, bool accumulate);                    \
  /* A linear layer's GEMMs: out [R, N] = x [R, K] @ w^T + b, x row- or column-major, w [N, K] and b [N] (or      */ \
  /* undefined) contiguous; and its weight gradient dw [N, K] = g^T @ x with db [N] = the sums of g [R, N]          */ \
  /* (contiguous) over its rows (db undefined: not wanted). On CUDA one cuBLASLt call each (bias epilogues). */      \
  void linear(const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& out);                                 \
  void linear_weight_grad(const Tensor& g, const Tensor& x, const Tensor& dw, const Tensor& db);                     \
  /* softmax / log_softmax over r of x [outer, r, inner] */                                                          \
  void softmax(const Tensor& x, const Tensor& out, int64_t outer, int64_t r, int64_t inner, bool log);               \
  void softmax_backward(const Tensor& grad, const Tensor& y, const Tensor& dx, int64_t outer, int64_t r,             \
                        int64_t inner, bool log);                                                                    \
  /* layer norm of rows of x [rows, cols]; w, b [cols] or undefined; mean, rstd [rows] */                            \
  void layer_norm(const Tensor& x, const Tensor& w, const Tensor& b, double eps, const Tensor& out,                  \
                  const Tensor& mean, const Tensor& rstd, int64_t rows, int64_t cols);                               \
  /* the residual sum and its layer norm in one pass: sum = x + dropout(r) (x, r contiguous, r of shape [batch, */  \
  /* ...] for the per-example draw; the dropout as dropout_rows, none when drop.p == 0), then as layer_norm of */   \
  /* sum over [rows, cols] */                                                                                        \
  void add_layer_norm(const Tensor& x, const Tensor& r, const FoldedDropout& drop, const Tensor& w, const Tensor& b,  \
                      double eps, const Tensor& sum, const Tensor& out, const Tensor& mean, const Tensor& rstd,       \
                      int64_t rows, int64_t cols);                                                                   \
  /* dw, db undefined when not wanted; they are overwritten, not accumulated */                                      \
  void layer_norm_backward(const Tensor& grad, const Tensor& x, const Tensor& w, const Tensor& mean,                 \
                           const Tensor& rstd, const Tensor& dx, const Tensor& dw, const Tensor& db, int64_t rows,   \
                           int64_t cols);                                                                            \
  /* add_layer_norm's backward: dx = layer_norm_backward(grad) + grad_sum (the sum's own gradient; undefined: */  \
  /* none), then dr = dx through the residual's dropout (drop.p > 0; else dr undefined: r's gradient is dx) */       \
  void add_layer_norm_backward(const Tensor& grad, const Tensor& grad_sum, const Tensor& x, const Tensor& w,         \
                               const Tensor& mean, const Tensor& rstd, const FoldedDropout& drop, const Tensor& dx,  \
                               const Tensor& dr, const Tensor& dw, const Tensor& db, int64_t rows, int64_t cols);    \
  /* rows of x [rows, cols] to unit length: out = x / max(|x|, eps) (F.normalize over the last dim) */               \
  void normalize(const Tensor& x, double eps, const Tensor& out, int64_t rows, int64_t cols);                        \
  /* its backward from x: dx = (g - y (y . g)) / |x| with y = x / |x|, or g / eps where |x| < eps */                 \
  void normalize_backward(const Tensor& grad, const Tensor& x, double eps, const Tensor& dx, int64_t rows,           \
                          int64_t cols);                                                                             \
  /* rows of y [rows, cols + 1] holding [num, den] sums to their ratio out [rows, cols] = num / max(den, tiny),      \
     0 in a row whose visible flag is false: visible Bool [groups, per] (per 1 or rows of a group) or undefined      \
     (every row visible); row r reads visible[(r / group_rows) per + r % per] */                                     \
  void sums_ratio(const Tensor& y, const Tensor& visible, int64_t group_rows, double tiny, const Tensor& out,        \
                  int64_t rows, int64_t cols);                                                                       \
  /* dy [rows, cols + 1] = [g / d, -(g . num) / d^2] with d = max(den, tiny) (0 at den where den < tiny), 0 in       \
     hidden rows */                                                                                                  \
  void sums_ratio_backward(const Tensor& grad, const Tensor& y, const Tensor& visible, int64_t group_rows,           \
                           double tiny, const Tensor& dy, int64_t rows, int64_t cols);                               \
  /* scale |x_r|^2 of each row of x [rows, cols] into out [rows] (cols 0: out 0), and its backward:                  \
     dx = 2 scale g_r x_r */                                                                                         \
  void sq_norm(const Tensor& x, double scale, const Tensor& out, int64_t rows, int64_t cols);                        \
  void sq_norm_backward(const Tensor& grad, const Tensor& x, double scale, const Tensor& dx, int64_t rows,           \
                        int64_t cols);                                                                               \
  /* per-row loss [N] and logsumexp [N] of logits [N, C], target Int64 [N]; rows whose                               \
     target == ignore_index get loss 0. smoothing: (1-s) * onehot + s / C. nll [N], when defined, gets the           \
     plain negative log-likelihood lse - x[target] from the same pass (0 where ignored) */                           \
  void cross_entropy(const Tensor& logits, const Tensor& target, int64_t ignore_index, double smoothing,             \
                     const Tensor& loss, const Tensor& lse, const Tensor& nll);                                      \
  /* the mean over the rows kept: out = sum of loss [N] / count, count = max(#(target [N] != ignore_index), 1) (an */ \
  /* all-ignored batch gives 0), both 0-d */                                                                         \
  void cross_entropy_mean(const Tensor& loss, const Tensor& target, int64_t ignore_index, const Tensor& out,          \
                          const Tensor& count);                                                                      \
  /* dlogits [N, C] from grad of the per-row loss [N], read with its stride (0: one value for every row, a mean's) */\
  void cross_entropy_backward(const Tensor& grad, const Tensor& logits, const Tensor& target, const Tensor& lse,     \
                              int64_t ignore_index, double smoothing, const Tensor& dlogits);                        \
  /* out = x at index (Int64 [n]) where SelectLayout says they lie; out's values do not overlap */                   \
  void index_select(const Tensor& x, const Tensor& index, const Tensor& out, const SelectLayout& at);                \
  /* out [outer, size, inner] += alpha * src [outer, n, inner] at index (Int64 [n]) (accumulates) */                 \
  void index_add(const Tensor& out, const Tensor& index, const Tensor& src, int64_t outer, int64_t size,             \
                 int64_t inner, double alpha);                                                                       \
  /* out [n, D] = scale * weight [V, D] at index (Int64 [n]) + positions [max_len, D] at offset + (j % length) */    \
  /* for row j (positions undefined: none): a sequence model's input embedding */                                    \
  void embed_tokens(const Tensor& weight, const Tensor& index, double scale, const Tensor& positions,                \
                    int64_t offset, int64_t length, const Tensor& out);                                              \
  /* out [B, P + N, D] = (t < P ? prefix [P, D] at t : x [B, N, D] at t - P) + positions [P + N, D] at t */          \
  /* (prefix undefined: P = 0), contiguous, one float dtype: a ViT's class token and positions */                    \
  void prepend_and_add_positions(const Tensor& x, const Tensor& prefix, const Tensor& positions,                     \
                                 const Tensor& out);                                                                 \
  /* its backward from g [B, P + N, D]: dx [B, N, D] = g's last N rows of each b, dpositions [P + N, D] = */         \
  /* the sum of g over b (in order of b), dprefix [P, D] = its first P rows; each undefined: not wanted */           \
  void prepend_and_add_positions_backward(const Tensor& g, int64_t prefix_len, const Tensor& dx,                     \
                                          const Tensor& dprefix, const Tensor& dpositions);                          \
  /* out = x gathered along dim at index; index Int64 has x's ndim, out index's shape */                             \
  void gather(const Tensor& x, const Tensor& index, const Tensor& out, int64_t dim);                                 \
  /* out (accumulated into) along dim at index += src; index and src have the same shape */                          \
  void scatter_add(const Tensor& out, const Tensor& index, const Tensor& src, int64_t dim);                          \
  /* inclusive prefix sum over r of x [outer, r, inner]; reverse sums from the end */                                \
  void cumsum(const Tensor& x, const Tensor& out, int64_t outer, int64_t r, int64_t inner, bool reverse);            \
  /* out Int64 [R, S]: for each value of values [R, S], its position in the non-decreasing row of sorted [R, M] */    \
  /* (sorted_position in core/search_math.h); one float dtype */                                                      \
  void searchsorted(const Tensor& sorted, const Tensor& values, bool right, const Tensor& out);                       \
  /* x [batch, n] real -> out [batch, n/2+1, 2] (re, im), unnormalized forward transform */                          \
  void rfft(const Tensor& x, const Tensor& out, int64_t batch, int64_t n);                                           \
  /* spec [batch, n/2+1, 2] -> out [batch, n] real, scaled by 1/n (imag of DC and Nyquist                            \
     ignored, as a c2r transform does) */                                                                            \
  void irfft(const Tensor& spec, const Tensor& out, int64_t batch, int64_t n);                                       \
  /* one SGD step of a parameter; param, grad, buf [n] contiguous, same dtype; buf undefined */                      \
  /* without momentum. g = grad + wd*param; buf = first ? g : momentum*buf + (1-dampening)*g;   */                   \
  /* update = momentum ? (nesterov ? g + momentum*buf : buf) : g; param -= lr*update           */                    \
  void sgd_step(const Tensor& param, const Tensor& grad, const Tensor& buf, double lr, double momentum,              \
                double dampening, double weight_decay, bool nesterov, bool first);                                   \
  /* one Adam step (step = 1, 2, ... after this update); decoupled = AdamW: param *= 1 - lr*wd;   */                 \
  /* else g = grad + wd*param. m = b1*m + (1-b1)*g; v = b2*v + (1-b2)*g^2;                      */                   \
  /* param -= lr * (m / (1-b1^step)) / (sqrt(v / (1-b2^step)) + eps)                            */                   \
  void adam_step(const Tensor& param, const Tensor& grad, const Tensor& m, const Tensor& v, double lr, double beta1, \
                 double beta2, double eps, double weight_decay, bool decoupled, int64_t step);                       \
  /* The global L2 norm of many gradients and the guard of a training step: out Float64 [3] = */                     \
  /* {norm, coef, ok}. grads [n_i] contiguous, one floating dtype T. s_i = sum of T(g*g) in   */                     \
  /* double, norm = sqrt(sum over i in order of T(s_i)) in T; coef = min(T(max_norm) /        */                     \
  /* (norm + T(1e-6)), 1) in T, or 1 when max_norm <= 0; ok = 1 when norm and loss (0-d, any  */                     \
  /* float dtype; undefined: not checked) are finite, else 0. */                                                     \
  void grad_norm_guard(const std::vector<Tensor>& grads, const Tensor& loss, double max_norm, const Tensor& out);    \
  /* One Adam/AdamW step of many parameters (multi-tensor), tensor i as adam_step with the lr  */                    \
  /* and weight decay of its group: hyper Float64 [G, 2] = (lr, wd), group[i] in [0, G); count  */                  \
  /* Int64 [1] = steps applied so far (this one is step count + 1). guard (grad_norm_guard's    */                  \
  /* out, or undefined): gradients are used times its coef, and when ok == 0 nothing is        */                   \
  /* written; otherwise count += 1. params, grads, m, v [n_i] contiguous, one dtype.          */                    \
  void adam_multi_step(const std::vector<Tensor>& params, const std::vector<Tensor>& grads,                          \
                       const std::vector<Tensor>& m, const std::vector<Tensor>& v, const std::vector<int>& group,    \
                       const Tensor& hyper, const Tensor& count, const Tensor& guard, double beta1, double beta2,    \
                       double eps, bool decoupled);                                                                  \
  /* fills out with U[lo, hi) / N(mean, std) from the device's default generator */                                  \
  void uniform(const Tensor& out, double lo, double hi);                                                             \
  void normal(const Tensor& out, double mean, double std);                                                           \
  /* per-example draws (core/random.h): out [rows, ...]; row r holds example first_row + r of the draw reserved at */ \
  /* counter `draw` of a generator seeded `seed` (core/random_math.h); with draw_base (CUDA, a captured graph: a   */ \
  /* device counter its replays set) the counter is *draw_base + draw */                                              \
  void uniform_rows(const Tensor& out, double lo, double hi, uint64_t seed, uint64_t draw, int64_t first_row,        \
                    const uint64_t* draw_base);                                                                      \
  void normal_rows(const Tensor& out, double mean, double std, uint64_t seed, uint64_t draw, int64_t first_row,       \
                   const uint64_t* draw_base);                                                                       \
  /* per-example dropout: out = x * (u < T(1 - p) ? T(1 / (1 - p)) : 0), u the per-example uniform [0, 1) of x's */   \
  /* element as uniform_rows draws it (x, out [rows, ...] contiguous, x's dtype): the forward (x the input) and */   \
  /* the backward (x the gradient) with the same mask, which is never stored */                                       \
  void dropout_rows(const Tensor& x, const Tensor& out, double p, uint64_t seed, uint64_t draw, int64_t first_row,   \
                    const uint64_t* draw_base);                                                                      \
  /* an activation (GeluErf, GeluTanh or Relu) and the dropout after it in one pass, with dropout_rows's mask */      \
  /* (x, grad, out [rows, ...] contiguous): out = dropout(op(x)); with grad defined, the backward */                   \
  /* out = op'(x) * dropout(grad) */                                                                                 \
  void activation_dropout(UnaryOp op, const Tensor& x, const Tensor& grad, const FoldedDropout& drop,               \
                          const Tensor& out);                                                                        \
  /* Softmax attention (raw::sdpa): q [B, H, N, D], k [B, H, M, D], v [B, H, M, E], one float dtype; key m hidden */   \
  /* from query n when causal and m > n + offset or pad (Bool [B, M]; undefined: none) marks it; bias [B, H, M] */     \
  /* (undefined: none) is added to every row's scaled scores. Writes out [B, H, N, E] and lse [B, H, N] (the */        \
  /* log-sum-exp of the row's visible scores; a row that sees no key: out 0, lse -inf) and, when defined (the */       \
  /* CPU only), the probabilities [B, H, N, M] for the backward. With drop.p > 0 each probability is multiplied */     \
  /* by its dropout factor before the product with v: element (h N + n) M + m of example b as dropout_rows */          \
  /* draws them for a [B, H, N, M] tensor (probs then undefined). q, k, v, out (and the */                             \
  /* backward's dout, dq, dk, dv): any batch, head and row strides, a row's values contiguous, rows apart; */          \
  /* pad: rows any stride apart, a row contiguous; lse, probs, bias contiguous */                                      \
  void sdpa_forward(const Tensor& q, const Tensor& k, const Tensor& v, double scale, bool causal, int64_t offset,      \
                    const Tensor& pad, const Tensor& bias, const FoldedDropout& drop, const Tensor& out,               \
                    const Tensor& lse, const Tensor& probs);                                                           \
  /* dq, dk, dv and, when defined, dbias [B, H, M] (overwritten) from dout, dlse [B, H, N] (the gradient of lse; */   \
  /* undefined: none) and the forward's out, lse and probs (undefined: recomputed); the same dropout factors */        \
  /* drawn again. dlse enters as delta_n = dout_n . out_n - dlse_n */                                                  \
  void sdpa_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,          \
                     const Tensor& probs, const Tensor& dout, const Tensor& dlse, double scale, bool causal,          \
                     int64_t offset, const Tensor& pad, const Tensor& bias, const FoldedDropout& drop,                \
                     const Tensor& dq, const Tensor& dk, const Tensor& dv, const Tensor& dbias);                      \
  /* Keys drawn from softmax attention (raw::sdpa_sample, RA's draw): for query n of q [B, H, N, D] and each u_s */  \
  /* of u [B, H, N, S] in [0, 1), with e_m = exp(scale q_n.k_m - max) (k [B, H, M, D], M > 0; 0 where pad, Bool */  \
  /* [B, M] or undefined, marks key m) and E_m = e_0 + ... + e_m in key order, out Int64 [B, H, N, S] = the     */  \
  /* number of keys with E_m <= u_s E_(M-1), clamped to the last key with e_m > 0 (0 when there is none): an   */  \
  /* inverse-CDF draw from the row's probabilities without keeping them. q, k, u contiguous, one float dtype. */    \
  void sdpa_sample(const Tensor& q, const Tensor& k, const Tensor& pad, const Tensor& u, double scale,               \
                   const Tensor& out);                                                                               \
  /* Bidirectional linear attention (raw::linear_attention; performer's): out_n = phi_q_n KV / den~_n, KV =      */  \
  /* sum_m phi_k_m v_m^T, den_n = phi_q_n . sum_m phi_k_m, den~ = den where |den| >= guard, else guard with den's  */  \
  /* sign (0 counting as +). phi_q [B, H, N, S], phi_k [B, H, M, S], v [B, H, M, E], one float dtype, all dims   */  \
  /* > 0. Writes out [B, H, N, E], den [B, H, N] (unguarded) and kvz [B, H, S, E + 1] = [KV, sum_m phi_k_m].      */  \
  void linear_attention_forward(const Tensor& phi_q, const Tensor& phi_k, const Tensor& v, double guard,           \
                                const Tensor& out, const Tensor& den, const Tensor& kvz);                            \
  /* dphi_q, dphi_k, dv (overwritten) from dout and the forward's out, den and kvz; the guard is a constant (no  */  \
  /* gradient reaches den where it is active) */                                                                     \
  void linear_attention_backward(const Tensor& phi_q, const Tensor& phi_k, const Tensor& v, const Tensor& out,      \
                                 const Tensor& den, const Tensor& kvz, const Tensor& dout, double guard,            \
                                 const Tensor& dphi_q, const Tensor& dphi_k, const Tensor& dv);              \
  /* Causal linear attention (raw::causal_linear_attention; causal performer's): query n of phi_q [B, H, N, S]     */  \
  /* sees the key rows m <= n of phi_k [B, H, N, S] and v [B, H, N, E] and, when defined, the sums of earlier      */  \
  /* keys state [B, H, S, E + 1]: [num, den]_n = phi_q_n (state + sum_{m<=n} phi_k_m^T [v_m, 1]), out = num /      */  \
  /* den~ (den~ as above). In chunks of `chunk` rows (the last one may be short), C = ceil(N / chunk) of them.     */  \
  /* Writes out [B, H, N, E], den [B, H, N] (unguarded), states [B, H, C, S, E + 1] (the sums before each          */  \
  /* chunk, state included; for the backward) and final [B, H, S, E + 1] (the sums after the last key).            */  \
  void causal_linear_attention_forward(const Tensor& phi_q, const Tensor& phi_k, const Tensor& v, const Tensor& state, \
                                       int64_t chunk, double guard, const Tensor& out, const Tensor& den,              \
                                       const Tensor& states, const Tensor& final);                                     \
  /* dphi_q, dphi_k, dv and, when defined, dstate [B, H, S, E + 1] (overwritten) from dout and the forward's       */  \
  /* out, den and states; the guard is a constant */                                                                   \
  void causal_linear_attention_backward(const Tensor& phi_q, const Tensor& phi_k, const Tensor& v, const Tensor& out,  \
                                        const Tensor& den, const Tensor& states, const Tensor& dout, int64_t chunk,    \
                                        double guard, const Tensor& dphi_q, const Tensor& dphi_k, const Tensor& dv,    \
                                        const Tensor& dstate);                                                         \
  /* Positive random features (FAVOR+; raw::positive_features): phi = exp(x W_h^T - |x|^2/2 - c) / sqrt(S) for   */  \
  /* x [B, H, L, D] and omega [H, S, D] (the rows of W_h), c (cancels in the attention ratio) the row's max over  */  \
  /* s (per_row) or the max over the (b, h)'s unpadded rows and s. Rows marked by pad (Bool [B, L]; undefined:   */  \
  /* none) get phi = 0. One float dtype; writes phi [B, H, L, S]. */                                                  \
  void positive_features_forward(const Tensor& x, const Tensor& omega, bool per_row, const Tensor& pad,            \
                                 const Tensor& phi);                                                                 \
  /* dx = dl W - (sum_s dl) x with dl = dphi * phi and, when domega is defined, dW_h = sum_b dl^T x; c counts as   */  \
  /* a constant. dx, domega: overwritten. */                                                                          \
  void positive_features_backward(const Tensor& x, const Tensor& omega, const Tensor& phi, const Tensor& dphi,     \
                                  const Tensor& dx, const Tensor& domega);                                             \
  /* FAVOR+ attention in one op (raw::favor_attention; performer's with the softmax map): with x~ = scale x,      */  \
  /* phi_q = positive_features(q~, omega, per row), phi_k = positive_features(k~, omega, per (b, h), pad), then   */  \
  /* linear_attention(phi_q, phi_k, v, guard) or, causal (N = M), causal_linear_attention(phi_q, phi_k, v, none,  */  \
  /* chunk, guard). Whether the backend has fused kernels for these sizes and that chunk (the CPU: never, its     */  \
  /* positive_features and linear attention kernels are its fused form); where it has not, raw::favor_attention   */  \
  /* composes those ops. */                                                                                           \
  bool favor_attention_fused(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& omega, bool causal,     \
                             int64_t chunk);                                                                          \
  /* q [B, H, N, D], k [B, H, M, D], v [B, H, M, E] and out any batch, head and row strides, a row's values       */  \
  /* contiguous; omega [H, S, D]; pad Bool [B, M] (rows any stride apart, a row contiguous) or undefined. Writes  */  \
  /* out, den [B, H, N], kvz [B, H, S, E + 1] (causal: the states [B, H, C, S, E + 1] of                          */  \
  /* causal_linear_attention), phi_q [B, H, N, S] and phi_k [B, H, M, S] (kept for the backward). */                  \
  void favor_attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& omega, double scale,  \
                               const Tensor& pad, double guard, bool causal, int64_t chunk, const Tensor& out,        \
                               const Tensor& den, const Tensor& kvz, const Tensor& phi_q, const Tensor& phi_k);       \
  /* dq, dk, dv (overwritten; any strides as above) from dout and the forward's outputs */                            \
  void favor_attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& omega, double scale, \
                                bool causal, int64_t chunk, const Tensor& out, const Tensor& den, const Tensor& kvz,  \
                                const Tensor& phi_q, const Tensor& phi_k, const Tensor& dout, double guard,           \
                                const Tensor& dq, const Tensor& dk, const Tensor& dv);                                \
  /* One step of causal FAVOR+ decoding (raw::favor_attention_step; no gradient), where favor_attention_fused     */  \
  /* says so for (q, k, v, omega, causal, chunk 64): the T new positions q, k [B, H, T, D], v [B, H, T, E] after  */  \
  /* the sums [B, H, S, E + 1] of earlier keys' stabilized features and their stabilizer c [B, H, 1, 1] (both     */  \
  /* undefined: none). Writes out (any strides as above), sums_out and c_out (c' = max(c, the step's unpadded     */  \
  /* keys' max log-factor), the sums after the step's keys, stabilized by c'). */                                     \
  void favor_attention_step(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& omega, double scale,     \
                            const Tensor& pad, double guard, const Tensor& sums, const Tensor& c, const Tensor& out,  \
                            const Tensor& sums_out, const Tensor& c_out);                                             \
  /* Toeplitz-modulated linear attention (raw::toeplitz_attention; nprf_rpe's FFT path), per (b, h): */                \
  /* y_n = sum_s phi_q_ns sum_m c_{m-n} phi_k_ms v_m, through transforms of length fft_len >= N + M - 1 one */         \
  /* (feature, value channel) at a time (memory O((N + M) S), not O(N S E)); fft_len 0: directly, term by */           \
  /* term in tiles (exact, O(N M) work). c [H or B*H, N+M-1] holds c_t */                                              \
  /* at t + N - 1 for t = m - n; phi_q [B, H, N, S], phi_k [B, H, M, S], v [B, H, M, E] contiguous, one float */       \
  /* dtype; y [B, H, N, E]. */                                                                                         \
  void toeplitz_attention_forward(const Tensor& c, const Tensor& phi_q, const Tensor& phi_k, const Tensor& v,          \
                                  int64_t fft_len, const Tensor& y);                                                   \
  /* dc (c's shape; summed over the batch when c is per head), dphi_q, dphi_k, dv: overwritten */                      \
  void toeplitz_attention_backward(const Tensor& c, const Tensor& phi_q, const Tensor& phi_k, const Tensor& v,         \
                                   const Tensor& dy, int64_t fft_len, const Tensor& dc, const Tensor& dphi_q,          \
                                   const Tensor& dphi_k, const Tensor& dv);                                            \
  /* LARA's mixture weights (raw::lara_mixture; attention/lara/), per (b, h), with q~ = q_scale q: */                \
  /* t = softmax over n of q~ qbar^T, a = self_w + beta (t - mean_c t), */                                           \
  /* mix = softmax_c(log max(a, floor) + q~ w^T - |q~|^2/2 + bias) for q [B, H, N, D], qbar and w */                 \
  /* [B, H, C, D], self_w and bias [B, H, C] (the -|q~|^2/2, the same for every c, drops out); */                    \
  /* contiguous, one float dtype, every dim > 0. Writes mix, t and a [B, H, N, C] (the last two for */               \
  /* the backward). */                                                                                               \
  void lara_mixture_forward(const Tensor& q, const Tensor& qbar, const Tensor& w, const Tensor& self_w,              \
                            const Tensor& bias, double beta, double floor, double q_scale, const Tensor& mix,        \
                            const Tensor& t, const Tensor& a);                                                       \
  /* dq (of q, not q~), dqbar, dw, dself_w, dbias (overwritten) from dmix and the forward's mix, t and a */          \
  void lara_mixture_backward(const Tensor& q, const Tensor& qbar, const Tensor& w, const Tensor& mix, const Tensor& t,\
                             const Tensor& a, const Tensor& dmix, double beta, double floor, double q_scale,         \
                             const Tensor& dq, const Tensor& dqbar, const Tensor& dw, const Tensor& dself_w,         \
                             const Tensor& dbias);                                                                   \
  /* LARA's proposal weights (raw::lara_proposals; attention/lara/), per (b, h): l_cc' = w_c.mu_c' - */              \
  /* |mu_c'|^2/2 (log xi(mu_c', w_c)), p = softmax_c'(l), self_w_c = p_cc and bias_c = lse_k_c - l_cc for */         \
  /* w and mu [B, H, C, D], lse_k [B, H, C]; contiguous, one float dtype, every dim > 0. Writes p */                 \
  /* [B, H, C, C] (for the backward), self_w and bias [B, H, C]. */                                                  \
  void lara_proposals_forward(const Tensor& w, const Tensor& mu, const Tensor& lse_k, const Tensor& p,               \
                              const Tensor& self_w, const Tensor& bias);                                             \
  /* dw and dmu (overwritten) from dself_w and dbias [B, H, C] and the forward's p (dlse_k is dbias) */              \
  void lara_proposals_backward(const Tensor& w, const Tensor& mu, const Tensor& p, const Tensor& dself_w,            \
                               const Tensor& dbias, const Tensor& dw, const Tensor& dmu);

namespace cpu {
LINEA_KERNEL_API
}  // namespace cpu

namespace cuda {
LINEA_KERNEL_API
}  // namespace cuda

}  // namespace linea
