// The evaluation's sums and reports (see metrics.h).
#include "metrics.h"

#include <algorithm>
#include <cmath>

#include "apps/common/progress.h"

using json = nlohmann::json;

namespace protein {

Unigram::Unigram(const Sequences& train) {
  std::vector<double> count(kVocabSize, 0.0);
  for (const auto& s : train.residues)
    for (int8_t r : s) count[r] += 1;
  double total = 0;
  for (int64_t id = kFirstResidue; id < kFirstResidue + kNumResidueTokens; ++id) total += count[id] + 1;
  for (int64_t id = kFirstResidue; id < kFirstResidue + kNumResidueTokens; ++id) {
    p[id] = (count[id] + 1) / total;
    if (p[id] > p[argmax]) argmax = id;
  }
}

void Tally::add(const float* log_probs, const int64_t* targets, int64_t n, const Unigram& unigram) {
  for (int64_t i = 0; i < n; ++i) {
    const int64_t tgt = targets[i];
    if (tgt == kPad) continue;
    const float* row = log_probs + i * kVocabSize;
    const int64_t pred = std::max_element(row, row + kVocabSize) - row;
    ++masked;
    ++by_residue[tgt];
    nll -= row[tgt];
    if (pred == tgt) {
      ++correct;
      ++correct_by_residue[tgt];
    }
    baseline_nll -= std::log(unigram.p[tgt]);
    if (unigram.argmax == tgt) ++baseline_correct;
  }
}

json tally_json(const std::string& prefix, const Tally& t, bool detail) {
  json j = {{prefix + "_masked_accuracy", t.accuracy()},
            {prefix + "_perplexity", t.perplexity()},
            {prefix + "_loss", t.loss()},
            {prefix + "_masked_positions", t.masked}};
  if (!detail) return j;
  j["baseline_" + prefix + "_masked_accuracy"] = t.baseline_accuracy();
  j["baseline_" + prefix + "_perplexity"] = t.baseline_perplexity();
  json per = json::object();
  for (int64_t id = kFirstResidue; id < kFirstResidue + kNumResidueTokens; ++id)
    if (t.by_residue[id] > 0)
      per[token_text(id)] = {{"accuracy", static_cast<double>(t.correct_by_residue[id]) / t.by_residue[id]},
                             {"positions", t.by_residue[id]}};
  j[prefix + "_per_residue_accuracy"] = per;
  return j;
}

std::string tally_text(const std::string& name, const Tally& t) {
  const auto fmt = [](const char* f, double v) { return linea::apps::format_number(f, v); };
  return name + " acc " + fmt("%.2f%%", 100 * t.accuracy()) + " ppl " + fmt("%.3f", t.perplexity()) +
         " (baseline " + fmt("%.2f%%", 100 * t.baseline_accuracy()) + ", " + fmt("%.3f", t.baseline_perplexity()) +
         ")";
}

}  // namespace protein
