// Training checkpoints: resuming after 5 steps reproduces 10 uninterrupted steps bit for bit
// (model, AdamW moments, RNG for dropout and input noise, learning rates), a failed save leaves
// the previous checkpoint intact, and mismatched or foreign files are rejected clearly.
// Not here: the safetensors format itself (test_safetensors.cpp).
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>

#include "nn/checkpoint.h"
#include "nn/optim.h"
#include "nn/safetensors.h"
#include "test_util.h"

using namespace linea;
using namespace linea::nn;
namespace fs = std::filesystem;
using linea::test::read_all;
using linea::test::TempDir;
using linea::test::write_all;

namespace {

// A two-layer MLP with dropout: its training uses the global RNG (dropout masks and the input
// noise below), so a resume that forgot the RNG state would diverge.
class Mlp : public Module {
 public:
  Mlp() : Module("Mlp") {
    w1 = register_parameter("w1", mul(randn({16, 4}), 0.5));
    b1 = register_parameter("b1", zeros({16}));
    w2 = register_parameter("w2", mul(randn({2, 16}), 0.25));
    b2 = register_parameter("b2", zeros({2}));
  }
  Tensor forward(const Tensor& x) {
    Tensor h = dropout(relu(add(matmul(x, w1.t()), b1)), 0.3, is_training());
    return add(matmul(h, w2.t()), b2);
  }
  Tensor w1, b1, w2, b2;
};

// Fixed data (from its own seed), noise and dropout from the global generator.
struct Task {
  Tensor x, y;
  Task() {
    auto saved = get_rng_state();
    manual_seed(1234);
    x = randn({32, 4});
    y = randn({32, 2});
    set_rng_state(saved);
  }
};

double lr_for(int64_t step) { return 0.05 / (1.0 + 0.3 * static_cast<double>(step)); }

void train_steps(Mlp& net, Optimizer& opt, const Task& task, int64_t first, int64_t count) {
  for (int64_t s = first; s < first + count; ++s) {
    opt.set_lr(lr_for(s));
    Tensor noisy = add(task.x, mul(randn({32, 4}), 0.1));
    Tensor err = sub(net.forward(noisy), task.y);
    Tensor loss = mean(mul(err, err));
    opt.zero_grad();
    loss.backward();
    opt.step();
  }
}

std::shared_ptr<AdamW> make_opt(Mlp& net) {
  return std::make_shared<AdamW>(decay_groups(net, 0.05, 0.1), 0.9, 0.99, 1e-8);
}

::testing::AssertionResult bitwise_equal(const Module& a, const Module& b) {
  StateDict sa = a.state_dict(), sb = b.state_dict();
  if (sa.size() != sb.size()) return ::testing::AssertionFailure() << "different key sets";
  for (auto& [name, t] : sa) {
    const Tensor& u = sb.at(name);
    if (t.shape() != u.shape() || t.dtype() != u.dtype()) return ::testing::AssertionFailure() << name << " differs";
    Tensor ct = raw::contiguous(t), cu = raw::contiguous(u);
    if (std::memcmp(ct.data_ptr(), cu.data_ptr(), t.numel() * t.element_size()) != 0)
      return ::testing::AssertionFailure() << name << " differs bitwise";
  }
  return ::testing::AssertionSuccess();
}

}  // namespace

