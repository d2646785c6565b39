// Decoding a Seq2Seq model: greedy search and beam search, batched over sentences, on the
// model's incremental decoder (the memory projected once per sentence, the caches reordered as
// beams move, finished sentences dropped from the batch).
//
// Beam search follows fairseq's: each step takes the 2K best (beam, token) continuations of every
// sentence; an end of sentence among the first K of them finishes a hypothesis, scored
// log P / length^len_penalty (length with the end token); the best K others go on. A sentence is
// done when it has K finished hypotheses or reaches its maximum length, where the end token is
// forced. Padding and the begin token are never produced.
#pragma once

#include <cstdint>
#include <vector>

#include "model.h"

namespace translate {

struct SearchOptions {
  int64_t beam = 5;              // beam size (beam_search); 1 is greedy
  double len_penalty = 1.0;      // score = log P / length^len_penalty (0: raw log P)
  double max_len_ratio = 2.0;    // at most max_len_ratio * source tokens + max_len_extra tokens,
  int64_t max_len_extra = 10;    // and never more than the model's max_len
  int64_t nbest = 1;             // hypotheses returned per sentence (<= beam)
};

struct Hypothesis {
  std::vector<int64_t> tokens;  // without bos and eos
  double log_prob = 0;          // log P(tokens + eos | source)
  double score = 0;             // log_prob / (tokens + 1)^len_penalty
};

// The longest output (tokens with eos) for a source of src_len tokens (with its eos).
int64_t max_output_length(const ModelConfig& cfg, const SearchOptions& o, int64_t src_len);

// src [B, S] Int64 and src_pad Bool [B, S] on the model's device; the model in eval mode, under
// a NoGradGuard. Greedy: the most probable token each step; one hypothesis per sentence.
std::vector<Hypothesis> greedy_search(Seq2Seq& model, const linea::Tensor& src, const linea::Tensor& src_pad,
                                      const SearchOptions& o);
// Greedy search without the incremental caches: every step runs the decoder over the whole prefix
// (what decoding costs without them; the same hypotheses up to rounding; for tests and benchmarks).
std::vector<Hypothesis> greedy_search_recompute(Seq2Seq& model, const linea::Tensor& src,
                                                const linea::Tensor& src_pad, const SearchOptions& o);
// Beam search: the nbest hypotheses of each sentence, best first.
std::vector<std::vector<Hypothesis>> beam_search(Seq2Seq& model, const linea::Tensor& src,
                                                 const linea::Tensor& src_pad, const SearchOptions& o);

}  // namespace translate
