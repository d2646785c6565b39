// Module system: registration (its errors; a parameter made from a graph becomes a leaf) and dotted
// names, the module walk's order, modes, device/dtype moves, state dicts with strict loading
// errors (an unexpected key alone too), parameter counts, printing.
#include <map>
#include <string>
#include <vector>

#include "nn/module.h"
#include "test_util.h"

using namespace linea;
using namespace linea::test;

namespace {
struct Leaf : nn::Module {
  Tensor w, b, running;
  explicit Leaf(int64_t n) : nn::Module("Leaf") {
    w = register_parameter("w", randn({n, 2}));
    b = register_parameter("b", zeros({n}));
    running = register_buffer("running", ones({n}));
  }
  std::string extra_repr() const override { return "n=" + std::to_string(w.size(0)); }
};
struct Tree : nn::Module {
  std::shared_ptr<Leaf> a;
  std::shared_ptr<nn::ModuleList> blocks;
  Tree() : nn::Module("Tree") {
    a = register_module("a", std::make_shared<Leaf>(3));
    blocks = register_module("blocks", std::make_shared<nn::ModuleList>());
    blocks->push_back(std::make_shared<Leaf>(1));
    blocks->push_back(std::make_shared<Leaf>(2));
  }
};
std::vector<std::string> names(const std::vector<std::pair<std::string, Tensor>>& v) {
  std::vector<std::string> out;
  for (auto& [n, _] : v) out.push_back(n);
  return out;
}
}  // namespace

TEST(Module, DottedNamesInRegistrationOrder) {
  auto t = std::make_shared<Tree>();
  EXPECT_EQ(names(t->named_parameters()),
            (std::vector<std::string>{"a.w", "a.b", "blocks.0.w", "blocks.0.b", "blocks.1.w", "blocks.1.b"}));
  EXPECT_EQ(names(t->named_buffers()), (std::vector<std::string>{"a.running", "blocks.0.running", "blocks.1.running"}));
  EXPECT_EQ(t->num_parameters(), 3 * 2 + 3 + 1 * 2 + 1 + 2 * 2 + 2);
  // Without recursion, a module's own tensors only.
  EXPECT_TRUE(t->named_parameters(/*recurse=*/false).empty());
  EXPECT_TRUE(t->named_buffers(/*recurse=*/false).empty());
  EXPECT_EQ(names(t->a->named_parameters(false)), (std::vector<std::string>{"w", "b"}));
  EXPECT_TRUE(t->a->w.requires_grad());
  EXPECT_FALSE(t->a->running.requires_grad());
  std::vector<std::string> mods;  // depth first, each module before its children, in registration order
  for (const auto& [n, _] : t->named_modules()) mods.push_back(n);
  EXPECT_EQ(mods, (std::vector<std::string>{"", "a", "blocks", "blocks.0", "blocks.1"}));
  EXPECT_EQ(t->blocks->at<Leaf>(1)->w.size(0), 2);
}

TEST(Module, TrainEvalPropagates) {
  auto t = std::make_shared<Tree>();
  EXPECT_TRUE(t->blocks->at<Leaf>(0)->is_training());
  t->eval();
  EXPECT_FALSE(t->blocks->at<Leaf>(0)->is_training());
  EXPECT_FALSE(t->a->is_training());
  t->train();
  EXPECT_TRUE(t->a->is_training());
}

TEST(Module, StateDictRoundTripSharesNothingAfterLoad) {
  manual_seed(1);
  auto src = std::make_shared<Tree>();
  manual_seed(2);
  auto dst = std::make_shared<Tree>();
  EXPECT_NE(dst->a->w.to_vector<float>(), src->a->w.to_vector<float>());
  dst->load_state_dict(src->state_dict());
  EXPECT_EQ(dst->a->w.to_vector<float>(), src->a->w.to_vector<float>());
  EXPECT_EQ(dst->blocks->at<Leaf>(1)->running.to_vector<float>(), src->blocks->at<Leaf>(1)->running.to_vector<float>());
  src->a->w.fill_(0.0);  // a copy was loaded, not the same storage
  EXPECT_NE(dst->a->w.to_vector<float>(), src->a->w.to_vector<float>());
  // The module's own handles still train: the loaded tensor is the registered parameter.
  EXPECT_TRUE(dst->a->w.requires_grad());
  EXPECT_TRUE(dst->a->w.same(dst->named_parameters()[0].second));
}

