// linea::raw::sdpa, toeplitz_attention, positive_features, linear_attention, lara_mixture and lara_proposals with
// their backwards: argument checks, allocation and the calls of the fused kernels of either device
// (core/kernels.h; core/cpu/ and cuda/).
#include <cmath>

#include "core/dispatch.h"
#include "core/ops.h"

namespace linea::raw {

namespace {
void check_sdpa_args(const char* op, const Tensor& q, const Tensor& k, const Tensor& v, double scale, int64_t offset,
                     const Tensor& pad) {
  check_defined(op, q, "q");
  check_defined(op, k, "k");
  check_defined(op, v, "v");
  LINEA_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4, op,
              ": expected q [B, H, N, D], k [B, H, M, D], v [B, H, M, E], got q ", shape_str(q.shape()), ", k ",
              shape_str(k.shape()), ", v ", shape_str(v.shape()));
  LINEA_CHECK(k.size(0) == q.size(0) && k.size(1) == q.size(1) && k.size(3) == q.size(3) && v.size(0) == q.size(0) &&
                  v.size(1) == q.size(1) && v.size(2) == k.size(2),
              op, ": shapes do not match: q ", shape_str(q.shape()), ", k ", shape_str(k.shape()), ", v ",
              shape_str(v.shape()), " (expected q [B, H, N, D], k [B, H, M, D], v [B, H, M, E])");
  LINEA_CHECK(q.size(3) > 0 && v.size(3) > 0, op, ": head dims must be positive, got q ", shape_str(q.shape()),
              " and v ", shape_str(v.shape()));
  LINEA_CHECK(is_floating(q.dtype()), op, ": expected float32 or float64, got ", dtype_name(q.dtype()));
  check_same_dtype(op, q, k);
  check_same_dtype(op, q, v);
  check_same_device(op, q, k);
  check_same_device(op, q, v);
  LINEA_CHECK(std::isfinite(scale), op, ": scale must be finite, got ", scale);
  LINEA_CHECK(offset >= 0, op, ": query offset must be >= 0, got ", offset);
  if (pad.defined()) {
    LINEA_CHECK(pad.dtype() == DType::Bool && pad.dim() == 2 && pad.size(0) == q.size(0) && pad.size(1) == k.size(2),
                op, ": key padding must be bool [B, M] = [", q.size(0), ", ", k.size(2), "], got ",
                dtype_name(pad.dtype()), " ", shape_str(pad.shape()));
    check_same_device(op, q, pad);
  }
}

// bias: undefined, or [B, H, M] of q's dtype and device.
void check_key_bias(const char* op, const Tensor& q, const Tensor& k, const Tensor& bias) {
  if (!bias.defined()) return;
  LINEA_CHECK(bias.shape() == Shape({q.size(0), q.size(1), k.size(2)}), op, ": key bias must be [B, H, M] = [",
              q.size(0), ", ", q.size(1), ", ", k.size(2), "], got ", shape_str(bias.shape()));
  check_same_dtype(op, q, bias);
  check_same_device(op, q, bias);
}

// An output of `shape` laid out as `like`'s heads (as_head_rows): a [B, L, H, E] tensor underneath
// where like's heads interleave within its rows (as a projection's do), so that merging the heads
// again is a view; dense [B, H, L, E] otherwise.
Tensor empty_heads(const Shape& shape, const Tensor& like) {
  if (like.size(1) <= 1 || like.size(2) <= 1 || like.stride(1) >= like.stride(2)) return empty(shape, like.options());
  return permute(empty({shape[0], shape[2], shape[1], shape[3]}, like.options()), {0, 2, 1, 3});
}

// dq, dk and dv laid out as empty_heads lays them out, and where q, k and v (or k and v) are one
// buffer's consecutive heads (MultiHeadAttention's projections, packed by linears), in one buffer
// the same way, so that linears' backward takes them in one GEMM each for x's gradient and the
// weights'.
std::vector<Tensor> empty_head_grads(const Tensor& q, const Tensor& k, const Tensor& v) {
  if (const Tensor qkv = joined_view({q, k, v}, 1); qkv.defined()) {
    return split(empty_heads(qkv.shape(), qkv), {q.size(1), k.size(1), v.size(1)}, 1);
  }
  if (const Tensor kv = joined_view({k, v}, 1); kv.defined()) {
    const std::vector<Tensor> dkv = split(empty_heads(kv.shape(), kv), {k.size(1), v.size(1)}, 1);
    return {empty_heads(q.shape(), q), dkv[0], dkv[1]};
  }
  return {empty_heads(q.shape(), q), empty_heads(k.shape(), k), empty_heads(v.shape(), v)};
}

void check_sdpa_dropout(const char* op, const FoldedDropout& drop, bool keep_probs) {
  LINEA_CHECK(drop.p >= 0.0 && drop.p < 1.0, op, ": dropout probability must be in [0, 1), got ", drop.p);
  LINEA_CHECK(!(keep_probs && drop.p > 0.0), op,
              ": kept probabilities and dropout do not go together (the backward draws the dropout again from "
              "recomputed probabilities)");
}
}  // namespace

// An operand that is undefined or not 4-d is left as it is, for the op's own checks to name.
Tensor as_head_rows(const Tensor& t) { return !t.defined() || t.dim() != 4 || is_head_rows(t) ? t : contiguous(t); }

namespace {
// The key padding [B, M] as the fused kernels read it: rows any stride apart, a row contiguous (a
// decoding step's column of the decoder's mask, or the decoding cache's padding, in place);
// undefined stays undefined.
Tensor pad_rows(const Tensor& pad) {
  return !pad.defined() || pad.size(1) <= 1 || pad.stride(1) == 1 ? pad : contiguous(pad);
}
}  // namespace

