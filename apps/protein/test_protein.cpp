// The protein app end to end through its executable, on generated sequences that have something
// to learn: families of mutated copies of Markov-chain sequences whose next residue is a fixed
// function of the current one half of the time. mmseqs2 clusters the families, so the cluster
// split tests on families the model never saw; only the chain's rule carries over. Checked:
// prepare, training beats the unigram baseline by far (a broken model, mask or metric does not),
// summary.json's fields, every training flag in the checkpoint's config, fill and embed on the
// trained checkpoint, an exact resume, packed training and --eval-only on the checkpoint's
// windows, the mask rate and the evaluation positions, and clear errors for bad input; and
// protein-bench-context's records.
#include <gtest/gtest.h>

#include <sys/wait.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "alphabet.h"
#include "apps/common/metrics.h"
#include "autograd/ops.h"
#include "dataset.h"
#include "nn/safetensors.h"
#include "nn/sampler.h"
#include "tests/test_util.h"
#include "toy_data.h"

using json = nlohmann::json;
using linea::test::TempDir;
using namespace protein::test;

namespace {

using linea::test::Shell;
Shell protein_cmd(const std::string& args, const TempDir& dir) {
  return linea::test::run_shell(PROTEIN_EXE, args, dir.file("protein_output.txt"));
}

const std::string kModelFlags =
    " --dim 64 --heads 4 --layers 2 --mlp-hidden 128 --max-len 48 --max-tokens 512 --lr 3e-3 --warmup 50"
    " --patience 0 --device cpu --threads 1 --no-progress --no-plot --log-every 10";

// One prepared toy folder shared by the tests (mmseqs takes a few seconds).
class ProteinApp : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir();
    write_families(dir_->file("toy.fasta"), 40, 8, 1, "seq");
    write_families(dir_->file("query.fasta"), 4, 5, 2, "query");
    const Shell s = protein_cmd("prepare --fasta " + dir_->file("toy.fasta") + " --query " + dir_->file("query.fasta") +
                                    " --out " + dir_->file("data") + " --valid-size 40 --test-size 40 --threads 1",
                                *dir_);
    ASSERT_EQ(s.code, 0) << s.output;
  }
  static void TearDownTestSuite() {
    delete dir_;
    dir_ = nullptr;
  }
  static TempDir* dir_;
};
TempDir* ProteinApp::dir_ = nullptr;

}  // namespace

