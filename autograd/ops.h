// The differentiable op set: every function here records a backward when an input requires
// grad (integer outputs such as argmax and comparisons excepted). Forward and backward of each
// op sit side by side in autograd/*.cpp; autograd/README.md lists every derivative rule.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "autograd/autograd.h"
#include "core/ops.h"
#include "core/random.h"
#include "core/tensor.h"

namespace linea {

// ---- views and copies -------------------------------------------------------------------
Tensor reshape(const Tensor& x, const Shape& shape);
Tensor view(const Tensor& x, const Shape& shape);
Tensor flatten(const Tensor& x, int64_t start_dim = 0, int64_t end_dim = -1);
Tensor permute(const Tensor& x, const std::vector<int64_t>& dims);
Tensor transpose(const Tensor& x, int64_t d0, int64_t d1);
Tensor narrow(const Tensor& x, int64_t dim, int64_t start, int64_t length);
Tensor slice(const Tensor& x, int64_t dim, int64_t start, int64_t end, int64_t step = 1);
Tensor select(const Tensor& x, int64_t dim, int64_t index);
Tensor unsqueeze(const Tensor& x, int64_t dim);
Tensor squeeze(const Tensor& x, int64_t dim);
Tensor squeeze(const Tensor& x);
Tensor expand(const Tensor& x, const Shape& shape);
Tensor contiguous(const Tensor& x);
Tensor clone(const Tensor& x);
Tensor to(const Tensor& x, Device device);
Tensor to(const Tensor& x, DType dtype);

// ---- elementwise unary --------------------------------------------------------------------
Tensor neg(const Tensor& x);
Tensor exp(const Tensor& x);
Tensor log(const Tensor& x);
Tensor sqrt(const Tensor& x);
Tensor rsqrt(const Tensor& x);
Tensor abs(const Tensor& x);
Tensor tanh(const Tensor& x);
Tensor sigmoid(const Tensor& x);
Tensor relu(const Tensor& x);
// approximate = false: x * Phi(x) (erf form); true: the tanh approximation.
Tensor gelu(const Tensor& x, bool approximate = false);
Tensor sin(const Tensor& x);
Tensor cos(const Tensor& x);
Tensor pow(const Tensor& x, double exponent);
Tensor square(const Tensor& x);
Tensor clamp(const Tensor& x, double lo, double hi);  // use +-INFINITY for one-sided
Tensor sign(const Tensor& x);                         // not differentiable (zero gradient)

// ---- elementwise binary (NumPy broadcasting; dtypes and devices must match) ---------------
Tensor add(const Tensor& a, const Tensor& b);
Tensor sub(const Tensor& a, const Tensor& b);
Tensor mul(const Tensor& a, const Tensor& b);
Tensor div(const Tensor& a, const Tensor& b);
Tensor maximum(const Tensor& a, const Tensor& b);  // ties: gradient split evenly
Tensor minimum(const Tensor& a, const Tensor& b);
Tensor add(const Tensor& a, double s);
Tensor sub(const Tensor& a, double s);
Tensor sub(double s, const Tensor& a);
Tensor mul(const Tensor& a, double s);
Tensor div(const Tensor& a, double s);
Tensor div(double s, const Tensor& a);
// Comparisons give Bool masks (no gradient).
Tensor eq(const Tensor& a, const Tensor& b);
Tensor ne(const Tensor& a, const Tensor& b);
Tensor lt(const Tensor& a, const Tensor& b);
Tensor le(const Tensor& a, const Tensor& b);
Tensor gt(const Tensor& a, const Tensor& b);
Tensor ge(const Tensor& a, const Tensor& b);
Tensor eq(const Tensor& a, double s);
Tensor ne(const Tensor& a, double s);
Tensor lt(const Tensor& a, double s);
Tensor le(const Tensor& a, double s);
Tensor gt(const Tensor& a, double s);
Tensor ge(const Tensor& a, double s);
// Logical ops on Bool tensors (broadcasting); also the operators &, |, ~ below.
Tensor logical_and(const Tensor& a, const Tensor& b);
Tensor logical_or(const Tensor& a, const Tensor& b);
Tensor logical_not(const Tensor& x);
// cond (Bool) ? a : b, all three broadcast together; differentiable in a and b. A scalar side
// takes the other side's dtype.
Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b);
Tensor where(const Tensor& cond, const Tensor& a, double b);
Tensor where(const Tensor& cond, double a, const Tensor& b);
// x with `value` where mask (Bool, broadcast to x) is true.
Tensor masked_fill(const Tensor& x, const Tensor& mask, double value);

