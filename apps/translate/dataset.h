// Reading a prepared translation folder (prepare.h) back: the manifest, a split's sentences and
// references, and a Dataset of token ids with padded, shifted batches for a seq2seq model.
//
//   Manifest m = read_manifest("data/translate");
//   Tokenizer src_tok = Tokenizer::from_file(m.src_model), tgt_tok = Tokenizer::from_file(m.tgt_model);
//   auto train = std::make_shared<TranslationDataset>(read_split(m.dir, "train"), src_tok, tgt_tok, 256);
//   nn::TokenBudgetOptions budget;
//   budget.max_tokens = 4096;
//   nn::TokenBudgetBatchSampler sampler(train->lengths(), budget);
//
// A batch of B examples (S: longest source + 1, T: longest target + 1 in the batch):
//   "src"     Int64 [B, S]  source ids + eos, padded with pad_id
//   "tgt_in"  Int64 [B, T]  bos + target ids (the decoder's input), padded
//   "tgt_out" Int64 [B, T]  target ids + eos (what the decoder predicts), padded
//   "src_pad" Bool  [B, S], "tgt_pad" Bool [B, T]: true at padding
//   "index"   Int64 [B]     the examples' indices in the dataset
// Not here: the model, the loss (cross_entropy with ignore index pad_id), decoding.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "nn/data.h"
#include "tokenizer.h"

namespace translate {

struct Manifest {
  std::string dir;
  std::string src_lang, tgt_lang;
  std::string vocab;                 // joint | separate
  std::string src_model, tgt_model;  // paths of the SentencePiece models (one file when joint)
  nlohmann::json json;               // data.json
};
// data.json of a prepared folder; a missing or foreign folder is a linea::Error that says to run
// `translate prepare`.
Manifest read_manifest(const std::string& data_dir);

struct ParallelSplit {
  std::vector<std::string> src, tgt, refs;  // refs: "Gen.1.1", or a line number of the user's files
};
// split: train, valid or test.
ParallelSplit read_split(const std::string& data_dir, const std::string& split);

class TranslationDataset : public linea::nn::Dataset {
 public:
  // Tokenizes every pair (source with src_tok, target with tgt_tok). max_len > 0: an example
  // whose source + eos or target + eos is longer than max_len (the model's positions) is a
  // linea::Error naming it (prepare's --max-length keeps training pairs short enough).
  TranslationDataset(ParallelSplit split, const Tokenizer& src_tok, const Tokenizer& tgt_tok, int64_t max_len = 0);

  int64_t size() const override { return static_cast<int64_t>(src_ids_.size()); }
  // Example i without the batch dim: src [S], tgt_in [T], tgt_out [T], src_pad [S], tgt_pad [T], index [].
  linea::nn::Example get(int64_t i) const override;
  linea::nn::Batch get_batch(const std::vector<int64_t>& indices) const override;

  // max(source + eos, target + eos) per example: the padded length it adds to a batch, for
  // nn::TokenBudgetBatchSampler.
  std::vector<int64_t> lengths() const;
  const std::vector<int64_t>& src_ids(int64_t i) const { return src_ids_.at(i); }  // no eos
  const std::vector<int64_t>& tgt_ids(int64_t i) const { return tgt_ids_.at(i); }  // no bos/eos
  const ParallelSplit& text() const { return split_; }
  int64_t pad_id() const { return kPadId; }

 private:
  ParallelSplit split_;
  std::vector<std::vector<int64_t>> src_ids_, tgt_ids_;
};

}  // namespace translate
