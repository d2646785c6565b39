// The vit app's tests, on a small synthetic Fashion-MNIST-like dataset (fake_data.h: gzip IDX
// files, each class a bright bar at its own row, plus noise): a smoke test
// (512 images, every attention spec, the loss falls and stays finite), the run's outputs and what
// its evaluation scores (recomputed from the checkpoint), --time-budget, an interrupted and resumed
// run equal to an uninterrupted one (the data folder spelled another way, older checkpoints), the
// options reaching the run (and every flag of the executable its checkpoint's config), an image
// folder end to end, --predict, the augmentation, and clear errors for bad data paths, malformed
// files and bad options (run_training's, and the executable's).
// Not here: the IDX reader itself (tests/test_data.cpp), the attention mechanisms (tests/),
// kills, signals and full disks (test_vit_faults.cpp).
#include <gtest/gtest.h>
#include <stb/stb_image_write.h>
#include <sys/wait.h>
#include <zlib.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <random>

#include "apps/common/metrics.h"
#include "apps/common/plot.h"
#include "attention/registry.h"
#include "data.h"
#include "fake_data.h"
#include "linea.h"
#include "tests/test_util.h"
#include "train.h"

namespace fs = std::filesystem;
using json = nlohmann::json;
using linea::test::error_of;
using linea::test::TempDir;
using linea::test::write_all;
using namespace vit::test;

namespace {

// A small, quick model and run on the fake data.
vit::TrainOptions small_run(const std::string& data, const std::string& out, const std::string& spec) {
  vit::TrainOptions o;
  o.data_dir = data;
  o.run.out_dir = out;
  o.model.attention = spec;
  o.model.patch = 7;
  o.model.dim = 32;
  o.model.depth = 2;
  o.model.heads = 2;
  o.batch_size = 64;
  o.epochs = 4;
  o.lr = 3e-3;
  o.warmup_epochs = 0.25;
  o.run.device = "cpu";
  o.run.progress = false;
  o.run.plot = false;
  o.run.log_every = 4;
  o.run.checkpoint_every = 0;
  o.crop_padding = 0;  // the classes' bars are 2 rows apart: a shift would change the class
  return o;
}

// A folder "data" in dir holding fake Fashion-MNIST files of n_train and n_test images.
std::string fake_data(const TempDir& dir, int n_train, int n_test) {
  const std::string data = (dir.path / "data").string();
  fs::create_directories(data);
  write_fake_fashion_mnist(data, n_train, n_test);
  return data;
}

// A folder "images" in dir: train/ and test/ with the classes cat and dog, 16 and 4 RGB images of
// 10x10 each, the class's colour channel bright.
std::string image_folder(const TempDir& dir) {
  const std::string folder = (dir.path / "images").string();
  std::mt19937 rng(3);
  for (const char* split : {"train", "test"})
    for (int c = 0; c < 2; ++c) {
      const std::string sub = folder + "/" + split + "/" + (c ? "dog" : "cat");
      fs::create_directories(sub);
      for (int i = 0; i < (std::string(split) == "train" ? 16 : 4); ++i) {
        std::vector<uint8_t> px(10 * 10 * 3);
        for (size_t p = 0; p < px.size(); ++p)
          px[p] = static_cast<uint8_t>((p % 3 == size_t(c) ? 200 : 20) + rng() % 40);
        if (!stbi_write_png((sub + "/" + std::to_string(i) + ".png").c_str(), 10, 10, 3, px.data(), 30))
          throw std::runtime_error("image_folder: cannot write " + sub);
      }
    }
  return folder;
}

using linea::test::Shell;
Shell run_vit(const std::string& args, const std::string& dir) {
  return linea::test::run_shell(VIT_EXE, args, dir + "/vit_output.txt");
}

double mean_of(const std::vector<double>& v, size_t from, size_t to) {
  double s = 0;
  for (size_t i = from; i < to; ++i) s += v[i];
  return s / static_cast<double>(to - from);
}

}  // namespace

// ---- smoke test: every attention spec trains ----------------------------------------------------

class VitSmoke : public ::testing::TestWithParam<std::string> {};

TEST_P(VitSmoke, LossFallsAndStaysFinite) {
  TempDir dir;
  const std::string data = fake_data(dir, 512, 128);
  vit::TrainOptions o = small_run(data, (dir.path / "out").string(), GetParam());
  vit::TrainResult r = vit::run_training(o);
  ASSERT_EQ(r.step_losses.size(), 32u);  // 4 epochs x 512 / 64
  for (double l : r.step_losses) ASSERT_TRUE(std::isfinite(l)) << GetParam();
  const double first = mean_of(r.step_losses, 0, 4), last = mean_of(r.step_losses, 28, 32);
  EXPECT_LT(last, 0.8 * first) << GetParam() << ": loss " << first << " -> " << last;
  EXPECT_TRUE(std::isfinite(r.test_loss));
  EXPECT_GT(r.test_accuracy, 0.2) << GetParam();  // chance is 0.1
}

INSTANTIATE_TEST_SUITE_P(EveryAttention, VitSmoke, ::testing::ValuesIn(linea::attn::registered_attentions()),
                         [](const auto& info) { return info.param; });

