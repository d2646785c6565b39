// The shared training loop (see train_loop.h): train() reads top to bottom; the helpers above it
// keep the running sums, the checkpoint and resume logic, the records and the curves.
#include "apps/common/train_loop.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <deque>
#include <filesystem>
#include <fstream>
#include <memory>

#include "apps/common/device.h"
#include "apps/common/interrupt.h"
#include "apps/common/metrics.h"
#include "apps/common/plot.h"
#include "apps/common/progress.h"
#include "autograd/autograd.h"
#include "autograd/ops.h"
#include "core/allocator.h"
#include "core/cuda_counters.h"
#include "core/cuda_graph.h"
#include "core/random.h"
#include "core/readback.h"
#include "nn/checkpoint.h"
#include "nn/data_parallel.h"
#include "nn/dist.h"
#include "nn/io_util.h"
#include "nn/safetensors.h"

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace linea::apps {

namespace {

using Clock = std::chrono::steady_clock;
std::string fmt(const char* f, double v) { return format_number(f, v); }

// Loss and stats summed on the host over the steps settled so far (see PendingStep). Each stat
// is added in its own dtype (an int64 count exactly, a float32 sum as float32 additions), so the
// figures equal sums kept on the device. Under data parallelism the loss and units are already
// the whole batch's, and stat_means() sums the stats across ranks (a collective: every rank
// calls it at the same points).
class RunningSums {
 public:
  explicit RunningSums(bool reduce) : reduce_(reduce) {}
  void add(double loss, const std::vector<std::pair<std::string, DType>>& names, const double* stats, int64_t units) {
    loss_ += loss;
    for (size_t i = 0; i < names.size(); ++i) {
      auto [it, fresh] = stats_.try_emplace(names[i].first, 0.0);
      const double v = stats[i];
      if (fresh)
        it->second = v;
      else if (names[i].second == DType::Float32)
        it->second = static_cast<float>(it->second) + static_cast<float>(v);
      else
        it->second += v;  // float64, and int64 counts (exact below 2^53)
    }
    units_ += units;
    ++steps_;
  }
  int64_t steps() const { return steps_; }
  int64_t units() const { return units_; }
  double mean_loss() const { return steps_ ? loss_ / static_cast<double>(steps_) : 0.0; }
  std::map<std::string, double> stat_means() const {
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

 private:
  bool reduce_;
  double loss_ = 0;
  std::map<std::string, double> stats_;
  int64_t steps_ = 0, units_ = 0;
};

// A step whose loss, guard and stats are still on their way to the host: the loop queues their
// copies (AsyncRead) and looks at them kInFlight steps later, so the host never waits for the
// step it has just issued (the GPU has the next one queued when the host waits at all).
constexpr size_t kInFlight = 2;
struct PendingStep {
  int64_t step = 0, batch = 0, units = 0;            // pos.step and pos.batch after it; its units
  double lr = 0;                                     // its learning rate
  std::vector<std::pair<std::string, DType>> stats;  // the stats' names and dtypes
  AsyncRead values;                                  // loss, guard {norm, coef, ok}, the stats
};

// --profile: per-step means of the counters over the steps issued since the last record.
struct ProfileSums {
  cuda::Counters sum;
  double host_s = 0;
  int64_t steps = 0;
  void add(const cuda::Counters& c, double seconds) {
    sum.kernel_launches += c.kernel_launches;
    sum.library_calls += c.library_calls;
    sum.graph_launches += c.graph_launches;
    sum.host_syncs += c.host_syncs;
    sum.device_allocs += c.device_allocs;
    sum.device_copies += c.device_copies;
    sum.h2d_copies += c.h2d_copies;
    sum.h2d_bytes += c.h2d_bytes;
    sum.d2h_copies += c.d2h_copies;
    sum.d2h_bytes += c.d2h_bytes;
    host_s += seconds;
    ++steps;
  }
  json per_step() const {
    const double n = static_cast<double>(std::max<int64_t>(steps, 1));
    return {{"kernel_launches", sum.kernel_launches / n},
            {"library_calls", sum.library_calls / n},
            {"graph_launches", sum.graph_launches / n},
            {"host_syncs", sum.host_syncs / n},
            {"device_allocs", sum.device_allocs / n},
            {"device_copies", sum.device_copies / n},
            {"h2d_copies", sum.h2d_copies / n},
            {"h2d_bytes", sum.h2d_bytes / n},
            {"d2h_copies", sum.d2h_copies / n},
            {"d2h_bytes", sum.d2h_bytes / n},
            {"host_ms", 1e3 * host_s / n}};
  }
};

// --cuda-graph: the captured steps, one per batch shape (names, shapes, dtypes of the batch's
// tensors), at most kMaxGraphs, the least recently used dropped first.
class GraphSteps {
 public:
  static constexpr size_t kMaxGraphs = 8;
  struct Entry {
    std::unique_ptr<CudaGraph> graph;
    std::map<std::string, Tensor> inputs;  // the static device tensors it reads the batch from
    Tensor loss, guard;                    // where it leaves the loss and the guard
    std::vector<std::pair<std::string, Tensor>> stats;
    int64_t draws = 0;  // per-example draws it reserves (the base counter moves by that much)
    int64_t units = 0;  // of the captured batch
    double weight = -1;
    uint64_t last_use = 0;
  };
  explicit GraphSteps(Device device) : device_(device) {
    LongLivedAllocations long_lived;
    draw_base_ = zeros({1}, TensorOptions(DType::Int64, device));
  }
  static std::string key_of(const nn::Batch& b) {
    std::string key;
    for (const auto& [name, t] : b.tensors()) key += name + shape_str(t.shape()) + dtype_name(t.dtype()) + ";";
    return key;
  }
  Entry* find(const std::string& key) {
    auto it = entries_.find(key);
    if (it == entries_.end()) return nullptr;
    it->second.last_use = ++tick_;
    return &it->second;
  }
  Entry& add(const std::string& key) {
    if (entries_.size() >= kMaxGraphs) {
      auto oldest = entries_.begin();
      for (auto it = entries_.begin(); it != entries_.end(); ++it)
        if (it->second.last_use < oldest->second.last_use) oldest = it;
      entries_.erase(oldest);
    }
    Entry& e = entries_[key];
    e.last_use = ++tick_;
    return e;
  }
  // The device counter the captured per-example draws add their index to.
  const uint64_t* draw_base() const { return static_cast<const uint64_t*>(draw_base_.data_ptr()); }
  void set_draw_base(uint64_t base) { draw_base_.copy_(from_vector<int64_t>({static_cast<int64_t>(base)}, {1})); }

 private:
  Device device_;
  Tensor draw_base_;
  std::map<std::string, Entry> entries_;
  uint64_t tick_ = 0;
};

std::string stats_text(const TrainHooks& hooks, const std::map<std::string, double>& stats) {
  if (hooks.format_stats) return hooks.format_stats(stats);
  std::string out;
  for (const auto& [name, v] : stats) out += (out.empty() ? "" : "  ") + name + " " + fmt("%.4g", v);
  return out;
}

// (epoch * n + batch) / n: the epoch count as a fraction, n = the epoch's batches.
double epoch_position(const nn::DataLoader& loader, int64_t epoch, int64_t batch) {
  const int64_t n = std::max<int64_t>(loader.num_batches(epoch), 1);
  return static_cast<double>(epoch * n + batch) / static_cast<double>(n);
}

void flatten_diff(const std::string& path, const json& saved, const json& now, std::string& out) {
  if (now.is_object() && saved.is_object()) {
    for (auto it = now.begin(); it != now.end(); ++it)
      flatten_diff(path.empty() ? it.key() : path + "." + it.key(),
                   saved.contains(it.key()) ? saved.at(it.key()) : json(), it.value(), out);
    return;
  }
  const std::string s = saved.is_null() ? "(absent)" : saved.dump();
  if (s != now.dump()) out += "\n  " + path + ": checkpoint " + s + ", now " + now.dump();
}

struct Position {
  int64_t step = 0, epoch = 0, batch = 0;  // batch: batches of `epoch` already done
};

// The moving average of the weights (TrainSetup::ema_decay). Its n-th update uses the decay
// min(d, (1 + n) / (10 + n)), so the early average is not held back by the initial weights.
class WeightAverage {
 public:
  WeightAverage(const nn::Module& model, double decay) : decay_(decay) {
    LINEA_CHECK(decay >= 0 && decay < 1, "train: ema_decay must be in [0, 1), got ", decay);
    if (decay == 0) return;
    NoGradGuard ng;
    for (auto& [name, p] : model.named_parameters()) {
      names_.push_back(name);
      params_.push_back(p);
      avg_.push_back(clone(p.detach()));
    }
  }
  bool on() const { return decay_ > 0; }
  // After a guarded optimizer step (nn::Optimizer::step_guarded): an update when its guard let
  // the step through, none when it did not. The count lives on the device beside the weights,
  // so the decision needs no synchronization.
  void update(const Tensor& guard) {
    if (!on()) return;
    NoGradGuard ng;
    const TensorOptions f64(DType::Float64, params_[0].device());
    if (!count_.defined() || count_.device() != f64.device) {
      LongLivedAllocations long_lived;
      count_ = full({}, static_cast<double>(updates_), f64);
    }
    const Tensor ok = gt(select(guard, 0, 2), 0.5);
    const Tensor d = where(ok, minimum(full({}, decay_, f64), (count_ + 1.0) / (count_ + 10.0)), 1.0);
    const Tensor one_minus_d = 1.0 - d;
    for (size_t i = 0; i < avg_.size(); ++i)
      avg_[i].copy_(avg_[i] * d.to(avg_[i].dtype()) + params_[i].detach() * one_minus_d.to(avg_[i].dtype()));
    count_.copy_(count_ + ok.to(DType::Float64));
  }
  // Exchanges the average and the weights (twice: back as before).
  void swap() {
    if (!on()) return;
    NoGradGuard ng;
    for (size_t i = 0; i < avg_.size(); ++i) {
      Tensor w = clone(params_[i].detach());
      params_[i].copy_(avg_[i]);
      avg_[i].copy_(w);
    }
  }
  void save_to(nn::TrainState& st) const {
    if (!on()) return;
    for (size_t i = 0; i < avg_.size(); ++i) st.tensors["ema." + names_[i]] = avg_[i].to(kCPU);
    st.extra["ema_updates"] = std::to_string(count_.defined() ? count_.item<int64_t>() : updates_);
  }
  void load_from(const nn::TrainState& st, const std::string& app) {
    if (!on()) return;
    for (size_t i = 0; i < avg_.size(); ++i) {
      auto it = st.tensors.find("ema." + names_[i]);
      LINEA_CHECK(it != st.tensors.end() && it->second.shape() == avg_[i].shape(), app,
                  ": --resume: the checkpoint has no moving average of '", names_[i], "' (saved without ema?)");
      avg_[i].copy_(it->second);
    }
    updates_ = std::stoll(st.extra.at("ema_updates"));
    count_ = Tensor();
  }

 private:
  double decay_;
  int64_t updates_ = 0;  // until count_ takes over (at the first update)
  Tensor count_;         // float64 0-d on the weights' device: the updates so far
  std::vector<std::string> names_;
  std::vector<Tensor> params_, avg_;
};

// Model selection (TrainSetup::select): the best evaluation so far and the evaluations since.
struct Selection {
  bool have = false;
  double best = 0;
  int64_t best_step = -1, since = 0;
  void save_to(nn::TrainState& st) const {
    if (!have) return;
    st.extra["select_best"] = format_number("%.17g", best);
    st.extra["select_best_step"] = std::to_string(best_step);
    st.extra["select_since"] = std::to_string(since);
  }
  void load_from(const nn::TrainState& st) {
    auto it = st.extra.find("select_best");
    if (it == st.extra.end()) return;
    have = true;
    best = std::stod(it->second);
    best_step = std::stoll(st.extra.at("select_best_step"));
    since = std::stoll(st.extra.at("select_since"));
  }
};

// <checkpoint>/best: the evaluated weights with config.json and the app's files (each file
// written atomically; model.safetensors last, so its presence marks a complete folder).
void save_best(const TrainSetup& s, const std::string& dir, int64_t step, double value) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  LINEA_CHECK(!ec, s.app, ": cannot create '", dir, "': ", ec.message());
  std::map<std::string, std::string> files = s.files;
  files["config.json"] = s.config.dump(2) + "\n";
  for (const auto& [name, bytes] : files) nn::write_text_file_atomic(dir + "/" + name, bytes);
  nn::save_module(dir + "/model.safetensors", *s.model,
                  {{"step", std::to_string(step)}, {s.select.metric, format_number("%.17g", value)}});
}

// --resume: refuses other run-defining settings (before changing anything), then loads.
Position resume(const TrainSetup& s, const std::string& dir, WeightAverage& ema, Selection& sel) {
  const std::string cfg_path = dir + "/config.json";
  LINEA_CHECK(fs::is_regular_file(cfg_path), s.app, ": --resume: '", dir, "' holds no config.json");
  const std::string diff = config_diff(read_json_file(cfg_path, s.app), s.config, s.resume_keys);
  LINEA_CHECK(diff.empty(), s.app, ": --resume: the checkpoint in '", dir,
              "' was made with other settings; use the same flags (or another --checkpoint/--out):", diff);
  nn::TrainState st = nn::load_checkpoint(dir, *s.model, *s.optimizer);
  nn::check_finite_weights(*s.model, s.app + ": --resume: '" + dir + "/model.safetensors'");
  Position p{st.step, st.epoch, 0};
  ema.load_from(st, s.app);
  sel.load_from(st);
  auto it = st.extra.find("epoch_batch");
  p.batch = it != st.extra.end() ? std::stoll(it->second) : st.step - st.epoch * s.loader->num_batches(st.epoch);
  return p;
}

void save(const TrainSetup& s, const std::string& dir, const Position& p, const WeightAverage& ema,
          const Selection& sel) {
  nn::TrainState st;
  ema.save_to(st);
  sel.save_to(st);
  st.step = p.step;
  st.epoch = p.epoch;
  st.extra["epoch_batch"] = std::to_string(p.batch);
  st.extra["schedule"] = nn::schedule_name(s.schedule);
  st.files = s.files;
  st.files["config.json"] = s.config.dump(2) + "\n";
  nn::save_checkpoint(dir, *s.model, *s.optimizer, st);
}

// Rank 0's evaluation results on every rank.
Metrics broadcast_metrics(const Metrics& m) {
  std::string text = json{{"values", m.values}, {"text", m.text}}.dump();
  dist::broadcast_string(text, 0);
  const json j = json::parse(text);
  return Metrics{j.at("values"), j.at("text").get<std::string>()};
}

void draw_curves(const TrainSetup& s, const std::string& out_dir) {
  const CurveOptions& c = s.curves;
  Series step_loss{c.train_loss + " (logged steps)", {}, {}}, epoch_train{c.train_loss + " (epoch mean)", {}, {}};
  Series eval_loss{c.eval_loss, {}, {}}, metric{c.metric + " (right axis)", {}, {}};
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
      if (!c.eval_loss_key.empty() && number(r, c.eval_loss_key)) {
        eval_loss.x.push_back(e);
        eval_loss.y.push_back(r[c.eval_loss_key].get<double>());
      }
      if (!c.metric_key.empty() && number(r, c.metric_key)) {
        metric.x.push_back(e);
        metric.y.push_back(c.metric_scale * r[c.metric_key].get<double>());
      }
    }
  }
  Figure fig;
  fig.title = c.title.empty() ? s.app + ": training" : c.title;
  fig.xlabel = "epoch";
  fig.ylabel = c.ylabel;
  fig.y2label = c.y2label;
  fig.series = {step_loss, epoch_train};
  if (!c.eval_loss_key.empty()) fig.series.push_back(eval_loss);
  if (!c.metric_key.empty()) fig.series.push_back(metric);
  std::string err;
  if (!plot_png(out_dir + "/curves.png", fig, &err))
    std::fprintf(stderr, "%s: warning: curves.png not drawn: %s\n", s.app.c_str(), err.c_str());
}

