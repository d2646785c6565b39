// CudaGraph (see cuda_graph.h): the capture with the allocator's private pool selected.
#include "core/cuda_graph.h"

#include "core/cuda_interface.h"
#include "core/error.h"

namespace linea {

#ifdef LINEA_WITH_CUDA
CudaGraph::CudaGraph(const std::function<void()>& fn) {
  LINEA_CHECK(cuda::is_available(), "CudaGraph: no usable CUDA device");
  CachingAllocator& a = cuda::allocator();
  pool_ = a.create_pool();
  const int previous = a.selected_pool();
  a.select_pool(pool_);
  try {
    cuda::graph_capture_begin();
  } catch (...) {
    a.select_pool(previous);
    a.release_pool(pool_);
    throw;
  }
  try {
    fn();
  } catch (...) {
    try {
      cuda::graph_capture_end(false);  // abandon it; the error that stopped it is the one to report
    } catch (...) {
    }
    a.select_pool(previous);
    a.release_pool(pool_);
    throw;
  }
  a.select_pool(previous);
  try {
    exec_ = cuda::graph_capture_end(true);
  } catch (...) {
    a.release_pool(pool_);
    throw;
  }
}

CudaGraph::~CudaGraph() {
  cuda::graph_destroy(exec_);
  cuda::allocator().release_pool(pool_);
}

void CudaGraph::replay() const { cuda::graph_launch(exec_); }

bool cuda_graph_capturing() { return cuda::graph_capturing(); }
#else
CudaGraph::CudaGraph(const std::function<void()>&) { LINEA_FAIL("CudaGraph: this build of Linea has no CUDA backend"); }
CudaGraph::~CudaGraph() = default;
void CudaGraph::replay() const {}
bool cuda_graph_capturing() { return false; }
#endif

}  // namespace linea
