// The shared training loop (train_loop.h) on a tiny classifier (a Linear layer on generated
// points): it trains and writes metrics.jsonl, summary.json and checkpoints (config.json inside),
// each step at its scheduled learning rate; a mid-epoch resume continues bit for bit, dropping the
// records written after the checkpoint (and one saved without its position in the epoch, as older
// runs were, continues from its step); a resume of a finished run only evaluates; a resume with
// another run-defining setting is refused listing the difference; a non-finite loss stops the run
// naming the step and leaves the last checkpoint as it was; --skip-nonfinite skips such steps and
// logs them (their losses in no mean); a signal during a step or an evaluation saves and stops,
// and the run resumes bit for bit; the token-budget sampler
// drives epoch lengths and throughput in its own unit; attention mechanisms that redraw their
// features on a schedule (performer, nprf_rpe with redraw=3) resume bit for bit too; the moving
// average of the weights and model selection (best folder, early stopping, the finish hook) work
// and resume exactly; and those two on their own (their warm-up, withheld steps, ties, saved state).
#include <gtest/gtest.h>

#include <signal.h>
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>

#include "apps/common/interrupt.h"
#include "apps/common/metrics.h"
#include "apps/common/train_loop.h"
#include "apps/common/train_state.h"
#include "attention/multihead.h"
#include "autograd/ops.h"
#include "core/random.h"
#include "nn/checkpoint.h"
#include "nn/layers.h"
#include "nn/safetensors.h"
#include "tests/test_util.h"

using namespace linea;
using json = nlohmann::json;
namespace fs = std::filesystem;

namespace {

using linea::test::TempDir;

// 3 classes of 2-d points around three centres.
std::shared_ptr<nn::TensorDataset> points(int64_t n) {
  std::vector<float> x;
  std::vector<int64_t> y;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t c = i % 3;
    const double a = 2.0944 * c, r = 0.3 * std::sin(i * 1.7);
    x.push_back(static_cast<float>(std::cos(a) + r));
    x.push_back(static_cast<float>(std::sin(a) - r));
    y.push_back(c);
  }
  return std::make_shared<nn::TensorDataset>(from_vector<float>(x, {n, 2}), from_vector<int64_t>(y, {n}));
}

struct LoopRun {
  std::vector<float> weights;
  apps::TrainResult result;
};

// Softmax regression Linear(2, 3) on 60 points, batches of 8 (7 per epoch, last dropped), with
// input noise from the global RNG (so a resume must restore it). nan_at_step > 0: that step's loss is NaN.
// tweak: changes the setup and hooks before training (moving average, model selection, ...).
using Tweak = std::function<void(apps::TrainSetup&, apps::TrainHooks&, nn::Module& model)>;
LoopRun train_points(const apps::RunOptions& o, double lr = 0.1, int64_t nan_at_step = 0, int64_t epochs = 3,
                     const Tweak& tweak = nullptr) {
  manual_seed(o.seed);
  auto data = points(60);
  auto model = std::make_shared<nn::Linear>(2, 3);
  nn::AdamW opt({nn::ParamGroup{model->parameters(), lr, 0.0}});
  nn::DataLoader loader(data, std::make_shared<nn::FixedSizeBatchSampler>(60, 8, true, o.seed, true));
  apps::TrainSetup s;
  s.app = "points";
  s.unit = "points";
  s.model = model.get();
  s.optimizer = &opt;
  s.schedule = nn::WarmupCosine(lr, 2, apps::planned_steps(loader, epochs));
  s.clip = 1.0;
  s.loader = &loader;
  s.epochs = epochs;
  s.config = {{"run", {{"lr", lr}, {"epochs", epochs}}}, {"note", "free"}};
  s.resume_keys = {"run"};
  s.files["labels.txt"] = "a\nb\nc\n";
  int64_t steps_seen = 0;
  apps::TrainHooks h;
  h.step = [&](const nn::Batch& b) {
    Tensor x = b.at("input") + 0.01 * randn({b.at("input").size(0), 2});
    Tensor logits = (*model)(x);
    apps::StepResult r;
    r.loss = cross_entropy(logits, b.at("target"));
    if (++steps_seen == nan_at_step) r.loss = r.loss * std::numeric_limits<double>::quiet_NaN();
    r.units = x.size(0);
    r.stats["accuracy"] = sum(eq(argmax(logits.detach(), 1), b.at("target")));
    return r;
  };
  h.evaluate = [&](const std::string&) {
    Tensor logits = (*model)(data->inputs());
    const double acc = mean(eq(argmax(logits, 1), data->targets()).to(DType::Float64)).item();
    return apps::Metrics{{{"test_accuracy", acc}}, "acc " + std::to_string(acc)};
  };
  h.summary = [](json& j) { j["app_field"] = 1; };
  if (tweak) tweak(s, h, *model);
  LoopRun run;
  run.result = apps::train(s, h, o);
  run.weights = model->parameters()[0].to_vector<float>();
  return run;
}

// Epoch e has 5 + 2e batches of 8 points (5, 7, 9, ...): epochs differ in length, as a token
// budget's do.
struct GrowingEpochs : nn::BatchSampler {
  std::vector<std::vector<int64_t>> batches(int64_t epoch) const override {
    std::vector<std::vector<int64_t>> b(5 + 2 * epoch);
    for (size_t k = 0; k < b.size(); ++k)
      for (int64_t j = 0; j < 8; ++j) b[k].push_back((static_cast<int64_t>(k) * 8 + j + 13 * epoch) % 60);
    return b;
  }
  int64_t num_examples() const override { return 60; }
};

