// FFTW3 for the CPU kernels (core/cpu/fft.cpp's rfft/irfft, core/cpu/toeplitz_attention.cpp):
// the interface of one precision (double: fftw_, float: fftwf_), fftw_malloc'ed buffers, and
// plans cached behind a mutex (FFTW's planner is not thread-safe; executing a plan with the
// new-array functions is, on arrays with the planning arrays' alignment). Plans live until
// process exit.
//
// Measured plans, kept per machine: FFTW_MEASURE picks a transform's algorithm by timing
// candidates (faster than FFTW_ESTIMATE's guess; figures in apps/bench/README.md), so two
// processes could pick different algorithms and round differently, and a resumed run would not
// continue bit for bit. So a measured plan's choice is written to a wisdom file
// (fftw_wisdom.cpp: $LINEA_FFTW_WISDOM, else
// $XDG_CACHE_HOME/linea or ~/.cache/linea) and every later process on the machine plans that
// shape from it, under a file lock, never measuring it again. Where no such folder can be
// used, or with LINEA_FFTW_WISDOM=off, plans are FFTW_ESTIMATE's (deterministic by
// construction, slower). Internal to core/cpu.
#pragma once

#include <fftw3.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <tuple>

#include "core/error.h"

namespace linea::cpu::fftw {

// The FFTW interface for one precision.
template <typename T> struct Fftw;
template <> struct Fftw<double> {
  using Plan = fftw_plan;
  using Complex = fftw_complex;
  static void* malloc(size_t bytes) { return fftw_malloc(bytes); }
  static void free(void* p) { fftw_free(p); }
  static int alignment_of(double* p) { return fftw_alignment_of(p); }
  // `channels` transforms of length n, one after another: real rows of n, complex rows of n/2+1.
  static Plan plan_r2c(int n, int channels, double* in, Complex* out, unsigned flags) {
    return fftw_plan_many_dft_r2c(1, &n, channels, in, nullptr, 1, n, out, nullptr, 1, n / 2 + 1, flags);
  }
  static Plan plan_c2r(int n, int channels, Complex* in, double* out, unsigned flags) {
    return fftw_plan_many_dft_c2r(1, &n, channels, in, nullptr, 1, n / 2 + 1, out, nullptr, 1, n, flags);
  }
  // One out-of-place complex transform of length n; sign FFTW_FORWARD (e^-) or FFTW_BACKWARD (e^+).
  static Plan plan_c2c(int n, Complex* in, Complex* out, int sign, unsigned flags) {
    return fftw_plan_dft_1d(n, in, out, sign, flags);
  }
  static void exec_r2c(Plan p, double* in, Complex* out) { fftw_execute_dft_r2c(p, in, out); }
  static void exec_c2r(Plan p, Complex* in, double* out) { fftw_execute_dft_c2r(p, in, out); }
  static void exec_c2c(Plan p, Complex* in, Complex* out) { fftw_execute_dft(p, in, out); }
  static int import_wisdom(const char* path) { return fftw_import_wisdom_from_filename(path); }
  static int export_wisdom(const char* path) { return fftw_export_wisdom_to_filename(path); }
  static constexpr const char* kName = "double";
};
template <> struct Fftw<float> {
  using Plan = fftwf_plan;
  using Complex = fftwf_complex;
  static void* malloc(size_t bytes) { return fftwf_malloc(bytes); }
  static void free(void* p) { fftwf_free(p); }
  static int alignment_of(float* p) { return fftwf_alignment_of(p); }
  static Plan plan_r2c(int n, int channels, float* in, Complex* out, unsigned flags) {
    return fftwf_plan_many_dft_r2c(1, &n, channels, in, nullptr, 1, n, out, nullptr, 1, n / 2 + 1, flags);
  }
  static Plan plan_c2r(int n, int channels, Complex* in, float* out, unsigned flags) {
    return fftwf_plan_many_dft_c2r(1, &n, channels, in, nullptr, 1, n / 2 + 1, out, nullptr, 1, n, flags);
  }
  static Plan plan_c2c(int n, Complex* in, Complex* out, int sign, unsigned flags) {
    return fftwf_plan_dft_1d(n, in, out, sign, flags);
  }
  static void exec_r2c(Plan p, float* in, Complex* out) { fftwf_execute_dft_r2c(p, in, out); }
  static void exec_c2r(Plan p, Complex* in, float* out) { fftwf_execute_dft_c2r(p, in, out); }
  static void exec_c2c(Plan p, Complex* in, Complex* out) { fftwf_execute_dft(p, in, out); }
  static int import_wisdom(const char* path) { return fftwf_import_wisdom_from_filename(path); }
  static int export_wisdom(const char* path) { return fftwf_export_wisdom_to_filename(path); }
  static constexpr const char* kName = "float";
};

// An fftw_malloc'ed array of T (freed on scope exit).
template <typename T> struct FftwBuffer {
  T* p = nullptr;
  explicit FftwBuffer(int64_t count) {
    p = static_cast<T*>(Fftw<T>::malloc(sizeof(T) * static_cast<size_t>(std::max<int64_t>(count, 1))));
    LINEA_CHECK(p != nullptr, "fft: out of memory allocating ", count, " scratch elements");
  }
  ~FftwBuffer() { Fftw<T>::free(p); }
  FftwBuffer(const FftwBuffer&) = delete;
  FftwBuffer& operator=(const FftwBuffer&) = delete;
};

// A cached plan and the alignment (fftw_alignment_of) of the arrays it was planned with.
template <typename T> struct CachedPlan {
  typename Fftw<T>::Plan plan;
  int align_in;
  int align_out;
};

inline std::mutex& planner_mutex() {
  static std::mutex m;
  return m;
}

// What a plan transforms: `channels` consecutive rows real -> half spectrum or half spectrum ->
// real, or one complex row forward (e^-, input preserved) or backward (e^+, input destroyed);
// all out of place.
enum class Kind { R2C, C2R, Forward, Backward };

// The machine's wisdom file for one precision ("float" or "double"), locked (flock) for the
// object's lifetime (fftw_wisdom.cpp). ok() is false where none can be used: then plans are
// FFTW_ESTIMATE's.
class WisdomFile {
 public:
  explicit WisdomFile(const char* precision);
  ~WisdomFile();
  WisdomFile(const WisdomFile&) = delete;
  WisdomFile& operator=(const WisdomFile&) = delete;
  bool ok() const { return lock_fd_ >= 0; }
  const std::string& path() const { return path_; }
  // Replaces the file with what `write` (FFTW's export to a file name) writes, atomically
  // (a temporary file beside it, synced, then renamed); on failure the old file stays.
  void save(int (*write)(const char*)) const;

