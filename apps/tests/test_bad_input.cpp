// The bad-input sweep: every app executable (vit, translate, protein, linea-attn, linea-bleu, the
// mlp example, the benchmarks' flags) is run on bad input: out-of-range numbers, wrong types,
// missing and unreadable files and folders (a folder where a file belongs and the reverse), empty
// and truncated data files, mismatched checkpoints (another app's, another model size, a missing
// or truncated file, --resume with other settings), attention specs with wrong keys or values,
// and numerical faults (a learning rate that makes training diverge; a checkpoint whose weights
// hold NaN given to --predict / decode / fill / embed / --eval-only; NaN and Inf in inputs).
// Every run must end on its own within a time limit, exit non-zero and not by a signal, print a
// line that names what is wrong (each case says which flag, file or value), and print nothing of
// a crash: no "terminate called", sanitizer report, stack trace or bare library exception text.
// Each test prints how many bad inputs its app got; the data are tiny and made here.
// Not here: the readers' fuzzing (tests/fuzz/), kills and full disks (apps/vit/test_vit_faults.cpp),
// what each app computes on good input (the apps' own tests).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <stb/stb_image_write.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <limits>
#include <map>
#include <regex>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "apps/protein/toy_data.h"
#include "apps/translate/toy_data.h"
#include "apps/vit/fake_data.h"
#include "linea.h"
#include "nn/safetensors.h"
#include "tests/test_util.h"

namespace fs = std::filesystem;
using linea::test::read_all;
using linea::test::TempDir;
using linea::test::write_all;

