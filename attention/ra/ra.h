// Randomized attention (`ra`), from Zheng et al. 2022, "Linear Complexity Randomized Self-attention
// Mechanism" (ICML), section 3: softmax attention written as an expectation over a Gaussian
// mixture, estimated by Monte Carlo.
//
// In the scaled space (x~ = D^-1/4 x, xi(x, w) = exp(w.x - |x|^2/2)), for each query n
//   pi_n    = softmax_m(q~_n.k~_m)                      (padded keys excluded)
//   w_ns    = q~_n + k~_{m_ns} + eps_ns,  m_ns ~ Cat(pi_n),  eps_ns ~ N(0, I)      (unbiased)
//   w_ns    = q~_n + sum_m pi_nm k~_m + eps_ns                                  (biased=1)
//   out_n   = (1/S) sum_s sum_m softmax_m(log xi(k~_m, w_ns)) v_m              (samples=S)
// Unbiased RA is exact in expectation: w ~ sum_m pi_nm N(q~_n + k~_m, I) has density
// proportional to exp(w.q~_n - |w|^2/2) sum_m xi(k~_m, w), so E[out_n] is softmax attention and
// the error of the average over S samples falls like 1/sqrt(S). Biased RA replaces the mixture
// by one Gaussian at its mean: lower variance, but it keeps a bias.
//
// Random quantities (AttentionMechanism::sample): "ra_index" Int64 [B, H, N, S] (unbiased only),
// drawn on the inputs' device by inverse CDF (sample_attention_keys: pi_n's running sums in key
// order against uniforms, no [N, M] kept; a padded key is never drawn, and a query whose keys are
// all padded gets index 0, which cannot matter: its output is zero), and "eps" [B, H, N, S, D].
// Eval mode: biased RA uses eps = 0 (no draw, and an explicit "eps" is ignored: deterministic, one
// sample suffices). UNBIASED RA STAYS A SAMPLE in eval (it draws m_ns and eps as in training),
// since its mixture has no single deterministic point that keeps it unbiased;
// freeze_samples()/set_samples() make it deterministic.
//
// Cost O(S N M D) time (it is an estimator of softmax attention, not a linear one). Both passes
// over the keys run the fused softmax attention (scaled_dot_product_attention): biased RA's
// mixture mean softmax(q~ k~^T) k~, and the estimator itself over the N S rows w_ns with xi's key
// term -|k~_m|^2/2 as a per-key bias; so the gradient keeps O(S N (D + Dv)), no [N, S, M]
// weights. Unbiased RA's pi_n [B, H, N, M] exists only while the indices are drawn (no gradient:
// the inverse CDF needs a whole row; a fused sampler could walk it blockwise). attention_matrix
// composes the weights from ops. Key padding supported; causal is not (error); cross-attention
// (M != N) is allowed since every formula is per query.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "attention/common/common.h"

namespace linea::attn {

class RandomizedAttention : public AttentionMechanism {
 public:
  RandomizedAttention(int64_t heads, int64_t head_dim, int64_t samples = 1, bool biased = false);

  // q [B, H, N, D], k [B, H, M, D], v [B, H, M, Dv] -> [B, H, N, Dv]
  Tensor forward(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& opts) override;
  // (1/S) sum_s softmax_m(log xi(k~_m, w_ns)) [B, H, N, M], drawn like forward.
  Tensor attention_matrix(const Tensor& q, const Tensor& k, const AttentionOptions& opts) override;
  // Not causal (an estimator of bidirectional softmax attention); each query is on its own, so
  // cross-attention works.
  AttentionSupport support() const override { return {false, true, false, false}; }
  std::vector<std::string> sample_names() const override;
  bool draws_in_eval() const override { return !biased_; }
  std::string extra_repr() const override;

  int64_t samples() const { return samples_; }
  bool biased() const { return biased_; }

 private:
  // The samples w_ns [B, H, N, Sw, D] (Sw = 1 for biased RA in eval) and k~ [B, H, M, D]; `who`
  // names the caller in errors.
  struct Samples {
    Tensor w, ks;
  };
  Samples draw(const Tensor& q, const Tensor& k, const AttentionOptions& opts, const char* who);
  // The averaged attention weights [B, H, N, M] of the samples.
  static Tensor weights(const Samples& d, const AttentionOptions& opts);

  int64_t samples_;
  bool biased_;
};

// Spec "ra[:samples=S][,biased=0|1]" (S > 0, default 1; biased default 0).
std::shared_ptr<AttentionMechanism> make_ra(const AttentionSpec& spec, int64_t heads, int64_t head_dim);
// What ra is, for the registry (attention/registry.h): summary, support, options, test specs.
AttentionInfo ra_info();

}  // namespace linea::attn
