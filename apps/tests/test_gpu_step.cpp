// The training step on the GPU, through the shared loop (apps/common/train_loop.h) with the apps'
// own step functions: the default ViT and a small translate model.
//
// StepCounters: what one step asks of the GPU (core/cuda_counters.h, --profile). After the first
// step (which allocates, plans and creates handles) every step must:
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
// StepCounters.TranslateDecodingStep holds a decoding step (model.step with its beam reorder) to
// the same rules, and its outputs to the CPU's.
// CudaGraph (--cuda-graph): a replayed step computes what an uncaptured one does, bit for bit
// (dropout's draws included), with one graph launch per step; what a replay would not repeat is
// refused at the capture. StepGuard: the non-finite guard read back late (the emulator holds its
// events back) still stops the run at the right step.
#include <gtest/gtest.h>
#include <signal.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <memory>

#include "apps/common/graph_steps.h"
#include "apps/common/interrupt.h"
#include "apps/common/train_loop.h"
#include "apps/translate/train.h"
#include "apps/vit/train.h"
#include "core/cuda_counters.h"
#include "core/cuda_graph.h"
#include "core/device.h"
#include "core/precision.h"
#include "core/random.h"
#include "nn/data.h"
#include "nn/layers.h"
#include "nn/optim.h"
#include "tests/test_util.h"

using namespace linea;

// The emulator's own count of the kernels it ran, and its events held back for n queries
// (tests/cuda_emu/emu_runtime.cpp); null on a GPU.
long emu_launch_count() __attribute__((weak));
void emu_set_event_lag(int n) __attribute__((weak));

namespace {

// Budgets: launches per training step (kernel launches + library calls). The measured figures
// are in apps/bench/README.md.
constexpr int64_t kVitBudget = 180;        // the default ViT (patch 4, dim 64, depth 6, 4 heads)
constexpr int64_t kTranslateBudget = 170;  // dim 64, 2 + 2 layers, dropout 0.1
// Per decoding step with its beam reorder (the same model, eval mode; 2 sentences x 3 beams).
constexpr int64_t kTranslateDecodeBudget = 31;

// A directory of this process's own (tests/cuda_emu/run.sh runs two tests at once, and two
// translate runs in one directory clobbered each other's checkpoint), removed at exit.
std::string temp_dir(const std::string& name) {
  static const test::TempDir root;
  const auto dir = root.path / ("step_counters_" + name);
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

// Steps 2.. of a profiled run: all equal, within the budget, no allocation, no synchronization.
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
    // (Host-to-device copies vary: the learning rates go up only when the schedule changed them.)
    const cuda::Counters& ci = r.step_counters[i];
    EXPECT_EQ(ci.kernel_launches + ci.library_calls, c.kernel_launches + c.library_calls) << "step " << i + 1;
    EXPECT_EQ(ci.device_allocs, 0) << "step " << i + 1;
    EXPECT_EQ(ci.host_syncs, 0) << "step " << i + 1;
  }
}

struct VitRun {
  apps::TrainResult result;
  long emulated_launches = -1;  // kernels the emulator ran during the steps (-1: not emulated)
  cuda::Counters total;         // what the steps asked for, counted around the whole run
};

// The parameters of a model, on the host, in order.
std::vector<Tensor> host_params(const nn::Module& m) {
  std::vector<Tensor> out;
  for (const Tensor& p : m.parameters()) out.push_back(p.detach().to(kCPU));
  return out;
}
bool same_bits(const std::vector<Tensor>& a, const std::vector<Tensor>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].shape() != b[i].shape()) return false;
    if (std::memcmp(a[i].data_ptr(), b[i].data_ptr(), static_cast<size_t>(a[i].numel()) * a[i].element_size()) != 0)
      return false;
  }
  return true;
}

