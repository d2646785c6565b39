// Differentiable matmul/bmm and neural-net ops (softmax, log_softmax, layer_norm,
// cross_entropy, dropout): forward through linea::raw, backward written beside it.
// Derivative rules (g = gradient of the output):
//   matmul   C = s A @ B      dA = s sum_to(g @ B^T), dB = s sum_to(A^T @ g)   (transposed views, no copies;
//                             a gradient that needs no sum is written in its input's layout)
//   linear   y = x W^T + b    dx = g W, dW = g^T x, db = sum_rows g   (one GEMM each; db with dW)
//   softmax  y = softmax(x)   dx = y * (g - sum(g * y))
//   log_softmax               dx = g - exp(y) * sum(g)
//   layer_norm                dx = rstd * (gw - mean(gw) - xhat * mean(gw * xhat)), gw = g * w;
//                             dw = sum_rows g * xhat, db = sum_rows g
//   normalize  y = x / |x|    dx = (g - y (y . g)) / |x|; g / eps where |x| < eps (y = x / eps)
//   sq_norm  y = s |x|^2      dx = 2 s g x   (over the last dim, which y drops)
//   cross_entropy (per row)   dx = (softmax(x) - (1 - s) onehot(t) - s / C) * g_row, 0 for ignored rows
//   dropout  y = x * m        dx = g * m, m = bernoulli(1 - p) / (1 - p) drawn per example, again in
//                             the backward (the same counters) instead of kept
//   scaled_dot_product_attention  O = P V, P = softmax(scale Q K^T): dV = P^T g,
//                             dS = P * (g V^T - rowsum(g * O)), dQ = scale dS K, dK = scale dS^T Q
//   toeplitz_attention        y = T(c) o (Pq Pk^T) V: dPq = (g V^T o T) Pk, dPk = (g V^T o T)^T Pq,
//                             dV = (T o Pq Pk^T)^T g, dc_t = sum over j - i = t of (g V^T o Pq Pk^T)_ij
//                             (all by FFT, one feature at a time)
//   positive_features         phi = exp(x W^T - |x|^2/2 - c) / sqrt(S), c a detached max:
//                             dl = g * phi, dx = dl W - rowsum(dl) x, dW = dl^T x
//   linear_attention          O = (Pq KV) / den, KV = Pk^T V, den = Pq z, z = Pk^T 1:
//                             G = [g / den, -rowsum(g * O) / den], dPq = G [KV, z]^T,
//                             [dKV, dz] = Pq^T G, dPk = V dKV^T + 1 dz^T, dV = Pk dKV
//   favor_attention           (causal_)linear_attention of positive_features(scale q) and (scale k),
//                             as one op
//   causal_linear_attention   the same per chunk of rows, KV the state before the chunk plus the
//                             chunk's own keys through tril(Pq Pk^T); dstate = Pq^T G
//                             (the chunk formulas: core/cpu/linear_attention.cpp)
//   lara_mixture              the chain of core/cpu/lara_mixture.cpp, by hand
// Not here: kernels (core/cpu/, cuda/) and the raw argument checks they share (core/ops_nn.cpp).
#include <algorithm>
#include <cstdint>
#include <vector>

#include "autograd/ops.h"
#include "core/ops.h"
#include "core/random.h"

