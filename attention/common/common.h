// Pieces shared by the attention mechanisms of attention/: the scaled space of the
// random-feature math, log xi, masked log-sum-exp, and orthogonal Gaussian feature rows.
//
// Notation: x~ = D^-1/4 x, so q~.k~ = q.k / sqrt(D), and the positive map
// xi(x, w) = exp(w.x - |x|^2 / 2); E_w~N(mu, I)[...] identities make xi the building block of
// performer, ra and lara.
#pragma once

#include <cstdint>

#include "attention/registry.h"

namespace linea::attn {

// x~ = D^-1/4 x for x [..., D] (differentiable); scale_of(D) = D^-1/4, for the fused ops that scale
// as they read.
Tensor scaled(const Tensor& x);
double scale_of(int64_t head_dim);

// log xi(x_m, w_p) for every pair: w [..., P, D], x [..., M, D] -> [..., P, M] = w x^T - |x|^2/2.
Tensor log_xi(const Tensor& w, const Tensor& x);

// logsumexp over `dim` leaving out entries where `hidden` (Bool, broadcast) is true; a slice with
// every entry hidden gives the dtype's lowest finite value (so exp() of it is 0), not -inf/NaN.
Tensor masked_logsumexp(const Tensor& logits, const Tensor& hidden, int64_t dim, bool keepdim);


// Orthogonal Gaussian feature rows, [heads, S, D] float64 on the CPU from the CPU generator:
// per head, ceil(S/D) blocks, each the Q factor of a Gaussian D x D matrix (Gram-Schmidt, so
// rows are Haar-orthonormal), its first rows up to S, every row rescaled to the norm of an
// independent N(0, I_D) vector (a chi(D) length), as FAVOR+ prescribes.
Tensor orthogonal_gaussian(int64_t heads, int64_t S, int64_t D);

// Key padding mask as Bool [B, 1, 1, M] (true = padded), undefined when there is none.
Tensor padded_keys(const AttentionOptions& opts);

}  // namespace linea::attn
