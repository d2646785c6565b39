// linea::raw — tensor operations without autograd: argument checks (throwing linea::Error
// with the op's name, shapes and dtypes), output allocation, and dispatch to the CPU or
// CUDA kernels of core/kernels.h. The differentiable API in autograd/ops.h is built on these.
// View ops here only compute geometry and share storage.
#pragma once

#include <optional>
#include <vector>

#include "core/kernels.h"
#include "core/tensor.h"

namespace linea::raw {

// ---- views (share storage) -------------------------------------------------------------
Tensor view(const Tensor& x, const Shape& shape);     // throws if strides don't allow it
Tensor reshape(const Tensor& x, const Shape& shape);  // view when possible, else a copy
Tensor permute(const Tensor& x, const std::vector<int64_t>& dims);
Tensor transpose(const Tensor& x, int64_t d0, int64_t d1);
Tensor narrow(const Tensor& x, int64_t dim, int64_t start, int64_t length);
Tensor slice(const Tensor& x, int64_t dim, int64_t start, int64_t end, int64_t step);
Tensor unsqueeze(const Tensor& x, int64_t dim);
Tensor squeeze(const Tensor& x, int64_t dim);
Tensor expand(const Tensor& x, const Shape& shape);  // broadcast to shape (stride 0)
// The view equal to cat(parts, dim) when the parts lie one after another along dim in one
// storage (the same dtype, strides and sizes but along dim, each starting where the one before
// ends: the q, k and v projections' weights packed in one buffer, or their outputs); undefined
// otherwise. Lets an op that takes several tensors run once over them.
Tensor joined_view(const std::vector<Tensor>& parts, int64_t dim);
// Its inverse: the consecutive pieces of x along dim with these sizes (summing to x's size
// there), as views.
std::vector<Tensor> split(const Tensor& x, const std::vector<int64_t>& sizes, int64_t dim);
// Resolves one -1 entry in a requested shape for a tensor of numel elements.
Shape infer_shape(const Shape& requested, int64_t numel, const char* op);

// ---- copies and conversion ---------------------------------------------------------------
Tensor contiguous(const Tensor& x);  // returns x itself when already contiguous
Tensor clone(const Tensor& x);       // always a fresh contiguous copy
Tensor to_device(const Tensor& x, Device d);
Tensor to_dtype(const Tensor& x, DType t);
void copy_(const Tensor& dst, const Tensor& src);  // src broadcast to dst; any devices
void fill_(const Tensor& dst, double value);       // dst any layout
void arange_(const Tensor& out, double start, double step);

// ---- elementwise -----------------------------------------------------------------------
Tensor unary(UnaryOp op, const Tensor& x, double a = 0.0, double b = 0.0);
Tensor unary_backward(UnaryOp op, const Tensor& grad, const Tensor& x, const Tensor& y, double a = 0.0, double b = 0.0);
Tensor binary(BinaryOp op, const Tensor& a, const Tensor& b);
// out = a op b written into `out` (in place, e.g. grad accumulation); b broadcast to out.
void binary_(BinaryOp op, const Tensor& out, const Tensor& b);
Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b);
Tensor masked_fill(const Tensor& x, const Tensor& mask, double value);

// ---- reductions ------------------------------------------------------------------------
// dims empty = all dims. Duplicate or out-of-range dims throw.
Tensor reduce(ReduceOp op, const Tensor& x, const std::vector<int64_t>& dims, bool keepdim);
Tensor arg_reduce(bool is_max, const Tensor& x, int64_t dim, bool keepdim);
// Sums a broadcast gradient back to `shape` (the inverse of expand). Returns g when equal.
Tensor sum_to(const Tensor& g, const Shape& shape);
// Normalized dims list (wrapped, sorted, unique-checked). Empty input means all dims.
std::vector<int64_t> reduction_dims(const std::vector<int64_t>& dims, int64_t ndim, const char* op);

