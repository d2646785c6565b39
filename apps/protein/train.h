// Training and evaluation for the protein app; main.cpp maps flags onto TrainOptions.
// One run: the prepared data (protein prepare) -> masked windows (dataset.h) in token-budget
// batches bucketed by length (or packed windows) -> the ProteinLM (model.h) -> AdamW with linear
// warmup and cosine decay, cross-entropy on the masked positions, gradient clipping
// -> the shared training loop (apps/common/train_loop.h). After every epoch: valid masked
// accuracy and perplexity; the weights with the best valid perplexity go to <checkpoint>/best
// (early stopping after --patience epochs without a better one). At the end, with those weights:
// test and query masked accuracy, perplexity and per-residue accuracy, beside the empirical
// baseline (the training split's residue frequencies) on the very same masked positions.
//
// Metrics (evaluation masks are fixed by seed, dataset.h):
//   masked accuracy   argmax of the logits == the original residue, over chosen positions
//   perplexity        exp(mean cross-entropy over chosen positions, nats)
//   baseline          predicting the training split's unigram residue frequencies (add-one
//                     smoothed over the 27 residue tokens): accuracy of the most frequent one,
//                     perplexity exp(mean -log p(residue)) (the Performer paper's "empirical
//                     baseline")
// summary.json adds: test_masked_accuracy, test_perplexity, baseline_masked_accuracy,
// baseline_perplexity (the test split's), the same for valid and query, per-residue accuracy.
#pragma once

#include <cstdint>
#include <string>

#include "apps/common/run_options.h"
#include "dataset.h"
#include "model.h"

namespace protein {

struct TrainOptions {
  std::string data_dir = "data/protein";  // what `protein prepare` wrote
  ModelConfig model;
  MaskingOptions masking;
  int64_t pack = 0;              // > 0: windows of this many tokens from the concatenated sequences
  int64_t max_tokens = 8192;     // padded tokens per batch
  int64_t epochs = 3;
  double lr = 1e-3;              // peak, after the warmup
  std::string schedule = "cosine";  // cosine (to 0 at the last planned step) | inverse_sqrt | constant
  int64_t warmup = 150;
  double weight_decay = 0.01;    // AdamW, not on biases, norms and embeddings
  double clip = 1.0;
  double ema = 0.0;
  int64_t patience = 3;
  int64_t eval_max_tokens = 32768;  // tokens per evaluation batch
  linea::apps::RunOptions run = default_run();

  static linea::apps::RunOptions default_run() {
    linea::apps::RunOptions r;
    r.out_dir = "runs/protein";
    r.checkpoint_every = 500;
    return r;
  }
};

struct TrainReport {
  double test_masked_accuracy = 0, test_perplexity = 0;
  double baseline_masked_accuracy = 0, baseline_perplexity = 0;
  int64_t steps = 0;
  double train_residues_per_s = 0;
};

// Runs training (or, with run.eval_only, the final evaluation of the checkpoint).
TrainReport run_training(const TrainOptions& options);

}  // namespace protein
