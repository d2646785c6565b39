// Tensor: a reference-counted handle to (storage, shape, strides, offset, dtype) plus an
// opaque pointer to autograd state. Views share storage. This header is the tensor *data*
// model; it knows nothing of graphs. The autograd-facing methods declared at the bottom
// (requires_grad, backward, and the differentiable view/op conveniences) are defined in
// autograd/, which is why they are grouped and marked here.
#pragma once

#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <memory>
#include <ostream>
#include <string>
#include <type_traits>
#include <vector>

#include "core/device.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/shape.h"

namespace linea {

// A block of memory on one device, returned to that device's caching allocator on release.
struct Storage {
  void* data = nullptr;
  size_t nbytes = 0;
  Device device;
  // Bumped by every in-place write (fill_, copy_, in-place arithmetic) to any view of this
  // storage; autograd compares it at backward time to catch writes into recorded tensors.
  uint64_t version = 0;
  Storage(size_t nbytes, Device device);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;
};

namespace detail {
struct AutogradMeta;  // defined in autograd/autograd.h; core never looks inside
}

struct TensorImpl {
  std::shared_ptr<Storage> storage;
  Shape shape;
  Strides strides;
  int64_t offset = 0;  // in elements
  DType dtype = DType::Float32;
  std::shared_ptr<detail::AutogradMeta> autograd;  // null for tensors outside any graph
};

struct TensorOptions {
  DType dtype = DType::Float32;
  Device device = kCPU;
  bool requires_grad = false;
  TensorOptions() = default;
  TensorOptions(DType d) : dtype(d) {}
  TensorOptions(Device dev) : device(dev) {}
  TensorOptions(DType d, Device dev, bool rg = false) : dtype(d), device(dev), requires_grad(rg) {}
  TensorOptions with_dtype(DType d) const {
    TensorOptions o = *this;
    o.dtype = d;
    return o;
  }
  TensorOptions with_device(Device d) const {
    TensorOptions o = *this;
    o.device = d;
    return o;
  }
  TensorOptions with_requires_grad(bool r) const {
    TensorOptions o = *this;
    o.requires_grad = r;
    return o;
  }
};

class Tensor {
 public:
  Tensor() = default;  // undefined tensor (e.g. "no gradient")
  explicit Tensor(std::shared_ptr<TensorImpl> impl) : impl_(std::move(impl)) {}

  // ---- metadata -----------------------------------------------------------------------
  bool defined() const { return impl_ != nullptr; }
  const Shape& shape() const { return impl().shape; }
  const Strides& strides() const { return impl().strides; }
  int64_t dim() const { return static_cast<int64_t>(impl().shape.size()); }
  int64_t size(int64_t d) const;  // negative d counts from the end
  int64_t stride(int64_t d) const;
  int64_t numel() const { return shape_numel(impl().shape); }
  int64_t offset() const { return impl().offset; }
  DType dtype() const { return impl().dtype; }
  Device device() const { return impl().storage->device; }
  bool is_cuda() const { return device().is_cuda(); }
  bool is_cpu() const { return device().is_cpu(); }
  bool is_contiguous() const;
  TensorOptions options() const { return TensorOptions(dtype(), device()); }
  size_t element_size() const { return dtype_size(dtype()); }

  // Raw pointer to the first element (storage + offset). On CUDA this is a device pointer.
  void* data_ptr() const;
  template <typename T> T* data() const {
    LINEA_CHECK(defined() && DTypeOf<T>::value == dtype(), "Tensor::data<", dtype_name(DTypeOf<T>::value),
                ">: tensor has dtype ", defined() ? dtype_name(dtype()) : "undefined");
    return static_cast<T*>(data_ptr());
  }

  // ---- host access (copies from the device when needed) ---------------------------------
  // Value of a one-element tensor, converted to double / T. An integer T reads through
  // item_int64: an integer tensor exactly (through double, an int64 above 2^53 would round, and
  // one rounded past the range is undefined behaviour), a float tensor only where its value fits
  // int64 (else an Error); a narrower T then truncates as a cast does.
  double item() const;
  int64_t item_int64() const;
  template <typename T> T item() const {
    if constexpr (std::is_integral_v<T>) {
      return static_cast<T>(item_int64());
    } else {
      return static_cast<T>(item());
    }
  }
  // All elements in row-major order, converted to T.
  template <typename T> std::vector<T> to_vector() const;
  std::string str() const;  // PyTorch-like printing

