// Differentiable indexing, joining, prefix-sum and real-FFT ops (declared in autograd/ops.h):
// index_select, embedding, embed_tokens, prepend_and_add_positions, gather, scatter_add, cat,
// stack, split, chunk, cumsum, searchsorted, rfft, irfft.
// Forward values come from linea::raw (core/ops_index.cpp); each backward sits beside its
// forward. Not the kernels and not the argument checks (those are in the raw layer).
//
// Derivative rules (g = gradient of the output):
//   index_select(x, d, i)    dx = index_add(zeros_like(x), d, i, g)
//   embedding(W, i, p)       dW = index_add(zeros_like(W), 0, flat(i), g.reshape([-1, D])), row p zeroed
//   embed_tokens(W, i, s, P) dW = s * the same; dP[offset + l] = sum over the batch of g[.., l, :]
//   prepend_and_add_positions(x, c, P)  dx = g[:, p:], dP = sum over the batch of g, dc = dP[:p]
//   gather(x, d, i)          dx = scatter_add(zeros_like(x), d, i, g)
//   scatter_add(x, d, i, s)  dx = g, ds = gather(g, d, i)
//   cat(xs, d)               dx_k = narrow(g, d, offset_k, size_k)
//   stack(xs, d)             = cat(unsqueeze(x_k, d), d)
//   split / chunk            = narrow pieces (differentiable views)
//   cumsum(x, d)             dx = reverse cumsum of g along d
//   rfft(x, n, d)            dx = resize(n * irfft(w * G, n), L), w = 1 (DC, Nyquist), 1/2 (others)
//   irfft(Z, n, d)           dZ = v * rfft(g, n), v = 1/n (re of DC, Nyquist), 2/n (others), 0 (im DC/Nyq)
#include <algorithm>
#include <vector>

#include "autograd/ops.h"

