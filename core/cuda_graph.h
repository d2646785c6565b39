// CUDA graphs: the stream work of one call of a function, captured once and replayed with one
// launch (cudaGraphLaunch), which is what makes a small model's training step, all launches,
// fast (PyTorch's torch.cuda.graph).
//
//   CudaGraph g([&] { step(static_inputs); });   // captures: nothing runs yet
//   for (...) { static_inputs.copy_(batch); g.replay(); }
//
// Tensors allocated during the capture come from a private pool of the device's caching
// allocator that lives as long as the graph, so a replay's kernels find their memory where the
// capture put it, and nothing else is given those blocks meanwhile (tensors that outlive the
// capture, such as the step's loss and the parameters' gradients, are at the same addresses
// after every replay). What the captured work takes from the host is baked in: kernel
// arguments, addresses. So a function to capture must read everything that changes between
// replays from device memory (inputs copied into static tensors, the optimizer's device-side
// learning rates and step count, the per-example draws' base counter: core/random.h), and must
// not copy between host and device, synchronize or draw with cuRAND: those throw linea::Error
// during the capture, which is then abandoned. Requires a CUDA device.
#pragma once

#include <functional>

namespace linea {

class CudaGraph {
 public:
  explicit CudaGraph(const std::function<void()>& fn);
  ~CudaGraph();
  CudaGraph(const CudaGraph&) = delete;
  CudaGraph& operator=(const CudaGraph&) = delete;
  // Runs the captured work (one graph launch on the stream; returns without waiting).
  void replay() const;

 private:
  [[maybe_unused]] void* exec_ = nullptr;  // (unused in a build without CUDA)
  [[maybe_unused]] int pool_ = 0;
};

// True while a capture is on (ops that must not be captured check it).
bool cuda_graph_capturing();

}  // namespace linea
