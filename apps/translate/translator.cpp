#include "translator.h"

#include <algorithm>
#include <chrono>
#include <numeric>

#include "apps/common/metrics.h"
#include "apps/common/train_loop.h"
#include "autograd/ops.h"
#include "core/error.h"
#include "nn/safetensors.h"

using namespace linea;
using json = nlohmann::json;

namespace translate {

Translator::Translator(std::shared_ptr<Seq2Seq> model, std::shared_ptr<const Tokenizer> src_tok,
                       std::shared_ptr<const Tokenizer> tgt_tok, Device device)
    : model_(std::move(model)), src_(std::move(src_tok)), tgt_(std::move(tgt_tok)), device_(device) {}

Translator Translator::load(const std::string& dir, Device device) {
  const json cfg = linea::apps::read_checkpoint_config(dir, "translate", kConfigFormat);
  ModelConfig mc;
  std::string src_file, tgt_file;
  try {
    mc = model_from_json(cfg.at("model"));
    src_file = cfg.at("tokenizers").at("source").get<std::string>();
    tgt_file = cfg.at("tokenizers").at("target").get<std::string>();
  } catch (const std::exception& e) {
    LINEA_FAIL("translate: '", dir, "/config.json' is malformed: ", e.what());
  }
  auto src = std::make_shared<const Tokenizer>(Tokenizer::from_file(dir + "/" + src_file));
  auto tgt = src_file == tgt_file ? src : std::make_shared<const Tokenizer>(Tokenizer::from_file(dir + "/" + tgt_file));
  LINEA_CHECK(src->vocab_size() == mc.src_vocab && tgt->vocab_size() == mc.tgt_vocab, "translate: '", dir,
              "': the tokenizers' vocabularies (", src->vocab_size(), ", ", tgt->vocab_size(),
              ") do not match the model's (", mc.src_vocab, ", ", mc.tgt_vocab, ")");
  auto model = std::make_shared<Seq2Seq>(mc);
  nn::load_module(dir + "/model.safetensors", *model);
  nn::check_finite_weights(*model, "translate: '" + dir + "/model.safetensors'");
  model->to(device);
  return Translator(model, src, tgt, device);
}

std::vector<int64_t> Translator::encode_source(const std::string& line, const std::string& what) const {
  std::vector<int64_t> ids = src_->encode(line);
  LINEA_CHECK(!ids.empty(), "translate: ", what, " is empty (nothing to translate)");
  ids.push_back(model_->config().eos_id);
  LINEA_CHECK(static_cast<int64_t>(ids.size()) <= model_->config().max_len, "translate: ", what, " has ", ids.size(),
              " tokens with its end token, more than the model's maximum of ", model_->config().max_len,
              " (split the sentence, or train with a larger --max-len)");
  return ids;
}

std::vector<std::vector<std::string>> Translator::translate(const std::vector<std::string>& lines,
                                                            const SearchOptions& o, int64_t batch_sentences,
                                                            DecodeStats* stats,
                                                            std::vector<std::vector<double>>* scores) {
  LINEA_CHECK(batch_sentences >= 1, "translate: the decoding batch must hold at least one sentence, got ",
              batch_sentences);
  const auto t0 = std::chrono::steady_clock::now();
  const int64_t n = static_cast<int64_t>(lines.size());
  std::vector<std::vector<int64_t>> ids(n);
  for (int64_t i = 0; i < n; ++i) ids[i] = encode_source(lines[i], "line " + std::to_string(i + 1));
  // Longest first, so that a batch's sentences have similar lengths (less padding).
  std::vector<int64_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return ids[a].size() > ids[b].size(); });

  const ModelConfig& c = model_->config();
  std::vector<std::vector<std::string>> out(n);
  if (scores) scores->assign(n, {});
  NoGradGuard ng;
  const bool was_training = model_->is_training();
  model_->eval();
  int64_t tokens = 0;
  for (int64_t first = 0; first < n; first += batch_sentences) {
    const int64_t B = std::min(batch_sentences, n - first);
    const int64_t S = static_cast<int64_t>(ids[order[first]].size());
    std::vector<int64_t> src(B * S, c.pad_id), pad(B * S, 1);
    for (int64_t b = 0; b < B; ++b) {
      const auto& s = ids[order[first + b]];
      std::copy(s.begin(), s.end(), src.begin() + b * S);
      std::fill(pad.begin() + b * S, pad.begin() + b * S + static_cast<int64_t>(s.size()), 0);
    }
    Tensor src_t = from_vector<int64_t>(src, {B, S}).to(device_);
    Tensor pad_t = (from_vector<int64_t>(pad, {B, S}) != 0.0).to(device_);
    std::vector<std::vector<Hypothesis>> hyps;
    if (o.beam == 1) {
      for (Hypothesis& h : greedy_search(*model_, src_t, pad_t, o)) hyps.push_back({std::move(h)});
    } else {
      hyps = beam_search(*model_, src_t, pad_t, o);
    }
    for (int64_t b = 0; b < B; ++b) {
      const int64_t i = order[first + b];
      for (const Hypothesis& h : hyps[b]) {
        out[i].push_back(tgt_->decode(h.tokens));
        if (scores) (*scores)[i].push_back(h.score);
      }
      tokens += static_cast<int64_t>(hyps[b].front().tokens.size()) + 1;
    }
  }
  if (was_training) model_->train();
  if (stats) {
    stats->sentences += n;
    stats->tokens += tokens;
    stats->seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  return out;
}

}  // namespace translate
