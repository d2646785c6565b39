// The captured training steps (see graph_steps.h).
#include "apps/common/graph_steps.h"

#include "apps/common/interrupt.h"
#include "autograd/ops.h"
#include "core/allocator.h"
#include "core/random.h"

namespace linea::apps {

namespace {

std::string key_of(const nn::Batch& b) {
  std::string key;
  for (const auto& [name, t] : b.tensors()) key += name + shape_str(t.shape()) + dtype_name(t.dtype()) + ";";
  return key;
}

}  // namespace

GraphSteps::GraphSteps(Device device) : device_(device) {
  LongLivedAllocations long_lived;
  draw_base_ = zeros({1}, TensorOptions(DType::Int64, device));
}

GraphSteps::Entry& GraphSteps::capture(const std::string& key, const nn::Batch& batch, nn::Optimizer& optimizer,
                                       const std::function<IssuedStep(const nn::Batch&)>& step) {
  if (entries_.size() >= kMaxGraphs) {
    auto oldest = entries_.begin();
    for (auto it = entries_.begin(); it != entries_.end(); ++it)
      if (it->second.last_use < oldest->second.last_use) oldest = it;
    entries_.erase(oldest);
  }
  Entry& e = entries_[key];
  nn::Batch staged;
  for (const auto& [name, t] : batch.tensors()) {
    e.inputs[name] = t.to(device_).contiguous();
    staged.set(name, e.inputs[name]);
  }
  optimizer.zero_grad();  // the capture's backward makes the gradients, in its pool
  linea::detail::begin_draw_capture(static_cast<const uint64_t*>(draw_base_.data_ptr()));
  try {
    e.graph = std::make_unique<CudaGraph>([&] { e.issued = step(staged); });
  } catch (...) {
    linea::detail::end_draw_capture();
    throw;
  }
  e.draws = linea::detail::end_draw_capture();  // the capture advanced the generator already
  return e;
}

IssuedStep GraphSteps::run(const nn::Batch& batch, nn::Optimizer& optimizer,
                           const std::function<IssuedStep(const nn::Batch&)>& step,
                           const std::function<std::pair<int64_t, double>(const nn::Batch&)>& units) {
  const std::string key = key_of(batch);
  auto it = entries_.find(key);
  optimizer.prepare_step();  // the learning rates, outside the graph
  const uint64_t base = linea::detail::next_example_draw(device_);
  Entry* e = nullptr;
  if (it == entries_.end()) {
    e = &capture(key, batch, optimizer, step);
  } else {
    e = &it->second;
    for (const auto& [name, t] : batch.tensors()) e->inputs.at(name).copy_(t);
    linea::detail::skip_example_draws(device_, e->draws);
  }
  e->last_use = ++tick_;
  if (e->draws > 0) draw_base_.copy_(from_vector<int64_t>({static_cast<int64_t>(base)}, {1}));
  e->graph->replay();
  IssuedStep out = e->issued;
  if (units) out.units = units(batch).first;
  out.interrupt = pending_interrupt();
  return out;
}

}  // namespace linea::apps
