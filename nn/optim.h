// Optimizers (SGD with momentum/Nesterov, Adam, AdamW) over parameter groups, and gradient
// clipping by global norm. Each step is one fused kernel per parameter (core/kernels.h:
// sgd_step, adam_step) on the CPU and on CUDA, with no host synchronization.
// Parameter groups carry their own lr and weight decay (e.g. no decay for biases and norms).
// Not here: learning-rate schedules (nn/schedule.h), checkpoint files (nn/checkpoint.h).
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "nn/module.h"

namespace linea::nn {

struct ParamGroup {
  std::vector<Tensor> params;
  double lr = 1e-3;
  double weight_decay = 0.0;
};

class Optimizer {
 public:
  explicit Optimizer(std::vector<ParamGroup> groups);
  virtual ~Optimizer() = default;
  // Applies one update to every parameter that has a gradient (others are skipped).
  virtual void step() = 0;
  // The training loop's update, gated on the device: `guard` is raw::grad_norm_guard's
  // {norm, coef, ok} (core/ops_optim.h) on the parameters' device. When ok, one step with the
  // gradients times coef (clipping); when not, nothing changes and the step is not counted.
  // Checks the guard, then calls guarded_step().
  void step_guarded(const Tensor& guard);
  // Copies what the next step reads from the host to the parameters' device (Adam: each
  // group's learning rate and weight decay, when they changed), so that a step captured in a
  // CUDA graph replays with the current values: call it before each replay, outside the graph.
  // step() and step_guarded() call it themselves. Default: nothing to copy.
  virtual void prepare_step() {}
  void zero_grad();
  std::vector<ParamGroup>& param_groups() { return groups_; }
  const std::vector<ParamGroup>& param_groups() const { return groups_; }
  // Sets the learning rate of every group, scaled by each group's lr_scale (schedules call this).
  void set_lr(double lr);
  // Steps applied so far (a guarded step that was skipped does not count). Adam keeps the
  // count on the parameters' device, so there this reads it back (a synchronization on CUDA).
  virtual int64_t steps() const { return step_; }

  // Optimizer state for checkpoints, keyed "<group>.<index>.<name>" (e.g. "0.3.exp_avg"), plus
  // "step" as a 0-d Int64 tensor. load_state_dict restores it exactly (shapes checked).
  virtual StateDict state_dict() const = 0;
  virtual void load_state_dict(const StateDict& state) = 0;

 protected:
  // step_guarded's update, with a checked guard. Adam and AdamW do it in fused kernels without
  // a host synchronization; the default reads the guard on the host first (one synchronization
  // on CUDA), then clips and calls step().
  virtual void guarded_step(const Tensor& guard);

  std::vector<ParamGroup> groups_;
  std::vector<double> lr_scale_;  // each group's lr relative to group 0's at construction
  int64_t step_ = 0;
};

// Groups a module's parameters for weight decay the usual way: decay for weights of dim >= 2,
// none for biases, norm weights and other 1-d parameters (and embeddings when asked).
std::vector<ParamGroup> decay_groups(const Module& m, double lr, double weight_decay);

}  // namespace linea::nn

// ---- optimizers, clipping (below the lead's declarations; nn/optim.cpp) ----------------------
namespace linea::nn {

// Groups like decay_groups(m, lr, weight_decay), and also puts every parameter whose dotted name
// contains one of `no_decay_substrings` (e.g. {"embed"} for embeddings) into the no-decay group.
// Always returns two groups, [0] = with decay, [1] = without (either may be empty).
std::vector<ParamGroup> decay_groups(const Module& m, double lr, double weight_decay,
                                     const std::vector<std::string>& no_decay_substrings);

// Stochastic gradient descent with optional momentum (PyTorch semantics; weight decay, as L2
// added to the gradient, comes from each group):
//   g = grad + wd * p;  buf = (first step ? g : momentum * buf + (1 - dampening) * g)
//   p -= lr * (nesterov ? g + momentum * buf : buf)       (p -= lr * g without momentum)
// State: "<group>.<index>.momentum_buffer" (only with momentum != 0).
class SGD : public Optimizer {
 public:
  explicit SGD(std::vector<ParamGroup> groups, double momentum = 0.0, double dampening = 0.0, bool nesterov = false);
  void step() override;
  StateDict state_dict() const override;
  void load_state_dict(const StateDict& state) override;
  double momentum() const { return momentum_; }
  double dampening() const { return dampening_; }
  bool nesterov() const { return nesterov_; }

