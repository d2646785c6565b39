// The training loop every app runs: one function, train(), with hooks. The app supplies its
// model, optimizer, schedule, data loader and two hooks, step(batch) and evaluate(label); the
// loop owns the rest:
//
//   for each epoch (its length: the batches the loader's sampler yields for it):
//     for each batch:  step: lr = schedule(step); zero_grad; r = hooks.step(batch);
//                      r.loss.backward() (summed over the ranks: step_reducer.h); the guard
//                      {norm, clipping coefficient, finite?} (nn::step_guard);
//                      opt.step_guarded(guard); moving average; the read-back queued
//                      settle the step two before: the guard's verdict, the running sums, a
//                      metrics.jsonl "step" record every log_every steps, the progress bar
//                      checkpoint every checkpoint_every steps; a signal stops after the step
//     end of the epoch: evaluate (eval mode, no graph, on a fork of the RNG); "epoch" record;
//                      checkpoint; curves.png
//   the final evaluation with the selected weights (hooks.finish); summary.json
//
// --cuda-graph (RunOptions::cuda_graph): after one uncaptured step (the warm-up: optimizer state,
// library handles and plans), the step (forward, backward, guard, optimizer step, moving
// average) is captured as a CUDA graph per batch shape and replayed with one launch
// (graph_steps.h): a replay computes what an uncaptured step would, bit for bit.
// Refused under data parallelism, on the CPU, and with mechanisms that draw with cuRAND every
// step (the capture names the call).
// Checkpoints (nn/checkpoint.h) hold the model, optimizer, RNG, step, the position in the epoch,
// config.json (TrainSetup::config) and the app's extra files, all in one atomic save. --resume
// refuses a checkpoint whose run-defining settings (TrainSetup::config's resume_keys) differ,
// listing the differences, and otherwise continues bit for bit on CPU (mid-epoch too: the loader
// restarts the epoch's batches at the saved index). A non-finite loss or gradient norm stops the
// run with an error naming the step, before anything is written over the last good checkpoint;
// RunOptions::skip_nonfinite skips up to N such steps instead (no optimizer step; a "skipped"
// record). The step never waits for the device: the guard is decided on the device (the
// optimizer's kernels leave everything as it was when it fails), and its verdict, the loss and
// the stats come back through pinned memory (core/readback.h) and are looked at two steps
// later ("settled"); checkpoints, evaluations and the end of an epoch settle every step first. SIGINT or SIGTERM
// (apps/common/interrupt.h) stops the run after the step in progress (or the evaluation): that step's checkpoint is
// saved, an "interrupted" record written and Interrupted thrown (apps exit 130 / 143); --resume continues it bit for
// bit.
//
// metrics.jsonl records (x = TrainSetup::unit, e.g. "images"):
//   step:  step, epoch (1-based), epoch_progress, lr, loss and each stat (means since the last
//          record: loss per step, stats per unit), x_per_s (this epoch so far)
//   epoch: step, epoch (fractional for a partial epoch), lr, train_loss, train_<stat>, the
//          evaluation's values, x_per_s, elapsed_s
//   skipped / interrupted: a step skipped as non-finite / the step a signal stopped the run after
// summary.json: the last evaluation's values, parameters, device, steps, epochs_completed,
// resumed_from_step, wall_time_s, train_x_per_s, checkpoint, then the model selection's best_*
// and stopped_early, hooks.finish's values and whatever hooks.summary adds.
//
// Optional, for the apps that want them:
//   ema_decay     an exponential moving average of the weights, updated after every optimizer
//                 step; evaluations, the best weights and hooks.finish use the average (it is
//                 saved with every checkpoint, so a resume continues it exactly)
//   select        model selection on an evaluation metric: the evaluated weights of the best
//                 evaluation so far go to <checkpoint>/best (model.safetensors, config.json and
//                 the app's files: a folder the app's decoder/predictor can load), and training
//                 stops early after `patience` evaluations without improvement
//   hooks.finish  runs once after training, with the selected weights loaded (the best, else
//                 the average, else the last): the final evaluation, e.g. on the test set
// Data parallelism (nn/dist.h; on when the app runs under `mpirun -np N`): N ranks train the same
// run as one process, each on its slice of every batch (step_reducer.h); the loss, the
// non-finite guard and the logs see the whole batch's, and the running stats are summed across
// ranks at log points.
// Rank 0 alone evaluates (the others wait at the next step), prints, and writes metrics.jsonl,
// checkpoints, curves and summary.json; evaluation results are broadcast so that model
// selection and early stopping decide the same everywhere.
// Not here: anything about the app's data, model or metrics.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "apps/common/run_options.h"
#include "core/cuda_counters.h"
#include "core/tensor.h"
#include "nn/data.h"
#include "nn/module.h"
#include "nn/optim.h"
#include "nn/schedule.h"

