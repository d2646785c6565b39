// The backward engine and the autograd-facing methods of Tensor.
#include <unordered_map>

#include "autograd/autograd.h"
#include "core/ops.h"

namespace linea {

// ---- grad mode -------------------------------------------------------------------------------
namespace {
thread_local bool g_grad_enabled = true;
}
bool GradMode::is_enabled() { return g_grad_enabled; }
void GradMode::set_enabled(bool on) { g_grad_enabled = on; }

namespace detail {
// Releasing the last tensor of a 10,000-op chain would destroy nodes recursively, one stack
// frame per node. Instead, a node's destructor hands its inputs' nodes to a thread-local list
// that the outermost destructor drains iteratively.
struct NodeTeardown {
  static void release(std::vector<Edge>& next) {
    thread_local std::vector<std::shared_ptr<Node>> pending;
    thread_local bool draining = false;
    for (Edge& e : next)
      if (e.node && e.node.use_count() == 1) pending.push_back(std::move(e.node));
    if (draining) return;
    draining = true;
    while (!pending.empty()) {
      std::shared_ptr<Node> n = std::move(pending.back());
      pending.pop_back();
      n.reset();  // may push more onto `pending`
    }
    draining = false;
  }
};
}  // namespace detail

namespace {
struct NodeDeleter {
  void operator()(detail::Node* n) const {
    detail::NodeTeardown::release(n->next);
    delete n;
  }
};

detail::AutogradMeta& meta_of(const Tensor& t) {
  auto& m = t.impl().autograd;
  if (!m) m = std::make_shared<detail::AutogradMeta>();
  return *m;
}
}  // namespace

// ---- Tensor's autograd methods ----------------------------------------------------------------
bool Tensor::requires_grad() const {
  const auto& m = impl().autograd;
  return m && (m->requires_grad || m->grad_fn);
}

Tensor& Tensor::requires_grad_(bool on) {
  auto& m = impl().autograd;
  if (m && m->grad_fn) {
    LINEA_CHECK(on, "requires_grad_: cannot turn off requires_grad on a non-leaf tensor (output of ", m->grad_fn->name,
                "); use detach()");
    return *this;
  }
  LINEA_CHECK(!on || is_floating(dtype()), "requires_grad_: only floating tensors can require grad, got ",
              dtype_name(dtype()), " (shape ", shape_str(shape()), ")");
  meta_of(*this).requires_grad = on;
  return *this;
}

Tensor Tensor::grad() const {
  const auto& m = impl().autograd;
  return m ? m->grad : Tensor();
}

void Tensor::set_grad(const Tensor& g) {
  if (g.defined())
    LINEA_CHECK(g.shape() == shape() && g.dtype() == dtype() && g.device() == device(), "set_grad: gradient (shape ",
                shape_str(g.shape()), ", ", dtype_name(g.dtype()), ") does not match the tensor (shape ",
                shape_str(shape()), ", ", dtype_name(dtype()), ")");
  meta_of(*this).grad = g;
}

void Tensor::zero_grad() {
  if (impl().autograd) impl().autograd->grad = Tensor();
}

bool Tensor::is_leaf() const {
  const auto& m = impl().autograd;
  return !m || !m->grad_fn;
}

std::string Tensor::grad_fn_name() const {
  const auto& m = impl().autograd;
  return m && m->grad_fn ? m->grad_fn->name : "";
}

Tensor Tensor::detach() const {
  auto d = std::make_shared<TensorImpl>();
  const TensorImpl& s = impl();
  d->storage = s.storage;
  d->shape = s.shape;
  d->strides = s.strides;
  d->offset = s.offset;
  d->dtype = s.dtype;
  return Tensor(std::move(d));
}

void Tensor::backward(const Tensor& gradient, bool retain_graph) const {
  Tensor g = gradient;
  if (!g.defined()) {
    LINEA_CHECK(numel() == 1, "backward: an implicit gradient needs a one-element output, got shape ",
                shape_str(shape()), "; pass a gradient of that shape");
    g = ones(shape(), options());
  }
  run_backward({*this}, {g}, retain_graph);
}

// ---- recording -------------------------------------------------------------------------------
bool needs_grad(std::initializer_list<const Tensor*> inputs) {
  if (!GradMode::is_enabled()) return false;
  for (const Tensor* t : inputs)
    if (t->defined() && t->requires_grad()) return true;
  return false;
}

bool needs_grad(const std::vector<Tensor>& inputs) {
  if (!GradMode::is_enabled()) return false;
  for (const Tensor& t : inputs)
    if (t.defined() && t.requires_grad()) return true;
  return false;
}

namespace {
// A node named `name` with an edge per input (to the node that made it, or its leaf accumulator,
// or none), recording the inputs' storage versions.
std::shared_ptr<detail::Node> make_node(const char* name, const std::vector<Tensor>& inputs) {
  std::shared_ptr<detail::Node> node(new detail::Node, NodeDeleter{});
  node->name = name;
  node->next.reserve(inputs.size());
  node->input_shapes.reserve(inputs.size());
  for (const Tensor& in : inputs) {
    detail::Edge e;
    if (in.defined() && in.requires_grad()) {
      auto& m = in.impl().autograd;
      if (m->grad_fn) {
        e.node = m->grad_fn;
        e.output = m->output;
      } else {
        e.leaf = m;
      }
    }
    node->next.push_back(std::move(e));
    node->input_shapes.push_back(in.defined() ? in.shape() : Shape{});
    if (in.defined()) node->versions.emplace_back(in.impl().storage, in.impl().storage->version);
  }
  return node;
}

// An op may hand back one of its inputs' storage (contiguous() of a contiguous tensor): give the
// output its own handle so the input's graph state is untouched.
Tensor own_handle(const Tensor& out, const std::vector<Tensor>& inputs) {
  for (const Tensor& in : inputs)
    if (in.defined() && in.same(out)) return out.detach();
  return out;
}

// Makes out output i of node.
void set_output(const std::shared_ptr<detail::Node>& node, Tensor& out, int i) {
  node->versions.emplace_back(out.impl().storage, out.impl().storage->version);
  auto& m = meta_of(out);
  m.grad_fn = node;
  m.output = i;
}
}  // namespace

Tensor attach(Tensor out, const char* name, const std::vector<Tensor>& inputs, detail::BackwardFn backward) {
  out = own_handle(out, inputs);
  std::shared_ptr<detail::Node> node = make_node(name, inputs);
  node->backward = std::move(backward);
  set_output(node, out, 0);
  return out;
}

std::vector<Tensor> attach_outputs(std::vector<Tensor> outs, const char* name, const std::vector<Tensor>& inputs,
                                   detail::MultiBackwardFn backward) {
  LINEA_CHECK(!outs.empty(), "attach_outputs: ", name, " has no outputs");
  std::shared_ptr<detail::Node> node = make_node(name, inputs);
  node->multi_backward = std::move(backward);
  node->outputs = static_cast<int>(outs.size());
  for (size_t i = 0; i < outs.size(); ++i) {
    LINEA_CHECK(outs[i].defined(), "attach_outputs: ", name, "'s output ", i, " is undefined");
    outs[i] = own_handle(outs[i], inputs);
    for (size_t j = 0; j < i; ++j)  // the same handle twice: each output its own
      if (outs[j].same(outs[i])) outs[i] = outs[i].detach();
    set_output(node, outs[i], static_cast<int>(i));
  }
  return outs;
}

// ---- backward --------------------------------------------------------------------------------
namespace {
// True when nothing but this handle reaches g's memory: its own tensor (no other handle, such
// as an add's backward returning g for both inputs), covering its whole storage (not a view).
bool sole_owner(const Tensor& g) {
  const Storage& st = *g.impl().storage;
  return g.impl_ptr().use_count() == 1 && g.impl().storage.use_count() == 1 && g.offset() == 0 && g.is_contiguous() &&
         st.nbytes == static_cast<size_t>(g.numel()) * g.element_size();
}

// Which of a node's gradients are disjoint contiguous pieces of one buffer that nothing but them
// holds (linears' gradients of packed weights: row blocks of one GEMM's output): each such piece
// may be taken as a leaf's .grad as it is, as a sole owner is.
std::vector<char> disjoint_pieces(const std::vector<Tensor>& grads) {
  std::vector<char> owned(grads.size(), 0);
  for (size_t i = 0; i < grads.size(); ++i) {
    const Tensor& g = grads[i];
    if (!g.defined() || !g.is_contiguous() || g.impl_ptr().use_count() != 1) continue;
    long sharing = 0;
    bool disjoint = true;
    for (size_t j = 0; j < grads.size(); ++j) {
      const Tensor& h = grads[j];
      if (!h.defined() || h.impl().storage != g.impl().storage) continue;
      ++sharing;
      if (j != i)
        disjoint = disjoint && h.is_contiguous() && h.dtype() == g.dtype() &&
                   (h.offset() + h.numel() <= g.offset() || g.offset() + g.numel() <= h.offset());
    }
    owned[i] = disjoint && g.impl().storage.use_count() == sharing;
  }
  return owned;
}

// owned: g is a disjoint piece of a buffer nothing else holds (disjoint_pieces).
void accumulate_leaf(detail::AutogradMeta& leaf, const Tensor& g, bool owned = false) {
  if (!leaf.grad.defined()) {
    // Own the gradient: it may be a broadcast view, or shared with another input's gradient,
    // and users (clipping, optimizers) write into .grad in place. A gradient nothing else holds
    // is taken as it is (a copy per parameter and step saved).
    leaf.grad = owned || sole_owner(g) ? g : raw::clone(g);
    return;
  }
  leaf.grad = raw::binary(BinaryOp::Add, leaf.grad, g);
}

using NodePtr = detail::Node*;

// One backward pass: the gradients waiting at each node, and how many graph edges into each
// node (and into each leaf with a grad-ready hook) have yet to deliver theirs.
class BackwardPass {
 public:
  explicit BackwardPass(bool retain_graph) : retain_graph_(retain_graph) {}