TEST(Checkpoint, ResumeTenStepsEqualsFivePlusFiveBitwiseOnCpu) {
  TempDir dir;
  Task task;

  // Uninterrupted: 10 steps.
  manual_seed(7);
  auto straight = std::make_shared<Mlp>();
  auto opt_straight = make_opt(*straight);
  train_steps(*straight, *opt_straight, task, 0, 10);

  // 5 steps, save, then a fresh process-like state: other seed, other init, fresh optimizer.
  manual_seed(7);
  auto first = std::make_shared<Mlp>();
  auto opt_first = make_opt(*first);
  train_steps(*first, *opt_first, task, 0, 5);
  const std::vector<uint64_t> rng_at_save = get_rng_state();
  save_checkpoint(dir.file("ckpt"), *first, *opt_first,
                  {5, 1, {{"schedule", "inverse_decay"}, {"flag", "x y"}}, {}, {}});
  EXPECT_TRUE(checkpoint_exists(dir.file("ckpt")));

  manual_seed(999);
  randn({100});  // move the generator somewhere else
  auto resumed = std::make_shared<Mlp>();
  auto opt_resumed = std::make_shared<AdamW>(decay_groups(*resumed, 1.0, 0.5), 0.9, 0.99, 1e-8);
  ASSERT_FALSE(bitwise_equal(*resumed, *first));
  TrainState st = load_checkpoint(dir.file("ckpt"), *resumed, *opt_resumed);
  EXPECT_EQ(st.step, 5);
  EXPECT_EQ(st.epoch, 1);
  EXPECT_EQ(st.extra, (std::map<std::string, std::string>{{"schedule", "inverse_decay"}, {"flag", "x y"}}));
  EXPECT_EQ(opt_resumed->steps(), 5);
  EXPECT_TRUE(bitwise_equal(*resumed, *first));
  // Learning rates and weight decay of each group come back too.
  ASSERT_EQ(opt_resumed->param_groups().size(), 2u);
  EXPECT_EQ(opt_resumed->param_groups()[0].lr, opt_first->param_groups()[0].lr);
  EXPECT_EQ(opt_resumed->param_groups()[0].weight_decay, 0.1);
  EXPECT_EQ(get_rng_state(), rng_at_save);

  train_steps(*resumed, *opt_resumed, task, st.step, 5);
  EXPECT_TRUE(bitwise_equal(*resumed, *straight));
  EXPECT_FALSE(bitwise_equal(*resumed, *first));  // it did train

  // The RNG restore matters: the same resume with the generator moved afterwards diverges.
  auto no_rng = std::make_shared<Mlp>();
  auto opt_no_rng = make_opt(*no_rng);
  load_checkpoint(dir.file("ckpt"), *no_rng, *opt_no_rng);
  randn({1});
  train_steps(*no_rng, *opt_no_rng, task, 5, 5);
  EXPECT_FALSE(bitwise_equal(*no_rng, *straight));

  // And so does the optimizer state: the same resume with AdamW's moments reset diverges.
  auto no_moments = std::make_shared<Mlp>();
  auto opt_fresh = make_opt(*no_moments);
  load_checkpoint(dir.file("ckpt"), *no_moments, *opt_fresh);
  auto opt_reset = make_opt(*no_moments);
  train_steps(*no_moments, *opt_reset, task, 5, 5);
  EXPECT_FALSE(bitwise_equal(*no_moments, *straight));
}

TEST(Checkpoint, FilesOpenAsPlainSafetensors) {
  TempDir dir;
  manual_seed(1);
  auto net = std::make_shared<Mlp>();
  auto opt = make_opt(*net);
  Task task;
  train_steps(*net, *opt, task, 0, 2);
  save_checkpoint(dir.file("c"), *net, *opt, {2, 0, {}, {}, {}});
  SafetensorsFile model = load_safetensors(dir.file("c/model.safetensors"));
  EXPECT_EQ(model.tensors.size(), 4u);
  EXPECT_EQ(model.metadata.at("step"), "2");
  SafetensorsFile train = load_safetensors(dir.file("c/training.safetensors"));
  EXPECT_EQ(train.metadata.at("linea_checkpoint"), "training/1");
  EXPECT_EQ(train.tensors.at("rng.cpu").to_vector<int64_t>(),
            (std::vector<int64_t>{static_cast<int64_t>(get_rng_state()[0]), static_cast<int64_t>(get_rng_state()[1])}));
  EXPECT_EQ(train.tensors.at("train.step").item<int64_t>(), 2);
  EXPECT_EQ(train.tensors.at("optim.step").item<int64_t>(), 2);
  EXPECT_EQ(train.tensors.at("optim.0.0.exp_avg").shape(), (Shape{16, 4}));
  EXPECT_EQ(train.tensors.count("rng.cuda"), cuda_available() ? 1u : 0u);
}

