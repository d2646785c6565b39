// What the protein app reports of an evaluation: masked accuracy, perplexity and the unigram
// baseline on the same masked positions, in total and per residue.
//   Unigram   the training split's residue frequencies (the baseline)
//   Tally     an evaluation's sums over the masked positions, fed a batch at a time
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "alphabet.h"
#include "dataset.h"

namespace protein {

// The empirical baseline: the training split's residue frequencies, add-one smoothed over the
// residue tokens (a residue the training split never holds, e.g. 'O', still gets a probability).
struct Unigram {
  std::vector<double> p = std::vector<double>(kVocabSize, 0.0);  // by token id; 0 for specials
  int64_t argmax = kFirstResidue;                                 // the first of the most frequent
  explicit Unigram(const Sequences& train);
};

// What an evaluation pass over a split adds up, for the model and the baseline on the same masked
// positions.
struct Tally {
  int64_t masked = 0, correct = 0, baseline_correct = 0;
  double nll = 0, baseline_nll = 0;  // nats, summed over the masked positions
  std::vector<int64_t> by_residue = std::vector<int64_t>(kVocabSize, 0), correct_by_residue = by_residue;

  // n positions: log_probs [n, kVocabSize] (the model's), targets [n] (kPad where not masked).
  // The prediction is a row's first largest log-probability.
  void add(const float* log_probs, const int64_t* targets, int64_t n, const Unigram& unigram);

  double accuracy() const { return masked ? static_cast<double>(correct) / masked : 0.0; }
  double loss() const { return masked ? nll / masked : 0.0; }
  double perplexity() const { return std::exp(loss()); }
  double baseline_accuracy() const { return masked ? static_cast<double>(baseline_correct) / masked : 0.0; }
  double baseline_perplexity() const { return std::exp(masked ? baseline_nll / masked : 0.0); }
};

// "<prefix>_masked_accuracy", "<prefix>_perplexity", "<prefix>_loss", "<prefix>_masked_positions";
// with `detail`, the baseline's ("baseline_<prefix>_...") and "<prefix>_per_residue_accuracy".
nlohmann::json tally_json(const std::string& prefix, const Tally& t, bool detail);
// "<name> acc 41.20% ppl 6.123 (baseline 9.80%, 17.402)"
std::string tally_text(const std::string& name, const Tally& t);

}  // namespace protein