// --time-budget: a budget far below one epoch trains one; a generous one all of --epochs; the
// epochs chosen are the run's (config.json), and --resume keeps them without probing again. The
// probe's scratch model trains on a fork of the generators (ForkRng): the run's own steps are those
// of the same run without a budget.
TEST(VitTimeBudget, ChoosesTheEpochsThatFitAndResumeKeepsThem) {
  TempDir dir;
  const std::string data = fake_data(dir, 256, 64);
  auto run_epochs = [&](const vit::TrainOptions& o) {
    return json::parse(linea::test::read_all(o.run.checkpoint() + "/config.json"))
        .at("run")
        .at("epochs")
        .get<int64_t>();
  };
  vit::TrainOptions tight = small_run(data, (dir.path / "tight").string(), "softmax");
  tight.time_budget = 1e-6;
  EXPECT_EQ(vit::run_training(tight).steps, 4);  // one epoch of 256 / 64
  EXPECT_EQ(run_epochs(tight), 1);
  tight.run.resume = true;  // done: its one epoch, not --epochs' 4
  EXPECT_EQ(vit::run_training(tight).steps, 0);
  vit::TrainOptions roomy = small_run(data, (dir.path / "roomy").string(), "softmax");
  roomy.model.dropout = 0.1;  // steps that draw, so that a probe that moved the generator would show
  roomy.time_budget = 1e6;
  roomy.run.max_steps = 6;  // stops inside epoch 2 of the 4 that fit
  const vit::TrainResult budgeted = vit::run_training(roomy);
  EXPECT_EQ(budgeted.steps, 6);
  EXPECT_EQ(run_epochs(roomy), 4);
  vit::TrainOptions plain = small_run(data, (dir.path / "plain").string(), "softmax");  // --epochs 4
  plain.model.dropout = 0.1;
  plain.run.max_steps = 6;
  EXPECT_EQ(vit::run_training(plain).step_losses, budgeted.step_losses);
  roomy.run.max_steps = 0;
  roomy.run.resume = true;
  roomy.time_budget = 1e6;
  roomy.data_dir = data + "/";  // the same folder
  testing::internal::CaptureStdout();
  const int64_t resumed_steps = vit::run_training(roomy).steps;
  const std::string printed = testing::internal::GetCapturedStdout();
  EXPECT_EQ(resumed_steps, 10);                                          // the rest of the 4 epochs
  EXPECT_EQ(printed.find("probe steps"), std::string::npos) << printed;  // the checkpoint's epochs: no probe
}

// ---- outputs, resume, predict -------------------------------------------------------------------

TEST(VitRun, WritesMetricsSummaryCurvesAndCheckpoint) {
  TempDir dir;
  const std::string data = fake_data(dir, 256, 64), out = (dir.path / "out").string();
  vit::TrainOptions o = small_run(data, out, "softmax");
  o.epochs = 2;
  o.run.plot = true;
  vit::TrainResult r = vit::run_training(o);

  std::vector<json> records = linea::apps::MetricsLog::read(out + "/metrics.jsonl");
  int steps = 0, epochs = 0;
  for (const json& j : records) {
    if (j.at("type") == "step") {
      ++steps;
      for (const char* k : {"step", "epoch", "lr", "loss", "accuracy", "images_per_s"}) EXPECT_TRUE(j.contains(k)) << k;
    } else if (j.at("type") == "epoch") {
      ++epochs;
      for (const char* k : {"step", "epoch", "lr", "train_loss", "test_loss", "test_accuracy", "images_per_s"})
        EXPECT_TRUE(j.contains(k)) << k;
    }
  }
  EXPECT_EQ(steps, 2);   // 8 steps, logged every 4
  EXPECT_EQ(epochs, 2);

  std::ifstream f(out + "/summary.json");
  json s = json::parse(f);
  EXPECT_DOUBLE_EQ(s.at("test_accuracy").get<double>(), r.test_accuracy);
  EXPECT_EQ(s.at("per_class_accuracy").size(), 10u);
  EXPECT_EQ(s.at("confusion_matrix").size(), 10u);
  int64_t total = 0;
  for (const auto& row : s.at("confusion_matrix")) {
    EXPECT_EQ(row.size(), 10u);
    for (const auto& v : row) total += v.get<int64_t>();
  }
  EXPECT_EQ(total, 64);  // every test image counted once
  for (const char* k : {"parameters", "attention", "device", "wall_time_s", "train_images_per_s"})
    EXPECT_TRUE(s.contains(k)) << k;
  EXPECT_EQ(s.at("attention"), "softmax");
  for (const char* file : {"checkpoint/model.safetensors", "checkpoint/training.safetensors", "checkpoint/config.json"})
    EXPECT_TRUE(fs::is_regular_file(out + "/" + file)) << file;
  if (linea::apps::gnuplot_available()) {
    EXPECT_GT(fs::file_size(out + "/curves.png"), 1000u);
  }

  // The summary holds the checkpoint's model and run settings; the schedule is the warmup's steps
  // (0.25 of an epoch of 4 steps) and the cosine down to --min-lr over the run's 8 steps.
  const json config = json::parse(linea::test::read_all(out + "/checkpoint/config.json"));
  EXPECT_EQ(s.at("model"), config.at("model"));
  EXPECT_EQ(s.at("run"), config.at("run"));
  EXPECT_EQ(linea::nn::load_safetensors(out + "/checkpoint/training.safetensors").metadata.at("schedule"),
            linea::nn::WarmupCosine(o.lr, 1, 8, o.min_lr).name());

  // What the evaluation scores: the checkpoint's weights (the last step's) on the test images
  // normalized with the checkpoint's statistics: the plain cross-entropy (no smoothing, although
  // the run trained with 0.1), the accuracy, and the confusion matrix with the true class as rows.
  {
    vit::VisionTransformer model(config.at("model").get<vit::VitConfig>());
    linea::nn::load_module(out + "/checkpoint/model.safetensors", model);
    model.eval();
    linea::NoGradGuard no_grad;
    vit::ImageData d = vit::load_fashion_mnist(data);
    vit::normalize_(d.test_images, config.at("normalize").at("mean").get<std::vector<double>>(),
                    config.at("normalize").at("std").get<std::vector<double>>());
    const linea::Tensor logits = model(d.test_images);
    const double loss = linea::cross_entropy(logits, d.test_labels).to(linea::DType::Float64).item();
    EXPECT_NEAR(s.at("test_loss").get<double>(), loss, 1e-5 * loss);
    const std::vector<int64_t> pred = linea::argmax(logits, 1).to_vector<int64_t>();
    const std::vector<int64_t> truth = d.test_labels.to_vector<int64_t>();
    std::vector<std::vector<int64_t>> confusion(10, std::vector<int64_t>(10, 0));
    for (size_t i = 0; i < pred.size(); ++i) confusion[truth[i]][pred[i]] += 1;
    EXPECT_EQ(s.at("confusion_matrix").get<std::vector<std::vector<int64_t>>>(), confusion);
    int64_t correct = 0;
    for (int64_t k = 0; k < 10; ++k) {
      int64_t row = 0;
      for (int64_t j = 0; j < 10; ++j) row += confusion[k][j];
      correct += confusion[k][k];
      const std::string& name = d.classes[k];
      EXPECT_DOUBLE_EQ(s.at("per_class_accuracy").at(name).get<double>(),
                       row > 0 ? static_cast<double>(confusion[k][k]) / row : 0.0)
          << name;
    }
    EXPECT_DOUBLE_EQ(s.at("test_accuracy").get<double>(), correct / 64.0);
    ASSERT_NE(confusion, [&] {  // the rows' meaning shows: the matrix is not symmetric
      auto t = confusion;
      for (int64_t k = 0; k < 10; ++k)
        for (int64_t j = 0; j < 10; ++j) t[k][j] = confusion[j][k];
      return t;
    }());
  }

  // --eval-only reproduces the final evaluation, with the checkpoint's normalization even when
  // the training images it would compute one from differ.
  vit::TrainOptions e = o;
  e.run.eval_only = true;
  e.train_limit = 100;
  vit::TrainResult ev = vit::run_training(e);
  EXPECT_EQ(ev.test_accuracy, r.test_accuracy);
  EXPECT_EQ(ev.test_loss, r.test_loss);
}