// SIGINT / SIGTERM (interrupt.h): the checkpoint of the step just done, a metrics record, then
// Interrupted, on every rank (they agreed on the step).
[[noreturn]] void stop_interrupted(const TrainSetup& s, const std::string& ckpt, const Position& p,
                                   const WeightAverage& ema, const Selection& sel, MetricsLog* metrics, bool main_rank,
                                   bool saved, int sig) {
  if (main_rank && !saved) save(s, ckpt, p, ema, sel);
  if (metrics) metrics->write({{"type", "interrupted"}, {"step", p.step}, {"signal", signal_name(sig)}});
  throw Interrupted(s.app + ": " + signal_name(sig) + ": stopped after step " + std::to_string(p.step) +
                        "; the checkpoint in '" + ckpt + "' holds it: run the same command with --resume to continue",
                    sig);
}

}  // namespace

json read_checkpoint_config(const std::string& dir, const std::string& app, const std::string& format) {
  const std::string path = dir + "/config.json";
  LINEA_CHECK(fs::is_directory(dir), app, ": checkpoint folder '", dir, "' ",
              fs::exists(dir) ? "is a file, not a folder" : "does not exist");
  LINEA_CHECK(fs::is_regular_file(path), app, ": '", dir, "' is not a ", app,
              " checkpoint (no config.json; pass the checkpoint folder of a training run)");
  json j = read_json_file(path, app);
  const std::string found =
      j.is_object() && j.contains("format") && j["format"].is_string() ? j["format"].get<std::string>() : "";
  LINEA_CHECK(found == format, app, ": '", dir, "' is not a ", app, " checkpoint (its config.json has format '",
              found.empty() ? std::string("none") : found, "', expected '", format, "')");
  return j;
}