// ---- linear algebra ----------------------------------------------------------------------
// torch.matmul semantics: 1-D operands are promoted and the added dim removed; batch dims
// broadcast. alpha scales the product (folded into the GEMM).
Tensor matmul(const Tensor& a, const Tensor& b, double alpha = 1.0);
// The same into `out` (a, b at least 2-D; out of the broadcast shape [batch..., M, N], its
// matrices row-major, its batch dims any layout): a gradient written in its input's layout.
// accumulate: out += the product (the GEMM's beta = 1; out must not overlap a or b), a sum of
// gradients made in the GEMMs.
void matmul_into(const Tensor& a, const Tensor& b, const Tensor& out, double alpha = 1.0, bool accumulate = false);
// An uninitialized tensor of t's shape, dtype and device, laid out like t when t is a
// permutation of a dense tensor (attention's [B, H, N, D] view of [B, N, H, D]), else contiguous.
Tensor empty_like_layout(const Tensor& t);
// A linear layer: x [..., K] @ weight^T + bias -> [..., N], weight [N, K], bias [N] or undefined.
// One GEMM over x's rows (the bias added by it on CUDA).
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias);
// Its weight's and bias's gradients from grad [..., N] and x [..., K]: {dw [N, K] = grad^T @ x
// over the rows, db [N] = grad summed over the rows (undefined unless want_bias)}, one GEMM
// (the bias gradient reduced by it on CUDA).
std::vector<Tensor> linear_weight_grad(const Tensor& grad, const Tensor& x, bool want_bias);

// ---- fused nn kernels ------------------------------------------------------------------
Tensor softmax(const Tensor& x, int64_t dim, bool log);
Tensor softmax_backward(const Tensor& grad, const Tensor& y, int64_t dim, bool log);
// Normalizes over the last `normalized_ndim` dims. Returns {out, mean, rstd}.
std::vector<Tensor> layer_norm(const Tensor& x, int64_t normalized_ndim, const Tensor& w, const Tensor& b, double eps);
// The residual sum and its layer norm in one kernel: {sum = x + dropout(r), layer_norm(sum), mean,
// rstd}; the dropout (core/kernels.h: FoldedDropout, p = 0 for none) drawn per example of r.
std::vector<Tensor> add_layer_norm(const Tensor& x, const Tensor& r, const FoldedDropout& dropout,
                                   int64_t normalized_ndim, const Tensor& w, const Tensor& b, double eps);
// Returns {dx, dw, db} (dw/db undefined when w/b are).
std::vector<Tensor> layer_norm_backward(const Tensor& grad, const Tensor& x, int64_t normalized_ndim, const Tensor& w,
                                        const Tensor& b, const Tensor& mean, const Tensor& rstd);
// add_layer_norm's backward, one kernel on CUDA: dx = the norm's backward of grad (undefined: none)
// plus grad_sum, the sum's own gradient (undefined: none); dr = dx through the residual's dropout
// (undefined when dropout.p == 0: r's gradient is dx). Returns {dx, dr, dw, db}.
std::vector<Tensor> add_layer_norm_backward(const Tensor& grad, const Tensor& grad_sum, const Tensor& sum,
                                            int64_t normalized_ndim, const Tensor& w, const Tensor& b,
                                            const Tensor& mean, const Tensor& rstd, const FoldedDropout& dropout);