TEST(VitRun, InterruptedAndResumedRunEqualsUninterruptedOne) {
  TempDir dir;
  const std::string data = fake_data(dir, 256, 64);
  // ra: a random mechanism, so the resumed run must also restore the generator's state.
  vit::TrainOptions full = small_run(data, (dir.path / "full").string(), "ra");
  full.epochs = 3;
  vit::TrainResult a = vit::run_training(full);

  vit::TrainOptions part = full;
  part.run.out_dir = (dir.path / "part").string();
  part.run.max_steps = 6;         // stops mid-epoch 2 (4 steps per epoch)...
  part.run.checkpoint_every = 2;  // ...after a checkpoint at step 6
  vit::run_training(part);
  part.run.max_steps = 0;
  part.run.resume = true;
  part.data_dir = data + "/./";  // the same folder, spelled another way
  vit::TrainResult b = vit::run_training(part);
  EXPECT_EQ(b.steps, 12 - 6);
  ASSERT_EQ(b.step_losses.size(), 6u);
  for (size_t i = 0; i < 6; ++i) EXPECT_EQ(b.step_losses[i], a.step_losses[6 + i]) << "step " << 6 + i;
  EXPECT_EQ(b.test_loss, a.test_loss);
  EXPECT_EQ(b.test_accuracy, a.test_accuracy);

  // metrics.jsonl holds each step record once, as if the run had not been interrupted.
  std::vector<int64_t> logged;
  for (const json& j : linea::apps::MetricsLog::read(part.run.out_dir + "/metrics.jsonl")) {
    if (j.at("type") == "step") logged.push_back(j.at("step").get<int64_t>());
  }
  EXPECT_EQ(logged, (std::vector<int64_t>{4, 8, 12}));

  // A resume with other settings is refused, naming the flag.
  vit::TrainOptions other = part;
  other.lr = 1e-2;
  try {
    vit::run_training(other);
    FAIL() << "expected an error";
  } catch (const linea::Error& e) {
    EXPECT_NE(std::string(e.what()).find("lr"), std::string::npos) << e.what();
  }

  // The run records its data folder absolute and normalized. A checkpoint from before recorded it
  // as typed (and had no time_budget): it resumes with that spelling (and keeps it), and is
  // refused with another.
  const std::string config_path = part.run.checkpoint() + "/config.json";
  {
    json config = json::parse(linea::test::read_all(config_path));
    EXPECT_EQ(config.at("run").at("data"), "fashion-mnist (" + data + ")");
    vit::VisionTransformer model(config.at("model").get<vit::VitConfig>());
    linea::nn::AdamW opt(linea::nn::decay_groups(model, 1, 0, {"pos.", "cls_token"}));
    linea::nn::TrainState st = linea::nn::load_checkpoint(part.run.checkpoint(), model, opt);
    config["run"]["data"] = "fashion-mnist (" + data + "//)";
    config["run"].erase("time_budget");  // and from before --time-budget
    st.files["config.json"] = config.dump(2) + "\n";
    linea::nn::save_checkpoint(part.run.checkpoint(), model, opt, st);
  }
  vit::TrainOptions legacy = part;
  legacy.data_dir = data + "//";
  EXPECT_EQ(vit::run_training(legacy).steps, 0);
  EXPECT_EQ(json::parse(linea::test::read_all(config_path)).at("run").at("data"), "fashion-mnist (" + data + "//)");
  legacy.data_dir = data;
  const std::string refused = error_of([&] { vit::run_training(legacy); });
  EXPECT_NE(refused.find("run.data"), std::string::npos) << refused;
}

