// What the training loop reports (apps/common/train_loop.cpp's pieces): the running sums behind
// the progress bar and the metrics.jsonl records, the --profile counter means, the console text
// of the stats and curves.png.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "apps/common/plot.h"
#include "apps/common/train_loop.h"
#include "core/cuda_counters.h"
#include "nn/data.h"

namespace linea::apps {

// Loss and stats summed on the host over the steps settled so far. Each stat is added in its own
// dtype (an int64 count exactly, a float32 sum as float32 additions), so the figures equal sums
// kept on the device. Under data parallelism (`reduce`) the loss and units are already the whole
// batch's, and stat_means() sums the stats across ranks (a collective: every rank calls it at
// the same points).
class RunningSums {
 public:
  explicit RunningSums(bool reduce) : reduce_(reduce) {}
  void add(double loss, const std::vector<std::pair<std::string, DType>>& names, const double* stats, int64_t units);
  int64_t steps() const { return steps_; }
  int64_t units() const { return units_; }
  double mean_loss() const { return steps_ ? loss_ / static_cast<double>(steps_) : 0.0; }
  std::map<std::string, double> stat_means() const;  // per unit

 private:
  bool reduce_;
  double loss_ = 0;
  std::map<std::string, double> stats_;
  int64_t steps_ = 0, units_ = 0;
};

// --profile: per-step means of the counters over the steps issued since the last record.
struct ProfileSums {
  cuda::Counters sum;
  double host_s = 0;
  int64_t steps = 0;
  void add(const cuda::Counters& c, double seconds);
  nlohmann::json per_step() const;
};

// The running stats as console text: hooks.format_stats, else "name 0.1234  ...".
std::string stats_text(const TrainHooks& hooks, const std::map<std::string, double>& stats);

// (epoch * n + batch) / n: the epoch count as a fraction, n = the epoch's batches.
double epoch_position(const nn::DataLoader& loader, int64_t epoch, int64_t batch);

// The curves of <out_dir>/metrics.jsonl (TrainSetup::curves) against the epoch: the logged steps'
// training loss, the epochs' mean training loss, the evaluation's loss and metric (right axis).
Figure training_curves(const TrainSetup& setup, const std::string& out_dir);
// training_curves drawn into <out_dir>/curves.png; a warning, not an error, when gnuplot cannot.
void draw_curves(const TrainSetup& setup, const std::string& out_dir);

}  // namespace linea::apps