VitRun train_vit(int64_t batch, int64_t steps, bool graph = false, std::vector<Tensor>* final_params = nullptr) {
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
  apps::RunOptions o = profiled_run("vit_" + std::to_string(batch) + (graph ? "_graph" : ""), steps);
  o.cuda_graph = graph;
  run.result = apps::train(s, h, o);
  run.total = cuda::counters() - c0;
  if (emu_launch_count) run.emulated_launches = emu_launch_count() - emu0;
  if (final_params) *final_params = host_params(*model);
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

// Batches whose lengths change with the batch index (batch i: 7 + i % shapes source tokens).
class AlternatingPairs : public nn::Dataset {
 public:
  AlternatingPairs(int64_t n, int64_t shapes) : n_(n), shapes_(shapes) {}
  int64_t size() const override { return n_; }
  nn::Example get(int64_t) const override { LINEA_FAIL("AlternatingPairs: batches only"); }
  nn::Batch get_batch(const std::vector<int64_t>& idx) const override {
    const int64_t k = (idx.front() / static_cast<int64_t>(idx.size())) % shapes_;
    return FixedPairs(n_, 7 + k, 5 + k, 64).get_batch(idx);
  }

 private:
  int64_t n_, shapes_;
};

// The small translate model of these tests: a vocabulary of 64, dim 64, 4 heads, 2 + 2 layers.
translate::ModelConfig small_translate() {
  translate::ModelConfig cfg;
  cfg.src_vocab = cfg.tgt_vocab = 64;
  cfg.dim = 64;
  cfg.heads = 4;
  cfg.enc_layers = cfg.dec_layers = 2;
  cfg.mlp_hidden = 128;
  return cfg;
}

apps::TrainResult train_translate(int64_t steps, bool graph = false, std::vector<Tensor>* final_params = nullptr,
                                  int64_t shapes = 1, const std::function<void(apps::RunOptions&)>& adjust = {}) {
  manual_seed(0);
  auto model = std::make_shared<translate::Seq2Seq>(small_translate());
  model->to(Device("cuda"));
  nn::AdamW opt(nn::decay_groups(*model, 1e-3, 1e-4), 0.9, 0.98, 1e-8);
  nn::DataLoaderOptions lo;
  lo.batch_size = 4;
  lo.drop_last = true;
  // shapes > 1: batches of other lengths, in turn (a captured step per shape).
  std::shared_ptr<nn::Dataset> data = std::make_shared<FixedPairs>(4 * steps, 9, 7, 64);
  if (shapes > 1) data = std::make_shared<AlternatingPairs>(4 * steps, shapes);
  nn::DataLoaderOptions fixed = lo;
  fixed.shuffle = false;
  nn::DataLoader loader(data, shapes > 1 ? fixed : lo);
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
  h.units = [](const nn::Batch& b) { return std::pair<int64_t, double>(translate::target_tokens(b), -1.0); };
  h.evaluate = [](const std::string&) { return apps::Metrics{}; };
  apps::RunOptions o = profiled_run(std::string("translate") + (graph ? "_graph" : ""), steps);
  o.cuda_graph = graph;
  if (adjust) adjust(o);
  apps::TrainResult r = apps::train(s, h, o);
  if (final_params) *final_params = host_params(*model);
  return r;
}

TEST(StepCounters, DefaultVitStep) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device (tests/cuda_emu/run.sh runs this on the emulator)";
  const VitRun small = train_vit(2, 3), larger = train_vit(3, 3);
  check_steady_steps(small.result, kVitBudget, "ViT, batch 2");
  check_steady_steps(larger.result, kVitBudget, "ViT, batch 3");
  for (size_t i = 1; i < small.result.step_counters.size(); ++i) {
    const cuda::Counters &a = small.result.step_counters[i], &b = larger.result.step_counters[i];
    EXPECT_EQ(a.stream_ops(), b.stream_ops()) << "step " << i + 1 << ": the work of a step depends on the batch size";
  }
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

// Translate's incremental decoding on the GPU (beam search's model.step and state.reorder): the
// small model's decoder stepping 2 sentences of 3 beams equals the CPU's, the beams reordered
// within their sentences before every step after the first (the index already on the device, as
// search.cpp sends it); from the third step on, a step with its reorder asks the device for its
// kernels alone: within the budget, no synchronization, allocation or copy to or from the host.
TEST(StepCounters, TranslateDecodingStep) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device (tests/cuda_emu/run.sh runs this on the emulator)";
  manual_seed(0);
  translate::Seq2Seq cpu(small_translate()), gpu(small_translate());
  gpu.load_state_dict(cpu.state_dict());
  const Device cuda("cuda");
  gpu.to(cuda);
  cpu.eval();
  gpu.eval();
  NoGradGuard ng;
  const int64_t S = 2, beams = 3, B = S * beams, L = 6;
  const nn::Batch b = FixedPairs(S, 9, L, 64).get_batch({0, 1});  // row 1 has a padded source token
  const Tensor src = b.at("src"), src_pad = b.at("src_pad");
  attn::DecoderState sc = cpu.start(cpu.encode(src, src_pad), src_pad);
  attn::DecoderState sg = gpu.start(gpu.encode(src.to(cuda), src_pad.to(cuda)), src_pad.to(cuda));
  cuda::Counters c;
  for (int64_t t = 0; t < L; ++t) {
    std::vector<int64_t> tokens, rows;
    for (int64_t i = 0; i < B; ++i) {
      // Distinct tokens from the first step on (a search starts every beam at bos): each beam's
      // cache differs from the first reorder on, so a wrong reorder shows in the outputs.
      tokens.push_back(4 + (i * 7 + t * 5) % 60);
      rows.push_back(i - i % beams + (i % beams + t) % beams);  // beam j continues beam (j + t) % beams
    }
    const Tensor tok = from_vector<int64_t>(tokens, {B}), index = from_vector<int64_t>(rows, {B});
    const Tensor tok_g = tok.to(cuda), index_g = index.to(cuda);
    if (t > 0) sc.reorder(index);
    const Tensor want = cpu.step(tok, sc);
    const cuda::Counters before = cuda::counters();
    if (t > 0) sg.reorder(index_g);
    const Tensor got = gpu.step(tok_g, sg);
    c = cuda::counters() - before;
    EXPECT_LT(max(abs(got.to(kCPU) - want)).item(), 1e-4) << "step " << t;
    if (t < 2) continue;
    SCOPED_TRACE("step " + std::to_string(t) + ": " + c.str());
    EXPECT_LE(c.kernel_launches + c.library_calls, kTranslateDecodeBudget);
    EXPECT_EQ(c.host_syncs + c.host_waits + c.device_allocs + c.h2d_copies + c.d2h_copies, 0);
  }
  std::printf("translate (dim 64, 2 + 2 layers), a decoding step of 2 x 3 beams with its reorder: %s\n",
              c.str().c_str());
}