TEST_F(ProteinApp, TrainsBeatsTheBaselineFillsAndEmbeds) {
  const std::string data = dir_->file("data"), out = dir_->file("run");
  const json manifest = linea::apps::read_json_file(data + "/data.json", "test");
  EXPECT_EQ(manifest.at("split").at("method"), "cluster");

  const Shell t = protein_cmd("train --data " + data + " --out " + out + " --epochs 80" + kModelFlags, *dir_);
  ASSERT_EQ(t.code, 0) << t.output;
  const json s = linea::apps::read_json_file(out + "/summary.json", "test");
  const double acc = s.at("test_masked_accuracy"), ppl = s.at("test_perplexity");
  const double base_acc = s.at("baseline_masked_accuracy"), base_ppl = s.at("baseline_perplexity");
  // Unseen families: only the chain's rule helps. It predicts about half the positions whose left
  // neighbour is visible; the unigram baseline is near 1/20.
  EXPECT_LT(base_acc, 0.12);
  EXPECT_GT(base_ppl, 15.0);
  EXPECT_GT(acc, 2.5 * base_acc) << t.output;
  EXPECT_LT(ppl, base_ppl - 4.0) << t.output;
  EXPECT_GT(s.at("test_masked_positions").get<int64_t>(), 200);
  EXPECT_TRUE(s.contains("query_masked_accuracy"));
  EXPECT_TRUE(s.contains("baseline_query_perplexity"));
  EXPECT_TRUE(s.at("test_per_residue_accuracy").contains("L"));
  EXPECT_DOUBLE_EQ(s.at("test_accuracy_over_baseline").get<double>(), acc / base_acc);
  EXPECT_DOUBLE_EQ(s.at("test_perplexity_below_baseline").get<double>(), base_ppl - ppl);
  EXPECT_TRUE(s.contains("valid_perplexity"));  // the final evaluation's, with the best weights
  // The closing line reports the same numbers.
  char line[256];
  std::snprintf(
      line, sizeof line,
      "test masked accuracy %.2f%%, perplexity %.3f; baseline %.2f%%, %.3f; best valid perplexity %.3f at step "
      "%lld",
      100 * acc, ppl, 100 * base_acc, base_ppl, s.at("best_valid_perplexity").get<double>(),
      static_cast<long long>(s.at("best_step").get<int64_t>()));
  EXPECT_NE(t.output.find(line), std::string::npos) << line << "\n" << t.output;
  // The checkpoint's config: the data's manifest, and the run's masking, size and seed.
  const json config = linea::apps::read_json_file(out + "/checkpoint/config.json", "test");
  EXPECT_EQ(config.at("data"), manifest);
  const json& run = config.at("run");
  EXPECT_EQ(run.at("data").get<std::string>(), std::filesystem::absolute(data).lexically_normal().string());
  EXPECT_EQ(
      run.at("train_sequences").get<int64_t>(),
      static_cast<int64_t>(protein::read_sequences(protein::split_path(protein::read_manifest(data), "train")).size()));
  EXPECT_EQ(run.at("mask_prob").get<double>(), 0.15);
  EXPECT_EQ(run.at("mask_token").get<double>(), 0.8);
  EXPECT_EQ(run.at("random_token").get<double>(), 0.1);
  EXPECT_EQ(run.at("seed").get<uint64_t>(), 0u);
  // Every flag of kModelFlags reached the model and the run (the defaults differ).
  EXPECT_EQ(config.at("model"), json({{"dim", 64},
                                      {"heads", 4},
                                      {"layers", 2},
                                      {"mlp_hidden", 128},
                                      {"dropout", 0.0},
                                      {"attention", "softmax"},
                                      {"positions", "learned"},
                                      {"max_len", 48}}));
  for (const auto& [key, value] : std::vector<std::pair<std::string, json>>{
           {"max_tokens", 512}, {"lr", 3e-3}, {"warmup", 50}, {"patience", 0}, {"epochs", 80}})
    EXPECT_EQ(run.at(key), value) << key;
  EXPECT_GT(s.at("train_residues_per_s").get<double>(), 0.0);
  EXPECT_TRUE(std::ifstream(out + "/checkpoint/best/model.safetensors").good());

  // fill: between c and successor(successor(c)) the rule says successor(c); it should be among
  // the top 3 at most of these masks (chance: 3 in 20 each).
  std::string seq;
  std::vector<char> expected;
  for (char c : std::string("LAGSEKDN")) {
    seq += std::string(1, c) + "<mask>" + std::string(1, successor(successor(c))) + "W";
    expected.push_back(successor(c));
  }
  const Shell f = protein_cmd("fill --checkpoint " + out + "/checkpoint --device cpu --top-k 3 '" + seq + "'", *dir_);
  ASSERT_EQ(f.code, 0) << f.output;
  int masks = 0, right = 0;
  std::istringstream lines(f.output);
  for (std::string line; std::getline(lines, line);) {
    if (line.find("<mask> at") == std::string::npos) continue;
    std::istringstream in(line.substr(line.find(':') + 1));
    std::string residue;
    double p0 = 0, p = 0, prev = 1;
    int k = 0;
    for (; in >> residue >> p; ++k) {
      EXPECT_LE(p, prev + 1e-12) << line;  // descending
      if (k == 0) p0 = p;
      if (residue[0] == expected.at(masks)) ++right;
      prev = p;
    }
    EXPECT_EQ(k, 3) << line;
    EXPECT_GT(p0, 0.0);
    ++masks;
  }
  EXPECT_EQ(masks, 8) << f.output;
  EXPECT_GE(right, 6) << f.output;

  // embed: one mean row per query sequence, per-residue rows of each sequence's length.
  const std::string emb = dir_->file("emb.safetensors");
  const Shell e = protein_cmd("embed --checkpoint " + out + "/checkpoint --device cpu " + dir_->file("query.fasta") +
                                  " --out " + emb + " --per-residue",
                              *dir_);
  ASSERT_EQ(e.code, 0) << e.output;
  const auto file = linea::nn::load_safetensors(emb);
  const linea::Tensor& mean = file.tensors.at("mean");
  ASSERT_EQ(mean.dim(), 2);
  EXPECT_EQ(mean.size(0), 20);
  EXPECT_EQ(mean.size(1), 64);
  const json names = json::parse(file.metadata.at("names"));
  ASSERT_EQ(names.size(), 20u);
  EXPECT_EQ(names[0], "query0_0");
  const linea::Tensor& r0 = file.tensors.at("residues.0");
  EXPECT_EQ(r0.size(1), 64);
  EXPECT_GE(r0.size(0), 30);
}

