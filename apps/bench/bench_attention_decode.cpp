// attention-decode: the time of one incremental decoding step against the length already
// decoded, for the causal mechanisms (softmax: a key/value cache, so a step grows with the prefix;
// performer: a constant-size recurrent state, so it should stay flat; nprf_rpe: exact over its
// key/value cache). Not a test: it asserts nothing, it measures.
//
// One run per spec: q, k, v [B, H, 1, D] ~ N(0, 1) (k and v one [B, 2H, 1, D] tensor's heads, as a
// projection gives them) fed one position at a time through decode_step in eval mode without a
// graph, up to --length positions. At each reported prefix length P the time is the median of the
// --window steps that end at P. Ratios: each step time against the same spec's at the first
// reported length (flat = 1.0x), and against softmax at the same length, both from this run.
// --beams K lays the batch rows out [sentence][beam] and reorders the state before every step as a
// beam search does (row j of a sentence continues its row (j + 1) % K: never the identity), the
// reorder timed with the step.
//
// Usage:
//   attention-decode [--specs softmax,performer,nprf_rpe] [--length 2048] [--report 128,512,2048]
//                    [--batch 1] [--beams 1] [--heads 4] [--dim 64] [--window 16] [--device cpu|cuda|auto]
//                    [--threads T] [--max-seconds S] [--seed 0] [--json FILE]
// nprf_rpe gets max_len=--length unless its spec sets max_len.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "apps/bench/bench_common.h"
#include "apps/common/process_env.h"
#include "apps/common/run_options.h"
#include "attention/registry.h"
#include "linea.h"
#include "nn/io_util.h"

