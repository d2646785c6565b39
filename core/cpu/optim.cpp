// CPU optimizer steps: sgd_step and adam_step of core/kernels.h, one pass over the elements
// of a contiguous parameter, its gradient and its state, in the parameter's dtype, parallel
// with OpenMP above kParallelGrain elements; the training step's grad_norm_guard and the
// multi-tensor adam_multi_step, which compute exactly what clip_grad_norm_'s composed ops and
// one adam_step per parameter compute. This is the reference the CUDA kernels (cuda/optim.cu)
// reproduce expression for expression.
// Not here: argument checks and version bumps (linea::raw in core/ops_optim.cpp).
#include <cmath>

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

// grads [n_i] contiguous, one dtype; loss 0-d or undefined; out Float64 [3] = {norm, coef, ok}
void grad_norm_guard(const std::vector<Tensor>& grads, const Tensor& loss, double max_norm, const Tensor& out) {
  double* o = static_cast<double*>(out.data_ptr());
  const DType dt = grads.empty() ? DType::Float32 : grads[0].dtype();
  dispatch_float(dt, "grad_norm_guard", [&](auto tag_) {
    using T = decltype(tag_);
    T total = T(0);  // in T, tensor by tensor, as the composed sum of per-tensor sums
    for (size_t i = 0; i < grads.size(); ++i) {
      const T s =
          static_cast<T>(linea::detail::sum_of_squares(static_cast<const T*>(grads[i].data_ptr()), grads[i].numel()));
      total = i == 0 ? s : total + s;
    }
    const T norm = std::sqrt(total);
    const bool loss_ok = !loss.defined() || std::isfinite(loss.item());
    o[0] = static_cast<double>(norm);
    o[1] = static_cast<double>(linea::detail::clip_coef(norm, max_norm));
    o[2] = std::isfinite(norm) && loss_ok ? 1.0 : 0.0;
  });
}

// params, grads, m, v [n_i] contiguous, one dtype; hyper Float64 [G, 2]; count Int64 [1];
// guard Float64 [3] or undefined
void adam_multi_step(const std::vector<Tensor>& params, const std::vector<Tensor>& grads, const std::vector<Tensor>& m,
                     const std::vector<Tensor>& v, const std::vector<int>& group, const Tensor& hyper,
                     const Tensor& count, const Tensor& guard, double beta1, double beta2, double eps, bool decoupled) {
  const double* g3 = guard.defined() ? static_cast<const double*>(guard.data_ptr()) : nullptr;
  if (g3 && g3[2] == 0.0) return;  // a non-finite step: nothing changes
  int64_t* cnt = static_cast<int64_t*>(count.data_ptr());
  const double* hp = static_cast<const double*>(hyper.data_ptr());
  const int64_t step = *cnt + 1;
  if (!params.empty()) {
    dispatch_float(params[0].dtype(), "adam_multi_step", [&](auto tag_) {
      using T = decltype(tag_);
      const T coef = g3 ? static_cast<T>(g3[1]) : T(1);
      for (size_t i = 0; i < params.size(); ++i) {
        const int64_t n = params[i].numel();
        T* p = static_cast<T*>(params[i].data_ptr());
        const T* g = static_cast<const T*>(grads[i].data_ptr());
        T* pm = static_cast<T*>(m[i].data_ptr());
        T* pv = static_cast<T*>(v[i].data_ptr());
        const double* h = hp + 2 * group[i];
        const auto c = linea::detail::AdamCoeffs<T>::make(h[0], beta1, beta2, eps, h[1], decoupled, step);
        if (!g3) {
#pragma omp parallel for schedule(static) if (n >= detail::kParallelGrain)
          for (int64_t j = 0; j < n; ++j) linea::detail::adam_element(p, g, pm, pv, j, c);
          continue;
        }
        // Clipped: the gradient times coef, as clip_grad_norm_ then adam_step would see it.
#pragma omp parallel for schedule(static) if (n >= detail::kParallelGrain)
        for (int64_t j = 0; j < n; ++j) linea::detail::adam_update(p, linea::detail::clipped(g[j], coef), pm, pv, j, c);
      }
    });
  }
  *cnt = step;
}

}  // namespace linea::cpu