namespace linea {

// ---- matmul -----------------------------------------------------------------------------------
// a [..., M, K] or [K], b [..., K, N] or [K] -> [batch..., M, N] minus promoted dims
namespace {
// A transposed view: its last two dims are stored column by column (a matrix of at least 2x2).
bool column_major(const Tensor& t) {
  return t.dim() >= 2 && t.size(-1) > 1 && t.size(-2) > 1 && t.stride(-2) == 1 && t.stride(-1) >= t.size(-2);
}
// t's matrix shape behind g's batch dims: the shape t's gradient has before any batch sum.
Shape batched_shape(const Tensor& g, const Tensor& t) {
  Shape s = g.shape();
  s[s.size() - 2] = t.size(-2);
  s[s.size() - 1] = t.size(-1);
  return s;
}

// A gradient of t's shape computed into t's layout: out = alpha (x @ y), laid out like t
// (raw::empty_like_layout: e.g. q [B, H, N, D] viewed from [B, N, H, D]), so that the views'
// backward hands on a contiguous gradient instead of copying it. A transposed t gets out^T in
// the layout of t^T.
Tensor grad_in_layout(const Tensor& t, const Tensor& x, const Tensor& y, double alpha) {
  if (column_major(t)) {
    Tensor inner = raw::empty_like_layout(t.transpose(-1, -2));  // (x @ y)^T = y^T @ x^T
    raw::matmul_into(y.transpose(-1, -2), x.transpose(-1, -2), inner, alpha);
    return inner.transpose(-1, -2);
  }
  Tensor out = raw::empty_like_layout(t);
  raw::matmul_into(x, y, out, alpha);
  return out;
}
}  // namespace

Tensor matmul(const Tensor& a, const Tensor& b, double alpha) {
  Tensor out = raw::matmul(a, b, alpha);
  if (!needs_grad({&a, &b})) return out;
  const bool need_a = a.requires_grad(), need_b = b.requires_grad();
  return attach(out, "matmul", {a, b},
                [ad = a.detach(), bd = b.detach(), need_a, need_b, alpha](const Tensor& g) -> std::vector<Tensor> {
                  // Promoted views: a2 [.., M, K], b2 [.., K, N], g2 [batch.., M, N].
                  const Tensor a2 = ad.dim() == 1 ? ad.unsqueeze(0) : ad;
                  const Tensor b2 = bd.dim() == 1 ? bd.unsqueeze(1) : bd;
                  Tensor g2 = g;
                  if (ad.dim() == 1 && bd.dim() == 1)
                    g2 = g.reshape({1, 1});
                  else if (ad.dim() == 1)
                    g2 = g.unsqueeze(-2);
                  else if (bd.dim() == 1)
                    g2 = g.unsqueeze(-1);
                  const int64_t K = a2.size(-1), N = b2.size(-1);
                  Tensor da, db;
                  if (need_a) {
                    // dA2 [batch.., M, K] = alpha g2 [batch.., M, N] @ b2^T [.., N, K], in a2's layout
                    // when a2 is not broadcast (no sum), so that the views a2 came from hand on a
                    // contiguous gradient (summing gradients of different layouts reads one of them
                    // across cache lines, and a reshape of a permuted one copies).
                    if (a2.shape() == batched_shape(g2, a2))
                      da = grad_in_layout(a2, g2, b2.transpose(-1, -2), alpha);
                    else
                      da = sum_to(matmul(g2, b2.transpose(-1, -2), alpha), a2.shape());
                    if (ad.dim() == 1) da = da.reshape(ad.shape());
                  }
                  if (need_b) {
                    if (b2.dim() == 2 && a2.dim() > 2 && K > 0) {
                      // b shared by the batch: one GEMM over the folded batch instead of a batch of
                      // products and a reduction. dB [K, N] = alpha a_flat^T [K, BM] @ g_flat [BM, N]
                      const int64_t BM = a2.numel() / K;
                      const Tensor af = a2.reshape({BM, K});
                      const Tensor gf = g2.reshape({BM, N});
                      db = column_major(b2) ? matmul(gf.transpose(0, 1), af, alpha).transpose(0, 1)
                                            : matmul(af.transpose(0, 1), gf, alpha);
                    } else if (b2.shape() == batched_shape(g2, b2)) {
                      // dB2 [batch.., K, N] = alpha a2^T @ g2, in b2's layout, as for dA2
                      db = grad_in_layout(b2, a2.transpose(-1, -2), g2, alpha);
                    } else {
                      db = sum_to(matmul(a2.transpose(-1, -2), g2, alpha), b2.shape());
                    }
                    if (bd.dim() == 1) db = db.reshape(bd.shape());
                  }
                  return {da, db};
                });
}

// x [..., K] @ weight^T [K, N] + bias [N] -> [..., N]
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  Tensor out = raw::linear(x, weight, bias);
  if (!needs_grad({&x, &weight, &bias})) return out;
  const bool need_x = x.requires_grad(), need_w = weight.requires_grad();
  const bool need_b = bias.defined() && bias.requires_grad();
  return attach(
      out, "linear", {x, weight, bias},
      [xd = x.detach(), wd = weight.detach(), need_x, need_w, need_b](const Tensor& g) -> std::vector<Tensor> {
        // g [..., N]: dx [..., K] = g @ weight; dw [N, K] = g^T @ x and db [N] = g summed,
        // over the rows.
        Tensor dx, dw, db;
        if (need_x) dx = raw::matmul(g, wd);
        if (need_w || need_b) {
          std::vector<Tensor> wb = raw::linear_weight_grad(g, xd, need_b);
          if (need_w) dw = wb[0];
          if (need_b) db = wb[1];
        }
        return {dx, dw, db};
      });
}

