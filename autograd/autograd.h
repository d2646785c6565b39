// The autograd engine: a dynamic tape (define-by-run). Each differentiable op that sees an
// input requiring grad attaches a Node to its output: the node keeps only what its backward
// needs (saved tensors are detached, so no cycles) and an edge per input. backward() walks
// the graph in topological order (iteratively: deep graphs must not blow the stack), sums
// gradients per node, accumulates into leaves' .grad, and frees each node's saved state
// unless retain_graph is set.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace linea {

namespace detail {

struct Node;

// Where an input's gradient goes: an interior node (to its output `output`), a leaf's
// accumulator, or nowhere.
struct Edge {
  std::shared_ptr<Node> node;
  std::shared_ptr<AutogradMeta> leaf;
  int output = 0;
  bool active() const { return node || leaf; }
};

// One gradient per input, in input order; undefined = zero / not needed.
using BackwardFn = std::function<std::vector<Tensor>(const Tensor& grad_output)>;
// The same for a node of several outputs: their gradients in output order, undefined where an
// output got none (at least one is defined).
using MultiBackwardFn = std::function<std::vector<Tensor>(const std::vector<Tensor>& grad_outputs)>;

struct Node {
  const char* name = "";
  std::vector<Edge> next;           // one per input
  std::vector<Shape> input_shapes;  // checked against the returned gradients
  BackwardFn backward;              // a node of one output; empty once released
  MultiBackwardFn multi_backward;   // a node of several (attach_outputs); empty once released
  int outputs = 1;
  // Storage versions of the inputs and the output when recorded. An in-place write to any of
  // them before this node's backward runs is an error (checked conservatively: whether or not
  // the backward reads that tensor).
  std::vector<std::pair<std::weak_ptr<Storage>, uint64_t>> versions;
};

struct AutogradMeta {
  bool requires_grad = false;
  Tensor grad;                    // leaves only
  std::shared_ptr<Node> grad_fn;  // interior tensors only
  int output = 0;                 // which of grad_fn's outputs this tensor is
  std::function<void()> grad_ready;  // leaves only: set_grad_ready_hook
};

}  // namespace detail

// Grad mode: when off, ops record nothing. Thread-local.
struct GradMode {
  static bool is_enabled();
  static void set_enabled(bool on);
};

// Disables recording for its scope (inference, optimizer steps, backward itself).
class NoGradGuard {
 public:
  NoGradGuard() : prev_(GradMode::is_enabled()) { GradMode::set_enabled(false); }
  ~NoGradGuard() { GradMode::set_enabled(prev_); }
  NoGradGuard(const NoGradGuard&) = delete;
  NoGradGuard& operator=(const NoGradGuard&) = delete;

 private:
  bool prev_;
};

// ---- for op authors -------------------------------------------------------------------------
// True when grad mode is on and some input requires grad: only then build a node.
bool needs_grad(std::initializer_list<const Tensor*> inputs);
bool needs_grad(const std::vector<Tensor>& inputs);

// Makes `out` (a fresh result, not an input's handle) the output of a node named `name`
// with the given inputs and backward. Returns out.
Tensor attach(Tensor out, const char* name, const std::vector<Tensor>& inputs, detail::BackwardFn backward);
// The same for an op of several outputs (fused kernels that hand out two results, each of which
// may or may not get a gradient): one node whose backward runs once with all the outputs'
// gradients, instead of a packed output handed out as views (a copy forward, a zero-filled
// gradient per view backward). Returns outs.
std::vector<Tensor> attach_outputs(std::vector<Tensor> outs, const char* name, const std::vector<Tensor>& inputs,
                                   detail::MultiBackwardFn backward);

// Computes gradients of `outputs` (weighted by `grad_outputs`) into the .grad of leaves.
// A leaf's grad-ready hook runs as soon as its gradient of this backward is complete.
void run_backward(const std::vector<Tensor>& outputs, const std::vector<Tensor>& grad_outputs, bool retain_graph);

// Calls `hook` during every backward() that reaches `leaf` (a tensor requiring grad, made by
// no op), once its .grad holds this backward's whole contribution: every graph edge into the
// leaf has delivered (an edge that carries no gradient counts). Data parallelism starts the
// gradient's reduction there while the rest of the backward runs. One hook per leaf; an empty
// function removes it.
void set_grad_ready_hook(const Tensor& leaf, std::function<void()> hook);

}  // namespace linea
