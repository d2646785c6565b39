// Autograd semantics: accumulation, reuse, retain_graph, zero_grad, NoGradGuard, detach,
// deep graphs, error cases.
#include "test_util.h"

using namespace linea;
using namespace linea::test;

TEST(Autograd, TensorUsedTwiceAccumulates) {
  Tensor x = tensor<double>({1.0, 2.0, 3.0}, {3});
  x.requires_grad_();
  Tensor y = sum(x * x + x);  // dy/dx = 2x + 1
  y.backward();
  EXPECT_EQ(x.grad().to_vector<double>(), (std::vector<double>{3.0, 5.0, 7.0}));
}

// The grad-ready hook (data parallelism starts a bucket's reduction from it) runs once per
// backward, after the leaf's last contribution: a leaf used three times sees its whole gradient.
TEST(Autograd, GradReadyHookRunsOnceAfterTheLastContribution) {
  Tensor w = from_vector<double>({1.0, 2.0}, {2}).requires_grad_(true);
  Tensor u = from_vector<double>({3.0, 4.0}, {2}).requires_grad_(true);
  std::vector<std::vector<double>> seen_w;
  int calls_u = 0;
  set_grad_ready_hook(w, [&] { seen_w.push_back(w.grad().to_vector<double>()); });
  set_grad_ready_hook(u, [&] { ++calls_u; });
  // w is used three times (w*w counts twice); u once.
  Tensor y = sum(mul(w, w)) + sum(mul(w, 3.0)) + sum(mul(u, 0.0));
  y.backward();
  ASSERT_EQ(seen_w.size(), 1u);
  EXPECT_EQ(seen_w[0], (std::vector<double>{5.0, 7.0}));  // 2w + 3
  EXPECT_EQ(calls_u, 1);
  // Another backward through another graph: the hook runs again, with that backward's gradient.
  w.zero_grad();
  seen_w.clear();
  Tensor z = sum(mul(w, 2.0)) + sum(w);
  z.backward();
  ASSERT_EQ(seen_w.size(), 1u);
  EXPECT_EQ(seen_w[0], (std::vector<double>{3.0, 3.0}));
  set_grad_ready_hook(w, nullptr);
  w.zero_grad();
  sum(w).backward();
  EXPECT_EQ(seen_w.size(), 1u);  // removed
  EXPECT_LINEA_ERROR(set_grad_ready_hook(mul(w, 2.0), [] {}), "not a leaf");
  EXPECT_LINEA_ERROR(set_grad_ready_hook(zeros({2}), [] {}), "does not require grad");
}

TEST(Autograd, GradAccumulatesAcrossBackwardsUntilZeroGrad) {
  Tensor x = tensor<double>({1.0, -2.0}, {2});
  x.requires_grad_();
  sum(mul(x, 3.0)).backward();
  sum(mul(x, 3.0)).backward();
  EXPECT_EQ(x.grad().to_vector<double>(), (std::vector<double>{6.0, 6.0}));
  x.zero_grad();
  EXPECT_FALSE(x.grad().defined());
  sum(mul(x, 2.0)).backward();
  EXPECT_EQ(x.grad().to_vector<double>(), (std::vector<double>{2.0, 2.0}));
}

TEST(Autograd, BackwardTwiceNeedsRetainGraph) {
  Tensor x = tensor<double>({0.5, 1.5}, {2});
  x.requires_grad_();
  Tensor y = sum(exp(x));
  y.backward(Tensor(), /*retain_graph=*/true);
  y.backward();  // allowed: the first kept the graph
  auto g = x.grad().to_vector<double>();
  EXPECT_NEAR(g[0], 2 * std::exp(0.5), 1e-12);
  EXPECT_NEAR(g[1], 2 * std::exp(1.5), 1e-12);
  EXPECT_LINEA_ERROR(y.backward(), "second time");
}

