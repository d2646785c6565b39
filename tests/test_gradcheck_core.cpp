// Float64 gradient checks of the elementwise, reduction and view ops (full Jacobians by
// central differences vs backward), each family with a non-contiguous input; and the check itself
// failing where it must (just past its tolerance, NaN gradients either way, in both modes).
#include "test_util.h"

using namespace linea;
using namespace linea::test;

namespace {
using Fn = std::function<Tensor(const std::vector<Tensor>&)>;

// Inputs away from kinks and domain edges: |x| in [0.3, 1.3] with random sign.
Tensor away_from_zero(const Shape& s) {
  Tensor u = rand(s, f64());
  Tensor sgn = sign(sub(rand(s, f64()), 0.5));
  Tensor t = mul(add(u, 0.3), sgn);
  t.requires_grad_(true);
  return t;
}
Tensor positive(const Shape& s) {
  Tensor t = add(rand(s, f64()), 0.5);
  t.requires_grad_(true);
  return t;
}
Tensor positive_transposed(const Shape& s) {
  Shape t = s;
  std::swap(t[0], t[1]);
  Tensor b = add(rand(t, f64()), 0.5);
  b.requires_grad_(true);
  return b.transpose(0, 1);
}

void check_unary(const std::function<Tensor(const Tensor&)>& op, bool positive_domain) {
  manual_seed(1);
  Tensor a = positive_domain ? positive({3, 4}) : away_from_zero({3, 4});
  EXPECT_GRADCHECK([&](const std::vector<Tensor>& in) { return op(in[0]); }, {a});
  Tensor b = positive_domain ? positive_transposed({4, 3}) : randn64_transposed({4, 3});
  EXPECT_GRADCHECK([&](const std::vector<Tensor>& in) { return op(in[0]); }, {b});
}
}  // namespace

TEST(GradCheck, Neg) {
  check_unary([](const Tensor& x) { return neg(x); }, false);
}
TEST(GradCheck, Exp) {
  check_unary([](const Tensor& x) { return exp(x); }, false);
}
TEST(GradCheck, Log) {
  check_unary([](const Tensor& x) { return log(x); }, true);
}
TEST(GradCheck, Sqrt) {
  check_unary([](const Tensor& x) { return sqrt(x); }, true);
}
TEST(GradCheck, Rsqrt) {
  check_unary([](const Tensor& x) { return rsqrt(x); }, true);
}
TEST(GradCheck, Abs) {
  check_unary([](const Tensor& x) { return abs(x); }, false);
}
TEST(GradCheck, Tanh) {
  check_unary([](const Tensor& x) { return tanh(x); }, false);
}
TEST(GradCheck, Sigmoid) {
  check_unary([](const Tensor& x) { return sigmoid(x); }, false);
}
TEST(GradCheck, Relu) {
  check_unary([](const Tensor& x) { return relu(x); }, false);
}
TEST(GradCheck, GeluTanh) {
  check_unary([](const Tensor& x) { return gelu(x, true); }, false);
}
TEST(GradCheck, GeluErf) {
  check_unary([](const Tensor& x) { return gelu(x, false); }, false);
}
TEST(GradCheck, Sin) {
  check_unary([](const Tensor& x) { return sin(x); }, false);
}
TEST(GradCheck, Cos) {
  check_unary([](const Tensor& x) { return cos(x); }, false);
}
TEST(GradCheck, PowScalar) {
  check_unary([](const Tensor& x) { return pow(x, 2.5); }, true);
  check_unary([](const Tensor& x) { return pow(x, -1.5); }, true);
  check_unary([](const Tensor& x) { return pow(x, 3.0); }, false);
}
TEST(GradCheck, Square) {
  check_unary([](const Tensor& x) { return square(x); }, false);
}
TEST(GradCheck, Clamp) {
  check_unary([](const Tensor& x) { return clamp(x, -0.8, 0.9); }, false);
}
TEST(GradCheck, ScalarArithmetic) {
  check_unary([](const Tensor& x) { return add(mul(sub(2.0, x), 3.0), 1.5) / 4.0; }, false);
  check_unary([](const Tensor& x) { return div(2.0, x); }, true);
}

