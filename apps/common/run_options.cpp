// add_run_flags, add_model_flags and the numeric flag checks (see run_options.h).
#include "apps/common/run_options.h"

#include <CLI/CLI.hpp>

#include <cmath>
#include <cstdio>
#include <filesystem>

namespace linea::apps {

namespace {

std::string num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

// A finite number in [lo, hi] (lo excluded when lo_open); `what` ends the error, e.g. "> 0".
CLI::Validator finite_number(double lo, double hi, bool lo_open, const std::string& what, const std::string& name) {
  return CLI::Validator(
      [=](std::string& in) -> std::string {
        double v = 0;
        if (!CLI::detail::lexical_cast(in, v)) return "'" + in + "' is not a number";
        if (!std::isfinite(v)) return in + " is not a finite number";
        if (v < lo || (lo_open && v == lo) || v > hi) return in + " is not " + what;
        return "";
      },
      name);
}

}  // namespace

std::string unknown_command(const CLI::App& app, int argc, char** argv) {
  if (argc < 2 || argv[1][0] == '-') return "";
  std::string names;
  for (const CLI::App* sub : app.get_subcommands([](const CLI::App*) { return true; })) {
    if (sub->get_name() == argv[1]) return "";
    names += (names.empty() ? "" : ", ") + sub->get_name();
  }
  return "unknown command '" + std::string(argv[1]) + "' (commands: " + names + ")";
}

CLI::Validator positive_number() { return finite_number(0, HUGE_VAL, true, "> 0", "POSITIVE"); }

CLI::Validator non_negative_number() { return finite_number(0, HUGE_VAL, false, ">= 0", "NONNEGATIVE"); }

CLI::Validator finite_range(double lo, double hi) {
  const std::string range = "[" + num(lo) + ", " + num(hi) + "]";
  return finite_number(lo, hi, false, "in " + range, "FLOAT in " + range);
}

void add_run_flags(CLI::App& app, RunOptions& o, const std::string& train_group, const std::string& run_group) {
  app.add_option("--seed", o.seed, "seed for initialization, data order, augmentation and attention samples")
      ->group(train_group)
      ->capture_default_str()
      ->check(non_negative_number());  // "-1" would wrap around
  app.add_option("--max-steps", o.max_steps,
                 "stop after this many steps in total (0: all epochs); the schedule "
                 "still spans --epochs, so --resume continues the same run")
      ->group(train_group)
      ->check(non_negative_number());

  app.add_option("--device", o.device, "cpu, cuda or auto (cuda when a GPU is usable)")
      ->group(run_group)->capture_default_str()->check(CLI::IsMember({"cpu", "cuda", "auto"}));
  app.add_option("--precision", o.precision,
                 "float32 matmuls on the GPU: fp32 (full precision, as the CPU), tf32 or bf16 (tensor cores, float32 "
                 "accumulation; weights, optimizer state, softmax and norms stay float32)")
      ->group(run_group)
      ->capture_default_str()
      ->check(CLI::IsMember({"fp32", "tf32", "bf16"}));
  app.add_option("--threads", o.threads, "CPU threads for OpenMP and OpenBLAS (0: all cores)")
      ->group(run_group)->capture_default_str()->check(CLI::Range(0, 1024));
  app.add_option("--out", o.out_dir, "output folder: metrics.jsonl, summary.json, curves.png, checkpoint/")
      ->group(run_group)->capture_default_str();
  app.add_option("--checkpoint", o.checkpoint_dir, "checkpoint folder (default OUT/checkpoint)")->group(run_group);
  app.add_flag("--resume", o.resume, "continue from the checkpoint (same flags; starts fresh when there is none)")
      ->group(run_group);
  app.add_flag("--eval-only", o.eval_only, "evaluate the checkpoint on the test set and exit")->group(run_group);
  app.add_option("--log-every", o.log_every, "steps between metrics.jsonl step records (0: epochs only)")
      ->group(run_group)
      ->capture_default_str()
      ->check(non_negative_number());
  app.add_option("--checkpoint-every", o.checkpoint_every,
                 "steps between checkpoints, besides every epoch end (0: epoch ends only)")
      ->group(run_group)
      ->capture_default_str()
      ->check(non_negative_number());
  app.add_flag("!--no-progress", o.progress, "no progress bar or periodic progress lines")->group(run_group);
  app.add_flag("!--no-plot", o.plot, "do not draw curves.png")->group(run_group);
  app.add_flag("--profile", o.profile,
               "print what each step asks of the GPU (kernel launches, library calls, host synchronizations, "
               "device allocations, copies) and its host time; step records get the means as cuda_per_step")
      ->group(run_group);
  app.add_flag("--cuda-graph", o.cuda_graph,
               "capture the training step as a CUDA graph (one per batch shape) and replay it: one launch per "
               "step; the same results as without")
      ->group(run_group);
  app.add_option("--skip-nonfinite", o.skip_nonfinite,
                 "skip up to N steps whose loss or gradient norm is not finite (logged) instead of stopping at the "
                 "first")
      ->group(run_group)
      ->capture_default_str()
      ->check(non_negative_number());
}

void add_clip_flag(CLI::App& app, double& clip, const std::string& group) {
  app.add_option("--clip", clip, "clip the global gradient norm to this (0: off)")
      ->group(group)
      ->capture_default_str()
      ->check(non_negative_number());
}

void add_selection_flags(CLI::App& app, double& ema, int64_t& patience, const std::string& metric,
                         const std::string& group) {
  app.add_option("--ema", ema,
                 "moving average of the weights for evaluation and the best checkpoint (0: off, e.g. 0.999)")
      ->group(group)
      ->capture_default_str()
      ->check(finite_range(0.0, 0.999999));
  app.add_option("--patience", patience, "stop after N epochs without a better " + metric + " (0: never)")
      ->group(group)
      ->capture_default_str()
      ->check(non_negative_number());
}

void add_model_flags(CLI::App& cmd, ModelOptions& o) {
  cmd.add_option("--checkpoint", o.checkpoint,
                 "checkpoint folder (a training run's checkpoint: its best weights; or a best/ folder)")
      ->required();
  cmd.add_option("--device", o.device, "cpu, cuda or auto")->capture_default_str()
      ->check(CLI::IsMember({"cpu", "cuda", "auto"}));
  cmd.add_option("--threads", o.threads, "CPU threads (0: all cores)")->check(CLI::Range(0, 1024));
}

}  // namespace linea::apps
