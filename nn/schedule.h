// Learning-rate schedules: small value types whose lr_at(step) is a pure function of the step
// (0-based: the lr used by the step()-th update), so a checkpoint only stores the step count and
// resuming recomputes the same learning rates. apply_schedule sets an optimizer's lr for a step
// (groups keep their relative scale, see Optimizer::set_lr).
//
//   ConstantLR(lr):                        lr
//   WarmupCosine(base, W, T, min = 0):     s < W:      base * (s + 1) / W          (linear warmup)
//                                          W <= s < T: min + (base - min) * (1 + cos(pi * (s - W) / (T - W))) / 2
//                                          s >= T:     min
//   InverseSqrt(base, W):                  s < W:      base * (s + 1) / W
//                                          s >= W:     base * sqrt(W / (s + 1))     (W = 0: base / sqrt(s + 1))
// The warmup reaches base at s = W - 1 (and the cosine starts at base at s = W), so no update
// runs with lr 0. Typical use:
//   Schedule sched = WarmupCosine(3e-4, 100, 5000);
//   for (int64_t s = 0; s < 5000; ++s) { apply_schedule(opt, sched, s); ...; opt.step(); }
// Not here: optimizers (nn/optim.h), checkpoint files.
#pragma once

#include <cstdint>
#include <string>
#include <variant>

#include "nn/optim.h"

namespace linea::nn {

struct ConstantLR {
  double lr;
  explicit ConstantLR(double lr);
  double lr_at(int64_t step) const;
  std::string name() const;  // "constant(lr=0.001)"
};

struct WarmupCosine {
  double base_lr;
  int64_t warmup_steps;
  int64_t total_steps;
  double min_lr;
  WarmupCosine(double base_lr, int64_t warmup_steps, int64_t total_steps, double min_lr = 0.0);
  double lr_at(int64_t step) const;
  std::string name() const;  // "warmup_cosine(base_lr=0.001, warmup=100, total=1000, min_lr=0)"
};

struct InverseSqrt {
  double base_lr;
  int64_t warmup_steps;
  InverseSqrt(double base_lr, int64_t warmup_steps);
  double lr_at(int64_t step) const;
  std::string name() const;  // "inverse_sqrt(base_lr=0.001, warmup=100)"
};

// Any of the schedules, for code that picks one at run time (e.g. from a flag).
using Schedule = std::variant<ConstantLR, WarmupCosine, InverseSqrt>;
double lr_at(const Schedule& s, int64_t step);
std::string schedule_name(const Schedule& s);

// Builds a schedule by kind: "constant", "cosine" (WarmupCosine) or "inverse_sqrt"; the
// arguments a kind does not use are ignored. Unknown kinds throw, listing the known ones.
Schedule make_schedule(const std::string& kind, double base_lr, int64_t warmup_steps, int64_t total_steps,
                       double min_lr = 0.0);

// Sets opt's learning rate to s.lr_at(step) (via Optimizer::set_lr) and returns it.
double apply_schedule(Optimizer& opt, const Schedule& s, int64_t step);

}  // namespace linea::nn