Tweak growing_epochs() {
  auto loader = std::make_shared<nn::DataLoader>(points(60), std::make_shared<GrowingEpochs>());
  return [loader](apps::TrainSetup& s, apps::TrainHooks&, nn::Module&) {
    s.loader = loader.get();
    s.schedule = nn::WarmupCosine(0.1, 2, apps::planned_steps(*loader, s.epochs));
  };
}

// A sequence classifier with one attention layer: 5 noisy points of a class -> Linear(2, 8) ->
// MultiHeadAttention(8, 2, spec) -> mean over the points -> Linear(8, 3).
class SeqClassifier : public nn::Module {
 public:
  explicit SeqClassifier(const std::string& spec) : Module("SeqClassifier") {
    in_ = register_module("in", std::make_shared<nn::Linear>(2, 8));
    attn_ = register_module("attn", std::make_shared<attn::MultiHeadAttention>(8, 2, spec));
    out_ = register_module("out", std::make_shared<nn::Linear>(8, 3));
  }
  Tensor forward(const Tensor& x) {  // [B, 5, 2] -> [B, 3]
    Tensor h = in_->forward(x);
    return out_->forward(mean(attn_->forward(h, h), {1}));
  }

 private:
  std::shared_ptr<nn::Linear> in_, out_;
  std::shared_ptr<attn::MultiHeadAttention> attn_;
};

LoopRun train_sequences(const apps::RunOptions& o, const std::string& spec) {
  manual_seed(o.seed);
  auto flat = points(300);  // 60 sequences of 5 points of one class
  Tensor x = reshape(flat->inputs(), {60, 5, 2}), y = contiguous(slice(flat->targets(), 0, 0, 300, 5));
  auto data = std::make_shared<nn::TensorDataset>(contiguous(x), y);
  auto model = std::make_shared<SeqClassifier>(spec);
  nn::AdamW opt({nn::ParamGroup{model->parameters(), 0.01, 0.0}});
  nn::DataLoader loader(data, std::make_shared<nn::FixedSizeBatchSampler>(60, 8, true, o.seed, true));
  apps::TrainSetup s;
  s.app = "seq";
  s.model = model.get();
  s.optimizer = &opt;
  s.schedule = nn::ConstantLR(0.01);
  s.loader = &loader;
  s.epochs = 3;
  apps::TrainHooks h;
  h.step = [&](const nn::Batch& b) {
    apps::StepResult r;
    r.loss = cross_entropy(model->forward(b.at("input")), b.at("target"));
    r.units = b.at("input").size(0);
    return r;
  };
  h.evaluate = [&](const std::string&) {
    const double loss = cross_entropy(model->forward(data->inputs()), data->targets()).item();
    return apps::Metrics{{{"test_loss", loss}}, ""};
  };
  LoopRun run;
  run.result = apps::train(s, h, o);
  for (const Tensor& p : model->parameters())
    for (float v : p.to_vector<float>()) run.weights.push_back(v);
  return run;
}

apps::RunOptions options(const fs::path& out) {
  apps::RunOptions o;
  o.device = "cpu";
  o.out_dir = out.string();
  o.progress = false;
  o.plot = false;
  o.log_every = 2;
  o.checkpoint_every = 0;
  o.seed = 7;
  return o;
}

std::vector<json> records(const fs::path& out, const std::string& type) {
  std::vector<json> r;
  for (const json& j : apps::MetricsLog::read((out / "metrics.jsonl").string()))
    if (j.value("type", "") == type) r.push_back(j);
  return r;
}

std::string read_text(const fs::path& p) {
  std::ifstream f(p);
  return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

}  // namespace

