// Fused CPU attention kernels; called through the raw:: functions of core/ops.h, which check the
// arguments. All five are backend kernels of both devices (core/kernels.h; on CUDA
// cuda/attention.cu, random_features.cu, linear_attention.cu, toeplitz_attention.cu and
// lara_mixture.cu).
//
// Softmax attention (raw::sdpa), per (b, h) a block of query rows at a time, the block's scores
// staying in cache:
//   out_n = sum_m p_nm v_m,  p_nm = exp(scale q_n.k_m - lse_n) over the keys n may see, 0 elsewhere
// where lse_n is the log-sum-exp of row n's visible scaled scores; a row that sees no key gets
// out_n = 0 and lse_n = -inf (masked_softmax's convention: fully hidden rows are zero).
// Its draw (raw::sdpa_sample, RA's; on CUDA cuda/attention_sample.cu) takes a block's scores the
// same way and turns each row into its running sums of exp(s - max), searched for each draw.
// The forward can keep the probabilities p [B, H, N, M] for the backward; without them the
// backward recomputes each block's scores from q, k and lse (one more GEMM and exp per score).
#pragma once

#include <cstdint>

#include "core/kernels.h"
#include "core/tensor.h"

namespace linea::cpu {

// sdpa_forward / sdpa_backward: declared with every backend kernel (core/kernels.h).

// positive_features_*, linear_attention_*, toeplitz_attention_*, lara_mixture_*, lara_proposals_*: declared with
// every backend kernel (core/kernels.h). The CPU toeplitz kernel (toeplitz_attention.cpp) works
// one feature and two value channels at a time: phi_k_ms (v_ma + i v_mb) is transformed (a
// complex FFT: c is real, so both channels share it), multiplied by the spectrum of c's circulant
// embedding, transformed back and weighted by phi_q_ns; the backward recomputes each feature's
// transforms.

}  // namespace linea::cpu
