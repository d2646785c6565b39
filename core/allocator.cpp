// The caching allocator and the CPU instance of it.
#include "core/allocator.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <new>

#include "core/error.h"

namespace linea {

namespace {
thread_local int long_lived_depth = 0;  // LongLivedAllocations in scope on this thread
}

LongLivedAllocations::LongLivedAllocations() { ++long_lived_depth; }
LongLivedAllocations::~LongLivedAllocations() { --long_lived_depth; }

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
  std::lock_guard<std::mutex> lock(mu_);
  const bool cached = caching_ || pool_ != 0;
  const size_t size = cached ? round_size(nbytes) : std::max<size_t>(nbytes, 1);
  // The limit is checked before anything changes: a refused request leaves every list and
  // counter as it was (only the cache is handed back, which the limit wants anyway).
  if (limit_ != 0 && (size > limit_ || stats_.allocated_bytes > limit_ - size)) {
    release_cached_locked();
    LINEA_FAIL("out of memory: allocating ", format_bytes(size), " would exceed the limit of ", format_bytes(limit_),
               " (", format_bytes(stats_.allocated_bytes), " in use)");
  }
  stats_.num_allocs++;
  void* ptr = nullptr;
  std::multimap<size_t, void*>& from = pool_ == 0 ? free_ : pools_[pool_];
  auto it = long_lived_depth > 0 ? from.end() : from.find(size);  // (empty when not caching)
  if (it != from.end()) {
    ptr = it->second;
    from.erase(it);
    stats_.cached_bytes -= size;
  } else {
    // A new block: under a limit, make room in what the allocator holds (live + cached) first.
    if (limit_ != 0) release_cached_until_locked(size);
    try {
      ptr = raw_alloc_(size);
    } catch (const Error&) {
      ptr = nullptr;
    }
    if (!ptr) {  // out of memory: give the cache back and try once more (this one may throw)
      release_cached_locked();
      ptr = raw_alloc_(size);
    }
    LINEA_CHECK(ptr != nullptr, "allocate: out of memory allocating ", size, " bytes (", stats_.allocated_bytes,
                " bytes in use)");
    stats_.num_raw_allocs++;
  }
  live_[ptr] = Live{size, pool_};
  stats_.allocated_bytes += size;
  if (stats_.allocated_bytes > stats_.peak_allocated_bytes) stats_.peak_allocated_bytes = stats_.allocated_bytes;
  return ptr;
}

void CachingAllocator::deallocate(void* ptr) {
  if (!ptr) return;
  std::lock_guard<std::mutex> lock(mu_);
  auto it = live_.find(ptr);
  if (it == live_.end()) return;  // not ours: a bug elsewhere, but never free twice
  const Live block = it->second;
  live_.erase(it);
  stats_.allocated_bytes -= block.size;
  auto pool = block.pool == 0 ? pools_.end() : pools_.find(block.pool);
  if (pool == pools_.end() && !caching_) return raw_free_(ptr);
  stats_.cached_bytes += block.size;
  (pool == pools_.end() ? free_ : pool->second).emplace(block.size, ptr);
}

int CachingAllocator::create_pool() {
  std::lock_guard<std::mutex> lock(mu_);
  const int id = next_pool_++;
  pools_[id];
  return id;
}

void CachingAllocator::select_pool(int id) {
  std::lock_guard<std::mutex> lock(mu_);
  LINEA_CHECK(id == 0 || pools_.count(id), "allocator: no pool ", id, " (released, or never created)");
  pool_ = id;
}

int CachingAllocator::selected_pool() const {
  std::lock_guard<std::mutex> lock(mu_);
  return pool_;
}

void CachingAllocator::release_pool(int id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto pool = pools_.find(id);
  if (pool == pools_.end()) return;
  free_.insert(pool->second.begin(), pool->second.end());
  pools_.erase(pool);  // its live blocks go to the shared cache when freed
  if (pool_ == id) pool_ = 0;
  if (!caching_) release_cached_locked();
}

void CachingAllocator::set_caching(bool on) {
  std::lock_guard<std::mutex> lock(mu_);
  caching_ = on;
  if (!on) release_cached_locked();
}

bool CachingAllocator::caching() const {
  std::lock_guard<std::mutex> lock(mu_);
  return caching_;
}

void CachingAllocator::empty_cache() {
  std::lock_guard<std::mutex> lock(mu_);
  release_cached_locked();
}

void CachingAllocator::release_cached_locked() {
  // The shared cache only: private pools keep their blocks for their graphs.
  for (auto& kv : free_) {
    raw_free_(kv.second);
    stats_.cached_bytes -= kv.first;
  }
  free_.clear();
}

void CachingAllocator::release_cached_until_locked(size_t need) {
  while (!free_.empty() && stats_.allocated_bytes + stats_.cached_bytes + need > limit_) {
    auto largest = std::prev(free_.end());
    raw_free_(largest->second);
    stats_.cached_bytes -= largest->first;
    free_.erase(largest);
  }
}

void CachingAllocator::set_limit(size_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  limit_ = bytes;
  // Keep the cache within the new limit too (live blocks stay: they belong to tensors).
  if (limit_ != 0) release_cached_until_locked(0);
}

size_t CachingAllocator::limit() const {
  std::lock_guard<std::mutex> lock(mu_);
  return limit_;
}

AllocatorStats CachingAllocator::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

void CachingAllocator::reset_peak() {
  std::lock_guard<std::mutex> lock(mu_);
  stats_.peak_allocated_bytes = stats_.allocated_bytes;
}

std::string format_bytes(size_t bytes) {
  char buf[48];
  const double b = static_cast<double>(bytes);
  if (bytes < 1024)
    std::snprintf(buf, sizeof buf, "%zu B", bytes);
  else if (bytes < (size_t{1} << 20))
    std::snprintf(buf, sizeof buf, "%.1f KiB", b / 1024.0);
  else if (bytes < (size_t{1} << 30))
    std::snprintf(buf, sizeof buf, "%.1f MiB", b / (1024.0 * 1024.0));
  else
    std::snprintf(buf, sizeof buf, "%.2f GiB", b / (1024.0 * 1024.0 * 1024.0));
  return buf;
}

bool caching_wanted(const char* no_caching_switch) {
  const char* s = std::getenv(no_caching_switch);
  return s == nullptr || std::strcmp(s, "1") != 0;
}

namespace {
// 64-byte alignment: cache lines and AVX-512 loads. The size as asked (posix_memalign takes any):
// without the cache, ASan then knows where each tensor's bytes end.
void* cpu_raw_alloc(size_t n) {
  void* p = nullptr;
  return posix_memalign(&p, 64, n) == 0 ? p : nullptr;
}
void cpu_raw_free(void* p) { std::free(p); }
}  // namespace

CachingAllocator& cpu_allocator() {
  // Leaked on purpose: tensors with static storage duration may outlive any static allocator.
  static CachingAllocator* a = [] {
    auto* made = new CachingAllocator(cpu_raw_alloc, cpu_raw_free);
    made->set_caching(caching_wanted("LINEA_NO_CPU_MEMORY_CACHING"));
    return made;
  }();
  return *a;
}

}  // namespace linea