TEST(TrainLoop, TrainsAndWritesRecordsSummaryAndCheckpoint) {
  TempDir dir;
  LoopRun r = train_points(options(dir.path / "out"));
  ASSERT_EQ(r.result.step_losses.size(), 21u);  // 3 epochs x 7 batches
  EXPECT_LT(r.result.step_losses.back(), r.result.step_losses.front());
  EXPECT_EQ(r.result.final_step, 21);
  EXPECT_GT(r.result.last_eval.values.at("test_accuracy").get<double>(), 0.9);
  auto steps = records(dir.path / "out", "step");
  ASSERT_EQ(steps.size(), 10u);  // every 2 steps
  for (const char* k : {"step", "epoch", "epoch_progress", "lr", "loss", "accuracy", "points_per_s"})
    EXPECT_TRUE(steps[0].contains(k)) << k;
  EXPECT_DOUBLE_EQ(steps[0].at("epoch_progress").get<double>(), 2.0 / 7);
  // Step s (counted from 0; its record says s + 1) ran at the schedule's lr of step s.
  const nn::WarmupCosine schedule(0.1, 2, 21);
  for (const json& rec : steps)
    EXPECT_EQ(rec.at("lr").get<double>(), schedule.lr_at(rec.at("step").get<int64_t>() - 1)) << rec.dump();
  // A step record's loss is the mean over the steps since the last record in its epoch (the
  // epoch's first record: since the epoch's start).
  int64_t since = 0;
  for (const json& rec : steps) {
    const int64_t step = rec.at("step").get<int64_t>(), first = std::max(since, (step - 1) / 7 * 7);
    double sum = 0;
    for (int64_t k = first; k < step; ++k) sum += r.result.step_losses[k];
    EXPECT_NEAR(rec.at("loss").get<double>(), sum / double(step - first), 1e-12) << rec.dump();
    since = step;
  }
  auto epochs = records(dir.path / "out", "epoch");
  ASSERT_EQ(epochs.size(), 3u);
  for (int e = 0; e < 3; ++e) EXPECT_EQ(epochs[e].at("step").get<int64_t>(), 7 * (e + 1));
  for (const char* k : {"train_loss", "train_accuracy", "test_accuracy", "points_per_s", "elapsed_s"})
    EXPECT_TRUE(epochs[2].contains(k)) << k;
  EXPECT_EQ(epochs[2].at("epoch").get<double>(), 3.0);
  json summary = json::parse(read_text(dir.path / "out/summary.json"));
  for (const char* k : {"test_accuracy", "steps", "epochs_completed", "train_points_per_s", "device", "app_field"})
    EXPECT_TRUE(summary.contains(k)) << k;
  EXPECT_EQ(summary.at("steps"), 21);
  EXPECT_GT(summary.at("train_points_per_s").get<double>(), 0.0);
  const fs::path ck = dir.path / "out/checkpoint";
  for (const char* f : {"model.safetensors", "training.safetensors", "config.json", "labels.txt"})
    EXPECT_TRUE(fs::is_regular_file(ck / f)) << f;
  EXPECT_EQ(json::parse(read_text(ck / "config.json")).at("note"), "free");
  // The training state holds the position and the schedule's name; neither a moving average nor
  // a selection was asked for, so neither is saved.
  nn::Linear m(2, 3);
  nn::AdamW opt({nn::ParamGroup{m.parameters(), 0.1, 0.0}});
  const nn::TrainState st = nn::load_checkpoint(ck.string(), m, opt);
  EXPECT_EQ(st.step, 21);
  EXPECT_EQ(st.epoch, 3);
  EXPECT_EQ(st.extra,
            (std::map<std::string, std::string>{{"epoch_batch", "0"}, {"schedule", nn::schedule_name(schedule)}}));
}

TEST(TrainLoop, ResumeMidEpochContinuesBitForBit) {
  TempDir dir;
  LoopRun uninterrupted = train_points(options(dir.path / "full"));
  apps::RunOptions part = options(dir.path / "part");
  part.max_steps = 10;  // stops in epoch 2 (7 batches per epoch)
  part.checkpoint_every = 3;
  train_points(part);
  // Records written after the checkpoint (a run killed before its next one) are dropped.
  std::ofstream(dir.path / "part" / "metrics.jsonl", std::ios::app)
      << "{\"type\": \"step\", \"step\": 11}\n{\"type\": \"step\", \"step\": 12}\n";
  part.max_steps = 0;
  part.resume = true;
  LoopRun resumed = train_points(part);
  EXPECT_EQ(resumed.result.start_step, 10);
  ASSERT_EQ(resumed.result.step_losses.size(), 11u);
  for (size_t i = 0; i < 11; ++i)
    EXPECT_EQ(resumed.result.step_losses[i], uninterrupted.result.step_losses[10 + i]) << i;
  EXPECT_EQ(resumed.weights, uninterrupted.weights);
  std::vector<int64_t> logged;
  for (const json& j : records(dir.path / "part", "step")) logged.push_back(j.at("step"));
  EXPECT_EQ(logged, (std::vector<int64_t>{2, 4, 6, 8, 10, 12, 14, 16, 18, 20}));
}

// A checkpoint saved before "epoch_batch" was kept (older runs) resumes from its step: the
// position in the epoch is the step less the batches of the epochs before (5 here; the epochs
// differ in length).
TEST(TrainLoop, ResumeWithoutEpochBatchCountsThePositionFromTheStep) {
  TempDir dir;
  const LoopRun uninterrupted = train_points(options(dir.path / "full"), 0.1, 0, 3, growing_epochs());
  ASSERT_EQ(uninterrupted.result.step_losses.size(), 21u);  // 5 + 7 + 9
  apps::RunOptions part = options(dir.path / "part");
  part.max_steps = 8;  // epoch 1 (counted from 0), batch 3
  train_points(part, 0.1, 0, 3, growing_epochs());
  {
    nn::Linear model(2, 3);
    nn::AdamW opt({nn::ParamGroup{model.parameters(), 0.1, 0.0}});
    const std::string ck = (dir.path / "part/checkpoint").string();
    nn::TrainState st = nn::load_checkpoint(ck, model, opt);
    ASSERT_EQ(st.extra.at("epoch_batch"), "3");
    st.extra.erase("epoch_batch");
    nn::save_checkpoint(ck, model, opt, st);
  }
  part.max_steps = 0;
  part.resume = true;
  const LoopRun resumed = train_points(part, 0.1, 0, 3, growing_epochs());
  EXPECT_EQ(resumed.result.start_step, 8);
  ASSERT_EQ(resumed.result.step_losses.size(), 13u);
  for (size_t i = 0; i < 13; ++i)
    EXPECT_EQ(resumed.result.step_losses[i], uninterrupted.result.step_losses[8 + i]) << i;
  EXPECT_EQ(resumed.weights, uninterrupted.weights);
}

