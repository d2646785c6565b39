// The CUDA runtime side of Linea: device probing, device memory (raw cudaMalloc/cudaFree
// behind the caching allocator), pinned host memory and events, host<->device copies (host ->
// device staged through pinned memory, so the host never waits for them), the one stream, the
// cuBLAS handle, the cuRAND generator's {seed, offset} state, the error reporting behind
// cuda/check.h, and the counters of core/cuda_counters.h that these calls bump.
// Everything is created on first use: nothing CUDA-related runs at static-initialization
// time, and probing a machine with no driver returns 0 devices instead of failing.
// Not the kernels (cuda/*.cu); not the allocator's bookkeeping (core/allocator.cpp).
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <mutex>
#include <string>
#include <vector>

#include "core/cuda_counters.h"
#include "core/cuda_interface.h"
#include "core/error.h"
#include "cuda/check.h"
#include "cuda/context.h"
#include "cuda/cublas_library.h"

namespace linea::cuda {

// ---- errors ---------------------------------------------------------------------------------
namespace detail {

namespace {

const char* cufft_status_name(cufftResult st) {
  switch (st) {
    case CUFFT_SUCCESS:
      return "CUFFT_SUCCESS";
    case CUFFT_INVALID_PLAN:
      return "CUFFT_INVALID_PLAN";
    case CUFFT_ALLOC_FAILED:
      return "CUFFT_ALLOC_FAILED (out of device memory)";
    case CUFFT_INVALID_TYPE:
      return "CUFFT_INVALID_TYPE";
    case CUFFT_INVALID_VALUE:
      return "CUFFT_INVALID_VALUE";
    case CUFFT_INTERNAL_ERROR:
      return "CUFFT_INTERNAL_ERROR";
    case CUFFT_EXEC_FAILED:
      return "CUFFT_EXEC_FAILED";
    case CUFFT_SETUP_FAILED:
      return "CUFFT_SETUP_FAILED";
    case CUFFT_INVALID_SIZE:
      return "CUFFT_INVALID_SIZE";
    case CUFFT_UNALIGNED_DATA:
      return "CUFFT_UNALIGNED_DATA";
    case CUFFT_INVALID_DEVICE:
      return "CUFFT_INVALID_DEVICE";
    case CUFFT_NO_WORKSPACE:
      return "CUFFT_NO_WORKSPACE";
    case CUFFT_NOT_IMPLEMENTED:
      return "CUFFT_NOT_IMPLEMENTED";
    case CUFFT_NOT_SUPPORTED:
      return "CUFFT_NOT_SUPPORTED";
    default:
      return "unknown cuFFT status";
  }
}

const char* curand_status_name(curandStatus_t st) {
  switch (st) {
    case CURAND_STATUS_SUCCESS:
      return "CURAND_STATUS_SUCCESS";
    case CURAND_STATUS_VERSION_MISMATCH:
      return "CURAND_STATUS_VERSION_MISMATCH";
    case CURAND_STATUS_NOT_INITIALIZED:
      return "CURAND_STATUS_NOT_INITIALIZED";
    case CURAND_STATUS_ALLOCATION_FAILED:
      return "CURAND_STATUS_ALLOCATION_FAILED";
    case CURAND_STATUS_TYPE_ERROR:
      return "CURAND_STATUS_TYPE_ERROR";
    case CURAND_STATUS_OUT_OF_RANGE:
      return "CURAND_STATUS_OUT_OF_RANGE";
    case CURAND_STATUS_LENGTH_NOT_MULTIPLE:
      return "CURAND_STATUS_LENGTH_NOT_MULTIPLE";
    case CURAND_STATUS_DOUBLE_PRECISION_REQUIRED:
      return "CURAND_STATUS_DOUBLE_PRECISION_REQUIRED";
    case CURAND_STATUS_LAUNCH_FAILURE:
      return "CURAND_STATUS_LAUNCH_FAILURE";
    case CURAND_STATUS_PREEXISTING_FAILURE:
      return "CURAND_STATUS_PREEXISTING_FAILURE";
    case CURAND_STATUS_INITIALIZATION_FAILED:
      return "CURAND_STATUS_INITIALIZATION_FAILED";
    case CURAND_STATUS_ARCH_MISMATCH:
      return "CURAND_STATUS_ARCH_MISMATCH";
    case CURAND_STATUS_INTERNAL_ERROR:
      return "CURAND_STATUS_INTERNAL_ERROR";
    default:
      return "unknown cuRAND status";
  }
}

}  // namespace

void throw_cuda_error(cudaError_t err, const char* expr, const char* file, int line) {
  // Clears the error for non-sticky failures so the next call does not see it again.
  (void)cudaGetLastError();
  throw Error(linea::detail::concat("CUDA error ", cudaGetErrorName(err), " (", cudaGetErrorString(err), ") in ", expr,
                                    " at ", file, ":", line));
}

void throw_cublas_error(cublasStatus_t st, const char* expr, const char* file, int line) {
  const CublasApi& api = cublas_api();
  throw Error(linea::detail::concat("cuBLAS error ", api.cublasGetStatusName(st), " (", api.cublasGetStatusString(st),
                                    ") in ", expr, " at ", file, ":", line));
}

void throw_cufft_error(cufftResult st, const char* expr, const char* file, int line) {
  throw Error(linea::detail::concat("cuFFT error ", cufft_status_name(st), " (code ", static_cast<int>(st), ") in ",
                                    expr, " at ", file, ":", line));
}

void throw_curand_error(curandStatus_t st, const char* expr, const char* file, int line) {
  throw Error(linea::detail::concat("cuRAND error ", curand_status_name(st), " (code ", static_cast<int>(st), ") in ",
                                    expr, " at ", file, ":", line));
}

bool sync_debug() {
  static const bool on = [] {
    const char* s = std::getenv("LINEA_CUDA_SYNC");
    return s != nullptr && std::strcmp(s, "1") == 0;
  }();
  return on;
}

void check_launch(const char* file, int line) {
  count_work(counter_cells().kernel_launches);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) throw_cuda_error(err, "kernel launch", file, line);
  if (sync_debug() && !graph_capturing()) {  // a capture cannot synchronize
    bump(counter_cells().host_syncs);
    err = cudaStreamSynchronize(stream());
    if (err != cudaSuccess) throw_cuda_error(err, "kernel execution (LINEA_CUDA_SYNC=1)", file, line);
    check_device_errors();
  }
}

}  // namespace detail

