// CUDA random fills from the device's default generator, cuRAND's Philox4x32-10 (state
// {seed, offset}, see cuda/context.h): uniform U[lo, hi) and normal N(mean, std), float32 and
// float64. The numbers differ from the CPU generator's (same algorithm family, different
// stream layout); a given {seed, offset} always gives the same numbers on the GPU.
// The per-example draws (uniform_rows, normal_rows) use Linea's own Philox counters
// (core/random_math.h), so they equal the CPU's numbers exactly.
// Not here: bernoulli / randint / randperm (built on these by core/random.cpp).
#include "core/kernels.h"
#include "core/random_math.h"
#include "core/unary_math.h"
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
      count_work(counter_cells().library_calls);
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
      count_work(counter_cells().library_calls);
      LINEA_CURAND_CHECK(generate_normal(g, dst, static_cast<size_t>(even), mean, std));
    }
    if (!direct) {
      count_work(counter_cells().device_copies);
      LINEA_CUDA_CHECK(
          cudaMemcpyAsync(out.data_ptr(), dst, sizeof(T) * static_cast<size_t>(n), cudaMemcpyDeviceToDevice, stream()));
    }
  });
}

// One thread per (row, counter block); row-major over blocks.
template <typename T>
__global__ void uniform_rows_kernel(T* p, int64_t rows, int64_t len, double lo, double hi, uint64_t seed, uint64_t draw,
                                    int64_t first_row, const uint64_t* draw_base) {
  if (draw_base) draw += *draw_base;
  constexpr int64_t per = linea::detail::uniforms_per_block<T>();
  const int64_t blocks = (len + per - 1) / per, total = rows * blocks;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / blocks, b = i % blocks;
    uint32_t w[4];
    linea::detail::example_block(seed, draw, first_row + r, b, w);
    for (int64_t j = 0; j < per && b * per + j < len; ++j)
      p[r * len + b * per + j] = linea::detail::uniform_from_block<T>(w, j, lo, hi);
  }
}

template <typename T>
__global__ void dropout_rows_kernel(const T* x, T* out, int64_t rows, int64_t len, T keep, T scale, uint64_t seed,
                                    uint64_t draw, int64_t first_row, const uint64_t* draw_base) {
  if (draw_base) draw += *draw_base;
  constexpr int64_t per = linea::detail::uniforms_per_block<T>();
  const int64_t blocks = (len + per - 1) / per, total = rows * blocks;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / blocks, b = i % blocks;
    uint32_t w[4];
    linea::detail::example_block(seed, draw, first_row + r, b, w);
    for (int64_t j = 0; j < per && b * per + j < len; ++j) {
      const int64_t e = r * len + b * per + j;
      out[e] = x[e] * linea::detail::dropout_factor<T>(w, j, keep, scale);
    }
  }
}

// dropout_rows_kernel with an activation before the mask (forward) or its derivative after it
// (backward, g given): the activation's output never goes to memory unmasked.
template <typename T>
__global__ void activation_dropout_kernel(UnaryOp op, const T* x, const T* g, T* out, int64_t rows, int64_t len, T keep,
                                          T scale, uint64_t seed, uint64_t draw, int64_t first_row,
                                          const uint64_t* draw_base) {
  if (draw_base) draw += *draw_base;
  constexpr int64_t per = linea::detail::uniforms_per_block<T>();
  const int64_t blocks = (len + per - 1) / per, total = rows * blocks;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / blocks, b = i % blocks;
    uint32_t w[4];
    linea::detail::example_block(seed, draw, first_row + r, b, w);
    for (int64_t j = 0; j < per && b * per + j < len; ++j) {
      const int64_t e = r * len + b * per + j;
      const T m = linea::detail::dropout_factor<T>(w, j, keep, scale);
      out[e] = g ? linea::detail::unary_backward_switch<T>(op, g[e] * m, x[e], x[e], T(0), T(0))
                 : linea::detail::unary_forward_switch<T>(op, x[e], T(0), T(0)) * m;
    }
  }
}