TEST_F(ProteinApp, ResumeContinuesExactly) {
  const std::string data = dir_->file("data");
  const std::string full = dir_->file("full"), part = dir_->file("part");
  const std::string flags = " --data " + data + " --epochs 3" + kModelFlags;
  ASSERT_EQ(protein_cmd("train --out " + full + flags, *dir_).code, 0);
  ASSERT_EQ(protein_cmd("train --out " + part + flags + " --max-steps 7", *dir_).code, 0);  // mid-epoch
  // The data folder spelled another way is the same folder.
  const Shell r =
      protein_cmd("train --out " + part + " --data " + data + "/./ --epochs 3" + kModelFlags + " --resume", *dir_);
  ASSERT_EQ(r.code, 0) << r.output;
  // The same losses after the interruption (step records average the steps since the last one:
  // from step 20 on both cover the same steps), and the same epoch-end evaluations.
  auto after = [](const std::string& run, const std::string& type, const std::string& key) {
    std::vector<double> v;
    for (const json& x : linea::apps::MetricsLog::read(run + "/metrics.jsonl"))
      if (x.at("type") == type && x.at("step").get<int64_t>() > 10) v.push_back(x.at(key).get<double>());
    return v;
  };
  ASSERT_GE(after(full, "step", "loss").size(), 5u);
  EXPECT_EQ(after(full, "step", "loss"), after(part, "step", "loss"));
  ASSERT_EQ(after(full, "epoch", "valid_perplexity").size(), 3u);
  EXPECT_EQ(after(full, "epoch", "valid_perplexity"), after(part, "epoch", "valid_perplexity"));
  const json a = linea::apps::read_json_file(full + "/summary.json", "test");
  const json b = linea::apps::read_json_file(part + "/summary.json", "test");
  EXPECT_EQ(a.at("test_perplexity").get<double>(), b.at("test_perplexity").get<double>());
  // Another mask rate or seed is refused, naming it.
  for (const auto& [flag, key] :
       std::vector<std::pair<std::string, std::string>>{{"--mask-prob 0.2", "mask_prob"}, {"--seed 3", "seed"}}) {
    const Shell other = protein_cmd("train --out " + part + flags + " --resume " + flag, *dir_);
    EXPECT_NE(other.code, 0) << flag;
    EXPECT_NE(other.output.find(key), std::string::npos) << other.output;
  }
}

