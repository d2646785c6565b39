// Counters of what a program asks of the CUDA device: kernel launches, library calls, graph
// launches, host synchronizations, device allocations and host<->device copies. They are the
// figures a training step can be driven down by on a machine without a GPU: the host emulator
// (tests/cuda_emu) runs the same cuda/ sources, so it counts the same things.
//
//   const cuda::Counters before = cuda::counters();
//   ... one training step ...
//   const cuda::Counters step = cuda::counters() - before;   // step.kernel_launches, ...
//
// The counts live in core, so they read as zeros in a build without the CUDA backend or on a
// program that never touches the GPU. Incremented with relaxed atomics (any thread may copy).
// Not a profiler: no times here (apps' --profile adds the host time of a step; ncu and nsys
// time the kernels themselves).
#pragma once

#include <atomic>
#include <cstdint>
#include <string>

namespace linea::cuda {

struct Counters {
  int64_t kernel_launches = 0;            // Linea's own kernels (every <<<...>>> in cuda/)
  int64_t library_calls = 0;              // cuBLAS GEMMs, cuFFT transforms, cuRAND draws (not handles or plans)
  int64_t graph_launches = 0;             // cudaGraphLaunch of a captured step
  int64_t host_syncs = 0;                 // the host drained the stream (a synchronization, a blocking copy)
  int64_t host_waits = 0;                 // the host waited on an event of work queued earlier (the readback of
                                          // a step two steps back, a staging block): back-pressure while the
                                          // device runs behind, the work queued after the event stays queued
  int64_t device_allocs = 0;              // cudaMalloc calls: the caching allocator's misses
  int64_t device_copies = 0;              // device-to-device copies and memsets (stream work that is not a kernel)
  int64_t h2d_copies = 0, h2d_bytes = 0;  // host -> device
  int64_t d2h_copies = 0, d2h_bytes = 0;  // device -> host

  // What the stream was given: kernels, library calls, device copies and host<->device copies
  // (a library call launches one kernel or more of its own: ncu counts those).
  int64_t stream_ops() const { return kernel_launches + library_calls + device_copies + h2d_copies + d2h_copies; }

  Counters operator-(const Counters& o) const;
  // "312 launches, 41 library calls, 0 graph launches, 0 syncs, 0 waits, 0 allocations, 3 device
  // copies, 1 H2D copy (401920 B), 1 D2H copy (24 B)"
  std::string str() const;
};

// The totals since the process started.
Counters counters();

namespace detail {
// Incremented by cuda/ (and the host emulator's run of it).
struct CounterCells {
  std::atomic<int64_t> kernel_launches{0}, library_calls{0}, graph_launches{0}, host_syncs{0}, host_waits{0},
      device_allocs{0}, device_copies{0}, h2d_copies{0}, h2d_bytes{0}, d2h_copies{0}, d2h_bytes{0};
};
CounterCells& counter_cells();
inline void bump(std::atomic<int64_t>& cell, int64_t n = 1) { cell.fetch_add(n, std::memory_order_relaxed); }
}  // namespace detail

}  // namespace linea::cuda
