// One training step's forward and backward on this process's share of the batch, and what the
// loop needs of the whole batch, whether the run is one process or the ranks of an MPI job
// (nn/dist.h). The loop has one step; data parallelism lives here:
//   one process  hooks.step(batch), loss.backward(); nothing waits for the device.
//   N ranks      at the start, the ranks check that their settings, parameter shapes and resume
//                step agree, rank 0's weights are broadcast and the loader yields each rank its
//                slice of every batch (the batch size stays the whole batch: N ranks train the
//                same run as one process, and a checkpoint resumes under any N). Per step, each
//                rank's forward runs inside a BatchRowsGuard at its slice's first example (its
//                per-example draws are those one process would make), the weighted losses are
//                summed across the ranks where they are (on the device, by NCCL, for a CUDA run:
//                the host does not wait for the forward), the example counts on the host, and
//                the gradients are averaged in buckets while the backward runs (nn::GradientReducer).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include <nlohmann/json.hpp>

#include "apps/common/train_loop.h"
#include "nn/data.h"
#include "nn/data_parallel.h"

namespace linea::apps {

// What forward_backward leaves for the loop: all on the device but the counts.
struct WholeStep {
  std::map<std::string, Tensor> stats;  // this rank's (hooks.step's StepResult::stats)
  Tensor loss;                          // 0-d: the whole batch's loss
  int64_t units = 0;                    // the whole batch's
  int interrupt = 0;                    // SIGINT/SIGTERM (on any rank): stop after this step
};

class StepReducer {
 public:
  // Data parallel when `setup.data_parallel` and the job has several ranks; `start_step` is the
  // step this process resumed at (the ranks must agree).
  StepReducer(const TrainSetup& setup, int64_t start_step);
  int world() const { return world_; }
  int rank() const { return rank_; }
  bool main_rank() const { return rank_ == 0; }  // the one that prints and writes

  // Before the epoch's first step (the sizes of its whole batches, to cut the slices).
  void begin_epoch(int64_t epoch);
  // The forward (hooks.step) and backward of batch `index` of the epoch.
  WholeStep forward_backward(const std::function<StepResult(const nn::Batch&)>& step, const nn::Batch& batch,
                             int64_t index);
  // Rank 0's evaluation results on every rank.
  Metrics from_main_rank(const Metrics& metrics) const;
  // summary.json's "data_parallel" block, and a console line (nothing for one process).
  void report(nlohmann::json& summary) const;

 private:
  const TrainSetup& setup_;
  int world_ = 1, rank_ = 0;
  std::shared_ptr<const nn::BatchSampler> whole_;  // the whole batches
  std::vector<int64_t> whole_sizes_;               // this epoch's
  std::unique_ptr<nn::GradientReducer> reducer_;
  double comm_s_ = 0;  // waiting for the steps' loss and count sums (the reducer counts its own waits)
  int64_t comm_steps_ = 0;
};

}  // namespace linea::apps