// --pack: training and evaluation on equal windows cut from the concatenated sequences, the
// windows the model's context (its config's max_len), a fixed number of them per batch
// (--max-tokens / --pack, at least one); --eval-only scores the checkpoint on its own windows
// whatever the flags say, so it reproduces the run's final numbers.
TEST_F(ProteinApp, PackedWindowsTrainAndEvalOnlyKeepsThem) {
  const std::string data = dir_->file("data"), out = dir_->file("packed");
  // --max-tokens 60 below --pack 100: one window per batch.
  std::string flags = kModelFlags;
  flags.replace(flags.find(" --max-tokens 512"), 17, " --max-tokens 60");
  const Shell t = protein_cmd("train --data " + data + " --out " + out + " --epochs 1 --pack 100" + flags, *dir_);
  ASSERT_EQ(t.code, 0) << t.output;
  EXPECT_NE(t.output.find("packed into windows of 100 tokens"), std::string::npos) << t.output;
  const json config = linea::apps::read_json_file(out + "/checkpoint/config.json", "test");
  EXPECT_EQ(config.at("model").at("max_len").get<int64_t>(), 100);
  EXPECT_EQ(config.at("run").at("pack").get<int64_t>(), 100);
  protein::DatasetOptions packed;
  packed.max_len = packed.pack = 100;
  packed.train = true;
  const protein::Manifest manifest = protein::read_manifest(data);
  const protein::MaskedLMDataset windows(
      std::make_shared<const protein::Sequences>(protein::read_sequences(protein::split_path(manifest, "train"))),
      packed);
  const json s = linea::apps::read_json_file(out + "/summary.json", "test");
  EXPECT_EQ(s.at("steps").get<int64_t>(), windows.size());

  const std::string again = dir_->file("packed_eval");
  const Shell e = protein_cmd(
      "train --data " + data + " --out " + again + " --eval-only --checkpoint " + out + "/checkpoint" + kModelFlags,
      *dir_);
  ASSERT_EQ(e.code, 0) << e.output;
  const json ev = linea::apps::read_json_file(again + "/eval.json", "test");
  for (const char* k : {"test_perplexity", "test_masked_accuracy", "valid_perplexity", "baseline_perplexity"})
    EXPECT_EQ(ev.at(k).get<double>(), s.at(k).get<double>()) << k;
  EXPECT_EQ(ev.at("test_masked_positions"), s.at("test_masked_positions"));
}

// The masking flags reach the training windows (each step record's `chosen` is its chosen
// positions per residue: --mask-prob), one random crop per training sequence (its step count is
// the token-budget batches of the training dataset's windows), --ema reaches the loop; the
// evaluation scores whole sequences in windows, positions fixed by the data's seed, not the run's:
// two runs with other seeds score the same positions, so their baselines are the same numbers.
TEST_F(ProteinApp, MaskRateReachesTrainingAndEvaluationPositionsIgnoreTheSeed) {
  const std::string data = dir_->file("data");
  json summaries[2];
  for (int seed : {7, 8}) {
    const std::string out = dir_->file("seed" + std::to_string(seed));
    const Shell t =
        protein_cmd("train --data " + data + " --out " + out + " --epochs 1 --ema 0.9 --mask-prob 0.3 --seed " +
                        std::to_string(seed) + kModelFlags,
                    *dir_);
    ASSERT_EQ(t.code, 0) << t.output;
    summaries[seed - 7] = linea::apps::read_json_file(out + "/summary.json", "test");
    EXPECT_EQ(summaries[seed - 7].at("ema_decay").get<double>(), 0.9);
    double chosen = 0;
    int records = 0;
    for (const json& r : linea::apps::MetricsLog::read(out + "/metrics.jsonl"))
      if (r.at("type") == "step") chosen += r.at("chosen").get<double>(), ++records;
    ASSERT_GT(records, 0);
    EXPECT_NEAR(chosen / records, 0.3, 0.05) << seed;  // 0.15 by default
  }
  const protein::Manifest manifest = protein::read_manifest(data);
  const auto split = [&](const char* name) {
    return std::make_shared<const protein::Sequences>(protein::read_sequences(protein::split_path(manifest, name)));
  };
  protein::DatasetOptions train;
  train.max_len = 48;
  train.train = true;
  train.masking.prob = 0.3;
  train.seed = 7;
  const protein::MaskedLMDataset windows(split("train"), train);
  const linea::nn::TokenBudgetBatchSampler batches(windows.lengths(), {512, 0, true, 7});
  EXPECT_EQ(summaries[0].at("steps").get<int64_t>(), batches.num_batches(0));
  // The test positions: the sequences whole, in windows, with masks fixed by the data's seed.
  protein::DatasetOptions eval = train;
  eval.train = false;
  eval.seed = manifest.json.at("split").at("seed").get<uint64_t>();
  const protein::MaskedLMDataset test_windows(split("test"), eval);
  std::vector<int64_t> all(test_windows.size());
  std::iota(all.begin(), all.end(), 0);
  const linea::Tensor targets = test_windows.get_batch(all).at("targets");
  EXPECT_EQ(summaries[0].at("test_masked_positions").get<int64_t>(),
            static_cast<int64_t>(linea::sum(targets != static_cast<double>(protein::kPad)).item()));
  for (const char* k : {"baseline_masked_accuracy", "baseline_perplexity", "baseline_query_perplexity"})
    EXPECT_EQ(summaries[0].at(k).get<double>(), summaries[1].at(k).get<double>()) << k;
  EXPECT_EQ(summaries[0].at("test_masked_positions"), summaries[1].at("test_masked_positions"));
  // (The runs themselves differ.)
  EXPECT_NE(summaries[0].at("test_perplexity").get<double>(), summaries[1].at("test_perplexity").get<double>());
}

