// The `performer` mechanism (see performer.h): FAVOR+ random features, the bidirectional linear
// product, the chunked causal prefix sums, and the spec factory.
//
// How the ratio stays finite: the mechanism never forms phi itself but phi times a detached
// positive factor that is constant over what the ratio sums (one per query row, one per (b, h)
// for the keys), so it cancels in out_n = phi(q_n).sum_m phi(k_m) v_m^T / phi(q_n).sum_m phi(k_m)
// and, being detached, leaves the gradient of the ratio unchanged (the ratio does not depend on
// it). The numerator and the denominator come out of one product: v gets a column of ones, so the
// last output column is phi(q_n).sum_m phi(k_m).
#include "attention/performer/performer.h"

#include <algorithm>
#include <cmath>

namespace linea::attn {

namespace {

// Absolute guard on the (stabilized) denominator: only a row that sees no key at all (0 / 0),
// or whose features underflowed entirely, is affected; it keeps the output finite (zero for 0/0).
// Chosen so that 1/guard and the backward's g/guard stay finite in float32 too.
constexpr double kDenGuard = 1e-30;
// The additive floor of the relu kernel, as the phi = relu(W x~) + 1e-3.
constexpr double kReluFloor = 1e-3;

// W x for every row: x [B, H, L, D], omega [H, S, D] -> [B, H, L, S] (W^T is a view).
Tensor projections(const Tensor& x, const Tensor& omega) { return matmul(x, transpose(omega, -2, -1)); }

// Keeps |den| >= kDenGuard with den's sign (sign of 0 taken as +), so the trf kernel's signed
// denominators are not flipped; for the positive kernels this is max(den, guard).
Tensor guard_denominator(const Tensor& den) {
  const TensorOptions o(den.dtype(), den.device());
  Tensor d = den.detach();
  Tensor small = raw::binary(BinaryOp::Lt, raw::unary(UnaryOp::Abs, d), scalar_tensor(kDenGuard, o));
  Tensor signed_guard =
      raw::where(raw::binary(BinaryOp::Ge, d, scalar_tensor(0.0, o)), scalar_tensor(kDenGuard, o),
                 scalar_tensor(-kDenGuard, o));
  return where(small, signed_guard, den);
}

// exp(l - c) for key log-factors l [B, H, M, X] with one detached c per (b, h): the max over the
// unpadded keys and X. Padded entries are filled with the lowest finite value first, so they give
// exp(...) = 0 and cannot overflow; pad is Bool [B, 1, M, 1] or undefined. A (b, h) with every key
// padded gets exp(0) = 1 rows here; the caller zeroes padded rows.
Tensor stabilized_key_exp(const Tensor& l, const Tensor& pad) {
  Tensor lf = pad.defined() ? masked_fill(l, pad, lowest(l.dtype())) : l;
  Tensor c = raw::reduce(ReduceOp::Max, lf.detach(), {2, 3}, /*keepdim=*/true);  // [B, H, 1, 1]
  return exp(sub(lf, c));
}

// Float 0/1 [rows, cols] with 1 where key index j <= query index i (both counted from the same
// origin), on `like`'s device and dtype.
Tensor causal_keep(int64_t rows, int64_t cols, const Tensor& like) {
  const TensorOptions io(DType::Int64, like.device());
  Tensor r = raw::reshape(arange(0.0, static_cast<double>(rows), 1.0, io), {rows, 1});
  Tensor c = raw::reshape(arange(0.0, static_cast<double>(cols), 1.0, io), {1, cols});
  return raw::to_dtype(raw::binary(BinaryOp::Le, c, r), like.dtype());
}

void check_inputs(const char* who, const nn::AttentionKernel& self, const Tensor& q, const Tensor& k,
                  const Tensor& v, const nn::AttentionOptions& opts) {
  nn::check_attention_inputs(who, q, k, v, opts);
  LINEA_CHECK(is_floating(q.dtype()), who, ": expected float32/float64 inputs, got ", dtype_name(q.dtype()));
  LINEA_CHECK(q.size(1) == self.heads() && q.size(3) == self.head_dim(), who, ": built for ", self.heads(),
              " heads of dim ", self.head_dim(), " (q [B, ", self.heads(), ", N, ", self.head_dim(), "]), got q ",
              shape_str(q.shape()));
  LINEA_CHECK(q.size(2) > 0 && k.size(2) > 0, who, ": empty sequence: q ", shape_str(q.shape()), ", k ",
              shape_str(k.shape()));
}

}  // namespace

PerformerKernel parse_performer_kernel(const std::string& name) {
  if (name == "softmax") return PerformerKernel::Softmax;
  if (name == "relu") return PerformerKernel::Relu;
  if (name == "trf") return PerformerKernel::Trf;
  LINEA_FAIL("performer: unknown kernel '", name, "' (expected softmax, relu or trf)");
}

const char* performer_kernel_name(PerformerKernel kind) {
  switch (kind) {
    case PerformerKernel::Softmax: return "softmax";
    case PerformerKernel::Relu: return "relu";
    case PerformerKernel::Trf: return "trf";
  }
  return "?";
}

Tensor performer_features(const Tensor& x, const Tensor& omega, PerformerKernel kind) {
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
    case PerformerKernel::Softmax:  // exp(W x - |x|^2/2) / sqrt(S)
      return mul(exp(sub(wx, mul(sq_norm(x), 0.5))), inv_sqrt_s);
    case PerformerKernel::Relu:  // relu(W x) + 1e-3
      return add(relu(wx), kReluFloor);
    case PerformerKernel::Trf:  // exp(|x|^2/2) [sin(W x), cos(W x)] / sqrt(S)
      return mul(cat({sin(wx), cos(wx)}, -1), mul(exp(mul(sq_norm(x), 0.5)), inv_sqrt_s));
  }
  LINEA_FAIL("performer_features: bad kernel");
}

