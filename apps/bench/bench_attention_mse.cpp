// attention-mse: how close each randomized mechanism gets to exact softmax attention as its
// number of samples grows (the LARA paper's Figure 1): output MSE to softmax against the sample
// count for ra, lara and performer. Not a test: it asserts nothing, it measures.
//
// For every spec and sample count S the mechanism is built with that count (ra: samples=S,
// lara: samples=S, performer and nprf_rpe: features=S), kept in training mode (so each forward
// makes its own random draws), and run --repeats times on the same inputs; each forward's MSE
// mean((out - softmax_attention(q, k, v))^2) over all of [B, H, N, Dv] is one independent draw.
// The table shows the mean of the R draws and its standard error sd/sqrt(R). Each (spec, S) cell
// reseeds the generators from --seed and its position, so a cell does not depend on the others.
//
// Inputs: q, k, v [B, H, N, D] from --in FILE.safetensors (float32 or float64, computed in the
// file's dtype unless --dtype says otherwise; an optional key_padding_mask [B, M] is honoured),
// or the synthetic generator below. Real attention is far from random Gaussian q, k: tokens
// form groups (image patches of one object, words of one phrase), a query attends mostly to keys
// of its own group, and q and k are two projections of the same token. The generator mimics
// that, per batch element and head, in the scaled space x~ = D^-1/4 x:
//   - K centres c~_j (--clusters, default 8) with |c~_j|^2 ~= 4, random directions;
//   - each token n belongs to group z_n. --layout grid (default): tokens are patches of a
//     sqrt(N) x sqrt(N) image (a line of N tokens when N is not a square), K seed points are
//     drawn uniformly over it and each token joins the nearest seed's group, so groups are
//     spatially coherent regions like objects in an image (neighbouring patches tend to look
//     alike, which is what landmark methods such as LARA exploit). --layout random: z_n
//     uniform and independent (no locality, the hardest case for segment landmarks);
//   - token content x~_n = c~_{z_n} + e~_n with |e~_n|^2 ~= 1 (isotropic within-group spread);
//   - q~_n = x~_n + a~_n and k~_n = x~_n + b~_n, with small independent noise |a~|^2 ~= |b~|^2 ~=
//     0.25: keys are correlated with their own token's query, not equal to it;
//   - v_n = (u_{z_n} + f_n) / sqrt(2) with u_j, f_n ~ N(0, I): values carry the group too.
// So q~.k~ (= q.k/sqrt(D)) is about 4 within a group, about 5 for the token itself and about 0
// across groups, with |q~| ~= 2.3: softmax rows put most of their mass on the ~N/K keys of the
// query's group, spread over them (peaked, not one-hot). The run prints the mean largest
// attention weight and the mean effective number of keys exp(entropy) so this can be checked.
//
// Usage:
//   attention-mse [--specs ra,lara,performer] [--samples 1,2,4,...,128] [--repeats 10] [--seed 0]
//                 [--device cpu|cuda|auto] [--json FILE] [--n 196 --heads 4 --dim 64 --batch 1
//                 --clusters 8 --layout grid|random | --in FILE.safetensors] [--dtype float32|float64] [--threads T]
// A spec may carry options ("lara:proposal=mixed"); in --specs, a comma-separated piece without
// ':' but with '=' continues the previous spec's options ("performer:feature_map=relu,redraw=1,ra").
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "apps/bench/bench_common.h"
#include "apps/common/process_env.h"
#include "apps/common/run_options.h"
#include "attention/softmax/softmax.h"
#include "attention/transformer.h"
#include "linea.h"
#include "nn/io_util.h"
#include "nn/safetensors.h"

