// Gradient checks (float64, central differences vs backward) of the nn layers, attention,
// transformer blocks and losses, with respect to the inputs AND every parameter of each module.
// How parameters are checked: gradcheck detaches its inputs into fresh leaves (same storage), so
// a module's own parameter handles would not be those leaves. module_grad_ok() passes the
// parameters as extra inputs and, inside f, points each parameter's autograd state at its leaf:
// perturbations reach the module through the shared storage, gradients reach the leaves (a layer
// whose weight gets no gradient fails it: ModuleCheckCatchesAWrongParameterGradient).
// Not here: forward values and errors (tests/test_nn_layers.cpp, tests/test_attention_softmax.cpp).
#include <cmath>
#include <memory>
#include <vector>

#include "attention/softmax/softmax.h"
#include "attention/transformer.h"
#include "nn/layers.h"
#include "nn/loss.h"
#include "tests/test_util.h"

namespace linea {
namespace {

using test::f64;
using test::randn64;
using Fn = std::function<Tensor(const std::vector<Tensor>&)>;

// Converts m to float64 and, when std > 0, redraws its parameters ~ N(0, std) so that small
// initial weights (0.02) do not make attention nearly uniform and the check nearly linear.
template <typename M> std::shared_ptr<M> prepare(std::shared_ptr<M> m, double std = 0.0) {
  m->to(DType::Float64);
  m->eval();  // dropout off
  if (std > 0) {
    NoGradGuard ng;
    for (auto& p : m->parameters()) p.copy_(randn(p.shape(), f64()) * std);
  }
  return m;
}

// gradcheck of f with respect to `inputs` (those requiring grad) and every parameter of m.
// f sees the inputs first and the parameters' leaves after them (it need not use the latter).
::testing::AssertionResult module_grad_ok(const nn::Module& m, const Fn& f, std::vector<Tensor> inputs) {
  std::vector<Tensor> params = m.parameters();
  const size_t n_in = inputs.size();
  std::vector<std::shared_ptr<detail::AutogradMeta>> saved;
  for (auto& p : params) {
    saved.push_back(p.impl().autograd);
    inputs.push_back(p);
  }
  auto g = [&](const std::vector<Tensor>& leaves) {
    for (size_t i = 0; i < params.size(); ++i) params[i].impl().autograd = leaves[n_in + i].impl().autograd;
    return f(leaves);
  };
  GradcheckResult r = gradcheck(g, inputs, test::suite_gradcheck_options());
  for (size_t i = 0; i < params.size(); ++i) params[i].impl().autograd = saved[i];
  if (r.ok) return ::testing::AssertionSuccess();
  std::string which;
  for (size_t i = 0; i < params.size(); ++i)
    if (r.message.find("input " + std::to_string(n_in + i) + " ") != std::string::npos)
      which = " (parameter " + m.named_parameters()[i].first + ")";
  return ::testing::AssertionFailure() << r.message << which;
}

#define EXPECT_MODULE_GRADCHECK(m, f, ...) EXPECT_TRUE(module_grad_ok(m, f, __VA_ARGS__))

// The check reaches the parameters: a layer whose weight gets no gradient (x * detach(w)) fails
// it, naming the parameter; the same layer with the gradient passes.
TEST(GradCheck, ModuleCheckCatchesAWrongParameterGradient) {
  struct Scale : nn::Module {
    Tensor w;
    bool cut;
    explicit Scale(bool cut_grad) : nn::Module("Scale"), cut(cut_grad) { w = register_parameter("w", randn64({3})); }
    Tensor forward(const Tensor& x) const { return x * (cut ? w.detach() : w); }
  };
  manual_seed(24);
  for (bool cut : {false, true}) {
    auto m = std::make_shared<Scale>(cut);
    const Fn f = [&](const std::vector<Tensor>& x) { return m->forward(x[0]); };
    const ::testing::AssertionResult r = module_grad_ok(*m, f, {randn64({2, 3})});
    EXPECT_EQ(static_cast<bool>(r), !cut);
    if (cut) EXPECT_NE(std::string(r.message()).find("(parameter w)"), std::string::npos) << r.message();
  }
}

TEST(GradCheck, Linear) {
  manual_seed(11);
  auto lin = prepare(std::make_shared<nn::Linear>(3, 4));
  const Fn f = [&](const std::vector<Tensor>& x) { return lin->forward(x[0]); };
  EXPECT_MODULE_GRADCHECK(*lin, f, {randn64({2, 3})});
  EXPECT_MODULE_GRADCHECK(*lin, f, {randn64({2, 2, 3})});                // leading dims
  EXPECT_MODULE_GRADCHECK(*lin, f, {test::randn64_transposed({2, 3})});  // non-contiguous input
  EXPECT_MODULE_GRADCHECK(*lin, f, {randn64({3})});                      // a single vector
  auto nob = prepare(std::make_shared<nn::Linear>(3, 2, /*bias=*/false));
  const Fn g = [&](const std::vector<Tensor>& x) { return nob->forward(x[0]); };
  EXPECT_EQ(nob->parameters().size(), 1u);
  EXPECT_MODULE_GRADCHECK(*nob, g, {randn64({2, 3})});
}

TEST(GradCheck, EmbeddingModule) {
  manual_seed(12);
  auto emb = prepare(std::make_shared<nn::Embedding>(5, 3), 1.0);
  Tensor idx = tensor<int64_t>({0, 4, 2, 2, 1, 0}, {2, 3});  // repeated indices accumulate
  const Fn f = [&](const std::vector<Tensor>& x) { return emb->forward(x[0]); };
  EXPECT_MODULE_GRADCHECK(*emb, f, {idx});
  // With a padding row that the batch does not use (a used padding row has, by design, a zero
  // gradient that differs from the true derivative: tested in test_nn_layers).
  auto pad = prepare(std::make_shared<nn::Embedding>(5, 3, /*padding_idx=*/3), 1.0);
  const Fn g = [&](const std::vector<Tensor>& x) { return pad->forward(x[0]); };
  EXPECT_MODULE_GRADCHECK(*pad, g, {idx});
}

TEST(GradCheck, LayerNormModule) {
  manual_seed(13);
  auto ln = prepare(std::make_shared<nn::LayerNorm>(4), 1.0);
  const Fn f = [&](const std::vector<Tensor>& x) { return ln->forward(x[0]); };
  EXPECT_MODULE_GRADCHECK(*ln, f, {randn64({3, 4})});
  EXPECT_MODULE_GRADCHECK(*ln, f, {test::randn64_transposed({2, 4})});
  auto ln2 = prepare(std::make_shared<nn::LayerNorm>(Shape{2, 3}, 1e-3), 1.0);
  const Fn g = [&](const std::vector<Tensor>& x) { return ln2->forward(x[0]); };
  EXPECT_MODULE_GRADCHECK(*ln2, g, {randn64({2, 2, 3})});
  auto plain = prepare(std::make_shared<nn::LayerNorm>(4, 1e-5, /*elementwise_affine=*/false));
  const Fn h = [&](const std::vector<Tensor>& x) { return plain->forward(x[0]); };
  EXPECT_MODULE_GRADCHECK(*plain, h, {randn64({2, 4})});
}

TEST(GradCheck, FeedForward) {
  manual_seed(14);
  for (const char* act : {"gelu", "gelu_tanh", "relu"}) {
    auto ff = prepare(std::make_shared<nn::FeedForward>(3, 5, 0.1, act), 0.7);
    const Fn f = [&](const std::vector<Tensor>& x) { return ff->forward(x[0]); };
    EXPECT_MODULE_GRADCHECK(*ff, f, {randn64({2, 2, 3})}) << act;
  }
}

TEST(GradCheck, PatchEmbed) {
  manual_seed(15);
  auto pe = prepare(std::make_shared<nn::PatchEmbed>(4, 2, 2, 3));
  const Fn f = [&](const std::vector<Tensor>& x) { return pe->forward(x[0]); };
  EXPECT_MODULE_GRADCHECK(*pe, f, {randn64({2, 2, 4, 4})});
  // A non-contiguous batch of images (a strided slice of a bigger batch).
  Tensor base = randn({4, 2, 4, 4}, f64());
  base.requires_grad_(true);
  EXPECT_MODULE_GRADCHECK(*pe, f, {base.slice(0, 0, 4, 2)});
}

TEST(GradCheck, PositionalEmbedding) {
  manual_seed(16);
  auto learned = prepare(std::make_shared<nn::LearnedPositionalEmbedding>(5, 3));
  const Fn f = [&](const std::vector<Tensor>& x) { return learned->forward(x[0]); };
  EXPECT_MODULE_GRADCHECK(*learned, f, {randn64({2, 4, 3})});
  const Fn f1 = [&](const std::vector<Tensor>& x) { return learned->forward(x[0], /*offset=*/2); };
  EXPECT_MODULE_GRADCHECK(*learned, f1, {randn64({2, 3, 3})});
  auto sinus = prepare(std::make_shared<nn::SinusoidalPositionalEmbedding>(6, 4));
  EXPECT_TRUE(sinus->parameters().empty());
  const Fn g = [&](const std::vector<Tensor>& x) { return sinus->forward(x[0], 1); };
  EXPECT_MODULE_GRADCHECK(*sinus, g, {randn64({2, 3, 4})});
}

TEST(GradCheck, MultiHeadAttention) {
  manual_seed(17);
  // Self-attention: the same input feeds q and k/v.
  auto mha = prepare(std::make_shared<attn::MultiHeadAttention>(4, 2), 0.6);
  const Fn self = [&](const std::vector<Tensor>& x) { return mha->forward(x[0], x[0]); };
  EXPECT_MODULE_GRADCHECK(*mha, self, {randn64({2, 3, 4})});
  // Cross-attention with another length and another key/value width.
  auto cross = prepare(std::make_shared<attn::MultiHeadAttention>(4, 2, "softmax", attn::MultiHeadOptions{attn::AttentionUse::Cross, true, /*kv_dim=*/3}), 0.6);
  const Fn c = [&](const std::vector<Tensor>& x) { return cross->forward(x[0], x[1]); };
  EXPECT_MODULE_GRADCHECK(*cross, c, {randn64({2, 2, 4}), randn64({2, 5, 3})});
  // Causal self-attention with a padding mask, no biases.
  auto nob = prepare(std::make_shared<attn::MultiHeadAttention>(4, 1, "softmax", attn::MultiHeadOptions{attn::AttentionUse::CausalSelf, false}), 0.6);
  attn::AttentionOptions o;
  o.causal = true;
  o.key_padding_mask = tensor<int64_t>({0, 0, 1, 0, 1, 1}, {2, 3});
  const Fn m = [&](const std::vector<Tensor>& x) { return nob->forward(x[0], x[0], o); };
  EXPECT_MODULE_GRADCHECK(*nob, m, {randn64({2, 3, 4})});
}

// The fused CPU kernel (what softmax_attention runs), with its probabilities kept or recomputed
// in the backward, or dropped (the mask frozen: the same seed before every evaluation), and the
// composed formula (the reference).
Fn kAttention(attn::AttentionOptions o, bool keep_probs = false, double dropout = 0.0) {
  return [o, keep_probs, dropout](const std::vector<Tensor>& x) {
    manual_seed(99);
    return scaled_dot_product_attention(x[0], x[1], x[2], 1.0 / std::sqrt(static_cast<double>(x[0].size(3))), o.causal,
                                        o.query_offset, attn::key_padding_bool(o), keep_probs, dropout);
  };
}
Fn kAttentionComposed(attn::AttentionOptions o) {
  return [o](const std::vector<Tensor>& x) { return attn::softmax_attention_composed(x[0], x[1], x[2], o); };
}

TEST(GradCheck, SoftmaxAttentionCausal) {
  manual_seed(18);
  attn::AttentionOptions o;
  o.causal = true;
  EXPECT_GRADCHECK(kAttention(o), {randn64({2, 2, 3, 2}), randn64({2, 2, 3, 2}), randn64({2, 2, 3, 3})});
  // N != M, both ways (top-left alignment), and a transposed (non-contiguous) key tensor.
  EXPECT_GRADCHECK(kAttention(o), {randn64({1, 2, 2, 3}), randn64({1, 2, 4, 3}), randn64({1, 2, 4, 2})});
  EXPECT_GRADCHECK(kAttention(o),
                   {randn64({1, 1, 4, 2}), test::randn64_transposed({1, 1, 3, 2}), randn64({1, 1, 3, 2})});
  EXPECT_GRADCHECK(kAttention(o, true), {randn64({1, 2, 2, 3}), randn64({1, 2, 4, 3}), randn64({1, 2, 4, 2})});
  EXPECT_GRADCHECK(kAttentionComposed(o), {randn64({2, 2, 3, 2}), randn64({2, 2, 3, 2}), randn64({2, 2, 3, 3})});
  // More queries than the fused kernel's block of 256 rows, with a query offset.
  o.query_offset = 2;
  EXPECT_GRADCHECK(kAttention(o), {randn64({1, 1, 260, 2}), randn64({1, 1, 262, 2}), randn64({1, 1, 262, 1})});
  EXPECT_GRADCHECK(kAttention(o, true), {randn64({1, 1, 260, 2}), randn64({1, 1, 262, 2}), randn64({1, 1, 262, 1})});
}

TEST(GradCheck, SoftmaxAttentionPadded) {
  manual_seed(19);
  attn::AttentionOptions o;
  // Batch 1 has every key padded: its outputs are zero, and so are its gradients.
  o.key_padding_mask = tensor<bool>({false, true, false, true, true, true, true, true}, {2, 4});
  EXPECT_GRADCHECK(kAttention(o), {randn64({2, 2, 3, 2}), randn64({2, 2, 4, 2}), randn64({2, 2, 4, 3})});
  // Padding together with the causal mask (query 0 of batch 0 sees no key: key 0 is padded).
  o.causal = true;
  o.key_padding_mask = tensor<int64_t>({1, 0, 0, 1, 0, 0, 0, 1}, {2, 4});
  EXPECT_GRADCHECK(kAttention(o), {randn64({2, 1, 4, 2}), randn64({2, 1, 4, 2}), randn64({2, 1, 4, 2})});
  EXPECT_GRADCHECK(kAttention(o, true), {randn64({2, 1, 4, 2}), randn64({2, 1, 4, 2}), randn64({2, 1, 4, 2})});
  EXPECT_GRADCHECK(kAttentionComposed(o), {randn64({2, 1, 4, 2}), randn64({2, 1, 4, 2}), randn64({2, 1, 4, 2})});
  // Dropout of the probabilities, padded and causal.
  EXPECT_GRADCHECK(kAttention(o, false, 0.4), {randn64({2, 2, 4, 2}), randn64({2, 2, 4, 2}), randn64({2, 2, 4, 3})});
  // A key bias (differentiable too), padded and causal or neither, recomputed and kept.
  for (bool plain : {false, true})
    for (bool keep : {false, true}) {
      const attn::AttentionOptions ob = plain ? attn::AttentionOptions{} : o;
      const Fn biased = [ob, keep](const std::vector<Tensor>& x) {
        return scaled_dot_product_attention(x[0], x[1], x[2], 0.7, ob.causal, ob.query_offset,
                                            attn::key_padding_bool(ob), keep, 0.0, x[3]);
      };
      const int64_t M = plain ? 5 : 4;  // the padding mask's 4 keys
      EXPECT_GRADCHECK(biased,
                       {randn64({2, 2, 4, 2}), randn64({2, 2, M, 2}), randn64({2, 2, M, 3}), randn64({2, 2, M})});
    }
}

// The attention and its log-sum-exp, both differentiable through one backward (LARA's landmarks):
// both outputs, or lse alone (then only the lse's gradient reaches the kernel), with a key bias and
// padding that leaves every batch a key (a row that sees none has lse -inf).
TEST(GradCheck, SoftmaxAttentionLse) {
  manual_seed(23);
  const Tensor pad = tensor<bool>({false, true, false, true, true, false, true, true}, {2, 4});
  for (bool causal : {false, true})
    for (bool only_lse : {false, true}) {
      SCOPED_TRACE(std::string(causal ? "causal" : "bidirectional") + (only_lse ? ", lse only" : ", out and lse"));
      const Fn f = [&](const std::vector<Tensor>& x) {
        auto [out, lse] = scaled_dot_product_attention_lse(x[0], x[1], x[2], 0.7, causal, 1, pad, x[3]);
        return only_lse ? lse : cat({out, unsqueeze(lse, 3)}, 3);
      };
      EXPECT_GRADCHECK(f, {randn64({2, 2, 3, 2}), randn64({2, 2, 4, 2}), randn64({2, 2, 4, 3}), randn64({2, 2, 4})});
    }
}

TEST(GradCheck, TransformerEncoderLayer) {
  manual_seed(20);
  auto layer = prepare(std::make_shared<attn::TransformerEncoderLayer>(4, 2, 6, 0.1), 0.5);
  const Fn f = [&](const std::vector<Tensor>& x) { return layer->forward(x[0]); };
  EXPECT_MODULE_GRADCHECK(*layer, f, {randn64({2, 3, 4})});
  attn::AttentionOptions o;
  o.key_padding_mask = tensor<bool>({false, false, true, false, false, false}, {2, 3});
  const Fn g = [&](const std::vector<Tensor>& x) { return layer->forward(x[0], o); };
  EXPECT_MODULE_GRADCHECK(*layer, g, {randn64({2, 3, 4})});
}

TEST(GradCheck, TransformerDecoderLayer) {
  manual_seed(21);
  auto layer = prepare(std::make_shared<attn::TransformerDecoderLayer>(4, 2, 6, 0.1), 0.5);
  Tensor mem_pad = tensor<bool>({false, false, false, true, false, false, true, true}, {2, 4});
  Tensor tgt_pad = tensor<bool>({false, false, true, false, false, false}, {2, 3});
  const Fn f = [&](const std::vector<Tensor>& x) { return layer->forward(x[0], x[1], mem_pad, tgt_pad); };
  EXPECT_MODULE_GRADCHECK(*layer, f, {randn64({2, 3, 4}), randn64({2, 4, 4})});
}

TEST(GradCheck, TransformerStacks) {
  manual_seed(22);
  auto enc = prepare(std::make_shared<attn::TransformerEncoder>(2, 4, 2, 4), 0.5);
  const Fn f = [&](const std::vector<Tensor>& x) { return enc->forward(x[0]); };
  EXPECT_MODULE_GRADCHECK(*enc, f, {randn64({1, 3, 4})});
  auto dec = prepare(std::make_shared<attn::TransformerDecoder>(2, 4, 2, 4), 0.5);
  const Fn g = [&](const std::vector<Tensor>& x) { return dec->forward(x[0], x[1]); };
  EXPECT_MODULE_GRADCHECK(*dec, g, {randn64({1, 2, 4}), randn64({1, 3, 4})});
}

TEST(GradCheck, CrossEntropyLoss) {
  manual_seed(23);
  Tensor target = tensor<int64_t>({0, 4, -100, 2, 1, 3}, {2, 3});
  for (double s : {0.0, 0.1}) {
    const Fn f = [&](const std::vector<Tensor>& x) { return cross_entropy(x[0], target, -100, s); };
    EXPECT_GRADCHECK(f, {randn64({2, 3, 5})}) << "smoothing " << s;
    const Fn none = [&](const std::vector<Tensor>& x) { return cross_entropy(x[0], target, -100, s, Reduction::None); };
    EXPECT_GRADCHECK(none, {randn64({2, 3, 5})});
  }
  const Fn rows = [](const std::vector<Tensor>& x) {
    return cross_entropy(x[0], tensor<int64_t>({1, 0, 2}, {3}), -100, 0.0, Reduction::Sum);
  };
  EXPECT_GRADCHECK(rows, {test::randn64_transposed({3, 4})});
}

TEST(GradCheck, MseLoss) {
  manual_seed(24);
  for (Reduction r : {Reduction::Mean, Reduction::Sum, Reduction::None}) {
    const Fn f = [r](const std::vector<Tensor>& x) { return nn::mse_loss(x[0], x[1], r); };
    EXPECT_GRADCHECK(f, {randn64({2, 3}), randn64({2, 3})});
  }
}

// The helper itself: a module whose weight gradient is lost (a detached use) must fail the
// check, naming the parameter; the same module used normally passes, and the module's own
// autograd state is restored afterwards.
TEST(GradCheckHelper, DetectsMissingParameterGradient) {
  manual_seed(25);
  auto lin = prepare(std::make_shared<nn::Linear>(3, 4));
  const Fn broken = [&](const std::vector<Tensor>& x) {
    return add(matmul(x[0], transpose(lin->weight().detach(), 0, 1)), lin->bias());
  };
  ::testing::AssertionResult r = module_grad_ok(*lin, broken, {randn64({2, 3})});
  EXPECT_FALSE(r);
  EXPECT_NE(std::string(r.message()).find("(parameter weight)"), std::string::npos) << r.message();
  const Fn ok = [&](const std::vector<Tensor>& x) { return lin->forward(x[0]); };
  EXPECT_MODULE_GRADCHECK(*lin, ok, {randn64({2, 3})});
  EXPECT_TRUE(lin->weight().requires_grad());
  EXPECT_FALSE(lin->weight().grad().defined());
}

}  // namespace
}  // namespace linea
