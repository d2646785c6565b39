// Scratch memory of one CPU kernel call, taken from the caching allocator as one tensor (so that
// the allocator's peak, which the benchmarks report, counts it) before any parallel region (an
// allocation failure then throws on the calling thread, never inside OpenMP). Carved into
// pieces aligned to 64 bytes, which FFTW's plans and AVX loads are content with.
// Internal to core/cpu.
#pragma once

#include <algorithm>
#include <cstdint>

#include "core/tensor.h"

namespace linea::cpu::detail {

template <typename T> class Workspace {
 public:
  static constexpr int64_t kAlign = 64 / static_cast<int64_t>(sizeof(T));  // elements per 64 bytes
  // Room for pieces of the given total size (each rounded up to kAlign elements: pass the sum of
  // rounded(n) over the pieces, see rounded()).
  explicit Workspace(int64_t elements)
      : buf_(empty({std::max<int64_t>(elements, 1)}, TensorOptions(DTypeOf<T>::value))),
        base_(buf_.data<T>()),
        size_(std::max<int64_t>(elements, 1)) {}
  static int64_t rounded(int64_t n) { return (std::max<int64_t>(n, 1) + kAlign - 1) / kAlign * kAlign; }
  // The next piece of n elements (not thread-safe: carve before the parallel region).
  T* take(int64_t n) {
    const int64_t r = rounded(n);
    LINEA_CHECK(used_ + r <= size_, "Workspace: ", r, " more elements past ", used_, " of ", size_);
    T* p = base_ + used_;
    used_ += r;
    return p;
  }

 private:
  Tensor buf_;
  T* base_;
  int64_t size_;
  int64_t used_ = 0;
};

}  // namespace linea::cpu::detail