// ---- device probing ---------------------------------------------------------------------------
namespace {

struct Probe {
  int count = 0;
  std::string reason;  // why no device is usable, when count == 0
};

const Probe& probe() {
  static const Probe p = [] {
    Probe r;
    int n = 0;
    cudaError_t err = cudaGetDeviceCount(&n);
    if (err != cudaSuccess) {
      r.reason = linea::detail::concat(cudaGetErrorName(err), ": ", cudaGetErrorString(err));
      (void)cudaGetLastError();  // clear it, so later calls do not report it again
      n = 0;
    } else if (n == 0) {
      r.reason = "no CUDA device found";
    }
    r.count = n;
    return r;
  }();
  return p;
}

void require_device(const char* what) {
  const Probe& p = probe();
  LINEA_CHECK(p.count > 0, what, ": no usable CUDA device (", p.reason,
              "); this build of Linea has the CUDA backend, but this machine has no GPU or driver. "
              "Use Device(\"cpu\"), or check cuda_available() first");
}

}  // namespace

bool is_available() { return device_count() > 0; }

int device_count() {
  try {
    return probe().count;
  } catch (...) {
    return 0;
  }
}

std::string device_name(int index) {
  require_device("cuda_device_name");
  const int count = probe().count;
  LINEA_CHECK(index >= 0 && index < count, "cuda_device_name: no CUDA device ", index, " (this machine has ", count,
              " device", count == 1 ? "" : "s", ", indices 0..", count - 1, ")");
  cudaDeviceProp prop{};
  LINEA_CUDA_CHECK(cudaGetDeviceProperties(&prop, index));
  return prop.name;
}

