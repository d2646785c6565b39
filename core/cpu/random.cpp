// CPU random fills from the Philox generator: uniform and normal (Box-Muller). Each counter
// value yields four 32-bit words; element blocks are independent, so filling is parallel and
// the result does not depend on the thread count.
#include <cmath>
#include <mutex>

#include "core/cpu/strided.h"
#include "core/kernels.h"
#include "core/random.h"
#include "core/random_math.h"

namespace linea::detail {
std::mutex& cpu_generator_mutex();
}

namespace linea::cpu {

namespace {
// Reserves `blocks` counter values and returns (seed, first counter).
std::pair<uint64_t, uint64_t> reserve(uint64_t blocks) {
  std::lock_guard<std::mutex> lock(linea::detail::cpu_generator_mutex());
  auto& g = linea::detail::cpu_generator();
  uint64_t first = g.offset;
  g.offset += blocks;
  return {g.seed, first};
}
using linea::detail::unit_double;
using linea::detail::unit_float;
}  // namespace

void uniform(const Tensor& out, double lo, double hi) {
  const int64_t n = out.numel();
  dispatch_float(out.dtype(), "uniform", [&](auto tag_) {
    using scalar_t = decltype(tag_);
    constexpr int64_t per = std::is_same_v<scalar_t, float> ? 4 : 2;  // values per counter block
    const int64_t blocks = (n + per - 1) / per;
    // Not a structured binding: clang < 16 cannot capture those in an OpenMP region (LINEA_FUZZ).
    const std::pair<uint64_t, uint64_t> drawn = reserve(static_cast<uint64_t>(blocks));
    const uint64_t seed = drawn.first, first = drawn.second;
    scalar_t* p = static_cast<scalar_t*>(out.data_ptr());
    const double span = hi - lo;
#pragma omp parallel for schedule(static) if (n >= detail::kParallelGrain)
    for (int64_t b = 0; b < blocks; ++b) {
      uint32_t w[4];
      linea::detail::Philox::block(seed, first + static_cast<uint64_t>(b), w);
      for (int64_t j = 0; j < per; ++j) {
        int64_t i = b * per + j;
        if (i >= n) break;
        double u;
        if constexpr (per == 4)
          u = unit_float(w[j]);
        else
          u = unit_double(w[2 * j], w[2 * j + 1]);
        scalar_t v = static_cast<scalar_t>(lo + span * u);
        p[i] = v < static_cast<scalar_t>(hi) || span == 0 ? v : static_cast<scalar_t>(lo);  // keep [lo, hi)
      }
    }
  });
}

void normal(const Tensor& out, double mean, double std) {
  const int64_t n = out.numel();
  dispatch_float(out.dtype(), "normal", [&](auto tag_) {
    using scalar_t = decltype(tag_);
    const int64_t blocks = (n + 1) / 2;  // one counter block -> two normals
    // Not a structured binding: clang < 16 cannot capture those in an OpenMP region (LINEA_FUZZ).
    const std::pair<uint64_t, uint64_t> drawn = reserve(static_cast<uint64_t>(blocks));
    const uint64_t seed = drawn.first, first = drawn.second;
    scalar_t* p = static_cast<scalar_t*>(out.data_ptr());
#pragma omp parallel for schedule(static) if (n >= detail::kParallelGrain)
    for (int64_t b = 0; b < blocks; ++b) {
      uint32_t w[4];
      linea::detail::Philox::block(seed, first + static_cast<uint64_t>(b), w);
      double u1 = 1.0 - unit_double(w[0], w[1]);  // (0, 1]: log is finite
      double u2 = unit_double(w[2], w[3]);
      double rad = std::sqrt(-2.0 * std::log(u1));
      double th = 6.283185307179586 * u2;
      p[2 * b] = static_cast<scalar_t>(mean + std * rad * std::cos(th));
      if (2 * b + 1 < n) p[2 * b + 1] = static_cast<scalar_t>(mean + std * rad * std::sin(th));
    }
  });
}

// Per-example draws: a loop over (row, block) pairs, each block giving its values at once.
void uniform_rows(const Tensor& out, double lo, double hi, uint64_t seed, uint64_t draw, int64_t first_row,
                  const uint64_t* draw_base) {
  LINEA_CHECK(draw_base == nullptr, "per-example draw: a device base counter on the CPU");
  const int64_t rows = out.size(0), len = out.numel() / std::max<int64_t>(rows, 1);
  dispatch_float(out.dtype(), "uniform_rows", [&](auto tag_) {
    using scalar_t = decltype(tag_);
    constexpr int64_t per = linea::detail::uniforms_per_block<scalar_t>();
    const int64_t blocks = (len + per - 1) / per;
    scalar_t* p = static_cast<scalar_t*>(out.data_ptr());
#pragma omp parallel for collapse(2) schedule(static) if (out.numel() >= detail::kParallelGrain)
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t b = 0; b < blocks; ++b) {
        uint32_t w[4];
        linea::detail::example_block(seed, draw, first_row + r, b, w);
        for (int64_t j = 0; j < per && b * per + j < len; ++j)
          p[r * len + b * per + j] = linea::detail::uniform_from_block<scalar_t>(w, j, lo, hi);
      }
  });
}