TEST(Autograd, NoGradGuardRecordsNothing) {
  Tensor x = ones({2}, f64());
  x.requires_grad_();
  {
    NoGradGuard g;
    Tensor y = x * 2.0;
    EXPECT_FALSE(y.requires_grad());
    EXPECT_TRUE(y.is_leaf());
  }
  Tensor z = x * 2.0;
  EXPECT_TRUE(z.requires_grad());
  EXPECT_EQ(z.grad_fn_name(), "mul");
  EXPECT_TRUE(GradMode::is_enabled());
  {
    NoGradGuard g;  // ops of a list of inputs too
    EXPECT_FALSE(cat({x, x}, 0).requires_grad());
  }
}

// Backward runs without recording (no create_graph): the gradients it computes have no graph,
// and custom backward functions and grad-ready hooks see grad mode off.
TEST(Autograd, BackwardRecordsNothing) {
  Tensor x = tensor<double>({1.0, 2.0}, {2});
  x.requires_grad_();
  std::vector<bool> modes;
  set_grad_ready_hook(x, [&] { modes.push_back(GradMode::is_enabled()); });
  Tensor y = attach(raw::binary(BinaryOp::Mul, x, x), "square", {x}, [&modes, x](const Tensor& g) {
    modes.push_back(GradMode::is_enabled());
    return std::vector<Tensor>{g * x * 2.0};  // x requires grad: recorded if grad mode were on
  });
  sum(y).backward();
  EXPECT_EQ(modes, (std::vector<bool>{false, false}));
  EXPECT_EQ(x.grad().to_vector<double>(), (std::vector<double>{2.0, 4.0}));
  EXPECT_FALSE(x.grad().requires_grad());
  EXPECT_TRUE(GradMode::is_enabled());
}

TEST(Autograd, DetachStopsGradient) {
  Tensor x = tensor<double>({2.0}, {1});
  x.requires_grad_();
  Tensor y = x * x.detach();  // d/dx = x (the detached factor is a constant)
  EXPECT_FALSE(x.detach().requires_grad());
  sum(y).backward();
  EXPECT_DOUBLE_EQ(x.grad().item(), 2.0);
}

TEST(Autograd, DeepChainNoStackOverflow) {
  Tensor x = scalar_tensor(0.0, f64());
  x.requires_grad_();
  Tensor y = x;
  for (int i = 0; i < 10000; ++i) y = add(y, 1e-4) * 1.0;  // 20,000 nodes
  y.backward();
  EXPECT_DOUBLE_EQ(x.grad().item(), 1.0);
  EXPECT_NEAR(y.item(), 1.0, 1e-9);
  y = Tensor();  // destroying the graph must not recurse either
  // ... nor destroying a graph that never ran backward, deep enough to overflow the stack if it did
  Tensor z = x;
  for (int i = 0; i < 200000; ++i) z = z * 1.0;
  z = Tensor();
}

TEST(Autograd, GraphFreedAfterBackward) {
  // The saved tensors of a node are released by backward (without retain_graph).
  Tensor x = randn({1000}, f64());
  x.requires_grad_();
  Tensor big = exp(x);
  std::weak_ptr<Storage> saved = big.impl().storage;  // exp saves its output
  Tensor y = sum(big);
  big = Tensor();
  EXPECT_FALSE(saved.expired());  // still held by the graph
  y.backward();
  EXPECT_TRUE(saved.expired());
}

TEST(Autograd, NonScalarBackwardNeedsGradient) {
  Tensor x = ones({3}, f64());
  x.requires_grad_();
  Tensor y = x * 2.0;
  EXPECT_LINEA_ERROR(y.backward(), "implicit gradient");
  y.backward(tensor<double>({1.0, 0.0, -1.0}, {3}));
  EXPECT_EQ(x.grad().to_vector<double>(), (std::vector<double>{2.0, 0.0, -2.0}));
}