// ---- context: stream, cuBLAS, scratch buffers ----------------------------------------------------
namespace detail {

cudaStream_t stream() {
  // Created once, never destroyed: the driver reclaims it at exit, after which destroying it
  // from a static destructor could fail.
  static cudaStream_t s = [] {
    require_device("CUDA");
    LINEA_CUDA_CHECK(cudaSetDevice(0));
    cudaStream_t created = nullptr;
    LINEA_CUDA_CHECK(cudaStreamCreateWithFlags(&created, cudaStreamDefault));
    return created;
  }();
  return s;
}

// Device 0's properties, read once (selecting it first, or throwing without one).
static const cudaDeviceProp& device_properties() {
  static const cudaDeviceProp prop = [] {
    stream();
    cudaDeviceProp p{};
    LINEA_CUDA_CHECK(cudaGetDeviceProperties(&p, 0));
    return p;
  }();
  return prop;
}

int compute_capability() { return device_properties().major * 10 + device_properties().minor; }

size_t shared_memory_optin() { return device_properties().sharedMemPerBlockOptin; }

BlasWorkspace blas_workspace() {
  static const BlasWorkspace w = [] {
    const size_t bytes = (compute_capability() >= 90 ? size_t(32) : size_t(4)) << 20;
    LongLivedAllocations long_lived;
    return BlasWorkspace{allocator().allocate(bytes), bytes};
  }();
  return w;
}

cublasHandle_t cublas() {
  static cublasHandle_t h = [] {
    cudaStream_t s = stream();
    const CublasApi& api = cublas_api();
    cublasHandle_t created = nullptr;
    LINEA_CUBLAS_CHECK(api.cublasCreate(&created));
    LINEA_CUBLAS_CHECK(api.cublasSetStream(created, s));
    // Default math mode: full-precision float32 (no TF32), so results match the CPU path.
    LINEA_CUBLAS_CHECK(api.cublasSetMathMode(created, CUBLAS_DEFAULT_MATH));
    const BlasWorkspace w = blas_workspace();
    LINEA_CUBLAS_CHECK(api.cublasSetWorkspace(created, w.p, w.bytes));
    return created;
  }();
  return h;
}

DeviceBuffer::DeviceBuffer(size_t nbytes) {
  if (nbytes > 0) ptr_ = allocator().allocate(nbytes);
}

DeviceBuffer::~DeviceBuffer() {
  if (ptr_ != nullptr) allocator().deallocate(ptr_);
}

unsigned int* blocks_done_counter() {
  static unsigned int* p = [] {
    LongLivedAllocations long_lived;
    void* d = allocator().allocate(sizeof(unsigned int));
    count_work(counter_cells().device_copies);
    LINEA_CUDA_CHECK(cudaMemsetAsync(d, 0, sizeof(unsigned int), stream()));
    return static_cast<unsigned int*>(d);
  }();
  return p;
}

// ---- device error reports -----------------------------------------------------------------------
namespace {
DeviceErrorReport* host_error_report = nullptr;  // the same memory, host side

const char* device_error_op(int code) {
  switch (static_cast<DeviceErrorCode>(code)) {
    case DeviceErrorCode::IndexSelect:
      return "index_select";
    case DeviceErrorCode::IndexAdd:
      return "index_add";
    case DeviceErrorCode::Gather:
      return "gather";
    case DeviceErrorCode::ScatterAdd:
      return "scatter_add";
    case DeviceErrorCode::CrossEntropyTarget:
      return "cross_entropy";
    case DeviceErrorCode::EmbedTokens:
      return "embed_tokens";
    default:
      return "CUDA kernel";
  }
}
}  // namespace

DeviceErrorReport* device_error_report() {
  static DeviceErrorReport* dev = [] {
    stream();  // selects the device
    void* host = nullptr;
    LINEA_CUDA_CHECK(cudaHostAlloc(&host, sizeof(DeviceErrorReport), cudaHostAllocMapped));
    std::memset(host, 0, sizeof(DeviceErrorReport));
    void* d = nullptr;
    LINEA_CUDA_CHECK(cudaHostGetDevicePointer(&d, host, 0));
    host_error_report = static_cast<DeviceErrorReport*>(host);
    return static_cast<DeviceErrorReport*>(d);
  }();
  return dev;
}

void check_device_errors() {
  if (host_error_report == nullptr) return;  // no kernel could have reported
  volatile DeviceErrorReport* r = host_error_report;
  const int code = r->code;
  if (code == 0) return;
  const int64_t value = r->value, bound = r->bound;
  r->code = 0;
  if (static_cast<DeviceErrorCode>(code) == DeviceErrorCode::CrossEntropyTarget)
    LINEA_FAIL("cross_entropy: target value ", value, " is out of range for ", bound,
               " classes (found on the GPU; that row's loss and gradient were set to 0)");
  LINEA_FAIL(device_error_op(code), ": index ", value, " is out of range for a dim of size ", bound,
             " (found on the GPU: the elements it selected were set to 0, or its additions skipped)");
}

// ---- random ---------------------------------------------------------------------------------
RngState& rng() {
  static RngState* state = new RngState();  // leaked: generators outlive static destructors
  return *state;
}

curandGenerator_t generator_for_draw(uint64_t words) {
  refuse_in_capture("a cuRAND draw (e.g. performer's features redrawn every step)");
  RngState& r = rng();
  if (r.gen == nullptr) {
    cudaStream_t s = stream();
    curandGenerator_t g = nullptr;
    LINEA_CURAND_CHECK(curandCreateGenerator(&g, CURAND_RNG_PSEUDO_PHILOX4_32_10));
    LINEA_CURAND_CHECK(curandSetStream(g, s));
    r.gen = g;
    r.gen_seeded = false;
  }
  if (!r.gen_seeded || r.gen_seed != r.seed) {
    LINEA_CURAND_CHECK(curandSetPseudoRandomGeneratorSeed(r.gen, r.seed));
    r.gen_seed = r.seed;
    r.gen_seeded = true;
  }
  LINEA_CURAND_CHECK(curandSetGeneratorOffset(r.gen, r.offset));
  r.offset += (words + 3) / 4 * 4;
  return r.gen;
}

}  // namespace detail

