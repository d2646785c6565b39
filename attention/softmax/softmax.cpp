// The softmax mechanism (see softmax.h): the fused kernel (either device, dropout included); the
// formula composed from differentiable ops is the reference it is tested against.
#include "attention/softmax/softmax.h"

#include <cmath>

#include "nn/layers.h"

namespace linea::attn {

namespace {
void check_softmax_inputs(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& opts,
                          double dropout_p) {
  check_attention_inputs("softmax attention", q, k, v, opts);
  LINEA_CHECK(is_floating(q.dtype()), "softmax attention: expected float32/float64 inputs, got ",
              dtype_name(q.dtype()));
  LINEA_CHECK(dropout_p >= 0.0 && dropout_p < 1.0, "softmax attention: dropout must be in [0, 1), got ", dropout_p);
}
}  // namespace

bool fused_kernel_keeps_probs(const Tensor& q, const Tensor& k) {
  const double prob_bytes = static_cast<double>(q.size(0)) * static_cast<double>(q.size(1)) *
                            static_cast<double>(q.size(2)) * static_cast<double>(k.size(2)) *
                            static_cast<double>(dtype_size(q.dtype()));
  return prob_bytes <= kKeepProbsBytes;
}

Tensor softmax_attention(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& opts,
                         double dropout_p, bool training) {
  check_softmax_inputs(q, k, v, opts, dropout_p);
  return scaled_dot_product_attention(q, k, v, 1.0 / std::sqrt(static_cast<double>(q.size(3))), opts.causal,
                                      opts.query_offset, key_padding_bool(opts), fused_kernel_keeps_probs(q, k),
                                      training ? dropout_p : 0.0);
}

Tensor softmax_attention_composed(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& opts,
                                  double dropout_p, bool training) {
  check_softmax_inputs(q, k, v, opts, dropout_p);
  const int64_t N = q.size(2), M = k.size(2), D = q.size(3);
  // scores [B, H, N, M] = q k^T / sqrt(D) (k^T a transposed view: no copy; the scale in the GEMM)
  Tensor scores = matmul(q, transpose(k, -2, -1), 1.0 / std::sqrt(static_cast<double>(D)));
  Tensor attn = masked_softmax(scores, attention_mask(opts, N, M, q.device()), -1);  // mask [B|1, 1, N, M]
  if (training && dropout_p > 0.0) attn = dropout(attn, dropout_p, true);
  return matmul(attn, v);  // [B, H, N, M] @ [B, H, M, Dv] -> [B, H, N, Dv]
}

SoftmaxAttention::SoftmaxAttention(int64_t heads, int64_t head_dim, double dropout)
    : AttentionMechanism("SoftmaxAttention", heads, head_dim), dropout_(dropout) {
  LINEA_CHECK(dropout >= 0.0 && dropout < 1.0, "SoftmaxAttention: dropout must be in [0, 1), got ", dropout);
}

Tensor SoftmaxAttention::forward(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& opts) {
  return softmax_attention(q, k, v, opts, dropout_, is_training());
}

Tensor SoftmaxAttention::attention_matrix(const Tensor& q, const Tensor& k, const AttentionOptions& opts) {
  check_attention_inputs("softmax attention_matrix", q, k, k, opts);
  const double scale = 1.0 / std::sqrt(static_cast<double>(q.size(3)));
  return masked_softmax(matmul(q, transpose(k, -2, -1), scale), attention_mask(opts, q.size(2), k.size(2), q.device()),
                        -1);
}

std::string SoftmaxAttention::extra_repr() const {
  return "heads=" + std::to_string(heads()) + ", head_dim=" + std::to_string(head_dim()) +
         ", dropout=" + nn::detail::fmt_double(dropout_);
}

std::shared_ptr<AttentionMechanism> make_softmax(const AttentionSpec& spec, int64_t heads, int64_t head_dim) {
  return std::make_shared<SoftmaxAttention>(heads, head_dim, spec.get_double("dropout", 0.0));
}

AttentionInfo softmax_info() {
  AttentionInfo i;
  i.name = "softmax";
  i.summary = "exact scaled dot-product attention, O(L^2)";
  i.support = {true, true, true, false};
  i.options = {{"dropout", "0", "dropout on the attention probabilities in training"}};
  i.factory = make_softmax;
  i.test_specs = {"softmax"};
  return i;
}

}  // namespace linea::attn
