// The protein model and its predictor on toy models (random weights, dim 16): shapes and
// parameter names; the output layer is the token embedding (tied); a sequence padded in a batch
// gives the hidden states it gives alone (softmax, performer, nprf_rpe); positions none makes
// the model blind to residue order, learned does not; the config's JSON round trip and the
// errors for bad settings; gradients of the head path and of the tied matrix in float64.
// Predictor: a checkpoint folder saved and loaded; fill's top residues are the full softmax's,
// from the window holding each mask; embed's per-residue rows are the per-window forwards put
// together, its mean their mean; another app's checkpoint is refused; the embeddings file
// round trips. Metrics: the unigram baseline's smoothing and the tally of masked positions.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "alphabet.h"
#include "attention/transformer.h"
#include "autograd/ops.h"
#include "core/random.h"
#include "metrics.h"
#include "model.h"
#include "nn/safetensors.h"
#include "predictor.h"
#include "tests/test_util.h"

using namespace linea;
using namespace linea::test;
using namespace protein;
using json = nlohmann::json;

namespace {

ModelConfig toy_config(const std::string& attention = "softmax", int64_t max_len = 16) {
  ModelConfig c;
  c.dim = 16;
  c.heads = 2;
  c.layers = 2;
  c.mlp_hidden = 32;
  c.dropout = 0.0;
  c.attention = attention;
  c.positions = "learned";
  c.max_len = max_len;
  return c;
}

std::shared_ptr<ProteinLM> toy_model(const ModelConfig& c, uint64_t seed = 1) {
  manual_seed(seed);
  auto m = std::make_shared<ProteinLM>(c);
  m->eval();
  return m;
}

// <cls> + residue ids from a string of residue characters + <eos>.
std::vector<int64_t> framed(const std::string& residues) {
  std::vector<int64_t> ids{kCls};
  for (char ch : residues) ids.push_back(residue_id(ch));
  ids.push_back(kEos);
  return ids;
}

Tensor row_tokens(const std::vector<int64_t>& ids) {
  return from_vector<int64_t>(ids, {1, static_cast<int64_t>(ids.size())});
}

// hidden [1, T, dim] of one unpadded window.
Tensor hidden_alone(ProteinLM& m, const std::vector<int64_t>& ids) {
  NoGradGuard ng;
  return m.hidden(row_tokens(ids), Tensor());
}

// The model's parameter `name` (the registered handle: its grad() is the parameter's).
Tensor param(const ProteinLM& m, const std::string& name) {
  for (const auto& [n, t] : m.named_parameters())
    if (n == name) return t;
  ADD_FAILURE() << "no parameter " << name;
  return Tensor();
}

std::string random_residues(int64_t n, uint64_t seed) {
  std::string s;
  uint64_t x = seed * 2654435761u + 12345;
  for (int64_t i = 0; i < n; ++i) {
    x = x * 6364136223846793005ULL + 1442695040888963407ULL;
    s += kResidueChars[(x >> 33) % kNumStandard];
  }
  return s;
}

}  // namespace

// ---- the model --------------------------------------------------------------------------------

TEST(ProteinModel, ShapesAndParameterNames) {
  auto m = toy_model(toy_config());
  NoGradGuard ng;
  Tensor tokens = from_vector<int64_t>(std::vector<int64_t>(3 * 7, 5), {3, 7});
  Tensor h = m->hidden(tokens, Tensor());
  EXPECT_EQ(h.shape(), (Shape{3, 7, 16}));
  EXPECT_EQ(m->logits(h).shape(), (Shape{3, 7, kVocabSize}));
  EXPECT_EQ(m->forward(tokens, Tensor()).shape(), (Shape{3, 7, kVocabSize}));

  std::map<std::string, Shape> shapes;
  for (const auto& [name, t] : m->named_parameters()) shapes[name] = t.shape();
  EXPECT_EQ(shapes.at("embed.weight"), (Shape{kVocabSize, 16}));
  EXPECT_EQ(shapes.at("pos.weight"), (Shape{16, 16}));
  EXPECT_EQ(shapes.at("head.dense.weight"), (Shape{16, 16}));
  EXPECT_EQ(shapes.at("head.dense.bias"), (Shape{16}));
  EXPECT_EQ(shapes.at("head.norm.weight"), (Shape{16}));
  EXPECT_EQ(shapes.at("head.norm.bias"), (Shape{16}));
  EXPECT_EQ(shapes.at("head.bias"), (Shape{kVocabSize}));
  EXPECT_EQ(shapes.at("encoder.norm.weight"), (Shape{16}));
  EXPECT_TRUE(shapes.count("encoder.layers.1.attn.q_proj.weight")) << "two encoder layers";
  EXPECT_FALSE(shapes.count("encoder.layers.2.attn.q_proj.weight"));
  for (const auto& [name, shape] : shapes) {
    const bool known = name.rfind("embed.", 0) == 0 || name.rfind("pos.", 0) == 0 ||
                       name.rfind("encoder.layers.", 0) == 0 || name.rfind("encoder.norm.", 0) == 0 ||
                       name.rfind("head.dense.", 0) == 0 || name.rfind("head.norm.", 0) == 0 || name == "head.bias";
    EXPECT_TRUE(known) << name;
    // The only [33, dim] matrix is the embedding: there is no separate output layer.
    if (name != "embed.weight") {
      EXPECT_NE(shape, (Shape{kVocabSize, 16})) << name;
    }
  }
  // The <pad> row starts at zero, the others do not.
  EXPECT_EQ(sum(abs(select(m->state_dict().at("embed.weight"), 0, kPad))).item(), 0.0);
  EXPECT_GT(sum(abs(select(m->state_dict().at("embed.weight"), 0, kCls))).item(), 0.0);
}

