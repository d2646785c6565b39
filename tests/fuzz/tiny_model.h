// The model and optimizer fuzz_checkpoint loads checkpoints into, shared with make_seeds.cpp
// (which saves real checkpoints of it as seeds): w [3, 2], b [3], AdamW over decay_groups (w
// decayed, b not: two parameter groups).
#pragma once

#include <memory>

#include "nn/module.h"
#include "nn/optim.h"

namespace linea::fuzz {

class TinyModel : public nn::Module {
 public:
  TinyModel() : Module("TinyModel") {
    w = register_parameter("w", full({3, 2}, 0.5));
    b = register_parameter("b", zeros({3}));
  }
  Tensor w, b;
};

inline std::unique_ptr<nn::AdamW> tiny_optimizer(TinyModel& model) {
  return std::make_unique<nn::AdamW>(nn::decay_groups(model, 0.01, 0.1));
}

}  // namespace linea::fuzz