TEST(VitPredict, TopThreeClassesFromCheckpoint) {
  TempDir dir;
  const std::string data = fake_data(dir, 512, 64), out = (dir.path / "out").string();
  vit::TrainOptions o = small_run(data, out, "softmax");
  o.epochs = 12;
  o.model.dropout = 0.1;                               // predict must switch it off
  EXPECT_GT(vit::run_training(o).test_accuracy, 0.5);  // chance is 0.1
  // A PNG of class 7's bar, larger than 28x28 (predict resizes it).
  std::mt19937 rng(5);
  std::vector<uint8_t> img = bar_image(7, rng), big(56 * 56);
  for (int y = 0; y < 56; ++y)
    for (int x = 0; x < 56; ++x) big[y * 56 + x] = img[(y / 2) * 28 + x / 2];
  const std::string png = (dir.path / "seven.png").string();
  ASSERT_NE(stbi_write_png(png.c_str(), 56, 56, 1, big.data(), 56), 0);
  auto lines = vit::predict({png}, out + "/checkpoint", "cpu");
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(lines[0].rfind(png + ": Sneaker ", 0), 0u) << lines[0];  // class 7 is "Sneaker"
  EXPECT_EQ(std::count(lines[0].begin(), lines[0].end(), ','), 2) << lines[0];
  EXPECT_EQ(vit::predict({png}, out + "/checkpoint", "cpu"), lines);  // eval mode: no dropout draws
  const std::vector<std::string> all = vit::predict({png}, out + "/checkpoint", "cpu", 20);  // at most the 10 classes
  ASSERT_EQ(all.size(), 1u);
  EXPECT_EQ(std::count(all[0].begin(), all[0].end(), ','), 9) << all[0];

  EXPECT_THROW(vit::predict({(dir.path / "missing.png").string()}, out + "/checkpoint", "cpu"), linea::Error);
  EXPECT_THROW(vit::predict({png}, (dir.path / "nowhere").string(), "cpu"), linea::Error);
}

// An image folder end to end: RGB images resized to --image-size, the classes from the folder
// names, the folder recorded absolute (a resume spelled another way continues).
TEST(VitRun, TrainsOnAnImageFolderAndResumes) {
  TempDir dir;
  const std::string folder = image_folder(dir);
  vit::TrainOptions o = small_run("", (dir.path / "out").string(), "softmax");
  o.image_folder = folder;
  o.image_size = 8;
  o.model.patch = 4;
  o.batch_size = 8;
  o.epochs = 2;
  o.run.max_steps = 3;
  o.run.checkpoint_every = 1;
  EXPECT_EQ(vit::run_training(o).steps, 3);
  const json config = json::parse(linea::test::read_all(o.run.checkpoint() + "/config.json"));
  EXPECT_EQ(config.at("classes"), json({"cat", "dog"}));
  EXPECT_EQ(config.at("model").at("channels"), 3);
  EXPECT_EQ(config.at("model").at("image_size"), 8);
  EXPECT_EQ(config.at("run").at("data"), "image folder " + folder);
  o.run.max_steps = 0;
  o.run.resume = true;
  o.image_folder = folder + "/./";
  EXPECT_EQ(vit::run_training(o).steps, 5);  // of the 2 epochs of 32 / 8 images
}

// ---- augmentation -------------------------------------------------------------------------------