std::vector<Tensor> sdpa(const Tensor& q, const Tensor& k, const Tensor& v, double scale, bool causal, int64_t offset,
                         const Tensor& pad, bool keep_probs, const FoldedDropout& drop, const Tensor& bias) {
  check_sdpa_args("sdpa", q, k, v, scale, offset, pad);
  check_sdpa_dropout("sdpa", drop, keep_probs);
  check_key_bias("sdpa", q, k, bias);
  const TensorOptions opts(q.dtype(), q.device());
  Tensor out = empty_heads({q.size(0), q.size(1), q.size(2), v.size(3)}, q);
  Tensor lse = empty({q.size(0), q.size(1), q.size(2)}, opts);
  // The CUDA kernel never keeps the probabilities: recomputing them is cheaper than O(N M) memory.
  Tensor probs = keep_probs && q.is_cpu() ? empty({q.size(0), q.size(1), q.size(2), k.size(2)}, opts) : Tensor();
  if (out.numel() > 0 || lse.numel() > 0)
    LINEA_BACKEND(q.device(), sdpa_forward, as_head_rows(q), as_head_rows(k), as_head_rows(v), scale, causal, offset,
                  pad_rows(pad), bias.defined() ? contiguous(bias) : Tensor(), drop, out, lse, probs);
  return {out, lse, probs};
}

std::vector<Tensor> sdpa_backward(const Tensor& grad, const Tensor& q, const Tensor& k, const Tensor& v,
                                  const Tensor& out, const Tensor& lse, double scale, bool causal, int64_t offset,
                                  const Tensor& pad, const Tensor& probs, const FoldedDropout& drop, const Tensor& bias,
                                  const Tensor& dlse) {
  check_sdpa_args("sdpa_backward", q, k, v, scale, offset, pad);
  check_sdpa_dropout("sdpa_backward", drop, probs.defined());
  check_key_bias("sdpa_backward", q, k, bias);
  check_defined("sdpa_backward", grad, "grad");
  LINEA_CHECK(grad.shape() == out.shape() && lse.shape() == Shape({q.size(0), q.size(1), q.size(2)}),
              "sdpa_backward: grad ", shape_str(grad.shape()), ", out ", shape_str(out.shape()), " and lse ",
              shape_str(lse.shape()), " do not match q ", shape_str(q.shape()), " and v ", shape_str(v.shape()));
  LINEA_CHECK(!probs.defined() || probs.shape() == Shape({q.size(0), q.size(1), q.size(2), k.size(2)}),
              "sdpa_backward: probs ", shape_str(probs.shape()), " do not match q ", shape_str(q.shape()), " and k ",
              shape_str(k.shape()), " (expected [B, H, N, M])");
  LINEA_CHECK(!dlse.defined() || dlse.shape() == lse.shape(), "sdpa_backward: dlse ", shape_str(dlse.shape()),
              " does not match lse ", shape_str(lse.shape()));
  for (const Tensor* t : {&grad, &probs, &dlse}) {
    if (!t->defined()) continue;
    check_same_dtype("sdpa_backward", q, *t);
    check_same_device("sdpa_backward", q, *t);
  }
  const std::vector<Tensor> d = empty_head_grads(q, k, v);
  const Tensor &dq = d[0], &dk = d[1], &dv = d[2];
  Tensor db = bias.defined() ? empty(bias.shape(), bias.options()) : Tensor();
  if (q.numel() + k.numel() + v.numel() > 0)
    LINEA_BACKEND(q.device(), sdpa_backward, as_head_rows(q), as_head_rows(k), as_head_rows(v), as_head_rows(out),
                  contiguous(lse), probs.defined() ? contiguous(probs) : Tensor(), as_head_rows(grad),
                  dlse.defined() ? contiguous(dlse) : Tensor(), scale, causal, offset, pad_rows(pad),
                  bias.defined() ? contiguous(bias) : Tensor(), drop, dq, dk, dv, db);
  return {dq, dk, dv, db};
}

namespace {
void check_toeplitz_args(const char* op, const Tensor& c, const Tensor& pq, const Tensor& pk, const Tensor& v,
                         int64_t fft_len) {
  check_defined(op, c, "c");
  check_defined(op, pq, "phi_q");
  check_defined(op, pk, "phi_k");
  check_defined(op, v, "v");
  LINEA_CHECK(pq.dim() == 4 && pk.dim() == 4 && v.dim() == 4 && pk.size(0) == pq.size(0) && pk.size(1) == pq.size(1) &&
                  pk.size(3) == pq.size(3) && v.size(0) == pq.size(0) && v.size(1) == pq.size(1) &&
                  v.size(2) == pk.size(2),
              op, ": expected phi_q [B, H, N, S], phi_k [B, H, M, S], v [B, H, M, E], got phi_q ",
              shape_str(pq.shape()), ", phi_k ", shape_str(pk.shape()), ", v ", shape_str(v.shape()));
  const int64_t B = pq.size(0), H = pq.size(1), N = pq.size(2), M = pk.size(2);
  LINEA_CHECK(N > 0 && M > 0, op, ": empty sequences: phi_q ", shape_str(pq.shape()), ", phi_k ",
              shape_str(pk.shape()));
  LINEA_CHECK((c.dim() == 2 && c.size(0) == H && c.size(1) == N + M - 1) ||
                  (c.dim() == 3 && c.size(0) == B && c.size(1) == H && c.size(2) == N + M - 1),
              op, ": c must be [H, N+M-1] = [", H, ", ", N + M - 1, "] or [B, H, N+M-1], got ", shape_str(c.shape()));
  LINEA_CHECK(fft_len == 0 || fft_len >= N + M - 1, op, ": fft length ", fft_len, " is below N + M - 1 = ", N + M - 1,
              " (0: the direct path)");
  LINEA_CHECK(is_floating(v.dtype()), op, ": expected float32 or float64, got ", dtype_name(v.dtype()));
  for (const Tensor* t : {&c, &pq, &pk}) {
    check_same_dtype(op, v, *t);
    check_same_device(op, v, *t);
  }
}
}  // namespace

