// linea::raw: views, copies, elementwise ops and reductions — argument checks, output
// allocation and device dispatch. No autograd here (see autograd/ for the differentiable API).
#include "core/ops.h"

#include <algorithm>
#include <numeric>
#include <optional>

#include "core/cuda_interface.h"
#include "core/dispatch.h"
#include "core/unary_math.h"

namespace linea::raw {

// ---- checks ----------------------------------------------------------------------------------
void check_defined(const char* op, const Tensor& a, const char* name) {
  LINEA_CHECK(a.defined(), op, ": argument '", name, "' is an undefined tensor");
}

void check_same_device(const char* op, const Tensor& a, const Tensor& b) {
  LINEA_CHECK(a.device() == b.device(), op, ": expected all tensors on the same device, got ", a.device().str(),
              " (shape ", shape_str(a.shape()), ") and ", b.device().str(), " (shape ", shape_str(b.shape()), ")");
}

void check_same_dtype(const char* op, const Tensor& a, const Tensor& b) {
  LINEA_CHECK(a.dtype() == b.dtype(), op, ": dtype mismatch: ", dtype_name(a.dtype()), " (shape ", shape_str(a.shape()),
              ") vs ", dtype_name(b.dtype()), " (shape ", shape_str(b.shape()), "); convert one with .to(dtype)");
}

namespace {
Tensor make_view(const Tensor& x, Shape shape, Strides strides, int64_t offset) {
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = x.impl().storage;
  impl->shape = std::move(shape);
  impl->strides = std::move(strides);
  impl->offset = offset;
  impl->dtype = x.dtype();
  return Tensor(std::move(impl));
}

// Strides that let `new_shape` view memory laid out as (old_shape, old_strides), if any.
std::optional<Strides> view_strides(const Shape& old_shape, const Strides& old_strides, const Shape& new_shape) {
  Strides ns(new_shape.size());
  if (shape_numel(old_shape) == 0) return contiguous_strides(new_shape);
  if (old_shape.empty()) {
    for (auto& s : ns) s = 1;
    return ns;
  }
  int64_t view_d = static_cast<int64_t>(new_shape.size()) - 1;
  int64_t chunk_base = old_strides.back();
  int64_t tensor_numel = 1, view_numel = 1;
  for (int64_t td = static_cast<int64_t>(old_shape.size()) - 1; td >= 0; --td) {
    tensor_numel *= old_shape[td];
    // A chunk of mutually contiguous old dims ends at td.
    if (td == 0 || (old_shape[td - 1] != 1 && old_strides[td - 1] != tensor_numel * chunk_base)) {
      while (view_d >= 0 && (view_numel < tensor_numel || new_shape[view_d] == 1)) {
        ns[view_d] = view_numel * chunk_base;
        view_numel *= new_shape[view_d];
        --view_d;
      }
      if (view_numel != tensor_numel) return std::nullopt;
      if (td > 0) {
        chunk_base = old_strides[td - 1];
        tensor_numel = 1;
        view_numel = 1;
      }
    }
  }
  if (view_d != -1) return std::nullopt;
  return ns;
}
}  // namespace

// ---- views -----------------------------------------------------------------------------------
Shape infer_shape(const Shape& requested, int64_t numel, const char* op) {
  Shape s = requested;
  int64_t known = 1, infer = -1;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == -1) {
      LINEA_CHECK(infer < 0, op, ": only one dimension can be -1 in ", shape_str(requested));
      infer = static_cast<int64_t>(i);
    } else {
      LINEA_CHECK(s[i] >= 0, op, ": invalid size ", s[i], " in ", shape_str(requested));
      known *= s[i];
    }
  }
  if (infer >= 0) {
    LINEA_CHECK(known != 0 && numel % known == 0, op, ": shape ", shape_str(requested), " is invalid for a tensor of ",
                numel, " elements");
    s[infer] = numel / known;
  }
  LINEA_CHECK(shape_numel(s) == numel, op, ": shape ", shape_str(requested), " is invalid for a tensor of ", numel,
              " elements");
  return s;
}

