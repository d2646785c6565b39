// Losses as functions of (prediction, target), for models built from nn/ layers:
// cross-entropy over class logits (ignore_index, label smoothing, token sequences) and MSE.
// Both are differentiable in the prediction; cross_entropy_loss is linea::cross_entropy (one
// fused kernel forward and backward) after flattening sequence dims.
// Not here: metrics (accuracy, perplexity: the apps), optimizers (nn/optim.h).
#pragma once

#include "autograd/ops.h"

namespace linea::nn {

// logits [N, C] with target Int64 [N], or [B, L, C] (any leading dims) with target [B, L]
// (flattened to rows), or [C] with a 0-d target. Rows whose target == ignore_index count
// neither in the loss nor in the mean (mean over non-ignored rows; 0 if all are ignored).
// label_smoothing s: the target distribution is (1 - s) * onehot + s / C.
// Reduction::None returns the per-row loss shaped like target.
Tensor cross_entropy_loss(const Tensor& logits, const Tensor& target, int64_t ignore_index = -100,
                          double label_smoothing = 0.0, Reduction reduction = Reduction::Mean);

// (pred - target)^2, averaged (Mean), summed (Sum) or elementwise (None). Shapes must match.
Tensor mse_loss(const Tensor& pred, const Tensor& target, Reduction reduction = Reduction::Mean);

}  // namespace linea::nn
