// Error checking for every CUDA runtime, cuBLAS, cuFFT and cuRAND call in cuda/: each macro
// throws linea::Error naming the call, the library's error, the file and the line.
// LINEA_KERNEL_LAUNCH_CHECK() goes after each kernel launch; with LINEA_CUDA_SYNC=1 in the
// environment it also synchronizes the stream, so an asynchronous fault is reported at the
// launch that caused it (a debug mode: slow, off by default).
// Not for user-argument checks (those are LINEA_CHECK in the launchers).
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cufft.h>
#include <curand.h>

#include "core/error.h"

namespace linea::cuda::detail {

[[noreturn]] void throw_cuda_error(cudaError_t err, const char* expr, const char* file, int line);
[[noreturn]] void throw_cublas_error(cublasStatus_t st, const char* expr, const char* file, int line);
[[noreturn]] void throw_cufft_error(cufftResult st, const char* expr, const char* file, int line);
[[noreturn]] void throw_curand_error(curandStatus_t st, const char* expr, const char* file, int line);
// cudaGetLastError after a launch; with LINEA_CUDA_SYNC=1 also synchronizes the stream.
void check_launch(const char* file, int line);
// True when LINEA_CUDA_SYNC=1 (read once).
bool sync_debug();

}  // namespace linea::cuda::detail

#define LINEA_CUDA_CHECK(expr)                                                                                     \
  do {                                                                                                             \
    cudaError_t linea_err_ = (expr);                                                                               \
    if (linea_err_ != cudaSuccess) ::linea::cuda::detail::throw_cuda_error(linea_err_, #expr, __FILE__, __LINE__); \
  } while (0)

#define LINEA_CUBLAS_CHECK(expr)                                                       \
  do {                                                                                 \
    cublasStatus_t linea_st_ = (expr);                                                 \
    if (linea_st_ != CUBLAS_STATUS_SUCCESS)                                            \
      ::linea::cuda::detail::throw_cublas_error(linea_st_, #expr, __FILE__, __LINE__); \
  } while (0)

#define LINEA_CUFFT_CHECK(expr)                                                                                     \
  do {                                                                                                              \
    cufftResult linea_st_ = (expr);                                                                                 \
    if (linea_st_ != CUFFT_SUCCESS) ::linea::cuda::detail::throw_cufft_error(linea_st_, #expr, __FILE__, __LINE__); \
  } while (0)

#define LINEA_CURAND_CHECK(expr)                                                       \
  do {                                                                                 \
    curandStatus_t linea_st_ = (expr);                                                 \
    if (linea_st_ != CURAND_STATUS_SUCCESS)                                            \
      ::linea::cuda::detail::throw_curand_error(linea_st_, #expr, __FILE__, __LINE__); \
  } while (0)

#define LINEA_KERNEL_LAUNCH_CHECK() ::linea::cuda::detail::check_launch(__FILE__, __LINE__)