  // The outputs' gradients: a leaf output's goes to its .grad, the others wait at their nodes.
  void seed(const std::vector<Tensor>& outputs, const std::vector<Tensor>& grad_outputs) {
    for (size_t i = 0; i < outputs.size(); ++i) {
      const Tensor& y = outputs[i];
      const Tensor& g = grad_outputs[i];
      LINEA_CHECK(y.requires_grad(), "backward: the tensor (shape ", shape_str(y.shape()),
                  ") does not require grad and has no grad_fn");
      LINEA_CHECK(g.defined() && g.shape() == y.shape() && g.dtype() == y.dtype() && g.device() == y.device(),
                  "backward: gradient (shape ", g.defined() ? shape_str(g.shape()) : "undefined",
                  ") does not match the output (shape ", shape_str(y.shape()), ", ", dtype_name(y.dtype()), ")");
      auto& m = *y.impl().autograd;
      if (!m.grad_fn) {  // backward on a leaf: its gradient is the given one
        accumulate_leaf(m, g);
        continue;
      }
      if (!pending_.count(m.grad_fn.get())) roots_.push_back(m.grad_fn);
      add_pending(m.grad_fn.get(), m.output, g);
    }
  }

  // Counts, for every node reachable from the roots, how many graph edges point at it
  // (iterative DFS: no recursion on deep graphs). Leaves with a grad-ready hook count their
  // edges too: the hook runs when the count drops to 0.
  void count_dependencies() {
    std::vector<NodePtr> stack;
    for (auto& r : roots_) {
      if (deps_.emplace(r.get(), 0).second) stack.push_back(r.get());
    }
    while (!stack.empty()) {
      NodePtr n = stack.back();
      stack.pop_back();
      for (auto& e : n->next) {
        if (e.leaf && e.leaf->grad_ready) leaf_deps_[e.leaf.get()]++;
        if (!e.node) continue;
        auto [it, inserted] = deps_.emplace(e.node.get(), 0);
        it->second++;
        if (inserted) stack.push_back(e.node.get());
      }
    }
  }

