// CUDA graph capture and replay behind core/cuda_interface.h (graph_capture_begin, ...): the
// one stream is captured in relaxed mode, the graph instantiated once and launched per replay.
// While a capture is on, the calls that would bake host state into the graph or wait for the
// device (host<->device copies, synchronizations, cuRAND draws) are refused by
// detail::refuse_in_capture with an error naming the call.
// Not here: what is captured (the training loop, apps/common/train_loop.cpp) and the private
// memory pool it allocates from (core/cuda_graph.cpp).
#include "core/cuda_counters.h"
#include "core/cuda_interface.h"
#include "core/error.h"
#include "cuda/check.h"
#include "cuda/context.h"

namespace linea::cuda {

namespace {
bool g_capturing = false;  // one stream, captured from one thread
}

namespace detail {
void refuse_in_capture(const char* what) {
  LINEA_CHECK(!g_capturing, what,
              " inside a captured CUDA graph (--cuda-graph): a replay would not repeat it. A captured step must "
              "read everything that changes from device memory and leave copies, synchronizations and cuRAND "
              "draws outside");
}
}  // namespace detail

bool graph_capturing() { return g_capturing; }

void graph_capture_begin() {
  LINEA_CHECK(!g_capturing, "CUDA graph: a capture is already on (captures do not nest)");
  LINEA_CUDA_CHECK(cudaStreamBeginCapture(detail::stream(), cudaStreamCaptureModeRelaxed));
  g_capturing = true;
}

void* graph_capture_end(bool instantiate) {
  g_capturing = false;
  cudaGraph_t graph = nullptr;
  LINEA_CUDA_CHECK(cudaStreamEndCapture(detail::stream(), &graph));
  if (!instantiate) {
    if (graph) (void)cudaGraphDestroy(graph);
    return nullptr;
  }
  cudaGraphExec_t exec = nullptr;
  const cudaError_t err = cudaGraphInstantiate(&exec, graph, 0);
  (void)cudaGraphDestroy(graph);  // the executable graph keeps what it needs
  LINEA_CUDA_CHECK(err);
  return exec;
}

void graph_launch(void* exec) {
  detail::bump(detail::counter_cells().graph_launches);
  LINEA_CUDA_CHECK(cudaGraphLaunch(static_cast<cudaGraphExec_t>(exec), detail::stream()));
}

void graph_destroy(void* exec) {
  if (exec != nullptr) (void)cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(exec));
}

}  // namespace linea::cuda
