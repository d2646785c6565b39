// AsyncRead (see readback.h): CUDA tensors are copied into one pinned block and an event is
// recorded after the copies; CPU tensors are read at once.
#include "core/readback.h"

#include <cstring>

#include "core/cuda_interface.h"
#include "core/ops.h"

namespace linea {

struct AsyncRead::State {
  std::vector<double> host_values;  // CPU tensors' values, or the CUDA values once converted
  // CUDA: the pinned block, each tensor's dtype and element count, and the event after the copies.
  void* block = nullptr;
  std::vector<std::pair<DType, int64_t>> parts;
  void* event = nullptr;
  bool converted = false;

  ~State() {
#ifdef LINEA_WITH_CUDA
    if (event) {
      // The copies must land before the block goes back to the pool (normally long done).
      try {
        cuda::event_synchronize(event);
      } catch (...) {
      }
      cuda::event_destroy(event);
    }
    if (block) cuda::pinned_allocator().deallocate(block);
#endif
  }
};

namespace {
template <typename T> void append(std::vector<double>& out, const void* p, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out.push_back(static_cast<double>(static_cast<const T*>(p)[i]));
}
}  // namespace

AsyncRead::AsyncRead(const std::vector<Tensor>& tensors) : state_(std::make_shared<State>()) {
  bool any_cuda = false;
  for (const Tensor& t : tensors) {
    raw::check_defined("AsyncRead", t, "tensor");
    any_cuda = any_cuda || t.is_cuda();
  }
  if (!any_cuda) {
    for (const Tensor& t : tensors) {
      const std::vector<double> v = t.to_vector<double>();
      state_->host_values.insert(state_->host_values.end(), v.begin(), v.end());
    }
    state_->converted = true;
    return;
  }
#ifdef LINEA_WITH_CUDA
  // Each part 8-byte aligned in the block.
  const auto padded = [](const Tensor& t) { return (static_cast<size_t>(t.numel()) * t.element_size() + 7) / 8 * 8; };
  size_t bytes = 0;
  for (const Tensor& t : tensors) bytes += padded(t);
  state_->block = cuda::pinned_allocator().allocate(bytes);
  char* dst = static_cast<char*>(state_->block);
  for (const Tensor& t : tensors) {
    const Tensor src = t.is_cuda() ? raw::contiguous(t) : raw::to_device(raw::contiguous(t), Device("cuda"));
    cuda::memcpy_d2h_async(dst, src.data_ptr(), static_cast<size_t>(t.numel()) * t.element_size());
    state_->parts.emplace_back(t.dtype(), t.numel());
    dst += padded(t);
  }
  state_->event = cuda::event_create();
  cuda::event_record(state_->event);
#endif
}

bool AsyncRead::ready() const {
  if (!state_ || state_->converted) return true;
#ifdef LINEA_WITH_CUDA
  return cuda::event_query(state_->event);
#else
  return true;
#endif
}

std::vector<double> AsyncRead::values() const {
  if (!state_) return {};
  if (!state_->converted) {
#ifdef LINEA_WITH_CUDA
    cuda::event_synchronize(state_->event);
    const char* p = static_cast<const char*>(state_->block);
    for (const auto& [dtype, n] : state_->parts) {
      dispatch_all(dtype, "AsyncRead", [&](auto tag) {
        using T = decltype(tag);
        append<T>(state_->host_values, p, n);
      });
      p += (static_cast<size_t>(n) * dtype_size(dtype) + 7) / 8 * 8;
    }
#endif
    state_->converted = true;
  }
  return state_->host_values;
}

}  // namespace linea