// ---- PerformerAttention -------------------------------------------------------------------------
PerformerAttention::PerformerAttention(int64_t heads, int64_t head_dim, int64_t features, PerformerKernel kernel,
                                       int64_t redraw, int64_t chunk, bool orthogonal)
    : nn::AttentionKernel("PerformerAttention", heads, head_dim),
      features_(features),
      kernel_(kernel),
      redraw_(redraw),
      chunk_(chunk),
      orthogonal_(orthogonal) {
  LINEA_CHECK(heads > 0 && head_dim > 0, "performer: heads and head_dim must be positive, got ", heads, " and ",
              head_dim);
  LINEA_CHECK(features > 0, "performer: features must be positive, got ", features);
  LINEA_CHECK(redraw >= 0, "performer: redraw must be >= 0 (0 = never), got ", redraw);
  LINEA_CHECK(chunk > 0, "performer: chunk must be positive, got ", chunk);
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
  return sample("omega", {heads(), features_, head_dim()}, like, [&] {
    if (is_training()) {
      // A new W on training draws 0, N, 2N, ... (redraw=N); eval never redraws.
      if (redraw_ > 0 && training_draws_ % redraw_ == 0) redraw_features();
      ++training_draws_;
    }
    // A copy, so last_samples()/frozen values keep this W when the buffer is redrawn later.
    return raw::clone(omega_).to(like.device()).to(like.dtype());
  });
}

std::pair<Tensor, Tensor> PerformerAttention::features_of(const Tensor& q, const Tensor& k,
                                                          const nn::AttentionOptions& opts) {
  const Tensor omega = current_omega(q);  // [H, S, D]
  const Tensor qs = scaled(q), ks = scaled(k);
  const int64_t B = k.size(0), M = k.size(2);
  const double inv_sqrt_s = 1.0 / std::sqrt(static_cast<double>(features_));
  Tensor pad = nn::key_padding_bool(opts);
  if (pad.defined()) pad = raw::reshape(pad, {B, 1, M, 1});
  Tensor phi_q, phi_k;
  switch (kernel_) {
    case PerformerKernel::Softmax: {
      // log phi = W x~ - |x~|^2/2 (- log sqrt(S)); queries: minus their row max over features.
      Tensor lq = sub(projections(qs, omega), mul(sq_norm(qs), 0.5));                 // [B, H, N, S]
      Tensor cq = raw::reduce(ReduceOp::Max, lq.detach(), {-1}, /*keepdim=*/true);  // [B, H, N, 1]
      phi_q = mul(exp(sub(lq, cq)), inv_sqrt_s);
      Tensor lk = sub(projections(ks, omega), mul(sq_norm(ks), 0.5));  // [B, H, M, S]
      phi_k = mul(stabilized_key_exp(lk, pad), inv_sqrt_s);
      break;
    }
    case PerformerKernel::Relu:  // bounded, no stabilizer needed
      phi_q = add(relu(projections(qs, omega)), kReluFloor);
      phi_k = add(relu(projections(ks, omega)), kReluFloor);
      break;
    case PerformerKernel::Trf: {
      // phi = exp(|x~|^2/2) [sin, cos] / sqrt(S). For a query, exp(|q~|^2/2) is one factor for
      // the whole row, i.e. exactly its stabilizer: it cancels, so it is left out. For keys it is
      // exp(|k~_m|^2/2 - max_m' |k~_m'|^2/2).
      Tensor wq = projections(qs, omega), wk = projections(ks, omega);  // [B, H, L, S]
      phi_q = mul(cat({sin(wq), cos(wq)}, -1), inv_sqrt_s);             // [B, H, N, 2S]
      Tensor scale_k = stabilized_key_exp(mul(sq_norm(ks), 0.5), pad);  // [B, H, M, 1]
      phi_k = mul(cat({sin(wk), cos(wk)}, -1), mul(scale_k, inv_sqrt_s));
      break;
    }
  }
  if (pad.defined()) {
    // Padded keys add to neither sum: their feature rows are zero.
    Tensor keep = raw::to_dtype(raw::binary(BinaryOp::Eq, pad, scalar_tensor(0.0, pad.options())), q.dtype());
    phi_k = mul(phi_k, keep);  // keep [B, 1, M, 1]
  }
  return {phi_q, phi_k};
}