// ---- memory ----------------------------------------------------------------------------------
void* raw_alloc(size_t nbytes) {
  require_device("CUDA allocation");
  detail::stream();  // selects the device
  void* p = nullptr;
  detail::bump(detail::counter_cells().device_allocs);
  cudaError_t err = cudaMalloc(&p, nbytes);
  if (err == cudaErrorMemoryAllocation) {
    (void)cudaGetLastError();
    size_t free_b = 0, total_b = 0;
    (void)cudaMemGetInfo(&free_b, &total_b);
    (void)cudaGetLastError();
    LINEA_FAIL("CUDA out of memory: tried to allocate ", nbytes, " bytes (", nbytes >> 20, " MiB); the device has ",
               free_b >> 20, " MiB free of ", total_b >> 20, " MiB");
  }
  LINEA_CUDA_CHECK(err);
  return p;
}

void raw_free(void* ptr) {
  if (ptr == nullptr) return;
  // Never throws: called from destructors. At process exit the runtime may already be gone.
  cudaError_t err = cudaFree(ptr);
  if (err != cudaSuccess && err != cudaErrorCudartUnloading) {
    (void)cudaGetLastError();
    std::fprintf(stderr, "linea: warning: cudaFree failed: %s (%s)\n", cudaGetErrorName(err), cudaGetErrorString(err));
  }
}