TEST(VitData, AugmentationShiftsFlipsAndIsReproducible) {
  using namespace linea;
  Tensor images = arange(0.0, 2.0 * 1 * 5 * 5).reshape({2, 1, 5, 5}).to(DType::Float32);
  Tensor labels = from_vector<int64_t>({3, 4}, {2});
  vit::AugmentedImages none(images, labels, 0, false, 7, {-1.0f});
  EXPECT_EQ(none.get_batch({1, 0}).at("input").to_vector<float>(),
            index_select(images, 0, from_vector<int64_t>({1, 0}, {2})).to_vector<float>());
  vit::AugmentedImages aug(images, labels, 2, true, 7, {-1.0f});
  std::set<std::vector<float>> seen;
  for (int64_t epoch = 0; epoch < 40; ++epoch) {
    aug.set_epoch(epoch);
    auto a = aug.get(0).at("input").to_vector<float>();
    EXPECT_EQ(a, aug.get(0).at("input").to_vector<float>());  // a pure function of (seed, epoch, index)
    // Every output pixel is an input pixel of the same image or the fill value.
    for (float v : a) EXPECT_TRUE(v == -1.0f || (v >= 0 && v < 25 && v == std::floor(v))) << v;
    seen.insert(a);
  }
  EXPECT_GT(seen.size(), 10u);  // shifts and flips vary with the epoch

  // Each output is the image shifted by some (dy, dx) in [-2, 2]^2, mirrored or not, the uncovered
  // border filled with its channel's value; over 60 epochs both mirrorings and shifts of every
  // row and column offset come up. Two channels, filled with -1 and -2.
  Tensor two = arange(0.0, 2.0 * 5 * 5).reshape({1, 2, 5, 5}).to(DType::Float32);
  vit::AugmentedImages aug2(two, from_vector<int64_t>({0}, {1}), 2, true, 11, {-1.0f, -2.0f});
  const std::vector<float> src = two.to_vector<float>();
  const auto transformed = [&](int64_t dy, int64_t dx, bool flip) {
    std::vector<float> out;
    for (int64_t c = 0; c < 2; ++c)
      for (int64_t y = 0; y < 5; ++y)
        for (int64_t x = 0; x < 5; ++x) {
          const int64_t sy = y + dy, sx = (flip ? 4 - x : x) + dx;
          out.push_back(sy >= 0 && sy < 5 && sx >= 0 && sx < 5 ? src[(c * 5 + sy) * 5 + sx] : -1.0f - c);
        }
    return out;
  };
  std::set<int64_t> dys, dxs, flips;
  for (int64_t epoch = 0; epoch < 60; ++epoch) {
    aug2.set_epoch(epoch);
    const std::vector<float> got = aug2.get(0).at("input").to_vector<float>();
    int matches = 0;
    for (int64_t dy = -2; dy <= 2; ++dy)
      for (int64_t dx = -2; dx <= 2; ++dx)
        for (const bool flip : {false, true})
          if (transformed(dy, dx, flip) == got) ++matches, dys.insert(dy), dxs.insert(dx), flips.insert(flip);
    EXPECT_EQ(matches, 1) << "epoch " << epoch;
  }
  EXPECT_EQ(dys.size(), 5u);
  EXPECT_EQ(dxs.size(), 5u);
  EXPECT_EQ(flips.size(), 2u);
}

// Per-channel mean and (population) standard deviation over the training images; normalize_
// leaves every channel at mean 0 and deviation 1; a constant channel's deviation is floored (no
// division by 0).
TEST(VitData, ChannelStatsAndNormalizePerChannel) {
  using namespace linea;
  std::vector<float> v;
  for (int64_t n = 0; n < 3; ++n) {
    for (int64_t i = 0; i < 4; ++i) v.push_back(static_cast<float>(n * 4 + i));  // channel 0: 0..11
    for (int64_t i = 0; i < 4; ++i) v.push_back(5.0f);                           // channel 1: constant
  }
  Tensor images = from_vector<float>(v, {3, 2, 2, 2});
  std::vector<double> m, sd;
  vit::channel_stats(images, m, sd);
  EXPECT_EQ(m, (std::vector<double>{5.5, 5.0}));
  EXPECT_NEAR(sd[0], std::sqrt(143.0 / 12), 1e-12);  // the population variance of 0..11
  EXPECT_EQ(sd[1], 1e-6);
  vit::normalize_(images, m, sd);
  const std::vector<float> out = images.to_vector<float>();
  double sum = 0, sq = 0;
  for (int64_t n = 0; n < 3; ++n)
    for (int64_t i = 0; i < 4; ++i) {
      const float x = out[static_cast<size_t>(n * 8 + i)];
      sum += x, sq += double(x) * x;
      EXPECT_EQ(out[static_cast<size_t>(n * 8 + 4 + i)], 0.0f);
    }
  EXPECT_NEAR(sum / 12, 0.0, 1e-6);
  EXPECT_NEAR(sq / 12, 1.0, 1e-5);
}

// ---- errors -------------------------------------------------------------------------------------

TEST(VitErrors, MissingAndMalformedData) {
  TempDir dir;
  EXPECT_NE(error_of([&] { vit::load_fashion_mnist((dir.path / "nowhere").string()); }).find("dataset-fashion-mnist"),
            std::string::npos);
  const std::string data = fake_data(dir, 16, 8);
  fs::remove(data + "/t10k-labels-idx1-ubyte.gz");
  EXPECT_NE(error_of([&] { vit::load_fashion_mnist(data); }).find("t10k-labels-idx1-ubyte"), std::string::npos);
  // A truncated image file.
  write_fake_fashion_mnist(data, 16, 8);
  std::string bytes;
  put_be32(bytes, 0x803);
  put_be32(bytes, 16);
  put_be32(bytes, 28);
  put_be32(bytes, 28);
  bytes += std::string(100, '\0');
  write_gz(data + "/train-images-idx3-ubyte.gz", bytes);
  EXPECT_NE(error_of([&] { vit::load_fashion_mnist(data); }).find("train-images-idx3-ubyte"), std::string::npos);
  // Images and labels of different lengths.
  write_fake_fashion_mnist(data, 16, 8);
  std::string labels;
  put_be32(labels, 0x801);
  put_be32(labels, 3);
  labels += std::string(3, '\1');
  write_gz(data + "/train-labels-idx1-ubyte.gz", labels);
  EXPECT_NE(error_of([&] { vit::load_fashion_mnist(data); }).find("different numbers"), std::string::npos);
  // An image folder without test/, and one whose images differ in size.
  const std::string folder = (dir.path / "folder").string();
  fs::create_directories(folder + "/train/a");
  EXPECT_NE(error_of([&] { vit::load_image_folder(folder, 0, 0); }).find("'test'"), std::string::npos);
  fs::create_directories(folder + "/test/a");
  std::vector<uint8_t> px(12 * 12, 100);
  stbi_write_png((folder + "/train/a/1.png").c_str(), 12, 12, 1, px.data(), 12);
  stbi_write_png((folder + "/train/a/2.png").c_str(), 10, 12, 1, px.data(), 10);
  stbi_write_png((folder + "/test/a/1.png").c_str(), 12, 12, 1, px.data(), 12);
  EXPECT_NE(error_of([&] { vit::load_image_folder(folder, 0, 0); }).find("--image-size"), std::string::npos);
  EXPECT_EQ(error_of([&] { vit::load_image_folder(folder, 0, 12); }), "(no error)");
}

