// The protein app end to end through its executable, on generated sequences that have something
// to learn: families of mutated copies of Markov-chain sequences whose next residue is a fixed
// function of the current one half of the time. mmseqs2 clusters the families, so the cluster
// split tests on families the model never saw; only the chain's rule carries over. Checked:
// prepare, training beats the unigram baseline by far (a broken model, mask or metric does not),
// summary.json's fields, fill and embed on the trained checkpoint, an exact resume, and clear
// errors for bad input.
#include <gtest/gtest.h>

#include <sys/wait.h>

#include <cmath>
#include <fstream>
#include <map>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "alphabet.h"
#include "apps/common/metrics.h"
#include "nn/safetensors.h"
#include "tests/test_util.h"
#include "toy_data.h"

using json = nlohmann::json;
using linea::test::TempDir;
using namespace protein::test;

namespace {

struct Shell {
  int code;
  std::string output;
};
Shell protein_cmd(const std::string& args, const TempDir& dir) {
  const std::string log = dir.file("protein_output.txt");
  const int rc = std::system((std::string(PROTEIN_EXE) + " " + args + " > " + log + " 2>&1").c_str());
  return {WIFEXITED(rc) ? WEXITSTATUS(rc) : -1, linea::test::read_all(log)};
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
  const Shell r = protein_cmd("train --out " + part + flags + " --resume", *dir_);
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
  // Another mask rate is refused, naming it.
  const Shell other = protein_cmd("train --out " + part + flags + " --resume --mask-prob 0.2", *dir_);
  EXPECT_NE(other.code, 0);
  EXPECT_NE(other.output.find("mask_prob"), std::string::npos) << other.output;
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
  ASSERT_EQ(protein_cmd("train --data " + data + " --out " + out + " --epochs 1" + kModelFlags, *dir_).code, 0);
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
