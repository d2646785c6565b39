// The per-element math of the fused optimizer steps (core/kernels.h: sgd_step, adam_step),
// usable from host and device code: the CPU kernels (core/cpu/optim.cpp) and the CUDA kernels
// (cuda/optim.cu) both call these, so they evaluate the same expressions.
// Coefficients are computed once per step on the host (in double, then cast to T).
#pragma once

#include <cmath>
#include <cstdint>

#include "core/ops_optim.h"
#include "core/host_device.h"

namespace linea::detail {

template <typename T> struct SgdCoeffs {
  T lr, momentum, damp1, wd;  // damp1 = 1 - dampening
  bool use_momentum, nesterov, first;
  static SgdCoeffs make(double lr, double momentum, double dampening, double weight_decay, bool nesterov, bool first) {
    return {static_cast<T>(lr),
            static_cast<T>(momentum),
            static_cast<T>(1.0 - dampening),
            static_cast<T>(weight_decay),
            momentum != 0.0,
            nesterov,
            first};
  }
};

// One element: p -= lr * update (semantics in core/kernels.h). buf is null without momentum.
template <typename T> LINEA_HD void sgd_element(T* p, const T* g, T* buf, int64_t i, const SgdCoeffs<T>& c) {
  T gi = g[i];
  if (c.wd != T(0)) gi = gi + c.wd * p[i];
  if (c.use_momentum) {
    const T bi = c.first ? gi : c.momentum * buf[i] + c.damp1 * gi;
    buf[i] = bi;
    gi = c.nesterov ? gi + c.momentum * bi : bi;
  }
  p[i] = p[i] - c.lr * gi;
}

template <typename T> struct AdamCoeffs {
  T b1, b2, one_b1, one_b2, eps, step_size, bc2_sqrt, decay, l2;
  LINEA_HD static AdamCoeffs make(double lr, double beta1, double beta2, double eps, double weight_decay,
                                  bool decoupled, int64_t step) {
    const AdamScalars s = adam_scalars(lr, beta1, beta2, weight_decay, decoupled, step);
    return {static_cast<T>(beta1),       static_cast<T>(beta2),   static_cast<T>(1.0 - beta1),
            static_cast<T>(1.0 - beta2), static_cast<T>(eps),     static_cast<T>(s.step_size),
            static_cast<T>(s.bc2_sqrt),  static_cast<T>(s.decay), static_cast<T>(s.l2)};
  }
};

// One element of an Adam/AdamW step (semantics in core/kernels.h), with gradient value gi.
template <typename T> LINEA_HD void adam_update(T* p, T gi, T* m, T* v, int64_t i, const AdamCoeffs<T>& c) {
  T pi = p[i];
  if (c.l2 != T(0)) gi = gi + c.l2 * pi;
  if (c.decay != T(1)) pi = pi * c.decay;
  const T mi = c.b1 * m[i] + c.one_b1 * gi;
  const T vi = c.b2 * v[i] + c.one_b2 * (gi * gi);
  m[i] = mi;
  v[i] = vi;
  const T denom = std::sqrt(vi) / c.bc2_sqrt + c.eps;
  p[i] = pi - c.step_size * mi / denom;
}
template <typename T> LINEA_HD void adam_element(T* p, const T* g, T* m, T* v, int64_t i, const AdamCoeffs<T>& c) {
  adam_update(p, g[i], m, v, i, c);
}

// The multi-tensor step's gradient: g times the clipping coefficient, in T (as the separate
// clip_grad_norm_ + adam_step wrote it: g *= coef, then the step read it).
template <typename T> LINEA_HD T clipped(T g, T coef) { return g * coef; }

// grad_norm_guard's coefficient from the norm, in T as the composed clip_grad_norm_ computes
// it: min(max_norm / (norm + 1e-6), 1) (NaN stays NaN); 1 without clipping (max_norm <= 0).
template <typename T> LINEA_HD T clip_coef(T norm, double max_norm) {
  if (!(max_norm > 0.0)) return T(1);
  const T c = static_cast<T>(max_norm) / (norm + static_cast<T>(1e-6));
  return c > T(1) ? T(1) : c;
}

// Partial sums of squares in the order cpu::reduce's sum_rows adds a row: eight interleaved
// double sums of T(g*g), combined pairwise. The CPU's grad_norm_guard uses it per tensor, so
// the norm equals the composed sum(g * g) bit for bit.
template <typename T> inline double sum_of_squares(const T* g, int64_t n) {
  double acc[8] = {};
  int64_t j = 0;
  for (; j + 8 <= n; j += 8)
    for (int k = 0; k < 8; ++k) acc[k] += static_cast<double>(static_cast<T>(g[j + k] * g[j + k]));
  for (; j < n; ++j) acc[0] += static_cast<double>(static_cast<T>(g[j] * g[j]));
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

}  // namespace linea::detail
