// Parameter initialization: in-place fills of existing tensors (any device, any floating dtype),
// drawn from Linea's CPU generator, so that a model built after manual_seed(s) has the same
// weights on every run and on every device (values are drawn on the CPU, then copied over).
//
// The choices the layers of nn/ make (common transformer practice: BERT, ViT, GPT-2):
//  - Linear on its own: PyTorch's default, weight and bias ~ U(-1/sqrt(in), 1/sqrt(in))
//    (kaiming_uniform_ with a = sqrt(5)), which trains small MLPs well; PatchEmbed's projection
//    keeps it too (it is PyTorch's Conv2d default, the patch convolution of ViT);
//  - Linear layers inside transformer blocks (MultiHeadAttention projections, FeedForward),
//    Embedding and LearnedPositionalEmbedding: truncated normal, std 0.02, cut at +-2 std
//    (+-0.04); biases zero;
//  - LayerNorm: weight ones, bias zeros.
// trunc_normal_ samples by rejection: N(0, 1) draws outside [a, b] (in std units) are redrawn,
// in order, from the same generator; deterministic under manual_seed.
// Not here: the layers themselves (nn/layers.h), random tensors in general (core/random.h).
#pragma once

#include <utility>

#include "core/tensor.h"

namespace linea::nn::init {

// t = value / 0 / 1 (in place; returns t).
Tensor constant_(const Tensor& t, double value);
Tensor zeros_(const Tensor& t);
Tensor ones_(const Tensor& t);
// t ~ U[lo, hi).
Tensor uniform_(const Tensor& t, double lo, double hi);
// t ~ N(mean, std).
Tensor normal_(const Tensor& t, double mean = 0.0, double std = 1.0);
// t ~ N(mean, std) truncated to [mean + a*std, mean + b*std] (a < b, in std units); defaults
// give the transformer initialization, std 0.02 cut at +-2 std.
Tensor trunc_normal_(const Tensor& t, double std = 0.02, double mean = 0.0, double a = -2.0, double b = 2.0);

// Fans of a weight laid out [out, in, k...] (as PyTorch): fan_in = in * prod(k), fan_out = out * prod(k).
// A 1-d tensor has fan_in = fan_out = its size.
std::pair<int64_t, int64_t> fan_in_out(const Tensor& t);
// U(-b, b) with b = gain * sqrt(6 / (fan_in + fan_out)) (Glorot & Bengio).
Tensor xavier_uniform_(const Tensor& t, double gain = 1.0);
// U(-b, b) with b = sqrt(6 / ((1 + a^2) * fan_in)) (He et al.; a = leaky-ReLU slope, 0 for ReLU).
Tensor kaiming_uniform_(const Tensor& t, double a = 0.0);

// A token table [num, dim] for a model that multiplies its embedded tokens by sqrt(dim)
// (fairseq's transformer): N(0, dim^-1/2), so the scaled rows have unit-size coordinates, and the
// padding row (padding_idx >= 0) zero.
Tensor scaled_embedding_(const Tensor& t, int64_t padding_idx = -1);

}  // namespace linea::nn::init