Tensor operator+(const Tensor& a, const Tensor& b);
Tensor operator-(const Tensor& a, const Tensor& b);
Tensor operator*(const Tensor& a, const Tensor& b);
Tensor operator/(const Tensor& a, const Tensor& b);
Tensor operator+(const Tensor& a, double s);
Tensor operator-(const Tensor& a, double s);
Tensor operator*(const Tensor& a, double s);
Tensor operator/(const Tensor& a, double s);
Tensor operator+(double s, const Tensor& a);
Tensor operator-(double s, const Tensor& a);
Tensor operator*(double s, const Tensor& a);
Tensor operator/(double s, const Tensor& a);
Tensor operator-(const Tensor& a);
// Comparisons give Bool masks, as eq/ne/lt/... above. Tensor handles are compared with
// Tensor::same(), never with ==. A scalar the tensor's dtype cannot hold exactly (0.5 against
// Int64) is compared in float64.
Tensor operator==(const Tensor& a, const Tensor& b);
Tensor operator!=(const Tensor& a, const Tensor& b);
Tensor operator<(const Tensor& a, const Tensor& b);
Tensor operator<=(const Tensor& a, const Tensor& b);
Tensor operator>(const Tensor& a, const Tensor& b);
Tensor operator>=(const Tensor& a, const Tensor& b);
Tensor operator==(const Tensor& a, double s);
Tensor operator!=(const Tensor& a, double s);
Tensor operator<(const Tensor& a, double s);
Tensor operator<=(const Tensor& a, double s);
Tensor operator>(const Tensor& a, double s);
Tensor operator>=(const Tensor& a, double s);
Tensor operator==(double s, const Tensor& a);
Tensor operator!=(double s, const Tensor& a);
Tensor operator<(double s, const Tensor& a);
Tensor operator<=(double s, const Tensor& a);
Tensor operator>(double s, const Tensor& a);
Tensor operator>=(double s, const Tensor& a);
// Logical and/or/not of Bool tensors (as PyTorch's &, |, ~ on bool tensors).
Tensor operator&(const Tensor& a, const Tensor& b);
Tensor operator|(const Tensor& a, const Tensor& b);
Tensor operator~(const Tensor& a);

// In-place arithmetic: a op= b writes into a's storage (b broadcast to a's shape, same dtype;
// a scalar must be exact in a's dtype), bumping its version. Not recorded by autograd: throws
// linea::Error when grad mode is on and a or b requires grad (use it under NoGradGuard, e.g.
// in optimizer updates, or write a = a + b). Returns a (the same handle).
const Tensor& operator+=(const Tensor& a, const Tensor& b);
const Tensor& operator-=(const Tensor& a, const Tensor& b);
const Tensor& operator*=(const Tensor& a, const Tensor& b);
const Tensor& operator/=(const Tensor& a, const Tensor& b);
const Tensor& operator+=(const Tensor& a, double s);
const Tensor& operator-=(const Tensor& a, double s);
const Tensor& operator*=(const Tensor& a, double s);
const Tensor& operator/=(const Tensor& a, double s);