namespace {
void check_binary(const std::function<Tensor(const Tensor&, const Tensor&)>& op, bool positive_b) {
  manual_seed(2);
  // Same shape, broadcast (row and column), and a transposed operand.
  std::vector<std::pair<Shape, Shape>> shapes = {
      {{3, 4}, {3, 4}}, {{2, 3, 4}, {4}}, {{3, 1}, {1, 4}}, {{2, 3, 4}, {3, 1}}};
  for (auto& [sa, sb] : shapes) {
    Tensor a = away_from_zero(sa);
    Tensor b = positive_b ? positive(sb) : away_from_zero(sb);
    EXPECT_GRADCHECK([&](const std::vector<Tensor>& in) { return op(in[0], in[1]); }, {a, b});
  }
  Tensor a = randn64_transposed({4, 3});
  Tensor b = positive_b ? positive_transposed({4, 3}) : randn64_transposed({4, 3});
  EXPECT_GRADCHECK([&](const std::vector<Tensor>& in) { return op(in[0], in[1]); }, {a, b});
}
}  // namespace

TEST(GradCheck, Add) {
  check_binary([](const Tensor& a, const Tensor& b) { return add(a, b); }, false);
}
TEST(GradCheck, Sub) {
  check_binary([](const Tensor& a, const Tensor& b) { return sub(a, b); }, false);
}
TEST(GradCheck, Mul) {
  check_binary([](const Tensor& a, const Tensor& b) { return mul(a, b); }, false);
}
TEST(GradCheck, Div) {
  check_binary([](const Tensor& a, const Tensor& b) { return div(a, b); }, true);
}
TEST(GradCheck, Maximum) {
  check_binary([](const Tensor& a, const Tensor& b) { return maximum(a, b); }, false);
}
TEST(GradCheck, Minimum) {
  check_binary([](const Tensor& a, const Tensor& b) { return minimum(a, b); }, false);
}

TEST(GradCheck, Where) {
  manual_seed(3);
  Tensor a = randn64({3, 4});
  Tensor cond = gt(randn({3, 4}, f64()), 0.0);
  Tensor b2 = randn64({4});
  EXPECT_GRADCHECK([&](const std::vector<Tensor>& in) { return where(cond, in[0], in[1]); }, {a, b2});
  Tensor at = randn64_transposed({3, 4});
  EXPECT_GRADCHECK([&](const std::vector<Tensor>& in) { return where(cond, in[0], in[1]); }, {at, b2});
}

TEST(GradCheck, WhereScalar) {
  manual_seed(3);
  Tensor cond = gt(randn({3, 4}, f64()), 0.0);
  Tensor a = randn64({3, 4});
  EXPECT_GRADCHECK([&](const std::vector<Tensor>& in) { return where(cond, in[0], 0.5); }, {a});
  Tensor at = randn64_transposed({3, 4});
  EXPECT_GRADCHECK([&](const std::vector<Tensor>& in) { return where(cond, -1.0, in[0]); }, {at});
  Tensor row = randn64({4});  // broadcast against cond
  EXPECT_GRADCHECK([&](const std::vector<Tensor>& in) { return where(cond.t().t(), in[0], 2.0); }, {row});
  // A mask from a scalar comparison of the input itself (the mask gets no gradient).
  EXPECT_GRADCHECK([&](const std::vector<Tensor>& in) { return where(in[0] > 0.1, in[0], 0.0) * in[0]; }, {at});
}

TEST(GradCheck, MaskedFill) {
  manual_seed(4);
  Tensor x = randn64_transposed({3, 5});
  Tensor mask = gt(randn({1, 5}, f64()), 0.0);
  EXPECT_GRADCHECK([&](const std::vector<Tensor>& in) { return masked_fill(in[0], mask, -2.0); }, {x});
}

// ---- reductions ---------------------------------------------------------------------------------
namespace {
void check_reduction(const std::function<Tensor(const Tensor&, const std::vector<int64_t>&, bool)>& op) {
  manual_seed(5);
  Tensor x = randn64({2, 3, 4});
  for (auto dims : std::vector<std::vector<int64_t>>{{}, {0}, {1}, {-1}, {0, 2}, {1, 2}})
    for (bool keep : {false, true})
      EXPECT_GRADCHECK([&](const std::vector<Tensor>& in) { return op(in[0], dims, keep); }, {x});
  Tensor xt = randn64_transposed({3, 5});
  EXPECT_GRADCHECK([&](const std::vector<Tensor>& in) { return op(in[0], {1}, false); }, {xt});
  Tensor xs = randn64({4, 6}).slice(1, 1, 6, 2);  // sliced (strided) view
  EXPECT_GRADCHECK([&](const std::vector<Tensor>& in) { return op(in[0], {0}, true); }, {xs});
}
}  // namespace