// run_training checks its options itself (the CLI's ranges do not guard a program that calls it):
// each bad value on its own is refused.
TEST(VitErrors, RunTrainingRefusesEachBadOption) {
  TempDir dir;
  const std::string data = fake_data(dir, 256, 64);
  const vit::TrainOptions good = small_run(data, (dir.path / "out").string(), "softmax");
  const std::vector<std::pair<std::function<void(vit::TrainOptions&)>, std::string>> bad = {
      {[](vit::TrainOptions& o) { o.batch_size = 0; }, "--batch-size 0"},
      {[](vit::TrainOptions& o) { o.epochs = 0; }, "--epochs 0"},
      {[](vit::TrainOptions& o) { o.lr = 0; }, "bad optimization flags"},
      {[](vit::TrainOptions& o) { o.min_lr = -1e-5; }, "bad optimization flags"},
      {[](vit::TrainOptions& o) { o.weight_decay = -0.1; }, "bad optimization flags"},
      {[](vit::TrainOptions& o) { o.warmup_epochs = -1; }, "bad optimization flags"},
      {[](vit::TrainOptions& o) { o.clip = -1; }, "bad optimization flags"},
      {[](vit::TrainOptions& o) { o.label_smoothing = -0.1; }, "bad optimization flags"},
      {[](vit::TrainOptions& o) { o.label_smoothing = 1; }, "bad optimization flags"},
      {[](vit::TrainOptions& o) { o.model.heads = 0; }, "--heads 0"},
  };
  for (const auto& [change, expect] : bad) {
    vit::TrainOptions o = good;
    change(o);
    const std::string e = error_of([&] { vit::run_training(o); });
    EXPECT_NE(e.find(expect), std::string::npos) << e;
  }
}

// The example limits, the warmup, the label smoothing and the gradient clipping reach the run
// (each changes what it should).
TEST(VitRun, LimitsSmoothingAndClippingReachTheRun) {
  TempDir dir;
  const std::string data = fake_data(dir, 256, 64);
  const vit::TrainOptions good = small_run(data, (dir.path / "out").string(), "softmax");
  vit::TrainOptions limited = good;
  limited.epochs = 1;
  limited.train_limit = 128;
  limited.test_limit = 32;
  limited.warmup_epochs = 5;                       // longer than the run: the warmup is its 2 steps
  EXPECT_EQ(vit::run_training(limited).steps, 2);  // 128 / 64
  EXPECT_EQ(linea::nn::load_safetensors(limited.run.checkpoint() + "/training.safetensors").metadata.at("schedule"),
            linea::nn::WarmupCosine(limited.lr, 2, 2, limited.min_lr).name());
  const json s = json::parse(linea::test::read_all(limited.run.out_dir + "/summary.json"));
  int64_t total = 0;
  for (const auto& row : s.at("confusion_matrix"))
    for (const auto& v : row) total += v.get<int64_t>();
  EXPECT_EQ(total, 32);
  vit::TrainOptions base = good;
  base.run.max_steps = 4;
  const std::vector<double> losses = vit::run_training(base).step_losses;
  vit::TrainOptions plain = base;
  plain.label_smoothing = 0;  // the first step's loss is another function of the same logits
  EXPECT_NE(vit::run_training(plain).step_losses.at(0), losses.at(0));
  vit::TrainOptions clipped = base;
  clipped.clip = 1e-4;  // every step clipped, by a factor that varies: AdamW's steps change
  const std::vector<double> clipped_losses = vit::run_training(clipped).step_losses;
  EXPECT_EQ(clipped_losses.at(0), losses.at(0));
  EXPECT_NE(clipped_losses.at(3), losses.at(3));
}

