// protein-bench-context: the Performer paper's point about long proteins (linear attention
// trains where softmax does not fit), measured here. Not a test: it asserts nothing, it measures.
//
// For each length L (ascending) and each mechanism (softmax first, the baseline of the ratios):
// a ProteinLM (model.h) with max_len L, learned positions for every mechanism (so that the
// models differ only in their attention; nprf_rpe adds its [heads, 2L-1] relative bias), a batch
// [--batch, L] of <cls> + uniform random standard residues + <eos> with 15% of the residue
// positions chosen (seeded) and replaced by <mask>, the original residues as targets. One
// untimed warm-up step, then --repeats timed training steps, each: forward, cross-entropy on
// the chosen positions, backward, AdamW step (and on CUDA a synchronization), timed with a
// steady clock. Reported: the median ms/step and the peak of live tensor bytes during the timed
// steps (the caching allocator's high-water mark, reset before the first timed step: parameters,
// gradients, AdamW state, activations; OpenBLAS's, FFTW's and cuBLAS's own buffers are not
// counted).
//
// --memory-limit-gib G caps the allocator (core/allocator.h set_limit; CUDA's allocator on a
// GPU) so that a step that needs more fails with its "out of memory" error instead of pushing a
// shared machine into swap or the OOM killer; that case is reported as "does not fit in G GiB",
// its model and tensors are freed, and the mechanism is not run at longer lengths (memory only
// grows with L). The run goes on with the next case.
//
//   protein-bench-context [--lengths 1024,4096,8192,16384] [--attention softmax,performer,lara,nprf_rpe]
//                         [--dim 256] [--heads 4] [--layers 4] [--mlp-hidden 1024] [--batch 1]
//                         [--repeats 3] [--memory-limit-gib 16] [--device auto] [--threads T]
//                         [--seed 0] [--json FILE]
// Output: a markdown table (ms/step, peak MiB, ratios to softmax at the same L in this run) with
// the device and settings; --json gets one JSON object with every number.
#include <sys/resource.h>

#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <new>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "alphabet.h"
#include "apps/bench/bench_common.h"
#include "apps/common/device.h"
#include "apps/common/run_options.h"
#include "attention/registry.h"
#include "autograd/ops.h"
#include "core/allocator.h"
#include "core/random.h"
#include "core/runtime.h"
#include "model.h"
#include "nn/io_util.h"
#include "nn/optim.h"

using namespace linea;
using json = nlohmann::json;
using bench::median;