namespace {

using namespace linea::bench;
using linea::Device;
using linea::DType;
using linea::Tensor;
using linea::attn::AttentionOptions;
using linea::attn::AttentionSpec;

// The option that sets a mechanism's number of random features or samples ("": exact).
std::string sample_key(const std::string& name) { return linea::attn::attention_info(name).count_option; }

struct Inputs {
  Tensor q, k, v;  // [B, H, N, D], [B, H, M, D], [B, H, M, Dv]
  AttentionOptions opts;
  std::string source;
};

// The structured synthetic inputs of the header comment, drawn on the CPU from the current
// generator state (so they are the same for every --device) in float64, then converted.
Inputs synthetic_inputs(int64_t B, int64_t H, int64_t N, int64_t D, int64_t K, const std::string& layout) {
  using namespace linea;
  const double quarter = std::pow(static_cast<double>(D), 0.25);  // x = D^{1/4} x~
  // An isotropic Gaussian vector with E|x~|^2 = r2, in the unscaled space (per coordinate
  // std sqrt(r2 / D) * D^{1/4}).
  auto gauss = [&](const Shape& shape, double r2) {
    return randn(shape, TensorOptions(DType::Float64)) * (std::sqrt(r2 / D) * quarter);
  };
  // Group of each token, z [B, H, N] (set-up on the host, N * K distances per head).
  Tensor z;
  if (layout == "random") {
    z = randint(0, K, {B, H, N});
  } else {
    const int64_t side = static_cast<int64_t>(std::llround(std::sqrt(static_cast<double>(N))));
    const int64_t rows = side * side == N ? side : 1, cols = N / rows;
    const std::vector<double> seeds = rand({B, H, K, 2}, TensorOptions(DType::Float64)).to_vector<double>();
    std::vector<int64_t> zs(static_cast<size_t>(B * H * N));
    for (int64_t bh = 0; bh < B * H; ++bh)
      for (int64_t n = 0; n < N; ++n) {
        const double r = static_cast<double>(n / cols) + 0.5, c = static_cast<double>(n % cols) + 0.5;
        double best = INFINITY;
        for (int64_t j = 0; j < K; ++j) {
          const double dr = r - seeds[(bh * K + j) * 2] * rows, dc = c - seeds[(bh * K + j) * 2 + 1] * cols;
          if (dr * dr + dc * dc < best) {
            best = dr * dr + dc * dc;
            zs[bh * N + n] = j;
          }
        }
      }
    z = from_vector<int64_t>(zs, {B, H, N});
  }
  z = z.unsqueeze(-1).expand({B, H, N, D}).contiguous();
  Tensor centres = gauss({B, H, K, D}, 4.0);                    // c [B, H, K, D]
  Tensor x = gather(centres, 2, z) + gauss({B, H, N, D}, 1.0);  // token content [B, H, N, D]
  Tensor q = x + gauss({B, H, N, D}, 0.25);
  Tensor k = x + gauss({B, H, N, D}, 0.25);
  Tensor u = randn({B, H, K, D}, TensorOptions(DType::Float64));
  Tensor v = (gather(u, 2, z) + randn({B, H, N, D}, TensorOptions(DType::Float64))) * std::sqrt(0.5);
  std::ostringstream src;
  src << "synthetic structured (B=" << B << ", H=" << H << ", N=" << N << ", D=" << D << ", " << K
      << " clusters, layout " << layout << ")";
  return {q, k, v, {}, src.str()};
}

Inputs file_inputs(const std::string& path) {
  auto file = linea::nn::load_safetensors(path);
  Inputs in;
  for (const char* name : {"q", "k", "v"}) {
    auto it = file.tensors.find(name);
    LINEA_CHECK(it != file.tensors.end(), "attention-mse: ", path, " has no tensor '", name, "' (needs q, k, v)");
    const Tensor& t = it->second;
    LINEA_CHECK(t.dim() == 4, "attention-mse: ", name, " in ", path, " must be [B, H, N, D], got ",
                linea::shape_str(t.shape()));
    LINEA_CHECK(t.dtype() == DType::Float32 || t.dtype() == DType::Float64, "attention-mse: ", name, " in ", path,
                " must be float32 or float64, got ", linea::dtype_name(t.dtype()));
  }
  in.q = file.tensors.at("q");
  in.k = file.tensors.at("k");
  in.v = file.tensors.at("v");
  if (auto it = file.tensors.find("key_padding_mask"); it != file.tensors.end()) in.opts.key_padding_mask = it->second;
  in.source = path + " (q " + linea::shape_str(in.q.shape()) + ", k " + linea::shape_str(in.k.shape()) + ", v " +
              linea::shape_str(in.v.shape()) + ", " + std::string(linea::dtype_name(in.q.dtype())) +
              (in.opts.key_padding_mask.defined() ? ", with key_padding_mask" : "") + ")";
  return in;
}

// Mean largest weight and mean exp(entropy) of the exact softmax rows (skipped for huge inputs).
std::pair<double, double> softmax_profile(const Inputs& in) {
  using namespace linea;
  const int64_t n = in.q.size(0) * in.q.size(1) * in.q.size(2) * in.k.size(2);
  if (n > (int64_t(1) << 27)) return {NAN, NAN};
  Tensor a = attn::SoftmaxAttention(in.q.size(1), in.q.size(3)).attention_matrix(in.q, in.k, in.opts);  // [B,H,N,M]
  Tensor plogp = where(gt(a, 0.0), a * log(clamp(a, 1e-300, INFINITY)), zeros_like(a));
  const double max_w = mean(max(a, {-1})).item();
  const double eff = mean(exp(-sum(plogp, {-1}))).item();
  return {max_w, eff};
}

struct Cell {
  bool ok = false;
  double mean = 0, se = 0;
  std::vector<double> draws;
  std::string error;
};

}  // namespace