TEST_F(ProteinApp, BadInputGetsAClearError) {
  // An invalid residue: the record and the position.
  {
    std::ofstream f(dir_->file("bad.fasta"));
    f << ">good\nMKVLAG\n>broken desc\nMKV\nLAJG\n";
  }
  Shell s = protein_cmd("prepare --fasta " + dir_->file("bad.fasta") + " --query '' --out " + dir_->file("bad"), *dir_);
  EXPECT_NE(s.code, 0);
  EXPECT_NE(s.output.find("broken"), std::string::npos) << s.output;
  EXPECT_NE(s.output.find("'J'"), std::string::npos) << s.output;
  EXPECT_NE(s.output.find("6"), std::string::npos) << s.output;  // J is residue 6 of the record
  // An empty record.
  {
    std::ofstream f(dir_->file("empty.fasta"));
    f << ">one\nMKVLAG\n>two\n>three\nMKV\n";
  }
  s = protein_cmd("prepare --fasta " + dir_->file("empty.fasta") + " --query '' --out " + dir_->file("empty"), *dir_);
  EXPECT_NE(s.code, 0);
  EXPECT_NE(s.output.find("two"), std::string::npos) << s.output;
  // A checkpoint from another app.
  const std::string foreign = dir_->file("foreign");
  std::filesystem::create_directories(foreign);
  std::ofstream(foreign + "/config.json") << R"({"format": "linea-translate/1", "model": {}})";
  s = protein_cmd("fill --checkpoint " + foreign + " --device cpu 'MK<mask>'", *dir_);
  EXPECT_NE(s.code, 0);
  EXPECT_NE(s.output.find("linea-translate/1"), std::string::npos) << s.output;
  // fill without a mask, and with a character outside the alphabet.
  const std::string data = dir_->file("data");
  const std::string out = dir_->file("tiny");
  ASSERT_EQ(protein_cmd("train --data " + data + " --out " + out + " --epochs 1" + kModelFlags +
                            " --schedule constant --weight-decay 0.02 --dropout 0.05 --positions none",
                        *dir_)
                .code,
            0);
  {  // these flags reach the run too (the defaults differ)
    const json config = linea::apps::read_json_file(out + "/checkpoint/config.json", "test");
    EXPECT_EQ(config.at("model").at("dropout"), 0.05);
    EXPECT_EQ(config.at("model").at("positions"), "none");
    EXPECT_EQ(config.at("run").at("schedule"), "constant");
    EXPECT_EQ(config.at("run").at("weight_decay"), 0.02);
  }
  s = protein_cmd("fill --checkpoint " + out + "/checkpoint --device cpu MKVLAG", *dir_);
  EXPECT_NE(s.code, 0);
  EXPECT_NE(s.output.find("<mask>"), std::string::npos) << s.output;
  s = protein_cmd("fill --checkpoint " + out + "/checkpoint --device cpu 'MK*<mask>'", *dir_);
  EXPECT_NE(s.code, 0);
  EXPECT_NE(s.output.find("'*'"), std::string::npos) << s.output;
  // A --max-len below the three tokens of the shortest window (<cls> residue <eos>).
  s = protein_cmd("train --data " + data + " --out " + dir_->file("short") + " --epochs 1 --max-len 2", *dir_);
  EXPECT_NE(s.code, 0);
  EXPECT_NE(s.output.find("max-len"), std::string::npos) << s.output;
}

