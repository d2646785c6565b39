// autograd/README.md's worked example of adding a differentiable op, compiled and tested as written:
// softplus(x) = log(1 + exp(x)), forward from the ordinary ops, backward g * sigmoid(x).
#include "test_util.h"

namespace linea {

Tensor softplus(const Tensor& x) {
  // Forward, stable for large |x|; under NoGradGuard its ops record nothing (softplus is one node).
  Tensor y;
  {
    NoGradGuard no_grad;
    y = relu(x) + log(1.0 + exp(-abs(x)));
  }
  if (!needs_grad({&x})) return y;
  // Backward: d softplus / dx = sigmoid(x). Save x detached (never the output: no cycles).
  return attach(y, "softplus", {x}, [xs = x.detach()](const Tensor& g) -> std::vector<Tensor> {
    return {g * sigmoid(xs)};  // [same shape as x]; backward runs under NoGradGuard: records nothing
  });
}

}  // namespace linea

using namespace linea;

TEST(GradCheck, SoftplusExample) {
  Tensor x = test::randn64({3, 4});
  EXPECT_EQ(softplus(x).grad_fn_name(), "softplus");
  EXPECT_GRADCHECK([](const std::vector<Tensor>& in) { return softplus(in[0]); }, {x});
  Tensor xt = test::randn64_transposed({3, 4});
  EXPECT_GRADCHECK([](const std::vector<Tensor>& in) { return softplus(in[0]); }, {xt});
}

TEST(CustomOp, SoftplusValues) {
  auto v = softplus(tensor<double>({-50.0, 0.0, 50.0}, {3})).to_vector<double>();
  EXPECT_NEAR(v[0], std::exp(-50.0), 1e-15);  // log(1 + tiny) loses tiny: absolute accuracy only
  EXPECT_NEAR(v[1], std::log(2.0), 1e-15);
  EXPECT_NEAR(v[2], 50.0, 1e-12);
}