TEST(Autograd, BackwardOnTensorWithoutGradFails) {
  Tensor x = ones({1}, f64());
  EXPECT_LINEA_ERROR(x.backward(), "does not require grad");
}

TEST(Autograd, IntegerTensorsCannotRequireGrad) {
  Tensor i = arange(4.0, TensorOptions(DType::Int64));
  EXPECT_LINEA_ERROR(i.requires_grad_(), "floating");
}

// Misuse of the engine gets an error naming the call and the shapes at fault, not a wrong gradient.
TEST(Autograd, MisuseNamesTheCause) {
  Tensor x = ones({2}, f64());
  x.requires_grad_();
  Tensor y = x * 2.0;
  EXPECT_LINEA_ERROR(
      y.requires_grad_(false),
      "requires_grad_: cannot turn off requires_grad on a non-leaf tensor (output of mul); use detach()");
  EXPECT_TRUE(y.requires_grad_(true).requires_grad());  // turning it on is a no-op
  EXPECT_LINEA_ERROR(x.set_grad(ones({3}, f64())),
                     "set_grad: gradient (shape [3], float64) does not match the tensor (shape [2], float64)");
  EXPECT_LINEA_ERROR(x.set_grad(ones({2})), "set_grad: gradient (shape [2], float32) does not match");
  EXPECT_LINEA_ERROR(y.backward(ones({3}, f64())),
                     "backward: gradient (shape [3]) does not match the output (shape [2], float64)");
  EXPECT_LINEA_ERROR(y.backward(ones({2})), "backward: gradient (shape [2]) does not match the output");
  EXPECT_LINEA_ERROR(run_backward({y}, {Tensor()}, false), "backward: gradient (shape undefined) does not match");
  EXPECT_LINEA_ERROR(run_backward({y, y}, {ones({2}, f64())}, false), "backward: 2 outputs but 1 gradients");
  EXPECT_FALSE(x.grad().defined());  // nothing ran

  EXPECT_LINEA_ERROR(attach_outputs({}, "none", {x}, [](const std::vector<Tensor>&) { return std::vector<Tensor>{}; }),
                     "attach_outputs: none has no outputs");
  EXPECT_LINEA_ERROR(attach_outputs({Tensor(), y.detach()}, "half", {x},
                                    [](const std::vector<Tensor>& g) { return std::vector<Tensor>{g[1]}; }),
                     "attach_outputs: half's output 0 is undefined");
  // A backward of too many gradients, or of one of the wrong shape, into a leaf and into a node.
  const auto op = [](const Tensor& in, const char* name, std::function<std::vector<Tensor>(const Tensor&)> back) {
    return attach(in.detach() * 1.0, name, {in}, [back](const Tensor& g) { return back(g); });
  };
  const auto two = [](const Tensor& g) { return std::vector<Tensor>{g, g}; };
  const auto narrowed = [](const Tensor& g) { return std::vector<Tensor>{narrow(g, 0, 0, 1)}; };
  EXPECT_LINEA_ERROR(sum(op(x, "two", two)).backward(), "backward: two returned 2 gradients for 1 inputs");
  EXPECT_LINEA_ERROR(sum(op(x, "narrowed", narrowed)).backward(),
                     "backward: narrowed produced a gradient of shape [1] for input 0 of shape [2]");
  EXPECT_LINEA_ERROR(sum(op(x * 3.0, "narrowed", narrowed)).backward(),
                     "backward: narrowed produced a gradient of shape [1] for input 0 of shape [2]");
  EXPECT_FALSE(x.grad().defined());
}

TEST(Autograd, BroadcastGradientReducedToInputShape) {
  Tensor a = ones({2, 3}, f64());
  Tensor b = ones({3}, f64());
  a.requires_grad_();
  b.requires_grad_();
  sum(a * b).backward();
  EXPECT_EQ(b.grad().shape(), (Shape{3}));
  EXPECT_EQ(b.grad().to_vector<double>(), (std::vector<double>{2.0, 2.0, 2.0}));
}

