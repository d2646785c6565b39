// CUDA random fills from the device's default generator, cuRAND's Philox4x32-10 (state
// {seed, offset}, see cuda/context.h): uniform U[lo, hi) and normal N(mean, std), float32 and
// float64. The numbers differ from the CPU generator's (same algorithm family, different
// stream layout); a given {seed, offset} always gives the same numbers on the GPU.
// Not here: bernoulli / randint / randperm (built on these by core/random.cpp).
#include "core/kernels.h"
#include "cuda/common.cuh"

namespace linea::cuda {

using namespace linea::cuda::detail;

namespace {

inline curandStatus_t generate_uniform(curandGenerator_t g, float* p, size_t n) {
  return curandGenerateUniform(g, p, n);
}
inline curandStatus_t generate_uniform(curandGenerator_t g, double* p, size_t n) {
  return curandGenerateUniformDouble(g, p, n);
}
inline curandStatus_t generate_normal(curandGenerator_t g, float* p, size_t n, double mean, double std) {
  return curandGenerateNormal(g, p, n, static_cast<float>(mean), static_cast<float>(std));
}
inline curandStatus_t generate_normal(curandGenerator_t g, double* p, size_t n, double mean, double std) {
  return curandGenerateNormalDouble(g, p, n, mean, std);
}

// cuRAND gives u in (0, 1]; 1 - u is in [0, 1). out = lo + (hi - lo) * (1 - u), computed in
// double as on the CPU, and a value that rounds up to hi is replaced by lo (keeps [lo, hi)).
template <typename T> __global__ void uniform_map_kernel(T* p, int64_t n, double lo, double hi) {
  const double span = hi - lo;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const double u = 1.0 - static_cast<double>(p[i]);
    const T v = static_cast<T>(lo + span * u);
    p[i] = (v < static_cast<T>(hi) || span == 0) ? v : static_cast<T>(lo);
  }
}

// 32-bit words a draw of n values consumes (an upper bound: the offset only has to move past them).
template <typename T> uint64_t words_for(int64_t n) { return static_cast<uint64_t>(n) * (sizeof(T) / 4); }

}  // namespace

// fills out (contiguous) with U[lo, hi)
void uniform(const Tensor& out, double lo, double hi) {
  LINEA_CHECK(out.is_contiguous(), "uniform: expected a contiguous output");
  const int64_t n = out.numel();
  if (n == 0) return;
  LINEA_DISPATCH_FLOAT(out.dtype(), "uniform", [&] {
    using T = scalar_t;
    {
      RngState& r = rng();
      std::lock_guard<std::mutex> lock(r.mu);
      curandGenerator_t g = generator_for_draw(words_for<T>(n));
      LINEA_CURAND_CHECK(generate_uniform(g, ptr<T>(out), static_cast<size_t>(n)));
    }
    uniform_map_kernel<T><<<grid_for(n), kBlockSize, 0, stream()>>>(ptr<T>(out), n, lo, hi);
    LINEA_KERNEL_LAUNCH_CHECK();
  });
}

// fills out (contiguous) with N(mean, std)
void normal(const Tensor& out, double mean, double std) {
  LINEA_CHECK(out.is_contiguous(), "normal: expected a contiguous output");
  const int64_t n = out.numel();
  if (n == 0) return;
  LINEA_DISPATCH_FLOAT(out.dtype(), "normal", [&] {
    using T = scalar_t;
    // cuRAND draws normals in pairs (Box-Muller): the count must be even and the pointer
    // aligned to a pair. Otherwise draw into scratch and copy.
    const int64_t even = n + (n % 2);
    const bool direct = even == n && reinterpret_cast<uintptr_t>(out.data_ptr()) % (2 * sizeof(T)) == 0;
    DeviceBuffer scratch(direct ? 0 : sizeof(T) * static_cast<size_t>(even));
    T* dst = direct ? ptr<T>(out) : scratch.as<T>();
    {
      RngState& r = rng();
      std::lock_guard<std::mutex> lock(r.mu);
      curandGenerator_t g = generator_for_draw(words_for<T>(even));
      LINEA_CURAND_CHECK(generate_normal(g, dst, static_cast<size_t>(even), mean, std));
    }
    if (!direct)
      LINEA_CUDA_CHECK(
          cudaMemcpyAsync(out.data_ptr(), dst, sizeof(T) * static_cast<size_t>(n), cudaMemcpyDeviceToDevice, stream()));
  });
}

}  // namespace linea::cuda