TEST(ProteinModel, OutputLayerIsTheEmbedding) {
  auto m = toy_model(toy_config());
  const Tensor tokens = row_tokens(framed("MKTAYIAK"));  // no 'W' (id 22)
  const int64_t w = residue_id('W');
  Tensor h0, l0;
  {
    NoGradGuard ng;
    h0 = m->hidden(tokens, Tensor());
    l0 = m->logits(h0);
  }
  // Moving the row of a token the input does not hold changes that token's logits only.
  const Tensor E = param(*m, "embed.weight");
  {
    NoGradGuard ng;
    // (not a constant shift: the head's LayerNorm output sums to zero at initialization)
    manual_seed(11);
    E.narrow(0, w, 1).copy_(E.narrow(0, w, 1) + randn({1, 16}));
  }
  NoGradGuard ng;
  const Tensor h1 = m->hidden(tokens, Tensor()), l1 = m->logits(h1);
  EXPECT_TRUE(all_close(h1, h0, 0, 0));
  EXPECT_GT(max(abs(sub(select(l1, 2, w), select(l0, 2, w)))).item(), 1e-3);
  for (int64_t c = 0; c < kVocabSize; ++c) {
    if (c != w) {
      EXPECT_TRUE(all_close(select(l1, 2, c), select(l0, 2, c), 1e-6, 1e-6)) << "logit " << c;
    }
  }
}

TEST(ProteinModel, TiedMatrixGetsBothGradients) {
  // float64 central differences of a loss through the whole model against backward, for
  // entries of embed.weight in rows the input holds (input and output use) and rows it does
  // not (output use only).
  ModelConfig c = toy_config();
  c.dim = 8;
  c.layers = 1;
  c.mlp_hidden = 16;
  auto m = toy_model(c, 3);
  m->to(DType::Float64);
  const Tensor tokens = row_tokens(framed("MKTAYIAK"));
  manual_seed(4);
  const Tensor g = randn({1, 10, kVocabSize}, TensorOptions(DType::Float64));
  auto loss = [&] { return sum(m->forward(tokens, Tensor()) * g); };
  Tensor E = param(*m, "embed.weight");
  m->zero_grad();
  loss().backward();
  const Tensor grad = E.grad();
  ASSERT_TRUE(grad.defined());
  double* p = E.data<double>();
  const std::vector<double> analytic = grad.to_vector<double>();
  int checked = 0;
  for (int64_t row : {residue_id('M'), residue_id('A'), residue_id('W'), kMask, kEos})
    for (int64_t d : {0, 3, 7}) {
      const int64_t i = row * c.dim + d;
      NoGradGuard ng;
      const double orig = p[i];
      p[i] = orig + 1e-6;
      const double up = loss().item();
      p[i] = orig - 1e-6;
      const double down = loss().item();
      p[i] = orig;
      const double numeric = (up - down) / 2e-6;
      EXPECT_NEAR(analytic[i], numeric, 1e-5 + 1e-3 * std::fabs(numeric)) << "row " << row << " dim " << d;
      ++checked;
    }
  EXPECT_EQ(checked, 15);
}

TEST(ProteinModel, HeadGradcheck) {
  ModelConfig c = toy_config();
  c.dim = 4;
  c.heads = 1;
  c.layers = 1;
  c.mlp_hidden = 8;
  auto m = toy_model(c, 5);
  m->to(DType::Float64);
  manual_seed(6);
  Tensor h = randn64({2, 3, 4});
  EXPECT_GRADCHECK([&](const std::vector<Tensor>& in) { return m->logits(in[0]); }, {h});
}

