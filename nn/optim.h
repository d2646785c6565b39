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
  void zero_grad();
  std::vector<ParamGroup>& param_groups() { return groups_; }
  const std::vector<ParamGroup>& param_groups() const { return groups_; }
  // Sets the learning rate of every group, scaled by each group's lr_scale (schedules call this).
  void set_lr(double lr);
  int64_t steps() const { return step_; }  // completed step() calls

  // Optimizer state for checkpoints, keyed "<group>.<index>.<name>" (e.g. "0.3.exp_avg"), plus
  // "step" as a 0-d Int64 tensor. load_state_dict restores it exactly (shapes checked).
  virtual StateDict state_dict() const = 0;
  virtual void load_state_dict(const StateDict& state) = 0;

 protected:
  std::vector<ParamGroup> groups_;
  std::vector<double> lr_scale_;  // each group's lr relative to group 0's at construction
  int64_t step_ = 0;
};

// Groups a module's parameters for weight decay the usual way: decay for weights of dim >= 2,
// none for biases, norm weights and other 1-d parameters (and embeddings when asked).
std::vector<ParamGroup> decay_groups(const Module& m, double lr, double weight_decay);

}  // namespace linea::nn
