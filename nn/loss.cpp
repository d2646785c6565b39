// Losses (see loss.h): shape checks around the differentiable ops.
#include "nn/loss.h"

namespace linea::nn {

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