// x / max(|x|, eps) over the last dim (F.normalize, p = 2), and its gradient from x.
Tensor normalize(const Tensor& x, double eps);
Tensor normalize_backward(const Tensor& grad, const Tensor& x, double eps);
// y [B, H, N, E + 1] holding [num, den] -> num / max(den, tiny) [B, H, N, E], 0 in the rows whose
// visible (Bool [B, 1, N or 1, 1]; undefined: all) is false; and its gradient with respect to y.
Tensor sums_ratio(const Tensor& y, const Tensor& visible, double tiny);
Tensor sums_ratio_backward(const Tensor& grad, const Tensor& y, const Tensor& visible, double tiny);
// scale |x|^2 over the last dim, which it drops: x [..., D] -> [...]; and its gradient from x.
Tensor sq_norm(const Tensor& x, double scale);
Tensor sq_norm_backward(const Tensor& grad, const Tensor& x, double scale);
// logits [N, C], target Int64 [N] -> {loss per row [N], lse [N]}, and with want_nll the rows'
// plain negative log-likelihood lse - x[target] [N] third (0 where ignored), from the same pass.
std::vector<Tensor> cross_entropy_rows(const Tensor& logits, const Tensor& target, int64_t ignore_index,
                                       double smoothing, bool want_nll = false);
// grad [N] (a stride-0 expand is read in place: a mean's one value) -> dlogits [N, C].
Tensor cross_entropy_rows_backward(const Tensor& grad, const Tensor& logits, const Tensor& target, const Tensor& lse,
                                   int64_t ignore_index, double smoothing);
// The mean over the rows kept, in one kernel: loss [N], target Int64 [N] -> {sum(loss) / count,
// count} (0-d), count = max(#rows whose target is not ignore_index, 1): an all-ignored batch
// gives 0, not NaN.
std::vector<Tensor> cross_entropy_mean(const Tensor& loss, const Tensor& target, int64_t ignore_index);
// Fused softmax attention (the fused kernels of both devices: core/kernels.h):
// q [B, H, N, D], k [B, H, M, D], v [B, H, M, E]; key m hidden from query n when causal and
// m > n + offset, or where pad (Bool [B, M], true = padding; undefined: none) says so.
// Returns {out [B, H, N, E], lse [B, H, N], probs [B, H, N, M]} (probs only with keep_probs on
// the CPU, else undefined). drop (p in [0, 1)): dropout of the probabilities (core/kernels.h),
// which cannot be combined with keep_probs. bias [B, H, M] (undefined: none): added to every
// row's scaled scores.
std::vector<Tensor> sdpa(const Tensor& q, const Tensor& k, const Tensor& v, double scale, bool causal, int64_t offset,
                         const Tensor& pad, bool keep_probs = false, const FoldedDropout& drop = FoldedDropout(),
                         const Tensor& bias = Tensor());
// q, k, v (or out, grad) as the fused attention kernels (sdpa on either device, FAVOR+ on CUDA)
// read them, rows of heads: the tensor itself where its rows are contiguous and do not overlap
// (the kernels take any batch, head and row strides: the heads of a projection in place, a
// decoding cache's view of its buffer), else a contiguous copy. out and the gradients come back
// laid out as q, k and v (the rule: is_head_rows, core/kernels.h). What the autograd op keeps for
// its backward.
Tensor as_head_rows(const Tensor& t);
// Returns {dq, dk, dv, dbias} (dbias undefined without a bias) from grad [B, H, N, E], the
// gradient of lse (dlse [B, H, N]; undefined: none) and the forward's out, lse and probs
// (undefined: recomputed block by block); drop and bias as in the forward.
std::vector<Tensor> sdpa_backward(const Tensor& grad, const Tensor& q, const Tensor& k, const Tensor& v,
                                  const Tensor& out, const Tensor& lse, double scale, bool causal, int64_t offset,
                                  const Tensor& pad, const Tensor& probs = Tensor(),
                                  const FoldedDropout& drop = FoldedDropout(), const Tensor& bias = Tensor(),
                                  const Tensor& dlse = Tensor());