Tensor sdpa_sample(const Tensor& q, const Tensor& k, const Tensor& u, double scale, const Tensor& pad) {
  const char* op = "sdpa_sample";
  check_sdpa_args(op, q, k, k, scale, 0, pad);
  check_defined(op, u, "u");
  LINEA_CHECK(k.size(2) > 0, op, ": needs at least one key, got k ", shape_str(k.shape()));
  LINEA_CHECK(u.dim() == 4 && u.size(0) == q.size(0) && u.size(1) == q.size(1) && u.size(2) == q.size(2), op,
              ": expected u [B, H, N, S] = [", q.size(0), ", ", q.size(1), ", ", q.size(2), ", S], got ",
              shape_str(u.shape()));
  check_same_dtype(op, q, u);
  check_same_device(op, q, u);
  Tensor out = empty(u.shape(), TensorOptions(DType::Int64, q.device()));
  if (out.numel() > 0)
    LINEA_BACKEND(q.device(), sdpa_sample, contiguous(q), contiguous(k), pad.defined() ? contiguous(pad) : Tensor(),
                  contiguous(u), scale, out);
  return out;
}

Tensor toeplitz_attention(const Tensor& c, const Tensor& phi_q, const Tensor& phi_k, const Tensor& v, int64_t fft_len) {
  check_toeplitz_args("toeplitz_attention", c, phi_q, phi_k, v, fft_len);
  Tensor y = empty({phi_q.size(0), phi_q.size(1), phi_q.size(2), v.size(3)}, v.options());
  if (y.numel() > 0)
    LINEA_BACKEND(v.device(), toeplitz_attention_forward, contiguous(c), contiguous(phi_q), contiguous(phi_k),
                  contiguous(v), fft_len, y);
  return y;
}

std::vector<Tensor> toeplitz_attention_backward(const Tensor& grad, const Tensor& c, const Tensor& phi_q,
                                                const Tensor& phi_k, const Tensor& v, int64_t fft_len) {
  check_toeplitz_args("toeplitz_attention_backward", c, phi_q, phi_k, v, fft_len);
  check_defined("toeplitz_attention_backward", grad, "grad");
  LINEA_CHECK(grad.shape() == Shape({phi_q.size(0), phi_q.size(1), phi_q.size(2), v.size(3)}),
              "toeplitz_attention_backward: grad ", shape_str(grad.shape()), " does not match phi_q ",
              shape_str(phi_q.shape()), " and v ", shape_str(v.shape()));
  check_same_dtype("toeplitz_attention_backward", v, grad);
  Tensor dc = empty(c.shape(), c.options()), dpq = empty(phi_q.shape(), phi_q.options()),
         dpk = empty(phi_k.shape(), phi_k.options()), dv = empty(v.shape(), v.options());
  if (v.size(3) == 0) {
    for (Tensor* t : {&dc, &dpq, &dpk}) t->zero_();
    return {dc, dpq, dpk, dv};
  }
  LINEA_BACKEND(v.device(), toeplitz_attention_backward, contiguous(c), contiguous(phi_q), contiguous(phi_k),
                contiguous(v), contiguous(grad), fft_len, dc, dpq, dpk, dv);
  return {dc, dpq, dpk, dv};
}

namespace {
void check_features_args(const char* op, const Tensor& x, const Tensor& omega, const Tensor& pad) {
  check_defined(op, x, "x");
  check_defined(op, omega, "omega");
  LINEA_CHECK(x.dim() == 4 && omega.dim() == 3 && omega.size(0) == x.size(1) && omega.size(2) == x.size(3), op,
              ": expected x [B, H, L, D] and omega [H, S, D], got x ", shape_str(x.shape()), ", omega ",
              shape_str(omega.shape()));
  LINEA_CHECK(omega.size(1) > 0, op, ": omega ", shape_str(omega.shape()), " has no features");
  LINEA_CHECK(is_floating(x.dtype()), op, ": expected float32 or float64, got ", dtype_name(x.dtype()));
  check_same_dtype(op, x, omega);
  check_same_device(op, x, omega);
  if (pad.defined()) {
    LINEA_CHECK(pad.dtype() == DType::Bool && pad.dim() == 2 && pad.size(0) == x.size(0) && pad.size(1) == x.size(2),
                op, ": pad must be a Bool [B, L] = [", x.size(0), ", ", x.size(2), "], got ", dtype_name(pad.dtype()),
                " ", shape_str(pad.shape()));
    check_same_device(op, x, pad);
  }
}
}  // namespace

Tensor positive_features(const Tensor& x, const Tensor& omega, bool per_row, const Tensor& pad) {
  check_features_args("positive_features", x, omega, pad);
  Tensor phi = empty({x.size(0), x.size(1), x.size(2), omega.size(1)}, x.options());
  if (phi.numel() > 0)
    LINEA_BACKEND(x.device(), positive_features_forward, contiguous(x), contiguous(omega), per_row,
                  pad.defined() ? contiguous(pad) : Tensor(), phi);
  return phi;
}

