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
#include <vector>

#include "core/host_device.h"
#include "core/tensor.h"

namespace linea {
namespace detail {

// The scalars of one Adam step, computed once in double (on the host, or per block on the
// device for the multi-tensor step, whose step count lives there) and shared by the CPU and
// CUDA kernels so that both evaluate the same expression:
//   param = param * decay;  param -= step_size * m / (sqrt(v) / bc2_sqrt + eps)
struct AdamScalars {
  double step_size;  // lr / (1 - beta1^step)
  double bc2_sqrt;   // sqrt(1 - beta2^step)
  double decay;      // 1 - lr * weight_decay for AdamW, 1 for Adam
  double l2;         // weight_decay for Adam (added to the gradient), 0 for AdamW
};
LINEA_HD AdamScalars adam_scalars(double lr, double beta1, double beta2, double weight_decay, bool decoupled,
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

// The guard of a training step, computed on the gradients' device without a host
// synchronization: a float64 [3] tensor {norm, coef, ok} with norm = the global L2 norm of
// `grads` (as clip_grad_norm_ computes it, in their dtype), coef = min(max_norm / (norm + 1e-6),
// 1) (1 when max_norm <= 0: no clipping) and ok = 1 when the norm and `loss` (one float value,
// or undefined) are finite, else 0. grads: one device and dtype, any layout.
Tensor grad_norm_guard(const std::vector<Tensor>& grads, const Tensor& loss, double max_norm);

// One Adam / AdamW step of many parameters at once, each as adam_step with its group's
// (lr, weight_decay) = hyper[group[i]] (float64 [G, 2] on the device) and step = count + 1
// (count: int64 [1] on the device, the steps applied so far, incremented by this call). With a
// guard (grad_norm_guard's result): the gradients are used times its coef, and when its ok is 0
// nothing changes, count included. Parameters, moments and count are written in place (versions
// bumped); params, m, v contiguous, one device and dtype. On CUDA: one launch per 256 tensors.
void adam_multi_step(const std::vector<Tensor>& params, const std::vector<Tensor>& grads, const std::vector<Tensor>& m,
                     const std::vector<Tensor>& v, const std::vector<int>& group, const Tensor& hyper,
                     const Tensor& count, const Tensor& guard, double beta1, double beta2, double eps, bool decoupled);

}  // namespace raw
}  // namespace linea
