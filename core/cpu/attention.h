// Fused CPU attention kernels; called through the raw:: functions of core/ops.h, which check the
// arguments. Softmax attention, the positive random features and linear attention are backend
// kernels of both devices (core/kernels.h; on CUDA cuda/attention.cu, cuda/random_features.cu,
// cuda/linear_attention.cu); the other two are CPU only so far (on CUDA the mechanisms compose
// them from ops).
//
// Softmax attention (raw::sdpa), per (b, h) a block of query rows at a time, the block's scores
// staying in cache:
//   out_n = sum_m p_nm v_m,  p_nm = exp(scale q_n.k_m - lse_n) over the keys n may see, 0 elsewhere
// where lse_n is the log-sum-exp of row n's visible scaled scores; a row that sees no key gets
// out_n = 0 and lse_n = -inf (masked_softmax's convention: fully hidden rows are zero).
// The forward can keep the probabilities p [B, H, N, M] for the backward; without them the
// backward recomputes each block's scores from q, k and lse (one more GEMM and exp per score).
#pragma once

#include <cstdint>

#include "core/kernels.h"
#include "core/tensor.h"

namespace linea::cpu {

// sdpa_forward / sdpa_backward: declared with every backend kernel (core/kernels.h).

// Toeplitz-modulated linear attention without the [S, E] outer products in memory
// (raw::toeplitz_attention; nprf_rpe's FFT path). Per (b, h):
//   y_n = sum_m c_{m-n} (phi_q_n . phi_k_m) v_m = sum_s phi_q_ns sum_m c_{m-n} phi_k_ms v_m
// one feature s and two value channels at a time: phi_k_ms (v_ma + i v_mb) is transformed (a
// complex FFT of length fft_len >= N + M - 1: c is real, so both channels share it),
// multiplied by the spectrum of c's circulant embedding, transformed back and weighted by
// phi_q_ns. The backward recomputes each feature's transforms (memory O((N + M) S), not
// O(N S E)). c [H or B*H, N+M-1] holds c_t at t + N - 1 for t = m - n;
// phi_q [B, H, N, S], phi_k [B, H, M, S], v [B, H, M, E] contiguous, one float dtype;
// y [B, H, N, E].
void toeplitz_attention_forward(const Tensor& c, const Tensor& phi_q, const Tensor& phi_k, const Tensor& v,
                                int64_t fft_len, const Tensor& y);
// dc (c's shape; summed over the batch when c is per head), dphi_q, dphi_k, dv: overwritten.
void toeplitz_attention_backward(const Tensor& c, const Tensor& phi_q, const Tensor& phi_k, const Tensor& v,
                                 const Tensor& dy, int64_t fft_len, const Tensor& dc, const Tensor& dphi_q,
                                 const Tensor& dphi_k, const Tensor& dv);

// positive_features_*, linear_attention_*: declared with every backend kernel (core/kernels.h).

// LARA's mixture weights (raw::lara_mixture; attention/lara/), per (b, h):
//   t = softmax over n of q~ qbar^T,  a = self_w + beta (t - mean_c t),
//   mix = softmax_c(log max(a, floor) + q~ w^T - |q~|^2/2 + bias)
// for q~ [B, H, N, D], qbar and w [B, H, C, D], self_w and bias [B, H, C]; contiguous, one float
// dtype, every dim > 0. Writes mix, t and a [B, H, N, C] (the last two for the backward).
void lara_mixture_forward(const Tensor& q, const Tensor& qbar, const Tensor& w, const Tensor& self_w,
                          const Tensor& bias, double beta, double floor, const Tensor& mix, const Tensor& t,
                          const Tensor& a);
// dq, dqbar, dw, dself_w, dbias (overwritten) from dmix and the forward's mix, t and a.
void lara_mixture_backward(const Tensor& q, const Tensor& qbar, const Tensor& w, const Tensor& mix, const Tensor& t,
                           const Tensor& a, const Tensor& dmix, double beta, double floor, const Tensor& dq,
                           const Tensor& dqbar, const Tensor& dw, const Tensor& dself_w, const Tensor& dbias);

}  // namespace linea::cpu
