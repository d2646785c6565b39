// CUDA optimizer steps: sgd_step and adam_step of core/kernels.h (namespace linea::cuda).
// One kernel launch per parameter per step: a grid-stride loop over the contiguous parameter,
// its gradient and its state, reading and writing each element once. Hyper-parameters and the
// bias corrections (computed on the host, core/ops_optim.h: detail::adam_scalars) are kernel
// arguments, so a step never synchronizes with the host. The per-element expressions are those
// of the CPU reference, core/cpu/optim.cpp.
// Not here: argument checks and version bumps (linea::raw in core/ops_optim.cpp).
#include "core/kernels.h"
#include "core/ops_optim.h"
#include "cuda/common.cuh"

namespace linea::cuda {

using namespace linea::cuda::detail;

namespace {

__device__ __forceinline__ float sqrt_of(float x) { return sqrtf(x); }
__device__ __forceinline__ double sqrt_of(double x) { return sqrt(x); }

// p, g, buf [n]; buf null when momentum is off (use_momentum false)
template <typename T>
__global__ void sgd_step_kernel(T* __restrict__ p, const T* __restrict__ g, T* __restrict__ buf, int64_t n, T lr,
                                T momentum, T damp1, T wd, bool use_momentum, bool nesterov, bool first) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    T gi = g[i];
    if (wd != T(0)) gi = gi + wd * p[i];
    if (use_momentum) {
      const T bi = first ? gi : momentum * buf[i] + damp1 * gi;
      buf[i] = bi;
      gi = nesterov ? gi + momentum * bi : bi;
    }
    p[i] = p[i] - lr * gi;
  }
}

// p, g, m, v [n]
template <typename T>
__global__ void adam_step_kernel(T* __restrict__ p, const T* __restrict__ g, T* __restrict__ m, T* __restrict__ v,
                                 int64_t n, T b1, T b2, T one_b1, T one_b2, T eps, T step_size, T bc2_sqrt, T decay,
                                 T l2) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    T pi = p[i];
    T gi = g[i];
    if (l2 != T(0)) gi = gi + l2 * pi;
    if (decay != T(1)) pi = pi * decay;
    const T mi = b1 * m[i] + one_b1 * gi;
    const T vi = b2 * v[i] + one_b2 * (gi * gi);
    m[i] = mi;
    v[i] = vi;
    const T denom = sqrt_of(vi) / bc2_sqrt + eps;
    p[i] = pi - step_size * mi / denom;
  }
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
        ptr<T>(param), cptr<T>(grad), use_momentum ? ptr<T>(buf) : nullptr, n, static_cast<T>(lr),
        static_cast<T>(momentum), static_cast<T>(1.0 - dampening), static_cast<T>(weight_decay), use_momentum, nesterov,
        first);
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
  const linea::detail::AdamScalars s = linea::detail::adam_scalars(lr, beta1, beta2, weight_decay, decoupled, step);
  LINEA_DISPATCH_FLOAT(param.dtype(), "adam_step", [&] {
    using T = scalar_t;
    adam_step_kernel<T><<<grid_for(n), kBlockSize, 0, stream()>>>(
        ptr<T>(param), cptr<T>(grad), ptr<T>(m), ptr<T>(v), n, static_cast<T>(beta1), static_cast<T>(beta2),
        static_cast<T>(1.0 - beta1), static_cast<T>(1.0 - beta2), static_cast<T>(eps), static_cast<T>(s.step_size),
        static_cast<T>(s.bc2_sqrt), static_cast<T>(s.decay), static_cast<T>(s.l2));
    LINEA_KERNEL_LAUNCH_CHECK();
  });
}

}  // namespace linea::cuda
