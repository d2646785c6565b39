// CPU real FFTs through FFTW3 (double: fftw_, float: fftwf_): rfft x [batch, n] -> [batch, n/2+1, 2]
// (unnormalized) and irfft [batch, n/2+1, 2] -> [batch, n] scaled by 1/n (contracts in
// core/kernels.h). Not the dim moving / padding (core/ops_index.cpp) nor the CUDA path (cuFFT).
//
// Plans: one single-transform plan per (dtype, n, direction), made with FFTW_ESTIMATE on
// fftw_malloc'ed arrays and cached behind a mutex (FFTW's planner is not thread-safe; executing
// a plan is). Rows are transformed in parallel (OpenMP) with the new-array execute functions.
// FFTW requires new arrays to have the planning arrays' alignment: rows whose pointers have it
// are transformed in place of our buffers, the others go through per-thread fftw_malloc'ed
// scratch rows. c2r destroys its input, so irfft always copies the spectrum row to scratch first.
// Plans live until process exit (never destroyed: a handful per distinct length).
#include <fftw3.h>
#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>
#include <vector>

#include "core/cpu/strided.h"
#include "core/kernels.h"

namespace linea::cpu {

namespace {

// The FFTW interface for one precision.
template <typename T> struct Fftw;
template <> struct Fftw<double> {
  using Plan = fftw_plan;
  using Complex = fftw_complex;
  static void* malloc(size_t bytes) { return fftw_malloc(bytes); }
  static void free(void* p) { fftw_free(p); }
  static int alignment_of(double* p) { return fftw_alignment_of(p); }
  static Plan plan_r2c(int n, double* in, Complex* out) {
    return fftw_plan_many_dft_r2c(1, &n, 1, in, nullptr, 1, n, out, nullptr, 1, n / 2 + 1, FFTW_ESTIMATE);
  }
  static Plan plan_c2r(int n, Complex* in, double* out) {
    return fftw_plan_many_dft_c2r(1, &n, 1, in, nullptr, 1, n / 2 + 1, out, nullptr, 1, n, FFTW_ESTIMATE);
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
  static Plan plan_r2c(int n, float* in, Complex* out) {
    return fftwf_plan_many_dft_r2c(1, &n, 1, in, nullptr, 1, n, out, nullptr, 1, n / 2 + 1, FFTW_ESTIMATE);
  }
  static Plan plan_c2r(int n, Complex* in, float* out) {
    return fftwf_plan_many_dft_c2r(1, &n, 1, in, nullptr, 1, n / 2 + 1, out, nullptr, 1, n, FFTW_ESTIMATE);
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

std::mutex& planner_mutex() {
  static std::mutex m;
  return m;
}

// The plan for a single length-n transform (r2c when forward, else c2r); made once.
template <typename T> CachedPlan<T> get_plan(int64_t n, bool forward) {
  using Key = std::tuple<int64_t, bool>;
  static std::map<Key, CachedPlan<T>> cache;  // one map per precision
  std::lock_guard<std::mutex> lock(planner_mutex());
  auto it = cache.find(Key(n, forward));
  if (it != cache.end()) return it->second;
  LINEA_CHECK(n <= INT32_MAX, "fft: transform length ", n, " is too large for FFTW");
  const int ni = static_cast<int>(n);
  FftwBuffer<T> real(n);
  FftwBuffer<T> cplx(2 * (n / 2 + 1));
  auto* c = reinterpret_cast<typename Fftw<T>::Complex*>(cplx.p);
  typename Fftw<T>::Plan p = forward ? Fftw<T>::plan_r2c(ni, real.p, c) : Fftw<T>::plan_c2r(ni, c, real.p);
  LINEA_CHECK(p != nullptr, forward ? "rfft" : "irfft", ": FFTW could not plan a transform of length ", n);
  CachedPlan<T> cp{p, Fftw<T>::alignment_of(real.p), Fftw<T>::alignment_of(cplx.p)};
  cache.emplace(Key(n, forward), cp);
  return cp;
}

template <typename T> void rfft_impl(const T* x, T* out, int64_t batch, int64_t n) {
  using Complex = typename Fftw<T>::Complex;
  const int64_t F = n / 2 + 1;
  const CachedPlan<T> cp = get_plan<T>(n, true);
  const bool par = batch > 1 && batch * n >= detail::kParallelGrain;
  // Per-thread scratch rows for pointers without the planning alignment (allocated here, not
  // inside the parallel region, so an allocation failure throws on the calling thread).
  const int nt = par ? omp_get_max_threads() : 1;
  std::vector<std::unique_ptr<FftwBuffer<T>>> in_bufs, out_bufs;
  for (int t = 0; t < nt; ++t) {
    in_bufs.emplace_back(new FftwBuffer<T>(n));
    out_bufs.emplace_back(new FftwBuffer<T>(2 * F));
  }
#pragma omp parallel for schedule(static) if (par)
  for (int64_t b = 0; b < batch; ++b) {
    const int tid = omp_get_thread_num();
    T* xin = const_cast<T*>(x + b * n);  // an out-of-place r2c does not write its input
    T* yout = out + b * 2 * F;
    T* in = xin;
    T* o = yout;
    if (Fftw<T>::alignment_of(xin) != cp.align_real) {
      in = in_bufs[static_cast<size_t>(tid)]->p;
      std::copy(xin, xin + n, in);
    }
    if (Fftw<T>::alignment_of(yout) != cp.align_complex) o = out_bufs[static_cast<size_t>(tid)]->p;
    Fftw<T>::exec_r2c(cp.plan, in, reinterpret_cast<Complex*>(o));
    if (o != yout) std::copy(o, o + 2 * F, yout);
  }
}

template <typename T> void irfft_impl(const T* spec, T* out, int64_t batch, int64_t n) {
  using Complex = typename Fftw<T>::Complex;
  const int64_t F = n / 2 + 1;
  const CachedPlan<T> cp = get_plan<T>(n, false);
  const T scale = T(1) / static_cast<T>(n);
  const bool par = batch > 1 && batch * n >= detail::kParallelGrain;
  const int nt = par ? omp_get_max_threads() : 1;
  std::vector<std::unique_ptr<FftwBuffer<T>>> in_bufs, out_bufs;
  for (int t = 0; t < nt; ++t) {
    in_bufs.emplace_back(new FftwBuffer<T>(2 * F));  // c2r destroys its input: transform a copy
    out_bufs.emplace_back(new FftwBuffer<T>(n));
  }
#pragma omp parallel for schedule(static) if (par)
  for (int64_t b = 0; b < batch; ++b) {
    const int tid = omp_get_thread_num();
    const T* s = spec + b * 2 * F;
    T* yout = out + b * n;
    T* in = in_bufs[static_cast<size_t>(tid)]->p;
    std::copy(s, s + 2 * F, in);
    T* o = yout;
    if (Fftw<T>::alignment_of(yout) != cp.align_real) o = out_bufs[static_cast<size_t>(tid)]->p;
    Fftw<T>::exec_c2r(cp.plan, reinterpret_cast<Complex*>(in), o);
    for (int64_t t = 0; t < n; ++t) yout[t] = o[t] * scale;
  }
}

}  // namespace

// x [batch, n] real -> out [batch, n/2+1, 2] (re, im), unnormalized
void rfft(const Tensor& x, const Tensor& out, int64_t batch, int64_t n) {
  LINEA_DISPATCH_FLOAT(x.dtype(), "rfft", [&] {
    rfft_impl<scalar_t>(static_cast<const scalar_t*>(x.data_ptr()), static_cast<scalar_t*>(out.data_ptr()), batch, n);
  });
}

// spec [batch, n/2+1, 2] -> out [batch, n] real, scaled by 1/n
void irfft(const Tensor& spec, const Tensor& out, int64_t batch, int64_t n) {
  LINEA_DISPATCH_FLOAT(spec.dtype(), "irfft", [&] {
    irfft_impl<scalar_t>(static_cast<const scalar_t*>(spec.data_ptr()), static_cast<scalar_t*>(out.data_ptr()), batch,
                         n);
  });
}

}  // namespace linea::cpu
