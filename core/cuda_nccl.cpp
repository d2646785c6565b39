// The NCCL collectives of a build without NCCL (see cuda_nccl.h): no CUDA backend, or CMake did
// not find nccl.h and libnccl. With NCCL, cuda/nccl.cpp implements them.
#include "core/cuda_nccl.h"

#include "core/error.h"

#ifndef LINEA_WITH_NCCL
namespace linea::cuda::nccl {
namespace {
[[noreturn]] void missing() {
  LINEA_FAIL(
      "this build of Linea has no NCCL (CMake did not find nccl.h and libnccl): collectives on CUDA "
      "tensors go through host memory and MPI");
}
}  // namespace
bool available() { return false; }
std::string unique_id() { missing(); }
void init(const std::string&, int, int) { missing(); }
bool initialized() { return false; }
void all_reduce(void*, size_t, DType, Op) { missing(); }
void broadcast(void*, size_t, DType, int) { missing(); }
void all_gather(const void*, void*, size_t, DType) { missing(); }
void wait_on_compute() {}
void finalize() {}
}  // namespace linea::cuda::nccl
#endif