// Every check of the loaders, each on its own bad input (an IDX file of `n` images of h x w,
// labels as given).
TEST(VitErrors, EachDataCheckNamesItsProblem) {
  TempDir dir;
  const auto idx_images = [](const std::string& path, uint32_t n, uint32_t h, uint32_t w) {
    std::string b;
    for (uint32_t v : {0x803u, n, h, w}) put_be32(b, v);
    write_gz(path, b + std::string(size_t(n) * h * w, '\x10'));
  };
  const auto idx_labels = [](const std::string& path, const std::string& labels) {
    std::string b;
    for (uint32_t v : {0x801u, static_cast<uint32_t>(labels.size())}) put_be32(b, v);
    write_gz(path, b + labels);
  };
  const std::string data = (dir.path / "data").string();
  fs::create_directories(data);
  const auto fresh = [&] { write_fake_fashion_mnist(data, 16, 8); };
  const auto load = [&] { vit::load_fashion_mnist(data); };
  fresh();
  EXPECT_EQ(error_of(load), "(no error)");
  // --data names a file; an IDX name that is a folder.
  EXPECT_NE(error_of([&] { vit::load_fashion_mnist(data + "/t10k-labels-idx1-ubyte.gz"); }).find("is a file"),
            std::string::npos);
  fs::remove(data + "/t10k-labels-idx1-ubyte.gz");
  fs::create_directories(data + "/t10k-labels-idx1-ubyte.gz");
  EXPECT_NE(error_of(load).find("not a regular file"), std::string::npos) << error_of(load);
  fs::remove(data + "/t10k-labels-idx1-ubyte.gz");
  // Test images and labels of different lengths.
  fresh();
  idx_labels(data + "/t10k-labels-idx1-ubyte.gz", std::string(5, '\1'));
  EXPECT_NE(error_of(load).find("test 8 vs 5"), std::string::npos) << error_of(load);
  // Images that are not square, or of two sizes.
  fresh();
  idx_images(data + "/train-images-idx3-ubyte.gz", 16, 28, 20);
  idx_images(data + "/t10k-images-idx3-ubyte.gz", 8, 28, 20);
  EXPECT_NE(error_of(load).find("square images of one size"), std::string::npos) << error_of(load);
  idx_images(data + "/train-images-idx3-ubyte.gz", 16, 28, 28);
  idx_images(data + "/t10k-images-idx3-ubyte.gz", 8, 14, 14);
  EXPECT_NE(error_of(load).find("square images of one size"), std::string::npos) << error_of(load);
  // No images at all; a label past the ten classes.
  fresh();
  idx_images(data + "/t10k-images-idx3-ubyte.gz", 0, 28, 28);
  idx_labels(data + "/t10k-labels-idx1-ubyte.gz", "");
  EXPECT_NE(error_of(load).find("hold no images"), std::string::npos) << error_of(load);
  fresh();
  idx_labels(data + "/t10k-labels-idx1-ubyte.gz", std::string(7, '\1') + "\x0a");
  EXPECT_NE(error_of(load).find("labels must lie in 0..9, found 0..10"), std::string::npos) << error_of(load);

  // Image folders: train/ a file; a file that is no image (its own error, not a size hint);
  // non-square images; train/ and test/ with other classes. Colour train images make the test
  // images colour too.
  const std::string folder = (dir.path / "folder").string();
  fs::create_directories(folder + "/test/a");
  write_all(folder + "/train", "x");
  EXPECT_NE(error_of([&] { vit::load_image_folder(folder, 0, 0); }).find("'train' is a file"), std::string::npos);
  fs::remove(folder + "/train");
  fs::create_directories(folder + "/train/a");
  std::vector<uint8_t> px(12 * 12 * 3, 100);
  write_all(folder + "/train/a/0.png", "not a png");
  const std::string bad = error_of([&] { vit::load_image_folder(folder, 0, 0); });
  EXPECT_NE(bad.find("0.png"), std::string::npos) << bad;
  EXPECT_EQ(bad.find("--image-size"), std::string::npos) << bad;
  fs::remove(folder + "/train/a/0.png");
  stbi_write_png((folder + "/train/a/1.png").c_str(), 12, 10, 3, px.data(), 12 * 3);
  stbi_write_png((folder + "/test/a/1.png").c_str(), 12, 10, 1, px.data(), 12);
  EXPECT_NE(error_of([&] { vit::load_image_folder(folder, 0, 0); }).find("square images"), std::string::npos);
  stbi_write_png((folder + "/train/a/1.png").c_str(), 12, 12, 3, px.data(), 12 * 3);
  stbi_write_png((folder + "/test/a/1.png").c_str(), 12, 12, 1, px.data(), 12);
  const vit::ImageData d = vit::load_image_folder(folder, 0, 0);
  EXPECT_EQ(d.test_images.shape(), linea::Shape({1, 3, 12, 12}));
  fs::rename(folder + "/test/a", folder + "/test/b");
  EXPECT_NE(error_of([&] { vit::load_image_folder(folder, 0, 0); }).find("same class folders"), std::string::npos);
}

// limit_examples keeps the first rows of images and labels together, and a limit past the data
// (or 0) keeps all; each example's crop and flip are its own (the draw takes its index), and an
// index past the data or a padding as wide as the image is an error.
TEST(VitData, LimitsAndPerExampleDraws) {
  using namespace linea;
  TempDir dir;
  write_fake_fashion_mnist(dir.path.string(), 16, 8);
  vit::ImageData d = vit::load_fashion_mnist(dir.path.string());
  const Tensor first_labels = narrow(d.train_labels, 0, 0, 5).contiguous();
  vit::limit_examples(d, 5, 100);
  EXPECT_EQ(d.train_images.size(0), 5);
  EXPECT_EQ(d.train_labels.size(0), 5);
  EXPECT_EQ(d.train_labels.to_vector<int64_t>(), first_labels.to_vector<int64_t>());
  EXPECT_EQ(d.test_images.size(0), 8);
  EXPECT_EQ(d.test_labels.size(0), 8);
  vit::limit_examples(d, 0, 3);
  EXPECT_EQ(d.train_labels.size(0), 5);
  EXPECT_EQ(d.test_images.size(0), 3);
  EXPECT_EQ(d.test_labels.size(0), 3);

  Tensor same = arange(0.0, 25.0).reshape({1, 1, 5, 5}).to(DType::Float32).expand({2, 1, 5, 5}).contiguous();
  vit::AugmentedImages aug(same, from_vector<int64_t>({0, 0}, {2}), 2, true, 3, {-1.0f});
  int differ = 0;
  for (int64_t epoch = 0; epoch < 10; ++epoch) {
    aug.set_epoch(epoch);
    const std::vector<float> b = aug.get_batch({0, 1}).at("input").to_vector<float>();
    differ += !std::equal(b.begin(), b.begin() + 25, b.begin() + 25);
  }
  EXPECT_GE(differ, 5);  // two copies of one image, each drawn on its own
  EXPECT_LINEA_ERROR(aug.get(2), "vit: example 2 out of range for 2 images");  // before reading past the images
  EXPECT_LINEA_ERROR(aug.get_batch({1, 2}), "vit: example 2 out of range for 2 images");
  EXPECT_THROW(vit::AugmentedImages(same, from_vector<int64_t>({0, 0}, {2}), 5, true, 3, {-1.0f}), Error);
}