// x through several linear layers (attention's q, k and v projections of one input): one node
// whose backward sums x's gradient in the GEMMs (each after the first adds into it, beta = 1),
// where a node per layer left the engine an add per extra layer. When the weights (and the
// biases) lie one after another in one buffer (MultiHeadAttention packs them), the layers run
// as one: one GEMM whose output's column blocks are the layers' outputs, and, when their
// gradients come back as one buffer's column blocks too (the CUDA attention kernels write dq, dk
// and dv so), one GEMM for x's gradient and one for the weights' and biases'. Otherwise layer by
// layer, as linear.
std::vector<Tensor> linears(const Tensor& x, const std::vector<Tensor>& weights, const std::vector<Tensor>& biases) {
  LINEA_CHECK(!weights.empty() && biases.size() == weights.size(), "linears: expected as many biases as weights (",
              "undefined for none) and at least one weight, got ", weights.size(), " weights and ", biases.size(),
              " biases");
  const bool no_bias = std::none_of(biases.begin(), biases.end(), [](const Tensor& b) { return b.defined(); });
  Tensor w_all = raw::joined_view(weights, 0), b_all = no_bias ? Tensor() : raw::joined_view(biases, 0);
  if (!no_bias && !b_all.defined()) w_all = Tensor();  // the biases are not packed as the weights are
  std::vector<int64_t> sizes;  // the layers' output features (an undefined weight: raw::linear's error)
  for (const Tensor& w : weights) sizes.push_back(w.defined() ? w.size(0) : 0);
  std::vector<Tensor> outs, inputs{x};  // inputs: x, w0, b0, w1, b1, ...
  if (w_all.defined())
    outs = raw::split(raw::linear(x, w_all, b_all), sizes, -1);  // checks x against w_all (and b_all)
  for (size_t i = 0; i < weights.size(); ++i) {
    if (!w_all.defined()) outs.push_back(raw::linear(x, weights[i], biases[i]));
    inputs.push_back(weights[i]);
    inputs.push_back(biases[i]);
  }
  if (!needs_grad(inputs)) return outs;
  std::vector<Tensor> wd;
  std::vector<char> need_w, need_b;
  for (size_t i = 0; i < weights.size(); ++i) {
    wd.push_back(weights[i].detach());
    need_w.push_back(weights[i].requires_grad());
    need_b.push_back(biases[i].defined() && biases[i].requires_grad());
  }
  return attach_outputs(
      std::move(outs), "linears", inputs,
      [xd = x.detach(), wd, w_all, sizes, need_x = x.requires_grad(), need_w, need_b](const std::vector<Tensor>& g) {
        // g[i] [..., N_i] (undefined: that output got no gradient): dx [..., K] = sum_i g[i] @ w_i
        // over the rows [R, K], dw_i = g[i]^T @ x and db_i = g[i] summed over the rows, as linear's.
        std::vector<Tensor> grads(1 + 2 * g.size());
        const Tensor g_all = w_all.defined() ? raw::joined_view(g, -1) : Tensor();
        if (g_all.defined()) {  // one GEMM each for dx and for [dw_0; dw_1; ...] with [db_0; db_1; ...]
          if (need_x)
            grads[0] = raw::reshape(raw::matmul(raw::reshape(g_all, {-1, g_all.size(-1)}), w_all), xd.shape());
          const bool want_w = std::find(need_w.begin(), need_w.end(), 1) != need_w.end();
          const bool want_b = std::find(need_b.begin(), need_b.end(), 1) != need_b.end();
          if (!want_w && !want_b) return grads;
          const std::vector<Tensor> wb = raw::linear_weight_grad(g_all, xd, want_b);
          const std::vector<Tensor> dw = raw::split(wb[0], sizes, 0);
          const std::vector<Tensor> db = want_b ? raw::split(wb[1], sizes, 0) : std::vector<Tensor>(g.size());
          for (size_t i = 0; i < g.size(); ++i) {
            if (need_w[i]) grads[1 + 2 * i] = dw[i];
            if (need_b[i]) grads[2 + 2 * i] = db[i];
          }
          return grads;
        }
        Tensor dx;  // [R, K]
        for (size_t i = 0; i < g.size(); ++i) {
          if (!g[i].defined()) continue;
          const Tensor g2 = raw::reshape(g[i], {-1, g[i].size(-1)});  // [R, N_i]
          if (need_x && !dx.defined())
            dx = raw::matmul(g2, wd[i]);
          else if (need_x)
            raw::matmul_into(g2, wd[i], dx, 1.0, /*accumulate=*/true);
          if (need_w[i] || need_b[i]) {
            std::vector<Tensor> wb = raw::linear_weight_grad(g[i], xd, need_b[i]);
            if (need_w[i]) grads[1 + 2 * i] = wb[0];
            if (need_b[i]) grads[2 + 2 * i] = wb[1];
          }
        }
        if (dx.defined()) grads[0] = raw::reshape(dx, xd.shape());
        return grads;
      });
}

// a [B, M, K] @ b [B, K, N] -> [B, M, N]
Tensor bmm(const Tensor& a, const Tensor& b) {
  raw::check_defined("bmm", a, "a");
  raw::check_defined("bmm", b, "b");
  LINEA_CHECK(a.dim() == 3 && b.dim() == 3, "bmm: expected 3-D tensors [B, M, K] and [B, K, N], got ",
              shape_str(a.shape()), " and ", shape_str(b.shape()));
  LINEA_CHECK(a.size(0) == b.size(0), "bmm: batch sizes differ (", shape_str(a.shape()), " and ", shape_str(b.shape()),
              ")");
  LINEA_CHECK(a.size(2) == b.size(1), "bmm: shapes cannot be multiplied (", shape_str(a.shape()), " and ",
              shape_str(b.shape()), ")");
  return matmul(a, b);
}