namespace linea {

namespace {

// The index tensors of these ops never get gradients.
void check_index_no_grad(const char* op, const Tensor& index) {
  LINEA_CHECK(!index.defined() || !index.requires_grad(), op, ": the index tensor cannot require grad");
}

// x zero-padded or truncated to `len` along dim (used by backward functions: no graph).
Tensor resize_dim(const Tensor& x, int64_t dim, int64_t len) {
  const int64_t cur = x.size(dim);
  if (len == cur) return x;
  if (len < cur) return narrow(x, dim, 0, len);
  Shape s = x.shape();
  s[static_cast<size_t>(dim)] = len;
  Tensor out = zeros(s, x.options());
  if (cur > 0) narrow(out, dim, 0, cur).copy_(x);
  return out;
}

// Per-bin weights for a spectrum [..., F at dim, ..., 2] of a length-n signal, shaped to
// broadcast against it ([1, .., F, .., 1, 2]): `edge_re` for the real part of DC (and Nyquist
// when n is even), `edge_im` for their imaginary parts, `mid` for both parts of the other bins.
Tensor spectrum_weights(const Tensor& like, int64_t n, int64_t dim, double edge_re, double edge_im, double mid) {
  const int64_t F = n / 2 + 1;
  std::vector<double> w(static_cast<size_t>(2 * F), mid);
  auto set_edge = [&](int64_t k) {
    w[static_cast<size_t>(2 * k)] = edge_re;
    w[static_cast<size_t>(2 * k + 1)] = edge_im;
  };
  set_edge(0);
  if (n % 2 == 0) set_edge(F - 1);
  Shape s(static_cast<size_t>(like.dim()), 1);
  s[static_cast<size_t>(dim)] = F;
  s.back() = 2;
  Tensor t = from_vector<double>(w, s, TensorOptions(like.dtype()));
  return t.to(like.device());
}

}  // namespace

// ---- index_select / embedding -----------------------------------------------------------

Tensor index_select(const Tensor& x, int64_t dim, const Tensor& index) {
  check_index_no_grad("index_select", index);
  Tensor out = raw::index_select(x, dim, index);  // [.., n at dim, ..]
  if (!needs_grad({&x})) return out;
  const int64_t d = wrap_dim(dim, x.dim(), "index_select");
  Shape xs = x.shape();
  Tensor idx = index.detach();
  return attach(out, "index_select", {x, index}, [xs, d, idx](const Tensor& g) -> std::vector<Tensor> {
    // g [.., n at d, ..] -> dx [.., size at d, ..]: each selected row's gradient added back to its
    // source, into zeros in place
    Tensor dx = zeros(xs, g.options());
    raw::index_add_(dx, d, idx, g);
    return {dx, Tensor()};
  });
}

Tensor embedding(const Tensor& weight, const Tensor& index, int64_t padding_idx) {
  LINEA_CHECK(weight.dim() == 2, "embedding: weight must be [V, D], got ", shape_str(weight.shape()));
  LINEA_CHECK(index.dtype() == DType::Int64, "embedding: index must have dtype int64, got ", dtype_name(index.dtype()),
              " (index shape ", shape_str(index.shape()), ")");
  LINEA_CHECK(padding_idx >= -1 && padding_idx < weight.size(0), "embedding: padding_idx ", padding_idx,
              " is out of range for ", weight.size(0), " rows (-1: none)");
  if (!is_floating(weight.dtype())) {  // a table of ints: a lookup, nothing to differentiate
    Shape out_shape = index.shape();
    out_shape.push_back(weight.size(1));
    return raw::index_select(weight, 0, index.reshape({index.numel()})).reshape(out_shape);
  }
  return embed_tokens(weight, index, 1.0, Tensor(), 0, padding_idx);
}

Tensor embed_tokens(const Tensor& weight, const Tensor& index, double scale, const Tensor& positions, int64_t offset,
                    int64_t padding_idx) {
  Tensor out = raw::embed_tokens(weight, index, scale, positions, offset);  // [index.shape..., D]
  LINEA_CHECK(padding_idx >= -1 && padding_idx < weight.size(0), "embed_tokens: padding_idx ", padding_idx,
              " is out of range for the weight ", shape_str(weight.shape()), " (-1: none)");
  const bool need_w = weight.requires_grad(), need_p = positions.defined() && positions.requires_grad();
  if (!needs_grad({&weight, &positions})) return out;
  const int64_t num = weight.size(0), D = weight.size(1), n = index.numel();
  const int64_t length = positions.defined() ? index.size(-1) : 1, max_len = need_p ? positions.size(0) : 0;
  return attach(out, "embed_tokens", {weight, positions},
                [flat = index.detach().reshape({n}), scale, padding_idx, need_w, need_p, num, D, n, length, max_len,
                 offset](const Tensor& g) -> std::vector<Tensor> {
                  Tensor rows = g.reshape({n, D}), dw, dp;
                  if (need_w) dw = raw::embedding_weight_grad(rows, flat, num, scale, padding_idx);
                  if (need_p) {  // each position's rows summed over the batch
                    const int64_t batch = length > 0 ? n / length : 0;
                    Tensor s = raw::reduce(ReduceOp::Sum, rows.reshape({batch, length, D}), {0}, false);
                    if (offset == 0 && length == max_len) {
                      dp = s;
                    } else {
                      dp = zeros({max_len, D}, g.options());
                      raw::copy_(dp.narrow(0, offset, length), s);
                    }
                  }
                  return {dw, dp};
                });
}

Tensor prepend_and_add_positions(const Tensor& x, const Tensor& prefix, const Tensor& positions) {
  Tensor out = raw::prepend_and_add_positions(x, prefix, positions);  // [B, P + N, D]
  if (!needs_grad({&x, &prefix, &positions})) return out;
  const int64_t P = prefix.defined() ? prefix.size(0) : 0;
  return attach(out, "prepend_and_add_positions", {x, prefix, positions},
                [P, want_x = x.requires_grad(), want_prefix = prefix.defined() && prefix.requires_grad(),
                 want_pos = positions.requires_grad()](const Tensor& g) {
                  return raw::prepend_and_add_positions_backward(g, P, want_x, want_prefix, want_pos);
                });
}

// ---- gather / scatter_add ---------------------------------------------------------------

Tensor gather(const Tensor& x, int64_t dim, const Tensor& index) {
  check_index_no_grad("gather", index);
  Tensor out = raw::gather(x, dim, index);  // index's shape
  if (!needs_grad({&x})) return out;
  const int64_t d = wrap_dim(dim, x.dim(), "gather");
  Shape xs = x.shape();
  Tensor idx = index.detach();
  return attach(out, "gather", {x, index}, [xs, d, idx](const Tensor& g) -> std::vector<Tensor> {
    // g [index.shape] -> dx [x.shape]: each gathered element's gradient added back where it came
    // from, into zeros in place
    Tensor dx = zeros(xs, g.options());
    raw::scatter_add_(dx, d, idx, g);
    return {dx, Tensor()};
  });
}

Tensor scatter_add(const Tensor& x, int64_t dim, const Tensor& index, const Tensor& src) {
  check_index_no_grad("scatter_add", index);
  Tensor out = raw::scatter_add(x, dim, index, src);  // x's shape
  if (!needs_grad({&x, &src})) return out;
  const int64_t d = wrap_dim(dim, x.dim(), "scatter_add");
  Tensor idx = index.detach();
  return attach(out, "scatter_add", {x, index, src}, [d, idx](const Tensor& g) -> std::vector<Tensor> {
    // g [x.shape]: out = x + S(src) with S linear, so dx = g and dsrc = S^T(g) = gather(g) [index.shape]
    return {g, Tensor(), gather(g, d, idx)};
  });
}

// ---- cat / pad / stack / split / chunk --------------------------------------------------

Tensor cat(const std::vector<Tensor>& xs, int64_t dim) {
  Tensor out = raw::cat(xs, dim);
  if (!needs_grad(xs)) return out;
  const int64_t d = wrap_dim(dim, xs[0].dim(), "cat");
  std::vector<int64_t> sizes;
  for (const Tensor& x : xs) sizes.push_back(x.size(d));
  return attach(out, "cat", xs, [d, sizes](const Tensor& g) -> std::vector<Tensor> {
    // g [.., sum(sizes) at d, ..] -> dx_k [.., sizes[k] at d, ..]: the slice each input filled
    return raw::split(g, sizes, d);
  });
}

Tensor pad(const Tensor& x, int64_t dim, int64_t before, int64_t after, double value) {
  Tensor out = raw::pad(x, dim, before, after, value);
  if (!needs_grad({&x})) return out;
  const int64_t d = wrap_dim(dim, x.dim(), "pad");
  return attach(out, "pad", {x}, [d, before, n = x.size(d)](const Tensor& g) -> std::vector<Tensor> {
    return {linea::narrow(g, d, before, n)};
  });
}

Tensor stack(const std::vector<Tensor>& xs, int64_t dim) {
  // Checked by raw::stack's rules (same shapes) before unsqueezing, for its error message.
  LINEA_CHECK(!xs.empty(), "stack: expected a non-empty list of tensors");
  for (size_t i = 1; i < xs.size(); ++i)
    LINEA_CHECK(xs[i].shape() == xs[0].shape(), "stack: all inputs must have the same shape; input ", i, " has shape ",
                shape_str(xs[i].shape()), " vs input 0 ", shape_str(xs[0].shape()));
  const int64_t d = wrap_dim(dim, xs[0].dim() + 1, "stack");
  std::vector<Tensor> us;
  us.reserve(xs.size());
  for (const Tensor& x : xs) us.push_back(linea::unsqueeze(x, d));  // [.., 1 at d, ..]
  return linea::cat(us, d);
}

std::vector<Tensor> split(const Tensor& x, int64_t split_size, int64_t dim) {
  LINEA_CHECK(x.dim() > 0, "split: cannot split a 0-d tensor");
  const int64_t d = wrap_dim(dim, x.dim(), "split");
  const int64_t size = x.size(d);
  LINEA_CHECK(split_size > 0 || (split_size == 0 && size == 0), "split: split_size must be positive, got ", split_size,
              " for input ", shape_str(x.shape()));
  // Pieces of split_size, the last one smaller; an empty dim gives one empty piece (as torch.split).
  std::vector<int64_t> sizes;
  for (int64_t off = 0; off < size; off += split_size) sizes.push_back(std::min(split_size, size - off));
  if (sizes.empty()) sizes.push_back(0);
  return linea::split(x, sizes, d);
}

std::vector<Tensor> split(const Tensor& x, const std::vector<int64_t>& sizes, int64_t dim) {
  std::vector<Tensor> pieces = raw::split(x, sizes, dim);  // checks the sizes against x
  if (!needs_grad({&x})) return pieces;
  const int64_t d = wrap_dim(dim, x.dim(), "split");
  int64_t at = 0;
  for (size_t k = 0; k < sizes.size(); at += sizes[k], ++k) pieces[k] = linea::narrow(x, d, at, sizes[k]);
  return pieces;
}

std::vector<Tensor> chunk(const Tensor& x, int64_t chunks, int64_t dim) {
  LINEA_CHECK(chunks > 0, "chunk: number of chunks must be positive, got ", chunks);
  LINEA_CHECK(x.dim() >= 1, "chunk: input must have at least 1 dim, got ", shape_str(x.shape()));
  const int64_t d = wrap_dim(dim, x.dim(), "chunk");
  const int64_t size = x.size(d);
  // As torch.chunk: pieces of ceil(size / chunks), the last one smaller (possibly fewer pieces).
  const int64_t piece = std::max<int64_t>(1, (size + chunks - 1) / chunks);
  return linea::split(x, piece, d);
}

// ---- searchsorted (Int64, no gradient) ----------------------------------------------------
Tensor searchsorted(const Tensor& sorted, const Tensor& values, bool right) {
  return raw::searchsorted(sorted, values, right);
}

// ---- cumsum -----------------------------------------------------------------------------

Tensor cumsum(const Tensor& x, int64_t dim) {
  Tensor out = raw::cumsum(x, dim, false);
  if (!needs_grad({&x})) return out;
  const int64_t d = x.dim() == 0 ? 0 : wrap_dim(dim, x.dim(), "cumsum");
  const bool scalar = x.dim() == 0;
  return attach(out, "cumsum", {x}, [d, scalar](const Tensor& g) -> std::vector<Tensor> {
    // y_k = sum_{j<=k} x_j  =>  dx_j = sum_{k>=j} g_k: the reverse cumsum of g [x.shape]
    if (scalar) return {g};
    return {raw::cumsum(g, d, true)};  // kernel-level: no differentiable reverse cumsum
  });
}

// ---- rfft / irfft -----------------------------------------------------------------------

Tensor rfft(const Tensor& x, int64_t n, int64_t dim) {
  Tensor out = raw::rfft(x, n, dim);  // [.., n/2+1 at dim, .., 2]
  if (!needs_grad({&x})) return out;
  const int64_t d = wrap_dim(dim, x.dim(), "rfft");
  const int64_t L = x.size(d);
  return attach(out, "rfft", {x}, [n, d, L](const Tensor& g) -> std::vector<Tensor> {
    // Forward: x [.., L at d, ..] is padded/truncated to x_n (length n), then
    //   Re X_k = sum_t x_n[t] cos(2 pi k t / n),  Im X_k = -sum_t x_n[t] sin(2 pi k t / n),  k < F = n/2+1.
    // With G_k = gr_k + i gi_k (g [.., F at d, .., 2]):
    //   dx_n[t] = sum_k gr_k cos(2 pi k t/n) - gi_k sin(2 pi k t/n) = Re sum_{k<F} G_k e^{+2 pi i k t/n}.
    // irfft(Z)[t] = (1/n) Re[Z_0 + 2 sum_{0<k<n/2} Z_k e^{2 pi i k t/n} + Z_{n/2} e^{i pi t}] (imag of DC and
    // Nyquist ignored, and they contribute nothing to dx_n: sin(0) = sin(pi t) = 0), so
    //   dx_n = n * irfft(w * G) with w = 1 at DC/Nyquist, 1/2 elsewhere.
    // Padding's adjoint truncates (and truncation's adjoint zero-pads) dx_n back to L.
    Tensor w = spectrum_weights(g, n, d, double(n), double(n), double(n) / 2.0);  // [1, .., F, .., 2]
    Tensor dxn = irfft(g * w, n, d);                                              // [.., n at d, ..]
    return {contiguous(resize_dim(dxn, d, L))};                                   // [.., L at d, ..]
  });
}

Tensor irfft(const Tensor& spec, int64_t n, int64_t dim) {
  Tensor out = raw::irfft(spec, n, dim);  // [.., n at dim, ..]
  if (!needs_grad({&spec})) return out;
  const int64_t d = wrap_dim(dim, spec.dim() - 1, "irfft");
  return attach(out, "irfft", {spec}, [n, d](const Tensor& g) -> std::vector<Tensor> {
    // Forward (M = (n-1)/2 interior bins, Z_k = a_k + i b_k, spec [.., F at d, .., 2]):
    //   y[t] = (1/n) [a_0 + 2 sum_{1<=k<=M} (a_k cos(2 pi k t/n) - b_k sin(2 pi k t/n)) + a_{n/2} (-1)^t].
    // With R = rfft(g, n): Re R_k = sum_t g_t cos(2 pi k t/n), Im R_k = -sum_t g_t sin(2 pi k t/n), so
    //   da_k = (2/n) Re R_k, db_k = (2/n) Im R_k  (1 <= k <= M);
    //   da_0 = (1/n) Re R_0, da_{n/2} = (1/n) Re R_{n/2} (n even); db_0 = db_{n/2} = 0 (ignored by c2r).
    Tensor r = rfft(g, n, d);                                                     // [.., F at d, .., 2]
    Tensor v = spectrum_weights(r, n, d, 1.0 / double(n), 0.0, 2.0 / double(n));  // [1, .., F, .., 2]
    return {r * v};
  });
}

}  // namespace linea
