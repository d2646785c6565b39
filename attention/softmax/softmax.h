// The `softmax` mechanism: exact scaled dot-product attention, softmax(q k^T / sqrt(D) + mask) v,
// with causal masks (and a query offset), key padding, cross-attention and incremental decoding
// over a key/value cache. Spec options: dropout=p (on the attention weights, training only).
#pragma once

#include <memory>
#include <string>

#include "attention/registry.h"

namespace linea::attn {

// Exact scaled dot-product attention with dropout p on the attention weights when training.
// Differentiable in q, k, v. The fused kernel on either device (scaled_dot_product_attention),
// the dropout drawn inside it.
Tensor softmax_attention(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& opts = {},
                         double dropout = 0.0, bool training = false);
// The fused CPU kernel keeps the probabilities for its backward while one [B, H, N, M] tensor of
// them takes at most kKeepProbsBytes (the CUDA kernel always recomputes them: memory O(N)), and recomputes them block by block beyond that (one more
// GEMM and exp per score), so that long sequences fit. Keeping them, it runs faster than the
// composed formula at every size measured on the CPU (ViT's N = 50 to N = 8192; figures in
// apps/bench/README.md), which holds about three such tensors through the backward.
constexpr double kKeepProbsBytes = 512.0 * 1024 * 1024;
bool fused_kernel_keeps_probs(const Tensor& q, const Tensor& k);
// The same formula composed from ops (matmul, masked softmax, dropout, matmul): the reference the
// fused kernel is tested against (its dropout draws the same mask as the fused kernel's when the
// generator is at the same state).
Tensor softmax_attention_composed(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& opts = {},
                                  double dropout = 0.0, bool training = false);

class SoftmaxAttention : public AttentionMechanism {
 public:
  SoftmaxAttention(int64_t heads, int64_t head_dim, double dropout = 0.0);
  Tensor forward(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& opts) override;
  Tensor attention_matrix(const Tensor& q, const Tensor& k, const AttentionOptions& opts) override;
  AttentionSupport support() const override { return {true, true, true, false}; }
  std::string extra_repr() const override;
  double dropout() const { return dropout_; }

 private:
  double dropout_;
};

// The factory registered as "softmax".
std::shared_ptr<AttentionMechanism> make_softmax(const AttentionSpec& spec, int64_t heads, int64_t head_dim);
// What softmax is, for the registry (attention/registry.h): summary, support, options, test specs.
AttentionInfo softmax_info();

}  // namespace linea::attn
