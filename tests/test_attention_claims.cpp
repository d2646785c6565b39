// Properties every mechanism shares, checked through the registry (make_attention / spec
// strings), and the cross-mechanism claim of the LARA paper:
//  - MultiHeadAttention with each spec passes a float64 gradcheck (samples frozen);
//  - the content of padded keys never reaches an output;
//  - training draws new random quantities, eval is deterministic (unbiased RA excepted: its
//    eval output stays a sample, as documented);
//  - float32 stays finite for |q~|, |k~| up to 5 and for fully padded rows;
//  - at equal sample count, LARA's output MSE to softmax is below Performer's on structured inputs.
// Each mechanism's own formulas, claims and gradchecks: tests/test_attention_<name>.cpp.
#include <cmath>
#include <string>
#include <vector>

#include "attention/softmax/softmax.h"
#include "attention/transformer.h"
#include "tests/test_util.h"

namespace linea {
namespace {

using test::f64;

// Small but non-trivial settings of every mechanism (few features/samples keep gradchecks fast).
const std::vector<std::string> kSpecs = {
    "softmax",          "performer:features=8", "performer:features=8,feature_map=relu", "performer:features=4,feature_map=trf",
    "ra:samples=2",     "ra:samples=2,biased=1", "lara:samples=3",                  "lara:samples=2,proposal=mixed",
    "lara:samples=2,adaptive=1", "nprf_rpe:features=8,max_len=8"};

// Key padding [2, M]: batch 0 pads its last key, batch 1 its keys 1 and 3.
Tensor padding(int64_t M) {
  std::vector<int64_t> p(static_cast<size_t>(2 * M), 0);
  p[static_cast<size_t>(M - 1)] = 1;
  p[static_cast<size_t>(M + 1)] = 1;
  p[static_cast<size_t>(M + 3)] = 1;
  return from_vector<int64_t>(p, {2, M});
}

// Sets every parameter to small random values (rpe starts at 0, adaptive LayerNorm at 1/0).
void randomize_parameters(nn::Module& m) {
  NoGradGuard ng;
  for (auto& [name, p] : m.named_parameters()) nn::replace_data(p, mul(randn(p.shape(), TensorOptions(p.dtype())), 0.3));
}

TEST(AttentionMechanisms, MultiHeadAttentionGradcheck) {
  for (const std::string& spec : kSpecs) {
    SCOPED_TRACE(spec);
    manual_seed(11);
    attn::MultiHeadAttention mha(8, 2, spec);
    mha.to(DType::Float64);
    randomize_parameters(*mha.mechanism());
    mha.mechanism()->freeze_samples(true);
    attn::AttentionOptions o;
    o.key_padding_mask = padding(6);
    Tensor x = test::randn64({2, 6, 8});
    auto f = [&](const std::vector<Tensor>& in) { return mha.forward(in[0], in[0], o); };
    f({x});  // draws the samples once; the gradcheck reuses them
    EXPECT_GRADCHECK(f, {x});
  }
}

TEST(AttentionMechanisms, PaddedKeysNeverReachTheOutput) {
  const int64_t B = 2, H = 2, N = 6, D = 4;
  for (const std::string& spec : kSpecs) {
    SCOPED_TRACE(spec);
    manual_seed(12);
    auto mech = attn::make_attention(spec, H, D);
    mech->to(DType::Float64);
    randomize_parameters(*mech);
    mech->freeze_samples(true);
    attn::AttentionOptions o;
    o.key_padding_mask = padding(N);
    Tensor q = randn({B, H, N, D}, f64()), k = randn({B, H, N, D}, f64()), v = randn({B, H, N, 3}, f64());
    const Tensor out = mech->forward(q, k, v, o);
    // New content for the padded keys and values only.
    Tensor pad = reshape(o.key_padding_mask.to(DType::Bool), {B, 1, N, 1});
    Tensor k2 = where(pad, mul(randn(k.shape(), f64()), 3.0), k);
    Tensor v2 = where(pad, mul(randn(v.shape(), f64()), 3.0), v);
    EXPECT_TRUE(test::all_close(mech->forward(q, k2, v2, o), out, 1e-12, 1e-10));
  }
}

TEST(AttentionMechanisms, TrainDrawsEvalIsDeterministic) {
  for (const std::string& spec : kSpecs) {
    SCOPED_TRACE(spec);
    manual_seed(13);
    auto mech = attn::make_attention(spec, 2, 4);
    randomize_parameters(*mech);
    Tensor q = randn({2, 2, 6, 4}), k = randn({2, 2, 6, 4}), v = randn({2, 2, 6, 3});
    const bool random = !mech->sample_names().empty();
    const Tensor a = mech->forward(q, k, v, {}), b = mech->forward(q, k, v, {});
    const double diff_train = max(abs(sub(a, b))).item<double>();
    if (random) {
      EXPECT_GT(diff_train, 1e-6) << "training forwards should draw new samples";
    }
    mech->eval();
    const Tensor c = mech->forward(q, k, v, {}), d = mech->forward(q, k, v, {});
    const double diff_eval = max(abs(sub(c, d))).item<double>();
    const bool unbiased_ra = spec.rfind("ra:", 0) == 0 && spec.find("biased=1") == std::string::npos;
    if (unbiased_ra) {
      EXPECT_GT(diff_eval, 1e-6) << "unbiased RA stays a sample in eval";
    } else {
      EXPECT_EQ(diff_eval, 0.0) << "eval must be deterministic";
    }
  }
}

TEST(AttentionMechanisms, Float32FiniteForLargeInputsAndFullyPaddedRows) {
  const int64_t B = 2, H = 2, N = 8, D = 16;
  for (const std::string& spec : kSpecs) {
    SCOPED_TRACE(spec);
    manual_seed(14);
    auto mech = attn::make_attention(spec, H, D);
    // Rows of norm exactly 5 in the scaled space (|x~| = D^-1/4 |x|), some aligned, some opposed.
    auto big = [&](const Tensor& x) {
      return mul(div(x, sqrt(sum(square(x), {-1}, true))), 5.0 * std::pow(static_cast<double>(D), 0.25));
    };
    Tensor q = big(randn({B, H, N, D}));
    Tensor k = cat({narrow(q, 2, 0, 4), mul(narrow(q, 2, 4, 4), -1.0)}, 2);  // k = +-q: extreme scores
    Tensor v = randn({B, H, N, 3});
    q.requires_grad_(true);
    v.requires_grad_(true);
    attn::AttentionOptions o;
    std::vector<int64_t> pad(static_cast<size_t>(B * N), 0);
    for (int64_t m = 0; m < N; ++m) pad[static_cast<size_t>(N + m)] = 1;  // batch 1 fully padded
    pad[2] = 1;
    o.key_padding_mask = from_vector<int64_t>(pad, {B, N});
    Tensor out = mech->forward(q, k, v, o);
    sum(square(out)).backward();
    auto finite = [](const Tensor& t) {
      for (float x : t.to_vector<float>())
        if (!std::isfinite(x)) return false;
      return true;
    };
    EXPECT_TRUE(finite(out));
    EXPECT_TRUE(finite(q.grad()));
    EXPECT_TRUE(finite(v.grad()));
    // The fully padded batch row attends to nothing: zeros.
    EXPECT_EQ(max(abs(select(out, 0, 1))).item<float>(), 0.0f);
  }
}

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
