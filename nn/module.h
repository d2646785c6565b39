// Module: the base of every layer and model. Parameters, buffers (non-trained state such as
// running statistics or fixed random features) and submodules are registered by name, which
// gives dotted names ("encoder.layers.0.attn.qkv.weight") to named_parameters(), state_dict()
// and checkpoints. Modules are held by std::shared_ptr; a layer keeps its parameters as Tensor
// members that share their TensorImpl with the registry, so to(device) and load_state_dict()
// update both at once.
// Not here: forward signatures (each layer defines its own forward()), optimizers, file I/O.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "autograd/ops.h"

namespace linea::nn {

using StateDict = std::map<std::string, Tensor>;

class Module : public std::enable_shared_from_this<Module> {
 public:
  explicit Module(std::string type_name) : type_name_(std::move(type_name)) {}
  virtual ~Module() = default;
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  // ---- registration (call from constructors) ------------------------------------------------
  // Registers t as a trainable parameter (requires_grad set) and returns it.
  Tensor register_parameter(const std::string& name, Tensor t);
  // Registers state that is saved and moved with the module but not trained.
  Tensor register_buffer(const std::string& name, Tensor t);
  // A buffer that stays on the CPU whatever device the module moves to (a counter read on the
  // host at every call, which would otherwise cost a device sync); saved like any buffer.
  Tensor register_host_buffer(const std::string& name, Tensor t);
  template <typename M>
  std::shared_ptr<M> register_module(const std::string& name, std::shared_ptr<M> m) {
    add_child(name, m);
    return m;
  }

  // ---- queries (registration order; dotted names for nested modules) --------------------------
  std::vector<std::pair<std::string, Tensor>> named_parameters(bool recurse = true) const;
  std::vector<Tensor> parameters(bool recurse = true) const;
  std::vector<std::pair<std::string, Tensor>> named_buffers(bool recurse = true) const;
  const std::vector<std::pair<std::string, std::shared_ptr<Module>>>& children() const { return children_; }
  // This module ("" name) and all descendants, depth first.
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> named_modules();
  int64_t num_parameters() const;  // number of trainable scalars
  const std::string& type_name() const { return type_name_; }

  // ---- modes and placement -----------------------------------------------------------------
  // train() / eval() set the mode of this module and every descendant (dropout, redraws, ...).
  virtual void train(bool on = true);
  void eval() { train(false); }
  bool is_training() const { return training_; }
  // Moves/converts every parameter and buffer in place (gradients are dropped); host buffers
  // stay on the CPU. Tensors that share a storage (pack_together's) share the new one too.
  void to(Device device);
  void to(DType dtype);  // floating parameters and buffers only
  void zero_grad();

  // ---- state -----------------------------------------------------------------------------
  // Parameters and buffers by dotted name (tensors share storage with the module).
  StateDict state_dict() const;
  // Copies values into the existing tensors (converting dtype/device as needed). strict: the key
  // sets must match exactly. Shapes must always match. Errors list every missing, unexpected
  // and mis-shaped key.
  void load_state_dict(const StateDict& state, bool strict = true);

  // ---- printing ----------------------------------------------------------------------------
  // "Linear(in_features=2, out_features=8, bias=true)" for leaves, a tree for containers.
  std::string str() const;
  virtual std::string extra_repr() const { return ""; }

 protected:
  void add_child(const std::string& name, std::shared_ptr<Module> m);

 private:
  void collect(const std::string& prefix, bool params, bool recurse,
               std::vector<std::pair<std::string, Tensor>>& out) const;
  void tensors_into(std::vector<Tensor>& out, bool host_buffers) const;  // parameters and buffers, recursively
  void str_into(std::string& out, int indent) const;

  std::string type_name_;
  bool training_ = true;
  std::vector<std::pair<std::string, Tensor>> params_;
  std::vector<std::pair<std::string, Tensor>> buffers_;
  std::vector<std::string> host_buffers_;  // names of buffers that to(Device) leaves on the CPU
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> children_;
};

std::ostream& operator<<(std::ostream& os, const Module& m);

// An ordered list of submodules named "0", "1", ... (forward is up to the owner).
class ModuleList : public Module {
 public:
  ModuleList() : Module("ModuleList") {}
  template <typename M>
  std::shared_ptr<M> push_back(std::shared_ptr<M> m) {
    return register_module(std::to_string(size()), std::move(m));
  }
  size_t size() const { return children().size(); }
  template <typename M = Module>
  std::shared_ptr<M> at(size_t i) const {
    LINEA_CHECK(i < size(), "ModuleList: index ", i, " out of range for ", size(), " modules");
    auto p = std::dynamic_pointer_cast<M>(children()[i].second);
    LINEA_CHECK(p != nullptr, "ModuleList: module ", i, " is a ", children()[i].second->type_name());
    return p;
  }
};

// Throws linea::Error when a floating parameter or buffer of m holds NaN or Inf, naming the
// first such tensor, how many of its values are not finite, and `source` (e.g. "vit: 'run/
// checkpoint/model.safetensors'"): weights loaded from a file are checked before they are used,
// so a diverged or corrupted checkpoint is refused instead of printing NaN scores. Reads every
// value on the host: for loading, not for a training step.
void check_finite_weights(const Module& m, const std::string& source);

// Replaces dst's data (storage, shape, strides, dtype) with src's, keeping dst's handle and
// its requires_grad flag, so every holder of the handle sees the new data. Drops dst's grad.
void replace_data(const Tensor& dst, const Tensor& src);

// Rebinds the tensors (one dtype and device) to consecutive pieces of one new buffer, in order,
// their values copied (replace_data): ops that take several tensors find them as one view
// (raw::joined_view), as linears does MultiHeadAttention's q, k and v weights. Module::to keeps
// the buffer shared.
void pack_together(const std::vector<Tensor>& tensors);

}  // namespace linea::nn
