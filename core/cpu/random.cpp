// CPU random fills from the Philox generator: uniform and normal (Box-Muller). Each counter
// value yields four 32-bit words; element blocks are independent, so filling is parallel and
// the result does not depend on the thread count.
#include <cmath>
#include <mutex>

#include "core/cpu/strided.h"
#include "core/kernels.h"
#include "core/random.h"

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
// [0, 1) with 24 (float) or 53 (double) random bits.
inline float unit_float(uint32_t w) { return static_cast<float>(w >> 8) * (1.0f / 16777216.0f); }
inline double unit_double(uint32_t a, uint32_t b) {
  uint64_t bits = (static_cast<uint64_t>(a) << 21) ^ (b >> 11);
  return static_cast<double>(bits & ((uint64_t(1) << 53) - 1)) * (1.0 / 9007199254740992.0);
}
}  // namespace

void uniform(const Tensor& out, double lo, double hi) {
  const int64_t n = out.numel();
  dispatch_float(out.dtype(), "uniform", [&](auto tag_) {
    using scalar_t = decltype(tag_);
    constexpr int64_t per = std::is_same_v<scalar_t, float> ? 4 : 2;  // values per counter block
    const int64_t blocks = (n + per - 1) / per;
    auto [seed, first] = reserve(static_cast<uint64_t>(blocks));
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
    auto [seed, first] = reserve(static_cast<uint64_t>(blocks));
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

}  // namespace linea::cpu
