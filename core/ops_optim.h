// linea::raw optimizer steps: one fused, in-place update of a parameter and its optimizer
// state per call (the kernels sgd_step / adam_step of core/kernels.h, on the CPU or CUDA).
// Argument checks name the op, the shapes, dtypes and the offending hyper-parameter; every
// tensor written (param, momentum buffer, Adam moments) gets its storage version bumped, so a
// backward through a graph that recorded the old value fails loudly.
// Not here: parameter groups, lazily allocated state, step counting (nn/optim.h); autograd
// (these ops record nothing: call them under NoGradGuard or on detached tensors).
#pragma once

#include <cmath>
#include <cstdint>

#include "core/tensor.h"

namespace linea {
namespace detail {

// Host-side scalars of one Adam step, computed once in double and shared by the CPU and CUDA
// kernels so that both evaluate the same expression:
//   param = param * decay;  param -= step_size * m / (sqrt(v) / bc2_sqrt + eps)
struct AdamScalars {
  double step_size;  // lr / (1 - beta1^step)
  double bc2_sqrt;   // sqrt(1 - beta2^step)
  double decay;      // 1 - lr * weight_decay for AdamW, 1 for Adam
  double l2;         // weight_decay for Adam (added to the gradient), 0 for AdamW
};
inline AdamScalars adam_scalars(double lr, double beta1, double beta2, double weight_decay, bool decoupled,
                                int64_t step) {
  const double t = static_cast<double>(step);
  return {lr / (1.0 - std::pow(beta1, t)), std::sqrt(1.0 - std::pow(beta2, t)),
          decoupled ? 1.0 - lr * weight_decay : 1.0, decoupled ? 0.0 : weight_decay};
}

}  // namespace detail

namespace raw {

// One SGD step (PyTorch semantics):
//   g = grad + weight_decay * param
//   buf = first ? g : momentum * buf + (1 - dampening) * g        (only when momentum != 0)
//   update = momentum != 0 ? (nesterov ? g + momentum * buf : buf) : g
//   param -= lr * update
// param: floating, any layout (a non-contiguous param is updated through a contiguous copy);
// grad: same shape/dtype/device, any layout; buf: contiguous, same shape/dtype/device, and
// undefined exactly when momentum == 0. first: buf has just been created (its content is ignored).
void sgd_step(const Tensor& param, const Tensor& grad, const Tensor& buf, double lr, double momentum, double dampening,
              double weight_decay, bool nesterov, bool first);

// One Adam / AdamW step; `step` is the count including this update (1 for the first):
//   decoupled (AdamW): param *= 1 - lr * weight_decay;  else (Adam, L2): g = grad + weight_decay * param
//   m = beta1 * m + (1 - beta1) * g;   v = beta2 * v + (1 - beta2) * g^2
//   param -= lr * (m / (1 - beta1^step)) / (sqrt(v / (1 - beta2^step)) + eps)
// m, v: contiguous, same shape/dtype/device as param (zeros before the first step).
void adam_step(const Tensor& param, const Tensor& grad, const Tensor& m, const Tensor& v, double lr, double beta1,
               double beta2, double eps, double weight_decay, bool decoupled, int64_t step);

}  // namespace raw
}  // namespace linea