std::vector<Tensor> positive_features_backward(const Tensor& grad, const Tensor& x, const Tensor& omega,
                                               const Tensor& phi, bool want_domega) {
  check_features_args("positive_features_backward", x, omega, Tensor());
  check_defined("positive_features_backward", grad, "grad");
  check_defined("positive_features_backward", phi, "phi");
  const Shape want{x.size(0), x.size(1), x.size(2), omega.size(1)};
  LINEA_CHECK(grad.shape() == want && phi.shape() == want, "positive_features_backward: grad ", shape_str(grad.shape()),
              " and phi ", shape_str(phi.shape()), " must be ", shape_str(want));
  check_same_dtype("positive_features_backward", x, grad);
  check_same_dtype("positive_features_backward", x, phi);
  if (phi.numel() == 0)
    return {zeros(x.shape(), x.options()), want_domega ? zeros(omega.shape(), omega.options()) : Tensor()};
  // The kernel overwrites both.
  Tensor dx = empty(x.shape(), x.options());
  Tensor dw = want_domega ? empty(omega.shape(), omega.options()) : Tensor();
  LINEA_BACKEND(x.device(), positive_features_backward, contiguous(x), contiguous(omega), contiguous(phi),
                contiguous(grad), dx, dw);
  return {dx, dw};
}

namespace {
void check_linear_args(const char* op, const Tensor& pq, const Tensor& pk, const Tensor& v, double guard) {
  check_defined(op, pq, "phi_q");
  check_defined(op, pk, "phi_k");
  check_defined(op, v, "v");
  LINEA_CHECK(pq.dim() == 4 && pk.dim() == 4 && v.dim() == 4 && pk.size(0) == pq.size(0) && pk.size(1) == pq.size(1) &&
                  pk.size(3) == pq.size(3) && v.size(0) == pq.size(0) && v.size(1) == pq.size(1) &&
                  v.size(2) == pk.size(2),
              op, ": expected phi_q [B, H, N, S], phi_k [B, H, M, S], v [B, H, M, E], got phi_q ",
              shape_str(pq.shape()), ", phi_k ", shape_str(pk.shape()), ", v ", shape_str(v.shape()));
  LINEA_CHECK(pq.numel() > 0 && pk.numel() > 0 && v.numel() > 0, op, ": every dim must be positive, got phi_q ",
              shape_str(pq.shape()), ", phi_k ", shape_str(pk.shape()), ", v ", shape_str(v.shape()));
  LINEA_CHECK(is_floating(v.dtype()), op, ": expected float32 or float64, got ", dtype_name(v.dtype()));
  LINEA_CHECK(guard >= 0.0 && std::isfinite(guard), op, ": guard must be finite and >= 0, got ", guard);
  for (const Tensor* t : {&pq, &pk}) {
    check_same_dtype(op, v, *t);
    check_same_device(op, v, *t);
  }
}
}  // namespace

std::vector<Tensor> linear_attention(const Tensor& phi_q, const Tensor& phi_k, const Tensor& v, double guard) {
  check_linear_args("linear_attention", phi_q, phi_k, v, guard);
  const int64_t B = phi_q.size(0), H = phi_q.size(1), N = phi_q.size(2), S = phi_q.size(3), E = v.size(3);
  Tensor out = empty({B, H, N, E}, v.options()), den = empty({B, H, N}, v.options()),
         kvz = empty({B, H, S, E + 1}, v.options());
  LINEA_BACKEND(v.device(), linear_attention_forward, contiguous(phi_q), contiguous(phi_k), contiguous(v), guard, out,
                den, kvz);
  return {out, den, kvz};
}

std::vector<Tensor> linear_attention_backward(const Tensor& grad, const Tensor& phi_q, const Tensor& phi_k,
                                              const Tensor& v, const Tensor& out, const Tensor& den, const Tensor& kvz,
                                              double guard) {
  const char* op = "linear_attention_backward";
  check_linear_args(op, phi_q, phi_k, v, guard);
  check_defined(op, grad, "grad");
  const int64_t B = phi_q.size(0), H = phi_q.size(1), N = phi_q.size(2), S = phi_q.size(3), E = v.size(3);
  LINEA_CHECK(grad.shape() == Shape({B, H, N, E}) && out.shape() == grad.shape() && den.shape() == Shape({B, H, N}) &&
                  kvz.shape() == Shape({B, H, S, E + 1}),
              op, ": grad ", shape_str(grad.shape()), ", out ", shape_str(out.shape()), ", den ",
              shape_str(den.shape()), " and kvz ", shape_str(kvz.shape()), " do not match phi_q ",
              shape_str(phi_q.shape()), " and v ", shape_str(v.shape()));
  for (const Tensor* t : {&grad, &out, &den, &kvz}) check_same_dtype(op, v, *t);
  Tensor dpq = empty(phi_q.shape(), phi_q.options()), dpk = empty(phi_k.shape(), phi_k.options()),
         dv = empty(v.shape(), v.options());
  LINEA_BACKEND(v.device(), linear_attention_backward, contiguous(phi_q), contiguous(phi_k), contiguous(v),
                contiguous(out), contiguous(den), contiguous(kvz), contiguous(grad), guard, dpq, dpk, dv);
  return {dpq, dpk, dv};
}

