// Losses as functions of (prediction, target), for models built from nn/ layers: MSE.
// Cross-entropy is linea::cross_entropy (autograd/ops.h: class logits of any leading dims,
// ignore_index, label smoothing; one fused kernel forward and backward).
// Not here: metrics (accuracy, perplexity: the apps), optimizers (nn/optim.h).
#pragma once

#include "autograd/ops.h"

namespace linea::nn {

// (pred - target)^2, averaged (Mean), summed (Sum) or elementwise (None). Shapes must match.
Tensor mse_loss(const Tensor& pred, const Tensor& target, Reduction reduction = Reduction::Mean);

}  // namespace linea::nn