// A resume of a run that has ended takes no step: it evaluates the final weights once more, for
// the summary.
TEST(TrainLoop, ResumingAFinishedRunEvaluatesItOnly) {
  TempDir dir;
  apps::RunOptions o = options(dir.path / "out");
  const LoopRun full = train_points(o);
  o.resume = true;
  const LoopRun again = train_points(o);
  EXPECT_EQ(again.result.start_step, 21);
  EXPECT_TRUE(again.result.step_losses.empty());
  EXPECT_EQ(again.weights, full.weights);
  EXPECT_EQ(again.result.last_eval.values.at("test_accuracy"), full.result.last_eval.values.at("test_accuracy"));
  EXPECT_EQ(json::parse(read_text(dir.path / "out/summary.json")).at("test_accuracy"),
            full.result.last_eval.values.at("test_accuracy"));
}

TEST(TrainLoop, RedrawingMechanismsResumeBitForBit) {
  // redraw=3: new features at training calls 0, 3, 6, ...; the run stops after call 9, so only a
  // restored call counter redraws at call 12 (and not at the first call after the resume).
  for (const std::string spec : {"performer:features=4,redraw=3", "nprf_rpe:features=4,max_len=8,redraw=3"}) {
    SCOPED_TRACE(spec);
    TempDir dir;
    LoopRun uninterrupted = train_sequences(options(dir.path / "full"), spec);
    apps::RunOptions part = options(dir.path / "part");
    part.max_steps = 10;
    train_sequences(part, spec);
    part.max_steps = 0;
    part.resume = true;
    LoopRun resumed = train_sequences(part, spec);
    ASSERT_EQ(resumed.result.step_losses.size(), 11u);
    for (size_t i = 0; i < 11; ++i)
      EXPECT_EQ(resumed.result.step_losses[i], uninterrupted.result.step_losses[10 + i]) << i;
    EXPECT_EQ(resumed.weights, uninterrupted.weights);
  }
}

TEST(TrainLoop, ResumeWithOtherSettingsIsRefusedListingThem) {
  TempDir dir;
  apps::RunOptions o = options(dir.path / "out");
  o.max_steps = 4;
  train_points(o);
  o.resume = true;
  try {
    train_points(o, /*lr=*/0.5);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("was made with other settings"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("run.lr: checkpoint 0.1, now 0.5"), std::string::npos) << e.what();
  }
}

TEST(TrainLoop, IncompleteSetupAndCudaGraphOnTheCpuAreRefused) {
  TempDir dir;
  apps::RunOptions o = options(dir.path / "out");
  const Tweak no_evaluate = [](apps::TrainSetup&, apps::TrainHooks& h, nn::Module&) { h.evaluate = nullptr; };
  EXPECT_LINEA_ERROR(train_points(o, 0.1, 0, 3, no_evaluate),
                     "points: train() needs a model, an optimizer, a loader and the step and evaluate hooks");
  o.cuda_graph = true;
  EXPECT_LINEA_ERROR(train_points(o), "points: --cuda-graph needs --device cuda (a CUDA graph is the GPU's)");
}

TEST(TrainLoop, NonFiniteLossStopsAndKeepsTheLastCheckpoint) {
  TempDir dir;
  apps::RunOptions o = options(dir.path / "out");
  o.checkpoint_every = 4;
  try {
    train_points(o, 0.1, /*nan_at_step=*/6);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("points: step 6: non-finite loss (nan)"), std::string::npos) << e.what();
  }
  nn::Linear m(2, 3);
  nn::AdamW opt({nn::ParamGroup{m.parameters(), 0.1, 0.0}});
  EXPECT_EQ(nn::load_checkpoint((dir.path / "out/checkpoint").string(), m, opt).step, 4);
  for (const float w : m.parameters()[0].to_vector<float>()) EXPECT_TRUE(std::isfinite(w));
}

// SIGTERM / SIGINT raised during a step: the loop saves that step and throws Interrupted; on the
// epoch's last step (7 per epoch) it evaluates and saves the epoch first. Resuming ends with the
// uninterrupted run's weights.
TEST(TrainLoop, SignalSavesTheStepAndResumesBitForBit) {
  TempDir dir;
  LoopRun uninterrupted = train_points(options(dir.path / "full"));
  for (int64_t at : {3, 7}) {
    const auto out = dir.path / ("sig" + std::to_string(at));
    int evaluations = 0;
    const Tweak raise_at = [&](apps::TrainSetup&, apps::TrainHooks& h, nn::Module&) {
      auto step = h.step;
      auto evaluate = h.evaluate;
      auto n = std::make_shared<int64_t>(0);
      h.step = [step, n, at](const nn::Batch& b) {
        if (++*n == at) ::raise(at == 3 ? SIGTERM : SIGINT);
        return step(b);
      };
      h.evaluate = [evaluate, &evaluations](const std::string& label) {
        ++evaluations;
        return evaluate(label);
      };
    };
    try {
      train_points(options(out), 0.1, 0, 3, raise_at);
      FAIL() << "expected Interrupted";
    } catch (const apps::Interrupted& e) {
      EXPECT_EQ(e.exit_code(), at == 3 ? 143 : 130);
      EXPECT_NE(std::string(e.what()).find("stopped after step " + std::to_string(at)), std::string::npos) << e.what();
    }
    EXPECT_EQ(evaluations, at == 7 ? 1 : 0);
    EXPECT_EQ(apps::pending_interrupt(), 0);  // the guard is gone with the run
    std::vector<int64_t> interrupted;
    for (const json& j : records(out, "interrupted")) interrupted.push_back(j.at("step"));
    EXPECT_EQ(interrupted, std::vector<int64_t>{at});
    apps::RunOptions again = options(out);
    again.resume = true;
    LoopRun resumed = train_points(again);
    EXPECT_EQ(resumed.result.start_step, at);
    EXPECT_EQ(resumed.weights, uninterrupted.weights);
  }
}

