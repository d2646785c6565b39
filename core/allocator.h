// Caching allocators. A training step allocates and frees the same sizes over and over;
// going to malloc/cudaMalloc each time costs more than many kernels. Freed blocks are kept
// in size-class free lists and handed out again. With one CUDA stream, device work is
// stream-ordered, so a block freed on the host can be reused by the next launch at once.
//
// A memory limit (set_limit) caps the bytes the allocator holds: live blocks plus the cache.
// A new block that would not fit first returns cached blocks to the system (largest first);
// one that would take the live bytes past the limit empties the cache and throws linea::Error
// "out of memory: allocating 1.50 GiB would exceed the limit of 16.0 GiB (15.2 GiB in use)",
// leaving the allocator as it was (the failed request is not counted anywhere), so the caller
// can free its tensors and go on. Benchmarks use it to tell "does not fit" on a shared machine
// without the OS killing the process.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
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
  // Caps allocated_bytes + cached_bytes at `bytes` (0: no limit, the default); see the top of
  // this file. A limit below what is already live only affects later allocations.
  void set_limit(size_t bytes);
  size_t limit() const;
  // Off: each request outside a private pool is a raw block of the size asked, given back at
  // once when freed (as PYTORCH_NO_CUDA_MEMORY_CACHING): a memory checker (ASan on the CPU and
  // the CUDA emulator, compute-sanitizer on a GPU) then sees each buffer's own bounds, every use
  // of a freed one, and (on the emulator, whose fresh memory is NaN) every read of memory that
  // nothing wrote. On by default.
  void set_caching(bool on);
  bool caching() const;

  // Size classes: round up to 512 bytes below 1 MiB, to 1/8 of the power of two above.
  static size_t round_size(size_t nbytes);

  // Private pools, for CUDA graphs (core/cuda_graph.h): while a pool is selected, requests are
  // served from that pool's free blocks (or new ones), and a block allocated in a pool goes back
  // to it when freed, never to the shared cache. A captured graph replays its kernels on the
  // addresses it captured, which nothing outside it may be given in the meantime.
  // release_pool hands the pool's free blocks to the shared cache, and its live ones when freed.
  int create_pool();
  void select_pool(int id);  // 0: the shared cache (the default)
  int selected_pool() const;
  void release_pool(int id);

 private:
  struct Live {
    size_t size;
    int pool;  // 0: the shared cache
  };
  RawAlloc raw_alloc_;
  RawFree raw_free_;
  mutable std::mutex mu_;
  std::multimap<size_t, void*> free_;                  // size -> block (the shared cache)
  std::map<int, std::multimap<size_t, void*>> pools_;  // a private pool's free blocks
  std::map<void*, Live> live_;                         // block -> size and pool
  AllocatorStats stats_;
  size_t limit_ = 0;  // 0: none
  bool caching_ = true;
  int pool_ = 0, next_pool_ = 1;

  void release_cached_locked();                 // every free block back to raw_free_
  void release_cached_until_locked(size_t need);  // largest first, until held + need <= limit_
};

// The CPU's allocator. LINEA_NO_CPU_MEMORY_CACHING=1 turns its cache off (set_caching), for
// ASan: each tensor then a block of its own exact size, freed at once.
CachingAllocator& cpu_allocator();

// Whether an allocator's environment switch (LINEA_NO_CPU_MEMORY_CACHING,
// LINEA_NO_CUDA_MEMORY_CACHING) leaves caching on: everything but "1" does.
bool caching_wanted(const char* no_caching_switch);

// Within its scope, this thread's allocations are long-lived (optimizer state, counters): each
// gets a block of its own rather than a cached one. A cached block is one a training step's
// temporaries freed and will ask for again at the next step; were the optimizer's state,
// created during the first step, to take such blocks, the second step would have to allocate
// anew. With this guard the first step is the only one that allocates. Nests.
class LongLivedAllocations {
 public:
  LongLivedAllocations();
  ~LongLivedAllocations();
  LongLivedAllocations(const LongLivedAllocations&) = delete;
  LongLivedAllocations& operator=(const LongLivedAllocations&) = delete;
};

// A byte count for people: "512 B", "3.0 KiB", "12.5 MiB", "1.50 GiB".
std::string format_bytes(size_t bytes);

}  // namespace linea