TEST(ProteinModel, PaddedInABatchAsAlone) {
  for (const std::string spec : {"softmax", "performer:features=16", "nprf_rpe:features=16"}) {
    SCOPED_TRACE(spec);
    auto m = toy_model(toy_config(spec));
    const std::vector<int64_t> a = framed("MKTAY"), b = framed("GLSDGEWQQVLNV");
    const int64_t T = static_cast<int64_t>(b.size()), La = static_cast<int64_t>(a.size());
    std::vector<int64_t> ids(2 * T, kPad), pad(2 * T, 0);
    std::copy(a.begin(), a.end(), ids.begin());
    std::fill(pad.begin() + La, pad.begin() + T, 1);
    std::copy(b.begin(), b.end(), ids.begin() + T);
    Tensor hb;
    {
      NoGradGuard ng;
      hb = m->hidden(from_vector<int64_t>(ids, {2, T}), from_vector<int64_t>(pad, {2, T}) != 0.0);
    }
    EXPECT_TRUE(all_close(select(hb, 0, 0).narrow(0, 0, La), select(hidden_alone(*m, a), 0, 0), 2e-5, 1e-4));
    EXPECT_TRUE(all_close(select(hb, 0, 1), select(hidden_alone(*m, b), 0, 0), 2e-5, 1e-4));
    // Without the mask the padding is seen (the test can tell).
    NoGradGuard ng;
    Tensor unmasked = m->hidden(from_vector<int64_t>(ids, {2, T}), Tensor());
    EXPECT_FALSE(all_close(select(unmasked, 0, 0).narrow(0, 0, La), select(hidden_alone(*m, a), 0, 0), 2e-5, 1e-4));
  }
}

TEST(ProteinModel, PositionsNoneSeesABagOfResidues) {
  // Without positions, softmax attention is permutation-equivariant: reversing the residues
  // reverses the hidden states. Learned positions break that.
  const std::vector<int64_t> fwd = framed("MKTAYIAKQR");
  std::vector<int64_t> rev = fwd;
  std::reverse(rev.begin() + 1, rev.end() - 1);
  for (const std::string positions : {"none", "learned"}) {
    ModelConfig c = toy_config();
    c.positions = positions;
    auto m = toy_model(c);
    bool has_pos = false;
    for (const auto& [name, t] : m->named_parameters()) has_pos = has_pos || name == "pos.weight";
    EXPECT_EQ(has_pos, positions == "learned");
    const Tensor hf = select(hidden_alone(*m, fwd), 0, 0), hr = select(hidden_alone(*m, rev), 0, 0);
    const int64_t n = static_cast<int64_t>(fwd.size()) - 2;
    std::vector<int64_t> back(n);
    for (int64_t i = 0; i < n; ++i) back[i] = n - i;  // position 1 + i of rev holds residue n - i
    const Tensor hr_back = index_select(hr, 0, from_vector<int64_t>(back, {n}));
    const bool equivariant = all_close(hf.narrow(0, 1, n), hr_back, 1e-5, 1e-4);
    EXPECT_EQ(equivariant, positions == "none") << positions;
  }
}

TEST(ProteinModel, ConfigJsonRoundTripAndErrors) {
  ModelConfig c = toy_config("performer:features=8", 40);
  c.dropout = 0.25;
  c.positions = "none";
  const json j = nlohmann::json(c);
  const ModelConfig r = model_from_json(json::parse(j.dump()));
  EXPECT_EQ(r.dim, c.dim);
  EXPECT_EQ(r.heads, c.heads);
  EXPECT_EQ(r.layers, c.layers);
  EXPECT_EQ(r.mlp_hidden, c.mlp_hidden);
  EXPECT_EQ(r.dropout, c.dropout);
  EXPECT_EQ(r.attention, c.attention);
  EXPECT_EQ(r.positions, c.positions);
  EXPECT_EQ(r.max_len, c.max_len);
  EXPECT_EQ(nlohmann::json(r), j);
  for (const char* key : {"dim", "heads", "layers", "mlp_hidden", "dropout", "attention", "positions", "max_len"}) {
    json missing = j;
    missing.erase(std::string(key));
    EXPECT_LINEA_ERROR(model_from_json(missing), std::string("\"") + key + "\"");
  }
  json wrong = j;
  wrong["heads"] = "four";
  EXPECT_LINEA_ERROR(model_from_json(wrong), "\"heads\" has the wrong type");
  EXPECT_LINEA_ERROR(model_from_json(json::array()), "JSON object");

  auto bad = [](auto edit) {
    ModelConfig b = toy_config();
    edit(b);
    ProteinLM m(b);
  };
  EXPECT_LINEA_ERROR(bad([](ModelConfig& b) { b.heads = 3; }), "--dim 16 must be a positive multiple of --heads 3");
  EXPECT_LINEA_ERROR(bad([](ModelConfig& b) { b.positions = "sinusoidal"; }), "--positions must be learned or none");
  EXPECT_LINEA_ERROR(bad([](ModelConfig& b) { b.max_len = 2; }), "--max-len must be at least 3");
  EXPECT_LINEA_ERROR(bad([](ModelConfig& b) { b.attention = "nonesuch"; }), "unknown attention 'nonesuch'");
  EXPECT_LINEA_ERROR(bad([](ModelConfig& b) { b.attention = "performer:feature=8"; }), "feature");
  EXPECT_LINEA_ERROR(bad([](ModelConfig& b) { b.attention = "nprf_rpe:max_len=8"; }), "--max-len 16");
  EXPECT_LINEA_ERROR(bad([](ModelConfig& b) { b.dropout = 1.0; }), "--dropout");
  EXPECT_LINEA_ERROR(bad([](ModelConfig& b) { b.dropout = -0.1; }), "--dropout must be in [0, 1), got -0.1");
  EXPECT_LINEA_ERROR(bad([](ModelConfig& b) { b.dim = -16; }), "--dim -16 must be a positive multiple of --heads 2");
  EXPECT_LINEA_ERROR(bad([](ModelConfig& b) { b.layers = 0; }), "--layers must be positive, got 0");
  EXPECT_LINEA_ERROR(bad([](ModelConfig& b) { b.mlp_hidden = 0; }), "--mlp-hidden must be positive, got 0");
  // nprf_rpe reaches across a whole window of max_len tokens by default.
  manual_seed(2);
  ProteinLM nprf(toy_config("nprf_rpe:features=8", 40));
  nprf.eval();
  NoGradGuard ng;
  EXPECT_EQ(nprf.hidden(from_vector<int64_t>(std::vector<int64_t>(40, 5), {1, 40}), Tensor()).shape(),
            (Shape{1, 40, 16}));
  int tables = 0;  // its relative-position table spans offsets -39..39
  for (const auto& [name, t] : nprf.named_parameters())
    if (name.size() > 4 && name.substr(name.size() - 4) == ".rpe") {
      EXPECT_EQ(t.size(1), 2 * 40 - 1) << name;
      ++tables;
    }
  EXPECT_EQ(tables, 2);
}