// Keys drawn from each query's softmax attention (core/kernels.h sdpa_sample): out Int64 [B, H, N,
// S], key m with probability p_nm = softmax_m(scale q_n.k_m) over the unpadded keys, by inverse CDF
// at u [B, H, N, S] (uniform in [0, 1)); key 0 for a query that sees no key. No [N, M] kept.
Tensor sdpa_sample(const Tensor& q, const Tensor& k, const Tensor& u, double scale, const Tensor& pad);
// Toeplitz-modulated linear attention, fused: y_n = sum_m c_{m-n}
// (phi_q_n . phi_k_m) v_m for c [H, N+M-1] or [B, H, N+M-1] (c_t at t + N - 1), phi_q
// [B, H, N, S], phi_k [B, H, M, S], v [B, H, M, E], by FFTs of length fft_len >= N + M - 1,
// or (fft_len 0) directly, term by term in tiles: exact, O(N M) work, the faster for short L.
Tensor toeplitz_attention(const Tensor& c, const Tensor& phi_q, const Tensor& phi_k, const Tensor& v,
                          int64_t fft_len);
// Returns {dc, dphi_q, dphi_k, dv} from grad [B, H, N, E].
std::vector<Tensor> toeplitz_attention_backward(const Tensor& grad, const Tensor& c, const Tensor& phi_q,
                                                const Tensor& phi_k, const Tensor& v, int64_t fft_len);
// Positive random features, fused: phi = exp(x W_h^T - |x|^2/2
// - c) / sqrt(S) for x [B, H, L, D], omega [H, S, D], c the row's max (per_row) or the (b, h)'s
// max over unpadded rows; rows marked by pad (Bool [B, L]; undefined: none) get 0.
Tensor positive_features(const Tensor& x, const Tensor& omega, bool per_row, const Tensor& pad);
// Returns {dx, domega} (domega undefined unless want_domega) from grad [B, H, L, S] and the
// forward's phi.
std::vector<Tensor> positive_features_backward(const Tensor& grad, const Tensor& x, const Tensor& omega,
                                               const Tensor& phi, bool want_domega);
// Bidirectional linear attention, fused: out_n = phi_q_n
// (sum_m phi_k_m v_m^T) / den~_n, den_n = phi_q_n . sum_m phi_k_m, den~ = den with |den| < guard
// replaced by guard carrying den's sign. Returns {out [B, H, N, E], den [B, H, N] (unguarded),
// kvz [B, H, S, E + 1]} (the last two for the backward).
std::vector<Tensor> linear_attention(const Tensor& phi_q, const Tensor& phi_k, const Tensor& v, double guard);
// Returns {dphi_q, dphi_k, dv} from grad [B, H, N, E] and the forward's out, den and kvz.
std::vector<Tensor> linear_attention_backward(const Tensor& grad, const Tensor& phi_q, const Tensor& phi_k,
                                              const Tensor& v, const Tensor& out, const Tensor& den, const Tensor& kvz,
                                              double guard);
// FAVOR+ attention (positive softmax features), fused: linear_attention of phi_q =
// positive_features(scale q, omega, per_row) and phi_k = positive_features(scale k, omega, per
// (b, h), pad) for q [B, H, N, D], k [B, H, M, D], v [B, H, M, E] (any layout; the heads of a
// projection are read in place) or, causal (self-attention: N = M, key m seen by queries n >= m),
// causal_linear_attention of them in chunks of `chunk` rows. Returns {out (laid out as q's heads
// on CUDA, see as_head_rows), den, kvz (causal: the chunk states), phi_q, phi_k} and, where the
// ops ran one after the other, the scaled q and k (all for the backward). One pass of fused
// kernels on CUDA where they fit the sizes (and, causal, chunks of 64); else, and on the CPU,
// the ops composed.
std::vector<Tensor> favor_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& omega,
                                    double scale, const Tensor& pad, double guard, bool causal = false,
                                    int64_t chunk = 64);
// Returns {dq, dk, dv} (laid out as q, k, v) from grad [B, H, N, E] and the forward's outputs.
std::vector<Tensor> favor_attention_backward(const Tensor& grad, const Tensor& q, const Tensor& k, const Tensor& v,
                                             const Tensor& omega, double scale, const std::vector<Tensor>& forward,
                                             double guard, bool causal = false, int64_t chunk = 64);
