// The step's forward and backward over the ranks (see step_reducer.h).
#include "apps/common/step_reducer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>

#include "apps/common/device.h"
#include "apps/common/interrupt.h"
#include "apps/common/progress.h"
#include "autograd/ops.h"
#include "core/random.h"
#include "nn/dist.h"

using json = nlohmann::json;

namespace linea::apps {

StepReducer::StepReducer(const TrainSetup& setup, int64_t start_step) : setup_(setup) {
  if (setup.data_parallel) world_ = dist::world_size(), rank_ = dist::rank();
  if (world_ == 1) return;
  const std::string& app = setup.app;
  whole_ = setup.loader->sampler_ptr();
  if (auto* sharded = dynamic_cast<const nn::ShardedBatchSampler*>(whole_.get())) whole_ = sharded->inner();
  std::string model_desc;
  for (const auto& [name, p] : setup.model->named_parameters())
    model_desc += name + " " + shape_str(p.shape()) + " " + dtype_name(p.dtype()) + "\n";
  dist::check_same(setup.config.dump() + "\n" + model_desc, app + ": data parallel: the settings or the model");
  dist::check_same(std::to_string(start_step),
                   app + ": data parallel: the step each rank resumed at (the ranks must share the checkpoint folder)");
  nn::broadcast_parameters(*setup.model);
  setup.loader->shard(rank_, world_);
  reducer_ = std::make_unique<nn::GradientReducer>(setup.model->parameters());
  if (main_rank())
    std::printf("%s: data parallel over %d ranks (%s), %lld gradient buckets of up to %lld MB\n", app.c_str(), world_,
                dist::has_nccl() && setup.device.is_cuda() ? "NCCL" : "MPI",
                static_cast<long long>(reducer_->num_buckets()),
                static_cast<long long>(nn::GradientReducer::kDefaultBucketBytes >> 20));
}

void StepReducer::begin_epoch(int64_t epoch) {
  whole_sizes_.clear();
  if (world_ > 1)
    for (const auto& b : whole_->batches(epoch)) whole_sizes_.push_back(static_cast<int64_t>(b.size()));
}

WholeStep StepReducer::forward_backward(const std::function<StepResult(const nn::Batch&)>& step, const nn::Batch& batch,
                                        int64_t index) {
  WholeStep out;
  if (world_ == 1) {
    StepResult r = step(batch);
    r.loss.backward();
    out.loss = r.loss.detach();
    out.units = r.units;
    out.stats = std::move(r.stats);
    out.interrupt = pending_interrupt();
    return out;
  }
  // This rank's slice of the whole batch, its loss weighted by its share of the batch's terms.
  const nn::ShardRange shard = nn::shard_range(whole_sizes_.at(static_cast<size_t>(index)), rank_, world_);
  StepResult r;
  double w = 0;
  if (shard.count > 0) {
    BatchRowsGuard rows(shard.first);
    r = step(batch);
    w = r.weight >= 0 ? r.weight : static_cast<double>(r.units);
  }
  // The weighted loss is summed where it is (NCCL on the device's stream for a CUDA run), so the
  // host never waits for the forward; the counts are the host's own.
  const auto t0 = std::chrono::steady_clock::now();
  const TensorOptions f64(DType::Float64, setup_.device);
  Tensor loss_sum = w > 0 ? mul(r.loss.detach().to(DType::Float64), w) : zeros({}, f64);
  dist::all_reduce(loss_sum);
  // The 3rd sum: did any rank get SIGINT/SIGTERM (so all stop after the same step).
  Tensor sums =
      from_vector<double>({w, static_cast<double>(r.units), static_cast<double>(pending_interrupt() != 0)}, {3});
  dist::all_reduce(sums);
  comm_s_ += seconds_since(t0);
  const std::vector<double> total = sums.to_vector<double>();
  if (total[2] > 0) out.interrupt = pending_interrupt() != 0 ? pending_interrupt() : SIGTERM;
  reducer_->prepare(total[0] > 0 ? w / total[0] : 0.0);
  if (shard.count > 0) r.loss.backward();
  reducer_->finish();
  ++comm_steps_;
  out.loss = total[0] > 0 ? div(loss_sum, total[0]) : zeros({}, f64);
  out.units = std::llround(total[1]);
  out.stats = std::move(r.stats);
  return out;
}

Metrics StepReducer::from_main_rank(const Metrics& m) const {
  if (world_ == 1) return m;
  std::string text = json{{"values", m.values}, {"text", m.text}}.dump();
  dist::broadcast_string(text, 0);
  const json j = json::parse(text);
  return Metrics{j.at("values"), j.at("text").get<std::string>()};
}

void StepReducer::report(json& summary) const {
  if (world_ == 1) return;
  const double per_step =
      (comm_s_ + reducer_->wait_seconds()) / std::max<double>(static_cast<double>(comm_steps_), 1.0);
  summary["data_parallel"] = {{"ranks", world_},
                              {"backend", dist::has_nccl() && setup_.device.is_cuda() ? "nccl" : "mpi"},
                              {"gradient_bytes", reducer_->bytes_per_step()},
                              {"buckets", reducer_->num_buckets()},
                              {"comm_wait_s_per_step", per_step}};
  if (main_rank())
    std::printf("%s: data parallel: %d ranks; per step %.2f ms waiting for collectives (%.1f MB of gradients)\n",
                setup_.app.c_str(), world_, 1e3 * per_step, static_cast<double>(reducer_->bytes_per_step()) / 1e6);
}

}  // namespace linea::apps