// A signal during the evaluation at an epoch's end: the epoch's checkpoint is saved, then the run
// stops; a resume goes on with the next epoch.
TEST(TrainLoop, SignalDuringTheEvaluationStopsAfterTheEpoch) {
  TempDir dir;
  const LoopRun uninterrupted = train_points(options(dir.path / "full"));
  const auto out = dir.path / "sig";
  const Tweak raise_in_evaluation = [](apps::TrainSetup&, apps::TrainHooks& h, nn::Module&) {
    auto evaluate = h.evaluate;
    h.evaluate = [evaluate](const std::string& label) {
      ::raise(SIGINT);
      return evaluate(label);
    };
  };
  try {
    train_points(options(out), 0.1, 0, 3, raise_in_evaluation);
    FAIL() << "expected Interrupted";
  } catch (const apps::Interrupted& e) {
    EXPECT_EQ(e.exit_code(), 130);
    EXPECT_NE(std::string(e.what()).find("stopped after step 7"), std::string::npos) << e.what();
  }
  EXPECT_EQ(records(out, "epoch").size(), 1u);
  std::vector<int64_t> interrupted;
  for (const json& j : records(out, "interrupted")) interrupted.push_back(j.at("step"));
  EXPECT_EQ(interrupted, std::vector<int64_t>{7});
  apps::RunOptions again = options(out);
  again.resume = true;
  const LoopRun resumed = train_points(again);
  EXPECT_EQ(resumed.result.start_step, 7);
  EXPECT_EQ(resumed.weights, uninterrupted.weights);
}

// curves.png is drawn from metrics.jsonl: records lacking its numbers (a hand-edited file kept
// by a resume) are left out of the plot, not an error at the end of training.
TEST(TrainLoop, CurvesSkipRecordsWithoutTheirNumbers) {
  TempDir dir;
  apps::RunOptions o = options(dir.path / "out");
  o.max_steps = 7;
  train_points(o);
  std::ofstream(dir.path / "out" / "metrics.jsonl", std::ios::app)
      << "{\"type\": \"step\", \"step\": 1}\n{\"type\": \"epoch\", \"epoch\": \"one\", \"step\": 2}\n";
  o.max_steps = 0;
  o.resume = true;
  o.plot = true;
  EXPECT_NO_THROW(train_points(o));
}

TEST(TrainLoop, SkipNonFiniteSkipsAndLogs) {
  TempDir dir;
  apps::RunOptions o = options(dir.path / "out");
  o.skip_nonfinite = 1;
  LoopRun r = train_points(o, 0.1, /*nan_at_step=*/6);
  EXPECT_EQ(r.result.skipped_steps, 1);
  EXPECT_EQ(r.result.final_step, 21);
  for (const float w : r.weights) EXPECT_TRUE(std::isfinite(w));
  auto skipped = records(dir.path / "out", "skipped");
  ASSERT_EQ(skipped.size(), 1u);
  EXPECT_EQ(skipped[0].at("step"), 6);
  EXPECT_EQ(json::parse(read_text(dir.path / "out/summary.json")).at("skipped_steps"), 1);
  // The skipped step's loss is in no mean: a record every step has none for step 6.
  o.out_dir = (dir.path / "every").string();
  o.log_every = 1;
  train_points(o, 0.1, /*nan_at_step=*/6);
  std::vector<int64_t> logged;
  for (const json& rec : records(dir.path / "every", "step")) {
    logged.push_back(rec.at("step"));
    EXPECT_TRUE(rec.at("loss").is_number() && std::isfinite(rec.at("loss").get<double>())) << rec.dump();
  }
  EXPECT_EQ(logged.size(), 20u);
  EXPECT_EQ(std::count(logged.begin(), logged.end(), 6), 0);
  for (const json& rec : records(dir.path / "every", "epoch"))
    EXPECT_TRUE(rec.at("train_loss").is_number() && std::isfinite(rec.at("train_loss").get<double>())) << rec.dump();
}

// Without keys the whole configuration is compared; a value that became an object is one
// difference.
TEST(TrainLoop, ConfigDiffListsNestedDifferences) {
  json saved = {{"model", {{"dim", 64}, {"heads", 4}}}, {"run", {{"lr", 0.1}}}};
  json now = {{"model", {{"dim", 32}, {"heads", 4}}}, {"run", {{"lr", 0.1}, {"seed", 1}}}};
  const std::string diff = "\n  model.dim: checkpoint 64, now 32\n  run.seed: checkpoint (absent), now 1";
  EXPECT_EQ(apps::config_diff(saved, now, {"model", "run"}), diff);
  EXPECT_EQ(apps::config_diff(saved, now, {}), diff);
  EXPECT_EQ(apps::config_diff(saved, now, {"run"}), "\n  run.seed: checkpoint (absent), now 1");
  EXPECT_EQ(apps::config_diff(saved, saved, {}), "");
  EXPECT_EQ(apps::config_diff({{"model", 3}}, {{"model", {{"dim", 1}}}}, {}),
            "\n  model: checkpoint 3, now {\"dim\":1}");
}

