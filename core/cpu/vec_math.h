// Branch-free float32 exp, erf and the GELU / sigmoid formulas built on them, for the CPU
// kernels' float32 paths. Plain inline arithmetic and bit moves only (no libm calls, no
// branches: both sides of a select are computed), so that a `#pragma omp simd` loop over them
// vectorizes with the default x86-64 target (SSE2), and for AVX2 where the kernel function is
// marked LINEA_VEC_CLONES.
// Accuracy (measured by tests/test_vec_math.cpp against double std::exp/std::erf):
//   exp: 1.02 ulp on the whole float range, subnormal results included; +inf, 0, NaN as IEEE.
//   erf: absolute error 1.3e-7 on all x, saturating to +-1; normal_cdf keeps relative accuracy
//        in its lower tail (it never forms 1 + erf(z) for z < -1).
// Not here: float64 (the double paths keep std::exp/std::erf: gradchecks run in float64), tanh
// on its own, and anything the CUDA kernels use (those share core/unary_math.h).
// Coefficients were fitted for this file (mpmath Chebyshev fits, see the comment at each).
#pragma once

#include <cstdint>
#include <cstring>

// LINEA_VEC_CLONES on a function holding a loop over these: GCC compiles it for AVX2 as well as
// for the default x86-64 target and picks one at load time (target_clones, an ifunc): twice the
// vector width (the speed-up: apps/bench/README.md). AVX2 without FMA, so both versions do the same IEEE
// operations and elementwise results are identical bits (a vectorized sum's order still
// depends on the width).
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && !defined(__AVX2__)
#define LINEA_VEC_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define LINEA_VEC_CLONES
#endif

namespace linea::cpu::vm {

inline float bits_to_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}
inline uint32_t float_to_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}
// c ? a : b as a bit blend of two computed values. A plain ?: between computed values is not
// vectorized by GCC under -ftrapping-math (its default): it sinks the float ops into branches
// and then may not speculate them.
inline float select(bool c, float a, float b) {
  const uint32_t m = 0u - static_cast<uint32_t>(c);
  return bits_to_float((float_to_bits(a) & m) | (float_to_bits(b) & ~m));
}

// exp(x) = 2^n * e^r, n = round(x / ln2), r = x - n ln2 in [-ln2/2, ln2/2].
inline float exp(float x) {
  // Clamp so n stays in [-150, 128]: exp(89) overflows to +inf, exp(-104) rounds to 0.
  // Selects on `x > c`, so that NaN (every comparison false) passes through.
  const bool zero = x < -103.98f;  // e^x < 2^-150: rounds to 0
  x = select(x > 89.0f, 89.0f, x);
  x = select(x < -104.0f, -104.0f, x);
  // Adding 1.5 * 2^23 rounds x/ln2 to an integer held in the low mantissa bits of t
  // (no float->int conversion, which is undefined for NaN).
  constexpr float kShift = 12582912.0f;
  const float t = x * 1.44269504088896341f + kShift;
  const float n = t - kShift;
  // Cody-Waite: ln2_hi has 15 significant bits, so n * ln2_hi and x - n * ln2_hi are exact.
  float r = x - n * 0.693145751953125f;
  r = r - n * 1.42860676533018704e-06f;
  // e^r = 1 + r + r^2 q(r), q fitted on [-0.35, 0.35] (degree 6 in all; e^r rel. error 8e-9).
  float q = 1.392692661e-3f;
  q = q * r + 8.363773874e-3f;
  q = q * r + 4.166655011e-2f;
  q = q * r + 1.666657338e-1f;
  q = q * r + 0.5f;
  const float p = 1.0f + (r + (r * r) * q);
  // 2^n as two factors 2^n1 * 2^n2, each a normal float, so subnormal results round once and
  // n = 128 gives +inf. (Garbage for NaN input, but p is NaN then.) Below -103.98 the second
  // factor is 0: a product that underflows costs a microcode assist (~100 cycles) on x86, and
  // masked attention logits (-inf, -FLT_MAX/2) land here by the thousand.
  const int32_t ni = static_cast<int32_t>(float_to_bits(t) - float_to_bits(kShift));
  const int32_t n1 = ni >> 1;  // arithmetic shift: floor(n / 2)
  const int32_t n2 = ni - n1;
  const float s1 = bits_to_float(static_cast<uint32_t>(n1 + 127) << 23);
  const float s2 = select(zero, 0.0f, bits_to_float(static_cast<uint32_t>(n2 + 127) << 23));
  return p * s1 * s2;
}

