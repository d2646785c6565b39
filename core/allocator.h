// Caching allocators. A training step allocates and frees the same sizes over and over;
// going to malloc/cudaMalloc each time costs more than many kernels. Freed blocks are kept
// in size-class free lists and handed out again. With one CUDA stream, device work is
// stream-ordered, so a block freed on the host can be reused by the next launch at once.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <vector>

namespace linea {

struct AllocatorStats {
  size_t allocated_bytes = 0;       // bytes in live blocks (rounded sizes)
  size_t peak_allocated_bytes = 0;  // high-water mark of allocated_bytes
  size_t cached_bytes = 0;          // bytes held in free lists
  size_t num_raw_allocs = 0;        // calls that went to the underlying allocator
  size_t num_allocs = 0;            // all allocation requests
};

class CachingAllocator {
 public:
  using RawAlloc = void* (*)(size_t);
  using RawFree = void (*)(void*);
  CachingAllocator(RawAlloc raw_alloc, RawFree raw_free) : raw_alloc_(raw_alloc), raw_free_(raw_free) {}
  ~CachingAllocator();  // intentionally leaks at process exit only if raw_free is unsafe then
  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;

  void* allocate(size_t nbytes);
  void deallocate(void* ptr);
  // Returns all cached (free) blocks to the underlying allocator.
  void empty_cache();
  AllocatorStats stats() const;
  void reset_peak();

  // Size classes: round up to 512 bytes below 1 MiB, to 1/8 of the power of two above.
  static size_t round_size(size_t nbytes);

 private:
  RawAlloc raw_alloc_;
  RawFree raw_free_;
  mutable std::mutex mu_;
  std::multimap<size_t, void*> free_;  // size -> block
  std::map<void*, size_t> live_;       // block -> size
  AllocatorStats stats_;
};

CachingAllocator& cpu_allocator();

}  // namespace linea