TEST(Module, StrictLoadListsEveryProblem) {
  auto m = std::make_shared<Tree>();
  nn::StateDict s = m->state_dict();
  s.erase("a.b");
  s["extra.weight"] = zeros({1});
  s["blocks.1.w"] = zeros({5, 5});
  try {
    m->load_state_dict(s);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("missing keys: a.b"), std::string::npos) << msg;
    EXPECT_NE(msg.find("unexpected keys: extra.weight"), std::string::npos) << msg;
    EXPECT_NE(msg.find("blocks.1.w (expected [2, 2], got [5, 5])"), std::string::npos) << msg;
  }
  // An unexpected key alone is enough.
  nn::StateDict extra = m->state_dict();
  extra["extra.weight"] = zeros({1});
  EXPECT_LINEA_ERROR(m->load_state_dict(extra), "load_state_dict (Tree): unexpected keys: extra.weight;");
  // Non-strict loading ignores missing/unexpected keys but never a shape mismatch (and names
  // only that).
  EXPECT_LINEA_ERROR(m->load_state_dict(s, /*strict=*/false),
                     "load_state_dict (Tree): shape mismatch: blocks.1.w (expected [2, 2], got [5, 5]);");
  s["blocks.1.w"] = ones({2, 2});
  m->load_state_dict(s, /*strict=*/false);
  EXPECT_EQ(m->blocks->at<Leaf>(1)->w.to_vector<float>(), std::vector<float>(4, 1.0f));
}

// A tensor of the wrong kind (integers for a float parameter) is refused before anything is
// copied: the parameters loaded before it in name order stay as they were (found by fuzzing a
// checkpoint whose "b" was float32 and "w" uint32).
TEST(Module, RefusedLoadChangesNothing) {
  auto m = std::make_shared<Tree>();
  const nn::StateDict before = m->state_dict();
  std::map<std::string, std::vector<float>> values;
  for (const auto& [n, t] : before) values[n] = t.contiguous().to_vector<float>();
  nn::StateDict s;
  for (const auto& [n, t] : before) s[n] = ones(t.shape());
  const std::string last = s.rbegin()->first;
  s[last] = zeros(before.at(last).shape(), TensorOptions(DType::Int64));
  try {
    m->load_state_dict(s);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("dtype mismatch: " + last + " (expected float32, got int64)"), std::string::npos) << msg;
  }
  for (const auto& [n, t] : m->state_dict()) EXPECT_EQ(t.contiguous().to_vector<float>(), values[n]) << n;
}

TEST(Module, ToDtypeKeepsHandlesAndDropsGrads) {
  auto m = std::make_shared<Leaf>(2);
  sum(m->w).backward();
  ASSERT_TRUE(m->w.grad().defined());
  Tensor handle = m->w;
  m->to(DType::Float64);
  EXPECT_EQ(handle.dtype(), DType::Float64);  // the layer's member sees the change
  EXPECT_EQ(m->named_parameters()[0].second.dtype(), DType::Float64);
  EXPECT_FALSE(m->w.grad().defined());
  EXPECT_TRUE(m->w.requires_grad());
  EXPECT_LINEA_ERROR(m->to(DType::Int64), "floating");
}

// pack_together puts tensors one after another in one buffer (values, names and handles kept);
// moving or converting the module keeps them sharing one, at the same places.
TEST(Module, PackedParametersStayPackedThroughMoves) {
  auto t = std::make_shared<Tree>();
  const Tensor w0 = t->a->w, w1 = t->blocks->at<Leaf>(0)->w, w2 = t->blocks->at<Leaf>(1)->w;
  const std::vector<float> v0 = w0.to_vector<float>(), v1 = w1.to_vector<float>(), v2 = w2.to_vector<float>();
  nn::pack_together({w0, w1, w2});
  const auto packed = [&] { return raw::joined_view({w0, w1, w2}, 0); };
  ASSERT_TRUE(packed().defined());
  EXPECT_EQ(packed().shape(), (Shape{6, 2}));
  EXPECT_TRUE(w0.requires_grad() && w0.is_leaf());
  EXPECT_EQ(w1.to_vector<float>(), v1);
  t->to(DType::Float64);
  ASSERT_TRUE(packed().defined());
  EXPECT_EQ(w2.dtype(), DType::Float64);
  EXPECT_EQ(w0.to(DType::Float32).to_vector<float>(), v0);
  EXPECT_EQ(w2.to(DType::Float32).to_vector<float>(), v2);
  t->to(kCPU);  // already there: nothing moves
  EXPECT_TRUE(packed().defined());
  // Loading copies into the packed tensors; an unpacked tensor beside them moves on its own.
  auto other = std::make_shared<Tree>();
  other->to(DType::Float64);
  t->load_state_dict(other->state_dict());
  ASSERT_TRUE(packed().defined());
  EXPECT_EQ(w1.to_vector<double>(), other->blocks->at<Leaf>(0)->w.to_vector<double>());
  EXPECT_NE(t->a->b.impl().storage, w0.impl().storage);
  EXPECT_LINEA_ERROR(nn::pack_together({w0, zeros({2})}), "pack_together: tensors of float64 on cpu and of float32");
  EXPECT_LINEA_ERROR(nn::pack_together({}), "pack_together: no tensors");
  EXPECT_LINEA_ERROR(nn::pack_together({w0, Tensor()}), test::undefined_arg("pack_together", "tensor"));
}

