// Gradient check: builds the full Jacobian of f at the inputs two ways, by central
// differences and by backward with one-hot output gradients, in float64 on the CPU, and
// compares entry by entry with |analytic - numeric| <= atol + rtol * |numeric|.
// On failure the result names the input and the worst entry.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace linea {

struct GradcheckOptions {
  double eps = 1e-6;
  double atol = 1e-5;
  double rtol = 1e-3;
};

struct GradcheckResult {
  bool ok = true;
  std::string message;  // the worst entry when !ok
  double max_abs_error = 0.0;
};

// f maps the inputs to one output tensor (any shape). Inputs must be float64 CPU tensors;
// those with requires_grad set are checked. Inputs are perturbed in place (and restored),
// so they may be non-contiguous views of a larger tensor.
GradcheckResult gradcheck(const std::function<Tensor(const std::vector<Tensor>&)>& f, const std::vector<Tensor>& inputs,
                          GradcheckOptions opts = {});

}  // namespace linea
