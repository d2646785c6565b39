// Parameter initialization (see init.h). Values are drawn in float64 on the CPU generator and
// copied (converted) into the target, whatever its device and floating dtype.
#include "nn/init.h"

#include <cmath>

#include "autograd/autograd.h"
#include "core/ops.h"
#include "core/random.h"

namespace linea::nn::init {

namespace {
void check_target(const char* op, const Tensor& t) {
  LINEA_CHECK(t.defined(), op, ": tensor is undefined");
  LINEA_CHECK(is_floating(t.dtype()), op, ": expected a floating tensor, got ", dtype_name(t.dtype()), " (shape ",
              shape_str(t.shape()), ")");
}

// Copies host-drawn float64 values into t (no graph; bumps t's version like any in-place write).
Tensor assign(const Tensor& t, const Tensor& values) {
  NoGradGuard ng;
  raw::copy_(t, values);
  return t;
}

const TensorOptions kHost(DType::Float64, kCPU);
}  // namespace

Tensor constant_(const Tensor& t, double value) {
  check_target("init::constant_", t);
  NoGradGuard ng;
  raw::fill_(t, value);
  return t;
}

Tensor zeros_(const Tensor& t) { return constant_(t, 0.0); }
Tensor ones_(const Tensor& t) { return constant_(t, 1.0); }

Tensor uniform_(const Tensor& t, double lo, double hi) {
  check_target("init::uniform_", t);
  LINEA_CHECK(std::isfinite(lo) && std::isfinite(hi) && lo <= hi, "init::uniform_: invalid range [", lo, ", ", hi, ")");
  return assign(t, uniform(t.shape(), lo, hi, kHost));
}

Tensor normal_(const Tensor& t, double mean, double std) {
  check_target("init::normal_", t);
  LINEA_CHECK(std::isfinite(mean) && std::isfinite(std) && std >= 0, "init::normal_: invalid mean ", mean, " / std ",
              std);
  return assign(t, normal(t.shape(), mean, std, kHost));
}

Tensor scaled_embedding_(const Tensor& t, int64_t padding_idx) {
  check_target("init::scaled_embedding_", t);
  LINEA_CHECK(t.dim() == 2 && t.size(1) > 0, "init::scaled_embedding_: expected a table [num, dim], got ",
              shape_str(t.shape()));
  LINEA_CHECK(padding_idx >= -1 && padding_idx < t.size(0), "init::scaled_embedding_: padding_idx ", padding_idx,
              " is outside the table's ", t.size(0), " rows");
  normal_(t, 0.0, 1.0 / std::sqrt(static_cast<double>(t.size(1))));
  if (padding_idx >= 0) zeros_(t.detach().narrow(0, padding_idx, 1));
  return t;
}

Tensor trunc_normal_(const Tensor& t, double std, double mean, double a, double b) {
  check_target("init::trunc_normal_", t);
  LINEA_CHECK(std::isfinite(mean) && std::isfinite(std) && std >= 0, "init::trunc_normal_: invalid mean ", mean,
              " / std ", std);
  LINEA_CHECK(a < b, "init::trunc_normal_: empty interval [", a, ", ", b, "] (in std units)");
  // Acceptance probability of one draw; reject intervals so far in a tail that sampling would crawl.
  const double accept = 0.5 * (std::erf(b / std::sqrt(2.0)) - std::erf(a / std::sqrt(2.0)));
  LINEA_CHECK(accept > 1e-3, "init::trunc_normal_: interval [", a, ", ", b, "] (in std units) has probability ", accept,
              "; too small to sample by rejection");
  const int64_t n = t.numel();
  std::vector<double> out;
  out.reserve(static_cast<size_t>(n));
  // Draw in rounds of the still-missing count (plus a margin); keep accepted values in draw order.
  while (static_cast<int64_t>(out.size()) < n) {
    const int64_t missing = n - static_cast<int64_t>(out.size());
    const int64_t draw = static_cast<int64_t>(static_cast<double>(missing) / accept) + 16;
    std::vector<double> z = normal({draw}, 0.0, 1.0, kHost).to_vector<double>();
    for (double v : z) {
      if (v < a || v > b) continue;
      out.push_back(mean + std * v);
      if (static_cast<int64_t>(out.size()) == n) break;
    }
  }
  return assign(t, from_vector<double>(out, t.shape()));
}

std::pair<int64_t, int64_t> fan_in_out(const Tensor& t) {
  LINEA_CHECK(t.defined() && t.dim() >= 1, "init: fan_in/fan_out need a tensor with at least one dim, got ",
              t.defined() ? shape_str(t.shape()) : "undefined");
  if (t.dim() == 1) return {t.size(0), t.size(0)};
  int64_t receptive = 1;
  for (int64_t d = 2; d < t.dim(); ++d) receptive *= t.size(d);
  return {t.size(1) * receptive, t.size(0) * receptive};
}

Tensor xavier_uniform_(const Tensor& t, double gain) {
  check_target("init::xavier_uniform_", t);
  auto [fin, fout] = fan_in_out(t);
  LINEA_CHECK(fin + fout > 0, "init::xavier_uniform_: zero fans for shape ", shape_str(t.shape()));
  const double bound = gain * std::sqrt(6.0 / static_cast<double>(fin + fout));
  return uniform_(t, -bound, bound);
}

Tensor kaiming_uniform_(const Tensor& t, double a) {
  check_target("init::kaiming_uniform_", t);
  auto [fin, fout] = fan_in_out(t);
  (void)fout;
  LINEA_CHECK(fin > 0, "init::kaiming_uniform_: zero fan_in for shape ", shape_str(t.shape()));
  const double bound = std::sqrt(6.0 / ((1.0 + a * a) * static_cast<double>(fin)));
  return uniform_(t, -bound, bound);
}

}  // namespace linea::nn::init