TEST(Autograd, ViewGradientFlowsToBase) {
  Tensor base = zeros({3, 4}, f64());
  base.requires_grad_();
  Tensor v = base.transpose(0, 1).narrow(0, 1, 2);  // [2, 3]
  sum(v * 3.0).backward();
  auto g = base.grad().to_vector<double>();
  for (int r = 0; r < 3; ++r)
    for (int c = 0; c < 4; ++c) EXPECT_EQ(g[r * 4 + c], (c == 1 || c == 2) ? 3.0 : 0.0);
}

TEST(Autograd, LeafGradIsOwnedNotAliased) {
  // add's backward hands the same gradient to both inputs; writing into one .grad must not change the other.
  Tensor a = ones({2}, f64()), b = ones({2}, f64());
  a.requires_grad_();
  b.requires_grad_();
  sum(a + b).backward();
  a.grad().fill_(7.0);
  EXPECT_EQ(b.grad().to_vector<double>(), (std::vector<double>{1.0, 1.0}));
  // The same with a gradient nothing else holds reaching add (sum's is a broadcast view, copied anyway).
  Tensor c = ones({2}, f64()).requires_grad_(), d = ones({2}, f64()).requires_grad_();
  sum((c + d) * 3.0).backward();
  c.grad().fill_(7.0);
  EXPECT_EQ(d.grad().to_vector<double>(), (std::vector<double>{3.0, 3.0}));
}

// A backward's gradient that another handle also reaches is copied into .grad, never taken: a
// second view of its memory handed to another input, or the same piece kept by the node.
TEST(Autograd, GradientsReachedByAnotherHandleAreCopied) {
  Tensor a = ones({2}, f64()).requires_grad_(), b = ones({2, 1}, f64()).requires_grad_();
  Tensor y = attach(raw::clone(a) + raw::reshape(b, {2}), "two_views", {a, b}, [](const Tensor& g) {
    const Tensor own = raw::clone(g);
    return std::vector<Tensor>{own, raw::reshape(own, {2, 1})};
  });
  sum(y).backward();
  a.grad().fill_(7.0);
  EXPECT_EQ(b.grad().to_vector<double>(), (std::vector<double>{1.0, 1.0}));

  Tensor c = ones({2}, f64()).requires_grad_(), d = ones({2}, f64()).requires_grad_();
  Tensor kept;
  Tensor z = attach(raw::clone(c) + raw::clone(d), "kept_piece", {c, d}, [&kept](const Tensor& g) {
    const Tensor buffer = raw::cat({g, g * 2.0}, 0);  // [4]: c's piece [0, 2), d's [2, 4)
    kept = raw::narrow(buffer, 0, 0, 2);
    return std::vector<Tensor>{kept, raw::narrow(buffer, 0, 2, 2)};
  });
  sum(z).backward();
  c.grad().fill_(7.0);
  EXPECT_EQ(kept.to_vector<double>(), (std::vector<double>{1.0, 1.0}));
  EXPECT_EQ(d.grad().to_vector<double>(), (std::vector<double>{2.0, 2.0}));
}

