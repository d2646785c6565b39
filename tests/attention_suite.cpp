// The shared attention suite (see attention_suite.h).
#include "tests/attention_suite.h"

#include <atomic>
#include <cmath>
#include <cstring>
#include <thread>

#include "attention/registry.h"
#include "attention/transformer.h"
#include "tests/test_util.h"

namespace linea::test {

std::vector<std::string> suite_specs(const std::vector<std::string>& names) {
  std::vector<std::string> specs;
  for (const std::string& n : names.empty() ? attn::registered_attentions() : names) {
    const attn::AttentionInfo info = attn::attention_info(n);
    if (info.test_specs.empty()) specs.push_back(n);
    for (const std::string& s : info.test_specs) specs.push_back(s);
  }
  return specs;
}

std::string spec_test_name(const ::testing::TestParamInfo<std::string>& info) {
  std::string name = info.param;
  for (char& c : name)
    if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
  return name;
}

namespace {

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
  for (auto& [name, p] : m.named_parameters())
    nn::replace_data(p, mul(randn(p.shape(), TensorOptions(p.dtype())), 0.3));
}

attn::AttentionInfo info_of(const std::string& spec) {
  return attn::attention_info(attn::AttentionSpec::parse(spec).name);
}

TEST_P(AttentionSuite, DeclaresItsOptionsDefaultsAndSupport) {
  const attn::AttentionInfo info = info_of(GetParam());
  // The keys the factory reads are the declared ones.
  const attn::AttentionSpec bare = attn::AttentionSpec::parse(info.name);
  const auto built = attn::make_attention(bare, 2, 4);
  std::vector<std::string> declared;
  for (const attn::AttentionOption& o : info.options) declared.push_back(o.key);
  std::sort(declared.begin(), declared.end());
  EXPECT_EQ(bare.asked(), declared) << info.name << ": the options its factory reads";
  // Every option written out at its declared default builds the same mechanism as the bare name.
  attn::AttentionSpec defaults = attn::AttentionSpec::parse(info.name);
  for (const attn::AttentionOption& o : info.options) defaults.options[o.key] = o.default_value;
  EXPECT_EQ(attn::make_attention(defaults, 2, 4)->extra_repr(), built->extra_repr()) << defaults.str();
  // The declared support is the built mechanism's, for each test spec.
  const attn::AttentionSupport s = attn::make_attention(GetParam(), 2, 4)->support();
  EXPECT_EQ(s.str(), info.support.str());
  EXPECT_EQ(s.positional, info.support.positional);
}

TEST_P(AttentionSuite, MultiHeadAttentionGradcheck) {
  manual_seed(11);
  attn::MultiHeadAttention mha(8, 2, GetParam());
  mha.to(DType::Float64);
  randomize_parameters(*mha.mechanism());
  mha.mechanism()->freeze_samples(true);
  attn::AttentionOptions o;
  o.key_padding_mask = padding(6);
  Tensor x = randn64({2, 6, 8});
  auto f = [&](const std::vector<Tensor>& in) { return mha.forward(in[0], in[0], o); };
  f({x});  // draws the samples once; the gradcheck reuses them
  EXPECT_GRADCHECK(f, {x});
}

TEST_P(AttentionSuite, PaddedKeysNeverReachTheOutput) {
  const int64_t B = 2, H = 2, N = 6, D = 4;
  manual_seed(12);
  auto mech = attn::make_attention(GetParam(), H, D);
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
  EXPECT_TRUE(all_close(mech->forward(q, k2, v2, o), out, 1e-12, 1e-10));
}

TEST_P(AttentionSuite, TrainDrawsEvalIsDeterministic) {
  manual_seed(13);
  auto mech = attn::make_attention(GetParam(), 2, 4);
  randomize_parameters(*mech);
  Tensor q = randn({2, 2, 6, 4}), k = randn({2, 2, 6, 4}), v = randn({2, 2, 6, 3});
  const Tensor a = mech->forward(q, k, v, {}), b = mech->forward(q, k, v, {});
  if (!mech->sample_names().empty()) {
    EXPECT_GT(max(abs(sub(a, b))).item<double>(), 1e-6) << "training forwards should draw new samples";
  }
  mech->eval();
  const Tensor c = mech->forward(q, k, v, {}), d = mech->forward(q, k, v, {});
  const double diff_eval = max(abs(sub(c, d))).item<double>();
  if (mech->draws_in_eval()) {
    EXPECT_GT(diff_eval, 1e-6) << "it says it draws in eval";
  } else {
    EXPECT_EQ(diff_eval, 0.0) << "eval must be deterministic";
  }
}

TEST_P(AttentionSuite, Float32FiniteForLargeInputsAndFullyPaddedRows) {
  const int64_t B = 2, H = 2, N = 8, D = 16;
  manual_seed(14);
  auto mech = attn::make_attention(GetParam(), H, D);
  auto [q, k] = extreme_scores(B, H, N, D);
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
  EXPECT_TRUE(all_finite(out));
  EXPECT_TRUE(all_finite(q.grad()));
  EXPECT_TRUE(all_finite(v.grad()));
  // The fully padded batch row attends to nothing: zeros.
  EXPECT_EQ(max(abs(select(out, 0, 1))).item<float>(), 0.0f);
}

// The CPU kernels' sums do not depend on timing: identical forward+backward calls give the same
// bits while another thread competes for the cores (a dynamic schedule feeding per-thread partial
// sums made the softmax backward's differ under load). One head of 1,024 queries and three OpenMP
// threads, so that the kernels split one head's work between threads; samples frozen.
TEST_P(AttentionSuite, SameBitsUnderLoad) {
  const int64_t B = 1, H = 1, N = 1024, D = 16;
  ThreadsGuard threads;
  set_num_threads(3);
  manual_seed(17);
  attn::AttentionSpec spec = attn::AttentionSpec::parse(GetParam());
  const std::string length = info_of(GetParam()).length_option;
  if (!length.empty()) spec.options[length] = std::to_string(N);  // a test spec's may be shorter
  auto mech = attn::make_attention(spec, H, D);
  randomize_parameters(*mech);
  mech->freeze_samples(true);
  const Tensor q = randn({B, H, N, D}), k = randn({B, H, N, D}), v = randn({B, H, N, D});
  const auto run = [&] {
    std::vector<Tensor> in = {q.detach().requires_grad_(true), k.detach().requires_grad_(true),
                              v.detach().requires_grad_(true)};
    const Tensor out = mech->forward(in[0], in[1], in[2], {});
    sum(mul(out, out)).backward();
    std::vector<std::vector<float>> bits = {out.to_vector<float>()};
    for (const Tensor& t : in) bits.push_back(t.grad().to_vector<float>());
    return bits;
  };
  const auto first = run();  // draws the samples the later calls reuse
  std::atomic<bool> stop{false};
  std::thread load([&] {
    volatile uint64_t x = 0;
    while (!stop.load(std::memory_order_relaxed)) x = x + 1;
  });
  std::vector<std::vector<std::vector<float>>> again;
  for (int r = 0; r < 4; ++r) again.push_back(run());
  stop = true;
  load.join();
  const char* names[] = {"out", "dq", "dk", "dv"};
  for (const auto& bits : again)
    for (size_t i = 0; i < bits.size(); ++i) {
      size_t differ = 0;
      for (size_t j = 0; j < bits[i].size(); ++j) differ += std::memcmp(&bits[i][j], &first[i][j], sizeof(float)) != 0;
      EXPECT_EQ(differ, 0u) << names[i] << ": " << differ << " of " << bits[i].size() << " values differ";
    }
}

TEST_P(AttentionSuite, CrossAttentionTakesKeysOfAnotherLength) {
  auto mech = attn::make_attention(GetParam(), 2, 4);
  if (!mech->support().cross) {
    EXPECT_THROW(attn::make_attention(GetParam(), 2, 4, attn::AttentionUse::Cross), Error);
    return;
  }
  manual_seed(15);
  mech = attn::make_attention(GetParam(), 2, 4, attn::AttentionUse::Cross);
  mech->to(DType::Float64);
  randomize_parameters(*mech);
  mech->freeze_samples(true);
  Tensor q = randn({2, 2, 5, 4}, f64()), k = randn({2, 2, 7, 4}, f64()), v = randn({2, 2, 7, 3}, f64());
  auto f = [&](const std::vector<Tensor>& in) { return mech->forward(in[0], in[1], in[2], {}); };
  EXPECT_EQ(f({q, k, v}).shape(), Shape({2, 2, 5, 3}));
  EXPECT_GRADCHECK(f, {q, k, v});
}

}  // namespace
}  // namespace linea::test
