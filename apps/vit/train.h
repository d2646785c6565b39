// Training, evaluation and prediction for the vit app; main.cpp maps flags onto TrainOptions.
// One run: load data -> build the ViT -> AdamW (no decay on biases, norms, positional
// embedding and CLS token) with linear warmup + cosine decay, label smoothing and gradient
// clipping -> the shared training loop (apps/common/train_loop.h), which evaluates on the test
// set after every epoch and writes <out>/metrics.jsonl, <out>/summary.json, <out>/curves.png and a
// checkpoint (<checkpoint>/model.safetensors, training.safetensors, config.json) that --resume
// continues from and --predict reads. This file holds what is about images: the data, the
// loss/accuracy step, the evaluation with per-class accuracy and confusion matrix, prediction.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "apps/common/run_options.h"
#include "apps/common/train_loop.h"
#include "model.h"

namespace vit {

struct TrainOptions {
  // data
  std::string data_dir;      // Fashion-MNIST IDX files
  std::string image_folder;  // or train/ and test/ class folders (overrides data_dir)
  int64_t image_size = 0;    // image folder: resize to this (0: keep, must be square)
  int channels = 0;          // image folder: 1 or 3 (0: from the first image)
  int64_t train_limit = 0;   // use only the first N training / test examples (0: all)
  int64_t test_limit = 0;
  // model (image_size, channels and classes are filled in from the data)
  VitConfig model;
  // optimization
  int64_t batch_size = 128;
  int64_t epochs = 8;
  double lr = 2e-3;
  double min_lr = 1e-5;
  double weight_decay = 0.05;
  double warmup_epochs = 0.5;
  double label_smoothing = 0.1;
  double clip = 1.0;  // max global gradient norm (0: off)
  int64_t crop_padding = 0;  // off by default: at a 10-epoch budget it cost accuracy (apps/vit/README.md)
  bool flip = true;
  // > 0: train at most the epochs that fit in this many seconds (evaluations included) at the
  // speed of a few probe steps, and at most `epochs`. The epochs chosen are the run's (config.json),
  // so --resume continues them without probing again.
  double time_budget = 0;
  // running: device, threads, out, checkpoint, resume, eval-only, logging, --max-steps, seed, ...
  linea::apps::RunOptions run = default_run();

  static linea::apps::RunOptions default_run() {
    linea::apps::RunOptions r;
    r.out_dir = "runs/vit";
    return r;
  }
};

struct TrainResult {
  double test_accuracy = 0, test_loss = 0;
  std::vector<double> step_losses;  // the loss of every training step this process ran
  int64_t steps = 0;
  double train_images_per_s = 0;
};

// Runs training (or evaluation only) as above; throws linea::Error on bad input.
TrainResult run_training(const TrainOptions& options);

// One training batch ("input" [B, C, H, W], "target" [B] on the host) through the model on
// `device`: the label-smoothed cross-entropy, B images, and the correct predictions as the
// "accuracy" stat (the shared loop's step hook; tests/cuda_emu counts its GPU work).
linea::apps::StepResult train_step(VisionTransformer& model, const linea::nn::Batch& batch, linea::Device device,
                                   double label_smoothing);

// Top-k classes with probabilities for each image, from a checkpoint directory (config.json +
// model.safetensors); prints "<image>: <class> <p>, ..." lines and returns them.
std::vector<std::string> predict(const std::vector<std::string>& images, const std::string& checkpoint_dir,
                                 const std::string& device, int64_t top_k = 3);

}  // namespace vit
