// bench_matmul: linea::matmul (float32, CPU, no grad) against direct cblas_sgemm calls on the
// same data, for the GEMM shapes of a small ViT (patch 4, dim 64, 4 heads, batch 128, 50
// tokens): projections, their transposed-weight and weight-gradient forms, the batched
// attention products, and a square reference. Prints a table (GFLOP/s of both, ratio
// linea/direct, the largest difference of the results) and writes one JSON object per case.
// Not a test: it asserts nothing about speed. Usage:
//   bench_matmul [--json FILE] [--reps N] [--warmup N]
#include <cblas.h>  // the baseline: direct cblas_sgemm calls

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "apps/bench/bench_common.h"
#include "apps/common/process_env.h"
#include "linea.h"

namespace {

using linea::Tensor;
using linea::bench::median;

// One GEMM shape: batch x ([M, K] @ [K, N]).
struct Case {
  std::string name;
  int64_t batch, M, N, K;
  bool ta;        // a is a transposed view of a contiguous [.., K, M] tensor
  bool tb;        // b is a transposed view of a contiguous [.., N, K] tensor
  bool b_shared;  // b has no batch dims (broadcast over a's batch)
};

struct Options {
  std::string json = "bench_matmul.jsonl";
  int reps = 20;
  int warmup = 3;
};

template <typename F> double time_ms(F&& f) {
  const auto t0 = std::chrono::steady_clock::now();
  f();
  const auto t1 = std::chrono::steady_clock::now();
  return std::chrono::duration<double, std::milli>(t1 - t0).count();
}

// Median milliseconds of f and g, timed alternately (f, g, f, g, ...) so that load from
// other processes on a shared machine affects both alike.
template <typename F, typename G> std::pair<double, double> median_ms_pair(F&& f, G&& g, int reps, int warmup) {
  for (int i = 0; i < warmup; ++i) {
    f();
    g();
  }
  std::vector<double> tf, tg;
  for (int i = 0; i < reps; ++i) {
    tf.push_back(time_ms(f));
    tg.push_back(time_ms(g));
  }
  return {median(tf), median(tg)};
}

linea::Shape with_batch(int64_t batch, bool has_batch, int64_t r, int64_t c) {
  if (has_batch) return {batch, r, c};
  return {r, c};
}

// "[6400, 64]" or, for a transposed view, its base's shape with "^T": "[192, 64]^T".
std::string shape_of(const Tensor& base, bool transposed) {
  return linea::shape_str(base.shape()) + (transposed ? "^T" : "");
}

// The integer value of flag `a` (atoi would read "abc" as 0 and run anyway).
int integer(const std::string& a, const std::string& v, int min) {
  size_t used = 0;
  long n = 0;
  try {
    n = std::stol(v, &used);
  } catch (const std::exception&) {
  }
  if (used != v.size() || v.empty() || n < min || n > 1000000)
    throw linea::Error("bench_matmul: " + a + " expects an integer in [" + std::to_string(min) + ", 1000000], got '" +
                       v + "'");
  return static_cast<int>(n);
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw linea::Error("bench_matmul: " + a + " needs a value");
      return argv[++i];
    };
    if (a == "--json") {
      o.json = value();
    } else if (a == "--reps") {
      o.reps = integer(a, value(), 1);
    } else if (a == "--warmup") {
      o.warmup = integer(a, value(), 0);
    } else if (a == "--help" || a == "-h") {
      std::cout << "usage: bench_matmul [--json FILE (default bench_matmul.jsonl)] [--reps N (20)] [--warmup N (3)]\n";
      std::exit(0);
    } else {
      throw linea::Error("bench_matmul: unknown argument '" + a + "' (try --help)");
    }
  }
  return o;
}

}  // namespace

