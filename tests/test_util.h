// Helpers shared by the test suites: float64 random inputs, closeness checks with a
// tolerance of atol + |ref| * rtol, gradcheck as a gtest assertion, GPU skipping.
#pragma once

#include <gtest/gtest.h>

#include <stdlib.h>
#include <sys/wait.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
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

// EXPECT_THROW that also checks the message: it contains each of the substrings given.
#define EXPECT_LINEA_ERROR(stmt, ...)                                               \
  do {                                                                              \
    try {                                                                           \
      stmt;                                                                         \
      ADD_FAILURE() << #stmt " did not throw a linea::Error";                       \
    } catch (const ::linea::Error& e) {                                             \
      for (const std::string& part : std::vector<std::string>{__VA_ARGS__})         \
        EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what(); \
    }                                                                               \
  } while (0)

// The message of the linea::Error that f throws, or "(no error)": for checks that compare or
// search a message, or look at several in turn.
inline std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const ::linea::Error& e) {
    return e.what();
  }
  return "(no error)";
}

// Restores the OpenMP and OpenBLAS thread counts (set_num_threads) a test changed, at scope exit.
struct ThreadsGuard {
  int threads = num_threads();
  ~ThreadsGuard() { set_num_threads(threads); }
};

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

// Whether idx (Int64 [B, H, N, S], any device) holds inverse-CDF draws from each query's softmax
// attention (sample_attention_keys) for q, k, u, scale and pad (Bool [B, M] or undefined), checked
// in float64: per row p = softmax_m(scale q.k_m) over the visible keys and its running sums P_m,
// draw s the first key with P_m > u_s (the last visible one if none; key 0 for a row that sees no
// key). Where u_s lies within tol of some P_m, rounding may take either neighbour: there the draw
// need only be a visible key with P_(m-1) - tol <= u_s <= P_m + tol.
inline ::testing::AssertionResult inverse_cdf_draws(const Tensor& idx, const Tensor& q, const Tensor& k,
                                                    const Tensor& u, double scale, const Tensor& pad, double tol) {
  const Device cpu(DeviceType::CPU);
  const int64_t B = q.size(0), H = q.size(1), N = q.size(2), D = q.size(3), M = k.size(2), S = u.size(3);
  const auto qv = q.to(cpu).to(DType::Float64).to_vector<double>(),
             kv = k.to(cpu).to(DType::Float64).to_vector<double>(),
             uv = u.to(cpu).to(DType::Float64).to_vector<double>();
  const auto pv = pad.defined() ? pad.to(cpu).to(DType::Int64).to_vector<int64_t>() : std::vector<int64_t>();
  const auto got = idx.to(cpu).to_vector<int64_t>();
  if (idx.shape() != u.shape()) return ::testing::AssertionFailure() << "draws of shape " << shape_str(idx.shape());
  std::vector<double> P(static_cast<size_t>(M));
  for (int64_t bh = 0; bh < B * H; ++bh)
    for (int64_t n = 0; n < N; ++n) {
      const auto visible = [&](int64_t m) { return pv.empty() || pv[static_cast<size_t>(bh / H * M + m)] == 0; };
      double mx = -INFINITY;
      for (int64_t m = 0; m < M; ++m) {
        double s = 0;
        for (int64_t d = 0; d < D; ++d)
          s += qv[static_cast<size_t>((bh * N + n) * D + d)] * kv[static_cast<size_t>((bh * M + m) * D + d)];
        P[static_cast<size_t>(m)] = visible(m) ? scale * s : -INFINITY;
        mx = std::max(mx, P[static_cast<size_t>(m)]);
      }
      int64_t last = 0;
      double run = 0;
      for (int64_t m = 0; m < M; ++m) {
        const double e = mx == -INFINITY ? 0.0 : std::exp(P[static_cast<size_t>(m)] - mx);
        if (e > 0) last = m;
        P[static_cast<size_t>(m)] = run += e;
      }
      for (int64_t s = 0; s < S; ++s) {
        const size_t i = static_cast<size_t>((bh * N + n) * S + s);
        const double x = uv[i];
        const int64_t m = got[i];
        int64_t want = 0;
        bool near = false;
        for (int64_t j = 0; j < M && run > 0; ++j) {
          want += P[static_cast<size_t>(j)] / run <= x;
          near = near || std::fabs(P[static_cast<size_t>(j)] / run - x) < tol;
        }
        want = std::min(want, last);
        const auto fail = [&] {
          return ::testing::AssertionFailure() << "row " << bh * N + n << " draw " << s << " (u " << x << "): key " << m
                                               << ", expected " << want << (near ? " or a neighbour" : "");
        };
        if (m == want) continue;
        if (!near || m < 0 || m > last || !visible(m)) return fail();
        const double below = m == 0 ? 0.0 : P[static_cast<size_t>(m - 1)] / run, upto = P[static_cast<size_t>(m)] / run;
        if (below - tol > x || x > upto + tol) return fail();
      }
    }
  return ::testing::AssertionSuccess();
}

// The most extreme scores float32 attention must survive: q [B, H, N, D] float32 of rows of norm 5
// in the scaled space (|x~| = D^-1/4 |x|), k its first N / 2 rows then the rest negated (k = +-q).
struct ExtremeScores {
  Tensor q, k;
};
inline ExtremeScores extreme_scores(int64_t B, int64_t H, int64_t N, int64_t D) {
  const Tensor x = randn({B, H, N, D});
  const Tensor q = mul(div(x, sqrt(sum(square(x), {-1}, true))), 5.0 * std::pow(static_cast<double>(D), 0.25));
  return {q, cat({narrow(q, 2, 0, N / 2), mul(narrow(q, 2, N / 2, N - N / 2), -1.0)}, 2)};
}

// Whether every element of t is finite.
inline bool all_finite(const Tensor& t) {
  for (double x : t.to_vector<double>())
    if (!std::isfinite(x)) return false;
  return true;
}

// The error an op gives for an undefined argument: the op and the argument by name.
inline std::string undefined_arg(const std::string& op, const std::string& arg) {
  return op + ": argument '" + arg + "' is an undefined tensor";
}

inline std::string read_all(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

inline void write_all(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// What an executable run through the shell printed (stdout and stderr together) and its exit
// code (-1 when it did not exit, e.g. killed by a signal).
struct Shell {
  int code;
  std::string output;
};
// Runs `exe args` (args: shell words), its output into the file `log`, which is read back.
inline Shell run_shell(const std::string& exe, const std::string& args, const std::string& log) {
  const int rc = std::system((exe + " " + args + " > '" + log + "' 2>&1").c_str());
  return {WIFEXITED(rc) ? WEXITSTATUS(rc) : -1, read_all(log)};
}

}  // namespace linea::test
