// attention-scaling: forward+backward time and peak memory of every attention mechanism against
// the sequence length, as ratios to softmax measured in the same run (the LARA paper's Table 6,
// the NPRF paper's Figure 1a). Not a test: it asserts nothing, it measures.
//
// One case = one spec at one length L: q, k, v [B, H, L, D] ~ N(0, 1) requiring grad and a fixed
// g [B, H, L, D]; the timed work is out = mechanism(q, k, v) (training mode, so the random
// features/samples are drawn as in training), sum(out * g), backward() (down to dq, dk, dv), and on
// CUDA a synchronization. At each length every spec gets a warm-up run, then --repeats timed runs,
// the median of which is reported. The timed runs are interleaved over the specs (so load from
// other processes on a shared machine hits all alike) unless the specs' buffers together would
// hold more than 1 GiB in the allocator's cache; then the specs run one after another, each with
// the cache emptied after it (the output names those lengths).
// Peak memory is the caching allocator's high-water mark of live bytes during the timed runs
// (allocator_of(device), core/device.h) minus the bytes live before the case (the inputs and g),
// i.e. what the mechanism's forward and backward added.
// Memory that bypasses the allocator (FFTW/cuFFT plans and their work areas, BLAS buffers) is
// not counted. nprf_rpe gets max_len=L unless its spec sets max_len.
//
// --max-seconds bounds the run: once a case of a spec takes longer (its warm-up or its median),
// that spec is skipped at every longer length, and the output says so. A case that fails (out of
// memory, a shape a mechanism refuses) is reported as n/a with the error and the spec is
// skipped at longer lengths too.
//
// Usage:
//   attention-scaling [--specs softmax,performer,ra,lara,nprf_rpe] [--lengths 256,512,...]
//                     [--device cpu|cuda|auto] [--batch 1] [--heads 2] [--dim 64] [--repeats 3]
//                     [--threads T] [--max-seconds S] [--seed 0] [--precision fp32|tf32|bf16] [--causal]
//                     [--json FILE]
// Default lengths: 256..8192 (powers of two) on the CPU, 256..65536 on CUDA. --precision (CUDA):
// the float32 matmuls' precision (core/precision.h); under bf16 softmax's fused kernel runs on
// the tensor cores too, the reference for PyTorch's SDPA in bfloat16. A spec may carry
// options; in --specs, a comma-separated piece without ':' but with '=' continues the previous
// spec's options ("performer:feature_map=relu,redraw=1,ra"). --causal: decoder self-attention
// (every query sees the keys up to its position), for the specs that support it (softmax,
// performer, nprf_rpe); another spec is an error.
#include <sys/resource.h>
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>
#include <new>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "apps/bench/bench_common.h"
#include "apps/common/process_env.h"
#include "apps/common/run_options.h"
#include "attention/transformer.h"
#include "core/allocator.h"
#include "linea.h"
#include "nn/io_util.h"

namespace {

using namespace linea::bench;
using linea::Device;
using linea::Tensor;
using linea::attn::AttentionSpec;

struct Result {
  enum Status { Ok, Error, Skipped } status = Skipped;
  double ms = 0, mb = 0;  // median time, peak memory added by the case
  std::vector<double> times_ms;
  bool over_limit = false;  // only the warm-up was run: it alone exceeded --max-seconds
  std::string note;         // error message or reason for skipping
};

}  // namespace