TEST(Checkpoint, FailedSaveLeavesPreviousCheckpointIntact) {
  TempDir dir;
  manual_seed(2);
  auto net = std::make_shared<Mlp>();
  auto opt = make_opt(*net);
  Task task;
  train_steps(*net, *opt, task, 0, 3);
  std::string ck = dir.file("ck");
  save_checkpoint(ck, *net, *opt, {3, 0, {}, {}, {}});
  std::string model_before = read_all(ck + "/model.safetensors");
  std::string train_before = read_all(ck + "/training.safetensors");
  train_steps(*net, *opt, task, 3, 2);

  // Block one temp file at a time with a directory of its name (works even as root, where
  // permission bits do not stop a write): the save fails and neither file changes.
  for (const char* file : {"model.safetensors", "training.safetensors"}) {
    SCOPED_TRACE(file);
    std::string blocker = ck + "/" + file + ".tmp." + std::to_string(::getpid());
    fs::create_directory(blocker);
    EXPECT_LINEA_ERROR(save_checkpoint(ck, *net, *opt, {5, 0, {}, {}, {}}), "was not modified");
    fs::remove(blocker);
    EXPECT_EQ(read_all(ck + "/model.safetensors"), model_before);
    EXPECT_EQ(read_all(ck + "/training.safetensors"), train_before);
    int entries = 0;
    for (auto& e : fs::directory_iterator(ck)) entries += e.exists() ? 1 : 0;
    EXPECT_EQ(entries, 2);  // no temp file left behind
  }
  auto fresh = std::make_shared<Mlp>();
  auto opt2 = make_opt(*fresh);
  EXPECT_EQ(load_checkpoint(ck, *fresh, *opt2).step, 3);

  // A checkpoint "directory" that is a file.
  std::ofstream(dir.file("file")) << "x";
  EXPECT_LINEA_ERROR(save_checkpoint(dir.file("file"), *net, *opt, {0, 0, {}, {}, {}}),
                     "save_checkpoint: cannot create directory '" + dir.file("file") + "'");
  // Reserved extra keys.
  EXPECT_LINEA_ERROR(save_checkpoint(ck, *net, *opt, {0, 0, {{"linea_checkpoint", "x"}}, {}, {}}),
                     "save_checkpoint: TrainState::extra key 'linea_checkpoint' is reserved");
  EXPECT_LINEA_ERROR(
      save_checkpoint(ck, *net, *opt, {0, 0, {{"linea_file.x", "y"}}, {}, {}}),
      "save_checkpoint: TrainState::extra keys starting with 'linea_file.' are reserved, got 'linea_file.x'");
  EXPECT_LINEA_ERROR(save_checkpoint("", *net, *opt, {0, 0, {}, {}, {}}),
                     "save_checkpoint: empty checkpoint directory");

  // A rename that fails after the temps are written (training.safetensors is a folder that is
  // not empty): the temps not yet renamed are removed too.
  const std::string blocked = dir.file("blocked");
  fs::create_directories(blocked + "/training.safetensors/x");
  EXPECT_LINEA_ERROR(save_checkpoint(blocked, *net, *opt, {5, 0, {}, {}, {}}),
                     "save_checkpoint: cannot rename '" + blocked + "/training.safetensors.tmp.");
  std::vector<std::string> left;
  for (auto& e : fs::directory_iterator(blocked)) left.push_back(e.path().filename().string());
  EXPECT_EQ(left, std::vector<std::string>{"training.safetensors"});
}

