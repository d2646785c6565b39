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
#include "core/random_math.h"

namespace linea {

namespace detail {

void Philox::block(uint64_t seed, uint64_t ctr, uint32_t out[4]) {
  out[0] = static_cast<uint32_t>(ctr);
  out[1] = static_cast<uint32_t>(ctr >> 32);
  out[2] = out[3] = 0;
  philox4x32_10(static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32), out);
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

ForkRng::ForkRng(Device device)
    : device_(device),
      cpu_(get_rng_state(kCPU)),
      dev_(device.is_cuda() ? get_rng_state(device) : std::vector<uint64_t>{}) {}

// Restoring sets host-side {seed, offset} pairs of the right size: nothing here can throw.
ForkRng::~ForkRng() {
  set_rng_state(cpu_, kCPU);
  if (device_.is_cuda()) set_rng_state(dev_, device_);
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

// ---- per-example draws ----
namespace {
thread_local int64_t t_first_row = 0;

// {seed, draw}: one counter value reserved from the device's generator.
std::pair<uint64_t, uint64_t> reserve_draw(Device device) {
  if (device.is_cpu()) {
    std::lock_guard<std::mutex> lock(detail::cpu_generator_mutex());
    auto& g = detail::cpu_generator();
    return {g.seed, g.offset++};
  }
#ifdef LINEA_WITH_CUDA
  // The CUDA generator's offset counts 32-bit words, in steps of 4 (one counter value): the
  // draw's counter is offset / 4, as the CPU's is its offset, so the devices agree.
  std::vector<uint64_t> st = cuda::rng_state();
  const uint64_t draw = (st[1] + 3) / 4;
  cuda::set_rng_state({st[0], 4 * (draw + 1)});
  return {st[0], draw};
#else
  LINEA_FAIL("random: this build of Linea has no CUDA backend");
#endif
}

// A CUDA graph capture's per-example draws (detail::begin_draw_capture).
struct DrawCapture {
  bool on = false;
  const uint64_t* base = nullptr;
  int64_t count = 0;
};
DrawCapture g_draw_capture;

Tensor per_example(const char* what, const Shape& shape, TensorOptions opts, bool normal, double a, double b) {
  LINEA_CHECK(is_floating(opts.dtype), what, ": expected a floating dtype, got ", opts.dtype);
  LINEA_CHECK(!shape.empty(), what, ": the first dimension is the batch; got a 0-d shape");
  Tensor out = empty(shape, opts.with_requires_grad(false));
  // Even for an empty draw: the same advance on every rank.
  const ExampleDraw d = reserve_example_draw(opts.device);
  if (out.numel() == 0) return out;
  if (normal)
    LINEA_BACKEND(out.device(), normal_rows, out, a, b, d.seed, d.draw, d.first_row, d.base);
  else
    LINEA_BACKEND(out.device(), uniform_rows, out, a, b, d.seed, d.draw, d.first_row, d.base);
  return out;
}
}  // namespace

namespace detail {
void begin_draw_capture(const uint64_t* base) {
  LINEA_CHECK(!g_draw_capture.on, "random: a draw capture is already on");
  g_draw_capture = DrawCapture{true, base, 0};
}
int64_t end_draw_capture() {
  const int64_t n = g_draw_capture.count;
  g_draw_capture = DrawCapture{};
  return n;
}
uint64_t next_example_draw(Device device) {
  if (device.is_cpu()) {
    std::lock_guard<std::mutex> lock(cpu_generator_mutex());
    return cpu_generator().offset;
  }
#ifdef LINEA_WITH_CUDA
  return (cuda::rng_state()[1] + 3) / 4;
#else
  LINEA_FAIL("random: this build of Linea has no CUDA backend");
#endif
}
void skip_example_draws(Device device, int64_t k) {
  for (int64_t i = 0; i < k; ++i) reserve_draw(device);
}
}  // namespace detail

ExampleDraw reserve_example_draw(Device device) {
  auto [seed, draw] = reserve_draw(device);
  if (g_draw_capture.on && device.is_cuda())  // numbered within the captured work
    return {seed, static_cast<uint64_t>(g_draw_capture.count++), t_first_row, g_draw_capture.base};
  return {seed, draw, t_first_row, nullptr};
}

Tensor dropout_rows(const Tensor& x, double p, const ExampleDraw& d) {
  raw::check_defined("dropout", x, "x");
  LINEA_CHECK(is_floating(x.dtype()), "dropout: expected a float32 or float64 input, got ", x.dtype());
  LINEA_CHECK(x.dim() >= 1, "dropout: the first dimension is the batch; got a 0-d tensor");
  LINEA_CHECK(p >= 0.0 && p <= 1.0, "dropout: probability p must be in [0, 1], got ", p);
  Tensor out = empty(x.shape(), x.options());
  if (out.numel() > 0)
    LINEA_BACKEND(x.device(), dropout_rows, raw::contiguous(x), out, p, d.seed, d.draw, d.first_row, d.base);
  return out;
}

Tensor activation_dropout(UnaryOp op, const Tensor& x, const Tensor& grad, double p, const ExampleDraw& d) {
  const char* what = grad.defined() ? "activation_dropout backward" : "activation_dropout";
  raw::check_defined(what, x, "x");
  LINEA_CHECK(op == UnaryOp::GeluErf || op == UnaryOp::GeluTanh || op == UnaryOp::Relu, what,
              ": the activation must be gelu, gelu(tanh) or relu, got ", unary_op_name(op));
  LINEA_CHECK(is_floating(x.dtype()), what, ": expected a float32 or float64 input, got ", x.dtype());
  LINEA_CHECK(x.dim() >= 1, what, ": the first dimension is the batch; got a 0-d tensor");
  LINEA_CHECK(p >= 0.0 && p <= 1.0, what, ": probability p must be in [0, 1], got ", p);
  if (grad.defined()) {
    raw::check_same_device(what, x, grad);
    raw::check_same_dtype(what, x, grad);
    LINEA_CHECK(grad.shape() == x.shape(), what, ": grad ", shape_str(grad.shape()), " and x ", shape_str(x.shape()),
                " differ in shape");
  }
  Tensor out = empty(x.shape(), x.options());
  if (out.numel() > 0)
    LINEA_BACKEND(x.device(), activation_dropout, op, raw::contiguous(x),
                  grad.defined() ? raw::contiguous(grad) : Tensor(),
                  FoldedDropout{p, d.seed, d.draw, d.first_row, d.base}, out);
  return out;
}

int64_t batch_first_row() { return t_first_row; }
BatchRowsGuard::BatchRowsGuard(int64_t first_row) : prev_(t_first_row) {
  LINEA_CHECK(first_row >= 0, "BatchRowsGuard: negative first row ", first_row);
  t_first_row = first_row;
}
BatchRowsGuard::~BatchRowsGuard() { t_first_row = prev_; }

Tensor uniform_per_example(const Shape& shape, double lo, double hi, TensorOptions opts) {
  LINEA_CHECK(std::isfinite(lo) && std::isfinite(hi) && lo <= hi, "uniform_per_example: invalid range [", lo, ", ", hi,
              ")");
  return per_example("uniform_per_example", shape, opts, false, lo, hi);
}
Tensor normal_per_example(const Shape& shape, double mean, double std, TensorOptions opts) {
  LINEA_CHECK(std::isfinite(mean) && std::isfinite(std) && std >= 0, "normal_per_example: invalid mean ", mean,
              " / std ", std);
  return per_example("normal_per_example", shape, opts, true, mean, std);
}
Tensor bernoulli_per_example(const Shape& shape, double p, TensorOptions opts) {
  LINEA_CHECK(p >= 0 && p <= 1, "bernoulli_per_example: probability ", p, " is outside [0, 1]");
  Tensor u =
      per_example("bernoulli_per_example", shape,
                  TensorOptions(is_floating(opts.dtype) ? opts.dtype : DType::Float64, opts.device), false, 0.0, 1.0);
  return raw::to_dtype(raw::binary(BinaryOp::Lt, u, scalar_tensor(p, u.options())), opts.dtype);
}

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