// ---- softmax ------------------------------------------------------------------------------------
namespace {
Tensor softmax_impl(const Tensor& x, int64_t dim, bool log) {
  Tensor y = raw::softmax(x, dim, log);
  if (!needs_grad({&x})) return y;
  return attach(y, log ? "log_softmax" : "softmax", {x},
                [yd = y.detach(), dim, log](const Tensor& g) -> std::vector<Tensor> {
                  // g, yd, dx [x's shape]
                  return {raw::softmax_backward(g, yd, dim, log)};
                });
}
}  // namespace

Tensor softmax(const Tensor& x, int64_t dim) { return softmax_impl(x, dim, false); }
Tensor log_softmax(const Tensor& x, int64_t dim) { return softmax_impl(x, dim, true); }

// ---- layer norm ---------------------------------------------------------------------------------
// x [..., *normalized_shape]; weight, bias [*normalized_shape] or undefined
Tensor layer_norm(const Tensor& x, const Shape& normalized_shape, const Tensor& weight, const Tensor& bias,
                  double eps) {
  raw::check_defined("layer_norm", x, "x");
  const int64_t nd = static_cast<int64_t>(normalized_shape.size());
  LINEA_CHECK(nd >= 1 && nd <= x.dim() && Shape(x.shape().end() - nd, x.shape().end()) == normalized_shape,
              "layer_norm: normalized_shape ", shape_str(normalized_shape),
              " does not match the trailing dims of the input ", shape_str(x.shape()));
  std::vector<Tensor> r = raw::layer_norm(x, nd, weight, bias, eps);  // {out, mean [rows], rstd [rows]}
  std::vector<Tensor> inputs{x};
  if (weight.defined()) inputs.push_back(weight);
  if (bias.defined()) inputs.push_back(bias);
  if (!needs_grad(inputs)) return r[0];
  const Tensor wd = weight.defined() ? weight.detach() : Tensor();
  const Tensor bd = bias.defined() ? bias.detach() : Tensor();
  return attach(r[0], "layer_norm", inputs,
                [xd = x.detach(), wd, bd, mean = r[1], rstd = r[2], nd](const Tensor& g) -> std::vector<Tensor> {
                  // g, dx [..., *norm]; dw, db [*norm]
                  std::vector<Tensor> d = raw::layer_norm_backward(g, xd, nd, wd, bd, mean, rstd);
                  std::vector<Tensor> grads{d[0]};
                  if (wd.defined()) grads.push_back(d[1]);
                  if (bd.defined()) grads.push_back(d[2]);
                  return grads;
                });
}

Tensor normalize(const Tensor& x, double eps) {
  Tensor y = raw::normalize(x, eps);
  if (!needs_grad({&x})) return y;
  return attach(y, "normalize", {x}, [xd = x.detach(), eps](const Tensor& g) -> std::vector<Tensor> {
    return {raw::normalize_backward(g, xd, eps)};
  });
}

Tensor sums_ratio(const Tensor& y, const Tensor& visible, double tiny) {
  Tensor out = raw::sums_ratio(y, visible, tiny);
  if (!needs_grad({&y})) return out;
  const Tensor vis = visible.defined() ? visible.detach() : Tensor();
  return attach(out, "sums_ratio", {y}, [yd = y.detach(), vis, tiny](const Tensor& g) -> std::vector<Tensor> {
    return {raw::sums_ratio_backward(g, yd, vis, tiny)};
  });
}

Tensor sq_norm(const Tensor& x, double scale) {
  Tensor y = raw::sq_norm(x, scale);
  if (!needs_grad({&x})) return y;
  return attach(y, "sq_norm", {x}, [xd = x.detach(), scale](const Tensor& g) -> std::vector<Tensor> {
    return {raw::sq_norm_backward(g, xd, scale)};
  });
}