TEST(Checkpoint, RejectsMismatchedAndForeignFiles) {
  TempDir dir;
  manual_seed(3);
  auto net = std::make_shared<Mlp>();
  auto opt = make_opt(*net);
  Task task;
  train_steps(*net, *opt, task, 0, 1);
  save_checkpoint(dir.file("a"), *net, *opt, {1, 0, {}, {}, {}});
  train_steps(*net, *opt, task, 1, 1);
  save_checkpoint(dir.file("b"), *net, *opt, {2, 0, {}, {}, {}});

  auto fresh = std::make_shared<Mlp>();
  auto fresh_opt = make_opt(*fresh);
  StateDict before = fresh->state_dict();
  EXPECT_LINEA_ERROR(load_checkpoint(dir.file("none"), *fresh, *fresh_opt),
                     "load_checkpoint: no checkpoint in '" + dir.file("none") +
                         "' (expected model.safetensors and training.safetensors)");

  // Files of two different saves (as after a crash between the two renames).
  fs::copy_file(dir.file("b/model.safetensors"), dir.file("a/model.safetensors"), fs::copy_options::overwrite_existing);
  EXPECT_LINEA_ERROR(load_checkpoint(dir.file("a"), *fresh, *fresh_opt),
                     "(step 2) and '" + dir.file("a/training.safetensors") +
                         "' (step 1) come from different saves (was a save interrupted?)");

  // A plain safetensors file in place of training.safetensors.
  save_safetensors(dir.file("b/training.safetensors"), {{"x", zeros({1})}});
  EXPECT_LINEA_ERROR(load_checkpoint(dir.file("b"), *fresh, *fresh_opt),
                     "is not a Linea training checkpoint (metadata 'linea_checkpoint' is missing");

  // A model of another shape: nothing is changed (model, optimizer), the error names the file.
  save_checkpoint(dir.file("c"), *net, *opt, {2, 0, {}, {}, {}});
  class Other : public Module {
   public:
    Other() : Module("Other") {
      register_parameter("w1", zeros({8, 4}));
      register_parameter("b1", zeros({8}));
      register_parameter("w2", zeros({2, 8}));
      register_parameter("b2", zeros({2}));
    }
  };
  auto other = std::make_shared<Other>();
  // The optimizer accepts the state only for matching shapes; build one with the checkpoint's
  // shapes but hand it a model that does not match.
  auto other_opt = make_opt(*fresh);
  EXPECT_LINEA_ERROR(load_checkpoint(dir.file("c"), *other, *other_opt),
                     "load_checkpoint: '" + dir.file("c/model.safetensors") +
                         "': load_state_dict (Other): shape mismatch: b1 (expected [8], got [16]), w1 (expected [8, "
                         "4], got [16, 4]), w2 (expected [2, 8], got [2, 16]);");
  EXPECT_EQ(other_opt->steps(), 0);  // the optimizer's state was rolled back
  EXPECT_TRUE(other_opt->state_dict().count("0.0.exp_avg") == 0);
  // An optimizer over other shapes is rejected before the model is touched.
  auto small = std::make_shared<Other>();
  auto small_opt = std::make_shared<AdamW>(decay_groups(*small, 0.1, 0.1));
  EXPECT_LINEA_ERROR(load_checkpoint(dir.file("c"), *fresh, *small_opt),
                     "load_checkpoint: '" + dir.file("c/training.safetensors") + "': AdamW::load_state_dict:");
  for (auto& [name, t] : fresh->state_dict()) EXPECT_TRUE(test::all_close(t, before.at(name), 0, 0)) << name;
  // Group count mismatch.
  std::vector<ParamGroup> one_group{ParamGroup{fresh->parameters(), 0.1, 0.0}};
  auto one_group_opt = std::make_shared<AdamW>(one_group);
  EXPECT_LINEA_ERROR(load_checkpoint(dir.file("c"), *fresh, *one_group_opt),
                     "': the checkpoint has 2 parameter groups, the optimizer has 1");
}

