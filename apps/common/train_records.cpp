// The loop's running sums, profile means, stats text and curves (see train_records.h).
#include "apps/common/train_records.h"

#include <algorithm>
#include <cstdio>

#include "apps/common/metrics.h"
#include "apps/common/plot.h"
#include "apps/common/progress.h"
#include "autograd/ops.h"
#include "nn/dist.h"

using json = nlohmann::json;

namespace linea::apps {

void RunningSums::add(double loss, const std::vector<std::pair<std::string, DType>>& names, const double* stats,
                      int64_t units) {
  loss_ += loss;
  for (size_t i = 0; i < names.size(); ++i) {
    double& sum = stats_.try_emplace(names[i].first, 0.0).first->second;
    if (names[i].second == DType::Float32)
      sum = static_cast<float>(sum) + static_cast<float>(stats[i]);
    else
      sum += stats[i];  // float64, and int64 counts (exact below 2^53)
  }
  units_ += units;
  ++steps_;
}

std::map<std::string, double> RunningSums::stat_means() const {
  std::vector<double> sums;
  for (const auto& [name, v] : stats_) sums.push_back(v);
  if (reduce_) {
    // The same stats on every rank (a rank whose slices were all empty so far has none).
    Tensor n = from_vector<int64_t>({static_cast<int64_t>(sums.size())}, {1});
    Tensor lo = clone(n);
    dist::all_reduce(n, dist::ReduceOp::Max);
    dist::all_reduce(lo, dist::ReduceOp::Min);
    LINEA_CHECK(n.item() == lo.item(), "train: the ranks' steps returned different stats (", lo.item(), " to ",
                n.item(), " names)");
    if (!sums.empty()) {
      Tensor t = from_vector<double>(sums, {static_cast<int64_t>(sums.size())});
      dist::all_reduce(t);
      sums = t.to_vector<double>();
    }
  }
  std::map<std::string, double> out;
  size_t i = 0;
  for (const auto& [name, v] : stats_) out[name] = sums[i++] / std::max<double>(units_, 1.0);
  return out;
}

void ProfileSums::add(const cuda::Counters& c, double seconds) {
  sum.kernel_launches += c.kernel_launches;
  sum.library_calls += c.library_calls;
  sum.graph_launches += c.graph_launches;
  sum.host_syncs += c.host_syncs;
  sum.host_waits += c.host_waits;
  sum.device_allocs += c.device_allocs;
  sum.device_copies += c.device_copies;
  sum.h2d_copies += c.h2d_copies;
  sum.h2d_bytes += c.h2d_bytes;
  sum.d2h_copies += c.d2h_copies;
  sum.d2h_bytes += c.d2h_bytes;
  host_s += seconds;
  ++steps;
}

json ProfileSums::per_step() const {
  const double n = static_cast<double>(std::max<int64_t>(steps, 1));
  return {{"kernel_launches", sum.kernel_launches / n},
          {"library_calls", sum.library_calls / n},
          {"graph_launches", sum.graph_launches / n},
          {"host_syncs", sum.host_syncs / n},
          {"host_waits", sum.host_waits / n},
          {"device_allocs", sum.device_allocs / n},
          {"device_copies", sum.device_copies / n},
          {"h2d_copies", sum.h2d_copies / n},
          {"h2d_bytes", sum.h2d_bytes / n},
          {"d2h_copies", sum.d2h_copies / n},
          {"d2h_bytes", sum.d2h_bytes / n},
          {"host_ms", 1e3 * host_s / n}};
}

std::string stats_text(const TrainHooks& hooks, const std::map<std::string, double>& stats) {
  if (hooks.format_stats) return hooks.format_stats(stats);
  std::string out;
  for (const auto& [name, v] : stats) out += (out.empty() ? "" : "  ") + name + " " + format_number("%.4g", v);
  return out;
}

double epoch_position(const nn::DataLoader& loader, int64_t epoch, int64_t batch) {
  const int64_t n = std::max<int64_t>(loader.num_batches(epoch), 1);
  return static_cast<double>(epoch * n + batch) / static_cast<double>(n);
}

namespace {
// "test_accuracy" -> "test accuracy"
std::string in_words(std::string key) {
  for (char& ch : key)
    if (ch == '_') ch = ' ';
  return key;
}
}  // namespace

Figure training_curves(const TrainSetup& setup, const std::string& out_dir) {
  const CurveOptions& c = setup.curves;
  const std::string metric_label =
      !c.metric_label.empty() ? c.metric_label : in_words(c.metric) + (c.metric_scale == 100 ? " (%)" : "");
  Series step_loss{c.train_loss + " (logged steps)", {}, {}}, epoch_train{c.train_loss + " (epoch mean)", {}, {}};
  Series eval_loss{in_words(c.eval_loss), {}, {}}, metric{metric_label + " (right axis)", {}, {}};
  epoch_train.points = eval_loss.points = metric.points = true;
  metric.right_axis = true;
  // Records without the numbers a curve needs (a hand-edited or foreign file) are left out.
  const auto number = [](const json& r, const std::string& key) { return r.contains(key) && r[key].is_number(); };
  for (const json& r : MetricsLog::read(out_dir + "/metrics.jsonl")) {
    const json type = r.value("type", json());
    if (type == "step" && number(r, "epoch_progress") && number(r, "loss")) {
      step_loss.x.push_back(r["epoch_progress"].get<double>());
      step_loss.y.push_back(r["loss"].get<double>());
    } else if (type == "epoch" && number(r, "epoch") && number(r, "train_loss")) {
      const double e = r["epoch"].get<double>();
      epoch_train.x.push_back(e);
      epoch_train.y.push_back(r["train_loss"].get<double>());
      if (!c.eval_loss.empty() && number(r, c.eval_loss)) {
        eval_loss.x.push_back(e);
        eval_loss.y.push_back(r[c.eval_loss].get<double>());
      }
      if (!c.metric.empty() && number(r, c.metric)) {
        metric.x.push_back(e);
        metric.y.push_back(c.metric_scale * r[c.metric].get<double>());
      }
    }
  }
  Figure fig;
  fig.title = c.title.empty() ? setup.app + ": training" : c.title;
  fig.xlabel = "epoch";
  fig.ylabel = c.ylabel;
  fig.y2label = c.metric.empty() ? "" : metric_label;
  fig.series = {step_loss, epoch_train};
  if (!c.eval_loss.empty()) fig.series.push_back(eval_loss);
  if (!c.metric.empty()) fig.series.push_back(metric);
  return fig;
}

void draw_curves(const TrainSetup& setup, const std::string& out_dir) {
  std::string err;
  if (!plot_png(out_dir + "/curves.png", training_curves(setup, out_dir), &err))
    std::fprintf(stderr, "%s: warning: curves.png not drawn: %s\n", setup.app.c_str(), err.c_str());
}

}  // namespace linea::apps
