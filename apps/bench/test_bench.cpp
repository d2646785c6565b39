// The benchmarks' records, on small cases on the CPU: every flag reaches the JSON lines they write,
// one record per case, and their numbers agree with each other (a time is the median of the timed
// runs it lists, a ratio is against the baseline of the same run, a mean and its standard error
// are those of the draws listed, a rate is units over time; bench_matmul's products agree with the
// direct BLAS call's). Nothing here asserts a speed.
// Not here: their bad flags (apps/tests/test_bad_input.cpp).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "core/ops.h"
#include "core/random.h"
#include "nn/safetensors.h"
#include "tests/test_util.h"

using json = nlohmann::json;
using linea::test::read_all;
using linea::test::TempDir;

namespace {

using linea::test::Shell;
Shell run(const std::string& exe, const std::string& args, const std::string& dir) {
  return linea::test::run_shell(exe, args, dir + "/bench_output.txt");
}

std::vector<json> records(const std::string& path) {
  std::vector<json> out;
  std::istringstream in(read_all(path));
  for (std::string line; std::getline(in, line);)
    if (!line.empty()) out.push_back(json::parse(line));
  return out;
}

double median_of(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

// Each key of the record holds its value (the flags a run was given, as the record names them).
void expect_fields(const json& record, const std::vector<std::pair<std::string, json>>& fields) {
  for (const auto& [key, value] : fields) EXPECT_EQ(record.at(key), value) << key;
}

// The record's device string names one OpenMP thread (--threads 1).
bool one_thread(const json& record) {
  return record.at("device").get<std::string>().find(" 1 OpenMP threads") != std::string::npos;
}

// a == b up to the rounding of one division
::testing::AssertionResult same(double a, double b) {
  if (std::fabs(a - b) <= 1e-12 * std::max(std::fabs(a), std::fabs(b))) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << a << " != " << b;
}

}  // namespace

// Lengths outer, specs inner; each record's time the median of its runs; the ratios against the
// softmax of the same length; --max-seconds reports one cold run, then skips the longer lengths.
TEST(AttentionScaling, RecordsEveryCaseWithItsFlags) {
  TempDir dir;
  const std::string d = dir.path.string();
  const std::vector<std::string> specs = {"performer:features=8", "softmax", "lara:samples=4"};
  Shell r = run(EXE_ATTENTION_SCALING,
                "--specs performer:features=8,softmax,lara:samples=4 --lengths 16,40 --repeats 4 --batch 2 --heads 3 "
                "--dim 8 --seed 7 --max-seconds 30 --device cpu --threads 1 --json " +
                    d + "/s.jsonl",
                d);
  ASSERT_EQ(r.code, 0) << r.output;
  std::vector<json> recs = records(d + "/s.jsonl");
  ASSERT_EQ(recs.size(), 6u) << r.output;
  for (size_t i = 0; i < recs.size(); ++i) {
    const json& j = recs[i];
    SCOPED_TRACE(j.dump());
    EXPECT_EQ(j.at("bench"), "attention-scaling");
    EXPECT_EQ(j.at("length"), i < 3 ? 16 : 40);
    EXPECT_EQ(j.at("spec"), specs[i % 3]);
    EXPECT_EQ(j.at("status"), "ok");
    expect_fields(j, {{"B", 2},
                      {"H", 3},
                      {"D", 8},
                      {"seed", 7},
                      {"repeats", 4},
                      {"max_seconds", 30.0},
                      {"causal", false},
                      {"precision", "fp32"},
                      {"single_run_over_limit", false}});
    EXPECT_EQ(j.at("device").get<std::string>().rfind("cpu (", 0), 0u);
    EXPECT_TRUE(one_thread(j));
    const std::vector<double> times = j.at("times_ms").get<std::vector<double>>();
    EXPECT_EQ(times.size(), 4u);
    EXPECT_TRUE(same(j.at("ms").get<double>(), median_of(times)));
    const json& softmax = recs[i / 3 * 3 + 1];
    EXPECT_TRUE(
        same(j.at("time_ratio_to_softmax").get<double>(), j.at("ms").get<double>() / softmax.at("ms").get<double>()));
    EXPECT_GT(j.at("peak_mb").get<double>(), 0.0);
    EXPECT_TRUE(same(j.at("memory_ratio_to_softmax").get<double>(),
                     j.at("peak_mb").get<double>() / softmax.at("peak_mb").get<double>()));
  }
  for (const char* row : {"\n      16 ", "\n      40 "}) EXPECT_NE(r.output.find(row), std::string::npos) << row;

  // Causal, and no softmax: no ratios. A bound every run exceeds: the warm-up reported alone, then
  // the longer length skipped with the reason.
  r = run(EXE_ATTENTION_SCALING,
          "--specs performer:features=8 --lengths 16,40 --repeats 3 --batch 1 --heads 1 --dim 4 --causal "
          "--max-seconds 1e-9 --device cpu --threads 1 --json " +
              d + "/c.jsonl",
          d);
  ASSERT_EQ(r.code, 0) << r.output;
  recs = records(d + "/c.jsonl");
  ASSERT_EQ(recs.size(), 2u) << r.output;
  EXPECT_EQ(recs[0].at("causal"), true);
  EXPECT_EQ(recs[0].at("single_run_over_limit"), true);
  EXPECT_EQ(recs[0].at("times_ms").size(), 1u);
  EXPECT_FALSE(recs[0].contains("time_ratio_to_softmax"));
  EXPECT_EQ(recs[1].at("status"), "skipped");
  EXPECT_NE(recs[1].at("note").get<std::string>().find("L=16 took"), std::string::npos) << recs[1];
  EXPECT_NE(r.output.find("no softmax column"), std::string::npos) << r.output;
}

// One record per (spec, reported length); ratios against the spec's first length and softmax's
// time at the same length; the beams, the window and the seed recorded.
TEST(AttentionDecode, RecordsEveryLengthWithItsFlags) {
  TempDir dir;
  const std::string d = dir.path.string();
  Shell r = run(EXE_ATTENTION_DECODE,
                "--specs performer:features=8,softmax --length 12 --report 12,4,30 --batch 4 --beams 2 --heads 2 "
                "--dim 8 --window 3 --seed 5 --device cpu --threads 1 --json " +
                    d + "/d.jsonl",
                d);
  ASSERT_EQ(r.code, 0) << r.output;
  const std::vector<json> recs = records(d + "/d.jsonl");
  ASSERT_EQ(recs.size(), 4u) << r.output;  // 30 is past --length
  for (size_t i = 0; i < recs.size(); ++i) {
    const json& j = recs[i];
    SCOPED_TRACE(j.dump());
    EXPECT_EQ(j.at("bench"), "attention-decode");
    EXPECT_EQ(j.at("spec"), i < 2 ? "performer:features=8" : "softmax");
    EXPECT_EQ(j.at("decoded_length"), i % 2 ? 12 : 4);
    expect_fields(j, {{"batch", 4}, {"beams", 2}, {"heads", 2}, {"head_dim", 8}, {"window", 3}, {"seed", 5}});
    const double ms = j.at("ms_per_step").get<double>();
    EXPECT_GT(ms, 0.0);
    EXPECT_TRUE(one_thread(j));
    EXPECT_TRUE(same(j.at("vs_first_length").get<double>(), ms / recs[i / 2 * 2].at("ms_per_step").get<double>()));
    EXPECT_TRUE(same(j.at("vs_softmax").get<double>(), ms / recs[2 + i % 2].at("ms_per_step").get<double>()));
  }
  EXPECT_NE(r.output.find("median of 3"), std::string::npos) << r.output;

  // A bound every step exceeds: each spec stops after its first step, reported if asked for.
  r = run(EXE_ATTENTION_DECODE,
          "--specs softmax,performer:features=8 --length 12 --report 1,12 --heads 1 --dim 4 --max-seconds 1e-9 "
          "--device cpu --threads 1 --json " +
              d + "/s.jsonl",
          d);
  ASSERT_EQ(r.code, 0) << r.output;
  const std::vector<json> stopped = records(d + "/s.jsonl");
  ASSERT_EQ(stopped.size(), 2u) << r.output;
  for (const json& j : stopped) EXPECT_EQ(j.at("decoded_length"), 1) << j;
  EXPECT_NE(r.output.find("stopped after 1 steps"), std::string::npos) << r.output;
}

// One record per (spec, samples); the mean and standard error those of the draws it lists; the
// inputs' flags in the record.
TEST(AttentionMse, RecordsEveryCellWithItsDraws) {
  TempDir dir;
  const std::string d = dir.path.string();
  Shell r = run(EXE_ATTENTION_MSE,
                "--specs ra,performer --samples 2,4 --repeats 3 --n 10 --batch 2 --heads 2 --dim 4 --clusters 3 "
                "--layout random --dtype float64 --seed 9 --device cpu --threads 1 --json " +
                    d + "/m.jsonl",
                d);
  ASSERT_EQ(r.code, 0) << r.output;
  const std::vector<json> recs = records(d + "/m.jsonl");
  ASSERT_EQ(recs.size(), 4u) << r.output;
  for (size_t i = 0; i < recs.size(); ++i) {
    const json& j = recs[i];
    SCOPED_TRACE(j.dump());
    EXPECT_EQ(j.at("bench"), "attention-mse");
    EXPECT_EQ(j.at("spec"), i < 2 ? "ra" : "performer");
    EXPECT_EQ(j.at("samples"), i % 2 ? 4 : 2);
    EXPECT_EQ(j.at("spec_used"), i < 2 ? (i ? "ra:samples=4" : "ra:samples=2")
                                       : (i % 2 ? "performer:features=4" : "performer:features=2"));
    EXPECT_EQ(j.at("ok"), true);
    expect_fields(
        j, {{"B", 2}, {"H", 2}, {"N", 10}, {"M", 10}, {"D", 4}, {"repeats", 3}, {"seed", 9}, {"dtype", "float64"}});
    const std::string inputs = j.at("inputs");
    EXPECT_NE(inputs.find("3 clusters, layout random"), std::string::npos) << inputs;
    const std::vector<double> draws = j.at("mse_draws").get<std::vector<double>>();
    ASSERT_EQ(draws.size(), 3u);
    double mean = 0, var = 0;
    for (double x : draws) mean += x / 3;
    for (double x : draws) var += (x - mean) * (x - mean) / 2;
    EXPECT_GT(mean, 0.0);
    EXPECT_NEAR(j.at("mse_mean").get<double>(), mean, 1e-12 * mean);
    EXPECT_NEAR(j.at("mse_se").get<double>(), std::sqrt(var / 3), 1e-9 * mean);
    EXPECT_GT(j.at("softmax_out_mean_square").get<double>(), 0.0);
    EXPECT_TRUE(one_thread(j));
  }

  // Inputs from a file: cross-attention of 6 queries to 5 keys, in the file's dtype.
  const std::string file = d + "/qkv.safetensors";
  linea::manual_seed(3);
  const linea::TensorOptions f32(linea::DType::Float32);
  linea::nn::save_safetensors(file, {{"q", linea::randn({1, 2, 6, 4}, f32)},
                                     {"k", linea::randn({1, 2, 5, 4}, f32)},
                                     {"v", linea::randn({1, 2, 5, 4}, f32)}});
  r = run(EXE_ATTENTION_MSE,
          "--specs ra --samples 3 --repeats 2 --in " + file + " --device cpu --json " + d + "/f.jsonl", d);
  ASSERT_EQ(r.code, 0) << r.output;
  const std::vector<json> from_file = records(d + "/f.jsonl");
  ASSERT_EQ(from_file.size(), 1u) << r.output;
  expect_fields(from_file[0], {{"B", 1}, {"H", 2}, {"N", 6}, {"M", 5}, {"D", 4}, {"dtype", "float32"}, {"ok", true}});
  EXPECT_EQ(from_file[0].at("inputs").get<std::string>().rfind(file, 0), 0u) << from_file[0];
}

// The training steps of both apps: the units of a step, the steps timed (all but the warm-up and
// the last two), the rate their ratio; --json appends; the host's op cost.
TEST(TrainStep, RecordsTheRateOfEachModel) {
  TempDir dir;
  const std::string d = dir.path.string(), out = " --json " + d + "/t.jsonl";
  Shell r = run(EXE_TRAIN_STEP, "--model vit --batch 4 --steps 4 --warmup 2 --device cpu" + out, d);
  ASSERT_EQ(r.code, 0) << r.output;
  r = run(EXE_TRAIN_STEP, "--model translate --sentences 3 --length 5 --steps 3 --warmup 1 --device cpu" + out, d);
  ASSERT_EQ(r.code, 0) << r.output;
  r = run(EXE_TRAIN_STEP, "--op-cost --ops 50 --device cpu" + out, d);
  ASSERT_EQ(r.code, 0) << r.output;
  const std::vector<json> recs = records(d + "/t.jsonl");
  ASSERT_EQ(recs.size(), 3u);
  for (size_t i = 0; i < 2; ++i) {
    const json& j = recs[i];
    SCOPED_TRACE(j.dump());
    EXPECT_EQ(j.at("bench"), "train-step");
    EXPECT_EQ(j.at("model"), i ? "translate" : "vit");
    EXPECT_EQ(j.at("units"), i ? "target tokens" : "images");
    EXPECT_EQ(j.at("units_per_step"), i ? 15 : 4);
    EXPECT_EQ(j.at("warmup_steps"), i ? 1 : 2);
    EXPECT_EQ(j.at("steps_timed"), i ? 1 : 2);
    EXPECT_EQ(j.at("precision"), "fp32");
    EXPECT_EQ(j.at("cuda_graph"), false);
    EXPECT_EQ(j.at("launches_per_step"), 0);  // the CPU launches nothing
    EXPECT_GT(j.at("parameters").get<int64_t>(), 0);
    const double ms = j.at("step_ms").get<double>();
    EXPECT_GT(ms, 0.0);
    EXPECT_NEAR(j.at("units_per_s").get<double>(), j.at("units_per_step").get<double>() / (ms / 1e3),
                1e-9 * j.at("units_per_s").get<double>());
  }
  EXPECT_EQ(recs[2].at("bench"), "op-cost");
  EXPECT_EQ(recs[2].at("ops"), 50);
  EXPECT_GT(recs[2].at("host_us_per_op").get<double>(), 0.0);
}

// bench_matmul's fixed ViT shapes: each product equal to the direct BLAS call's on the same data (up
// to float32 rounding), its GFLOP the shape's, its rates that over the times listed.
TEST(BenchMatmul, EachShapeAgreesWithTheDirectCall) {
  TempDir dir;
  const std::string d = dir.path.string();
  const Shell r = run(EXE_BENCH_MATMUL, "--reps 2 --warmup 0 --json " + d + "/mm.jsonl", d);
  ASSERT_EQ(r.code, 0) << r.output;
  const std::vector<json> recs = records(d + "/mm.jsonl");
  ASSERT_GE(recs.size(), 5u) << r.output;
  for (const json& j : recs) {
    SCOPED_TRACE(j.dump());
    EXPECT_EQ(j.at("bench"), "matmul");
    EXPECT_EQ(j.at("reps"), 2);
    const double batch = j.at("batch"), m = j.at("M"), n = j.at("N"), k = j.at("K"), gflop = j.at("gflop");
    EXPECT_TRUE(same(gflop, 2 * batch * m * n * k * 1e-9));
    EXPECT_TRUE(same(j.at("linea_gflops"), gflop / (j.at("linea_ms").get<double>() * 1e-3)));
    EXPECT_TRUE(same(j.at("direct_gflops"), gflop / (j.at("direct_ms").get<double>() * 1e-3)));
    EXPECT_TRUE(same(j.at("ratio"), j.at("linea_gflops").get<double>() / j.at("direct_gflops").get<double>()));
    EXPECT_LE(j.at("max_abs_diff").get<double>(), 1e-3);
  }
}