  // Kahn's algorithm: a node runs once all its consumers have delivered their gradients.
  void run() {
    for (auto& r : roots_)
      if (deps_[r.get()] == 0) ready_.push_back(r.get());
    while (!ready_.empty()) {
      NodePtr n = ready_.back();
      ready_.pop_back();
      std::vector<Tensor> g = std::move(pending_[n]);
      pending_.erase(n);
      std::vector<Tensor> grads = call_backward(*n, g);
      const std::vector<char> owned = disjoint_pieces(grads);
      for (size_t i = 0; i < grads.size(); ++i) deliver(*n, i, grads[i], owned[i]);
    }
  }

 private:
  // Output `output` of n gets gradient g: summed into what it has (the engine's one add per
  // tensor used twice).
  void add_pending(NodePtr n, int output, const Tensor& g) {
    std::vector<Tensor>& waiting = pending_[n];
    if (waiting.empty()) waiting.resize(static_cast<size_t>(n->outputs));
    Tensor& sum = waiting[static_cast<size_t>(output)];
    sum = sum.defined() ? raw::binary(BinaryOp::Add, sum, g) : g;
  }

  // Whether some output of n has a gradient waiting.
  bool has_gradient(NodePtr n) const {
    auto it = pending_.find(n);
    if (it == pending_.end()) return false;
    for (const Tensor& g : it->second)
      if (g.defined()) return true;
    return false;
  }

