// ReLU linear attention (see relu_linear.h).
#include "relu_linear.h"

#include "autograd/ops.h"

using namespace linea;

namespace example {

ReluLinearAttention::ReluLinearAttention(int64_t heads, int64_t head_dim, double eps)
    : attn::AttentionMechanism("ReluLinearAttention", heads, head_dim), eps_(eps) {
  LINEA_CHECK(eps > 0, "relu_linear: eps must be > 0, got ", eps);
}

Tensor ReluLinearAttention::forward(const Tensor& q, const Tensor& k, const Tensor& v,
                                    const attn::AttentionOptions& opts) {
  attn::check_attention_inputs("relu_linear attention", q, k, v, opts);
  LINEA_CHECK(!opts.causal, "relu_linear attention: no causal form (support() says so)");
  Tensor phi_q = relu(q), phi_k = relu(k);            // [B, H, N, D], [B, H, M, D]
  if (opts.key_padding_mask.defined()) {              // padded keys get phi = 0: they add nothing
    const Tensor pad = attn::key_padding_bool(opts);  // [B, M]
    phi_k = where(reshape(pad, {pad.size(0), 1, pad.size(1), 1}), 0.0, phi_k);
  }
  const Tensor kv = matmul(transpose(phi_k, 2, 3), v);   // [B, H, D, Dv]
  const Tensor z = unsqueeze(sum(phi_k, {2}), -1);       // [B, H, D, 1]
  return matmul(phi_q, kv) / (matmul(phi_q, z) + eps_);  // [B, H, N, Dv]
}

std::string ReluLinearAttention::extra_repr() const {
  return "heads=" + std::to_string(heads()) + ", head_dim=" + std::to_string(head_dim()) +
         ", eps=" + std::to_string(eps_);
}

attn::AttentionInfo relu_linear_info() {
  attn::AttentionInfo info;
  info.name = "relu_linear";
  info.summary = "linear attention with a ReLU feature map, O(L D^2)";
  info.support = {false, true, false, false};
  info.options = {{"eps", "1e-06", "added to the normalizer (a query that matches no key gets 0)"}};
  info.factory = [](const attn::AttentionSpec& spec, int64_t heads, int64_t head_dim) {
    return std::make_shared<ReluLinearAttention>(heads, head_dim, spec.get_double("eps", 1e-6));
  };
  info.test_specs = {"relu_linear", "relu_linear:eps=0.01"};
  return info;
}

void register_relu_linear() {
  for (const std::string& name : attn::registered_attentions())
    if (name == "relu_linear") return;
  attn::register_attention(relu_linear_info());
}

}  // namespace example
