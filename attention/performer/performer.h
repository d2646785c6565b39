// The `performer` mechanism: FAVOR+ linear attention with random features (Choromanski et al.,
// "Rethinking Attention with Performers"), bidirectional and causal (chunked prefix sums), with
// key padding and cross-attention, and its feature maps:
//   feature_map=softmax  positive features phi(x) = exp(W x~ - |x~|^2/2) / sqrt(S), so that
//                   E_W[phi(q~).phi(k~)] = exp(q~.k~) = exp(q.k / sqrt(D))   (the default)
//   feature_map=relu     phi(x) = relu(W x~) + 1e-3  (generalized attention, no softmax estimate)
//   feature_map=trf      phi(x) = exp(|x~|^2/2) [sin(W x~), cos(W x~)] / sqrt(S)  (2S trigonometric
//                   features; unbiased for exp(q~.k~) too, but phi(q).phi(k) can be negative)
// and out_n = phi(q_n).sum_m phi(k_m) v_m^T / phi(q_n).sum_m phi(k_m).
//
// Spec options: features=S (128), feature_map=softmax|relu|trf, redraw=N (1: a new W every N training
// calls, the first included; 0: never; the schedule of AttentionMechanism), chunk=T (64: causal
// chunk length), orthogonal=1|0 (1: orthogonal Gaussian blocks as FAVOR+ prescribes; 0: i.i.d.
// Gaussian rows).
// Decoding: a constant-size recurrent state per (batch row, head), the running sums
// sum_m phi(k_m) [v_m, 1]^T [F, Dv+1] with a running stabilizer (when a new key's features are
// larger, the sums are rescaled instead of overflowing), so a step costs the same at any length.
// Not here: the shared random-feature helpers (attention/common/common.h).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "attention/common/common.h"

namespace linea::attn {

enum class FeatureMap { Softmax, Relu, Trf };

// "softmax" | "relu" | "trf" (throws on anything else), and back.
FeatureMap parse_feature_map(const std::string& name);
const char* feature_map_name(FeatureMap kind);

// The unstabilized feature map phi, for tests and benchmarks (the mechanism computes the same map
// with max-stabilizers that cancel in its ratio). x_scaled [B, H, L, D] is already in the scaled
// space (x~ = D^-1/4 x, see scaled()), omega [H, S, D] holds the rows of W. Returns [B, H, L, S]
// (softmax, relu) or [B, H, L, 2S] (trf: the S sines, then the S cosines). Differentiable in
// x_scaled. For feature_map=softmax and trf, phi(q~).phi(k~) is an unbiased estimate of exp(q~.k~)
// when the rows of W are N(0, I_D) (i.i.d. or orthogonal blocks).
Tensor performer_features(const Tensor& x_scaled, const Tensor& omega, FeatureMap kind);

class PerformerAttention : public AttentionMechanism {
 public:
  PerformerAttention(int64_t heads, int64_t head_dim, int64_t features = 128,
                     FeatureMap feature_map = FeatureMap::Softmax, int64_t redraw = 1, int64_t chunk = 64,
                     bool orthogonal = true);

  // q [B, H, N, D], k [B, H, M, D], v [B, H, M, Dv] -> [B, H, N, Dv]. Causal: N/T chunks of T
  // rows, each O(T (T + S) Dv) work; the N/T chunk states [S, Dv + 1] are kept for the backward.
  Tensor forward(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& opts) override;
  // [B, H, N, M]: phi(q_n).phi(k_m) over visible keys, normalized per row (forward == this @ v).
  Tensor attention_matrix(const Tensor& q, const Tensor& k, const AttentionOptions& opts) override;
  AttentionSupport support() const override { return {true, true, true, false}; }
  std::unique_ptr<DecodeState> start_decoding() const override;
  // The recurrent step: O(T (T + F) Dv) for T new positions, whatever the length decoded so far.
  // Uses the features of the first step for the whole sequence (no redraw while decoding).
  Tensor decode_step(const Tensor& q, const Tensor& k, const Tensor& v, DecodeState& state,
                     const Tensor& key_padding = Tensor()) override;
  std::vector<std::string> sample_names() const override { return {"omega"}; }
  std::string extra_repr() const override;

  // Draws new feature rows into the "omega" buffer now (orthogonal blocks or i.i.d. Gaussian
  // rows, from the CPU generator, then moved to the buffer's device and dtype).
  void redraw_features();

  const Tensor& omega() const { return omega_; }  // the buffer [H, S, D]
  int64_t features() const { return features_; }
  FeatureMap feature_map() const { return feature_map_; }
  int64_t redraw() const { return redraw_every(); }
  int64_t chunk() const { return chunk_; }
  bool orthogonal() const { return orthogonal_; }

 private:
  // omega for this call through sample(): in training, counts the call and redraws when due.
  Tensor current_omega(const Tensor& like);
  // The query features, each row times a detached factor (its max over features): [B, H, N, F].
  Tensor query_features(const Tensor& q, const Tensor& omega) const;
  // The key features of the relu and trf maps before stabilization: phi_k = base * exp(log_scale)
  // (relu: base only). The softmax map's are fused (positive_features, favor_attention_step).
  struct KeyParts {
    Tensor log_scale;  // [B, H, M, 1] (trf), undefined (relu)
    Tensor base;       // [B, H, M, 2S] sin, cos (trf), [B, H, M, S] (relu)
  };
  KeyParts key_parts(const Tensor& k, const Tensor& omega) const;
  // phi_k with exp(log_scale - c) for a detached c [B, H, 1, 1]; padded rows (pad Bool
  // [B, 1, M, 1] or undefined) zero.
  Tensor stabilized_keys(const KeyParts& parts, const Tensor& c, const Tensor& pad) const;
  // The stabilized features of this call: phi_q [B, H, N, F], phi_k [B, H, M, F] (padded key
  // rows zero). Each is the unstabilized phi times a detached per-row (q) / per-(b, h) (k) factor.
  std::pair<Tensor, Tensor> features_of(const Tensor& q, const Tensor& k, const AttentionOptions& opts);

  int64_t features_;
  FeatureMap feature_map_;
  int64_t chunk_;
  bool orthogonal_;
  Tensor omega_;  // buffer "omega" [H, S, D]
};

// The factory behind the spec name "performer" (attention/builtin.cpp).
std::shared_ptr<AttentionMechanism> make_performer(const AttentionSpec& spec, int64_t heads, int64_t head_dim);
// What performer is, for the registry (attention/registry.h): summary, support, options, test specs.
AttentionInfo performer_info();

}  // namespace linea::attn
