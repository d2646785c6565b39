#include "train.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "apps/common/device.h"
#include "apps/common/metrics.h"
#include "apps/common/plot.h"
#include "apps/common/progress.h"
#include "data.h"
#include "attention/transformer.h"
#include "nn/checkpoint.h"
#include "nn/io_util.h"
#include "nn/loss.h"
#include "nn/optim.h"
#include "nn/safetensors.h"
#include "nn/schedule.h"

namespace fs = std::filesystem;
using json = nlohmann::json;
using namespace linea;

namespace vit {

namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

json model_json(const VitConfig& c) {
  return {{"image_size", c.image_size}, {"channels", c.channels}, {"classes", c.classes},    {"patch", c.patch},
          {"dim", c.dim},               {"depth", c.depth},       {"heads", c.heads},        {"mlp_ratio", c.mlp_ratio},
          {"dropout", c.dropout},       {"pool", c.pool},         {"attention", c.attention}, {"init", c.init}};
}

VitConfig model_from_json(const json& j) {
  VitConfig c;
  c.image_size = j.at("image_size");
  c.channels = j.at("channels");
  c.classes = j.at("classes");
  c.patch = j.at("patch");
  c.dim = j.at("dim");
  c.depth = j.at("depth");
  c.heads = j.at("heads");
  c.mlp_ratio = j.at("mlp_ratio");
  c.dropout = j.at("dropout");
  c.pool = j.at("pool");
  c.attention = j.at("attention");
  c.init = j.value("init", "trunc_normal");
  return c;
}

// The flags that define a run: a resumed run must use the same ones (the others — device,
// threads, logging, --max-steps — may change between the interrupted and the resumed run).
json run_json(const TrainOptions& o, const ImageData& d) {
  return {{"data", d.source},
          {"train_examples", d.train_images.size(0)},
          {"batch_size", o.batch_size},
          {"epochs", o.epochs},
          {"lr", o.lr},
          {"min_lr", o.min_lr},
          {"weight_decay", o.weight_decay},
          {"warmup_epochs", o.warmup_epochs},
          {"label_smoothing", o.label_smoothing},
          {"clip", o.clip},
          {"crop_padding", o.crop_padding},
          {"flip", o.flip},
          {"seed", o.seed}};
}

json read_json_file(const std::string& path) {
  std::ifstream f(path);
  LINEA_CHECK(f.good(), "vit: cannot read '", path, "'");
  try {
    return json::parse(f);
  } catch (const std::exception& e) {
    LINEA_FAIL("vit: '", path, "' is not valid JSON: ", e.what());
  }
}

// "key: saved vs now" for every differing key, or "" when equal.
std::string json_diff(const json& saved, const json& now) {
  std::string out;
  for (auto it = now.begin(); it != now.end(); ++it) {
    const std::string s = saved.contains(it.key()) ? saved.at(it.key()).dump() : "(absent)";
    if (s != it.value().dump()) out += "\n  " + it.key() + ": checkpoint " + s + ", now " + it.value().dump();
  }
  return out;
}

// What --predict needs besides the weights: the model, the class names and the normalization.
struct CheckpointConfig {
  VitConfig model;
  std::vector<std::string> classes;
  std::vector<double> mean, std;
  json run;
};

json config_json(const CheckpointConfig& c) {
  return {{"format", "linea-vit/1"}, {"model", model_json(c.model)}, {"classes", c.classes},
          {"normalize", {{"mean", c.mean}, {"std", c.std}}}, {"run", c.run}};
}

CheckpointConfig read_config(const std::string& dir) {
  const std::string path = dir + "/config.json";
  LINEA_CHECK(fs::is_regular_file(path), "vit: '", dir,
              "' is not a vit checkpoint (no config.json; pass the --checkpoint directory of a training run)");
  json j = read_json_file(path);
  try {
    LINEA_CHECK(j.at("format") == "linea-vit/1", "unknown format ", j.at("format").dump());
    CheckpointConfig c;
    c.model = model_from_json(j.at("model"));
    c.classes = j.at("classes").get<std::vector<std::string>>();
    c.mean = j.at("normalize").at("mean").get<std::vector<double>>();
    c.std = j.at("normalize").at("std").get<std::vector<double>>();
    c.run = j.at("run");
    LINEA_CHECK(static_cast<int64_t>(c.classes.size()) == c.model.classes &&
                    static_cast<int64_t>(c.mean.size()) == c.model.channels && c.std.size() == c.mean.size(),
                "inconsistent classes/channels");
    return c;
  } catch (const Error& e) {
    LINEA_FAIL("vit: '", path, "' is malformed: ", e.what());
  } catch (const std::exception& e) {
    LINEA_FAIL("vit: '", path, "' is malformed: ", e.what());
  }
}

void save_all(const std::string& dir, const VisionTransformer& model, const nn::Optimizer& opt,
              const nn::TrainState& state, const CheckpointConfig& cfg) {
  nn::save_checkpoint(dir, model, opt, state);
  nn::write_text_file_atomic(dir + "/config.json", config_json(cfg).dump(2) + "\n");
}

struct EvalResult {
  double loss = 0, accuracy = 0, images_per_s = 0;
  std::vector<std::vector<int64_t>> confusion;  // [true][predicted]
};

// Test-set loss (plain cross-entropy, no smoothing) and accuracy, in eval mode, without a graph.
EvalResult evaluate(VisionTransformer& model, const Tensor& images, const Tensor& labels, Device device,
                    int64_t batch_size, const std::string& label, bool progress) {
  NoGradGuard no_grad;
  model.eval();
  // Evaluation runs on a fork of the generators (a mechanism may still sample in eval, e.g.
  // unbiased RA): the training run's random stream is the same with or without evaluations, so
  // a resumed run matches an uninterrupted one wherever their evaluations happened.
  const std::vector<uint64_t> rng_cpu = get_rng_state(kCPU);
  const std::vector<uint64_t> rng_dev = device.is_cuda() ? get_rng_state(device) : std::vector<uint64_t>{};
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
    loss_sum = loss_sum + sum(nn::cross_entropy_loss(logits, y, -100, 0.0, Reduction::Sum)).to(DType::Float64);
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
  set_rng_state(rng_cpu, kCPU);
  if (device.is_cuda()) set_rng_state(rng_dev, device);
  model.train();
  return r;
}

void draw_curves(const std::string& out_dir, const std::string& attention) {
  std::vector<json> records = apps::MetricsLog::read(out_dir + "/metrics.jsonl");
  apps::Series step_loss{"train loss, label-smoothed (logged steps)", {}, {}};
  apps::Series epoch_train{"train loss, label-smoothed (epoch mean)", {}, {}};
  apps::Series epoch_test{"test loss", {}, {}};
  apps::Series test_acc{"test accuracy (right axis)", {}, {}};
  epoch_train.points = epoch_test.points = test_acc.points = true;
  test_acc.right_axis = true;
  for (const json& r : records) {
    const std::string type = r.value("type", "");
    if (type == "step") {
      step_loss.x.push_back(r.at("epoch_progress").get<double>());
      step_loss.y.push_back(r.at("loss").get<double>());
    } else if (type == "epoch") {
      const double e = r.at("epoch").get<double>();
      epoch_train.x.push_back(e);
      epoch_train.y.push_back(r.at("train_loss").get<double>());
      epoch_test.x.push_back(e);
      epoch_test.y.push_back(r.at("test_loss").get<double>());
      test_acc.x.push_back(e);
      test_acc.y.push_back(100.0 * r.at("test_accuracy").get<double>());
    }
  }
  apps::Figure fig;
  fig.title = "vit: " + attention + " attention, training loss and test accuracy";
  fig.xlabel = "epoch";
  fig.ylabel = "loss (cross-entropy)";
  fig.y2label = "test accuracy (%)";
  fig.series = {step_loss, epoch_train, epoch_test, test_acc};
  std::string err;
  if (!apps::plot_png(out_dir + "/curves.png", fig, &err))
    std::fprintf(stderr, "vit: warning: curves.png not drawn: %s\n", err.c_str());
}

}  // namespace

