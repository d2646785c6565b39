// FFTW3 for the CPU kernels (core/cpu/fft.cpp's rfft/irfft, core/cpu/toeplitz_attention.cpp):
// the interface of one precision (double: fftw_, float: fftwf_), fftw_malloc'ed buffers, and
// plans cached behind a mutex (FFTW's planner is not thread-safe; executing a plan with the
// new-array functions is, on arrays with the planning arrays' alignment). Plans are made with
// FFTW_ESTIMATE and live until process exit. Not FFTW_MEASURE, although it measured 1.3-1.45x
// faster here for 65 channels of 4096 or 16384 (float): it picks algorithms by timing, so two
// runs (or a run and its resumption) could round differently. Internal to core/cpu.
#pragma once

#include <fftw3.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <mutex>
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
  static Plan plan_r2c(int n, int channels, double* in, Complex* out) {
    return fftw_plan_many_dft_r2c(1, &n, channels, in, nullptr, 1, n, out, nullptr, 1, n / 2 + 1, FFTW_ESTIMATE);
  }
  static Plan plan_c2r(int n, int channels, Complex* in, double* out) {
    return fftw_plan_many_dft_c2r(1, &n, channels, in, nullptr, 1, n / 2 + 1, out, nullptr, 1, n, FFTW_ESTIMATE);
  }
  static void exec_r2c(Plan p, double* in, Complex* out) { fftw_execute_dft_r2c(p, in, out); }
  static void exec_c2r(Plan p, Complex* in, double* out) { fftw_execute_dft_c2r(p, in, out); }
};
template <> struct Fftw<float> {
  using Plan = fftwf_plan;
  using Complex = fftwf_complex;
  static void* malloc(size_t bytes) { return fftwf_malloc(bytes); }
  static void free(void* p) { fftwf_free(p); }
  static int alignment_of(float* p) { return fftwf_alignment_of(p); }
  static Plan plan_r2c(int n, int channels, float* in, Complex* out) {
    return fftwf_plan_many_dft_r2c(1, &n, channels, in, nullptr, 1, n, out, nullptr, 1, n / 2 + 1, FFTW_ESTIMATE);
  }
  static Plan plan_c2r(int n, int channels, Complex* in, float* out) {
    return fftwf_plan_many_dft_c2r(1, &n, channels, in, nullptr, 1, n / 2 + 1, out, nullptr, 1, n, FFTW_ESTIMATE);
  }
  static void exec_r2c(Plan p, float* in, Complex* out) { fftwf_execute_dft_r2c(p, in, out); }
  static void exec_c2r(Plan p, Complex* in, float* out) { fftwf_execute_dft_c2r(p, in, out); }
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
  int align_real;
  int align_complex;
};

inline std::mutex& planner_mutex() {
  static std::mutex m;
  return m;
}

// The plan for `channels` consecutive length-n transforms (r2c when forward, else c2r); made once.
template <typename T> CachedPlan<T> get_plan(int64_t n, bool forward, int64_t channels = 1) {
  using Key = std::tuple<int64_t, bool, int64_t>;
  static std::map<Key, CachedPlan<T>> cache;  // one map per precision
  std::lock_guard<std::mutex> lock(planner_mutex());
  auto it = cache.find(Key(n, forward, channels));
  if (it != cache.end()) return it->second;
  LINEA_CHECK(n <= INT32_MAX && channels <= INT32_MAX && n * channels <= INT32_MAX, "fft: ", channels,
              " transforms of length ", n, " are too large for FFTW");
  const int ni = static_cast<int>(n), ci = static_cast<int>(channels);
  FftwBuffer<T> real(n * channels);
  FftwBuffer<T> cplx(2 * (n / 2 + 1) * channels);
  auto* c = reinterpret_cast<typename Fftw<T>::Complex*>(cplx.p);
  typename Fftw<T>::Plan p = forward ? Fftw<T>::plan_r2c(ni, ci, real.p, c) : Fftw<T>::plan_c2r(ni, ci, c, real.p);
  LINEA_CHECK(p != nullptr, forward ? "rfft" : "irfft", ": FFTW could not plan ", channels, " transforms of length ",
              n);
  CachedPlan<T> cp{p, Fftw<T>::alignment_of(real.p), Fftw<T>::alignment_of(cplx.p)};
  cache.emplace(Key(n, forward, channels), cp);
  return cp;
}

}  // namespace linea::cpu::fftw
