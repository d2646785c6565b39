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

Tensor grad_norm_guard(const std::vector<Tensor>& grads, const Tensor& loss, double max_norm) {
  const char* op = "grad_norm_guard";
  LINEA_CHECK(std::isfinite(max_norm), op, ": max_norm must be finite (<= 0: no clipping), got ", max_norm);
  std::vector<Tensor> gs;
  Device device = loss.defined() ? loss.device() : Device(kCPU);
  for (size_t i = 0; i < grads.size(); ++i) {
    check_float_operand(op, grads[i], "gradient");
    if (i == 0 && !loss.defined()) device = grads[i].device();
    LINEA_CHECK(grads[i].device() == device && grads[i].dtype() == grads[0].dtype(), op,
                ": every gradient must share one device and dtype (gradient 0 is ", grads[0].dtype(), " on ",
                grads[0].device().str(), ", gradient ", i, " ", grads[i].dtype(), " on ", grads[i].device().str(),
                loss.defined() ? ", the loss on " + loss.device().str() : std::string(), ")");
    gs.push_back(contiguous(grads[i]));
  }
  if (loss.defined()) {
    LINEA_CHECK(is_floating(loss.dtype()) && loss.numel() == 1, op,
                ": the loss must be one float32/float64 value, got ", loss.dtype(), " ", shape_str(loss.shape()));
  }
  Tensor out = empty({3}, TensorOptions(DType::Float64, device));
  LINEA_BACKEND(device, grad_norm_guard, gs, loss.defined() ? contiguous(loss) : Tensor(), max_norm, out);
  return out;
}

void adam_multi_step(const std::vector<Tensor>& params, const std::vector<Tensor>& grads, const std::vector<Tensor>& m,
                     const std::vector<Tensor>& v, const std::vector<int>& group, const Tensor& hyper,
                     const Tensor& count, const Tensor& guard, double beta1, double beta2, double eps, bool decoupled) {
  const char* op = decoupled ? "adamw_multi_step" : "adam_multi_step";
  const size_t n = params.size();
  LINEA_CHECK(grads.size() == n && m.size() == n && v.size() == n && group.size() == n, op,
              ": expected as many gradients, moments and group indices as parameters (", n, "), got ", grads.size(),
              ", ", m.size(), ", ", v.size(), " and ", group.size());
  check_defined(op, hyper, "hyper");
  check_defined(op, count, "count");
  const Device device = count.device();
  LINEA_CHECK(hyper.dtype() == DType::Float64 && hyper.dim() == 2 && hyper.size(1) == 2 && hyper.size(0) >= 1 &&
                  hyper.size(0) <= 127 && hyper.is_contiguous() && hyper.device() == device,
              op, ": hyper must be contiguous float64 [G, 2] (lr, weight decay per group; 1 <= G <= 127) on ",
              device.str(), ", got ", hyper.dtype(), " ", shape_str(hyper.shape()), " on ", hyper.device().str());
  LINEA_CHECK(count.dtype() == DType::Int64 && count.numel() == 1 && count.is_contiguous(), op,
              ": count must be one int64 value, got ", count.dtype(), " ", shape_str(count.shape()));
  if (guard.defined())
    LINEA_CHECK(
        guard.dtype() == DType::Float64 && guard.numel() == 3 && guard.is_contiguous() && guard.device() == device, op,
        ": guard must be grad_norm_guard's float64 [3] on ", device.str(), ", got ", guard.dtype(), " ",
        shape_str(guard.shape()), " on ", guard.device().str());
  LINEA_CHECK(std::isfinite(eps) && eps >= 0.0, op, ": eps must be finite and >= 0, got ", eps);
  LINEA_CHECK(beta1 >= 0.0 && beta1 < 1.0, op, ": beta1 must be in [0, 1), got ", beta1);
  LINEA_CHECK(beta2 >= 0.0 && beta2 < 1.0, op, ": beta2 must be in [0, 1), got ", beta2);
  std::vector<Tensor> gs;
  for (size_t i = 0; i < n; ++i) {
    check_float_operand(op, params[i], "param");
    LINEA_CHECK(params[i].is_contiguous(), op, ": parameter ", i, " (shape ", shape_str(params[i].shape()),
                ") must be contiguous");
    LINEA_CHECK(params[i].device() == device && params[i].dtype() == params[0].dtype(), op,
                ": every parameter must be on ", device.str(), " with one dtype (parameter 0 is ", params[0].dtype(),
                ", parameter ", i, " ", params[i].dtype(), " on ", params[i].device().str(), ")");
    check_like_param(op, params[i], grads[i], "grad");
    check_state(op, params[i], m[i], "first moment (exp_avg)");
    check_state(op, params[i], v[i], "second moment (exp_avg_sq)");
    LINEA_CHECK(group[i] >= 0 && group[i] < hyper.size(0), op, ": parameter ", i, " is in group ", group[i],
                ", but hyper has ", hyper.size(0), " groups");
    gs.push_back(contiguous(grads[i]));
  }
  for (size_t i = 0; i < n; ++i) {
    bump(params[i]);
    bump(m[i]);
    bump(v[i]);
  }
  bump(count);
  LINEA_BACKEND(device, adam_multi_step, params, gs, m, v, group, hyper, count, guard, beta1, beta2, eps, decoupled);
}

}  // namespace linea::raw
