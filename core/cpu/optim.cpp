// CPU optimizer steps: sgd_step and adam_step of core/kernels.h, one pass over the elements
// of a contiguous parameter, its gradient and its state, in the parameter's dtype, parallel
// with OpenMP above kParallelGrain elements. This is the reference the CUDA kernels
// (cuda/optim.cu) reproduce expression for expression.
// Not here: argument checks and version bumps (linea::raw in core/ops_optim.cpp).
#include <cmath>

#include "core/cpu/strided.h"
#include "core/kernels.h"
#include "core/ops_optim.h"

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
    const T lr_ = static_cast<T>(lr), mom = static_cast<T>(momentum), damp1 = static_cast<T>(1.0 - dampening),
            wd = static_cast<T>(weight_decay);
    const bool use_momentum = momentum != 0.0;
#pragma omp parallel for schedule(static) if (n >= detail::kParallelGrain)
    for (int64_t i = 0; i < n; ++i) {
      T gi = g[i];
      if (wd != T(0)) gi = gi + wd * p[i];
      if (use_momentum) {
        const T bi = first ? gi : mom * b[i] + damp1 * gi;
        b[i] = bi;
        gi = nesterov ? gi + mom * bi : bi;
      }
      p[i] = p[i] - lr_ * gi;
    }
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
  const linea::detail::AdamScalars s = linea::detail::adam_scalars(lr, beta1, beta2, weight_decay, decoupled, step);
  dispatch_float(param.dtype(), "adam_step", [&](auto tag_) {
    using T = decltype(tag_);
    T* p = static_cast<T*>(param.data_ptr());
    const T* g = static_cast<const T*>(grad.data_ptr());
    T* pm = static_cast<T*>(m.data_ptr());
    T* pv = static_cast<T*>(v.data_ptr());
    const T b1 = static_cast<T>(beta1), b2 = static_cast<T>(beta2), one_b1 = static_cast<T>(1.0 - beta1),
            one_b2 = static_cast<T>(1.0 - beta2), eps_ = static_cast<T>(eps), step_size = static_cast<T>(s.step_size),
            bc2_sqrt = static_cast<T>(s.bc2_sqrt), decay = static_cast<T>(s.decay), l2 = static_cast<T>(s.l2);
#pragma omp parallel for schedule(static) if (n >= detail::kParallelGrain)
    for (int64_t i = 0; i < n; ++i) {
      T pi = p[i];
      T gi = g[i];
      if (l2 != T(0)) gi = gi + l2 * pi;
      if (decay != T(1)) pi = pi * decay;
      const T mi = b1 * pm[i] + one_b1 * gi;
      const T vi = b2 * pv[i] + one_b2 * (gi * gi);
      pm[i] = mi;
      pv[i] = vi;
      const T denom = std::sqrt(vi) / bc2_sqrt + eps_;
      p[i] = pi - step_size * mi / denom;
    }
  });
}

}  // namespace linea::cpu