namespace {

using namespace linea::bench;
using linea::Device;
using linea::Tensor;

std::string incremental_attentions() {
  std::string names;
  for (const std::string& n : linea::attn::registered_attentions())
    if (linea::attn::attention_info(n).support.incremental) names += (names.empty() ? "" : ",") + n;
  return names;
}

struct Options {
  // The mechanisms that decode one step at a time (attention/registry.h).
  std::string specs = incremental_attentions(), report = "128,512,2048", device = "auto", json_path;
  int64_t length = 2048, batch = 1, beams = 1, heads = 4, dim = 64, window = 16;
  int threads = 0;
  double max_seconds = 120;
  uint64_t seed = 0;
};

// Per-step milliseconds at each reported prefix length (missing: the run was cut short).
std::map<int64_t, double> run(const std::string& spec_in, const Options& o, const std::vector<int64_t>& report,
                              const Device& device, std::string* note) {
  const std::string spec = linea::attn::with_length(spec_in, o.length);
  auto m = linea::attn::make_attention(spec, o.heads, o.dim, linea::attn::AttentionUse::CausalSelf);
  m->to(device);
  m->eval();
  linea::NoGradGuard ng;
  linea::manual_seed(o.seed);
  auto state = m->start_decoding();
  const linea::TensorOptions opts(linea::DType::Float32, device);
  std::vector<int64_t> rows(static_cast<size_t>(o.batch));
  for (int64_t b = 0; b < o.batch; ++b) rows[static_cast<size_t>(b)] = b - b % o.beams + (b % o.beams + 1) % o.beams;
  const Tensor reorder = linea::from_vector<int64_t>(rows, {o.batch}).to(device);
  std::vector<double> steps_ms;
  std::map<int64_t, double> out;
  const auto start = std::chrono::steady_clock::now();
  for (int64_t t = 1; t <= o.length; ++t) {
    // k and v one tensor's consecutive heads, as MultiHeadAttention's projection hands them over.
    const Tensor q = linea::randn({o.batch, o.heads, 1, o.dim}, opts),
                 kv = linea::randn({o.batch, 2 * o.heads, 1, o.dim}, opts);
    const Tensor k = linea::narrow(kv, 1, 0, o.heads), v = linea::narrow(kv, 1, o.heads, o.heads);
    synchronize(device);
    const auto t0 = std::chrono::steady_clock::now();
    if (o.beams > 1 && t > 1) state->reorder(reorder);
    Tensor y = m->decode_step(q, k, v, *state);
    synchronize(device);
    steps_ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    if (std::find(report.begin(), report.end(), t) != report.end()) {
      const int64_t w = std::min<int64_t>(o.window, t);
      out[t] = median(std::vector<double>(steps_ms.end() - w, steps_ms.end()));
    }
    if (std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() > o.max_seconds) {
      *note = "stopped after " + std::to_string(t) + " steps (--max-seconds)";
      break;
    }
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  linea::apps::tune_process(argv, /*short_openmp_spin=*/false);  // OpenBLAS kernels that fit the CPU
  Options o;
  CLI::App app{"attention-decode: time of one incremental decoding step against the decoded length"};
  app.add_option("--specs", o.specs, "causal mechanisms to run")->capture_default_str();
  app.add_option("--length", o.length, "positions to decode")->capture_default_str()->check(CLI::Range(1, 1 << 20));
  app.add_option("--report", o.report, "prefix lengths to report")->capture_default_str();
  app.add_option("--batch", o.batch, "sequences decoded together")
      ->capture_default_str()
      ->check(linea::apps::positive_number());
  app.add_option("--beams", o.beams, "beams per sentence: the state reordered before each step (1: never)")
      ->capture_default_str()
      ->check(linea::apps::positive_number());
  app.add_option("--heads", o.heads, "heads")->capture_default_str()->check(linea::apps::positive_number());
  app.add_option("--dim", o.dim, "head dim")->capture_default_str()->check(linea::apps::positive_number());
  app.add_option("--window", o.window, "steps whose median is reported")
      ->capture_default_str()
      ->check(linea::apps::positive_number());
  app.add_option("--device", o.device, "cpu, cuda or auto")->capture_default_str();
  app.add_option("--threads", o.threads, "CPU threads (0: all cores)")
      ->capture_default_str()
      ->check(CLI::Range(0, 1024));
  app.add_option("--max-seconds", o.max_seconds, "stop a spec's run after this long")
      ->capture_default_str()
      ->check(linea::apps::positive_number());
  app.add_option("--seed", o.seed, "seed")->capture_default_str();
  app.add_option("--json", o.json_path, "also write one JSON line per (spec, length) here");
  CLI11_PARSE(app, argc, argv);
  try {
    linea::set_num_threads(o.threads);
    const Device device = resolve_device("attention-decode", o.device);
    LINEA_CHECK(o.batch % o.beams == 0, "attention-decode: --batch ", o.batch, " is not a multiple of --beams ",
                o.beams, " (rows are [sentence][beam])");
    std::vector<int64_t> report;
    for (const std::string& s : split_specs(o.report)) {
      size_t used = 0;
      int64_t p = 0;
      try {
        p = std::stoll(s, &used);
      } catch (const std::exception&) {  // std::stoll's own message is just "stoll"
      }
      LINEA_CHECK(used == s.size() && p >= 1, "attention-decode: --report: '", s,
                  "' is not a positive length (expected e.g. 128,512,2048)");
      report.push_back(p);
    }
    std::sort(report.begin(), report.end());
    report.erase(std::remove_if(report.begin(), report.end(), [&](int64_t p) { return p < 1 || p > o.length; }),
                 report.end());
    LINEA_CHECK(!report.empty(), "attention-decode: no --report length within 1..--length ", o.length);
    std::printf(
        "attention-decode on %s: batch %lld%s, heads %lld, head dim %lld, float32; ms per step (median of %lld)\n",
        device_name(device).c_str(), static_cast<long long>(o.batch),
        o.beams > 1 ? (" (" + std::to_string(o.beams) + " beams each reordered a step)").c_str() : "",
        static_cast<long long>(o.heads), static_cast<long long>(o.dim), static_cast<long long>(o.window));
    std::map<std::string, std::map<int64_t, double>> results;
    std::vector<std::string> specs = split_specs(o.specs), notes;
    LINEA_CHECK(!specs.empty(), "attention-decode: --specs '", o.specs, "' names no mechanism");
    for (const std::string& spec : specs) {
      std::string note;
      results[spec] = run(spec, o, report, device, &note);
      if (!note.empty()) notes.push_back(spec + ": " + note);
    }
    std::printf("\n%-28s", "spec \\ decoded length");
    for (int64_t p : report) std::printf(" %22lld", static_cast<long long>(p));
    std::printf("\n");
    const auto& base = results.count("softmax") ? results.at("softmax") : std::map<int64_t, double>{};
    std::string lines;
    for (const std::string& spec : specs) {
      const auto& r = results.at(spec);
      std::printf("%-28s", spec.c_str());
      const double first = r.count(report.front()) ? r.at(report.front()) : 0.0;
      for (int64_t p : report) {
        if (!r.count(p)) {
          std::printf(" %22s", "n/a");
          continue;
        }
        char cell[64];
        std::snprintf(cell, sizeof cell, "%.3f (%.2fx)", r.at(p), first > 0 ? r.at(p) / first : 0.0);
        std::printf(" %22s", cell);
        nlohmann::json j = {{"bench", "attention-decode"},
                            {"device", device_name(device)},
                            {"spec", spec},
                            {"decoded_length", p},
                            {"ms_per_step", r.at(p)},
                            {"batch", o.batch},
                            {"beams", o.beams},
                            {"heads", o.heads},
                            {"head_dim", o.dim},
                            {"window", o.window},
                            {"seed", o.seed}};
        if (first > 0) j["vs_first_length"] = r.at(p) / first;  // none when the first length has no time
        if (base.count(p)) j["vs_softmax"] = r.at(p) / base.at(p);
        lines += j.dump() + "\n";
      }
      std::printf("\n");
    }
    std::printf("(cell: ms per step, and in brackets against the same spec at length %lld)\n",
                static_cast<long long>(report.front()));
    for (const std::string& n : notes) std::printf("note: %s\n", n.c_str());
    if (!o.json_path.empty()) linea::nn::write_text_file_atomic(o.json_path, lines);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
