// Helpers shared by the fuzz targets of tests/fuzz: a per-process scratch folder for the readers
// that take a path (in /dev/shm when it is writable, so no disk I/O per run), gzip compression
// (so a target can feed valid gzip streams of fuzzed content as well as corrupt ones), and the
// one rule every target follows: linea::Error is an expected outcome, anything else is a bug.
// Not here: the seeds (make_seeds.cpp) or how the targets are run (run.sh).
#pragma once

#include <signal.h>
#include <unistd.h>
#include <zlib.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "core/allocator.h"
#include "core/error.h"

namespace linea::fuzz {

namespace fs = std::filesystem;

// This process's scratch folder, <base>/linea-fuzz-<pid>, created on first use and removed at
// exit. A crash ends the process without that cleanup, so the folders of processes that are
// gone are removed here first.
inline const fs::path& scratch_dir() {
  static const fs::path dir = [] {
    fs::path base = "/dev/shm";
    if (::access(base.c_str(), W_OK) != 0) base = std::getenv("TMPDIR") ? std::getenv("TMPDIR") : "/tmp";
    std::error_code ec;
    std::vector<fs::path> stale;
    for (fs::directory_iterator it(base, ec), end; !ec && it != end; it.increment(ec)) {
      const std::string name = it->path().filename().string();
      const long pid = name.rfind("linea-fuzz-", 0) == 0 ? std::strtol(name.c_str() + 11, nullptr, 10) : 0;
      if (pid > 0 && ::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH) stale.push_back(it->path());
    }
    for (const fs::path& p : stale) fs::remove_all(p, ec);
    fs::path d = base / ("linea-fuzz-" + std::to_string(::getpid()));
    fs::remove_all(d, ec);
    if (!fs::create_directories(d, ec)) {
      std::fprintf(stderr, "linea fuzz: cannot create %s: %s\n", d.c_str(), ec.message().c_str());
      std::abort();
    }
    std::atexit([] {
      std::error_code e;
      fs::remove_all(scratch_dir(), e);
    });
    return d;
  }();
  return dir;
}

// A fresh, empty sub-folder of the scratch folder (the same path every call).
inline fs::path fresh_dir(const std::string& name) {
  const fs::path dir = scratch_dir() / name;
  std::error_code ec;
  fs::remove_all(dir, ec);
  fs::create_directories(dir);
  return dir;
}

inline void write_file(const fs::path& path, const void* data, size_t size) {
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr || (size > 0 && std::fwrite(data, 1, size, f) != size) || std::fclose(f) != 0) {
    std::perror(("linea fuzz: cannot write " + path.string()).c_str());
    std::abort();
  }
}
inline void write_file(const fs::path& path, const std::string& bytes) { write_file(path, bytes.data(), bytes.size()); }

// `bytes` as one gzip member (what gzip(1) writes).
inline std::string gzip(const void* data, size_t size) {
  z_stream z{};
  if (deflateInit2(&z, Z_BEST_SPEED, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY) != Z_OK) std::abort();
  std::string out(deflateBound(&z, size), '\0');
  z.next_in = static_cast<Bytef*>(const_cast<void*>(data));
  z.avail_in = static_cast<uInt>(size);
  z.next_out = reinterpret_cast<Bytef*>(out.data());
  z.avail_out = static_cast<uInt>(out.size());
  if (deflate(&z, Z_FINISH) != Z_STREAM_END) std::abort();
  out.resize(z.total_out);
  deflateEnd(&z);
  return out;
}

// Declared first in a target's LLVMFuzzerTestOneInput, so it runs last: hands the blocks the CPU
// caching allocator kept back to malloc, where ASan sees them (use after free) and libFuzzer's
// RSS limit does not count an ever-growing cache of odd sizes. (tests/fuzz/run.sh turns the cache
// off altogether, LINEA_NO_CPU_MEMORY_CACHING=1; this is for a target run by hand.)
struct Iteration {
  Iteration() = default;
  Iteration(const Iteration&) = delete;
  Iteration& operator=(const Iteration&) = delete;
  ~Iteration() { cpu_allocator().empty_cache(); }
};

// Runs fn(); a linea::Error is the reader refusing bad input, which is fine. Every other
// exception escapes to libFuzzer, which reports it (an uncaught exception is a bug).
template <typename Fn> bool expect_ok_or_error(Fn&& fn) {
  try {
    fn();
    return true;
  } catch (const linea::Error&) {
    return false;
  }
}

// A broken invariant: report it the way a sanitizer would (libFuzzer saves the input).
#define LINEA_FUZZ_ASSERT(cond, ...)                                                                \
  do {                                                                                              \
    if (!(cond)) {                                                                                  \
      std::fprintf(stderr, "linea fuzz: %s:%d: invariant failed: %s\n", __FILE__, __LINE__, #cond); \
      std::fprintf(stderr, "  %s\n", ::linea::detail::concat(__VA_ARGS__).c_str());                 \
      std::abort();                                                                                 \
    }                                                                                               \
  } while (0)

}  // namespace linea::fuzz