TEST(ProteinModel, LongerThanMaxLenIsAnError) {
  auto m = toy_model(toy_config());
  NoGradGuard ng;
  EXPECT_LINEA_ERROR(m->hidden(from_vector<int64_t>(std::vector<int64_t>(17, 5), {1, 17}), Tensor()), "--max-len");
  EXPECT_LINEA_ERROR(m->hidden(from_vector<int64_t>(std::vector<int64_t>(16, 5), {16}), Tensor()), "[B, T]");
  EXPECT_LINEA_ERROR(m->hidden(from_vector<int64_t>(std::vector<int64_t>(4, 5), {2, 2}), zeros({2, 3})), "padding");
  EXPECT_EQ(m->hidden(from_vector<int64_t>(std::vector<int64_t>(16, 5), {1, 16}), Tensor()).size(1), 16);
  EXPECT_LINEA_ERROR(m->logits(zeros({2, 15})), "ProteinLM::logits: expected [..., 16], got [2, 15]");
  EXPECT_LINEA_ERROR(m->logits(Tensor()), "ProteinLM::logits: expected [..., 16], got undefined");
}

// The forward as ESM-2 lays it out, composed here from the model's own parts: the tokens' rows
// times sqrt(dim) plus the learned positions, dropout, the encoder under the padding mask, then
// the head, LayerNorm(GELU(dense(h))) against the embedding matrix plus its own bias; the
// embedding's gradient leaves out the <pad> row's input use (padding_idx), not its output use.
// The embedding starts as N(0, dim^-1/2).
TEST(ProteinModel, ForwardIsEsm2sLayout) {
  ModelConfig c = toy_config();
  c.dropout = 0.25;
  auto m = toy_model(c);
  const Tensor E = param(*m, "embed.weight"), P = param(*m, "pos.weight");
  Tensor bias = param(*m, "head.bias");
  const std::vector<float> rows = narrow(E, 0, kFirstResidue, kVocabSize - kFirstResidue).to_vector<float>();
  double sq = 0;
  for (float v : rows) sq += double(v) * v;
  EXPECT_NEAR(std::sqrt(sq / rows.size()), 0.25, 0.03);
  {
    NoGradGuard ng;
    manual_seed(3);
    bias.copy_(randn({kVocabSize}));
  }
  std::vector<int64_t> ids = framed("MKTAYIAK"), short_ids = framed("MKT");
  short_ids.resize(ids.size(), kPad);
  ids.insert(ids.end(), short_ids.begin(), short_ids.end());
  const Tensor tokens = from_vector<int64_t>(ids, {2, 10}), pad = eq(tokens, kPad);
  std::map<std::string, std::shared_ptr<nn::Module>> parts;
  for (const auto& [name, module] : m->named_modules()) parts[name] = module;
  auto& encoder = static_cast<attn::TransformerEncoder&>(*parts.at("encoder"));
  auto& dense = static_cast<nn::Linear&>(*parts.at("head.dense"));
  auto& norm = static_cast<nn::LayerNorm&>(*parts.at("head.norm"));
  m->train();
  manual_seed(9);
  const Tensor g = randn({2, 10, kVocabSize});
  const auto gradient_of = [&](const std::function<Tensor()>& logits) {
    manual_seed(5);
    m->zero_grad();
    const Tensor l = logits();
    sum(l * g).backward();
    return std::make_pair(l.detach(), E.grad().detach());
  };
  const auto [got, got_grad] = gradient_of([&] { return m->forward(tokens, pad); });
  const auto [want, want_grad] = gradient_of([&] {
    Tensor x = embedding(E, tokens, kPad) * 4.0 + narrow(P, 0, 0, 10);
    x = dropout(x, 0.25, true);
    attn::AttentionOptions o;
    o.key_padding_mask = pad;
    const Tensor h = encoder(x, o);
    return matmul(norm(gelu(dense(h))), transpose(E, 0, 1)) + bias;
  });
  EXPECT_TRUE(all_close(got, want, 1e-5, 1e-5)) << max(abs(got - want)).item();
  EXPECT_TRUE(all_close(got_grad, want_grad, 1e-5, 1e-5)) << max(abs(got_grad - want_grad)).item();
}

