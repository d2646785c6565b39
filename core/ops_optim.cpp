// linea::raw optimizer steps (core/ops_optim.h): argument and hyper-parameter checks, the
// contiguous operands the kernels need, dispatch to the CPU or CUDA kernels (core/kernels.h:
// sgd_step, adam_step), and storage version bumps of everything written in place.
// Not here: the kernels (core/cpu/optim.cpp, cuda/optim.cu) and optimizer state management
// (nn/optim.cpp).
#include "core/ops_optim.h"

#include <cmath>

#include "core/dispatch.h"
#include "core/ops.h"

namespace linea::raw {

namespace {

void check_float_operand(const char* op, const Tensor& t, const char* name) {
  check_defined(op, t, name);
  LINEA_CHECK(is_floating(t.dtype()), op, ": expected ", name, " to be float32 or float64, got ", t.dtype(), " (shape ",
              shape_str(t.shape()), ")");
}

// `t` (named `name`) must match param in shape, dtype and device.
void check_like_param(const char* op, const Tensor& param, const Tensor& t, const char* name) {
  check_defined(op, t, name);
  LINEA_CHECK(t.shape() == param.shape(), op, ": ", name, " has shape ", shape_str(t.shape()),
              " but the parameter has ", shape_str(param.shape()));
  check_same_dtype(op, param, t);
  check_same_device(op, param, t);
}

// Optimizer state is updated in place, so it must be addressable as [n].
void check_state(const char* op, const Tensor& param, const Tensor& t, const char* name) {
  check_like_param(op, param, t, name);
  LINEA_CHECK(t.is_contiguous(), op, ": the ", name, " (shape ", shape_str(t.shape()), ") must be contiguous");
}

void check_finite_nonneg(const char* op, double value, const char* name) {
  LINEA_CHECK(std::isfinite(value) && value >= 0.0, op, ": ", name, " must be finite and >= 0, got ", value);
}

void bump(const Tensor& t) {
  if (t.defined()) ++t.impl().storage->version;
}

}  // namespace

void sgd_step(const Tensor& param, const Tensor& grad, const Tensor& buf, double lr, double momentum, double dampening,
              double weight_decay, bool nesterov, bool first) {
  const char* op = "sgd_step";
  check_float_operand(op, param, "param");
  check_like_param(op, param, grad, "grad");
  check_finite_nonneg(op, lr, "lr");
  check_finite_nonneg(op, momentum, "momentum");
  check_finite_nonneg(op, weight_decay, "weight_decay");
  LINEA_CHECK(std::isfinite(dampening) && dampening >= 0.0 && dampening <= 1.0, op,
              ": dampening must be in [0, 1], got ", dampening);
  LINEA_CHECK(!nesterov || (momentum > 0.0 && dampening == 0.0), op,
              ": Nesterov momentum needs momentum > 0 and dampening == 0, got momentum ", momentum, ", dampening ",
              dampening);
  if (momentum != 0.0) {
    check_state(op, param, buf, "momentum buffer");
  } else {
    LINEA_CHECK(!buf.defined(), op, ": a momentum buffer was given but momentum is 0");
  }
  Tensor p = contiguous(param);
  Tensor g = contiguous(grad);
  bump(param);
  bump(buf);
  if (p.numel() > 0)
    LINEA_BACKEND(p.device(), sgd_step, p, g, buf, lr, momentum, dampening, weight_decay, nesterov, first);
  if (!p.same(param)) copy_(param, p);
}

void adam_step(const Tensor& param, const Tensor& grad, const Tensor& m, const Tensor& v, double lr, double beta1,
               double beta2, double eps, double weight_decay, bool decoupled, int64_t step) {
  const char* op = decoupled ? "adamw_step" : "adam_step";
  check_float_operand(op, param, "param");
  check_like_param(op, param, grad, "grad");
  check_state(op, param, m, "first moment (exp_avg)");
  check_state(op, param, v, "second moment (exp_avg_sq)");
  check_finite_nonneg(op, lr, "lr");
  check_finite_nonneg(op, weight_decay, "weight_decay");
  LINEA_CHECK(std::isfinite(eps) && eps >= 0.0, op, ": eps must be finite and >= 0, got ", eps);
  LINEA_CHECK(beta1 >= 0.0 && beta1 < 1.0, op, ": beta1 must be in [0, 1), got ", beta1);
  LINEA_CHECK(beta2 >= 0.0 && beta2 < 1.0, op, ": beta2 must be in [0, 1), got ", beta2);
  LINEA_CHECK(step >= 1, op, ": step counts updates including this one and must be >= 1, got ", step);
  LINEA_CHECK(!m.same(v) && m.impl().storage != v.impl().storage, op, ": the two moments must not share storage");
  Tensor p = contiguous(param);
  Tensor g = contiguous(grad);
  bump(param);
  bump(m);
  bump(v);
  if (p.numel() > 0)
    LINEA_BACKEND(p.device(), adam_step, p, g, m, v, lr, beta1, beta2, eps, weight_decay, decoupled, step);
  if (!p.same(param)) copy_(param, p);
}

}  // namespace linea::raw