std::pair<Tensor, Tensor> add_layer_norm(const Tensor& x, const Tensor& r, const Shape& normalized_shape,
                                         const Tensor& weight, const Tensor& bias, double eps, double dropout) {
  raw::check_defined("add_layer_norm", x, "x");
  const int64_t nd = static_cast<int64_t>(normalized_shape.size());
  LINEA_CHECK(nd >= 1 && nd <= x.dim() && Shape(x.shape().end() - nd, x.shape().end()) == normalized_shape,
              "add_layer_norm: normalized_shape ", shape_str(normalized_shape),
              " does not match the trailing dims of the input ", shape_str(x.shape()));
  LINEA_CHECK(dropout >= 0 && dropout <= 1, "add_layer_norm: dropout must be in [0, 1], got ", dropout);
  // The residual branch's dropout: its draw reserved here, as dropout() would reserve it.
  FoldedDropout fd;
  ExampleDraw d;
  if (dropout > 0) {
    d = reserve_example_draw(x.device());
    fd = FoldedDropout{dropout, d.seed, d.draw, d.first_row, d.base};
  }
  // {sum [x's shape], out [x's shape], mean [rows], rstd [rows]}: one kernel on CUDA
  std::vector<Tensor> f = raw::add_layer_norm(x, r, fd, nd, weight, bias, eps);
  std::vector<Tensor> inputs{x, r};
  if (weight.defined()) inputs.push_back(weight);
  if (bias.defined()) inputs.push_back(bias);
  if (!needs_grad(inputs)) return {f[0], f[1]};
  // One node for both outputs: the sum's own gradient (from the next residual) is added in the
  // norm's backward kernel, which also writes r's through the dropout (one launch, where the norm's
  // backward, the engine's sum of the two and the dropout took three).
  std::vector<Tensor> outs =
      attach_outputs({f[0], f[1]}, "add_layer_norm", inputs,
                     [sd = f[0].detach(), wd = weight.defined() ? weight.detach() : Tensor(),
                      bd = bias.defined() ? bias.detach() : Tensor(), mean = f[2], rstd = f[3], nd,
                      fd](const std::vector<Tensor>& g) -> std::vector<Tensor> {
                       std::vector<Tensor> d = raw::add_layer_norm_backward(g[1], g[0], sd, nd, wd, bd, mean, rstd, fd);
                       std::vector<Tensor> grads{d[0], d[1].defined() ? d[1] : d[0]};  // x's, r's
                       if (wd.defined()) grads.push_back(d[2]);
                       if (bd.defined()) grads.push_back(d[3]);
                       return grads;
                     });
  return {outs[0], outs[1]};
}

// ---- cross-entropy ------------------------------------------------------------------------------
namespace {
// logits [N, C], target Int64 [N]: the fused per-row kernel, then the reduction.
Tensor cross_entropy_rows(const Tensor& l2, const Tensor& t2, int64_t ignore_index, double label_smoothing,
                          Reduction reduction, Tensor* nll) {
  // {loss, lse (, nll)} [N]
  std::vector<Tensor> rows = raw::cross_entropy_rows(l2, t2, ignore_index, label_smoothing, nll != nullptr);
  if (nll) *nll = raw::reduce(ReduceOp::Sum, rows[2], {}, false);
  Tensor loss = rows[0];
  if (needs_grad({&l2})) {
    loss = attach(loss, "cross_entropy", {l2},
                  [ld = l2.detach(), td = t2.detach(), lse = rows[1], ignore_index,
                   label_smoothing](const Tensor& g) -> std::vector<Tensor> {
                    // g [N] -> dlogits [N, C]
                    return {raw::cross_entropy_rows_backward(g, ld, td, lse, ignore_index, label_smoothing)};
                  });
  }
  switch (reduction) {
    case Reduction::None:
      return loss;
    case Reduction::Sum:
      return sum(loss);
    case Reduction::Mean: {
      // Divided by the number of non-ignored rows, at least 1 (an all-ignored batch gives 0, not
      // NaN): one kernel, on the device (no host sync). Its backward hands the rows' backward
      // g / count expanded (read in place, no copy).
      std::vector<Tensor> mc = raw::cross_entropy_mean(loss, t2, ignore_index);  // {mean, count}
      if (!needs_grad({&loss})) return mc[0];
      return attach(mc[0], "cross_entropy_mean", {loss},
                    [count = mc[1], N = loss.size(0)](const Tensor& g) -> std::vector<Tensor> {
                      return {raw::expand(raw::binary(BinaryOp::Div, g, count), {N})};  // g 0-d -> [N]
                    });
    }
  }
  LINEA_FAIL("cross_entropy: unknown reduction");
}
}  // namespace

// logits [..., C] with target Int64 [...] (any leading dims, flattened to rows), or [C] with a 0-d target
Tensor cross_entropy(const Tensor& logits, const Tensor& target, int64_t ignore_index, double label_smoothing,
                     Reduction reduction, Tensor* nll) {
  raw::check_defined("cross_entropy", logits, "logits");
  raw::check_defined("cross_entropy", target, "target");
  LINEA_CHECK(target.dtype() == DType::Int64, "cross_entropy: target must be int64 class indices, got ",
              dtype_name(target.dtype()), " (shape ", shape_str(target.shape()), ")");
  LINEA_CHECK(label_smoothing >= 0.0 && label_smoothing <= 1.0,
              "cross_entropy: label smoothing must be in [0, 1], got ", label_smoothing);
  LINEA_CHECK(logits.dim() >= 1 && target.dim() == logits.dim() - 1, "cross_entropy: logits ",
              shape_str(logits.shape()), " need a target with one dim fewer (a 0-d target for [C] logits), got target ",
              shape_str(target.shape()));
  const Shape lead(logits.shape().begin(), logits.shape().end() - 1);
  LINEA_CHECK(lead == target.shape(), "cross_entropy: target ", shape_str(target.shape()), " does not match logits ",
              shape_str(logits.shape()), " (expected target ", shape_str(lead), ")");
  if (logits.dim() == 2) return cross_entropy_rows(logits, target, ignore_index, label_smoothing, reduction, nll);
  // [..., C] -> [N, C] and [...] -> [N] (a [C] row becomes [1, C]; reshape is differentiable)
  const int64_t C = logits.size(-1);
  Tensor loss = cross_entropy_rows(reshape(logits, {-1, C}), reshape(target, {-1}), ignore_index, label_smoothing,
                                   reduction, nll);
  return reduction == Reduction::None ? reshape(loss, target.shape()) : loss;
}