namespace {

struct Case {
  enum Status { Ok, DoesNotFit, Failed, NotRun } status = NotRun;
  std::vector<double> times_ms, losses;
  double ms = 0;
  size_t peak_bytes = 0;
  int64_t parameters = 0;
  std::string note;  // the error message, or why it was not run
};

const char* status_name(Case::Status s) {
  switch (s) {
    case Case::Ok:
      return "ok";
    case Case::DoesNotFit:
      return "does_not_fit";
    case Case::Failed:
      return "error";
    case Case::NotRun:
      return "not_run";
  }
  return "?";
}

// [batch, L] tokens <cls> r... <eos> with uniform standard residues, 15% of the residue positions
// (at least one per row) replaced by <mask>; targets hold the residue there and <pad> (the
// loss's ignore index) elsewhere.
std::pair<Tensor, Tensor> masked_batch(int64_t batch, int64_t L, uint64_t seed) {
  std::mt19937_64 rng(seed * 1000003 + static_cast<uint64_t>(L));
  std::uniform_int_distribution<int64_t> residue(protein::kFirstResidue,
                                                 protein::kFirstResidue + protein::kNumStandard - 1);
  std::bernoulli_distribution chosen(0.15);
  std::vector<int64_t> tokens(batch * L), targets(batch * L, protein::kPad);
  for (int64_t b = 0; b < batch; ++b) {
    int64_t* t = tokens.data() + b * L;
    int64_t* y = targets.data() + b * L;
    t[0] = protein::kCls;
    t[L - 1] = protein::kEos;
    bool any = false;
    for (int64_t i = 1; i < L - 1; ++i) {
      t[i] = residue(rng);
      if (chosen(rng)) {
        y[i] = t[i];
        t[i] = protein::kMask;
        any = true;
      }
    }
    if (!any) {
      y[1] = t[1];
      t[1] = protein::kMask;
    }
  }
  return {from_vector<int64_t>(tokens, {batch, L}), from_vector<int64_t>(targets, {batch, L})};
}

// One case: build, warm up, time. Everything it allocates is freed when it returns or throws.
void run_case(Case& c, const protein::ModelConfig& mc, int64_t batch, int repeats, uint64_t seed, const Device& device,
              CachingAllocator& alloc) {
  manual_seed(seed);
  auto model = std::make_shared<protein::ProteinLM>(mc);
  model->to(device);
  model->train();
  c.parameters = model->num_parameters();
  nn::AdamW opt(nn::decay_groups(*model, 1e-4, 0.01));
  auto [tokens_cpu, targets_cpu] = masked_batch(batch, mc.max_len, seed);
  const Tensor tokens = tokens_cpu.to(device), targets = targets_cpu.to(device);
  auto step = [&] {
    opt.zero_grad();
    Tensor loss = cross_entropy(model->forward(tokens, Tensor()), targets, protein::kPad);
    loss.backward();
    opt.step();
    synchronize(device);
    return loss.detach();
  };
  step();  // warm-up: first-touch allocations, FFT plans, the optimizer's state
  alloc.reset_peak();
  for (int r = 0; r < repeats; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    Tensor loss = step();
    c.times_ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    c.losses.push_back(loss.item());  // read after the clock stopped
  }
  c.peak_bytes = alloc.stats().peak_allocated_bytes;
  c.ms = median(c.times_ms);
  c.status = Case::Ok;
}

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "protein-bench-context: one training step's time and peak memory at long context, per attention mechanism"};
  std::vector<int64_t> lengths{1024, 4096, 8192, 16384};
  std::string attention_arg = "softmax,performer,lara,nprf_rpe", device_arg = "auto", positions = "learned",
              json_path = "protein_bench_context.json";
  protein::ModelConfig base;  // dim 256, heads 4, layers 4, mlp_hidden 1024
  int64_t batch = 1;
  int repeats = 3, threads = 0;
  double limit_gib = 16;
  uint64_t seed = 0;
  app.add_option("--lengths", lengths, "sequence lengths in tokens (with <cls> and <eos>)")
      ->delimiter(',')
      ->check(CLI::Range(int64_t{3}, int64_t{1} << 24))
      ->capture_default_str();
  app.add_option("--attention", attention_arg,
                 "comma-separated attention specs (options allowed: performer:features=64)")
      ->capture_default_str();
  app.add_option("--dim", base.dim, "model width")->check(CLI::Range(1, 1 << 16))->capture_default_str();
  app.add_option("--heads", base.heads, "attention heads")->check(CLI::Range(1, 1024))->capture_default_str();
  app.add_option("--layers", base.layers, "encoder layers")->check(CLI::Range(1, 1024))->capture_default_str();
  app.add_option("--mlp-hidden", base.mlp_hidden, "MLP hidden width")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  app.add_option("--positions", positions, "learned or none, for every mechanism")->capture_default_str();
  app.add_option("--batch", batch, "sequences per step")->check(CLI::Range(1, 1 << 16))->capture_default_str();
  app.add_option("--repeats", repeats, "timed steps per case after one warm-up step (median reported)")
      ->check(CLI::Range(1, 10000))
      ->capture_default_str();
  app.add_option("--memory-limit-gib", limit_gib,
                 "cap on the allocator's tensor memory; a step needing more 'does not fit' (0: no cap)")
      ->check(linea::apps::finite_range(0.0, 1e6))
      ->capture_default_str();
  app.add_option("--device", device_arg, "cpu, cuda, cuda:N or auto")->capture_default_str();
  app.add_option("--threads", threads, "CPU threads (OpenMP and OpenBLAS; 0 = their default)")
      ->check(CLI::Range(0, 1024));
  app.add_option("--seed", seed, "seed of the models and the batches")->capture_default_str();
  app.add_option("--json", json_path, "JSON output (one object with every number)")->capture_default_str();
  CLI11_PARSE(app, argc, argv);

  try {
    set_num_threads(threads);
    const Device device = apps::resolve_device("protein-bench-context", device_arg);
    std::sort(lengths.begin(), lengths.end());
    lengths.erase(std::unique(lengths.begin(), lengths.end()), lengths.end());
    std::vector<std::string> specs = bench::split_specs(attention_arg);
    LINEA_CHECK(!specs.empty(), "protein-bench-context: --attention is empty");
    // softmax first: the ratios' baseline is measured before the others at every length.
    std::stable_partition(specs.begin(), specs.end(),
                          [](const std::string& s) { return attn::AttentionSpec::parse(s).name == "softmax"; });
    const bool has_softmax = attn::AttentionSpec::parse(specs.front()).name == "softmax";
    base.dropout = 0;
    base.positions = positions;
    base.max_len = lengths.front();
    for (const std::string& spec : specs) {  // bad --dim/--heads/--positions/specs fail here, before any timing
      protein::ModelConfig mc = base;
      mc.attention = spec;
      protein::ProteinLM check(mc);
    }

    CachingAllocator& alloc = allocator_of(device);
    const size_t limit = static_cast<size_t>(limit_gib * 1024.0 * 1024.0 * 1024.0);
    alloc.set_limit(limit);
    const std::string limit_text = limit ? fmt("%g GiB", limit_gib) : std::string("no limit");
    const std::string dev_name = apps::device_name(device);
    std::fprintf(stderr, "protein-bench-context on %s, memory limit %s\n", dev_name.c_str(), limit_text.c_str());

    std::vector<std::vector<Case>> res(lengths.size(), std::vector<Case>(specs.size()));
    // The JSON file, rewritten after every length so that a long run interrupted late still
    // leaves the lengths it finished.
    auto write_json = [&](size_t done, double secs, double rss_mib) {
      json rows = json::array();
      for (size_t i = 0; i < done; ++i)
        for (size_t j = 0; j < specs.size(); ++j) {
          const Case& c = res[i][j];
          json r = {{"length", lengths[i]}, {"attention", specs[j]}, {"status", status_name(c.status)}};
          if (c.status == Case::Ok) {
            r["ms_per_step"] = c.ms;
            r["times_ms"] = c.times_ms;
            r["losses"] = c.losses;
            r["peak_bytes"] = c.peak_bytes;
            r["peak_mib"] = c.peak_bytes / 1048576.0;
            r["parameters"] = c.parameters;
            const Case& sm = res[i][0];
            if (has_softmax && sm.status == Case::Ok) {
              r["time_ratio_to_softmax"] = c.ms / sm.ms;
              r["memory_ratio_to_softmax"] = static_cast<double>(c.peak_bytes) / static_cast<double>(sm.peak_bytes);
            }
          } else {
            r["note"] = c.note;
          }
          rows.push_back(r);
        }
      json out = {{"bench", "protein-bench-context"},
                  {"device", dev_name},
                  {"complete", done == lengths.size()},
                  {"settings",
                   {{"dim", base.dim},
                    {"heads", base.heads},
                    {"layers", base.layers},
                    {"mlp_hidden", base.mlp_hidden},
                    {"positions", positions},
                    {"batch", batch},
                    {"mask_prob", 0.15},
                    {"repeats", repeats},
                    {"warmup_steps", 1},
                    {"memory_limit_bytes", limit},
                    {"memory_limit_gib", limit_gib},
                    {"threads", num_threads()},
                    {"seed", seed},
                    {"lengths", lengths},
                    {"attention", specs}}},
                  {"memory_counts", "live tensor bytes in the caching allocator (not OpenBLAS/FFTW/cuBLAS buffers)"},
                  {"seconds", secs},
                  {"process_peak_rss_mib", rss_mib},
                  {"results", rows}};
      nn::write_text_file_atomic(json_path, out.dump(2) + "\n");
    };
    auto peak_rss_mib = [] {
      struct rusage ru {};
      getrusage(RUSAGE_SELF, &ru);
      return ru.ru_maxrss / 1024.0;
    };
    std::vector<int64_t> no_fit_at(specs.size(), 0);  // > 0: did not fit at this length
    const auto t_start = std::chrono::steady_clock::now();
    for (size_t i = 0; i < lengths.size(); ++i) {
      for (size_t j = 0; j < specs.size(); ++j) {
        Case& c = res[i][j];
        if (no_fit_at[j] > 0) {
          c.status = Case::DoesNotFit;
          c.note = "not run: did not fit at L=" + std::to_string(no_fit_at[j]);
        } else {
          protein::ModelConfig mc = base;
          mc.attention = specs[j];
          mc.max_len = lengths[i];
          try {
            run_case(c, mc, batch, repeats, seed, device, alloc);
          } catch (const Error& e) {
            const std::string msg = bench::first_line(e.what());
            c = Case();
            c.status = msg.find("out of memory") != std::string::npos ? Case::DoesNotFit : Case::Failed;
            c.note = msg;
          } catch (const std::bad_alloc&) {
            c = Case();
            c.status = Case::DoesNotFit;
            c.note = "out of host memory (std::bad_alloc)";
          }
          if (c.status == Case::DoesNotFit) no_fit_at[j] = lengths[i];
          alloc.empty_cache();  // the next case's block sizes differ: give this one's back
        }
        if (c.status == Case::Ok)
          std::fprintf(stderr, "  L=%-6lld %-22s %10.1f ms/step %10.1f MiB\n", static_cast<long long>(lengths[i]),
                       specs[j].c_str(), c.ms, c.peak_bytes / 1048576.0);
        else
          std::fprintf(stderr, "  L=%-6lld %-22s %s: %s\n", static_cast<long long>(lengths[i]), specs[j].c_str(),
                       status_name(c.status), c.note.c_str());
      }
      write_json(i + 1, std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count(),
                 peak_rss_mib());
    }
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();

    // ---- the table ----------------------------------------------------------------------------
    std::printf("## protein-bench-context: one masked-LM training step per attention mechanism\n\n");
    std::printf("device: %s\n", dev_name.c_str());
    std::printf(
        "model: dim %lld, heads %lld, layers %lld, mlp-hidden %lld, %s positions, dropout 0; batch %lld, "
        "15%% of residues masked; AdamW\n",
        static_cast<long long>(base.dim), static_cast<long long>(base.heads), static_cast<long long>(base.layers),
        static_cast<long long>(base.mlp_hidden), positions.c_str(), static_cast<long long>(batch));
    std::printf("time: median of %d timed steps after 1 warm-up step (forward, cross-entropy, backward, AdamW)\n",
                repeats);
    std::printf(
        "memory: peak of live tensor bytes in the caching allocator during the timed steps (parameters, "
        "gradients, AdamW state, activations); OpenBLAS's and FFTW's own buffers are not counted; "
        "limit %s\n\n",
        limit_text.c_str());
    std::printf("| L | attention | ms/step | peak MiB | time vs softmax | memory vs softmax |\n");
    std::printf("|---:|---|---:|---:|---:|---:|\n");
    for (size_t i = 0; i < lengths.size(); ++i)
      for (size_t j = 0; j < specs.size(); ++j) {
        const Case& c = res[i][j];
        const Case* sm = has_softmax ? &res[i][0] : nullptr;
        std::string ms, mib, rt, rm;
        if (c.status == Case::Ok) {
          ms = fmt("%.1f", c.ms);
          mib = fmt("%.1f", c.peak_bytes / 1048576.0);
          if (!sm) {
            rt = rm = "no softmax in this run";
          } else if (sm->status == Case::Ok) {
            rt = fmt("%.2fx", c.ms / sm->ms);
            rm = fmt("%.2fx", static_cast<double>(c.peak_bytes) / static_cast<double>(sm->peak_bytes));
          } else {
            rt = rm = sm->status == Case::DoesNotFit ? "softmax does not fit" : "softmax failed";
          }
        } else if (c.status == Case::DoesNotFit) {
          ms = limit ? "does not fit in " + limit_text : "does not fit (out of memory)";
          if (c.note.rfind("not run", 0) == 0) ms += " (" + c.note + ")";
        } else {
          ms = "error: " + c.note;
        }
        std::printf("| %lld | %s | %s | %s | %s | %s |\n", static_cast<long long>(lengths[i]), specs[j].c_str(),
                    ms.c_str(), mib.c_str(), rt.c_str(), rm.c_str());
      }
    const double rss = peak_rss_mib();
    std::printf("\ntotal %.1f s; process peak RSS %.0f MiB\n", seconds, rss);
    write_json(lengths.size(), seconds, rss);
    std::printf("wrote %s\n", json_path.c_str());
    return 0;
  } catch (const Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