  // Runs n's backward on its summed output gradients g (after checking that it still can and that
  // nothing it recorded was modified in place), then frees its saved tensors unless retain_graph.
  std::vector<Tensor> call_backward(detail::Node& n, const std::vector<Tensor>& g) {
    LINEA_CHECK(n.backward != nullptr || n.multi_backward != nullptr,
                "backward: trying to backward through the graph a second time (at ", n.name,
                "); its saved tensors were freed. Pass retain_graph = true to the first backward");
    for (const auto& [storage, version] : n.versions) {
      auto st = storage.lock();
      LINEA_CHECK(!st || st->version == version, "backward: a tensor used by ", n.name,
                  " was modified by an in-place operation after ", n.name, " recorded it (storage version ",
                  st ? st->version : 0, ", expected ", version, "); write into a clone instead");
    }
    std::vector<Tensor> grads = n.multi_backward ? n.multi_backward(g) : n.backward(g[0]);
    if (!retain_graph_) {  // frees the saved tensors
      n.backward = nullptr;
      n.multi_backward = nullptr;
    }
    LINEA_CHECK(grads.size() == n.next.size(), "backward: ", n.name, " returned ", grads.size(), " gradients for ",
                n.next.size(), " inputs");
    return grads;
  }

  // Input i's gradient gi (undefined: none) along n's edge i: summed into the node's pending
  // gradient or accumulated into the leaf's .grad (owned: a piece it may take as it is).
  void deliver(detail::Node& n, size_t i, const Tensor& gi, bool owned) {
    detail::Edge& e = n.next[i];
    if (e.node) {
      // A consumer that yields no gradient still counts as delivered.
      if (gi.defined()) {
        check_shape(n, i, gi);
        add_pending(e.node.get(), e.output, gi);
      }
      if (--deps_[e.node.get()] == 0) {
        if (has_gradient(e.node.get()))
          ready_.push_back(e.node.get());
        else
          skip_without_gradient(e.node.get());
      }
    } else if (e.leaf) {
      if (gi.defined()) {
        check_shape(n, i, gi);
        accumulate_leaf(*e.leaf, gi, owned);
      }
      leaf_delivered(e.leaf.get());
    }
  }

  void check_shape(const detail::Node& n, size_t i, const Tensor& gi) const {
    LINEA_CHECK(gi.shape() == n.input_shapes[i], "backward: ", n.name, " produced a gradient of shape ",
                shape_str(gi.shape()), " for input ", i, " of shape ", shape_str(n.input_shapes[i]));
  }

  // No gradient reached this node: propagate "nothing" by running nothing, but its inputs'
  // counters must still drop. Walk it with an undefined gradient.
  void skip_without_gradient(NodePtr node) {
    std::vector<NodePtr> quiet{node};
    while (!quiet.empty()) {
      NodePtr q = quiet.back();
      quiet.pop_back();
      pending_.erase(q);
      for (auto& qe : q->next) {
        if (qe.leaf) leaf_delivered(qe.leaf.get());
        if (qe.node && --deps_[qe.node.get()] == 0) {
          if (has_gradient(qe.node.get()))
            ready_.push_back(qe.node.get());
          else
            quiet.push_back(qe.node.get());
        }
      }
    }
  }

  // One more edge into `leaf` has delivered; the last one runs its grad-ready hook.
  void leaf_delivered(detail::AutogradMeta* leaf) {
    if (leaf_deps_.empty() || !leaf->grad_ready) return;
    auto it = leaf_deps_.find(leaf);
    if (it != leaf_deps_.end() && --it->second == 0) leaf->grad_ready();
  }

  const bool retain_graph_;
  std::unordered_map<NodePtr, std::vector<Tensor>>
      pending_;                                  // summed gradients of the nodes yet to run, an output each
  std::unordered_map<NodePtr, int> deps_;        // edges into each node yet to deliver
  std::unordered_map<detail::AutogradMeta*, int> leaf_deps_;
  std::vector<std::shared_ptr<detail::Node>> roots_;
  std::vector<NodePtr> ready_;  // nodes whose gradient is complete
};
}  // namespace

void run_backward(const std::vector<Tensor>& outputs, const std::vector<Tensor>& grad_outputs, bool retain_graph) {
  LINEA_CHECK(outputs.size() == grad_outputs.size(), "backward: ", outputs.size(), " outputs but ", grad_outputs.size(),
              " gradients");
  NoGradGuard no_grad;
  BackwardPass pass(retain_graph);
  pass.seed(outputs, grad_outputs);
  pass.count_dependencies();
  pass.run();
}

void set_grad_ready_hook(const Tensor& leaf, std::function<void()> hook) {
  LINEA_CHECK(leaf.defined() && leaf.requires_grad(), "set_grad_ready_hook: the tensor does not require grad");
  auto& m = meta_of(leaf);
  LINEA_CHECK(!m.grad_fn, "set_grad_ready_hook: the tensor (shape ", shape_str(leaf.shape()),
              ") is the output of an op, not a leaf");
  m.grad_ready = std::move(hook);
}

}  // namespace linea