  // ---- in-place writes: not recorded by autograd (initialization, optimizer updates under
  //      NoGradGuard). They bump the storage's version, so a backward through an op that
  //      recorded this tensor afterwards fails with a clear error instead of a wrong gradient.
  Tensor& fill_(double value);
  Tensor& zero_() { return fill_(0.0); }
  Tensor& copy_(const Tensor& src);  // broadcasts src to this shape; converts dtype; copies across devices

  // ---- autograd (defined in autograd/) ---------------------------------------------------
  bool requires_grad() const;
  Tensor& requires_grad_(bool on = true);
  Tensor grad() const;             // undefined until a backward reaches this leaf
  void set_grad(const Tensor& g);  // replaces .grad (shape-checked)
  void zero_grad();                // drops .grad
  bool is_leaf() const;
  std::string grad_fn_name() const;  // "" for leaves
  // Backpropagates from this tensor. A non-scalar tensor needs an explicit gradient.
  void backward(const Tensor& gradient = Tensor(), bool retain_graph = false) const;
  Tensor detach() const;  // shares storage, outside any graph

  // ---- differentiable conveniences (defined in autograd/; same as the free functions) ---
  Tensor reshape(const Shape& shape) const;
  Tensor view(const Shape& shape) const;
  Tensor flatten(int64_t start_dim = 0, int64_t end_dim = -1) const;
  Tensor permute(const std::vector<int64_t>& dims) const;
  Tensor transpose(int64_t d0, int64_t d1) const;
  Tensor t() const { return transpose(-2, -1); }
  Tensor narrow(int64_t dim, int64_t start, int64_t length) const;
  Tensor slice(int64_t dim, int64_t start, int64_t end, int64_t step = 1) const;
  Tensor select(int64_t dim, int64_t index) const;
  Tensor unsqueeze(int64_t dim) const;
  Tensor squeeze(int64_t dim) const;
  Tensor squeeze() const;
  Tensor expand(const Shape& shape) const;
  Tensor contiguous() const;
  Tensor to(Device device) const;
  Tensor to(DType dtype) const;
  Tensor sum(const std::vector<int64_t>& dims = {}, bool keepdim = false) const;
  Tensor mean(const std::vector<int64_t>& dims = {}, bool keepdim = false) const;

  TensorImpl& impl() const {
    LINEA_CHECK(impl_ != nullptr, "use of an undefined tensor");
    return *impl_;
  }
  const std::shared_ptr<TensorImpl>& impl_ptr() const { return impl_; }
  bool same(const Tensor& o) const { return impl_ == o.impl_; }  // same handle

 private:
  std::shared_ptr<TensorImpl> impl_;
};

std::ostream& operator<<(std::ostream& os, const Tensor& t);

// ---- creation (no graph; requires_grad in the options marks the result as a leaf) -------
Tensor empty(const Shape& shape, TensorOptions opts = {});
Tensor zeros(const Shape& shape, TensorOptions opts = {});
Tensor ones(const Shape& shape, TensorOptions opts = {});
Tensor full(const Shape& shape, double value, TensorOptions opts = {});
Tensor scalar_tensor(double value, TensorOptions opts = {});
// [start, end) with step, like torch.arange.
Tensor arange(double start, double end, double step = 1.0, TensorOptions opts = {});
inline Tensor arange(double end, TensorOptions opts = {}) { return arange(0.0, end, 1.0, opts); }
Tensor empty_like(const Tensor& t);
Tensor zeros_like(const Tensor& t);
Tensor ones_like(const Tensor& t);
Tensor full_like(const Tensor& t, double value);

// From host data (copied). The dtype is that of T unless opts says otherwise (then converted).
template <typename T>
Tensor from_vector(const std::vector<T>& data, const Shape& shape,
                   TensorOptions opts = TensorOptions(DTypeOf<T>::value));
template <typename T>
Tensor tensor(std::initializer_list<T> data, const Shape& shape,
              TensorOptions opts = TensorOptions(DTypeOf<T>::value)) {
  return from_vector<T>(std::vector<T>(data), shape, opts);
}

// A view with explicit geometry over t's storage (checked to stay in bounds).
Tensor as_strided(const Tensor& t, const Shape& shape, const Strides& strides, int64_t offset);

}  // namespace linea
