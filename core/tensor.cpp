// Tensor data model: storage, metadata, host access, printing, creation.
#include "core/tensor.h"

#include <cmath>
#include <iomanip>
#include <sstream>

#include "core/allocator.h"
#include "core/cuda_interface.h"
#include "core/ops.h"

namespace linea {

// ---- Storage ---------------------------------------------------------------------------------
Storage::Storage(size_t n, Device dev) : nbytes(n), device(dev) {
  if (dev.is_cpu()) {
    data = cpu_allocator().allocate(n);
  } else {
#ifdef LINEA_WITH_CUDA
    LINEA_CHECK(cuda::is_available(), "allocate on ", dev.str(),
                ": no CUDA device is available (no GPU or no driver); use the CPU");
    LINEA_CHECK(dev.index == 0, "allocate on ", dev.str(), ": only cuda:0 is supported");
    data = cuda::allocator().allocate(n);
#else
    LINEA_FAIL("allocate on ", dev.str(), ": this build of Linea has no CUDA backend (configure with LINEA_CUDA=ON)");
#endif
  }
}

Storage::~Storage() {
  if (!data) return;
  if (device.is_cpu()) {
    cpu_allocator().deallocate(data);
  } else {
#ifdef LINEA_WITH_CUDA
    cuda::allocator().deallocate(data);
#endif
  }
}

// ---- metadata --------------------------------------------------------------------------------
int64_t Tensor::size(int64_t d) const { return shape()[wrap_dim(d, dim(), "size")]; }
int64_t Tensor::stride(int64_t d) const { return strides()[wrap_dim(d, dim(), "stride")]; }

bool Tensor::is_contiguous() const {
  if (numel() == 0) return true;  // nothing to lay out
  const auto& sh = shape();
  const auto& st = strides();
  int64_t expected = 1;
  for (size_t i = sh.size(); i-- > 0;) {
    if (sh[i] == 1) continue;
    if (st[i] != expected) return false;
    expected *= sh[i];
  }
  return true;
}

void* Tensor::data_ptr() const {
  const TensorImpl& t = impl();
  return static_cast<char*>(t.storage->data) + t.offset * static_cast<int64_t>(dtype_size(t.dtype));
}

// ---- host access -----------------------------------------------------------------------------
namespace {
// A contiguous CPU tensor with x's values (x itself when it already is one).
Tensor host_contiguous(const Tensor& x) { return raw::contiguous(raw::to_device(x, kCPU)); }
}  // namespace

double Tensor::item() const {
  LINEA_CHECK(numel() == 1, "item: expected a tensor with one element, got shape ", shape_str(shape()));
  Tensor h = host_contiguous(*this);
  return LINEA_DISPATCH_ALL(h.dtype(), "item",
                            [&] { return static_cast<double>(*static_cast<scalar_t*>(h.data_ptr())); });
}

int64_t Tensor::item_int64() const {
  LINEA_CHECK(numel() == 1, "item: expected a tensor with one element, got shape ", shape_str(shape()));
  if (is_floating(dtype())) {
    const double v = item();
    // [-2^63, 2^63): the doubles that convert to int64 (NaN fails the comparisons too).
    LINEA_CHECK(v >= -9223372036854775808.0 && v < 9223372036854775808.0, "item: ", v, " (", dtype_name(dtype()),
                ") is not an int64 value");
    return static_cast<int64_t>(v);
  }
  Tensor h = host_contiguous(*this);
  return LINEA_DISPATCH_ALL(h.dtype(), "item",
                            [&] { return static_cast<int64_t>(*static_cast<scalar_t*>(h.data_ptr())); });
}

template <typename T> std::vector<T> Tensor::to_vector() const {
  Tensor h = host_contiguous(*this);
  std::vector<T> out(static_cast<size_t>(h.numel()));
  LINEA_DISPATCH_ALL(h.dtype(), "to_vector", [&] {
    const scalar_t* p = static_cast<const scalar_t*>(h.data_ptr());
    for (size_t i = 0; i < out.size(); ++i) out[i] = static_cast<T>(p[i]);
  });
  return out;
}
template std::vector<float> Tensor::to_vector<float>() const;
template std::vector<double> Tensor::to_vector<double>() const;
template std::vector<int64_t> Tensor::to_vector<int64_t>() const;
template std::vector<int> Tensor::to_vector<int>() const;
template std::vector<uint8_t> Tensor::to_vector<uint8_t>() const;

Tensor& Tensor::fill_(double value) {
  raw::check_defined("fill_", *this, "self");
  raw::fill_(*this, value);
  return *this;
}

Tensor& Tensor::copy_(const Tensor& src) {
  raw::copy_(*this, src);
  return *this;
}

// ---- printing --------------------------------------------------------------------------------
namespace {
void print_rec(std::ostream& os, const std::vector<double>& v, const Shape& sh, size_t d, int64_t& pos, bool is_int,
               int indent) {
  if (sh.empty()) {
    os << v[0];
    return;
  }
  os << '[';
  int64_t n = sh[d];
  const int64_t edge = 3;
  bool elide = n > 2 * edge + 1;
  int64_t inner = 1;
  for (size_t k = d + 1; k < sh.size(); ++k) inner *= sh[k];
  for (int64_t i = 0; i < n; ++i) {
    if (elide && i == edge) {
      os << (d + 1 == sh.size() ? "..., " : "...,\n" + std::string(indent + 1, ' '));
      pos += (n - 2 * edge) * inner;
      i = n - edge - 1;
      continue;
    }
    if (d + 1 == sh.size()) {
      double x = v[pos++];
      if (is_int)
        os << static_cast<int64_t>(x);
      else
        os << std::setw(10) << x;
    } else {
      print_rec(os, v, sh, d + 1, pos, is_int, indent + 1);
    }
    if (i + 1 < n) os << (d + 1 == sh.size() ? ", " : ",\n" + std::string(indent + 1, ' '));
  }
  os << ']';
}
}  // namespace

std::string Tensor::str() const {
  if (!defined()) return "tensor(undefined)";
  std::ostringstream os;
  std::vector<double> v = to_vector<double>();
  bool is_int = !is_floating(dtype());
  os << "tensor(";
  if (numel() == 0) {
    os << "[]";
  } else {
    os << std::setprecision(4) << std::fixed;
    int64_t pos = 0;
    print_rec(os, v, shape(), 0, pos, is_int, 7);
  }
  os << ", shape=" << shape_str(shape()) << ", dtype=" << dtype_name(dtype());
  if (!is_cpu()) os << ", device=" << device().str();
  if (impl().autograd) {
    std::string fn = grad_fn_name();
    if (!fn.empty())
      os << ", grad_fn=" << fn;
    else if (requires_grad())
      os << ", requires_grad=true";
  }
  os << ")";
  return os.str();
}

std::ostream& operator<<(std::ostream& os, const Tensor& t) { return os << t.str(); }

// ---- creation --------------------------------------------------------------------------------
Tensor empty(const Shape& shape, TensorOptions opts) {
  for (int64_t d : shape) LINEA_CHECK(d >= 0, "empty: negative dimension in shape ", shape_str(shape));
  auto impl = std::make_shared<TensorImpl>();
  impl->storage =
      std::make_shared<Storage>(static_cast<size_t>(shape_numel(shape)) * dtype_size(opts.dtype), opts.device);
  impl->shape = shape;
  impl->strides = contiguous_strides(shape);
  impl->dtype = opts.dtype;
  Tensor t(std::move(impl));
  if (opts.requires_grad) t.requires_grad_(true);
  return t;
}

Tensor full(const Shape& shape, double value, TensorOptions opts) {
  bool rg = opts.requires_grad;
  Tensor t = empty(shape, opts.with_requires_grad(false));
  t.fill_(value);
  if (rg) t.requires_grad_(true);
  return t;
}
Tensor zeros(const Shape& shape, TensorOptions opts) { return full(shape, 0.0, opts); }
Tensor ones(const Shape& shape, TensorOptions opts) { return full(shape, 1.0, opts); }
Tensor scalar_tensor(double value, TensorOptions opts) { return full({}, value, opts); }
Tensor empty_like(const Tensor& t) { return empty(t.shape(), t.options()); }
Tensor zeros_like(const Tensor& t) { return zeros(t.shape(), t.options()); }
Tensor ones_like(const Tensor& t) { return ones(t.shape(), t.options()); }
Tensor full_like(const Tensor& t, double value) { return full(t.shape(), value, t.options()); }

Tensor arange(double start, double end, double step, TensorOptions opts) {
  LINEA_CHECK(step != 0 && std::isfinite(start) && std::isfinite(end) && std::isfinite(step),
              "arange: invalid range (start ", start, ", end ", end, ", step ", step, ")");
  double n = std::ceil((end - start) / step);
  int64_t count = n > 0 ? static_cast<int64_t>(n) : 0;
  bool rg = opts.requires_grad;
  Tensor t = empty({count}, opts.with_requires_grad(false));
  if (count > 0) raw::arange_(t, start, step);
  if (rg) t.requires_grad_(true);
  return t;
}

template <typename T> Tensor from_vector(const std::vector<T>& data, const Shape& shape, TensorOptions opts) {
  LINEA_CHECK(static_cast<int64_t>(data.size()) == shape_numel(shape), "from_vector: ", data.size(),
              " values do not fill shape ", shape_str(shape));
  bool rg = opts.requires_grad;
  Tensor host = empty(shape, TensorOptions(DTypeOf<T>::value));
  if (!data.empty()) std::memcpy(host.data_ptr(), data.data(), data.size() * sizeof(T));
  Tensor t = raw::to_device(raw::to_dtype(host, opts.dtype), opts.device);
  if (rg) t.requires_grad_(true);
  return t;
}
template Tensor from_vector<float>(const std::vector<float>&, const Shape&, TensorOptions);
template Tensor from_vector<double>(const std::vector<double>&, const Shape&, TensorOptions);
template Tensor from_vector<int64_t>(const std::vector<int64_t>&, const Shape&, TensorOptions);

template <> Tensor from_vector<bool>(const std::vector<bool>& data, const Shape& shape, TensorOptions opts) {
  std::vector<int64_t> v(data.begin(), data.end());
  return raw::to_dtype(from_vector<int64_t>(v, shape, TensorOptions(DType::Int64, opts.device)), DType::Bool);
}

Tensor as_strided(const Tensor& t, const Shape& shape, const Strides& strides, int64_t offset) {
  LINEA_CHECK(shape.size() == strides.size(), "as_strided: shape ", shape_str(shape), " and strides ",
              shape_str(strides), " differ in length");
  int64_t lo = offset, hi = offset;
  for (size_t i = 0; i < shape.size(); ++i) {
    LINEA_CHECK(shape[i] >= 0, "as_strided: negative size in ", shape_str(shape));
    if (shape[i] == 0) {
      hi = lo - 1;
      break;
    }
    int64_t ext = (shape[i] - 1) * strides[i];
    if (ext < 0)
      lo += ext;
    else
      hi += ext;
  }
  int64_t cap = static_cast<int64_t>(t.impl().storage->nbytes / dtype_size(t.dtype()));
  LINEA_CHECK(lo >= 0 && (hi < lo || hi < cap), "as_strided: view (shape ", shape_str(shape), ", strides ",
              shape_str(strides), ", offset ", offset, ") exceeds the storage of ", cap, " elements");
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = t.impl().storage;
  impl->shape = shape;
  impl->strides = strides;
  impl->offset = offset;
  impl->dtype = t.dtype();
  return Tensor(std::move(impl));
}

}  // namespace linea
