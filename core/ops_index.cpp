// linea::raw indexing, joining, prefix-sum, sorted-search and real-FFT ops: index_select(_out),
// index_add, gather, scatter_add, cat, stack, cumsum, searchsorted, rfft, irfft. Each checks its
// arguments (dtypes, devices, ranks, shapes and, on the CPU, every index value) before any
// compute, allocates the output and dispatches to the kernels of core/kernels.h. No autograd here (see
// autograd/index_ops.cpp).
//
// Conventions chosen here (PyTorch-like unless stated):
//  - index tensors are Int64; negative index values are out of range (no wrap-around);
//  - index_select takes a 0-d or 1-d index; gather/scatter_add take an index with x's ndim and
//    index.size(d) <= x.size(d) for d != dim; scatter_add's src must have index's shape;
//  - index_add / scatter_add return a fresh tensor (base + scattered src); base is not modified;
//  - rfft/irfft results are contiguous; the complex dim is a trailing (re, im) dim of size 2.
#include <algorithm>
#include <optional>
#include <sstream>
#include <vector>

#include "core/dispatch.h"
#include "core/ops.h"

namespace linea::raw {

namespace {

void check_index_dtype(const char* op, const Tensor& index) {
  LINEA_CHECK(index.dtype() == DType::Int64, op, ": index must have dtype int64, got ", dtype_name(index.dtype()),
              " (index shape ", shape_str(index.shape()), ")");
}

// On the CPU, every value of `index` (contiguous) must lie in [0, size).
void check_index_values(const char* op, const Tensor& index, int64_t dim, int64_t size) {
  if (!index.is_cpu()) return;  // device kernels do their own bounds handling
  const int64_t* p = index.data<int64_t>();
  const int64_t n = index.numel();
  for (int64_t i = 0; i < n; ++i) {
    LINEA_CHECK(p[i] >= 0 && p[i] < size, op, ": index ", p[i], " is out of range for dim ", dim, " of size ", size);
  }
}

// Shape s with entry d replaced by v.
Shape with_dim(Shape s, int64_t d, int64_t v) {
  s[static_cast<size_t>(d)] = v;
  return s;
}

int64_t prod(const Shape& s, int64_t lo, int64_t hi) {
  int64_t p = 1;
  for (int64_t d = lo; d < hi; ++d) p *= s[static_cast<size_t>(d)];
  return p;
}

// x zero-padded or truncated to `len` along dim (a view when truncating or unchanged).
Tensor resize_dim(const Tensor& x, int64_t dim, int64_t len) {
  const int64_t cur = x.size(dim);
  if (len == cur) return x;
  if (len < cur) return narrow(x, dim, 0, len);
  Tensor out = zeros(with_dim(x.shape(), dim, len), x.options());
  if (cur > 0) copy_(narrow(out, dim, 0, cur), x);
  return out;
}

// Permutation moving dim `from` to position `to` (others keep their order), and its inverse.
std::vector<int64_t> move_dim_perm(int64_t ndim, int64_t from, int64_t to) {
  std::vector<int64_t> rest;
  for (int64_t d = 0; d < ndim; ++d)
    if (d != from) rest.push_back(d);
  rest.insert(rest.begin() + to, from);
  return rest;
}
std::vector<int64_t> inverse_perm(const std::vector<int64_t>& p) {
  std::vector<int64_t> inv(p.size());
  for (size_t i = 0; i < p.size(); ++i) inv[static_cast<size_t>(p[i])] = static_cast<int64_t>(i);
  return inv;
}

// gather/scatter_add: index has x's ndim and fits inside x except along dim.
void check_gather_index(const char* op, const Tensor& x, int64_t dim, const Tensor& index) {
  LINEA_CHECK(index.dim() == x.dim(), op, ": index must have the same number of dims as the input; got index ",
              shape_str(index.shape()), " and input ", shape_str(x.shape()));
  for (int64_t d = 0; d < x.dim(); ++d) {
    if (d == dim) continue;
    LINEA_CHECK(index.size(d) <= x.size(d), op, ": index ", shape_str(index.shape()), " is larger than input ",
                shape_str(x.shape()), " at dim ", d, " (only dim ", dim, " may differ)");
  }
}

}  // namespace

// ---- index_select / index_add --------------------------------------------------------------

namespace {

// index (0-d or 1-d Int64) checked for selecting along dim of x; returns dim wrapped and the index
// contiguous in idx.
int64_t check_index_select(const char* op, const Tensor& x, int64_t dim, const Tensor& index, Tensor& idx) {
  check_defined(op, x, "x");
  check_defined(op, index, "index");
  check_same_device(op, x, index);
  check_index_dtype(op, index);
  LINEA_CHECK(x.dim() >= 1, op, ": input must have at least 1 dim, got ", shape_str(x.shape()));
  LINEA_CHECK(index.dim() <= 1, op, ": index must be 0-d or 1-d, got ", shape_str(index.shape()));
  dim = wrap_dim(dim, x.dim(), op);
  idx = contiguous(index);
  check_index_values(op, idx, dim, x.size(dim));
  return dim;
}

// Where x's and out's values lie for a select along dim 0 (SelectLayout, outer = 1), when x's and
// out's values from dim 1 on lie as [runs, run] in both (a run contiguous, runs at one stride
// each) and out's do not overlap; nullopt otherwise.
std::optional<SelectLayout> rows_of_runs(const Tensor& out, const Tensor& x) {
  int64_t d = x.dim() - 1, run = 1;
  for (; d >= 1; --d) {  // the contiguous tail
    if (x.size(d) == 1) continue;
    if (x.stride(d) != run || out.stride(d) != run) break;
    run *= x.size(d);
  }
  int64_t runs = 1, x_run = run, out_run = run;
  for (; d >= 1; --d) {  // the runs, at one stride
    if (x.size(d) == 1) continue;
    if (runs == 1) {
      x_run = x.stride(d);
      out_run = out.stride(d);
    } else if (x.stride(d) != x_run * runs || out.stride(d) != out_run * runs) {
      return std::nullopt;
    }
    runs *= x.size(d);
  }
  const bool apart = (runs == 1 || out_run >= run) && (out.size(0) == 1 || out.stride(0) >= (runs - 1) * out_run + run);
  if (!apart) return std::nullopt;
  SelectLayout at;
  at.size = x.size(0);
  at.runs = runs;
  at.run = run;
  at.x_row = x.stride(0);
  at.x_run = x_run;
  at.out_row = out.stride(0);
  at.out_run = out_run;
  return at;
}

}  // namespace

Tensor index_select(const Tensor& x, int64_t dim, const Tensor& index) {
  const char* op = "index_select";
  Tensor idx;
  dim = check_index_select(op, x, dim, index, idx);
  const int64_t n = idx.numel();
  Tensor out = empty(with_dim(x.shape(), dim, n), x.options());
  if (out.numel() == 0) return out;
  // Along dim 0, rows of a view (a cache buffer's filled part) read where they lie, not copied first.
  if (dim == 0) {
    if (const std::optional<SelectLayout> at = rows_of_runs(out, x)) {
      LINEA_BACKEND(x.device(), index_select, x, idx, out, *at);
      return out;
    }
  }
  // Otherwise x contiguous: [outer, size, inner], a row one run.
  const Tensor xc = contiguous(x);
  SelectLayout at;
  at.outer = prod(x.shape(), 0, dim);
  at.size = x.size(dim);
  at.run = prod(x.shape(), dim + 1, x.dim());
  at.x_row = at.out_row = at.run;
  at.x_outer = at.size * at.run;
  at.out_outer = n * at.run;
  LINEA_BACKEND(x.device(), index_select, xc, idx, out, at);
  return out;
}

void index_select_out(const Tensor& out, const Tensor& x, int64_t dim, const Tensor& index) {
  const char* op = "index_select";
  Tensor idx;
  dim = check_index_select(op, x, dim, index, idx);
  check_defined(op, out, "out");
  check_same_device(op, x, out);
  check_same_dtype(op, x, out);
  LINEA_CHECK(out.shape() == with_dim(x.shape(), dim, idx.numel()), op, ": out ", shape_str(out.shape()),
              " must equal x ", shape_str(x.shape()), " with dim ", dim, " of size ", idx.numel(),
              " (the index length)");
  if (out.numel() == 0) return;
  if (dim == 0) {
    if (const std::optional<SelectLayout> at = rows_of_runs(out, x)) {
      LINEA_BACKEND(x.device(), index_select, x, idx, out, *at);
      return;
    }
  }
  copy_(out, index_select(x, dim, idx));
}

Tensor index_add(const Tensor& base, int64_t dim, const Tensor& index, const Tensor& src) {
  check_defined("index_add", base, "base");
  Tensor out = clone(base);
  index_add_(out, dim, index, src);
  return out;
}

void index_add_(const Tensor& base, int64_t dim, const Tensor& index, const Tensor& src) {
  const char* op = "index_add";
  check_defined(op, base, "base");
  LINEA_CHECK(base.is_contiguous(), op, ": adds in place into a contiguous tensor, got ", shape_str(base.shape()),
              " with strides ", shape_str(base.strides()));
  check_defined(op, index, "index");
  check_defined(op, src, "src");
  check_same_device(op, base, index);
  check_same_device(op, base, src);
  check_same_dtype(op, base, src);
  check_index_dtype(op, index);
  LINEA_CHECK(base.dim() >= 1, op, ": base must have at least 1 dim, got ", shape_str(base.shape()));
  LINEA_CHECK(index.dim() <= 1, op, ": index must be 0-d or 1-d, got ", shape_str(index.shape()));
  dim = wrap_dim(dim, base.dim(), op);
  LINEA_CHECK(src.shape() == with_dim(base.shape(), dim, index.numel()), op, ": src ", shape_str(src.shape()),
              " must equal base ", shape_str(base.shape()), " with dim ", dim, " of size ", index.numel(),
              " (the index length)");
  Tensor idx = contiguous(index);
  check_index_values(op, idx, dim, base.size(dim));
  if (src.numel() == 0) return;
  LINEA_BACKEND(base.device(), index_add, base, idx, contiguous(src), prod(base.shape(), 0, dim), base.size(dim),
                prod(base.shape(), dim + 1, base.dim()), 1.0);
}

// ---- embed_tokens ------------------------------------------------------------------------

Tensor embed_tokens(const Tensor& weight, const Tensor& index, double scale, const Tensor& positions, int64_t offset) {
  const char* op = "embed_tokens";
  check_defined(op, weight, "weight");
  check_defined(op, index, "index");
  check_same_device(op, weight, index);
  check_index_dtype(op, index);
  LINEA_CHECK(weight.dim() == 2 && is_floating(weight.dtype()), op, ": weight must be a float [V, D] table, got ",
              dtype_name(weight.dtype()), " ", shape_str(weight.shape()));
  const int64_t V = weight.size(0), D = weight.size(1);
  int64_t length = 1;  // the positions' period along the flattened index
  if (positions.defined()) {
    check_same_device(op, weight, positions);
    check_same_dtype(op, weight, positions);
    LINEA_CHECK(positions.dim() == 2 && positions.size(1) == D, op, ": positions must be [max_len, ", D,
                "] like the weight ", shape_str(weight.shape()), ", got ", shape_str(positions.shape()));
    LINEA_CHECK(index.dim() >= 1, op, ": with positions the index needs a sequence dim (last), got ",
                shape_str(index.shape()));
    length = index.size(-1);
    LINEA_CHECK(offset >= 0 && offset + length <= positions.size(0), op, ": positions [", offset, ", ", offset + length,
                ") of index ", shape_str(index.shape()), " exceed the table's ", positions.size(0), " rows");
  }
  Tensor idx = contiguous(index);
  check_index_values(op, idx, 0, V);
  Shape out_shape = index.shape();
  out_shape.push_back(D);
  Tensor out = empty(out_shape, weight.options());
  if (out.numel() == 0) return out;
  LINEA_BACKEND(weight.device(), embed_tokens, contiguous(weight), idx, scale,
                positions.defined() ? contiguous(positions) : Tensor(), offset, length, out);
  return out;
}

Tensor embedding_weight_grad(const Tensor& grad, const Tensor& index, int64_t num, double scale, int64_t padding_idx) {
  const char* op = "embedding_weight_grad";
  check_defined(op, grad, "grad");
  check_defined(op, index, "index");
  check_same_device(op, grad, index);
  check_index_dtype(op, index);
  const int64_t n = index.numel();
  LINEA_CHECK(grad.dim() == 2 && grad.size(0) == n && padding_idx >= -1 && padding_idx < num, op, ": grad ",
              shape_str(grad.shape()), " must be [", n, ", D] for an index of ", n, ", padding_idx ", padding_idx,
              " in [-1, ", num, ")");
  Tensor idx = contiguous(index.reshape({n}));
  check_index_values(op, idx, 0, num);
  Tensor dw = zeros({num, grad.size(1)}, grad.options());
  if (grad.numel() > 0) LINEA_BACKEND(grad.device(), index_add, dw, idx, contiguous(grad), 1, num, grad.size(1), scale);
  if (padding_idx >= 0) fill_(dw.narrow(0, padding_idx, 1), 0.0);
  return dw;
}

// ---- prepend_and_add_positions -------------------------------------------------------------

Tensor prepend_and_add_positions(const Tensor& x, const Tensor& prefix, const Tensor& positions) {
  const char* op = "prepend_and_add_positions";
  check_defined(op, x, "x");
  check_defined(op, positions, "positions");
  const int64_t P = prefix.defined() && prefix.dim() >= 1 ? prefix.size(0) : 0;
  LINEA_CHECK(x.dim() == 3 && positions.dim() == 2 && positions.size(1) == x.size(2) &&
                  positions.size(0) == P + x.size(1) &&
                  (!prefix.defined() || (prefix.dim() == 2 && prefix.size(1) == x.size(2))),
              op, ": expected x [B, N, D], prefix [P, D] (or none) and positions [P + N, D], got x ",
              shape_str(x.shape()), ", prefix ", prefix.defined() ? shape_str(prefix.shape()) : std::string("none"),
              ", positions ", shape_str(positions.shape()));
  LINEA_CHECK(is_floating(x.dtype()), op, ": expected float32 or float64, got ", dtype_name(x.dtype()));
  for (const Tensor* t : {&prefix, &positions}) {
    if (!t->defined()) continue;
    check_same_dtype(op, x, *t);
    check_same_device(op, x, *t);
  }
  Tensor out = empty({x.size(0), positions.size(0), x.size(2)}, x.options());
  if (out.numel() == 0) return out;
  LINEA_BACKEND(x.device(), prepend_and_add_positions, contiguous(x), prefix.defined() ? contiguous(prefix) : Tensor(),
                contiguous(positions), out);
  return out;
}

std::vector<Tensor> prepend_and_add_positions_backward(const Tensor& grad, int64_t prefix_len, bool want_x,
                                                       bool want_prefix, bool want_positions) {
  const char* op = "prepend_and_add_positions_backward";
  check_defined(op, grad, "grad");
  LINEA_CHECK(grad.dim() == 3 && prefix_len >= 0 && prefix_len <= grad.size(1), op, ": grad ", shape_str(grad.shape()),
              " must be [B, P + N, D] with P = ", prefix_len, " in [0, ", grad.size(1), "]");
  LINEA_CHECK(is_floating(grad.dtype()), op, ": expected float32 or float64, got ", dtype_name(grad.dtype()));
  const int64_t B = grad.size(0), TT = grad.size(1), D = grad.size(2);
  Tensor dx = want_x ? empty({B, TT - prefix_len, D}, grad.options()) : Tensor();
  Tensor dprefix = want_prefix ? empty({prefix_len, D}, grad.options()) : Tensor();
  Tensor dpos = want_positions ? empty({TT, D}, grad.options()) : Tensor();
  if (want_x || want_prefix || want_positions)
    LINEA_BACKEND(grad.device(), prepend_and_add_positions_backward, contiguous(grad), prefix_len, dx, dprefix, dpos);
  return {dx, dprefix, dpos};
}

// ---- gather / scatter_add ------------------------------------------------------------------

Tensor gather(const Tensor& x, int64_t dim, const Tensor& index) {
  const char* op = "gather";
  check_defined(op, x, "x");
  check_defined(op, index, "index");
  check_same_device(op, x, index);
  check_index_dtype(op, index);
  LINEA_CHECK(x.dim() >= 1, op, ": input must have at least 1 dim, got ", shape_str(x.shape()));
  dim = wrap_dim(dim, x.dim(), op);
  check_gather_index(op, x, dim, index);
  Tensor idx = contiguous(index);
  check_index_values(op, idx, dim, x.size(dim));
  Tensor out = empty(index.shape(), x.options());
  if (out.numel() == 0) return out;
  Tensor xc = contiguous(x);
  LINEA_BACKEND(x.device(), gather, xc, idx, out, dim);
  return out;
}

Tensor scatter_add(const Tensor& base, int64_t dim, const Tensor& index, const Tensor& src) {
  check_defined("scatter_add", base, "base");
  Tensor out = clone(base);
  scatter_add_(out, dim, index, src);
  return out;
}

void scatter_add_(const Tensor& base, int64_t dim, const Tensor& index, const Tensor& src) {
  const char* op = "scatter_add";
  check_defined(op, base, "base");
  LINEA_CHECK(base.is_contiguous(), op, ": adds in place into a contiguous tensor, got ", shape_str(base.shape()),
              " with strides ", shape_str(base.strides()));
  check_defined(op, index, "index");
  check_defined(op, src, "src");
  check_same_device(op, base, index);
  check_same_device(op, base, src);
  check_same_dtype(op, base, src);
  check_index_dtype(op, index);
  LINEA_CHECK(base.dim() >= 1, op, ": base must have at least 1 dim, got ", shape_str(base.shape()));
  dim = wrap_dim(dim, base.dim(), op);
  check_gather_index(op, base, dim, index);
  LINEA_CHECK(src.shape() == index.shape(), op, ": src ", shape_str(src.shape()), " must have the index's shape ",
              shape_str(index.shape()));
  Tensor idx = contiguous(index);
  check_index_values(op, idx, dim, base.size(dim));
  if (src.numel() == 0) return;
  LINEA_BACKEND(base.device(), scatter_add, base, idx, contiguous(src), dim);
}

// ---- cat / stack ---------------------------------------------------------------------------

Tensor cat(const std::vector<Tensor>& xs, int64_t dim) {
  const char* op = "cat";
  LINEA_CHECK(!xs.empty(), op, ": expected a non-empty list of tensors");
  for (size_t i = 0; i < xs.size(); ++i) check_defined(op, xs[i], "input");
  const Tensor& first = xs[0];
  LINEA_CHECK(first.dim() >= 1, op, ": zero-dim tensors cannot be concatenated (input 0 has shape ",
              shape_str(first.shape()), ")");
  dim = wrap_dim(dim, first.dim(), op);
  int64_t total = 0;
  for (size_t i = 0; i < xs.size(); ++i) {
    const Tensor& x = xs[i];
    check_same_device(op, first, x);
    check_same_dtype(op, first, x);
    bool ok = x.dim() == first.dim();
    for (int64_t d = 0; ok && d < x.dim(); ++d)
      if (d != dim && x.size(d) != first.size(d)) ok = false;
    if (!ok) {
      std::ostringstream shapes;
      for (size_t j = 0; j < xs.size(); ++j) shapes << (j ? ", " : "") << shape_str(xs[j].shape());
      LINEA_FAIL(op, ": shapes must match except in dim ", dim, "; input ", i, " has shape ", shape_str(x.shape()),
                 " vs input 0 ", shape_str(first.shape()), " (all shapes: ", shapes.str(), ")");
    }
    total += x.size(dim);
  }
  Tensor out = empty(with_dim(first.shape(), dim, total), first.options());
  int64_t off = 0;
  for (const Tensor& x : xs) {
    const int64_t len = x.size(dim);
    if (len > 0 && x.numel() > 0) copy_(narrow(out, dim, off, len), x);
    off += len;
  }
  return out;
}

Tensor pad(const Tensor& x, int64_t dim, int64_t before, int64_t after, double value) {
  const char* op = "pad";
  check_defined(op, x, "x");
  LINEA_CHECK(x.dim() >= 1, op, ": a zero-dim tensor has no dim to pad");
  dim = wrap_dim(dim, x.dim(), op);
  LINEA_CHECK(before >= 0 && after >= 0, op, ": pads must be >= 0, got before = ", before, ", after = ", after,
              " for dim ", dim, " of ", shape_str(x.shape()));
  LINEA_CHECK(x.dtype() != DType::Bool || value == 0.0 || value == 1.0, op, ": a Bool tensor pads with 0 or 1, got ",
              value);
  Tensor out = empty(with_dim(x.shape(), dim, before + x.size(dim) + after), x.options());
  if (out.numel() > 0) LINEA_BACKEND(x.device(), pad, x, dim, before, value, out);
  return out;
}

Tensor stack(const std::vector<Tensor>& xs, int64_t dim) {
  const char* op = "stack";
  LINEA_CHECK(!xs.empty(), op, ": expected a non-empty list of tensors");
  for (size_t i = 0; i < xs.size(); ++i) check_defined(op, xs[i], "input");
  for (size_t i = 1; i < xs.size(); ++i) {
    if (xs[i].shape() != xs[0].shape()) {
      std::ostringstream shapes;
      for (size_t j = 0; j < xs.size(); ++j) shapes << (j ? ", " : "") << shape_str(xs[j].shape());
      LINEA_FAIL(op, ": all inputs must have the same shape; input ", i, " has shape ", shape_str(xs[i].shape()),
                 " vs input 0 ", shape_str(xs[0].shape()), " (all shapes: ", shapes.str(), ")");
    }
  }
  dim = wrap_dim(dim, xs[0].dim() + 1, op);
  std::vector<Tensor> us;
  us.reserve(xs.size());
  for (const Tensor& x : xs) us.push_back(unsqueeze(x, dim));
  return cat(us, dim);
}

// ---- cumsum --------------------------------------------------------------------------------

Tensor cumsum(const Tensor& x, int64_t dim, bool reverse) {
  const char* op = "cumsum";
  check_defined(op, x, "x");
  LINEA_CHECK(x.dtype() != DType::Bool, op, ": expected a numeric dtype, got ", dtype_name(x.dtype()));
  if (x.dim() == 0) {
    wrap_dim(dim, 1, op);
    return clone(x);
  }
  dim = wrap_dim(dim, x.dim(), op);
  Tensor out = empty(x.shape(), x.options());
  if (out.numel() == 0) return out;
  Tensor xc = contiguous(x);
  LINEA_BACKEND(x.device(), cumsum, xc, out, prod(x.shape(), 0, dim), x.size(dim), prod(x.shape(), dim + 1, x.dim()),
                reverse);
  return out;
}

// ---- searchsorted ---------------------------------------------------------------------------

Tensor searchsorted(const Tensor& sorted, const Tensor& values, bool right) {
  const char* op = "searchsorted";
  check_defined(op, sorted, "sorted");
  check_defined(op, values, "values");
  const int64_t d = sorted.dim();
  bool leading = d >= 1 && values.dim() == d;
  for (int64_t i = 0; leading && i + 1 < d; ++i) leading = values.size(i) == sorted.size(i);
  LINEA_CHECK(leading && sorted.size(-1) > 0, op,
              ": expected sorted [..., M] (M > 0) and values [..., S] with the same leading dims, got sorted ",
              shape_str(sorted.shape()), ", values ", shape_str(values.shape()));
  LINEA_CHECK(is_floating(values.dtype()), op, ": expected float32 or float64, got ", dtype_name(values.dtype()));
  check_same_dtype(op, values, sorted);
  check_same_device(op, values, sorted);
  Tensor out = empty(values.shape(), TensorOptions(DType::Int64, values.device()));
  if (out.numel() == 0) return out;
  LINEA_BACKEND(values.device(), searchsorted, contiguous(sorted), contiguous(values), right, out);
  return out;
}

// ---- rfft / irfft --------------------------------------------------------------------------

Tensor rfft(const Tensor& x, int64_t n, int64_t dim) {
  const char* op = "rfft";
  check_defined(op, x, "x");
  LINEA_CHECK(is_floating(x.dtype()), op, ": expected a floating input, got ", dtype_name(x.dtype()));
  LINEA_CHECK(x.dim() >= 1, op, ": input must have at least 1 dim, got ", shape_str(x.shape()));
  LINEA_CHECK(n >= 1, op, ": transform length n must be >= 1, got ", n);
  dim = wrap_dim(dim, x.dim(), op);
  const int64_t nd = x.dim();
  const int64_t F = n / 2 + 1;
  // [others..., L] -> zero-padded / truncated [others..., n] -> [batch, n]
  std::vector<int64_t> perm = move_dim_perm(nd, dim, nd - 1);
  Tensor xm = resize_dim(permute(x, perm), nd - 1, n);
  xm = contiguous(xm);
  const int64_t batch = xm.numel() / n;
  Shape moved_out = xm.shape();
  moved_out.back() = F;
  moved_out.push_back(2);  // [others..., F, 2]
  Tensor out = empty(moved_out, x.options());
  if (batch > 0) LINEA_BACKEND(x.device(), rfft, xm, out, batch, n);
  // back to [..., F at dim, ..., 2]
  std::vector<int64_t> back = inverse_perm(perm);
  back.push_back(nd);
  return contiguous(permute(out, back));
}

Tensor irfft(const Tensor& spec, int64_t n, int64_t dim) {
  const char* op = "irfft";
  check_defined(op, spec, "spec");
  LINEA_CHECK(is_floating(spec.dtype()), op, ": expected a floating spectrum, got ", dtype_name(spec.dtype()));
  LINEA_CHECK(spec.dim() >= 2 && spec.size(-1) == 2, op,
              ": spectrum must have a trailing (re, im) dim of size 2, got shape ", shape_str(spec.shape()));
  LINEA_CHECK(n >= 1, op, ": output length n must be >= 1, got ", n);
  const int64_t nd = spec.dim() - 1;  // dims without the trailing 2
  dim = wrap_dim(dim, nd, op);
  const int64_t F = n / 2 + 1;
  LINEA_CHECK(spec.size(dim) == F, op, ": spectrum ", shape_str(spec.shape()), " has ", spec.size(dim),
              " entries at dim ", dim, " but a length-", n, " output needs n/2+1 = ", F);
  // [..., F at dim, ..., 2] -> [others..., F, 2] -> [batch, F, 2]
  std::vector<int64_t> perm = move_dim_perm(nd, dim, nd - 1);
  perm.push_back(nd);
  Tensor sm = contiguous(permute(spec, perm));
  const int64_t batch = sm.numel() / (2 * F);
  Shape moved_out(sm.shape().begin(), sm.shape().end() - 1);
  moved_out.back() = n;  // [others..., n]
  Tensor out = empty(moved_out, spec.options());
  if (batch > 0) LINEA_BACKEND(spec.device(), irfft, sm, out, batch, n);
  std::vector<int64_t> back = inverse_perm(move_dim_perm(nd, dim, nd - 1));
  return contiguous(permute(out, back));
}

}  // namespace linea::raw
