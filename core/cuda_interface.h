// What core needs from the CUDA backend beyond the kernel list in core/kernels.h:
// memory, copies between host and device, synchronization, the device's generator.
// Implemented in cuda/ when LINEA_WITH_CUDA is defined; otherwise nothing here is called,
// because no CUDA tensor can be created (allocation throws first).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "core/allocator.h"

namespace linea::cuda {

bool is_available();  // never throws
int device_count();   // 0 without a driver or GPU
// cudaDeviceProp::name of device `index`; throws linea::Error without a usable device or for
// an index outside [0, device_count()).
std::string device_name(int index);
void* raw_alloc(size_t nbytes);
void raw_free(void* ptr);
CachingAllocator& allocator();
// Host -> device without waiting for the device: `src` is copied into pinned staging memory at
// once (the caller may reuse it on return) and the transfer is queued on the stream. (A plain
// cudaMemcpyAsync from pageable memory waits for the stream to drain first.)
void memcpy_h2d(void* dst, const void* src, size_t nbytes);
// Device -> host, waiting for the stream (the host reads dst next): a host synchronization.
void memcpy_d2h(void* dst, const void* src, size_t nbytes);
// Device -> pinned host memory (from pinned_allocator()), queued on the stream; record an event
// after it and query or wait for that event before reading dst.
void memcpy_d2h_async(void* dst, const void* src, size_t nbytes);
void memcpy_d2d(void* dst, const void* src, size_t nbytes);
void synchronize();
// Page-locked host memory for asynchronous copies (cudaHostAlloc behind a caching allocator).
CachingAllocator& pinned_allocator();
// Events on the stream (opaque handles): record after queued work, then ask or wait.
void* event_create();
void event_destroy(void* event);
void event_record(void* event);
bool event_query(void* event);        // done? never blocks (checks kernels' error reports when done)
void event_synchronize(void* event);  // waits unless already done (counted as a host wait)
// CUDA graphs (core/cuda_graph.h): the stream's work between begin and end is captured
// (relaxed mode) and instantiated; launch replays it; destroy frees it. While capturing, copies
// between host and device, synchronizations and cuRAND draws throw linea::Error.
void graph_capture_begin();
void* graph_capture_end(bool instantiate);  // the instantiated graph (opaque); null when !instantiate
void graph_launch(void* exec);
void graph_destroy(void* exec);
bool graph_capturing();
void manual_seed(uint64_t seed);
std::vector<uint64_t> rng_state();  // {seed, offset}
void set_rng_state(const std::vector<uint64_t>& state);

}  // namespace linea::cuda
