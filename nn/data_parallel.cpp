// Data parallelism's gradient averaging (see data_parallel.h).
#include "nn/data_parallel.h"

#include <chrono>

#include "autograd/autograd.h"
#include "autograd/ops.h"
#include "core/ops.h"

namespace linea::nn {

void broadcast_parameters(Module& model, int root) {
  if (dist::world_size() == 1) return;
  NoGradGuard ng;
  for (auto& [name, p] : model.named_parameters()) dist::broadcast(p.detach(), root);
  for (auto& [name, b] : model.named_buffers()) dist::broadcast(b, root);
}

GradientReducer::GradientReducer(std::vector<Tensor> params, int64_t bucket_bytes) {
  LINEA_CHECK(bucket_bytes > 0, "GradientReducer: bucket_bytes must be positive, got ", bucket_bytes);
  for (Tensor& p : params)
    if (p.requires_grad()) params_.push_back(std::move(p));  // frozen parameters get no gradient
  bucket_of_.assign(params_.size(), 0);
  // Reverse registration order; a new bucket when the dtype or device changes or the bucket is full.
  for (size_t k = params_.size(); k-- > 0;) {
    const Tensor& p = params_[k];
    LINEA_CHECK(p.is_leaf(), "GradientReducer: parameter ", k, " (shape ", shape_str(p.shape()),
                ") is the output of an op, not a leaf");
    const int64_t bytes = p.numel() * static_cast<int64_t>(dtype_size(p.dtype()));
    bool fresh = buckets_.empty();
    if (!fresh) {
      const Tensor& first = params_[buckets_.back().params.front()];
      fresh = first.dtype() != p.dtype() || first.device() != p.device() ||
              (buckets_.back().numel * static_cast<int64_t>(dtype_size(p.dtype())) + bytes > bucket_bytes &&
               buckets_.back().numel > 0);
    }
    if (fresh) buckets_.emplace_back();
    Bucket& b = buckets_.back();
    b.params.push_back(k);
    b.offsets.push_back(b.numel);
    b.numel += p.numel();
    bucket_of_[k] = buckets_.size() - 1;
    bytes_ += bytes;
  }
  if (dist::world_size() == 1) return;  // nothing to reduce: no hooks
  for (size_t k = 0; k < params_.size(); ++k) set_grad_ready_hook(params_[k], [this, k] { on_ready(k); });
}

GradientReducer::~GradientReducer() {
  if (dist::world_size() == 1) return;
  for (Tensor& p : params_) set_grad_ready_hook(p, nullptr);
}

void GradientReducer::prepare(double scale) {
  scale_ = scale;
  next_ = 0;
  for (Bucket& b : buckets_) b.ready = 0;
  active_ = true;
}

void GradientReducer::on_ready(size_t param) {
  if (!active_) return;  // a backward outside prepare()/finish(): not ours to reduce
  Bucket& b = buckets_[bucket_of_[param]];
  ++b.ready;
  start_in_order();
}

void GradientReducer::start_in_order() {
  while (next_ < buckets_.size() && buckets_[next_].ready == static_cast<int>(buckets_[next_].params.size()))
    start(buckets_[next_++]);
}

void GradientReducer::start(Bucket& b) {
  NoGradGuard ng;
  const Tensor& first = params_[b.params.front()];
  b.flat = empty({b.numel}, TensorOptions(first.dtype(), first.device()));
  for (size_t j = 0; j < b.params.size(); ++j) {
    const Tensor& p = params_[b.params[j]];
    Tensor dst = b.flat.narrow(0, b.offsets[j], p.numel());
    const Tensor g = p.grad();
    if (!g.defined())
      dst.fill_(0.0);
    else if (scale_ == 1.0)
      dst.copy_(g.reshape({p.numel()}));
    else
      dst.copy_(g.reshape({p.numel()}) * scale_);
  }
  b.work = dist::all_reduce_async(b.flat, dist::ReduceOp::Sum);
}

void GradientReducer::finish() {
  LINEA_CHECK(active_, "GradientReducer::finish: prepare() was not called before the backward");
  active_ = false;
  if (dist::world_size() == 1) {
    // One rank: the sum over ranks is this rank's scaled gradient.
    if (scale_ != 1.0) {
      NoGradGuard ng;
      for (Tensor& p : params_)
        if (p.grad().defined()) p.set_grad(p.grad() * scale_);
    }
    return;
  }
  // Buckets whose parameters got no gradient this step (or whose hooks never ran) start now, in order.
  while (next_ < buckets_.size()) start(buckets_[next_++]);
  const auto t0 = std::chrono::steady_clock::now();
  for (Bucket& b : buckets_) b.work.wait();
  wait_s_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  NoGradGuard ng;
  for (Bucket& b : buckets_) {
    for (size_t j = 0; j < b.params.size(); ++j) {
      Tensor p = params_[b.params[j]];
      // A view of the step's bucket (a fresh one every step), contiguous like any gradient.
      p.set_grad(b.flat.narrow(0, b.offsets[j], p.numel()).reshape(p.shape()));
    }
    b.flat = Tensor();
  }
}

}  // namespace linea::nn