 private:
  double momentum_, dampening_;
  bool nesterov_;
  std::vector<std::vector<Tensor>> buf_;  // [group][index], undefined until the parameter's first step
};

// Adam (Kingma & Ba) with bias correction; weight decay from each group is L2, added to the
// gradient (g = grad + wd * p). AdamW (below) decouples it. Every parameter with a gradient is
// updated by one multi-tensor kernel (raw::adam_multi_step: one launch on CUDA for up to 256
// tensors) when they share one device and dtype. With t = the step count after this update
// (steps() + 1, shared by all parameters):
//   m = b1 * m + (1 - b1) * g;  v = b2 * v + (1 - b2) * g^2
//   p -= lr * (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps)
// State: "<group>.<index>.exp_avg" and ".exp_avg_sq", zeros allocated at the parameter's
// first update. A parameter that first receives a gradient at a later step starts from zero
// moments with the shared step count (the usual case, every parameter updated every step, is
// exactly PyTorch's).
class Adam : public Optimizer {
 public:
  explicit Adam(std::vector<ParamGroup> groups, double beta1 = 0.9, double beta2 = 0.999, double eps = 1e-8);
  void step() override;
  void prepare_step() override;
  int64_t steps() const override;
  StateDict state_dict() const override;
  void load_state_dict(const StateDict& state) override;
  double beta1() const { return beta1_; }
  double beta2() const { return beta2_; }
  double eps() const { return eps_; }
  bool decoupled() const { return decoupled_; }

 protected:
  Adam(std::vector<ParamGroup> groups, double beta1, double beta2, double eps, bool decoupled);
  void guarded_step(const Tensor& guard) override { multi_step(guard); }

 private:
  double beta1_, beta2_, eps_;
  bool decoupled_;
  std::vector<std::vector<Tensor>> m_, v_;  // [group][index]
  // On the parameters' device: the step count (int64 [1]; step_ holds it until first used) and
  // each group's (lr, weight decay) (float64 [G, 2], uploaded before every step), which the
  // multi-tensor kernel reads, so that a captured step replays with the current values.
  Tensor count_, hyper_;
  std::vector<double> hyper_host_;  // what hyper_ holds
  void multi_step(const Tensor& guard);
};

// AdamW (Loshchilov & Hutter): Adam with decoupled weight decay, p *= 1 - lr * wd before the
// Adam update (the gradient itself is not changed). The decay rate comes from each group.
class AdamW : public Adam {
 public:
  explicit AdamW(std::vector<ParamGroup> groups, double beta1 = 0.9, double beta2 = 0.999, double eps = 1e-8)
      : Adam(std::move(groups), beta1, beta2, eps, /*decoupled=*/true) {}
};

// Scales the gradients of `params` in place so that their global L2 norm is at most max_norm:
//   norm = sqrt(sum over params of sum(grad^2));  coef = min(1, max_norm / (norm + 1e-6))
// and returns norm (before clipping) as a 0-d tensor on the gradients' device, in the first
// gradient's dtype. Computed and applied on the device without a host synchronization (read it
// with .item() only when you need it). Parameters without a gradient are skipped; all gradients
// must be on one device. A non-finite norm makes every gradient non-finite (as PyTorch's default).
Tensor clip_grad_norm_(const std::vector<Tensor>& params, double max_norm);
// The same total norm without clipping (0-d, on the gradients' device; 0 when no gradient).
Tensor grad_norm(const std::vector<Tensor>& params);

// A training step's guard, for Optimizer::step_guarded: raw::grad_norm_guard over the
// parameters' gradients (those without one are skipped; other dtypes converted to the first
// one's) and `loss`: {norm, coef, ok} on the loss's device, with coef the clipping coefficient
// at max_norm (no clipping when max_norm <= 0). No host synchronization; on CUDA two launches.
Tensor step_guard(const std::vector<Tensor>& params, const Tensor& loss, double max_norm);

}  // namespace linea::nn