CachingAllocator& allocator() {
  // Deliberately leaked: tensors held in static objects may be released after static
  // destructors have run; the driver reclaims device memory at exit.
  static CachingAllocator* a = [] {
    auto* made = new CachingAllocator(raw_alloc, raw_free);
    made->set_caching(caching_wanted("LINEA_NO_CUDA_MEMORY_CACHING"));
    return made;
  }();
  return *a;
}

// ---- pinned memory, events and the H2D staging ring ------------------------------------------------
namespace {

void* raw_alloc_pinned(size_t nbytes) {
  detail::stream();  // selects the device
  void* p = nullptr;
  LINEA_CUDA_CHECK(cudaHostAlloc(&p, nbytes, cudaHostAllocDefault));
  return p;
}
void raw_free_pinned(void* ptr) {
  if (ptr != nullptr) (void)cudaFreeHost(ptr);
}

// Copies up to this size go through pinned staging; a larger one is rare (a whole dataset moved
// at once) and goes straight from pageable memory, which waits for the stream.
constexpr size_t kMaxStaged = size_t(64) << 20;
// Staging blocks in flight beyond this many bytes: wait for the oldest before staging more.
constexpr size_t kMaxInFlight = size_t(256) << 20;

// Staging blocks whose transfer is queued, each with the event recorded after it; a block goes
// back to the pinned allocator once its event has passed. Events are recycled.
struct StagingRing {
  std::mutex mu;
  struct InFlight {
    void* block;
    size_t nbytes;
    void* event;
  };
  std::deque<InFlight> in_flight;
  std::vector<void*> spare_events;
  size_t bytes = 0;

  void retire_front() {
    pinned_allocator().deallocate(in_flight.front().block);
    spare_events.push_back(in_flight.front().event);
    bytes -= in_flight.front().nbytes;
    in_flight.pop_front();
  }
  // Returns the blocks whose transfers are done; waits for the oldest while over the limit.
  void reclaim(size_t incoming) {
    while (!in_flight.empty() && event_query(in_flight.front().event)) retire_front();
    while (!in_flight.empty() && bytes + incoming > kMaxInFlight) {
      event_synchronize(in_flight.front().event);
      retire_front();
    }
  }
};
StagingRing& staging() {
  static StagingRing* ring = new StagingRing();  // leaked, like the allocators
  return *ring;
}

}  // namespace

CachingAllocator& pinned_allocator() {
  static CachingAllocator* a = new CachingAllocator(raw_alloc_pinned, raw_free_pinned);
  return *a;
}

void* event_create() {
  detail::stream();  // selects the device
  cudaEvent_t e = nullptr;
  LINEA_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  return e;
}

void event_destroy(void* event) {
  if (event != nullptr) (void)cudaEventDestroy(static_cast<cudaEvent_t>(event));
}

void event_record(void* event) { LINEA_CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(event), detail::stream())); }

bool event_query(void* event) {
  const cudaError_t err = cudaEventQuery(static_cast<cudaEvent_t>(event));
  if (err == cudaErrorNotReady) {
    (void)cudaGetLastError();  // not an error, but the runtime may keep it as the last one
    return false;
  }
  LINEA_CUDA_CHECK(err);
  detail::check_device_errors();  // the kernels before the event are done: their reports are in
  return true;
}

void event_synchronize(void* event) {
  detail::refuse_in_capture("waiting for an event");
  if (event_query(event)) return;
  detail::bump(detail::counter_cells().host_waits);
  LINEA_CUDA_CHECK(cudaEventSynchronize(static_cast<cudaEvent_t>(event)));
  detail::check_device_errors();
}