// A training.safetensors edited by hand (or corrupted into another valid file): each missing or
// malformed entry is named with the file (RejectsMismatchedAndForeignFiles: a refused load changes
// nothing).
TEST(Checkpoint, MalformedTrainingFileIsNamed) {
  TempDir dir;
  manual_seed(5);
  auto net = std::make_shared<Mlp>();
  auto opt = make_opt(*net);
  save_checkpoint(dir.file("c"), *net, *opt, {3, 1, {}, {}, {}});
  const std::string train = dir.file("c/training.safetensors");
  const SafetensorsFile good = load_safetensors(train);
  // Rewrites training.safetensors from the good one with `edit` applied, then loads it.
  const auto load_edited = [&](const std::function<void(SafetensorsFile&)>& edit) {
    SafetensorsFile f = good;
    edit(f);
    save_safetensors(train, f.tensors, f.metadata);
    auto fresh = std::make_shared<Mlp>();
    auto fresh_opt = make_opt(*fresh);
    load_checkpoint(dir.file("c"), *fresh, *fresh_opt);
  };
  const std::string at = "load_checkpoint: '" + train + "': ";
  EXPECT_LINEA_ERROR(load_edited([](SafetensorsFile& f) { f.tensors.erase("train.step"); }),
                     at + "missing tensor 'train.step'");
  EXPECT_LINEA_ERROR(load_edited([](SafetensorsFile& f) { f.tensors["train.epoch"] = scalar_tensor(1.0); }),
                     at + "tensor 'train.epoch' is float32 [], expected int64 []");
  EXPECT_LINEA_ERROR(load_edited([](SafetensorsFile& f) { f.tensors.erase("optim_groups.lr"); }),
                     at + "missing tensor 'optim_groups.lr'");
  EXPECT_LINEA_ERROR(load_edited([](SafetensorsFile& f) {
                       f.tensors["optim_groups.lr"] = zeros({2, 1});
                     }),
                     at + "missing tensor 'optim_groups.lr'");
  EXPECT_LINEA_ERROR(load_edited([](SafetensorsFile& f) { f.metadata["linea_file.a/b"] = "0"; }),
                     "load_checkpoint: '" + train +
                         "' lists the extra file 'a/b', which is not a plain file name in '" + dir.file("c") + "'");
  EXPECT_LINEA_ERROR(
      load_edited([](SafetensorsFile& f) { f.tensors["optim_groups.lr"] = full({2}, -0.5, test::f64()); }),
      at + "parameter group 0 has lr -0.5 and weight_decay 0.1 (both must be finite and >= 0)");
  EXPECT_LINEA_ERROR(
      load_edited([](SafetensorsFile& f) { f.tensors["optim_groups.weight_decay"] = full({2}, NAN, test::f64()); }),
      at + "parameter group 0 has lr 0.05 and weight_decay nan (both must be finite and >= 0)");
  load_edited([](SafetensorsFile&) {});  // the good file loads
}