// A node's gradients that are disjoint pieces of one buffer nothing else holds (linears' of
// packed weights) become the leaves' .grad as they are; overlapping pieces, or a piece of a buffer
// the node keeps, are copied (writing into one .grad must not change another).
TEST(Autograd, LeafGradsMayBeDisjointPiecesOfOneBuffer) {
  const auto run = [](int64_t second_start, bool keep_buffer) {
    Tensor a = ones({2}, f64()).requires_grad_(), b = ones({2}, f64()).requires_grad_();
    Tensor kept;
    Tensor y = attach(raw::clone(a) + raw::clone(b), "pieces", {a, b}, [&, second_start, keep_buffer](const Tensor& g) {
      const Tensor buffer = raw::cat({g, g * 2.0}, 0);  // [4]: pieces [0, 2) and [second_start, +2)
      if (keep_buffer) kept = buffer;
      return std::vector<Tensor>{raw::narrow(buffer, 0, 0, 2), raw::narrow(buffer, 0, second_start, 2)};
    });
    sum(y).backward();
    const bool shared = a.grad().impl().storage == b.grad().impl().storage;
    a.grad().fill_(7.0);
    return std::make_pair(shared, b.grad().to_vector<double>());
  };
  EXPECT_EQ(run(2, false), std::make_pair(true, std::vector<double>{2.0, 2.0}));   // disjoint: taken
  EXPECT_EQ(run(1, false), std::make_pair(false, std::vector<double>{1.0, 2.0}));  // overlapping: copied
  EXPECT_EQ(run(2, true), std::make_pair(false, std::vector<double>{2.0, 2.0}));   // held elsewhere: copied
}

// Only contiguous pieces count as disjoint by their offsets: a strided view reaches past its
// offset + numel. Here b's gradient (elements 0 and 4 of the buffer) overlaps a's (2..4); a's
// hook writes into a's .grad in place during backward (as a data-parallel reduction does) before
// b's gradient is used, which must not see it. And a gradient that is not contiguous is copied:
// .grad is dense, as the optimizers' fused steps need.
TEST(Autograd, StridedGradientsAreNeverTakenAsTheyAre) {
  Tensor a = ones({3}, f64()).requires_grad_(), b = ones({2}, f64()).requires_grad_();
  set_grad_ready_hook(a, [&a] { a.grad().fill_(0.0); });
  Tensor y = attach(raw::clone(a), "strided_pieces", {a, b * 1.0}, [](const Tensor&) {
    const Tensor buffer = raw::clone(arange(1.0, 7.0, 1.0, f64()));  // [6]: 1..6
    return std::vector<Tensor>{raw::narrow(buffer, 0, 2, 3), raw::slice(buffer, 0, 0, 6, 4)};
  });
  sum(y).backward();
  EXPECT_EQ(a.grad().to_vector<double>(), (std::vector<double>{0.0, 0.0, 0.0}));
  EXPECT_EQ(b.grad().to_vector<double>(), (std::vector<double>{1.0, 5.0}));

  Tensor c = ones({2, 3}, f64()).requires_grad_();
  Tensor z = attach(raw::clone(c), "transposed", {c}, [](const Tensor&) {
    return std::vector<Tensor>{raw::transpose(raw::clone(arange(0.0, 6.0, 1.0, f64()).reshape({3, 2})), 0, 1)};
  });
  sum(z).backward();
  EXPECT_TRUE(c.grad().is_contiguous());
  EXPECT_EQ(c.grad().to_vector<double>(), (std::vector<double>{0.0, 2.0, 4.0, 1.0, 3.0, 5.0}));
}

namespace {
// A custom op whose backward yields no gradient for its (gradient-requiring) input.
Tensor drop_gradient(const Tensor& h) {
  return attach(raw::clone(h), "drop_gradient", {h}, [](const Tensor&) { return std::vector<Tensor>{Tensor()}; });
}
}  // namespace

TEST(Autograd, UndefinedGradientCountsAsZero) {
  Tensor x = ones({2}, f64());
  x.requires_grad_();
  Tensor h = x * 2.0;
  sum(drop_gradient(h) + h).backward();  // only the direct path carries a gradient
  EXPECT_EQ(x.grad().to_vector<double>(), (std::vector<double>{2.0, 2.0}));
  Tensor x2 = ones({2}, f64());
  x2.requires_grad_();
  sum(drop_gradient(x2 * 3.0)).backward();  // no path carries one: the leaf gets nothing
  EXPECT_FALSE(x2.grad().defined());
  // A node that gets no gradient is still walked: h3 waits on both its consumers (the last to
  // finish is the one that got nothing), and x4's hook on both of its edges.
  Tensor x3 = ones({2}, f64()).requires_grad_();
  Tensor h3 = x3 * 1.0;
  sum(drop_gradient(h3 * 2.0) + h3 * 5.0).backward();
  EXPECT_EQ(x3.grad().to_vector<double>(), (std::vector<double>{5.0, 5.0}));
  Tensor x4 = ones({2}, f64()).requires_grad_();
  std::vector<std::vector<double>> seen;
  set_grad_ready_hook(x4, [&] { seen.push_back(x4.grad().to_vector<double>()); });
  sum(drop_gradient(x4 * 2.0) + x4 * 5.0).backward();
  EXPECT_EQ(seen, (std::vector<std::vector<double>>{{5.0, 5.0}}));
}

