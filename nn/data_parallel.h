// Data parallelism: every rank (nn/dist.h) holds the whole model, runs its own shard of each
// batch, and the gradients are averaged across ranks before the optimizer step, so every rank
// takes the same step. The shared training loop (apps/common/train_loop.h) drives it:
//
//   broadcast_parameters(model);           // at start: rank 0's weights everywhere
//   GradientReducer reducer(model.parameters());
//   per step:  reducer.prepare(weight / total_weight);  loss.backward();  reducer.finish();
//
// Gradients go in buckets (flattened, about bucket_bytes each, parameters in reverse order of
// registration, which is roughly the order the backward completes them). A bucket's all-reduce
// starts from the autograd engine's grad-ready hook as soon as its last gradient is complete,
// while the backward goes on, always in bucket order (every rank must start the same collectives
// in the same order); finish() starts what is left (a parameter the step did not use counts as a
// zero gradient), waits, and leaves each .grad holding sum over ranks of scale_r * grad_r.
#pragma once

#include <cstdint>
#include <vector>

#include "core/tensor.h"
#include "nn/dist.h"
#include "nn/module.h"

namespace linea::nn {

// Rank 0's parameters and buffers (e.g. fixed random features) on every rank.
void broadcast_parameters(Module& model, int root = 0);

class GradientReducer {
 public:
  static constexpr int64_t kDefaultBucketBytes = int64_t(4) << 20;
  // Installs grad-ready hooks on those of `params` that require grad (removed by the destructor).
  explicit GradientReducer(std::vector<Tensor> params, int64_t bucket_bytes = kDefaultBucketBytes);
  ~GradientReducer();
  GradientReducer(const GradientReducer&) = delete;
  GradientReducer& operator=(const GradientReducer&) = delete;

  // Before the backward: this rank's gradients enter the sum multiplied by `scale` (for a loss
  // that is a mean over this rank's share w_r of the W terms of the whole batch: w_r / W).
  void prepare(double scale);
  // After the backward: the reduced gradients in every parameter's .grad.
  void finish();

  int64_t num_buckets() const { return static_cast<int64_t>(buckets_.size()); }
  // Seconds finish() has spent waiting for collectives (the communication that the backward
  // did not hide), over all steps so far, and the bytes reduced per step.
  double wait_seconds() const { return wait_s_; }
  int64_t bytes_per_step() const { return bytes_; }

 private:
  struct Bucket {
    std::vector<size_t> params;  // indices into params_
    std::vector<int64_t> offsets;
    int64_t numel = 0;
    int ready = 0;  // parameters whose gradient is complete this step
    Tensor flat;
    dist::Work work;
  };
  void on_ready(size_t param);
  void start(Bucket& b);
  void start_in_order();

  std::vector<Tensor> params_;
  std::vector<Bucket> buckets_;
  std::vector<size_t> bucket_of_;  // parameter index -> bucket
  size_t next_ = 0;                // the next bucket to start
  double scale_ = 1;
  bool active_ = false;  // between prepare() and finish()
  double wait_s_ = 0;
  int64_t bytes_ = 0;
};

}  // namespace linea::nn
