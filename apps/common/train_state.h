// What a training run keeps besides the model and the optimizer, and how the loop saves and
// resumes it (apps/common/train_loop.cpp's pieces; nothing here is an app's):
//   Position       where the run is: step, epoch, batches of the epoch done
//   WeightAverage  the moving average of the weights (TrainSetup::ema_decay)
//   Selection      model selection's best evaluation so far (TrainSetup::select)
//   save_checkpoint / resume_checkpoint / save_best   the checkpoint folder and its best/ folder
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "apps/common/train_loop.h"
#include "core/tensor.h"
#include "nn/checkpoint.h"
#include "nn/module.h"

namespace linea::apps {

struct Position {
  int64_t step = 0, epoch = 0, batch = 0;  // batch: batches of `epoch` already done
};

// The moving average of the weights. Its n-th update uses the decay min(d, (1 + n) / (10 + n)),
// so the early average is not held back by the initial weights. Off (every call a no-op) when
// the decay is 0.
class WeightAverage {
 public:
  WeightAverage(const nn::Module& model, double decay);
  bool on() const { return decay_ > 0; }
  // After a guarded optimizer step (nn::Optimizer::step_guarded): an update when its guard let
  // the step through, none when it did not. The count lives on the device beside the weights,
  // so the decision needs no synchronization.
  void update(const Tensor& guard);
  // Exchanges the average and the weights (twice: back as before).
  void swap();
  void save_to(nn::TrainState& st) const;
  void load_from(const nn::TrainState& st, const std::string& app);

 private:
  double decay_;
  int64_t updates_ = 0;  // until count_ takes over (at the first update)
  Tensor count_;         // float64 0-d on the weights' device: the updates so far
  std::vector<std::string> names_;
  std::vector<Tensor> params_, avg_;
};

// Model selection: the best evaluation so far and the evaluations since.
struct Selection {
  bool have = false;
  double best = 0;
  int64_t best_step = -1, since = 0;
  // Takes an evaluation's value at `step`; true when it is the best so far.
  bool consider(double value, bool maximize, int64_t step);
  bool patience_out(int64_t patience) const { return patience > 0 && since >= patience; }
  void save_to(nn::TrainState& st) const;
  void load_from(const nn::TrainState& st);
};

// The checkpoint folder: model, optimizer, RNG, position, the moving average, the selection,
// config.json and the app's files, in one atomic save.
void save_checkpoint(const TrainSetup& setup, const std::string& dir, const Position& pos, const WeightAverage& ema,
                     const Selection& sel);

// --resume: refuses other run-defining settings (TrainSetup::resume_keys) before changing
// anything, then loads the checkpoint and returns where it stopped.
Position resume_checkpoint(const TrainSetup& setup, const std::string& dir, WeightAverage& ema, Selection& sel);

// <checkpoint>/best: the evaluated weights with config.json and the app's files (each file
// written atomically; model.safetensors last, so its presence marks a complete folder).
void save_best(const TrainSetup& setup, const std::string& dir, int64_t step, double value);

}  // namespace linea::apps