TEST(Checkpoint, ExtraFilesAreSavedAndLoadedWithTheSameSave) {
  TempDir dir;
  manual_seed(4);
  auto net = std::make_shared<Mlp>();
  auto opt = make_opt(*net);
  Task task;
  train_steps(*net, *opt, task, 0, 1);
  const std::string ck = dir.file("ck");
  TrainState st{1,
                0,
                {{"k", "v"}},
                {{"config.json", "{\"a\": 1}\n"}, {"vocab.txt", "x\ny\n"}},
                {{"ema.w", from_vector<float>({1.5f, -2.0f}, {2})}}};
  save_checkpoint(ck, *net, *opt, st);
  EXPECT_EQ(read_all(ck + "/config.json"), "{\"a\": 1}\n");
  auto fresh = std::make_shared<Mlp>();
  auto opt2 = make_opt(*fresh);
  TrainState back = load_checkpoint(ck, *fresh, *opt2);
  EXPECT_EQ(back.files, st.files);
  EXPECT_EQ(back.extra, st.extra);     // the file tags are not extras
  ASSERT_EQ(back.tensors.size(), 1u);  // the state tensors come back by name
  EXPECT_EQ(back.tensors.at("ema.w").to_vector<float>(), (std::vector<float>{1.5f, -2.0f}));

  // A failed save (config.json's temp file blocked) changes none of the files.
  const std::string model_before = read_all(ck + "/model.safetensors");
  st.step = 2;
  st.files["config.json"] = "{\"a\": 2}\n";
  const std::string blocker = ck + "/config.json.tmp." + std::to_string(::getpid());
  fs::create_directory(blocker);
  EXPECT_LINEA_ERROR(save_checkpoint(ck, *net, *opt, st), "was not modified");
  fs::remove(blocker);
  EXPECT_EQ(read_all(ck + "/config.json"), "{\"a\": 1}\n");
  EXPECT_EQ(read_all(ck + "/model.safetensors"), model_before);

  // A config.json of another save is detected.
  std::ofstream(ck + "/config.json") << "{\"a\": 3}\n";
  EXPECT_LINEA_ERROR(load_checkpoint(ck, *fresh, *opt2),
                     "config.json' and '" + ck + "/training.safetensors' come from different saves");
  for (const std::string bad : {"a/b", ".", "..", "model.safetensors", "training.safetensors"})
    EXPECT_LINEA_ERROR(save_checkpoint(ck, *net, *opt, {0, 0, {}, {{bad, ""}}, {}}),
                       "save_checkpoint: bad extra file name '" + bad + "'");
}

// Temps of another killed save beside those of the save that load finishes, sorted after them:
// each file comes from the temp of the save being finished (an extra file's by its tag, the
// model's by its save id), not from whichever temp is last.
TEST(Checkpoint, LoadFinishesASaveWithItsOwnTemps) {
  TempDir dir;
  manual_seed(4);
  auto net = std::make_shared<Mlp>();
  auto opt = make_opt(*net);
  Task task;
  for (int64_t step : {1, 2, 3}) {
    train_steps(*net, *opt, task, step - 1, 1);
    const std::string n = std::to_string(step);
    save_checkpoint(dir.file("s" + n), *net, *opt,
                    {step, 0, {}, {{"config.json", "{\"v\": " + n + "}\n"}, {"labels.txt", "l" + n + "\n"}}, {}});
  }
  const std::string ck = dir.file("ck"), s1 = dir.file("s1/"), s2 = dir.file("s2/"), s3 = dir.file("s3/");
  fs::create_directories(ck);
  // Save 2 killed after config.json was renamed (labels.txt, training and model still temps, .7);
  // save 3 killed before, its temps (.8) left too.
  const std::vector<std::pair<std::string, std::string>> files = {
      {"config.json", s2 + "config.json"},
      {"labels.txt", s1 + "labels.txt"},
      {"training.safetensors", s1 + "training.safetensors"},
      {"model.safetensors", s1 + "model.safetensors"},
      {"labels.txt.tmp.7", s2 + "labels.txt"},
      {"training.safetensors.tmp.7", s2 + "training.safetensors"},
      {"model.safetensors.tmp.7", s2 + "model.safetensors"},
      {"labels.txt.tmp.8", s3 + "labels.txt"},
      {"model.safetensors.tmp.8", s3 + "model.safetensors"}};
  for (const auto& [name, from] : files) fs::copy_file(from, ck + "/" + name);
  auto fresh = std::make_shared<Mlp>();
  auto fresh_opt = make_opt(*fresh);
  const TrainState st = load_checkpoint(ck, *fresh, *fresh_opt);
  EXPECT_EQ(st.step, 2);
  EXPECT_EQ(st.files.at("labels.txt"), "l2\n");
  EXPECT_EQ(read_all(ck + "/labels.txt"), "l2\n");
  EXPECT_EQ(read_all(ck + "/model.safetensors"), read_all(s2 + "model.safetensors"));
}

