#include "train.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "apps/common/app_run.h"
#include "apps/common/config_json.h"
#include "apps/common/device.h"
#include "apps/common/metrics.h"
#include "apps/common/prepared_data.h"
#include "apps/common/progress.h"
#include "apps/common/train_loop.h"
#include "attention/transformer.h"
#include "autograd/ops.h"
#include "data.h"
#include "nn/checkpoint.h"
#include "nn/dist.h"
#include "nn/optim.h"
#include "nn/readers.h"
#include "nn/safetensors.h"
#include "nn/schedule.h"

namespace fs = std::filesystem;
using json = nlohmann::json;
using namespace linea;

namespace vit {

// The flags that define a run (config.json's "run", with the data and the seed).
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(TrainOptions, batch_size, epochs, lr, min_lr, weight_decay, warmup_epochs,
                                   label_smoothing, clip, crop_padding, flip, time_budget)

namespace {

using Clock = std::chrono::steady_clock;
using apps::seconds_since;
std::string fmt(const char* f, double v) { return apps::format_number(f, v); }

// "init" may be missing: checkpoints from before --init.
VitConfig model_from_json(const json& j) { return apps::config_from_json<VitConfig>(j, "the model config", {"init"}); }

// The data a run records: its folder absolute and normalized, so that `data` and `data/` are one
// run on --resume. Checkpoints from before recorded the folder as typed (d.source): resumed with
// that spelling, they keep it.
std::string recorded_data(const TrainOptions& o, const ImageData& d, const json& saved_run) {
  if (saved_run.value("data", "") == d.source) return d.source;
  return o.image_folder.empty() ? "fashion-mnist (" + apps::recorded_data_dir(o.data_dir) + ")"
                                : "image folder " + apps::recorded_data_dir(o.image_folder);
}

// The flags that define a run: a resumed run must use the same ones (the others — device,
// threads, logging, --max-steps — may change between the interrupted and the resumed run).
json run_json(const TrainOptions& o, const ImageData& d, const json& saved_run) {
  json j = o;
  j.update(
      {{"data", recorded_data(o, d, saved_run)}, {"train_examples", d.train_images.size(0)}, {"seed", o.run.seed}});
  if (o.time_budget == 0) j.erase("time_budget");  // as before the flag: older checkpoints resume
  return j;
}

// What --predict needs besides the weights: the model, the class names and the normalization.
struct CheckpointConfig {
  VitConfig model;
  std::vector<std::string> classes;
  std::vector<double> mean, std;
  json run;
};

constexpr const char* kConfigFormat = "linea-vit/1";

json config_json(const CheckpointConfig& c) {
  return {{"format", kConfigFormat},
          {"model", c.model},
          {"classes", c.classes},
          {"normalize", {{"mean", c.mean}, {"std", c.std}}},
          {"run", c.run}};
}

CheckpointConfig read_config(const std::string& dir) {
  const std::string path = dir + "/config.json";
  const json j = apps::read_checkpoint_config(dir, "vit", kConfigFormat);
  try {
    CheckpointConfig c;
    c.model = model_from_json(j.at("model"));
    c.classes = j.at("classes").get<std::vector<std::string>>();
    c.mean = j.at("normalize").at("mean").get<std::vector<double>>();
    c.std = j.at("normalize").at("std").get<std::vector<double>>();
    c.run = j.at("run");
    LINEA_CHECK(c.run.is_object(), "\"run\" is not an object");
    LINEA_CHECK(static_cast<int64_t>(c.classes.size()) == c.model.classes &&
                    static_cast<int64_t>(c.mean.size()) == c.model.channels && c.std.size() == c.mean.size(),
                "inconsistent classes/channels");
    return c;
  } catch (const std::exception& e) {  // linea::Error and json's exceptions alike
    LINEA_FAIL("vit: '", path, "' is malformed: ", e.what());
  }
}

struct EvalResult {
  double loss = 0, accuracy = 0, images_per_s = 0;
  std::vector<std::vector<int64_t>> confusion;  // [true][predicted]
};

// Test-set loss (plain cross-entropy, no smoothing), accuracy and confusion matrix; the caller
// runs it in eval mode without a graph (apps::evaluate_forked).
EvalResult evaluate(VisionTransformer& model, const Tensor& images, const Tensor& labels, Device device,
                    int64_t batch_size, const std::string& label, bool progress) {
  const int64_t N = images.size(0), K = model.config().classes;
  EvalResult r;
  r.confusion.assign(K, std::vector<int64_t>(K, 0));
  std::unique_ptr<apps::ProgressBar> bar;
  if (progress) bar = std::make_unique<apps::ProgressBar>(label, N);
  const auto t0 = Clock::now();
  Tensor loss_sum = zeros({}, TensorOptions(DType::Float64).with_device(device));
  for (int64_t s = 0; s < N; s += batch_size) {
    const int64_t n = std::min(batch_size, N - s);
    Tensor x = narrow(images, 0, s, n).to(device), y = narrow(labels, 0, s, n).to(device);
    Tensor logits = model(x);
    loss_sum = loss_sum + sum(cross_entropy(logits, y, -100, 0.0, Reduction::Sum)).to(DType::Float64);
    auto pred = argmax(logits, 1).to(kCPU).to_vector<int64_t>();
    auto truth = narrow(labels, 0, s, n).to_vector<int64_t>();
    for (int64_t i = 0; i < n; ++i) r.confusion[truth[i]][pred[i]] += 1;
    if (bar) bar->update(s + n);
  }
  const double secs = seconds_since(t0);
  int64_t correct = 0;
  for (int64_t k = 0; k < K; ++k) correct += r.confusion[k][k];
  r.loss = loss_sum.item() / static_cast<double>(N);
  r.accuracy = static_cast<double>(correct) / static_cast<double>(N);
  r.images_per_s = N / std::max(secs, 1e-9);
  if (bar) bar->finish("loss " + fmt("%.4f", r.loss) + "  acc " + fmt("%.2f%%", 100 * r.accuracy));
  return r;
}

apps::Metrics metrics_of(const EvalResult& r) {
  return {{{"test_loss", r.loss}, {"test_accuracy", r.accuracy}, {"eval_images_per_s", r.images_per_s}},
          "test loss " + fmt("%.4f", r.loss) + " acc " + fmt("%.2f%%", 100 * r.accuracy)};
}

// --time-budget: the epochs that fit in what is left of the budget, at most o.epochs. The budget
// counts from the start of run_training (loading the data and this probe are spent from it).
// The speed is that of a scratch model of the same config, trained on the run's augmenting
// dataset through a loader of its own (another order) for at least 12 steps and 1% of the budget
// (a short probe misjudges a noisy machine), and evaluated on two batches of test images; the
// run's model, data order and random streams are left as they were.
int64_t epochs_within_budget(const TrainOptions& o, const VitConfig& config,
                             const std::shared_ptr<const nn::Dataset>& train_set, const ImageData& data,
                             int64_t eval_batch, Device device, Clock::time_point started) {
  constexpr int kWarmup = 3, kMinTimed = 12;
  const int64_t B = o.batch_size, steps_per_epoch = data.train_images.size(0) / B;
  double train_s = 0, eval_s = 0;
  int64_t timed = 0;
  const int64_t eval_n = std::min<int64_t>(2 * eval_batch, data.test_images.size(0));
  {
    const ForkRng fork(device);  // the run's random streams as they were
    VisionTransformer scratch(config);
    scratch.to(device);
    nn::AdamW opt(nn::decay_groups(scratch, o.lr, o.weight_decay, {"pos.", "cls_token"}));
    nn::DataLoader loader(train_set, nn::DataLoaderOptions{B, true, o.run.seed ^ 0x9e3779b9ULL, true});
    nn::Batch batch;
    auto t0 = Clock::now();
    for (int64_t i = 0; i < kWarmup + steps_per_epoch; ++i) {
      if (i == kWarmup) t0 = Clock::now();
      if (i >= kWarmup) {
        timed = i - kWarmup;
        train_s = seconds_since(t0);
        if (timed >= kMinTimed && train_s >= 0.01 * o.time_budget) break;
      }
      if (!loader.next(batch)) {
        loader.reset(loader.epoch() + 1);
        loader.next(batch);
      }
      scratch.train();
      opt.zero_grad();
      apps::StepResult r = train_step(scratch, batch, device, o.label_smoothing);
      r.loss.backward();
      opt.step();
      r.loss.item();  // the device's work done
    }
    scratch.eval();
    NoGradGuard no_grad;
    const auto e0 = Clock::now();
    evaluate(scratch, narrow(data.test_images, 0, 0, eval_n), narrow(data.test_labels, 0, 0, eval_n), device,
             eval_batch, "", false);
    eval_s = seconds_since(e0);
  }
  const double step_s = train_s / static_cast<double>(std::max<int64_t>(timed, 1)),
               eval_per_image = eval_s / static_cast<double>(eval_n);
  const double epoch_s =
      step_s * static_cast<double>(steps_per_epoch) + eval_per_image * static_cast<double>(data.test_images.size(0));
  const double spent = seconds_since(started), left = o.time_budget - spent;
  const int64_t epochs = std::clamp<int64_t>(static_cast<int64_t>(std::floor(left / epoch_s)), 1, o.epochs);
  std::printf(
      "vit: --time-budget %s s: %s spent (data, probe); %.0f images/s on %lld probe steps, evaluation %.0f "
      "images/s: an epoch with its evaluation about %s; %lld of --epochs %lld fit in the %s left\n",
      fmt("%g", o.time_budget).c_str(), apps::format_duration(spent).c_str(), static_cast<double>(B) / step_s,
      static_cast<long long>(timed), 1 / eval_per_image, apps::format_duration(epoch_s).c_str(),
      static_cast<long long>(epochs), static_cast<long long>(o.epochs),
      apps::format_duration(std::max(left, 0.0)).c_str());
  return epochs;
}

void print_confusion(const std::vector<std::string>& classes, const json& per_class,
                     const std::vector<std::vector<int64_t>>& confusion) {
  const auto K = static_cast<int64_t>(classes.size());
  std::printf("\nper-class test accuracy:\n");
  for (int64_t k = 0; k < K; ++k)
    std::printf("  %-14s %6.2f%%\n", classes[k].c_str(), 100 * per_class[classes[k]].get<double>());
  std::printf("confusion matrix (rows: true class, columns: predicted):\n     ");
  for (int64_t j = 0; j < K; ++j) std::printf("%6lld", static_cast<long long>(j));
  std::printf("\n");
  for (int64_t k = 0; k < K; ++k) {
    std::printf("  %2lld ", static_cast<long long>(k));
    for (int64_t j = 0; j < K; ++j) std::printf("%6lld", static_cast<long long>(confusion[k][j]));
    std::printf("\n");
  }
}

}  // namespace

TrainResult run_training(const TrainOptions& options) {
  const auto started = Clock::now();  // --time-budget counts from here
  TrainOptions o = options;           // --time-budget may lower the epochs
  const apps::RunOptions& run = o.run;
  const Device device = apps::start_run("vit", run, kConfigFormat);
  LINEA_CHECK(o.batch_size >= 1 && o.epochs >= 1, "vit: --batch-size ", o.batch_size, " and --epochs ", o.epochs,
              " must be positive");
  LINEA_CHECK(o.lr > 0 && o.min_lr >= 0 && o.weight_decay >= 0 && o.warmup_epochs >= 0 && o.clip >= 0 &&
                  o.label_smoothing >= 0 && o.label_smoothing < 1,
              "vit: bad optimization flags: --lr ", o.lr, " --min-lr ", o.min_lr, " --weight-decay ", o.weight_decay,
              " --warmup ", o.warmup_epochs, " --clip ", o.clip, " --label-smoothing ", o.label_smoothing);
  // A bad --attention spec fails now, not after loading the data.
  LINEA_CHECK(o.model.heads >= 1 && o.model.dim % o.model.heads == 0, "vit: --dim ", o.model.dim,
              " is not divisible by --heads ", o.model.heads);
  attn::make_attention(o.model.attention, o.model.heads, o.model.dim / o.model.heads);

  // ---- data ----
  ImageData data = o.image_folder.empty() ? load_fashion_mnist(o.data_dir)
                                          : load_image_folder(o.image_folder, o.channels, o.image_size);
  limit_examples(data, o.train_limit, o.test_limit);
  CheckpointConfig cfg;
  cfg.model = o.model;
  cfg.model.image_size = data.train_images.size(2);
  cfg.model.channels = data.train_images.size(1);
  cfg.model.classes = static_cast<int64_t>(data.classes.size());
  cfg.classes = data.classes;
  channel_stats(data.train_images, cfg.mean, cfg.std);
  const int64_t n_train = data.train_images.size(0);
  LINEA_CHECK(n_train / o.batch_size >= 1, "vit: --batch-size ", o.batch_size, " is larger than the ", n_train,
              " training images");

  // ---- model and optimizer ----
  manual_seed(run.seed);
  auto model = std::make_shared<VisionTransformer>(cfg.model);
  model->to(device);
  // No weight decay for biases, norms, the positional embedding and the CLS token (as timm's ViT).
  nn::AdamW opt(nn::decay_groups(*model, o.lr, o.weight_decay, {"pos.", "cls_token"}));
  const int64_t eval_batch = std::max<int64_t>(o.batch_size, 256);
  EvalResult last_eval;
  const auto evaluate_test = [&](const std::string& label) {
    last_eval = evaluate(*model, data.test_images, data.test_labels, device, eval_batch, label, run.progress);
    return metrics_of(last_eval);
  };

  if (run.eval_only) {
    apps::eval_only("vit", run, [&](const std::string& dir) {
      CheckpointConfig saved = read_config(dir);
      const std::string diff = apps::config_diff(json(saved.model), json(cfg.model), {});
      LINEA_CHECK(diff.empty(), "vit: --eval-only: the checkpoint in '", dir,
                  "' was made with another model; use the same flags (or another --checkpoint/--out):", diff);
      nn::load_checkpoint(dir, *model, opt);
      nn::check_finite_weights(*model, "vit: --eval-only: '" + dir + "/model.safetensors'");
      // The model was trained on data normalized with these (the test images may differ).
      normalize_(data.test_images, saved.mean, saved.std);
      return apps::evaluate_forked(*model, device, [&] { return evaluate_test("test"); });
    });
    return {last_eval.accuracy, last_eval.loss, {}, 0, 0};
  }
  normalize_(data.train_images, cfg.mean, cfg.std);
  normalize_(data.test_images, cfg.mean, cfg.std);

  auto train_set = std::make_shared<AugmentedImages>(data.train_images, data.train_labels, o.crop_padding, o.flip,
                                                     run.seed ^ 0x5eedULL,
                                                     // a black pixel after normalization, for the crop's padding
                                                     [&] {
                                                       std::vector<float> f;
                                                       for (size_t c = 0; c < cfg.mean.size(); ++c)
                                                         f.push_back(static_cast<float>(-cfg.mean[c] / cfg.std[c]));
                                                       return f;
                                                     }());
  // The run settings of the checkpoint a --resume continues (none for a new run).
  const json saved_run =
      run.resume && nn::checkpoint_exists(run.checkpoint()) ? read_config(run.checkpoint()).run : json::object();
  if (o.time_budget > 0) {
    // A resumed run keeps the epochs it chose; a new one measures.
    if (!saved_run.empty())
      o.epochs = saved_run.value("epochs", o.epochs);
    else
      o.epochs = epochs_within_budget(o, cfg.model, train_set, data, eval_batch, device, started);
    // Data parallel: rank 0's choice everywhere (each rank probed its own speed).
    std::string epochs = std::to_string(o.epochs);
    dist::broadcast_string(epochs, 0);
    o.epochs = std::stoll(epochs);
  }
  cfg.run = run_json(o, data, saved_run);
  nn::DataLoader loader(train_set, std::make_shared<nn::FixedSizeBatchSampler>(n_train, o.batch_size,
                                                                               /*shuffle=*/true, run.seed,
                                                                               /*drop_last=*/true));
  const int64_t steps_per_epoch = loader.num_batches(0), total_steps = apps::planned_steps(loader, o.epochs);
  const auto warmup = static_cast<int64_t>(std::llround(o.warmup_epochs * steps_per_epoch));

  std::printf("vit: %s, %lld train / %lld test images of %lldx%lldx%lld, %zu classes\n", data.source.c_str(),
              static_cast<long long>(n_train), static_cast<long long>(data.test_images.size(0)),
              static_cast<long long>(cfg.model.channels), static_cast<long long>(cfg.model.image_size),
              static_cast<long long>(cfg.model.image_size), data.classes.size());
  std::printf(
      "vit: ViT patch %lld, dim %lld, depth %lld, heads %lld, mlp ratio %g, pool %s, attention %s: %lld "
      "parameters\n",
      static_cast<long long>(cfg.model.patch), static_cast<long long>(cfg.model.dim),
      static_cast<long long>(cfg.model.depth), static_cast<long long>(cfg.model.heads), cfg.model.mlp_ratio,
      cfg.model.pool.c_str(), cfg.model.attention.c_str(), static_cast<long long>(model->num_parameters()));
  std::printf("vit: device %s\n", apps::device_name(device).c_str());

  // ---- the shared loop: what is about images goes in the setup and the hooks ----
  apps::TrainSetup setup;
  setup.app = "vit";
  setup.unit = "images";
  setup.unit_short = "img";
  setup.model = model.get();
  setup.optimizer = &opt;
  setup.schedule = nn::WarmupCosine(o.lr, std::min(warmup, total_steps), total_steps, o.min_lr);
  setup.clip = o.clip;
  setup.loader = &loader;
  setup.epochs = o.epochs;
  setup.device = device;
  setup.config = config_json(cfg);
  setup.resume_keys = {"model", "run"};
  setup.on_epoch = [&](int64_t epoch) { train_set->set_epoch(epoch); };
  setup.curves = {"vit: " + cfg.model.attention + " attention, training loss and test accuracy",
                  "train loss, label-smoothed",
                  "test_loss",
                  "test_accuracy",
                  100,
                  "loss (cross-entropy)",
                  ""};

  apps::TrainHooks hooks;
  hooks.step = [&](const nn::Batch& batch) { return train_step(*model, batch, device, o.label_smoothing); };
  hooks.evaluate = evaluate_test;
  hooks.format_stats = [](const std::map<std::string, double>& s) {
    return "acc " + fmt("%.2f%%", 100 * s.at("accuracy"));
  };
  const int64_t K = cfg.model.classes;
  json per_class = json::object();
  hooks.summary = [&](json& summary) {
    for (int64_t k = 0; k < K; ++k) {
      int64_t row = 0;
      for (int64_t j = 0; j < K; ++j) row += last_eval.confusion[k][j];
      per_class[data.classes[k]] = row > 0 ? static_cast<double>(last_eval.confusion[k][k]) / row : 0.0;
    }
    summary.update({{"per_class_accuracy", per_class},
                    {"classes", data.classes},
                    {"confusion_matrix", last_eval.confusion},
                    {"confusion_matrix_rows", "true class"},
                    {"attention", cfg.model.attention},
                    {"model", cfg.model},
                    {"run", cfg.run}});
  };
  const apps::TrainResult tr = apps::train(setup, hooks, run);
  TrainResult result;
  result.step_losses = tr.step_losses;
  result.steps = tr.final_step - tr.start_step;
  result.train_images_per_s = tr.units_per_s;
  result.test_accuracy = tr.last_eval.values.value("test_accuracy", 0.0);  // rank 0's, on every rank
  result.test_loss = tr.last_eval.values.value("test_loss", 0.0);
  if (linea::dist::rank() == 0) print_confusion(data.classes, per_class, last_eval.confusion);
  apps::report_run(setup, run, tr,
                   "test accuracy " + fmt("%.2f%%", 100 * result.test_accuracy) + " after " +
                       std::to_string(tr.final_step) + " steps");
  return result;
}

std::vector<std::string> predict(const std::vector<std::string>& images, const std::string& checkpoint_dir,
                                 const std::string& device_arg, int64_t top_k) {
  const Device device = apps::resolve_device("vit", device_arg);
  CheckpointConfig cfg = read_config(checkpoint_dir);
  auto model = std::make_shared<VisionTransformer>(cfg.model);
  nn::load_module(checkpoint_dir + "/model.safetensors", *model);
  nn::check_finite_weights(*model, "vit: '" + checkpoint_dir + "/model.safetensors'");
  model->to(device);
  model->eval();
  NoGradGuard no_grad;
  const int64_t k = std::min<int64_t>(top_k, cfg.model.classes);
  std::vector<std::string> lines;
  for (const std::string& path : images) {
    Tensor img = nn::read_image(path, static_cast<int>(cfg.model.channels), cfg.model.image_size, cfg.model.image_size)
                     .reshape({1, cfg.model.channels, cfg.model.image_size, cfg.model.image_size})
                     .contiguous();
    normalize_(img, cfg.mean, cfg.std);
    std::vector<float> p = softmax((*model)(img.to(device)), 1).to(kCPU).to_vector<float>();
    std::vector<int64_t> order(p.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int64_t>(i);
    std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](int64_t a, int64_t b) { return p[a] > p[b]; });
    std::string line = path + ":";
    for (int64_t i = 0; i < k; ++i) line += (i ? ", " : " ") + cfg.classes[order[i]] + " " + fmt("%.3f", p[order[i]]);
    std::printf("%s\n", line.c_str());
    lines.push_back(line);
  }
  std::fflush(stdout);
  return lines;
}

}  // namespace vit
