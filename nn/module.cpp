// Module registry, state dicts and printing.
#include "nn/module.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <set>
#include <sstream>

#include "autograd/autograd.h"

namespace linea::nn {

namespace {
void check_name(const std::string& owner, const std::string& name) {
  LINEA_CHECK(!name.empty() && name.find('.') == std::string::npos, owner, ": invalid name '", name,
              "' (must be non-empty and contain no '.')");
}
}  // namespace

void replace_data(const Tensor& dst, const Tensor& src) {
  TensorImpl& d = dst.impl();
  const TensorImpl& s = src.impl();
  d.storage = s.storage;
  d.shape = s.shape;
  d.strides = s.strides;
  d.offset = s.offset;
  d.dtype = s.dtype;
  if (d.autograd) d.autograd->grad = Tensor();
}

void pack_together(const std::vector<Tensor>& tensors) {
  LINEA_CHECK(!tensors.empty(), "pack_together: no tensors");
  NoGradGuard ng;
  int64_t n = 0;
  for (const Tensor& t : tensors) {
    raw::check_defined("pack_together", t, "tensor");
    LINEA_CHECK(t.dtype() == tensors[0].dtype() && t.device() == tensors[0].device(), "pack_together: tensors of ",
                dtype_name(tensors[0].dtype()), " on ", tensors[0].device().str(), " and of ", dtype_name(t.dtype()),
                " on ", t.device().str());
    n += t.numel();
  }
  const Tensor buffer = empty({n}, tensors[0].options());
  int64_t at = 0;
  for (const Tensor& t : tensors) {
    const Tensor piece = raw::view(raw::narrow(buffer, 0, at, t.numel()), t.shape());
    raw::copy_(piece, t);
    replace_data(t, piece);
    at += t.numel();
  }
}

namespace {
// Replaces each tensor's data by fn(data), once per storage where distinct tensors share one
// (packed, or views of one another): fn converts the whole storage, and each tensor is rebound
// to its place in the result, so they still share one.
void convert_all(const std::vector<Tensor>& tensors, const std::function<Tensor(const Tensor&)>& fn) {
  std::map<const Storage*, std::vector<Tensor>> by_storage;
  std::vector<const Storage*> order;  // first-seen order: conversions run in a fixed order
  std::set<const TensorImpl*> seen;
  for (const Tensor& t : tensors) {
    if (!seen.insert(&t.impl()).second) continue;  // one tensor registered twice (tied)
    const Storage* s = t.impl().storage.get();
    if (by_storage[s].empty()) order.push_back(s);
    by_storage[s].push_back(t);
  }
  for (const Storage* s : order) {
    const std::vector<Tensor>& group = by_storage[s];
    const bool one_dtype =
        std::all_of(group.begin(), group.end(), [&](const Tensor& t) { return t.dtype() == group[0].dtype(); });
    if (group.size() == 1 || !one_dtype) {
      for (const Tensor& t : group) replace_data(t, fn(t));
      continue;
    }
    const int64_t elements = static_cast<int64_t>(s->nbytes / dtype_size(group[0].dtype()));
    const Tensor whole = fn(as_strided(group[0], {elements}, {1}, 0));
    for (const Tensor& t : group) replace_data(t, as_strided(whole, t.shape(), t.strides(), t.offset()));
  }
}
}  // namespace

void Module::tensors_into(std::vector<Tensor>& out, bool host_buffers) const {
  for (auto& [_, t] : params_) out.push_back(t);
  for (auto& [n, t] : buffers_)
    if (host_buffers || std::find(host_buffers_.begin(), host_buffers_.end(), n) == host_buffers_.end())
      out.push_back(t);
  for (auto& [_, c] : children_) c->tensors_into(out, host_buffers);
}

Tensor Module::register_parameter(const std::string& name, Tensor t) {
  check_name(type_name_, name);
  LINEA_CHECK(t.defined() && is_floating(t.dtype()), type_name_, ": parameter '", name,
              "' must be a defined floating tensor");
  for (auto& [n, _] : params_) LINEA_CHECK(n != name, type_name_, ": parameter '", name, "' registered twice");
  if (!t.is_leaf()) t = t.detach();
  t.requires_grad_(true);
  params_.emplace_back(name, t);
  return t;
}

Tensor Module::register_buffer(const std::string& name, Tensor t) {
  check_name(type_name_, name);
  LINEA_CHECK(t.defined(), type_name_, ": buffer '", name, "' is undefined");
  for (auto& [n, _] : buffers_) LINEA_CHECK(n != name, type_name_, ": buffer '", name, "' registered twice");
  buffers_.emplace_back(name, t);
  return t;
}

Tensor Module::register_host_buffer(const std::string& name, Tensor t) {
  LINEA_CHECK(t.defined() && t.is_cpu(), type_name_, ": host buffer '", name, "' must be a defined CPU tensor");
  Tensor b = register_buffer(name, std::move(t));
  host_buffers_.push_back(name);
  return b;
}

void Module::add_child(const std::string& name, std::shared_ptr<Module> m) {
  check_name(type_name_, name);
  LINEA_CHECK(m != nullptr, type_name_, ": submodule '", name, "' is null");
  for (auto& [n, _] : children_) LINEA_CHECK(n != name, type_name_, ": submodule '", name, "' registered twice");
  children_.emplace_back(name, std::move(m));
}

void Module::collect(const std::string& prefix, bool params, bool recurse,
                     std::vector<std::pair<std::string, Tensor>>& out) const {
  for (auto& [n, t] : params ? params_ : buffers_) out.emplace_back(prefix + n, t);
  if (!recurse) return;
  for (auto& [n, c] : children_) c->collect(prefix + n + ".", params, true, out);
}

std::vector<std::pair<std::string, Tensor>> Module::named_parameters(bool recurse) const {
  std::vector<std::pair<std::string, Tensor>> out;
  collect("", true, recurse, out);
  return out;
}

std::vector<Tensor> Module::parameters(bool recurse) const {
  std::vector<Tensor> out;
  for (auto& [_, t] : named_parameters(recurse)) out.push_back(t);
  return out;
}

std::vector<std::pair<std::string, Tensor>> Module::named_buffers(bool recurse) const {
  std::vector<std::pair<std::string, Tensor>> out;
  collect("", false, recurse, out);
  return out;
}

std::vector<std::pair<std::string, std::shared_ptr<Module>>> Module::named_modules() {
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> out;
  // Iterative depth-first walk (module trees are shallow, but this keeps it simple to reason about).
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> stack{{"", shared_from_this()}};
  while (!stack.empty()) {
    auto [name, m] = stack.back();
    stack.pop_back();
    out.emplace_back(name, m);
    for (auto it = m->children_.rbegin(); it != m->children_.rend(); ++it)
      stack.emplace_back(name.empty() ? it->first : name + "." + it->first, it->second);
  }
  return out;
}

int64_t Module::num_parameters() const {
  int64_t n = 0;
  for (auto& [_, t] : named_parameters()) n += t.numel();
  return n;
}

void Module::train(bool on) {
  training_ = on;
  for (auto& [_, c] : children_) c->train(on);
}

void Module::to(Device device) {
  NoGradGuard ng;
  std::vector<Tensor> tensors;
  tensors_into(tensors, /*host_buffers=*/false);
  convert_all(tensors, [&](const Tensor& t) { return t.to(device).contiguous(); });
}

void Module::to(DType dtype) {
  LINEA_CHECK(is_floating(dtype), type_name_, ".to: expected a floating dtype, got ", dtype_name(dtype));
  NoGradGuard ng;
  std::vector<Tensor> tensors;
  tensors_into(tensors, /*host_buffers=*/true);
  tensors.erase(std::remove_if(tensors.begin(), tensors.end(), [](const Tensor& t) { return !is_floating(t.dtype()); }),
                tensors.end());
  convert_all(tensors, [&](const Tensor& t) { return t.to(dtype); });
}

void Module::zero_grad() {
  for (auto& [_, t] : named_parameters()) t.zero_grad();
}

StateDict Module::state_dict() const {
  StateDict out;
  for (auto& [n, t] : named_parameters()) out[n] = t.detach();
  for (auto& [n, t] : named_buffers()) out[n] = t.detach();
  return out;
}

void Module::load_state_dict(const StateDict& state, bool strict) {
  StateDict mine;
  for (auto& [n, t] : named_parameters()) mine[n] = t;
  for (auto& [n, t] : named_buffers()) mine[n] = t;
  std::vector<std::string> missing, unexpected, misshaped, mistyped;
  for (auto& [n, t] : mine) {
    auto it = state.find(n);
    if (it == state.end())
      missing.push_back(n);
    else if (!it->second.defined() || it->second.shape() != t.shape())
      misshaped.push_back(n + " (expected " + shape_str(t.shape()) + ", got " +
                          (it->second.defined() ? shape_str(it->second.shape()) : "undefined") + ")");
    else if (is_floating(t.dtype()) != is_floating(it->second.dtype()))
      mistyped.push_back(n + " (expected " + dtype_name(t.dtype()) + ", got " + dtype_name(it->second.dtype()) + ")");
  }
  for (auto& [n, _] : state)
    if (!mine.count(n)) unexpected.push_back(n);
  // Everything is checked before anything is copied: a refused state leaves the module as it was.
  bool bad = !misshaped.empty() || !mistyped.empty() || (strict && (!missing.empty() || !unexpected.empty()));
  if (bad) {
    std::ostringstream os;
    os << "load_state_dict (" << type_name_ << "):";
    if (!missing.empty() && strict) os << " missing keys: " << join(missing) << ";";
    if (!unexpected.empty() && strict) os << " unexpected keys: " << join(unexpected) << ";";
    if (!misshaped.empty()) os << " shape mismatch: " << join(misshaped) << ";";
    if (!mistyped.empty()) os << " dtype mismatch: " << join(mistyped) << ";";
    throw Error(os.str());
  }
  NoGradGuard ng;
  for (auto& [n, t] : mine) {
    auto it = state.find(n);
    if (it == state.end()) continue;
    t.copy_(it->second);
  }
}

void Module::str_into(std::string& out, int indent) const {
  out += type_name_ + "(" + extra_repr();
  if (children_.empty()) {
    out += ")";
    return;
  }
  if (!extra_repr().empty()) out += ",";
  out += "\n";
  for (auto& [n, c] : children_) {
    out += std::string(indent + 2, ' ') + "(" + n + "): ";
    c->str_into(out, indent + 2);
    out += "\n";
  }
  out += std::string(indent, ' ') + ")";
}

std::string Module::str() const {
  std::string s;
  str_into(s, 0);
  return s;
}

std::ostream& operator<<(std::ostream& os, const Module& m) { return os << m.str(); }

void check_finite_weights(const Module& m, const std::string& source) {
  for (const auto& [name, t] : m.state_dict()) {
    if (!is_floating(t.dtype())) continue;
    const std::vector<double> v = t.to(kCPU).to_vector<double>();
    const auto bad = std::count_if(v.begin(), v.end(), [](double x) { return !std::isfinite(x); });
    LINEA_CHECK(bad == 0, source, ": weight '", name, "' holds ", bad, " non-finite values (NaN or Inf) of ", v.size(),
                "; a model with such weights gives meaningless outputs (was it saved by a run that diverged, or is the "
                "file corrupted?)");
  }
}

}  // namespace linea::nn
