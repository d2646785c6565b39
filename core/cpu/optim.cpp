// CPU optimizer steps: sgd_step and adam_step of core/kernels.h, one pass over the elements
// of a contiguous parameter, its gradient and its state, in the parameter's dtype, parallel
// with OpenMP above kParallelGrain elements. This is the reference the CUDA kernels
// (cuda/optim.cu) reproduce expression for expression.
// Not here: argument checks and version bumps (linea::raw in core/ops_optim.cpp).
#include "core/cpu/strided.h"
#include "core/kernels.h"
#include "core/optim_math.h"

namespace linea::cpu {

// param, grad, buf [n] contiguous; buf undefined when momentum == 0
void sgd_step(const Tensor& param, const Tensor& grad, const Tensor& buf, double lr, double momentum, double dampening,
              double weight_decay, bool nesterov, bool first) {
  const int64_t n = param.numel();
  LINEA_CHECK(grad.numel() == n && (!buf.defined() || buf.numel() == n), "sgd_step: sizes differ (param ",
              shape_str(param.shape()), ", grad ", shape_str(grad.shape()), ")");
  if (n == 0) return;
  dispatch_float(param.dtype(), "sgd_step", [&](auto tag_) {
    using T = decltype(tag_);
    T* p = static_cast<T*>(param.data_ptr());
    const T* g = static_cast<const T*>(grad.data_ptr());
    T* b = buf.defined() ? static_cast<T*>(buf.data_ptr()) : nullptr;
    const auto c = linea::detail::SgdCoeffs<T>::make(lr, momentum, dampening, weight_decay, nesterov, first);
#pragma omp parallel for schedule(static) if (n >= detail::kParallelGrain)
    for (int64_t i = 0; i < n; ++i) linea::detail::sgd_element(p, g, b, i, c);
  });
}

// param, grad, m, v [n] contiguous
void adam_step(const Tensor& param, const Tensor& grad, const Tensor& m, const Tensor& v, double lr, double beta1,
               double beta2, double eps, double weight_decay, bool decoupled, int64_t step) {
  const int64_t n = param.numel();
  LINEA_CHECK(grad.numel() == n && m.numel() == n && v.numel() == n, "adam_step: sizes differ (param ",
              shape_str(param.shape()), ", grad ", shape_str(grad.shape()), ", m ", shape_str(m.shape()), ", v ",
              shape_str(v.shape()), ")");
  if (n == 0) return;
  dispatch_float(param.dtype(), "adam_step", [&](auto tag_) {
    using T = decltype(tag_);
    T* p = static_cast<T*>(param.data_ptr());
    const T* g = static_cast<const T*>(grad.data_ptr());
    T* pm = static_cast<T*>(m.data_ptr());
    T* pv = static_cast<T*>(v.data_ptr());
    const auto c = linea::detail::AdamCoeffs<T>::make(lr, beta1, beta2, eps, weight_decay, decoupled, step);
#pragma omp parallel for schedule(static) if (n >= detail::kParallelGrain)
    for (int64_t i = 0; i < n; ++i) linea::detail::adam_element(p, g, pm, pv, i, c);
  });
}

}  // namespace linea::cpu
