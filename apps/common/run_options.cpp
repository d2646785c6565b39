// add_run_flags (see run_options.h).
#include "apps/common/run_options.h"

#include <CLI/CLI.hpp>

namespace linea::apps {

void add_run_flags(CLI::App& app, RunOptions& o, const std::string& train_group, const std::string& run_group) {
  app.add_option("--seed", o.seed, "seed for initialization, data order, augmentation and attention samples")
      ->group(train_group)->capture_default_str();
  app.add_option("--max-steps", o.max_steps, "stop after this many steps in total (0: all epochs); the schedule "
                 "still spans --epochs, so --resume continues the same run")->group(train_group)->check(CLI::NonNegativeNumber);

  app.add_option("--device", o.device, "cpu, cuda or auto (cuda when a GPU is usable)")
      ->group(run_group)->capture_default_str()->check(CLI::IsMember({"cpu", "cuda", "auto"}));
  app.add_option("--threads", o.threads, "CPU threads for OpenMP and OpenBLAS (0: all cores)")
      ->group(run_group)->capture_default_str()->check(CLI::Range(0, 1024));
  app.add_option("--out", o.out_dir, "output folder: metrics.jsonl, summary.json, curves.png, checkpoint/")
      ->group(run_group)->capture_default_str();
  app.add_option("--checkpoint", o.checkpoint_dir, "checkpoint folder (default OUT/checkpoint)")->group(run_group);
  app.add_flag("--resume", o.resume, "continue from the checkpoint (same flags; starts fresh when there is none)")
      ->group(run_group);
  app.add_flag("--eval-only", o.eval_only, "evaluate the checkpoint on the test set and exit")->group(run_group);
  app.add_option("--log-every", o.log_every, "steps between metrics.jsonl step records (0: epochs only)")
      ->group(run_group)->capture_default_str()->check(CLI::NonNegativeNumber);
  app.add_option("--checkpoint-every", o.checkpoint_every,
                 "steps between checkpoints, besides every epoch end (0: epoch ends only)")
      ->group(run_group)->capture_default_str()->check(CLI::NonNegativeNumber);
  app.add_flag("!--no-progress", o.progress, "no progress bar or periodic progress lines")->group(run_group);
  app.add_flag("!--no-plot", o.plot, "do not draw curves.png")->group(run_group);
  app.add_option("--skip-nonfinite", o.skip_nonfinite,
                 "skip up to N steps whose loss or gradient norm is not finite (logged) instead of stopping at the "
                 "first")->group(run_group)->capture_default_str()->check(CLI::NonNegativeNumber);
}

}  // namespace linea::apps