// ---- reductions (dims empty = all) ----------------------------------------------------------
Tensor sum(const Tensor& x, const std::vector<int64_t>& dims = {}, bool keepdim = false);
Tensor mean(const Tensor& x, const std::vector<int64_t>& dims = {}, bool keepdim = false);
// Maximum/minimum values over dims (torch.amax); the gradient is split evenly among ties.
Tensor max(const Tensor& x, const std::vector<int64_t>& dims = {}, bool keepdim = false);
Tensor min(const Tensor& x, const std::vector<int64_t>& dims = {}, bool keepdim = false);
Tensor argmax(const Tensor& x, int64_t dim, bool keepdim = false);  // Int64, no gradient
Tensor argmin(const Tensor& x, int64_t dim, bool keepdim = false);
Tensor logsumexp(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim = false);
// Variance with Bessel's correction by default (correction = 1), as torch.var.
Tensor var(const Tensor& x, const std::vector<int64_t>& dims = {}, int64_t correction = 1, bool keepdim = false);
// Whether any / all elements over dims are true; x Bool, result Bool (no gradient). Over an
// empty set any is false and all is true.
Tensor any(const Tensor& x, const std::vector<int64_t>& dims = {}, bool keepdim = false);
Tensor all(const Tensor& x, const std::vector<int64_t>& dims = {}, bool keepdim = false);
// Sums a broadcast gradient back to `shape` (differentiable; its backward is expand).
Tensor sum_to(const Tensor& x, const Shape& shape);

// ---- linear algebra -----------------------------------------------------------------------
// torch.matmul semantics, times alpha (folded into the GEMMs, forward and backward).
Tensor matmul(const Tensor& a, const Tensor& b, double alpha = 1.0);
Tensor bmm(const Tensor& a, const Tensor& b);     // [B, M, K] @ [B, K, N]
// x [..., K] @ weight^T + bias -> [..., N] (torch.nn.functional.linear); weight [N, K], bias [N]
// or undefined. One fused op: forward one GEMM with the bias, backward two (dx; dw with db).
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor());
// linear(x, weights[i], biases[i]) for each i (biases[i] undefined: none), as one node: x's
// gradient is summed inside the backward's GEMMs (beta = 1), not by the engine an add at a time.
// For layers that read one input: attention's q, k and v projections.
std::vector<Tensor> linears(const Tensor& x, const std::vector<Tensor>& weights, const std::vector<Tensor>& biases);

// ---- neural-net ops (fused forward and backward kernels) -----------------------------------
Tensor softmax(const Tensor& x, int64_t dim);
Tensor log_softmax(const Tensor& x, int64_t dim);
// Normalizes over the trailing dims named by normalized_shape; weight/bias may be undefined.
Tensor layer_norm(const Tensor& x, const Shape& normalized_shape, const Tensor& weight = Tensor(),
                  const Tensor& bias = Tensor(), double eps = 1e-5);
// A residual sum and its layer norm (a pre-LN transformer's "x + dropout(f(x)), then norm"):
// {s = x + dropout(r), layer_norm(s)}, both differentiable, computed by one kernel (the same
// values as dropout, add, then layer_norm; the dropout, when p > 0, drawn per example of r as
// dropout(r, p, true) draws it).
std::pair<Tensor, Tensor> add_layer_norm(const Tensor& x, const Tensor& r, const Shape& normalized_shape,
                                         const Tensor& weight = Tensor(), const Tensor& bias = Tensor(),
                                         double eps = 1e-5, double dropout = 0.0);
// x / max(|x|, eps) over the last dim (F.normalize(x, p=2, dim=-1, eps)): a zero row stays zero.
Tensor normalize(const Tensor& x, double eps = 1e-12);
// The ratio of [num, den] sums: y [B, H, N, E + 1] -> num / max(den, tiny) [B, H, N, E] (den the
// last column), exactly 0 in the rows whose visible (Bool [B, 1, N or 1, 1]; undefined: all rows)
// is false, one kernel each way (nprf_rpe's Toeplitz sums). Differentiable in y: none through den
// where den < tiny, none in hidden rows.
Tensor sums_ratio(const Tensor& y, const Tensor& visible, double tiny);
// scale |x|^2 over the last dim, which it drops: x [..., D] -> [...] (one kernel each way instead
// of square, sum and a scale).
Tensor sq_norm(const Tensor& x, double scale = 1.0);
enum class Reduction { None, Mean, Sum };
// logits [N, C] with target Int64 [N], or [B, L, C] (any leading dims) with target [B, L]
// (flattened to rows), or [C] with a 0-d target. Rows whose target == ignore_index count
// neither in the loss nor in the mean (mean over non-ignored rows; 0 if all are ignored).
// label_smoothing s: the target distribution is (1 - s) * onehot + s / C.
// Reduction::None returns the per-row loss shaped like target. nll, when given, gets the plain
// (unsmoothed) cross-entropy summed over the rows kept, 0-d and without gradient, from the same
// pass over the logits (fairseq's label_smoothed_nll_loss returns both: perplexity's statistic).
Tensor cross_entropy(const Tensor& logits, const Tensor& target, int64_t ignore_index = -100,
                     double label_smoothing = 0.0, Reduction reduction = Reduction::Mean, Tensor* nll = nullptr);