Tensor view(const Tensor& x, const Shape& shape) {
  check_defined("view", x, "x");
  Shape s = infer_shape(shape, x.numel(), "view");
  auto st = view_strides(x.shape(), x.strides(), s);
  LINEA_CHECK(st.has_value(), "view: shape ", shape_str(shape),
              " is incompatible with the strides of a tensor of shape ", shape_str(x.shape()), " (strides ",
              shape_str(x.strides()), "); use reshape");
  return make_view(x, s, *st, x.offset());
}

Tensor reshape(const Tensor& x, const Shape& shape) {
  check_defined("reshape", x, "x");
  Shape s = infer_shape(shape, x.numel(), "reshape");
  auto st = view_strides(x.shape(), x.strides(), s);
  if (st) return make_view(x, s, *st, x.offset());
  Tensor c = clone(x);
  return make_view(c, s, contiguous_strides(s), 0);
}

Tensor permute(const Tensor& x, const std::vector<int64_t>& dims) {
  check_defined("permute", x, "x");
  const int64_t n = x.dim();
  LINEA_CHECK(static_cast<int64_t>(dims.size()) == n, "permute: got ", dims.size(), " dims for a tensor of shape ",
              shape_str(x.shape()));
  Shape s(n);
  Strides st(n);
  std::vector<bool> seen(n, false);
  for (int64_t i = 0; i < n; ++i) {
    int64_t d = wrap_dim(dims[i], n, "permute");
    LINEA_CHECK(!seen[d], "permute: dim ", d, " repeated in ", shape_str(dims));
    seen[d] = true;
    s[i] = x.shape()[d];
    st[i] = x.strides()[d];
  }
  return make_view(x, s, st, x.offset());
}

Tensor transpose(const Tensor& x, int64_t d0, int64_t d1) {
  check_defined("transpose", x, "x");
  const int64_t n = x.dim();
  if (n == 0) return make_view(x, {}, {}, x.offset());
  d0 = wrap_dim(d0, n, "transpose");
  d1 = wrap_dim(d1, n, "transpose");
  Shape s = x.shape();
  Strides st = x.strides();
  std::swap(s[d0], s[d1]);
  std::swap(st[d0], st[d1]);
  return make_view(x, s, st, x.offset());
}

Tensor narrow(const Tensor& x, int64_t dim, int64_t start, int64_t length) {
  check_defined("narrow", x, "x");
  LINEA_CHECK(x.dim() > 0, "narrow: cannot narrow a 0-d tensor");
  dim = wrap_dim(dim, x.dim(), "narrow");
  const int64_t size = x.shape()[dim];
  if (start < 0) start += size;
  LINEA_CHECK(start >= 0 && length >= 0 && start + length <= size, "narrow: range [", start, ", ", start + length,
              ") out of bounds for dim ", dim, " of size ", size, " (shape ", shape_str(x.shape()), ")");
  Shape s = x.shape();
  s[dim] = length;
  return make_view(x, s, x.strides(), x.offset() + start * x.strides()[dim]);
}

Tensor joined_view(const std::vector<Tensor>& parts, int64_t dim) {
  if (parts.empty() || !parts[0].defined() || parts[0].dim() == 0 || parts[0].numel() == 0) return Tensor();
  const Tensor& first = parts[0];
  dim = wrap_dim(dim, first.dim(), "joined_view");
  if (first.stride(dim) <= 0) return Tensor();
  int64_t size = 0, next = first.offset();
  for (const Tensor& p : parts) {
    if (!p.defined() || p.impl().storage != first.impl().storage || p.dtype() != first.dtype() ||
        p.strides() != first.strides() || p.offset() != next || p.numel() == 0)
      return Tensor();
    for (int64_t d = 0; d < p.dim(); ++d)
      if (d != dim && p.size(d) != first.size(d)) return Tensor();
    size += p.size(dim);
    next += p.size(dim) * p.stride(dim);
  }
  Shape s = first.shape();
  s[dim] = size;
  return make_view(first, s, first.strides(), first.offset());
}

