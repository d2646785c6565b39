// Training and evaluation for the translate app; main.cpp maps flags onto TrainOptions.
// One run: the prepared data (translate prepare) -> token-budget batches bucketed by length ->
// the Seq2Seq model (model.h) -> Adam (betas 0.9, 0.98) with inverse-square-root warmup,
// label-smoothed cross-entropy and gradient clipping -> the shared training loop
// (apps/common/train_loop.h). After every epoch: valid loss, perplexity and greedy BLEU; the
// weights with the best valid BLEU go to <checkpoint>/best (early stopping after --patience
// epochs without a better one; a moving average of the weights with --ema). At the end, with
// those weights: test BLEU with beam search and with greedy search, chrF, the hypotheses files
// and the BLEU signature in summary.json.
//
// Outputs (under --out): metrics.jsonl, summary.json (test_bleu = beam, test_bleu_greedy, ...),
// curves.png (train and valid loss, valid BLEU), test.beam.<tgt> and test.greedy.<tgt>
// (detokenized hypotheses, one per test line), checkpoint/ (training state; the tokenizer model
// files and config.json travel in it) and checkpoint/best (what `translate decode` loads).
#pragma once

#include <cstdint>
#include <string>

#include "apps/common/run_options.h"
#include "apps/common/train_loop.h"
#include "model.h"
#include "search.h"

namespace translate {

struct TrainOptions {
  std::string data_dir = "data/translate";  // what `translate prepare` wrote
  ModelConfig model;                        // vocabulary sizes and special ids come from the data
  // optimization
  int64_t max_tokens = 4096;     // padded tokens (longest side x sentences) per batch
  int64_t epochs = 6;            // time and BLEU by epochs: apps/translate/README.md
  double lr = 1e-3;              // peak, after the warmup
  int64_t warmup = 400;          // steps of linear warmup, then lr * sqrt(warmup / step)
  double weight_decay = 1e-4;    // AdamW, not on biases and norms
  double label_smoothing = 0.1;
  double clip = 1.0;
  double ema = 0.0;              // moving average of the weights (0: off; e.g. 0.999)
  int64_t patience = 5;          // epochs without a better valid BLEU before stopping (0: never)
  // evaluation
  SearchOptions search;                 // the final test decoding (beam, length penalty, ...)
  int64_t valid_sentences = 0;          // greedy BLEU on the first N valid sentences (0: all)
  int64_t decode_batch = 64;            // sentences per decoding batch
  linea::apps::RunOptions run = default_run();

  static linea::apps::RunOptions default_run() {
    linea::apps::RunOptions r;
    r.out_dir = "runs/translate";
    r.checkpoint_every = 500;
    return r;
  }
};

struct TrainReport {
  double test_bleu = 0, test_bleu_greedy = 0, best_valid_bleu = 0;
  int64_t steps = 0;
  double train_tokens_per_s = 0;
};

// Runs training (or, with run.eval_only, the final test evaluation of the checkpoint).
TrainReport run_training(const TrainOptions& options);

// One training batch (dataset.h: "src", "src_pad", "tgt_in", "tgt_out", "tgt_pad" on the host)
// through the model on `device`: the label-smoothed cross-entropy over the target tokens (pad
// ignored), their count (counted on the host, when the batch is there), and their summed plain cross-entropy as the
// "nll" stat (the shared loop's step hook; tests/cuda_emu counts its GPU work).
linea::apps::StepResult train_step(Seq2Seq& model, const linea::nn::Batch& batch, linea::Device device, int64_t pad,
                                   double label_smoothing);
// The target tokens of a batch on the host (its units; the loop's units hook under --cuda-graph).
int64_t target_tokens(const linea::nn::Batch& batch);

}  // namespace translate