namespace detail {
// erf(x) / x as a polynomial in s = x^2 on [0, 1] (Chebyshev fit; erf abs. error 4e-8).
inline float erf_small(float s) {
  float p = -5.648059866e-4f;
  p = p * s + 4.921762028e-3f;
  p = p * s - 2.671505423e-2f;
  p = p * s + 1.128031665e-1f;
  p = p * s - 3.761234378e-1f;
  p = p * s + 1.128379126f;
  return p;
}
// For a >= 1: erfc(a) = exp(-a^2) * t * R(t), t = 2 / (2 + a) in (0, 2/3]; R fitted on the
// whole of (0, 2/3], i.e. a in [1, inf) (Chebyshev fit; relative error of erfc 1.8e-7).
inline float erfc_tail_r(float t) {
  float p = 9.393350389e-2f;
  p = p * t - 2.282789668e-1f;
  p = p * t + 8.602063775e-2f;
  p = p * t + 5.778386709e-2f;
  p = p * t + 1.804010966e-1f;
  p = p * t + 2.465099003e-1f;
  p = p * t + 2.821047390e-1f;
  p = p * t + 2.820947402e-1f;
  return p;
}
inline float abs(float x) { return bits_to_float(float_to_bits(x) & 0x7fffffffu); }
}  // namespace detail

inline float erf(float x) {
  const float a = detail::abs(x), s = x * x;
  const float small = x * detail::erf_small(s);
  const float t = 2.0f / (2.0f + a);
  const float big = 1.0f - vm::exp(-s) * t * detail::erfc_tail_r(t);  // erf(|x|); NaN stays NaN
  return select(a < 1.0f, small, select(x < 0.0f, -big, big));
}

constexpr float kInvSqrt2 = 0.70710678118654752f;
constexpr float kInvSqrt2Pi = 0.39894228040143268f;  // 1/sqrt(2 pi)

// Phi(x) = (1 + erf(x / sqrt2)) / 2, and e = exp(-x^2 / 2) (the pdf's exponential) on the side.
inline float normal_cdf(float x, float& e) {
  const float z = x * kInvSqrt2, a = detail::abs(z), s = z * z;
  e = vm::exp(-s);
  const float small = 0.5f + 0.5f * (z * detail::erf_small(s));
  const float t = 2.0f / (2.0f + a);
  const float tail = 0.5f * (e * t * detail::erfc_tail_r(t));  // Phi(-|x|)
  return select(a < 1.0f, small, select(z < 0.0f, tail, 1.0f - tail));
}

// GELU (erf form) x Phi(x) and its derivative Phi(x) + x phi(x).
inline float gelu_erf(float x) {
  float e;
  return x * normal_cdf(x, e);
}
inline float gelu_erf_grad(float x) {
  float e;
  const float cdf = normal_cdf(x, e);
  return cdf + x * (kInvSqrt2Pi * e);
}

// Logistic sigmoid s = 1 / (1 + e^-v) and s (1 - s), from e = exp(-|v|) so that neither
// overflows nor cancels: s = 1/(1+e) for v >= 0, e/(1+e) for v < 0, and s (1 - s) = e/(1+e)^2.
inline float sigmoid_parts(float v, float& s_oms) {
  const float e = vm::exp(-detail::abs(v));
  const float d = 1.0f / (1.0f + e);
  s_oms = e * d * d;
  return select(v < 0.0f, e * d, d);
}
inline float sigmoid(float v) {
  float unused;
  return sigmoid_parts(v, unused);
}

// GELU (tanh form) 0.5 x (1 + tanh(u)) = x sigmoid(2u), u = sqrt(2/pi) (x + 0.044715 x^3),
// and its derivative s + 2 x s (1 - s) u' with s = sigmoid(2u).
constexpr float kSqrt2OverPi = 0.79788456080286536f;
constexpr float kGeluC = 0.044715f;
inline float gelu_tanh(float x) {
  const float u = kSqrt2OverPi * (x + kGeluC * x * x * x);
  return x * sigmoid(2.0f * u);
}
inline float gelu_tanh_grad(float x) {
  const float u = kSqrt2OverPi * (x + kGeluC * x * x * x);
  float s_oms;
  const float s = sigmoid_parts(2.0f * u, s_oms);
  const float du = kSqrt2OverPi * (1.0f + 3.0f * kGeluC * x * x);
  return s + 2.0f * x * s_oms * du;
}

}  // namespace linea::cpu::vm
