// Predictor: fill and embed with a trained ProteinLM (predictor.h), and the embeddings file.
// Not here: the model itself (model.h), training (train.h).
#include "predictor.h"

#include <algorithm>
#include <cstring>
#include <numeric>

#include "alphabet.h"
#include "apps/common/metrics.h"
#include "apps/common/train_loop.h"
#include "autograd/autograd.h"
#include "autograd/ops.h"
#include "core/error.h"

using namespace linea;
using json = nlohmann::json;

namespace protein {

namespace {
// Eval mode and no graph for a scope; the model's mode is restored on the way out, also when a
// forward throws.
class EvalScope {
 public:
  explicit EvalScope(nn::Module& m) : m_(m), was_training_(m.is_training()) { m_.eval(); }
  ~EvalScope() {
    if (was_training_) m_.train();
  }
  EvalScope(const EvalScope&) = delete;
  EvalScope& operator=(const EvalScope&) = delete;

 private:
  nn::Module& m_;
  bool was_training_;
  NoGradGuard no_grad_;
};
}  // namespace

Predictor::Predictor(std::shared_ptr<ProteinLM> model, Device device) : model_(std::move(model)), device_(device) {
  LINEA_CHECK(model_ != nullptr, "protein: Predictor needs a model");
  const auto params = model_->parameters();
  if (!params.empty() && params.front().device() != device_) model_->to(device_);
}

Predictor Predictor::load(const std::string& dir, Device device) {
  const json cfg = linea::apps::read_checkpoint_config(dir, "protein", kConfigFormat);
  LINEA_CHECK(cfg.contains("model"), "protein: '", dir, "/config.json' has no \"model\" (the model's settings)");
  ModelConfig mc;
  try {
    mc = model_from_json(cfg.at("model"));
  } catch (const Error& e) {
    LINEA_FAIL("protein: '", dir, "/config.json': ", e.what());
  }
  auto model = std::make_shared<ProteinLM>(mc);
  nn::load_module(dir + "/model.safetensors", *model);
  nn::check_finite_weights(*model, "protein: '" + dir + "/model.safetensors'");
  model->eval();
  return Predictor(model, device);
}

std::vector<Fill> Predictor::fill(const std::string& text, int64_t k) {
  LINEA_CHECK(k >= 1 && k <= kNumResidueTokens, "protein fill: the number of residues to list must be in [1, ",
              kNumResidueTokens, "], got ", k);
  const std::vector<int64_t> ids = parse_tokens(text);
  std::vector<int64_t> masks;  // 0-based positions of the <mask> tokens, ascending
  for (size_t i = 0; i < ids.size(); ++i)
    if (ids[i] == kMask) masks.push_back(static_cast<int64_t>(i));
  LINEA_CHECK(!masks.empty(),
              "protein fill: the input has no <mask> to fill (write <mask> where a residue is unknown)");

  EvalScope scope(*model_);
  const int64_t max_residues = model_->config().max_len - 2;
  std::vector<Fill> out;
  size_t m = 0;  // the next mask to fill
  // Each mask is predicted from the one window (dataset.h's sequence_windows) that holds it,
  // framed <cls> ... <eos> as in training; a window without a mask is not run.
  for (const auto& [begin, end] : sequence_windows(static_cast<int64_t>(ids.size()), max_residues)) {
    if (m == masks.size()) break;
    if (masks[m] >= end) continue;
    std::vector<int64_t> window{kCls};
    window.insert(window.end(), ids.begin() + begin, ids.begin() + end);
    window.push_back(kEos);
    const int64_t T = static_cast<int64_t>(window.size());
    Tensor tokens = from_vector<int64_t>(window, {1, T}).to(device_);
    const std::vector<float> probs = softmax(model_->forward(tokens, Tensor()), -1).to(kCPU).to_vector<float>();
    for (; m < masks.size() && masks[m] < end; ++m) {
      const float* p = probs.data() + (1 + masks[m] - begin) * kVocabSize;  // row of the mask's token
      std::vector<int64_t> cand(kNumResidueTokens);
      std::iota(cand.begin(), cand.end(), kFirstResidue);
      std::stable_sort(cand.begin(), cand.end(), [&](int64_t a, int64_t b) { return p[a] > p[b]; });
      Fill f;
      f.position = masks[m] + 1;
      for (int64_t j = 0; j < k; ++j) f.top.emplace_back(token_text(cand[j]), static_cast<double>(p[cand[j]]));
      out.push_back(std::move(f));
    }
  }
  return out;
}

Embeddings Predictor::embed(const Sequences& seqs, bool per_residue, int64_t batch_tokens) {
  LINEA_CHECK(batch_tokens >= 1, "protein embed: the batch must hold at least one token, got ", batch_tokens);
  LINEA_CHECK(seqs.names.size() == seqs.residues.size(), "protein embed: ", seqs.names.size(), " names for ",
              seqs.residues.size(), " sequences");
  const int64_t n = seqs.size(), dim = model_->config().dim, max_residues = model_->config().max_len - 2;

  // Every sequence's windows, longest first, so that a batch pads little.
  struct Win {
    int64_t seq, begin, end;
  };
  std::vector<Win> wins;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t len = static_cast<int64_t>(seqs.residues[i].size());
    LINEA_CHECK(len > 0, "protein embed: sequence ", i + 1, " '", seqs.names[i], "' is empty");
    for (const auto& [b, e] : sequence_windows(len, max_residues)) wins.push_back({i, b, e});
  }
  std::stable_sort(wins.begin(), wins.end(),
                   [](const Win& a, const Win& b) { return a.end - a.begin > b.end - b.begin; });

