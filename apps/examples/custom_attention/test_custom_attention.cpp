// ReLU linear attention against its formula written out, then the shared suite every mechanism
// passes (tests/attention_suite.h: declared options and support, float64 gradcheck, padding,
// train/eval, float32 extremes, cross-attention), on the specs it registered.
#include "relu_linear.h"
#include "tests/attention_suite.h"
#include "tests/test_util.h"

using namespace linea;

namespace {

const bool kRegistered = (example::register_relu_linear(), true);  // before the suite lists the specs

TEST(ReluLinearAttention, EqualsTheQuadraticFormula) {
  manual_seed(1);
  Tensor q = test::randn64({2, 3, 5, 4}), k = test::randn64({2, 3, 7, 4}), v = test::randn64({2, 3, 7, 2});
  auto mech = attn::make_attention("relu_linear", 3, 4, attn::AttentionUse::Cross);
  const Tensor w = matmul(relu(q), transpose(relu(k), 2, 3));  // [B, H, N, M]: phi(q_n).phi(k_m)
  const Tensor expected = matmul(w, v) / (sum(w, {3}, true) + 1e-6);
  EXPECT_TRUE(test::all_close(mech->forward(q, k, v, {}), expected, 1e-12, 1e-10));
  EXPECT_LINEA_ERROR(attn::make_attention("relu_linear", 3, 4, attn::AttentionUse::CausalSelf), "causal");
  EXPECT_LINEA_ERROR(attn::make_attention("relu_linear:eps=0", 3, 4), "eps must be > 0");
}

using test::AttentionSuite;
INSTANTIATE_TEST_SUITE_P(ReluLinear, AttentionSuite, ::testing::ValuesIn(test::suite_specs({"relu_linear"})),
                         test::spec_test_name);

}  // namespace