int main(int argc, char** argv) {
  linea::apps::tune_process(argv, /*short_openmp_spin=*/false);  // OpenBLAS kernels that fit the CPU
  CLI::App app{"attention-mse: output MSE of randomized attention to exact softmax against the number of samples"};
  std::string specs_arg = "ra,lara,performer", in_path, json_path = "attention_mse.jsonl", device_arg = "cpu",
              dtype_arg;
  std::vector<int64_t> samples = {1, 2, 4, 8, 16, 32, 64, 128};
  int repeats = 10, threads = 0;
  uint64_t seed = 0;
  int64_t n = 196, heads = 4, dim = 64, batch = 1, clusters = 8;
  std::string layout = "grid";
  app.add_option("--specs", specs_arg, "comma-separated attention specs (options allowed: lara:proposal=mixed)")
      ->capture_default_str();
  app.add_option("--samples", samples, "sample counts (S: ra/lara samples=S, performer features=S)")
      ->delimiter(',')
      ->check(linea::apps::positive_number())
      ->capture_default_str();
  app.add_option("--repeats", repeats, "independent draws per cell (mean MSE and its standard error)")
      ->check(CLI::Range(1, 100000))
      ->capture_default_str();
  app.add_option("--seed", seed, "seed of the synthetic inputs and of the mechanisms' draws")->capture_default_str();
  app.add_option("--device", device_arg, "cpu, cuda, cuda:N or auto")->capture_default_str();
  app.add_option("--json", json_path, "JSON lines output (one object per cell)")->capture_default_str();
  app.add_option("--in", in_path, "safetensors file with q, k, v [B, H, N, D] (instead of synthetic inputs)")
      ->check(CLI::ExistingFile);
  app.add_option("--n", n, "synthetic: tokens (196 = ViT 14x14)")->check(CLI::Range(1, 1 << 20))->capture_default_str();
  app.add_option("--heads", heads, "synthetic: heads")->check(CLI::Range(1, 1024))->capture_default_str();
  app.add_option("--dim", dim, "synthetic: head dimension")->check(CLI::Range(1, 4096))->capture_default_str();
  app.add_option("--batch", batch, "synthetic: batch size")->check(CLI::Range(1, 1 << 16))->capture_default_str();
  app.add_option("--clusters", clusters, "synthetic: token groups")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  app.add_option("--layout", layout, "synthetic: grid (groups are image regions) or random (no locality)")
      ->check(CLI::IsMember({"grid", "random"}))
      ->capture_default_str();
  app.add_option("--dtype", dtype_arg, "float32 or float64 (default: the file's, float32 for synthetic)")
      ->check(CLI::IsMember({"float32", "float64"}));
  app.add_option("--threads", threads, "CPU threads (OpenMP and OpenBLAS; 0 = their default)")
      ->check(CLI::Range(0, 1024));
  CLI11_PARSE(app, argc, argv);

  try {
    using namespace linea;
    linea::set_num_threads(threads);
    const Device device = resolve_device("attention-mse", device_arg);
    const std::vector<std::string> specs = split_specs(specs_arg);
    LINEA_CHECK(!specs.empty(), "attention-mse: --specs is empty");
    std::vector<AttentionSpec> parsed;
    for (const auto& s : specs) parsed.push_back(AttentionSpec::parse(s));

    manual_seed(seed);
    Inputs in = in_path.empty() ? synthetic_inputs(batch, heads, n, dim, clusters, layout) : file_inputs(in_path);
    const DType dtype = !dtype_arg.empty() ? (dtype_arg == "float64" ? DType::Float64 : DType::Float32)
                        : in_path.empty()  ? DType::Float32
                                           : in.q.dtype();
    in.q = in.q.to(dtype).to(device);
    in.k = in.k.to(dtype).to(device);
    in.v = in.v.to(dtype).to(device);
    if (in.opts.key_padding_mask.defined()) in.opts.key_padding_mask = in.opts.key_padding_mask.to(device);
    const int64_t H = in.q.size(1), D = in.q.size(3);

    NoGradGuard no_grad;
    const Tensor ref = attn::softmax_attention(in.q, in.k, in.v, in.opts);  // [B, H, N, Dv]
    const double ref_ms = mean(ref * ref).item();
    const auto [max_w, eff_keys] = softmax_profile(in);

    // A spec that cannot be built (an unknown name, key or value) is an error now, not a column of n/a.
    for (size_t j = 0; j < specs.size(); ++j) {
      AttentionSpec spec = parsed[j];
      const std::string key = sample_key(spec.name);
      if (!key.empty() && !spec.has(key)) spec.options[key] = std::to_string(samples.front());
      attn::make_attention(spec, H, D);
    }

    // cells[s][j]: sample count samples[s], spec j.
    std::vector<std::vector<Cell>> cells(samples.size(), std::vector<Cell>(specs.size()));
    std::ostringstream jsonl;
    const std::string dev_name = device_name(device);
    const auto t_start = std::chrono::steady_clock::now();
    for (size_t j = 0; j < specs.size(); ++j) {
      for (size_t s = 0; s < samples.size(); ++s) {
        Cell& c = cells[s][j];
        AttentionSpec spec = parsed[j];
        try {
          // An exact mechanism (softmax: a sanity column whose MSE is rounding only) takes no sample count.
          const std::string key = sample_key(spec.name);
          if (!key.empty()) {
            LINEA_CHECK(!spec.has(key), "attention-mse: spec '", specs[j], "' sets ", key,
                        " itself; --samples sets it (leave it out)");
            spec.options[key] = std::to_string(samples[s]);
          }
          auto kernel = attn::make_attention(spec, H, D);
          kernel->to(device);
          kernel->to(dtype);
          kernel->train();  // random draws, one per forward
          manual_seed(seed + 1000003ull * (j + 1) + 7919ull * (s + 1));
          for (int r = 0; r < repeats; ++r) {
            Tensor out = kernel->forward(in.q, in.k, in.v, in.opts);
            Tensor d = out - ref;
            c.draws.push_back(mean(d * d).item());
          }
          double m = 0;
          for (double x : c.draws) m += x;
          m /= repeats;
          double var = 0;
          for (double x : c.draws) var += (x - m) * (x - m);
          c.mean = m;
          c.se = repeats > 1 ? std::sqrt(var / (repeats - 1) / repeats) : NAN;
          c.ok = true;
        } catch (const Error& e) {
          c.error = first_line(e.what());
        }
        nlohmann::json rec = {{"bench", "attention-mse"},
                              {"spec", specs[j]},
                              {"spec_used", spec.str()},
                              {"samples", samples[s]},
                              {"ok", c.ok},
                              {"inputs", in.source},
                              {"B", in.q.size(0)},
                              {"H", H},
                              {"N", in.q.size(2)},
                              {"M", in.k.size(2)},
                              {"D", D},
                              {"dtype", dtype_name(dtype)},
                              {"device", dev_name},
                              {"seed", seed},
                              {"repeats", repeats},
                              {"softmax_out_mean_square", ref_ms}};
        if (c.ok) {
          rec["mse_mean"] = c.mean;
          rec["mse_se"] = std::isnan(c.se) ? nlohmann::json() : nlohmann::json(c.se);
          rec["mse_draws"] = c.draws;
        } else {
          rec["error"] = c.error;
        }
        jsonl << rec.dump() << "\n";
        std::fprintf(stderr, "  %-24s S=%-5lld %s\n", specs[j].c_str(), static_cast<long long>(samples[s]),
                     c.ok ? (std::to_string(c.mean)).c_str() : ("n/a (" + c.error + ")").c_str());
      }
    }
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();

    // The table: rows = sample counts, columns = specs, "mean ± s.e.".
    std::vector<std::string> rows;
    std::vector<std::vector<std::string>> text(samples.size(), std::vector<std::string>(specs.size()));
    for (size_t s = 0; s < samples.size(); ++s) {
      rows.push_back(std::to_string(samples[s]));
      for (size_t j = 0; j < specs.size(); ++j) {
        const Cell& c = cells[s][j];
        char buf[96];
        if (c.ok && std::isnan(c.se))
          std::snprintf(buf, sizeof buf, "%.3e", c.mean);
        else if (c.ok)
          std::snprintf(buf, sizeof buf, "%.3e ± %.1e", c.mean, c.se);
        text[s][j] = c.ok ? std::string(buf) : "n/a (" + c.error + ")";
      }
    }
    std::printf("attention output MSE to exact softmax (mean ± standard error over %d draws per cell)\n", repeats);
    std::printf("inputs: %s, %s; seed %llu; device %s\n", in.source.c_str(), dtype_name(dtype),
                static_cast<unsigned long long>(seed), dev_name.c_str());
    std::printf(
        "N=%lld, H=%lld, D=%lld; softmax rows: mean max weight %.3f, mean effective keys exp(entropy) %.1f of %lld; "
        "mean square of softmax output %.3e\n",
        static_cast<long long>(in.q.size(2)), static_cast<long long>(H), static_cast<long long>(D), max_w, eff_keys,
        static_cast<long long>(in.k.size(2)), ref_ms);
    print_table("samples", rows, specs, text);
    std::printf(
        "(ra: samples=S, lara: samples=S landmarks, performer/nprf_rpe: features=S; training-mode draws; "
        "%.1f s)\n",
        secs);

    linea::nn::write_text_file_atomic(json_path, jsonl.str());  // temp file + rename
    std::printf("wrote %s\n", json_path.c_str());
    return 0;
  } catch (const linea::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
