// Kills and faults through the vit executable (the shared training loop and nn/checkpoint.h,
// end to end): SIGKILL at random moments, during checkpoint writes too, never costs more than
// the steps since the last checkpoint and a resumed run ends with the uninterrupted run's
// parameters, bit for bit; SIGINT and SIGTERM save and exit 130 / 143; a full disk (a file
// size limit, and a real small tmpfs where mounting is allowed) and a read-only checkpoint
// folder give a clear error and leave the previous checkpoint as it was.
// Not here: resume inside one process (test_vit.cpp), the loop's own tests (apps/common/).
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "fake_data.h"
#include "linea.h"
#include "nn/safetensors.h"
#include "tests/test_util.h"

namespace fs = std::filesystem;
using linea::test::TempDir;
using namespace vit::test;

namespace {

using Clock = std::chrono::steady_clock;

std::string read_all(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

// What a child process is started with besides its arguments.
struct Limits {
  rlim_t file_size = RLIM_INFINITY;  // RLIMIT_FSIZE; writes past it fail with EFBIG (SIGXFSZ ignored)
};

// The vit executable running with `args`, its stdout and stderr in `log`.
class Vit {
 public:
  Vit(const std::vector<std::string>& args, const std::string& log, Limits limits = {}) : log_(log) {
    pid_ = ::fork();
    if (pid_ == 0) {
      std::FILE* out = std::freopen(log.c_str(), "w", stdout);
      if (out == nullptr || ::dup2(STDOUT_FILENO, STDERR_FILENO) < 0) ::_exit(126);
      // A test started in the background (`ctest &`) ignores SIGINT, and the app keeps a signal it
      // was started ignoring ignored: the child gets the default, as from a terminal.
      ::signal(SIGINT, SIG_DFL);
      if (limits.file_size != RLIM_INFINITY) {
        ::signal(SIGXFSZ, SIG_IGN);  // kept across exec: the write fails instead of killing
        rlimit rl{limits.file_size, limits.file_size};
        ::setrlimit(RLIMIT_FSIZE, &rl);
      }
      std::vector<char*> argv;
      static std::string exe = VIT_EXE;
      argv.push_back(exe.data());
      for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
      argv.push_back(nullptr);
      ::execv(exe.c_str(), argv.data());
      ::_exit(127);
    }
  }
  ~Vit() {
    if (pid_ > 0 && !reaped_) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
  }
  Vit(const Vit&) = delete;
  Vit& operator=(const Vit&) = delete;

  void signal(int sig) { ::kill(pid_, sig); }
  // Whether the child has exited (reaped then: wait() returns its status).
  bool exited() {
    if (!reaped_ && ::waitpid(pid_, &status_, WNOHANG) == pid_) reaped_ = true;
    return reaped_;
  }
  // Waits for the exit (at most `limit_s`, then SIGKILL); the raw wait status, or -1 on timeout.
  int wait(double limit_s = 300) {
    const auto t0 = Clock::now();
    while (!exited()) {
      if (std::chrono::duration<double>(Clock::now() - t0).count() > limit_s) {
        ::kill(pid_, SIGKILL);
        ::waitpid(pid_, &status_, 0);
        reaped_ = true;
        return -1;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return status_;
  }
  // Exit code of a normal exit; -1 for a timeout or a death by signal.
  int exit_code(double limit_s = 300) {
    const int st = wait(limit_s);
    return st >= 0 && WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  }
  std::string output() const { return read_all(log_); }

 private:
  pid_t pid_ = -1;
  bool reaped_ = false;
  int status_ = 0;  // the raw wait status, once reaped
  std::string log_;
};

// A small run on the fake data: batches of 16 (16 steps per epoch of 256 images), 3 epochs, ra
// attention (random: a resume must restore the generator too), one thread for exact repeats.
std::vector<std::string> run_args(const std::string& data, const std::string& out,
                                  const std::vector<std::string>& more = {}) {
  std::vector<std::string> a = {"--data",
                                data,
                                "--patch",
                                "7",
                                "--dim",
                                "32",
                                "--depth",
                                "1",
                                "--heads",
                                "2",
                                "--batch-size",
                                "16",
                                "--epochs",
                                "3",
                                "--attention",
                                "ra",
                                "--lr",
                                "3e-3",
                                "--no-flip",
                                "--crop-padding",
                                "0",
                                "--threads",
                                "1",
                                "--seed",
                                "5",
                                "--no-progress",
                                "--no-plot",
                                "--out",
                                out};
  a.insert(a.end(), more.begin(), more.end());
  return a;
}

struct Fixture {
  TempDir dir;
  std::string data, ref;
  explicit Fixture(int n_train = 256) {
    data = (dir.path / "data").string();
    fs::create_directories(data);
    write_fake_fashion_mnist(data, n_train, 64);
    ref = (dir.path / "ref").string();
  }
  std::string path(const std::string& name) const { return (dir.path / name).string(); }
  // The uninterrupted run (its wall time in seconds).
  double reference() {
    const auto t0 = Clock::now();
    Vit v(run_args(data, ref), path("ref.log"));
    const int rc = v.exit_code();
    EXPECT_EQ(rc, 0) << v.output();
    return std::chrono::duration<double>(Clock::now() - t0).count();
  }
};

// Both files' tensors equal bit for bit.
::testing::AssertionResult same_parameters(const std::string& a, const std::string& b) {
  const auto fa = linea::nn::load_safetensors(a), fb = linea::nn::load_safetensors(b);
  if (fa.tensors.size() != fb.tensors.size()) return ::testing::AssertionFailure() << "different tensor counts";
  for (const auto& [name, t] : fa.tensors) {
    auto it = fb.tensors.find(name);
    if (it == fb.tensors.end()) return ::testing::AssertionFailure() << "'" << name << "' missing";
    const auto va = t.to_vector<double>(), vb = it->second.to_vector<double>();
    if (va != vb) return ::testing::AssertionFailure() << "'" << name << "' differs";
  }
  return ::testing::AssertionSuccess();
}

std::vector<std::string> temp_files(const std::string& dir) {
  std::vector<std::string> out;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec))
    if (it->path().filename().string().find(".tmp.") != std::string::npos) out.push_back(it->path().string());
  return out;
}

// The save id in a safetensors file's metadata (model: "save_id", training: "linea_save_id").
std::string save_id(const std::string& path, const char* key) {
  try {
    auto md = linea::nn::load_safetensors(path).metadata;
    return md.count(key) ? md.at(key) : "";
  } catch (const linea::Error&) {
    return "(unreadable)";
  }
}

int64_t saved_step(const std::string& ckpt) {
  return linea::nn::load_safetensors(ckpt + "/training.safetensors").tensors.at("train.step").item<int64_t>();
}

std::string checkpoint_bytes(const std::string& ckpt) {
  return read_all(ckpt + "/model.safetensors") + read_all(ckpt + "/training.safetensors") +
         read_all(ckpt + "/config.json");
}

// A tmpfs of `bytes` mounted at `dir` for the object's lifetime, when this process may mount.
struct Tmpfs {
  std::string dir;
  bool ok = false;
  Tmpfs(const std::string& d, int64_t bytes) : dir(d) {
    fs::create_directories(dir);
    ok = std::system(
             ("mount -t tmpfs -o size=" + std::to_string(bytes) + " tmpfs '" + dir + "' 2>/dev/null").c_str()) == 0;
  }
  bool remount_read_only() { return std::system(("mount -o remount,ro '" + dir + "' 2>/dev/null").c_str()) == 0; }
  ~Tmpfs() {
    if (ok) (void)std::system(("umount '" + dir + "'").c_str());
  }
};

}  // namespace

TEST(VitFaults, KilledAtRandomMomentsResumesExactly) {
  Fixture f(2048);  // 384 steps
  const double t_ref = f.reference();
  const std::string out = f.path("killed"), ckpt = out + "/checkpoint";
  // Kill after a random 0.02 .. t_ref / 8 s: each attempt gets some steps in (a checkpoint every
  // step, so many kills land inside a save), until `kKills` kills; then the run finishes.
  constexpr int kKills = 40;
  std::mt19937 rng(12345);
  std::uniform_real_distribution<double> delay(0.02, std::max(0.05, t_ref / 8));
  int kills = 0, in_save = 0, mixed = 0, runs = 0;
  while (true) {
    ASSERT_LT(runs, 300) << "no progress";
    ++runs;
    Vit v(run_args(f.data, out, {"--resume", "--checkpoint-every", "1", "--log-every", "1"}), f.path("killed.log"));
    if (kills < kKills) {
      std::this_thread::sleep_for(std::chrono::duration<double>(delay(rng)));
      v.signal(SIGKILL);
    }
    const int st = v.wait();
    ASSERT_NE(st, -1) << "timed out: " << v.output();
    if (WIFEXITED(st)) {  // finished before the kill, or the last run
      ASSERT_EQ(WEXITSTATUS(st), 0) << v.output();
      break;
    }
    ASSERT_TRUE(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL);
    ++kills;
    if (!temp_files(ckpt).empty()) ++in_save;
    if (fs::exists(ckpt + "/model.safetensors") && fs::exists(ckpt + "/training.safetensors") &&
        save_id(ckpt + "/model.safetensors", "save_id") != save_id(ckpt + "/training.safetensors", "linea_save_id"))
      ++mixed;
  }
  EXPECT_GE(kills, kKills);
  EXPECT_TRUE(same_parameters(out + "/checkpoint/model.safetensors", f.ref + "/checkpoint/model.safetensors"));
  EXPECT_TRUE(temp_files(ckpt).empty());  // the later saves removed what the kills left
  std::printf(
      "uninterrupted run %.2f s; kills: %d in %d runs, %d of them during a checkpoint save (%d between its renames); "
      "the final "
      "parameters equal the uninterrupted run's\n",
      t_ref, kills, runs, in_save, mixed);
}

TEST(VitFaults, SigintAndSigtermSaveAndExit) {
  Fixture f;
  f.reference();
  const std::string out = f.path("sig"), ckpt = out + "/checkpoint";
  // No periodic checkpoints: the signal's is the one resumed from.
  const auto args = run_args(f.data, out, {"--resume", "--checkpoint-every", "0", "--log-every", "1"});
  int64_t last_step = 0;
  for (int sig : {SIGINT, SIGTERM}) {
    Vit v(args, f.path("sig.log"));
    // Wait until the run has logged 5 more steps, then signal it.
    const auto t0 = Clock::now();
    while (true) {
      const std::string m = read_all(out + "/metrics.jsonl");
      size_t steps = 0;
      for (size_t p = m.find("\"type\":\"step\""); p != std::string::npos; p = m.find("\"type\":\"step\"", p + 1))
        ++steps;
      if (static_cast<int64_t>(steps) >= last_step + 5) break;
      ASSERT_FALSE(v.exited()) << "the run ended before 5 more steps:\n" << v.output();
      ASSERT_LT(std::chrono::duration<double>(Clock::now() - t0).count(), 120) << v.output();
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    v.signal(sig);
    const int code = v.exit_code();
    const std::string log = v.output();
    EXPECT_EQ(code, 128 + sig) << log;
    const std::string name = sig == SIGINT ? "SIGINT" : "SIGTERM";
    EXPECT_NE(log.find("vit: " + name + ": stopped after step"), std::string::npos) << log;
    EXPECT_NE(log.find("--resume"), std::string::npos) << log;
    EXPECT_EQ(log.find("error"), std::string::npos) << log;
    const int64_t step = saved_step(ckpt);
    EXPECT_GE(step, last_step + 5);
    EXPECT_NE(read_all(out + "/metrics.jsonl").find("\"type\":\"interrupted\""), std::string::npos);
    last_step = step;
  }
  Vit v(args, f.path("sig.log"));
  ASSERT_EQ(v.exit_code(), 0) << v.output();
  EXPECT_NE(v.output().find("resumed from"), std::string::npos);
  EXPECT_TRUE(same_parameters(ckpt + "/model.safetensors", f.ref + "/checkpoint/model.safetensors"));
}

TEST(VitFaults, FullDiskIsAClearErrorAndKeepsTheCheckpoint) {
  Fixture f;
  f.reference();
  const std::string out = f.path("full"), ckpt = out + "/checkpoint";
  {
    Vit v(run_args(f.data, out, {"--max-steps", "8"}), f.path("full.log"));
    ASSERT_EQ(v.exit_code(), 0) << v.output();
  }
  ASSERT_EQ(saved_step(ckpt), 8);
  const std::string before = checkpoint_bytes(ckpt);
  // Files may not grow past 16 KiB: the checkpoint's files are larger, the metrics lines not.
  ASSERT_GT(fs::file_size(ckpt + "/training.safetensors"), 16u << 10);
  Limits lim;
  lim.file_size = 16 << 10;
  Vit v(run_args(f.data, out, {"--resume", "--checkpoint-every", "4"}), f.path("full.log"), lim);
  const int code = v.exit_code();
  const std::string log = v.output();
  EXPECT_EQ(code, 1) << log;
  EXPECT_NE(log.find("error: save_safetensors: write failed on '" + ckpt + "/training.safetensors.tmp."),
            std::string::npos)
      << log;
  EXPECT_NE(log.find("File too large"), std::string::npos) << log;
  EXPECT_NE(log.find("was not modified"), std::string::npos) << log;
  EXPECT_EQ(checkpoint_bytes(ckpt), before);
  EXPECT_TRUE(temp_files(ckpt).empty());
  // The kept checkpoint resumes to the uninterrupted run's end.
  Vit r(run_args(f.data, out, {"--resume"}), f.path("full.log"));
  ASSERT_EQ(r.exit_code(), 0) << r.output();
  EXPECT_TRUE(same_parameters(ckpt + "/model.safetensors", f.ref + "/checkpoint/model.safetensors"));
}

// The checkpoint on a tmpfs with room for itself and little more: the next save runs out of
// space (ENOSPC), then the same tmpfs read-only (EROFS). Needs permission to mount.
TEST(VitFaults, NoSpaceAndReadOnlyFolderOnTmpfs) {
  Fixture f;
  const std::string out = f.path("small");
  {
    Vit v(run_args(f.data, out, {"--max-steps", "8"}), f.path("small.log"));
    ASSERT_EQ(v.exit_code(), 0) << v.output();
  }
  const std::string src = out + "/checkpoint";
  int64_t size = 0;
  for (const auto& e : fs::directory_iterator(src))
    if (e.is_regular_file()) size += static_cast<int64_t>(e.file_size());
  Tmpfs disk(f.path("tmpfs"), size + (64 << 10));
  if (!disk.ok) GTEST_SKIP() << "cannot mount a tmpfs here (needs root or CAP_SYS_ADMIN)";
  const std::string ckpt = disk.dir + "/checkpoint";
  fs::create_directories(ckpt);
  for (const char* name : {"model.safetensors", "training.safetensors", "config.json"})
    fs::copy_file(src + "/" + name, ckpt + "/" + name);
  const std::string before = checkpoint_bytes(ckpt);
  const auto args = run_args(f.data, out, {"--resume", "--checkpoint", ckpt, "--checkpoint-every", "4"});
  {
    Vit v(args, f.path("small.log"));
    const int code = v.exit_code();
    const std::string log = v.output();
    EXPECT_EQ(code, 1) << log;
    EXPECT_NE(log.find("No space left on device"), std::string::npos) << log;
    EXPECT_NE(log.find("was not modified"), std::string::npos) << log;
    EXPECT_EQ(checkpoint_bytes(ckpt), before);
    EXPECT_TRUE(temp_files(ckpt).empty());
  }
  ASSERT_TRUE(disk.remount_read_only());
  {
    Vit v(args, f.path("small.log"));
    const int code = v.exit_code();
    const std::string log = v.output();
    EXPECT_EQ(code, 1) << log;
    EXPECT_NE(log.find("Read-only file system"), std::string::npos) << log;
    EXPECT_EQ(checkpoint_bytes(ckpt), before);
  }
  {  // an output folder that cannot be made
    Vit v(run_args(f.data, disk.dir + "/out"), f.path("small.log"));
    const int code = v.exit_code();
    const std::string log = v.output();
    EXPECT_EQ(code, 1) << log;
    EXPECT_NE(
        log.find("error: vit: cannot create the output folder '" + disk.dir + "/out' (--out): Read-only file system"),
        std::string::npos)
        << log;
  }
}