// One step of causal FAVOR+ decoding (no gradient): the T new positions q, k [B, H, T, D], v [B, H,
// T, E] (query t sees the step's keys <= t) after the earlier keys' running sums [B, H, S, E + 1] =
// sum_m phi~(k_m) [v_m, 1]^T, phi~ their features stabilized by c [B, H, 1, 1] (both undefined
// before the first step). The step's keys are stabilized by c' = max(c, their largest log-factor
// over the unpadded keys), the sums rescaled to it. Returns {out [B, H, T, E], the sums after the
// step, c'}; favor_attention's causal kernels on CUDA where they fit, else the ops composed.
std::vector<Tensor> favor_attention_step(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& omega,
                                         double scale, const Tensor& pad, double guard, const Tensor& sums,
                                         const Tensor& c, int64_t chunk = 64);
// Causal linear attention, fused, in chunks of `chunk` rows: query n sees keys m <= n of phi_k
// and v (rows aligned with phi_q's) and the sums of earlier keys `state` [B, H, S, E + 1] (or
// undefined). Returns {out [B, H, N, E], den [B, H, N] (unguarded), states [B, H, C, S, E + 1]
// (the sums before each chunk), final [B, H, S, E + 1] (the sums after the last key)}.
std::vector<Tensor> causal_linear_attention(const Tensor& phi_q, const Tensor& phi_k, const Tensor& v,
                                            const Tensor& state, int64_t chunk, double guard);
// Returns {dphi_q, dphi_k, dv, dstate (undefined unless want_dstate)} from grad and the forward's
// out, den and states.
std::vector<Tensor> causal_linear_attention_backward(const Tensor& grad, const Tensor& phi_q, const Tensor& phi_k,
                                                     const Tensor& v, const Tensor& out, const Tensor& den,
                                                     const Tensor& states, int64_t chunk, double guard,
                                                     bool want_dstate);
// LARA's mixture weights, fused, of q~ = q_scale q. Returns {mix, t, a}, all
// [B, H, N, C] (t and a for the backward).
std::vector<Tensor> lara_mixture(const Tensor& q, const Tensor& qbar, const Tensor& w, const Tensor& self_w,
                                 const Tensor& bias, double beta, double floor, double q_scale);
// Returns {dq, dqbar, dw, dself_w, dbias} from grad [B, H, N, C] and the forward's mix, t, a.
std::vector<Tensor> lara_mixture_backward(const Tensor& grad, const Tensor& q, const Tensor& qbar, const Tensor& w,
                                          const Tensor& mix, const Tensor& t, const Tensor& a, double beta,
                                          double floor, double q_scale);
// LARA's proposal weights, fused: l_cc' = w_c.mu_c' - |mu_c'|^2/2 per (b, h), self_w_c =
// softmax_c'(l)_cc, bias_c = lse_k_c - l_cc. Returns {self_w, bias} [B, H, C] and p = softmax_c'(l)
// [B, H, C, C] for the backward.
std::vector<Tensor> lara_proposals(const Tensor& w, const Tensor& mu, const Tensor& lse_k);
// Returns {dw, dmu} from the gradients of self_w and bias and the forward's p (lse_k's is dbias).
std::vector<Tensor> lara_proposals_backward(const Tensor& dself_w, const Tensor& dbias, const Tensor& w,
                                            const Tensor& mu, const Tensor& p);

