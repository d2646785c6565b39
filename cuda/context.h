// The CUDA context Linea uses: one process-wide stream on device 0, the cuBLAS handle and the
// cuRAND generator bound to it, and the generator's {seed, offset} state. Everything is
// created lazily on first use (never at static-initialization time), so a CUDA build runs
// CPU-only programs on a machine with no GPU or driver.
// Not the public API (core/cuda_interface.h is what core calls); internal to cuda/.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <curand.h>

#include <cstddef>
#include <cstdint>
#include <mutex>

#include "core/cuda_counters.h"
#include "core/cuda_interface.h"

namespace linea::cuda::detail {

// The one stream every kernel, copy and library call is issued on (created on first use;
// throws linea::Error when no device is usable).
cudaStream_t stream();

// The compute capability of the device (major * 10 + minor, e.g. 90 for an H100), read once.
int compute_capability();

// The most dynamic shared memory one block may opt in to (bytes; 227 KB on an H100, 99 KB on
// sm_86 and sm_89), read once.
size_t shared_memory_optin();

// The workspace cuBLAS and cuBLASLt share (their calls are ordered on stream()), allocated once,
// so that a captured CUDA graph never sees them allocate: 32 MiB from sm_90 on, 4 MiB before, the
// sizes the cuBLAS documentation recommends (cublasSetWorkspace; PyTorch's defaults). Less may keep
// the heuristics from split-K kernels for GEMMs with a long inner dimension and few outputs
// (linear attention's phi^T v: K = L, a [64, 64] product per head).
struct BlasWorkspace {
  void* p;
  size_t bytes;
};
BlasWorkspace blas_workspace();

// The cuBLAS handle, bound to stream(), on blas_workspace().
cublasHandle_t cublas();

// Counts stream work (core/cuda_counters.h) that runs now: captured work is counted as the graph
// launch that replays it.
inline void count_work(std::atomic<int64_t>& cell, int64_t n = 1) {
  if (!graph_capturing()) bump(cell, n);
}

// Throws linea::Error naming `what` when a CUDA graph capture is on (cuda/graph.cpp): for the
// calls a replay would not repeat (host<->device copies, synchronizations, cuRAND draws).
void refuse_in_capture(const char* what);

// Scratch device memory from the caching allocator, freed on scope exit. With one stream,
// a block freed here can be reused by the next launch at once (stream order).
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t nbytes);
  ~DeviceBuffer();
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  void* get() const { return ptr_; }
  template <typename T> T* as() const { return static_cast<T*>(ptr_); }

 private:
  void* ptr_ = nullptr;
};

// A device counter at zero for the "last block finishes" pattern (adam_multi_step, the
// layer_norm backward): each block adds 1 when done, the one that sees gridDim.x - 1 does the
// final step and sets it back to 0. One stream runs one such kernel at a time, so they share it.
unsigned int* blocks_done_counter();

// Bad values found by a kernel (an index out of range, a cross-entropy target outside
// [0, C)). Kernels cannot throw, and trapping would poison the CUDA context, so a kernel
// writes a report into host-mapped memory and moves on (the affected outputs are 0);
// check_device_errors(), called after every host synchronization (memcpy_d2h,
// synchronize(), LINEA_CUDA_SYNC=1 launches), throws linea::Error from the host.
enum class DeviceErrorCode : int {
  None = 0,
  IndexSelect,
  IndexAdd,
  Gather,
  ScatterAdd,
  CrossEntropyTarget,
  EmbedTokens
};
struct DeviceErrorReport {
  int code;       // a DeviceErrorCode; 0 = none
  int64_t value;  // the bad value (one of them, when several threads saw one)
  int64_t bound;  // the valid range is [0, bound)
};
// Device-visible pointer to the report (host-mapped pinned memory, allocated on first use).
DeviceErrorReport* device_error_report();
// Throws linea::Error if a kernel filed a report since the last check (and clears it).
// Call only after the stream was synchronized.
void check_device_errors();

// The cuRAND Philox4x32-10 generator with its state. lock() must be held while using it.
// Each draw sets the generator's offset to offset_ first and advances offset_ by (at least)
// the number of 32-bit words consumed, so {seed, offset} fully describes the state.
struct RngState {
  std::mutex mu;
  uint64_t seed = 0;
  uint64_t offset = 0;
  curandGenerator_t gen = nullptr;  // created lazily by generator()
  uint64_t gen_seed = 0;            // seed the generator was last given
  bool gen_seeded = false;
};
RngState& rng();
// The generator (created and bound to stream() on first use), with seed and offset applied.
// Caller holds rng().mu. Advances rng().offset by `words` rounded up to a multiple of 4.
curandGenerator_t generator_for_draw(uint64_t words);

}  // namespace linea::cuda::detail