// Inverted dropout: zeroes with probability p and scales the rest by 1/(1-p); identity when !training.
Tensor dropout(const Tensor& x, double p, bool training);
// dropout(act(x), p, training) with the activation (UnaryOp::GeluErf, GeluTanh or Relu) folded
// into the dropout's kernel, forward and backward (the same values; the mask drawn as dropout's).
Tensor activation_dropout(const Tensor& x, UnaryOp act, double p, bool training);
// Fused softmax attention (CPU and CUDA): softmax(scale q k^T) v for q [B, H, N, D], k [B, H, M, D],
// v [B, H, M, E], where key m is hidden from query n (probability 0) when causal and
// m > n + query_offset, or where key_padding (Bool [B, M], true = padding) says so; a query
// that sees no key gets 0. With keep_probs (and a gradient to compute) the CPU kernel keeps the
// probabilities [B, H, N, M] for the backward (the CUDA kernel never does); without, it keeps no [N, M] tensor and the
// backward recomputes the scores blockwise (one more q k^T product and exp per score).
// dropout_p > 0 (pass 0 in evaluation, as PyTorch's): each probability is dropped with that
// probability (the rest scaled by 1 / (1 - dropout_p)) before the product with v, from a
// per-example draw (as dropout() of the [B, H, N, M] probabilities would be); nothing kept.
// key_bias [B, H, M] (undefined: none) is added to every row's scaled scores (differentiable).
Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v, double scale,
                                    bool causal = false, int64_t query_offset = 0, const Tensor& key_padding = Tensor(),
                                    bool keep_probs = false, double dropout_p = 0.0, const Tensor& key_bias = Tensor());
// The same attention (no dropout, no kept probabilities) and each query's log-sum-exp of its
// visible scores, both differentiable: {out [B, H, N, E], lse [B, H, N]} (a query that sees no key:
// out 0, lse -inf). Where the normalizer itself is used, as LARA's mixture uses its landmarks'.
std::pair<Tensor, Tensor> scaled_dot_product_attention_lse(const Tensor& q, const Tensor& k, const Tensor& v,
                                                           double scale, bool causal = false, int64_t query_offset = 0,
                                                           const Tensor& key_padding = Tensor(),
                                                           const Tensor& key_bias = Tensor());
// Keys drawn from each query's softmax attention, fused (CPU and CUDA): Int64 [B, H, N, S], key m
// with probability softmax_m(scale q_n.k_m) over the keys key_padding (Bool [B, M]) leaves visible,
// one draw per u_s of u [B, H, N, S] (uniform in [0, 1)) by inverse CDF in key order; key 0 for a
// query that sees no key. No [N, M] probabilities kept (RA's draw); no gradient.
Tensor sample_attention_keys(const Tensor& q, const Tensor& k, const Tensor& u, double scale,
                             const Tensor& key_padding = Tensor());
// Toeplitz-modulated linear attention, fused (CPU and CUDA): y_n = sum_m c_{m-n} (phi_q_n . phi_k_m) v_m
// for c [H or B, H, N+M-1] (c_t at index t + N - 1), phi_q [B, H, N, S], phi_k [B, H, M, S],
// v [B, H, M, E], by FFTs of length fft_len >= N + M - 1, a feature at a time: no
// [S, E] products per key are kept (nprf_rpe's FFT path); fft_len 0: directly, in tiles of
// query rows by keys (exact, O(N M) work: nprf_rpe's dense path). Differentiable in all four.
Tensor toeplitz_attention(const Tensor& c, const Tensor& phi_q, const Tensor& phi_k, const Tensor& v,
                          int64_t fft_len);
