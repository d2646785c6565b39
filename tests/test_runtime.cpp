// core/runtime.h: set_num_threads moves OpenMP's and OpenBLAS's counts together and n <= 0
// keeps them, cpu_name reads a name, cuda_device_name names a GPU or says clearly why it cannot.
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