 private:
  std::string path_;
  int lock_fd_ = -1;
};

// How many plans this process has measured (not taken from wisdom): for tests.
int64_t& measured_plan_count();

// The plan for `channels` transforms of length n of the given kind; made once per process, from
// the machine's wisdom where it has the shape, else measured and added to it.
template <typename T> CachedPlan<T> get_plan(int64_t n, Kind kind, int64_t channels = 1) {
  using Key = std::tuple<int64_t, Kind, int64_t>;
  static std::map<Key, CachedPlan<T>> cache;  // one map per precision
  std::lock_guard<std::mutex> lock(planner_mutex());
  auto it = cache.find(Key(n, kind, channels));
  if (it != cache.end()) return it->second;
  LINEA_CHECK(n <= INT32_MAX && channels <= INT32_MAX && 2 * n * channels <= INT32_MAX, "fft: ", channels,
              " transforms of length ", n, " are too large for FFTW");
  const int ni = static_cast<int>(n), ci = static_cast<int>(channels);
  FftwBuffer<T> a(2 * n * channels), b(2 * n * channels);  // room for complex rows of n
  using C = typename Fftw<T>::Complex;
  auto plan = [&](unsigned flags) {
    switch (kind) {
      case Kind::R2C: return Fftw<T>::plan_r2c(ni, ci, a.p, reinterpret_cast<C*>(b.p), flags);
      case Kind::C2R: return Fftw<T>::plan_c2r(ni, ci, reinterpret_cast<C*>(a.p), b.p, flags);
      case Kind::Forward:
        return Fftw<T>::plan_c2c(ni, reinterpret_cast<C*>(a.p), reinterpret_cast<C*>(b.p), FFTW_FORWARD, flags);
      case Kind::Backward:
        return Fftw<T>::plan_c2c(ni, reinterpret_cast<C*>(a.p), reinterpret_cast<C*>(b.p), FFTW_BACKWARD,
                                 flags | FFTW_DESTROY_INPUT);
    }
    return typename Fftw<T>::Plan(nullptr);
  };
  typename Fftw<T>::Plan p = nullptr;
  {
    const WisdomFile wisdom(Fftw<T>::kName);
    if (wisdom.ok()) {
      // The file may have grown since this process last read it (other processes add to it).
      Fftw<T>::import_wisdom(wisdom.path().c_str());
      p = plan(FFTW_MEASURE | FFTW_WISDOM_ONLY);
      if (p == nullptr) {
        p = plan(FFTW_MEASURE);
        ++measured_plan_count();
        if (p != nullptr) wisdom.save(Fftw<T>::export_wisdom);
      }
    } else {
      p = plan(FFTW_ESTIMATE);
    }
  }
  LINEA_CHECK(p != nullptr, "fft: FFTW could not plan ", channels, " transforms of length ", n);
  CachedPlan<T> cp{p, Fftw<T>::alignment_of(a.p), Fftw<T>::alignment_of(b.p)};
  cache.emplace(Key(n, kind, channels), cp);
  return cp;
}

}  // namespace linea::cpu::fftw
