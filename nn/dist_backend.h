// Inside linea::dist (nn/dist.h): what its shared part (nn/dist.cpp: the checks, worlds of one,
// NCCL for CUDA tensors, other CUDA tensors through host memory, Mean's division) asks of the
// process backend, which CMake picks: nn/dist_mpi.cpp in a build with MPI (LINEA_WITH_MPI),
// nn/dist_single.cpp without (a world of one). The backend moves contiguous CPU tensors between
// ranks; the shared part calls it only when world_size() > 1 and the tensor is not empty.
#pragma once

#include <functional>
#include <string>

#include "core/tensor.h"
#include "nn/dist.h"

namespace linea::dist::detail {

struct State {
  bool initialized = false;
  int rank = 0, world = 1, local_rank = 0, local_size = 1;
};
State& state();
bool env_set(const char* name);  // set and not empty
// The CUDA_VISIBLE_DEVICES of the rank with local rank r, where several ranks share a machine and
// each takes a GPU of its own: entry r mod n of `visible` (CUDA_VISIBLE_DEVICES as the launcher
// left it, n entries, empty ones skipped) or, where that is null or empty, of the driver's
// `driver_gpus` devices 0 .. n-1; "" where there are none (the rank leaves the variable alone).
std::string gpu_for_local_rank(const char* visible, int driver_gpus, int local_rank);

// Joins the job this process was launched into (MPI_Init_thread; each rank its own GPU) and sets
// s's ranks and sizes. init() calls it only when has_mpi().
void start(State& s);
void host_barrier();
// Rank root's t on every rank, in place.
void host_broadcast(const Tensor& t, int root);
// out [world, ...t.shape] = every rank's t (the same shape and dtype on every rank).
void host_all_gather(const Tensor& t, const Tensor& out);
// Starts the in-place all-reduce of buf (Mean sums: the caller divides); the returned function
// waits for it (empty when there is nothing to wait for).
std::function<void()> host_all_reduce_start(const Tensor& buf, ReduceOp op);
// Ends every process of the job with `code` (MPI_Abort) when there are others; else returns.
void abort_others(int code);

}  // namespace linea::dist::detail
