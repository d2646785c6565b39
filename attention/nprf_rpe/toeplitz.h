// The Toeplitz matrix product of relative-position attention, y_i = sum_j c_{j-i} x_j, computed
// by FFT in O((N + M) log(N + M)) per channel (or densely, for tests), on CPU (FFTW) and CUDA
// (cuFFT) through the differentiable rfft/irfft of autograd/ops.h. nprf_rpe uses it for both
// of its sums over keys; it is public so that tests and benchmarks can call it alone.
#pragma once

#include <cstdint>

#include "autograd/ops.h"

namespace linea::attn {

// The smallest n >= min_len of the form 2^a 3^b 5^c (a length FFTW and cuFFT transform fast).
int64_t fft_length(int64_t min_len);

// y [..., H, N, C] with y_i = sum_{j < M} c_{j-i} x_j (the [N, M] Toeplitz matrix T_ij = c_{j-i}
// times x, per head and channel).
//  c: [H, N+M-1] or [B, H, N+M-1], the coefficient of offset t = j - i in -(N-1)..(M-1) at index
//     t + N - 1 (broadcast over channels, and over batches when 2-D);
//  x: [B, H, M, C], C independent channels (same dtype and device as c);
//  fft: true — circulant embedding of length n = fft_length(N + M - 1): with g the length-n
//     circle holding c_t at position t mod n, y_i = sum_j g_{(j-i) mod n} x_j (no wrap-around
//     since n >= N+M-1), i.e. a circular cross-correlation: Y = X conj(G) in frequency space;
//     false — the dense O(N M C) product through an explicit [.., N, M] matrix (the reference).
// Differentiable in c and x.
Tensor toeplitz_matmul(const Tensor& c, const Tensor& x, int64_t N, bool fft = true);

// The same product with the channels first: xt [B, H, C, M] -> yt [B, H, C, N] (yt_i = sum_j
// c_{j-i} xt_j along the last dim). The FFT runs along the last dim, so a caller that can build
// its input this way saves the two transposes of toeplitz_matmul (nprf_rpe does).
Tensor toeplitz_matmul_channels_first(const Tensor& c, const Tensor& xt, int64_t N, bool fft = true);

// The dense Toeplitz matrix T [.., H, N, M] with T_ij = c_{j-i}, c as in toeplitz_matmul
// (differentiable in c).
Tensor toeplitz_matrix(const Tensor& c, int64_t N, int64_t M);

}  // namespace linea::attn
