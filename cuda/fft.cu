// CUDA real FFTs through cuFFT (float: R2C/C2R, double: D2Z/Z2D): rfft x [batch, n] ->
// [batch, n/2+1, 2] (unnormalized) and irfft [batch, n/2+1, 2] -> [batch, n] scaled by 1/n
// (contracts in core/kernels.h; CPU reference core/cpu/fft.cpp on FFTW).
//
// Plans: one cufftPlanMany per (dtype, n, batch, direction), bound to Linea's stream and
// cached (at most kMaxPlans; the cache is emptied when full). Both transforms run on scratch
// copies of their input: c2r overwrites its input, and the copy also gives cuFFT aligned
// buffers whatever the view's offset. irfft zeroes the imaginary parts of the DC and Nyquist
// bins of its copy, which is what a c2r transform (FFTW's included) assumes of its input.
// Length 1 is handled by a small kernel (no plan).
// Not here: the dim moving / padding (core/ops_index.cpp).
#include <map>
#include <mutex>
#include <tuple>

#include "core/kernels.h"
#include "cuda/common.cuh"

namespace linea::cuda {

using namespace linea::cuda::detail;

namespace {

constexpr size_t kMaxPlans = 64;

// ---- plan cache ------------------------------------------------------------------------------------
struct PlanCache {
  std::mutex mu;
  std::map<std::tuple<DType, int64_t, int64_t, bool>, cufftHandle> plans;
};

PlanCache& plan_cache() {
  static PlanCache* cache = new PlanCache();  // leaked: plans outlive static destructors
  return *cache;
}

// The plan for `batch` transforms of length n; caller holds the cache's mutex.
cufftHandle get_plan(PlanCache& cache, DType dtype, int64_t n, int64_t batch, bool forward) {
  const auto key = std::make_tuple(dtype, n, batch, forward);
  auto it = cache.plans.find(key);
  if (it != cache.plans.end()) return it->second;
  const char* op = forward ? "rfft" : "irfft";
  LINEA_CHECK(n >= 1 && n <= INT32_MAX && batch <= INT32_MAX, op, ": length ", n, " x batch ", batch,
              " is too large for cuFFT (int32)");
  if (cache.plans.size() >= kMaxPlans) {
    bump(counter_cells().host_syncs);
    LINEA_CUDA_CHECK(cudaStreamSynchronize(stream()));  // no plan may be in use when destroyed
    for (auto& kv : cache.plans) LINEA_CUFFT_CHECK(cufftDestroy(kv.second));
    cache.plans.clear();
  }
  int len = static_cast<int>(n), nf = static_cast<int>(n / 2 + 1);
  const bool dbl = dtype == DType::Float64;
  const cufftType type = forward ? (dbl ? CUFFT_D2Z : CUFFT_R2C) : (dbl ? CUFFT_Z2D : CUFFT_C2R);
  // Rows of the real side are n apart, rows of the complex side n/2+1 apart.
  int in_embed = forward ? len : nf, out_embed = forward ? nf : len;
  cufftHandle plan = 0;
  LINEA_CUFFT_CHECK(
      cufftPlanMany(&plan, 1, &len, &in_embed, 1, in_embed, &out_embed, 1, out_embed, type, static_cast<int>(batch)));
  const cufftResult st = cufftSetStream(plan, stream());
  if (st != CUFFT_SUCCESS) {
    cufftDestroy(plan);
    LINEA_CUFFT_CHECK(st);
  }
  cache.plans.emplace(key, plan);
  return plan;
}

inline cufftResult exec_r2c(cufftHandle p, float* in, float* out) {
  return cufftExecR2C(p, in, reinterpret_cast<cufftComplex*>(out));
}
inline cufftResult exec_r2c(cufftHandle p, double* in, double* out) {
  return cufftExecD2Z(p, in, reinterpret_cast<cufftDoubleComplex*>(out));
}
inline cufftResult exec_c2r(cufftHandle p, float* in, float* out) {
  return cufftExecC2R(p, reinterpret_cast<cufftComplex*>(in), out);
}
inline cufftResult exec_c2r(cufftHandle p, double* in, double* out) {
  return cufftExecZ2D(p, reinterpret_cast<cufftDoubleComplex*>(in), out);
}

// ---- kernels ---------------------------------------------------------------------------------------
// dst = spec [batch, nf, 2] with the imaginary parts of bin 0 and (n even) bin n/2 zeroed.
template <typename T>
__global__ void prepare_spectrum_kernel(const T* spec, T* dst, int64_t batch, int64_t nf, int64_t n) {
  const int64_t total = batch * nf * 2;
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < total;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t part = e % 2, bin = (e / 2) % nf;
    const bool drop = part == 1 && (bin == 0 || (n % 2 == 0 && bin == n / 2));
    dst[e] = drop ? T(0) : spec[e];
  }
}

template <typename T> __global__ void scale_kernel(T* x, int64_t count, T scale) {
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < count;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x)
    x[e] *= scale;
}

