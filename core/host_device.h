// LINEA_HD marks the math written once for the CPU and the CUDA kernels (core/unary_math.h,
// core/binary_math.h, core/optim_math.h): __host__ __device__ when nvcc compiles it, a plain
// inline function otherwise.
#pragma once

#if defined(__CUDACC__)
#define LINEA_HD __host__ __device__ __forceinline__
#else
#define LINEA_HD inline
#endif