TEST(CudaGraph, ReplayedVitStepsEqualUncapturedOnes) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device (tests/cuda_emu/run.sh runs this on the emulator)";
  std::vector<Tensor> eager_params, graph_params;
  const VitRun eager = train_vit(2, 4, false, &eager_params), graph = train_vit(2, 4, true, &graph_params);
  EXPECT_EQ(graph.result.step_losses, eager.result.step_losses);
  EXPECT_TRUE(same_bits(graph_params, eager_params)) << "the parameters after 4 steps differ";
  // Step 1 runs uncaptured; step 2 captures and replays; later steps only replay: one launch.
  ASSERT_EQ(graph.result.step_counters.size(), 4u);
  for (size_t i = 1; i < 4; ++i) EXPECT_EQ(graph.result.step_counters[i].graph_launches, 1) << "step " << i + 1;
  for (size_t i = 2; i < 4; ++i) {
    const cuda::Counters& c = graph.result.step_counters[i];
    SCOPED_TRACE("step " + std::to_string(i + 1) + ": " + c.str());
    EXPECT_EQ(c.kernel_launches + c.library_calls, 0);
    EXPECT_EQ(c.device_allocs, 0);
    // No synchronization; host waits may come on a GPU, where the host gets two steps ahead of
    // the replays and the readback holds it there (seen on an H200, 2026-11-28).
    EXPECT_EQ(c.host_syncs, 0);
  }
  std::printf("default ViT, one replayed step: %s\n", graph.result.step_counters[3].str().c_str());
}

TEST(CudaGraph, ReplayedTranslateStepsWithDropoutEqualUncapturedOnes) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device (tests/cuda_emu/run.sh runs this on the emulator)";
  // Dropout's per-example draws read their base counter from the device at every replay; two
  // batch shapes in turn: a graph each.
  std::vector<Tensor> eager_params, graph_params;
  const apps::TrainResult eager = train_translate(5, false, &eager_params, 2);
  const apps::TrainResult graph = train_translate(5, true, &graph_params, 2);
  EXPECT_EQ(graph.step_losses, eager.step_losses);
  EXPECT_TRUE(same_bits(graph_params, eager_params)) << "the parameters after 5 steps differ";
  for (size_t i = 3; i < graph.step_counters.size(); ++i) {
    const cuda::Counters& c = graph.step_counters[i];
    EXPECT_EQ(c.graph_launches, 1) << "step " << i + 1;
    EXPECT_EQ(c.kernel_launches + c.library_calls, 0) << "step " << i + 1 << ": " << c.str();
  }
}

