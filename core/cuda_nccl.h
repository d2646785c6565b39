// NCCL collectives on CUDA memory, for linea::dist (nn/dist.h), which bootstraps the
// communicator through MPI: rank 0 makes the unique id, MPI broadcasts it, every rank calls
// init(). Plain C++ (no CUDA or NCCL types): implemented in cuda/nccl.cpp when the build has
// NCCL (LINEA_WITH_NCCL); otherwise (no CUDA backend, or CMake found no NCCL) core/cuda_nccl.cpp
// stands in, where available() and initialized() are false and every collective is an error
// naming what is missing (CUDA tensors then go through host memory and MPI).
//
// The collectives run on a communication stream of their own, ordered after the work already
// queued on Linea's stream (an event), so a reduction started during the backward overlaps the
// kernels queued after it; wait_on_compute() makes Linea's stream wait for every collective
// started so far, so later kernels see the results.
#pragma once

#include <cstddef>
#include <string>

#include "core/dtype.h"

namespace linea::cuda::nccl {

enum class Op { Sum, Avg, Max, Min };

bool available();         // this build has NCCL
std::string unique_id();  // rank 0: the ncclUniqueId's bytes, to broadcast
// Every rank, once: the communicator of `world` ranks on Linea's CUDA device.
void init(const std::string& id, int world, int rank);
bool initialized();
void all_reduce(void* data, size_t count, DType dtype, Op op);             // in place
void broadcast(void* data, size_t count, DType dtype, int root);           // in place
void all_gather(const void* send, void* recv, size_t count, DType dtype);  // recv: world * count
void wait_on_compute();  // Linea's stream waits for the collectives started so far
void finalize();         // destroys the communicator (at exit)

}  // namespace linea::cuda::nccl