TrainResult run_training(const TrainOptions& o) {
  const auto t_start = Clock::now();
  apps::set_threads(o.threads);
  const Device device = apps::resolve_device("vit", o.device);
  LINEA_CHECK(o.batch_size >= 1 && o.epochs >= 1, "vit: --batch-size ", o.batch_size, " and --epochs ", o.epochs,
              " must be positive");
  LINEA_CHECK(o.lr > 0 && o.min_lr >= 0 && o.weight_decay >= 0 && o.warmup_epochs >= 0 && o.clip >= 0 &&
                  o.label_smoothing >= 0 && o.label_smoothing < 1,
              "vit: bad optimization flags: --lr ", o.lr, " --min-lr ", o.min_lr, " --weight-decay ", o.weight_decay,
              " --warmup ", o.warmup_epochs, " --clip ", o.clip, " --label-smoothing ", o.label_smoothing);
  const std::string ckpt_dir = o.checkpoint_dir.empty() ? o.out_dir + "/checkpoint" : o.checkpoint_dir;
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
  cfg.run = run_json(o, data);
  const int64_t n_train = data.train_images.size(0);
  const int64_t steps_per_epoch = n_train / o.batch_size;
  LINEA_CHECK(steps_per_epoch >= 1, "vit: --batch-size ", o.batch_size, " is larger than the ", n_train,
              " training images");
  const int64_t total_steps = steps_per_epoch * o.epochs;

  // ---- model and optimizer ----
  manual_seed(o.seed);
  auto model = std::make_shared<VisionTransformer>(cfg.model);
  model->to(device);
  // No weight decay for biases, norms, the positional embedding and the CLS token (as timm's ViT).
  nn::AdamW opt(nn::decay_groups(*model, o.lr, o.weight_decay, {"pos.", "cls_token"}));
  const auto warmup = static_cast<int64_t>(std::llround(o.warmup_epochs * steps_per_epoch));
  nn::Schedule sched = nn::WarmupCosine(o.lr, std::min(warmup, total_steps), total_steps, o.min_lr);
  const std::vector<Tensor> params = model->parameters();

  nn::TrainState state;
  bool resumed = false;
  if ((o.resume || o.eval_only) && nn::checkpoint_exists(ckpt_dir)) {
    CheckpointConfig saved = read_config(ckpt_dir);
    std::string diff = json_diff(model_json(saved.model), model_json(cfg.model));
    if (!o.eval_only) diff += json_diff(saved.run, cfg.run);
    LINEA_CHECK(diff.empty(), "vit: --resume: the checkpoint in '", ckpt_dir,
                "' was made with other settings; use the same flags (or another --checkpoint/--out):", diff);
    state = nn::load_checkpoint(ckpt_dir, *model, opt);
    resumed = true;
    // The model was trained on data normalized with these (--eval-only may use other data).
    cfg.mean = saved.mean;
    cfg.std = saved.std;
  } else if (o.eval_only) {
    LINEA_FAIL("vit: --eval-only needs a checkpoint, but '", ckpt_dir, "' holds none");
  } else if (o.resume) {
    std::printf("vit: --resume: no checkpoint in '%s' yet, starting from scratch\n", ckpt_dir.c_str());
  }
  const int64_t start_step = state.step;
  normalize_(data.train_images, cfg.mean, cfg.std);
  normalize_(data.test_images, cfg.mean, cfg.std);

  const std::string dev_name = apps::device_name(device);
  std::printf("vit: %s, %lld train / %lld test images of %lldx%lldx%lld, %zu classes\n", data.source.c_str(),
              static_cast<long long>(n_train), static_cast<long long>(data.test_images.size(0)),
              static_cast<long long>(cfg.model.channels), static_cast<long long>(cfg.model.image_size),
              static_cast<long long>(cfg.model.image_size), data.classes.size());
  std::printf("vit: ViT patch %lld, dim %lld, depth %lld, heads %lld, mlp ratio %g, pool %s, attention %s: %lld "
              "parameters\n",
              static_cast<long long>(cfg.model.patch), static_cast<long long>(cfg.model.dim),
              static_cast<long long>(cfg.model.depth), static_cast<long long>(cfg.model.heads), cfg.model.mlp_ratio,
              cfg.model.pool.c_str(), cfg.model.attention.c_str(), static_cast<long long>(model->num_parameters()));
  std::printf("vit: device %s\n", dev_name.c_str());
  if (resumed) std::printf("vit: resumed from '%s' at step %lld\n", ckpt_dir.c_str(), static_cast<long long>(start_step));
  std::fflush(stdout);

  fs::create_directories(o.out_dir);
  const int64_t eval_batch = std::max<int64_t>(o.batch_size, 256);
  TrainResult result;

  if (o.eval_only) {
    EvalResult ev = evaluate(*model, data.test_images, data.test_labels, device, eval_batch, "test", o.progress);
    std::printf("vit: test loss %.4f, accuracy %.2f%% (%lld images, %.0f images/s)\n", ev.loss, 100 * ev.accuracy,
                static_cast<long long>(data.test_images.size(0)), ev.images_per_s);
    result.test_accuracy = ev.accuracy;
    result.test_loss = ev.loss;
    return result;
  }

  // ---- training ----
  apps::MetricsLog metrics(o.out_dir + "/metrics.jsonl", resumed ? start_step : -1);
  auto train_set = std::make_shared<AugmentedImages>(
      data.train_images, data.train_labels, o.crop_padding, o.flip, o.seed ^ 0x5eedULL,
      // a black pixel after normalization, for the crop's padding
      [&] {
        std::vector<float> f;
        for (size_t c = 0; c < cfg.mean.size(); ++c) f.push_back(static_cast<float>(-cfg.mean[c] / cfg.std[c]));
        return f;
      }());
  nn::DataLoaderOptions lo;
  lo.batch_size = o.batch_size;
  lo.shuffle = true;
  lo.seed = o.seed;
  lo.drop_last = true;
  nn::DataLoader loader(train_set, lo);

  const int64_t stop_step = o.max_steps > 0 ? std::min(total_steps, o.max_steps) : total_steps;
  int64_t step = start_step;
  double train_seconds = 0;
  int64_t train_images = 0;
  EvalResult last_eval;
  bool have_eval = false;
  model->train();
  for (int64_t epoch = step / steps_per_epoch; epoch < o.epochs && step < stop_step; ++epoch) {
    const int64_t first_batch = step - epoch * steps_per_epoch;
    const int64_t epoch_end = std::min((epoch + 1) * steps_per_epoch, stop_step);
    train_set->set_epoch(epoch);
    loader.reset(epoch, first_batch);
    const std::string label = "epoch " + std::to_string(epoch + 1) + "/" + std::to_string(o.epochs);
    std::unique_ptr<apps::ProgressBar> bar;
    if (o.progress) bar = std::make_unique<apps::ProgressBar>(label + " train", (epoch_end - epoch * steps_per_epoch) * o.batch_size);
    // Running sums on the device, read back only at log points (no per-step host sync on CUDA).
    Tensor loss_sum = zeros({}, TensorOptions(DType::Float64).with_device(device));
    Tensor correct_sum = zeros({}, TensorOptions(DType::Int64).with_device(device));
    Tensor log_loss = zeros({}, TensorOptions(DType::Float64).with_device(device));
    Tensor log_correct = zeros({}, TensorOptions(DType::Int64).with_device(device));
    int64_t epoch_steps = 0, log_steps = 0;
    double lr = 0;
    const auto t_epoch = Clock::now();
    nn::Batch batch;
    while (step < epoch_end && loader.next(batch)) {
      Tensor x = batch.input.to(device), y = batch.target.to(device);
      lr = nn::apply_schedule(opt, sched, step);
      Tensor logits = (*model)(x);
      Tensor loss = nn::cross_entropy_loss(logits, y, -100, o.label_smoothing);
      opt.zero_grad();
      loss.backward();
      if (o.clip > 0) nn::clip_grad_norm_(params, o.clip);
      opt.step();
      ++step;
      ++epoch_steps;
      ++log_steps;
      Tensor l = loss.detach().to(DType::Float64);
      loss_sum = loss_sum + l;
      log_loss = log_loss + l;
      Tensor correct = sum(eq(argmax(logits.detach(), 1), y).to(DType::Int64));
      correct_sum = correct_sum + correct;
      log_correct = log_correct + correct;
      if (device.is_cpu()) result.step_losses.push_back(l.item());
      const bool log_now = o.log_every > 0 && step % o.log_every == 0;
      if (log_now || (bar && epoch_steps % 10 == 0) || step == epoch_end) {
        const double secs = seconds_since(t_epoch);
        const double mean_loss = loss_sum.item() / epoch_steps;
        const double acc = static_cast<double>(correct_sum.item<int64_t>()) / (epoch_steps * o.batch_size);
        if (bar)
          bar->update((first_batch + epoch_steps) * o.batch_size,
                      "loss " + fmt("%.4f", mean_loss) + "  acc " + fmt("%.1f%%", 100 * acc) + "  lr " + fmt("%.2e", lr));
        if (log_now) {
          metrics.write({{"type", "step"},
                         {"step", step},
                         {"epoch", epoch + 1},
                         {"epoch_progress", static_cast<double>(step) / steps_per_epoch},
                         {"lr", lr},
                         {"loss", log_loss.item() / log_steps},  // both over the steps since the last record
                         {"accuracy", static_cast<double>(log_correct.item<int64_t>()) / (log_steps * o.batch_size)},
                         {"images_per_s", epoch_steps * o.batch_size / std::max(secs, 1e-9)}});
          log_loss = zeros({}, TensorOptions(DType::Float64).with_device(device));
          log_correct = zeros({}, TensorOptions(DType::Int64).with_device(device));
          log_steps = 0;
        }
      }
      // Mid-epoch checkpoints; the one at the epoch's end is saved after its evaluation.
      if (o.checkpoint_every > 0 && step % o.checkpoint_every == 0 && step % steps_per_epoch != 0 && step < stop_step) {
        state.step = step;
        state.epoch = epoch;
        save_all(ckpt_dir, *model, opt, state, cfg);
      }
    }
    const double epoch_secs = seconds_since(t_epoch);
    train_seconds += epoch_secs;
    train_images += epoch_steps * o.batch_size;
    const double train_loss = loss_sum.item() / std::max<int64_t>(epoch_steps, 1);
    const double train_acc = static_cast<double>(correct_sum.item<int64_t>()) / std::max<int64_t>(epoch_steps * o.batch_size, 1);
    const double ips = epoch_steps * o.batch_size / std::max(epoch_secs, 1e-9);
    if (bar) bar->finish("loss " + fmt("%.4f", train_loss) + "  acc " + fmt("%.1f%%", 100 * train_acc));

    last_eval = evaluate(*model, data.test_images, data.test_labels, device, eval_batch, label + " test", o.progress);
    have_eval = true;
    const bool epoch_done = step % steps_per_epoch == 0;
    std::printf("%s  train loss %.4f acc %.2f%%  test loss %.4f acc %.2f%%  %.0f img/s  lr %.2e  [%s]%s\n",
                label.c_str(), train_loss, 100 * train_acc, last_eval.loss, 100 * last_eval.accuracy, ips, lr,
                apps::format_duration(seconds_since(t_start)).c_str(), epoch_done ? "" : "  (partial epoch)");
    std::fflush(stdout);
    metrics.write({{"type", "epoch"},
                   {"step", step},
                   {"epoch", epoch_done ? static_cast<double>(epoch + 1) : static_cast<double>(step) / steps_per_epoch},
                   {"lr", lr},
                   {"train_loss", train_loss},
                   {"train_accuracy", train_acc},
                   {"test_loss", last_eval.loss},
                   {"test_accuracy", last_eval.accuracy},
                   {"images_per_s", ips},
                   {"eval_images_per_s", last_eval.images_per_s},
                   {"elapsed_s", seconds_since(t_start)}});
    state.step = step;
    state.epoch = step / steps_per_epoch;
    save_all(ckpt_dir, *model, opt, state, cfg);
    if (o.plot) draw_curves(o.out_dir, cfg.model.attention);
  }
  if (!have_eval) {  // resumed after the last step: evaluate the final model once more for the summary
    last_eval = evaluate(*model, data.test_images, data.test_labels, device, eval_batch, "test", o.progress);
    if (o.plot) draw_curves(o.out_dir, cfg.model.attention);
  }

  // ---- summary ----
  const int64_t K = cfg.model.classes;
  json per_class = json::object();
  for (int64_t k = 0; k < K; ++k) {
    int64_t row = 0;
    for (int64_t j = 0; j < K; ++j) row += last_eval.confusion[k][j];
    per_class[data.classes[k]] = row > 0 ? static_cast<double>(last_eval.confusion[k][k]) / row : 0.0;
  }
  result.test_accuracy = last_eval.accuracy;
  result.test_loss = last_eval.loss;
  result.steps = step - start_step;
  result.train_images_per_s = train_images / std::max(train_seconds, 1e-9);
  const double wall = seconds_since(t_start);
  json summary = {{"test_accuracy", last_eval.accuracy},
                  {"test_loss", last_eval.loss},
                  {"per_class_accuracy", per_class},
                  {"classes", data.classes},
                  {"confusion_matrix", last_eval.confusion},
                  {"confusion_matrix_rows", "true class"},
                  {"parameters", model->num_parameters()},
                  {"attention", cfg.model.attention},
                  {"model", model_json(cfg.model)},
                  {"run", cfg.run},
                  {"device", dev_name},
                  {"steps", step},
                  {"epochs_completed", static_cast<double>(step) / steps_per_epoch},
                  {"resumed_from_step", resumed ? json(start_step) : json(nullptr)},
                  {"wall_time_s", wall},
                  {"train_images_per_s", result.train_images_per_s},
                  {"eval_images_per_s", last_eval.images_per_s},
                  {"checkpoint", ckpt_dir}};
  nn::write_text_file_atomic(o.out_dir + "/summary.json", summary.dump(2) + "\n");

  std::printf("\nper-class test accuracy:\n");
  for (int64_t k = 0; k < K; ++k)
    std::printf("  %-14s %6.2f%%\n", data.classes[k].c_str(), 100 * per_class[data.classes[k]].get<double>());
  std::printf("confusion matrix (rows: true class, columns: predicted):\n     ");
  for (int64_t j = 0; j < K; ++j) std::printf("%6lld", static_cast<long long>(j));
  std::printf("\n");
  for (int64_t k = 0; k < K; ++k) {
    std::printf("  %2lld ", static_cast<long long>(k));
    for (int64_t j = 0; j < K; ++j) std::printf("%6lld", static_cast<long long>(last_eval.confusion[k][j]));
    std::printf("\n");
  }
  std::printf("\nvit: test accuracy %.2f%% after %lld steps (%s wall, %.0f train images/s on %s)\n",
              100 * last_eval.accuracy, static_cast<long long>(step), apps::format_duration(wall).c_str(),
              result.train_images_per_s, dev_name.c_str());
  std::printf("vit: outputs in %s: metrics.jsonl, summary.json, curves.png; checkpoint %s\n", o.out_dir.c_str(),
              ckpt_dir.c_str());
  std::fflush(stdout);
  return result;
}

std::vector<std::string> predict(const std::vector<std::string>& images, const std::string& checkpoint_dir,
                                 const std::string& device_arg, int64_t top_k) {
  const Device device = apps::resolve_device("vit", device_arg);
  CheckpointConfig cfg = read_config(checkpoint_dir);
  auto model = std::make_shared<VisionTransformer>(cfg.model);
  nn::load_module(checkpoint_dir + "/model.safetensors", *model);
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
    for (int64_t i = 0; i < k; ++i)
      line += (i ? ", " : " ") + cfg.classes[order[i]] + " " + fmt("%.3f", p[order[i]]);
    std::printf("%s\n", line.c_str());
    lines.push_back(line);
  }
  std::fflush(stdout);
  return lines;
}

}  // namespace vit
