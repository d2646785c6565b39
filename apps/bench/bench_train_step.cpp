// train-step: the training step of an app's default model on synthetic batches of its real
// shapes, through the shared loop (apps/common/train_loop.h) and the app's own step function,
// timed by when each step's loss is back from the device (TrainResult::step_done_s), after a
// warm-up. Prints units per second (images, target tokens) with what one step asks of the GPU
// (core/cuda_counters.h) and writes a JSON line. The PyTorch counterpart is
// torch_train_step.py; gpu_compare.sh runs both on one GPU and prints the ratios.
//
//   train-step --model vit [--batch 128] [--steps 60] [--device cuda] [--precision bf16] [--cuda-graph]
//   train-step --model translate [--sentences 128 --length 32]   (4,096 tokens a side, dropout 0.1)
//   train-step --op-cost [--device cuda]   host time per small op, issued without waiting
//
// Synthetic data: the throughput of the step, not of the data pipeline (the apps prefetch
// batches on a thread). Not a test: the numbers are a fact about the machine and the day.
#include <CLI/CLI.hpp>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>

#include <unistd.h>
#include <nlohmann/json.hpp>

#include "apps/bench/bench_common.h"
#include "apps/common/train_loop.h"
#include "apps/translate/train.h"
#include "apps/vit/train.h"
#include "autograd/ops.h"
#include "core/cuda_counters.h"
#include "core/precision.h"
#include "core/random.h"
#include "nn/data.h"
#include "nn/optim.h"
#include "nn/schedule.h"

using namespace linea;
using json = nlohmann::json;

namespace {

struct Options {
  std::string model = "vit";
  int64_t batch = 128;                   // vit: images per batch
  int64_t sentences = 128, length = 32;  // translate: sentences per batch, tokens per sentence
  int64_t steps = 60, warmup = 10;
  std::string device = "cuda", precision = "fp32", json_out;
  bool cuda_graph = false, op_cost = false;
  int64_t ops = 20000;
};

// Sentence pairs of fixed lengths (translate/dataset.h's names), every token real.
class SyntheticPairs : public nn::Dataset {
 public:
  SyntheticPairs(int64_t n, int64_t length, int64_t vocab) : n_(n), length_(length), vocab_(vocab) {}
  int64_t size() const override { return n_; }
  nn::Example get(int64_t) const override { LINEA_FAIL("SyntheticPairs: batches only"); }
  nn::Batch get_batch(const std::vector<int64_t>& idx) const override {
    const int64_t b = static_cast<int64_t>(idx.size()), L = length_;
    std::vector<int64_t> src, tgt;
    for (int64_t i = 0; i < b; ++i)
      for (int64_t t = 0; t <= L; ++t) {
        if (t < L) src.push_back(4 + (idx[i] * 131 + t * 17) % (vocab_ - 4));
        tgt.push_back(t == 0 ? 2 : 4 + (idx[i] * 71 + t * 13) % (vocab_ - 4));
      }
    const Tensor all = from_vector<int64_t>(tgt, {b, L + 1});
    nn::Batch out;
    out.set("src", from_vector<int64_t>(src, {b, L}));
    out.set("src_pad", zeros({b, L}, TensorOptions(DType::Bool)));
    out.set("tgt_in", narrow(all, 1, 0, L).contiguous());
    out.set("tgt_out", narrow(all, 1, 1, L).contiguous());
    out.set("tgt_pad", zeros({b, L}, TensorOptions(DType::Bool)));
    return out;
  }