int64_t planned_steps(const nn::DataLoader& loader, int64_t epochs) {
  int64_t n = 0;
  for (int64_t e = 0; e < epochs; ++e) n += loader.num_batches(e);
  return n;
}

std::string config_diff(const json& saved, const json& now, const std::vector<std::string>& keys) {
  std::string out;
  if (keys.empty()) {
    flatten_diff("", saved, now, out);
    return out;
  }
  for (const std::string& k : keys)
    flatten_diff(k, saved.contains(k) ? saved.at(k) : json(), now.contains(k) ? now.at(k) : json(), out);
  return out;
}

Metrics evaluate_forked(nn::Module& model, Device device, const std::function<Metrics()>& evaluate) {
  NoGradGuard no_grad;
  model.eval();
  // Evaluation may sample (e.g. unbiased RA in eval): on a fork, so the training run's random
  // stream is the same with or without evaluations, and a resume matches wherever they happened.
  const std::vector<uint64_t> rng_cpu = get_rng_state(kCPU);
  const std::vector<uint64_t> rng_dev = device.is_cuda() ? get_rng_state(device) : std::vector<uint64_t>{};
  Metrics m = evaluate();
  set_rng_state(rng_cpu, kCPU);
  if (device.is_cuda()) set_rng_state(rng_dev, device);
  model.train();
  return m;
}