// ---- the predictor ------------------------------------------------------------------------------

namespace {
// A checkpoint folder as a training run leaves it: config.json and model.safetensors.
void save_checkpoint(const std::string& dir, const ProteinLM& m, const std::string& format = kConfigFormat) {
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/config.json") << json{{"format", format}, {"model", nlohmann::json(m.config())}}.dump(2);
  nn::save_module(dir + "/model.safetensors", m);
}

// The k most probable residues (ids 4..30) of a probability row [33], best first.
std::vector<std::pair<std::string, double>> top_k(const std::vector<double>& p, int64_t k) {
  std::vector<int64_t> ids;
  for (int64_t i = kFirstResidue; i < kFirstResidue + kNumResidueTokens; ++i) ids.push_back(i);
  std::stable_sort(ids.begin(), ids.end(), [&](int64_t a, int64_t b) { return p[a] > p[b]; });
  std::vector<std::pair<std::string, double>> out;
  for (int64_t j = 0; j < k; ++j) out.emplace_back(token_text(ids[j]), p[ids[j]]);
  return out;
}

// Softmax row of position `pos` of an unpadded window.
std::vector<double> probs_at(ProteinLM& m, const std::vector<int64_t>& window, int64_t pos) {
  NoGradGuard ng;
  Tensor p = softmax(m.forward(row_tokens(window), Tensor()), -1);
  return select(select(p, 0, 0), 0, pos).to_vector<double>();
}
}  // namespace

TEST(ProteinPredictor, LoadAndFill) {
  TempDir tmp;
  auto m = toy_model(toy_config("softmax", 12), 7);
  save_checkpoint(tmp.file("ckpt"), *m);
  Predictor p = Predictor::load(tmp.file("ckpt"));
  EXPECT_FALSE(p.model().is_training());

  const std::string text = "MKT<mask>LLA<mask>";
  const std::vector<Fill> fills = p.fill(text, 5);
  ASSERT_EQ(fills.size(), 2u);
  EXPECT_EQ(fills[0].position, 4);
  EXPECT_EQ(fills[1].position, 8);
  const std::vector<int64_t> window = {kCls,
                                       residue_id('M'),
                                       residue_id('K'),
                                       residue_id('T'),
                                       kMask,
                                       residue_id('L'),
                                       residue_id('L'),
                                       residue_id('A'),
                                       kMask,
                                       kEos};
  for (const Fill& f : fills) {
    ASSERT_EQ(f.top.size(), 5u);
    double total = 0;
    for (size_t j = 0; j < f.top.size(); ++j) {
      total += f.top[j].second;
      if (j > 0) {
        EXPECT_GE(f.top[j - 1].second, f.top[j].second);
      }
      EXPECT_EQ(f.top[j].first.size(), 1u) << "a residue character";
    }
    EXPECT_LE(total, 1.0 + 1e-6);
    // The full softmax's probabilities, computed from the model directly (the loaded copy and
    // the original have the same weights).
    const auto want = top_k(probs_at(*m, window, f.position), 5);
    for (size_t j = 0; j < 5; ++j) {
      EXPECT_EQ(f.top[j].first, want[j].first);
      EXPECT_NEAR(f.top[j].second, want[j].second, 1e-6);
    }
  }
  EXPECT_EQ(p.fill(text, 27)[0].top.size(), 27u);
  EXPECT_LINEA_ERROR(p.fill("MKTLL", 5), "no <mask>");
  EXPECT_LINEA_ERROR(p.fill(text, 0), "[1, 27]");
  EXPECT_LINEA_ERROR(p.fill(text, 28), "[1, 27]");
}

