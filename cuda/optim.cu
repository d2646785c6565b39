// CUDA optimizer steps: sgd_step and adam_step of core/kernels.h (namespace linea::cuda).
// One kernel launch per parameter per step: a grid-stride loop over the contiguous parameter,
// its gradient and its state, reading and writing each element once. Hyper-parameters and the
// bias corrections (computed on the host, core/ops_optim.h: detail::adam_scalars) are kernel
// arguments, so a step never synchronizes with the host. The per-element expressions are those
// of core/optim_math.h, shared with the CPU kernels.
// Not here: argument checks and version bumps (linea::raw in core/ops_optim.cpp).
#include "core/kernels.h"
#include "core/optim_math.h"
#include "cuda/common.cuh"

namespace linea::cuda {

using namespace linea::cuda::detail;

namespace {

// p, g, buf [n]; buf null when momentum is off
template <typename T>
__global__ void sgd_step_kernel(T* __restrict__ p, const T* __restrict__ g, T* __restrict__ buf, int64_t n,
                                const linea::detail::SgdCoeffs<T> c) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    linea::detail::sgd_element(p, g, buf, i, c);
}

// p, g, m, v [n]
template <typename T>
__global__ void adam_step_kernel(T* __restrict__ p, const T* __restrict__ g, T* __restrict__ m, T* __restrict__ v,
                                 int64_t n, const linea::detail::AdamCoeffs<T> c) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    linea::detail::adam_element(p, g, m, v, i, c);
}

}  // namespace

// param, grad, buf [n] contiguous; buf undefined when momentum == 0
void sgd_step(const Tensor& param, const Tensor& grad, const Tensor& buf, double lr, double momentum, double dampening,
              double weight_decay, bool nesterov, bool first) {
  const int64_t n = param.numel();
  const bool use_momentum = momentum != 0.0;
  LINEA_CHECK(grad.numel() == n && (!use_momentum || (buf.defined() && buf.numel() == n)),
              "sgd_step: sizes differ (param ", shape_str(param.shape()), ", grad ", shape_str(grad.shape()), ")");
  if (n == 0) return;
  LINEA_DISPATCH_FLOAT(param.dtype(), "sgd_step", [&] {
    using T = scalar_t;
    sgd_step_kernel<T><<<grid_for(n), kBlockSize, 0, stream()>>>(
        ptr<T>(param), cptr<T>(grad), use_momentum ? ptr<T>(buf) : nullptr, n,
        linea::detail::SgdCoeffs<T>::make(lr, momentum, dampening, weight_decay, nesterov, first));
    LINEA_KERNEL_LAUNCH_CHECK();
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
  LINEA_DISPATCH_FLOAT(param.dtype(), "adam_step", [&] {
    using T = scalar_t;
    adam_step_kernel<T><<<grid_for(n), kBlockSize, 0, stream()>>>(
        ptr<T>(param), cptr<T>(grad), ptr<T>(m), ptr<T>(v), n,
        linea::detail::AdamCoeffs<T>::make(lr, beta1, beta2, eps, weight_decay, decoupled, step));
    LINEA_KERNEL_LAUNCH_CHECK();
  });
}

}  // namespace linea::cuda
