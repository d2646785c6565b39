// Reading small device values on the host without stalling: a training step's loss, gradient
// norm and statistics are copied into pinned host memory behind the work that computes them,
// and the host looks at them later (usually a step later), when the copies have long landed.
//
//   AsyncRead r({loss, norm});      // queues the copies; returns at once
//   ... issue the next step ...
//   if (r.ready()) use(r.values());  // never waits; values() waits when it must (a host sync)
//
// On the CPU the values are read at construction (nothing is in flight). Each tensor is read
// whole, converted to double, in row-major order; values() concatenates them.
// Not for large tensors (use .to(kCPU)), and not a stream: one read, one event.
#pragma once

#include <memory>
#include <vector>

#include "core/tensor.h"

namespace linea {

class AsyncRead {
 public:
  AsyncRead() = default;
  explicit AsyncRead(const std::vector<Tensor>& tensors);
  // True when the values can be read without waiting (always, for CPU tensors or none).
  bool ready() const;
  // The values, waiting for the copies when they are not done yet.
  std::vector<double> values() const;

 private:
  struct State;
  std::shared_ptr<State> state_;
};

}  // namespace linea
