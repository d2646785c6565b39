// Randomness: one seedable generator per device. Both are counter-based (Philox4x32-10:
// our own implementation on the CPU, cuRAND's on CUDA), so a generator's whole state is
// {seed, offset} and checkpoints can store and restore it exactly.
#pragma once

#include <cstdint>
#include <vector>

#include "core/tensor.h"

namespace linea {

enum class UnaryOp;  // core/kernels.h

// Seeds the default generator of every device (CPU, and CUDA when available).
void manual_seed(uint64_t seed);
// {seed, offset} of a device's default generator, and its restore.
std::vector<uint64_t> get_rng_state(Device device = kCPU);
void set_rng_state(const std::vector<uint64_t>& state, Device device = kCPU);

// Draws made while it lives leave no trace: the CPU generator's state, and `device`'s when it is
// CUDA, are restored when it goes out of scope (torch.random.fork_rng). For side work inside a run
// (an evaluation that samples, a speed probe) that must not shift the run's random stream.
class ForkRng {
 public:
  explicit ForkRng(Device device = kCPU);
  ~ForkRng();
  ForkRng(const ForkRng&) = delete;
  ForkRng& operator=(const ForkRng&) = delete;

 private:
  Device device_;
  std::vector<uint64_t> cpu_, dev_;
};

// Random tensors (no graph).
Tensor rand(const Shape& shape, TensorOptions opts = {});   // U[0, 1)
Tensor randn(const Shape& shape, TensorOptions opts = {});  // N(0, 1)
Tensor uniform(const Shape& shape, double lo, double hi, TensorOptions opts = {});
Tensor normal(const Shape& shape, double mean, double std, TensorOptions opts = {});
Tensor bernoulli(const Shape& shape, double p, TensorOptions opts = {});  // 1 with probability p, else 0
Tensor randint(int64_t low, int64_t high, const Shape& shape, Device device = kCPU);
Tensor randperm(int64_t n, Device device = kCPU);

// ---- per-example randomness ------------------------------------------------------------------
// Draws whose first dimension is the batch (dropout masks, attention samples) use these: the
// numbers of example i depend only on the generator's state and i's index in the whole batch,
// never on the other examples or on how many there are, and every such draw advances the
// generator by the same amount (one counter value) whatever its shape. Under data parallelism
// a rank that runs examples [first, first + B) of the batch does so inside a
// BatchRowsGuard(first): its examples get the numbers one process would draw for them, and the
// ranks' generators stay equal. Within an example, element e (row-major over the other
// dimensions) has its own numbers, so padding an example's trailing dimension keeps them where
// the layout keeps e. CPU and CUDA give the same numbers (same Philox counters).
Tensor uniform_per_example(const Shape& shape, double lo, double hi, TensorOptions opts = {});
Tensor normal_per_example(const Shape& shape, double mean, double std, TensorOptions opts = {});
Tensor bernoulli_per_example(const Shape& shape, double p, TensorOptions opts = {});

// One per-example draw reserved from the device's generator (each per-example draw above takes
// one), for a kernel that draws with it itself: dropout's mask, which its backward draws again
// instead of keeping it.
struct ExampleDraw {
  uint64_t seed = 0, draw = 0;
  int64_t first_row = 0;           // batch_first_row() when reserved
  const uint64_t* base = nullptr;  // in a captured CUDA graph: the counter is *base + draw
};
ExampleDraw reserve_example_draw(Device device);
// Per-example dropout of x [batch, ...] with draw d (no graph): x * m / (1 - p), m ~ Bernoulli(1 - p)
// per element, the numbers bernoulli_per_example(x.shape(), 1 - p) would have drawn with d. One
// kernel; applied to a gradient with the same d, the backward.
Tensor dropout_rows(const Tensor& x, double p, const ExampleDraw& d);
// dropout_rows(op(x), p, d) in one kernel, op an activation (GeluErf, GeluTanh or Relu); with grad
// defined, its backward op'(x) * dropout_rows(grad, p, d) instead.
Tensor activation_dropout(UnaryOp op, const Tensor& x, const Tensor& grad, double p, const ExampleDraw& d);

// The index in the whole batch of this thread's first example (0 outside any guard).
int64_t batch_first_row();
class BatchRowsGuard {
 public:
  explicit BatchRowsGuard(int64_t first_row);
  ~BatchRowsGuard();
  BatchRowsGuard(const BatchRowsGuard&) = delete;
  BatchRowsGuard& operator=(const BatchRowsGuard&) = delete;

 private:
  int64_t prev_;
};

namespace detail {
// A CUDA graph capture (core/cuda_graph.h) of work that draws per example: between begin and
// end, per-example draws on CUDA are numbered from 0 and read their base counter from `base`, a
// device counter each replay sets (so a replay draws new numbers, the ones an uncaptured run
// would); end returns how many were reserved. The host generator advances as usual.
void begin_draw_capture(const uint64_t* base);
int64_t end_draw_capture();
// The counter the next per-example draw on `device` gets; skipping k of them (what a replay
// of a step that reserved k consumes).
uint64_t next_example_draw(Device device);
void skip_example_draws(Device device, int64_t k);

// The CPU generator. Philox4x32-10: each 128-bit counter value gives four 32-bit words.
struct Philox {
  uint64_t seed = 0;
  uint64_t offset = 0;  // counter values consumed so far
  // Four random words for counter value `ctr` under `seed` (pure function).
  static void block(uint64_t seed, uint64_t ctr, uint32_t out[4]);
};
Philox& cpu_generator();
}  // namespace detail

}  // namespace linea
