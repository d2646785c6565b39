// The apps' run plumbing (see app_run.h).
#include "apps/common/app_run.h"

#include <cstdio>
#include <filesystem>

#include "apps/common/device.h"
#include "apps/common/progress.h"
#include "core/runtime.h"
#include "nn/checkpoint.h"
#include "nn/dist.h"
#include "nn/io_util.h"

namespace fs = std::filesystem;

namespace linea::apps {

Device start_run(const std::string& app, const RunOptions& run, const std::string& config_format) {
  set_num_threads(run.threads);  // 0 keeps the defaults
  const Device device = resolve_device(app, run.device);
  apply_precision(app, run.precision, device);
  // --resume from another app's checkpoint says so, rather than listing every setting as changed.
  if (run.resume && nn::checkpoint_exists(run.checkpoint()))
    read_checkpoint_config(run.checkpoint(), app, config_format);
  return device;
}

ModelRun start_model_run(const std::string& app, const ModelOptions& options) {
  set_num_threads(options.threads);
  return {resolve_device(app, options.device), best_weights_dir(options.checkpoint)};
}

std::string best_weights_dir(const std::string& dir) {
  return fs::exists(dir + "/best/model.safetensors") ? dir + "/best" : dir;
}

Metrics eval_only(const std::string& app, const RunOptions& run,
                  const std::function<Metrics(const std::string& weights_dir)>& evaluate) {
  const std::string dir = best_weights_dir(run.checkpoint());
  LINEA_CHECK(fs::exists(dir + "/model.safetensors"), app, ": --eval-only needs a checkpoint, but '", run.checkpoint(),
              "' holds none");
  std::error_code ec;
  fs::create_directories(run.out_dir, ec);  // the evaluation may write files there (e.g. hypotheses)
  LINEA_CHECK(!ec, app, ": cannot create the output folder '", run.out_dir, "' (--out): ", ec.message());
  const Metrics m = evaluate(dir);
  std::printf("%s: %s (weights from %s)\n", app.c_str(), m.text.c_str(), dir.c_str());
  std::fflush(stdout);
  nn::write_text_file_atomic(run.out_dir + "/eval.json", m.values.dump(2) + "\n");
  return m;
}

void report_run(const TrainSetup& setup, const RunOptions& run, const TrainResult& result, const std::string& headline,
                const std::vector<std::string>& extra_outputs) {
  if (setup.data_parallel && dist::rank() != 0) return;
  const std::string ckpt = run.checkpoint();
  std::printf("\n%s: %s; %s wall, %.0f train %s/s on %s\n", setup.app.c_str(), headline.c_str(),
              format_duration(result.wall_s).c_str(), result.units_per_s, setup.unit.c_str(),
              device_name(setup.device).c_str());
  std::string outputs = "metrics.jsonl, summary.json, curves.png";
  for (const std::string& f : extra_outputs) outputs += ", " + f;
  const std::string best = setup.select.metric.empty() ? "" : " (best weights in " + ckpt + "/best)";
  std::printf("%s: outputs in %s: %s; checkpoint %s%s\n", setup.app.c_str(), run.out_dir.c_str(), outputs.c_str(),
              ckpt.c_str(), best.c_str());
  std::fflush(stdout);
}

}  // namespace linea::apps
