// The `performer` mechanism: FAVOR+ linear attention with random features (Choromanski et al.,
// "Rethinking Attention with Performers"), bidirectional and causal (chunked prefix sums), with
// key padding and cross-attention, and its kernel variants:
//   kernel=softmax  positive features phi(x) = exp(W x~ - |x~|^2/2) / sqrt(S), so that
//                   E_W[phi(q~).phi(k~)] = exp(q~.k~) = exp(q.k / sqrt(D))   (the default)
//   kernel=relu     phi(x) = relu(W x~) + 1e-3  (generalized attention, no softmax estimate)
//   kernel=trf      phi(x) = exp(|x~|^2/2) [sin(W x~), cos(W x~)] / sqrt(S)  (2S trigonometric
//                   features; unbiased for exp(q~.k~) too, but phi(q).phi(k) can be negative)
// and out_n = phi(q_n).sum_m phi(k_m) v_m^T / phi(q_n).sum_m phi(k_m).
//
// Spec options: features=S (128), kernel=softmax|relu|trf, redraw=N (1: a new W every N training
// forwards, the first included; 0: never), chunk=T (64: causal chunk length), orthogonal=1|0 (1:
// orthogonal Gaussian blocks as FAVOR+ prescribes; 0: i.i.d. Gaussian rows).
// Not here: the shared random-feature helpers (attention/common/common.h).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "attention/common/common.h"

namespace linea::attn {

enum class PerformerKernel { Softmax, Relu, Trf };

// "softmax" | "relu" | "trf" (throws on anything else), and back.
PerformerKernel parse_performer_kernel(const std::string& name);
const char* performer_kernel_name(PerformerKernel kind);

// The unstabilized feature map phi, for tests and benchmarks (the mechanism computes the same map
// with max-stabilizers that cancel in its ratio). x_scaled [B, H, L, D] is already in the scaled
// space (x~ = D^-1/4 x, see scaled()), omega [H, S, D] holds the rows of W. Returns [B, H, L, S]
// (softmax, relu) or [B, H, L, 2S] (trf: the S sines, then the S cosines). Differentiable in
// x_scaled. For kernel=softmax and trf, phi(q~).phi(k~) is an unbiased estimate of exp(q~.k~)
// when the rows of W are N(0, I_D) (i.i.d. or orthogonal blocks).
Tensor performer_features(const Tensor& x_scaled, const Tensor& omega, PerformerKernel kind);

class PerformerAttention : public nn::AttentionKernel {
 public:
  PerformerAttention(int64_t heads, int64_t head_dim, int64_t features = 128,
                     PerformerKernel kernel = PerformerKernel::Softmax, int64_t redraw = 1, int64_t chunk = 64,
                     bool orthogonal = true);

  // q [B, H, N, D], k [B, H, M, D], v [B, H, M, Dv] -> [B, H, N, Dv]. Causal: O(N/T) chunk steps,
  // each O(T (T + S) Dv) work and O(T S + S Dv) memory for the carried prefix state.
  Tensor forward(const Tensor& q, const Tensor& k, const Tensor& v, const nn::AttentionOptions& opts) override;
  // [B, H, N, M]: phi(q_n).phi(k_m) over visible keys, normalized per row (forward == this @ v).
  Tensor attention_matrix(const Tensor& q, const Tensor& k, const nn::AttentionOptions& opts) override;
  std::vector<std::string> sample_names() const override { return {"omega"}; }
  std::string extra_repr() const override;

  // Draws new feature rows into the "omega" buffer now (orthogonal blocks or i.i.d. Gaussian
  // rows, from the CPU generator, then moved to the buffer's device and dtype).
  void redraw_features();

  const Tensor& omega() const { return omega_; }  // the buffer [H, S, D]
  int64_t features() const { return features_; }
  PerformerKernel kernel() const { return kernel_; }
  int64_t redraw() const { return redraw_; }
  int64_t chunk() const { return chunk_; }
  bool orthogonal() const { return orthogonal_; }
  // Training calls that drew omega so far (calls with explicit or frozen omega do not count).
  int64_t training_draws() const { return training_draws_; }

 private:
  // omega for this call through sample(): redraws first when in training and due.
  Tensor current_omega(const Tensor& like);
  // The stabilized features of this call: phi_q [B, H, N, F], phi_k [B, H, M, F] (padded key
  // rows zero). Each is the unstabilized phi times a detached per-row (q) / per-(b, h) (k) factor.
  std::pair<Tensor, Tensor> features_of(const Tensor& q, const Tensor& k, const nn::AttentionOptions& opts);

  int64_t features_;
  PerformerKernel kernel_;
  int64_t redraw_, chunk_;
  bool orthogonal_;
  int64_t training_draws_ = 0;
  Tensor omega_;  // buffer "omega" [H, S, D]
};

// The factory behind the spec name "performer" (attention/builtin.cpp).
std::shared_ptr<nn::AttentionKernel> make_performer(const AttentionSpec& spec, int64_t heads, int64_t head_dim);

}  // namespace linea::attn
