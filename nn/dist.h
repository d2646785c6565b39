// linea::dist: processes that train together. MPI (Open MPI: started by `mpirun -np N` or a
// cluster scheduler) gives the ranks and the collectives on CPU tensors; NCCL, bootstrapped
// through MPI (rank 0's ncclUniqueId broadcast), the collectives on CUDA tensors. A build
// without MPI, or a process not started by a launcher, is one rank of one: every collective is
// then the identity, and nothing else changes.
//
//   dist::init();                          // reads the launcher's environment; idempotent
//   dist::all_reduce(grad, ReduceOp::Mean);  // in place, every rank gets the result
//   dist::broadcast(param, 0);             // rank 0's values everywhere
//   Tensor all = dist::all_gather(x);      // [world, ...x.shape], rank r's x at index r
//
// Collectives take contiguous tensors of any dtype (Sum and Mean: numbers only, Mean: floating
// only) on one device; every rank must call the same collectives in the same order with the same
// shapes (a mismatch is checked where it is cheap: the shapes in all_gather, the sizes in
// check_same). A CUDA tensor goes through NCCL when the build has it, else through host memory
// and MPI. Errors are linea::Error naming the collective and the rank.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "core/tensor.h"

namespace linea::dist {

enum class ReduceOp { Sum, Mean, Max, Min };

// Compiled in?
bool has_mpi();
bool has_nccl();

// Starts MPI when the process was started by a launcher (Open MPI's mpirun, or a PMI/PMIx
// scheduler such as Slurm's srun), else stays single-process. LINEA_DIST=0 forces single-process,
// LINEA_DIST=1 requires MPI (an error when this build or launch has none). Idempotent; the
// process's exit finalizes MPI.
void init();
bool is_initialized();  // init() ran (with MPI or as a world of one)
int rank();             // 0 .. world_size()-1 (0 before init)
int world_size();       // 1 before init and without MPI
int local_rank();       // rank among the processes on this machine: which GPU to take
int local_size();
inline bool is_main() { return rank() == 0; }  // the rank that writes logs and checkpoints

void barrier();
// In place on every rank.
void all_reduce(const Tensor& t, ReduceOp op = ReduceOp::Sum);
void broadcast(const Tensor& t, int root = 0);
// Rank `root`'s string on every rank (e.g. evaluation results as JSON).
void broadcast_string(std::string& s, int root = 0);
// A new tensor [world_size, ...t.shape] on t's device; every rank's t must have the same shape.
Tensor all_gather(const Tensor& t);
// Every rank's `what` (e.g. a hash of the run's settings) is the same, else a linea::Error on
// every rank naming `label` and the ranks that differ: catches mismatched flags and models at start.
void check_same(const std::string& what, const std::string& label);

// A collective started without waiting (MPI_Iallreduce; NCCL on the device's stream). wait()
// completes it (and is called by the destructor): the data is final only after it.
class Work {
 public:
  struct Impl;
  Work();
  explicit Work(std::unique_ptr<Impl> impl);
  Work(Work&&) noexcept;
  Work& operator=(Work&&) noexcept;
  ~Work();
  void wait();

 private:
  std::unique_ptr<Impl> impl_;
};
Work all_reduce_async(const Tensor& t, ReduceOp op = ReduceOp::Sum);

// Ends the whole job (MPI_Abort) after printing "<label>: rank R of N: <message>" to stderr: a
// rank that fails must not leave the others waiting in a collective. Single-process: exit(code).
[[noreturn]] void abort_job(const std::string& label, const std::string& message, int code = 1);

// "rank 1 of 2 (local 1 of 2), MPI + NCCL" or "single process": for logs.
std::string describe();

}  // namespace linea::dist