namespace linea::apps {

// What hooks.step returns for one batch.
struct StepResult {
  Tensor loss;        // 0-d, on the device: the loss backward() runs from
  int64_t units = 0;  // what the step processed (images, tokens): throughput and per-unit means
  // How many terms the loss is a mean over (images, target tokens, masked positions; < 0: units).
  // Data parallelism weights each rank's gradient by its share of the batch's total weight.
  double weight = -1;
  // 0-d device tensors summed over steps (e.g. "accuracy": the number of correct predictions),
  // reported divided by the units; read back only at log points.
  std::map<std::string, Tensor> stats;
};

// What hooks.evaluate returns.
struct Metrics {
  nlohmann::json values = nlohmann::json::object();  // into epoch records and summary.json
  std::string text;  // for the console, e.g. "test loss 0.4123 acc 85.12%"
};

struct TrainHooks {
  // Forward and loss of one batch (the loop moves nothing to the device; the hook does).
  // With RunOptions::cuda_graph it is captured once per batch shape and replayed: it then gets
  // the batch on the device, must leave everything a replay changes on the device (a loss
  // normalized by a count from the host would keep the captured count), and its StepResult's
  // units and weight are those of the captured batch (see `units`).
  std::function<StepResult(const nn::Batch&)> step;
  // Optional, for --cuda-graph when a batch's units or weight depend on more than its shapes
  // (tokens that are not padding): {units, weight} of a batch, counted on the host.
  std::function<std::pair<int64_t, double>(const nn::Batch&)> units;
  // Evaluates the model; the loop has already put it in eval mode under a NoGradGuard on a
  // fork of the RNG (restored afterwards, so evaluations never change the training run).
  std::function<Metrics(const std::string& label)> evaluate;
  // Optional: the running stats (per unit) as console text; default "name 0.1234 ...".
  std::function<std::string(const std::map<std::string, double>&)> format_stats;
  // Optional: the final evaluation (see the top of this file); its values go into summary.json.
  std::function<Metrics()> finish;
  // Optional: adds the app's fields to summary.json (on rank 0 only, which writes it).
  std::function<void(nlohmann::json& summary)> summary;
};

// Model selection on an evaluation metric (TrainSetup::select; see the top of this file).
struct SelectOptions {
  std::string metric;     // a key of Metrics::values, e.g. "valid_bleu" ("": off)
  bool maximize = true;   // higher is better (false: lower, e.g. a loss)
  int64_t patience = 0;   // evaluations without improvement before stopping early (0: never)
};

// curves.png: the logged steps' loss and the epochs' train loss, evaluation loss and main metric.
struct CurveOptions {
  std::string title;                      // e.g. "vit: softmax attention, training loss and test accuracy"
  std::string train_loss = "train loss";  // label of the training loss
  std::string eval_loss;                  // key of the evaluation's loss, e.g. "test_loss" ("": none)
  std::string metric;                     // key of its main metric, e.g. "test_accuracy" (right axis; "": none)
  double metric_scale = 1.0;              // e.g. 100 to plot a fraction in percent
  std::string ylabel = "loss";            // left axis
  std::string metric_label;               // default: the key in words, with "(%)" when scaled by 100
};

struct TrainSetup {
  std::string app;                    // message prefix, e.g. "vit"
  std::string unit = "examples";      // "images" -> "images_per_s"
  std::string unit_short = "ex";      // for the progress bar and console, e.g. "img"
  nn::Module* model = nullptr;
  nn::Optimizer* optimizer = nullptr;
  nn::Schedule schedule = nn::ConstantLR(1e-3);  // the learning rate of every step (nn/schedule.h)
  double clip = 0;                    // max global gradient norm (0: off)
  nn::DataLoader* loader = nullptr;   // training batches; the epoch length is its sampler's
  int64_t epochs = 1;
  Device device = kCPU;
  // config.json of every checkpoint; its resume_keys (e.g. {"model", "run"}) must match on --resume.
  nlohmann::json config = nlohmann::json::object();
  std::vector<std::string> resume_keys;
  std::map<std::string, std::string> files;  // more files saved with every checkpoint (e.g. a tokenizer)
  // Called when the epoch starts (e.g. to set an augmenting dataset's epoch before the loader resets).
  std::function<void(int64_t epoch)> on_epoch;
  CurveOptions curves;
  double ema_decay = 0;  // 0: no moving average of the weights; else e.g. 0.999
  SelectOptions select;
  // Data parallelism across the ranks of an MPI job (nn/dist.h); false: this process trains
  // alone even when it is one rank of several (tests that need a one-process reference).
  bool data_parallel = true;
};

struct TrainResult {
  Metrics last_eval;
  std::vector<double> step_losses;  // the loss of every step this process ran (skipped ones too)
  // When each of those steps was done: seconds since train() started at which the loop had its
  // loss back from the device (a GPU step is read back two steps after it is issued, so this
  // times the device's work; benchmarks take their rates from it).
  std::vector<double> step_done_s;
  int64_t start_step = 0;           // where this process started (> 0 after a resume)
  int64_t final_step = 0;
  bool resumed = false;
  int64_t skipped_steps = 0;
  double units_per_s = 0;           // training throughput of this process
  double wall_s = 0;
  double best_value = 0;            // select: the best evaluation's metric, at best_step (-1: none)
  int64_t best_step = -1;
  bool stopped_early = false;
  Metrics final_eval;               // what hooks.finish returned
  // What each step of this process asked of the GPU (cuda_counters.h), its settling of an
  // earlier step and any checkpoint it saved included (RunOptions::profile prints them).
  std::vector<cuda::Counters> step_counters;
};

// Steps of epochs 0..epochs-1 (the sum of the sampler's batch counts): a schedule's length.
int64_t planned_steps(const nn::DataLoader& loader, int64_t epochs);

// "key.sub: checkpoint X, now Y" lines for every differing value under `keys` (all keys when
// empty), or "" when equal.
std::string config_diff(const nlohmann::json& saved, const nlohmann::json& now, const std::vector<std::string>& keys);

// <dir>/config.json of a checkpoint folder this loop wrote for app `app` (its "format" must be
// `format`); a missing folder or file, or another app's checkpoint, is a linea::Error naming the
// folder.
nlohmann::json read_checkpoint_config(const std::string& dir, const std::string& app, const std::string& format);

// Runs (or resumes) training as above; throws linea::Error on bad input, a refused resume or a
// non-finite step, and Interrupted (interrupt.h) after saving when SIGINT or SIGTERM arrived.
TrainResult train(const TrainSetup& setup, const TrainHooks& hooks, const RunOptions& options);

// Runs hooks-style evaluation code in eval mode, without a graph, on a fork of the CPU (and
// `device`'s) generator, restoring train mode and the generators afterwards.
Metrics evaluate_forked(nn::Module& model, Device device, const std::function<Metrics()>& evaluate);

}  // namespace linea::apps
