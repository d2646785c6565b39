// CUDA backend basics that run on every machine, GPU or not: device probing never throws,
// a CUDA tensor on a machine without a GPU (or in a build without CUDA) is a clear
// linea::Error rather than a crash, CPU work is unaffected, the error-checking macros of
// cuda/check.h report the call, the library's error and the place, and the generator state
// API works without touching the device.
// Not here: kernel parity against the CPU (tests/test_cuda_parity.cpp, needs a GPU).
#include <cstdint>
#include <random>
#include <string>

#include "core/runtime.h"
#include "cuda/divider.h"
#include "tests/test_util.h"

#ifdef LINEA_WITH_CUDA
#include <fstream>

#include "core/cuda_interface.h"
#include "cuda/check.h"
#include "cuda/cublas_library.h"
#endif

namespace linea {
namespace {

TEST(CudaBasics, ProbingIsConsistentAndNeverThrows) {
  bool avail = false;
  int count = -1;
  EXPECT_NO_THROW(avail = cuda_available());
  EXPECT_NO_THROW(count = cuda_device_count());
  EXPECT_EQ(avail, count > 0);
  EXPECT_GE(count, 0);
  if (!cuda_built()) {
    EXPECT_FALSE(avail);
  }
}

TEST(CudaBasics, CudaTensorWithoutGpuIsAClearError) {
  if (cuda_available()) GTEST_SKIP() << "a CUDA device is present";
  try {
    Tensor t = zeros({2, 3}, TensorOptions(DType::Float32, Device("cuda")));
    ADD_FAILURE() << "expected linea::Error creating a CUDA tensor without a GPU";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("cuda"), std::string::npos) << msg;  // names the device
    EXPECT_TRUE(msg.find("no CUDA device") != std::string::npos || msg.find("no CUDA backend") != std::string::npos)
        << msg;
  }
  const Tensor x = randn({4, 5});
  EXPECT_THROW(x.to(Device("cuda")), Error);
  // CPU work goes on as usual afterwards
  EXPECT_NEAR(sum(ones({3, 4})).item(), 12.0, 0.0);
  EXPECT_NEAR(matmul(ones({2, 3}), ones({3, 2})).to_vector<double>()[0], 3.0, 0.0);
}

#ifdef LINEA_WITH_CUDA

// The message of the linea::Error thrown by stmt ("" if none).
template <typename F> std::string error_of(F stmt) {
  try {
    stmt();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(CudaBasics, CheckMacrosReportCallErrorAndPlace) {
  std::string m = error_of([] { LINEA_CUDA_CHECK(cudaErrorInvalidValue); });
  EXPECT_NE(m.find("cudaErrorInvalidValue"), std::string::npos) << m;
  EXPECT_NE(m.find("test_cuda_basics.cpp"), std::string::npos) << m;
  m = error_of([] { LINEA_CUBLAS_CHECK(CUBLAS_STATUS_INVALID_VALUE); });
  EXPECT_NE(m.find("CUBLAS_STATUS_INVALID_VALUE"), std::string::npos) << m;
  EXPECT_NE(m.find("cuBLAS"), std::string::npos) << m;
  m = error_of([] { LINEA_CUFFT_CHECK(CUFFT_INVALID_PLAN); });
  EXPECT_NE(m.find("CUFFT_INVALID_PLAN"), std::string::npos) << m;
  m = error_of([] { LINEA_CURAND_CHECK(CURAND_STATUS_LENGTH_NOT_MULTIPLE); });
  EXPECT_NE(m.find("CURAND_STATUS_LENGTH_NOT_MULTIPLE"), std::string::npos) << m;
  EXPECT_NE(m.find(" in CURAND_STATUS_LENGTH_NOT_MULTIPLE at "), std::string::npos) << "names the call: " << m;
  // success passes silently
  EXPECT_NO_THROW(LINEA_CUDA_CHECK(cudaSuccess));
  EXPECT_NO_THROW(LINEA_CUBLAS_CHECK(CUBLAS_STATUS_SUCCESS));
}

#if defined(LINEA_WITH_CUDA) && !defined(LINEA_CUDA_EMULATOR)
// Whether a shared library whose path holds `name` is mapped into this process.
bool library_mapped(const std::string& name) {
  std::ifstream maps("/proc/self/maps");
  for (std::string line; std::getline(maps, line);)
    if (line.find(name) != std::string::npos) return true;
  return false;
}
// Read during static initialization: after the linked libraries loaded, before any test ran.
const bool kCublasLtMappedAtStart = library_mapped("libcublasLt.so");

// cuBLAS is opened on first use (cuda/cublas_library.h), not at start: loading libcublasLt costs
// every process about half a second. Once opened, every function Linea calls is there.
TEST(CudaBasics, CublasOpensOnFirstUse) {
  EXPECT_FALSE(kCublasLtMappedAtStart) << "libcublasLt was loaded before main: is it linked again?";
  const cuda::detail::CublasApi& api = cuda::detail::cublas_api();  // throws linea::Error when missing
  EXPECT_TRUE(library_mapped("libcublasLt.so"));
  EXPECT_STREQ(api.cublasGetStatusName(CUBLAS_STATUS_NOT_SUPPORTED), "CUBLAS_STATUS_NOT_SUPPORTED");
  EXPECT_NE(api.cublasLtMatmul, nullptr);
  EXPECT_NE(api.cublasGemmStridedBatchedEx, nullptr);
}
#endif

TEST(CudaBasics, GeneratorStateWithoutDevice) {
  // {seed, offset}; seeding only records the state (no device call until a draw).
  const std::vector<uint64_t> saved = cuda::rng_state();
  cuda::manual_seed(42);
  EXPECT_EQ(cuda::rng_state(), (std::vector<uint64_t>{42, 0}));
  cuda::set_rng_state({7, 128});
  EXPECT_EQ(cuda::rng_state(), (std::vector<uint64_t>{7, 128}));
  EXPECT_LINEA_ERROR(cuda::set_rng_state({1, 2, 3}), "set_rng_state");
  cuda::set_rng_state(saved);
}

TEST(CudaBasics, NoDeviceAllocationAndSyncAreSafe) {
  if (cuda::is_available()) GTEST_SKIP() << "a CUDA device is present";
  EXPECT_EQ(cuda::device_count(), 0);
  EXPECT_NO_THROW(cuda::synchronize());  // nothing can be pending
  EXPECT_LINEA_ERROR(cuda::raw_alloc(64), "no usable CUDA device");
}

TEST(CudaBasics, DeviceNameOrAClearError) {
  if (!cuda::is_available()) {
    EXPECT_LINEA_ERROR(cuda::device_name(0), "no usable CUDA device");
    return;
  }
  const std::string name = cuda_device_name(0);  // through core/runtime.h
  EXPECT_FALSE(name.empty());
  EXPECT_EQ(cuda::device_name(0), name);
  EXPECT_LINEA_ERROR(cuda::device_name(cuda::device_count()), "no CUDA device");
  EXPECT_LINEA_ERROR(cuda::device_name(-1), "no CUDA device -1");
}

#endif  // LINEA_WITH_CUDA

// The strided kernels' 32-bit division (cuda/divider.h, the same code on the host) against /:
// small divisors, powers of two and their neighbours up to 2^31, random ones; dividends at the
// edges (0, multiples of d and their neighbours, 2^31 - 1) and random below 2^31.
TEST(CudaBasics, DividerMatchesDivision) {
  std::mt19937_64 gen(5);
  std::vector<uint32_t> divisors;
  for (uint32_t d = 1; d <= 300; ++d) divisors.push_back(d);
  for (int b = 1; b <= 31; ++b)
    for (int64_t off : {-1, 0, 1}) {
      const int64_t d = (int64_t{1} << b) + off;
      if (d >= 1 && d <= (int64_t{1} << 31)) divisors.push_back(static_cast<uint32_t>(d));
    }
  for (int i = 0; i < 200; ++i) divisors.push_back(static_cast<uint32_t>(gen() % (uint64_t{1} << 31)) + 1);
  const uint32_t top = (uint32_t{1} << 31) - 1;
  for (uint32_t d : divisors) {
    const cuda::detail::Divider div(d);
    std::vector<uint32_t> ns = {0, 1, top, top - 1, top / d * d, top / d * d - (top >= d ? 1 : 0)};
    for (uint32_t m = 1; m <= 3 && uint64_t{m} * d <= top; ++m) ns.insert(ns.end(), {m * d - 1, m * d, m * d + 1});
    for (int i = 0; i < 200; ++i) ns.push_back(static_cast<uint32_t>(gen() % (uint64_t{top} + 1)));
    for (uint32_t n : ns) {
      if (n > top) continue;
      ASSERT_EQ(div.div(n), n / d) << n << " / " << d;
    }
  }
}

}  // namespace
}  // namespace linea
