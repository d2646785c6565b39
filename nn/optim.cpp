// Optimizers over parameter groups (SGD, Adam, AdamW), their state dicts, weight-decay
// grouping and gradient clipping by global norm. Each parameter's update is one fused kernel
// (linea::raw::sgd_step / adam_step, core/ops_optim.h); all optimizer math runs under
// NoGradGuard and never reads a device value back to the host.
// Not here: the update kernels (core/cpu/optim.cpp, cuda/optim.cu), learning-rate schedules
// (nn/schedule.cpp), checkpoint files.
#include "nn/optim.h"

#include <cmath>
#include <set>
#include <sstream>

#include "autograd/autograd.h"
#include "core/allocator.h"
#include "core/ops.h"
#include "core/ops_optim.h"

namespace linea::nn {

namespace {

// Per-parameter state of one kind ("exp_avg", ...): [group][index], undefined until allocated.
using SlotTable = std::vector<std::vector<Tensor>>;

// Keeps the table's geometry in step with the groups (a user may add parameters to a group
// through param_groups()).
void fit(SlotTable& table, const std::vector<ParamGroup>& groups) {
  table.resize(groups.size());
  for (size_t g = 0; g < groups.size(); ++g) table[g].resize(groups[g].params.size());
}

std::string state_key(size_t group, size_t index, const char* name) {
  return std::to_string(group) + "." + std::to_string(index) + "." + name;
}

// The state slot of parameter p: allocated as zeros on p's device at its first update (then
// *fresh is set), moved along when the parameter moved (Module::to) since the state was made.
Tensor& slot_for(Tensor& slot, const Tensor& p, bool* fresh) {
  LongLivedAllocations long_lived;  // state outlives the step that creates it (core/allocator.h)
  if (!slot.defined()) {
    slot = zeros(p.shape(), TensorOptions(p.dtype(), p.device()));
    if (fresh) *fresh = true;
  } else if (slot.device() != p.device() || slot.dtype() != p.dtype()) {
    slot = slot.to(p.device()).to(p.dtype()).contiguous();
  }
  return slot;
}

struct NamedTable {
  const char* name;
  SlotTable* table;
};
struct ConstNamedTable {
  const char* name;
  const SlotTable* table;
};

// A snapshot (copies) of every allocated state tensor, plus "step".
StateDict export_state(const std::vector<ParamGroup>& groups, const std::vector<ConstNamedTable>& tables,
                       int64_t step) {
  StateDict out;
  for (const ConstNamedTable& nt : tables) {
    for (size_t g = 0; g < nt.table->size() && g < groups.size(); ++g) {
      for (size_t i = 0; i < (*nt.table)[g].size(); ++i) {
        const Tensor& t = (*nt.table)[g][i];
        if (t.defined()) out[state_key(g, i, nt.name)] = clone(t);
      }
    }
  }
  out["step"] = scalar_tensor(static_cast<double>(step), TensorOptions(DType::Int64));
  return out;
}

// Checks `state` against the parameters and the optimizer's state names (every key known, each
// parameter's state complete or absent, shapes equal, "step" a non-negative integer), then
// replaces the tables with copies on each parameter's device and dtype. Nothing changes when a
// check fails; the error lists every offending key.
void import_state(const char* opt, const std::vector<ParamGroup>& groups, const std::vector<NamedTable>& tables,
                  const StateDict& state, int64_t* step) {
  std::vector<std::string> missing, unexpected, misshaped, bad;
  std::set<std::string> known = {"step"};
  for (size_t g = 0; g < groups.size(); ++g) {
    for (size_t i = 0; i < groups[g].params.size(); ++i) {
      const Tensor& p = groups[g].params[i];
      std::vector<std::string> absent;
      for (const NamedTable& nt : tables) {
        const std::string key = state_key(g, i, nt.name);
        known.insert(key);
        auto it = state.find(key);
        if (it == state.end()) {
          absent.push_back(key);
        } else if (!it->second.defined() || it->second.shape() != p.shape()) {
          misshaped.push_back(key + " (expected " + shape_str(p.shape()) + ", got " +
                              (it->second.defined() ? shape_str(it->second.shape()) : "undefined") + ")");
        } else if (!is_floating(it->second.dtype())) {
          bad.push_back(key + " has dtype " + dtype_name(it->second.dtype()));
        }
      }
      // A parameter's state is all there (it was updated) or not at all (it never had a gradient).
      if (!absent.empty() && absent.size() < tables.size()) missing.insert(missing.end(), absent.begin(), absent.end());
    }
  }
  for (auto& [k, _] : state)
    if (!known.count(k)) unexpected.push_back(k);
  auto st = state.find("step");
  int64_t new_step = 0;
  if (st == state.end()) {
    missing.push_back("step");
  } else if (!st->second.defined() || st->second.dtype() != DType::Int64 || st->second.numel() != 1) {
    bad.push_back("step must be a one-element int64 tensor");
  } else {
    new_step = st->second.item<int64_t>();
    // At most 2^53: no run gets there, and the bias corrections take the count as a double.
    if (new_step < 0 || new_step > (int64_t{1} << 53))
      bad.push_back("step is " + std::to_string(new_step) + " (expected 0 to 2^53)");
  }
  if (!missing.empty() || !unexpected.empty() || !misshaped.empty() || !bad.empty()) {
    std::ostringstream os;
    os << opt << "::load_state_dict:";
    if (!missing.empty()) os << " missing keys: " << join(missing) << ";";
    if (!unexpected.empty()) os << " unexpected keys: " << join(unexpected) << ";";
    if (!misshaped.empty()) os << " shape mismatch: " << join(misshaped) << ";";
    if (!bad.empty()) os << " bad values: " << join(bad) << ";";
    throw Error(os.str());
  }
  for (const NamedTable& nt : tables) {
    SlotTable fresh(groups.size());
    for (size_t g = 0; g < groups.size(); ++g) {
      fresh[g].resize(groups[g].params.size());
      for (size_t i = 0; i < groups[g].params.size(); ++i) {
        auto it = state.find(state_key(g, i, nt.name));
        if (it == state.end()) continue;
        const Tensor& p = groups[g].params[i];
        fresh[g][i] = clone(it->second.to(p.device()).to(p.dtype()));
      }
    }
    *nt.table = std::move(fresh);
  }
  *step = new_step;
}

void check_hyper(bool ok, const char* opt, const char* what, double value) {
  LINEA_CHECK(ok, opt, ": ", what, ", got ", value);
}

}  // namespace

// ---- Optimizer ---------------------------------------------------------------------------------
Optimizer::Optimizer(std::vector<ParamGroup> groups) : groups_(std::move(groups)) {
  LINEA_CHECK(!groups_.empty(), "Optimizer: no parameter groups given (pass at least one group of parameters)");
  std::set<const TensorImpl*> seen;
  size_t total = 0;
  for (size_t g = 0; g < groups_.size(); ++g) {
    const ParamGroup& pg = groups_[g];
    LINEA_CHECK(std::isfinite(pg.lr) && pg.lr >= 0.0, "Optimizer: group ", g, " has lr ", pg.lr,
                " (must be finite and >= 0)");
    LINEA_CHECK(std::isfinite(pg.weight_decay) && pg.weight_decay >= 0.0, "Optimizer: group ", g, " has weight_decay ",
                pg.weight_decay, " (must be finite and >= 0)");
    for (size_t i = 0; i < pg.params.size(); ++i) {
      const Tensor& p = pg.params[i];
      LINEA_CHECK(p.defined(), "Optimizer: parameter ", i, " of group ", g, " is undefined");
      LINEA_CHECK(is_floating(p.dtype()), "Optimizer: parameter ", i, " of group ", g, " (shape ", shape_str(p.shape()),
                  ") has dtype ", dtype_name(p.dtype()), "; only float32/float64 can be trained");
      LINEA_CHECK(p.is_leaf(), "Optimizer: parameter ", i, " of group ", g, " (shape ", shape_str(p.shape()),
                  ") is not a leaf tensor (it is the output of ", p.grad_fn_name(), "); optimize leaves only");
      LINEA_CHECK(seen.insert(&p.impl()).second, "Optimizer: parameter ", i, " of group ", g, " (shape ",
                  shape_str(p.shape()), ") appears more than once in the groups");
      ++total;
    }
  }
  LINEA_CHECK(total > 0, "Optimizer: the ", groups_.size(), " parameter group(s) hold no parameters");
  const double base = groups_[0].lr;
  for (const ParamGroup& pg : groups_) lr_scale_.push_back(base > 0.0 ? pg.lr / base : 1.0);
}

void Optimizer::zero_grad() {
  for (ParamGroup& pg : groups_)
    for (Tensor& p : pg.params) p.zero_grad();
}

void Optimizer::step_guarded(const Tensor& guard) {
  raw::check_defined("Optimizer::step_guarded", guard, "guard");
  LINEA_CHECK(guard.numel() == 3, "Optimizer::step_guarded: expected raw::grad_norm_guard's {norm, coef, ok}, got ",
              guard.numel(), " values");
  guarded_step(guard);
}

void Optimizer::guarded_step(const Tensor& guard) {
  const std::vector<double> g = guard.to(kCPU).to_vector<double>();
  if (g[2] == 0.0) return;
  if (g[1] != 1.0) {
    NoGradGuard no_grad;
    for (ParamGroup& pg : groups_)
      for (Tensor& p : pg.params) {
        Tensor grad = p.grad();
        if (grad.defined()) grad *= g[1];
      }
  }
  step();
}

void Optimizer::set_lr(double lr) {
  LINEA_CHECK(std::isfinite(lr) && lr >= 0.0, "Optimizer::set_lr: lr must be finite and >= 0, got ", lr);
  for (size_t g = 0; g < groups_.size(); ++g) groups_[g].lr = lr * (g < lr_scale_.size() ? lr_scale_[g] : 1.0);
}

// ---- decay groups ------------------------------------------------------------------------------
std::vector<ParamGroup> decay_groups(const Module& m, double lr, double weight_decay,
                                     const std::vector<std::string>& no_decay_substrings) {
  ParamGroup decay, no_decay;
  decay.lr = no_decay.lr = lr;
  decay.weight_decay = weight_decay;
  no_decay.weight_decay = 0.0;
  for (auto& [name, p] : m.named_parameters()) {
    bool excluded = p.dim() < 2;
    for (const std::string& s : no_decay_substrings) excluded = excluded || name.find(s) != std::string::npos;
    (excluded ? no_decay : decay).params.push_back(p);
  }
  return {decay, no_decay};
}

std::vector<ParamGroup> decay_groups(const Module& m, double lr, double weight_decay) {
  return decay_groups(m, lr, weight_decay, {});
}

// ---- SGD ---------------------------------------------------------------------------------------
SGD::SGD(std::vector<ParamGroup> groups, double momentum, double dampening, bool nesterov)
    : Optimizer(std::move(groups)), momentum_(momentum), dampening_(dampening), nesterov_(nesterov) {
  check_hyper(std::isfinite(momentum) && momentum >= 0.0, "SGD", "momentum must be finite and >= 0", momentum);
  check_hyper(dampening >= 0.0 && dampening <= 1.0, "SGD", "dampening must be in [0, 1]", dampening);
  LINEA_CHECK(!nesterov || (momentum > 0.0 && dampening == 0.0),
              "SGD: Nesterov momentum needs momentum > 0 and dampening == 0, got momentum ", momentum, ", dampening ",
              dampening);
  fit(buf_, groups_);
}

void SGD::step() {
  NoGradGuard no_grad;
  fit(buf_, groups_);
  for (size_t g = 0; g < groups_.size(); ++g) {
    const ParamGroup& pg = groups_[g];
    for (size_t i = 0; i < pg.params.size(); ++i) {
      const Tensor& p = pg.params[i];
      Tensor grad = p.grad();
      if (!grad.defined()) continue;
      bool first = false;
      Tensor buf = momentum_ != 0.0 ? slot_for(buf_[g][i], p, &first) : Tensor();
      raw::sgd_step(p, grad, buf, pg.lr, momentum_, dampening_, pg.weight_decay, nesterov_, first);
    }
  }
  ++step_;
}

StateDict SGD::state_dict() const {
  std::vector<ConstNamedTable> tables;
  if (momentum_ != 0.0) tables.push_back({"momentum_buffer", &buf_});
  return export_state(groups_, tables, step_);
}

void SGD::load_state_dict(const StateDict& state) {
  std::vector<NamedTable> tables;
  if (momentum_ != 0.0) tables.push_back({"momentum_buffer", &buf_});
  import_state("SGD", groups_, tables, state, &step_);
  fit(buf_, groups_);
}

// ---- Adam / AdamW ------------------------------------------------------------------------------
Adam::Adam(std::vector<ParamGroup> groups, double beta1, double beta2, double eps)
    : Adam(std::move(groups), beta1, beta2, eps, false) {}

Adam::Adam(std::vector<ParamGroup> groups, double beta1, double beta2, double eps, bool decoupled)
    : Optimizer(std::move(groups)), beta1_(beta1), beta2_(beta2), eps_(eps), decoupled_(decoupled) {
  const char* name = decoupled ? "AdamW" : "Adam";
  check_hyper(beta1 >= 0.0 && beta1 < 1.0, name, "beta1 must be in [0, 1)", beta1);
  check_hyper(beta2 >= 0.0 && beta2 < 1.0, name, "beta2 must be in [0, 1)", beta2);
  check_hyper(std::isfinite(eps) && eps >= 0.0, name, "eps must be finite and >= 0", eps);
  fit(m_, groups_);
  fit(v_, groups_);
}

void Adam::step() { multi_step(Tensor()); }

void Adam::multi_step(const Tensor& guard) {
  NoGradGuard no_grad;
  fit(m_, groups_);
  fit(v_, groups_);
  std::vector<Tensor> ps, gs, ms, vs;
  std::vector<int> group;
  bool one_kind = true;  // one device and one dtype: the multi-tensor kernel applies
  for (size_t g = 0; g < groups_.size(); ++g) {
    const ParamGroup& pg = groups_[g];
    for (size_t i = 0; i < pg.params.size(); ++i) {
      const Tensor& p = pg.params[i];
      Tensor grad = p.grad();
      if (!grad.defined()) continue;
      ms.push_back(slot_for(m_[g][i], p, nullptr));
      vs.push_back(slot_for(v_[g][i], p, nullptr));
      one_kind =
          one_kind && p.is_contiguous() && (ps.empty() || (p.device() == ps[0].device() && p.dtype() == ps[0].dtype()));
      ps.push_back(p);
      gs.push_back(grad);
      group.push_back(static_cast<int>(g));
    }
  }
  if (!one_kind) {
    // Parameters on several devices or of several dtypes: one kernel each, the step count and
    // the guard on the host.
    double coef = 1.0;
    if (guard.defined()) {
      const std::vector<double> gv = guard.to(kCPU).to_vector<double>();
      if (gv[2] == 0.0) return;
      coef = gv[1];
    }
    const int64_t t = steps() + 1;
    for (size_t k = 0; k < ps.size(); ++k) {
      const ParamGroup& pg = groups_[static_cast<size_t>(group[k])];
      Tensor g = coef == 1.0 ? gs[k] : gs[k] * coef;
      raw::adam_step(ps[k], g, ms[k], vs[k], pg.lr, beta1_, beta2_, eps_, pg.weight_decay, decoupled_, t);
    }
    step_ = t;
    count_ = Tensor();
    return;
  }
  prepare_step();
  raw::adam_multi_step(ps, gs, ms, vs, group, hyper_, count_, guard, beta1_, beta2_, eps_, decoupled_);
}

void Adam::prepare_step() {
  NoGradGuard no_grad;
  Device dev = kCPU;
  for (const ParamGroup& pg : groups_)
    if (!pg.params.empty()) {
      dev = pg.params[0].device();
      break;
    }
  if (!count_.defined() || count_.device() != dev) {
    // From step_ (after construction or a load) or from where the parameters were before.
    const int64_t n = count_.defined() ? count_.to(kCPU).item<int64_t>() : step_;
    LongLivedAllocations long_lived;  // lasts as long as the optimizer
    count_ = from_vector<int64_t>({n}, {1}).to(dev);
  }
  std::vector<double> h;
  for (const ParamGroup& pg : groups_) h.insert(h.end(), {pg.lr, pg.weight_decay});
  if (hyper_.defined() && hyper_.device() == dev && h == hyper_host_) return;  // unchanged: no copy
  const Tensor host = from_vector<double>(h, {static_cast<int64_t>(groups_.size()), 2});
  if (!hyper_.defined() || hyper_.device() != dev || hyper_.shape() != host.shape()) {
    LongLivedAllocations long_lived;
    hyper_ = host.to(dev);
  } else {
    hyper_.copy_(host);  // in place: the kernel reads it at the same address every step
  }
  hyper_host_ = h;
}

int64_t Adam::steps() const { return count_.defined() ? count_.item<int64_t>() : step_; }

StateDict Adam::state_dict() const { return export_state(groups_, {{"exp_avg", &m_}, {"exp_avg_sq", &v_}}, steps()); }

void Adam::load_state_dict(const StateDict& state) {
  import_state(decoupled_ ? "AdamW" : "Adam", groups_, {{"exp_avg", &m_}, {"exp_avg_sq", &v_}}, state, &step_);
  if (count_.defined()) {  // in place: a captured step reads it where it is
    count_.copy_(from_vector<int64_t>({step_}, {1}));
  }
}

// ---- clipping ----------------------------------------------------------------------------------
namespace {
// The parameters' defined gradients, checked to share one device; `who` names the caller.
std::vector<Tensor> gradients_of(const std::vector<Tensor>& params, const char* who) {
  std::vector<Tensor> grads;
  for (size_t i = 0; i < params.size(); ++i) {
    LINEA_CHECK(params[i].defined(), who, ": parameter ", i, " is undefined");
    Tensor g = params[i].grad();
    if (!g.defined()) continue;
    LINEA_CHECK(grads.empty() || g.device() == grads[0].device(), who, ": gradients on different devices (",
                grads.empty() ? "" : grads[0].device().str(), " and ", g.device().str(), " for parameter ", i,
                ", shape ", shape_str(g.shape()), ")");
    grads.push_back(g);
  }
  return grads;
}

// sqrt(sum of squares) over grads, in the first one's dtype.
Tensor total_norm(const std::vector<Tensor>& grads) {
  NoGradGuard no_grad;
  const DType dt = grads[0].dtype();
  Tensor total;  // [] sum of squares
  for (const Tensor& g : grads) {
    Tensor sq = sum(g * g);
    if (sq.dtype() != dt) sq = sq.to(dt);
    total = total.defined() ? total + sq : sq;
  }
  return sqrt(total);
}

Tensor zero_norm(const std::vector<Tensor>& params) {
  return scalar_tensor(0.0, params.empty() ? TensorOptions() : TensorOptions(params[0].dtype(), params[0].device()));
}
}  // namespace

Tensor grad_norm(const std::vector<Tensor>& params) {
  const std::vector<Tensor> grads = gradients_of(params, "grad_norm");
  return grads.empty() ? zero_norm(params) : total_norm(grads);
}

Tensor clip_grad_norm_(const std::vector<Tensor>& params, double max_norm) {
  LINEA_CHECK(std::isfinite(max_norm) && max_norm > 0.0, "clip_grad_norm_: max_norm must be finite and > 0, got ",
              max_norm);
  const std::vector<Tensor> grads = gradients_of(params, "clip_grad_norm_");
  if (grads.empty()) return zero_norm(params);
  NoGradGuard no_grad;
  const DType dt = grads[0].dtype();
  const Device dev = grads[0].device();
  Tensor norm = total_norm(grads);
  Tensor coef = clamp(scalar_tensor(max_norm, TensorOptions(dt, dev)) / (norm + 1e-6), -INFINITY, 1.0);
  Tensor coef_other;  // coef in the other floating dtype, made when needed
  for (const Tensor& g : grads) {
    if (g.dtype() == dt) {
      g *= coef;
    } else {
      if (!coef_other.defined()) coef_other = coef.to(g.dtype());
      g *= coef_other;
    }
  }
  return norm;
}

Tensor step_guard(const std::vector<Tensor>& params, const Tensor& loss, double max_norm) {
  std::vector<Tensor> grads = gradients_of(params, "step_guard");
  NoGradGuard no_grad;
  for (Tensor& g : grads)
    if (g.dtype() != grads[0].dtype()) g = g.to(grads[0].dtype());
  return raw::grad_norm_guard(grads, loss, max_norm);
}

}  // namespace linea::nn