std::vector<Tensor> split(const Tensor& x, const std::vector<int64_t>& sizes, int64_t dim) {
  check_defined("split", x, "x");
  LINEA_CHECK(x.dim() > 0, "split: cannot split a 0-d tensor");
  dim = wrap_dim(dim, x.dim(), "split");
  int64_t total = 0;
  for (int64_t s : sizes) {
    LINEA_CHECK(s >= 0, "split: sizes must be non-negative, got ", shape_str(sizes));
    total += s;
  }
  LINEA_CHECK(total == x.size(dim), "split: sizes ", shape_str(sizes), " sum to ", total, " but dim ", dim,
              " of input ", shape_str(x.shape()), " has size ", x.size(dim));
  std::vector<Tensor> pieces;
  int64_t at = 0;
  for (int64_t s : sizes) {
    pieces.push_back(narrow(x, dim, at, s));
    at += s;
  }
  return pieces;
}

Tensor slice(const Tensor& x, int64_t dim, int64_t start, int64_t end, int64_t step) {
  check_defined("slice", x, "x");
  LINEA_CHECK(x.dim() > 0, "slice: cannot slice a 0-d tensor");
  LINEA_CHECK(step > 0, "slice: step must be positive, got ", step);
  dim = wrap_dim(dim, x.dim(), "slice");
  const int64_t size = x.shape()[dim];
  // Python semantics: negative indices count from the end, out-of-range ones are clamped.
  if (start < 0) start += size;
  if (end < 0) end += size;
  start = std::clamp<int64_t>(start, 0, size);
  end = std::clamp<int64_t>(end, start, size);
  Shape s = x.shape();
  Strides st = x.strides();
  s[dim] = (end - start + step - 1) / step;
  st[dim] *= step;
  return make_view(x, s, st, x.offset() + start * x.strides()[dim]);
}

Tensor unsqueeze(const Tensor& x, int64_t dim) {
  check_defined("unsqueeze", x, "x");
  const int64_t n = x.dim();
  LINEA_CHECK(dim >= -(n + 1) && dim <= n, "unsqueeze: dim ", dim, " out of range for a tensor with ", n,
              " dims (expected in [", -(n + 1), ", ", n, "])");
  if (dim < 0) dim += n + 1;
  Shape s = x.shape();
  Strides st = x.strides();
  int64_t stride = dim < n ? s[dim] * st[dim] : 1;
  s.insert(s.begin() + dim, 1);
  st.insert(st.begin() + dim, stride);
  return make_view(x, s, st, x.offset());
}

Tensor squeeze(const Tensor& x, int64_t dim) {
  check_defined("squeeze", x, "x");
  if (x.dim() == 0) return make_view(x, {}, {}, x.offset());
  dim = wrap_dim(dim, x.dim(), "squeeze");
  Shape s = x.shape();
  Strides st = x.strides();
  if (s[dim] == 1) {
    s.erase(s.begin() + dim);
    st.erase(st.begin() + dim);
  }
  return make_view(x, s, st, x.offset());
}