TEST(ProteinPredictor, FillLongerThanMaxLenUsesTheMasksWindow) {
  auto m = toy_model(toy_config("softmax", 12), 8);  // windows of at most 10 residues
  Predictor p(m, kCPU);
  m->train();
  std::string residues = random_residues(27, 1);
  std::string text;
  const std::vector<int64_t> masks = {2, 13, 25};  // 0-based residue positions
  for (int64_t i = 0; i < 27; ++i)
    text += std::find(masks.begin(), masks.end(), i) != masks.end() ? std::string("<mask>") : residues.substr(i, 1);
  const std::vector<Fill> fills = p.fill(text, 3);
  EXPECT_TRUE(m->is_training()) << "fill restores the model's mode";
  m->eval();
  ASSERT_EQ(fills.size(), 3u);
  const std::vector<int64_t> ids = parse_tokens(text);
  const auto windows = sequence_windows(27, 10);
  ASSERT_EQ(windows.size(), 3u);
  for (size_t f = 0; f < fills.size(); ++f) {
    const int64_t pos = masks[f];
    EXPECT_EQ(fills[f].position, pos + 1);
    for (const auto& [b, e] : windows) {
      if (pos < b || pos >= e) continue;
      std::vector<int64_t> window{kCls};
      window.insert(window.end(), ids.begin() + b, ids.begin() + e);
      window.push_back(kEos);
      const auto want = top_k(probs_at(*m, window, 1 + pos - b), 3);
      for (size_t j = 0; j < 3; ++j) {
        EXPECT_EQ(fills[f].top[j].first, want[j].first);
        EXPECT_NEAR(fills[f].top[j].second, want[j].second, 1e-6);
      }
    }
  }
}

TEST(ProteinPredictor, EmbedWindowsAndMeans) {
  auto m = toy_model(toy_config("softmax", 12), 9);  // windows of at most 10 residues
  Predictor p(m, kCPU);
  Sequences seqs;
  const std::vector<std::string> text = {random_residues(5, 2), random_residues(25, 3), random_residues(10, 4),
                                         random_residues(1, 5)};
  for (size_t i = 0; i < text.size(); ++i) {
    seqs.names.push_back("seq" + std::to_string(i));
    std::vector<int8_t> r;
    for (char ch : text[i]) r.push_back(static_cast<int8_t>(residue_id(ch)));
    seqs.residues.push_back(r);
  }
  // A small token budget: several batches, with padding in some.
  const Embeddings e = p.embed(seqs, /*per_residue=*/true, /*batch_tokens=*/30);
  EXPECT_EQ(e.names, seqs.names);
  ASSERT_EQ(e.mean.shape(), (Shape{4, 16}));
  ASSERT_EQ(e.residues.size(), 4u);
  for (size_t i = 0; i < text.size(); ++i) {
    SCOPED_TRACE(seqs.names[i]);
    const int64_t len = static_cast<int64_t>(text[i].size());
    ASSERT_EQ(e.residues[i].shape(), (Shape{len, 16}));
    // Each window's rows are that window's own forward (framed <cls> ... <eos>, unpadded).
    const auto windows = sequence_windows(len, 10);
    EXPECT_EQ(static_cast<int64_t>(windows.size()), (len + 9) / 10);
    for (const auto& [b, en] : windows) {
      const Tensor h = select(hidden_alone(*m, framed(text[i].substr(b, en - b))), 0, 0);
      EXPECT_TRUE(all_close(e.residues[i].narrow(0, b, en - b), h.narrow(0, 1, en - b), 2e-5, 1e-4));
    }
    // The mean is the mean of the residue rows (not <cls>/<eos>).
    EXPECT_TRUE(all_close(select(e.mean, 0, i), mean(e.residues[i], {0}), 1e-6, 1e-5));
  }
  // Without per-residue output, and one window per batch, the means are the same.
  const Embeddings e1 = p.embed(seqs, /*per_residue=*/false, /*batch_tokens=*/1);
  EXPECT_TRUE(e1.residues.empty());
  EXPECT_TRUE(all_close(e1.mean, e.mean, 2e-5, 1e-4));
  // The mean differs from the <cls> state and from a mean including <cls>/<eos>.
  const Tensor h0 = select(hidden_alone(*m, framed(text[0])), 0, 0);
  EXPECT_TRUE(all_close(select(e.mean, 0, 0), mean(h0.narrow(0, 1, 5), {0}), 2e-5, 1e-4));
  EXPECT_FALSE(all_close(select(e.mean, 0, 0), mean(h0, {0}), 2e-5, 1e-4));

  Sequences empty_seq;
  empty_seq.names = {"empty"};
  empty_seq.residues = {{}};
  EXPECT_LINEA_ERROR(p.embed(empty_seq), "'empty' is empty");
  EXPECT_LINEA_ERROR(p.embed(seqs, false, 0), "at least one token");
}

