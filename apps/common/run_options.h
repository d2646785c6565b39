// The run flags every app shares (--device --threads --out --checkpoint --resume --eval-only
// --log-every --checkpoint-every --max-steps --seed --no-progress --no-plot --skip-nonfinite --profile
// --precision --cuda-graph),
// added to a CLI11 app by one call, into the RunOptions the training loop (train_loop.h) takes.
//
//   apps::RunOptions run;
//   run.out_dir = "runs/vit";                       // the app's defaults, before add_run_flags
//   apps::add_run_flags(app, run, "Training", "Running");
// Also the flags of the commands that use a trained model (ModelOptions). Not here: the app's own
// flags, or what a run does with them (train_loop.h).
#pragma once

#include <cstdint>
#include <string>

namespace CLI {
class App;
class Validator;
}  // namespace CLI

namespace linea::apps {

struct RunOptions {
  std::string device = "auto";     // cpu, cuda or auto
  std::string precision = "fp32";  // float32 matmuls on CUDA: fp32, tf32 or bf16 (core/precision.h)
  int threads = 0;                 // CPU threads for OpenMP and OpenBLAS (0: keep the defaults)
  std::string out_dir = "runs";    // metrics.jsonl, summary.json, curves.png, checkpoint/
  std::string checkpoint_dir;      // default <out_dir>/checkpoint
  bool resume = false;             // continue from the checkpoint (same run-defining flags)
  bool eval_only = false;          // evaluate the checkpoint and exit (the app does this)
  int64_t log_every = 50;          // steps between metrics.jsonl "step" records (0: epochs only)
  int64_t checkpoint_every = 200;  // steps between checkpoints, besides every epoch end (0: epoch ends only)
  int64_t max_steps = 0;           // stop after this many steps in total (0: all epochs)
  uint64_t seed = 0;
  bool progress = true;            // progress bar / periodic progress lines
  bool plot = true;                // draw curves.png
  int64_t skip_nonfinite = 0;      // steps with a non-finite loss or gradient norm to skip before stopping
  bool profile = false;            // print each step's CUDA counters (core/cuda_counters.h) and host time
  bool cuda_graph = false;         // capture the training step as a CUDA graph per batch shape and replay it

  std::string checkpoint() const { return checkpoint_dir.empty() ? out_dir + "/checkpoint" : checkpoint_dir; }
};

// Adds the flags above to `app`, showing the values `options` holds as defaults: --seed and
// --max-steps in `train_group`, the others in `run_group`. An app may reword a description
// afterwards (app.get_option("--seed")->description(...)).
void add_run_flags(CLI::App& app, RunOptions& options, const std::string& train_group = "Training",
                   const std::string& run_group = "Running");

// The flags of the loop's optional features, bound to the app's fields (each app keeps them in
// its own options): --clip (TrainSetup::clip), and --ema (ema_decay) with --patience
// (select.patience; `metric` says what it waits for, e.g. "valid BLEU").
void add_clip_flag(CLI::App& app, double& clip, const std::string& group);
void add_selection_flags(CLI::App& app, double& ema, int64_t& patience, const std::string& metric,
                         const std::string& group);

// The flags of a command that uses a trained model (translate decode, protein fill and embed):
// --checkpoint (required), --device, --threads.
struct ModelOptions {
  std::string checkpoint;        // a training run's checkpoint folder, or a folder of weights
  std::string device = "auto";   // cpu, cuda or auto
  int threads = 0;               // CPU threads (0: all cores)
};
void add_model_flags(CLI::App& cmd, ModelOptions& options);

// Checks of numeric flags whose errors say what is wrong with the value, for the apps' flags in
// place of CLI11's PositiveNumber, NonNegativeNumber and floating Range, which let NaN through
// (every comparison with NaN is false) and print an open bound as a 309-digit number:
//   --lr: 'abc' is not a number     --lr: nan is not a finite number     --lr: -1 is not > 0
// On an integer flag the value is then converted as usual ("--epochs 1.5": could not convert).
CLI::Validator positive_number();                   // finite, > 0
CLI::Validator non_negative_number();               // finite, >= 0
CLI::Validator finite_range(double lo, double hi);  // finite, in [lo, hi]

// For an app with subcommands: "unknown command 'x' (commands: prepare, train, decode)" when the
// first argument is neither a flag nor one of app's subcommands, else "" (CLI11 itself says only
// "A subcommand is required"). Call before parsing.
std::string unknown_command(const CLI::App& app, int argc, char** argv);

}  // namespace linea::apps