// protein-bench-context's JSON: the settings as given (lengths sorted, softmax first: the ratios'
// baseline), a result per (length, mechanism) whose time is the median of the steps it lists and
// whose ratios are against softmax at the same length; a case over --memory-limit-gib is named so.
TEST(ProteinBenchContext, RecordsEveryCaseWithItsSettings) {
  TempDir dir;
  const std::string out = dir.file("context.json");
  Shell r = linea::test::run_shell(
      BENCH_CONTEXT_EXE,
      "--lengths 40,16 --attention performer:features=8,softmax --dim 16 --heads 2 --layers 1 --mlp-hidden 24"
      " --positions none --batch 2 --repeats 4 --seed 3 --device cpu --threads 1 --memory-limit-gib 1 --json " +
          out,
      dir.file("log.txt"));
  ASSERT_EQ(r.code, 0) << r.output;
  json j = json::parse(linea::test::read_all(out));
  EXPECT_EQ(j.at("bench"), "protein-bench-context");
  EXPECT_EQ(j.at("complete"), true);
  EXPECT_NE(j.at("device").get<std::string>().find(" 1 OpenMP threads"), std::string::npos) << j.at("device");
  const json& settings = j.at("settings");
  for (const auto& [key, value] :
       std::vector<std::pair<std::string, json>>{{"attention", {"softmax", "performer:features=8"}},
                                                 {"lengths", {16, 40}},
                                                 {"dim", 16},
                                                 {"heads", 2},
                                                 {"layers", 1},
                                                 {"mlp_hidden", 24},
                                                 {"positions", "none"},
                                                 {"batch", 2},
                                                 {"repeats", 4},
                                                 {"seed", 3},
                                                 {"threads", 1},
                                                 {"memory_limit_gib", 1.0}})
    EXPECT_EQ(settings.at(key), value) << key;
  const json& results = j.at("results");
  ASSERT_EQ(results.size(), 4u);
  for (size_t i = 0; i < 4; ++i) {
    const json& r = results[i];
    SCOPED_TRACE(r.dump());
    EXPECT_EQ(r.at("length"), i < 2 ? 16 : 40);
    EXPECT_EQ(r.at("attention"), i % 2 ? "performer:features=8" : "softmax");
    EXPECT_EQ(r.at("status"), "ok");
    std::vector<double> times = r.at("times_ms").get<std::vector<double>>();
    ASSERT_EQ(times.size(), 4u);
    std::sort(times.begin(), times.end());
    EXPECT_DOUBLE_EQ(r.at("ms_per_step").get<double>(), (times[1] + times[2]) / 2);  // the median
    for (const json& loss : r.at("losses")) EXPECT_TRUE(std::isfinite(loss.get<double>()) && loss.get<double>() > 0);
    EXPECT_EQ(r.at("losses").size(), 4u);
    EXPECT_EQ(r.at("parameters"), results[0].at("parameters"));  // no positional table: the same model at every L
    const json& softmax = results[i / 2 * 2];
    EXPECT_DOUBLE_EQ(r.at("time_ratio_to_softmax").get<double>(),
                     r.at("ms_per_step").get<double>() / softmax.at("ms_per_step").get<double>());
    EXPECT_DOUBLE_EQ(r.at("memory_ratio_to_softmax").get<double>(),
                     r.at("peak_bytes").get<double>() / softmax.at("peak_bytes").get<double>());
  }

  // A limit the longer length exceeds.
  r = linea::test::run_shell(BENCH_CONTEXT_EXE,
                             "--lengths 16,64 --attention softmax --dim 16 --heads 2 --layers 1 --mlp-hidden 24"
                             " --batch 2 --repeats 3 --device cpu --threads 1 --memory-limit-gib 0.0002 --json " +
                                 out,
                             dir.file("log.txt"));
  ASSERT_EQ(r.code, 0) << r.output;
  j = json::parse(linea::test::read_all(out));
  ASSERT_EQ(j.at("results").size(), 2u);
  EXPECT_EQ(j.at("results")[0].at("status"), "ok");
  EXPECT_EQ(j.at("results")[1].at("status"), "does_not_fit");
  EXPECT_NE(j.at("results")[1].at("note").get<std::string>().find("out of memory"), std::string::npos);
  EXPECT_NE(r.output.find("does not fit in 0.0002 GiB"), std::string::npos) << r.output;
}