TEST(CudaGraph, ReplayedBf16TranslateStepsEqualUncapturedOnes) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device (tests/cuda_emu/run.sh runs this on the emulator)";
  // --precision bf16: cuBLAS's bf16 GEMMs and the tensor-core attention kernels (with the
  // probabilities' dropout), captured and replayed, give the uncaptured steps' bits.
  struct Restore {
    ~Restore() { set_matmul_precision(MatmulPrecision::Float32); }
  } restore;
  set_matmul_precision(MatmulPrecision::BF16);
  std::vector<Tensor> eager_params, graph_params;
  const apps::TrainResult eager = train_translate(3, false, &eager_params);
  const apps::TrainResult graph = train_translate(3, true, &graph_params);
  EXPECT_EQ(graph.step_losses, eager.step_losses);
  EXPECT_TRUE(same_bits(graph_params, eager_params)) << "the parameters after 3 steps differ";
}

TEST(Reproducible, TwoTranslateRunsAndAResumedOneEndWithTheSameBits) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device (tests/cuda_emu/run.sh runs this on the emulator)";
  // Every sum in a fixed order (no atomics), dropout drawn per example from counters: two runs of
  // 4 steps, and a run stopped after 2 and resumed from its checkpoint, end with the same bits.
  std::vector<Tensor> first, second, resumed;
  const apps::TrainResult a = train_translate(4, false, &first), b = train_translate(4, false, &second);
  EXPECT_EQ(a.step_losses, b.step_losses);
  EXPECT_TRUE(same_bits(first, second)) << "two runs end with other parameters";
  const std::string dir = temp_dir("translate_resume");
  train_translate(4, false, nullptr, 1, [&](apps::RunOptions& o) {  // the same data, stopped mid-epoch
    o.out_dir = dir;
    o.max_steps = 2;
  });
  const apps::TrainResult r = train_translate(4, false, &resumed, 1, [&](apps::RunOptions& o) {
    o.out_dir = dir;
    o.resume = true;
  });
  EXPECT_EQ(r.start_step, 2);
  ASSERT_EQ(a.step_losses.size(), 4u);
  EXPECT_EQ(r.step_losses, std::vector<double>(a.step_losses.begin() + 2, a.step_losses.end()));
  EXPECT_TRUE(same_bits(resumed, first)) << "the resumed run ends with other parameters";
}

// A one-layer ViT on CUDA (self-attention `attention`), AdamW and n random images in batches of
// 2, wired into a TrainSetup: what the tests of the loop itself train.
struct LoopVit {
  std::shared_ptr<vit::VisionTransformer> model;
  std::unique_ptr<nn::AdamW> opt;
  std::unique_ptr<nn::DataLoader> loader;
  apps::TrainSetup setup;

  LoopVit(const std::string& attention, int64_t n) {
    vit::VitConfig cfg;
    cfg.depth = 1;
    cfg.attention = attention;
    model = std::make_shared<vit::VisionTransformer>(cfg);
    model->to(Device("cuda"));
    opt = std::make_unique<nn::AdamW>(nn::decay_groups(*model, 1e-3, 0.0));
    auto data = std::make_shared<nn::TensorDataset>(randn({n, 1, 28, 28}), randint(0, 10, {n}));
    nn::DataLoaderOptions lo;
    lo.batch_size = 2;
    loader = std::make_unique<nn::DataLoader>(data, lo);
    setup.app = "vit";
    setup.model = model.get();
    setup.optimizer = opt.get();
    setup.loader = loader.get();
    setup.device = Device("cuda");
    setup.data_parallel = false;
  }
};

TEST(CudaGraph, RefusesWhatAReplayWouldNotRepeat) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device (tests/cuda_emu/run.sh runs this on the emulator)";
  // Performer redraws its features with cuRAND every training step: a replay would reuse one draw.
  manual_seed(0);
  const LoopVit v("performer:features=8", 6);
  apps::TrainHooks h;
  h.step = [&](const nn::Batch& b) { return vit::train_step(*v.model, b, Device("cuda"), 0.0); };
  h.evaluate = [](const std::string&) { return apps::Metrics{}; };
  apps::RunOptions o = profiled_run("vit_performer_graph", 3);
  o.cuda_graph = true;
  try {
    apps::train(v.setup, h, o);
    ADD_FAILURE() << "a captured step that draws with cuRAND was not refused";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cuRAND draw"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("--cuda-graph"), std::string::npos) << e.what();
  }
  // And after the failed capture the device works as before.
  EXPECT_FALSE(cuda_graph_capturing());
  EXPECT_EQ(sum(ones({3}, TensorOptions(Device("cuda")))).item(), 3.0);
}

