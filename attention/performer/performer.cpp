// The `performer` mechanism (see performer.h): FAVOR+ random features, the bidirectional linear
// product, the causal one (fused chunked prefix sums) and its decoding step, and the spec factory.
//
// How the ratio stays finite: the mechanism never forms phi itself but phi times a detached
// positive factor that is constant over what the ratio sums (one per query row, one per (b, h)
// for the keys), so it cancels in out_n = phi(q_n).sum_m phi(k_m) v_m^T / phi(q_n).sum_m phi(k_m)
// and, being detached, leaves the gradient of the ratio unchanged (the ratio does not depend on
// it). The fused ops (favor_attention, linear_attention, causal_linear_attention) take numerator
// and denominator from one product: v gets a column of ones, so its last column is
// phi(q_n).sum_m phi(k_m). favor_attention (the softmax map; causal when the queries are the keys'
// positions) computes the features too, with the stabilizers of positive_features, and
// favor_attention_step a decoding step of them.
#include "attention/performer/performer.h"

#include <algorithm>
#include <cmath>

namespace linea::attn {

namespace {

// Absolute guard on the (stabilized) denominator: only a row that sees no key at all (0 / 0),
// or whose features underflowed entirely, is affected; it keeps the output finite (zero for 0/0).
// Chosen so that 1/guard and the backward's g/guard stay finite in float32 too.
constexpr double kDenGuard = 1e-30;
// The additive floor of the relu feature map phi = relu(W x~) + 1e-3.
constexpr double kReluFloor = 1e-3;

// W x for every row: x [B, H, L, D], omega [H, S, D] -> [B, H, L, S] (W^T is a view).
Tensor projections(const Tensor& x, const Tensor& omega) { return matmul(x, transpose(omega, -2, -1)); }

// Keeps |den| >= kDenGuard with den's sign (sign of 0 taken as +), so the trf map's signed
// denominators are not flipped; for the positive maps this is max(den, guard).
Tensor guard_denominator(const Tensor& den) {
  const Tensor d = den.detach();
  const Tensor signed_guard = where(d >= 0.0, scalar_tensor(kDenGuard, d.options()), -kDenGuard);
  return where(abs(d) < kDenGuard, signed_guard, den);
}

// The detached per-(b, h) stabilizer of key log-factors l [B, H, M, X]: the max over the unpadded
// keys and X (pad Bool [B, 1, M, 1] or undefined). Padded entries count as the lowest finite
// value; a (b, h) with every key padded gets that value (its rows are zeroed anyway).
Tensor key_stabilizer(const Tensor& l, const Tensor& pad) {
  Tensor lf = pad.defined() ? masked_fill(l.detach(), pad, dtype_lowest(l.dtype())) : l.detach();
  return max(lf, {2, 3}, /*keepdim=*/true);  // [B, H, 1, 1]
}

void check_inputs(const char* who, const AttentionMechanism& self, const Tensor& q, const Tensor& k,
                  const Tensor& v, const AttentionOptions& opts) {
  check_attention_inputs(who, q, k, v, opts);
  LINEA_CHECK(is_floating(q.dtype()), who, ": expected float32/float64 inputs, got ", dtype_name(q.dtype()));
  LINEA_CHECK(q.size(1) == self.heads() && q.size(3) == self.head_dim(), who, ": built for ", self.heads(),
              " heads of dim ", self.head_dim(), " (q [B, ", self.heads(), ", N, ", self.head_dim(), "]), got q ",
              shape_str(q.shape()));
  LINEA_CHECK(q.size(2) > 0 && k.size(2) > 0, who, ": empty sequence: q ", shape_str(q.shape()), ", k ",
              shape_str(k.shape()));
}

}  // namespace

FeatureMap parse_feature_map(const std::string& name) {
  if (name == "softmax") return FeatureMap::Softmax;
  if (name == "relu") return FeatureMap::Relu;
  if (name == "trf") return FeatureMap::Trf;
  LINEA_FAIL("performer: unknown feature_map '", name, "' (expected softmax, relu or trf)");
}

const char* feature_map_name(FeatureMap kind) {
  switch (kind) {
    case FeatureMap::Softmax: return "softmax";
    case FeatureMap::Relu: return "relu";
    case FeatureMap::Trf: return "trf";
  }
  return "?";
}

Tensor performer_features(const Tensor& x, const Tensor& omega, FeatureMap kind) {
  raw::check_defined("performer_features", x, "x_scaled");
  raw::check_defined("performer_features", omega, "omega");
  LINEA_CHECK(x.dim() == 4 && omega.dim() == 3 && omega.size(0) == x.size(1) && omega.size(2) == x.size(3),
              "performer_features: expected x_scaled [B, H, L, D] and omega [H, S, D], got x_scaled ",
              shape_str(x.shape()), ", omega ", shape_str(omega.shape()));
  raw::check_same_dtype("performer_features", x, omega);
  raw::check_same_device("performer_features", x, omega);
  const double inv_sqrt_s = 1.0 / std::sqrt(static_cast<double>(omega.size(1)));
  Tensor wx = projections(x, omega);  // [B, H, L, S]
  switch (kind) {
    case FeatureMap::Softmax:  // exp(W x - |x|^2/2) / sqrt(S)
      return mul(exp(sub(wx, unsqueeze(sq_norm(x, 0.5), -1))), inv_sqrt_s);
    case FeatureMap::Relu:  // relu(W x) + 1e-3
      return add(relu(wx), kReluFloor);
    case FeatureMap::Trf:  // exp(|x|^2/2) [sin(W x), cos(W x)] / sqrt(S)
      return mul(cat({sin(wx), cos(wx)}, -1), mul(exp(unsqueeze(sq_norm(x, 0.5), -1)), inv_sqrt_s));
  }
  LINEA_FAIL("performer_features: bad feature map");
}

// ---- PerformerAttention -------------------------------------------------------------------------
PerformerAttention::PerformerAttention(int64_t heads, int64_t head_dim, int64_t features, FeatureMap feature_map,
                                       int64_t redraw, int64_t chunk, bool orthogonal)
    : AttentionMechanism("PerformerAttention", heads, head_dim),
      features_(features),
      feature_map_(feature_map),
      chunk_(chunk),
      orthogonal_(orthogonal) {
  LINEA_CHECK(heads > 0 && head_dim > 0, "performer: heads and head_dim must be positive, got ", heads, " and ",
              head_dim);
  LINEA_CHECK(features > 0, "performer: features must be positive, got ", features);
  LINEA_CHECK(features <= kMaxRandomFeatures, "performer: features ", features, " is more than the limit of ",
              kMaxRandomFeatures);
  LINEA_CHECK(redraw >= 0, "performer: redraw must be >= 0 (0 = never), got ", redraw);
  LINEA_CHECK(chunk > 0, "performer: chunk must be positive, got ", chunk);
  init_redraw(redraw);
  // A buffer, so W is saved in the state dict and moved with the model; drawn now so that an
  // eval-only model (never trained) has features too.
  omega_ = register_buffer("omega", zeros({heads, features, head_dim}, TensorOptions(DType::Float32)));
  redraw_features();
}

void PerformerAttention::redraw_features() {
  const int64_t H = heads(), S = features_, D = head_dim();
  // Float64 on the CPU generator (orthogonal_gaussian draws there too), then to the buffer's place.
  Tensor w = orthogonal_ ? orthogonal_gaussian(H, S, D) : randn({H, S, D}, TensorOptions(DType::Float64));
  nn::replace_data(omega_, w.to(omega_.dtype()).to(omega_.device()));
}

Tensor PerformerAttention::current_omega(const Tensor& like) {
  const bool due = redraw_due();
  return sample("omega", {heads(), features_, head_dim()}, like, [&] {
    if (due) redraw_features();
    // A copy, so last_samples()/frozen values keep this W when the buffer is redrawn later.
    return clone(omega_).to(like.device()).to(like.dtype());
  });
}

Tensor PerformerAttention::query_features(const Tensor& q, const Tensor& omega) const {
  const Tensor qs = scaled(q);
  const double inv_sqrt_s = 1.0 / std::sqrt(static_cast<double>(features_));
  switch (feature_map_) {
    case FeatureMap::Softmax:  // exp(W q~ - |q~|^2/2 - the row's max) / sqrt(S), fused
      return positive_features(qs, omega, /*per_row=*/true, Tensor());  // [B, H, N, S]
    case FeatureMap::Relu:  // bounded, no stabilizer needed
      return relu(projections(qs, omega)) + kReluFloor;
    case FeatureMap::Trf: {
      // phi = exp(|q~|^2/2) [sin, cos] / sqrt(S): the exp is one factor for the whole row, i.e.
      // exactly its stabilizer, so it cancels and is left out.
      Tensor wq = projections(qs, omega);                // [B, H, N, S]
      return cat({sin(wq), cos(wq)}, -1) * inv_sqrt_s;  // [B, H, N, 2S]
    }
  }
  LINEA_FAIL("performer: bad feature map");
}

PerformerAttention::KeyParts PerformerAttention::key_parts(const Tensor& k, const Tensor& omega) const {
  const Tensor ks = scaled(k);
  switch (feature_map_) {
    case FeatureMap::Softmax:
      break;  // fused: positive_features, favor_attention(_step)
    case FeatureMap::Relu:
      return {Tensor(), relu(projections(ks, omega)) + kReluFloor};
    case FeatureMap::Trf: {
      Tensor wk = projections(ks, omega);
      return {unsqueeze(sq_norm(ks, 0.5), -1), cat({sin(wk), cos(wk)}, -1)};  // exp(|k~|^2/2) [sin, cos]
    }
  }
  LINEA_FAIL("performer: key_parts of the ", feature_map_name(feature_map_), " feature map");
}

Tensor PerformerAttention::stabilized_keys(const KeyParts& p, const Tensor& c, const Tensor& pad) const {
  const double inv_sqrt_s = 1.0 / std::sqrt(static_cast<double>(features_));
  Tensor phi = p.base;
  if (p.log_scale.defined()) {
    // Padded entries at the lowest finite value: exp(...) = 0, they cannot overflow.
    Tensor l = pad.defined() ? masked_fill(p.log_scale, pad, dtype_lowest(p.log_scale.dtype())) : p.log_scale;
    phi = p.base * (exp(l - c) * inv_sqrt_s);
  }
  // Padded keys add to neither sum: their feature rows are zero.
  if (pad.defined()) phi = phi * (~pad).to(phi.dtype());  // keep [B, 1, M, 1]
  return phi;
}

std::pair<Tensor, Tensor> PerformerAttention::features_of(const Tensor& q, const Tensor& k,
                                                          const AttentionOptions& opts) {
  const Tensor omega = current_omega(q);  // [H, S, D]
  const int64_t B = k.size(0), M = k.size(2);
  Tensor pad = key_padding_bool(opts);
  // The softmax map's keys: one stabilizer per (b, h), fused (stabilized_keys' formula).
  if (feature_map_ == FeatureMap::Softmax)
    return {query_features(q, omega), positive_features(scaled(k), omega, /*per_row=*/false, pad)};
  if (pad.defined()) pad = reshape(pad, {B, 1, M, 1});
  KeyParts parts = key_parts(k, omega);
  Tensor c = parts.log_scale.defined() ? key_stabilizer(parts.log_scale, pad) : Tensor();
  return {query_features(q, omega), stabilized_keys(parts, c, pad)};
}

Tensor PerformerAttention::forward(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& opts) {
  check_inputs("performer", *this, q, k, v, opts);
  const int64_t N = q.size(2), M = k.size(2);
  // Features and product in one fused op (causal: where query n sits at key n's position).
  if (feature_map_ == FeatureMap::Softmax && (!opts.causal || (opts.query_offset == 0 && N == M)))
    return favor_attention(q, k, v, current_omega(q), scale_of(q.size(3)), key_padding_bool(opts), kDenGuard,
                           opts.causal, chunk_);
  auto [phi_q, phi_k] = features_of(q, k, opts);  // [B, H, N, F], [B, H, M, F]
  if (!opts.causal) return linear_attention(phi_q, phi_k, v, kDenGuard);  // fused, on either device
  // Query n sits at position o + n among the keys (o = query_offset): the keys before o come in
  // as the state (their sums phi(k)^T [v, 1]), the keys [o, o + N) align with the queries (zero
  // rows appended where the keys end first: a zero key adds nothing), later keys are never seen.
  // The fused op scans chunks of `chunk` rows (see causal_linear_attention).
  const int64_t o = opts.query_offset, m0 = std::min(o, M), m1 = std::min(M, o + N);
  Tensor state;
  if (m0 > 0) state = matmul(transpose(narrow(phi_k, 2, 0, m0), -2, -1), pad(narrow(v, 2, 0, m0), -1, 0, 1, 1.0));
  const auto aligned = [&](const Tensor& x) {
    Tensor y = m0 > 0 || m1 < M ? narrow(x, 2, m0, m1 - m0) : x;
    return m1 - m0 < N ? pad(y, 2, 0, N - (m1 - m0)) : y;
  };
  return causal_linear_attention(phi_q, aligned(phi_k), aligned(v), state, chunk_, kDenGuard);
}

Tensor PerformerAttention::attention_matrix(const Tensor& q, const Tensor& k, const AttentionOptions& opts) {
  check_inputs("performer attention_matrix", *this, q, k, k, opts);
  auto [phi_q, phi_k] = features_of(q, k, opts);
  Tensor a = matmul(phi_q, transpose(phi_k, -2, -1));  // [B, H, N, M]
  if (opts.causal) a = masked_fill(a, causal_hidden(q.size(2), k.size(2), opts.query_offset, q.device()), 0.0);
  return a / guard_denominator(sum(a, {-1}, /*keepdim=*/true));
}

// ---- decoding ------------------------------------------------------------------------------------
namespace {
// The recurrent state of causal performer: per (b, h) the running sums over the keys so far,
// sums = sum_m phi~(k_m) [v_m, 1]^T [B, H, F, Dv+1], where phi~ carries the stabilizer exp(-c) of
// the largest key log-factor seen so far (c [B, H, 1, 1]; undefined for the relu map), and the
// features W used from the first step on.
class PerformerState : public DecodeState {
 public:
  Tensor sums, c, omega;
  void reorder(const Tensor& index) override {
    if (!sums.defined()) return;
    const Tensor i = index.to(sums.device());
    sums = index_select(sums, 0, i);
    if (c.defined()) c = index_select(c, 0, i);
  }
};
}  // namespace

std::unique_ptr<DecodeState> PerformerAttention::start_decoding() const { return std::make_unique<PerformerState>(); }

Tensor PerformerAttention::decode_step(const Tensor& q, const Tensor& k, const Tensor& v, DecodeState& state_in,
                                       const Tensor& key_padding) {
  auto* st = dynamic_cast<PerformerState*>(&state_in);
  LINEA_CHECK(st != nullptr, "performer decode_step: the state was not made by this mechanism's start_decoding");
  check_step(q, k, v);
  const int64_t B = q.size(0), T = q.size(2), Dv = v.size(3);
  if (st->sums.defined())
    LINEA_CHECK(st->sums.size(0) == B && st->sums.size(3) == Dv + 1, "performer decode_step: q ",
                shape_str(q.shape()), ", v ", shape_str(v.shape()), " do not continue the state's ", st->sums.size(0),
                " rows of value dim ", st->sums.size(3) - 1);
  if (!st->omega.defined())  // the features of the whole sequence: no redraw while decoding
    st->omega = sample("omega", {heads(), features_, head_dim()}, q,
                       [&] { return clone(omega_).to(q.device()).to(q.dtype()); });
  Tensor pad = key_padding_bool(key_padding);
  if (pad.defined())
    LINEA_CHECK(pad.dim() == 2 && pad.size(0) == B && pad.size(1) == T, "performer decode_step: key_padding must be [",
                B, ", ", T, "], got ", shape_str(pad.shape()));
  if (feature_map_ == FeatureMap::Softmax) {  // features, sums and product in one fused op
    std::vector<Tensor> r = favor_attention_step(q, k, v, st->omega, scale_of(q.size(3)), pad, kDenGuard, st->sums,
                                                 st->c, chunk_);  // out, sums, c
    st->sums = r[1];
    st->c = r[2];
    advance(*st, T);
    return r[0];
  }
  if (pad.defined()) pad = reshape(pad, {B, 1, T, 1});
  Tensor phi_q = query_features(q, st->omega);  // [B, H, T, F]
  KeyParts parts = key_parts(k, st->omega);
  Tensor c = st->c;
  if (parts.log_scale.defined()) {
    // A larger key than any before: raise the stabilizer and rescale the sums to it.
    Tensor c_new = key_stabilizer(parts.log_scale, pad);
    if (c.defined()) {
      c_new = maximum(c, c_new);
      st->sums = st->sums * exp(c - c_new);
    }
    c = c_new;
  }
  Tensor phi_k = stabilized_keys(parts, c, pad);  // [B, H, T, F]
  // Earlier keys through the sums, the step's own keys causally; the sums move on past them.
  Tensor sums;
  Tensor out = causal_linear_attention(phi_q, phi_k, v, st->sums, chunk_, kDenGuard, &sums);
  st->sums = sums;
  st->c = c;
  advance(*st, T);
  return out;
}

std::string PerformerAttention::extra_repr() const {
  return "heads=" + std::to_string(heads()) + ", head_dim=" + std::to_string(head_dim()) +
         ", features=" + std::to_string(features_) + ", feature_map=" + feature_map_name(feature_map_) +
         ", redraw=" + std::to_string(redraw_every()) + ", chunk=" + std::to_string(chunk_) +
         ", orthogonal=" + (orthogonal_ ? "1" : "0");
}

std::shared_ptr<AttentionMechanism> make_performer(const AttentionSpec& spec, int64_t heads, int64_t head_dim) {
  const int64_t features = spec.get_int("features", 128);
  const FeatureMap feature_map = parse_feature_map(spec.get_string("feature_map", "softmax"));
  const int64_t redraw = spec.get_int("redraw", 1);
  const int64_t chunk = spec.get_int("chunk", 64);
  const bool orthogonal = spec.get_bool("orthogonal", true);
  return std::make_shared<PerformerAttention>(heads, head_dim, features, feature_map, redraw, chunk, orthogonal);
}

AttentionInfo performer_info() {
  AttentionInfo i;
  i.name = "performer";
  i.summary = "FAVOR+ random features (Performer), O(L F D); causal through prefix sums";
  i.support = {true, true, true, false};
  i.options = {{"features", "128", "random features F"},
               {"feature_map", "softmax", "softmax (positive FAVOR+), relu or trf (sin/cos)"},
               {"redraw", "1", "draw new features every N training forwards (0: never)"},
               {"chunk", "64", "positions per block of the causal prefix sums"},
               {"orthogonal", "1", "orthogonal blocks of feature rows"}};
  i.factory = make_performer;
  i.test_specs = {"performer:features=8", "performer:features=8,feature_map=relu",
                  "performer:features=4,feature_map=trf"};
  i.count_option = "features";
  return i;
}

}  // namespace linea::attn
