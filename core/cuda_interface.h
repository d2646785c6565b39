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
void memcpy_h2d(void* dst, const void* src, size_t nbytes);
void memcpy_d2h(void* dst, const void* src, size_t nbytes);
void memcpy_d2d(void* dst, const void* src, size_t nbytes);
void synchronize();
void manual_seed(uint64_t seed);
std::vector<uint64_t> rng_state();  // {seed, offset}
void set_rng_state(const std::vector<uint64_t>& state);

}  // namespace linea::cuda
