// Philox4x32-10 (Salmon et al., SC'11) and the maps from its words to numbers, written once for
// the CPU generator (core/random.cpp, core/cpu/random.cpp) and the per-example draws' CUDA kernel
// (cuda/random.cu), so both devices give the same per-example numbers.
#pragma once

#include <cmath>
#include <cstdint>

#include "core/host_device.h"

namespace linea::detail {

// Ten rounds on the 128-bit counter c under the 64-bit key (k0, k1); c is replaced by the output.
LINEA_HD void philox4x32_10(uint32_t k0, uint32_t k1, uint32_t c[4]) {
  uint32_t c0 = c[0], c1 = c[1], c2 = c[2], c3 = c[3];
  for (int round = 0; round < 10; ++round) {
    const uint64_t p0 = uint64_t(0xD2511F53u) * c0;
    const uint64_t p1 = uint64_t(0xCD9E8D57u) * c2;
    const uint32_t hi0 = static_cast<uint32_t>(p0 >> 32), lo0 = static_cast<uint32_t>(p0);
    const uint32_t hi1 = static_cast<uint32_t>(p1 >> 32), lo1 = static_cast<uint32_t>(p1);
    c0 = hi1 ^ c1 ^ k0;
    c1 = lo1;
    c2 = hi0 ^ c3 ^ k1;
    c3 = lo0;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  c[0] = c0;
  c[1] = c1;
  c[2] = c2;
  c[3] = c3;
}

// [0, 1) with 24 (float) or 53 (double) random bits.
LINEA_HD float unit_float(uint32_t w) { return static_cast<float>(w >> 8) * (1.0f / 16777216.0f); }
LINEA_HD double unit_double(uint32_t a, uint32_t b) {
  const uint64_t bits = (static_cast<uint64_t>(a) << 21) ^ (b >> 11);
  return static_cast<double>(bits & ((uint64_t(1) << 53) - 1)) * (1.0 / 9007199254740992.0);
}

// Per-example draws (core/random.h): element e of example `row` (its index in the whole batch)
// in the draw reserved at generator offset `draw`, from the counter {draw (64 bits), block of e
// within the row, row + 1}. The generator's own stream uses counters {offset, 0, 0}, so the two
// never meet. Uniform: 4 (float) or 2 (double) values per block; normal: 2 per block
// (Box-Muller on two 53-bit uniforms), as the generator's plain draws.
LINEA_HD void example_block(uint64_t seed, uint64_t draw, int64_t row, int64_t block, uint32_t w[4]) {
  w[0] = static_cast<uint32_t>(draw);
  w[1] = static_cast<uint32_t>(draw >> 32);
  w[2] = static_cast<uint32_t>(block);
  w[3] = static_cast<uint32_t>(row + 1);
  philox4x32_10(static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32), w);
}

// lo + span * u rounded as the CPU rounds it: the product, then the sum. nvcc would fuse the two
// into one fma (one rounding), and the GPU's numbers would differ from the CPU's in the last bit
// (seen on an H100). The x86-64 CPU build has no fma to fuse into.
LINEA_HD double add_product_unfused(double lo, double span, double u) {
#ifdef __CUDA_ARCH__
  return __dadd_rn(lo, __dmul_rn(span, u));
#else
  return lo + span * u;
#endif
}

// Value j of a uniform block (j < 4 for float, < 2 for double), in [lo, hi).
template <typename T> LINEA_HD T uniform_from_block(const uint32_t w[4], int64_t j, double lo, double hi) {
  const double u = sizeof(T) == 4 ? static_cast<double>(unit_float(w[j])) : unit_double(w[2 * j], w[2 * j + 1]);
  const double span = hi - lo;
  const T v = static_cast<T>(add_product_unfused(lo, span, u));
  return v < static_cast<T>(hi) || span == 0 ? v : static_cast<T>(lo);  // keep [lo, hi)
}
template <typename T> constexpr int64_t uniforms_per_block() { return sizeof(T) == 4 ? 4 : 2; }

// The two normals of a block (Box-Muller).
template <typename T> LINEA_HD void normals_from_block(const uint32_t w[4], double mean, double std, T& a, T& b) {
  const double u1 = 1.0 - unit_double(w[0], w[1]);  // (0, 1]: log is finite
  const double u2 = unit_double(w[2], w[3]);
  const double rad = std::sqrt(-2.0 * std::log(u1)), th = 6.283185307179586 * u2;
  a = static_cast<T>(mean + std * rad * std::cos(th));
  b = static_cast<T>(mean + std * rad * std::sin(th));
}

// Dropout's multiplier for element j of a uniform block: the per-example uniform u in [0, 1)
// kept when u < T(1 - p), as the composed bernoulli_per_example(1 - p) * (1 / (1 - p)) is.
template <typename T> LINEA_HD T dropout_factor(const uint32_t w[4], int64_t j, T keep, T scale) {
  return uniform_from_block<T>(w, j, 0.0, 1.0) < keep ? scale : T(0);
}

// dropout_rows's mask one element at a time: the factor of element j of example `row` (its index
// within the call's rows; first_row is added), one Philox block per call. For kernels that drop
// what they compute rather than a tensor (fused softmax attention's probabilities).
template <typename T> struct ExampleDropout {
  bool on = false;
  T keep = 1, scale = 1;
  uint64_t seed = 0, draw = 0;
  int64_t first_row = 0;
  LINEA_HD T factor(int64_t row, int64_t j) const {
    constexpr int64_t per = uniforms_per_block<T>();
    uint32_t w[4];
    example_block(seed, draw, first_row + row, j / per, w);
    return dropout_factor<T>(w, j % per, keep, scale);
  }
};

}  // namespace linea::detail