void dropout_rows(const Tensor& x, const Tensor& out, double p, uint64_t seed, uint64_t draw, int64_t first_row,
                  const uint64_t* draw_base) {
  LINEA_CHECK(draw_base == nullptr, "per-example draw: a device base counter on the CPU");
  const int64_t rows = out.size(0), len = out.numel() / std::max<int64_t>(rows, 1);
  dispatch_float(out.dtype(), "dropout_rows", [&](auto tag_) {
    using scalar_t = decltype(tag_);
    constexpr int64_t per = linea::detail::uniforms_per_block<scalar_t>();
    const int64_t blocks = (len + per - 1) / per;
    const scalar_t keep = static_cast<scalar_t>(1.0 - p), scale = static_cast<scalar_t>(1.0 / (1.0 - p));
    const scalar_t* px = static_cast<const scalar_t*>(x.data_ptr());
    scalar_t* po = static_cast<scalar_t*>(out.data_ptr());
#pragma omp parallel for collapse(2) schedule(static) if (out.numel() >= detail::kParallelGrain)
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t b = 0; b < blocks; ++b) {
        uint32_t w[4];
        linea::detail::example_block(seed, draw, first_row + r, b, w);
        for (int64_t j = 0; j < per && b * per + j < len; ++j) {
          const int64_t e = r * len + b * per + j;
          po[e] = px[e] * linea::detail::dropout_factor<scalar_t>(w, j, keep, scale);
        }
      }
  });
}

// The two ops one after the other (the activation's vectorized float32 math, the same bits as
// running them unfused); a pass each over memory the caches mostly hold.
void activation_dropout(UnaryOp op, const Tensor& x, const Tensor& grad, const FoldedDropout& drop, const Tensor& out) {
  if (!grad.defined()) {
    unary(op, x, out, 0.0, 0.0);
    dropout_rows(out, out, drop.p, drop.seed, drop.draw, drop.first_row, drop.draw_base);
  } else {
    dropout_rows(grad, out, drop.p, drop.seed, drop.draw, drop.first_row, drop.draw_base);
    unary_backward(op, out, x, x, out, 0.0, 0.0);  // these ops' derivatives read x only
  }
}

void normal_rows(const Tensor& out, double mean, double std, uint64_t seed, uint64_t draw, int64_t first_row,
                 const uint64_t* draw_base) {
  LINEA_CHECK(draw_base == nullptr, "per-example draw: a device base counter on the CPU");
  const int64_t rows = out.size(0), len = out.numel() / std::max<int64_t>(rows, 1);
  dispatch_float(out.dtype(), "normal_rows", [&](auto tag_) {
    using scalar_t = decltype(tag_);
    const int64_t blocks = (len + 1) / 2;
    scalar_t* p = static_cast<scalar_t*>(out.data_ptr());
#pragma omp parallel for collapse(2) schedule(static) if (out.numel() >= detail::kParallelGrain)
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t b = 0; b < blocks; ++b) {
        uint32_t w[4];
        linea::detail::example_block(seed, draw, first_row + r, b, w);
        scalar_t x, y;
        linea::detail::normals_from_block<scalar_t>(w, mean, std, x, y);
        p[r * len + 2 * b] = x;
        if (2 * b + 1 < len) p[r * len + 2 * b + 1] = y;
      }
  });
}

}  // namespace linea::cpu
