// Randomized attention (see ra.h): the component indices drawn by the fused sampler
// (sample_attention_keys), the samples w_ns, and the estimator through the fused softmax attention
// (the weights composed from ops for attention_matrix).
#include "attention/ra/ra.h"

namespace linea::attn {

RandomizedAttention::RandomizedAttention(int64_t heads, int64_t head_dim, int64_t samples, bool biased)
    : AttentionMechanism("RandomizedAttention", heads, head_dim), samples_(samples), biased_(biased) {
  LINEA_CHECK(samples > 0, "ra: samples must be positive, got ", samples);
  LINEA_CHECK(samples <= kMaxRandomFeatures, "ra: samples ", samples, " is more than the limit of ",
              kMaxRandomFeatures);
}

std::vector<std::string> RandomizedAttention::sample_names() const {
  if (biased_) return {"eps"};
  return {"eps", "ra_index"};
}

std::string RandomizedAttention::extra_repr() const {
  return "heads=" + std::to_string(heads()) + ", head_dim=" + std::to_string(head_dim()) +
         ", samples=" + std::to_string(samples_) + ", biased=" + (biased_ ? "1" : "0");
}

RandomizedAttention::Samples RandomizedAttention::draw(const Tensor& q, const Tensor& k, const AttentionOptions& opts,
                                                       const char* who) {
  check_attention_inputs(who, q, k, k, opts);
  LINEA_CHECK(!opts.causal, "ra: causal attention is not supported (randomized attention is bidirectional)");
  LINEA_CHECK(is_floating(q.dtype()), who, ": expected float32/float64 inputs, got ", dtype_name(q.dtype()));
  const int64_t B = q.size(0), H = q.size(1), N = q.size(2), D = q.size(3), M = k.size(2), S = samples_;
  Tensor qs = scaled(q), ks = scaled(k);  // q~ [B, H, N, D], k~ [B, H, M, D]

  // The component means of w_ns: [B, H, N, S, D] (unbiased) or [B, H, N, 1, D] (biased).
  Tensor centre;
  if (biased_) {
    // q~_n + sum_m pi_nm k~_m, pi_n = softmax_m(q~_n.k~_m) over the unpadded keys: fused.
    centre = unsqueeze(add(qs, scaled_dot_product_attention(qs, ks, ks, 1.0, false, 0, key_padding_bool(opts))), 3);
  } else {
    bool drew = false;
    Tensor index = sample("ra_index", {B, H, N, S}, q, [&] {
      drew = true;
      // m_ns ~ pi_n = softmax_m(q~_n.k~_m) over the unpadded keys, by inverse CDF at uniforms u_ns:
      // one fused op, no [N, M] probabilities or running sums in memory (no gradient)
      const Tensor u = uniform_per_example({B, H, N, S}, 0.0, 1.0, q.options());
      return sample_attention_keys(qs, ks, u, 1.0, key_padding_bool(opts));
    });
    if (!drew) {  // explicit or frozen values: check them once here (a host sync, but not in training draws)
      LINEA_CHECK(index.dtype() == DType::Int64, "ra: sample 'ra_index' must be int64, got ",
                  dtype_name(index.dtype()));
      const double lo = min(index).item(), hi = max(index).item();
      LINEA_CHECK(lo >= 0 && hi < static_cast<double>(M), "ra: sample 'ra_index' values must lie in [0, M = ", M,
                  "), got values in [", lo, ", ", hi, "]");
    }
    // k~_{m_ns}: row (b H + h) M + m_ns of k~ as [B H M, D], an embedding lookup (gradients flow
    // to the chosen rows; the index is constant). Its backward adds each row's gradients in
    // draw order, deterministic on CUDA too (see cuda/index.cu), and no index is expanded over D.
    const Tensor first_row = reshape(arange(0.0, static_cast<double>(B * H * M), static_cast<double>(M),
                                            TensorOptions(DType::Int64, q.device())),
                                     {B, H, 1, 1});
    Tensor k_sel = embedding(reshape(ks, {B * H * M, D}), index + first_row);  // [B, H, N, S, D]
    centre = add(unsqueeze(qs, 3), k_sel);
  }

  // w_ns = centre + eps_ns; biased RA in eval uses eps = 0, so its S samples coincide: one suffices.
  Tensor w = centre;
  if (!(biased_ && !is_training())) {
    Tensor eps = sample("eps", {B, H, N, S, D}, q, [&] { return normal_per_example({B, H, N, S, D}, 0.0, 1.0, q.options()); });
    w = add(centre, eps);
  }
  return {w, ks};
}

Tensor RandomizedAttention::weights(const Samples& d, const AttentionOptions& opts) {
  const int64_t B = d.w.size(0), H = d.w.size(1), N = d.w.size(2), Sw = d.w.size(3), D = d.w.size(4),
                M = d.ks.size(2);
  // softmax_m(log xi(k~_m, w_ns)), padded keys excluded: [B, H, N*Sw, M] -> average over s.
  Tensor p = masked_softmax(log_xi(reshape(d.w, {B, H, N * Sw, D}), d.ks), padded_keys(opts), -1);
  return mean(reshape(p, {B, H, N, Sw, M}), {3});  // [B, H, N, M]
}

Tensor RandomizedAttention::forward(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& opts) {
  check_attention_inputs("ra", q, k, v, opts);
  const Samples d = draw(q, k, opts, "ra");
  const int64_t B = d.w.size(0), H = d.w.size(1), N = d.w.size(2), Sw = d.w.size(3), D = d.w.size(4);
  // (1/Sw) sum_s softmax_m(w_ns.k~_m - |k~_m|^2/2) v_m: the fused attention over the N Sw rows
  // w_ns, xi's key term as a per-key bias; no [N, Sw, M] weights are kept.
  const Tensor bias = sq_norm(d.ks, -0.5);  // [B, H, M]
  const Tensor out = scaled_dot_product_attention(reshape(d.w, {B, H, N * Sw, D}), d.ks, v, 1.0, false, 0,
                                                  key_padding_bool(opts), false, 0.0, bias);
  return mean(reshape(out, {B, H, N, Sw, v.size(3)}), {3});  // [B, H, N, Dv]
}

Tensor RandomizedAttention::attention_matrix(const Tensor& q, const Tensor& k, const AttentionOptions& opts) {
  return weights(draw(q, k, opts, "ra attention_matrix"), opts);
}

std::shared_ptr<AttentionMechanism> make_ra(const AttentionSpec& spec, int64_t heads, int64_t head_dim) {
  const int64_t samples = spec.get_int("samples", 1);
  LINEA_CHECK(samples > 0, "attention spec '", spec.str(), "': ra: samples must be positive, got ", samples);
  return std::make_shared<RandomizedAttention>(heads, head_dim, samples, spec.get_bool("biased", false));
}

AttentionInfo ra_info() {
  AttentionInfo i;
  i.name = "ra";
  i.summary = "randomized attention: softmax attention estimated from S samples per query, O(L^2 S)";
  i.support = {false, true, false, false};
  i.options = {{"samples", "1", "samples S per query"},
               {"biased", "0", "1: the biased estimator (the mixture's expected component, deterministic in eval)"}};
  i.factory = make_ra;
  i.test_specs = {"ra:samples=2", "ra:samples=2,biased=1"};
  i.count_option = "samples";
  return i;
}

}  // namespace linea::attn