int main(int argc, char** argv) {
  linea::apps::tune_process(argv, /*short_openmp_spin=*/false);  // OpenBLAS kernels that fit the CPU
  CLI::App app{"attention-scaling: forward+backward time and peak memory vs sequence length, relative to softmax"};
  std::string specs_arg = linea::join(linea::attn::registered_attentions(), ","), device_arg = "cpu",
              json_path = "attention_scaling.jsonl", precision = "fp32";
  std::vector<int64_t> lengths;
  int64_t batch = 1, heads = 2, dim = 64;
  int repeats = 3, threads = 0;
  bool causal = false;
  double max_seconds = 10.0;
  uint64_t seed = 0;
  app.add_option("--specs", specs_arg, "comma-separated attention specs (options allowed: performer:features=64)")
      ->capture_default_str();
  app.add_option("--lengths", lengths, "sequence lengths (default 256..8192 on cpu, 256..65536 on cuda)")
      ->delimiter(',')
      ->check(linea::apps::positive_number());
  app.add_option("--device", device_arg, "cpu, cuda, cuda:N or auto")->capture_default_str();
  app.add_option("--batch", batch, "batch size B")->check(CLI::Range(1, 1 << 16))->capture_default_str();
  app.add_option("--heads", heads, "heads H")->check(CLI::Range(1, 1024))->capture_default_str();
  app.add_option("--dim", dim, "head dimension D (= Dv)")->check(CLI::Range(1, 4096))->capture_default_str();
  app.add_option("--repeats", repeats, "timed runs per case after one warm-up (median reported; >= 3)")
      ->check(CLI::Range(3, 10000))
      ->capture_default_str();
  app.add_option("--threads", threads, "CPU threads (OpenMP and OpenBLAS; 0 = their default)")
      ->check(CLI::Range(0, 1024));
  app.add_option("--max-seconds", max_seconds,
                 "once one run of a spec takes longer than this, skip the spec at longer lengths")
      ->check(linea::apps::positive_number())
      ->capture_default_str();
  app.add_option("--seed", seed, "seed of the inputs and of the mechanisms' draws")->capture_default_str();
  app.add_option("--precision", precision, "float32 matmuls on CUDA: fp32, tf32 or bf16 (tensor cores)")
      ->capture_default_str();
  app.add_flag("--causal", causal, "causal self-attention (the specs that support it)");
  app.add_option("--json", json_path, "JSON lines output (one object per case)")->capture_default_str();
  CLI11_PARSE(app, argc, argv);

  try {
    using namespace linea;
    linea::set_num_threads(threads);
    const Device device = resolve_device("attention-scaling", device_arg);
    apps::apply_precision("attention-scaling", precision, device);
    if (lengths.empty())
      for (int64_t L = 256; L <= (device.is_cuda() ? 65536 : 8192); L *= 2) lengths.push_back(L);
    const std::vector<std::string> specs = split_specs(specs_arg);
    LINEA_CHECK(!specs.empty(), "attention-scaling: --specs is empty");
    std::vector<AttentionSpec> parsed;
    for (const auto& s : specs) parsed.push_back(AttentionSpec::parse(s));
    // A spec that cannot be built (an unknown name, key or value) is an error now, not a column of n/a.
    for (const std::string& spec : specs) {
      const auto m = attn::make_attention(attn::with_length(spec, lengths.front()), heads, dim);
      LINEA_CHECK(!causal || m->support().causal, "attention-scaling: --causal: '", spec,
                  "' does not support causal attention (", m->support().str(), ")");
    }
    attn::AttentionOptions opts;
    opts.causal = causal;
    int base = -1;  // the softmax column the ratios refer to
    for (size_t j = 0; j < specs.size() && base < 0; ++j)
      if (parsed[j].name == "softmax") base = static_cast<int>(j);

    const std::string dev_name = device_name(device);
    std::printf("%sattention forward+backward, float32 (matmul precision %s), B=%lld, H=%lld, D=%lld, device %s\n",
                causal ? "causal " : "", precision.c_str(), static_cast<long long>(batch),
                static_cast<long long>(heads), static_cast<long long>(dim), dev_name.c_str());
    std::printf(
        "median of %d runs after a warm-up; peak memory = allocator high-water mark minus live bytes before the case; "
        "--max-seconds %g\n",
        repeats, max_seconds);
    std::fflush(stdout);

    CachingAllocator& alloc = allocator_of(device);
    std::vector<std::vector<Result>> res(lengths.size(), std::vector<Result>(specs.size()));
    std::vector<std::string> skip_reason(specs.size());  // non-empty: skip this spec from now on
    std::vector<char> interleaved(lengths.size());       // how length i was timed
    std::ostringstream jsonl;
    const auto t_start = std::chrono::steady_clock::now();
    for (size_t i = 0; i < lengths.size(); ++i) {
      const int64_t L = lengths[i];
      manual_seed(seed + static_cast<uint64_t>(L));
      const TensorOptions grad_opts = TensorOptions(DType::Float32, device, true);
      Tensor q = randn({batch, heads, L, dim}, grad_opts), k = randn({batch, heads, L, dim}, grad_opts),
             v = randn({batch, heads, L, dim}, grad_opts), g = randn({batch, heads, L, dim}, TensorOptions(device));

      // One forward + backward of spec j: returns its milliseconds and records the peak memory it
      // added. Gradients of the previous run are dropped first, so every run starts alike.
      std::vector<std::shared_ptr<attn::AttentionMechanism>> kernels(specs.size());
      auto run = [&](size_t j) {
        Result& r = res[i][j];
        for (Tensor* t : {&q, &k, &v}) t->zero_grad();
        kernels[j]->zero_grad();
        synchronize(device);
        const size_t before = alloc.stats().allocated_bytes;
        alloc.reset_peak();
        const auto t0 = std::chrono::steady_clock::now();
        {
          Tensor out = kernels[j]->forward(q, k, v, opts);
          Tensor loss = sum(out * g);
          loss.backward();
          synchronize(device);
        }
        const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
        const size_t peak = alloc.stats().peak_allocated_bytes;
        r.mb = std::max(r.mb, (peak > before ? peak - before : 0) / (1024.0 * 1024.0));
        return ms;
      };
      auto fail = [&](size_t j, const std::string& msg) {
        res[i][j].status = Result::Error;
        res[i][j].note = msg;
        skip_reason[j] = "error at L=" + std::to_string(L);
        kernels[j].reset();
      };
      auto guarded = [&](size_t j, auto&& f) {
        try {
          f();
        } catch (const Error& e) {
          fail(j, first_line(e.what()));
        } catch (const std::bad_alloc&) {
          fail(j, "out of host memory (std::bad_alloc)");
        }
        for (Tensor* t : {&q, &k, &v}) t->zero_grad();
      };

      // Interleaved timing (a, b, c, a, b, c, ...) lets load from other processes on a shared
      // machine hit every spec alike, but keeps every spec's buffers in the allocator's cache at
      // once. When the specs' peaks, extrapolated from the previous length (x4 per doubling, the
      // quadratic ones), would add up to more than kInterleaveBytes, the specs run one after
      // another instead (warm-up, repeats, cache emptied), which bounds the process's memory by
      // the largest single spec.
      constexpr double kInterleaveBytes = 1024.0 * 1024 * 1024;
      double predicted = 0;
      if (i > 0)
        for (size_t j = 0; j < specs.size(); ++j) {
          const double growth = static_cast<double>(L) / static_cast<double>(lengths[i - 1]);
          predicted += res[i - 1][j].mb * 1024 * 1024 * growth * growth;
        }
      interleaved[i] = predicted <= kInterleaveBytes;

      // Builds spec j and runs its warm-up.
      auto warm_up = [&](size_t j) {
        Result& r = res[i][j];
        guarded(j, [&] {
          kernels[j] = attn::make_attention(attn::with_length(specs[j], L), heads, dim);
          kernels[j]->to(device);
          kernels[j]->train();
          r.status = Result::Ok;
          const double warm_ms = run(j);
          // One run already exceeds the bound: report it alone rather than spend repeats on it.
          if (warm_ms > 1e3 * max_seconds) {
            r.over_limit = true;
            r.times_ms = {warm_ms};
          } else {
            r.mb = 0;  // the timed runs measure the memory (the warm-up may allocate once-only state)
          }
        });
      };
      auto timed = [&](size_t j) {
        if (kernels[j] && !res[i][j].over_limit) guarded(j, [&] { res[i][j].times_ms.push_back(run(j)); });
      };
      for (size_t j = 0; j < specs.size(); ++j)
        if (!skip_reason[j].empty()) {
          res[i][j].status = Result::Skipped;
          res[i][j].note = skip_reason[j];
        }
      if (interleaved[i]) {
        for (size_t j = 0; j < specs.size(); ++j)
          if (skip_reason[j].empty()) warm_up(j);
        for (int rep = 0; rep < repeats; ++rep)
          for (size_t j = 0; j < specs.size(); ++j) timed(j);
      } else {
        for (size_t j = 0; j < specs.size(); ++j) {
          if (!skip_reason[j].empty()) continue;
          warm_up(j);
          for (int rep = 0; rep < repeats; ++rep) timed(j);
          kernels[j].reset();
          alloc.empty_cache();
        }
      }
      for (size_t j = 0; j < specs.size(); ++j) {
        Result& r = res[i][j];
        if (r.status != Result::Ok) continue;
        r.ms = median(r.times_ms);
        if (r.ms > 1e3 * max_seconds) {
          char buf[160];
          std::snprintf(buf, sizeof buf, "L=%lld took %.3g s > --max-seconds %.3g", static_cast<long long>(L),
                        r.ms / 1e3, max_seconds);
          skip_reason[j] = buf;
        }
        if (kernels[j]) kernels[j].reset();
      }
      // Return cached blocks of this length to the system: the specs' differently sized buffers
      // would otherwise pile up in the cache (several GB at L=8192).
      q = k = v = g = Tensor();
      alloc.empty_cache();
      for (size_t j = 0; j < specs.size(); ++j) {
        const Result& r = res[i][j];
        if (r.status == Result::Ok)
          std::fprintf(stderr, "  L=%-6lld %-24s %10.2f ms %10.1f MB%s\n", static_cast<long long>(L), specs[j].c_str(),
                       r.ms, r.mb, r.over_limit ? " (one run: over --max-seconds)" : "");
        else
          std::fprintf(stderr, "  L=%-6lld %-24s %s: %s\n", static_cast<long long>(L), specs[j].c_str(),
                       r.status == Result::Error ? "n/a" : "skipped", r.note.c_str());
      }
      // JSON after the row, so ratios to softmax are known.
      for (size_t j = 0; j < specs.size(); ++j) {
        const Result& r = res[i][j];
        nlohmann::json rec = {{"bench", "attention-scaling"},
                              {"spec", specs[j]},
                              {"length", L},
                              {"status", r.status == Result::Ok      ? "ok"
                                         : r.status == Result::Error ? "error"
                                                                     : "skipped"},
                              {"causal", causal},
                              {"B", batch},
                              {"H", heads},
                              {"D", dim},
                              {"dtype", "float32"},
                              {"precision", precision},
                              {"device", dev_name},
                              {"repeats", repeats},
                              {"max_seconds", max_seconds},
                              {"interleaved", interleaved[i] != 0},
                              {"seed", seed}};
        if (r.status == Result::Ok) {
          rec["ms"] = r.ms;
          rec["peak_mb"] = r.mb;
          rec["times_ms"] = r.times_ms;
          rec["single_run_over_limit"] = r.over_limit;
          if (base >= 0 && res[i][base].status == Result::Ok) {
            rec["time_ratio_to_softmax"] = r.ms / res[i][base].ms;
            rec["memory_ratio_to_softmax"] = res[i][base].mb > 0 ? nlohmann::json(r.mb / res[i][base].mb) : nullptr;
          }
        } else {
          rec["note"] = r.note;
        }
        jsonl << rec.dump() << "\n";
      }
    }
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();

    // Two tables, rows = lengths, columns = specs: "value (ratio to softmax)".
    auto print_results = [&](const char* title, bool time) {
      std::vector<std::string> rows;
      std::vector<std::vector<std::string>> text(lengths.size(), std::vector<std::string>(specs.size()));
      for (size_t i = 0; i < lengths.size(); ++i) {
        rows.push_back(std::to_string(lengths[i]));
        for (size_t j = 0; j < specs.size(); ++j) {
          const Result& r = res[i][j];
          std::string cell;
          if (r.status == Result::Ok) {
            char buf[96];
            const double x = time ? r.ms : r.mb;
            std::snprintf(buf, sizeof buf, time && x < 10 ? "%.2f" : "%.1f", x);
            cell = buf;
            if (base >= 0 && res[i][base].status == Result::Ok) {
              const double b = time ? res[i][base].ms : res[i][base].mb;
              if (b > 0) {
                std::snprintf(buf, sizeof buf, " (%.2fx)", x / b);
                cell += buf;
              } else {
                cell += " (n/a)";
              }
            } else {
              cell += " (n/a)";
            }
            if (r.over_limit) cell += " 1 run";
          } else if (r.status == Result::Error) {
            cell = "n/a (" + r.note + ")";
          } else {
            cell = "skipped";
          }
          text[i][j] = cell;
        }
      }
      std::printf("\n%s\n", title);
      print_table("length", rows, specs, text);
    };
    print_results("forward+backward time, ms (ratio to softmax)", true);
    print_results("peak memory added by forward+backward, MB (ratio to softmax)", false);
    std::printf("\n");
    for (size_t j = 0; j < specs.size(); ++j)
      if (!skip_reason[j].empty())
        for (size_t i = 0; i < lengths.size(); ++i)
          if (res[i][j].status == Result::Skipped) {
            std::printf("%s: skipped for L >= %lld (%s)\n", specs[j].c_str(), static_cast<long long>(lengths[i]),
                        skip_reason[j].c_str());
            break;
          }
    bool any_single = false;
    for (const auto& row : res)
      for (const Result& r : row) any_single = any_single || (r.status == Result::Ok && r.over_limit);
    if (any_single)
      std::printf("\"1 run\": the warm-up alone took longer than --max-seconds; that one (cold) run is reported\n");
    std::string seq;
    for (size_t i = 0; i < lengths.size(); ++i)
      if (!interleaved[i]) seq += (seq.empty() ? "" : ", ") + std::to_string(lengths[i]);
    std::printf("timed runs interleaved over the specs%s%s\n", seq.empty() ? "" : ", except at L = ",
                seq.empty() ? "" : (seq + " (spec by spec, to bound memory)").c_str());
    if (base < 0) std::printf("no softmax column: ratios are n/a\n");
    struct rusage ru {};
    getrusage(RUSAGE_SELF, &ru);
    std::printf("total %.1f s; process peak RSS %.0f MB\n", secs, ru.ru_maxrss / 1024.0);

    linea::nn::write_text_file_atomic(json_path, jsonl.str());  // temp file + rename
    std::printf("wrote %s\n", json_path.c_str());
    return 0;
  } catch (const linea::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
