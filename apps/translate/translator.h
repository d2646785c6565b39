// A trained translation model ready to translate text: the Seq2Seq model, its SentencePiece
// tokenizers and its config, loaded from a checkpoint folder (config.json, model.safetensors and
// the tokenizer model files that travel with it), or built from a model in training.
// translate() batches sentences of similar length, runs greedy or beam search and detokenizes.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "model.h"
#include "search.h"
#include "tokenizer.h"

namespace translate {

// config.json of a translate checkpoint: {"format": kConfigFormat, "model": json(ModelConfig),
// "tokenizers": {"source": file, "target": file} (files of the same folder), "data": ..., "run": ...}.
inline constexpr const char* kConfigFormat = "linea-translate/1";

struct DecodeStats {
  int64_t sentences = 0, tokens = 0;  // tokens: output tokens with their eos
  double seconds = 0;
  double sentences_per_s() const { return seconds > 0 ? sentences / seconds : 0; }
  double tokens_per_s() const { return seconds > 0 ? tokens / seconds : 0; }
};

class Translator {
 public:
  Translator(std::shared_ptr<Seq2Seq> model, std::shared_ptr<const Tokenizer> src_tok,
             std::shared_ptr<const Tokenizer> tgt_tok, linea::Device device);
  // Loads <dir>/config.json (a translate checkpoint's), <dir>/model.safetensors and the tokenizers.
  static Translator load(const std::string& dir, linea::Device device);

  // Source token ids (with eos) of one line; throws linea::Error naming `what` (e.g. "line 3")
  // for an empty line or one longer than the model's maximum.
  std::vector<int64_t> encode_source(const std::string& line, const std::string& what) const;
  // The nbest translations of each line (beam 1: greedy search), best first; lines are batched
  // by length, at most batch_sentences per batch. The model runs in eval mode without a graph.
  std::vector<std::vector<std::string>> translate(const std::vector<std::string>& lines, const SearchOptions& o,
                                                  int64_t batch_sentences = 64, DecodeStats* stats = nullptr,
                                                  std::vector<std::vector<double>>* scores = nullptr);

  Seq2Seq& model() { return *model_; }
  const Tokenizer& source_tokenizer() const { return *src_; }
  const Tokenizer& target_tokenizer() const { return *tgt_; }

 private:
  std::shared_ptr<Seq2Seq> model_;
  std::shared_ptr<const Tokenizer> src_, tgt_;
  linea::Device device_;
};

}  // namespace translate