Tensor expand(const Tensor& x, const Shape& shape) {
  check_defined("expand", x, "x");
  const int64_t n = static_cast<int64_t>(shape.size()), m = x.dim();
  LINEA_CHECK(n >= m, "expand: cannot expand shape ", shape_str(x.shape()), " to ", shape_str(shape), " (fewer dims)");
  Shape s(n);
  Strides st(n);
  for (int64_t i = n - 1; i >= 0; --i) {
    int64_t j = i - (n - m);
    int64_t want = shape[i];
    if (j < 0) {
      LINEA_CHECK(want >= 0, "expand: invalid size ", want, " in ", shape_str(shape), " for a new leading dim");
      s[i] = want;
      st[i] = 0;
      continue;
    }
    int64_t have = x.shape()[j];
    if (want == -1) want = have;
    LINEA_CHECK(have == want || have == 1, "expand: cannot expand shape ", shape_str(x.shape()), " to ",
                shape_str(shape), " (dim ", i, ": ", have, " vs ", want, ")");
    s[i] = want;
    st[i] = have == want ? x.strides()[j] : 0;
  }
  return make_view(x, s, st, x.offset());
}

// ---- copies ----------------------------------------------------------------------------------
Tensor clone(const Tensor& x) {
  check_defined("clone", x, "x");
  Tensor out = empty(x.shape(), x.options());
  if (out.numel() > 0) LINEA_BACKEND(x.device(), copy, out, x);
  return out;
}

Tensor contiguous(const Tensor& x) {
  check_defined("contiguous", x, "x");
  return x.is_contiguous() ? x : clone(x);
}

Tensor to_dtype(const Tensor& x, DType t) {
  check_defined("to", x, "x");
  if (x.dtype() == t) return x;
  Tensor out = empty(x.shape(), TensorOptions(t, x.device()));
  if (out.numel() > 0) LINEA_BACKEND(x.device(), copy, out, x);
  return out;
}

Tensor to_device(const Tensor& x, Device d) {
  check_defined("to", x, "x");
  if (x.device() == d) return x;
#ifdef LINEA_WITH_CUDA
  Tensor src = contiguous(x);
  Tensor out = empty(x.shape(), TensorOptions(x.dtype(), d));
  size_t nbytes = static_cast<size_t>(x.numel()) * x.element_size();
  if (nbytes > 0) {
    if (d.is_cuda() && src.is_cpu())
      cuda::memcpy_h2d(out.data_ptr(), src.data_ptr(), nbytes);
    else if (d.is_cpu() && src.is_cuda())
      cuda::memcpy_d2h(out.data_ptr(), src.data_ptr(), nbytes);
    else
      cuda::memcpy_d2d(out.data_ptr(), src.data_ptr(), nbytes);
  }
  return out;
#else
  LINEA_FAIL("to(", d.str(), "): this build of Linea has no CUDA backend");
#endif
}

void copy_(const Tensor& dst, const Tensor& src) {
  check_defined("copy_", dst, "dst");
  check_defined("copy_", src, "src");
#ifdef LINEA_WITH_CUDA
  if (src.is_cpu() && dst.is_cuda() && src.shape() == dst.shape() && src.dtype() == dst.dtype() &&
      src.is_contiguous() && dst.is_contiguous()) {  // straight into dst: one copy, no device temporary
    ++dst.impl().storage->version;
    if (dst.numel() > 0)
      cuda::memcpy_h2d(dst.data_ptr(), src.data_ptr(), static_cast<size_t>(dst.numel()) * dst.element_size());
    return;
  }
#endif
  Tensor s = src.device() == dst.device() ? src : to_device(src, dst.device());
  s = expand(s, dst.shape());
  ++dst.impl().storage->version;
  if (dst.numel() > 0) LINEA_BACKEND(dst.device(), copy, dst, s);
}

void fill_(const Tensor& dst, double value) {
  check_defined("fill_", dst, "dst");
  ++dst.impl().storage->version;
  if (dst.numel() > 0) LINEA_BACKEND(dst.device(), fill, dst, value);
}

void arange_(const Tensor& out, double start, double step) {
  LINEA_CHECK(out.dtype() != DType::Bool, "arange: bool output is not supported");
  if (out.numel() > 0) LINEA_BACKEND(out.device(), arange, out, start, step);
}

