// core/runtime.h: set_num_threads moves OpenMP's and OpenBLAS's counts together and n <= 0
// keeps them, blas_kernels names OpenBLAS's kernels and fitting_blas_kernels replaces only
// generic ones, cpu_name reads a name, cuda_device_name names a GPU or says clearly why it cannot;
// core/device.h's synchronize and allocator_of, the device-agnostic forms benchmarks time with.
// Not here: CUDA probing (tests/test_cuda_basics.cpp).
#include "core/runtime.h"

#include <string>

#include "core/allocator.h"
#include "core/device.h"

#include "tests/test_util.h"

namespace linea {
namespace {

TEST(Runtime, SetNumThreadsSetsOpenMPAndOpenBLAS) {
  test::ThreadsGuard guard;
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
  test::ThreadsGuard guard;
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

// synchronize and allocator_of take either device: the CPU's allocator is cpu_allocator() and sees
// a CPU tensor's bytes; a CUDA device gets CUDA's (its bytes where a GPU is present) or, in a
// build without the backend, an error saying so.
TEST(Runtime, SynchronizeAndAllocatorOfEitherDevice) {
  EXPECT_NO_THROW(synchronize(kCPU));
  EXPECT_EQ(&allocator_of(kCPU), &cpu_allocator());
  const Device gpu("cuda");
  if (!cuda_built()) {
    EXPECT_LINEA_ERROR(synchronize(gpu), "synchronize cuda:0: this build of Linea has no CUDA backend");
    EXPECT_LINEA_ERROR(allocator_of(gpu), "allocator_of cuda:0: this build of Linea has no CUDA backend");
  } else {
    EXPECT_NE(&allocator_of(gpu), &cpu_allocator());
    EXPECT_NO_THROW(synchronize(gpu));  // with no GPU, nothing can be pending
  }
  for (const Device& d : {kCPU, gpu}) {
    if (d.is_cuda() && !cuda_available()) continue;
    SCOPED_TRACE(d.str());
    const size_t before = allocator_of(d).stats().allocated_bytes;
    const Tensor t = empty({1000}, TensorOptions(DType::Float32, d));
    EXPECT_GE(allocator_of(d).stats().allocated_bytes, before + 4000);
    synchronize(d);
  }
}

}  // namespace
}  // namespace linea