// Length-1 transforms, done without cuFFT: rfft (x) -> (x, 0); irfft (re, im) -> re.
template <typename T> __global__ void length1_kernel(const T* in, T* out, int64_t batch, bool forward) {
  for (int64_t b = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; b < batch;
       b += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    if (forward) {
      out[2 * b] = in[b];
      out[2 * b + 1] = T(0);
    } else {
      out[b] = in[2 * b];
    }
  }
}

template <typename T> void rfft_impl(const Tensor& x, const Tensor& out, int64_t batch, int64_t n) {
  const int64_t count = batch * n;
  DeviceBuffer in(sizeof(T) * static_cast<size_t>(count));
  count_work(counter_cells().device_copies);
  LINEA_CUDA_CHECK(cudaMemcpyAsync(in.get(), x.data_ptr(), sizeof(T) * static_cast<size_t>(count),
                                   cudaMemcpyDeviceToDevice, stream()));
  rfft_rows<T>(in.as<T>(), ptr<T>(out), batch, n);
}

template <typename T> void irfft_impl(const Tensor& spec, const Tensor& out, int64_t batch, int64_t n) {
  const int64_t nf = n / 2 + 1, count = batch * nf * 2;
  DeviceBuffer in(sizeof(T) * static_cast<size_t>(count));
  prepare_spectrum_kernel<T><<<grid_for(count), kBlockSize, 0, stream()>>>(cptr<T>(spec), in.as<T>(), batch, nf, n);
  LINEA_KERNEL_LAUNCH_CHECK();
  irfft_rows<T>(in.as<T>(), ptr<T>(out), batch, n);
  scale_kernel<T><<<grid_for(batch * n), kBlockSize, 0, stream()>>>(ptr<T>(out), batch * n, T(1) / static_cast<T>(n));
  LINEA_KERNEL_LAUNCH_CHECK();
}

// cuFFT wants complex arrays aligned to their element size; our outputs are fresh tensors.
void check_aligned(const char* op, const Tensor& t) {
  LINEA_CHECK(reinterpret_cast<uintptr_t>(t.data_ptr()) % (2 * t.element_size()) == 0, op,
              ": output is not aligned for cuFFT (expected a freshly allocated tensor)");
}

}  // namespace

namespace detail {
// One batched real transform of rows, forward (R2C) or backward (C2R), through the plan cache.
template <typename T> void real_transform_rows(T* in, T* out, int64_t batch, int64_t n, bool forward) {
  if (n == 1) {
    length1_kernel<T><<<grid_for(batch), kBlockSize, 0, stream()>>>(in, out, batch, forward);
    LINEA_KERNEL_LAUNCH_CHECK();
    return;
  }
  PlanCache& cache = plan_cache();
  std::lock_guard<std::mutex> lock(cache.mu);
  cufftHandle plan = get_plan(cache, DTypeOf<T>::value, n, batch, forward);
  count_work(counter_cells().library_calls);
  LINEA_CUFFT_CHECK(forward ? exec_r2c(plan, in, out) : exec_c2r(plan, in, out));
}
template <typename T> void rfft_rows(T* in, T* out, int64_t batch, int64_t n) {
  real_transform_rows(in, out, batch, n, true);
}
template <typename T> void irfft_rows(T* in, T* out, int64_t batch, int64_t n) {
  real_transform_rows(in, out, batch, n, false);
}

template void rfft_rows<float>(float*, float*, int64_t, int64_t);
template void rfft_rows<double>(double*, double*, int64_t, int64_t);
template void irfft_rows<float>(float*, float*, int64_t, int64_t);
template void irfft_rows<double>(double*, double*, int64_t, int64_t);
}  // namespace detail

// x [batch, n] real -> out [batch, n/2+1, 2] (re, im), unnormalized
void rfft(const Tensor& x, const Tensor& out, int64_t batch, int64_t n) {
  LINEA_CHECK(x.numel() == batch * n && out.numel() == batch * (n / 2 + 1) * 2 && x.dtype() == out.dtype(), "rfft: x ",
              shape_str(x.shape()), " / out ", shape_str(out.shape()), " do not match batch ", batch, ", n ", n);
  if (batch == 0 || n == 0) return;
  check_aligned("rfft", out);
  LINEA_DISPATCH_FLOAT(x.dtype(), "rfft", [&] { rfft_impl<scalar_t>(x, out, batch, n); });
}

// spec [batch, n/2+1, 2] -> out [batch, n] real, scaled by 1/n
void irfft(const Tensor& spec, const Tensor& out, int64_t batch, int64_t n) {
  LINEA_CHECK(out.numel() == batch * n && spec.numel() == batch * (n / 2 + 1) * 2 && spec.dtype() == out.dtype(),
              "irfft: spec ", shape_str(spec.shape()), " / out ", shape_str(out.shape()), " do not match batch ", batch,
              ", n ", n);
  if (batch == 0 || n == 0) return;
  check_aligned("irfft", out);
  LINEA_DISPATCH_FLOAT(spec.dtype(), "irfft", [&] { irfft_impl<scalar_t>(spec, out, batch, n); });
}

}  // namespace linea::cuda
