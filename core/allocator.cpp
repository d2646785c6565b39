// The caching allocator and the CPU instance of it.
#include "core/allocator.h"

#include <cstdlib>
#include <new>

#include "core/error.h"

namespace linea {

size_t CachingAllocator::round_size(size_t nbytes) {
  if (nbytes == 0) nbytes = 1;
  if (nbytes < (1u << 20)) return (nbytes + 511) / 512 * 512;
  size_t p = 1;
  while (p < nbytes) p <<= 1;
  size_t step = p / 8;
  return (nbytes + step - 1) / step * step;
}

CachingAllocator::~CachingAllocator() {
  // Process exit: the CUDA runtime may already be torn down, so only the CPU allocator
  // returns memory here; device memory goes back with the process.
}

void* CachingAllocator::allocate(size_t nbytes) {
  size_t size = round_size(nbytes);
  std::lock_guard<std::mutex> lock(mu_);
  stats_.num_allocs++;
  void* ptr = nullptr;
  auto it = free_.find(size);
  if (it != free_.end()) {
    ptr = it->second;
    free_.erase(it);
    stats_.cached_bytes -= size;
  } else {
    try {
      ptr = raw_alloc_(size);
    } catch (const Error&) {
      ptr = nullptr;
    }
    if (!ptr) {  // out of memory: give the cache back and try once more (this one may throw)
      for (auto& kv : free_) raw_free_(kv.second);
      free_.clear();
      stats_.cached_bytes = 0;
      ptr = raw_alloc_(size);
    }
    LINEA_CHECK(ptr != nullptr, "allocate: out of memory allocating ", size, " bytes (", stats_.allocated_bytes,
                " bytes in use)");
    stats_.num_raw_allocs++;
  }
  live_[ptr] = size;
  stats_.allocated_bytes += size;
  if (stats_.allocated_bytes > stats_.peak_allocated_bytes) stats_.peak_allocated_bytes = stats_.allocated_bytes;
  return ptr;
}

void CachingAllocator::deallocate(void* ptr) {
  if (!ptr) return;
  std::lock_guard<std::mutex> lock(mu_);
  auto it = live_.find(ptr);
  if (it == live_.end()) return;  // not ours: a bug elsewhere, but never free twice
  size_t size = it->second;
  live_.erase(it);
  stats_.allocated_bytes -= size;
  stats_.cached_bytes += size;
  free_.emplace(size, ptr);
}

void CachingAllocator::empty_cache() {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& kv : free_) raw_free_(kv.second);
  free_.clear();
  stats_.cached_bytes = 0;
}

AllocatorStats CachingAllocator::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

void CachingAllocator::reset_peak() {
  std::lock_guard<std::mutex> lock(mu_);
  stats_.peak_allocated_bytes = stats_.allocated_bytes;
}

namespace {
// 64-byte alignment: cache lines and AVX-512 loads.
void* cpu_raw_alloc(size_t n) { return std::aligned_alloc(64, (n + 63) / 64 * 64); }
void cpu_raw_free(void* p) { std::free(p); }
}  // namespace

CachingAllocator& cpu_allocator() {
  // Leaked on purpose: tensors with static storage duration may outlive any static allocator.
  static CachingAllocator* a = new CachingAllocator(cpu_raw_alloc, cpu_raw_free);
  return *a;
}

}  // namespace linea