TEST(VitCli, ExitsNonZeroWithClearMessages) {
  TempDir dir;
  const std::string d = dir.path.string();
  Shell r = run_vit("--data " + d + "/nowhere --no-progress --out " + d + "/out", d);
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.output.find("error: vit:"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("dataset-fashion-mnist"), std::string::npos) << r.output;

  r = run_vit("--predict x.png", d);
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.output.find("--checkpoint"), std::string::npos) << r.output;

  r = run_vit("--attention nosuch --data " + d, d);
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.output.find("nosuch"), std::string::npos) << r.output;

  r = run_vit("--batch-size 0", d);  // CLI11 range check
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.output.find("batch-size"), std::string::npos) << r.output;

  r = run_vit("--help", d);
  EXPECT_EQ(r.code, 0);
  for (const char* flag : {"--attention", "--patch", "--pool", "--resume", "--predict", "--device", "--threads"})
    EXPECT_NE(r.output.find(flag), std::string::npos) << flag;
}

TEST(VitCli, TrainsAndPredictsEndToEnd) {
  TempDir dir;
  const std::string d = dir.path.string();
  fs::create_directories(d + "/data");
  write_fake_fashion_mnist(d + "/data", 256, 64);
  Shell r = run_vit("--data " + d + "/data --epochs 1 --patch 7 --dim 32 --depth 1 --heads 2 --batch-size 64 "
                    "--threads 1 --out " + d + "/out",
                    d);
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("test accuracy"), std::string::npos) << r.output;
  EXPECT_TRUE(fs::is_regular_file(d + "/out/summary.json"));
  std::mt19937 rng(3);
  auto img = bar_image(2, rng);
  ASSERT_NE(stbi_write_png((d + "/two.png").c_str(), 28, 28, 1, img.data(), 28), 0);
  r = run_vit("--predict " + d + "/two.png " + d + "/two.png --checkpoint " + d + "/out/checkpoint", d);
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 2) << r.output;
}

// Every flag reaches the run: each set away from its default, the checkpoint's config holds it.
TEST(VitCli, EveryFlagReachesTheCheckpointConfig) {
  TempDir dir;
  const std::string d = dir.path.string(), data = fake_data(dir, 96, 40);
  Shell r = run_vit("--data " + data + " --train-limit 64 --test-limit 24 --patch 7 --dim 16 --depth 1 --heads 2 " +
                        "--mlp-ratio 1.5 --dropout 0.05 --init trunc_normal --pool mean --epochs 3 " +
                        "--time-budget 3600 --batch-size 32 --min-lr 2e-5 --weight-decay 0.02 --warmup 0.25 " +
                        "--label-smoothing 0.05 --crop-padding 2 --no-flip --threads 1 --no-progress --no-plot " +
                        "--out " + d + "/out",
                    d);
  ASSERT_EQ(r.code, 0) << r.output;
  json config = json::parse(linea::test::read_all(d + "/out/checkpoint/config.json"));
  const json& model = config.at("model");
  for (const auto& [key, value] : std::vector<std::pair<std::string, json>>{{"patch", 7},
                                                                            {"dim", 16},
                                                                            {"depth", 1},
                                                                            {"heads", 2},
                                                                            {"mlp_ratio", 1.5},
                                                                            {"dropout", 0.05},
                                                                            {"init", "trunc_normal"},
                                                                            {"pool", "mean"}})
    EXPECT_EQ(model.at(key), value) << key;
  const json& run = config.at("run");
  EXPECT_EQ(run.at("train_examples"), 64);  // --train-limit
  for (const auto& [key, value] : std::vector<std::pair<std::string, json>>{{"epochs", 3},
                                                                            {"time_budget", 3600.0},
                                                                            {"batch_size", 32},
                                                                            {"min_lr", 2e-5},
                                                                            {"weight_decay", 0.02},
                                                                            {"warmup_epochs", 0.25},
                                                                            {"label_smoothing", 0.05},
                                                                            {"crop_padding", 2},
                                                                            {"flip", false}})
    EXPECT_EQ(run.at(key), value) << key;
  const json summary = json::parse(linea::test::read_all(d + "/out/summary.json"));
  EXPECT_EQ(summary.at("confusion_matrix").size(), 10u);
  int64_t tested = 0;
  for (const auto& row : summary.at("confusion_matrix"))
    for (const auto& v : row) tested += v.get<int64_t>();
  EXPECT_EQ(tested, 24);  // --test-limit

  // An image folder's size and channels: RGB images read as gray and resized to 8x8.
  r = run_vit("--image-folder " + image_folder(dir) + " --image-size 8 --channels 1 --patch 4 --dim 16 --depth 1 " +
                  "--heads 2 --epochs 1 --batch-size 8 --threads 1 --no-progress --no-plot --out " + d + "/folder",
              d);
  ASSERT_EQ(r.code, 0) << r.output;
  config = json::parse(linea::test::read_all(d + "/folder/checkpoint/config.json"));
  EXPECT_EQ(config.at("model").at("image_size"), 8);
  EXPECT_EQ(config.at("model").at("channels"), 1);
}