template <typename T>
__global__ void normal_rows_kernel(T* p, int64_t rows, int64_t len, double mean, double std, uint64_t seed,
                                   uint64_t draw, int64_t first_row, const uint64_t* draw_base) {
  if (draw_base) draw += *draw_base;
  const int64_t blocks = (len + 1) / 2, total = rows * blocks;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / blocks, b = i % blocks;
    uint32_t w[4];
    linea::detail::example_block(seed, draw, first_row + r, b, w);
    T x, y;
    linea::detail::normals_from_block<T>(w, mean, std, x, y);
    p[r * len + 2 * b] = x;
    if (2 * b + 1 < len) p[r * len + 2 * b + 1] = y;
  }
}

void uniform_rows(const Tensor& out, double lo, double hi, uint64_t seed, uint64_t draw, int64_t first_row,
                  const uint64_t* draw_base) {
  LINEA_CHECK(out.is_contiguous(), "uniform_rows: expected a contiguous output");
  const int64_t rows = out.size(0), len = out.numel() / std::max<int64_t>(rows, 1);
  if (out.numel() == 0) return;
  LINEA_DISPATCH_FLOAT(out.dtype(), "uniform_rows", [&] {
    using T = scalar_t;
    const int64_t per = linea::detail::uniforms_per_block<T>();
    uniform_rows_kernel<T><<<grid_for(rows * ((len + per - 1) / per)), kBlockSize, 0, stream()>>>(
        ptr<T>(out), rows, len, lo, hi, seed, draw, first_row, draw_base);
    LINEA_KERNEL_LAUNCH_CHECK();
  });
}

void normal_rows(const Tensor& out, double mean, double std, uint64_t seed, uint64_t draw, int64_t first_row,
                 const uint64_t* draw_base) {
  LINEA_CHECK(out.is_contiguous(), "normal_rows: expected a contiguous output");
  const int64_t rows = out.size(0), len = out.numel() / std::max<int64_t>(rows, 1);
  if (out.numel() == 0) return;
  LINEA_DISPATCH_FLOAT(out.dtype(), "normal_rows", [&] {
    using T = scalar_t;
    normal_rows_kernel<T><<<grid_for(rows * ((len + 1) / 2)), kBlockSize, 0, stream()>>>(
        ptr<T>(out), rows, len, mean, std, seed, draw, first_row, draw_base);
    LINEA_KERNEL_LAUNCH_CHECK();
  });
}

// x, out [rows, ...] contiguous
void dropout_rows(const Tensor& x, const Tensor& out, double p, uint64_t seed, uint64_t draw, int64_t first_row,
                  const uint64_t* draw_base) {
  const int64_t rows = out.size(0), len = out.numel() / std::max<int64_t>(rows, 1);
  if (out.numel() == 0) return;
  LINEA_DISPATCH_FLOAT(out.dtype(), "dropout_rows", [&] {
    using T = scalar_t;
    constexpr int64_t per = linea::detail::uniforms_per_block<T>();
    const int64_t total = rows * ((len + per - 1) / per);
    dropout_rows_kernel<T><<<grid_for(total), kBlockSize, 0, stream()>>>(
        cptr<T>(x), ptr<T>(out), rows, len, static_cast<T>(1.0 - p), static_cast<T>(1.0 / (1.0 - p)), seed, draw,
        first_row, draw_base);
    LINEA_KERNEL_LAUNCH_CHECK();
  });
}

// x, grad (or undefined), out [rows, ...] contiguous
void activation_dropout(UnaryOp op, const Tensor& x, const Tensor& grad, const FoldedDropout& drop, const Tensor& out) {
  const int64_t rows = out.size(0), len = out.numel() / std::max<int64_t>(rows, 1);
  if (out.numel() == 0) return;
  LINEA_DISPATCH_FLOAT(out.dtype(), "activation_dropout", [&] {
    using T = scalar_t;
    constexpr int64_t per = linea::detail::uniforms_per_block<T>();
    const int64_t total = rows * ((len + per - 1) / per);
    activation_dropout_kernel<T><<<grid_for(total), kBlockSize, 0, stream()>>>(
        op, cptr<T>(x), grad.defined() ? cptr<T>(grad) : nullptr, ptr<T>(out), rows, len, static_cast<T>(1.0 - drop.p),
        static_cast<T>(1.0 / (1.0 - drop.p)), drop.seed, drop.draw, drop.first_row, drop.draw_base);
    LINEA_KERNEL_LAUNCH_CHECK();
  });
}

}  // namespace linea::cuda