// ---- indexing and joining ----------------------------------------------------------------
Tensor index_select(const Tensor& x, int64_t dim, const Tensor& index);
// The same into out (x's shape with dim of index's length, any layout, not sharing x's memory):
// along dim 0 with out a buffer's part (a cache's filled rows), one kernel that writes only out.
void index_select_out(const Tensor& out, const Tensor& x, int64_t dim, const Tensor& index);
// base + src added at index along dim (base not modified); index_add_ adds into out (contiguous)
// in place: the backward of index_select, into its zeros.
Tensor index_add(const Tensor& base, int64_t dim, const Tensor& index, const Tensor& src);
void index_add_(const Tensor& out, int64_t dim, const Tensor& index, const Tensor& src);
// scale * weight [V, D] at index + positions [max_len, D] at offset + the index's last coordinate
// (undefined: none) -> [index.shape..., D], one kernel: a sequence model's input embedding.
Tensor embed_tokens(const Tensor& weight, const Tensor& index, double scale, const Tensor& positions, int64_t offset);
// An embedding's weight gradient: [num, D] zeros plus scale * grad [n, D] added at index [n] (each
// row's sources in index order on both devices), row padding_idx (-1: none) zeroed.
Tensor embedding_weight_grad(const Tensor& grad, const Tensor& index, int64_t num, double scale, int64_t padding_idx);
// x [B, N, D] with prefix [P, D] (undefined: none) before each sequence and positions [P + N, D]
// added -> [B, P + N, D], one kernel: a ViT's class token and positions. Its backward returns
// {dx, dprefix, dpositions}, each only where wanted (else undefined), one kernel.
Tensor prepend_and_add_positions(const Tensor& x, const Tensor& prefix, const Tensor& positions);
std::vector<Tensor> prepend_and_add_positions_backward(const Tensor& grad, int64_t prefix_len, bool want_x,
                                                       bool want_prefix, bool want_positions);
Tensor gather(const Tensor& x, int64_t dim, const Tensor& index);
// base + src added at index along dim, elementwise (base not modified); scatter_add_ in place into
// out (contiguous): gather's backward, into its zeros.
Tensor scatter_add(const Tensor& base, int64_t dim, const Tensor& index, const Tensor& src);
void scatter_add_(const Tensor& out, int64_t dim, const Tensor& index, const Tensor& src);
Tensor cat(const std::vector<Tensor>& xs, int64_t dim);
// x with `before` and `after` elements of `value` added along dim (torch.nn.functional.pad's
// constant mode, one dim at a time): [.., before + n + after at dim, ..], contiguous, one kernel.
Tensor pad(const Tensor& x, int64_t dim, int64_t before, int64_t after, double value = 0.0);
Tensor stack(const std::vector<Tensor>& xs, int64_t dim);
Tensor cumsum(const Tensor& x, int64_t dim, bool reverse = false);
// Int64 [..., S]: where each of values [..., S] falls in the non-decreasing last dim of sorted
// [..., M] (same leading dims): the number of elements below it (right: at or below it), M for
// NaN, as torch.searchsorted.
Tensor searchsorted(const Tensor& sorted, const Tensor& values, bool right = false);

// ---- FFT (real) along dim ------------------------------------------------------------------
// rfft: x real [..., L at dim, ...] -> [..., n/2+1 at dim, ..., 2] (last dim = re, im); the input is
// zero-padded or truncated to n. irfft: inverse, spectrum [..., n/2+1 at dim, ..., 2] -> real, length n.
Tensor rfft(const Tensor& x, int64_t n, int64_t dim);
Tensor irfft(const Tensor& spec, int64_t n, int64_t dim);

// ---- random (device's default generator) -------------------------------------------------
Tensor uniform(const Shape& shape, double lo, double hi, TensorOptions opts = {});
Tensor normal(const Shape& shape, double mean, double std, TensorOptions opts = {});
Tensor bernoulli(const Shape& shape, double p, TensorOptions opts = {});              // 0/1 in opts.dtype
Tensor randint(int64_t low, int64_t high, const Shape& shape, Device device = kCPU);  // Int64
Tensor randperm(int64_t n, Device device = kCPU);                                     // Int64

// ---- checks shared by ops --------------------------------------------------------------
void check_same_device(const char* op, const Tensor& a, const Tensor& b);
void check_same_dtype(const char* op, const Tensor& a, const Tensor& b);
void check_defined(const char* op, const Tensor& a, const char* name);

}  // namespace linea::raw
