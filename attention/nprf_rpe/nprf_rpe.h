// The `nprf_rpe` mechanism (Luo et al. 2021, "Stable, Fast and Accurate: Kernelized Attention
// with Relative Positional Encoding"): normalized positive random features with a learned
// relative-position bias b_{j-i} per head, whose Toeplitz sums over keys are done by FFT in
// O(N log N) (attention/nprf_rpe/toeplitz.h), with a dense O(N M) path of the same formula.
//
// The formula (per batch and head; q [N, D], k [M, D], v [M, Dv]):
//   q^ = q / |q|, k^ = k / |k|   (a zero vector stays zero)
//   phi(x) = exp(W x - |x|^2 / 2) / sqrt(S)   on q^, k^ directly (no D^-1/4), W = omega [S, D],
//            so that E[phi(q^).phi(k^)] = exp(q^.k^)
//   out_i = phi(q^_i) . sum_j e^{b_{j-i}} phi(k^_j) v_j^T / phi(q^_i) . sum_j e^{b_{j-i}} phi(k^_j)
// with b_t (t = j - i in -(L-1)..L-1) stored in rpe [H, 2L-1] at index t + L - 1, where query i
// sits at position i + query_offset among the keys (AttentionOptions). Causal: key j is visible
// to query i iff j <= i + query_offset (the positive offsets drop out); padded keys drop out of both
// sums; a query that sees no key gets zeros. Stabilizers that cancel in the ratio (detached):
// the max over features per query row, the max over keys and features per (batch, head), and
// the max of b per head (exp(b - max b)).
//
// Precision of the FFT path: the rounding error of an FFT-computed sum is relative to the
// largest terms of the whole sequence, not of the query's own terms, so in float32 a query whose
// weights are all ~1e-7 of the largest in its (batch, head) (a strongly peaked bias or extreme
// features) gets an inexact output; float64 and the dense path do not have this limit. Queries
// that see no key at all are detected exactly (from the masks) and get zeros.
#pragma once

#include "attention/common/common.h"

namespace linea::attn {

// The nprf_rpe output [B, H, N, Dv] for q [B, H, N, D], k [B, H, M, D], v [B, H, M, Dv], feature
// rows omega [H, S, D] and the bias table rpe [H, 2L-1] (L >= max(N, M)); omega and rpe are
// converted to q's dtype and device. dense: the O(N M) path instead of the FFT one. Both run the
// fused toeplitz_attention kernel (no [S, Dv] products per key in memory): by FFT, or (dense)
// term by term in tiles of query rows by keys (on CUDA the tensor-core tiles of the softmax
// kernels), never holding the [N, M] matrix.
// Differentiable in q, k, v, rpe (and omega).
Tensor nprf_rpe_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& omega, const Tensor& rpe,
                          const AttentionOptions& opts = {}, bool dense = false);
// The FFT path composed from ops (toeplitz_matmul_channels_first over the S * Dv channels of
// phi(k) v^T): the reference the fused kernel is tested against.
Tensor nprf_rpe_attention_fft_composed(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& omega,
                                       const Tensor& rpe, const AttentionOptions& opts = {});

// The normalized attention matrix [B, H, N, M] of the same formula (dense), so that
// nprf_rpe_attention(q, k, v, ...) == nprf_rpe_attention_matrix(q, k, ...) @ v. Rows of queries
// that see no key are zero.
Tensor nprf_rpe_attention_matrix(const Tensor& q, const Tensor& k, const Tensor& omega, const Tensor& rpe,
                                 const AttentionOptions& opts = {});

// Which path computes the two sums over keys: the FFT one, the dense O(N M) one, or whichever
// nprf_rpe_prefers_dense() picks for the call's shapes.
enum class NprfPath { Fft, Dense, Auto };

// The choice of NprfPath::Auto: true when the dense path is expected to be the faster one for N
// queries, M keys, S features and value dim Dv on the CPU, or on CUDA when `cuda` (a cost model
// fitted to timings of both paths on each, see nprf_rpe.cpp; shapes only, never data). With the
// defaults (S = 64): dense up to N = M ~ 1500 at Dv = 16, ~4000 at Dv = 64 on the CPU; ~6900 at
// Dv = 64 on CUDA (fitted before the tensor-core tiles took the dense path: to refit).
bool nprf_rpe_prefers_dense(int64_t N, int64_t M, int64_t S, int64_t Dv, bool cuda = false);

// The mechanism. Spec options: features=S (default 64), max_len=L (default 512), redraw=N (new
// features every N training calls, the first included; 0 = never; default 1; the schedule of
// AttentionMechanism), dense=0|1|auto
// (default auto: dense for short sequences, FFT for long ones; 0/1 force one path).
// Parameter "rpe" [H, 2L-1] (zeros at construction); buffer "omega" [H, S, D] float32, orthogonal
// Gaussian rows drawn at construction and replaced at redraws (never in eval). The random
// quantity "omega" goes through sample(), so set_samples/freeze_samples fix it.
class NprfRpeAttention : public AttentionMechanism {
 public:
  NprfRpeAttention(int64_t heads, int64_t head_dim, int64_t features = 64, int64_t max_len = 512, int64_t redraw = 1,
                   NprfPath dense = NprfPath::Auto);
  Tensor forward(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& opts) override;
  Tensor attention_matrix(const Tensor& q, const Tensor& k, const AttentionOptions& opts) override;
  // Decoding keeps the keys and values (a KeyValueCache) and is exact over them, with the
  // relative positions of the new queries taken from the state's length.
  AttentionSupport support() const override { return {true, true, true, true}; }
  std::vector<std::string> sample_names() const override { return {"omega"}; }
  std::string extra_repr() const override;

  int64_t features() const { return features_; }
  int64_t max_len() const { return max_len_; }
  int64_t redraw() const { return redraw_every(); }
  NprfPath dense() const { return dense_; }  // the mode as given (Auto is not resolved here)
  // Whether a forward with N queries and M keys (values of dim Dv; head_dim when not given), on
  // CUDA when `cuda`, takes the dense path.
  bool uses_dense(int64_t N, int64_t M, int64_t Dv, bool cuda = false) const {
    return dense_ == NprfPath::Dense || (dense_ == NprfPath::Auto && nprf_rpe_prefers_dense(N, M, features_, Dv, cuda));
  }
  bool uses_dense(int64_t N, int64_t M) const { return uses_dense(N, M, head_dim()); }
  const Tensor& rpe() const { return rpe_; }      // [H, 2L-1]
  const Tensor& omega() const { return omega_; }  // [H, S, D] (the buffer)

 private:
  // omega for this call through sample(): in training, redraws the buffer when due.
  Tensor features_for(const Tensor& like);

  int64_t features_, max_len_;
  NprfPath dense_;
  Tensor rpe_, omega_;
};

// The factory registered as "nprf_rpe" (attention/builtin.cpp).
std::shared_ptr<AttentionMechanism> make_nprf_rpe(const AttentionSpec& spec, int64_t heads, int64_t head_dim);
// What nprf_rpe is, for the registry (attention/registry.h): summary, support, options, test specs.
AttentionInfo nprf_rpe_info();

}  // namespace linea::attn
