// Warp-level tensor-core products (mma.sync, sm_80+) and asynchronous tile copies (cp.async) for
// kernels that keep their tiles in registers (cuda/attention.cu; the quad reductions of their
// accumulator rows: common.cuh).
//
// mma.sync.m16n8k16 with bf16 inputs and float32 accumulation, in the PTX ISA's fragment
// layouts. With g = lane / 4 and t = lane % 4:
//   A [16 x 16], 4 registers of two bf16 (low half = lower column):
//     a[0] = A[g][2t, 2t+1]   a[1] = A[g+8][2t, 2t+1]   a[2] = A[g][2t+8, +9]   a[3] = A[g+8][2t+8, +9]
//   B [16 x 8], 2 registers:  b[0] = B[2t, 2t+1][g]     b[1] = B[2t+8, 2t+9][g]
//   C, D [16 x 8] float:      d[0], d[1] = D[g][2t, 2t+1]   d[2], d[3] = D[g+8][2t, 2t+1]
// So the accumulators of two neighbouring 8-column tiles are, rounded, one A fragment: what
// FlashAttention-2 uses to feed its probabilities to the second product without shared memory.
//
// mma.sync.m16n8k8 with tf32 inputs (float32 bits; the tensor cores read the top 19) and float32
// accumulation:
//   A [16 x 8]:  a[0] = A[g][t]   a[1] = A[g+8][t]   a[2] = A[g][t+4]   a[3] = A[g+8][t+4]
//   B [8 x 8]:   b[0] = B[t][g]   b[1] = B[t+4][g]
//   C, D as above.
// The host emulator (tests/cuda_emu) implements the same layouts by gathering the warp's lanes.
#pragma once

#include <cstdint>
#include <cstring>

#include "cuda/common.cuh"

#if !defined(LINEA_CUDA_EMULATOR)
#include <cuda_bf16.h>
#endif

namespace linea::cuda::detail {

// Two floats rounded to bf16 (to nearest even), lo in the low half.
__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
#if defined(LINEA_CUDA_EMULATOR)
  auto round = [](float f) -> uint32_t {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0u;  // NaN stays NaN
    return (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  };
  return round(lo) | (round(hi) << 16);
#else
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  uint32_t u;
  std::memcpy(&u, &v, 4);
  return u;
#endif
}

// A float's bits and back.
__device__ __forceinline__ uint32_t float_bits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  return u;
}
__device__ __forceinline__ float bits_to_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
// The bits of x rounded to TF32 (10 mantissa bits; to nearest, ties away from zero, as
// cvt.rna.tf32.f32), in two integer operations.
__device__ __forceinline__ uint32_t round_tf32(float x) { return (float_bits(x) + 0x1000u) & 0xffffe000u; }

// Asynchronous copies global -> shared (cp.async, sm_80+) of BYTES (16, or 4), or as many zero
// bytes when !in (src is then not read). A thread's copies land by cp_async_wait<N>() (all but its
// N most recent commit groups); the block sees them after the __syncthreads() that follows. On
// the emulator too: a copy lands at the wait that completes its group (tests/cuda_emu).
template <int BYTES> __device__ __forceinline__ void cp_async(void* dst, const void* src, bool in) {
  static_assert(BYTES == 16 || BYTES == 4, "cp.async copies 4, 8 or 16 bytes; Linea uses 16 and 4");
#if defined(LINEA_CUDA_EMULATOR)
  emu::cp_async(dst, in ? src : nullptr, BYTES);
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  if constexpr (BYTES == 16)  // .cg (through L2 only) takes 16 bytes only
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(src), "r"(in ? 16 : 0));
  else
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(s), "l"(src), "r"(in ? 4 : 0));
#elif defined(__CUDA_ARCH__)
  __trap();
#endif
}
__device__ __forceinline__ void cp_async_commit() {
#if defined(LINEA_CUDA_EMULATOR)
  emu::cp_async_commit();
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;\n" ::);
#endif
}
template <int N> __device__ __forceinline__ void cp_async_wait() {
#if defined(LINEA_CUDA_EMULATOR)
  emu::cp_async_wait(N);
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
#endif
}

// ldmatrix (sm_75+): the warp reads four 8 x 8 matrices of 16-bit elements (8 rows of 16 bytes)
// from shared memory in one instruction, where a fragment's own loads take one per register. Lane l
// gives the address of row l % 8 of matrix l / 8 (16-byte aligned); r[i] gets matrix i's elements
// (row l / 4, columns 2 (l % 4), +1), or with TRANS the transposed matrix's: (rows 2 (l % 4), +1,
// column l / 4). Read as 8 rows of 4 floats, a matrix gives r[i] = element (l / 4, l % 4): TF32
// fragments load the same way (not transposed).
template <bool TRANS = false> __device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* row) {
#if defined(LINEA_CUDA_EMULATOR)
  emu::ldmatrix_x4(r, row, TRANS);
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 750
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(row));
  if constexpr (TRANS)
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(s));
  else
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(s));
#elif defined(__CUDA_ARCH__)
  __trap();
#endif
}

// d += A B for the warp (every lane calls it, converged).
__device__ __forceinline__ void mma_bf16_16x8x16(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
#if defined(LINEA_CUDA_EMULATOR)
  emu::mma_bf16_m16n8k16(d, a, b);
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#elif defined(__CUDA_ARCH__)
  __trap();  // the callers check compute_capability() >= 80 first
#endif
}

// d += A B for the warp on TF32 inputs (every lane calls it, converged).
__device__ __forceinline__ void mma_tf32_16x8x8(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
#if defined(LINEA_CUDA_EMULATOR)
  emu::mma_tf32_m16n8k8(d, a, b);
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile(
      "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#elif defined(__CUDA_ARCH__)
  __trap();  // the callers check compute_capability() >= 80 first
#endif
}

// x split for 3xTF32: big = x rounded to TF32, small = the rest (x - big) rounded to TF32.
// (attention.cu's Tf32Format splits its a and b inline, bigs first: through this, ptxas moved six
// of its kernels, one forward to 12 spilled bytes.)
template <int N>
__device__ __forceinline__ void split_tf32(const uint32_t (&x)[N], uint32_t (&big)[N], uint32_t (&small)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) {
    big[i] = round_tf32(bits_to_float(x[i]));
    small[i] = round_tf32(bits_to_float(x[i]) - bits_to_float(big[i]));
  }
}

// d += A_big B_small + A_small B_big + A_big B_big (3xTF32: a and b each split into a TF32 big
// part and the TF32 rounding of the rest), the small products first: three mma.
__device__ __forceinline__ void mma_tf32x3_16x8x8(float (&d)[4], const uint32_t (&ab)[4], const uint32_t (&as)[4],
                                                  const uint32_t (&bb)[2], const uint32_t (&bs)[2]) {
#if defined(LINEA_CUDA_EMULATOR)
  emu::mma_tf32x3_m16n8k8(d, ab, as, bb, bs);  // one gathering of the warp's fragments for the three
#else
  mma_tf32_16x8x8(d, ab, bs);
  mma_tf32_16x8x8(d, as, bb);
  mma_tf32_16x8x8(d, ab, bb);
#endif
}

}  // namespace linea::cuda::detail