// ---- dropout ------------------------------------------------------------------------------------
Tensor dropout(const Tensor& x, double p, bool training) {
  raw::check_defined("dropout", x, "x");
  LINEA_CHECK(p >= 0.0 && p <= 1.0, "dropout: probability p must be in [0, 1], got ", p);
  if (!training || p == 0.0) return x;
  LINEA_CHECK(is_floating(x.dtype()), "dropout: expected a float32 or float64 input, got ", x.dtype());
  // mask [x's shape]: 0 with probability p, else 1 / (1 - p); dim 0 is the batch (a per-example
  // draw, as bernoulli_per_example(1 - p)). One kernel draws and applies it; the backward draws
  // it again from the same counters rather than keeping it.
  const ExampleDraw d = reserve_example_draw(x.device());
  Tensor out = dropout_rows(x, p, d);
  if (!needs_grad({&x})) return out;
  return attach(out, "dropout", {x}, [p, d](const Tensor& g) -> std::vector<Tensor> {
    // g, dx [x's shape]
    return {dropout_rows(g, p, d)};
  });
}

Tensor activation_dropout(const Tensor& x, UnaryOp act, double p, bool training) {
  raw::check_defined("activation_dropout", x, "x");
  LINEA_CHECK(p >= 0.0 && p <= 1.0, "activation_dropout: probability p must be in [0, 1], got ", p);
  LINEA_CHECK(act == UnaryOp::GeluErf || act == UnaryOp::GeluTanh || act == UnaryOp::Relu,
              "activation_dropout: the activation must be gelu, gelu(tanh) or relu, got ", unary_op_name(act));
  if (!training || p == 0.0) return act == UnaryOp::Relu ? relu(x) : gelu(x, act == UnaryOp::GeluTanh);
  const ExampleDraw d = reserve_example_draw(x.device());
  Tensor out = activation_dropout(act, x, Tensor(), p, d);
  if (!needs_grad({&x})) return out;
  return attach(out, "activation_dropout", {x}, [act, p, d, xd = x.detach()](const Tensor& g) -> std::vector<Tensor> {
    return {activation_dropout(act, xd, g, p, d)};  // act'(x) * dropout(g), the mask drawn again
  });
}

// ---- fused attention ----------------------------------------------------------------------------
namespace {
// q, k, v and the key bias as the sdpa kernels read them (raw::as_head_rows: the heads of a
// projection in place), kept so for the backward, which then copies nothing; the padding detached; the graph's inputs
// (the bias only when given).
struct SdpaOperands {
  Tensor q, k, v, bias, pad;
  std::vector<Tensor> inputs;
};
SdpaOperands sdpa_operands(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& key_padding,
                           const Tensor& key_bias) {
  raw::check_defined("sdpa", q, "q");
  raw::check_defined("sdpa", k, "k");
  raw::check_defined("sdpa", v, "v");
  SdpaOperands o{raw::as_head_rows(q.detach()),
                 raw::as_head_rows(k.detach()),
                 raw::as_head_rows(v.detach()),
                 key_bias.defined() ? raw::contiguous(key_bias.detach()) : Tensor(),
                 key_padding.defined() ? key_padding.detach() : Tensor(),
                 {q, k, v}};
  if (key_bias.defined()) o.inputs.push_back(key_bias);
  return o;
}
}  // namespace

Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v, double scale, bool causal,
                                    int64_t query_offset, const Tensor& key_padding, bool keep_probs, double dropout_p,
                                    const Tensor& key_bias) {
  const bool grad = needs_grad({&q, &k, &v, &key_bias});
  LINEA_CHECK(dropout_p >= 0.0 && dropout_p < 1.0, "scaled_dot_product_attention: dropout_p must be in [0, 1), got ",
              dropout_p);
  // Dropout of the probabilities: a per-example draw, the backward drawing the same factors again.
  FoldedDropout drop;
  if (dropout_p > 0.0) {
    const ExampleDraw d = reserve_example_draw(q.device());
    drop = FoldedDropout{dropout_p, d.seed, d.draw, d.first_row, d.base};
    keep_probs = false;
  }
  const SdpaOperands o = sdpa_operands(q, k, v, key_padding, key_bias);
  std::vector<Tensor> r = raw::sdpa(o.q, o.k, o.v, scale, causal, query_offset, o.pad, grad && keep_probs, drop,
                                    o.bias);  // out, lse, probs
  if (!grad) return r[0];
  return attach(r[0], "scaled_dot_product_attention", o.inputs,
                [qd = o.q, kd = o.k, vd = o.v, bd = o.bias, out = r[0].detach(), lse = r[1], probs = r[2], scale,
                 causal, query_offset, pad = o.pad, drop](const Tensor& g) -> std::vector<Tensor> {
                  std::vector<Tensor> d =
                      raw::sdpa_backward(g, qd, kd, vd, out, lse, scale, causal, query_offset, pad, probs, drop, bd);
                  if (!bd.defined()) d.pop_back();  // {dq, dk, dv}
                  return d;
                });
}