// Positive random features, fused (CPU and CUDA): phi = exp(x W_h^T - |x|^2/2 - c) / sqrt(S) for
// x [B, H, L, D] and omega [H, S, D] (the rows of W_h), c a detached stabilizer that cancels in
// an attention ratio: the row's max over s (per_row) or the max over the (b, h)'s unpadded rows
// and s. Rows marked by key_padding (Bool [B, L], true = padding) get phi = 0. Differentiable in
// x and omega (c held constant). The performer's and nprf_rpe's feature map.
Tensor positive_features(const Tensor& x, const Tensor& omega, bool per_row, const Tensor& key_padding = Tensor());
// Bidirectional linear attention, fused (CPU and CUDA): out_n = phi_q_n (sum_m phi_k_m v_m^T) / den_n,
// den_n = phi_q_n . sum_m phi_k_m, for phi_q [B, H, N, S], phi_k [B, H, M, S], v [B, H, M, E] (all
// dims > 0), where |den_n| < den_guard is replaced by den_guard with den_n's sign (0 counting as
// +; no gradient through it). Differentiable in all three; keeps only [B, H, S, E + 1] and
// [B, H, N] besides its inputs and output for the backward (performer's bidirectional path).
Tensor linear_attention(const Tensor& phi_q, const Tensor& phi_k, const Tensor& v, double den_guard);
// FAVOR+ attention, fused (CPU and CUDA): linear_attention(phi_q, phi_k, v, den_guard) of the
// positive features phi_q = positive_features(scale q, omega, per_row) and phi_k =
// positive_features(scale k, omega, per (b, h), key_padding), for q [B, H, N, D], k [B, H, M, D],
// v [B, H, M, E], omega [H, S, D]; causal (self-attention, N = M): causal_linear_attention of
// them in chunks of `chunk` rows. On CUDA one pass of fused kernels that reads the heads of a
// projection in place (the ops composed where the sizes, or a chunk other than 64, do not fit
// them); on the CPU the ops composed. Differentiable in q, k and v; omega is a constant (the
// features are samples). Performer's path with its softmax feature map.
Tensor favor_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& omega, double scale,
                       const Tensor& key_padding, double den_guard, bool causal = false, int64_t chunk = 64);
// One step of causal FAVOR+ decoding (raw::favor_attention_step): {out, sums, c} for the T new
// positions after the running sums and stabilizer of the earlier keys (undefined before the
// first step). Decoding takes no gradient: inputs that would need one are refused (run it under
// NoGradGuard). Performer's decoding step with its softmax feature map.
std::vector<Tensor> favor_attention_step(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& omega,
                                         double scale, const Tensor& key_padding, double den_guard, const Tensor& sums,
                                         const Tensor& c, int64_t chunk = 64);
// Causal linear attention, fused (CPU and CUDA), in chunks of `chunk` rows (a scan over chunk
// states, then each chunk from its state plus its masked product): out_n = num_n / den~_n with
// [num, den]_n = phi_q_n (state + sum_{m<=n} phi_k_m^T [v_m, 1]) for phi_q, phi_k [B, H, N, S] and
// v [B, H, N, E] aligned (key m at query m's position), state [B, H, S, E + 1] the sums of the
// keys before them (undefined: none); den~ as in linear_attention. Differentiable in phi_q, phi_k,
// v and state. `final`, when given, gets the sums after the last key (no gradient: the next
// decoding step's state). Performer's causal path and its decoding step.
Tensor causal_linear_attention(const Tensor& phi_q, const Tensor& phi_k, const Tensor& v, const Tensor& state,
                               int64_t chunk, double den_guard, Tensor* final = nullptr);
// LARA's mixture weights, fused (CPU and CUDA): with q~ = q_scale q (never formed), per (b, h),
// t = softmax over n of q~ qbar^T, a = self_w + beta (t - mean_c t),
// mix = softmax_c(log max(a, floor) + q~ w^T - |q~|^2/2 + bias) for q [B, H, N, D], qbar and w
// [B, H, C, D], self_w and bias [B, H, C] -> mix [B, H, N, C]. Differentiable in all five (no
// gradient where a < floor). attention/lara's mixture weights.
Tensor lara_mixture(const Tensor& q, const Tensor& qbar, const Tensor& w, const Tensor& self_w, const Tensor& bias,
                    double beta, double floor, double q_scale = 1.0);