TEST(Module, ZeroGradClearsEveryParameter) {
  auto t = std::make_shared<Tree>();
  Tensor loss = sum(t->a->w) + sum(t->blocks->at<Leaf>(0)->b);
  loss.backward();
  EXPECT_TRUE(t->a->w.grad().defined());
  t->zero_grad();
  for (auto& p : t->parameters()) EXPECT_FALSE(p.grad().defined());
}

TEST(Module, PrintsTree) {
  auto t = std::make_shared<Tree>();
  std::string s = t->str();
  EXPECT_NE(s.find("Tree(\n  (a): Leaf(n=3)\n  (blocks): ModuleList(\n    (0): Leaf(n=1)"), std::string::npos) << s;
}

TEST(Module, RegistrationErrors) {
  struct Bad : nn::Module {
    Bad() : nn::Module("Bad") {}
    void twice() {
      register_parameter("p", zeros({1}));
      register_parameter("p", zeros({1}));
    }
    void dotted() { register_parameter("a.b", zeros({1})); }
    void integer() { register_parameter("i", zeros({1}, TensorOptions(DType::Int64))); }
    void buffer_twice() {
      register_buffer("r", zeros({1}));
      register_buffer("r", zeros({1}));
    }
    void child_twice() {
      register_module("c", std::make_shared<Leaf>(1));
      register_module("c", std::make_shared<Leaf>(1));
    }
    void undefined_host_buffer() { register_host_buffer("h", Tensor()); }
    void undefined_parameter() { register_parameter("u", Tensor()); }
    void undefined_buffer() { register_buffer("u", Tensor()); }
    void dotted_buffer() { register_buffer("a.b", zeros({1})); }
    void unnamed_child() { register_module("", std::make_shared<Leaf>(1)); }
    void null_child() { register_module("n", std::shared_ptr<Leaf>()); }
    // A parameter made from a graph (here 2 x, x requiring grad) is cut from it: a leaf of its own.
    Tensor from_graph() {
      Tensor x = ones({2}).requires_grad_(true);
      return register_parameter("g", x * 2.0);
    }
  };
  Bad b;
  EXPECT_LINEA_ERROR(b.buffer_twice(), "Bad: buffer 'r' registered twice");
  EXPECT_LINEA_ERROR(b.child_twice(), "Bad: submodule 'c' registered twice");
  EXPECT_LINEA_ERROR(b.undefined_host_buffer(), "Bad: host buffer 'h' must be a defined CPU tensor");
  EXPECT_LINEA_ERROR(b.undefined_parameter(), "Bad: parameter 'u' must be a defined floating tensor");
  EXPECT_LINEA_ERROR(b.undefined_buffer(), "Bad: buffer 'u' is undefined");
  EXPECT_LINEA_ERROR(b.dotted_buffer(), "Bad: invalid name 'a.b' (must be non-empty and contain no '.')");
  EXPECT_LINEA_ERROR(b.unnamed_child(), "Bad: invalid name '' (must be non-empty and contain no '.')");
  EXPECT_LINEA_ERROR(b.null_child(), "Bad: submodule 'n' is null");
  const Tensor g = b.from_graph();
  EXPECT_TRUE(g.is_leaf());
  EXPECT_TRUE(g.requires_grad());
  EXPECT_EQ(g.to_vector<float>(), std::vector<float>(2, 2.0f));
  EXPECT_LINEA_ERROR(b.twice(), "registered twice");
  EXPECT_LINEA_ERROR(b.dotted(), "invalid name 'a.b'");
  EXPECT_LINEA_ERROR(b.integer(), "Bad: parameter 'i' must be a defined floating tensor");
  auto t = std::make_shared<Tree>();
  EXPECT_LINEA_ERROR(t->blocks->at(7), "index 7 out of range");
}

// check_finite_weights names the source and the first weight holding NaN or Inf, and counts them.
TEST(Module, NonFiniteWeightsAreNamed) {
  Tree t;
  nn::check_finite_weights(t, "model.safetensors");
  {
    NoGradGuard ng;
    t.blocks->at<Leaf>(1)->w.fill_(NAN);  // [2, 2]
    t.blocks->at<Leaf>(1)->b.fill_(INFINITY);
  }
  EXPECT_LINEA_ERROR(nn::check_finite_weights(t, "model.safetensors"),
                     "model.safetensors: weight 'blocks.1.b' holds 2 non-finite values (NaN or Inf) of 2;");
}