std::pair<Tensor, Tensor> scaled_dot_product_attention_lse(const Tensor& q, const Tensor& k, const Tensor& v,
                                                           double scale, bool causal, int64_t query_offset,
                                                           const Tensor& key_padding, const Tensor& key_bias) {
  const SdpaOperands o = sdpa_operands(q, k, v, key_padding, key_bias);
  std::vector<Tensor> r = raw::sdpa(o.q, o.k, o.v, scale, causal, query_offset, o.pad, false, FoldedDropout(), o.bias);
  if (!needs_grad(o.inputs)) return {r[0], r[1]};
  // One node for both outputs: its backward gets out's gradient and lse's (either may be absent).
  std::vector<Tensor> outs = attach_outputs(
      {r[0], r[1]}, "scaled_dot_product_attention_lse", o.inputs,
      [qc = o.q, kc = o.k, vc = o.v, bc = o.bias, out = r[0].detach(), lse = r[1].detach(), scale, causal, query_offset,
       pad = o.pad](const std::vector<Tensor>& g) -> std::vector<Tensor> {
        const Tensor gout = g[0].defined() ? g[0] : zeros_like(out);
        std::vector<Tensor> d = raw::sdpa_backward(gout, qc, kc, vc, out, lse, scale, causal, query_offset, pad,
                                                   Tensor(), FoldedDropout(), bc, g[1]);
        if (!bc.defined()) d.pop_back();  // {dq, dk, dv}
        return d;
      });
  return {outs[0], outs[1]};
}

Tensor sample_attention_keys(const Tensor& q, const Tensor& k, const Tensor& u, double scale,
                             const Tensor& key_padding) {
  return raw::sdpa_sample(q, k, u, scale, key_padding);
}

Tensor toeplitz_attention(const Tensor& c, const Tensor& phi_q, const Tensor& phi_k, const Tensor& v,
                          int64_t fft_len) {
  Tensor y = raw::toeplitz_attention(c, phi_q, phi_k, v, fft_len);
  if (!needs_grad({&c, &phi_q, &phi_k, &v})) return y;
  return attach(y, "toeplitz_attention", {c, phi_q, phi_k, v},
                [cd = c.detach(), qd = phi_q.detach(), kd = phi_k.detach(), vd = v.detach(),
                 fft_len](const Tensor& g) -> std::vector<Tensor> {
                  return raw::toeplitz_attention_backward(g, cd, qd, kd, vd, fft_len);
                });
}

Tensor positive_features(const Tensor& x, const Tensor& omega, bool per_row, const Tensor& key_padding) {
  const Tensor pad = key_padding.defined() ? key_padding.detach() : Tensor();
  // Contiguous once here, kept for the backward (heads split off a projection are strided views).
  const Tensor xc = raw::contiguous(x.detach()), wc = raw::contiguous(omega.detach());
  Tensor phi = raw::positive_features(xc, wc, per_row, pad);
  if (!needs_grad({&x, &omega})) return phi;
  return attach(phi, "positive_features", {x, omega},
                [xc, wc, out = phi.detach(), want_w = omega.requires_grad()](const Tensor& g) -> std::vector<Tensor> {
                  return raw::positive_features_backward(g, xc, wc, out, want_w);
                });
}

Tensor linear_attention(const Tensor& phi_q, const Tensor& phi_k, const Tensor& v, double den_guard) {
  const Tensor pq = raw::contiguous(phi_q.detach()), pk = raw::contiguous(phi_k.detach()),
               vc = raw::contiguous(v.detach());
  std::vector<Tensor> r = raw::linear_attention(pq, pk, vc, den_guard);  // out, den, kvz
  if (!needs_grad({&phi_q, &phi_k, &v})) return r[0];
  return attach(r[0], "linear_attention", {phi_q, phi_k, v},
                [pq, pk, vc, out = r[0].detach(), den = r[1], kvz = r[2], den_guard](const Tensor& g) {
                  return raw::linear_attention_backward(g, pq, pk, vc, out, den, kvz, den_guard);
                });
}