namespace {

// ---- running an executable with a time limit ----------------------------------------------------

constexpr double kLimitS = 60;  // per run: far above what any case needs (well under a second)

struct Outcome {
  bool timed_out = false;
  int signal = 0;      // the signal that ended the process (0: it exited)
  int code = -1;       // its exit status
  std::string output;  // stdout and stderr together
};

// Runs exe with args (no shell) in its own process group, stdin from `input` (empty: /dev/null),
// stdout and stderr into `log`; kills the group after limit_s.
Outcome run(const std::string& exe, const std::vector<std::string>& args, const std::string& input,
            const std::string& log, double limit_s = kLimitS) {
  const pid_t pid = fork();
  if (pid < 0) throw std::runtime_error(std::string("fork: ") + std::strerror(errno));
  if (pid == 0) {
    setpgid(0, 0);
    const int in = open(input.empty() ? "/dev/null" : input.c_str(), O_RDONLY);
    const int out = open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (in < 0 || out < 0) _exit(126);
    dup2(in, 0);
    dup2(out, 1);
    dup2(out, 2);
    setenv("OMP_NUM_THREADS", "1", 1);
    std::vector<char*> argv{const_cast<char*>(exe.c_str())};
    for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    execv(exe.c_str(), argv.data());
    _exit(127);
  }
  setpgid(pid, pid);
  Outcome r;
  int status = 0;
  const auto start = std::chrono::steady_clock::now();
  while (waitpid(pid, &status, WNOHANG) == 0) {
    if (std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() > limit_s) {
      kill(-pid, SIGKILL);
      waitpid(pid, &status, 0);
      r.timed_out = true;
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  if (WIFSIGNALED(status)) r.signal = WTERMSIG(status);
  if (WIFEXITED(status)) r.code = WEXITSTATUS(status);
  r.output = read_all(log);
  return r;
}

// ---- judging a run --------------------------------------------------------------------------------

// What a crash, an uncaught exception or a message that says nothing prints.
const char* const kCrashSigns[] = {
    "terminate called",
    "what():",
    "Aborted",
    "Segmentation",
    "core dumped",
    "AddressSanitizer",
    "LeakSanitizer",
    "runtime error",
    "Stack trace",
    "stack trace",
    "Backtrace",
    "backtrace",
    "#0 0x",
    "#1 0x",
    "std::",  // a bare library exception: "std::bad_alloc", "cannot create std::vector larger than max_size()"
    "basic_string",
    "_M_",
    "stoll",
    "stoi",
    "stod",
    "1797693134862315",  // DBL_MAX printed in full: CLI11's open range bound, not a message
};

struct Case {
  Case(std::vector<std::string> a, std::vector<std::string> e, std::string in = "")
      : args(std::move(a)), expect(std::move(e)), input(std::move(in)) {}
  std::vector<std::string> args;
  // Some line of the output holds all of these: the flag, file or value at fault (and, for a
  // numerical fault, the step).
  std::vector<std::string> expect;
  std::string input;  // stdin ("": /dev/null)
};

std::string joined(const std::vector<std::string>& args) {
  std::string s;
  for (const std::string& a : args) s += (s.empty() ? "" : " ") + (a.empty() ? "''" : a);
  return s;
}

::testing::AssertionResult clear_error(const Outcome& r, const Case& c) {
  auto fail = [&](const std::string& why) {
    return ::testing::AssertionFailure() << why << "; output:\n" << r.output.substr(0, 4000);
  };
  if (r.timed_out) return fail("did not end within " + std::to_string(static_cast<int>(kLimitS)) + " s (killed)");
  if (r.signal != 0) return fail(std::string("ended by signal ") + strsignal(r.signal));
  if (r.code == 0) return fail("exit status 0 on bad input");
  for (const char* sign : kCrashSigns)
    if (r.output.find(sign) != std::string::npos) return fail(std::string("the output holds '") + sign + "'");
  size_t begin = 0;
  while (begin <= r.output.size()) {
    const size_t end = std::min(r.output.find('\n', begin), r.output.size());
    const std::string line = r.output.substr(begin, end - begin);
    bool all = true;
    for (const std::string& e : c.expect) all = all && line.find(e) != std::string::npos;
    if (all) return ::testing::AssertionSuccess();
    begin = end + 1;
  }
  std::string want;
  for (const std::string& e : c.expect) want += (want.empty() ? "'" : " and '") + e + "'";
  return fail("no line names " + want);
}

// How many bad inputs each app got in this process, and how many gave a clear error.
std::map<std::string, std::pair<int, int>>& tally() {
  static std::map<std::string, std::pair<int, int>> t;
  return t;
}

// The last line of the output that starts like an error ("error: ", "<tool>: ", CLI11's "--flag: "), else its last
// line.
std::string error_line(const std::string& output) {
  std::string last, error;
  size_t begin = 0;
  while (begin < output.size()) {
    const size_t end = std::min(output.find('\n', begin), output.size());
    const std::string line = output.substr(begin, end - begin);
    if (!line.empty()) last = line;
    if (line.find("error") != std::string::npos || line.rfind("--", 0) == 0) error = line;
    begin = end + 1;
  }
  return error.empty() ? last : error;
}

// Runs every case through exe and checks each; logs go to dir. LINEA_SWEEP_VERBOSE=1 prints each
// case with its error line.
void sweep(const std::string& app, const std::string& exe, const std::vector<Case>& cases, const TempDir& dir) {
  const bool verbose = std::getenv("LINEA_SWEEP_VERBOSE") != nullptr;
  int clear = 0;
  for (const Case& c : cases) {
    const Outcome r = run(exe, c.args, c.input, dir.file("sweep_output.txt"));
    const ::testing::AssertionResult ok = clear_error(r, c);
    clear += ok ? 1 : 0;
    if (verbose)
      std::printf("%s %s\n  -> %d: %s\n", app.c_str(), joined(c.args).c_str(), r.code, error_line(r.output).c_str());
    EXPECT_TRUE(ok) << app << " " << joined(c.args);
  }
  auto& [tried, good] = tally()[app];
  tried += static_cast<int>(cases.size());
  good += clear;
  std::printf("bad-input sweep: %s: %zu bad inputs, %d gave a clear error\n", app.c_str(), cases.size(), clear);
  std::fflush(stdout);
}

class SweepSummary : public ::testing::Environment {
 public:
  void TearDown() override {
    int tried = 0, good = 0;
    for (const auto& [app, n] : tally()) {
      std::printf("bad-input sweep summary: %-24s %4d bad inputs, %4d clear errors\n", app.c_str(), n.first, n.second);
      tried += n.first;
      good += n.second;
    }
    if (!tally().empty())
      std::printf("bad-input sweep summary: %-24s %4d bad inputs, %4d clear errors\n", "all", tried, good);
  }
};
const auto* const kSummary = ::testing::AddGlobalTestEnvironment(new SweepSummary);

// ---- building argument lists and bad files ----------------------------------------------------------

using Args = std::vector<std::string>;

// base with flag set to value: replaced where base has the flag, else appended.
Args with(Args base, const std::string& flag, const std::string& value) {
  for (size_t i = 0; i + 1 < base.size(); ++i)
    if (base[i] == flag) {
      base[i + 1] = value;
      return base;
    }
  base.push_back(flag);
  base.push_back(value);
  return base;
}

// base followed by more words.
Args plus(Args base, const Args& more) {
  base.insert(base.end(), more.begin(), more.end());
  return base;
}

// base without flag and its value.
Args without(Args base, const std::string& flag) {
  for (size_t i = 0; i + 1 < base.size(); ++i)
    if (base[i] == flag) {
      base.erase(base.begin() + static_cast<std::ptrdiff_t>(i), base.begin() + static_cast<std::ptrdiff_t>(i) + 2);
      break;
    }
  return base;
}

// A copy of src (file or folder) at dst.
std::string copy_of(const std::string& src, const std::string& dst) {
  fs::remove_all(dst);
  fs::copy(src, dst, fs::copy_options::recursive);
  return dst;
}

// The file cut to its first `fraction` of bytes.
void truncate(const std::string& path, double fraction) {
  fs::resize_file(path, static_cast<uintmax_t>(static_cast<double>(fs::file_size(path)) * fraction));
}

// One weight of a safetensors model file set to `value` (NaN, Inf): the last floating tensor's
// middle element, so a check must look at every value of every tensor.
void poison(const std::string& path, float value) {
  linea::nn::SafetensorsFile f = linea::nn::load_safetensors(path);
  std::string last;
  for (const auto& [name, t] : f.tensors)
    if (t.dtype() == linea::DType::Float32) last = name;
  ASSERT_FALSE(last.empty()) << path;
  const linea::Tensor t = f.tensors.at(last);
  std::vector<float> v = t.to_vector<float>();
  v[v.size() / 2] = value;
  f.tensors[last] = linea::from_vector<float>(v, t.shape());
  linea::nn::save_safetensors(path, f.tensors, f.metadata);
}

const float kNaN = std::numeric_limits<float>::quiet_NaN();
const float kInf = std::numeric_limits<float>::infinity();

// A PNG of w x h gray pixels.
void write_png(const std::string& path, int w, int h) {
  std::vector<uint8_t> px(static_cast<size_t>(w) * h, 120);
  ASSERT_NE(stbi_write_png(path.c_str(), w, h, 1, px.data(), w), 0) << path;
}

// An IDX file (gzip) with the given magic, dims and payload.
void write_idx(const std::string& path, uint32_t magic, const std::vector<uint32_t>& dims, const std::string& payload) {
  std::string bytes;
  vit::test::put_be32(bytes, magic);
  for (uint32_t d : dims) vit::test::put_be32(bytes, d);
  vit::test::write_gz(path, bytes + payload);
}

// Where the process's shared runs live: each built once, on first use, by the executables.
TempDir& shared_dir() {
  static TempDir dir;  // removed at exit
  return dir;
}

bool as_root() { return geteuid() == 0; }

// The runs an app's cases start from, each trained once by `exe` with `train` (its command and
// flags, without --out) into the shared folder: `run`, `big` (--dim 32: a checkpoint of another
// shape) and `partial` (stopped at step `stop`, with a checkpoint there).
struct TrainedRuns {
  std::string run, big, partial;
};

[[maybe_unused]] void train_runs(TrainedRuns& r, const char* exe, const std::string& app, const Args& train,
                                 const std::string& stop) {
  TempDir& d = shared_dir();
  r.run = d.file(app + "_run");
  r.big = d.file(app + "_big");
  r.partial = d.file(app + "_partial");
  for (const auto& [out, extra] : std::vector<std::pair<std::string, Args>>{
           {r.run, {}}, {r.big, {"--dim", "32"}}, {r.partial, {"--max-steps", stop, "--checkpoint-every", stop}}}) {
    Args a = plus(train, {"--out", out});
    for (size_t i = 0; i + 1 < extra.size(); i += 2) a = with(a, extra[i], extra[i + 1]);
    const Outcome o = run(exe, a, "", d.file(app + "_fixture.txt"));
    if (o.code != 0) throw std::runtime_error("the " + app + " fixture run failed:\n" + o.output);
  }
}

// ---- vit -----------------------------------------------------------------------------------------

#ifdef EXE_VIT
// The tiny vit run every case starts from: 128 train / 32 test images of the fake dataset.
struct VitRuns : TrainedRuns {  // runs with dim 16, dim 32, and stopped at step 2
  std::string data;
  Args flags;  // the training flags of `run` (without --out)
};

const VitRuns& vit_runs() {
  static const VitRuns r = [] {
    VitRuns v;
    TempDir& d = shared_dir();
    v.data = d.file("vit_data");
    fs::create_directories(v.data);
    vit::test::write_fake_fashion_mnist(v.data, 128, 32);
    v.flags = {"--data",        v.data,      "--patch",      "7",  "--dim",    "16", "--depth",   "1",
               "--heads",       "2",         "--batch-size", "32", "--epochs", "1",  "--threads", "1",
               "--no-progress", "--no-plot", "--device",     "cpu"};
    train_runs(v, EXE_VIT, "vit", v.flags, "2");
    return v;
  }();
  return r;
}
#endif

#ifdef EXE_TRANSLATE
// The tiny translate data and run: 300 toy pairs, a 48-piece vocabulary, a 1+1-layer model.
struct TranslateRuns : TrainedRuns {  // partial: stopped at step 4
  std::string src, tgt, data;
  Args flags;  // `translate train` flags of `run` (without --out)
};

const TranslateRuns& translate_runs() {
  static const TranslateRuns r = [] {
    TranslateRuns t;
    TempDir& d = shared_dir();
    t.src = d.file("toy.en");
    t.tgt = d.file("toy.es");
    translate::test::write_toy_pair(t.src, t.tgt, 300);
    t.data = d.file("translate_data");
    const Outcome p = run(EXE_TRANSLATE,
                          {"prepare", "--src", t.src, "--tgt", t.tgt, "--out", t.data, "--valid-size", "20",
                           "--test-size", "20", "--vocab-size", "48"},
                          "", d.file("translate_fixture.txt"));
    if (p.code != 0) throw std::runtime_error("translate prepare failed:\n" + p.output);
    t.flags = {"--data",       t.data, "--dim",        "16", "--heads",   "2",  "--enc-layers",  "1",
               "--dec-layers", "1",    "--mlp-hidden", "32", "--max-len", "64", "--max-tokens",  "256",
               "--epochs",     "1",    "--beam",       "1",  "--threads", "1",  "--no-progress", "--no-plot",
               "--device",     "cpu"};
    train_runs(t, EXE_TRANSLATE, "translate", plus({"train"}, t.flags), "4");
    return t;
  }();
  return r;
}
#endif

#ifdef EXE_PROTEIN
// The tiny protein data (12 families of 4, clustered by mmseqs2) and run.
struct ProteinRuns : TrainedRuns {  // partial: stopped at step 2
  std::string fasta, data;
  Args flags;  // `protein train` flags of `run` (without --out)
};

const ProteinRuns& protein_runs() {
  static const ProteinRuns r = [] {
    ProteinRuns p;
    TempDir& d = shared_dir();
    p.fasta = d.file("toy.fasta");
    protein::test::write_families(p.fasta, 12, 4, 1, "seq");
    p.data = d.file("protein_data");
    const Outcome o = run(EXE_PROTEIN,
                          {"prepare", "--fasta", p.fasta, "--query", "", "--out", p.data, "--valid-size", "8",
                           "--test-size", "8", "--threads", "1"},
                          "", d.file("protein_fixture.txt"));
    if (o.code != 0) throw std::runtime_error("protein prepare failed:\n" + o.output);
    p.flags = {"--data",       p.data, "--dim",         "16",        "--heads",      "2",   "--layers", "1",
               "--mlp-hidden", "32",   "--max-len",     "48",        "--max-tokens", "512", "--epochs", "1",
               "--threads",    "1",    "--no-progress", "--no-plot", "--device",     "cpu"};
    train_runs(p, EXE_PROTEIN, "protein", plus({"train"}, p.flags), "2");
    return p;
  }();
  return r;
}
#endif

// Cases every training command gets: wrong types, out-of-range and non-finite numbers, unknown
// flags, and bad attention specs through `attention_flag`.
std::vector<Case> common_training_cases(const Args& base, const std::string& attention_flag) {
  std::vector<Case> c;
  auto bad = [&](const std::string& flag, const std::string& value, const std::string& expect = "") {
    c.push_back({with(base, flag, value), {expect.empty() ? flag : expect}});
  };
  for (const char* v : {"abc", "-1", "0", "nan", "inf", "-inf", "1e400", ""}) bad("--lr", v);
  for (const char* v : {"1.5", "0", "-3", "99999999999999999999", "abc"}) bad("--epochs", v);
  for (const char* v : {"-4", "0", "abc", "1e9"}) bad("--dim", v);
  for (const char* v : {"0", "-2", "2.5"}) bad("--heads", v);
  for (const char* v : {"2", "-0.5", "nan"}) bad("--dropout", v);
  for (const char* v : {"-0.1", "nan", "inf"}) bad("--weight-decay", v);
  for (const char* v : {"-1", "nan"}) bad("--clip", v);
  for (const char* v : {"-1", "5000", "two"}) bad("--threads", v);
  for (const char* v : {"gpu", "cuda:x", ""}) bad("--device", v);
  if (!linea::cuda_available()) bad("--device", "cuda", "cuda");
  bad("--seed", "-1");
  bad("--seed", "abc");
  bad("--max-steps", "-1");
  bad("--log-every", "abc");
  bad("--checkpoint-every", "-5");
  bad("--skip-nonfinite", "x");
  c.push_back({plus(base, {"--no-such-flag"}), {"--no-such-flag"}});
  c.push_back({plus(base, {"stray-word"}), {"stray-word"}});
  c.push_back({plus(base, {"--epochs"}), {"--epochs"}});  // a flag without its value
  // Attention specs: unknown names, keys and values.
  for (const auto& [spec, expect] : std::vector<std::pair<std::string, std::string>>{
           {"nosuch", "nosuch"},
           {"performer:featurez=8", "featurez"},
           {"softmax:dropout=2", "dropout"},
           {"softmax:dropout=nan", "dropout"},
           {"performer:features=abc", "features"},
           {"performer:features=0", "features"},
           {"performer:features=-3", "features"},
           {"performer:features=99999999999999999999", "features"},
           {"performer:features", "features"},
           {"performer:kernel=cosine", "cosine"},
           {"ra:samples=0", "samples"},
           {"lara:samples=-1", "samples"},
           {"nprf_rpe:features=8,features=16", "features"},
           {"softmax:", "softmax:"},
           {":features=8", "missing mechanism name"},
           {"", "attention spec"},
           {"SOFTMAX", "SOFTMAX"},
       })
    c.push_back({with(base, attention_flag, spec), {expect}});
  return c;
}

// ---- the apps ------------------------------------------------------------------------------------------

TEST(BadInput, Vit) {
#ifndef EXE_VIT
  GTEST_SKIP() << "vit is not built";
#else
  const VitRuns& v = vit_runs();
  TempDir dir;
  const std::string d = dir.path.string(), exe = EXE_VIT;
  const Args base = plus(v.flags, {"--out", dir.file("out")});
  std::vector<Case> cases = common_training_cases(base, "--attention");
  auto bad = [&](const std::string& flag, const std::string& value, const std::string& expect = "") {
    cases.push_back({with(base, flag, value), {expect.empty() ? flag : expect}});
  };
  // The app's own flags.
  bad("--patch", "5", "patch");   // does not divide 28
  bad("--patch", "56", "patch");  // larger than the image
  bad("--patch", "0");
  bad("--dim", "15", "--heads");  // not divisible by 2 heads
  bad("--depth", "100000");
  for (const char* m : {"0", "nan", "-1"}) bad("--mlp-ratio", m);
  for (const char* l : {"1.5", "nan"}) bad("--label-smoothing", l);
  for (const char* w : {"-1", "nan", "inf"}) bad("--warmup", w);
  for (const char* m : {"-1", "nan"}) bad("--min-lr", m);
  bad("--batch-size", "0");
  bad("--batch-size", "100000");
  bad("--batch-size", "129", "--batch-size");  // more than the 128 training images
  bad("--pool", "max");
  bad("--init", "xavier");
  bad("--channels", "2");
  bad("--image-size", "-1");
  bad("--crop-padding", "-1");
  bad("--train-limit", "-1");
  bad("--test-limit", "x");
  // The dataset: missing, a file for the folder, a file missing, empty, truncated, wrong magic,
  // wrong lengths, labels out of range, not gzip, a folder for a file.
  bad("--data", d + "/nowhere", "nowhere");
  write_all(d + "/a_file", "not a folder\n");
  cases.push_back({with(base, "--data", d + "/a_file"), {"a_file", "is a file"}});
  auto broken_data = [&](const std::string& name, const std::function<void(const std::string&)>& damage,
                         const std::string& expect) {
    const std::string data = copy_of(v.data, d + "/data_" + name);
    damage(data);
    cases.push_back({with(base, "--data", data), {expect}});
  };
  broken_data(
      "missing", [](const std::string& p) { fs::remove(p + "/t10k-labels-idx1-ubyte.gz"); }, "t10k-labels-idx1-ubyte");
  broken_data(
      "empty", [](const std::string& p) { write_all(p + "/train-images-idx3-ubyte.gz", ""); },
      "train-images-idx3-ubyte");
  broken_data(
      "empty_gz", [](const std::string& p) { vit::test::write_gz(p + "/train-labels-idx1-ubyte.gz", ""); },
      "train-labels-idx1-ubyte");
  broken_data(
      "truncated", [](const std::string& p) { truncate(p + "/train-images-idx3-ubyte.gz", 0.5); },
      "train-images-idx3-ubyte");
  broken_data(
      "short",
      [](const std::string& p) {
        write_idx(p + "/train-images-idx3-ubyte.gz", 0x803, {128, 28, 28}, std::string(1000, '\1'));
      },
      "train-images-idx3-ubyte");
  broken_data(
      "magic",
      [](const std::string& p) { write_idx(p + "/train-images-idx3-ubyte.gz", 0x801, {128}, std::string(128, '\1')); },
      "train-images-idx3-ubyte");
  broken_data(
      "huge_count",
      [](const std::string& p) {
        write_idx(p + "/t10k-images-idx3-ubyte.gz", 0x803, {0x7fffffff, 28, 28}, std::string(784, '\1'));
      },
      "t10k-images-idx3-ubyte");
  broken_data(
      "zero_rows",
      [](const std::string& p) {
        write_idx(p + "/t10k-images-idx3-ubyte.gz", 0x803, {32, 0, 28}, "");
      },
      "[32, 1, 0, 28]");
  broken_data(
      "no_images",
      [](const std::string& p) {
        write_idx(p + "/train-images-idx3-ubyte.gz", 0x803, {0, 28, 28}, "");
        write_idx(p + "/train-labels-idx1-ubyte.gz", 0x801, {0}, "");
      },
      "train");
  broken_data(
      "lengths",
      [](const std::string& p) { write_idx(p + "/train-labels-idx1-ubyte.gz", 0x801, {3}, std::string(3, '\1')); },
      "different numbers");
  broken_data(
      "labels",
      [](const std::string& p) {
        write_idx(p + "/train-labels-idx1-ubyte.gz", 0x801, {128}, std::string(128, '\310'));  // 200
      },
      "200");
  broken_data(
      "not_gzip", [](const std::string& p) { write_all(p + "/t10k-labels-idx1-ubyte.gz", std::string(64, 'x')); },
      "t10k-labels-idx1-ubyte");
  broken_data(
      "folder",
      [](const std::string& p) {
        fs::remove(p + "/train-images-idx3-ubyte.gz");
        fs::create_directories(p + "/train-images-idx3-ubyte.gz");
      },
      "not a regular file");
  if (!as_root()) {  // root reads a file without read permission
    broken_data(
        "unreadable", [](const std::string& p) { chmod((p + "/train-images-idx3-ubyte.gz").c_str(), 0); },
        "train-images-idx3-ubyte");
  }
  // Image folders: missing, without test/, without classes, a class with no images, an image that
  // is no image, images of different sizes, a file where the class folder belongs.
  const std::string nowhere = d + "/no_images";
  cases.push_back({without(with(base, "--image-folder", nowhere), "--data"), {"no_images"}});
  auto folder = [&](const std::string& name, const std::function<void(const std::string&)>& make,
                    const std::string& expect) {
    const std::string f = d + "/images_" + name;
    fs::create_directories(f);
    make(f);
    cases.push_back({without(with(base, "--image-folder", f), "--data"), {expect}});
  };
  folder(
      "no_test",
      [](const std::string& f) {
        fs::create_directories(f + "/train/a");
        write_png(f + "/train/a/1.png", 8, 8);
      },
      "test");
  folder(
      "no_classes",
      [](const std::string& f) {
        fs::create_directories(f + "/train");
        fs::create_directories(f + "/test");
      },
      "train");
  folder(
      "empty_class",
      [](const std::string& f) {
        fs::create_directories(f + "/train/a");
        fs::create_directories(f + "/test/a");
        write_png(f + "/test/a/1.png", 8, 8);
      },
      "train");
  folder(
      "not_an_image",
      [](const std::string& f) {
        fs::create_directories(f + "/train/a");
        fs::create_directories(f + "/test/a");
        write_png(f + "/test/a/1.png", 8, 8);
        write_all(f + "/train/a/broken.png", "\x89PNG\r\n\x1a\nnot really");
      },
      "broken.png");
  folder(
      "sizes",
      [](const std::string& f) {
        fs::create_directories(f + "/train/a");
        fs::create_directories(f + "/test/a");
        write_png(f + "/train/a/1.png", 8, 8);
        write_png(f + "/train/a/2.png", 9, 8);
        write_png(f + "/test/a/1.png", 8, 8);
      },
      "--image-size");
  folder(
      "file_for_folder",
      [](const std::string& f) {
        fs::create_directories(f + "/train");
        write_all(f + "/test", "a file\n");
        write_png(f + "/train/x.png", 8, 8);
      },
      "'test' is a file");
  // --predict: no checkpoint, missing/empty/truncated/not-an-image input, a folder for the image.
  const std::string png = d + "/image.png";
  write_png(png, 28, 28);
  const std::string ckpt = v.run + "/checkpoint";
  cases.push_back({{"--predict", png}, {"--checkpoint"}});
  cases.push_back({{"--predict", d + "/missing.png", "--checkpoint", ckpt}, {"missing.png"}});
  write_all(d + "/empty.png", "");
  cases.push_back({{"--predict", d + "/empty.png", "--checkpoint", ckpt}, {"empty.png"}});
  write_all(d + "/cut.png", read_all(png).substr(0, 60));
  cases.push_back({{"--predict", d + "/cut.png", "--checkpoint", ckpt}, {"cut.png"}});
  write_all(d + "/text.png", "hello\n");
  cases.push_back({{"--predict", d + "/text.png", "--checkpoint", ckpt}, {"text.png"}});
  cases.push_back({{"--predict", d, "--checkpoint", ckpt}, {d}});
  cases.push_back({{"--predict", png, png, d + "/second_missing.png", "--checkpoint", ckpt}, {"second_missing.png"}});
  cases.push_back({{"--predict", png, "--checkpoint", ckpt, "--device", "gpu"}, {"--device"}});
  // Checkpoints: missing, a file, another app's, files missing or truncated, config.json damaged,
  // another model size, NaN and Inf weights (--predict and --eval-only).
  cases.push_back({{"--predict", png, "--checkpoint", d + "/no_checkpoint"}, {"no_checkpoint"}});
  cases.push_back({{"--predict", png, "--checkpoint", ckpt + "/model.safetensors"}, {"model.safetensors"}});
  auto broken_ckpt = [&](const std::string& name, const std::function<void(const std::string&)>& damage) {
    const std::string c = copy_of(ckpt, d + "/ckpt_" + name);
    damage(c);
    return c;
  };
  auto predict_with = [&](const std::string& c, const std::vector<std::string>& expect) {
    cases.push_back({{"--predict", png, "--checkpoint", c}, expect});
  };
  auto eval_with = [&](const std::string& c, const std::vector<std::string>& expect) {
    cases.push_back({plus(base, {"--eval-only", "--checkpoint", c}), expect});
  };
  const std::string no_model =
      broken_ckpt("no_model", [](const std::string& c) { fs::remove(c + "/model.safetensors"); });
  predict_with(no_model, {"model.safetensors"});
  eval_with(no_model, {"no_model"});
  const std::string cut_model =
      broken_ckpt("cut_model", [](const std::string& c) { truncate(c + "/model.safetensors", 0.6); });
  predict_with(cut_model, {"model.safetensors"});
  eval_with(cut_model, {"model.safetensors"});
  const std::string empty_model =
      broken_ckpt("empty_model", [](const std::string& c) { write_all(c + "/model.safetensors", ""); });
  predict_with(empty_model, {"model.safetensors"});
  const std::string folder_model = broken_ckpt("folder_model", [](const std::string& c) {
    fs::remove(c + "/model.safetensors");
    fs::create_directories(c + "/model.safetensors");
  });
  predict_with(folder_model, {"model.safetensors"});
  const std::string cut_training =
      broken_ckpt("cut_training", [](const std::string& c) { truncate(c + "/training.safetensors", 0.5); });
  eval_with(cut_training, {"training.safetensors"});
  const std::string no_config = broken_ckpt("no_config", [](const std::string& c) { fs::remove(c + "/config.json"); });
  predict_with(no_config, {"config.json"});
  const std::string cut_config =
      broken_ckpt("cut_config", [](const std::string& c) { truncate(c + "/config.json", 0.3); });
  predict_with(cut_config, {"config.json"});
  eval_with(cut_config, {"config.json"});
  const std::string empty_config =
      broken_ckpt("empty_config", [](const std::string& c) { write_all(c + "/config.json", "{}"); });
  predict_with(empty_config, {"config.json"});
  const std::string wrong_types = broken_ckpt("wrong_types", [](const std::string& c) {
    write_all(c + "/config.json", R"({"format": "linea-vit/1", "model": {"dim": "sixteen"}, "classes": 3})");
  });
  predict_with(wrong_types, {"config.json"});
  // A config.json that parses but does not agree with itself: one check each (a second channel's
  // statistics for the model's one channel; a class name more; a mean without its std; no run).
  const std::vector<std::pair<std::string, std::vector<std::pair<std::string, std::string>>>> inconsistent = {
      {"extra_channel", {{R"("mean": [)", R"("mean": [0.5, )"}, {R"("std": [)", R"("std": [0.5, )"}}},
      {"extra_class", {{R"("classes": [)", R"("classes": ["extra", )"}}},
      {"extra_mean", {{R"("mean": [)", R"("mean": [0.5, )"}}},
      {"run_string", {{R"("run": {)", R"("run": "x", "was_run": {)"}}}};
  for (const auto& damage : inconsistent) {
    const std::string& name = damage.first;
    const std::string c = broken_ckpt(name, [&](const std::string& c) {
      std::string text = read_all(c + "/config.json");
      for (const auto& [from, to] : damage.second) {
        const size_t at = text.find(from);
        ASSERT_NE(at, std::string::npos) << from;
        text.replace(at, from.size(), to);
      }
      write_all(c + "/config.json", text);
    });
    predict_with(c, {"config.json' is malformed",
                     name == "run_string" ? R"("run" is not an object)" : "inconsistent classes/channels"});
  }
  const std::string other_size = broken_ckpt("other_size", [&](const std::string& c) {
    fs::copy_file(v.big + "/checkpoint/config.json", c + "/config.json", fs::copy_options::overwrite_existing);
  });
  predict_with(other_size, {"model.safetensors"});
  const std::string nan_weights =
      broken_ckpt("nan_weights", [](const std::string& c) { poison(c + "/model.safetensors", kNaN); });
  predict_with(nan_weights, {"non-finite"});
  eval_with(nan_weights, {"non-finite"});
  const std::string inf_weights =
      broken_ckpt("inf_weights", [](const std::string& c) { poison(c + "/model.safetensors", -kInf); });
  predict_with(inf_weights, {"non-finite"});
#ifdef EXE_TRANSLATE
  predict_with(translate_runs().run + "/checkpoint", {"linea-translate"});
  cases.push_back(
      {plus(base, {"--resume", "--checkpoint", translate_runs().run + "/checkpoint"}), {"linea-translate"}});
  eval_with(translate_runs().run + "/checkpoint", {"linea-translate"});
#endif
  // --eval-only and --resume with other settings or nothing to load.
  cases.push_back({plus(base, {"--eval-only"}), {"--eval-only"}});
  cases.push_back({with(plus(base, {"--eval-only"}), "--out", v.big), {"dim"}});
  cases.push_back({with(with(plus(base, {"--resume"}), "--out", v.run), "--lr", "0.1"), {"lr"}});
  cases.push_back({with(with(plus(base, {"--resume"}), "--out", v.run), "--attention", "performer"), {"attention"}});
  cases.push_back({with(with(plus(base, {"--resume"}), "--out", v.run), "--depth", "2"), {"depth"}});
  // Numerical faults: a learning rate that diverges stops with the step; resuming NaN weights is refused.
  cases.push_back({with(base, "--lr", "1e30"), {"step ", "non-finite loss"}});
  cases.push_back({with(plus(base, {"--skip-nonfinite", "2"}), "--lr", "1e30"), {"step ", "non-finite loss"}});
  const std::string nan_partial = copy_of(v.partial, d + "/nan_partial");
  poison(nan_partial + "/checkpoint/model.safetensors", kNaN);
  cases.push_back({with(plus(base, {"--resume"}), "--out", nan_partial), {"--resume", "non-finite values"}});
  sweep("vit", exe, cases, dir);
#endif
}

TEST(BadInput, Translate) {
#ifndef EXE_TRANSLATE
  GTEST_SKIP() << "translate is not built";
#else
  const TranslateRuns& t = translate_runs();
  TempDir dir;
  const std::string d = dir.path.string(), exe = EXE_TRANSLATE;
  std::vector<Case> cases;
  // The command line itself.
  cases.push_back({{}, {"subcommand"}});
  cases.push_back({{"frobnicate"}, {"frobnicate"}});
  cases.push_back({{"decode"}, {"--checkpoint"}});
  cases.push_back({{"train", "decode"}, {"decode"}});

  // ---- prepare ----
  const Args prep = {"prepare",      "--src", t.src,         "--tgt", t.tgt,          "--out", d + "/prep",
                     "--valid-size", "20",    "--test-size", "20",    "--vocab-size", "48"};
  auto bad_prep = [&](const std::string& flag, const std::string& value, const std::string& expect = "") {
    cases.push_back({with(prep, flag, value), {expect.empty() ? flag : expect}});
  };
  bad_prep("--src", d + "/missing.en", "missing.en");
  bad_prep("--src", d, d);
  bad_prep("--tgt", d + "/missing.es", "missing.es");
  write_all(d + "/empty.en", "");
  bad_prep("--src", d + "/empty.en", "empty.en");
  write_all(d + "/short.es", "sol\nluna\n");
  bad_prep("--tgt", d + "/short.es", "short.es");
  write_all(d + "/blank.en", "\n\n\n");
  bad_prep("--src", d + "/blank.en", "blank.en");
  cases.push_back({without(prep, "--tgt"), {"--tgt"}});
  for (const char* v : {"3", "abc", "2000000", "-5"}) bad_prep("--vocab-size", v);
  bad_prep("--vocab-size", "5000", "vocab");  // more pieces than the toy text holds
  for (const char* v : {"-1", "x"}) bad_prep("--valid-size", v);
  bad_prep("--valid-size", "100000", "valid");
  bad_prep("--test-size", "1e9", "--test-size");
  bad_prep("--split", "bogus");
  bad_prep("--split", "books", "books");  // books are the Bible's, not user files'
  bad_prep("--vocab", "both");
  bad_prep("--spm-type", "word");
  bad_prep("--max-length", "-1");
  bad_prep("--max-ratio", "nan");
  bad_prep("--seed", "-1");
  write_all(d + "/out_file", "x\n");
  bad_prep("--out", d + "/out_file", "out_file");
  fs::create_directories(d + "/someone_elses/files");
  bad_prep("--out", d + "/someone_elses", "someone_elses");
  bad_prep("--out", "", "--out");
  bad_prep("--src-lang", "", "--src-lang");
  bad_prep("--tgt-lang", "a/b", "a/b");

  // ---- train ----
  const Args train = plus(plus({"train"}, t.flags), {"--out", d + "/out"});
  std::vector<Case> common = common_training_cases(train, "--enc-attention");
  cases.insert(cases.end(), common.begin(), common.end());
  auto bad = [&](const std::string& flag, const std::string& value, const std::string& expect = "") {
    cases.push_back({with(train, flag, value), {expect.empty() ? flag : expect}});
  };
  bad("--dec-attention", "lara", "lara");  // not causal
  bad("--dec-attention", "ra", "ra");
  bad("--dec-attention", "performer:featurez=8", "featurez");
  bad("--cross-attention", "softmax:dropout=2", "dropout");
  bad("--cross-attention", "nosuch", "nosuch");
  bad("--heads", "3", "--heads");  // does not divide --dim 16
  bad("--max-len", "1");
  bad("--max-len", "8", "max_len");  // shorter than the training pairs
  bad("--max-tokens", "0");
  bad("--max-tokens", "5", "5");  // less than one sentence
  bad("--warmup", "0");
  for (const char* v : {"1", "nan", "-0.5"}) bad("--ema", v);
  for (const char* v : {"nan", "-1", "11"}) bad("--lenpen", v);
  for (const char* v : {"nan", "-1"}) bad("--max-len-ratio", v);
  bad("--max-len-extra", "-1");
  bad("--beam", "0");
  bad("--positions", "xyz");
  bad("--valid-sentences", "-1");
  bad("--decode-batch", "0");
  bad("--patience", "-1");
  bad("--label-smoothing", "nan");
  bad("--mlp-hidden", "0");
  bad("--enc-layers", "0");
  // The prepared data: missing, a file, no data.json, damaged data.json, another app's, split and
  // tokenizer files missing, short, damaged, or folders.
  bad("--data", d + "/no_data", "no_data");
  bad("--data", d + "/out_file", "out_file");
  fs::create_directories(d + "/not_prepared");
  bad("--data", d + "/not_prepared", "not_prepared");
  auto broken_data = [&](const std::string& name, const std::function<void(const std::string&)>& damage,
                         const std::vector<std::string>& expect) {
    const std::string data = copy_of(t.data, d + "/data_" + name);
    damage(data);
    cases.push_back({with(train, "--data", data), expect});
  };
  broken_data("cut_manifest", [](const std::string& p) { truncate(p + "/data.json", 0.5); }, {"data.json"});
  broken_data("empty_manifest", [](const std::string& p) { write_all(p + "/data.json", ""); }, {"data.json"});
  broken_data("object_manifest", [](const std::string& p) { write_all(p + "/data.json", "{}"); }, {"data.json"});
  broken_data("array_manifest", [](const std::string& p) { write_all(p + "/data.json", "[1, 2]"); }, {"data.json"});
  broken_data(
      "protein_manifest",
      [](const std::string& p) { write_all(p + "/data.json", R"({"format": "linea-protein-data", "version": 1})"); },
      {"data.json"});
  broken_data("no_train", [](const std::string& p) { fs::remove(p + "/train.en"); }, {"train.en"});
  broken_data("short_train", [](const std::string& p) { truncate(p + "/train.es", 0.5); }, {"train"});
  broken_data("empty_valid", [](const std::string& p) { write_all(p + "/valid.en", ""); }, {"valid"});
  broken_data("folder_test",
              [](const std::string& p) {
                fs::remove(p + "/test.es");
                fs::create_directories(p + "/test.es");
              },
              {"test.es"});
  broken_data("no_spm", [](const std::string& p) { fs::remove(p + "/spm.model"); }, {"spm.model"});
  broken_data("cut_spm", [](const std::string& p) { truncate(p + "/spm.model", 0.5); }, {"spm.model"});
  broken_data("garbage_spm", [](const std::string& p) { write_all(p + "/spm.model", std::string(300, '\xff')); },
              {"spm.model"});
  broken_data("empty_spm", [](const std::string& p) { write_all(p + "/spm.model", ""); }, {"spm.model"});
  // Checkpoints for --resume and --eval-only.
  const std::string ckpt = t.run + "/checkpoint";
  cases.push_back({with(with(plus(train, {"--resume"}), "--out", t.run), "--lr", "0.5"), {"lr"}});
  cases.push_back({with(with(plus(train, {"--resume"}), "--out", t.run), "--dim", "32"), {"dim"}});
  cases.push_back({with(with(plus(train, {"--resume"}), "--out", t.run), "--max-tokens", "512"), {"max_tokens"}});
#ifdef EXE_VIT
  cases.push_back({plus(train, {"--resume", "--checkpoint", vit_runs().run + "/checkpoint"}), {"linea-vit"}});
  cases.push_back({plus(train, {"--eval-only", "--checkpoint", vit_runs().run + "/checkpoint"}), {"linea-vit"}});
#endif
  cases.push_back({plus(train, {"--eval-only"}), {"checkpoint"}});
  auto broken_ckpt = [&](const std::string& name, const std::function<void(const std::string&)>& damage) {
    const std::string c = copy_of(ckpt, d + "/ckpt_" + name);
    damage(c);
    return c;
  };
  const std::string nan_best =
      broken_ckpt("nan", [](const std::string& c) { poison(c + "/best/model.safetensors", kNaN); });
  cases.push_back({plus(train, {"--eval-only", "--checkpoint", nan_best}), {"non-finite"}});
  // Numerical faults in training.
  cases.push_back({with(train, "--lr", "1e30"), {"step ", "non-finite loss"}});
  const std::string nan_partial = copy_of(t.partial, d + "/nan_partial");
  poison(nan_partial + "/checkpoint/model.safetensors", kNaN);
  cases.push_back({with(plus(train, {"--resume"}), "--out", nan_partial), {"--resume", "non-finite values"}});

  // ---- decode ----
  const std::string in = d + "/in.txt";
  write_all(in, "sun moon\nstar\n");
  const Args dec = {"decode", "--checkpoint", ckpt, "--input", in, "--device", "cpu", "--threads", "1"};
  auto bad_dec = [&](const std::string& flag, const std::string& value, const std::string& expect = "") {
    cases.push_back({with(dec, flag, value), {expect.empty() ? flag : expect}});
  };
  bad_dec("--checkpoint", d + "/no_checkpoint", "no_checkpoint");
  bad_dec("--checkpoint", in, "in.txt");
  bad_dec("--checkpoint", t.data, "config.json");
#ifdef EXE_VIT
  bad_dec("--checkpoint", vit_runs().run + "/checkpoint", "linea-vit");
#endif
  const std::vector<std::pair<std::string, std::function<void(const std::string&)>>> damages = {
      {"no_model",
       [](const std::string& c) {
         fs::remove(c + "/best/model.safetensors");
         fs::remove(c + "/model.safetensors");
       }},
      {"cut_model", [](const std::string& c) { truncate(c + "/best/model.safetensors", 0.5); }},
      {"no_spm", [](const std::string& c) { fs::remove(c + "/best/spm.model"); }},
      {"cut_spm", [](const std::string& c) { truncate(c + "/best/spm.model", 0.3); }},
      {"cut_config", [](const std::string& c) { truncate(c + "/best/config.json", 0.5); }},
      {"foreign_spm",
       [](const std::string& c) {
         write_all(c + "/best/config.json",
                   std::regex_replace(read_all(c + "/best/config.json"), std::regex("spm\\.model"), "../../x.model"));
       }},
  };
  for (const auto& [name, damage] : damages) {
    const std::string c = broken_ckpt(name, damage);
    const std::string what = name == "no_model" || name == "cut_model" ? "model.safetensors"
                             : name == "cut_config"                    ? "config.json"
                             : name == "foreign_spm"                   ? "x.model"
                                                                       : "spm.model";
    bad_dec("--checkpoint", c, what);
  }
  const std::string other_size = broken_ckpt("other_size", [&](const std::string& c) {
    fs::copy_file(t.big + "/checkpoint/best/config.json", c + "/best/config.json",
                  fs::copy_options::overwrite_existing);
  });
  bad_dec("--checkpoint", other_size, "model.safetensors");
  bad_dec("--checkpoint", nan_best, "non-finite");
  const std::string inf_best =
      broken_ckpt("inf", [](const std::string& c) { poison(c + "/best/model.safetensors", kInf); });
  bad_dec("--checkpoint", inf_best, "non-finite");
  bad_dec("--input", d + "/missing.txt", "missing.txt");
  bad_dec("--input", d, "is a folder");
  bad_dec("--output", d, d);
  bad_dec("--output", d + "/no/such/folder/out.txt", "out.txt");
  cases.push_back({plus(dec, {"--beam", "2", "--nbest", "3"}), {"--nbest 3"}});
  for (const char* v : {"0", "abc", "1001"}) bad_dec("--beam", v);
  bad_dec("--batch-size", "0");
  bad_dec("--buffer-size", "-1");
  bad_dec("--lenpen", "nan");
  bad_dec("--max-len-ratio", "-1");
  bad_dec("--threads", "-1");
  bad_dec("--device", "gpu");
  write_all(d + "/blank_line.txt", "sun moon\n\nstar\n");
  bad_dec("--input", d + "/blank_line.txt", "line 2");
  std::string long_line;
  for (int i = 0; i < 80; ++i) long_line += "sun ";
  write_all(d + "/long.txt", "sun\n" + long_line + "\n");
  bad_dec("--input", d + "/long.txt", "line 2");
  cases.push_back({without(dec, "--input"), {"line 2"}, d + "/blank_line.txt"});  // the same on stdin
  cases.push_back({plus(dec, {"extra-word"}), {"extra-word"}});
  sweep("translate", exe, cases, dir);
#endif
}

TEST(BadInput, Protein) {
#ifndef EXE_PROTEIN
  GTEST_SKIP() << "protein is not built";
#else
  const ProteinRuns& p = protein_runs();
  TempDir dir;
  const std::string d = dir.path.string(), exe = EXE_PROTEIN;
  std::vector<Case> cases;
  cases.push_back({{}, {"subcommand"}});
  cases.push_back({{"fold"}, {"fold"}});

  // ---- prepare (each refused before mmseqs runs, or by mmseqs' absence) ----
  const Args prep = {"prepare",      "--fasta", p.fasta,       "--query", "",          "--out", d + "/prep",
                     "--valid-size", "8",       "--test-size", "8",       "--threads", "1"};
  auto bad_prep = [&](const std::string& flag, const std::string& value, const std::string& expect = "") {
    cases.push_back({with(prep, flag, value), {expect.empty() ? flag : expect}});
  };
  auto fasta = [&](const std::string& name, const std::string& text) {
    write_all(d + "/" + name, text);
    return d + "/" + name;
  };
  bad_prep("--fasta", d + "/missing.fasta", "missing.fasta");
  bad_prep("--fasta", d, d);
  bad_prep("--fasta", fasta("empty.fasta", ""), "empty.fasta");
  bad_prep("--fasta", fasta("plain.txt", "MKVLAG\nMKV\n"), "plain.txt");
  bad_prep("--fasta", fasta("residue.fasta", ">good\nMKVLAG\n>broken desc\nMKV\nLAJG\n"), "'J'");
  bad_prep("--fasta", fasta("record.fasta", ">one\nMKVLAG\n>two\n>three\nMKV\n"), "two");
  bad_prep("--fasta", fasta("header_only.fasta", ">only\n"), "only");
  bad_prep("--fasta", fasta("binary.fasta", std::string("\x1f\x8b\x08\x00garbage", 11)), "binary.fasta");
  bad_prep("--fasta", fasta("cut.fasta.gz", std::string("\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\x03", 10)),
           "cut.fasta.gz");
  bad_prep("--fasta", fasta("nul.fasta", std::string(">a\nMK\0VL\n", 10)), "nul.fasta");
  bad_prep("--query", d + "/missing_query.fasta", "missing_query.fasta");
  bad_prep("--mmseqs", d + "/no_mmseqs", "no_mmseqs");
  bad_prep("--mmseqs", "/bin/false", "/bin/false");
  bad_prep("--mmseqs", d, "mmseqs");
  bad_prep("--mmseqs", "", "--mmseqs");
  for (const char* v : {"2", "nan", "-0.1"}) bad_prep("--min-seq-id", v);
  for (const char* v : {"-1", "inf"}) bad_prep("--coverage", v);
  bad_prep("--valid-size", "10000", "valid");
  bad_prep("--test-size", "-8");
  bad_prep("--split", "bogus");
  bad_prep("--threads", "-1");
  bad_prep("--seed", "-1");
  write_all(d + "/out_file", "x\n");
  bad_prep("--out", d + "/out_file", "out_file");
  fs::create_directories(d + "/someone_elses/files");
  bad_prep("--out", d + "/someone_elses", "someone_elses");

  // ---- train ----
  const Args train = plus(plus({"train"}, p.flags), {"--out", d + "/out"});
  std::vector<Case> common = common_training_cases(train, "--attention");
  cases.insert(cases.end(), common.begin(), common.end());
  auto bad = [&](const std::string& flag, const std::string& value, const std::string& expect = "") {
    cases.push_back({with(train, flag, value), {expect.empty() ? flag : expect}});
  };
  bad("--pack", "2", "--pack");
  bad("--pack", "-1");
  bad("--pack", "100000000", "100000000");
  for (const char* v : {"0", "nan", "1.5"}) bad("--mask-prob", v);
  bad("--max-len", "2");
  bad("--max-tokens", "0");
  bad("--max-tokens", "3", "3");  // less than one window
  bad("--eval-max-tokens", "0");
  bad("--eval-max-tokens", "4", "4");
  bad("--schedule", "linear");
  bad("--positions", "sinusoidal");
  bad("--heads", "3", "--heads");
  bad("--layers", "0");
  bad("--warmup", "-1");
  bad("--ema", "1");
  bad("--patience", "-1");
  bad("--data", d + "/no_data", "no_data");
  bad("--data", d + "/out_file", "out_file");
  auto broken_data = [&](const std::string& name, const std::function<void(const std::string&)>& damage,
                         const std::vector<std::string>& expect) {
    const std::string data = copy_of(p.data, d + "/data_" + name);
    damage(data);
    cases.push_back({with(train, "--data", data), expect});
  };
  broken_data("cut_manifest", [](const std::string& x) { truncate(x + "/data.json", 0.5); }, {"data.json"});
  broken_data("object_manifest", [](const std::string& x) { write_all(x + "/data.json", "{}"); }, {"data.json"});
  broken_data(
      "translate_manifest",
      [](const std::string& x) { write_all(x + "/data.json", R"({"format": "linea-translate-data", "version": 1})"); },
      {"data.json"});
  broken_data("no_train", [](const std::string& x) { fs::remove(x + "/train.fasta"); }, {"train.fasta"});
  broken_data("empty_test", [](const std::string& x) { write_all(x + "/test.fasta", ""); },
              {"needs sequences in train, valid and test", " and 0"});
  broken_data("empty_train", [](const std::string& x) { write_all(x + "/train.fasta", ""); },
              {"needs sequences in train, valid and test; it has 0, "});
  broken_data("bad_valid", [](const std::string& x) { write_all(x + "/valid.fasta", ">v\nMK*X!\n"); }, {"valid.fasta"});
  broken_data("folder_valid",
              [](const std::string& x) {
                fs::remove(x + "/valid.fasta");
                fs::create_directories(x + "/valid.fasta");
              },
              {"valid.fasta"});
  // Checkpoints.
  const std::string ckpt = p.run + "/checkpoint";
  cases.push_back({with(with(plus(train, {"--resume"}), "--out", p.run), "--mask-prob", "0.2"), {"mask_prob"}});
  cases.push_back({with(with(plus(train, {"--resume"}), "--out", p.run), "--attention", "performer"), {"attention"}});
#ifdef EXE_VIT
  cases.push_back({plus(train, {"--resume", "--checkpoint", vit_runs().run + "/checkpoint"}), {"linea-vit"}});
  cases.push_back({plus(train, {"--eval-only", "--checkpoint", vit_runs().run + "/checkpoint"}), {"linea-vit"}});
#endif
  cases.push_back({plus(train, {"--eval-only"}), {"checkpoint"}});
  auto broken_ckpt = [&](const std::string& name, const std::function<void(const std::string&)>& damage) {
    const std::string c = copy_of(ckpt, d + "/ckpt_" + name);
    damage(c);
    return c;
  };
  const std::string nan_best =
      broken_ckpt("nan", [](const std::string& c) { poison(c + "/best/model.safetensors", kNaN); });
  cases.push_back({plus(train, {"--eval-only", "--checkpoint", nan_best}), {"non-finite"}});
  const std::string no_model_cfg = broken_ckpt("no_model_cfg", [](const std::string& c) {
    write_all(c + "/config.json", R"({"format": "linea-protein/1"})");
    fs::remove_all(c + "/best");
  });
  cases.push_back({plus(train, {"--eval-only", "--checkpoint", no_model_cfg}), {"config.json' is malformed", "model"}});
  const std::string no_max_len = broken_ckpt("no_max_len", [](const std::string& c) {
    write_all(c + "/config.json",
              std::regex_replace(read_all(c + "/config.json"), std::regex("\"max_len\""), "\"max_length\""));
    fs::remove_all(c + "/best");
  });
  cases.push_back({plus(train, {"--eval-only", "--checkpoint", no_max_len}), {"config.json' is malformed", "max_len"}});
  cases.push_back({with(train, "--lr", "1e30"), {"step ", "non-finite loss"}});
  const std::string nan_partial = copy_of(p.partial, d + "/nan_partial");
  poison(nan_partial + "/checkpoint/model.safetensors", kNaN);
  cases.push_back({with(plus(train, {"--resume"}), "--out", nan_partial), {"--resume", "non-finite values"}});

  // ---- fill and embed ----
  const Args fill = {"fill", "--checkpoint", ckpt, "--device", "cpu", "--threads", "1"};
  cases.push_back({plus(fill, {"MKVLAG"}), {"<mask>"}});
  cases.push_back({plus(fill, {"MK*<mask>"}), {"'*'"}});
  cases.push_back({plus(fill, {"MK<mask"}), {"<mask"}});
  cases.push_back({plus(fill, {"MK<bogus>L"}), {"<bogus>"}});
  cases.push_back({plus(fill, {""}), {"<mask>"}});
  cases.push_back({fill, {"sequences"}});
  cases.push_back({plus(with(fill, "--top-k", "0"), {"M<mask>"}), {"--top-k"}});
  cases.push_back({plus(with(fill, "--top-k", "28"), {"M<mask>"}), {"--top-k"}});
  cases.push_back({plus(with(fill, "--checkpoint", d + "/no_checkpoint"), {"M<mask>"}), {"no_checkpoint"}});
  cases.push_back({plus(with(fill, "--checkpoint", nan_best), {"M<mask>"}), {"non-finite"}});
  cases.push_back({{"fill", "M<mask>"}, {"--checkpoint"}});
#ifdef EXE_TRANSLATE
  cases.push_back(
      {plus(with(fill, "--checkpoint", translate_runs().run + "/checkpoint"), {"M<mask>"}), {"linea-translate"}});
#endif
  const std::string other_size = broken_ckpt("other_size", [&](const std::string& c) {
    fs::copy_file(p.big + "/checkpoint/best/config.json", c + "/best/config.json",
                  fs::copy_options::overwrite_existing);
  });
  cases.push_back({plus(with(fill, "--checkpoint", other_size), {"M<mask>"}), {"model.safetensors"}});
  const std::string cut_model =
      broken_ckpt("cut_model", [](const std::string& c) { truncate(c + "/best/model.safetensors", 0.5); });
  cases.push_back({plus(with(fill, "--checkpoint", cut_model), {"M<mask>"}), {"model.safetensors"}});
  const std::string emb = d + "/emb.safetensors";
  const Args embed = {"embed", "--checkpoint", ckpt, "--device", "cpu", "--threads", "1", p.fasta, "--out", emb};
  cases.push_back({with(embed, "--out", d), {d}});
  cases.push_back({with(embed, "--out", d + "/no/such/emb.safetensors"), {"emb.safetensors"}});
  cases.push_back({without(embed, "--out"), {"--out"}});
  cases.push_back({with(embed, "--batch-tokens", "0"), {"--batch-tokens"}});
  cases.push_back({with(embed, "--checkpoint", nan_best), {"non-finite"}});
  Args no_fasta = embed;
  no_fasta.erase(no_fasta.begin() + 7);
  cases.push_back({no_fasta, {"fasta"}});
  for (const auto& [file, expect] : std::vector<std::pair<std::string, std::string>>{
           {d + "/missing.fasta", "missing.fasta"},
           {d, d},
           {d + "/empty.fasta", "empty.fasta"},
           {d + "/residue.fasta", "'J'"},
           {d + "/cut.fasta.gz", "cut.fasta.gz"},
       }) {
    Args a = embed;
    a[7] = file;
    cases.push_back({a, {expect}});
  }
  sweep("protein", exe, cases, dir);
#endif
}

// q, k, v [B, H, L, D] = [1, 2, 4, 8] (and more tensors) in a safetensors file for linea-attn.
std::string attention_inputs(const std::string& path, const std::map<std::string, linea::Tensor>& extra = {},
                             const std::vector<std::string>& drop = {}) {
  linea::manual_seed(1);
  linea::nn::StateDict t = {
      {"q", linea::randn({1, 2, 4, 8})}, {"k", linea::randn({1, 2, 4, 8})}, {"v", linea::randn({1, 2, 4, 8})}};
  for (const auto& [name, x] : extra) t[name] = x;
  for (const std::string& name : drop) t.erase(name);
  linea::nn::save_safetensors(path, t);
  return path;
}

// A [1, 2, 4, 8] float32 tensor with one value set.
linea::Tensor with_value(float value, linea::DType dtype = linea::DType::Float32) {
  std::vector<float> v(64, 0.5f);
  v[37] = value;
  return linea::from_vector<float>(v, {1, 2, 4, 8}).to(dtype);
}

TEST(BadInput, LineaAttn) {
#ifndef EXE_LINEA_ATTN
  GTEST_SKIP() << "linea-attn is not built";
#else
  using linea::DType;
  TempDir dir;
  const std::string d = dir.path.string();
  const std::string qkv = attention_inputs(d + "/qkv.safetensors");
  const Args base = {"--spec", "softmax", "--in", qkv, "--out", d + "/out.safetensors"};
  std::vector<Case> cases;
  cases.push_back({without(base, "--spec"), {"--spec"}});
  cases.push_back({without(base, "--in"), {"--in"}});
  cases.push_back({without(base, "--out"), {"--out"}});
  cases.push_back({plus(base, {"--bogus"}), {"--bogus"}});
  for (const auto& [spec, expect] :
       std::vector<std::pair<std::string, std::string>>{{"nosuch", "nosuch"},
                                                        {"performer:featurez=8", "featurez"},
                                                        {"softmax:dropout=2", "dropout"},
                                                        {"ra:samples=0", "samples"},
                                                        {"lara:samples=abc", "samples"},
                                                        {"", "spec"},
                                                        {"performer:features=-1", "features"},
                                                        {"nprf_rpe:max_len=2", "max_len"}})
    cases.push_back({with(base, "--spec", spec), {expect}});
  cases.push_back({with(base, "--in", d + "/missing.safetensors"), {"missing.safetensors"}});
  cases.push_back({with(base, "--in", d), {d}});
  write_all(d + "/text.safetensors", "q k v\n");
  cases.push_back({with(base, "--in", d + "/text.safetensors"), {"text.safetensors"}});
  write_all(d + "/empty.safetensors", "");
  cases.push_back({with(base, "--in", d + "/empty.safetensors"), {"empty.safetensors"}});
  write_all(d + "/cut.safetensors", read_all(qkv).substr(0, read_all(qkv).size() - 40));
  cases.push_back({with(base, "--in", d + "/cut.safetensors"), {"cut.safetensors"}});
  auto file = [&](const std::string& name, const std::map<std::string, linea::Tensor>& extra,
                  const std::vector<std::string>& drop = {}) {
    return attention_inputs(d + "/" + name + ".safetensors", extra, drop);
  };
  cases.push_back({with(base, "--in", file("no_q", {}, {"q"})), {"'q'"}});
  cases.push_back({with(base, "--in", file("unknown", {{"x", linea::randn({2})}})), {"'x'"}});
  cases.push_back(
      {with(base, "--in", file("int_q", {{"q", linea::zeros({1, 2, 4, 8}, linea::TensorOptions(DType::Int64))}})),
       {"q must be F32 or F64"}});
  cases.push_back(
      {with(base, "--in", file("f64_k", {{"k", linea::randn({1, 2, 4, 8}).to(DType::Float64)}})), {"k is"}});
  cases.push_back({with(base, "--in", file("3d_q", {{"q", linea::randn({2, 4, 8})}})), {"q"}});
  cases.push_back({with(base, "--in", file("short_v", {{"v", linea::randn({1, 2, 3, 8})}})), {"v"}});
  cases.push_back({with(base, "--in", file("heads_k", {{"k", linea::randn({1, 3, 4, 8})}})), {"k"}});
  cases.push_back({with(base, "--in", file("dim_k", {{"k", linea::randn({1, 2, 4, 7})}})), {"k"}});
  cases.push_back({with(base, "--in", file("dout", {{"dout", linea::randn({1, 2, 4, 9})}})), {"dout"}});
  cases.push_back(
      {with(base, "--in", file("mask_float", {{"key_padding_mask", linea::randn({1, 4})}})), {"key_padding_mask"}});
  cases.push_back(
      {with(base, "--in",
            file("mask_shape", {{"key_padding_mask", linea::zeros({1, 5}, linea::TensorOptions(DType::Int64))}})),
       {"key_padding_mask"}});
  cases.push_back({with(base, "--in", file("rpe", {{"rpe", linea::randn({2, 7})}})), {"rpe"}});
  cases.push_back({with(base, "--in", file("omega", {{"omega", linea::randn({2, 8, 8})}})), {"omega"}});
  cases.push_back(
      {with(with(base, "--in", file("short_rpe", {{"rpe", linea::randn({2, 3})}})), "--spec", "nprf_rpe"), {"rpe"}});
  cases.push_back(
      {with(with(base, "--in", file("rpe_heads", {{"rpe", linea::randn({3, 7})}})), "--spec", "nprf_rpe"), {"rpe"}});
  cases.push_back(
      {with(with(base, "--in", file("ra_index", {{"ra_index", linea::randn({2})}})), "--spec", "ra"), {"ra_index"}});
  // NaN and Inf in the inputs, and finite inputs that overflow.
  cases.push_back({with(base, "--in", file("nan_q", {{"q", with_value(kNaN)}})), {"q holds nan", "[0, 1, 0, 5]"}});
  cases.push_back({with(base, "--in", file("inf_k", {{"k", with_value(kInf)}})), {"k holds inf"}});
  cases.push_back({with(base, "--in",
                        file("inf_v64", {{"v", with_value(-kInf, DType::Float64)},
                                         {"q", with_value(0, DType::Float64)},
                                         {"k", with_value(0, DType::Float64)}})),
                   {"v holds -inf"}});
  cases.push_back({with(base, "--in", file("nan_dout", {{"dout", with_value(kNaN)}})), {"dout holds nan"}});
  cases.push_back(
      {with(with(base, "--in", file("nan_rpe", {{"rpe", linea::full({2, 7}, kNaN)}})), "--spec", "nprf_rpe"),
       {"rpe holds nan"}});
  cases.push_back(
      {with(base, "--in", file("overflow", {{"q", with_value(3e38f)}, {"k", with_value(3e38f)}})), {"non-finite"}});
  // Outputs and devices.
  cases.push_back({with(base, "--out", d), {d}});
  cases.push_back({with(base, "--out", d + "/no/such/out.safetensors"), {"out.safetensors"}});
  cases.push_back({plus(base, {"--device", "gpu"}), {"gpu"}});
  cases.push_back({plus(base, {"--device", "cuda:abc"}), {"cuda:abc"}});
  if (!linea::cuda_available()) cases.push_back({plus(base, {"--device", "cuda"}), {"cuda"}});
  sweep("linea-attn", EXE_LINEA_ATTN, cases, dir);
#endif
}

TEST(BadInput, LineaBleu) {
#ifndef EXE_LINEA_BLEU
  GTEST_SKIP() << "linea-bleu is not built";
#else
  TempDir dir;
  const std::string d = dir.path.string(), ref = d + "/ref.txt", hyp = d + "/hyp.txt";
  write_all(ref, "the cat sat on the mat\na dog barked\nit rained\n");
  write_all(hyp, "the cat sat on a mat\nthe dog barked\nit snowed\n");
  const Args base = {ref, "-i", hyp};
  std::vector<Case> cases;
  cases.push_back({{"-i", hyp}, {"reference"}});
  cases.push_back({{d + "/missing.txt", "-i", hyp}, {"missing.txt"}});
  cases.push_back({{d, "-i", hyp}, {d}});
  cases.push_back({with(base, "-i", d + "/missing_hyp.txt"), {"missing_hyp.txt"}});
  cases.push_back({with(base, "-i", d), {d}});
  write_all(d + "/two.txt", "a\nb\n");
  cases.push_back({with(base, "-i", d + "/two.txt"), {"two.txt"}});
  cases.push_back({{ref, d + "/two.txt", "-i", hyp}, {"two.txt"}});
  write_all(d + "/empty.txt", "");
  cases.push_back({with(base, "-i", d + "/empty.txt"), {"empty.txt"}});
  cases.push_back({{d + "/empty.txt", "-i", hyp}, {"empty.txt"}});
  write_all(d + "/cut.txt.gz", std::string("\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\x03", 10));
  cases.push_back({{d + "/cut.txt.gz", "-i", hyp}, {"cut.txt.gz", "gzip"}});
  write_all(d + "/latin1.txt", "caf\xe9\nb\nc\n");
  cases.push_back({{d + "/latin1.txt", "-i", hyp}, {"latin1.txt"}});
  write_all(d + "/tabs.txt", "a\tb\nc\nd\n");
  cases.push_back({{ref}, {"tab"}, d + "/tabs.txt"});
  for (const char* w : {"-1", "101", "2147483647", "abc", "1e3"}) cases.push_back({plus(base, {"-w", w}), {"-w"}});
  cases.push_back({plus(base, {"-m", "ter"}), {"ter"}});
  cases.push_back({plus(base, {"-f", "xml"}), {"xml"}});
  for (const char* o : {"0", "-3", "1000000000", "x"})
    cases.push_back({plus(base, {"-m", "chrf", "--chrf-char-order", o}), {"--chrf-char-order"}});
  for (const char* b : {"-1", "100000", "nan", "1e308"})
    cases.push_back({plus(base, {"-m", "chrf", "--chrf-beta", b}), {"--chrf-beta"}});
  cases.push_back({plus(base, {"--bogus"}), {"--bogus"}});
  sweep("linea-bleu", EXE_LINEA_BLEU, cases, dir);
#endif
}

TEST(BadInput, MlpExample) {
#ifndef EXE_MLP
  GTEST_SKIP() << "the mlp example is not built";
#else
  TempDir dir;
  const std::string d = dir.path.string();
  const Args base = {"--steps", "20", "--points", "50"};
  std::vector<Case> cases;
  auto bad = [&](const std::string& flag, const std::string& value, const std::string& expect = "") {
    cases.push_back({with(base, flag, value), {expect.empty() ? flag : expect}});
  };
  for (const char* v : {"abc", "0", "-1", "nan", "inf"}) bad("--lr", v);
  for (const char* v : {"nan", "-1", "inf"}) bad("--noise", v);
  for (const char* v : {"1", "101", "abc"}) bad("--classes", v);
  bad("--points", "5");
  bad("--hidden", "0");
  for (const char* v : {"0", "17"}) bad("--depth", v);
  for (const char* v : {"-1", "1.5"}) bad("--steps", v);
  for (const char* v : {"nan", "2", "-1"}) bad("--min-accuracy", v);
  write_all(d + "/a_file", "x\n");
  bad("--save", d + "/a_file", "a_file");
  bad("--save", "/proc/linea_mlp", "/proc/linea_mlp");
  cases.push_back({plus(base, {"--bogus"}), {"--bogus"}});
  // Training that diverges stops with the step.
  cases.push_back({with(base, "--lr", "1e30"), {"step ", "non-finite loss"}});
  sweep("mlp", EXE_MLP, cases, dir);
#endif
}

// The benchmarks' flags (their measurements are not run: every case fails before or at once).
TEST(BadInput, BenchmarkFlags) {
  TempDir dir;
  const std::string d = dir.path.string();
  int swept = 0;
#ifdef EXE_ATTENTION_DECODE
  {
    const Args base = {"--specs", "softmax", "--length", "8", "--report", "4", "--device", "cpu", "--threads", "1"};
    std::vector<Case> cases;
    auto bad = [&](const std::string& flag, const std::string& value, const std::string& expect = "") {
      cases.push_back({with(base, flag, value), {expect.empty() ? flag : expect}});
    };
    for (const char* v : {"abc", "1,x", "99999999999999999999", "0"}) bad("--report", v);
    bad("--report", "100", "--report");  // beyond --length
    for (const char* v : {"-4", "abc"}) bad("--threads", v);
    for (const char* v : {"nan", "-1", "0"}) bad("--max-seconds", v);
    bad("--specs", "", "--specs");
    bad("--specs", ",", "--specs");
    bad("--specs", "bogus", "bogus");
    bad("--specs", "lara", "lara");  // not causal
    bad("--specs", "performer:featurez=8", "featurez");
    bad("--device", "gpu", "gpu");
    for (const char* f : {"--length", "--window", "--heads", "--batch", "--dim"}) bad(f, "0");
    bad("--length", "abc");
    bad("--json", d, d);
    cases.push_back({plus(base, {"--bogus"}), {"--bogus"}});
    sweep("attention-decode", EXE_ATTENTION_DECODE, cases, dir);
    ++swept;
  }
#endif
#ifdef EXE_ATTENTION_MSE
  {
    const Args base = {
        "--specs", "ra", "--samples",  "2", "--repeats", "1",   "--n",       "8", "--heads", "1",
        "--dim",   "4",  "--clusters", "2", "--device",  "cpu", "--threads", "1", "--json",  d + "/mse.jsonl"};
    std::vector<Case> cases;
    auto bad = [&](const std::string& flag, const std::string& value, const std::string& expect = "") {
      cases.push_back({with(base, flag, value), {expect.empty() ? flag : expect}});
    };
    for (const char* v : {"bogus", "performer:featurez=8", ""})
      bad("--specs", v, std::string(v).empty() ? "--specs" : v == std::string("bogus") ? "bogus" : "featurez");
    for (const char* v : {"0", "abc", "2,-1", "nan"}) bad("--samples", v);
    bad("--repeats", "0");
    bad("--in", d + "/missing.safetensors", "missing.safetensors");
    write_all(d + "/text.safetensors", "not safetensors");
    bad("--in", d + "/text.safetensors", "text.safetensors");
    for (const char* f : {"--n", "--clusters", "--heads", "--dim", "--batch"}) bad(f, "0");
    bad("--layout", "x");
    bad("--dtype", "float16");
    bad("--device", "gpu", "gpu");
    bad("--threads", "-1");
    bad("--json", d, d);
    sweep("attention-mse", EXE_ATTENTION_MSE, cases, dir);
    ++swept;
  }
#endif
#ifdef EXE_ATTENTION_SCALING
  {
    const Args base = {"--specs",  "softmax", "--lengths", "16", "--repeats", "3",
                       "--batch",  "1",       "--heads",   "1",  "--dim",     "8",
                       "--device", "cpu",     "--threads", "1",  "--json",    d + "/scaling.jsonl"};
    std::vector<Case> cases;
    auto bad = [&](const std::string& flag, const std::string& value, const std::string& expect = "") {
      cases.push_back({with(base, flag, value), {expect.empty() ? flag : expect}});
    };
    for (const char* v : {"0", "abc", "16,-2"}) bad("--lengths", v);
    bad("--repeats", "2");
    bad("--specs", "bogus", "bogus");
    bad("--specs", "", "--specs");
    for (const char* v : {"nan", "0", "-1"}) bad("--max-seconds", v);
    for (const char* f : {"--batch", "--heads", "--dim"}) bad(f, "0");
    bad("--device", "gpu", "gpu");
    bad("--precision", "fp16", "fp16");
    bad("--precision", "bf16", "--device cuda");  // the CPU computes every matmul in float32
    bad("--json", d, d);
    sweep("attention-scaling", EXE_ATTENTION_SCALING, cases, dir);
    ++swept;
  }
#endif
#ifdef EXE_BENCH_MATMUL
  {
    std::vector<Case> cases;
    for (const char* v : {"abc", "-1", "0", "1.5", ""}) cases.push_back({{"--reps", v}, {"--reps"}});
    for (const char* v : {"x", "-1"}) cases.push_back({{"--warmup", v}, {"--warmup"}});
    cases.push_back({{"--json"}, {"--json"}});
    cases.push_back({{"--bogus"}, {"--bogus"}});
    sweep("bench_matmul", EXE_BENCH_MATMUL, cases, dir);
    ++swept;
  }
#endif
#ifdef EXE_TRAIN_STEP
  {
    const Args base = {"--model", "vit", "--batch", "2", "--steps", "3", "--warmup", "1", "--device", "cpu"};
    std::vector<Case> cases;
    auto bad = [&](const std::string& flag, const std::string& value, const std::string& expect = "") {
      cases.push_back({with(base, flag, value), {expect.empty() ? flag : expect}});
    };
    bad("--model", "mlp");
    for (const char* f : {"--batch", "--warmup", "--ops"}) bad(f, "0");
    bad("--steps", "2");
    bad("--precision", "fp16");
    bad("--precision", "tf32", "--device cuda");  // the CPU computes every matmul in float32
    bad("--device", "gpu", "gpu");
    cases.push_back({plus(base, {"--cuda-graph"}), {"--cuda-graph needs --device cuda"}});
    bad("--json", d, d);
    cases.push_back({plus(base, {"--bogus"}), {"--bogus"}});
    sweep("train-step", EXE_TRAIN_STEP, cases, dir);
    ++swept;
  }
#endif
#ifdef EXE_PROTEIN_BENCH_CONTEXT
  {
    const Args base = {"--lengths",    "16",
                       "--attention",  "softmax",
                       "--dim",        "16",
                       "--heads",      "2",
                       "--layers",     "1",
                       "--mlp-hidden", "32",
                       "--batch",      "1",
                       "--repeats",    "1",
                       "--device",     "cpu",
                       "--threads",    "1",
                       "--json",       d + "/context.json"};
    std::vector<Case> cases;
    auto bad = [&](const std::string& flag, const std::string& value, const std::string& expect = "") {
      cases.push_back({with(base, flag, value), {expect.empty() ? flag : expect}});
    };
    for (const char* v : {"2", "abc"}) bad("--lengths", v);
    bad("--attention", "bogus", "bogus");
    bad("--attention", "", "--attention");
    bad("--attention", "softmax:dropout=2", "dropout");
    bad("--dim", "0");
    bad("--heads", "3", "3");
    bad("--positions", "xyz", "xyz");
    for (const char* v : {"nan", "-1"}) bad("--memory-limit-gib", v);
    bad("--device", "gpu", "gpu");
    bad("--json", d, d);
    sweep("protein-bench-context", EXE_PROTEIN_BENCH_CONTEXT, cases, dir);
    ++swept;
  }
#endif
#if defined(EXE_TRANSLATE_BENCH_DECODE) && defined(EXE_TRANSLATE)
  {
    const TranslateRuns& t = translate_runs();
    const std::string in = d + "/in.txt";
    write_all(in, "sun moon\nstar\n");
    const Args base = {"--checkpoint", t.run + "/checkpoint",
                       "--input",      in,
                       "--sentences",  "2",
                       "--batch",      "1",
                       "--beam",       "1",
                       "--device",     "cpu",
                       "--threads",    "1"};
    std::vector<Case> cases;
    auto bad = [&](const std::string& flag, const std::string& value, const std::string& expect = "") {
      cases.push_back({with(base, flag, value), {expect.empty() ? flag : expect}});
    };
    bad("--checkpoint", d + "/no_checkpoint", "no_checkpoint");
    bad("--input", d + "/missing.txt", "missing.txt");
    bad("--input", d, d);
    write_all(d + "/blank.txt", "\n\n");
    bad("--input", d + "/blank.txt", "blank.txt");
    for (const char* f : {"--sentences", "--batch", "--beam"}) bad(f, "0");
    bad("--threads", "-1");
    bad("--device", "gpu", "gpu");
    bad("--json", d, d);
    const std::string nan_ckpt = copy_of(t.run + "/checkpoint", d + "/nan_checkpoint");
    poison(nan_ckpt + "/best/model.safetensors", kNaN);
    bad("--checkpoint", nan_ckpt, "non-finite");
    cases.push_back({without(base, "--input"), {"--input"}});
    sweep("translate-bench-decode", EXE_TRANSLATE_BENCH_DECODE, cases, dir);
    ++swept;
  }
#endif
  if (swept == 0) GTEST_SKIP() << "no benchmark is built";
}

}  // namespace