TEST(ProteinPredictor, RefusesOtherCheckpoints) {
  TempDir tmp;
  auto m = toy_model(toy_config());
  const std::string dir = tmp.file("translate_ckpt");
  save_checkpoint(dir, *m, "linea-translate/1");
  EXPECT_LINEA_ERROR(Predictor::load(dir), dir);
  EXPECT_LINEA_ERROR(Predictor::load(dir), "format 'linea-translate/1'");
  EXPECT_LINEA_ERROR(Predictor::load(tmp.file("nowhere")), "does not exist");
  std::filesystem::create_directories(tmp.file("no_config"));
  EXPECT_LINEA_ERROR(Predictor::load(tmp.file("no_config")), "no config.json");
  // A protein config without a model key, and one whose model lacks a key.
  const std::string d2 = tmp.file("broken");
  save_checkpoint(d2, *m);
  std::ofstream(d2 + "/config.json") << json{{"format", kConfigFormat}}.dump();
  EXPECT_LINEA_ERROR(Predictor::load(d2), "has no \"model\"");
  json mj = nlohmann::json(m->config());
  mj.erase("max_len");
  std::ofstream(d2 + "/config.json") << json{{"format", kConfigFormat}, {"model", mj}}.dump();
  EXPECT_LINEA_ERROR(Predictor::load(d2), "\"max_len\"");
  EXPECT_LINEA_ERROR(Predictor::load(d2), "protein: '" + d2 + "/config.json': ");
  // Weights of another shape.
  ModelConfig other = m->config();
  other.dim = 8;
  std::ofstream(d2 + "/config.json") << json{{"format", kConfigFormat}, {"model", nlohmann::json(other)}}.dump();
  EXPECT_THROW(Predictor::load(d2), linea::Error);
  // Weights that are not finite.
  std::ofstream(d2 + "/config.json") << json{{"format", kConfigFormat}, {"model", nlohmann::json(m->config())}}.dump();
  {
    NoGradGuard ng;
    param(*m, "head.bias").fill_(std::nan(""));
  }
  nn::save_module(d2 + "/model.safetensors", *m);
  EXPECT_LINEA_ERROR(Predictor::load(d2), "protein: '" + d2 + "/model.safetensors'");
  EXPECT_LINEA_ERROR(Predictor(nullptr, kCPU), "protein: Predictor needs a model");
}

// A model handed over in training mode (dropout on) predicts in eval mode, and is given back in
// training mode.
TEST(ProteinPredictor, PredictsInEvalModeAndGivesTheModelBack) {
  ModelConfig c = toy_config();
  c.dropout = 0.5;
  auto m = toy_model(c);
  m->train();
  Predictor p(m, kCPU);
  const std::vector<Fill> a = p.fill("MKT<mask>YIAK", 3);
  EXPECT_TRUE(m->is_training());
  const std::vector<Fill> b = p.fill("MKT<mask>YIAK", 3);
  ASSERT_EQ(a.size(), 1u);
  ASSERT_EQ(b.size(), 1u);
  EXPECT_EQ(a[0].top, b[0].top);
}

TEST(ProteinPredictor, SaveEmbeddingsRoundTrip) {
  TempDir tmp;
  auto m = toy_model(toy_config("softmax", 12), 10);
  Predictor p(m, kCPU);
  Sequences seqs;
  seqs.names = {"sp|P1|A", "tr|Q2|B", "c"};
  for (int64_t len : {4, 13, 2}) {
    std::vector<int8_t> r;
    for (char ch : random_residues(len, static_cast<uint64_t>(len))) r.push_back(static_cast<int8_t>(residue_id(ch)));
    seqs.residues.push_back(r);
  }
  const Embeddings e = p.embed(seqs, true);
  const std::string path = tmp.file("emb.safetensors");
  save_embeddings(path, e, {{"checkpoint", "runs/x"}});
  const nn::SafetensorsFile f = nn::load_safetensors(path);
  EXPECT_EQ(f.metadata.at("format"), kEmbeddingsFormat);
  EXPECT_EQ(f.metadata.at("dim"), "16");
  EXPECT_EQ(f.metadata.at("checkpoint"), "runs/x");
  EXPECT_EQ(json::parse(f.metadata.at("names")).get<std::vector<std::string>>(), seqs.names);
  EXPECT_EQ(f.tensors.size(), 4u);
  EXPECT_TRUE(all_close(f.tensors.at("mean"), e.mean, 0, 0));
  for (size_t i = 0; i < 3; ++i)
    EXPECT_TRUE(all_close(f.tensors.at("residues." + std::to_string(i)), e.residues[i], 0, 0));
  // Means only; and nothing but the file in the folder (no temporary left behind).
  save_embeddings(tmp.file("mean.safetensors"), p.embed(seqs, false));
  EXPECT_EQ(nn::load_safetensors(tmp.file("mean.safetensors")).tensors.size(), 1u);
  int files = 0;
  for (const auto& entry : std::filesystem::directory_iterator(tmp.path)) files += entry.is_regular_file();
  EXPECT_EQ(files, 2);
  EXPECT_LINEA_ERROR(save_embeddings(tmp.file("x.safetensors"), e, {{"format", "mine"}}), "'format'");
  Embeddings wrong = e;
  wrong.names.pop_back();
  EXPECT_LINEA_ERROR(save_embeddings(tmp.file("x.safetensors"), wrong), "save_embeddings");
  Embeddings means = p.embed(seqs, false);
  means.names.pop_back();
  EXPECT_LINEA_ERROR(save_embeddings(tmp.file("x.safetensors"), means),
                     "save_embeddings: expected mean [2, dim] for 2 names, got [3, 16]");
  means.mean = Tensor();
  EXPECT_LINEA_ERROR(save_embeddings(tmp.file("x.safetensors"), means), "got undefined");
  Embeddings narrow_rows = e;
  narrow_rows.residues[1] = zeros({13, 8});
  EXPECT_LINEA_ERROR(save_embeddings(tmp.file("x.safetensors"), narrow_rows),
                     "save_embeddings: residues of 'tr|Q2|B' must be [length, 16], got [13, 8]");
  Sequences unnamed = seqs;
  unnamed.names.pop_back();
  EXPECT_LINEA_ERROR(p.embed(unnamed), "protein embed: 2 names for 3 sequences");
}

