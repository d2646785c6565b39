// Default generators and random tensor creation. The CPU generator is Philox4x32-10
// (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC'11), written from the
// paper's description: counter-based, so element i of a draw depends only on (seed, offset, i)
// and large tensors fill in parallel.
#include "core/random.h"

#include <algorithm>
#include <cmath>
#include <mutex>
#include <numeric>

#include "core/cuda_interface.h"
#include "core/dispatch.h"
#include "core/ops.h"

namespace linea {

namespace detail {

void Philox::block(uint64_t seed, uint64_t ctr, uint32_t out[4]) {
  uint32_t k0 = static_cast<uint32_t>(seed), k1 = static_cast<uint32_t>(seed >> 32);
  uint32_t c0 = static_cast<uint32_t>(ctr), c1 = static_cast<uint32_t>(ctr >> 32), c2 = 0, c3 = 0;
  for (int round = 0; round < 10; ++round) {
    uint64_t p0 = uint64_t(0xD2511F53u) * c0;
    uint64_t p1 = uint64_t(0xCD9E8D57u) * c2;
    uint32_t hi0 = static_cast<uint32_t>(p0 >> 32), lo0 = static_cast<uint32_t>(p0);
    uint32_t hi1 = static_cast<uint32_t>(p1 >> 32), lo1 = static_cast<uint32_t>(p1);
    c0 = hi1 ^ c1 ^ k0;
    c1 = lo1;
    c2 = hi0 ^ c3 ^ k1;
    c3 = lo0;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  out[0] = c0;
  out[1] = c1;
  out[2] = c2;
  out[3] = c3;
}

Philox& cpu_generator() {
  static Philox g{5489u, 0};
  return g;
}

std::mutex& cpu_generator_mutex() {
  static std::mutex m;
  return m;
}

}  // namespace detail

void manual_seed(uint64_t seed) {
  {
    std::lock_guard<std::mutex> lock(detail::cpu_generator_mutex());
    detail::cpu_generator() = detail::Philox{seed, 0};
  }
#ifdef LINEA_WITH_CUDA
  if (cuda_available()) cuda::manual_seed(seed);
#endif
}

std::vector<uint64_t> get_rng_state(Device device) {
  if (device.is_cpu()) {
    std::lock_guard<std::mutex> lock(detail::cpu_generator_mutex());
    return {detail::cpu_generator().seed, detail::cpu_generator().offset};
  }
#ifdef LINEA_WITH_CUDA
  LINEA_CHECK(cuda_available(), "get_rng_state: no CUDA device is available");
  return cuda::rng_state();
#else
  LINEA_FAIL("get_rng_state: this build of Linea has no CUDA backend");
#endif
}

void set_rng_state(const std::vector<uint64_t>& state, Device device) {
  LINEA_CHECK(state.size() == 2, "set_rng_state: expected {seed, offset}, got ", state.size(), " values");
  if (device.is_cpu()) {
    std::lock_guard<std::mutex> lock(detail::cpu_generator_mutex());
    detail::cpu_generator() = detail::Philox{state[0], state[1]};
    return;
  }
#ifdef LINEA_WITH_CUDA
  LINEA_CHECK(cuda_available(), "set_rng_state: no CUDA device is available");
  cuda::set_rng_state(state);
#else
  LINEA_FAIL("set_rng_state: this build of Linea has no CUDA backend");
#endif
}

namespace raw {

Tensor uniform(const Shape& shape, double lo, double hi, TensorOptions opts) {
  LINEA_CHECK(is_floating(opts.dtype), "uniform: expected a floating dtype, got ", opts.dtype);
  LINEA_CHECK(std::isfinite(lo) && std::isfinite(hi) && lo <= hi, "uniform: invalid range [", lo, ", ", hi, ")");
  Tensor out = empty(shape, opts.with_requires_grad(false));
  if (out.numel() > 0) LINEA_BACKEND(out.device(), uniform, out, lo, hi);
  return out;
}

Tensor normal(const Shape& shape, double mean, double std, TensorOptions opts) {
  LINEA_CHECK(is_floating(opts.dtype), "normal: expected a floating dtype, got ", opts.dtype);
  LINEA_CHECK(std::isfinite(mean) && std::isfinite(std) && std >= 0, "normal: invalid mean ", mean, " / std ", std);
  Tensor out = empty(shape, opts.with_requires_grad(false));
  if (out.numel() > 0) LINEA_BACKEND(out.device(), normal, out, mean, std);
  return out;
}

Tensor bernoulli(const Shape& shape, double p, TensorOptions opts) {
  LINEA_CHECK(p >= 0 && p <= 1, "bernoulli: probability ", p, " is outside [0, 1]");
  Tensor u =
      raw::uniform(shape, 0.0, 1.0, TensorOptions(is_floating(opts.dtype) ? opts.dtype : DType::Float64, opts.device));
  Tensor mask = raw::binary(BinaryOp::Lt, u, scalar_tensor(p, u.options()));
  return raw::to_dtype(mask, opts.dtype);
}

Tensor randint(int64_t low, int64_t high, const Shape& shape, Device device) {
  LINEA_CHECK(low < high, "randint: empty range [", low, ", ", high, ")");
  // Uniform doubles in [0, high - low), truncated, then shifted: exact for ranges below 2^52.
  Tensor u = raw::uniform(shape, 0.0, static_cast<double>(high - low), TensorOptions(DType::Float64, device));
  Tensor r = raw::to_dtype(u, DType::Int64);
  // Guard the (measure-zero) rounding of a value to high - low.
  r = raw::unary(UnaryOp::Clamp, r, 0.0, static_cast<double>(high - low - 1));
  return low == 0 ? r : raw::unary(UnaryOp::AddScalar, r, static_cast<double>(low));
}

Tensor randperm(int64_t n, Device device) {
  LINEA_CHECK(n >= 0, "randperm: negative n ", n);
  // Random keys from the device's generator, sorted on the host: a permutation whose
  // randomness comes from (and advances) that device's generator.
  Tensor keys = raw::uniform({n}, 0.0, 1.0, TensorOptions(DType::Float64, device));
  std::vector<double> k = keys.to_vector<double>();
  std::vector<int64_t> idx(static_cast<size_t>(n));
  std::iota(idx.begin(), idx.end(), 0);
  std::stable_sort(idx.begin(), idx.end(), [&](int64_t a, int64_t b) { return k[a] < k[b]; });
  return from_vector<int64_t>(idx, {n}, TensorOptions(DType::Int64, device));
}

}  // namespace raw

Tensor rand(const Shape& shape, TensorOptions opts) { return uniform(shape, 0.0, 1.0, opts); }
Tensor randn(const Shape& shape, TensorOptions opts) { return normal(shape, 0.0, 1.0, opts); }

Tensor uniform(const Shape& shape, double lo, double hi, TensorOptions opts) {
  Tensor t = raw::uniform(shape, lo, hi, opts);
  if (opts.requires_grad) t.requires_grad_(true);
  return t;
}
Tensor normal(const Shape& shape, double mean, double std, TensorOptions opts) {
  Tensor t = raw::normal(shape, mean, std, opts);
  if (opts.requires_grad) t.requires_grad_(true);
  return t;
}
Tensor bernoulli(const Shape& shape, double p, TensorOptions opts) { return raw::bernoulli(shape, p, opts); }
Tensor randint(int64_t low, int64_t high, const Shape& shape, Device device) {
  return raw::randint(low, high, shape, device);
}
Tensor randperm(int64_t n, Device device) { return raw::randperm(n, device); }

}  // namespace linea