// A kill between a save's renames (extra files, then training, then model) leaves complete temps
// of the files not yet renamed: loading finishes that save. Temps cut short by a kill during the
// writes are ignored, and the next save removes them.
TEST(Checkpoint, LoadFinishesASaveKilledBetweenItsRenames) {
  TempDir dir;
  manual_seed(4);
  auto net = std::make_shared<Mlp>();
  auto opt = make_opt(*net);
  Task task;
  train_steps(*net, *opt, task, 0, 1);
  save_checkpoint(dir.file("a"), *net, *opt, {1, 0, {}, {{"config.json", "{\"v\": 1}\n"}}, {}});
  train_steps(*net, *opt, task, 1, 1);
  save_checkpoint(dir.file("b"), *net, *opt, {2, 0, {}, {{"config.json", "{\"v\": 2}\n"}}, {}});
  const std::string ck = dir.file("ck");
  auto setup = [&](std::initializer_list<std::pair<const char*, std::string>> files) {
    fs::remove_all(ck);
    fs::create_directories(ck);
    for (const auto& [name, from] : files) fs::copy_file(from, ck + "/" + name);
  };
  auto step_of = [&] {
    auto fresh = std::make_shared<Mlp>();
    auto fresh_opt = make_opt(*fresh);
    return load_checkpoint(ck, *fresh, *fresh_opt).step;
  };
  const std::string a = dir.file("a/"), b = dir.file("b/");
  // Killed after training was renamed: model's temp is left.
  setup({{"config.json", b + "config.json"},
         {"training.safetensors", b + "training.safetensors"},
         {"model.safetensors", a + "model.safetensors"},
         {"model.safetensors.tmp.99999", b + "model.safetensors"}});
  EXPECT_EQ(step_of(), 2);
  EXPECT_EQ(read_all(ck + "/model.safetensors"), read_all(b + "model.safetensors"));
  EXPECT_FALSE(fs::exists(ck + "/model.safetensors.tmp.99999"));
  // Killed after config.json was renamed: training's and model's temps are left.
  setup({{"config.json", b + "config.json"},
         {"training.safetensors", a + "training.safetensors"},
         {"model.safetensors", a + "model.safetensors"},
         {"training.safetensors.tmp.7", b + "training.safetensors"},
         {"model.safetensors.tmp.7", b + "model.safetensors"}});
  EXPECT_EQ(step_of(), 2);
  // A mix with nothing to finish it stays an error.
  setup({{"config.json", b + "config.json"},
         {"training.safetensors", b + "training.safetensors"},
         {"model.safetensors", a + "model.safetensors"}});
  EXPECT_LINEA_ERROR(step_of(), "come from different saves (was a save interrupted?)");
  // The first save, killed between its renames; and a folder with one file only.
  setup({{"config.json", b + "config.json"},
         {"training.safetensors", b + "training.safetensors"},
         {"model.safetensors.tmp.5", b + "model.safetensors"}});
  EXPECT_TRUE(checkpoint_exists(ck));
  EXPECT_EQ(step_of(), 2);
  setup({{"config.json", b + "config.json"}, {"training.safetensors", b + "training.safetensors"}});
  EXPECT_TRUE(checkpoint_exists(ck));  // so --resume loads it and fails rather than starting afresh
  EXPECT_LINEA_ERROR(step_of(), "load_checkpoint: incomplete checkpoint in '" + ck + "'");
  // Killed while writing: a truncated temp beside a whole save is ignored, then removed.
  setup({{"config.json", a + "config.json"},
         {"training.safetensors", a + "training.safetensors"},
         {"model.safetensors", a + "model.safetensors"}});
  std::ofstream(ck + "/model.safetensors.tmp.12345") << read_all(b + "model.safetensors").substr(0, 40);
  EXPECT_EQ(step_of(), 1);
  save_checkpoint(ck, *net, *opt, {2, 0, {}, {{"config.json", "{\"v\": 2}\n"}}, {}});
  EXPECT_FALSE(fs::exists(ck + "/model.safetensors.tmp.12345"));
  EXPECT_EQ(step_of(), 2);
}
