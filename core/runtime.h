// The machine a program runs on, as the library sees it: the CPU thread counts (OpenMP loops
// and OpenBLAS GEMMs, set together), the processor's name, and a CUDA device's name, so that
// apps can set threads and name their device without including <omp.h> / <cblas.h> or running
// nvidia-smi. Not device parsing or CUDA probing (core/device.h).
#pragma once

#include <string>

namespace linea {

// Sets the threads of Linea's CPU work: OpenMP's loops and OpenBLAS's GEMMs. n <= 0 changes
// nothing (each keeps its default: OMP_NUM_THREADS / OPENBLAS_NUM_THREADS or the core count).
// Like omp_set_num_threads, it applies to the calling thread's later parallel regions.
void set_num_threads(int n);
// The threads OpenMP's loops use (omp_get_max_threads).
int num_threads();
// The threads OpenBLAS's GEMMs use (openblas_get_num_threads).
int blas_num_threads();

// The OpenBLAS kernels in use: the core type OpenBLAS picked for this CPU when it loaded
// ("Haswell", "SkylakeX", "Zen", ...; OPENBLAS_CORETYPE overrides its pick).
std::string blas_kernels();

// The OPENBLAS_CORETYPE that would use this CPU's vector units when the kernels in use do not,
// "" when they do (or the CPU has no AVX2). OpenBLAS picks its kernels from the CPU's model
// number, so a release older than the CPU falls back to its generic SSE3 kernels ("Prescott"):
// Debian's 0.3.21 on a Xeon of model 207 ran Linea's softmax attention several times slower
// than with its SkylakeX kernels (apps/bench/README.md). The choice only happens when OpenBLAS
// loads, so a program that wants it sets the variable and restarts itself
// (apps/common/process_env.h).
std::string fitting_blas_kernels();
// The rule behind it, for kernels `in_use` on a CPU with (avx2 and fma) / AVX-512 (F, BW, DQ,
// VL): "SkylakeX" or "Haswell" when in_use is not one of OpenBLAS's AVX2 (or newer) core types.
std::string fitting_blas_kernels_for(const std::string& in_use, bool avx2_fma, bool avx512);

// The processor's model name from /proc/cpuinfo ("AMD EPYC ..."); "unknown CPU" where there is none.
std::string cpu_name();

// The name of CUDA device `index` ("NVIDIA H100 80GB HBM3"), from cudaGetDeviceProperties.
// Throws linea::Error when this build has no CUDA backend, when no GPU or driver is usable,
// or when index is not in [0, cuda_device_count()).
std::string cuda_device_name(int index = 0);

}  // namespace linea