Tensor favor_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& omega, double scale,
                       const Tensor& key_padding, double den_guard, bool causal, int64_t chunk) {
  LINEA_CHECK(!omega.requires_grad(),
              "favor_attention: omega takes no gradient (the features are samples); got an "
              "omega that requires one");
  const Tensor pad = key_padding.defined() ? key_padding.detach() : Tensor();
  // Kept as they are for the backward (the raw op reads the heads of a projection in place).
  const Tensor qc = q.detach(), kc = k.detach(), vc = v.detach(), wc = omega.detach();
  // out, den, kvz (causal: the chunk states), phi_q, phi_k[, q~, k~]
  std::vector<Tensor> r = raw::favor_attention(qc, kc, vc, wc, scale, pad, den_guard, causal, chunk);
  const Tensor out = r[0];
  if (!needs_grad({&q, &k, &v})) return out;
  r[0] = out.detach();
  return attach(out, "favor_attention", {q, k, v},
                [qc, kc, vc, wc, scale, r = std::move(r), den_guard, causal, chunk](const Tensor& g) {
                  return raw::favor_attention_backward(g, qc, kc, vc, wc, scale, r, den_guard, causal, chunk);
                });
}

std::vector<Tensor> favor_attention_step(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& omega,
                                         double scale, const Tensor& key_padding, double den_guard, const Tensor& sums,
                                         const Tensor& c, int64_t chunk) {
  LINEA_CHECK(!needs_grad({&q, &k, &v, &omega, &sums, &c}),
              "favor_attention_step: decoding takes no gradient; run it under NoGradGuard");
  return raw::favor_attention_step(q, k, v, omega, scale, key_padding, den_guard, sums, c, chunk);
}

Tensor causal_linear_attention(const Tensor& phi_q, const Tensor& phi_k, const Tensor& v, const Tensor& state,
                               int64_t chunk, double den_guard, Tensor* final) {
  const Tensor pq = raw::contiguous(phi_q.detach()), pk = raw::contiguous(phi_k.detach()),
               vc = raw::contiguous(v.detach());
  // out, den, states, final
  std::vector<Tensor> r =
      raw::causal_linear_attention(pq, pk, vc, state.defined() ? state.detach() : Tensor(), chunk, den_guard);
  if (final) *final = r[3];
  if (!needs_grad({&phi_q, &phi_k, &v, &state})) return r[0];
  return attach(r[0], "causal_linear_attention", {phi_q, phi_k, v, state},
                [pq, pk, vc, out = r[0].detach(), den = r[1], states = r[2], chunk, den_guard,
                 want_dstate = state.defined() && state.requires_grad()](const Tensor& g) {
                  return raw::causal_linear_attention_backward(g, pq, pk, vc, out, den, states, chunk, den_guard,
                                                               want_dstate);
                });
}

Tensor lara_mixture(const Tensor& q, const Tensor& qbar, const Tensor& w, const Tensor& self_w, const Tensor& bias,
                    double beta, double floor, double q_scale) {
  const Tensor qc = raw::contiguous(q.detach()), qb = raw::contiguous(qbar.detach()), wc = raw::contiguous(w.detach());
  std::vector<Tensor> r = raw::lara_mixture(qc, qb, wc, self_w.detach(), bias.detach(), beta, floor, q_scale);
  if (!needs_grad({&q, &qbar, &w, &self_w, &bias})) return r[0];
  return attach(r[0], "lara_mixture", {q, qbar, w, self_w, bias},
                [qc, qb, wc, mix = r[0].detach(), t = r[1], a = r[2], beta, floor, q_scale](const Tensor& g) {
                  return raw::lara_mixture_backward(g, qc, qb, wc, mix, t, a, beta, floor, q_scale);
                });
}

std::pair<Tensor, Tensor> lara_proposals(const Tensor& w, const Tensor& mu, const Tensor& lse_k) {
  const Tensor wc = raw::contiguous(w.detach()), mc = raw::contiguous(mu.detach());
  std::vector<Tensor> r = raw::lara_proposals(wc, mc, lse_k.detach());  // {self_w, bias, p}
  if (!needs_grad({&w, &mu, &lse_k})) return {r[0], r[1]};
  // One node for both outputs (either may get no gradient); lse_k's gradient is bias's.
  auto backward = [wc, mc, p = r[2]](const std::vector<Tensor>& g) -> std::vector<Tensor> {
    const Tensor gs = g[0].defined() ? g[0] : zeros_like(g[1]);
    const Tensor gb = g[1].defined() ? g[1] : zeros_like(g[0]);
    std::vector<Tensor> d = raw::lara_proposals_backward(gs, gb, wc, mc, p);  // {dw, dmu}
    d.push_back(gb);
    return d;
  };
  std::vector<Tensor> outs = attach_outputs({r[0], r[1]}, "lara_proposals", {w, mu, lse_k}, backward);
  return {outs[0], outs[1]};
}

}  // namespace linea
