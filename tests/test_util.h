// Helpers shared by the test suites: float64 random inputs, closeness checks with a
// tolerance of atol + |ref| * rtol, gradcheck as a gtest assertion, GPU skipping.
#pragma once

#include <gtest/gtest.h>

#include <stdlib.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "linea.h"

namespace linea::test {

inline TensorOptions f64() { return TensorOptions(DType::Float64); }

// Random float64 leaf that requires grad.
inline Tensor randn64(const Shape& s, double scale = 1.0) {
  Tensor t = mul(randn(s, f64()), scale);
  t.requires_grad_(true);
  return t;
}

// A non-contiguous float64 leaf view of the given shape: the transpose of a [.., b, a] tensor.
inline Tensor randn64_transposed(const Shape& s) {
  Shape t = s;
  std::swap(t[t.size() - 1], t[t.size() - 2]);
  Tensor base = randn(t, f64());
  base.requires_grad_(true);
  return base.transpose(-1, -2);  // a differentiable view: grads flow to `base`
}

// Max over elements of |a - b| - (atol + rtol * |b|); <= 0 means close.
inline ::testing::AssertionResult all_close(const Tensor& a, const Tensor& b, double atol, double rtol) {
  if (a.shape() != b.shape())
    return ::testing::AssertionFailure() << "shape " << shape_str(a.shape()) << " vs " << shape_str(b.shape());
  auto va = a.to_vector<double>();
  auto vb = b.to_vector<double>();
  double worst = -1e300;
  size_t wi = 0;
  for (size_t i = 0; i < va.size(); ++i) {
    if (std::isnan(va[i]) != std::isnan(vb[i]))
      return ::testing::AssertionFailure() << "NaN mismatch at flat index " << i << ": " << va[i] << " vs " << vb[i];
    if (std::isnan(va[i])) continue;
    if (std::isinf(va[i]) || std::isinf(vb[i])) {
      if (va[i] != vb[i]) return ::testing::AssertionFailure() << "inf mismatch at " << i;
      continue;
    }
    double excess = std::fabs(va[i] - vb[i]) - (atol + rtol * std::fabs(vb[i]));
    if (excess > worst) {
      worst = excess;
      wi = i;
    }
  }
  if (va.empty() || worst <= 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "worst at flat index " << wi << ": " << va[wi] << " vs " << vb[wi]
                                       << " (atol " << atol << ", rtol " << rtol << ")";
}

// The suites' gradcheck options: o as given (the full Jacobian by default), or N random probes
// per input when LINEA_GRADCHECK_PROBES=N is set. tests/run.sh sets it for the sanitizer pass,
// which looks for memory errors and undefined behaviour: a few probes run every forward and
// backward path the full Jacobian does, in seconds instead of minutes. The main pass checks the
// full Jacobian.
inline GradcheckOptions suite_gradcheck_options(GradcheckOptions o = {}) {
  const char* probes = std::getenv("LINEA_GRADCHECK_PROBES");
  if (o.probes == 0 && probes != nullptr) o.probes = std::atoll(probes);
  return o;
}

inline ::testing::AssertionResult grad_ok(const std::function<Tensor(const std::vector<Tensor>&)>& f,
                                          const std::vector<Tensor>& inputs, GradcheckOptions o = {}) {
  GradcheckResult r = gradcheck(f, inputs, suite_gradcheck_options(o));
  if (r.ok) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << r.message;
}

#define EXPECT_GRADCHECK(f, ...) EXPECT_TRUE(::linea::test::grad_ok(f, __VA_ARGS__))

// Skips the current test when no CUDA device is usable.
#define LINEA_REQUIRE_CUDA()                                          \
  do {                                                                \
    if (!::linea::cuda_available()) GTEST_SKIP() << "no CUDA device"; \
  } while (0)

// EXPECT_THROW that also checks the message contains a substring.
#define EXPECT_LINEA_ERROR(stmt, substr)                                            \
  do {                                                                              \
    try {                                                                           \
      stmt;                                                                         \
      ADD_FAILURE() << "expected linea::Error containing '" << substr << "'";       \
    } catch (const ::linea::Error& e) {                                             \
      EXPECT_NE(std::string(e.what()).find(substr), std::string::npos) << e.what(); \
    }                                                                               \
  } while (0)

// A fresh directory under the system temp dir, removed with everything in it at scope exit.
struct TempDir {
  std::filesystem::path path;
  TempDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "linea_test_XXXXXX").string();
    std::vector<char> buf(tmpl.begin(), tmpl.end());
    buf.push_back('\0');
    char* p = ::mkdtemp(buf.data());
    if (p == nullptr) throw std::runtime_error("mkdtemp failed");
    path = p;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::string file(const std::string& name) const { return (path / name).string(); }
};

inline std::string read_all(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

inline void write_all(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

}  // namespace linea::test