TrainResult train(const TrainSetup& s, const TrainHooks& hooks, const RunOptions& o) {
  const auto t_start = Clock::now();
  LINEA_CHECK(s.model && s.optimizer && s.loader && hooks.step && hooks.evaluate, s.app,
              ": train() needs a model, an optimizer, a loader and the step and evaluate hooks");
  const std::string ckpt = o.checkpoint(), app = s.app, per_s = s.unit + "_per_s";
  const std::vector<Tensor> params = s.model->parameters();
  TrainResult result;
  Position pos;
  WeightAverage ema(*s.model, s.ema_decay);
  Selection sel;
  const int world = s.data_parallel ? dist::world_size() : 1, rank = s.data_parallel ? dist::rank() : 0;
  const bool main_rank = rank == 0;  // the one that prints and writes
  const InterruptGuard interrupt_guard(s.app);
  if (o.resume && nn::checkpoint_exists(ckpt)) {
    pos = resume(s, ckpt, ema, sel);
    result.resumed = true;
    if (main_rank)
      std::printf("%s: resumed from '%s' at step %lld\n", app.c_str(), ckpt.c_str(), static_cast<long long>(pos.step));
  } else if (o.resume && main_rank) {
    std::printf("%s: --resume: no checkpoint in '%s' yet, starting from scratch\n", app.c_str(), ckpt.c_str());
  }
  std::fflush(stdout);

  // ---- data parallelism (see train_loop.h) ----
  std::shared_ptr<const nn::BatchSampler> whole = s.loader->sampler_ptr();  // whole batches
  if (auto* sharded = dynamic_cast<const nn::ShardedBatchSampler*>(whole.get())) whole = sharded->inner();
  std::unique_ptr<nn::GradientReducer> reducer;
  double comm_s = 0;  // waiting for the steps' loss sums (the reducer counts its own waits)
  int64_t comm_steps = 0;
  if (world > 1) {
    std::string model_desc;
    for (const auto& [name, p] : s.model->named_parameters())
      model_desc += name + " " + shape_str(p.shape()) + " " + dtype_name(p.dtype()) + "\n";
    dist::check_same(s.config.dump() + "\n" + model_desc, app + ": data parallel: the settings or the model");
    dist::check_same(
        std::to_string(pos.step),
        app + ": data parallel: the step each rank resumed at (the ranks must share the checkpoint folder)");
    nn::broadcast_parameters(*s.model);
    s.loader->shard(rank, world);
    reducer = std::make_unique<nn::GradientReducer>(params);
    if (main_rank)
      std::printf("%s: data parallel over %d ranks (%s), %lld gradient buckets of up to %lld MB\n", app.c_str(), world,
                  dist::has_nccl() && s.device.is_cuda() ? "NCCL" : "MPI",
                  static_cast<long long>(reducer->num_buckets()),
                  static_cast<long long>(nn::GradientReducer::kDefaultBucketBytes >> 20));
  }

  std::unique_ptr<MetricsLog> metrics;
  if (main_rank) {
    std::error_code ec;
    fs::create_directories(o.out_dir, ec);
    LINEA_CHECK(!ec, app, ": cannot create the output folder '", o.out_dir, "' (--out): ", ec.message());
    metrics = std::make_unique<MetricsLog>(o.out_dir + "/metrics.jsonl", result.resumed ? pos.step : -1);
  }
  const int64_t total = planned_steps(*s.loader, s.epochs);
  const int64_t stop = o.max_steps > 0 ? std::min(total, o.max_steps) : total;
  // Evaluations see the moving average when there is one. Rank 0 evaluates; the others get its
  // results, so that model selection and early stopping decide the same on every rank.
  const auto eval = [&](const std::string& label) {
    Metrics m;
    if (main_rank) {
      ema.swap();
      m = evaluate_forked(*s.model, s.device, [&] { return hooks.evaluate(label); });
    }
    if (world > 1) m = broadcast_metrics(m);
    if (!s.select.metric.empty() && m.values.contains(s.select.metric)) {
      const double v = m.values.at(s.select.metric).get<double>();
      if (!sel.have || (s.select.maximize ? v > sel.best : v < sel.best)) {
        sel = Selection{true, v, pos.step, 0};
        if (main_rank) save_best(s, ckpt + "/best", pos.step, v);
      } else {
        ++sel.since;
      }
    }
    if (main_rank) ema.swap();
    return m;
  };
  result.start_step = pos.step;
  double train_s = 0;
  int64_t train_units = 0;
  bool have_eval = false;
  s.model->train();

  std::unique_ptr<GraphSteps> graphs;  // --cuda-graph
  if (o.cuda_graph) {
    LINEA_CHECK(s.device.is_cuda(), app, ": --cuda-graph needs --device cuda (a CUDA graph is the GPU's)");
    LINEA_CHECK(world == 1, app, ": --cuda-graph does not run data parallel (", world,
                " ranks): the gradient exchange is not captured; run without it");
    graphs = std::make_unique<GraphSteps>(s.device);
  }
  bool warmed_up = false;  // --cuda-graph: one uncaptured step first
  const auto patience_out = [&] { return s.select.patience > 0 && sel.since >= s.select.patience; };
  while (pos.epoch < s.epochs && pos.step < stop && !patience_out()) {
    const int64_t n = s.loader->num_batches(pos.epoch), first = pos.batch;
    const int64_t last = std::min(n, first + (stop - pos.step));  // this epoch runs batches [first, last)
    if (s.on_epoch) s.on_epoch(pos.epoch);
    s.loader->reset(pos.epoch, first);
    const std::string label = "epoch " + std::to_string(pos.epoch + 1) + "/" + std::to_string(s.epochs);
    std::unique_ptr<ProgressBar> bar;
    if (o.progress && main_rank) bar = std::make_unique<ProgressBar>(label + " train", 0, s.unit_short);
    std::vector<int64_t> whole_sizes;  // data parallelism: the sizes of the epoch's whole batches
    if (world > 1)
      for (const auto& b : whole->batches(pos.epoch)) whole_sizes.push_back(static_cast<int64_t>(b.size()));
    RunningSums epoch_sums(world > 1), log_sums(world > 1);
    ProfileSums log_profile;
    double lr = 0;
    int64_t first_units = 0;
    const auto t_epoch = Clock::now();
    nn::Batch batch;
    int stop_signal = 0;  // a signal during the epoch's last step: stop after its evaluation
    std::deque<PendingStep> pending;

    // Settles the oldest pending step: the non-finite guard's verdict on it (an error, or a skip
    // within --skip-nonfinite: its update was already withheld on the device), its loss and stats
    // into the running sums, its metrics record and the progress bar. Which steps settle when
    // depends only on the step count, so data-parallel ranks meet in the same collectives.
    const auto settle_one = [&] {
      const PendingStep p = std::move(pending.front());
      pending.pop_front();
      const std::vector<double> v = p.values.values();  // waits only if the copies are not done
      const double loss = v[0], gnorm = v[1];
      result.step_losses.push_back(loss);
      result.step_done_s.push_back(seconds_since(t_start));
      if (v[3] == 0.0) {
        const std::string what = "step " + std::to_string(p.step) + ": non-finite loss (" + fmt("%g", loss) +
                                 ") or gradient norm (" + fmt("%g", gnorm) + ")";
        LINEA_CHECK(result.skipped_steps < o.skip_nonfinite, app, ": ", what, "; stopped (",
                    nn::checkpoint_exists(ckpt) ? "the checkpoint in '" + ckpt + "' is the last good one"
                                                : "no checkpoint was written yet",
                    "; --skip-nonfinite N skips up to N such steps)");
        ++result.skipped_steps;
        if (main_rank)
          std::fprintf(stderr, "%s: %s: skipped (%lld of --skip-nonfinite %lld)\n", app.c_str(), what.c_str(),
                       static_cast<long long>(result.skipped_steps), static_cast<long long>(o.skip_nonfinite));
        if (metrics)
          metrics->write(
              {{"type", "skipped"}, {"step", p.step}, {"epoch", pos.epoch + 1}, {"loss", loss}, {"grad_norm", gnorm}});
      } else {
        epoch_sums.add(loss, p.stats, v.data() + 4, p.units);
        log_sums.add(loss, p.stats, v.data() + 4, p.units);
      }
      // (Under data parallelism every rank reads the stats at the same steps: a collective.)
      const bool log_now = o.log_every > 0 && p.step % o.log_every == 0;
      if (log_now || ((bar || world > 1) && (p.batch - first) % 10 == 0) || p.batch == last) {
        const double secs = seconds_since(t_epoch);
        if (bar || world > 1) {
          const std::string stats = stats_text(hooks, epoch_sums.stat_means());
          if (bar)
            bar->update(first * first_units + epoch_sums.units(),
                        "loss " + fmt("%.4f", epoch_sums.mean_loss()) + "  " + stats + "  lr " + fmt("%.2e", p.lr));
        }
        if (log_now && log_sums.steps() > 0) {
          json rec = {{"type", "step"},
                      {"step", p.step},
                      {"epoch", pos.epoch + 1},
                      {"epoch_progress", epoch_position(*s.loader, pos.epoch, p.batch)},
                      {"lr", p.lr},
                      {"loss", log_sums.mean_loss()},
                      {per_s, epoch_sums.units() / std::max(secs, 1e-9)}};
          for (const auto& [name, value] : log_sums.stat_means()) rec[name] = value;
          if (o.profile && s.device.is_cuda()) rec["cuda_per_step"] = log_profile.per_step();
          if (metrics) metrics->write(rec);
          log_sums = RunningSums(world > 1);
          log_profile = ProfileSums();
        }
      }
    };
    const auto settle = [&](size_t keep) {
      while (pending.size() > keep) settle_one();
    };

    while (pos.batch < last && s.loader->next(batch)) {
      // ---- one step: queued on the device, read back kInFlight steps later ----
      const cuda::Counters counters_before = cuda::counters();
      const auto t_step = Clock::now();
      lr = nn::apply_schedule(*s.optimizer, s.schedule, pos.step);
      // The last step's gradients go before the forward, so that its blocks can serve it (a
      // captured step writes its own gradients, in its own memory, at every replay).
      if (!(graphs && warmed_up)) s.optimizer->zero_grad();
      StepResult r;
      int interrupt = 0;       // SIGINT/SIGTERM received: stop after this step
      Tensor step_loss;        // 0-d: the whole batch's loss
      int64_t step_units = 0;  // the whole batch's units
      Tensor guard;            // {norm, coef, ok}, on the device
      if (graphs && warmed_up) {
        // ---- a replay of the captured step for this batch's shape (captured first if new) ----
        const std::string key = GraphSteps::key_of(batch);
        GraphSteps::Entry* e = graphs->find(key);
        s.optimizer->prepare_step();  // the learning rates, outside the graph
        const uint64_t base = linea::detail::next_example_draw(s.device);
        if (e == nullptr) {
          e = &graphs->add(key);
          nn::Batch staged;
          for (const auto& [name, t] : batch.tensors()) {
            e->inputs[name] = t.to(s.device).contiguous();
            staged.set(name, e->inputs[name]);
          }
          s.optimizer->zero_grad();  // the capture's backward makes the gradients, in its pool
          linea::detail::begin_draw_capture(graphs->draw_base());
          try {
            e->graph = std::make_unique<CudaGraph>([&] {
              StepResult c = hooks.step(staged);
              c.loss.backward();
              e->guard = nn::step_guard(params, c.loss.detach(), s.clip);
              s.optimizer->step_guarded(e->guard);
              ema.update(e->guard);
              e->loss = c.loss.detach();
              for (const auto& [name, t] : c.stats) e->stats.emplace_back(name, t.detach());
              e->units = c.units;
              e->weight = c.weight;
            });
          } catch (...) {
            linea::detail::end_draw_capture();
            throw;
          }
          e->draws = linea::detail::end_draw_capture();  // the capture advanced the generator already
        } else {
          for (const auto& [name, t] : batch.tensors()) e->inputs.at(name).copy_(t);
          linea::detail::skip_example_draws(s.device, e->draws);
        }
        if (e->draws > 0) graphs->set_draw_base(base);
        e->graph->replay();
        step_loss = e->loss;
        guard = e->guard;
        for (const auto& [name, t] : e->stats) r.stats[name] = t;
        step_units = hooks.units ? hooks.units(batch).first : e->units;
        interrupt = pending_interrupt();
      } else if (world == 1) {
        r = hooks.step(batch);
        r.loss.backward();
        step_loss = r.loss.detach();
        step_units = r.units;
        interrupt = pending_interrupt();
      } else {
        // This rank's slice of the whole batch, its loss weighted by its share of the batch's terms.
        const nn::ShardRange shard = nn::shard_range(whole_sizes.at(static_cast<size_t>(pos.batch)), rank, world);
        double w = 0, wl = 0;
        if (shard.count > 0) {
          BatchRowsGuard rows(shard.first);
          r = hooks.step(batch);
          w = r.weight >= 0 ? r.weight : static_cast<double>(r.units);
          wl = w > 0 ? w * r.loss.item() : 0.0;
        }
        const auto t0 = Clock::now();
        // The 4th sum: did any rank get SIGINT/SIGTERM (so all stop after the same step).
        Tensor sums = from_vector<double>(
            {wl, w, static_cast<double>(r.units), static_cast<double>(pending_interrupt() != 0)}, {4});
        dist::all_reduce(sums);
        comm_s += seconds_since(t0);
        const std::vector<double> total = sums.to_vector<double>();
        if (total[3] > 0) interrupt = pending_interrupt() != 0 ? pending_interrupt() : SIGTERM;
        reducer->prepare(total[1] > 0 ? w / total[1] : 0.0);
        if (shard.count > 0) r.loss.backward();
        reducer->finish();
        ++comm_steps;
        step_loss = scalar_tensor(total[1] > 0 ? total[0] / total[1] : 0.0, TensorOptions(DType::Float64)).to(s.device);
        step_units = std::llround(total[2]);
      }
      // Clipping, the non-finite guard and the optimizer step, all on the device: a step whose
      // loss or gradient norm is not finite changes nothing (the settling says so, later).
      if (!guard.defined()) {
        guard = nn::step_guard(params, step_loss, s.clip);
        s.optimizer->step_guarded(guard);
        ema.update(guard);
        warmed_up = true;
      }
      ++pos.step, ++pos.batch;
      PendingStep p{pos.step, pos.batch, step_units, lr, {}, {}};
      std::vector<Tensor> reads = {step_loss, guard};
      for (const auto& [name, t] : r.stats) {
        p.stats.emplace_back(name, t.dtype());
        reads.push_back(t.detach());
      }
      p.values = AsyncRead(reads);
      pending.push_back(std::move(p));
      if (first_units == 0 && step_units > 0 && bar) {
        first_units = step_units;
        bar->set_total(step_units * last);
      }
      settle(kInFlight);
      // Mid-epoch checkpoints (every rank settles, so that they agree on the guard); the one at
      // the epoch's end is saved after its evaluation.
      const bool save_now =
          o.checkpoint_every > 0 && pos.step % o.checkpoint_every == 0 && pos.batch != n && pos.step < stop;
      if (save_now) settle(0);
      if (main_rank && save_now) save(s, ckpt, pos, ema, sel);
      // After the epoch's last step, the evaluation and the epoch's checkpoint come first (a
      // checkpoint never resumes into an epoch that is done but not evaluated).
      if (interrupt && pos.batch == last) {
        stop_signal = interrupt;
      } else if (interrupt) {
        settle(0);
        stop_interrupted(s, ckpt, pos, ema, sel, metrics.get(), main_rank, save_now, interrupt);
      }
      {  // this step's counters, its settling and checkpoint included
        const cuda::Counters c = cuda::counters() - counters_before;
        const double host_s = seconds_since(t_step);
        result.step_counters.push_back(c);
        if (o.profile) log_profile.add(c, host_s);
        if (o.profile && main_rank)
          std::fprintf(stderr, "%s: step %lld: %s; host %.2f ms\n", app.c_str(), static_cast<long long>(pos.step),
                       c.str().c_str(), 1e3 * host_s);
      }
    }
    settle(0);
    // ---- end of the epoch (or of --max-steps) ----
    const double epoch_s = seconds_since(t_epoch), rate = epoch_sums.units() / std::max(epoch_s, 1e-9);
    train_s += epoch_s;
    train_units += epoch_sums.units();
    const double train_loss = epoch_sums.mean_loss();
    const std::map<std::string, double> train_stats = epoch_sums.stat_means();
    if (bar) bar->finish("loss " + fmt("%.4f", train_loss) + "  " + stats_text(hooks, train_stats));
    result.last_eval = eval(label + " test");
    have_eval = true;
    const bool epoch_done = pos.batch == n;
    const double epoch_pos = epoch_position(*s.loader, pos.epoch, pos.batch);
    if (epoch_done) pos.epoch += 1, pos.batch = 0;
    if (main_rank)
      std::printf("%s  train loss %.4f %s  %s  %.0f %s/s  lr %.2e  [%s]%s\n", label.c_str(), train_loss,
                  stats_text(hooks, train_stats).c_str(), result.last_eval.text.c_str(), rate, s.unit_short.c_str(), lr,
                  format_duration(seconds_since(t_start)).c_str(), epoch_done ? "" : "  (partial epoch)");
    std::fflush(stdout);
    json rec = {{"type", "epoch"}, {"step", pos.step}, {"epoch", epoch_pos}, {"lr", lr}, {"train_loss", train_loss},
                {per_s, rate}, {"elapsed_s", seconds_since(t_start)}};
    for (const auto& [name, v] : train_stats) rec["train_" + name] = v;
    rec.update(result.last_eval.values);
    if (metrics) metrics->write(rec);
    if (main_rank) save(s, ckpt, pos, ema, sel);
    if (o.plot && main_rank) draw_curves(s, o.out_dir);
    // A signal during the last step or the evaluation: the checkpoint above holds the epoch. (With
    // several ranks, one during the evaluation is seen in the next step's sums, where they agree.)
    if (world == 1 && !stop_signal) stop_signal = pending_interrupt();
    if (stop_signal) stop_interrupted(s, ckpt, pos, ema, sel, metrics.get(), main_rank, /*saved=*/true, stop_signal);
  }
  result.stopped_early = patience_out() && pos.step < stop && pos.epoch < s.epochs;
  if (result.stopped_early && main_rank)
    std::printf("%s: stopped early: no better %s in %lld evaluations (best %s at step %lld)\n", app.c_str(),
                s.select.metric.c_str(), static_cast<long long>(sel.since), fmt("%.4g", sel.best).c_str(),
                static_cast<long long>(sel.best_step));
  if (!have_eval) {  // resumed after the last step: evaluate the final model once more for the summary
    result.last_eval = eval("test");
    if (o.plot && main_rank) draw_curves(s, o.out_dir);
  }

  // ---- the final evaluation, with the selected weights ----
  if (sel.have) result.best_value = sel.best, result.best_step = sel.best_step;
  if (hooks.finish) {
    if (main_rank) {
      if (sel.have) {
        NoGradGuard ng;
        nn::load_module(ckpt + "/best/model.safetensors", *s.model);
      } else {
        ema.swap();
      }
      result.final_eval = evaluate_forked(*s.model, s.device, hooks.finish);
      if (!result.final_eval.text.empty()) std::printf("%s: %s\n", app.c_str(), result.final_eval.text.c_str());
      std::fflush(stdout);
    }
    if (world > 1) result.final_eval = broadcast_metrics(result.final_eval);
  }

  // ---- summary ----
  result.final_step = pos.step;
  result.units_per_s = train_units / std::max(train_s, 1e-9);
  result.wall_s = seconds_since(t_start);
  json summary = result.last_eval.values;
  summary.update({{"parameters", s.model->num_parameters()},
                  {"device", device_name(s.device)},
                  {"precision", precision_name(matmul_precision())},
                  {"steps", pos.step},
                  {"epochs_completed", epoch_position(*s.loader, pos.epoch, pos.batch)},
                  {"resumed_from_step", result.resumed ? json(result.start_step) : json(nullptr)},
                  {"wall_time_s", result.wall_s},
                  {"train_" + per_s, result.units_per_s},
                  {"checkpoint", ckpt}});
  if (result.skipped_steps > 0) summary["skipped_steps"] = result.skipped_steps;
  if (sel.have) {
    summary["best_" + s.select.metric] = sel.best;
    summary["best_step"] = sel.best_step;
    summary["best_checkpoint"] = ckpt + "/best";
    summary["stopped_early"] = result.stopped_early;
  }
  if (s.ema_decay > 0) summary["ema_decay"] = s.ema_decay;
  if (world > 1) {
    const double per_step = (comm_s + reducer->wait_seconds()) / std::max<double>(static_cast<double>(comm_steps), 1.0);
    summary["data_parallel"] = {{"ranks", world},
                                {"backend", dist::has_nccl() && s.device.is_cuda() ? "nccl" : "mpi"},
                                {"gradient_bytes", reducer->bytes_per_step()},
                                {"buckets", reducer->num_buckets()},
                                {"comm_wait_s_per_step", per_step}};
    if (main_rank)
      std::printf("%s: data parallel: %d ranks; per step %.2f ms waiting for collectives (%.1f MB of gradients)\n",
                  app.c_str(), world, 1e3 * per_step, static_cast<double>(reducer->bytes_per_step()) / 1e6);
  }
  summary.update(result.final_eval.values);
  if (hooks.summary && main_rank) hooks.summary(summary);
  if (main_rank) nn::write_text_file_atomic(o.out_dir + "/summary.json", summary.dump(2) + "\n");
  return result;
}

}  // namespace linea::apps