  Embeddings out;
  out.names = seqs.names;
  std::vector<double> sums(static_cast<size_t>(n * dim), 0.0);  // per sequence, over its residues
  if (per_residue)
    for (int64_t i = 0; i < n; ++i) out.residues.push_back(zeros({static_cast<int64_t>(seqs.residues[i].size()), dim}));

  EvalScope scope(*model_);
  for (size_t first = 0; first < wins.size();) {
    const int64_t T = wins[first].end - wins[first].begin + 2;  // the longest window of the batch, framed
    size_t last = first + 1;
    while (last < wins.size() && static_cast<int64_t>(last - first + 1) * T <= batch_tokens) ++last;
    const int64_t B = static_cast<int64_t>(last - first);
    std::vector<int64_t> tok(B * T, kPad), pad(B * T, 1);
    bool padded = false;
    for (int64_t b = 0; b < B; ++b) {
      const Win& w = wins[first + b];
      const int64_t len = w.end - w.begin;
      int64_t* row = tok.data() + b * T;
      row[0] = kCls;
      for (int64_t j = 0; j < len; ++j) row[1 + j] = seqs.residues[w.seq][w.begin + j];
      row[1 + len] = kEos;
      std::fill(pad.begin() + b * T, pad.begin() + b * T + len + 2, 0);
      padded = padded || len + 2 < T;
    }
    Tensor tokens = from_vector<int64_t>(tok, {B, T}).to(device_);
    Tensor mask = padded ? (from_vector<int64_t>(pad, {B, T}) != 0.0).to(device_) : Tensor();
    const Tensor h = model_->hidden(tokens, mask).to(kCPU).contiguous();  // [B, T, dim]
    const float* hp = h.data<float>();
    for (int64_t b = 0; b < B; ++b) {
      const Win& w = wins[first + b];
      double* sum = sums.data() + w.seq * dim;
      for (int64_t j = 0; j < w.end - w.begin; ++j) {
        const float* r = hp + (b * T + 1 + j) * dim;  // residue w.begin + j (after <cls>)
        for (int64_t d = 0; d < dim; ++d) sum[d] += r[d];
        if (per_residue) std::memcpy(out.residues[w.seq].data<float>() + (w.begin + j) * dim, r, dim * sizeof(float));
      }
    }
    first = last;
  }

  std::vector<float> means(static_cast<size_t>(n * dim));
  for (int64_t i = 0; i < n; ++i) {
    const double len = static_cast<double>(seqs.residues[i].size());
    for (int64_t d = 0; d < dim; ++d) means[i * dim + d] = static_cast<float>(sums[i * dim + d] / len);
  }
  out.mean = from_vector<float>(means, {n, dim});
  return out;
}

void save_embeddings(const std::string& path, const Embeddings& e, const nn::Metadata& extra) {
  const int64_t n = static_cast<int64_t>(e.names.size());
  LINEA_CHECK(e.mean.defined() && e.mean.dim() == 2 && e.mean.size(0) == n, "save_embeddings: expected mean [", n,
              ", dim] for ", n, " names, got ",
              e.mean.defined() ? shape_str(e.mean.shape()) : std::string("undefined"));
  const int64_t dim = e.mean.size(1);
  LINEA_CHECK(e.residues.empty() || static_cast<int64_t>(e.residues.size()) == n,
              "save_embeddings: ", e.residues.size(), " per-residue tensors for ", n, " names");
  nn::StateDict tensors{{"mean", e.mean}};
  for (size_t i = 0; i < e.residues.size(); ++i) {
    const Tensor& r = e.residues[i];
    LINEA_CHECK(r.defined() && r.dim() == 2 && r.size(1) == dim, "save_embeddings: residues of '", e.names[i],
                "' must be [length, ", dim, "], got ", r.defined() ? shape_str(r.shape()) : std::string("undefined"));
    tensors["residues." + std::to_string(i)] = r;
  }
  nn::Metadata meta{{"format", kEmbeddingsFormat}, {"dim", std::to_string(dim)}, {"names", json(e.names).dump()}};
  for (const auto& [key, value] : extra) {
    LINEA_CHECK(!meta.count(key), "save_embeddings: metadata key '", key, "' is the file's own");
    meta[key] = value;
  }
  nn::save_safetensors(path, tensors, meta);  // temp file + rename
}

}  // namespace protein