namespace {
void check_favor_args(const char* op, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& omega,
                      double scale, const Tensor& pad, double guard, bool causal, int64_t chunk) {
  check_sdpa_args(op, q, k, v, 1.0, 0, pad);
  check_defined(op, omega, "omega");
  LINEA_CHECK(omega.dim() == 3 && omega.size(0) == q.size(1) && omega.size(1) > 0 && omega.size(2) == q.size(3), op,
              ": expected omega [H, S, D] = [", q.size(1), ", S, ", q.size(3), "] with S > 0, got ",
              shape_str(omega.shape()));
  check_same_dtype(op, q, omega);
  check_same_device(op, q, omega);
  LINEA_CHECK(q.size(2) > 0 && k.size(2) > 0 && q.size(0) * q.size(1) > 0, op, ": every dim must be positive, got q ",
              shape_str(q.shape()), " and k ", shape_str(k.shape()));
  LINEA_CHECK(std::isfinite(scale) && scale > 0.0, op, ": scale must be finite and > 0, got ", scale);
  LINEA_CHECK(guard >= 0.0 && std::isfinite(guard), op, ": guard must be finite and >= 0, got ", guard);
  LINEA_CHECK(!causal || q.size(2) == k.size(2), op, ": causal takes as many queries as keys (self-attention), got q ",
              shape_str(q.shape()), " and k ", shape_str(k.shape()));
  LINEA_CHECK(!causal || chunk > 0, op, ": chunk must be positive, got ", chunk);
}
}  // namespace

std::vector<Tensor> favor_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& omega,
                                    double scale, const Tensor& pad, double guard, bool causal, int64_t chunk) {
  check_favor_args("favor_attention", q, k, v, omega, scale, pad, guard, causal, chunk);
  const int64_t B = q.size(0), H = q.size(1), N = q.size(2), M = k.size(2), S = omega.size(1), E = v.size(3);
  const Tensor qc = as_head_rows(q), kc = as_head_rows(k), vc = as_head_rows(v), wc = contiguous(omega);
  if (LINEA_BACKEND(q.device(), favor_attention_fused, qc, kc, vc, wc, causal, chunk)) {
    const Shape kvz = causal ? Shape{B, H, (N + chunk - 1) / chunk, S, E + 1} : Shape{B, H, S, E + 1};
    std::vector<Tensor> r = {empty_heads({B, H, N, E}, qc), empty({B, H, N}, q.options()), empty(kvz, q.options()),
                             empty({B, H, N, S}, q.options()),
                             empty({B, H, M, S}, q.options())};  // out, den, kvz, phi_q, phi_k
    LINEA_BACKEND(q.device(), favor_attention_forward, qc, kc, vc, wc, scale, pad_rows(pad), guard, causal, chunk, r[0],
                  r[1], r[2], r[3], r[4]);
    return r;
  }
  const Tensor pc = pad.defined() ? contiguous(pad) : Tensor();
  // Composed: the features, then the product (what the kernels above fuse). The scaled q~ and k~
  // come back too, for the backward's feature gradients (recomputing them there cost the CPU
  // about 5% of a forward and backward at L = 4096).
  const Tensor qs = unary(UnaryOp::MulScalar, qc, scale), ks = unary(UnaryOp::MulScalar, kc, scale);
  const Tensor phi_q = positive_features(qs, wc, /*per_row=*/true, Tensor());
  const Tensor phi_k = positive_features(ks, wc, /*per_row=*/false, pc);
  std::vector<Tensor> lin = causal ? causal_linear_attention(phi_q, phi_k, vc, Tensor(), chunk, guard)
                                   : linear_attention(phi_q, phi_k, vc, guard);  // out, den, kvz or states[, final]
  return {lin[0], lin[1], lin[2], phi_q, phi_k, qs, ks};
}

std::vector<Tensor> favor_attention_backward(const Tensor& grad, const Tensor& q, const Tensor& k, const Tensor& v,
                                             const Tensor& omega, double scale, const std::vector<Tensor>& forward,
                                             double guard, bool causal, int64_t chunk) {
  const char* op = "favor_attention_backward";
  check_favor_args(op, q, k, v, omega, scale, Tensor(), guard, causal, chunk);
  check_defined(op, grad, "grad");
  LINEA_CHECK(forward.size() == 5 || forward.size() == 7, op, ": expected the forward's 5 or 7 outputs, got ",
              forward.size());
  const Tensor &out = forward[0], &den = forward[1], &kvz = forward[2], &phi_q = forward[3], &phi_k = forward[4];
  const int64_t B = q.size(0), H = q.size(1), N = q.size(2), M = k.size(2), S = omega.size(1), E = v.size(3);
  const Shape kvz_shape = causal ? Shape{B, H, (N + chunk - 1) / chunk, S, E + 1} : Shape{B, H, S, E + 1};
  LINEA_CHECK(
      grad.shape() == Shape({B, H, N, E}) && out.shape() == grad.shape() && den.shape() == Shape({B, H, N}) &&
          kvz.shape() == kvz_shape && phi_q.shape() == Shape({B, H, N, S}) && phi_k.shape() == Shape({B, H, M, S}),
      op, ": grad ", shape_str(grad.shape()), " and the forward's out ", shape_str(out.shape()), ", den ",
      shape_str(den.shape()), ", kvz ", shape_str(kvz.shape()), ", phi_q ", shape_str(phi_q.shape()), ", phi_k ",
      shape_str(phi_k.shape()), " do not match q ", shape_str(q.shape()), ", k ", shape_str(k.shape()), ", v ",
      shape_str(v.shape()), " and omega ", shape_str(omega.shape()), causal ? " (causal)" : "");
  for (const Tensor* t : {&grad, &out, &den, &kvz, &phi_q, &phi_k}) {
    check_same_dtype(op, q, *t);
    check_same_device(op, q, *t);
  }
  const Tensor qc = as_head_rows(q), kc = as_head_rows(k), vc = as_head_rows(v), wc = contiguous(omega);
  if (LINEA_BACKEND(q.device(), favor_attention_fused, qc, kc, vc, wc, causal, chunk)) {
    std::vector<Tensor> d = empty_head_grads(qc, kc, vc);
    LINEA_BACKEND(q.device(), favor_attention_backward, qc, kc, vc, wc, scale, causal, chunk, as_head_rows(out),
                  contiguous(den), contiguous(kvz), contiguous(phi_q), contiguous(phi_k), as_head_rows(grad), guard,
                  d[0], d[1], d[2]);
    return d;
  }
  std::vector<Tensor> dl =
      causal ? causal_linear_attention_backward(grad, phi_q, phi_k, vc, out, den, kvz, chunk, guard, false)
             : linear_attention_backward(grad, phi_q, phi_k, vc, out, den, kvz, guard);
  // dx = scale dx~ (x~ = scale x: the forward's, else recomputed); each feature gradient dropped
  // once used and the scaling in place, so that no more is live at once than in the two ops' own
  // backwards.
  const auto features_grad = [&](const Tensor& x, size_t kept, const Tensor& phi, Tensor& dphi) {
    const Tensor xs = forward.size() == 7 ? forward[kept] : unary(UnaryOp::MulScalar, x, scale);
    Tensor dx = positive_features_backward(dphi, xs, wc, phi, false)[0];
    dphi = Tensor();
    LINEA_BACKEND(dx.device(), unary, UnaryOp::MulScalar, dx, dx, scale, 0.0);
    return dx;
  };
  Tensor dq = features_grad(qc, 5, phi_q, dl[0]);
  Tensor dk = features_grad(kc, 6, phi_k, dl[1]);
  return {dq, dk, dl[2]};
}

