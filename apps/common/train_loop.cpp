// The shared training loop (see train_loop.h). train() is the outline; TrainRun below holds the
// run's state and one method per piece of it. The state saved with a checkpoint lives in
// train_state.h, the reports in train_records.h, the data-parallel step in step_reducer.h and
// the captured steps in graph_steps.h.
#include "apps/common/train_loop.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <deque>
#include <filesystem>
#include <memory>

#include "apps/common/device.h"
#include "apps/common/graph_steps.h"
#include "apps/common/interrupt.h"
#include "apps/common/metrics.h"
#include "apps/common/progress.h"
#include "apps/common/step_reducer.h"
#include "apps/common/train_records.h"
#include "apps/common/train_state.h"
#include "autograd/autograd.h"
#include "core/random.h"
#include "core/readback.h"
#include "nn/checkpoint.h"
#include "nn/dist.h"
#include "nn/io_util.h"
#include "nn/safetensors.h"

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace linea::apps {

namespace {

using Clock = std::chrono::steady_clock;
std::string fmt(const char* f, double v) { return format_number(f, v); }

// A step whose loss, guard and stats are still on their way to the host: the loop queues their
// copies (AsyncRead) and looks at them kInFlight steps later, so the host never waits for the
// step it has just issued (the GPU has the next one queued when the host waits at all).
constexpr size_t kInFlight = 2;
struct PendingStep {
  int64_t step = 0, batch = 0, units = 0;            // the position after it; its units
  double lr = 0;                                     // its learning rate
  std::vector<std::pair<std::string, DType>> stats;  // the stats' names and dtypes
  AsyncRead values;                                  // loss, guard {norm, coef, ok}, the stats
};

// What a step asked of the GPU and how long the host took to issue it (--profile).
struct StepCounter {
  cuda::Counters before = cuda::counters();
  Clock::time_point start = Clock::now();
};

std::vector<Tensor> checked_parameters(const TrainSetup& setup, const TrainHooks& hooks) {
  LINEA_CHECK(setup.model && setup.optimizer && setup.loader && hooks.step && hooks.evaluate, setup.app,
              ": train() needs a model, an optimizer, a loader and the step and evaluate hooks");
  return setup.model->parameters();
}

// One training run: train()'s state and its pieces, in the order train() calls them.
class TrainRun {
 public:
  TrainRun(const TrainSetup& setup, const TrainHooks& hooks, const RunOptions& options);

  bool more_epochs() const;
  void begin_epoch();  // the loader at the epoch's first batch to run, the progress bar, the sums
  bool more_batches() const { return pos_.batch < epoch_.last; }
  // The step, queued on the device: learning rate, forward, backward (summed over the ranks),
  // the non-finite guard, the optimizer step and the moving average; its read-back queued.
  IssuedStep step(const nn::Batch& batch);
  // Settles the steps issued before the last `keep`: the guard's verdict, the running sums,
  // the step records and the progress bar.
  void settle(size_t keep);
  bool checkpoint_if_due();                          // every --checkpoint-every steps; true when saved
  void stop_if_interrupted(int signal, bool saved);  // SIGINT/SIGTERM during the step
  void count(const StepCounter& counter);            // --profile
  void end_epoch();                                  // evaluation, the epoch record, the checkpoint, curves.png
  void final_evaluation();                           // hooks.finish with the selected weights
  TrainResult summary();                             // summary.json

 private:
  IssuedStep update(const nn::Batch& batch);  // the uncaptured step (also what a graph captures)
  void settle_one();
  bool guard_passed(const PendingStep& p, const std::vector<double>& values);  // the non-finite guard
  void log_settled(const PendingStep& p);
  Metrics evaluate(const std::string& label);
  [[noreturn]] void stop_interrupted(int signal, bool saved);

  const TrainSetup& setup_;
  const TrainHooks& hooks_;
  const RunOptions& options_;
  const Clock::time_point t_start_ = Clock::now();
  const std::string ckpt_, per_s_;  // the checkpoint folder, e.g. "images_per_s"
  const std::vector<Tensor> params_;
  TrainResult result_;
  Position pos_;
  WeightAverage ema_;
  Selection sel_;
  InterruptGuard interrupt_guard_;
  std::unique_ptr<StepReducer> ranks_;
  std::unique_ptr<MetricsLog> metrics_;  // rank 0's
  std::unique_ptr<GraphSteps> graphs_;   // --cuda-graph
  bool warmed_up_ = false;               // --cuda-graph: one uncaptured step first
  int64_t stop_ = 0;                     // the step the run stops at (--max-steps or all epochs)
  double train_s_ = 0;
  int64_t train_units_ = 0;
  bool have_eval_ = false;

  struct Epoch {                         // the epoch in progress
    int64_t n = 0, first = 0, last = 0;  // its batches; it runs [first, last)
    std::string label;                   // "epoch 2/8"
    std::unique_ptr<ProgressBar> bar;
    RunningSums sums{false}, log_sums{false};  // since the epoch's start / the last step record
    ProfileSums log_profile;
    double lr = 0;
    int64_t first_units = 0;  // the first step's units: the bar's total is a guess from them
    Clock::time_point start;
    int stop_signal = 0;  // a signal during the epoch's last step: stop after its evaluation
    std::deque<PendingStep> pending;
  } epoch_;
};

}  // namespace

// ---- the loop ----
TrainResult train(const TrainSetup& setup, const TrainHooks& hooks, const RunOptions& options) {
  TrainRun run(setup, hooks, options);  // checks, --resume, the ranks, metrics.jsonl, CUDA graphs
  while (run.more_epochs()) {
    run.begin_epoch();
    nn::Batch batch;
    while (run.more_batches() && setup.loader->next(batch)) {
      const StepCounter counter;
      const IssuedStep issued = run.step(batch);  // nothing read back yet
      run.settle(kInFlight);                      // the step issued two before
      const bool saved = run.checkpoint_if_due();
      if (issued.interrupt) run.stop_if_interrupted(issued.interrupt, saved);
      run.count(counter);
    }
    run.settle(0);
    run.end_epoch();
  }
  run.final_evaluation();
  return run.summary();
}

namespace {

TrainRun::TrainRun(const TrainSetup& setup, const TrainHooks& hooks, const RunOptions& options)
    : setup_(setup),
      hooks_(hooks),
      options_(options),
      ckpt_(options.checkpoint()),
      per_s_(setup.unit + "_per_s"),
      params_(checked_parameters(setup, hooks)),
      ema_(*setup.model, setup.ema_decay),
      interrupt_guard_(setup.app) {
  const std::string& app = setup.app;
  const bool main_rank = !setup.data_parallel || dist::rank() == 0;  // before the ranks meet
  if (options.resume && nn::checkpoint_exists(ckpt_)) {
    pos_ = resume_checkpoint(setup, ckpt_, ema_, sel_);
    result_.resumed = true;
    if (main_rank)
      std::printf("%s: resumed from '%s' at step %lld\n", app.c_str(), ckpt_.c_str(),
                  static_cast<long long>(pos_.step));
  } else if (options.resume && main_rank) {
    std::printf("%s: --resume: no checkpoint in '%s' yet, starting from scratch\n", app.c_str(), ckpt_.c_str());
  }
  std::fflush(stdout);
  ranks_ = std::make_unique<StepReducer>(setup, pos_.step);
  if (ranks_->main_rank()) {
    std::error_code ec;
    fs::create_directories(options.out_dir, ec);
    LINEA_CHECK(!ec, app, ": cannot create the output folder '", options.out_dir, "' (--out): ", ec.message());
    metrics_ = std::make_unique<MetricsLog>(options.out_dir + "/metrics.jsonl", result_.resumed ? pos_.step : -1);
  }
  const int64_t total = planned_steps(*setup.loader, setup.epochs);
  stop_ = options.max_steps > 0 ? std::min(total, options.max_steps) : total;
  result_.start_step = pos_.step;
  setup.model->train();
  if (options.cuda_graph) {
    LINEA_CHECK(setup.device.is_cuda(), app, ": --cuda-graph needs --device cuda (a CUDA graph is the GPU's)");
    LINEA_CHECK(ranks_->world() == 1, app, ": --cuda-graph does not run data parallel (", ranks_->world(),
                " ranks): the gradient exchange is not captured; run without it");
    graphs_ = std::make_unique<GraphSteps>(setup.device);
  }
}

bool TrainRun::more_epochs() const {
  return pos_.epoch < setup_.epochs && pos_.step < stop_ && !sel_.patience_out(setup_.select.patience);
}

void TrainRun::begin_epoch() {
  Epoch& e = epoch_;
  e = Epoch();
  e.n = setup_.loader->num_batches(pos_.epoch);
  e.first = pos_.batch;
  e.last = std::min(e.n, e.first + (stop_ - pos_.step));
  if (setup_.on_epoch) setup_.on_epoch(pos_.epoch);
  setup_.loader->reset(pos_.epoch, e.first);
  e.label = "epoch " + std::to_string(pos_.epoch + 1) + "/" + std::to_string(setup_.epochs);
  if (options_.progress && ranks_->main_rank())
    e.bar = std::make_unique<ProgressBar>(e.label + " train", 0, setup_.unit_short);
  ranks_->begin_epoch(pos_.epoch);
  e.sums = e.log_sums = RunningSums(ranks_->world() > 1);
  e.start = Clock::now();
}

IssuedStep TrainRun::update(const nn::Batch& batch) {
  WholeStep whole = ranks_->forward_backward(hooks_.step, batch, pos_.batch);
  IssuedStep out;
  out.loss = whole.loss;
  out.units = whole.units;
  out.interrupt = whole.interrupt;
  for (const auto& [name, t] : whole.stats) out.stats.emplace_back(name, t.detach());
  // Clipping, the non-finite guard and the optimizer step, all on the device: a step whose loss
  // or gradient norm is not finite changes nothing (the settling says so, later).
  out.guard = nn::step_guard(params_, out.loss, setup_.clip);
  setup_.optimizer->step_guarded(out.guard);
  ema_.update(out.guard);
  return out;
}

IssuedStep TrainRun::step(const nn::Batch& batch) {
  epoch_.lr = nn::apply_schedule(*setup_.optimizer, setup_.schedule, pos_.step);
  IssuedStep issued;
  if (graphs_ && warmed_up_) {
    issued = graphs_->run(
        batch, *setup_.optimizer, [&](const nn::Batch& b) { return update(b); }, hooks_.units);
  } else {
    // The last step's gradients go before the forward, so that its blocks can serve it (a
    // captured step writes its own gradients, in its own memory, at every replay).
    setup_.optimizer->zero_grad();
    issued = update(batch);
    warmed_up_ = true;
  }
  ++pos_.step, ++pos_.batch;
  PendingStep p{pos_.step, pos_.batch, issued.units, epoch_.lr, {}, {}};
  std::vector<Tensor> reads = {issued.loss, issued.guard};
  for (const auto& [name, t] : issued.stats) {
    p.stats.emplace_back(name, t.dtype());
    reads.push_back(t);
  }
  p.values = AsyncRead(reads);
  epoch_.pending.push_back(std::move(p));
  if (epoch_.first_units == 0 && issued.units > 0 && epoch_.bar) {
    epoch_.first_units = issued.units;
    epoch_.bar->set_total(issued.units * epoch_.last);
  }
  return issued;
}

void TrainRun::settle(size_t keep) {
  while (epoch_.pending.size() > keep) settle_one();
}

// Which steps settle when depends only on the step count, so data-parallel ranks meet in the
// same collectives.
void TrainRun::settle_one() {
  const PendingStep p = std::move(epoch_.pending.front());
  epoch_.pending.pop_front();
  const std::vector<double> v = p.values.values();  // waits only if the copies are not done
  const double loss = v[0];
  result_.step_losses.push_back(loss);
  result_.step_done_s.push_back(seconds_since(t_start_));
  if (guard_passed(p, v)) {
    epoch_.sums.add(loss, p.stats, v.data() + 4, p.units);
    epoch_.log_sums.add(loss, p.stats, v.data() + 4, p.units);
  }
  log_settled(p);
}

// The guard's verdict (v[3] of the read-back): an error naming the step, or a skip within
// --skip-nonfinite (its update was already withheld on the device).
bool TrainRun::guard_passed(const PendingStep& p, const std::vector<double>& v) {
  if (v[3] != 0.0) return true;
  const double loss = v[0], grad_norm = v[1];
  const std::string what = "step " + std::to_string(p.step) + ": non-finite loss (" + fmt("%g", loss) +
                           ") or gradient norm (" + fmt("%g", grad_norm) + ")";
  LINEA_CHECK(result_.skipped_steps < options_.skip_nonfinite, setup_.app, ": ", what, "; stopped (",
              nn::checkpoint_exists(ckpt_) ? "the checkpoint in '" + ckpt_ + "' is the last good one"
                                           : "no checkpoint was written yet",
              "; --skip-nonfinite N skips up to N such steps)");
  ++result_.skipped_steps;
  if (ranks_->main_rank())
    std::fprintf(stderr, "%s: %s: skipped (%lld of --skip-nonfinite %lld)\n", setup_.app.c_str(), what.c_str(),
                 static_cast<long long>(result_.skipped_steps), static_cast<long long>(options_.skip_nonfinite));
  if (metrics_)
    metrics_->write(
        {{"type", "skipped"}, {"step", p.step}, {"epoch", pos_.epoch + 1}, {"loss", loss}, {"grad_norm", grad_norm}});
  return false;
}

// The progress bar every 10 batches and a "step" record every --log-every steps. (Under data
// parallelism every rank reads the stats at the same steps: a collective.)
void TrainRun::log_settled(const PendingStep& p) {
  Epoch& e = epoch_;
  const bool several = ranks_->world() > 1;
  const bool log_now = options_.log_every > 0 && p.step % options_.log_every == 0;
  if (!(log_now || ((e.bar || several) && (p.batch - e.first) % 10 == 0) || p.batch == e.last)) return;
  const double secs = seconds_since(e.start);
  if (e.bar || several) {
    const std::string stats = stats_text(hooks_, e.sums.stat_means());
    if (e.bar)
      e.bar->update(e.first * e.first_units + e.sums.units(),
                    "loss " + fmt("%.4f", e.sums.mean_loss()) + "  " + stats + "  lr " + fmt("%.2e", p.lr));
  }
  if (!log_now || e.log_sums.steps() == 0) return;
  json rec = {{"type", "step"},
              {"step", p.step},
              {"epoch", pos_.epoch + 1},
              {"epoch_progress", epoch_position(*setup_.loader, pos_.epoch, p.batch)},
              {"lr", p.lr},
              {"loss", e.log_sums.mean_loss()},
              {per_s_, e.sums.units() / std::max(secs, 1e-9)}};
  for (const auto& [name, value] : e.log_sums.stat_means()) rec[name] = value;
  if (options_.profile && setup_.device.is_cuda()) rec["cuda_per_step"] = e.log_profile.per_step();
  if (metrics_) metrics_->write(rec);
  e.log_sums = RunningSums(several);
  e.log_profile = ProfileSums();
}

// Mid-epoch checkpoints (every rank settles, so that they agree on the guard); the one at the
// epoch's end is saved after its evaluation.
bool TrainRun::checkpoint_if_due() {
  const int64_t every = options_.checkpoint_every;
  const bool due = every > 0 && pos_.step % every == 0 && pos_.batch != epoch_.n && pos_.step < stop_;
  if (!due) return false;
  settle(0);
  if (ranks_->main_rank()) save_checkpoint(setup_, ckpt_, pos_, ema_, sel_);
  return true;
}

// After the epoch's last step, the evaluation and the epoch's checkpoint come first (a
// checkpoint never resumes into an epoch that is done but not evaluated).
void TrainRun::stop_if_interrupted(int signal, bool saved) {
  if (pos_.batch == epoch_.last) {
    epoch_.stop_signal = signal;
    return;
  }
  settle(0);
  stop_interrupted(signal, saved);
}

// The checkpoint of the step just done, an "interrupted" record, then Interrupted, on every
// rank (they agreed on the step).
void TrainRun::stop_interrupted(int signal, bool saved) {
  if (ranks_->main_rank() && !saved) save_checkpoint(setup_, ckpt_, pos_, ema_, sel_);
  if (metrics_) metrics_->write({{"type", "interrupted"}, {"step", pos_.step}, {"signal", signal_name(signal)}});
  throw Interrupted(setup_.app + ": " + signal_name(signal) + ": stopped after step " + std::to_string(pos_.step) +
                        "; the checkpoint in '" + ckpt_ + "' holds it: run the same command with --resume to continue",
                    signal);
}

// This step's counters, its settling and checkpoint included.
void TrainRun::count(const StepCounter& counter) {
  const cuda::Counters c = cuda::counters() - counter.before;
  const double host_s = seconds_since(counter.start);
  result_.step_counters.push_back(c);
  if (!options_.profile) return;
  epoch_.log_profile.add(c, host_s);
  if (ranks_->main_rank())
    std::fprintf(stderr, "%s: step %lld: %s; host %.2f ms\n", setup_.app.c_str(), static_cast<long long>(pos_.step),
                 c.str().c_str(), 1e3 * host_s);
}

// Evaluations see the moving average when there is one. Rank 0 evaluates; the others get its
// results, so that model selection and early stopping decide the same on every rank.
Metrics TrainRun::evaluate(const std::string& label) {
  const bool main_rank = ranks_->main_rank();
  Metrics m;
  if (main_rank) {
    ema_.swap();
    m = evaluate_forked(*setup_.model, setup_.device, [&] { return hooks_.evaluate(label); });
  }
  m = ranks_->from_main_rank(m);
  const std::string& metric = setup_.select.metric;
  if (!metric.empty() && m.values.contains(metric)) {
    const double v = m.values.at(metric).get<double>();
    if (sel_.consider(v, setup_.select.maximize, pos_.step) && main_rank)
      save_best(setup_, ckpt_ + "/best", pos_.step, v);
  }
  if (main_rank) ema_.swap();
  return m;
}

void TrainRun::end_epoch() {
  Epoch& e = epoch_;
  const bool main_rank = ranks_->main_rank();
  const double epoch_s = seconds_since(e.start), rate = e.sums.units() / std::max(epoch_s, 1e-9);
  train_s_ += epoch_s;
  train_units_ += e.sums.units();
  const double train_loss = e.sums.mean_loss();
  const std::map<std::string, double> train_stats = e.sums.stat_means();
  if (e.bar) e.bar->finish("loss " + fmt("%.4f", train_loss) + "  " + stats_text(hooks_, train_stats));
  result_.last_eval = evaluate(e.label + " test");
  have_eval_ = true;
  const bool epoch_done = pos_.batch == e.n;
  const double epoch_pos = epoch_position(*setup_.loader, pos_.epoch, pos_.batch);
  if (epoch_done) pos_.epoch += 1, pos_.batch = 0;
  if (main_rank)
    std::printf("%s  train loss %.4f %s  %s  %.0f %s/s  lr %.2e  [%s]%s\n", e.label.c_str(), train_loss,
                stats_text(hooks_, train_stats).c_str(), result_.last_eval.text.c_str(), rate,
                setup_.unit_short.c_str(), e.lr, format_duration(seconds_since(t_start_)).c_str(),
                epoch_done ? "" : "  (partial epoch)");
  std::fflush(stdout);
  json rec = {{"type", "epoch"},
              {"step", pos_.step},
              {"epoch", epoch_pos},
              {"lr", e.lr},
              {"train_loss", train_loss},
              {per_s_, rate},
              {"elapsed_s", seconds_since(t_start_)}};
  for (const auto& [name, v] : train_stats) rec["train_" + name] = v;
  rec.update(result_.last_eval.values);
  if (metrics_) metrics_->write(rec);
  if (main_rank) save_checkpoint(setup_, ckpt_, pos_, ema_, sel_);
  if (options_.plot && main_rank) draw_curves(setup_, options_.out_dir);
  // A signal during the last step or the evaluation: the checkpoint above holds the epoch. (With
  // several ranks, one during the evaluation is seen in the next step's sums, where they agree.)
  if (ranks_->world() == 1 && !e.stop_signal) e.stop_signal = pending_interrupt();
  if (e.stop_signal) stop_interrupted(e.stop_signal, /*saved=*/true);
}

void TrainRun::final_evaluation() {
  const bool main_rank = ranks_->main_rank();
  result_.stopped_early = sel_.patience_out(setup_.select.patience) && pos_.step < stop_ && pos_.epoch < setup_.epochs;
  if (result_.stopped_early && main_rank)
    std::printf("%s: stopped early: no better %s in %lld evaluations (best %s at step %lld)\n", setup_.app.c_str(),
                setup_.select.metric.c_str(), static_cast<long long>(sel_.since), fmt("%.4g", sel_.best).c_str(),
                static_cast<long long>(sel_.best_step));
  if (!have_eval_) {  // resumed after the last step: evaluate the final model once more for the summary
    result_.last_eval = evaluate("test");
    if (options_.plot && main_rank) draw_curves(setup_, options_.out_dir);
  }
  if (sel_.have) result_.best_value = sel_.best, result_.best_step = sel_.best_step;
  if (!hooks_.finish) return;
  // The selected weights: the best evaluation's, else the moving average, else the last.
  if (main_rank) {
    if (sel_.have) {
      NoGradGuard ng;
      nn::load_module(ckpt_ + "/best/model.safetensors", *setup_.model);
    } else {
      ema_.swap();
    }
    result_.final_eval = evaluate_forked(*setup_.model, setup_.device, hooks_.finish);
    if (!result_.final_eval.text.empty()) std::printf("%s: %s\n", setup_.app.c_str(), result_.final_eval.text.c_str());
    std::fflush(stdout);
  }
  result_.final_eval = ranks_->from_main_rank(result_.final_eval);
}

TrainResult TrainRun::summary() {
  result_.final_step = pos_.step;
  result_.units_per_s = train_units_ / std::max(train_s_, 1e-9);
  result_.wall_s = seconds_since(t_start_);
  json summary = result_.last_eval.values;
  summary.update({{"parameters", setup_.model->num_parameters()},
                  {"device", device_name(setup_.device)},
                  {"precision", precision_name(matmul_precision())},
                  {"steps", pos_.step},
                  {"epochs_completed", epoch_position(*setup_.loader, pos_.epoch, pos_.batch)},
                  {"resumed_from_step", result_.resumed ? json(result_.start_step) : json(nullptr)},
                  {"wall_time_s", result_.wall_s},
                  {"train_" + per_s_, result_.units_per_s},
                  {"checkpoint", ckpt_}});
  if (result_.skipped_steps > 0) summary["skipped_steps"] = result_.skipped_steps;
  if (sel_.have) {
    summary["best_" + setup_.select.metric] = sel_.best;
    summary["best_step"] = sel_.best_step;
    summary["best_checkpoint"] = ckpt_ + "/best";
    summary["stopped_early"] = result_.stopped_early;
  }
  if (setup_.ema_decay > 0) summary["ema_decay"] = setup_.ema_decay;
  ranks_->report(summary);
  summary.update(result_.final_eval.values);
  if (hooks_.summary && ranks_->main_rank()) hooks_.summary(summary);
  if (ranks_->main_rank()) nn::write_text_file_atomic(options_.out_dir + "/summary.json", summary.dump(2) + "\n");
  return result_;
}

}  // namespace

int64_t planned_steps(const nn::DataLoader& loader, int64_t epochs) {
  int64_t n = 0;
  for (int64_t e = 0; e < epochs; ++e) n += loader.num_batches(e);
  return n;
}

Metrics evaluate_forked(nn::Module& model, Device device, const std::function<Metrics()>& evaluate) {
  NoGradGuard no_grad;
  model.eval();
  // Evaluation may sample (e.g. unbiased RA in eval): on a fork, so the training run's random
  // stream is the same with or without evaluations, and a resume matches wherever they happened.
  const ForkRng fork(device);
  Metrics m = evaluate();
  model.train();
  return m;
}

}  // namespace linea::apps
