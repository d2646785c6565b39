#include "tokenizer.h"

#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include <unordered_map>

#include "core/error.h"
#include "nn/io_util.h"

// SentencePiece's log threshold (0 info, 1 warning, 2 error). Exported by libsentencepiece but
// declared only in its private headers; training logs a hundred INFO lines without it.
namespace sentencepiece::logging {
int GetMinLogLevel();
void SetMinLogLevel(int v);
}  // namespace sentencepiece::logging

namespace translate {

namespace {

std::shared_ptr<const sentencepiece::SentencePieceProcessor> load(const std::string& bytes, const std::string& what) {
  auto sp = std::make_shared<sentencepiece::SentencePieceProcessor>();
  sentencepiece::util::Status status;
  try {
    status = sp->LoadFromSerializedProto(bytes);
  } catch (const std::exception& e) {
    // Most corrupt models get a status back, but some throw from SentencePiece's trie builder
    // (a piece "\0": "failed to insert key: zero-length key").
    LINEA_FAIL("translate: cannot load the SentencePiece model ", what, ": ", e.what());
  }
  LINEA_CHECK(status.ok(), "translate: cannot load the SentencePiece model ", what, ": ", status.ToString());
  const int64_t ids[4] = {sp->pad_id(), sp->unk_id(), sp->bos_id(), sp->eos_id()};
  LINEA_CHECK(ids[0] == kPadId && ids[1] == kUnkId && ids[2] == kBosId && ids[3] == kEosId,
              "translate: the SentencePiece model ", what, " has special ids pad=", ids[0], " unk=", ids[1],
              " bos=", ids[2], " eos=", ids[3], "; Linea's models use pad=0 unk=1 bos=2 eos=3 (translate prepare)");
  return sp;
}

// The training sentences as SentencePiece reads them (no temporary file).
class Sentences : public sentencepiece::SentenceIterator {
 public:
  explicit Sentences(const std::vector<const std::string*>& s) : s_(s) {}
  bool done() const override { return i_ >= s_.size(); }
  void Next() override { ++i_; }
  const std::string& value() const override { return *s_[i_]; }
  sentencepiece::util::Status status() const override { return sentencepiece::util::Status(); }

 private:
  const std::vector<const std::string*>& s_;
  size_t i_ = 0;
};

}  // namespace

Tokenizer Tokenizer::from_bytes(const std::string& model_bytes) {
  Tokenizer t;
  t.sp_ = load(model_bytes, "(" + std::to_string(model_bytes.size()) + " bytes)");
  t.bytes_ = std::make_shared<const std::string>(model_bytes);
  return t;
}

Tokenizer Tokenizer::from_file(const std::string& path) {
  const std::vector<char> b = linea::nn::detail::read_file_bytes(path, "translate: SentencePiece model");
  std::string bytes(b.begin(), b.end());
  Tokenizer t;
  t.sp_ = load(bytes, "'" + path + "'");
  t.bytes_ = std::make_shared<const std::string>(std::move(bytes));
  return t;
}

const sentencepiece::SentencePieceProcessor& Tokenizer::sp() const {
  LINEA_CHECK(sp_ != nullptr, "translate: Tokenizer used before a model was loaded (from_file / from_bytes)");
  return *sp_;
}

const std::string& Tokenizer::bytes() const {
  sp();
  return *bytes_;
}

std::vector<int64_t> Tokenizer::encode(const std::string& text) const {
  std::vector<int> ids;
  const auto status = sp().Encode(text, &ids);
  LINEA_CHECK(status.ok(), "translate: SentencePiece cannot encode '", text.substr(0, 80), "': ", status.ToString());
  return std::vector<int64_t>(ids.begin(), ids.end());
}

std::vector<std::string> Tokenizer::pieces(const std::string& text) const {
  std::vector<std::string> p;
  const auto status = sp().Encode(text, &p);
  LINEA_CHECK(status.ok(), "translate: SentencePiece cannot encode '", text.substr(0, 80), "': ", status.ToString());
  return p;
}

std::string Tokenizer::decode(const std::vector<int64_t>& ids) const {
  std::vector<int> sp_ids;
  for (int64_t id : ids) {
    LINEA_CHECK(id >= 0 && id < vocab_size(), "translate: Tokenizer::decode: id ", id, " is outside the vocabulary [0, ",
                vocab_size(), ")");
    sp_ids.push_back(static_cast<int>(id));
  }
  std::string text;  // SentencePiece skips the control pieces (pad, bos, eos)
  const auto status = sp().Decode(sp_ids, &text);
  LINEA_CHECK(status.ok(), "translate: SentencePiece cannot decode: ", status.ToString());
  return text;
}

int64_t Tokenizer::vocab_size() const { return sp().GetPieceSize(); }

std::string Tokenizer::piece(int64_t id) const {
  LINEA_CHECK(id >= 0 && id < vocab_size(), "translate: Tokenizer::piece: id ", id, " is outside the vocabulary [0, ",
              vocab_size(), ")");
  return sp().IdToPiece(static_cast<int>(id));
}

std::string train_tokenizer(const std::vector<const std::string*>& sentences, const TokenizerTraining& o) {
  LINEA_CHECK(o.model_type == "unigram" || o.model_type == "bpe", "translate: SentencePiece model type must be unigram "
              "or bpe, got '", o.model_type, "'");
  LINEA_CHECK(!sentences.empty(), "translate: no sentences to train the SentencePiece model on");
  const std::unordered_map<std::string, std::string> args = {
      {"model_type", o.model_type},
      {"vocab_size", std::to_string(o.vocab_size)},
      {"character_coverage", "1.0"},
      {"pad_id", std::to_string(kPadId)},
      {"unk_id", std::to_string(kUnkId)},
      {"bos_id", std::to_string(kBosId)},
      {"eos_id", std::to_string(kEosId)},
      {"num_threads", "1"},          // the EM sums in a fixed order: the same model every run
      {"input_sentence_size", "0"},  // every sentence, no sampling
  };
  Sentences it(sentences);
  std::string model;
  sentencepiece::SetRandomGeneratorSeed(static_cast<unsigned int>(o.seed % 4294967295u));  // -1 means "random"
  const int log_level = sentencepiece::logging::GetMinLogLevel();
  sentencepiece::logging::SetMinLogLevel(2);
  const auto status = sentencepiece::SentencePieceTrainer::Train(args, &it, &model);
  sentencepiece::logging::SetMinLogLevel(log_level);
  LINEA_CHECK(status.ok(), "translate: SentencePiece training (", o.model_type, ", vocab size ", o.vocab_size,
              ", ", sentences.size(), " sentences) failed: ", status.ToString(),
              status.ToString().find("Vocabulary size") != std::string::npos ? " (use a smaller --vocab-size)" : "");
  return model;
}

}  // namespace translate