// ---- elementwise -----------------------------------------------------------------------------
Tensor unary(UnaryOp op, const Tensor& x, double a, double b) {
  check_defined(unary_op_name(op), x, "x");
  LINEA_CHECK(is_floating(x.dtype()) || (x.dtype() == DType::Int64 && unary_supports_integers(op)), unary_op_name(op),
              ": expected a floating dtype, got ", dtype_name(x.dtype()), " (shape ", shape_str(x.shape()), ")");
  Tensor out = empty(x.shape(), x.options());
  if (out.numel() > 0) LINEA_BACKEND(x.device(), unary, op, x, out, a, b);
  return out;
}

Tensor unary_backward(UnaryOp op, const Tensor& grad, const Tensor& x, const Tensor& y, double a, double b) {
  // The CPU kernel reads contiguous operands; the CUDA kernel any layout (no copies there).
  const auto operand = [&](const Tensor& t) { return x.is_cuda() ? t : contiguous(t); };
  Tensor g = operand(grad), xc = operand(x), yc = y.defined() ? operand(y) : xc;
  LINEA_CHECK(g.shape() == xc.shape(), unary_op_name(op), " backward: gradient shape ", shape_str(g.shape()),
              " does not match input shape ", shape_str(xc.shape()));
  Tensor dx = empty(x.shape(), x.options());
  if (dx.numel() > 0) LINEA_BACKEND(x.device(), unary_backward, op, g, xc, yc, dx, a, b);
  return dx;
}

namespace {
void check_binary_dtypes(BinaryOp op, const Tensor& a, const Tensor& b) {
  const char* name = binary_op_name(op);
  check_same_device(name, a, b);
  check_same_dtype(name, a, b);
  if (a.dtype() == DType::Int64)
    LINEA_CHECK(op != BinaryOp::Div, "div: integer division is not supported (shape ", shape_str(a.shape()),
                "); convert to a floating dtype first");
  LINEA_CHECK(
      binary_supports(op, a.dtype()), name, ": not defined for ", dtype_name(a.dtype()), " tensors (shapes ",
      shape_str(a.shape()), " and ", shape_str(b.shape()), ")",
      a.dtype() == DType::Bool ? "; on bool: eq, ne, logical_and/or, mul = and, maximum = or, minimum = and" : "");
}
}  // namespace

Tensor binary(BinaryOp op, const Tensor& a, const Tensor& b) {
  const char* name = binary_op_name(op);
  check_defined(name, a, "a");
  check_defined(name, b, "b");
  check_binary_dtypes(op, a, b);
  Shape s = broadcast_shapes(a.shape(), b.shape(), name);
  Tensor out = empty(s, TensorOptions(is_comparison(op) ? DType::Bool : a.dtype(), a.device()));
  if (out.numel() > 0) LINEA_BACKEND(a.device(), binary, op, expand(a, s), expand(b, s), out);
  return out;
}

void binary_(BinaryOp op, const Tensor& out, const Tensor& b) {
  const char* name = binary_op_name(op);
  check_defined(name, out, "out");
  check_defined(name, b, "b");
  check_binary_dtypes(op, out, b);
  LINEA_CHECK(!is_comparison(op), name, ": cannot write a comparison in place");
  Shape s = broadcast_shapes(out.shape(), b.shape(), name);
  LINEA_CHECK(s == out.shape(), name, " (in place): shape ", shape_str(b.shape()), " does not broadcast to ",
              shape_str(out.shape()));
  ++out.impl().storage->version;
  if (out.numel() > 0) LINEA_BACKEND(out.device(), binary, op, out, expand(b, s), out);
}

Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b) {
  check_defined("where", cond, "cond");
  check_defined("where", a, "a");
  check_defined("where", b, "b");
  LINEA_CHECK(cond.dtype() == DType::Bool, "where: condition must be bool, got ", dtype_name(cond.dtype()), " (shape ",
              shape_str(cond.shape()), ")");
  check_same_device("where", cond, a);
  check_same_device("where", a, b);
  check_same_dtype("where", a, b);
  Shape s = broadcast_shapes(broadcast_shapes(cond.shape(), a.shape(), "where"), b.shape(), "where");
  Tensor out = empty(s, a.options());
  if (out.numel() > 0) LINEA_BACKEND(a.device(), where, expand(cond, s), expand(a, s), expand(b, s), out);
  return out;
}

