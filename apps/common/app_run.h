// What every app's run does around the training loop (train_loop.h), written once:
//
//   const Device device = apps::start_run("vit", o.run, kConfigFormat);  // threads, device, precision
//   if (o.run.eval_only) return apps::eval_only("vit", o.run, [&](const std::string& weights) {...});
//   ... the app's data, model, setup and hooks ...
//   const apps::TrainResult tr = apps::train(setup, hooks, o.run);
//   apps::report_run(setup, o.run, tr, "test accuracy 88.85%");
//
// and the rule every command that uses a trained model follows: a training checkpoint's best/
// folder when it has one (best_weights_dir).
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "apps/common/run_options.h"
#include "apps/common/train_loop.h"
#include "core/device.h"

namespace linea::apps {

// The start of a training or evaluation run: --threads, --device (resolved) and --precision. A
// --resume from a checkpoint of another app (config.json's
// "format" is not `config_format`) is refused by name before any data is read.
Device start_run(const std::string& app, const RunOptions& run, const std::string& config_format);

// A command that uses a trained model (ModelOptions: translate decode, protein fill and embed):
// --threads set, --device resolved, and the folder of the weights --checkpoint stands for.
struct ModelRun {
  Device device;
  std::string weights_dir;
};
ModelRun start_model_run(const std::string& app, const ModelOptions& options);

// The weights a checkpoint folder stands for: <dir>/best when it holds model.safetensors (model
// selection's best evaluation, not the last step), else <dir> itself.
std::string best_weights_dir(const std::string& dir);

// --eval-only: `evaluate` loads the weights from the folder it is given (best_weights_dir of
// the run's checkpoint) and evaluates them (apps::evaluate_forked); its metrics are printed
// ("<app>: <text> (weights from <dir>)") and written to <out>/eval.json. A checkpoint folder
// without weights is an error naming it.
Metrics eval_only(const std::string& app, const RunOptions& run,
                  const std::function<Metrics(const std::string& weights_dir)>& evaluate);

// The run's last lines, on rank 0: "<app>: <headline>; <wall> wall, <rate> train <unit>/s on
// <device>" and where the outputs are (`extra_outputs` are files in the output folder besides
// metrics.jsonl, summary.json and curves.png).
void report_run(const TrainSetup& setup, const RunOptions& run, const TrainResult& result, const std::string& headline,
                const std::vector<std::string>& extra_outputs = {});

}  // namespace linea::apps
