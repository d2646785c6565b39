// Losses (see loss.h): shape checks and flattening around the differentiable ops.
#include "nn/loss.h"

namespace linea::nn {

Tensor cross_entropy_loss(const Tensor& logits, const Tensor& target, int64_t ignore_index, double label_smoothing,
                          Reduction reduction) {
  raw::check_defined("cross_entropy_loss", logits, "logits");
  raw::check_defined("cross_entropy_loss", target, "target");
  LINEA_CHECK(target.dtype() == DType::Int64, "cross_entropy_loss: target must be int64 class indices, got ",
              dtype_name(target.dtype()), " (shape ", shape_str(target.shape()), ")");
  LINEA_CHECK(label_smoothing >= 0.0 && label_smoothing <= 1.0,
              "cross_entropy_loss: label_smoothing must be in [0, 1], got ", label_smoothing);
  LINEA_CHECK(logits.dim() >= 1 && target.dim() == logits.dim() - 1, "cross_entropy_loss: logits ",
              shape_str(logits.shape()), " need a target with one dim fewer, got target ", shape_str(target.shape()));
  const Shape lead(logits.shape().begin(), logits.shape().end() - 1);
  LINEA_CHECK(lead == target.shape(), "cross_entropy_loss: logits ", shape_str(logits.shape()), " and target ",
              shape_str(target.shape()), " do not match (expected target ", shape_str(lead), ")");
  if (logits.dim() <= 2) return cross_entropy(logits, target, ignore_index, label_smoothing, reduction);
  const int64_t C = logits.size(-1);
  // [B, L, C] -> [B*L, C], [B, L] -> [B*L]
  Tensor loss =
      cross_entropy(reshape(logits, {-1, C}), raw::reshape(target, {-1}), ignore_index, label_smoothing, reduction);
  return reduction == Reduction::None ? reshape(loss, target.shape()) : loss;
}

Tensor mse_loss(const Tensor& pred, const Tensor& target, Reduction reduction) {
  raw::check_defined("mse_loss", pred, "pred");
  raw::check_defined("mse_loss", target, "target");
  LINEA_CHECK(pred.shape() == target.shape(), "mse_loss: pred ", shape_str(pred.shape()), " and target ",
              shape_str(target.shape()), " must have the same shape");
  LINEA_CHECK(is_floating(pred.dtype()), "mse_loss: expected a floating prediction, got ", dtype_name(pred.dtype()));
  Tensor d = square(sub(pred, target));
  switch (reduction) {
    case Reduction::None:
      return d;
    case Reduction::Sum:
      return sum(d);
    case Reduction::Mean:
      return mean(d);
  }
  LINEA_FAIL("mse_loss: unknown reduction");
}

}  // namespace linea::nn