TEST(TrainLoop, ReadCheckpointConfigChecksTheFolderAndTheFormat) {
  TempDir dir;
  const std::string ck = (dir.path / "ck").string();
  auto error_of = [&] {
    try {
      apps::read_checkpoint_config(ck, "toy", "linea-toy/1");
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("(no error)");
  };
  EXPECT_NE(error_of().find("toy: checkpoint folder '" + ck + "' does not exist"), std::string::npos) << error_of();
  test::write_all(ck, "x");
  EXPECT_NE(error_of().find("toy: checkpoint folder '" + ck + "' is a file, not a folder"), std::string::npos)
      << error_of();
  fs::remove(ck);
  fs::create_directories(ck);
  EXPECT_NE(error_of().find("is not a toy checkpoint (no config.json"), std::string::npos) << error_of();
  std::ofstream(ck + "/config.json") << R"({"format": "linea-other/1", "model": {}})";
  EXPECT_NE(error_of().find("its config.json has format 'linea-other/1', expected 'linea-toy/1'"), std::string::npos)
      << error_of();
  std::ofstream(ck + "/config.json") << R"({"format": 1})";
  EXPECT_NE(error_of().find("its config.json has format 'none', expected 'linea-toy/1'"), std::string::npos)
      << error_of();
  std::ofstream(ck + "/config.json") << R"({"format": "linea-toy/1", "model": {"dim": 3}})";
  EXPECT_EQ(error_of(), "(no error)");
  EXPECT_EQ(apps::read_checkpoint_config(ck, "toy", "linea-toy/1").at("model").at("dim"), 3);
}

// Model selection on the mean training-set loss (lower is better) with a moving average.
// maximize: the worst loss is "best" (an early evaluation, not the last); metric "": no selection.
Tweak select_loss(double ema, int64_t patience, std::vector<double>* evals, std::vector<double>* finished,
                  bool maximize = false, const std::string& metric = "eval_loss") {
  return [=](apps::TrainSetup& s, apps::TrainHooks& h, nn::Module& model) {
    s.ema_decay = ema;
    s.select = {metric, maximize, patience};
    auto data = points(60);
    auto loss_of = [data, &model] {
      Tensor logits = static_cast<nn::Linear&>(model)(data->inputs());
      return cross_entropy(logits, data->targets()).item();
    };
    h.evaluate = [=](const std::string&) {
      const double l = loss_of();
      if (evals) evals->push_back(l);
      return apps::Metrics{{{"eval_loss", l}}, "loss"};
    };
    h.finish = [=] {
      const double l = loss_of();
      if (finished) finished->push_back(l);
      return apps::Metrics{{{"final_loss", l}}, "final"};
    };
  };
}

TEST(TrainLoop, MovingAverageAndModelSelection) {
  TempDir dir;
  apps::RunOptions o = options(dir.path / "out");
  std::vector<double> evals, finished, plain_evals;
  LoopRun r = train_points(o, 0.1, 0, 4, select_loss(0.9, 0, &evals, &finished));
  ASSERT_EQ(evals.size(), 4u);
  ASSERT_EQ(finished.size(), 1u);
  const double best = *std::min_element(evals.begin(), evals.end());
  EXPECT_EQ(r.result.best_value, best);
  EXPECT_EQ(finished[0], best);  // finish() ran on the best weights
  for (const char* f : {"model.safetensors", "config.json", "labels.txt"})
    EXPECT_TRUE(fs::exists(dir.path / "out" / "checkpoint" / "best" / f)) << f;
  const nn::Metadata md = nn::load_safetensors((dir.path / "out/checkpoint/best/model.safetensors").string()).metadata;
  EXPECT_EQ(md.at("step"), std::to_string(r.result.best_step));
  EXPECT_EQ(std::stod(md.at("eval_loss")), best);
  const json summary = json::parse(read_text(dir.path / "out" / "summary.json"));
  EXPECT_EQ(summary.at("best_eval_loss").get<double>(), best);
  EXPECT_EQ(summary.at("final_loss").get<double>(), best);
  EXPECT_EQ(summary.at("stopped_early").get<bool>(), false);
  EXPECT_EQ(summary.at("ema_decay").get<double>(), 0.9);
  // The average follows the training (its evaluations improve), and the evaluations saw it, not
  // the weights: without it they differ.
  EXPECT_LT(evals[3], evals[0]);
  // finish() runs on the selected weights when the best is not the last evaluation too, and on
  // the average without a selection.
  for (const bool maximize : {true, false}) {
    TempDir d;
    std::vector<double> ev, fin;
    train_points(options(d.path / "out"), 0.1, 0, 4,
                 select_loss(0.9, 0, &ev, &fin, maximize, maximize ? "eval_loss" : ""));
    ASSERT_EQ(ev.size(), 4u);
    ASSERT_EQ(fin.size(), 1u);
    if (maximize) {
      EXPECT_EQ(fin[0], *std::max_element(ev.begin(), ev.end()));
      EXPECT_NE(fin[0], ev[3]);
    } else {
      EXPECT_EQ(fin[0], ev[3]);  // the last evaluation saw the average too
    }
  }
  TempDir dir2;
  train_points(options(dir2.path / "out"), 0.1, 0, 4, select_loss(0.0, 0, &plain_evals, nullptr));
  ASSERT_EQ(plain_evals.size(), 4u);
  EXPECT_NE(plain_evals[3], evals[3]);
}

// planned_steps adds each epoch's own number of batches.
TEST(TrainLoop, PlannedStepsCountEachEpoch) {
  nn::DataLoader loader(points(60), std::make_shared<GrowingEpochs>());
  EXPECT_EQ(apps::planned_steps(loader, 3), 5 + 7 + 9);
}

// setup.on_epoch (the augmentation's epoch, in the apps) sees each epoch before its first batch,
// a resumed one again.
TEST(TrainLoop, OnEpochSeesEachEpochItRuns) {
  TempDir dir;
  std::vector<int64_t> seen;
  const Tweak tweak = [&seen](apps::TrainSetup& s, apps::TrainHooks&, nn::Module&) {
    s.on_epoch = [&seen](int64_t epoch) { seen.push_back(epoch); };
  };
  train_points(options(dir.path / "full"), 0.1, 0, 3, tweak);
  EXPECT_EQ(seen, (std::vector<int64_t>{0, 1, 2}));
  seen.clear();
  apps::RunOptions part = options(dir.path / "part");
  part.max_steps = 10;  // stops in epoch 2 (7 batches per epoch)
  train_points(part, 0.1, 0, 3, tweak);
  part.max_steps = 0;
  part.resume = true;
  train_points(part, 0.1, 0, 3, tweak);
  EXPECT_EQ(seen, (std::vector<int64_t>{0, 1, 1, 2}));
}

TEST(TrainLoop, EarlyStoppingAfterPatience) {
  TempDir dir;
  int64_t n = 0;
  auto tweak = [&n](apps::TrainSetup& s, apps::TrainHooks& h, nn::Module&) {
    s.select = {"score", true, 2};
    // The score improves at the 2nd evaluation, then never again: stop after the 4th.
    h.evaluate = [&n](const std::string&) {
      ++n;
      return apps::Metrics{{{"score", n == 2 ? 1.0 : 0.0}}, ""};
    };
  };
  LoopRun r = train_points(options(dir.path / "out"), 0.1, 0, 8, tweak);
  EXPECT_EQ(n, 4);
  EXPECT_TRUE(r.result.stopped_early);
  EXPECT_EQ(r.result.final_step, 4 * 7);
  EXPECT_EQ(r.result.best_step, 2 * 7);
  EXPECT_EQ(r.result.best_value, 1.0);
  // Patience running out at the last evaluation stops nothing early.
  n = 0;
  TempDir dir4;
  LoopRun four = train_points(options(dir4.path / "out"), 0.1, 0, 4, tweak);
  EXPECT_EQ(n, 4);
  EXPECT_FALSE(four.result.stopped_early);
  EXPECT_EQ(four.result.final_step, 4 * 7);
}

// maximize: the best is the first evaluation, before the checkpoint; only the saved selection
// remembers it.
TEST(TrainLoop, MovingAverageAndSelectionResumeExactly) {
  for (const bool maximize : {false, true}) {
    SCOPED_TRACE(maximize ? "maximize" : "minimize");
    TempDir a, b;
    std::vector<double> evals_a, fin_a, evals_b, fin_b;
    LoopRun full = train_points(options(a.path / "out"), 0.1, 0, 3, select_loss(0.8, 0, &evals_a, &fin_a, maximize));
    apps::RunOptions o = options(b.path / "out");
    o.max_steps = 10;  // stops mid-epoch 2, after one evaluation
    train_points(o, 0.1, 0, 3, select_loss(0.8, 0, &evals_b, &fin_b, maximize));
    o.max_steps = 0;
    o.resume = true;
    evals_b.clear();
    fin_b.clear();
    LoopRun resumed = train_points(o, 0.1, 0, 3, select_loss(0.8, 0, &evals_b, &fin_b, maximize));
    EXPECT_EQ(resumed.weights, full.weights);
    ASSERT_EQ(evals_b.size(), 2u);  // the evaluations of epochs 2 and 3
    EXPECT_EQ(evals_b[1], evals_a[2]);
    ASSERT_EQ(fin_b.size(), 1u);
    EXPECT_EQ(fin_b[0], fin_a[0]);
    EXPECT_EQ(resumed.result.best_step, full.result.best_step);
    EXPECT_EQ(full.result.best_step, maximize ? 7 : 21);
  }
}

// ---- the run's state (train_state.h) --------------------------------------------------------------

// The moving average's n-th update (n from 0) takes the decay min(d, (1 + n) / (10 + n)); a step
// the guard withheld updates nothing, nor counts; swap() exchanges average and weights; the count
// is saved and a load replaces it (on an average that has counted already too).
// Bad settings and folders get errors naming the app, the value or the folder at fault.
TEST(TrainState, BadDecayAndFoldersAreNamed) {
  nn::Linear model(2, 1);
  EXPECT_LINEA_ERROR(apps::WeightAverage(model, 1.0), "train: ema_decay must be in [0, 1), got 1");
  EXPECT_LINEA_ERROR(apps::WeightAverage(model, -0.5), "train: ema_decay must be in [0, 1), got -0.5");
  TempDir dir;
  // The best model's folder under a file.
  apps::TrainSetup s;
  s.app = "points";
  s.model = &model;
  test::write_all((dir.path / "file").string(), "x");
  const std::string best = (dir.path / "file" / "best").string();
  EXPECT_LINEA_ERROR(apps::save_best(s, best, 3, 0.5), "points: cannot create '" + best + "': ");
  // Resuming from a checkpoint whose config.json is gone.
  apps::RunOptions o = options(dir.path / "out");
  o.max_steps = 2;
  train_points(o);
  const fs::path ckpt = dir.path / "out" / "checkpoint";
  fs::remove(ckpt / "config.json");
  o.resume = true;
  EXPECT_LINEA_ERROR(train_points(o), "points: --resume: '" + ckpt.string() + "' holds no config.json");
  // Resuming from a checkpoint whose weights are not finite.
  apps::RunOptions n = options(dir.path / "nan");
  n.max_steps = 2;
  train_points(n);
  const std::string weights = (dir.path / "nan/checkpoint/model.safetensors").string();
  nn::SafetensorsFile f = nn::load_safetensors(weights);
  f.tensors.at("weight") = full({3, 2}, std::numeric_limits<double>::quiet_NaN());
  nn::save_safetensors(weights, f.tensors, f.metadata);
  n.resume = true;
  EXPECT_LINEA_ERROR(train_points(n), "points: --resume: '" + weights + "'");
}

TEST(TrainState, WeightAverageWarmsUpSkipsWithheldStepsAndResumes) {
  nn::Linear model(2, 1);
  const Tensor w = model.parameters()[0];
  const auto set = [&](std::vector<float> v) { w.detach().copy_(from_vector<float>(v, {1, 2})); };
  const auto guard = [](bool ok) { return from_vector<float>({1.0f, 1.0f, ok ? 1.0f : 0.0f}, {3}); };
  const auto values = [&] { return w.to_vector<float>(); };
  set({1, -1});
  apps::WeightAverage ema(model, 0.9);
  std::vector<double> avg{1, -1};
  const auto expect_average = [&](const std::vector<double>& weights) {
    ema.swap();
    const std::vector<float> got = values();
    for (size_t i = 0; i < 2; ++i) EXPECT_NEAR(got[i], avg[i], 1e-6) << "element " << i;
    ema.swap();
    EXPECT_EQ(values(), std::vector<float>(weights.begin(), weights.end()));  // swapped back
  };
  const auto mix = [&](double d, const std::vector<double>& weights) {
    for (size_t i = 0; i < 2; ++i) avg[i] = d * avg[i] + (1 - d) * weights[i];
  };
  set({3, 5});
  ema.update(guard(true));  // n = 0: decay 1/10
  mix(0.1, {3, 5});
  expect_average({3, 5});
  set({100, 100});
  ema.update(guard(false));  // withheld: no update, no count
  expect_average({100, 100});
  set({-2, 4});
  ema.update(guard(true));  // n = 1: decay 2/11
  mix(2.0 / 11, {-2, 4});
  expect_average({-2, 4});

  nn::TrainState st;
  ema.save_to(st);
  EXPECT_EQ(st.extra.at("ema_updates"), "2");
  ASSERT_TRUE(st.tensors.count("ema.weight"));
  st.extra["ema_updates"] = "5";
  ema.load_from(st, "points");
  nn::TrainState loaded;  // saved before its next update: the count loaded
  ema.save_to(loaded);
  EXPECT_EQ(loaded.extra.at("ema_updates"), "5");
  set({7, 1});
  ema.update(guard(true));  // n = 5: decay 6/15
  mix(6.0 / 15, {7, 1});
  expect_average({7, 1});
  st.tensors["ema.weight"] = zeros({2, 1});
  EXPECT_LINEA_ERROR(ema.load_from(st, "points"), "points: --resume: the checkpoint has no moving average of 'weight'");
  // Without a decay there is no average: nothing to update, swap or save.
  apps::WeightAverage off(model, 0.0);
  EXPECT_FALSE(off.on());
  nn::TrainState none;
  off.save_to(none);
  EXPECT_TRUE(none.extra.empty() && none.tensors.empty());
}

// The first of equal evaluations stays the best; the best value (all 17 digits), its step and the
// evaluations since are saved and loaded.
TEST(TrainState, SelectionKeepsTheFirstOfEqualsAndResumes) {
  apps::Selection s;
  nn::TrainState empty;  // before any evaluation: nothing saved, nothing loaded
  s.save_to(empty);
  EXPECT_TRUE(empty.extra.empty());
  s.load_from(empty);
  EXPECT_FALSE(s.have);
  EXPECT_TRUE(s.consider(0.1 + 0.2, true, 10));
  EXPECT_FALSE(s.consider(0.1 + 0.2, true, 20));
  EXPECT_FALSE(s.consider(0.25, true, 30));
  EXPECT_EQ(s.best_step, 10);
  EXPECT_EQ(s.since, 2);
  nn::TrainState st;
  s.save_to(st);
  apps::Selection loaded;
  loaded.load_from(st);
  EXPECT_TRUE(loaded.have);
  EXPECT_EQ(loaded.best, 0.1 + 0.2);
  EXPECT_EQ(loaded.best_step, 10);
  EXPECT_EQ(loaded.since, 2);
  EXPECT_TRUE(loaded.patience_out(2));
  EXPECT_FALSE(loaded.patience_out(3));
  apps::Selection lower;
  EXPECT_TRUE(lower.consider(1.0, false, 1));
  EXPECT_FALSE(lower.consider(1.0, false, 2));
  EXPECT_TRUE(lower.consider(0.5, false, 3));
  EXPECT_EQ(lower.since, 0);
}
