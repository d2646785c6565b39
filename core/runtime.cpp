// Thread counts, the processor's name and CUDA device names (core/runtime.h). The CUDA part
// goes through core/cuda_interface.h and is only compiled in with the backend.
#include "core/runtime.h"

#include <cblas.h>
#include <omp.h>

#include <fstream>

#include "core/error.h"

#ifdef LINEA_WITH_CUDA
#include "core/cuda_interface.h"
#endif

namespace linea {

void set_num_threads(int n) {
  if (n <= 0) return;
  omp_set_num_threads(n);
  openblas_set_num_threads(n);
}

int num_threads() { return omp_get_max_threads(); }

int blas_num_threads() { return openblas_get_num_threads(); }

std::string blas_kernels() {
  const char* name = openblas_get_corename();
  return name != nullptr ? name : "unknown";
}

std::string fitting_blas_kernels_for(const std::string& in_use, bool avx2_fma, bool avx512) {
  // OpenBLAS's x86 core types with AVX2 kernels or better; anything else is older or generic.
  for (const char* good : {"Haswell", "Zen", "Excavator", "SkylakeX", "Cooperlake", "SapphireRapids"})
    if (in_use == good) return "";
  if (avx512) return "SkylakeX";
  if (avx2_fma) return "Haswell";
  return "";
}

std::string fitting_blas_kernels() {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  __builtin_cpu_init();
  const bool avx2_fma = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  const bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                      __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
  return fitting_blas_kernels_for(blas_kernels(), avx2_fma, avx512);
#else
  return "";  // other architectures: OpenBLAS's own pick
#endif
}

std::string cpu_name() {
  std::ifstream f("/proc/cpuinfo");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("model name", 0) != 0) continue;
    const size_t colon = line.find(':');
    if (colon == std::string::npos) continue;
    const size_t start = line.find_first_not_of(" \t", colon + 1);
    if (start != std::string::npos) return line.substr(start);
  }
  return "unknown CPU";
}

std::string cuda_device_name(int index) {
#ifdef LINEA_WITH_CUDA
  return cuda::device_name(index);
#else
  LINEA_FAIL("cuda_device_name(", index, "): this build of Linea has no CUDA backend (configure with LINEA_CUDA=ON)");
#endif
}

}  // namespace linea
