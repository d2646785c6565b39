// Force-included into cuda/*.cu compiled as C++ by g++ (tests/cuda_emu/run.sh): CUDA built-ins on the
// host. Blocks run one after another; the threads of a block are fibers switched at __syncthreads.
#pragma once
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>
#include <tuple>
#include <utility>

extern uint3 threadIdx;
extern uint3 blockIdx;
extern dim3 blockDim;
extern dim3 gridDim;

#define __launch_bounds__(...)  // occupancy hints mean nothing on the host
void __syncthreads();
void __syncwarp(unsigned mask = 0xffffffffu);
namespace emu {
void warp_exchange(const void* mine, void* all, size_t bytes);
// mma.sync.m16n8k16.row.col.f32.bf16.bf16.f32 (d += A B) in the PTX ISA's fragment layouts.
void mma_bf16_m16n8k16(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]);
void mma_tf32_m16n8k8(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]);
// d += A_big B_small, then A_small B_big, then A_big B_big: three mma_tf32_m16n8k8 with one
// gathering of the warp's fragments instead of three (the emulator's cost is the gathering).
void mma_tf32x3_m16n8k8(float (&d)[4], const uint32_t (&ab)[4], const uint32_t (&as)[4], const uint32_t (&bb)[2],
                        const uint32_t (&bs)[2]);
// ldmatrix.sync.aligned.m8n8.x4[.trans].shared.b16 (lane l gives row l % 8 of matrix l / 8).
void ldmatrix_x4(uint32_t (&r)[4], const void* row, bool trans);
// cp.async of `bytes` from src (zeros where null) to dst, landing at the cp_async_wait that
// completes its commit group (cuda/mma.cuh's cp_async, cp_async_commit, cp_async_wait<n>).
void cp_async(void* dst, const void* src, int bytes);
void cp_async_commit();
void cp_async_wait(int n);
}  // namespace emu
// Warp shuffles over the full warp (every lane calls them, as in Linea's kernels).
template <typename T> inline T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int = 32) {
  if (mask != 0xffffffffu) std::abort();
  T all[32];
  emu::warp_exchange(&v, all, sizeof(T));
  const unsigned lane = (threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z)) % 32;
  return all[lane ^ static_cast<unsigned>(lane_mask)];
}
template <typename T> inline T __shfl_sync(unsigned mask, T v, int src, int = 32) {
  if (mask != 0xffffffffu) std::abort();
  T all[32];
  emu::warp_exchange(&v, all, sizeof(T));
  return all[static_cast<unsigned>(src) % 32];
}
template <typename T> inline T __shfl_up_sync(unsigned mask, T v, unsigned delta, int = 32) {
  if (mask != 0xffffffffu) std::abort();
  T all[32];
  emu::warp_exchange(&v, all, sizeof(T));
  const unsigned lane = (threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z)) % 32;
  return lane >= delta ? all[lane - delta] : v;
}
inline unsigned __ballot_sync(unsigned mask, int pred) {
  if (mask != 0xffffffffu) std::abort();
  int all[32];
  emu::warp_exchange(&pred, all, sizeof(int));
  unsigned bits = 0;
  for (unsigned l = 0; l < 32; ++l) bits |= all[l] ? 1u << l : 0u;
  return bits;
}
inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline int __clz(unsigned x) { return x ? __builtin_clz(x) : 32; }
inline int __ffs(int x) { return __builtin_ffs(x); }
inline void __threadfence_system() {}
inline void __threadfence() {}
inline float atomicAdd(float* p, float v) { float o = *p; *p = o + v; return o; }
inline double atomicAdd(double* p, double v) { double o = *p; *p = o + v; return o; }
inline unsigned int atomicAdd(unsigned int* p, unsigned int v) {
  unsigned int o = *p;
  *p = o + v;
  return o;
}
inline unsigned long long atomicAdd(unsigned long long* p, unsigned long long v) {
  unsigned long long o = *p; *p = o + v; return o;
}
template <typename T> inline T min(T a, T b) { return b < a ? b : a; }
template <typename T> inline T max(T a, T b) { return a < b ? b : a; }
using std::isfinite;
using std::isinf;

namespace emu {
// cuda/common.cuh's kMaxBlocks on the emulator, the cap of grid_for's grids: EMU_MAX_BLOCKS=N
// caps them at N blocks, so every grid-stride loop takes several turns.
int64_t max_blocks();
// Runs the grid now, or records it when a stream capture is on (replayed by cudaGraphLaunch).
void submit_grid(const void* kernel, dim3 grid, dim3 block, size_t smem, std::function<void()> body);

template <typename... KArgs>
struct Launch {
  void (*k)(KArgs...);
  dim3 grid, block;
  size_t smem;
  template <typename... A>
  void operator()(A&&... a) const {
    // By value, as a kernel launch copies its arguments (kept for as long as a captured graph).
    auto args = std::make_shared<std::tuple<KArgs...>>(std::forward<A>(a)...);
    void (*kernel)(KArgs...) = k;
    submit_grid(reinterpret_cast<const void*>(kernel), grid, block, smem,
                [kernel, args] { std::apply(kernel, *args); });
  }
};
template <typename... KArgs>
Launch<KArgs...> launch(void (*k)(KArgs...), dim3 grid, dim3 block, size_t smem = 0, cudaStream_t = nullptr) {
  return Launch<KArgs...>{k, grid, block, smem};
}
}  // namespace emu
