// The vectorizable float32 exp / erf of core/cpu/vec_math.h against double libm (dense sweeps
// and IEEE special values), and the float32 CPU ops built on them (exp, sigmoid, both GELUs,
// softmax, log_softmax, cross_entropy; forward and backward through autograd) against the same
// ops run in float64 on the same (float-rounded) inputs.
// Not here: float64 gradient checks of these ops (tests/test_gradcheck_*.cpp).
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <limits>
#include <vector>

#include "core/cpu/vec_math.h"
#include "tests/test_util.h"

namespace linea {
namespace {

namespace vm = cpu::vm;
using test::all_close;
using test::f64;

// Size of one unit in the last place of a float of value |r| (subnormal spacing below FLT_MIN).
double float_ulp(double r) {
  r = std::fabs(r);
  if (r < FLT_MIN) return std::ldexp(1.0, -149);
  int e;
  std::frexp(r, &e);  // r = m 2^e, m in [0.5, 1)
  return std::ldexp(1.0, e - 24);
}

// Error of y against the exact value r, in float ulps of r; a result that overflows float must be +inf.
double ulp_error(float y, double r) {
  if (r > FLT_MAX) return (std::isinf(y) && y > 0) ? 0.0 : 1e30;
  if (!std::isfinite(y)) return 1e30;
  return std::fabs(static_cast<double>(y) - r) / float_ulp(r);
}

TEST(VecMath, ExpWithin4UlpOverTheFloatRange) {
  double worst = 0, worst_x = 0;
  auto check = [&](float x) {
    const double e = ulp_error(vm::exp(x), std::exp(static_cast<double>(x)));
    if (e > worst) {
      worst = e;
      worst_x = x;
    }
  };
  // A uniform grid over [-104, 89] (every region of the result, subnormal and overflowing ones included) ...
  const int64_t n = 2000000;
  for (int64_t i = 0; i <= n; ++i) check(static_cast<float>(-104.0 + 193.0 * static_cast<double>(i) / n));
  // ... and a sweep over bit patterns, which is dense near 0 where the grid is coarse.
  for (uint32_t sign : {0u, 0x80000000u})
    for (uint32_t b = 0; b < 0x42d00000u; b += 511) {  // |x| up to 104
      const float x = vm::bits_to_float(b | sign);
      if (x >= -104.0f && x <= 89.0f) check(x);
    }
  // Measured: 1.02 ulp.
  std::printf("exp: worst %.3f ulp at x = %.9g\n", worst, worst_x);
  EXPECT_LE(worst, 4.0) << "at x = " << worst_x;
}

TEST(VecMath, ExpSpecialValues) {
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(vm::exp(0.0f), 1.0f);
  EXPECT_EQ(vm::exp(-0.0f), 1.0f);
  EXPECT_EQ(vm::exp(1.0f), std::exp(1.0f));
  EXPECT_EQ(vm::exp(inf), inf);
  EXPECT_EQ(vm::exp(-inf), 0.0f);
  EXPECT_TRUE(std::isnan(vm::exp(std::numeric_limits<float>::quiet_NaN())));
  EXPECT_TRUE(std::isnan(vm::exp(-std::numeric_limits<float>::quiet_NaN())));
  EXPECT_EQ(vm::exp(1000.0f), inf);
  EXPECT_EQ(vm::exp(88.73f), inf);  // just above log(FLT_MAX) = 88.7228
  EXPECT_TRUE(std::isfinite(vm::exp(88.72f)));
  EXPECT_EQ(vm::exp(-1000.0f), 0.0f);
  EXPECT_EQ(vm::exp(-104.0f), 0.0f);  // below half the smallest subnormal
  // Subnormal results: the smallest one, and one in the middle of the range.
  EXPECT_EQ(vm::exp(-103.25f), std::exp(-103.25f));
  EXPECT_LE(ulp_error(vm::exp(-95.5f), std::exp(-95.5)), 1.0);
  EXPECT_EQ(vm::exp(-87.3365479f), std::exp(-87.3365479f));  // ~FLT_MIN
}

TEST(VecMath, ErfAbsoluteErrorOverAllX) {
  double worst = 0, worst_x = 0;
  const int64_t n = 2000000;
  for (int64_t i = 0; i <= n; ++i) {
    const float x = static_cast<float>(-10.0 + 20.0 * static_cast<double>(i) / n);
    const double e = std::fabs(vm::erf(x) - std::erf(static_cast<double>(x)));
    if (e > worst) {
      worst = e;
      worst_x = x;
    }
    EXPECT_EQ(vm::erf(-x), -vm::erf(x));  // odd, exactly
  }
  // Measured: 1.1e-7 on this grid (1.3e-7, at x = -0.999, on a 10x denser one).
  std::printf("erf: worst abs error %.3g at x = %.9g\n", worst, worst_x);
  EXPECT_LE(worst, 3e-7) << "at x = " << worst_x;
  // Small |x|: relative accuracy, not just absolute.
  for (float x : {1e-30f, 1e-10f, 1e-5f, 3e-3f, 0.1f, 0.7f}) {
    const double r = std::erf(static_cast<double>(x));
    EXPECT_LE(std::fabs(vm::erf(x) - r), 3e-7 * r) << x;
  }
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(vm::erf(0.0f), 0.0f);
  EXPECT_TRUE(std::signbit(vm::erf(-0.0f)));
  EXPECT_EQ(vm::erf(inf), 1.0f);
  EXPECT_EQ(vm::erf(-inf), -1.0f);
  EXPECT_EQ(vm::erf(1e30f), 1.0f);
  EXPECT_EQ(vm::erf(-12.0f), -1.0f);
  EXPECT_TRUE(std::isnan(vm::erf(std::numeric_limits<float>::quiet_NaN())));
}

TEST(VecMath, NormalCdfKeepsRelativeAccuracyInTheLowerTail) {
  // Phi(x) for x << 0 is computed from erfc directly, not as 1 + erf (which would be all
  // rounding). What remains is the float rounding of x^2 / 2 inside exp(-x^2 / 2), a relative
  // error of ~x^2 2^-24, so errors are measured relative to (1 + x^2) 2^-24.
  double worst_cdf = 0, worst_pdf = 0, cdf_x = 0, pdf_x = 0;
  for (int i = 0; i <= 200000; ++i) {
    const double x = static_cast<float>(-9.0 + 9.0 * i / 200000.0);
    float e;
    const double c = vm::normal_cdf(static_cast<float>(x), e);
    const double rc = 0.5 * std::erfc(-x / std::sqrt(2.0)), re = std::exp(-0.5 * x * x);
    const double scale = (1.0 + x * x) * std::ldexp(1.0, -24);
    const double ec = std::fabs(c - rc) / rc / scale, ee = std::fabs(e - re) / re / scale;
    if (ec > worst_cdf) {
      worst_cdf = ec;
      cdf_x = x;
    }
    if (ee > worst_pdf) {
      worst_pdf = ee;
      pdf_x = x;
    }
  }
  // Measured: cdf 4.0, pdf 1.7 (in units of (1 + x^2) 2^-24).
  std::printf("normal_cdf: worst %.2f (cdf) %.2f (pdf) x (1 + x^2) 2^-24\n", worst_cdf, worst_pdf);
  EXPECT_LE(worst_cdf, 8.0) << "at x = " << cdf_x;
  EXPECT_LE(worst_pdf, 4.0) << "at x = " << pdf_x;
}

// ---- the float32 ops against float64 ----------------------------------------------------------

// Inputs: a wide random spread plus the regions where each formula changes branch.
Tensor op_inputs64() {
  manual_seed(5);
  Tensor r = mul(randn({4000}, f64()), 4.0);
  std::vector<double> v = r.to_vector<double>();
  for (double x : {0.0,  -0.0, 1e-6, -1e-6, 0.5,  -0.75, 1.0,   -1.0, 1.4142, -1.4142, 1.415, -1.415, 3.0,
                   -3.0, 5.0,  -5.0, 8.0,   -8.0, 12.0,  -12.0, 30.0, -30.0,  80.0,    -80.0, 88.0,   -100.0})
    v.push_back(x);
  // Round to float first, so the float64 reference sees exactly the float32 inputs.
  return from_vector<double>(v, {static_cast<int64_t>(v.size())}).to(DType::Float32).to(DType::Float64);
}

struct UnaryCase {
  const char* name;
  std::function<Tensor(const Tensor&)> f;
  double atol, rtol;            // forward
  double grad_atol, grad_rtol;  // backward
};

TEST(VecMathOps, Float32UnaryOpsMatchFloat64ForwardAndBackward) {
  const std::vector<UnaryCase> cases = {
      // atol 1e-38 for subnormal results; 1e-7 where the tails' x^2 rounding dominates.
      {"exp", [](const Tensor& x) { return exp(x); }, 0, 5e-7, 0, 5e-7},
      // sigmoid's backward is g y (1 - y) from the saved output: 1 - y carries y's rounding
      // (~1 ulp = 6e-8 near 1) times |g| (up to ~4 here).
      {"sigmoid", [](const Tensor& x) { return sigmoid(x); }, 1e-38, 5e-7, 4e-7, 1e-6},
      {"gelu", [](const Tensor& x) { return gelu(x, false); }, 1e-7, 1e-6, 1e-6, 1e-6},
      {"gelu_tanh", [](const Tensor& x) { return gelu(x, true); }, 1e-7, 1e-6, 1e-6, 1e-6},
  };
  Tensor x64 = op_inputs64();
  // exp's range is limited so that its results stay finite (relative comparison); it also
  // gets a column of large values below, checked for inf.
  Tensor x64_exp = clamp(x64, -80.0, 80.0);
  manual_seed(6);
  Tensor g64 = randn(x64.shape(), f64()).to(DType::Float32).to(DType::Float64);
  for (const UnaryCase& c : cases) {
    SCOPED_TRACE(c.name);
    Tensor xin = std::string(c.name) == "exp" ? x64_exp : x64;
    Tensor a = xin.detach(), b = xin.to(DType::Float32).detach();
    a.requires_grad_(true);
    b.requires_grad_(true);
    Tensor ya = c.f(a), yb = c.f(b);
    ASSERT_EQ(yb.dtype(), DType::Float32);
    EXPECT_TRUE(all_close(yb, ya, c.atol, c.rtol));
    ya.backward(g64);
    yb.backward(g64.to(DType::Float32));
    EXPECT_TRUE(all_close(b.grad(), a.grad(), c.grad_atol, c.grad_rtol));
    // A strided (transposed) input goes through the same float32 formula: identical bits.
    NoGradGuard ng;
    Tensor m = b.detach().narrow(0, 0, 4000).reshape({40, 100});
    Tensor strided = c.f(m.t()), dense = c.f(m.t().contiguous());
    EXPECT_EQ(strided.to_vector<float>(), dense.to_vector<float>());
  }
  NoGradGuard ng;
  std::vector<float> big = exp(tensor<float>({100.0f, -200.0f, INFINITY, -INFINITY}, {4})).to_vector<float>();
  EXPECT_EQ(big, (std::vector<float>{INFINITY, 0.0f, INFINITY, 0.0f}));
  EXPECT_TRUE(std::isnan(exp(tensor<float>({NAN}, {1})).to_vector<float>()[0]));
  EXPECT_TRUE(std::isnan(gelu(tensor<float>({NAN}, {1}), false).to_vector<float>()[0]));
}

TEST(VecMathOps, Float64KeepsLibm) {
  // Gradchecks run in float64: its exp must stay the correctly rounded libm one.
  NoGradGuard ng;
  Tensor x = op_inputs64();
  std::vector<double> xs = x.to_vector<double>(), ys = exp(x).to_vector<double>();
  for (size_t i = 0; i < xs.size(); ++i) ASSERT_EQ(ys[i], std::exp(xs[i])) << xs[i];
}

TEST(VecMathOps, Float32SoftmaxFamilyMatchesFloat64) {
  manual_seed(7);
  // [33, 100]: dim 1 is the contiguous-row path, dim 0 the strided-block path.
  Tensor x64 = mul(randn({33, 100}, f64()), 5.0).to(DType::Float32).to(DType::Float64);
  Tensor g64 = randn({33, 100}, f64()).to(DType::Float32).to(DType::Float64);
  for (bool log : {false, true})
    for (int64_t dim : {1, 0}) {
      SCOPED_TRACE(std::string(log ? "log_softmax" : "softmax") + " dim " + std::to_string(dim));
      Tensor a = x64.detach(), b = x64.to(DType::Float32).detach();
      a.requires_grad_(true);
      b.requires_grad_(true);
      Tensor ya = log ? log_softmax(a, dim) : softmax(a, dim);
      Tensor yb = log ? log_softmax(b, dim) : softmax(b, dim);
      // Float rounding of x - max (|x - max| up to ~40) alone gives ~1e-6 relative error in
      // exp; log_softmax's x - (max + log sum) rounds to an ulp of |x| (~2e-6 here).
      EXPECT_TRUE(all_close(yb, ya, log ? 4e-6 : 1e-7, 2e-6));
      ya.backward(g64);
      yb.backward(g64.to(DType::Float32));
      // log_softmax's dx = g - exp(y) * sum(g): the forward's absolute error in y (above) times
      // |sum(g)| (up to ~10 here, rows of N(0, 1)) bounds it, so its atol is 4e-6 * 10. (An
      // -O2 sanitizer build measured 1.5e-6 where Release is under 1e-6.)
      EXPECT_TRUE(all_close(b.grad(), a.grad(), log ? 4e-5 : 1e-6, 2e-6));
    }
  // cross_entropy, plain and with label smoothing.
  Tensor target = randint(0, 100, {33});
  for (double smoothing : {0.0, 0.1}) {
    SCOPED_TRACE("cross_entropy smoothing " + std::to_string(smoothing));
    Tensor a = x64.detach(), b = x64.to(DType::Float32).detach();
    a.requires_grad_(true);
    b.requires_grad_(true);
    Tensor la = cross_entropy(a, target, -100, smoothing), lb = cross_entropy(b, target, -100, smoothing);
    EXPECT_TRUE(all_close(lb, la, 0, 1e-6));
    la.backward();
    lb.backward();
    EXPECT_TRUE(all_close(b.grad(), a.grad(), 1e-8, 2e-6));
  }
}

}  // namespace
}  // namespace linea