// LARA's proposal weights, fused (CPU and CUDA), for the proposals N(mu_c, I) drawn as w_c, per
// (b, h): with l_cc' = log xi(mu_c', w_c) = w_c.mu_c' - |mu_c'|^2/2 for w and mu [B, H, C, D],
// returns {self_w, bias} [B, H, C]: self_w_c = exp(l_cc - logsumexp_c' l_cc') (the balance
// heuristic's weight of proposal c) and bias_c = lse_k_c - l_cc for lse_k [B, H, C] (the
// mixture's per-proposal term). Differentiable in w, mu and lse_k (w and mu may be one tensor).
std::pair<Tensor, Tensor> lara_proposals(const Tensor& w, const Tensor& mu, const Tensor& lse_k);

// ---- indexing and joining -----------------------------------------------------------------
Tensor index_select(const Tensor& x, int64_t dim, const Tensor& index);
// weight [V, D], index Int64 of any shape -> [index.shape..., D]; row padding_idx (-1: none) gets
// no gradient (F.embedding's padding_idx: its output is still that row).
Tensor embedding(const Tensor& weight, const Tensor& index, int64_t padding_idx = -1);
// A sequence model's input embedding in one kernel (fairseq's embed_scale * embed_tokens(ids) +
// embed_positions(ids), llm.c's encoder): scale * weight[index] + positions[offset + l] for the
// index's last coordinate l -> [index.shape..., D]. positions [max_len, D] or undefined (none); a
// table that requires grad gets its rows' sums over the batch, a fixed one (sinusoids) nothing.
// The weight's gradient as embedding's, scaled, with padding_idx.
Tensor embed_tokens(const Tensor& weight, const Tensor& index, double scale, const Tensor& positions,
                    int64_t offset = 0, int64_t padding_idx = -1);
// A ViT's input sequence in one kernel each way (timm's cat((cls_token.expand(B, -1, -1), x), 1)
// + pos_embed): x [B, N, D] with prefix [P, D] (undefined: none) before each sequence and
// positions [P + N, D] added -> [B, P + N, D]. Differentiable in all three.
Tensor prepend_and_add_positions(const Tensor& x, const Tensor& prefix, const Tensor& positions);
Tensor gather(const Tensor& x, int64_t dim, const Tensor& index);
Tensor scatter_add(const Tensor& x, int64_t dim, const Tensor& index, const Tensor& src);
Tensor cat(const std::vector<Tensor>& xs, int64_t dim);
// x with `before` and `after` elements of `value` added along dim (F.pad's constant mode, one dim),
// one kernel; its backward is a view (narrow).
Tensor pad(const Tensor& x, int64_t dim, int64_t before, int64_t after, double value = 0.0);
Tensor stack(const std::vector<Tensor>& xs, int64_t dim);
std::vector<Tensor> split(const Tensor& x, int64_t split_size, int64_t dim);
std::vector<Tensor> split(const Tensor& x, const std::vector<int64_t>& sizes, int64_t dim);
std::vector<Tensor> chunk(const Tensor& x, int64_t chunks, int64_t dim);
Tensor cumsum(const Tensor& x, int64_t dim);
// Int64 [..., S]: where each of values [..., S] falls in the non-decreasing last dim of sorted
// [..., M] (same leading dims): the number of elements below it (right: at or below it); NaN
// sorts last. As torch.searchsorted; no gradient.
Tensor searchsorted(const Tensor& sorted, const Tensor& values, bool right = false);

// ---- FFT ----------------------------------------------------------------------------------
// Real FFT of length n along dim (zero-padded or truncated to n). Complex results carry a
// trailing dim of size 2 (re, im): x [..., L, ...] -> [..., n/2+1, ..., 2].
Tensor rfft(const Tensor& x, int64_t n, int64_t dim = -1);
// Inverse of rfft: spec [..., n/2+1, ..., 2] -> real [..., n, ...]; dim counts the dims of
// spec without its trailing (re, im) dim. Scaled by 1/n, so irfft(rfft(x, n), n) == x.
Tensor irfft(const Tensor& spec, int64_t n, int64_t dim = -1);

}  // namespace linea
