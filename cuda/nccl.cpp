// NCCL collectives for linea::dist (see core/cuda_nccl.h). Compiled into every CUDA build; the
// body only when CMake found NCCL (LINEA_WITH_NCCL), else core/cuda_nccl.cpp stands in.
#include "core/cuda_nccl.h"

#include "core/error.h"

#ifdef LINEA_WITH_NCCL
#include <cuda_runtime.h>
#include <nccl.h>

#include <cstring>

#include "cuda/check.h"
#include "cuda/context.h"

#define LINEA_NCCL_CHECK(expr)                                                                                         \
  do {                                                                                                                 \
    ncclResult_t linea_nr_ = (expr);                                                                                   \
    LINEA_CHECK(linea_nr_ == ncclSuccess, "NCCL: ", #expr, " failed: ", ncclGetErrorString(linea_nr_), " (", __FILE__, \
                ":", __LINE__, ")");                                                                                   \
  } while (0)

namespace linea::cuda::nccl {

namespace {
struct State {
  ncclComm_t comm = nullptr;
  cudaStream_t comm_stream = nullptr;  // the collectives' own stream
  cudaEvent_t queued = nullptr;        // recorded on Linea's stream before each collective
  cudaEvent_t done = nullptr;          // recorded on comm_stream after each collective
  bool pending = false;                // a collective was started since wait_on_compute()
};
State& state() {
  static State s;
  return s;
}

ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::Float32:
      return ncclFloat32;
    case DType::Float64:
      return ncclFloat64;
    case DType::Int64:
      return ncclInt64;
    case DType::Bool:
      return ncclUint8;
  }
  LINEA_FAIL("NCCL: unsupported dtype ", t);
}

ncclRedOp_t nccl_op(Op op) {
  switch (op) {
    case Op::Sum:
      return ncclSum;
    case Op::Avg:
      return ncclAvg;
    case Op::Max:
      return ncclMax;
    case Op::Min:
      return ncclMin;
  }
  return ncclSum;
}

// Orders the next collective after everything queued on Linea's stream so far.
cudaStream_t begin() {
  State& s = state();
  LINEA_CHECK(s.comm, "NCCL: the communicator is not initialized (linea::dist::init)");
  LINEA_CUDA_CHECK(cudaEventRecord(s.queued, detail::stream()));
  LINEA_CUDA_CHECK(cudaStreamWaitEvent(s.comm_stream, s.queued, 0));
  return s.comm_stream;
}
void end() {
  State& s = state();
  LINEA_CUDA_CHECK(cudaEventRecord(s.done, s.comm_stream));
  s.pending = true;
}
}  // namespace

bool available() { return true; }

std::string unique_id() {
  ncclUniqueId id;
  LINEA_NCCL_CHECK(ncclGetUniqueId(&id));
  return std::string(id.internal, sizeof(id.internal));
}

void init(const std::string& id_bytes, int world, int rank) {
  State& s = state();
  if (s.comm) return;
  ncclUniqueId id;
  LINEA_CHECK(id_bytes.size() == sizeof(id.internal), "NCCL: a unique id of ", id_bytes.size(), " bytes, expected ",
              sizeof(id.internal));
  std::memcpy(id.internal, id_bytes.data(), sizeof(id.internal));
  detail::stream();  // selects Linea's device first
  LINEA_CUDA_CHECK(cudaStreamCreateWithFlags(&s.comm_stream, cudaStreamNonBlocking));
  LINEA_CUDA_CHECK(cudaEventCreateWithFlags(&s.queued, cudaEventDisableTiming));
  LINEA_CUDA_CHECK(cudaEventCreateWithFlags(&s.done, cudaEventDisableTiming));
  LINEA_NCCL_CHECK(ncclCommInitRank(&s.comm, world, id, rank));
}

bool initialized() { return state().comm != nullptr; }

void all_reduce(void* data, size_t count, DType dtype, Op op) {
  cudaStream_t st = begin();
  LINEA_NCCL_CHECK(ncclAllReduce(data, data, count, nccl_type(dtype), nccl_op(op), state().comm, st));
  end();
}

void broadcast(void* data, size_t count, DType dtype, int root) {
  cudaStream_t st = begin();
  LINEA_NCCL_CHECK(ncclBroadcast(data, data, count, nccl_type(dtype), root, state().comm, st));
  end();
}

void all_gather(const void* send, void* recv, size_t count, DType dtype) {
  cudaStream_t st = begin();
  LINEA_NCCL_CHECK(ncclAllGather(send, recv, count, nccl_type(dtype), state().comm, st));
  end();
}

void wait_on_compute() {
  State& s = state();
  if (!s.pending) return;
  LINEA_CUDA_CHECK(cudaStreamWaitEvent(detail::stream(), s.done, 0));
  s.pending = false;
}

void finalize() {
  State& s = state();
  if (!s.comm) return;
  cudaStreamSynchronize(s.comm_stream);
  ncclCommDestroy(s.comm);
  s.comm = nullptr;
}

}  // namespace linea::cuda::nccl

#endif  // LINEA_WITH_NCCL