// Roots of one backward may feed each other: the one used by the other runs once, with both
// gradients summed, whichever comes first in the list.
TEST(Autograd, RootsThatFeedEachOtherRunOnce) {
  for (bool used_first : {true, false}) {
    Tensor x = tensor<double>({1.0, 2.0}, {2});
    x.requires_grad_();
    Tensor y = x * 2.0;
    Tensor z = y * y;
    if (used_first)
      run_backward({y, z}, {ones({2}, f64()), ones({2}, f64())}, false);
    else
      run_backward({z, y}, {ones({2}, f64()), ones({2}, f64())}, false);
    EXPECT_EQ(x.grad().to_vector<double>(), (std::vector<double>{2.0 + 8.0, 2.0 + 16.0})) << used_first;  // 2 + 8x
  }
}

// A custom op may hand back its input, or one tensor as two outputs: each output gets its own
// handle, so the input stays a leaf and each output's gradient reaches its own slot.
TEST(Autograd, CustomOpOutputsGetTheirOwnHandles) {
  Tensor x = ones({2}, f64()).requires_grad_();
  Tensor y = attach(x, "identity", {x}, [](const Tensor& g) { return std::vector<Tensor>{g * 3.0}; });
  EXPECT_TRUE(x.is_leaf());
  EXPECT_EQ(y.grad_fn_name(), "identity");
  sum(y).backward();
  EXPECT_EQ(x.grad().to_vector<double>(), (std::vector<double>{3.0, 3.0}));

  std::string seen;
  const Tensor t = raw::clone(x);
  std::vector<Tensor> outs =
      attach_outputs({t, t}, "same_twice", {x}, [&seen](const std::vector<Tensor>& g) -> std::vector<Tensor> {
        seen = std::string(g[0].defined() ? "a" : "-") + (g[1].defined() ? "b" : "-");
        return {g[0].defined() ? g[0] : g[1]};
      });
  sum(outs[0]).backward();
  EXPECT_EQ(seen, "a-");
}

TEST(Autograd, MultipleOutputsShareOneBackward) {
  Tensor x = tensor<double>({1.0, 2.0}, {2});
  x.requires_grad_();
  Tensor a = x * 3.0, b = x * x;
  run_backward({sum(a), sum(b)}, {scalar_tensor(1.0, f64()), scalar_tensor(1.0, f64())}, false);
  EXPECT_EQ(x.grad().to_vector<double>(), (std::vector<double>{5.0, 7.0}));
}

// An op of two outputs, a = 2 x and b = x^2, as one node (attach_outputs) that records which of
// its outputs' gradients it got.
std::pair<Tensor, Tensor> twice_and_square(const Tensor& x, std::vector<std::string>* seen) {
  const Tensor xd = x.detach();
  std::vector<Tensor> outs =
      attach_outputs({xd * 2.0, xd * xd}, "twice_and_square", {x}, [xd, seen](const std::vector<Tensor>& g) {
        seen->push_back(std::string(g[0].defined() ? "a" : "-") + (g[1].defined() ? "b" : "-"));
        Tensor dx = g[0].defined() ? g[0] * 2.0 : Tensor();  // the engine runs this without recording
        if (g[1].defined()) {
          const Tensor db = g[1] * xd * 2.0;
          dx = dx.defined() ? dx + db : db;
        }
        return std::vector<Tensor>{dx};
      });
  return {outs[0], outs[1]};
}