 private:
  int64_t n_, length_, vocab_;
};

json run_step_bench(const Options& o, const Device device) {
  manual_seed(0);
  const int64_t steps = o.warmup + o.steps;
  apps::TrainSetup s;
  apps::TrainHooks h;
  std::shared_ptr<nn::Module> model;
  std::unique_ptr<nn::Optimizer> opt;
  std::unique_ptr<nn::DataLoader> loader;
  std::string unit;
  int64_t params = 0;
  if (o.model == "vit") {
    auto m = std::make_shared<vit::VisionTransformer>(vit::VitConfig{});  // the app's default model
    m->to(device);
    opt = std::make_unique<nn::AdamW>(nn::decay_groups(*m, 2e-3, 0.05, {"pos.", "cls_token"}));
    auto data = std::make_shared<nn::TensorDataset>(randn({o.batch * 4, 1, 28, 28}), randint(0, 10, {o.batch * 4}));
    nn::DataLoaderOptions lo;
    lo.batch_size = o.batch;
    lo.drop_last = true;
    loader = std::make_unique<nn::DataLoader>(data, lo);
    h.step = [m, device](const nn::Batch& b) { return vit::train_step(*m, b, device, 0.1); };
    model = m;
    unit = "images";
  } else if (o.model == "translate") {
    translate::ModelConfig c;  // the app's default model with its joint 8k vocabulary
    c.src_vocab = c.tgt_vocab = 8000;
    auto m = std::make_shared<translate::Seq2Seq>(c);
    m->to(device);
    opt = std::make_unique<nn::AdamW>(nn::decay_groups(*m, 1e-3, 1e-4), 0.9, 0.98, 1e-8);
    nn::DataLoaderOptions lo;
    lo.batch_size = o.sentences;
    lo.drop_last = true;
    loader = std::make_unique<nn::DataLoader>(std::make_shared<SyntheticPairs>(o.sentences * 4, o.length, 8000), lo);
    h.step = [m, device](const nn::Batch& b) { return translate::train_step(*m, b, device, 0, 0.1); };
    h.units = [](const nn::Batch& b) { return std::pair<int64_t, double>(translate::target_tokens(b), -1.0); };
    model = m;
    unit = "target tokens";
  } else {
    LINEA_FAIL("train-step: --model must be vit or translate, got '", o.model, "'");
  }
  params = model->num_parameters();
  h.evaluate = [](const std::string&) { return apps::Metrics{}; };
  s.app = "train-step";
  s.model = model.get();
  s.optimizer = opt.get();
  s.schedule = nn::ConstantLR(1e-3);
  s.clip = 1.0;
  s.loader = loader.get();
  s.epochs = (steps + loader->num_batches(0) - 1) / loader->num_batches(0);
  s.device = device;
  s.data_parallel = false;
  apps::RunOptions r;
  r.device = device.str();
  // its own folder: two runs at once must not remove each other's
  r.out_dir = (std::filesystem::temp_directory_path() / ("linea_train_step_" + std::to_string(getpid()))).string();
  r.log_every = 0;
  r.checkpoint_every = 0;
  r.max_steps = steps;
  r.progress = false;
  r.plot = false;
  r.cuda_graph = o.cuda_graph;
  const apps::TrainResult tr = apps::train(s, h, r);
  std::filesystem::remove_all(r.out_dir);
  const int64_t done = static_cast<int64_t>(tr.step_done_s.size());
  LINEA_CHECK(done == steps, "train-step: ran ", done, " steps of ", steps);
  // The loop reads step k back when it issues step k + 2 (waiting for it if it is not done), so
  // in the steady state step k's time is when it was done; the last two are read back together
  // at the end. The rate: from the warm-up's last step to the third last.
  const int64_t first = o.warmup - 1, last = std::max(first + 1, steps - 3), timed = last - first;
  const double secs = tr.step_done_s[static_cast<size_t>(last)] - tr.step_done_s[static_cast<size_t>(first)];
  const int64_t units_per_step = o.model == "vit" ? o.batch : o.sentences * o.length;
  const cuda::Counters& c = tr.step_counters.back();
  json j = {{"bench", "train-step"},
            {"model", o.model},
            {"parameters", params},
            {"device", bench::device_name(device)},
            {"precision", o.precision},
            {"cuda_graph", o.cuda_graph},
            {"units", unit},
            {"units_per_step", units_per_step},
            {"warmup_steps", o.warmup},
            {"steps_timed", timed},
            {"step_ms", 1e3 * secs / static_cast<double>(timed)},
            {"units_per_s", static_cast<double>(units_per_step * timed) / secs},
            {"launches_per_step", c.kernel_launches + c.library_calls},
            {"graph_launches_per_step", c.graph_launches},
            {"host_syncs_per_step", c.host_syncs},
            {"host_waits_per_step", c.host_waits},
            {"device_allocs_per_step", c.device_allocs}};
  return j;
}

// Host time per op: `ops` adds of two small tensors issued back to back, then one wait.
json run_op_cost(const Options& o, const Device device) {
  const Tensor a = randn({16}).to(device), b = randn({16}).to(device);
  Tensor c = add(a, b);
  sum(c).item();  // warm up, and wait once
  const auto t0 = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < o.ops; ++i) c = add(a, b);
  const double issue = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  sum(c).item();
  const double total = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return {{"bench", "op-cost"},
          {"device", bench::device_name(device)},
          {"ops", o.ops},
          {"host_us_per_op", 1e6 * issue / static_cast<double>(o.ops)},
          {"us_per_op_with_wait", 1e6 * total / static_cast<double>(o.ops)}};
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app(
      "train-step: the apps' training steps on synthetic batches, timed (see the top of bench_train_step.cpp)");
  app.add_option("--model", o.model, "vit or translate")
      ->capture_default_str()
      ->check(CLI::IsMember({"vit", "translate"}));
  app.add_option("--batch", o.batch, "vit: images per batch")->capture_default_str()->check(CLI::Range(1, 1 << 16));
  app.add_option("--sentences", o.sentences, "translate: sentences per batch")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 16));
  app.add_option("--length", o.length, "translate: tokens per sentence, each side")
      ->capture_default_str()
      ->check(CLI::Range(2, 256));
  app.add_option("--steps", o.steps, "steps after the warm-up (the rate is taken over all but the last two)")
      ->capture_default_str()
      ->check(CLI::Range(3, 1 << 20));
  app.add_option("--warmup", o.warmup, "steps before the timing")->capture_default_str()->check(CLI::Range(1, 1 << 20));
  app.add_option("--device", o.device, "cpu, cuda or auto")->capture_default_str();
  app.add_option("--precision", o.precision, "fp32, tf32 or bf16 (CUDA)")
      ->capture_default_str()
      ->check(CLI::IsMember({"fp32", "tf32", "bf16"}));
  app.add_flag("--cuda-graph", o.cuda_graph, "capture the step as a CUDA graph and replay it");
  app.add_flag("--op-cost", o.op_cost, "time the host's cost per small op instead");
  app.add_option("--ops", o.ops, "--op-cost: ops issued")->capture_default_str()->check(CLI::Range(1, 1 << 24));
  app.add_option("--json", o.json_out, "append the result as a JSON line to this file");
  CLI11_PARSE(app, argc, argv);
  try {
    const Device device = bench::resolve_device("train-step", o.device);
    apps::apply_precision("train-step", o.precision, device);
    const json j = o.op_cost ? run_op_cost(o, device) : run_step_bench(o, device);
    if (o.op_cost) {
      std::printf("op cost on %s: %.2f us of host time per op (%.2f us with the final wait)\n",
                  j["device"].get<std::string>().c_str(), j["host_us_per_op"].get<double>(),
                  j["us_per_op_with_wait"].get<double>());
    } else {
      std::printf("%s step on %s (%s%s): %.3f ms per step, %.0f %s/s, %lld launches and %lld graph launches per step\n",
                  o.model.c_str(), j["device"].get<std::string>().c_str(), o.precision.c_str(),
                  o.cuda_graph ? ", CUDA graph" : "", j["step_ms"].get<double>(), j["units_per_s"].get<double>(),
                  j["units"].get<std::string>().c_str(), static_cast<long long>(j["launches_per_step"].get<int64_t>()),
                  static_cast<long long>(j["graph_launches_per_step"].get<int64_t>()));
    }
    if (!o.json_out.empty()) {
      std::ofstream f(o.json_out, std::ios::app);
      f << j.dump() << "\n";
      f.flush();
      LINEA_CHECK(f.good(), "train-step: --json: cannot append to '", o.json_out, "'");
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
