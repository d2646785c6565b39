// Shared attention helpers (see common.h).
#include "attention/common/common.h"

#include <cmath>
#include <vector>

namespace linea::attn {

double scale_of(int64_t head_dim) { return std::pow(static_cast<double>(head_dim), -0.25); }

Tensor scaled(const Tensor& x) { return mul(x, scale_of(x.size(-1))); }

Tensor log_xi(const Tensor& w, const Tensor& x) {
  // [..., P, M] = w x^T - (|x|^2 / 2)^T ; x^T is a view, no copy.
  return sub(matmul(w, transpose(x, -2, -1)), unsqueeze(sq_norm(x, 0.5), -2));
}

Tensor masked_logsumexp(const Tensor& logits, const Tensor& hidden, int64_t dim, bool keepdim) {
  if (!hidden.defined()) return logsumexp(logits, {dim}, keepdim);
  // Hidden entries at half the lowest value: exp() of them underflows to 0 next to any visible
  // entry, and a fully hidden slice gives lowest/2 + log(n), still finite.
  return logsumexp(masked_fill(logits, hidden, 0.5 * dtype_lowest(logits.dtype())), {dim}, keepdim);
}

Tensor orthogonal_gaussian(int64_t heads, int64_t S, int64_t D) {
  LINEA_CHECK(heads > 0 && S > 0 && D > 0, "orthogonal_gaussian: heads, S, D must be positive, got ", heads, ", ", S,
              ", ", D);
  std::vector<double> out(static_cast<size_t>(heads * S * D));
  for (int64_t h = 0; h < heads; ++h) {
    for (int64_t s0 = 0; s0 < S; s0 += D) {
      const int64_t rows = std::min(D, S - s0);
      std::vector<double> g = randn({D, D}, TensorOptions(DType::Float64)).to_vector<double>();
      // Modified Gram-Schmidt on the rows, twice for orthogonality to rounding.
      for (int64_t i = 0; i < D; ++i) {
        double* gi = &g[static_cast<size_t>(i * D)];
        for (int pass = 0; pass < 2; ++pass)
          for (int64_t j = 0; j < i; ++j) {
            const double* gj = &g[static_cast<size_t>(j * D)];
            double dot = 0;
            for (int64_t d = 0; d < D; ++d) dot += gi[d] * gj[d];
            for (int64_t d = 0; d < D; ++d) gi[d] -= dot * gj[d];
          }
        double nrm = 0;
        for (int64_t d = 0; d < D; ++d) nrm += gi[d] * gi[d];
        nrm = std::sqrt(nrm);
        for (int64_t d = 0; d < D; ++d) gi[d] /= nrm;
      }
      std::vector<double> len = randn({rows, D}, TensorOptions(DType::Float64)).to_vector<double>();
      for (int64_t r = 0; r < rows; ++r) {
        double chi = 0;
        for (int64_t d = 0; d < D; ++d) chi += len[static_cast<size_t>(r * D + d)] * len[static_cast<size_t>(r * D + d)];
        chi = std::sqrt(chi);
        for (int64_t d = 0; d < D; ++d)
          out[static_cast<size_t>((h * S + s0 + r) * D + d)] = chi * g[static_cast<size_t>(r * D + d)];
      }
    }
  }
  return from_vector<double>(out, {heads, S, D});
}

Tensor padded_keys(const AttentionOptions& opts) {
  Tensor pad = key_padding_bool(opts);
  if (!pad.defined()) return pad;
  return reshape(pad, {pad.size(0), 1, 1, pad.size(1)});
}

}  // namespace linea::attn