TEST(Autograd, NodeOfSeveralOutputsRunsOnceWithEachOutputsGradient) {
  std::vector<std::string> seen;
  Tensor x = tensor<double>({1.0, 3.0}, {2});
  x.requires_grad_();
  // Both outputs used, b twice (its two gradients summed before the node runs): one backward call.
  auto [a, b] = twice_and_square(x, &seen);
  sum(a * 5.0 + b + b * 3.0).backward();
  EXPECT_EQ(seen, (std::vector<std::string>{"ab"}));
  EXPECT_EQ(x.grad().to_vector<double>(), (std::vector<double>{10.0 + 8.0, 10.0 + 24.0}));
  // Only the second used: the first's gradient comes undefined; and through a later op.
  x.zero_grad();
  seen.clear();
  auto [a2, b2] = twice_and_square(x, &seen);
  sum(exp(b2 * 0.0) * b2).backward();
  EXPECT_EQ(seen, (std::vector<std::string>{"-b"}));
  EXPECT_EQ(x.grad().to_vector<double>(), (std::vector<double>{2.0, 6.0}));
  // Both outputs as the roots of one backward, with retain_graph, then again.
  x.zero_grad();
  seen.clear();
  auto [a3, b3] = twice_and_square(x, &seen);
  run_backward({b3, a3}, {ones({2}, f64()), full({2}, 10.0, f64())}, true);
  run_backward({a3}, {ones({2}, f64())}, false);
  EXPECT_EQ(seen, (std::vector<std::string>{"ab", "a-"}));
  EXPECT_EQ(x.grad().to_vector<double>(), (std::vector<double>{2.0 + 20.0 + 2.0, 6.0 + 20.0 + 2.0}));
  EXPECT_EQ(a3.grad_fn_name(), "twice_and_square");
  EXPECT_LINEA_ERROR(sum(b3).backward(), "trying to backward through the graph a second time");
  // No output reaches the loss with a gradient: the node does not run, the leaf gets nothing.
  Tensor x4 = tensor<double>({1.0}, {1});
  x4.requires_grad_();
  seen.clear();
  auto [a4, b4] = twice_and_square(x4, &seen);
  sum(drop_gradient(a4) + drop_gradient(b4)).backward();
  EXPECT_TRUE(seen.empty());
  EXPECT_FALSE(x4.grad().defined());
}

TEST(Autograd, InPlaceWriteIntoRecordedTensorIsAnError) {
  Tensor x = tensor<double>({1.0, 2.0}, {2});
  x.requires_grad_();
  Tensor h = x * 1.0;
  Tensor y = exp(h);  // exp saves its output
  y.fill_(0.0);       // ... which is now overwritten
  EXPECT_LINEA_ERROR(sum(y).backward(), "modified by an in-place operation");
  // Writing into a view counts too (views share the version counter), and a clone is safe.
  Tensor a = tensor<double>({1.0, 2.0, 3.0}, {3});
  a.requires_grad_();
  Tensor b = a * 2.0;
  Tensor c = b * b;
  b.narrow(0, 0, 1).fill_(5.0);
  EXPECT_LINEA_ERROR(sum(c).backward(), "in-place");
  // copy_ is an in-place write too.
  Tensor f = a * 2.0;
  Tensor g = f * f;
  f.copy_(zeros({3}, f64()));
  EXPECT_LINEA_ERROR(sum(g).backward(), "in-place");
  Tensor d = a * 2.0;
  Tensor e = clone(d) * d;
  clone(d).fill_(0.0);
  sum(e).backward();
  EXPECT_EQ(a.grad().to_vector<double>(), (std::vector<double>{8.0, 16.0, 24.0}));
}
