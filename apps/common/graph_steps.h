// --cuda-graph (RunOptions::cuda_graph): the training step captured as a CUDA graph per batch
// shape (names, shapes and dtypes of the batch's tensors; core/cuda_graph.h) and replayed with
// one launch. At most kMaxGraphs shapes, the least recently used dropped first. A replay reads
// the batch from the graph's static input tensors, the learning rates and the per-example draws'
// base counter from device memory, and computes what an uncaptured step would, bit for bit.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "apps/common/train_loop.h"
#include "core/cuda_graph.h"
#include "core/tensor.h"
#include "nn/data.h"
#include "nn/optim.h"

namespace linea::apps {

// A step issued on the device: what the loop reads back later.
struct IssuedStep {
  Tensor loss;   // 0-d: the whole batch's loss
  Tensor guard;  // {gradient norm, clipping coefficient, finite?} (nn::step_guard)
  std::vector<std::pair<std::string, Tensor>> stats;
  int64_t units = 0;  // the whole batch's
  int interrupt = 0;  // SIGINT/SIGTERM arrived: stop after this step
};

class GraphSteps {
 public:
  static constexpr size_t kMaxGraphs = 8;
  explicit GraphSteps(Device device);
  // `step` on `batch` through the graph of its shape: captured on first sight of the shape
  // (after zero_grad: the capture's backward makes the gradients, in the graph's pool), then
  // replayed. `units` (TrainHooks::units) counts a replayed batch's units when set.
  IssuedStep run(const nn::Batch& batch, nn::Optimizer& optimizer,
                 const std::function<IssuedStep(const nn::Batch&)>& step,
                 const std::function<std::pair<int64_t, double>(const nn::Batch&)>& units);

 private:
  struct Entry {
    std::unique_ptr<CudaGraph> graph;
    std::map<std::string, Tensor> inputs;  // the static device tensors it reads the batch from
    IssuedStep issued;                     // where it leaves the loss, the guard and the stats
    int64_t draws = 0;                     // per-example draws it reserves (the base counter moves by that much)
    uint64_t last_use = 0;
  };
  Entry& capture(const std::string& key, const nn::Batch& batch, nn::Optimizer& optimizer,
                 const std::function<IssuedStep(const nn::Batch&)>& step);

  Device device_;
  Tensor draw_base_;  // the device counter the captured per-example draws add their index to
  std::map<std::string, Entry> entries_;
  uint64_t tick_ = 0;
};

}  // namespace linea::apps