TEST(GradCheck, Sum) {
  check_reduction([](const Tensor& x, const std::vector<int64_t>& d, bool k) { return sum(x, d, k); });
}
TEST(GradCheck, Mean) {
  check_reduction([](const Tensor& x, const std::vector<int64_t>& d, bool k) { return mean(x, d, k); });
}
TEST(GradCheck, Max) {
  check_reduction([](const Tensor& x, const std::vector<int64_t>& d, bool k) { return max(x, d, k); });
}
TEST(GradCheck, Min) {
  check_reduction([](const Tensor& x, const std::vector<int64_t>& d, bool k) { return min(x, d, k); });
}
TEST(GradCheck, LogSumExp) {
  check_reduction([](const Tensor& x, const std::vector<int64_t>& d, bool k) { return logsumexp(x, d, k); });
}
TEST(GradCheck, Var) {
  check_reduction([](const Tensor& x, const std::vector<int64_t>& d, bool k) { return var(x, d, 1, k); });
  check_reduction([](const Tensor& x, const std::vector<int64_t>& d, bool k) { return var(x, d, 0, k); });
}
TEST(GradCheck, SumTo) {
  manual_seed(6);
  Tensor x = randn64({2, 3, 4});
  EXPECT_GRADCHECK([](const std::vector<Tensor>& in) { return sum_to(in[0], {3, 1}); }, {x});
  EXPECT_GRADCHECK([](const std::vector<Tensor>& in) { return sum_to(in[0], {4}); }, {x});
}

// ---- views --------------------------------------------------------------------------------------
TEST(GradCheck, Views) {
  manual_seed(7);
  Tensor x = randn64({2, 3, 4});
  Tensor xt = randn64_transposed({3, 4});
  std::vector<std::pair<const char*, std::function<Tensor(const Tensor&)>>> views = {
      {"reshape",
       [](const Tensor& t) {
         return t.reshape({-1, 2});
       }},
      {"flatten", [](const Tensor& t) { return t.flatten(); }},
      {"permute",
       [](const Tensor& t) {
         return t.dim() == 3 ? t.permute({2, 0, 1}) : t.permute({1, 0});
       }},
      {"transpose", [](const Tensor& t) { return t.transpose(0, -1); }},
      {"narrow", [](const Tensor& t) { return t.narrow(-1, 1, 2); }},
      {"narrow from the end", [](const Tensor& t) { return t.narrow(0, -2, 1); }},
      {"slice", [](const Tensor& t) { return t.slice(-1, 0, 4, 2); }},
      {"select", [](const Tensor& t) { return t.select(1, 2); }},
      {"unsqueeze", [](const Tensor& t) { return t.unsqueeze(1); }},
      {"squeeze", [](const Tensor& t) { return t.unsqueeze(0).squeeze(0); }},
      {"expand",
       [](const Tensor& t) {
         Shape s = t.shape();
         s.insert(s.begin(), 3);
         return t.unsqueeze(0).expand(s);
       }},
      {"contiguous", [](const Tensor& t) { return t.contiguous(); }},
      {"clone", [](const Tensor& t) { return clone(t); }},
  };
  for (auto& [name, v] : views) {
    SCOPED_TRACE(name);
    EXPECT_GRADCHECK([&](const std::vector<Tensor>& in) { return v(in[0]); }, {x});
    EXPECT_GRADCHECK([&](const std::vector<Tensor>& in) { return v(in[0]); }, {xt});
  }
}
TEST(GradCheck, Reshape) {
  Tensor xt = randn64_transposed({3, 4});  // non-contiguous: reshape must copy
  EXPECT_GRADCHECK([](const std::vector<Tensor>& in) { return in[0].reshape({2, 6}); }, {xt});
}
TEST(GradCheck, Permute) {
  Tensor x = randn64({2, 3, 4});
  EXPECT_GRADCHECK([](const std::vector<Tensor>& in) { return in[0].permute({1, 2, 0}); }, {x});
}
TEST(GradCheck, Expand) {
  Tensor x = randn64({3, 1});
  EXPECT_GRADCHECK([](const std::vector<Tensor>& in) { return in[0].expand({2, 3, 4}); }, {x});
}
TEST(GradCheck, ToDtype) {
  Tensor x = randn64_transposed({3, 4});
  EXPECT_GRADCHECK([](const std::vector<Tensor>& in) { return in[0].to(DType::Float32).to(DType::Float64); }, {x},
                   GradcheckOptions{1e-3, 1e-4, 1e-3});
}
TEST(GradCheck, Composite) {
  // A small MLP-like expression mixing broadcasting, reductions and views.
  manual_seed(8);
  Tensor x = randn64({4, 3}), w = randn64({3}), b = randn64({1});
  EXPECT_GRADCHECK(
      [](const std::vector<Tensor>& in) {
        Tensor h = tanh(in[0] * in[1] + in[2]);
        return logsumexp(h, {1}) - mean(h * h);
      },
      {x, w, b});
}