// GraphSteps on its own: a graph per batch shape and dtype, captured on first sight (the step
// function runs only then) and replayed on each new batch's values; a new shape beyond
// kMaxGraphs drops the least recently used graph; the units hook counts, and a pending signal is
// reported, at every step.
TEST(CudaGraph, AGraphPerShapeTheLeastRecentlyUsedDropped) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device (tests/cuda_emu/run.sh runs this on the emulator)";
  const Device cuda("cuda");
  nn::Linear model(2, 1);
  model.to(cuda);
  nn::AdamW opt({nn::ParamGroup{model.parameters(), 0.1, 0.0}});
  int captures = 0;
  const auto step = [&](const nn::Batch& b) {
    ++captures;
    apps::IssuedStep s;
    s.loss = sum(b.at("x")) * 2.0;
    s.units = -1;  // the hook's count replaces it
    return s;
  };
  const auto units = [](const nn::Batch& b) { return std::pair<int64_t, double>{b.at("x").size(0), 0.0}; };
  apps::GraphSteps graphs(cuda);
  const auto run = [&](int64_t n, double v, DType dtype = DType::Float32) {
    nn::Batch b;
    b.set("x", full({n, 2}, v, TensorOptions(dtype)));
    const apps::IssuedStep s = graphs.run(b, opt, step, units);
    EXPECT_EQ(s.units, n);
    EXPECT_EQ(s.loss.dtype(), dtype) << n;
    EXPECT_EQ(s.loss.item(), 4.0 * n * v) << n;
    return s;
  };
  static_assert(apps::GraphSteps::kMaxGraphs == 8, "the shapes below fill it");
  for (int64_t n = 1; n <= 8; ++n) run(n, 1.0);
  EXPECT_EQ(captures, 8);
  run(3, 0.5);  // a replay, on the new values
  EXPECT_EQ(captures, 8);
  run(3, 0.5, DType::Float64);  // another dtype: a graph of its own, in the place of n = 1's
  EXPECT_EQ(captures, 9);
  run(2, 1.5);
  EXPECT_EQ(captures, 9);
  run(1, 1.0);  // dropped, so captured again
  EXPECT_EQ(captures, 10);
  // (SIGTERM at its default first: a job started with `&` from a script ignores SIGINT, and a
  // guard leaves an ignored signal ignored.)
  struct sigaction before;
  sigaction(SIGTERM, nullptr, &before);
  signal(SIGTERM, SIG_DFL);
  {
    apps::InterruptGuard guard("graphs");
    testing::internal::CaptureStderr();
    raise(SIGTERM);
    testing::internal::GetCapturedStderr();
    EXPECT_EQ(run(2, 1.0).interrupt, SIGTERM);
  }
  sigaction(SIGTERM, &before, nullptr);
  EXPECT_EQ(run(2, 1.0).interrupt, 0);
  EXPECT_EQ(captures, 10);
}

TEST(StepGuard, LateReadbackStillStopsAtTheNonFiniteStep) {
  if (!emu_set_event_lag) GTEST_SKIP() << "needs the host emulator's delayed events (tests/cuda_emu/run.sh)";
  // The guard's readback of each step comes back three queries late: the loop goes on issuing
  // steps, but the error names the step whose loss was NaN, and no later step is recorded.
  emu_set_event_lag(3);
  manual_seed(0);
  const LoopVit v("softmax", 12);
  int calls = 0;
  apps::TrainHooks h;
  h.step = [&](const nn::Batch& b) {
    apps::StepResult r = vit::train_step(*v.model, b, Device("cuda"), 0.0);
    if (++calls == 3) r.loss = r.loss * NAN;
    return r;
  };
  h.evaluate = [](const std::string&) { return apps::Metrics{}; };
  apps::RunOptions o = profiled_run("vit_late_guard", 6);
  o.profile = false;
  try {
    apps::train(v.setup, h, o);
    ADD_FAILURE() << "the NaN step did not stop the run";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("step 3: non-finite loss"), std::string::npos) << e.what();
  }
  emu_set_event_lag(0);
  EXPECT_LE(calls, 6);
}

}  // namespace
