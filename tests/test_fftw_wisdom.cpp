// The CPU FFT planner's kept wisdom (core/cpu/fftw.h, fftw_wisdom.cpp): a shape is measured by
// the first process that needs it and planned from the file by every later one, with the same
// algorithm; "off" and unusable folders plan without measuring; an unreadable file is replaced.
// Each case runs its planners in child processes (fork), since a process keeps its plans.
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <string>
#include <type_traits>

#include "core/cpu/fftw.h"
#include "tests/test_util.h"

namespace linea {
namespace {

using cpu::fftw::Kind;

// Plans one shape in a child process with LINEA_FFTW_WISDOM=folder and writes FFTW's description
// of the plan to plan_out (when given). Returns the number of plans the child measured, or -1.
template <typename T> int plan_in_child(const std::string& folder, int64_t n, Kind kind, const std::string& plan_out) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    int rc = 100;
    try {
      ::setenv("LINEA_FFTW_WISDOM", folder.c_str(), 1);
      const auto cp = cpu::fftw::get_plan<T>(n, kind);
      if (!plan_out.empty()) {
        char* text = nullptr;
        if constexpr (std::is_same_v<T, float>)
          text = fftwf_sprint_plan(cp.plan);
        else
          text = fftw_sprint_plan(cp.plan);
        test::write_all(plan_out, text);
        std::free(text);
      }
      rc = static_cast<int>(cpu::fftw::measured_plan_count());
    } catch (...) {
    }
    ::_exit(rc);
  }
  int status = 0;
  if (pid < 0 || ::waitpid(pid, &status, 0) != pid || !WIFEXITED(status)) return -1;
  return WEXITSTATUS(status);
}

TEST(FftwWisdom, AShapeIsMeasuredOncePerMachineAndPlannedAlikeAfter) {
  test::TempDir dir;
  const std::string folder = dir.file("cache/linea");  // created, parents too
  EXPECT_EQ(plan_in_child<float>(folder, 1000, Kind::Forward, dir.file("first")), 1);
  EXPECT_TRUE(std::filesystem::file_size(folder + "/fftw-wisdom-float") > 0);
  EXPECT_EQ(plan_in_child<float>(folder, 1000, Kind::Forward, dir.file("second")), 0);  // from the file
  EXPECT_EQ(test::read_all(dir.file("first")), test::read_all(dir.file("second")));
  EXPECT_FALSE(test::read_all(dir.file("first")).empty());
  // Another kind, length or precision is another shape.
  EXPECT_EQ(plan_in_child<float>(folder, 1000, Kind::Backward, ""), 1);
  EXPECT_EQ(plan_in_child<float>(folder, 1024, Kind::R2C, ""), 1);
  EXPECT_EQ(plan_in_child<double>(folder, 1000, Kind::Forward, ""), 1);
  EXPECT_EQ(plan_in_child<double>(folder, 1000, Kind::Forward, ""), 0);
  EXPECT_EQ(plan_in_child<float>(folder, 1000, Kind::Backward, ""), 0);
  // No temporary file left behind.
  for (const auto& entry : std::filesystem::directory_iterator(folder))
    EXPECT_EQ(entry.path().filename().string().find(".tmp"), std::string::npos) << entry.path();
}

TEST(FftwWisdom, OffOrAnUnusableFolderPlansWithoutMeasuring) {
  test::TempDir dir;
  EXPECT_EQ(plan_in_child<float>("off", 1000, Kind::Forward, ""), 0);
  test::write_all(dir.file("file"), "x");
  EXPECT_EQ(plan_in_child<float>(dir.file("file/below"), 1000, Kind::Forward, ""), 0);  // a file is in the way
  EXPECT_FALSE(std::filesystem::exists(dir.file("file/below")));
}

TEST(FftwWisdom, AnUnreadableFileIsMeasuredAgainAndReplaced) {
  test::TempDir dir;
  const std::string folder = dir.file("w");
  std::filesystem::create_directories(folder);
  test::write_all(folder + "/fftw-wisdom-float", "(fftw-3.3 torn");
  EXPECT_EQ(plan_in_child<float>(folder, 1000, Kind::Forward, ""), 1);
  EXPECT_EQ(plan_in_child<float>(folder, 1000, Kind::Forward, ""), 0);
}

}  // namespace
}  // namespace linea