// The random-probe mode (GradcheckOptions::probes, the sanitizer pass's): it passes where the
// full Jacobian passes, and a gradient wrong in one entry of many fails it as it fails the full
// check. Element 0 of x loses half its gradient (one factor detached): d y0 / d x0 is x0, not 2 x0.
TEST(GradCheckProbes, AgreeWithTheFullJacobian) {
  manual_seed(31);
  Tensor x = randn64({4, 3}), w = randn64({3}), b = randn64({1});
  const Fn good = [](const std::vector<Tensor>& in) {
    Tensor h = tanh(in[0] * in[1] + in[2]);
    return logsumexp(h, {1}) - mean(h * h);
  };
  GradcheckOptions probes;
  probes.probes = 3;
  EXPECT_TRUE(gradcheck(good, {x, w, b}, probes).ok);

  Tensor v = randn64({12});
  const Fn wrong = [](const std::vector<Tensor>& in) {
    const Tensor& t = in[0];
    return t * cat({t.narrow(0, 0, 1).detach(), t.narrow(0, 1, 11)}, 0);
  };
  EXPECT_FALSE(gradcheck(wrong, {v}).ok);
  for (uint64_t seed : {0u, 1u, 2u, 3u}) {
    probes.probe_seed = seed;
    const GradcheckResult r = gradcheck(wrong, {v}, probes);
    EXPECT_FALSE(r.ok) << "seed " << seed;
    EXPECT_NE(r.message.find("input 0 (shape [12]), random probe"), std::string::npos) << r.message;
  }
}

// The check itself can fail: a gradient off by a little more than atol + rtol |numeric| fails and
// one within it passes; a NaN analytic gradient (0 * inf in the backward of sqrt(x^2) * 0 at 0) or a
// NaN numeric one (sqrt just left of 0) fails, in both modes; inputs and outputs must be float64.
TEST(GradCheckItself, FailsWhereItMust) {
  const Tensor x = tensor<double>({1.0, -2.0, 0.5}, {3}).requires_grad_(true);
  // y = x (1 + d) with the factor detached: the backward gives 1, the numbers 1 + d.
  const auto scaled = [](double d) {
    return [d](const std::vector<Tensor>& in) { return in[0] + in[0].detach() * d; };
  };
  GradcheckOptions probes;
  probes.probes = 2;
  for (const GradcheckOptions& o : {GradcheckOptions{}, probes}) {
    SCOPED_TRACE(o.probes ? "probes" : "full Jacobian");
    EXPECT_TRUE(gradcheck(scaled(0.5e-3), {x}, o).ok);   // |diff| 5e-4 within 1e-5 + 1e-3 * 1.0005
    EXPECT_FALSE(gradcheck(scaled(1.5e-3), {x}, o).ok);  // 1.5e-3 beyond 1e-5 + 1e-3 * 1.0015
    const Tensor zero = zeros({1}, TensorOptions(DType::Float64)).requires_grad_(true);
    const GradcheckResult nan_grad =
        gradcheck([](const std::vector<Tensor>& in) { return sqrt(in[0] * in[0]) * 0.0; }, {zero}, o);
    EXPECT_FALSE(nan_grad.ok);
    EXPECT_NE(nan_grad.message.find("nan, numeric 0"), std::string::npos) << nan_grad.message;
    const Tensor tiny = tensor<double>({1e-9}, {1}).requires_grad_(true);
    EXPECT_FALSE(gradcheck([](const std::vector<Tensor>& in) { return sqrt(in[0]); }, {tiny}, o).ok);
  }
  EXPECT_LINEA_ERROR(gradcheck([](const std::vector<Tensor>& in) { return in[0].to(DType::Float32); }, {x}),
                     "gradcheck: f must return a float64 tensor");
  EXPECT_LINEA_ERROR(gradcheck([](const std::vector<Tensor>& in) { return in[0]; }, {randn({3}).requires_grad_(true)}),
                     "gradcheck: input 0 must be a float64 CPU tensor, got float32");
}
