// An attention mechanism defined outside the library: ReLU linear attention,
//   out_n = sum_m phi(q_n).phi(k_m) v_m / (sum_m phi(q_n).phi(k_m) + eps),  phi = relu,
// computed in O(L D Dv) as phi(q) (phi(k)^T v) over phi(q) (phi(k)^T 1) (Katharopoulos et al.'s
// linear attention with a ReLU feature map). It is built from the library's differentiable ops,
// so its backward comes with them; registering it makes "relu_linear" a spec every layer, app
// and test suite of Linea accepts.
#pragma once

#include "attention/registry.h"

namespace example {

class ReluLinearAttention : public linea::attn::AttentionMechanism {
 public:
  ReluLinearAttention(int64_t heads, int64_t head_dim, double eps);
  linea::Tensor forward(const linea::Tensor& q, const linea::Tensor& k, const linea::Tensor& v,
                        const linea::attn::AttentionOptions& opts) override;
  // Any keys, of any length: self- and cross-attention (no causal form here).
  linea::attn::AttentionSupport support() const override { return {false, true, false, false}; }
  std::string extra_repr() const override;

 private:
  double eps_;
};

// What it is, for the registry: name, summary, support, options, the specs the shared suite runs.
linea::attn::AttentionInfo relu_linear_info();

// Adds "relu_linear" to the registry (once; later calls do nothing).
void register_relu_linear();

}  // namespace example
