// The protein app's training run (see train.h): what is about proteins lives here (the splits,
// the masked loss, the evaluations; their accuracy, perplexity and baseline in metrics.h); the
// loop is apps/common/train_loop.
#include "train.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <tuple>

#include "alphabet.h"
#include "apps/common/app_run.h"
#include "apps/common/device.h"
#include "apps/common/metrics.h"
#include "apps/common/prepared_data.h"
#include "apps/common/progress.h"
#include "apps/common/train_loop.h"
#include "autograd/ops.h"
#include "core/error.h"
#include "core/random.h"
#include "core/runtime.h"
#include "metrics.h"
#include "nn/checkpoint.h"
#include "nn/io_util.h"
#include "nn/optim.h"
#include "nn/sampler.h"
#include "predictor.h"

using namespace linea;
using json = nlohmann::json;

namespace protein {

namespace {

std::string fmt(const char* f, double v) { return apps::format_number(f, v); }

// Scores every chosen position of `data` (evaluation masks, fixed by seed): the model's
// log-probabilities come to the host and are tallied there.
Tally evaluate_split(ProteinLM& model, const MaskedLMDataset& data, const Unigram& unigram, int64_t max_tokens,
                     Device device) {
  nn::TokenBudgetBatchSampler sampler(data.lengths(), {max_tokens, 0, /*shuffle=*/false, 0});
  Tally t;
  for (const auto& idx : sampler.batches(0)) {
    const nn::Batch b = data.get_batch(idx);
    const Tensor lp = log_softmax(model.forward(b.at("tokens").to(device), b.at("pad").to(device)), -1)
                          .to(kCPU).contiguous();
    const Tensor targets = b.at("targets").contiguous();
    t.add(lp.data<float>(), targets.data<int64_t>(), targets.numel(), unigram);
  }
  return t;
}

}  // namespace

NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(TrainOptions, pack, max_tokens, epochs, lr, schedule, warmup, weight_decay, clip,
                                   ema, patience)

TrainReport run_training(const TrainOptions& o) {
  const apps::RunOptions& run = o.run;
  const Device device = apps::start_run("protein", run, kConfigFormat);
  const std::string ckpt_dir = run.checkpoint();
  LINEA_CHECK(o.pack == 0 || o.pack >= 3, "protein: --pack ", o.pack, " must be 0 (off) or at least 3 tokens");

  // ---- data ----
  const Manifest data = read_manifest(o.data_dir);
  auto train_seqs = std::make_shared<const Sequences>(read_sequences(split_path(data, "train")));
  auto valid_seqs = std::make_shared<const Sequences>(read_sequences(split_path(data, "valid")));
  auto test_seqs = std::make_shared<const Sequences>(read_sequences(split_path(data, "test")));
  const std::string query_path = split_path(data, "query");
  auto query_seqs = query_path.empty() ? nullptr : std::make_shared<const Sequences>(read_sequences(query_path));
  LINEA_CHECK(train_seqs->size() > 0 && valid_seqs->size() > 0 && test_seqs->size() > 0, "protein: '", o.data_dir,
              "' needs sequences in train, valid and test; it has ", train_seqs->size(), ", ", valid_seqs->size(),
              " and ", test_seqs->size());
  const Unigram unigram(*train_seqs);
  const std::string split_method = data.json.at("split").value("method", std::string("?"));

  ModelConfig mc = o.model;
  if (o.pack > 0) mc.max_len = o.pack;  // packed windows are the model's context
  DatasetOptions train_opts;
  train_opts.max_len = mc.max_len;
  train_opts.pack = o.pack;
  train_opts.train = true;
  train_opts.masking = o.masking;
  train_opts.seed = run.seed;
  // Evaluation masks come from the data's seed, not the run's: every run on the same data is
  // scored on the same positions.
  DatasetOptions eval_opts = train_opts;
  eval_opts.train = false;
  eval_opts.seed = data.json.at("split").value("seed", uint64_t{0});
  if (run.eval_only) {  // the checkpoint's windows: its positions decide them, not the flags
    const json saved = linea::apps::read_checkpoint_config(ckpt_dir, "protein", kConfigFormat);
    try {
      eval_opts.max_len = saved.at("model").at("max_len");
      eval_opts.pack = saved.at("run").value("pack", int64_t{0});
    } catch (const json::exception& e) {
      LINEA_FAIL("protein: --eval-only: '", ckpt_dir, "/config.json' is malformed: ", e.what());
    }
  }
  auto train_set = std::make_shared<MaskedLMDataset>(train_seqs, train_opts);
  const MaskedLMDataset valid_set(valid_seqs, eval_opts), test_set(test_seqs, eval_opts);
  std::unique_ptr<MaskedLMDataset> query_set;
  if (query_seqs) query_set = std::make_unique<MaskedLMDataset>(query_seqs, eval_opts);

  // ---- the checkpoint's config ----
  json run_cfg = o;
  run_cfg.update({{"data", apps::recorded_data_dir(o.data_dir)},
                  {"train_sequences", train_seqs->size()},
                  {"mask_prob", o.masking.prob},
                  {"mask_token", o.masking.mask_token},
                  {"random_token", o.masking.random_token},
                  {"seed", run.seed}});
  json config = {{"format", kConfigFormat}, {"model", mc}, {"data", data.json}, {"run", run_cfg}};

  // ---- model and optimizer ----
  manual_seed(run.seed);
  auto model = std::make_shared<ProteinLM>(mc);
  model->to(device);
  // No decay on embeddings and positions, as on biases and norms.
  nn::AdamW opt(nn::decay_groups(*model, o.lr, o.weight_decay, {"embed", "pos"}), 0.9, 0.98, 1e-8);

  std::printf("protein: %lld train / %lld valid / %lld test%s sequences from %s (%s split), %s\n",
              static_cast<long long>(train_seqs->size()), static_cast<long long>(valid_seqs->size()),
              static_cast<long long>(test_seqs->size()),
              query_seqs ? (" / " + std::to_string(query_seqs->size()) + " query").c_str() : "", o.data_dir.c_str(),
              split_method.c_str(),
              o.pack > 0 ? ("packed into windows of " + std::to_string(o.pack) + " tokens").c_str()
                         : ("windows of at most " + std::to_string(mc.max_len) + " tokens").c_str());
  std::printf("protein: transformer %lld layers, dim %lld, %lld heads, mlp %lld, %s attention, %s positions: %lld "
              "parameters\n",
              static_cast<long long>(mc.layers), static_cast<long long>(mc.dim), static_cast<long long>(mc.heads),
              static_cast<long long>(mc.mlp_hidden), mc.attention.c_str(), mc.positions.c_str(),
              static_cast<long long>(model->num_parameters()));
  std::printf("protein: device %s\n", apps::device_name(device).c_str());
  std::fflush(stdout);

  // ---- evaluations ----
  auto validate = [&](const std::string&) {
    const Tally t = evaluate_split(*model, valid_set, unigram, o.eval_max_tokens, device);
    apps::Metrics m;
    m.values = tally_json("valid", t, false);
    m.text = tally_text("valid", t);
    return m;
  };
  // The final evaluation of `m`: test and query beside the baseline on the same positions.
  auto final_eval = [&](ProteinLM& m) {
    apps::Metrics r;
    const Tally vt = evaluate_split(m, valid_set, unigram, o.eval_max_tokens, device);
    const Tally tt = evaluate_split(m, test_set, unigram, o.eval_max_tokens, device);
    r.values = tally_json("valid", vt, true);
    r.values.update(tally_json("test", tt, true));
    r.values["baseline_masked_accuracy"] = tt.baseline_accuracy();
    r.values["baseline_perplexity"] = tt.baseline_perplexity();
    r.values["test_accuracy_over_baseline"] = tt.accuracy() / std::max(tt.baseline_accuracy(), 1e-12);
    r.values["test_perplexity_below_baseline"] = tt.baseline_perplexity() - tt.perplexity();
    r.text = tally_text("test", tt);
    if (query_set) {
      const Tally qt = evaluate_split(m, *query_set, unigram, o.eval_max_tokens, device);
      r.values.update(tally_json("query", qt, true));
      r.text += "; " + tally_text("query", qt);
    }
    return r;
  };

  TrainReport report;
  auto fill_report = [&](const json& v) {
    report.test_masked_accuracy = v.value("test_masked_accuracy", 0.0);
    report.test_perplexity = v.value("test_perplexity", 0.0);
    report.baseline_masked_accuracy = v.value("baseline_masked_accuracy", 0.0);
    report.baseline_perplexity = v.value("baseline_perplexity", 0.0);
  };
  if (run.eval_only) {  // the best weights of the checkpoint (else its last)
    fill_report(apps::eval_only("protein", run, [&](const std::string& dir) {
                  Predictor loaded = Predictor::load(dir, device);
                  return apps::evaluate_forked(loaded.model(), device, [&] { return final_eval(loaded.model()); });
                }).values);
    return report;
  }

  // ---- the shared loop ----
  std::shared_ptr<nn::BatchSampler> sampler;
  if (o.pack > 0) {  // equal-length windows: a fixed number per batch
    sampler = std::make_shared<nn::FixedSizeBatchSampler>(train_set->size(), std::max<int64_t>(1, o.max_tokens / o.pack),
                                                          true, run.seed);
  } else {
    sampler = std::make_shared<nn::TokenBudgetBatchSampler>(train_set->lengths(),
                                                            nn::TokenBudgetOptions{o.max_tokens, 0, true, run.seed});
  }
  nn::DataLoader loader(train_set, sampler);
  const int64_t total_steps = apps::planned_steps(loader, o.epochs);

  apps::TrainSetup setup;
  setup.app = "protein";
  setup.unit = "residues";
  setup.unit_short = "res";
  setup.model = model.get();
  setup.optimizer = &opt;
  // A run shorter than the warmup warms up over all of its steps.
  setup.schedule = nn::make_schedule(o.schedule, o.lr, std::min(o.warmup, total_steps), total_steps);
  setup.clip = o.clip;
  setup.loader = &loader;
  setup.epochs = o.epochs;
  setup.device = device;
  setup.config = config;
  setup.resume_keys = {"model", "run"};
  setup.on_epoch = [&](int64_t epoch) { train_set->set_epoch(epoch); };
  setup.ema_decay = o.ema;
  setup.select = {"valid_perplexity", false, o.patience};
  setup.curves = {"protein: " + mc.attention + " attention, masked-LM loss and valid accuracy",
                  "train loss (masked positions)",
                  "valid_loss",
                  "valid_masked_accuracy",
                  100,
                  "loss (nats per masked residue)",
                  ""};

  apps::TrainHooks hooks;
  // Residues in a batch (the throughput unit) and chosen positions (the loss's denominator, and
  // the batch's weight under data parallelism), counted on the host where the batch was made.
  const auto units_of = [](const nn::Batch& b) {
    const Tensor& tokens = b.at("tokens");
    const int64_t residues = static_cast<int64_t>(
        sum(logical_and(logical_and(tokens != static_cast<double>(kPad), tokens != static_cast<double>(kCls)),
                        tokens != static_cast<double>(kEos)))
            .item());
    const int64_t chosen = static_cast<int64_t>(sum(b.at("targets") != static_cast<double>(kPad)).item());
    return std::pair<int64_t, double>(residues, static_cast<double>(chosen));
  };
  hooks.step = [&](const nn::Batch& b) {
    const Tensor tgt = b.at("targets").to(device);
    const Tensor logits = model->forward(b.at("tokens").to(device), b.at("pad").to(device));
    const Tensor nll = cross_entropy(logits, tgt, kPad, 0.0, Reduction::Sum);
    apps::StepResult r;
    // The mean over chosen positions (a batch without any, possible with tiny sequences, adds 0),
    // their count taken on the device, so that a captured step (--cuda-graph) divides by each
    // batch's own: nll * (1 / max(count, 1)), the reciprocal in double as a host division.
    const TensorOptions f64(DType::Float64, device);
    const Tensor chosen = sum(tgt != static_cast<double>(kPad)).to(DType::Float64);
    r.loss = nll * (full({}, 1.0, f64) / maximum(chosen, full({}, 1.0, f64))).to(nll.dtype());
    if (b.at("tokens").is_cpu()) std::tie(r.units, r.weight) = units_of(b);  // else hooks.units counts
    r.stats["nll"] = nll.detach();
    r.stats["chosen"] = chosen.to(DType::Float32);
    r.stats["correct"] = sum(argmax(logits.detach(), -1) == tgt);
    return r;
  };
  hooks.units = units_of;
  hooks.evaluate = validate;
  // The stats are sums per residue; their ratios are per chosen position.
  hooks.format_stats = [](const std::map<std::string, double>& s) {
    const double chosen = std::max(s.at("chosen"), 1e-12);
    return "acc " + fmt("%.2f%%", 100 * s.at("correct") / chosen) + " ppl " + fmt("%.3f", std::exp(s.at("nll") / chosen));
  };
  hooks.finish = [&] { return final_eval(*model); };
  hooks.summary = [&](json& summary) { summary.update({{"model", mc}, {"run", run_cfg}, {"data", data.json}}); };
  const apps::TrainResult tr = apps::train(setup, hooks, run);

  fill_report(tr.final_eval.values);
  report.steps = tr.final_step;
  report.train_residues_per_s = tr.units_per_s;
  apps::report_run(setup, run, tr,
                   "test masked accuracy " + fmt("%.2f%%", 100 * report.test_masked_accuracy) + ", perplexity " +
                       fmt("%.3f", report.test_perplexity) + "; baseline " +
                       fmt("%.2f%%", 100 * report.baseline_masked_accuracy) + ", " +
                       fmt("%.3f", report.baseline_perplexity) + "; best valid perplexity " +
                       fmt("%.3f", tr.best_value) + " at step " + std::to_string(tr.best_step));
  return report;
}

}  // namespace protein
