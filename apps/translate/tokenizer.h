// The translate app's subword tokenizer: a SentencePiece model (unigram or BPE) with fixed special
// ids pad = 0, unk = 1, bos = 2, eos = 3, loaded from its file or from the model's bytes (a
// checkpoint carries the bytes, so decoding needs nothing else), and trained from sentences in
// memory.
//
//   Tokenizer tok = Tokenizer::from_file("data/translate/spm.model");
//   std::vector<int64_t> ids = tok.encode("In the beginning");   // no bos/eos added
//   std::string text = tok.decode(ids);                           // pad/bos/eos skipped
//   Tokenizer same = Tokenizer::from_bytes(tok.bytes());
// Not here: which model files a prepared folder holds (prepare.h writes data.json).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace sentencepiece {
class SentencePieceProcessor;
}

namespace translate {

inline constexpr int64_t kPadId = 0, kUnkId = 1, kBosId = 2, kEosId = 3;

class Tokenizer {
 public:
  // Errors (missing or corrupt model, special ids other than the fixed ones) are linea::Error.
  // A default-constructed Tokenizer holds no model: using it is an error.
  static Tokenizer from_file(const std::string& path);
  static Tokenizer from_bytes(const std::string& model_bytes);

  std::vector<int64_t> encode(const std::string& text) const;
  // Skips pad, bos and eos; an id outside [0, vocab_size) is an error.
  std::string decode(const std::vector<int64_t>& ids) const;
  std::vector<std::string> pieces(const std::string& text) const;  // "▁In", "▁the", ...

  int64_t vocab_size() const;
  int64_t pad_id() const { return kPadId; }
  int64_t unk_id() const { return kUnkId; }
  int64_t bos_id() const { return kBosId; }
  int64_t eos_id() const { return kEosId; }
  std::string piece(int64_t id) const;
  const std::string& bytes() const;  // the serialized model (the .model file)
  bool loaded() const { return sp_ != nullptr; }

 private:
  const sentencepiece::SentencePieceProcessor& sp() const;
  std::shared_ptr<const sentencepiece::SentencePieceProcessor> sp_;  // shared: copies are cheap
  std::shared_ptr<const std::string> bytes_;
};

struct TokenizerTraining {
  int64_t vocab_size = 8000;
  std::string model_type = "unigram";  // unigram | bpe
  uint64_t seed = 0;
};

// Trains a model on `sentences` (in memory, no files) and returns its bytes. Deterministic: one
// thread and a fixed seed, so the same sentences give byte-identical models. character_coverage
// is 1.0 (every character of the training text gets a piece). A vocabulary too large for the
// text is a linea::Error that says the largest size SentencePiece can build.
std::string train_tokenizer(const std::vector<const std::string*>& sentences, const TokenizerTraining& options);

}  // namespace translate
