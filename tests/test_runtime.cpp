// core/runtime.h: set_num_threads moves OpenMP's and OpenBLAS's counts together and n <= 0
// keeps them, blas_kernels names OpenBLAS's kernels and fitting_blas_kernels replaces only
// generic ones, cpu_name reads a name, cuda_device_name names a GPU or says clearly why it cannot.
// Not here: CUDA probing (tests/test_cuda_basics.cpp).
#include "core/runtime.h"

#include <string>

#include "tests/test_util.h"

namespace linea {
namespace {

// Restores the thread counts a test changed.
struct ThreadsGuard {
  int omp = num_threads();
  ~ThreadsGuard() { set_num_threads(omp); }
};

TEST(Runtime, SetNumThreadsSetsOpenMPAndOpenBLAS) {
  ThreadsGuard guard;
  set_num_threads(1);
  EXPECT_EQ(num_threads(), 1);
  EXPECT_EQ(blas_num_threads(), 1);
  set_num_threads(2);
  EXPECT_EQ(num_threads(), 2);
  EXPECT_EQ(blas_num_threads(), 2);
  // work still runs, and gives the same answer, on one thread
  const Tensor a = randn({33, 17}), b = randn({17, 9});
  const std::vector<float> two = matmul(a, b).to_vector<float>();
  set_num_threads(1);
  EXPECT_EQ(matmul(a, b).to_vector<float>(), two);
}

TEST(Runtime, NonPositiveThreadCountKeepsTheCurrentOnes) {
  ThreadsGuard guard;
  set_num_threads(1);
  set_num_threads(0);
  EXPECT_EQ(num_threads(), 1);
  EXPECT_EQ(blas_num_threads(), 1);
  set_num_threads(-3);
  EXPECT_EQ(num_threads(), 1);
  EXPECT_EQ(blas_num_threads(), 1);
}

TEST(Runtime, CpuNameIsATrimmedNonEmptyLine) {
  const std::string name = cpu_name();
  ASSERT_FALSE(name.empty());
  EXPECT_EQ(name.find('\n'), std::string::npos);
  EXPECT_NE(name.front(), ' ');
  EXPECT_NE(name.find_first_not_of(" \t"), std::string::npos);
}

TEST(Runtime, BlasKernelsAreNamed) {
  EXPECT_FALSE(blas_kernels().empty());
  // Whatever this machine is, the advice never names the kernels already in use.
  const std::string fit = fitting_blas_kernels();
  EXPECT_TRUE(fit.empty() || fit != blas_kernels()) << fit;
}

TEST(Runtime, FittingBlasKernelsReplaceOnlyGenericOnesOnCapableCpus) {
  // The generic fallback of an OpenBLAS older than the CPU, and older core types.
  EXPECT_EQ(fitting_blas_kernels_for("Prescott", true, true), "SkylakeX");
  EXPECT_EQ(fitting_blas_kernels_for("Prescott", true, false), "Haswell");
  EXPECT_EQ(fitting_blas_kernels_for("Sandybridge", true, false), "Haswell");
  EXPECT_EQ(fitting_blas_kernels_for("Nehalem", true, true), "SkylakeX");
  // A CPU without AVX2: nothing better to offer.
  EXPECT_EQ(fitting_blas_kernels_for("Prescott", false, false), "");
  // Kernels with AVX2 or better are OpenBLAS's own informed pick: kept.
  for (const char* good : {"Haswell", "Zen", "SkylakeX", "Cooperlake", "SapphireRapids", "Excavator"})
    EXPECT_EQ(fitting_blas_kernels_for(good, true, true), "") << good;
}

TEST(Runtime, CudaDeviceNameOrAClearError) {
  if (!cuda_built()) {
    EXPECT_LINEA_ERROR(cuda_device_name(), "no CUDA backend");
    EXPECT_LINEA_ERROR(cuda_device_name(1), "cuda_device_name(1)");
    return;
  }
  if (!cuda_available()) {
    EXPECT_LINEA_ERROR(cuda_device_name(), "no usable CUDA device");
    return;
  }
  EXPECT_FALSE(cuda_device_name().empty());
  EXPECT_EQ(cuda_device_name(0), cuda_device_name());
  EXPECT_LINEA_ERROR(cuda_device_name(cuda_device_count()), "no CUDA device");
  EXPECT_LINEA_ERROR(cuda_device_name(-1), "no CUDA device -1");
}

}  // namespace
}  // namespace linea
