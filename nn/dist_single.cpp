// linea::dist's backend in a build without MPI (see dist_backend.h): always a world of one, so
// every collective is the identity.
#include "core/error.h"
#include "nn/dist_backend.h"

namespace linea::dist {

bool has_mpi() { return false; }

namespace detail {
void start(State&) { LINEA_FAIL("dist: this build of Linea has no MPI"); }  // init() asks has_mpi() first
void host_barrier() {}
void host_broadcast(const Tensor&, int) {}
void host_all_gather(const Tensor& t, const Tensor& out) { Tensor(out).copy_(t); }
std::function<void()> host_all_reduce_start(const Tensor&, ReduceOp) { return {}; }
void abort_others(int) {}
}  // namespace detail

}  // namespace linea::dist