std::vector<Tensor> favor_attention_step(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& omega,
                                         double scale, const Tensor& pad, double guard, const Tensor& sums,
                                         const Tensor& c, int64_t chunk) {
  const char* op = "favor_attention_step";
  check_favor_args(op, q, k, v, omega, scale, pad, guard, true, chunk);
  const int64_t B = q.size(0), H = q.size(1), T = q.size(2), S = omega.size(1), E = v.size(3);
  LINEA_CHECK(sums.defined() == c.defined(), op, ": the running sums and their stabilizer come together, got ",
              sums.defined() ? "sums without c" : "c without sums");
  if (sums.defined()) {
    LINEA_CHECK(sums.shape() == Shape({B, H, S, E + 1}) && c.shape() == Shape({B, H, 1, 1}), op, ": expected sums [", B,
                ", ", H, ", ", S, ", ", E + 1, "] and c [", B, ", ", H, ", 1, 1], got ", shape_str(sums.shape()),
                " and ", shape_str(c.shape()));
    for (const Tensor* t : {&sums, &c}) {
      check_same_dtype(op, q, *t);
      check_same_device(op, q, *t);
    }
  }
  const Tensor qc = as_head_rows(q), kc = as_head_rows(k), vc = as_head_rows(v), wc = contiguous(omega);
  if (LINEA_BACKEND(q.device(), favor_attention_fused, qc, kc, vc, wc, true, chunk)) {
    std::vector<Tensor> r = {empty_heads({B, H, T, E}, qc), empty({B, H, S, E + 1}, q.options()),
                             empty({B, H, 1, 1}, q.options())};  // out, sums, c
    LINEA_BACKEND(q.device(), favor_attention_step, qc, kc, vc, wc, scale, pad_rows(pad), guard,
                  sums.defined() ? contiguous(sums) : Tensor(), sums.defined() ? contiguous(c) : Tensor(), r[0], r[1],
                  r[2]);
    return r;
  }
  const Tensor pc = pad.defined() ? contiguous(pad) : Tensor();
  // Composed. The keys' log-factors l = k~ W^T - |k~|^2/2 [B, H, T, S], padded rows at the lowest
  // value (their features 0), and c' over them and c.
  const Tensor qs = unary(UnaryOp::MulScalar, qc, scale), ks = unary(UnaryOp::MulScalar, kc, scale);
  const Tensor half = unary(UnaryOp::MulScalar, reduce(ReduceOp::Sum, unary(UnaryOp::Square, ks), {-1}, true), 0.5);
  Tensor l = binary(BinaryOp::Sub, matmul(ks, transpose(wc, -2, -1)), half);
  const Tensor pad4 = pc.defined() ? reshape(pc, {B, 1, T, 1}) : Tensor();
  if (pad4.defined()) l = masked_fill(l, pad4, dtype_lowest(l.dtype()));
  Tensor cn = reduce(ReduceOp::Max, l, {2, 3}, true);
  if (c.defined()) cn = binary(BinaryOp::Maximum, cn, c);
  Tensor phi_k = unary(UnaryOp::MulScalar, unary(UnaryOp::Exp, binary(BinaryOp::Sub, l, cn)),
                       1.0 / std::sqrt(static_cast<double>(S)));
  if (pad4.defined()) phi_k = masked_fill(phi_k, pad4, 0.0);
  const Tensor state =
      sums.defined() ? binary(BinaryOp::Mul, sums, unary(UnaryOp::Exp, binary(BinaryOp::Sub, c, cn))) : Tensor();
  const Tensor phi_q = positive_features(qs, wc, /*per_row=*/true, Tensor());
  std::vector<Tensor> r = causal_linear_attention(phi_q, phi_k, vc, state, chunk, guard);  // out, den, states, final
  return {r[0], r[3], cn};
}

