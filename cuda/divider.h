// Division by a divisor fixed at launch, as a multiply-high, an add and a shift (Granlund and
// Montgomery's method; PyTorch's IntDivider is the same): a 64-bit division on a GPU is a
// software routine of tens of instructions, which an elementwise pass that moves a few bytes an
// element pays for every dimension of its index. Exact for dividends below 2^31 and divisors
// 1..2^31. Plain C++ (host and device), so CPU tests check it against the / operator.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define LINEA_HOST_DEVICE __host__ __device__
#else
#define LINEA_HOST_DEVICE
#endif

namespace linea::cuda::detail {

struct Divider {
  uint32_t divisor = 1, magic = 1, shift = 0;

  Divider() = default;
  explicit Divider(uint32_t d) : divisor(d) {
    while (shift < 32 && (uint64_t{1} << shift) < d) ++shift;  // 2^shift >= d: the smallest such
    // magic = floor(2^32 (2^shift - d) / d) + 1, below 2^32 since 2^shift < 2d
    magic = static_cast<uint32_t>(((uint64_t{1} << 32) * ((uint64_t{1} << shift) - d)) / d + 1);
  }

  // n / divisor for n < 2^31 (t + n then stays below 2^32).
  LINEA_HOST_DEVICE uint32_t div(uint32_t n) const {
#if defined(__CUDA_ARCH__)
    const uint32_t t = __umulhi(n, magic);
#else
    const uint32_t t = static_cast<uint32_t>((uint64_t{n} * magic) >> 32);
#endif
    return (t + n) >> shift;
  }
};

}  // namespace linea::cuda::detail

#undef LINEA_HOST_DEVICE
