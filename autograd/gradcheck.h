// Gradient check: builds the full Jacobian of f at the inputs two ways, by central
// differences and by backward with one-hot output gradients, in float64 on the CPU, and
// compares entry by entry with |analytic - numeric| <= atol + rtol * |numeric|.
// On failure the result names the input and the worst entry.
// With `probes` set it checks random projections instead (PyTorch's fast_mode): for random unit
// vectors u (input-shaped) and v (output-shaped), v . (J u) by central differences along u
// against (J^T v) . u by one backward; a wrong gradient fails for almost every u and v.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace linea {

struct GradcheckOptions {
  double eps = 1e-6;
  double atol = 1e-5;
  double rtol = 1e-3;
  // 0: the full Jacobian (2 forwards per input element, a backward per output element).
  // N > 0: N random probes per input (2 forwards and a backward each), drawn from probe_seed.
  int64_t probes = 0;
  uint64_t probe_seed = 0;
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