Tensor PerformerAttention::forward(const Tensor& q, const Tensor& k, const Tensor& v,
                                   const nn::AttentionOptions& opts) {
  check_inputs("performer", *this, q, k, v, opts);
  const int64_t B = q.size(0), H = q.size(1), N = q.size(2), M = k.size(2), Dv = v.size(3);
  auto [phi_q, phi_k] = features_of(q, k, opts);  // [B, H, N, F], [B, H, M, F]
  // v with a column of ones [B, H, M, Dv+1]: one product gives numerator and denominator.
  Tensor v1 = cat({v, ones({B, H, M, 1}, TensorOptions(v.dtype(), v.device()))}, -1);
  Tensor out;  // [B, H, N, Dv+1]
  if (!opts.causal) {
    // sum_m phi(k_m) [v_m, 1]^T [B, H, F, Dv+1], then phi(q_n) times it.
    out = matmul(phi_q, matmul(transpose(phi_k, -2, -1), v1));
  } else {
    // Chunks of T queries [c0, c0+T): keys before c0 come through the carried state
    // sum_{m < c0} phi(k_m) [v_m, 1]^T [B, H, F, Dv+1]; keys inside the chunk through the masked
    // quadratic phi(q_c) phi(k_c)^T (lower triangle, diagonal included). Keys m >= N are never
    // visible (top-left alignment), so only the first min(M, N) keys take part.
    const int64_t T = std::min(chunk_, N), Mv = std::min(M, N);
    const Tensor tri = causal_keep(T, T, q);  // [T, T]
    std::vector<Tensor> outs;
    Tensor state;
    for (int64_t c0 = 0; c0 < N; c0 += T) {
      const int64_t Tc = std::min(T, N - c0);
      Tensor qc = narrow(phi_q, 2, c0, Tc);  // [B, H, Tc, F]
      Tensor oc = state.defined() ? matmul(qc, state) : Tensor();
      if (c0 < Mv) {
        const int64_t Tk = std::min(c0 + Tc, Mv) - c0;
        Tensor kc = narrow(phi_k, 2, c0, Tk), vc = narrow(v1, 2, c0, Tk);  // [B, H, Tk, F], [B, H, Tk, Dv+1]
        Tensor a = mul(matmul(qc, transpose(kc, -2, -1)), narrow(narrow(tri, 0, 0, Tc), 1, 0, Tk));
        Tensor intra = matmul(a, vc);  // [B, H, Tc, Dv+1]
        oc = oc.defined() ? add(oc, intra) : intra;
        if (c0 + Tc < N) {
          Tensor kv = matmul(transpose(kc, -2, -1), vc);  // [B, H, F, Dv+1]
          state = state.defined() ? add(state, kv) : kv;
        }
      }
      outs.push_back(oc);
    }
    out = outs.size() == 1 ? outs[0] : cat(outs, 2);
  }
  // out_n = num / den, den = phi(q_n).sum_m phi(k_m) guarded (0/0 of a row with no visible key -> 0).
  return div(narrow(out, -1, 0, Dv), guard_denominator(narrow(out, -1, Dv, 1)));
}

Tensor PerformerAttention::attention_matrix(const Tensor& q, const Tensor& k, const nn::AttentionOptions& opts) {
  check_inputs("performer attention_matrix", *this, q, k, k, opts);
  auto [phi_q, phi_k] = features_of(q, k, opts);
  Tensor a = matmul(phi_q, transpose(phi_k, -2, -1));                // [B, H, N, M]
  if (opts.causal) a = mul(a, causal_keep(q.size(2), k.size(2), q));  // m <= n
  return div(a, guard_denominator(sum(a, {-1}, /*keepdim=*/true)));
}

std::string PerformerAttention::extra_repr() const {
  return "heads=" + std::to_string(heads()) + ", head_dim=" + std::to_string(head_dim()) +
         ", features=" + std::to_string(features_) + ", kernel=" + performer_kernel_name(kernel_) +
         ", redraw=" + std::to_string(redraw_) + ", chunk=" + std::to_string(chunk_) +
         ", orthogonal=" + (orthogonal_ ? "1" : "0");
}

std::shared_ptr<nn::AttentionKernel> make_performer(const AttentionSpec& spec, int64_t heads, int64_t head_dim) {
  const int64_t features = spec.get_int("features", 128);
  const PerformerKernel kernel = parse_performer_kernel(spec.get_string("kernel", "softmax"));
  const int64_t redraw = spec.get_int("redraw", 1);
  const int64_t chunk = spec.get_int("chunk", 64);
  const bool orthogonal = spec.get_bool("orthogonal", true);
  return std::make_shared<PerformerAttention>(heads, head_dim, features, kernel, redraw, chunk, orthogonal);
}

}  // namespace linea::attn
