// Linear randomized attention (`lara`), from Zheng et al. 2022, "Linear Complexity Randomized
// Self-attention Mechanism" (ICML), section 4: randomized attention (attention/ra) with C
// proposals built from segment landmarks instead of one mixture per query, combined by
// multiple importance sampling with query-specific weights, at O(C (N + M) D) cost.
//
// In the scaled space (x~ = D^-1/4 x, xi(x, w) = exp(w.x - |x|^2/2)):
//  - queries and keys are split into C_eff = min(C, N) contiguous segments (sizes floor(N/C_eff)
//    for the first C_eff - N % C_eff segments, one more for the rest; when N <= C each token is
//    its own segment); q-_c, k-_c are the segment means (the key means leave padded keys out; a
//    segment whose keys are all padded has k-_c = 0; the query means, and t_nc below, use every
//    position: padding hides keys, not queries);
//  - proposal means mu_c = q-_c + k-_c (proposal=qk), or mu_c = q-_c + sum_c' softmax_c'(k-_c.k-_c')
//    k-_c' (proposal=mixed, the ViT variant); with adaptive=1, mu_c -> LayerNorm(Linear(mu_c))
//    (learned, registered as submodules "mu_proj" and "mu_norm");
//  - w_c = mu_c + noise * eps_c in training, w_c = mu_c in eval (deterministic);
//  - l_cc' = log xi(mu_c', w_c);  f_c = sum_m softmax_m(log xi(k~_m, w_c)) v_m;
//    t_nc = softmax over n of (q~_n.q-_c);
//    alpha_nc = max(exp(l_cc - logsumexp_c' l_cc') + beta (t_nc - mean_c' t_nc'), 1e-8);
//    log u_nc = log alpha_nc + log xi(q~_n, w_c) + logsumexp_m log xi(k~_m, w_c) - l_cc;
//    out_n = sum_c softmax_c(log u_nc) f_c.
//    Why: w_c ~ q_c = N(mu_c, I); the target of query n is p_n(w) proportional to
//    N(w; 0, I) xi(q~_n, w) sum_m xi(k~_m, w) (RA's mixture), and N(w; 0, I) / N(w; mu_c, I) =
//    1 / xi(mu_c, w), so log u_nc is log alpha_nc plus the log importance ratio p_n(w_c)/q_c(w_c);
//    exp(l_cc - logsumexp_c' l_cc') = q_c(w_c) / sum_c' q_c'(w_c) is the balance heuristic, made
//    query-specific by the beta term.
// Padded keys get log xi = -inf (left out of f_c and of the logsumexp over m; a batch row whose
// keys are all padded outputs zeros). Every ratio of exponentials is a softmax or logsumexp, so
// nothing overflows for |q~|, |k~| up to 5.
// The formulas over c' (logsumexp_c' l_cc', the mixed proposal's softmax_c') run over all C_eff
// segments, as written, including a segment whose keys are all padded (its k-_c' is 0).
//
// Random quantity (AttentionMechanism::sample): "eps" [B, H, C_eff, D], used in training only (eval
// neither draws nor reads it).
// Requires self-attention (M == N: the landmarks pair query and key segments) and no causal mask.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "attention/common/common.h"
#include "nn/layers.h"

namespace linea::attn {

class LinearRandomizedAttention : public AttentionMechanism {
 public:
  enum class Proposal { QK, Mixed };

  LinearRandomizedAttention(int64_t heads, int64_t head_dim, int64_t samples = 16, Proposal proposal = Proposal::QK,
                            bool adaptive = false, double noise = 1.0, double beta = 1.0);

  // q [B, H, N, D], k [B, H, N, D], v [B, H, N, Dv] -> [B, H, N, Dv]
  Tensor forward(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& opts) override;
  // sum_c softmax_c(log u_nc) softmax_m(log xi(k~_m, w_c)) [B, H, N, N], drawn like forward.
  Tensor attention_matrix(const Tensor& q, const Tensor& k, const AttentionOptions& opts) override;
  // Bidirectional self-attention only: the landmarks summarize whole segments of one sequence.
  AttentionSupport support() const override { return {false, false, false, false}; }
  std::vector<std::string> sample_names() const override { return {"eps"}; }
  std::string extra_repr() const override;

  // The segment sizes for N tokens and C landmarks (C_eff = min(C, N) entries summing to N).
  static std::vector<int64_t> segment_sizes(int64_t N, int64_t C);

  int64_t samples() const { return samples_; }
  Proposal proposal() const { return proposal_; }
  bool adaptive() const { return mu_proj_ != nullptr; }
  double noise() const { return noise_; }
  double beta() const { return beta_; }

 private:
  struct Parts {
    Tensor mix;    // softmax_c(log u_nc)                        [B, H, N, C]
    Tensor f;      // f_c = softmax_m(log xi(k~_m, w_c)) v_m     [B, H, C, Dv]  (given v)
    Tensor probs;  // softmax_m(log xi(k~_m, w_c))               [B, H, C, M]   (without v)
  };
  // With v: f_c by the fused softmax attention of the landmarks w_c over the keys (nothing of size
  // C x M kept); without (attention_matrix): the probabilities themselves.
  Parts compute(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& opts, const char* who);
  // The segments of N positions in the given dtype/device, cached for the last shape (constants:
  // built once on the host, not a few kernels every forward).
  struct Segments {
    Tensor member;    // 0/1 membership [C_eff, N]
    // member with each row divided by its segment's size and multiplied by D^-1/4: the segment
    // means of q~ and k~ taken from q and k themselves (no scaled copies of q and k)
    Tensor scaled_mean;
  };
  const Segments& segments(int64_t N, const TensorOptions& opts);

  int64_t samples_;
  Proposal proposal_;
  double noise_, beta_;
  std::shared_ptr<nn::Linear> mu_proj_;     // adaptive only
  std::shared_ptr<nn::LayerNorm> mu_norm_;  // adaptive only
  Segments segments_;
};

// The mixture weights softmax_c(log u_nc) [B, H, N, C] composed from ops: the reference the fused
// linea::lara_mixture (the layer's path) is tested against. t = softmax over n of q~ qbar^T,
// alpha = max(self_w + beta (t - mean_c t), 1e-8), log u = log alpha + log xi(q~_n, w_c) + bias_c,
// for q~ [B, H, N, D], qbar and w [B, H, C, D], self_w and bias [B, H, C].
Tensor mixture_weights(const Tensor& qs, const Tensor& qbar, const Tensor& w, const Tensor& self_w,
                       const Tensor& bias, double beta);
// The proposal weights {self_w, bias} [B, H, C] composed from ops: the reference of the fused
// linea::lara_proposals. l_cc' = log xi(mu_c', w_c), self_w_c = exp(l_cc - logsumexp_c' l_cc'),
// bias_c = lse_k_c - l_cc.
std::pair<Tensor, Tensor> proposal_weights(const Tensor& w, const Tensor& mu, const Tensor& lse_k);

// Spec "lara[:samples=C][,proposal=qk|mixed][,adaptive=0|1][,noise=x][,beta=x]" (C > 0, default
// 16; proposal default qk; adaptive default 0; noise >= 0, default 1; beta default 1).
std::shared_ptr<AttentionMechanism> make_lara(const AttentionSpec& spec, int64_t heads, int64_t head_dim);
// What lara is, for the registry (attention/registry.h): summary, support, options, test specs.
AttentionInfo lara_info();

}  // namespace linea::attn