Tensor masked_fill(const Tensor& x, const Tensor& mask, double value) {
  check_defined("masked_fill", x, "x");
  check_defined("masked_fill", mask, "mask");
  LINEA_CHECK(mask.dtype() == DType::Bool, "masked_fill: mask must be bool, got ", dtype_name(mask.dtype()), " (shape ",
              shape_str(mask.shape()), ")");
  check_same_device("masked_fill", x, mask);
  Shape s = broadcast_shapes(x.shape(), mask.shape(), "masked_fill");
  LINEA_CHECK(s == x.shape(), "masked_fill: mask of shape ", shape_str(mask.shape()),
              " does not broadcast to the input shape ", shape_str(x.shape()));
  Tensor v = full({}, value, x.options());
  Tensor out = empty(s, x.options());
  if (out.numel() > 0) LINEA_BACKEND(x.device(), where, expand(mask, s), expand(v, s), x, out);
  return out;
}

// ---- reductions ------------------------------------------------------------------------------
std::vector<int64_t> reduction_dims(const std::vector<int64_t>& dims, int64_t ndim, const char* op) {
  std::vector<int64_t> out;
  if (dims.empty()) {
    out.resize(ndim);
    std::iota(out.begin(), out.end(), 0);
    return out;
  }
  for (int64_t d : dims) out.push_back(wrap_dim(d, ndim, op));
  std::sort(out.begin(), out.end());
  for (size_t i = 1; i < out.size(); ++i)
    LINEA_CHECK(out[i] != out[i - 1], op, ": dim ", out[i], " appears twice in ", shape_str(dims));
  if (ndim == 0) out.clear();  // dim 0 / -1 of a scalar: nothing to reduce
  return out;
}

namespace {
const char* reduce_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum:
      return "sum";
    case ReduceOp::Max:
      return "max";
    case ReduceOp::Min:
      return "min";
    case ReduceOp::LogSumExp:
      return "logsumexp";
  }
  return "reduce";
}

Shape reduced_shape(const Shape& s, const std::vector<int64_t>& rd, bool keepdim) {
  Shape out;
  for (int64_t d = 0; d < static_cast<int64_t>(s.size()); ++d) {
    bool red = std::binary_search(rd.begin(), rd.end(), d);
    if (!red)
      out.push_back(s[d]);
    else if (keepdim)
      out.push_back(1);
  }
  return out;
}
}  // namespace