namespace {
void check_causal_linear_args(const char* op, const Tensor& pq, const Tensor& pk, const Tensor& v, const Tensor& state,
                              int64_t chunk, double guard) {
  check_defined(op, pq, "phi_q");
  check_defined(op, pk, "phi_k");
  check_defined(op, v, "v");
  LINEA_CHECK(pq.dim() == 4 && pk.shape() == pq.shape() && v.dim() == 4 && v.size(0) == pq.size(0) &&
                  v.size(1) == pq.size(1) && v.size(2) == pq.size(2),
              op, ": expected phi_q and phi_k [B, H, N, S], v [B, H, N, E] (key m seen by queries n >= m), got phi_q ",
              shape_str(pq.shape()), ", phi_k ", shape_str(pk.shape()), ", v ", shape_str(v.shape()));
  LINEA_CHECK(pq.numel() > 0 && v.numel() > 0, op, ": every dim must be positive, got phi_q ", shape_str(pq.shape()),
              ", v ", shape_str(v.shape()));
  const Shape state_shape{pq.size(0), pq.size(1), pq.size(3), v.size(3) + 1};
  LINEA_CHECK(!state.defined() || state.shape() == state_shape, op,
              ": state must be [B, H, S, E + 1] = ", shape_str(state_shape), ", got ", shape_str(state.shape()));
  LINEA_CHECK(chunk > 0, op, ": chunk must be positive, got ", chunk);
  LINEA_CHECK(is_floating(v.dtype()), op, ": expected float32 or float64, got ", dtype_name(v.dtype()));
  LINEA_CHECK(guard >= 0.0 && std::isfinite(guard), op, ": guard must be finite and >= 0, got ", guard);
  for (const Tensor* t : {&pq, &pk, &state}) {
    if (!t->defined()) continue;
    check_same_dtype(op, v, *t);
    check_same_device(op, v, *t);
  }
}
}  // namespace

std::vector<Tensor> causal_linear_attention(const Tensor& phi_q, const Tensor& phi_k, const Tensor& v,
                                            const Tensor& state, int64_t chunk, double guard) {
  check_causal_linear_args("causal_linear_attention", phi_q, phi_k, v, state, chunk, guard);
  const int64_t B = phi_q.size(0), H = phi_q.size(1), N = phi_q.size(2), S = phi_q.size(3), E = v.size(3);
  const int64_t C = (N + chunk - 1) / chunk;
  Tensor out = empty({B, H, N, E}, v.options()), den = empty({B, H, N}, v.options()),
         states = empty({B, H, C, S, E + 1}, v.options()), final = empty({B, H, S, E + 1}, v.options());
  LINEA_BACKEND(v.device(), causal_linear_attention_forward, contiguous(phi_q), contiguous(phi_k), contiguous(v),
                state.defined() ? contiguous(state) : Tensor(), chunk, guard, out, den, states, final);
  return {out, den, states, final};
}

std::vector<Tensor> causal_linear_attention_backward(const Tensor& grad, const Tensor& phi_q, const Tensor& phi_k,
                                                     const Tensor& v, const Tensor& out, const Tensor& den,
                                                     const Tensor& states, int64_t chunk, double guard,
                                                     bool want_dstate) {
  const char* op = "causal_linear_attention_backward";
  check_causal_linear_args(op, phi_q, phi_k, v, Tensor(), chunk, guard);
  check_defined(op, grad, "grad");
  const int64_t B = phi_q.size(0), H = phi_q.size(1), N = phi_q.size(2), S = phi_q.size(3), E = v.size(3);
  const int64_t C = (N + chunk - 1) / chunk;
  LINEA_CHECK(grad.shape() == Shape({B, H, N, E}) && out.shape() == grad.shape() && den.shape() == Shape({B, H, N}) &&
                  states.shape() == Shape({B, H, C, S, E + 1}),
              op, ": grad ", shape_str(grad.shape()), ", out ", shape_str(out.shape()), ", den ",
              shape_str(den.shape()), " and states ", shape_str(states.shape()), " do not match phi_q ",
              shape_str(phi_q.shape()), ", v ", shape_str(v.shape()), " and chunk ", chunk);
  for (const Tensor* t : {&grad, &out, &den, &states}) check_same_dtype(op, v, *t);
  Tensor dpq = empty(phi_q.shape(), phi_q.options()), dpk = empty(phi_k.shape(), phi_k.options()),
         dv = empty(v.shape(), v.options());
  Tensor dstate = want_dstate ? empty({B, H, S, E + 1}, v.options()) : Tensor();
  LINEA_BACKEND(v.device(), causal_linear_attention_backward, contiguous(phi_q), contiguous(phi_k), contiguous(v),
                contiguous(out), contiguous(den), contiguous(states), contiguous(grad), chunk, guard, dpq, dpk, dv,
                dstate);
  return {dpq, dpk, dv, dstate};
}

namespace {
// self_w and bias are checked when given (the backward has neither).
void check_mixture_args(const char* op, const Tensor& q, const Tensor& qbar, const Tensor& w, const Tensor& self_w,
                        const Tensor& bias) {
  check_defined(op, q, "q");
  check_defined(op, qbar, "qbar");
  check_defined(op, w, "w");
  const bool vectors_ok = !self_w.defined() || (self_w.shape() == Shape({q.size(0), q.size(1), qbar.size(2)}) &&
                                                bias.defined() && bias.shape() == self_w.shape());
  LINEA_CHECK(
      q.dim() == 4 && qbar.dim() == 4 && q.numel() > 0 && qbar.numel() > 0 && qbar.size(0) == q.size(0) &&
          qbar.size(1) == q.size(1) && qbar.size(3) == q.size(3) && w.shape() == qbar.shape() && vectors_ok,
      op, ": expected q [B, H, N, D], qbar and w [B, H, C, D], self_w and bias [B, H, C] (all dims > 0), got q ",
      shape_str(q.shape()), ", qbar ", shape_str(qbar.shape()), ", w ", shape_str(w.shape()), ", self_w ",
      self_w.defined() ? shape_str(self_w.shape()) : "-", ", bias ", bias.defined() ? shape_str(bias.shape()) : "-");
  LINEA_CHECK(is_floating(q.dtype()), op, ": expected float32 or float64, got ", dtype_name(q.dtype()));
  for (const Tensor* t : {&qbar, &w, &self_w, &bias}) {
    if (!t->defined()) continue;
    check_same_dtype(op, q, *t);
    check_same_device(op, q, *t);
  }
}
}  // namespace

