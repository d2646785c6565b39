// linea::dist's backend in a build with MPI (see dist_backend.h): the ranks, the GPU each rank
// takes, and the collectives on CPU tensors, through MPI's C API.
#include <dirent.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "core/cuda_nccl.h"
#include "core/error.h"
#include "nn/dist_backend.h"

#define OMPI_SKIP_MPICXX 1  // the C API only: no C++ bindings (and their warnings)
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>

namespace linea::dist {

namespace {

using detail::env_set;

// The GPUs the driver lists (/proc/driver/nvidia/gpus/<bus id>), counted without touching CUDA:
// CUDA_VISIBLE_DEVICES must be set before the runtime starts.
int driver_gpu_count() {
  DIR* d = opendir("/proc/driver/nvidia/gpus");
  if (!d) return 0;
  int n = 0;
  while (dirent* e = readdir(d))
    if (e->d_name[0] != '.') ++n;
  closedir(d);
  return n;
}

// Linea uses CUDA device 0 of what it sees; with several ranks on one machine each rank must
// see its own GPU (detail::gpu_for_local_rank picks it).
void pick_gpu(int local_rank, int local_size) {
  if (local_size <= 1 || env_set("LINEA_DIST_KEEP_DEVICES")) return;
  const std::string gpu =
      detail::gpu_for_local_rank(std::getenv("CUDA_VISIBLE_DEVICES"), driver_gpu_count(), local_rank);
  if (!gpu.empty()) setenv("CUDA_VISIBLE_DEVICES", gpu.c_str(), 1);
}

void mpi_check(int rc, const char* call) {
  if (rc == MPI_SUCCESS) return;
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  LINEA_FAIL("dist: ", call, " failed on rank ", detail::state().rank, ": ",
             std::string(msg, static_cast<size_t>(len)));
}

MPI_Datatype mpi_type(DType t) {
  switch (t) {
    case DType::Float32:
      return MPI_FLOAT;
    case DType::Float64:
      return MPI_DOUBLE;
    case DType::Int64:
      return MPI_INT64_T;
    case DType::Bool:
      return MPI_UINT8_T;  // stored as 0/1 bytes: Max is "any", Min is "all"
  }
  LINEA_FAIL("dist: unsupported dtype ", t);
}

MPI_Op mpi_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum:
    case ReduceOp::Mean:
      return MPI_SUM;
    case ReduceOp::Max:
      return MPI_MAX;
    case ReduceOp::Min:
      return MPI_MIN;
  }
  return MPI_SUM;
}

// MPI counts are int: split larger buffers into pieces of at most 2^30 elements.
constexpr int64_t kMaxCount = int64_t(1) << 30;

void finalize_at_exit() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  linea::cuda::nccl::finalize();
  MPI_Finalize();
}

}  // namespace

bool has_mpi() { return true; }

namespace detail {

void start(State& s) {
  int provided = 0;
  mpi_check(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided), "MPI_Init_thread");
  std::atexit(finalize_at_exit);
  // Errors come back as return codes (turned into linea::Error), not as MPI's default abort.
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  mpi_check(MPI_Comm_rank(MPI_COMM_WORLD, &s.rank), "MPI_Comm_rank");
  mpi_check(MPI_Comm_size(MPI_COMM_WORLD, &s.world), "MPI_Comm_size");
  MPI_Comm local;
  mpi_check(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, s.rank, MPI_INFO_NULL, &local),
            "MPI_Comm_split_type");
  mpi_check(MPI_Comm_rank(local, &s.local_rank), "MPI_Comm_rank");
  mpi_check(MPI_Comm_size(local, &s.local_size), "MPI_Comm_size");
  MPI_Comm_free(&local);
  pick_gpu(s.local_rank, s.local_size);
}

void host_barrier() { mpi_check(MPI_Barrier(MPI_COMM_WORLD), "MPI_Barrier"); }

void host_broadcast(const Tensor& t, int root) {
  char* p = static_cast<char*>(t.data_ptr());
  for (int64_t i = 0; i < t.numel(); i += kMaxCount) {
    const int n = static_cast<int>(std::min(kMaxCount, t.numel() - i));
    mpi_check(
        MPI_Bcast(p + i * static_cast<int64_t>(dtype_size(t.dtype())), n, mpi_type(t.dtype()), root, MPI_COMM_WORLD),
        "MPI_Bcast");
  }
}

void host_all_gather(const Tensor& t, const Tensor& out) {
  LINEA_CHECK(t.numel() <= kMaxCount, "dist::all_gather: ", t.numel(), " elements per rank; at most ", kMaxCount);
  const int n = static_cast<int>(t.numel());
  mpi_check(MPI_Allgather(t.data_ptr(), n, mpi_type(t.dtype()), out.data_ptr(), n, mpi_type(t.dtype()), MPI_COMM_WORLD),
            "MPI_Allgather");
}

std::function<void()> host_all_reduce_start(const Tensor& buf, ReduceOp op) {
  std::vector<MPI_Request> requests;
  char* p = static_cast<char*>(buf.data_ptr());
  for (int64_t i = 0; i < buf.numel(); i += kMaxCount) {
    const int n = static_cast<int>(std::min(kMaxCount, buf.numel() - i));
    MPI_Request req;
    mpi_check(MPI_Iallreduce(MPI_IN_PLACE, p + i * static_cast<int64_t>(dtype_size(buf.dtype())), n,
                             mpi_type(buf.dtype()), mpi_op(op), MPI_COMM_WORLD, &req),
              "MPI_Iallreduce");
    requests.push_back(req);
  }
  return [requests]() mutable {
    mpi_check(MPI_Waitall(static_cast<int>(requests.size()), requests.data(), MPI_STATUSES_IGNORE), "MPI_Waitall");
  };
}

void abort_others(int code) {
  if (world_size() > 1) MPI_Abort(MPI_COMM_WORLD, code);
}

}  // namespace detail

}  // namespace linea::dist
