// The shared suite (tests/attention_suite.h) on every registered mechanism's test specs, and the
// cross-mechanism claim of the LARA paper: at equal sample count, LARA's output MSE to softmax is
// below Performer's on structured inputs.
// Each mechanism's own formulas, claims and gradchecks: tests/test_attention_<name>.cpp.
#include <cmath>
#include <string>
#include <vector>

#include "attention/softmax/softmax.h"
#include "attention/transformer.h"
#include "tests/attention_suite.h"
#include "tests/test_util.h"

namespace linea {
namespace {

using test::AttentionSuite;
INSTANTIATE_TEST_SUITE_P(Registered, AttentionSuite, ::testing::ValuesIn(test::suite_specs()), test::spec_test_name);

using test::f64;

// Structured inputs, as attention sees them in a trained model: tokens around a few cluster
// centres (so attention is peaked on the tokens of the same cluster), keys a noisy linear image
// of the queries' cluster. Returns q, k, v [1, H, N, D].
std::vector<Tensor> clustered_qkv(int64_t H, int64_t N, int64_t D, int64_t clusters) {
  Tensor centres = mul(randn({H, clusters, D}, f64()), 1.2);
  Tensor assign = randint(0, clusters, {N});
  Tensor base = index_select(centres, 1, assign);  // [H, N, D]
  Tensor q = add(base, mul(randn({H, N, D}, f64()), 0.4));
  Tensor k = add(base, mul(randn({H, N, D}, f64()), 0.4));
  Tensor v = randn({H, N, D}, f64());
  return {unsqueeze(q, 0), unsqueeze(k, 0), unsqueeze(v, 0)};
}

// The LARA paper's Figure 1 claim at equal sample count (lara samples = C landmarks, performer
// features = C random features): the mean output MSE to softmax over independent draws.
TEST(AttentionMechanisms, LaraBeatsPerformerAtEqualSampleCount) {
  manual_seed(15);
  const int64_t H = 4, N = 64, D = 16, R = 24;  // R draws: enough power to resolve S = 8
  auto qkv = clustered_qkv(H, N, D, 4);
  const Tensor exact = attn::softmax_attention(qkv[0], qkv[1], qkv[2]);
  for (int64_t S : {8, 16, 32}) {
    SCOPED_TRACE("samples " + std::to_string(S));
    double mse[2] = {0, 0}, sq[2] = {0, 0};
    const std::string specs[2] = {"lara:samples=" + std::to_string(S), "performer:features=" + std::to_string(S)};
    for (int i = 0; i < 2; ++i) {
      auto mech = attn::make_attention(specs[i], H, D);
      for (int64_t r = 0; r < R; ++r) {
        const double e = mean(square(sub(mech->forward(qkv[0], qkv[1], qkv[2], {}), exact))).item<double>();
        mse[i] += e / R;
        sq[i] += e * e / R;
      }
    }
    // Standard errors of the two means; LARA must be lower by more than their combined spread.
    const double se = std::sqrt((sq[0] - mse[0] * mse[0] + sq[1] - mse[1] * mse[1]) / (R - 1));
    EXPECT_LT(mse[0] + 2 * se, mse[1]) << "lara " << mse[0] << " vs performer " << mse[1] << " (se " << se << ")";
  }
}

}  // namespace
}  // namespace linea