Tensor reduce(ReduceOp op, const Tensor& x_in, const std::vector<int64_t>& dims, bool keepdim) {
  const char* name = reduce_name(op);
  check_defined(name, x_in, "x");
  // A Bool x: Sum counts its true elements into Int64 in the kernel's one pass (torch.sum of a
  // bool tensor); the other reductions see it as Int64.
  const bool count = x_in.dtype() == DType::Bool && op == ReduceOp::Sum;
  Tensor x = x_in.dtype() == DType::Bool && !count ? to_dtype(x_in, DType::Int64) : x_in;
  const TensorOptions out_opts = count ? x.options().with_dtype(DType::Int64) : x.options();
  LINEA_CHECK(op != ReduceOp::LogSumExp || is_floating(x.dtype()), name, ": expected a floating dtype, got ",
              dtype_name(x.dtype()));
  auto rd = reduction_dims(dims, x.dim(), name);
  Shape out_shape = reduced_shape(x.shape(), rd, keepdim);
  int64_t r = 1;
  for (int64_t d : rd) r *= x.shape()[d];
  if (r == 0 || x.numel() == 0) {
    LINEA_CHECK(op == ReduceOp::Sum || op == ReduceOp::LogSumExp || shape_numel(out_shape) == 0, name,
                ": cannot reduce over a zero-size dimension (shape ", shape_str(x.shape()), ")");
    return full(out_shape, op == ReduceOp::Sum ? 0.0 : -INFINITY, out_opts);
  }
  Tensor out = empty(out_shape, out_opts);
  // Reduced dims forming one contiguous range of a contiguous tensor: reduce in place as
  // [outer, r, inner]. Otherwise move them last and copy.
  bool range = rd.empty() || rd.back() - rd.front() + 1 == static_cast<int64_t>(rd.size());
  int64_t outer = 1, inner = 1;
  Tensor src = x;
  if (range && x.is_contiguous()) {
    int64_t lo = rd.empty() ? 0 : rd.front(), hi = rd.empty() ? -1 : rd.back();
    for (int64_t d = 0; d < lo; ++d) outer *= x.shape()[d];
    for (int64_t d = hi + 1; d < x.dim(); ++d) inner *= x.shape()[d];
    if (rd.empty()) outer = x.numel();
  } else {
    std::vector<int64_t> perm;
    for (int64_t d = 0; d < x.dim(); ++d)
      if (!std::binary_search(rd.begin(), rd.end(), d)) perm.push_back(d);
    perm.insert(perm.end(), rd.begin(), rd.end());
    src = contiguous(permute(x, perm));
    outer = x.numel() / r;
  }
  LINEA_BACKEND(x.device(), reduce, op, src, out, outer, r, inner);
  return out;
}

Tensor arg_reduce(bool is_max, const Tensor& x, int64_t dim, bool keepdim) {
  const char* name = is_max ? "argmax" : "argmin";
  check_defined(name, x, "x");
  LINEA_CHECK(x.dtype() != DType::Bool, name, ": not defined for bool tensors");
  if (x.dim() == 0) return zeros({}, TensorOptions(DType::Int64, x.device()));
  dim = wrap_dim(dim, x.dim(), name);
  const int64_t r = x.shape()[dim];
  LINEA_CHECK(r > 0, name, ": cannot reduce over a zero-size dimension (shape ", shape_str(x.shape()), ")");
  Shape out_shape = reduced_shape(x.shape(), {dim}, keepdim);
  Tensor out = empty(out_shape, TensorOptions(DType::Int64, x.device()));
  if (out.numel() == 0) return out;
  Tensor src = contiguous(x);
  int64_t outer = 1, inner = 1;
  for (int64_t d = 0; d < dim; ++d) outer *= x.shape()[d];
  for (int64_t d = dim + 1; d < x.dim(); ++d) inner *= x.shape()[d];
  LINEA_BACKEND(x.device(), arg_reduce, is_max, src, out, outer, r, inner);
  return out;
}

Tensor sum_to(const Tensor& g, const Shape& shape) {
  check_defined("sum_to", g, "g");
  if (g.shape() == shape) return g;
  const int64_t lead = g.dim() - static_cast<int64_t>(shape.size());
  LINEA_CHECK(lead >= 0, "sum_to: cannot reduce shape ", shape_str(g.shape()), " to ", shape_str(shape));
  std::vector<int64_t> dims;
  for (int64_t d = 0; d < lead; ++d) dims.push_back(d);
  for (int64_t d = lead; d < g.dim(); ++d) {
    int64_t want = shape[d - lead];
    LINEA_CHECK(want == g.shape()[d] || want == 1, "sum_to: cannot reduce shape ", shape_str(g.shape()), " to ",
                shape_str(shape));
    if (want == 1 && g.shape()[d] != 1) dims.push_back(d);
  }
  if (dims.empty()) return reshape(g, shape);
  return reshape(reduce(ReduceOp::Sum, g, dims, true), shape);
}

}  // namespace linea::raw
