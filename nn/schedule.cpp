// Learning-rate schedules (formulas in nn/schedule.h): argument checks, lr_at, names, and the
// run-time selection by kind. Not here: optimizers (nn/optim.cpp).
#include "nn/schedule.h"

#include <cmath>
#include <sstream>

namespace linea::nn {

namespace {

constexpr double kPi = 3.14159265358979323846;

void check_lr(const char* sched, const char* what, double lr) {
  LINEA_CHECK(std::isfinite(lr) && lr >= 0.0, sched, ": ", what, " must be finite and >= 0, got ", lr);
}

void check_step(const char* sched, int64_t step) {
  LINEA_CHECK(step >= 0, sched, "::lr_at: step must be >= 0, got ", step);
}

// lr of the linear warmup at step s < warmup: base * (s + 1) / warmup.
double warmup_lr(double base, int64_t s, int64_t warmup) {
  return base * static_cast<double>(s + 1) / static_cast<double>(warmup);
}

}  // namespace

// ---- ConstantLR ----------------------------------------------------------------------------------
ConstantLR::ConstantLR(double lr_) : lr(lr_) { check_lr("ConstantLR", "lr", lr); }

double ConstantLR::lr_at(int64_t step) const {
  check_step("ConstantLR", step);
  return lr;
}

std::string ConstantLR::name() const {
  std::ostringstream os;
  os << "constant(lr=" << lr << ")";
  return os.str();
}

// ---- WarmupCosine ----------------------------------------------------------------------------------
WarmupCosine::WarmupCosine(double base_lr_, int64_t warmup_steps_, int64_t total_steps_, double min_lr_)
    : base_lr(base_lr_), warmup_steps(warmup_steps_), total_steps(total_steps_), min_lr(min_lr_) {
  check_lr("WarmupCosine", "base_lr", base_lr);
  check_lr("WarmupCosine", "min_lr", min_lr);
  LINEA_CHECK(min_lr <= base_lr, "WarmupCosine: min_lr (", min_lr, ") must not exceed base_lr (", base_lr, ")");
  LINEA_CHECK(warmup_steps >= 0, "WarmupCosine: warmup_steps must be >= 0, got ", warmup_steps);
  LINEA_CHECK(total_steps > 0 && total_steps >= warmup_steps,
              "WarmupCosine: total_steps must be > 0 and >= ", "warmup_steps (", warmup_steps, "), got ", total_steps);
}

double WarmupCosine::lr_at(int64_t step) const {
  check_step("WarmupCosine", step);
  if (step < warmup_steps) return warmup_lr(base_lr, step, warmup_steps);
  if (step >= total_steps) return min_lr;
  const double progress = static_cast<double>(step - warmup_steps) / static_cast<double>(total_steps - warmup_steps);
  return min_lr + (base_lr - min_lr) * 0.5 * (1.0 + std::cos(kPi * progress));
}

std::string WarmupCosine::name() const {
  std::ostringstream os;
  os << "warmup_cosine(base_lr=" << base_lr << ", warmup=" << warmup_steps << ", total=" << total_steps
     << ", min_lr=" << min_lr << ")";
  return os.str();
}

// ---- InverseSqrt -----------------------------------------------------------------------------------
InverseSqrt::InverseSqrt(double base_lr_, int64_t warmup_steps_) : base_lr(base_lr_), warmup_steps(warmup_steps_) {
  check_lr("InverseSqrt", "base_lr", base_lr);
  LINEA_CHECK(warmup_steps >= 0, "InverseSqrt: warmup_steps must be >= 0, got ", warmup_steps);
}

double InverseSqrt::lr_at(int64_t step) const {
  check_step("InverseSqrt", step);
  if (step < warmup_steps) return warmup_lr(base_lr, step, warmup_steps);
  const double w = static_cast<double>(warmup_steps > 0 ? warmup_steps : 1);
  return base_lr * std::sqrt(w / static_cast<double>(step + 1));
}

std::string InverseSqrt::name() const {
  std::ostringstream os;
  os << "inverse_sqrt(base_lr=" << base_lr << ", warmup=" << warmup_steps << ")";
  return os.str();
}

// ---- any schedule ----------------------------------------------------------------------------------
double lr_at(const Schedule& s, int64_t step) {
  return std::visit([step](const auto& x) { return x.lr_at(step); }, s);
}

std::string schedule_name(const Schedule& s) {
  return std::visit([](const auto& x) { return x.name(); }, s);
}

Schedule make_schedule(const std::string& kind, double base_lr, int64_t warmup_steps, int64_t total_steps,
                       double min_lr) {
  if (kind == "constant") return ConstantLR(base_lr);
  if (kind == "cosine") return WarmupCosine(base_lr, warmup_steps, total_steps, min_lr);
  if (kind == "inverse_sqrt") return InverseSqrt(base_lr, warmup_steps);
  LINEA_FAIL("make_schedule: unknown schedule '", kind, "' (known: constant, cosine, inverse_sqrt)");
}

double apply_schedule(Optimizer& opt, const Schedule& s, int64_t step) {
  const double lr = lr_at(s, step);
  opt.set_lr(lr);
  return lr;
}

}  // namespace linea::nn