// ---- metrics ------------------------------------------------------------------------------------

// The baseline: add-one counts over the 27 residue tokens of the training split, specials 0; its
// prediction the first most frequent residue.
TEST(ProteinMetrics, UnigramIsAddOneSmoothedResidueFrequencies) {
  Sequences train;
  const int8_t L = static_cast<int8_t>(kFirstResidue), A = L + 1, G = L + 2;
  train.residues = {{L, A, A}, {A, G}};  // L 1, A 3, G 1 of 5
  const Unigram u(train);
  EXPECT_EQ(u.argmax, A);
  EXPECT_DOUBLE_EQ(u.p[A], 4.0 / (5 + kNumResidueTokens));
  EXPECT_DOUBLE_EQ(u.p[L], 2.0 / (5 + kNumResidueTokens));
  EXPECT_DOUBLE_EQ(u.p[kFirstResidue + kNumResidueTokens - 1], 1.0 / (5 + kNumResidueTokens));
  double sum = 0;
  for (int64_t id = 0; id < kVocabSize; ++id) sum += u.p[id];
  EXPECT_NEAR(sum, 1.0, 1e-12);
  for (int64_t id : {kCls, kPad, kEos, kUnk, kNull, kMask}) EXPECT_EQ(u.p[id], 0.0) << id;
  train.residues = {{G, L}};  // a tie: the first of the most frequent (L, id 4)
  EXPECT_EQ(Unigram(train).argmax, L);
}

// A tally over four positions, one not masked: the prediction is a row's largest log-probability
// (the first of equals), the loss the mean negative log-probability of the targets, perplexity
// its exp; the baseline on the same positions; per residue.
TEST(ProteinMetrics, TallyCountsTheMaskedPositions) {
  Sequences train;
  const int64_t L = kFirstResidue, A = L + 1, G = L + 2;
  train.residues = {{static_cast<int8_t>(A)}};
  const Unigram u(train);  // argmax A
  std::vector<float> lp(4 * kVocabSize, -10.0f);
  const auto row = [&](int64_t i) { return lp.data() + i * kVocabSize; };
  row(0)[L] = -0.5f, row(0)[A] = -1.0f;   // target L: right
  row(1)[L] = -0.25f, row(1)[A] = -2.0f;  // target A: wrong
  row(2)[A] = -0.1f;                      // not masked (target pad): left out
  row(3)[G] = -3.0f, row(3)[A] = -3.0f;   // target G: a tie, the first (A) is predicted: wrong
  const std::vector<int64_t> targets = {L, A, kPad, G};
  Tally t;
  t.add(lp.data(), targets.data(), 4, u);
  EXPECT_EQ(t.masked, 3);
  EXPECT_EQ(t.correct, 1);
  EXPECT_DOUBLE_EQ(t.accuracy(), 1.0 / 3);
  EXPECT_DOUBLE_EQ(t.loss(), (0.5 + 2.0 + 3.0) / 3);
  EXPECT_DOUBLE_EQ(t.perplexity(), std::exp((0.5 + 2.0 + 3.0) / 3));
  EXPECT_EQ(t.baseline_correct, 1);  // the A position
  EXPECT_NEAR(t.baseline_perplexity(), std::exp(-(std::log(u.p[L]) + std::log(u.p[A]) + std::log(u.p[G])) / 3), 1e-12);
  const json j = tally_json("test", t, true);
  EXPECT_EQ(j.at("test_masked_positions"), 3);
  EXPECT_DOUBLE_EQ(j.at("baseline_test_masked_accuracy").get<double>(), 1.0 / 3);
  EXPECT_EQ(j.at("test_per_residue_accuracy").at(token_text(L)).at("accuracy"), 1.0);
  EXPECT_EQ(j.at("test_per_residue_accuracy").at(token_text(G)).at("positions"), 1);
  EXPECT_EQ(j.at("test_per_residue_accuracy").size(), 3u);
  EXPECT_FALSE(tally_json("valid", t, false).contains("baseline_valid_perplexity"));
  EXPECT_EQ(Tally().perplexity(), 1.0);  // no masked position: loss 0
}
