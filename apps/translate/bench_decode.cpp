// translate-bench-decode: incremental decoding (the decoder's caches: the memory projected once per
// sentence, keys/values or a recurrent state per layer) against recomputing the whole prefix at
// every step, on the same sentences with the same model, in one run. Not a test: it measures.
//
//   translate-bench-decode --checkpoint runs/translate/checkpoint --input data/translate/test.en
//                          [--sentences 200] [--batch 32] [--beam 5] [--threads T] [--json FILE]
//
// Rows: greedy with caches, greedy recomputing the prefix (the baseline), beam search with caches.
// Ratios are against the baseline's time; the hypotheses of the two greedy searches are compared.
#include <CLI/CLI.hpp>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "apps/common/app_run.h"
#include "apps/common/device.h"
#include "apps/common/run_options.h"
#include "autograd/ops.h"
#include "core/error.h"
#include "core/runtime.h"
#include "translator.h"

using namespace linea;

namespace {

// The sentences padded into batches, longest first.
struct Batches {
  std::vector<std::pair<Tensor, Tensor>> batches;  // src, src_pad
};

Batches make_batches(translate::Translator& tr, const std::vector<std::string>& lines, int64_t batch, Device d) {
  std::vector<std::vector<int64_t>> ids;
  for (size_t i = 0; i < lines.size(); ++i) ids.push_back(tr.encode_source(lines[i], "line " + std::to_string(i + 1)));
  std::stable_sort(ids.begin(), ids.end(), [](const auto& a, const auto& b) { return a.size() > b.size(); });
  Batches out;
  const int64_t pad_id = tr.model().config().pad_id;
  for (size_t first = 0; first < ids.size(); first += batch) {
    const int64_t B = std::min<int64_t>(batch, static_cast<int64_t>(ids.size() - first));
    const int64_t S = static_cast<int64_t>(ids[first].size());
    std::vector<int64_t> src(B * S, pad_id), pad(B * S, 1);
    for (int64_t b = 0; b < B; ++b) {
      std::copy(ids[first + b].begin(), ids[first + b].end(), src.begin() + b * S);
      std::fill(pad.begin() + b * S, pad.begin() + b * S + static_cast<int64_t>(ids[first + b].size()), 0);
    }
    out.batches.emplace_back(from_vector<int64_t>(src, {B, S}).to(d), (from_vector<int64_t>(pad, {B, S}) != 0.0).to(d));
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  apps::ModelOptions model;  // --checkpoint --device --threads
  std::string input, json_path;
  int64_t sentences = 200, batch = 32;
  translate::SearchOptions beam;
  CLI::App app{"translate-bench-decode: incremental decoding against recomputing the prefix"};
  apps::add_model_flags(app, model);
  app.add_option("--input", input, "source sentences, one per line")->required();
  app.add_option("--sentences", sentences, "the first N lines")->capture_default_str()->check(CLI::Range(1, 1000000));
  app.add_option("--batch", batch, "sentences per batch")->capture_default_str()->check(CLI::Range(1, 100000));
  app.add_option("--beam", beam.beam, "beam size of the beam-search row")
      ->capture_default_str()
      ->check(CLI::Range(1, 1000));
  app.add_option("--json", json_path, "append the rows as JSON lines here");
  CLI11_PARSE(app, argc, argv);
  try {
    const apps::ModelRun m = apps::start_model_run("translate-bench-decode", model);
    const Device device = m.device;
    translate::Translator tr = translate::Translator::load(m.weights_dir, device);
    tr.model().eval();
    NoGradGuard ng;
    std::ifstream in(input);
    LINEA_CHECK(in.good() && !std::filesystem::is_directory(input), "translate-bench-decode: cannot read --input '",
                input, "'", std::filesystem::is_directory(input) ? ": it is a folder" : "");
    std::vector<std::string> lines;
    for (std::string l; std::getline(in, l) && static_cast<int64_t>(lines.size()) < sentences;)
      if (!l.empty()) lines.push_back(l);
    LINEA_CHECK(!lines.empty(), "translate-bench-decode: --input '", input, "' has no non-empty lines to translate");
    const Batches data = make_batches(tr, lines, batch, device);
    translate::SearchOptions greedy = beam;
    greedy.beam = 1;

    struct Row {
      std::string name;
      double seconds = 0;
      int64_t tokens = 0;
      std::vector<std::vector<int64_t>> outputs;
    };
    auto run = [&](const std::string& name, auto&& search) {
      Row r;
      r.name = name;
      const auto t0 = std::chrono::steady_clock::now();
      for (const auto& [src, pad] : data.batches)
        for (const translate::Hypothesis& h : search(src, pad)) {
          r.tokens += static_cast<int64_t>(h.tokens.size()) + 1;
          r.outputs.push_back(h.tokens);
        }
      r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      return r;
    };
    Row cached = run("greedy, incremental", [&](const Tensor& s, const Tensor& p) {
      return translate::greedy_search(tr.model(), s, p, greedy);
    });
    Row recompute = run("greedy, recompute prefix", [&](const Tensor& s, const Tensor& p) {
      return translate::greedy_search_recompute(tr.model(), s, p, greedy);
    });
    Row beamed = run("beam " + std::to_string(beam.beam) + ", incremental", [&](const Tensor& s, const Tensor& p) {
      std::vector<translate::Hypothesis> best;
      for (auto& n : translate::beam_search(tr.model(), s, p, beam)) best.push_back(n.front());
      return best;
    });
    int64_t same = 0;
    for (size_t i = 0; i < cached.outputs.size(); ++i) same += cached.outputs[i] == recompute.outputs[i];

    const std::string dev = apps::device_name(device);
    std::printf("translate-bench-decode: %zu sentences, batches of %lld, on %s\n", lines.size(),
                static_cast<long long>(batch), dev.c_str());
    std::printf("%-28s %10s %12s %12s %18s\n", "search", "seconds", "sentences/s", "tokens/s", "speed-up vs recompute");
    std::string records;
    for (const Row* r : {&recompute, &cached, &beamed}) {
      const double sps = lines.size() / r->seconds, tps = r->tokens / r->seconds;
      std::printf("%-28s %10.2f %12.1f %12.0f %17.2fx\n", r->name.c_str(), r->seconds, sps, tps,
                  recompute.seconds / r->seconds);
      records += nlohmann::json({{"bench", "translate-decode"},
                                 {"search", r->name},
                                 {"seconds", r->seconds},
                                 {"sentences", lines.size()},
                                 {"batch", batch},
                                 {"beam", r == &beamed ? beam.beam : 1},
                                 {"tokens", r->tokens},
                                 {"sentences_per_s", sps},
                                 {"tokens_per_s", tps},
                                 {"speedup_vs_recompute", recompute.seconds / r->seconds},
                                 {"greedy_identical", same},
                                 {"device", dev}})
                     .dump() +
                 "\n";
    }
    std::printf("greedy hypotheses identical with and without the caches: %lld of %zu\n", static_cast<long long>(same),
                cached.outputs.size());
    if (!json_path.empty()) {
      std::ofstream js(json_path, std::ios::app);
      js << records;
      js.flush();
      LINEA_CHECK(js.good(), "translate-bench-decode: cannot append to --json '", json_path, "'");
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