std::vector<Tensor> lara_mixture(const Tensor& q, const Tensor& qbar, const Tensor& w, const Tensor& self_w,
                                 const Tensor& bias, double beta, double floor, double q_scale) {
  check_mixture_args("lara_mixture", q, qbar, w, self_w, bias);
  const Shape shape{q.size(0), q.size(1), q.size(2), qbar.size(2)};
  Tensor mix = empty(shape, q.options()), t = empty(shape, q.options()), a = empty(shape, q.options());
  LINEA_BACKEND(q.device(), lara_mixture_forward, contiguous(q), contiguous(qbar), contiguous(w), contiguous(self_w),
                contiguous(bias), beta, floor, q_scale, mix, t, a);
  return {mix, t, a};
}

std::vector<Tensor> lara_mixture_backward(const Tensor& grad, const Tensor& q, const Tensor& qbar, const Tensor& w,
                                          const Tensor& mix, const Tensor& t, const Tensor& a, double beta,
                                          double floor, double q_scale) {
  const char* op = "lara_mixture_backward";
  check_mixture_args(op, q, qbar, w, Tensor(), Tensor());
  check_defined(op, grad, "grad");
  const Shape shape{q.size(0), q.size(1), q.size(2), qbar.size(2)};
  LINEA_CHECK(grad.shape() == shape && mix.shape() == shape && t.shape() == shape && a.shape() == shape, op, ": grad ",
              shape_str(grad.shape()), ", mix, t and a must be ", shape_str(shape));
  for (const Tensor* x : {&grad, &mix, &t, &a}) check_same_dtype(op, q, *x);
  Tensor dq = empty(q.shape(), q.options()), dqbar = empty(qbar.shape(), q.options()),
         dw = empty(w.shape(), q.options()), dself_w = empty({q.size(0), q.size(1), qbar.size(2)}, q.options()),
         dbias = empty(dself_w.shape(), q.options());
  LINEA_BACKEND(q.device(), lara_mixture_backward, contiguous(q), contiguous(qbar), contiguous(w), contiguous(mix),
                contiguous(t), contiguous(a), contiguous(grad), beta, floor, q_scale, dq, dqbar, dw, dself_w, dbias);
  return {dq, dqbar, dw, dself_w, dbias};
}

std::vector<Tensor> lara_proposals(const Tensor& w, const Tensor& mu, const Tensor& lse_k) {
  const char* op = "lara_proposals";
  check_defined(op, w, "w");
  check_defined(op, mu, "mu");
  check_defined(op, lse_k, "lse_k");
  LINEA_CHECK(w.dim() == 4 && w.numel() > 0 && mu.shape() == w.shape() &&
                  lse_k.shape() == Shape({w.size(0), w.size(1), w.size(2)}),
              op, ": expected w and mu [B, H, C, D], lse_k [B, H, C] (all dims > 0), got w ", shape_str(w.shape()),
              ", mu ", shape_str(mu.shape()), ", lse_k ", shape_str(lse_k.shape()));
  LINEA_CHECK(is_floating(w.dtype()), op, ": expected float32 or float64, got ", dtype_name(w.dtype()));
  for (const Tensor* t : {&mu, &lse_k}) {
    check_same_dtype(op, w, *t);
    check_same_device(op, w, *t);
  }
  Tensor p = empty({w.size(0), w.size(1), w.size(2), w.size(2)}, w.options()),
         self_w = empty(lse_k.shape(), w.options()), bias = empty(lse_k.shape(), w.options());
  LINEA_BACKEND(w.device(), lara_proposals_forward, contiguous(w), contiguous(mu), contiguous(lse_k), p, self_w, bias);
  return {self_w, bias, p};
}

std::vector<Tensor> lara_proposals_backward(const Tensor& dself_w, const Tensor& dbias, const Tensor& w,
                                            const Tensor& mu, const Tensor& p) {
  const char* op = "lara_proposals_backward";
  for (const Tensor* t : {&dself_w, &dbias, &w, &mu, &p}) check_defined(op, *t, "argument");
  const Shape rows{w.size(0), w.size(1), w.size(2)};
  LINEA_CHECK(w.dim() == 4 && mu.shape() == w.shape() && dself_w.shape() == rows && dbias.shape() == rows &&
                  p.shape() == Shape({w.size(0), w.size(1), w.size(2), w.size(2)}),
              op, ": expected w and mu [B, H, C, D], dself_w and dbias [B, H, C], p [B, H, C, C], got w ",
              shape_str(w.shape()), ", mu ", shape_str(mu.shape()), ", dself_w ", shape_str(dself_w.shape()),
              ", dbias ", shape_str(dbias.shape()), ", p ", shape_str(p.shape()));
  for (const Tensor* t : {&mu, &p, &dself_w, &dbias}) check_same_dtype(op, w, *t);
  Tensor dw = empty(w.shape(), w.options()), dmu = empty(w.shape(), w.options());
  LINEA_BACKEND(w.device(), lara_proposals_backward, contiguous(w), contiguous(mu), contiguous(p), contiguous(dself_w),
                contiguous(dbias), dw, dmu);
  return {dw, dmu};
}

}  // namespace linea::raw
