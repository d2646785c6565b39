// What one training step asks of the GPU (core/cuda_counters.h), through the shared loop
// (apps/common/train_loop.h, --profile) with the apps' own step functions: the default ViT and
// a small translate model. After the first step (which allocates, plans and creates handles)
// every step must:
//   - launch at most a budgeted number of kernels, counting each library call as one (ncu counts
//     the kernels a cuBLAS call launches: one, or two for a split reduction), and put the same
//     operations on the stream every step;
//   - allocate no device memory (the caching allocator serves everything);
//   - never make the host wait for the device (the loss, norm and guard are read back two
//     steps later, from pinned memory).
// It needs a CUDA device: a GPU, or the host emulator (tests/cuda_emu/run.sh builds this file
// against the unmodified cuda/ sources), where it also checks that the counted launches are
// the launches the emulator ran. Skipped otherwise.
//
// The counts do not depend on the batch size (each matmul is one library call whatever its
// batch), which the ViT case checks by running two batch sizes; so the emulator runs small
// batches of the default model.
#include <gtest/gtest.h>

#include <filesystem>
#include <memory>

#include "apps/common/train_loop.h"
#include "apps/translate/train.h"
#include "apps/vit/train.h"
#include "core/cuda_counters.h"
#include "core/device.h"
#include "core/random.h"
#include "nn/data.h"
#include "nn/optim.h"

using namespace linea;

// The emulator's own count of the kernels it ran (tests/cuda_emu/emu_runtime.cpp); null on a GPU.
long emu_launch_count() __attribute__((weak));

namespace {

// Budgets: launches per training step (kernel launches + library calls). The measured figures
// are in apps/bench/README.md.
constexpr int64_t kVitBudget = 300;        // the default ViT (patch 4, dim 64, depth 6, 4 heads)
constexpr int64_t kTranslateBudget = 400;  // dim 64, 2 + 2 layers, dropout 0.1

std::string temp_dir(const std::string& name) {
  const auto dir = std::filesystem::temp_directory_path() / ("linea_step_counters_" + name);
  std::filesystem::remove_all(dir);
  return dir.string();
}

apps::RunOptions profiled_run(const std::string& name, int64_t steps) {
  apps::RunOptions o;
  o.device = "cuda";
  o.out_dir = temp_dir(name);
  o.log_every = 0;
  o.checkpoint_every = 0;
  o.max_steps = steps;
  o.progress = false;
  o.plot = false;
  o.profile = true;
  return o;
}

// Steps 2.. of a profiled run: all equal, within the budget, no allocation, no wait.
void check_steady_steps(const apps::TrainResult& r, int64_t budget, const char* what) {
  ASSERT_GE(r.step_counters.size(), 3u) << what;
  const cuda::Counters& c = r.step_counters[1];
  SCOPED_TRACE(std::string(what) + ": step 2: " + c.str());
  EXPECT_LE(c.kernel_launches + c.library_calls, budget);
  EXPECT_GT(c.kernel_launches, 0);
  EXPECT_EQ(c.device_allocs, 0);
  EXPECT_EQ(c.host_syncs, 0);
  EXPECT_EQ(c.d2h_copies, 3);  // the loss, the guard, one stat
  for (size_t i = 2; i < r.step_counters.size(); ++i) {
    EXPECT_EQ(r.step_counters[i].stream_ops(), c.stream_ops()) << "step " << i + 1;
    EXPECT_EQ(r.step_counters[i].device_allocs, 0) << "step " << i + 1;
    EXPECT_EQ(r.step_counters[i].host_syncs, 0) << "step " << i + 1;
  }
}

struct VitRun {
  apps::TrainResult result;
  long emulated_launches = -1;  // kernels the emulator ran during the steps (-1: not emulated)
  cuda::Counters total;          // what the steps asked for, counted around the whole run
};

VitRun train_vit(int64_t batch, int64_t steps) {
  manual_seed(0);
  vit::VitConfig cfg;  // the app's default model
  auto model = std::make_shared<vit::VisionTransformer>(cfg);
  model->to(Device("cuda"));
  nn::AdamW opt(nn::decay_groups(*model, 2e-3, 0.05, {"pos.", "cls_token"}));
  const int64_t n = batch * steps;
  auto data = std::make_shared<nn::TensorDataset>(randn({n, 1, 28, 28}), randint(0, 10, {n}));
  nn::DataLoaderOptions lo;
  lo.batch_size = batch;
  lo.drop_last = true;
  nn::DataLoader loader(data, lo);
  apps::TrainSetup s;
  s.app = "vit";
  s.model = model.get();
  s.optimizer = &opt;
  s.schedule = nn::WarmupCosine(2e-3, 2, steps, 1e-5);
  s.clip = 1.0;
  s.loader = &loader;
  s.device = Device("cuda");
  s.data_parallel = false;
  apps::TrainHooks h;
  h.step = [&](const nn::Batch& b) { return vit::train_step(*model, b, Device("cuda"), 0.1); };
  h.evaluate = [](const std::string&) { return apps::Metrics{}; };
  VitRun run;
  const long emu0 = emu_launch_count ? emu_launch_count() : -1;
  const cuda::Counters c0 = cuda::counters();
  run.result = apps::train(s, h, profiled_run("vit_" + std::to_string(batch), steps));
  run.total = cuda::counters() - c0;
  if (emu_launch_count) run.emulated_launches = emu_launch_count() - emu0;
  return run;
}

// Token batches of fixed shapes for the translate model (dataset.h's names).
class FixedPairs : public nn::Dataset {
 public:
  FixedPairs(int64_t n, int64_t src_len, int64_t tgt_len, int64_t vocab)
      : n_(n), src_len_(src_len), tgt_len_(tgt_len), vocab_(vocab) {}
  int64_t size() const override { return n_; }
  nn::Example get(int64_t) const override { LINEA_FAIL("FixedPairs: batches only"); }
  nn::Batch get_batch(const std::vector<int64_t>& idx) const override {
    const int64_t b = static_cast<int64_t>(idx.size());
    std::vector<int64_t> src, tgt, src_pad, tgt_pad;
    for (int64_t i = 0; i < b; ++i) {
      const int64_t cut = src_len_ - (idx[i] % 3);  // some padding at the end of some rows
      for (int64_t t = 0; t < src_len_; ++t) {
        src.push_back(t < cut ? 4 + (idx[i] * 7 + t * 3) % (vocab_ - 4) : 0);
        src_pad.push_back(t < cut ? 0 : 1);
      }
      for (int64_t t = 0; t <= tgt_len_; ++t) {
        tgt.push_back(t == 0 ? 2 : 4 + (idx[i] * 5 + t) % (vocab_ - 4));
        if (t > 0) tgt_pad.push_back(0);
      }
    }
    const Tensor all = from_vector<int64_t>(tgt, {b, tgt_len_ + 1});
    nn::Batch out;
    out.set("src", from_vector<int64_t>(src, {b, src_len_}));
    out.set("src_pad", from_vector<int64_t>(src_pad, {b, src_len_}).to(DType::Bool));
    out.set("tgt_in", narrow(all, 1, 0, tgt_len_).contiguous());
    out.set("tgt_out", narrow(all, 1, 1, tgt_len_).contiguous());
    out.set("tgt_pad", from_vector<int64_t>(tgt_pad, {b, tgt_len_}).to(DType::Bool));
    return out;
  }