int main(int argc, char** argv) try {
  linea::apps::tune_process(argv, /*short_openmp_spin=*/false);  // OpenBLAS kernels that fit the CPU
  const Options opt = parse(argc, argv);
  linea::NoGradGuard no_grad;
  linea::manual_seed(0);

  const int64_t B = 128, L = 50, D = 64, H = 4, Dh = D / H;
  const std::vector<Case> cases = {
      {"qkv_proj", 1, B * L, 3 * D, D, false, false, false},       // [6400, 64] @ [64, 192]
      {"qkv_proj_wT", 1, B * L, 3 * D, D, false, true, false},     // [6400, 64] @ W[192, 64]^T
      {"qkv_proj_batched", B, L, 3 * D, D, false, false, true},    // [128, 50, 64] @ [64, 192]
      {"weight_grad_xT", 1, D, 3 * D, B * L, true, false, false},  // X[6400, 64]^T @ G[6400, 192]
      {"attn_scores", B * H, L, L, Dh, false, false, false},       // [512, 50, 16] @ [512, 16, 50]
      {"attn_scores_kT", B * H, L, L, Dh, false, true, false},     // [512, 50, 16] @ K[512, 50, 16]^T
      {"attn_values", B * H, L, Dh, L, false, false, false},       // [512, 50, 50] @ [512, 50, 16]
      {"square_512", 1, 512, 512, 512, false, false, false},       // [512, 512] @ [512, 512]
  };

  const std::string cpu = linea::cpu_name();
  std::printf(
      "linea matmul vs direct cblas_sgemm, float32, device cpu (%s), %d OpenMP threads, %d OpenBLAS threads, %s "
      "kernels, median of %d\n",
      cpu.c_str(), linea::num_threads(), linea::blas_num_threads(), linea::blas_kernels().c_str(), opt.reps);
  std::printf("%-18s %-34s %10s %10s %10s %10s %7s %9s\n", "case", "a @ b", "linea ms", "direct ms", "linea GF/s",
              "direct GF/s", "ratio", "max diff");

  std::ostringstream jsonl;
  for (const Case& c : cases) {
    const bool batched = c.batch > 1;
    // Contiguous base tensors; a and b are (possibly transposed) views of them.
    Tensor a_base = linea::randn(with_batch(c.batch, batched, c.ta ? c.K : c.M, c.ta ? c.M : c.K));
    Tensor b_base = linea::randn(with_batch(c.batch, batched && !c.b_shared, c.tb ? c.N : c.K, c.tb ? c.K : c.N));
    Tensor a = c.ta ? a_base.transpose(-1, -2) : a_base;
    Tensor b = c.tb ? b_base.transpose(-1, -2) : b_base;

    // linea: the previous result is released before each call, so that the caching allocator
    // hands the same block back, as the direct loop reuses its one output buffer.
    Tensor out;
    auto run_linea = [&] {
      out = Tensor();
      out = linea::matmul(a, b);
    };

    // Direct: the same data through cblas_sgemm, transposes as flags; a shared b is folded
    // into one GEMM over all batch rows, as one would write it by hand.
    std::vector<float> direct(static_cast<size_t>(c.batch * c.M * c.N));
    const float* pa = a_base.data<float>();
    const float* pb = b_base.data<float>();
    float* pc = direct.data();
    const CBLAS_TRANSPOSE ta = c.ta ? CblasTrans : CblasNoTrans, tb = c.tb ? CblasTrans : CblasNoTrans;
    const int lda = static_cast<int>(c.ta ? c.M : c.K), ldb = static_cast<int>(c.tb ? c.K : c.N);
    auto run_direct = [&] {
      if (c.b_shared && !c.ta) {
        cblas_sgemm(CblasRowMajor, ta, tb, static_cast<int>(c.batch * c.M), static_cast<int>(c.N),
                    static_cast<int>(c.K), 1.0f, pa, lda, pb, ldb, 0.0f, pc, static_cast<int>(c.N));
        return;
      }
      for (int64_t i = 0; i < c.batch; ++i)
        cblas_sgemm(CblasRowMajor, ta, tb, static_cast<int>(c.M), static_cast<int>(c.N), static_cast<int>(c.K), 1.0f,
                    pa + i * c.M * c.K, lda, pb + (c.b_shared ? 0 : i * c.K * c.N), ldb, 0.0f, pc + i * c.M * c.N,
                    static_cast<int>(c.N));
    };
    const auto [linea_ms, direct_ms] = median_ms_pair(run_linea, run_direct, opt.reps, opt.warmup);

    const std::vector<float> lv = out.to_vector<float>();
    double max_diff = 0;
    for (size_t i = 0; i < lv.size(); ++i) max_diff = std::max(max_diff, std::fabs(double(lv[i]) - direct[i]));

    const double gflop = 2.0 * c.batch * c.M * c.N * c.K * 1e-9;
    const double linea_gfs = gflop / (linea_ms * 1e-3), direct_gfs = gflop / (direct_ms * 1e-3);
    const double ratio = linea_gfs / direct_gfs;
    const std::string desc = shape_of(a_base, c.ta) + " @ " + shape_of(b_base, c.tb);
    std::printf("%-18s %-34s %10.3f %10.3f %10.2f %10.2f %7.3f %9.2e\n", c.name.c_str(), desc.c_str(), linea_ms,
                direct_ms, linea_gfs, direct_gfs, ratio, max_diff);
    std::fflush(stdout);

    const nlohmann::json rec = {{"bench", "matmul"},
                                {"case", c.name},
                                {"a", shape_of(a_base, c.ta)},
                                {"b", shape_of(b_base, c.tb)},
                                {"dtype", "float32"},
                                {"device", "cpu"},
                                {"cpu", cpu},
                                {"batch", c.batch},
                                {"M", c.M},
                                {"N", c.N},
                                {"K", c.K},
                                {"gflop", gflop},
                                {"linea_ms", linea_ms},
                                {"direct_ms", direct_ms},
                                {"linea_gflops", linea_gfs},
                                {"direct_gflops", direct_gfs},
                                {"ratio", ratio},
                                {"max_abs_diff", max_diff},
                                {"reps", opt.reps},
                                {"omp_threads", linea::num_threads()}};
    jsonl << rec.dump() << "\n";
  }

  // Written atomically: a temp file renamed over the target.
  const std::string tmp = opt.json + ".tmp";
  {
    std::ofstream f(tmp, std::ios::trunc);
    if (!f) throw linea::Error("bench_matmul: cannot write " + tmp);
    f << jsonl.str();
    if (!f) throw linea::Error("bench_matmul: write to " + tmp + " failed");
  }
  if (std::rename(tmp.c_str(), opt.json.c_str()) != 0)
    throw linea::Error("bench_matmul: cannot rename " + tmp + " to " + opt.json);
  std::printf("wrote %s\n", opt.json.c_str());
  return 0;
} catch (const std::exception& e) {  // linea::Error, and anything unexpected, the same way
  std::fprintf(stderr, "error: %s\n", e.what());
  return 1;
}