void memcpy_h2d(void* dst, const void* src, size_t nbytes) {
  if (nbytes == 0) return;
  detail::refuse_in_capture("a host-to-device copy");
  detail::bump(detail::counter_cells().h2d_copies);
  detail::bump(detail::counter_cells().h2d_bytes, static_cast<int64_t>(nbytes));
  if (nbytes > kMaxStaged) {
    // From pageable memory: returns once `src` has been read, after the stream drained.
    LINEA_CUDA_CHECK(cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyHostToDevice, detail::stream()));
    return;
  }
  StagingRing& ring = staging();
  std::lock_guard<std::mutex> lock(ring.mu);
  ring.reclaim(nbytes);
  void* block = pinned_allocator().allocate(nbytes);
  std::memcpy(block, src, nbytes);
  void* event = nullptr;
  try {
    LINEA_CUDA_CHECK(cudaMemcpyAsync(dst, block, nbytes, cudaMemcpyHostToDevice, detail::stream()));
    if (ring.spare_events.empty()) ring.spare_events.push_back(event_create());
    event = ring.spare_events.back();
    ring.spare_events.pop_back();
    event_record(event);
  } catch (...) {
    if (event) ring.spare_events.push_back(event);
    // The copy may be queued: keep the block out of circulation rather than reuse it early.
    throw;
  }
  ring.in_flight.push_back({block, nbytes, event});
  ring.bytes += nbytes;
}

void memcpy_d2h(void* dst, const void* src, size_t nbytes) {
  if (nbytes == 0) return;
  detail::refuse_in_capture("a device-to-host copy (reading a device value on the host)");
  cudaStream_t s = detail::stream();
  detail::bump(detail::counter_cells().d2h_copies);
  detail::bump(detail::counter_cells().d2h_bytes, static_cast<int64_t>(nbytes));
  detail::bump(detail::counter_cells().host_syncs);
  LINEA_CUDA_CHECK(cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyDeviceToHost, s));
  LINEA_CUDA_CHECK(cudaStreamSynchronize(s));  // the host reads dst next
  detail::check_device_errors();
}

void memcpy_d2h_async(void* dst, const void* src, size_t nbytes) {
  if (nbytes == 0) return;
  detail::refuse_in_capture("a device-to-host copy");
  detail::bump(detail::counter_cells().d2h_copies);
  detail::bump(detail::counter_cells().d2h_bytes, static_cast<int64_t>(nbytes));
  LINEA_CUDA_CHECK(cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyDeviceToHost, detail::stream()));
}

void memcpy_d2d(void* dst, const void* src, size_t nbytes) {
  if (nbytes == 0) return;
  detail::count_work(detail::counter_cells().device_copies);
  LINEA_CUDA_CHECK(cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyDeviceToDevice, detail::stream()));
}

void synchronize() {
  if (!is_available()) return;  // no device: nothing can be pending
  detail::refuse_in_capture("a synchronization");
  detail::bump(detail::counter_cells().host_syncs);
  LINEA_CUDA_CHECK(cudaStreamSynchronize(detail::stream()));
  detail::check_device_errors();
}

// ---- generator state (no CUDA call: works, and is harmless, without a device) -------------------
void manual_seed(uint64_t seed) {
  detail::RngState& r = detail::rng();
  std::lock_guard<std::mutex> lock(r.mu);
  r.seed = seed;
  r.offset = 0;
}

std::vector<uint64_t> rng_state() {
  detail::RngState& r = detail::rng();
  std::lock_guard<std::mutex> lock(r.mu);
  return {r.seed, r.offset};
}

void set_rng_state(const std::vector<uint64_t>& state) {
  LINEA_CHECK(state.size() == 2, "set_rng_state(cuda): expected {seed, offset} (2 values), got ", state.size(),
              " values");
  detail::RngState& r = detail::rng();
  std::lock_guard<std::mutex> lock(r.mu);
  r.seed = state[0];
  r.offset = state[1];
}

}  // namespace linea::cuda