 private:
  int64_t n_, src_len_, tgt_len_, vocab_;
};

apps::TrainResult train_translate(int64_t steps) {
  manual_seed(0);
  translate::ModelConfig cfg;
  cfg.src_vocab = cfg.tgt_vocab = 64;
  cfg.dim = 64;
  cfg.heads = 4;
  cfg.enc_layers = cfg.dec_layers = 2;
  cfg.mlp_hidden = 128;
  auto model = std::make_shared<translate::Seq2Seq>(cfg);
  model->to(Device("cuda"));
  nn::AdamW opt(nn::decay_groups(*model, 1e-3, 1e-4), 0.9, 0.98, 1e-8);
  nn::DataLoaderOptions lo;
  lo.batch_size = 4;
  lo.drop_last = true;
  nn::DataLoader loader(std::make_shared<FixedPairs>(4 * steps, 9, 7, 64), lo);
  apps::TrainSetup s;
  s.app = "translate";
  s.model = model.get();
  s.optimizer = &opt;
  s.schedule = nn::InverseSqrt(1e-3, 4);
  s.clip = 1.0;
  s.loader = &loader;
  s.device = Device("cuda");
  s.data_parallel = false;
  apps::TrainHooks h;
  h.step = [&](const nn::Batch& b) { return translate::train_step(*model, b, Device("cuda"), 0, 0.1); };
  h.evaluate = [](const std::string&) { return apps::Metrics{}; };
  return apps::train(s, h, profiled_run("translate", steps));
}

TEST(StepCounters, DefaultVitStep) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device (tests/cuda_emu/run.sh runs this on the emulator)";
  const VitRun small = train_vit(2, 3), larger = train_vit(3, 3);
  check_steady_steps(small.result, kVitBudget, "ViT, batch 2");
  check_steady_steps(larger.result, kVitBudget, "ViT, batch 3");
  for (size_t i = 1; i < small.result.step_counters.size(); ++i)
    EXPECT_EQ(small.result.step_counters[i].stream_ops(), larger.result.step_counters[i].stream_ops())
        << "step " << i + 1 << ": the work of a step depends on the batch size";
  if (small.emulated_launches >= 0) {  // every kernel the emulator ran was counted
    EXPECT_EQ(small.emulated_launches, small.total.kernel_launches);
  }
  std::printf("default ViT, one step: %s\n", small.result.step_counters[1].str().c_str());
}

TEST(StepCounters, SmallTranslateStep) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device (tests/cuda_emu/run.sh runs this on the emulator)";
  const apps::TrainResult r = train_translate(3);
  check_steady_steps(r, kTranslateBudget, "translate");
  std::printf("translate (dim 64, 2 + 2 layers), one step: %s\n", r.step_counters[1].str().c_str());
}

}  // namespace
