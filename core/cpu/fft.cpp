// CPU real FFTs through FFTW3 (double: fftw_, float: fftwf_): rfft x [batch, n] -> [batch, n/2+1, 2]
// (unnormalized) and irfft [batch, n/2+1, 2] -> [batch, n] scaled by 1/n (contracts in
// core/kernels.h). Not the dim moving / padding (core/ops_index.cpp) nor the CUDA path (cuFFT).
//
// Plans (core/cpu/fftw.h): one single-transform plan per (dtype, n, direction), cached. Rows are
// transformed in parallel (OpenMP) with the new-array execute functions. FFTW requires new
// arrays to have the planning arrays' alignment: rows whose pointers have it are transformed in
// place of our buffers, the others go through per-thread fftw_malloc'ed scratch rows. c2r
// destroys its input, so irfft always copies the spectrum row to scratch first.
#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <vector>

#include "core/cpu/fftw.h"
#include "core/cpu/strided.h"
#include "core/kernels.h"

namespace linea::cpu {

namespace {

using fftw::CachedPlan;
using fftw::Fftw;
using fftw::FftwBuffer;
using fftw::get_plan;

template <typename T> void rfft_impl(const T* x, T* out, int64_t batch, int64_t n) {
  using Complex = typename Fftw<T>::Complex;
  const int64_t F = n / 2 + 1;
  const CachedPlan<T> cp = get_plan<T>(n, fftw::Kind::R2C);
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
    if (Fftw<T>::alignment_of(xin) != cp.align_in) {
      in = in_bufs[static_cast<size_t>(tid)]->p;
      std::copy(xin, xin + n, in);
    }
    if (Fftw<T>::alignment_of(yout) != cp.align_out) o = out_bufs[static_cast<size_t>(tid)]->p;
    Fftw<T>::exec_r2c(cp.plan, in, reinterpret_cast<Complex*>(o));
    if (o != yout) std::copy(o, o + 2 * F, yout);
  }
}

template <typename T> void irfft_impl(const T* spec, T* out, int64_t batch, int64_t n) {
  using Complex = typename Fftw<T>::Complex;
  const int64_t F = n / 2 + 1;
  const CachedPlan<T> cp = get_plan<T>(n, fftw::Kind::C2R);
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
    if (Fftw<T>::alignment_of(yout) != cp.align_out) o = out_bufs[static_cast<size_t>(tid)]->p;
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
