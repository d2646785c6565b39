// Linear randomized attention (see lara.h): segment landmarks by matmul with a constant
// membership matrix, then the proposal, importance weights and mixture of the paper, composed
// from differentiable ops batched over [B, H]: the [B, H, N, C] mixture weights by one fused op,
// the proposals' [B, H, C, C] weights by another, f_c and its log-sum-exp by the fused softmax
// attention of the landmarks over the keys; all [.., C, ..] tensors, nothing of size N x M.
#include "attention/lara/lara.h"

#include <cmath>
#include <tuple>

namespace linea::attn {

namespace {
// The floor of the mixture's alpha_nc (so that log alpha stays finite).
constexpr double kAlphaFloor = 1e-8;
}  // namespace

LinearRandomizedAttention::LinearRandomizedAttention(int64_t heads, int64_t head_dim, int64_t samples,
                                                     Proposal proposal, bool adaptive, double noise, double beta)
    : AttentionMechanism("LinearRandomizedAttention", heads, head_dim),
      samples_(samples),
      proposal_(proposal),
      noise_(noise),
      beta_(beta) {
  LINEA_CHECK(samples > 0, "lara: samples must be positive, got ", samples);
  LINEA_CHECK(samples <= kMaxRandomFeatures, "lara: samples ", samples, " is more than the limit of ",
              kMaxRandomFeatures);
  LINEA_CHECK(std::isfinite(noise) && noise >= 0, "lara: noise must be >= 0, got ", noise);
  LINEA_CHECK(std::isfinite(beta), "lara: beta must be finite, got ", beta);
  if (adaptive) {
    mu_proj_ = register_module("mu_proj", std::make_shared<nn::Linear>(head_dim, head_dim));
    mu_norm_ = register_module("mu_norm", std::make_shared<nn::LayerNorm>(head_dim));
  }
}

std::string LinearRandomizedAttention::extra_repr() const {
  return "heads=" + std::to_string(heads()) + ", head_dim=" + std::to_string(head_dim()) +
         ", samples=" + std::to_string(samples_) + ", proposal=" + (proposal_ == Proposal::QK ? "qk" : "mixed") +
         ", adaptive=" + (adaptive() ? "1" : "0") + ", noise=" + nn::detail::fmt_double(noise_) +
         ", beta=" + nn::detail::fmt_double(beta_);
}

std::vector<int64_t> LinearRandomizedAttention::segment_sizes(int64_t N, int64_t C) {
  LINEA_CHECK(N > 0 && C > 0, "lara: segment_sizes needs N > 0 and C > 0, got N = ", N, ", C = ", C);
  const int64_t Ce = std::min(C, N), base = N / Ce, longer = N % Ce;
  std::vector<int64_t> sizes(static_cast<size_t>(Ce), base);
  for (int64_t c = Ce - longer; c < Ce; ++c) sizes[static_cast<size_t>(c)] = base + 1;  // the last ones are longer
  return sizes;
}

const LinearRandomizedAttention::Segments& LinearRandomizedAttention::segments(int64_t N, const TensorOptions& opts) {
  const int64_t Ce = std::min(samples_, N);
  const Tensor& m = segments_.member;
  if (m.defined() && m.size(1) == N && m.dtype() == opts.dtype && m.device() == opts.device) return segments_;
  // Setup of two constant [C_eff, N] matrices (C_eff * N host values), not a loop of the forward.
  std::vector<double> member(static_cast<size_t>(Ce * N), 0.0), mean(member.size(), 0.0);
  int64_t start = 0, c = 0;
  for (int64_t len : segment_sizes(N, samples_)) {
    for (int64_t n = start; n < start + len; ++n) {
      member[static_cast<size_t>(c * N + n)] = 1.0;
      mean[static_cast<size_t>(c * N + n)] = scale_of(head_dim()) / static_cast<double>(len);
    }
    start += len;
    ++c;
  }
  segments_.member = from_vector<double>(member, {Ce, N}, TensorOptions(opts.dtype)).to(opts.device);
  segments_.scaled_mean = from_vector<double>(mean, {Ce, N}, TensorOptions(opts.dtype)).to(opts.device);
  return segments_;
}

LinearRandomizedAttention::Parts LinearRandomizedAttention::compute(const Tensor& q, const Tensor& k, const Tensor& v,
                                                                    const AttentionOptions& opts, const char* who) {
  check_attention_inputs(who, q, k, k, opts);
  LINEA_CHECK(!opts.causal, "lara: causal attention is not supported (its landmarks summarize whole segments)");
  LINEA_CHECK(k.size(2) == q.size(2), "lara: only self-attention is supported (M == N: query and key segments pair ",
              "up as landmarks), got q ", shape_str(q.shape()), " and k ", shape_str(k.shape()));
  LINEA_CHECK(is_floating(q.dtype()), who, ": expected float32/float64 inputs, got ", dtype_name(q.dtype()));
  LINEA_CHECK(q.size(1) == heads() && q.size(3) == head_dim(), who, ": built for ", heads(), " heads of dim ",
              head_dim(), ", got q ", shape_str(q.shape()));
  const int64_t B = q.size(0), H = q.size(1), N = q.size(2), D = q.size(3);
  Tensor pad = padded_keys(opts);  // Bool [B, 1, 1, N] (true = padded) or undefined
  // q~ = s q and k~ = s k are never formed: their readers take q or k and s (the segment means in
  // their matrix, |k~|^2 in sq_norm's scale, the landmarks' attention and the mixture weights in
  // their scales), two [B, H, N, D] passes fewer each way.
  const double s = scale_of(D);

  // Segment means.
  const Segments& seg = segments(N, q.options());
  const int64_t C = seg.member.size(0);
  Tensor qbar = matmul(seg.scaled_mean, q);  // q-_c [B, H, C, D] (of q~)
  Tensor kbar;                               // k-_c [B, H, C, D] (of k~), padded keys left out
  if (!pad.defined()) {
    kbar = matmul(seg.scaled_mean, k);
  } else {
    Tensor wk = seg.member * (~pad).to(q.dtype());           // [B,1,C,N]
    Tensor cnt = clamp(sum(wk, {-1}, true), 1.0, INFINITY);  // [B,1,C,1]; all padded: 0 / 1 = 0
    kbar = matmul(wk / (cnt * (1.0 / s)), k);                // [B,1,C,N] @ [B,H,N,D]
  }

  // Proposal means mu_c [B, H, C, D].
  Tensor mu;
  if (proposal_ == Proposal::QK) {
    mu = add(qbar, kbar);
  } else {  // q-_c + sum_c' softmax_c'(k-_c.k-_c') k-_c'
    mu = add(qbar, matmul(softmax(matmul(kbar, transpose(kbar, -2, -1)), -1), kbar));
  }
  if (mu_proj_) mu = mu_norm_->forward(mu_proj_->forward(mu));

  // w_c = mu_c + noise eps_c (training), mu_c (eval).
  Tensor w = mu;
  if (is_training()) {
    Tensor eps = sample("eps", {B, H, C, D}, q, [&] { return normal_per_example({B, H, C, D}, 0.0, 1.0, q.options()); });
    w = add(mu, mul(eps, noise_));
  }

  // f_c = sum_m softmax_m(log xi(k~_m, w_c)) v_m and lse_k = logsumexp_m log xi(k~_m, w_c) [B, H, C],
  // padded keys left out: softmax attention of the landmarks w over k~ with the key bias -|k~|^2/2.
  // A batch whose keys are all padded: f 0, and lse -inf raised to what masked_logsumexp gives
  // (so that log u stays finite).
  Parts parts;
  Tensor lse_k;
  if (v.defined()) {
    std::tie(parts.f, lse_k) =
        scaled_dot_product_attention_lse(w, k, v, s, false, 0, key_padding_bool(opts), sq_norm(k, -0.5 * s * s));
    if (pad.defined()) lse_k = clamp(lse_k, 0.5 * dtype_lowest(q.dtype()), INFINITY);
  } else {
    Tensor lk = log_xi(w, scaled(k));  // [B, H, C, M], padded keys -inf
    parts.probs = masked_softmax(lk, pad, -1);
    lse_k = masked_logsumexp(lk, pad, -1, /*keepdim=*/false);
  }
  // The balance heuristic's proposal weights self_w_c and the mixture's bias_c = lse_k_c - l_cc
  // (l_cc' = log xi(mu_c', w_c)), fused (proposal_weights composes them); then the [B, H, N, C]
  // part, fused (mixture_weights composes it).
  auto [self_w, bias] = lara_proposals(w, mu, lse_k);
  parts.mix = lara_mixture(q, qbar, w, self_w, bias, beta_, kAlphaFloor, s);
  return parts;
}

std::pair<Tensor, Tensor> proposal_weights(const Tensor& w, const Tensor& mu, const Tensor& lse_k) {
  Tensor l = log_xi(w, mu);                                      // [B, H, C, C]
  Tensor l_diag = sub(sum(mul(w, mu), {-1}), sq_norm(mu, 0.5));  // its diagonal [B, H, C]
  return {exp(sub(l_diag, logsumexp(l, {-1}))), sub(lse_k, l_diag)};
}

Tensor mixture_weights(const Tensor& qs, const Tensor& qbar, const Tensor& w, const Tensor& self_w, const Tensor& bias,
                       double beta) {
  // t_nc = softmax over n of q~_n.q-_c [B, H, N, C], centred over c: alpha_nc.
  Tensor t = softmax(matmul(qs, transpose(qbar, -2, -1)), 2);
  Tensor alpha = clamp(add(unsqueeze(self_w, 2), mul(sub(t, mean(t, {-1}, true)), beta)), kAlphaFloor, INFINITY);
  // log u_nc = log alpha_nc + log xi(q~_n, w_c) + logsumexp_m log xi(k~_m, w_c) - l_cc  [B, H, N, C]
  Tensor lq = transpose(log_xi(w, qs), -2, -1);
  Tensor log_u = add(add(log(alpha), lq), unsqueeze(bias, 2));
  return softmax(log_u, -1);
}

Tensor LinearRandomizedAttention::forward(const Tensor& q, const Tensor& k, const Tensor& v,
                                          const AttentionOptions& opts) {
  check_attention_inputs("lara", q, k, v, opts);
  Parts p = compute(q, k, v, opts, "lara");
  // out_n = sum_c softmax_c(log u_nc) f_c: [B, H, N, C] @ [B, H, C, Dv]
  return matmul(p.mix, p.f);
}

Tensor LinearRandomizedAttention::attention_matrix(const Tensor& q, const Tensor& k, const AttentionOptions& opts) {
  Parts p = compute(q, k, Tensor(), opts, "lara attention_matrix");
  return matmul(p.mix, p.probs);  // [B, H, N, M]
}

std::shared_ptr<AttentionMechanism> make_lara(const AttentionSpec& spec, int64_t heads, int64_t head_dim) {
  const int64_t samples = spec.get_int("samples", 16);
  LINEA_CHECK(samples > 0, "attention spec '", spec.str(), "': lara: samples must be positive, got ", samples);
  const std::string proposal = spec.get_string("proposal", "qk");
  LINEA_CHECK(proposal == "qk" || proposal == "mixed", "attention spec '", spec.str(),
              "': lara: proposal must be qk or mixed, got '", proposal, "'");
  const double noise = spec.get_double("noise", 1.0);
  LINEA_CHECK(noise >= 0, "attention spec '", spec.str(), "': lara: noise must be >= 0, got ", noise);
  return std::make_shared<LinearRandomizedAttention>(
      heads, head_dim, samples,
      proposal == "qk" ? LinearRandomizedAttention::Proposal::QK : LinearRandomizedAttention::Proposal::Mixed,
      spec.get_bool("adaptive", false), noise, spec.get_double("beta", 1.0));
}

AttentionInfo lara_info() {
  AttentionInfo i;
  i.name = "lara";
  i.summary = "linear randomized attention: C proposals from segment landmarks, multiple importance sampling, O(C L)";
  i.support = {false, false, false, false};
  i.options = {{"samples", "16", "landmarks C (proposals)"},
               {"proposal", "qk", "qk: segment means of q and k; mixed: the key-landmark attention variant (ViT)"},
               {"adaptive", "0", "1: proposal means through LayerNorm(Linear(.))"},
               {"noise", "1", "scale of the proposals' noise in training"},
               {"beta", "1", "weight of the query-specific term of the mixture weights"}};
  i.factory = make_lara;
  i.test_specs = {"lara:samples=3", "lara:samples=2,proposal=mixed", "lara:samples=2,adaptive=1"};
  i.count_option = "samples";
  return i;
}

}  // namespace linea::attn
