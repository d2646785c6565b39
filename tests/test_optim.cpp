// Optimizers, gradient clipping and learning-rate schedules (nn/optim.h, nn/schedule.h, and the
// raw fused steps of core/ops_optim.h) on the CPU: single and double steps against values
// worked out by hand in the comments, parameter groups, state-dict round trips that must
// continue bit for bit, clipping, schedule values at chosen steps, a small regression fitted by
// each optimizer, and the errors bad input must raise.
// Not here: CUDA parity of the step kernels (tests/test_cuda_parity.cpp, CudaParity.OptimizerSteps).
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "core/ops.h"
#include "core/ops_optim.h"
#include "nn/module.h"
#include "nn/optim.h"
#include "nn/schedule.h"
#include "tests/test_util.h"

namespace linea {
namespace {

using nn::ParamGroup;

constexpr double kTol = 1e-12;  // float64 steps vs hand arithmetic

// A float64 leaf parameter [n] with the given values.
Tensor param64(const std::vector<double>& v) {
  Tensor p = from_vector<double>(v, {static_cast<int64_t>(v.size())});
  p.requires_grad_(true);
  return p;
}

void set_grad64(Tensor p, const std::vector<double>& g) {
  p.set_grad(from_vector<double>(g, {static_cast<int64_t>(g.size())}));
}

std::vector<ParamGroup> one_group(const std::vector<Tensor>& ps, double lr, double wd = 0.0) {
  ParamGroup g;
  g.params = ps;
  g.lr = lr;
  g.weight_decay = wd;
  return {g};
}

void expect_values(const Tensor& t, const std::vector<double>& want, double tol = kTol) {
  std::vector<double> got = t.to_vector<double>();
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(got[i], want[i], tol) << "element " << i;
}

bool same_bits(const Tensor& a, const Tensor& b) {
  if (a.shape() != b.shape() || a.dtype() != b.dtype()) return false;
  Tensor ca = raw::contiguous(a), cb = raw::contiguous(b);
  return std::memcmp(ca.data_ptr(), cb.data_ptr(), static_cast<size_t>(ca.numel()) * ca.element_size()) == 0;
}

// ---- SGD ------------------------------------------------------------------------------------------
TEST(SGDStep, Plain) {
  // p = [1, -2], g = [0.5, 0.25], lr = 0.1:  p - lr * g = [1 - 0.05, -2 - 0.025]
  Tensor p = param64({1.0, -2.0});
  nn::SGD opt(one_group({p}, 0.1));
  set_grad64(p, {0.5, 0.25});
  opt.step();
  expect_values(p, {0.95, -2.025});
  EXPECT_EQ(opt.steps(), 1);
}

TEST(SGDStep, WeightDecay) {
  // wd = 0.1: g' = g + wd * p = [0.5 + 0.1, 0.25 - 0.2] = [0.6, 0.05]; p - 0.1 * g' = [0.94, -2.005]
  Tensor p = param64({1.0, -2.0});
  nn::SGD opt(one_group({p}, 0.1, 0.1));
  set_grad64(p, {0.5, 0.25});
  opt.step();
  expect_values(p, {0.94, -2.005});
}

TEST(SGDStep, MomentumTwoSteps) {
  // momentum 0.9, lr 0.1, g = 0.5 both steps.
  // step 1: buf = g = 0.5;                    p = 1 - 0.1 * 0.5 = 0.95
  // step 2: buf = 0.9 * 0.5 + 0.5 = 0.95;     p = 0.95 - 0.1 * 0.95 = 0.855
  Tensor p = param64({1.0});
  nn::SGD opt(one_group({p}, 0.1), 0.9);
  set_grad64(p, {0.5});
  opt.step();
  expect_values(p, {0.95});
  set_grad64(p, {0.5});
  opt.step();
  expect_values(p, {0.855});
  expect_values(opt.state_dict().at("0.0.momentum_buffer"), {0.95});
}

TEST(SGDStep, DampeningTwoSteps) {
  // momentum 0.9, dampening 0.1: step 1 buf = g = 0.5 (no dampening on the first step), p = 0.95
  // step 2: buf = 0.9 * 0.5 + (1 - 0.1) * 0.5 = 0.45 + 0.45 = 0.9;  p = 0.95 - 0.1 * 0.9 = 0.86
  Tensor p = param64({1.0});
  nn::SGD opt(one_group({p}, 0.1), 0.9, 0.1);
  set_grad64(p, {0.5});
  opt.step();
  expect_values(p, {0.95});
  set_grad64(p, {0.5});
  opt.step();
  expect_values(p, {0.86});
}

TEST(SGDStep, NesterovTwoSteps) {
  // momentum 0.9, Nesterov, lr 0.1, g = 0.5 both steps.
  // step 1: buf = 0.5;  update = g + 0.9 * buf = 0.5 + 0.45 = 0.95;     p = 1 - 0.095 = 0.905
  // step 2: buf = 0.9 * 0.5 + 0.5 = 0.95;  update = 0.5 + 0.9 * 0.95 = 1.355;  p = 0.905 - 0.1355 = 0.7695
  Tensor p = param64({1.0});
  nn::SGD opt(one_group({p}, 0.1), 0.9, 0.0, true);
  set_grad64(p, {0.5});
  opt.step();
  expect_values(p, {0.905});
  set_grad64(p, {0.5});
  opt.step();
  expect_values(p, {0.7695});
}

TEST(SGDStep, MomentumWithWeightDecay) {
  // momentum 0.9, wd 0.1, lr 0.1, p = 1, g = 0.5.
  // step 1: g' = 0.5 + 0.1 * 1 = 0.6;  buf = 0.6;  p = 1 - 0.06 = 0.94
  // step 2: g' = 0.5 + 0.1 * 0.94 = 0.594;  buf = 0.9 * 0.6 + 0.594 = 1.134;  p = 0.94 - 0.1134 = 0.8266
  Tensor p = param64({1.0});
  nn::SGD opt(one_group({p}, 0.1, 0.1), 0.9);
  set_grad64(p, {0.5});
  opt.step();
  expect_values(p, {0.94});
  set_grad64(p, {0.5});
  opt.step();
  expect_values(p, {0.8266});
}

// ---- Adam / AdamW ---------------------------------------------------------------------------------
TEST(AdamStep, OneStep) {
  // lr 0.1, b1 0.9, b2 0.999, eps 1e-8, p = 1, g = 0.5:
  // m = 0.1 * 0.5 = 0.05;  v = 0.001 * 0.25 = 0.00025
  // m_hat = 0.05 / (1 - 0.9) = 0.5;  v_hat = 0.00025 / (1 - 0.999) = 0.25;  sqrt(v_hat) = 0.5
  // p = 1 - 0.1 * 0.5 / (0.5 + 1e-8) = 1 - 0.1 * 0.99999998 = 0.900000002
  Tensor p = param64({1.0});
  nn::Adam opt(one_group({p}, 0.1));
  set_grad64(p, {0.5});
  opt.step();
  expect_values(p, {0.900000002});
  nn::StateDict sd = opt.state_dict();
  expect_values(sd.at("0.0.exp_avg"), {0.05});
  expect_values(sd.at("0.0.exp_avg_sq"), {0.00025});
  EXPECT_EQ(sd.at("step").item<int64_t>(), 1);
}

TEST(AdamStep, TwoStepsBiasCorrection) {
  // step 1 as in OneStep: p1 = 0.900000002, m1 = 0.05, v1 = 0.00025.
  // step 2 with g = 0.25:
  //   m2 = 0.9 * 0.05 + 0.1 * 0.25 = 0.045 + 0.025 = 0.07
  //   v2 = 0.999 * 0.00025 + 0.001 * 0.0625 = 0.00024975 + 0.0000625 = 0.00031225
  //   bias corrections: 1 - 0.9^2 = 0.19,  1 - 0.999^2 = 0.001999
  //   m_hat = 0.07 / 0.19 = 0.368421052631579;  v_hat = 0.00031225 / 0.001999 = 0.156203101550775
  //   p2 = p1 - 0.1 * m_hat / (sqrt(v_hat) + 1e-8) = 0.900000002 - 0.1 * 0.368421052631579 / 0.395225380701664
  //      = 0.900000002 - 0.0932179615225383 = 0.806782040477462
  const double m_hat = 0.07 / 0.19, v_hat = 0.00031225 / 0.001999;
  const double p2 = 0.900000002 - 0.1 * m_hat / (std::sqrt(v_hat) + 1e-8);
  EXPECT_NEAR(p2, 0.806782040477462, 1e-13);  // the number the arithmetic above gives
  Tensor p = param64({1.0});
  nn::Adam opt(one_group({p}, 0.1));
  set_grad64(p, {0.5});
  opt.step();
  set_grad64(p, {0.25});
  opt.step();
  expect_values(p, {p2});
  nn::StateDict sd = opt.state_dict();
  expect_values(sd.at("0.0.exp_avg"), {0.07});
  expect_values(sd.at("0.0.exp_avg_sq"), {0.00031225});
  EXPECT_EQ(opt.steps(), 2);
}

TEST(AdamStep, L2WeightDecay) {
  // Adam adds wd * p to the gradient: p = 2, g = -0.1, wd = 0.1, lr = 0.1 -> g' = -0.1 + 0.2 = 0.1
  // step 1: m = 0.01, v = 0.001 * 0.01 = 1e-5; m_hat = 0.1, v_hat = 0.01, sqrt = 0.1
  //         p = 2 - 0.1 * 0.1 / (0.1 + 1e-8) = 2 - 0.0999999900000001 = 1.90000001 (moves down,
  //         while without decay the negative gradient would move it up)
  Tensor p = param64({2.0});
  nn::Adam opt(one_group({p}, 0.1, 0.1));
  set_grad64(p, {-0.1});
  opt.step();
  const double p1 = 2.0 - 0.1 * 0.1 / (0.1 + 1e-8);
  EXPECT_NEAR(p1, 1.90000001, 1e-12);
  expect_values(p, {p1});
  // step 2: g' = -0.1 + 0.1 * p1;  m = 0.9 * 0.01 + 0.1 * g';  v = 0.999 * 1e-5 + 0.001 * g'^2
  const double g2 = -0.1 + 0.1 * p1;
  const double m2 = 0.9 * 0.01 + 0.1 * g2, v2 = 0.999 * 1e-5 + 0.001 * g2 * g2;
  const double want = p1 - 0.1 * (m2 / 0.19) / (std::sqrt(v2 / 0.001999) + 1e-8);
  set_grad64(p, {-0.1});
  opt.step();
  expect_values(p, {want});
}

TEST(AdamWStep, DecoupledDecayTwoSteps) {
  // AdamW: p *= 1 - lr * wd first, the gradient is left alone. lr 0.1, wd 0.1, p = 1, g = 0.5:
  // step 1: p = 1 * (1 - 0.01) = 0.99; Adam part as in AdamStep.OneStep: 0.1 * 0.5 / (0.5 + 1e-8)
  //         p1 = 0.99 - 0.099999998 = 0.890000002
  // step 2 (g = 0.25): p = p1 * 0.99, then minus 0.1 * m_hat / (sqrt(v_hat) + eps) with the same
  //         m_hat = 0.07 / 0.19 and v_hat = 0.00031225 / 0.001999 as AdamStep.TwoStepsBiasCorrection
  Tensor p = param64({1.0});
  nn::AdamW opt(one_group({p}, 0.1, 0.1));
  set_grad64(p, {0.5});
  opt.step();
  expect_values(p, {0.890000002});
  set_grad64(p, {0.25});
  opt.step();
  const double want = 0.890000002 * 0.99 - 0.1 * (0.07 / 0.19) / (std::sqrt(0.00031225 / 0.001999) + 1e-8);
  expect_values(p, {want});
  EXPECT_TRUE(opt.decoupled());
}

TEST(AdamWStep, ZeroDecayEqualsAdam) {
  Tensor a = param64({0.3, -1.2, 2.0}), b = param64({0.3, -1.2, 2.0});
  nn::Adam adam(one_group({a}, 0.01));
  nn::AdamW adamw(one_group({b}, 0.01));
  for (int s = 0; s < 3; ++s) {
    set_grad64(a, {0.1 * s, -0.7, 0.05});
    set_grad64(b, {0.1 * s, -0.7, 0.05});
    adam.step();
    adamw.step();
  }
  EXPECT_TRUE(same_bits(a, b));
}

// ---- groups, lr, bookkeeping --------------------------------------------------------------------
TEST(Optim, SkipsParamsWithoutGrad) {
  Tensor a = param64({1.0}), b = param64({2.0});
  nn::Adam opt(one_group({a, b}, 0.1));
  set_grad64(a, {0.5});
  opt.step();
  expect_values(b, {2.0}, 0.0);
  nn::StateDict sd = opt.state_dict();
  EXPECT_TRUE(sd.count("0.0.exp_avg"));
  EXPECT_FALSE(sd.count("0.1.exp_avg"));  // b never had a gradient: no state
}

TEST(Optim, ParamGroupsDifferentLrAndNoDecay) {
  // group 0: lr 0.1, wd 0.5;  group 1: lr 0.05, no decay.  p = 1, g = 0.5 in both.
  // group 0: g' = 0.5 + 0.5 * 1 = 1.0, p = 1 - 0.1 * 1.0 = 0.9
  // group 1: p = 1 - 0.05 * 0.5 = 0.975
  Tensor w = param64({1.0}), bias = param64({1.0});
  ParamGroup g0{{w}, 0.1, 0.5}, g1{{bias}, 0.05, 0.0};
  nn::SGD opt({g0, g1});
  set_grad64(w, {0.5});
  set_grad64(bias, {0.5});
  opt.step();
  expect_values(w, {0.9});
  expect_values(bias, {0.975});
}

TEST(Optim, SetLrKeepsGroupScale) {
  Tensor w = param64({1.0}), bias = param64({1.0});
  ParamGroup g0{{w}, 0.1, 0.0}, g1{{bias}, 0.05, 0.0};
  nn::SGD opt({g0, g1});
  opt.set_lr(0.2);  // group 1 was created with half the base lr and keeps half
  EXPECT_DOUBLE_EQ(opt.param_groups()[0].lr, 0.2);
  EXPECT_DOUBLE_EQ(opt.param_groups()[1].lr, 0.1);
  // The new lr is used: g = 1 -> w = 1 - 0.2, bias = 1 - 0.1
  set_grad64(w, {1.0});
  set_grad64(bias, {1.0});
  opt.step();
  expect_values(w, {0.8});
  expect_values(bias, {0.9});
  EXPECT_LINEA_ERROR(opt.set_lr(-1.0), "set_lr");
}

TEST(Optim, ZeroGradDropsGradients) {
  Tensor a = param64({1.0, 2.0});
  nn::SGD opt(one_group({a}, 0.1));
  set_grad64(a, {1.0, 1.0});
  opt.zero_grad();
  EXPECT_FALSE(a.grad().defined());
  opt.step();  // nothing to do
  expect_values(a, {1.0, 2.0}, 0.0);
}

class TinyNet : public nn::Module {
 public:
  TinyNet() : Module("TinyNet") {
    weight = register_parameter("weight", zeros({2, 3}));
    bias = register_parameter("bias", zeros({2}));
    norm_weight = register_parameter("norm_weight", ones({3}));
    embed = register_parameter("embed", zeros({4, 3}));
  }
  Tensor weight, bias, norm_weight, embed;
};

TEST(Optim, DecayGroups) {
  TinyNet net;
  auto groups = nn::decay_groups(net, 0.01, 0.1);
  ASSERT_EQ(groups.size(), 2u);
  EXPECT_DOUBLE_EQ(groups[0].lr, 0.01);
  EXPECT_DOUBLE_EQ(groups[1].lr, 0.01);
  EXPECT_DOUBLE_EQ(groups[0].weight_decay, 0.1);
  EXPECT_DOUBLE_EQ(groups[1].weight_decay, 0.0);
  ASSERT_EQ(groups[0].params.size(), 2u);  // weight, embed (dim 2)
  EXPECT_TRUE(groups[0].params[0].same(net.weight));
  EXPECT_TRUE(groups[0].params[1].same(net.embed));
  ASSERT_EQ(groups[1].params.size(), 2u);  // bias, norm_weight (dim 1)
  EXPECT_TRUE(groups[1].params[0].same(net.bias));
  EXPECT_TRUE(groups[1].params[1].same(net.norm_weight));

  auto g2 = nn::decay_groups(net, 0.01, 0.1, {"embed"});
  ASSERT_EQ(g2[0].params.size(), 1u);
  EXPECT_TRUE(g2[0].params[0].same(net.weight));
  EXPECT_EQ(g2[1].params.size(), 3u);
  nn::AdamW opt(groups);  // the groups are valid optimizer input
  EXPECT_EQ(opt.param_groups().size(), 2u);
}

TEST(Optim, StepBumpsVersionSoStaleGraphsFail) {
  Tensor p = param64({1.0, 2.0});
  Tensor y = sum(mul(p, p));  // records p
  nn::SGD opt(one_group({p}, 0.1));
  set_grad64(p, {1.0, 1.0});
  const uint64_t v0 = p.impl().storage->version;
  opt.step();
  EXPECT_GT(p.impl().storage->version, v0);
  EXPECT_LINEA_ERROR(y.backward(), "modified by an in-place operation");
}

TEST(Optim, StepRecordsNoGraph) {
  Tensor p = param64({1.0});
  nn::Adam opt(one_group({p}, 0.1));
  set_grad64(p, {0.5});
  opt.step();
  EXPECT_TRUE(p.is_leaf());
  EXPECT_TRUE(p.requires_grad());
}

TEST(Optim, StateFollowsParameterDtype) {
  // A module converted after the state exists (Module::to(dtype) replaces the data in place).
  Tensor p = from_vector<float>({1.0f, 2.0f}, {2});
  p.requires_grad_(true);
  nn::Adam opt(one_group({p}, 0.1));
  p.set_grad(from_vector<float>({0.5f, 0.5f}, {2}));
  opt.step();
  nn::replace_data(p, raw::to_dtype(p.detach(), DType::Float64));
  set_grad64(p, {0.5, 0.5});
  opt.step();
  EXPECT_EQ(opt.state_dict().at("0.0.exp_avg").dtype(), DType::Float64);
}

// ---- state dicts ----------------------------------------------------------------------------------
// Deterministic gradient for step s of parameter k.
Tensor grad_for(const Tensor& p, int s, int k) {
  Tensor idx = arange(0.0, static_cast<double>(p.numel()), 1.0, TensorOptions(p.dtype()));
  Tensor g = sin(add(mul(idx, 0.37 + 0.11 * k), 0.5 * s + k));
  return reshape(g, p.shape()).detach();
}

using MakeOpt = std::function<std::unique_ptr<nn::Optimizer>(std::vector<ParamGroup>)>;

void check_round_trip(const MakeOpt& make, const char* what) {
  SCOPED_TRACE(what);
  manual_seed(7);
  auto make_params = [] {
    std::vector<Tensor> ps = {randn({3, 4}), randn({5}), randn({1})};
    for (auto& p : ps) p.requires_grad_(true);
    return ps;
  };
  auto groups_of = [](const std::vector<Tensor>& ps) {
    ParamGroup g0{{ps[0]}, 0.05, 0.01}, g1{{ps[1], ps[2]}, 0.025, 0.0};
    return std::vector<ParamGroup>{g0, g1};
  };
  auto run = [](nn::Optimizer& opt, const std::vector<Tensor>& ps, int from, int to) {
    for (int s = from; s < to; ++s) {
      for (size_t k = 0; k < ps.size(); ++k) Tensor(ps[k]).set_grad(grad_for(ps[k], s, static_cast<int>(k)));
      opt.step();
    }
  };
  std::vector<Tensor> a = make_params();
  auto opt_a = make(groups_of(a));
  run(*opt_a, a, 0, 3);
  nn::StateDict sd = opt_a->state_dict();
  std::vector<Tensor> saved;
  for (auto& p : a) saved.push_back(raw::clone(p.detach()));
  run(*opt_a, a, 3, 6);  // continue without saving (must not change the snapshot)

  std::vector<Tensor> b;
  for (auto& p : saved) {
    Tensor q = raw::clone(p);
    q.requires_grad_(true);
    b.push_back(q);
  }
  auto opt_b = make(groups_of(b));
  opt_b->load_state_dict(sd);
  EXPECT_EQ(opt_b->steps(), 3);
  run(*opt_b, b, 3, 6);
  for (size_t k = 0; k < a.size(); ++k) EXPECT_TRUE(same_bits(a[k], b[k])) << "parameter " << k;
  EXPECT_TRUE(same_bits(opt_a->state_dict().begin()->second, opt_b->state_dict().begin()->second));
  // Loaded into the optimizer that went on (its step count on the device, for Adam): the same.
  for (size_t k = 0; k < a.size(); ++k) a[k].detach().copy_(saved[k]);
  opt_a->load_state_dict(sd);
  EXPECT_EQ(opt_a->steps(), 3);
  run(*opt_a, a, 3, 6);
  for (size_t k = 0; k < a.size(); ++k) EXPECT_TRUE(same_bits(a[k], b[k])) << "parameter " << k << ", reloaded";
}

TEST(Optim, StateDictRoundTripIsBitIdentical) {
  check_round_trip([](std::vector<ParamGroup> g) { return std::make_unique<nn::SGD>(std::move(g), 0.9, 0.0, true); },
                   "SGD nesterov");
  check_round_trip([](std::vector<ParamGroup> g) { return std::make_unique<nn::SGD>(std::move(g)); }, "SGD plain");
  check_round_trip([](std::vector<ParamGroup> g) { return std::make_unique<nn::Adam>(std::move(g)); }, "Adam");
  check_round_trip([](std::vector<ParamGroup> g) { return std::make_unique<nn::AdamW>(std::move(g), 0.8, 0.99); },
                   "AdamW");
}

TEST(Optim, StateDictKeys) {
  Tensor a = param64({1.0, 2.0}), b = param64({3.0});
  ParamGroup g0{{a}, 0.1, 0.0}, g1{{b}, 0.1, 0.0};
  nn::Adam adam({g0, g1});
  nn::StateDict empty_sd = adam.state_dict();
  EXPECT_EQ(empty_sd.size(), 1u);  // only "step" before the first update
  EXPECT_EQ(empty_sd.at("step").dim(), 0);
  EXPECT_EQ(empty_sd.at("step").dtype(), DType::Int64);
  set_grad64(a, {1.0, 1.0});
  set_grad64(b, {1.0});
  adam.step();
  nn::StateDict sd = adam.state_dict();
  std::vector<std::string> keys;
  for (auto& [k, _] : sd) keys.push_back(k);
  EXPECT_EQ(keys, (std::vector<std::string>{"0.0.exp_avg", "0.0.exp_avg_sq", "1.0.exp_avg", "1.0.exp_avg_sq", "step"}));
  nn::SGD sgd({g0, g1}, 0.5);
  sgd.step();
  EXPECT_TRUE(sgd.state_dict().count("1.0.momentum_buffer"));
  nn::SGD plain({g0, g1});
  plain.step();
  EXPECT_EQ(plain.state_dict().size(), 1u);
}

TEST(Optim, StateDictRejectsMismatches) {
  Tensor a = param64({1.0, 2.0});
  set_grad64(a, {1.0, 1.0});
  nn::Adam adam(one_group({a}, 0.1));
  adam.step();
  nn::StateDict sd = adam.state_dict();

  nn::SGD sgd(one_group({a}, 0.1), 0.9);
  EXPECT_LINEA_ERROR(sgd.load_state_dict(sd), "unexpected keys: 0.0.exp_avg, 0.0.exp_avg_sq");

  nn::Adam other(one_group({param64({1.0, 2.0, 3.0})}, 0.1));
  EXPECT_LINEA_ERROR(other.load_state_dict(sd), "shape mismatch: 0.0.exp_avg (expected [3], got [2])");

  nn::StateDict no_step = sd;
  no_step.erase("step");
  EXPECT_LINEA_ERROR(adam.load_state_dict(no_step), "missing keys: step");

  nn::StateDict half = sd;
  half.erase("0.0.exp_avg_sq");
  EXPECT_LINEA_ERROR(adam.load_state_dict(half), "missing keys: 0.0.exp_avg_sq");

  nn::StateDict extra = sd;
  extra["0.1.exp_avg"] = zeros({2}, TensorOptions(DType::Float64));
  EXPECT_LINEA_ERROR(adam.load_state_dict(extra), "unexpected keys: 0.1.exp_avg");

  nn::StateDict ints = sd;
  ints["0.0.exp_avg"] = zeros({2}, TensorOptions(DType::Int64));
  EXPECT_LINEA_ERROR(adam.load_state_dict(ints), "bad values: 0.0.exp_avg has dtype int64");

  nn::StateDict bad_step = sd;
  bad_step["step"] = scalar_tensor(1.0);
  EXPECT_LINEA_ERROR(adam.load_state_dict(bad_step), "step must be a one-element int64 tensor");
  // (Read exactly: 2^63 - 3 went through a double, rounded to 2^63 and overflowed the conversion.)
  for (const int64_t step : {int64_t{-1}, (int64_t{1} << 53) + 1, std::numeric_limits<int64_t>::max() - 2}) {
    bad_step["step"] = from_vector<int64_t>({step}, {});
    EXPECT_LINEA_ERROR(adam.load_state_dict(bad_step), "step is " + std::to_string(step) + " (expected 0 to 2^53)");
  }

  // A failed load changes nothing.
  EXPECT_EQ(adam.steps(), 1);
  expect_values(adam.state_dict().at("0.0.exp_avg"), {0.1, 0.1});
}

// ---- clipping -------------------------------------------------------------------------------------
TEST(ClipGradNorm, ScalesToMaxNorm) {
  // grads [3, 4] and [12]: norm = sqrt(9 + 16 + 144) = 13; max_norm 6.5 -> coef = 6.5 / (13 + 1e-6)
  Tensor a = param64({0.0, 0.0}), b = param64({0.0}), c = param64({0.0});
  set_grad64(a, {3.0, 4.0});
  set_grad64(b, {12.0});
  Tensor norm = nn::clip_grad_norm_({a, b, c}, 6.5);
  EXPECT_EQ(norm.dim(), 0);
  EXPECT_NEAR(norm.item(), 13.0, kTol);
  const double coef = 6.5 / (13.0 + 1e-6);
  expect_values(a.grad(), {3.0 * coef, 4.0 * coef});
  expect_values(b.grad(), {12.0 * coef});
  EXPECT_FALSE(c.grad().defined());  // skipped, not created
  // The clipped norm is max_norm (up to the 1e-6 guard).
  EXPECT_NEAR(nn::clip_grad_norm_({a, b}, 100.0).item(), 6.5, 1e-6);
}

TEST(ClipGradNorm, GradNormMeasuresWithoutScaling) {
  Tensor a = param64({0.0, 0.0}), b = param64({0.0}), c = param64({0.0});
  set_grad64(a, {3.0, 4.0});
  set_grad64(b, {12.0});
  Tensor before = raw::clone(a.grad());
  EXPECT_NEAR(nn::grad_norm({a, b, c}).item(), 13.0, kTol);
  EXPECT_TRUE(same_bits(a.grad(), before));  // untouched
  EXPECT_EQ(nn::grad_norm({c}).item(), 0.0);
  // The same norm clip_grad_norm_ reports.
  EXPECT_EQ(nn::grad_norm({a, b}).item(), nn::clip_grad_norm_({a, b}, 100.0).item());
}

TEST(ClipGradNorm, NoOpBelowMax) {
  Tensor a = from_vector<float>({0.1f, -0.2f, 0.3f}, {3});
  a.requires_grad_(true);
  a.set_grad(from_vector<float>({0.1f, -0.2f, 0.3f}, {3}));
  Tensor before = raw::clone(a.grad());
  Tensor norm = nn::clip_grad_norm_({a}, 1.0);
  EXPECT_EQ(norm.dtype(), DType::Float32);
  EXPECT_NEAR(norm.item(), std::sqrt(0.01 + 0.04 + 0.09), 1e-6);
  EXPECT_TRUE(same_bits(a.grad(), before));
}

TEST(ClipGradNorm, MixedDtypesAndNoGrads) {
  Tensor a = param64({0.0});
  Tensor b = from_vector<float>({0.0f}, {1});
  b.requires_grad_(true);
  set_grad64(a, {3.0});
  b.set_grad(from_vector<float>({4.0f}, {1}));
  Tensor norm = nn::clip_grad_norm_({a, b}, 1.0);  // norm 5, coef 0.2
  EXPECT_EQ(norm.dtype(), DType::Float64);
  EXPECT_NEAR(norm.item(), 5.0, 1e-6);
  EXPECT_NEAR(a.grad().item(), 0.6, 1e-6);
  EXPECT_NEAR(b.grad().item(), 0.8, 1e-6);
  // The float32 gradient first: the float64 one is scaled by the coefficient in its own dtype.
  set_grad64(a, {3.0});
  b.set_grad(from_vector<float>({4.0f}, {1}));
  EXPECT_EQ(nn::clip_grad_norm_({b, a}, 1.0).dtype(), DType::Float32);
  EXPECT_EQ(a.grad().dtype(), DType::Float64);
  EXPECT_NEAR(a.grad().item(), 0.6, 1e-6);
  // No gradients: a zero norm in the first parameter's dtype.
  Tensor none = nn::clip_grad_norm_({param64({1.0})}, 1.0);
  EXPECT_EQ(none.item(), 0.0);
  EXPECT_EQ(none.dtype(), DType::Float64);
  EXPECT_EQ(nn::grad_norm({param64({1.0})}).dtype(), DType::Float64);
  EXPECT_LINEA_ERROR(nn::clip_grad_norm_({a}, 0.0), "max_norm must be finite and > 0");
}

// ---- schedules ------------------------------------------------------------------------------------
TEST(Schedule, Constant) {
  nn::ConstantLR s(0.3);
  EXPECT_EQ(s.lr_at(0), 0.3);
  EXPECT_EQ(s.lr_at(12345), 0.3);
  EXPECT_EQ(s.name(), "constant(lr=0.3)");
}

TEST(Schedule, WarmupCosine) {
  // base 1, warmup 10, total 110, min 0.1.
  nn::WarmupCosine s(1.0, 10, 110, 0.1);
  EXPECT_NEAR(s.lr_at(0), 0.1, kTol);   // 1 * (0 + 1) / 10
  EXPECT_NEAR(s.lr_at(4), 0.5, kTol);   // 1 * 5 / 10
  EXPECT_NEAR(s.lr_at(9), 1.0, kTol);   // warmup - 1: 10 / 10
  EXPECT_NEAR(s.lr_at(10), 1.0, kTol);  // progress 0: 0.1 + 0.9 * (1 + cos 0) / 2
  // progress (35 - 10) / 100 = 0.25: 0.1 + 0.9 * (1 + cos(pi / 4)) / 2 = 0.1 + 0.45 * 1.70710678118655
  EXPECT_NEAR(s.lr_at(35), 0.868198051533946, kTol);
  EXPECT_NEAR(s.lr_at(60), 0.55, kTol);   // middle, progress 0.5: 0.1 + 0.9 * (1 + 0) / 2
  EXPECT_NEAR(s.lr_at(110), 0.1, kTol);   // total: min_lr
  EXPECT_NEAR(s.lr_at(5000), 0.1, kTol);  // beyond: min_lr
  EXPECT_EQ(s.name(), "warmup_cosine(base_lr=1, warmup=10, total=110, min_lr=0.1)");
  // No warmup, min 0: starts at base, ends at 0.
  nn::WarmupCosine s0(2.0, 0, 4);
  EXPECT_NEAR(s0.lr_at(0), 2.0, kTol);
  EXPECT_NEAR(s0.lr_at(2), 1.0, kTol);
  EXPECT_NEAR(s0.lr_at(4), 0.0, kTol);
}

TEST(Schedule, InverseSqrt) {
  nn::InverseSqrt s(1.0, 4);
  EXPECT_NEAR(s.lr_at(0), 0.25, kTol);               // 1 * 1 / 4
  EXPECT_NEAR(s.lr_at(3), 1.0, kTol);                // warmup - 1
  EXPECT_NEAR(s.lr_at(4), 0.894427190999916, kTol);  // sqrt(4 / 5)
  EXPECT_NEAR(s.lr_at(15), 0.5, kTol);               // sqrt(4 / 16)
  EXPECT_NEAR(s.lr_at(99), 0.2, kTol);               // sqrt(4 / 100)
  nn::InverseSqrt nw(1.0, 0);                        // no warmup: 1 / sqrt(s + 1)
  EXPECT_NEAR(nw.lr_at(0), 1.0, kTol);
  EXPECT_NEAR(nw.lr_at(3), 0.5, kTol);
  EXPECT_EQ(s.name(), "inverse_sqrt(base_lr=1, warmup=4)");
}

TEST(Schedule, ApplyScheduleSetsScaledGroupLr) {
  Tensor w = param64({1.0}), b = param64({1.0});
  ParamGroup g0{{w}, 1.0, 0.0}, g1{{b}, 0.5, 0.0};
  nn::SGD opt({g0, g1});
  nn::Schedule sched = nn::WarmupCosine(0.2, 10, 110);
  EXPECT_NEAR(nn::apply_schedule(opt, sched, 4), 0.1, kTol);
  EXPECT_NEAR(opt.param_groups()[0].lr, 0.1, kTol);
  EXPECT_NEAR(opt.param_groups()[1].lr, 0.05, kTol);
}

TEST(Schedule, MakeByName) {
  EXPECT_NEAR(nn::lr_at(nn::make_schedule("constant", 0.1, 5, 50), 40), 0.1, kTol);
  EXPECT_NEAR(nn::lr_at(nn::make_schedule("cosine", 0.1, 5, 50), 50), 0.0, kTol);
  EXPECT_NEAR(nn::lr_at(nn::make_schedule("inverse_sqrt", 0.1, 4, 0), 15), 0.05, kTol);
  EXPECT_EQ(nn::schedule_name(nn::make_schedule("cosine", 0.5, 1, 2)),
            "warmup_cosine(base_lr=0.5, warmup=1, total=2, min_lr=0)");
  EXPECT_LINEA_ERROR(nn::make_schedule("linear", 0.1, 0, 10), "unknown schedule 'linear'");
}

TEST(Schedule, BadArguments) {
  EXPECT_LINEA_ERROR(nn::WarmupCosine(1.0, 10, 5),
                     "WarmupCosine: total_steps must be > 0 and >= warmup_steps (10), got 5");
  EXPECT_LINEA_ERROR(nn::WarmupCosine(1.0, 0, 0),
                     "WarmupCosine: total_steps must be > 0 and >= warmup_steps (0), got 0");
  EXPECT_LINEA_ERROR(nn::WarmupCosine(1.0, 0, 10, 2.0), "WarmupCosine: min_lr (2) must not exceed base_lr (1)");
  EXPECT_LINEA_ERROR(nn::WarmupCosine(NAN, 0, 10), "WarmupCosine: base_lr must be finite and >= 0, got nan");
  EXPECT_LINEA_ERROR(nn::WarmupCosine(1.0, 0, 10, -0.5), "WarmupCosine: min_lr must be finite and >= 0, got -0.5");
  EXPECT_LINEA_ERROR(nn::WarmupCosine(1.0, -1, 10), "WarmupCosine: warmup_steps must be >= 0, got -1");
  EXPECT_LINEA_ERROR(nn::WarmupCosine(1.0, 2, 10).lr_at(-1), "WarmupCosine::lr_at: step must be >= 0, got -1");
  EXPECT_LINEA_ERROR(nn::ConstantLR(-0.1), "ConstantLR: lr must be finite and >= 0, got -0.1");
  EXPECT_LINEA_ERROR(nn::ConstantLR(0.1).lr_at(-1), "ConstantLR::lr_at: step must be >= 0, got -1");
  EXPECT_LINEA_ERROR(nn::InverseSqrt(-1.0, 0), "InverseSqrt: base_lr must be finite and >= 0, got -1");
  EXPECT_LINEA_ERROR(nn::InverseSqrt(0.1, -1), "InverseSqrt: warmup_steps must be >= 0, got -1");
  EXPECT_LINEA_ERROR(nn::InverseSqrt(0.1, 2).lr_at(-1), "InverseSqrt::lr_at: step must be >= 0, got -1");
}

// ---- a small regression: y = 3x + 1 ---------------------------------------------------------------
void fit_line(nn::Optimizer& opt, const Tensor& w, const Tensor& b, int steps, const nn::Schedule* sched = nullptr) {
  Tensor x = reshape(arange(-1.0, 1.0, 1.0 / 16.0), {32, 1});  // [32, 1]
  Tensor y = add(mul(x, 3.0), 1.0);                            // [32, 1]
  for (int s = 0; s < steps; ++s) {
    if (sched) nn::apply_schedule(opt, *sched, s);
    opt.zero_grad();
    Tensor pred = add(mul(x, w), b);  // [32, 1]
    Tensor loss = mean(square(sub(pred, y)));
    loss.backward();
    opt.step();
  }
  EXPECT_NEAR(w.item(), 3.0, 1e-2);
  EXPECT_NEAR(b.item(), 1.0, 1e-2);
}

std::vector<ParamGroup> line_params(Tensor* w, Tensor* b, double lr, double wd = 0.0) {
  *w = zeros({1});
  *b = zeros({1});
  w->requires_grad_(true);
  b->requires_grad_(true);
  return {ParamGroup{{*w}, lr, wd}, ParamGroup{{*b}, lr, 0.0}};
}

TEST(Regression, FitsLineWithEachOptimizer) {
  Tensor w, b;
  {
    SCOPED_TRACE("SGD");
    nn::SGD opt(line_params(&w, &b, 0.3));
    fit_line(opt, w, b, 200);
  }
  {
    SCOPED_TRACE("SGD momentum");
    nn::SGD opt(line_params(&w, &b, 0.1), 0.9);
    fit_line(opt, w, b, 200);
  }
  {
    SCOPED_TRACE("SGD Nesterov");
    nn::SGD opt(line_params(&w, &b, 0.1), 0.9, 0.0, true);
    fit_line(opt, w, b, 200);
  }
  {
    SCOPED_TRACE("Adam");
    nn::Adam opt(line_params(&w, &b, 0.1));
    nn::Schedule sched = nn::WarmupCosine(0.1, 10, 400);
    fit_line(opt, w, b, 400, &sched);
  }
  {
    SCOPED_TRACE("AdamW");
    nn::AdamW opt(line_params(&w, &b, 0.1, 1e-4));
    nn::Schedule sched = nn::InverseSqrt(0.1, 10);
    fit_line(opt, w, b, 600, &sched);
  }
}

// ---- raw steps ------------------------------------------------------------------------------------
TEST(RawOptim, ParallelPathMatchesScalarLoop) {
  // Above the OpenMP threshold; the reference is the same float32 expression in a plain loop.
  const int64_t n = 100003;
  Tensor p = randn({n}), g = randn({n}), m = abs(randn({n})), v = square(randn({n}));
  std::vector<float> P = p.to_vector<float>(), G = g.to_vector<float>(), M = m.to_vector<float>(),
                     V = v.to_vector<float>();
  Tensor pc = raw::clone(p), mc = raw::clone(m), vc = raw::clone(v);
  raw::adam_step(pc, g, mc, vc, 0.01, 0.9, 0.99, 1e-8, 0.05, true, 3);
  const auto s = linea::detail::adam_scalars(0.01, 0.9, 0.99, 0.05, true, 3);
  const float b1 = 0.9f, b2 = 0.99f, one_b1 = static_cast<float>(1.0 - 0.9), one_b2 = static_cast<float>(1.0 - 0.99),
              eps = 1e-8f, step_size = static_cast<float>(s.step_size), bc2 = static_cast<float>(s.bc2_sqrt),
              decay = static_cast<float>(s.decay);
  std::vector<float> got = pc.to_vector<float>(), gm = mc.to_vector<float>();
  int64_t bad = 0;
  for (int64_t i = 0; i < n; ++i) {
    const float pi = P[i] * decay;
    const float mi = b1 * M[i] + one_b1 * G[i];
    const float vi = b2 * V[i] + one_b2 * (G[i] * G[i]);
    const float want = pi - step_size * mi / (std::sqrt(vi) / bc2 + eps);
    bad += (got[i] != want) + (gm[i] != mi);
  }
  EXPECT_EQ(bad, 0);
}

// ---- the training step's fused pair: grad_norm_guard + adam_multi_step --------------------------------
// Float32 parameters of awkward sizes (0, 1, odd, above the OpenMP threshold) with gradients.
std::vector<Tensor> random_params(const std::vector<int64_t>& sizes) {
  std::vector<Tensor> ps;
  for (int64_t n : sizes) {
    Tensor p = randn({n});
    p.requires_grad_(true);
    p.set_grad(mul(randn({n}), 3.0));
    ps.push_back(p);
  }
  return ps;
}

std::vector<Tensor> clones_of(const std::vector<Tensor>& ps) {
  std::vector<Tensor> out;
  for (const Tensor& p : ps) {
    Tensor q = raw::clone(p.detach());
    q.requires_grad_(true);
    q.set_grad(raw::clone(p.grad()));
    out.push_back(q);
  }
  return out;
}

TEST(FusedStep, GradNormGuardEqualsClipGradNorm) {
  manual_seed(21);
  const std::vector<Tensor> ps = random_params({5, 0, 1, 40000, 257});
  const std::vector<Tensor> ref = clones_of(ps);
  const Tensor loss = scalar_tensor(0.5);
  const Tensor guard = nn::step_guard(ps, loss, 1.0);  // {norm, coef, ok}
  const Tensor norm = nn::clip_grad_norm_(ref, 1.0);
  const std::vector<double> g = guard.to_vector<double>();
  EXPECT_EQ(static_cast<float>(g[0]), norm.item<float>());  // the same float32 norm, bit for bit
  EXPECT_EQ(g[2], 1.0);
  // coef scales every gradient to what clip_grad_norm_ left in place.
  for (size_t i = 0; i < ps.size(); ++i) EXPECT_TRUE(same_bits(mul(ps[i].grad(), g[1]), ref[i].grad())) << i;
  // Without clipping, coef is 1; a non-finite loss or gradient fails the guard.
  EXPECT_EQ(nn::step_guard(ps, loss, 0.0).to_vector<double>()[1], 1.0);
  EXPECT_EQ(nn::step_guard(ps, scalar_tensor(NAN), 1.0).to_vector<double>()[2], 0.0);
  EXPECT_EQ(nn::step_guard(ps, scalar_tensor(INFINITY, TensorOptions(DType::Float32)), 1.0).to_vector<double>()[2],
            0.0);
  Tensor bad = ps[3].grad();
  bad.narrow(0, 7, 1).fill_(INFINITY);
  EXPECT_EQ(nn::step_guard(ps, loss, 1.0).to_vector<double>()[2], 0.0);
}

TEST(FusedStep, AdamMultiStepEqualsOneStepPerParameter) {
  // Two groups, three steps, clipping: the multi-tensor step against clip_grad_norm_ and one
  // adam_step per parameter, bit for bit (the CPU path of the training loop must not change).
  manual_seed(22);
  std::vector<Tensor> ps = random_params({33, 1, 40000, 8});
  std::vector<Tensor> ref = clones_of(ps);
  auto groups = [](const std::vector<Tensor>& v) {
    ParamGroup a{{v[0], v[2]}, 0.01, 0.05}, b{{v[1], v[3]}, 0.004, 0.0};
    return std::vector<ParamGroup>{a, b};
  };
  nn::AdamW fused(groups(ps), 0.9, 0.98, 1e-8), plain(groups(ref), 0.9, 0.98, 1e-8);
  for (int step = 0; step < 3; ++step) {
    if (step > 0)
      for (size_t i = 0; i < ps.size(); ++i) {
        const Tensor g = mul(randn({ps[i].numel()}), 2.0);
        ps[i].set_grad(g);
        ref[i].set_grad(raw::clone(g));
      }
    fused.step_guarded(nn::step_guard(ps, scalar_tensor(1.0), 1.0));
    nn::clip_grad_norm_(ref, 1.0);
    plain.step();
  }
  for (size_t i = 0; i < ps.size(); ++i) EXPECT_TRUE(same_bits(ps[i], ref[i])) << "parameter " << i;
  const nn::StateDict a = fused.state_dict(), b = plain.state_dict();
  for (const auto& [key, t] : b) EXPECT_TRUE(same_bits(a.at(key), t)) << key;
  EXPECT_EQ(fused.steps(), 3);
}

TEST(FusedStep, FailedGuardChangesNothing) {
  manual_seed(23);
  std::vector<Tensor> ps = random_params({17, 3});
  nn::Adam opt(one_group(ps, 0.01));
  opt.step_guarded(nn::step_guard(ps, scalar_tensor(1.0), 0.0));
  std::vector<Tensor> before;
  for (const Tensor& p : ps) before.push_back(raw::clone(p.detach()));
  const nn::StateDict sd = opt.state_dict();
  opt.step_guarded(nn::step_guard(ps, scalar_tensor(NAN), 0.0));
  for (size_t i = 0; i < ps.size(); ++i) EXPECT_TRUE(same_bits(ps[i], before[i]));
  for (const auto& [key, t] : opt.state_dict()) EXPECT_TRUE(same_bits(t, sd.at(key))) << key;
  EXPECT_EQ(opt.steps(), 1);  // the skipped step is not counted
  // SGD has no fused kernel: the default reads the guard on the host, with the same effect.
  nn::SGD sgd(one_group(ps, 0.1), 0.9);
  sgd.step_guarded(nn::step_guard(ps, scalar_tensor(NAN), 0.0));
  for (size_t i = 0; i < ps.size(); ++i) EXPECT_TRUE(same_bits(ps[i], before[i]));
  EXPECT_EQ(sgd.steps(), 0);
}

// The guarded steps that read the guard on the host: SGD's (no fused kernel) and Adam's when its
// parameters have several dtypes (one kernel each). A passing guard scales every gradient by its
// coef before the step, a failing one changes nothing and is not counted; the step count goes on
// from the fused kernel's when the parameters stop being of one kind.
TEST(FusedStep, HostGuardedSteps) {
  manual_seed(24);
  const auto scaled = [](std::vector<Tensor> ref, double coef) {
    for (Tensor& r : ref) r.set_grad(mul(r.grad(), coef));
  };
  std::vector<Tensor> ps = random_params({17, 3}), ref = clones_of(ps);
  nn::SGD sgd(one_group(ps, 0.1), 0.9), sgd_ref(one_group(ref, 0.1), 0.9);
  const Tensor guard = nn::step_guard(ps, scalar_tensor(1.0), 1.0);
  const double coef = guard.to_vector<double>()[1];
  ASSERT_LT(coef, 0.5);  // the gradients' norm is well above 1
  sgd.step_guarded(guard);
  scaled(ref, coef);
  sgd_ref.step();
  for (size_t i = 0; i < ps.size(); ++i) EXPECT_TRUE(same_bits(ps[i], ref[i])) << "SGD, parameter " << i;

  // Adam over a float32 and a float64 parameter; the guard's norm over both, in float32.
  ps = random_params({17, 3});
  ps[1] = randn({5}, test::f64());
  ps[1].requires_grad_(true);
  ps[1].set_grad(mul(randn({5}, test::f64()), 3.0));
  ref = clones_of(ps);
  nn::Adam adam(one_group(ps, 0.01)), adam_ref(one_group(ref, 0.01));
  const Tensor mixed_guard = nn::step_guard(ps, scalar_tensor(1.0), 1.0);
  adam.step_guarded(mixed_guard);
  scaled(ref, mixed_guard.to_vector<double>()[1]);
  adam_ref.step();
  for (size_t i = 0; i < ps.size(); ++i) EXPECT_TRUE(same_bits(ps[i], ref[i])) << "Adam, parameter " << i;
  adam.step_guarded(nn::step_guard(ps, scalar_tensor(NAN), 1.0));
  for (size_t i = 0; i < ps.size(); ++i) EXPECT_TRUE(same_bits(ps[i], ref[i])) << "Adam, parameter " << i;
  EXPECT_EQ(adam.steps(), 1);

  // One fused step (float32 only), then a parameter turned float64: the count goes on.
  ps = random_params({4, 6});
  nn::Adam opt(one_group(ps, 0.01));
  opt.step();
  nn::replace_data(ps[0], raw::to_dtype(ps[0].detach(), DType::Float64));
  ps[0].set_grad(randn({4}, test::f64()));
  opt.step();
  EXPECT_EQ(opt.steps(), 2);
}

TEST(FusedStep, RawChecks) {
  Tensor p = randn({3}), g = randn({3}), m = zeros({3}), v = zeros({3});
  const Tensor hyper = from_vector<double>({0.1, 0.0}, {1, 2});
  const Tensor count = from_vector<int64_t>({0}, {1});
  EXPECT_LINEA_ERROR(raw::adam_multi_step({p}, {g}, {m}, {v}, {1}, hyper, count, Tensor(), 0.9, 0.99, 1e-8, true),
                     "parameter 0 is in group 1, but hyper has 1 groups");
  EXPECT_LINEA_ERROR(raw::adam_multi_step({p}, {g, g}, {m}, {v}, {0}, hyper, count, Tensor(), 0.9, 0.99, 1e-8, true),
                     "expected as many gradients");
  EXPECT_LINEA_ERROR(raw::adam_multi_step({p}, {g}, {m}, {v}, {0}, from_vector<float>({0.1f, 0.0f}, {1, 2}), count,
                                          Tensor(), 0.9, 0.99, 1e-8, true),
                     "hyper must be contiguous float64 [G, 2]");
  EXPECT_LINEA_ERROR(raw::grad_norm_guard({g, randn({2}, test::f64())}, Tensor(), 1.0),
                     "every gradient must share one device and dtype");
  EXPECT_LINEA_ERROR(raw::grad_norm_guard({g}, randn({2}), 1.0), "the loss must be one float32/float64 value");
  EXPECT_LINEA_ERROR(raw::grad_norm_guard({g}, Tensor(), INFINITY),
                     "grad_norm_guard: max_norm must be finite (<= 0: no clipping), got inf");
  EXPECT_LINEA_ERROR(raw::grad_norm_guard({g, Tensor()}, Tensor(), 1.0),
                     test::undefined_arg("grad_norm_guard", "gradient"));
  EXPECT_LINEA_ERROR(raw::grad_norm_guard({zeros({2}, TensorOptions(DType::Int64))}, Tensor(), 1.0),
                     "grad_norm_guard: expected gradient to be float32 or float64, got int64");

  // adam_multi_step's own arguments, then each parameter's.
  const auto multi = [&](const std::vector<Tensor>& ps, const std::vector<Tensor>& gs, const std::vector<Tensor>& ms,
                         const std::vector<Tensor>& vs, const Tensor& h, const Tensor& c, const Tensor& guard,
                         double beta1 = 0.9, double beta2 = 0.99, double eps = 1e-8) {
    raw::adam_multi_step(ps, gs, ms, vs, std::vector<int>(ps.size(), 0), h, c, guard, beta1, beta2, eps, false);
  };
  const char* op = "adam_multi_step";
  EXPECT_LINEA_ERROR(multi({p}, {g}, {m}, {v}, Tensor(), count, Tensor()), test::undefined_arg(op, "hyper"));
  EXPECT_LINEA_ERROR(multi({p}, {g}, {m}, {v}, hyper, Tensor(), Tensor()), test::undefined_arg(op, "count"));
  EXPECT_LINEA_ERROR(multi({p}, {g}, {m}, {v}, hyper, zeros({1}), Tensor()),
                     "adam_multi_step: count must be one int64 value, got float32 [1]");
  EXPECT_LINEA_ERROR(multi({p}, {g}, {m}, {v}, hyper, count, zeros({3})),
                     "adam_multi_step: guard must be grad_norm_guard's float64 [3] on cpu, got float32 [3] on cpu");
  EXPECT_LINEA_ERROR(multi({p}, {g}, {m}, {v}, hyper, count, Tensor(), 0.9, 0.99, -1.0),
                     "adam_multi_step: eps must be finite and >= 0, got -1");
  EXPECT_LINEA_ERROR(multi({p}, {g}, {m}, {v}, hyper, count, Tensor(), -0.1),
                     "adam_multi_step: beta1 must be in [0, 1), got -0.1");
  EXPECT_LINEA_ERROR(multi({p}, {g}, {m}, {v}, hyper, count, Tensor(), 0.9, 1.0),
                     "adam_multi_step: beta2 must be in [0, 1), got 1");
  const Tensor ip = zeros({3}, TensorOptions(DType::Int64)), pt = raw::transpose(zeros({2, 2}), 0, 1);
  EXPECT_LINEA_ERROR(multi({ip}, {ip}, {ip}, {ip}, hyper, count, Tensor()),
                     "adam_multi_step: expected param to be float32 or float64, got int64");
  EXPECT_LINEA_ERROR(multi({pt}, {pt}, {pt}, {pt}, hyper, count, Tensor()),
                     "adam_multi_step: parameter 0 (shape [2, 2]) must be contiguous");
  const Tensor p64 = randn({3}, test::f64());
  EXPECT_LINEA_ERROR(multi({p, p64}, {g, p64}, {m, p64}, {v, p64}, hyper, count, Tensor()),
                     "adam_multi_step: every parameter must be on cpu with one dtype (parameter 0 is float32, "
                     "parameter 1 float64 on cpu)");
  EXPECT_LINEA_ERROR(multi({p}, {zeros({2})}, {m}, {v}, hyper, count, Tensor()),
                     "adam_multi_step: grad has shape [2] but the parameter has [3]");
  EXPECT_LINEA_ERROR(multi({p}, {g}, {zeros({2})}, {v}, hyper, count, Tensor()),
                     "adam_multi_step: first moment (exp_avg) has shape [2]");
  EXPECT_LINEA_ERROR(multi({p}, {g}, {m}, {zeros({2})}, hyper, count, Tensor()),
                     "adam_multi_step: second moment (exp_avg_sq) has shape [2]");
}

TEST(RawOptim, NonContiguousParamAndGrad) {
  // A transposed parameter and gradient give the same result as their contiguous copies.
  Tensor base = randn({4, 3}, test::f64());
  Tensor pt = raw::transpose(raw::clone(base), 0, 1);  // [3, 4] view
  Tensor pc = raw::contiguous(pt);
  Tensor gt = raw::transpose(randn({4, 3}, test::f64()), 0, 1);
  Tensor gc = raw::contiguous(gt);
  Tensor bt = zeros({3, 4}, test::f64()), bc = zeros({3, 4}, test::f64());
  raw::sgd_step(pt, gt, bt, 0.1, 0.9, 0.0, 0.01, true, true);
  raw::sgd_step(pc, gc, bc, 0.1, 0.9, 0.0, 0.01, true, true);
  EXPECT_TRUE(same_bits(pt, pc));
  EXPECT_TRUE(same_bits(bt, bc));
}

// Adam over a parameter that is not contiguous (a leaf made as a transposed view) takes the
// per-parameter path (the multi-tensor kernel reads dense parameters) and updates it as it would
// its contiguous copy.
TEST(Optim, AdamUpdatesANonContiguousParameter) {
  const Tensor base = randn({4, 3}, test::f64());
  Tensor pt = raw::transpose(raw::clone(base), 0, 1).requires_grad_(true);  // [3, 4], not contiguous
  Tensor pc = raw::contiguous(pt).requires_grad_(true);
  ASSERT_FALSE(pt.is_contiguous());
  nn::Adam at(one_group({pt}, 0.1)), ac(one_group({pc}, 0.1));
  for (int step = 0; step < 2; ++step) {
    const Tensor g = randn({3, 4}, test::f64());
    pt.set_grad(raw::clone(g));
    pc.set_grad(raw::clone(g));
    at.step();
    ac.step();
  }
  EXPECT_TRUE(same_bits(raw::contiguous(pt), pc));
  EXPECT_EQ(at.steps(), 2);
}

// Every tensor a raw step writes in place has its storage version bumped (a graph that recorded
// it then fails its backward, as for the parameter in Optim.StepBumpsVersionSoStaleGraphsFail).
TEST(RawOptim, StepsBumpEveryTensorTheyWrite) {
  const auto bumps = [](const std::vector<Tensor>& written, const std::function<void()>& step) {
    std::vector<uint64_t> before;
    for (const Tensor& t : written) before.push_back(t.impl().storage->version);
    step();
    for (size_t i = 0; i < written.size(); ++i)
      EXPECT_GT(written[i].impl().storage->version, before[i]) << "tensor " << i;
  };
  Tensor p = randn({3}), g = randn({3}), buf = zeros({3}), m = zeros({3}), v = zeros({3});
  bumps({p, buf}, [&] { raw::sgd_step(p, g, buf, 0.1, 0.9, 0, 0, false, true); });
  bumps({p, m, v}, [&] { raw::adam_step(p, g, m, v, 0.1, 0.9, 0.99, 1e-8, 0, false, 1); });
  Tensor q = randn({2}), gq = randn({2}), mq = zeros({2}), vq = zeros({2});
  const Tensor hyper = from_vector<double>({0.1, 0.0}, {1, 2}), count = from_vector<int64_t>({0}, {1});
  bumps({p, q, m, mq, v, vq, count}, [&] {
    raw::adam_multi_step({p, q}, {g, gq}, {m, mq}, {v, vq}, {0, 0}, hyper, count, Tensor(), 0.9, 0.99, 1e-8, false);
  });
  // Two views of one storage as the moments: a write to one would show in the other.
  const Tensor both = zeros({6});
  EXPECT_LINEA_ERROR(
      raw::adam_step(p, g, narrow(both, 0, 0, 3), narrow(both, 0, 3, 3), 0.1, 0.9, 0.99, 1e-8, 0, false, 1),
      "adam_step: the two moments must not share storage");
}

// ---- bad input --------------------------------------------------------------------------------------
TEST(OptimErrors, BadGroups) {
  EXPECT_LINEA_ERROR(nn::SGD(std::vector<ParamGroup>{}), "no parameter groups");
  EXPECT_LINEA_ERROR(nn::SGD({ParamGroup{}}), "hold no parameters");
  Tensor ints = zeros({3}, TensorOptions(DType::Int64));
  EXPECT_LINEA_ERROR(nn::Adam(one_group({ints}, 0.1)), "has dtype int64; only float32/float64 can be trained");
  Tensor leaf = param64({1.0});
  Tensor nonleaf = mul(leaf, 2.0);
  EXPECT_LINEA_ERROR(nn::Adam(one_group({nonleaf}, 0.1)), "is not a leaf tensor");
  EXPECT_LINEA_ERROR(nn::Adam(one_group({leaf, leaf}, 0.1)), "appears more than once");
  EXPECT_LINEA_ERROR(nn::SGD(one_group({leaf}, -0.1)), "has lr -0.1");
  EXPECT_LINEA_ERROR(nn::SGD(one_group({leaf}, 0.1, -1.0)), "has weight_decay -1");
  EXPECT_LINEA_ERROR(nn::SGD(one_group({Tensor()}, 0.1)), "is undefined");
}

TEST(OptimErrors, BadHyperParameters) {
  Tensor p = param64({1.0});
  EXPECT_LINEA_ERROR(nn::SGD(one_group({p}, 0.1), 0.0, 0.0, true), "Nesterov momentum needs momentum > 0");
  EXPECT_LINEA_ERROR(nn::SGD(one_group({p}, 0.1), -0.5), "momentum must be finite and >= 0");
  EXPECT_LINEA_ERROR(nn::SGD(one_group({p}, 0.1), 0.9, 1.5), "dampening must be in [0, 1]");
  EXPECT_LINEA_ERROR(nn::Adam(one_group({p}, 0.1), 1.0), "Adam: beta1 must be in [0, 1)");
  EXPECT_LINEA_ERROR(nn::AdamW(one_group({p}, 0.1), 0.9, -0.1), "AdamW: beta2 must be in [0, 1)");
  EXPECT_LINEA_ERROR(nn::Adam(one_group({p}, 0.1), 0.9, 0.999, -1.0), "eps must be finite and >= 0");
}

TEST(OptimErrors, GuardedStepAndClippingArguments) {
  Tensor p = param64({1.0, 2.0});
  set_grad64(p, {1.0, 1.0});
  // The default step_guarded (SGD's) and Adam's fused one alike.
  nn::SGD sgd(one_group({p}, 0.1));
  nn::Adam adam(one_group({p}, 0.1));
  for (nn::Optimizer* opt : std::vector<nn::Optimizer*>{&sgd, &adam}) {
    EXPECT_LINEA_ERROR(opt->step_guarded(Tensor()), test::undefined_arg("Optimizer::step_guarded", "guard"));
    EXPECT_LINEA_ERROR(opt->step_guarded(zeros({2}, test::f64())),
                       "Optimizer::step_guarded: expected raw::grad_norm_guard's {norm, coef, ok}, got 2 values");
  }
  EXPECT_EQ(adam.steps(), 0);
  EXPECT_EQ(p.to_vector<double>(), (std::vector<double>{1.0, 2.0}));
  EXPECT_LINEA_ERROR(nn::grad_norm({Tensor()}), "grad_norm: parameter 0 is undefined");
  EXPECT_LINEA_ERROR(nn::clip_grad_norm_({p, Tensor()}, 1.0), "clip_grad_norm_: parameter 1 is undefined");
}

TEST(OptimErrors, RawStepChecks) {
  Tensor p = zeros({2, 3}), g = zeros({2, 3});
  EXPECT_LINEA_ERROR(raw::sgd_step(p, zeros({3, 2}), Tensor(), 0.1, 0, 0, 0, false, false),
                     "sgd_step: grad has shape [3, 2] but the parameter has [2, 3]");
  EXPECT_LINEA_ERROR(raw::sgd_step(p, zeros({2, 3}, test::f64()), Tensor(), 0.1, 0, 0, 0, false, false),
                     "dtype mismatch");
  EXPECT_LINEA_ERROR(raw::sgd_step(p, g, Tensor(), 0.1, 0.9, 0, 0, false, false), "momentum buffer");
  EXPECT_LINEA_ERROR(raw::sgd_step(p, g, zeros({2, 3}), 0.1, 0.0, 0, 0, false, false), "momentum is 0");
  Tensor strided_buf = raw::transpose(zeros({3, 2}), 0, 1);
  EXPECT_LINEA_ERROR(raw::sgd_step(p, g, strided_buf, 0.1, 0.9, 0, 0, false, false), "must be contiguous");
  EXPECT_LINEA_ERROR(raw::sgd_step(p, g, Tensor(), -1.0, 0, 0, 0, false, false), "lr must be finite and >= 0");
  Tensor ip = zeros({2}, TensorOptions(DType::Int64));
  EXPECT_LINEA_ERROR(raw::sgd_step(ip, ip, Tensor(), 0.1, 0, 0, 0, false, false), "float32 or float64");
  Tensor m = zeros({2, 3}), v = zeros({2, 3});
  EXPECT_LINEA_ERROR(raw::adam_step(p, g, m, v, 0.1, 0.9, 0.999, 1e-8, 0, false, 0), "must be >= 1");
  EXPECT_LINEA_ERROR(raw::adam_step(p, g, m, zeros({6}), 0.1, 0.9, 0.999, 1e-8, 0, false, 1),
                     "second moment (exp_avg_sq) has shape [6]");
  EXPECT_LINEA_ERROR(raw::adam_step(p, g, m, m, 0.1, 0.9, 0.999, 1e-8, 0, true, 1), "must not share storage");
  EXPECT_LINEA_ERROR(raw::adam_step(p, g, m, v, 0.1, 1.0, 0.999, 1e-8, 0, true, 1), "adamw_step: beta1");
  // Each argument by name, with the value at fault.
  EXPECT_LINEA_ERROR(raw::sgd_step(Tensor(), g, Tensor(), 0.1, 0, 0, 0, false, false),
                     test::undefined_arg("sgd_step", "param"));
  EXPECT_LINEA_ERROR(raw::sgd_step(p, g, Tensor(), 0.1, -0.5, 0, 0, false, false),
                     "sgd_step: momentum must be finite and >= 0, got -0.5");
  EXPECT_LINEA_ERROR(raw::sgd_step(p, g, Tensor(), 0.1, 0, 0, -1.0, false, false),
                     "sgd_step: weight_decay must be finite and >= 0, got -1");
  EXPECT_LINEA_ERROR(raw::sgd_step(p, g, Tensor(), 0.1, 0, 1.5, 0, false, false),
                     "sgd_step: dampening must be in [0, 1], got 1.5");
  EXPECT_LINEA_ERROR(raw::sgd_step(p, g, Tensor(), 0.1, 0, 0, 0, true, false),
                     "sgd_step: Nesterov momentum needs momentum > 0 and dampening == 0, got momentum 0, dampening 0");
  EXPECT_LINEA_ERROR(raw::sgd_step(p, g, zeros({2, 3}), 0.1, 0.9, 0.5, 0, true, false),
                     "sgd_step: Nesterov momentum needs momentum > 0 and dampening == 0, got momentum 0.9, "
                     "dampening 0.5");
  EXPECT_LINEA_ERROR(raw::adam_step(Tensor(), g, m, v, 0.1, 0.9, 0.999, 1e-8, 0, false, 1),
                     test::undefined_arg("adam_step", "param"));
  EXPECT_LINEA_ERROR(raw::adam_step(ip, ip, ip, ip, 0.1, 0.9, 0.999, 1e-8, 0, false, 1),
                     "adam_step: expected param to be float32 or float64, got int64");
  EXPECT_LINEA_ERROR(raw::adam_step(p, zeros({6}), m, v, 0.1, 0.9, 0.999, 1e-8, 0, false, 1),
                     "adam_step: grad has shape [6] but the parameter has [2, 3]");
  EXPECT_LINEA_ERROR(raw::adam_step(p, g, zeros({6}), v, 0.1, 0.9, 0.999, 1e-8, 0, false, 1),
                     "adam_step: first moment (exp_avg) has shape [6]");
  EXPECT_LINEA_ERROR(raw::adam_step(p, g, m, v, -0.1, 0.9, 0.999, 1e-8, 0, false, 1),
                     "adam_step: lr must be finite and >= 0, got -0.1");
  EXPECT_LINEA_ERROR(raw::adam_step(p, g, m, v, 0.1, 0.9, 0.999, 1e-8, -1.0, false, 1),
                     "adam_step: weight_decay must be finite and >= 0, got -1");
  EXPECT_LINEA_ERROR(raw::adam_step(p, g, m, v, 0.1, 0.9, 0.999, NAN, 0, false, 1),
                     "adam_step: eps must be finite and >= 0, got nan");
  EXPECT_LINEA_ERROR(raw::adam_step(p, g, m, v, 0.1, 0.9, 1.0, 1e-8, 0, false, 1),
                     "adam_step: beta2 must be in [0, 1), got 1");
}

}  // namespace
}  // namespace linea
