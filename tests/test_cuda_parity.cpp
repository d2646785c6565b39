// CUDA parity: every kernel family run through the public API on the CPU (the reference) and
// on CUDA (x.to(Device("cuda"))), forward values and gradients (out.backward(g) with the same
// g on both devices) compared with |cuda - cpu| <= atol + rtol * |cpu|, per-dtype tolerances
// kept in tol_for() below. Inputs have awkward sizes (odd, non-power-of-two, 1), broadcast
// (stride-0) operands and non-contiguous (transposed, sliced, permuted) views. Also: the
// caching allocator reuses blocks, the generator is reproducible, bad indices are reported.
// Every test starts with LINEA_REQUIRE_CUDA(): without a GPU they are skipped, not failed.
// Not here: tests that run without a GPU (tests/test_cuda_basics.cpp).
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <tuple>
#include <vector>

#include "core/cuda_counters.h"
#include "core/dispatch.h"
#include "core/kernels.h"
#include "core/ops_optim.h"
#include "core/precision.h"
#include "tests/test_util.h"

#ifdef LINEA_WITH_CUDA
#include "core/cuda_interface.h"
#endif

namespace linea {
namespace {

using Fn = std::function<Tensor(const std::vector<Tensor>&)>;

const Device kCuda(DeviceType::CUDA, 0);

// ---- tolerances, all in one place ------------------------------------------------------------
// float32: cuBLAS / cuFFT / tree reductions add in another order than OpenBLAS / FFTW / loops,
// and CUDA's expf, tanhf, erff are within 2 ulp of glibc's. float64: the same at double
// precision. Integer and bool results must match exactly. A test may scale the tolerance for
// long sums (FFT lengths, GEMM depths), saying why.
struct Tol {
  double atol, rtol;
};
Tol tol_for(DType dt) {
  switch (dt) {
    case DType::Float32:
      return {2e-5, 2e-5};
    case DType::Float64:
      return {1e-10, 1e-10};
    default:
      return {0.0, 0.0};
  }
}

const std::vector<DType> kFloatTypes = {DType::Float32, DType::Float64};

// CPU input: N(0, scale^2) in dtype dt (drawn in float64 from the CPU generator, then converted).
Tensor rnd(const Shape& s, DType dt, double scale = 1.0) { return mul(randn(s, test::f64()), scale).to(dt); }

// A CUDA output of a kernel under test: NaN everywhere, so that an element the kernel does not
// write fails the comparison.
Tensor poisoned(const Shape& shape, DType dt) { return full(shape, NAN, TensorOptions(dt).with_device(kCuda)); }

// Heads [B, H, L, dim] of a poisoned [B, L, H, pitch] device buffer: a projection's layout, for
// the kernels that read and write heads in place.
Tensor heads(int64_t B, int64_t H, int64_t L, int64_t dim, int64_t pitch, DType dt) {
  return narrow(permute(poisoned({B, L, H, pitch}, dt), {0, 2, 1, 3}), 3, 0, dim);
}
// Nothing written past a view of heads()'s head dims: the rest of each buffer row is still NaN.
void gaps_untouched(const Tensor& view, int64_t dim, int64_t pitch, const char* what) {
  if (pitch == dim) return;
  const Tensor buffer = as_strided(view, {view.size(0), view.size(2), view.size(1), pitch},
                                   {view.stride(0), view.stride(2), view.stride(1), 1}, view.offset());
  const std::vector<double> g = narrow(buffer, 3, dim, pitch - dim).to(kCPU).to(DType::Float64).to_vector<double>();
  EXPECT_TRUE(std::all_of(g.begin(), g.end(), [](double x) { return std::isnan(x); })) << what << " wrote a gap";
}

// Int64 tensor from values.
Tensor ints(const std::vector<int64_t>& v, const Shape& s) { return from_vector<int64_t>(v, s); }
// A key padding mask Bool [B, M] for the attention kernels: batch 0 has every third key padded,
// the last batch (when B > 1) all of them.
Tensor key_padding(int64_t B, int64_t M) {
  std::vector<int64_t> mask(static_cast<size_t>(B * M), 0);
  for (int64_t m = 0; m < M; ++m) mask[m] = m % 3 == 1;
  for (int64_t m = 0; m < M; ++m) mask[(B - 1) * M + m] = B > 1 ? 1 : mask[m];
  return ints(mask, {B, M}).to(DType::Bool);
}

// pad on CUDA as columns 2.. of a wider mask (rows M + 3 apart, the columns around it unpadded: read
// in their place, they would show keys of the all-padded batch), as a decoding step reads its
// column of the decoder's mask in place.
Tensor in_wider_rows(const Tensor& pad) {
  const int64_t B = pad.size(0), M = pad.size(1);
  Tensor wide = ints(std::vector<int64_t>(static_cast<size_t>(B * (M + 3)), 0), {B, M + 3}).to(DType::Bool);
  narrow(wide, 1, 2, M).copy_(pad);
  return narrow(wide.to(kCuda), 1, 2, M);
}

::testing::AssertionResult matches(const Tensor& got, const Tensor& ref, double scale, const char* what) {
  if (got.defined() != ref.defined())
    return ::testing::AssertionFailure() << what << ": defined on " << (got.defined() ? "CUDA" : "CPU") << " only";
  if (!got.defined()) return ::testing::AssertionSuccess();
  if (!got.is_cuda()) return ::testing::AssertionFailure() << what << ": CUDA result is on " << got.device();
  if (got.dtype() != ref.dtype())
    return ::testing::AssertionFailure() << what << ": dtype " << got.dtype() << " vs " << ref.dtype();
  const Tol t = tol_for(ref.dtype());
  ::testing::AssertionResult r = test::all_close(got.to(kCPU), ref, t.atol * scale, t.rtol * scale);
  if (!r) r << " [" << what << ", dtype " << ref.dtype() << ", shape " << shape_str(ref.shape()) << "]";
  return r;
}

// Runs fn on CPU leaves made from `inputs` and on CUDA copies of them; compares the outputs,
// then (for a floating output) backpropagates the same random gradient on both devices and
// compares the .grad of every floating input.
void expect_parity(const std::string& what, const Fn& fn, const std::vector<Tensor>& inputs, double scale = 1.0,
                   bool backward = true) {
  SCOPED_TRACE(what);
  std::vector<Tensor> cpu_in, cuda_in;
  for (const Tensor& x : inputs) {
    Tensor c = x.detach();
    Tensor g = x.detach().to(kCuda);
    if (backward && is_floating(x.dtype())) {
      c.requires_grad_(true);
      g.requires_grad_(true);
    }
    cpu_in.push_back(c);
    cuda_in.push_back(g);
  }
  const Tensor ref = fn(cpu_in);
  const Tensor got = fn(cuda_in);
  EXPECT_TRUE(matches(got, ref, scale, "forward"));
  if (!backward || !is_floating(ref.dtype()) || !ref.requires_grad()) return;
  const Tensor gout = rnd(ref.shape(), ref.dtype());
  ref.backward(gout);
  got.backward(gout.to(kCuda));
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (!cpu_in[i].requires_grad()) continue;
    const std::string name = "grad of input " + std::to_string(i);
    EXPECT_TRUE(matches(cuda_in[i].grad(), cpu_in[i].grad(), scale, name.c_str()));
  }
}

std::string tag(const std::string& s, DType dt) { return s + " (" + dtype_name(dt) + ")"; }

// ---- elementwise ------------------------------------------------------------------------------
TEST(CudaParity, Unary) {
  LINEA_REQUIRE_CUDA();
  manual_seed(1);
  struct Case {
    const char* name;
    std::function<Tensor(const Tensor&)> f;
    bool positive;  // needs x > 0
  };
  const std::vector<Case> cases = {
      {"neg", [](const Tensor& x) { return neg(x); }, false},
      {"exp", [](const Tensor& x) { return exp(x); }, false},
      {"log", [](const Tensor& x) { return log(x); }, true},
      {"sqrt", [](const Tensor& x) { return sqrt(x); }, true},
      {"rsqrt", [](const Tensor& x) { return rsqrt(x); }, true},
      {"abs", [](const Tensor& x) { return abs(x); }, false},
      {"tanh", [](const Tensor& x) { return tanh(x); }, false},
      {"sigmoid", [](const Tensor& x) { return sigmoid(x); }, false},
      {"relu", [](const Tensor& x) { return relu(x); }, false},
      {"gelu_erf", [](const Tensor& x) { return gelu(x, false); }, false},
      {"gelu_tanh", [](const Tensor& x) { return gelu(x, true); }, false},
      {"sin", [](const Tensor& x) { return sin(x); }, false},
      {"cos", [](const Tensor& x) { return cos(x); }, false},
      {"pow2.5", [](const Tensor& x) { return pow(x, 2.5); }, true},
      {"pow3", [](const Tensor& x) { return pow(x, 3.0); }, false},
      {"square", [](const Tensor& x) { return square(x); }, false},
      {"clamp", [](const Tensor& x) { return clamp(x, -0.5, 0.7); }, false},
      {"clamp_lo", [](const Tensor& x) { return clamp(x, -0.3, INFINITY); }, false},
      {"sign", [](const Tensor& x) { return sign(x); }, false},
      {"add_scalar", [](const Tensor& x) { return add(x, 0.37); }, false},
      {"mul_scalar", [](const Tensor& x) { return mul(x, -1.7); }, false},
      {"rsub_scalar", [](const Tensor& x) { return sub(2.0, x); }, false},
      {"rdiv_scalar", [](const Tensor& x) { return div(1.5, x); }, true},
  };
  for (DType dt : kFloatTypes) {
    for (const Case& c : cases) {
      auto in = [&](const Tensor& x) { return c.positive ? add(abs(x), 0.5) : x; };
      // contiguous odd length, a single element, a transposed 2-D view, a strided slice
      expect_parity(tag(std::string(c.name) + " [1001]", dt),
                    [&](const std::vector<Tensor>& v) { return c.f(in(v[0])); }, {rnd({1001}, dt, 2.0)});
      expect_parity(tag(std::string(c.name) + " [1]", dt), [&](const std::vector<Tensor>& v) { return c.f(in(v[0])); },
                    {rnd({1}, dt)});
      expect_parity(tag(std::string(c.name) + " transposed", dt),
                    [&](const std::vector<Tensor>& v) { return c.f(in(v[0].transpose(0, 1))); }, {rnd({13, 7}, dt)});
      expect_parity(tag(std::string(c.name) + " sliced", dt),
                    [&](const std::vector<Tensor>& v) { return c.f(in(v[0].slice(1, 1, 10, 3))); },
                    {rnd({5, 11, 3}, dt)});
    }
  }
}

TEST(CudaParity, UnaryInt64) {
  LINEA_REQUIRE_CUDA();
  const Tensor x = ints({-7, -1, 0, 1, 2, 5, 9, -3, 4}, {3, 3});
  const std::vector<std::pair<const char*, Fn>> cases = {
      {"neg", [](const std::vector<Tensor>& v) { return neg(v[0]); }},
      {"abs", [](const std::vector<Tensor>& v) { return abs(v[0].t()); }},
      {"sign", [](const std::vector<Tensor>& v) { return sign(v[0]); }},
      {"clamp", [](const std::vector<Tensor>& v) { return clamp(v[0], -2, 3); }},
      {"add_scalar", [](const std::vector<Tensor>& v) { return add(v[0], 3.0); }},
      {"mul_scalar", [](const std::vector<Tensor>& v) { return mul(v[0].t(), -2.0); }},
  };
  for (const auto& c : cases) expect_parity(std::string("int64 ") + c.first, c.second, {x});
}

TEST(CudaParity, BinaryBroadcast) {
  LINEA_REQUIRE_CUDA();
  manual_seed(2);
  const std::vector<std::pair<const char*, std::function<Tensor(const Tensor&, const Tensor&)>>> ops = {
      {"add", [](const Tensor& a, const Tensor& b) { return add(a, b); }},
      {"sub", [](const Tensor& a, const Tensor& b) { return sub(a, b); }},
      {"mul", [](const Tensor& a, const Tensor& b) { return mul(a, b); }},
      {"div", [](const Tensor& a, const Tensor& b) { return div(a, add(abs(b), 0.5)); }},
      {"maximum", [](const Tensor& a, const Tensor& b) { return maximum(a, b); }},
      {"minimum", [](const Tensor& a, const Tensor& b) { return minimum(a, b); }},
  };
  for (DType dt : kFloatTypes) {
    for (const auto& op : ops) {
      auto f = op.second;
      // [5, 1, 7] with [1, 3, 7]: both broadcast (stride 0)
      expect_parity(tag(std::string(op.first) + " broadcast", dt),
                    [&](const std::vector<Tensor>& v) { return f(v[0], v[1]); },
                    {rnd({5, 1, 7}, dt), rnd({1, 3, 7}, dt)});
      // transposed a with a row vector b, and a 0-d operand
      expect_parity(tag(std::string(op.first) + " transposed", dt),
                    [&](const std::vector<Tensor>& v) { return f(v[0].t(), v[1]); }, {rnd({9, 6}, dt), rnd({9}, dt)});
      expect_parity(tag(std::string(op.first) + " scalar", dt),
                    [&](const std::vector<Tensor>& v) { return f(v[0].slice(0, 0, 11, 2), v[1]); },
                    {rnd({11, 4}, dt), rnd({}, dt)});
      // many dims, permuted (exercises the offset calculator beyond a few dims)
      expect_parity(tag(std::string(op.first) + " 6-d permuted", dt),
                    [&](const std::vector<Tensor>& v) {
                      return f(v[0].permute({5, 3, 1, 0, 2, 4}), v[1]);
                    },
                    {rnd({2, 3, 2, 3, 2, 3}, dt), rnd({3, 3, 1, 2, 2, 1}, dt)});
    }
  }
  // A constant operand broadcast under x (a positional table under a batch of tokens) gets no
  // gradient: its sum over the batch was a reduction nobody read. x's gradient against the CPU's,
  // and each backward's launches.
  struct Case {
    const char* name;
    std::function<Tensor(const Tensor&, const Tensor&)> f;
    int64_t launches;
  };
  const std::vector<Case> cases = {
      {"x + c", [](const Tensor& x, const Tensor& c) { return add(x, c); }, 0},
      {"c + x", [](const Tensor& x, const Tensor& c) { return add(c, x); }, 0},
      {"x - c", [](const Tensor& x, const Tensor& c) { return sub(x, c); }, 0},
      {"c - x", [](const Tensor& x, const Tensor& c) { return sub(c, x); }, 1},              // -g
      {"x / c", [](const Tensor& x, const Tensor& c) { return div(x, c); }, 1},              // g / c
      {"c / x", [](const Tensor& x, const Tensor& c) { return div(c, x); }, 3},              // -(g / x) * out
      {"maximum(x, c)", [](const Tensor& x, const Tensor& c) { return maximum(x, c); }, 5},  // ties, halves, wins
  };
  const Tensor x = rnd({4, 5, 7}, DType::Float32), c = add(abs(rnd({5, 7}, DType::Float32)), 0.5),
               g = rnd({4, 5, 7}, DType::Float32);
  for (const Case& k : cases) {
    SCOPED_TRACE(k.name);
    Tensor xh = x.detach().requires_grad_(true);
    k.f(xh, c).backward(g);
    Tensor xd = x.to(kCuda).requires_grad_(true);
    const Tensor yd = k.f(xd, c.to(kCuda)), gd = g.to(kCuda);
    const cuda::Counters before = cuda::counters();
    yd.backward(gd);
    const cuda::Counters n = cuda::counters() - before;
    EXPECT_EQ(n.kernel_launches, k.launches) << n.str();
    EXPECT_TRUE(test::all_close(xd.grad().to(kCPU), xh.grad(), 1e-6, 1e-6));
  }
}

TEST(CudaParity, Comparisons) {
  LINEA_REQUIRE_CUDA();
  // small integer values so that ties occur
  const std::vector<int64_t> va = {0, 1, 2, 1, 0, -1, 2, 2, 1, 0, -1, -2};
  const std::vector<int64_t> vb = {1, 1, 0, 2};
  const std::vector<int64_t> vc = {1, 0, 2, 2, -1, -1, 2, 0, 1, 1, -2, 0};  // va's shape, ties with it
  for (DType dt : {DType::Float32, DType::Float64, DType::Int64}) {
    const Tensor a = ints(va, {3, 4}).to(dt), b = ints(vb, {4}).to(dt);
    const std::vector<std::pair<const char*, std::function<Tensor(const Tensor&, const Tensor&)>>> ops = {
        {"eq", [](const Tensor& x, const Tensor& y) { return eq(x, y); }},
        {"ne", [](const Tensor& x, const Tensor& y) { return ne(x, y); }},
        {"lt", [](const Tensor& x, const Tensor& y) { return lt(x, y); }},
        {"le", [](const Tensor& x, const Tensor& y) { return le(x, y); }},
        {"gt", [](const Tensor& x, const Tensor& y) { return gt(x, y); }},
        {"ge", [](const Tensor& x, const Tensor& y) { return ge(x, y); }},
    };
    for (const auto& op : ops) {
      auto f = op.second;
      expect_parity(
          tag(op.first, dt), [&](const std::vector<Tensor>& v) { return f(v[0], v[1]); }, {a, b}, 1.0, false);
      expect_parity(
          tag(std::string(op.first) + " transposed", dt),
          [&](const std::vector<Tensor>& v) { return f(v[0].t(), v[1].unsqueeze(0)); }, {ints(va, {4, 3}).to(dt), b},
          1.0, false);
      // same shapes, both contiguous: the contiguous kernel, not the strided one
      expect_parity(
          tag(std::string(op.first) + " same shape", dt), [&](const std::vector<Tensor>& v) { return f(v[0], v[1]); },
          {a, ints(vc, {3, 4}).to(dt)}, 1.0, false);
    }
  }
  // bool operands of one shape
  expect_parity(
      "eq / ne bool same shape", [](const std::vector<Tensor>& v) { return eq(v[0], v[1]) & ne(v[0], ~v[1]); },
      {ints({0, 1, 1, 0, 1, 0}, {2, 3}).to(DType::Bool), ints({1, 1, 0, 0, 1, 1}, {2, 3}).to(DType::Bool)}, 1.0, false);
  // integer arithmetic
  const Tensor a = ints(va, {3, 4}), b = ints(vb, {4});
  expect_parity("int64 add", [](const std::vector<Tensor>& v) { return add(v[0], v[1]); }, {a, b});
  expect_parity("int64 mul", [](const std::vector<Tensor>& v) { return mul(v[0].t(), v[1]); }, {ints(va, {4, 3}), b});
  expect_parity("int64 maximum", [](const std::vector<Tensor>& v) { return maximum(v[0], v[1]); }, {a, b});
  expect_parity("int64 sub same shape", [](const std::vector<Tensor>& v) { return sub(v[0], v[1]); },
                {a, ints(vc, {3, 4})});
}

TEST(CudaParity, LogicalOpsAndScalarComparisons) {
  LINEA_REQUIRE_CUDA();
  manual_seed(4);
  const Tensor a = gt(randn({3, 5}), 0.0), b = gt(randn({5}), 0.0), at = gt(randn({5, 3}), 0.0);
  expect_parity(
      "logical_and", [](const std::vector<Tensor>& v) { return v[0] & v[1]; }, {a, b}, 1.0, false);
  expect_parity(
      "logical_or", [](const std::vector<Tensor>& v) { return v[0] | v[1]; }, {a, b}, 1.0, false);
  expect_parity(
      "logical_not", [](const std::vector<Tensor>& v) { return ~v[0]; }, {a}, 1.0, false);
  expect_parity(
      "logical_and transposed", [](const std::vector<Tensor>& v) { return v[0].t() & v[1]; }, {at, b}, 1.0, false);
  expect_parity(
      "logical_or transposed", [](const std::vector<Tensor>& v) { return v[0].t() | v[1].t().t(); }, {at, a}, 1.0,
      false);
  expect_parity(
      "any / all", [](const std::vector<Tensor>& v) { return any(v[0], {1}) & ~all(v[0].t(), {0}); }, {a}, 1.0, false);
  for (DType dt : {DType::Float32, DType::Float64, DType::Int64}) {
    const Tensor x = ints({0, 1, 2, 1, 0, -1, 2, 2, 1, 0, -1, -2}, {3, 4}).to(dt);
    expect_parity(
        tag("scalar comparisons", dt),
        [](const std::vector<Tensor>& v) { return ((v[0] > 0.5) | (1.0 == v[0])) & (v[0].t().t() <= 2.0); }, {x}, 1.0,
        false);
  }
  for (DType dt : kFloatTypes)
    expect_parity(
        tag("where scalar", dt),
        [](const std::vector<Tensor>& v) { return where(v[0] > 0.0, v[0], 0.0) + where(v[0] < 0.5, 1.5, v[0]); },
        {rnd({4, 6}, dt)});
}

TEST(CudaParity, CompoundAssignment) {
  LINEA_REQUIRE_CUDA();
  manual_seed(5);
  for (DType dt : kFloatTypes) {
    const Tensor x = rnd({4, 6}, dt), r = rnd({6}, dt), y = rnd({6, 4}, dt);
    expect_parity(
        tag("compound assignment", dt),
        [](const std::vector<Tensor>& v) {
          Tensor out = clone(v[0]);
          out += v[1];
          out *= 2.0;
          out.t() -= v[2];  // into a transposed view
          out /= 3.0;
          return out;
        },
        {x, r, y}, 1.0, false);
  }
}

TEST(CudaParity, WhereAndMaskedFill) {
  LINEA_REQUIRE_CUDA();
  manual_seed(3);
  for (DType dt : kFloatTypes) {
    const Tensor mask = gt(randn({4, 1}), 0.0);
    expect_parity(tag("where broadcast", dt), [&](const std::vector<Tensor>& v) { return where(v[2], v[0], v[1]); },
                  {rnd({4, 6}, dt), rnd({6}, dt), gt(randn({4, 6}), 0.0)});
    expect_parity(tag("where transposed", dt),
                  [&](const std::vector<Tensor>& v) { return where(v[2].t(), v[0].t(), v[1]); },
                  {rnd({6, 4}, dt), rnd({4, 1}, dt), gt(randn({6, 4}), 0.0)});
    expect_parity(tag("masked_fill", dt), [&](const std::vector<Tensor>& v) { return masked_fill(v[0], v[1], -3.5); },
                  {rnd({4, 5}, dt), mask});
  }
  expect_parity("where int64", [](const std::vector<Tensor>& v) { return where(v[2], v[0], v[1]); },
                {ints({1, 2, 3, 4, 5, 6}, {2, 3}), ints({-1, -2, -3}, {3}), gt(randn({2, 3}), 0.0)});
  expect_parity("where bool", [](const std::vector<Tensor>& v) { return where(v[2], v[0], v[1]); },
                {gt(randn({3, 5}), 0.0), gt(randn({5}), 0.5), gt(randn({3, 1}), 0.0)});
  expect_parity("where bool same shape", [](const std::vector<Tensor>& v) { return where(v[2], v[0], v[1]); },
                {gt(randn({3, 5}), 0.0), gt(randn({3, 5}), 0.5), gt(randn({3, 5}), 0.0)});
}

TEST(CudaParity, CopyConvertFillArange) {
  LINEA_REQUIRE_CUDA();
  manual_seed(4);
  for (DType dt : kFloatTypes) {
    expect_parity(tag("contiguous of permuted 4-d", dt),
                  [](const std::vector<Tensor>& v) {
                    return contiguous(v[0].permute({2, 0, 3, 1}));
                  },
                  {rnd({2, 3, 4, 5}, dt)});
    expect_parity(tag("contiguous of expanded", dt),
                  [](const std::vector<Tensor>& v) {
                    return contiguous(v[0].expand({4, 3, 5}));
                  },
                  {rnd({3, 1}, dt)});
    expect_parity(tag("cat", dt),
                  [](const std::vector<Tensor>& v) {
                    return cat({v[0], v[1].t()}, 1);
                  },
                  {rnd({3, 4}, dt), rnd({5, 3}, dt)});
    expect_parity(tag("stack", dt),
                  [](const std::vector<Tensor>& v) {
                    return stack({v[0], v[1]}, 1);
                  },
                  {rnd({3, 4}, dt), rnd({3, 4}, dt)});
    for (DType to_t : {DType::Float32, DType::Float64, DType::Int64}) {
      expect_parity(
          tag(std::string("to ") + dtype_name(to_t) + " from", dt),
          [to_t](const std::vector<Tensor>& v) { return to(v[0].t(), to_t); }, {rnd({7, 3}, dt, 5.0)}, 1.0, false);
      expect_parity(
          tag(std::string("to ") + dtype_name(to_t) + " from contiguous", dt),
          [to_t](const std::vector<Tensor>& v) { return to(v[0], to_t); }, {rnd({7, 3}, dt, 5.0)}, 1.0, false);
    }
    // to bool: x != 0 (0.5, -0.25 and 256 are true, not their casts' 0)
    const Tensor nonzero = from_vector<double>({0, 0.5, -0.25, 0, 256, 1}, {2, 3}).to(dt);
    expect_parity(
        tag("to bool from contiguous", dt), [](const std::vector<Tensor>& v) { return to(v[0], DType::Bool); },
        {nonzero}, 1.0, false);
    expect_parity(
        tag("to bool from", dt), [](const std::vector<Tensor>& v) { return to(v[0].t(), DType::Bool); }, {nonzero}, 1.0,
        false);
  }
  expect_parity(
      "to bool from int64", [](const std::vector<Tensor>& v) { return to(v[0], DType::Bool); },
      {ints({0, 3, -1, 0, 256}, {5})}, 1.0, false);
  expect_parity(
      "to bool from int64 transposed", [](const std::vector<Tensor>& v) { return to(v[0].t(), DType::Bool); },
      {ints({0, 1, 512, 0, -7, 0}, {2, 3})}, 1.0, false);
  for (DType to_t : {DType::Float32, DType::Float64, DType::Int64}) {
    expect_parity(
        std::string("to ") + dtype_name(to_t) + " from int64",
        [to_t](const std::vector<Tensor>& v) { return to(v[0], to_t); }, {ints({-3, 0, 2, 7, 1}, {5})}, 1.0, false);
    expect_parity(
        std::string("to ") + dtype_name(to_t) + " from int64 transposed",
        [to_t](const std::vector<Tensor>& v) { return to(v[0].t(), to_t); }, {ints({-3, 0, 2, 7, 1, 4}, {2, 3})}, 1.0,
        false);
    expect_parity(
        std::string("to ") + dtype_name(to_t) + " from bool",
        [to_t](const std::vector<Tensor>& v) { return to(v[0].t(), to_t); }, {gt(randn({3, 4}), 0.0)}, 1.0, false);
  }
  // fill_ of a strided view writes only the view
  for (DType dt : {DType::Float32, DType::Float64, DType::Int64, DType::Bool}) {
    Tensor c = zeros({6, 5}, TensorOptions(dt)), g = zeros({6, 5}, TensorOptions(dt, kCuda));
    c.slice(0, 1, 6, 2).slice(1, 0, 5, 3).fill_(3.0);
    g.slice(0, 1, 6, 2).slice(1, 0, 5, 3).fill_(3.0);
    EXPECT_TRUE(matches(g, c, 1.0, "fill_ of a view"));
    c.fill_(1.0);  // the whole tensor: the contiguous kernel
    g.fill_(1.0);
    EXPECT_TRUE(matches(g, c, 1.0, "fill_ one"));
    c.slice(0, 1, 6, 2).slice(1, 0, 5, 3).fill_(0.0);  // zero into a view: not the memset
    g.slice(0, 1, 6, 2).slice(1, 0, 5, 3).fill_(0.0);
    EXPECT_TRUE(matches(g, c, 1.0, "fill_ zero of a view"));
    c.fill_(0.0);  // the memset path
    g.fill_(0.0);
    EXPECT_TRUE(matches(g, c, 1.0, "fill_ zero"));
  }
  // arange
  for (DType dt : {DType::Float32, DType::Float64, DType::Int64}) {
    EXPECT_TRUE(
        matches(arange(-3, 17, 1, TensorOptions(dt, kCuda)), arange(-3, 17, 1, TensorOptions(dt)), 1.0, "arange"));
    EXPECT_TRUE(matches(arange(0.5, 7.3, 0.3, TensorOptions(dt, kCuda)), arange(0.5, 7.3, 0.3, TensorOptions(dt)), 1.0,
                        "arange step 0.3"));
  }
  // copy_ across devices and within CUDA into a strided destination
  for (DType dt : kFloatTypes) {
    const Tensor src = rnd({4, 3}, dt);
    Tensor c = zeros({3, 4}, TensorOptions(dt)), g = zeros({3, 4}, TensorOptions(dt, kCuda));
    c.t().copy_(src);
    g.t().copy_(src);  // host -> device, then strided copy
    EXPECT_TRUE(matches(g, c, 1.0, "copy_ into transposed view"));
    Tensor g2 = zeros({3, 4}, TensorOptions(dt, kCuda));
    g2.t().copy_(src.to(kCuda));  // device -> device strided
    EXPECT_TRUE(matches(g2, c, 1.0, "device copy_ into transposed view"));
  }
}

// pad: every dtype (its kernel moves 1-, 4- and 8-byte elements), x contiguous (1-d: the
// plain-index kernel) or a strided view on the device (transposed, narrowed), each dim, pads on
// either side or none, an empty x. The kernel writes into a poisoned output (two poisons for the
// integer types: an element left unwritten differs from one of them). Its backward (a narrow) and
// narrow's (a pad of zeros) by expect_parity.
TEST(CudaParity, Pad) {
  LINEA_REQUIRE_CUDA();
  manual_seed(41);
  struct Case {
    Shape base;
    std::function<Tensor(const Tensor&)> view;
  };
  const std::vector<Case> cases = {{{37}, [](const Tensor& b) { return b; }},
                                   {{5, 7}, [](const Tensor& b) { return b.t(); }},
                                   {{3, 4, 9}, [](const Tensor& b) { return narrow(b, 2, 2, 5); }},
                                   {{2, 0, 3}, [](const Tensor& b) { return b; }}};
  for (DType dt : {DType::Float32, DType::Float64, DType::Int64, DType::Bool}) {
    for (const Case& c : cases) {
      const Tensor r = rnd(c.base, DType::Float64);
      const Tensor base = dt == DType::Bool ? gt(r, 0.0) : dt == DType::Int64 ? to(mul(r, 9.0), dt) : to(r, dt);
      const Tensor x = c.view(base), xd = c.view(base.to(kCuda));
      for (int64_t dim = 0; dim < x.dim(); ++dim) {
        for (auto [before, after] : std::vector<std::pair<int64_t, int64_t>>{{3, 2}, {0, 1}, {2, 0}, {0, 0}}) {
          const double value = dt == DType::Bool ? 1.0 : -2.5;
          const std::string what = tag("pad " + shape_str(x.shape()) + " dim " + std::to_string(dim) + " by " +
                                           std::to_string(before) + ", " + std::to_string(after),
                                       dt);
          const Tensor ref = pad(x, dim, before, after, value);
          ASSERT_EQ(ref.size(dim), before + x.size(dim) + after) << what;
          for (double poison : is_floating(dt) ? std::vector<double>{NAN} : std::vector<double>{0.0, 1.0}) {
            const Tensor out = full(ref.shape(), poison, TensorOptions(dt).with_device(kCuda));
            LINEA_BACKEND(kCuda, pad, xd, dim, before, value, out);
            EXPECT_TRUE(matches(out, ref, 1.0, what.c_str())) << "poison " << poison;
          }
          EXPECT_TRUE(matches(pad(xd, dim, before, after, value), ref, 1.0, what.c_str()));
        }
      }
    }
  }
  for (DType dt : kFloatTypes) {
    expect_parity(tag("pad's backward", dt), [](const std::vector<Tensor>& v) { return pad(v[0].t(), 0, 2, 3, 1.0); },
                  {rnd({4, 3}, dt)});
    expect_parity(tag("narrow's backward", dt), [](const std::vector<Tensor>& v) { return narrow(v[0].t(), 1, 1, 2); },
                  {rnd({4, 3}, dt)});
  }
}

// ---- reductions -----------------------------------------------------------------------------------
TEST(CudaParity, Reductions) {
  LINEA_REQUIRE_CUDA();
  manual_seed(5);
  // A bool tensor sums into int64 (the count of true) in one kernel: over rows, the middle dim,
  // dims that are not one range, long rows and columns (the split path's two passes).
  for (const Shape& shape : std::vector<Shape>{{6, 37, 5}, {3, 20001}, {9000, 7}}) {
    const Tensor mask = gt(rnd(shape, DType::Float64), 0.3);
    for (const std::vector<int64_t>& dims :
         std::vector<std::vector<int64_t>>{{0}, {1}, {}, {static_cast<int64_t>(shape.size()) - 1}}) {
      const Tensor ref = sum(mask, dims);
      const Tensor got = sum(mask.to(kCuda), dims);
      ASSERT_EQ(got.dtype(), DType::Int64);
      EXPECT_EQ(got.to(kCPU).to_vector<int64_t>(), ref.to_vector<int64_t>()) << shape_str(shape);
    }
    if (shape.size() == 3) {
      EXPECT_EQ(sum(mask.to(kCuda), {0, 2}).to(kCPU).to_vector<int64_t>(), sum(mask, {0, 2}).to_vector<int64_t>());
    }
  }
  {  // the kernel into a poisoned output: [2, 3, 4] over the middle dim
    const Tensor mask = gt(rnd({2, 3, 4}, DType::Float64), 0.0).to(kCuda);
    const Tensor out = full({2, 4}, -7, TensorOptions(DType::Int64).with_device(kCuda));
    LINEA_BACKEND(kCuda, reduce, ReduceOp::Sum, mask, out, 2, 3, 4);
    EXPECT_EQ(out.to(kCPU).to_vector<int64_t>(), sum(mask.to(kCPU), {1}).to_vector<int64_t>());
    EXPECT_LINEA_ERROR(LINEA_BACKEND(kCuda, reduce, ReduceOp::Max, mask, out, 2, 3, 4),
                       "reduce: a bool tensor sums into int64 only");
  }
  for (DType dt : kFloatTypes) {
    const Tensor x = rnd({6, 37, 5}, dt);
    for (const std::vector<int64_t>& dims : std::vector<std::vector<int64_t>>{{0}, {1}, {2}, {0, 2}, {}, {1, 2}}) {
      std::string d = "dims";
      for (int64_t k : dims) d += " " + std::to_string(k);
      expect_parity(tag("sum " + d, dt), [&](const std::vector<Tensor>& v) { return sum(v[0], dims); }, {x});
      expect_parity(tag("mean keepdim " + d, dt), [&](const std::vector<Tensor>& v) { return mean(v[0], dims, true); },
                    {x});
      expect_parity(tag("max " + d, dt), [&](const std::vector<Tensor>& v) { return max(v[0], dims); }, {x});
      expect_parity(tag("min " + d, dt), [&](const std::vector<Tensor>& v) { return min(v[0], dims); }, {x});
      if (!dims.empty())
        expect_parity(tag("logsumexp " + d, dt), [&](const std::vector<Tensor>& v) { return logsumexp(v[0], dims); },
                      {x});
    }
    expect_parity(tag("var", dt), [](const std::vector<Tensor>& v) { return var(v[0], {1}); }, {x});
    expect_parity(tag("sum of transposed", dt), [](const std::vector<Tensor>& v) { return sum(v[0].t(), {1}); },
                  {rnd({9, 13}, dt)});
    // long reductions: the split (two-pass) path, over the last dim and over the first
    expect_parity(tag("sum long rows", dt), [](const std::vector<Tensor>& v) { return sum(v[0], {1}); },
                  {rnd({3, 20001}, dt)});
    expect_parity(tag("sum long columns", dt), [](const std::vector<Tensor>& v) { return sum(v[0], {0}); },
                  {rnd({9000, 7}, dt)});
    expect_parity(tag("max all long", dt), [](const std::vector<Tensor>& v) { return max(v[0]); }, {rnd({30011}, dt)});
    expect_parity(tag("mean all long", dt), [](const std::vector<Tensor>& v) { return mean(v[0]); },
                  {rnd({257, 129}, dt)});
    expect_parity(tag("logsumexp long", dt), [](const std::vector<Tensor>& v) { return logsumexp(v[0], {0}); },
                  {rnd({5000, 3}, dt)});
    // argmax / argmin (Int64, exact), with ties: first index wins
    for (int64_t dim : {0, 1, 2}) {
      expect_parity(
          tag("argmax dim " + std::to_string(dim), dt),
          [dim](const std::vector<Tensor>& v) { return argmax(v[0], dim); }, {x}, 1.0, false);
      expect_parity(
          tag("argmin dim " + std::to_string(dim), dt),
          [dim](const std::vector<Tensor>& v) { return argmin(v[0], dim, true); }, {x}, 1.0, false);
    }
    const Tensor ties = ints({1, 3, 3, 0, 3, -2, -2, 1, 0, 3, -2, 0}, {3, 4}).to(dt);
    for (int64_t dim : {0, 1}) {
      expect_parity(
          tag("argmax ties", dt), [dim](const std::vector<Tensor>& v) { return argmax(v[0], dim); }, {ties}, 1.0,
          false);
      expect_parity(
          tag("argmin ties", dt), [dim](const std::vector<Tensor>& v) { return argmin(v[0], dim); }, {ties}, 1.0,
          false);
    }
    expect_parity(
        tag("argmax long", dt), [](const std::vector<Tensor>& v) { return argmax(v[0], 1); }, {rnd({2, 40000}, dt)},
        1.0, false);
    expect_parity(
        tag("argmin long", dt), [](const std::vector<Tensor>& v) { return argmin(v[0], 1); }, {rnd({2, 40000}, dt)},
        1.0, false);
    // NaN propagates through max and wins argmax (first NaN)
    std::vector<double> nanv = {1.0, NAN, 5.0, NAN, 2.0, 7.0};
    const Tensor xn = from_vector<double>(nanv, {2, 3}).to(dt);
    expect_parity(
        tag("max with NaN", dt), [](const std::vector<Tensor>& v) { return max(v[0], {1}); }, {xn}, 1.0, false);
    expect_parity(
        tag("argmax with NaN", dt), [](const std::vector<Tensor>& v) { return argmax(v[0], 0); }, {xn}, 1.0, false);
    // Rows with several NaNs, a later one on a lower thread of the tree than the first
    std::vector<double> nans = rnd({3, 600}, DType::Float64).to_vector<double>();
    for (int64_t at : {100, 300, 600 + 250, 600 + 5, 600 + 520, 1200 + 258, 1200 + 3}) nans[at] = NAN;
    const Tensor xnn = from_vector<double>(nans, {3, 600}).to(dt);
    for (bool is_max : {true, false})
      expect_parity(
          tag(is_max ? "argmax of NaNs" : "argmin of NaNs", dt),
          [is_max](const std::vector<Tensor>& v) { return is_max ? argmax(v[0], 1) : argmin(v[0], 1); }, {xnn}, 1.0,
          false);
    // logsumexp of a row of -inf is -inf, of a row with +inf +inf
    const Tensor xi = from_vector<double>({-INFINITY, -INFINITY, 0.5, 1.0, INFINITY, 1.0}, {3, 2}).to(dt);
    expect_parity(
        tag("logsumexp infinite rows", dt), [](const std::vector<Tensor>& v) { return logsumexp(v[0], {1}); }, {xi},
        1.0, false);
  }
  // int64 sums and extremes
  const Tensor xi = ints({4, -2, 9, 0, 7, 7, -5, 3, 1, 2, 8, -9}, {3, 4});
  expect_parity("int64 sum", [](const std::vector<Tensor>& v) { return sum(v[0], {1}); }, {xi});
  expect_parity("int64 max", [](const std::vector<Tensor>& v) { return max(v[0], {0}); }, {xi});
  expect_parity("int64 argmax", [](const std::vector<Tensor>& v) { return argmax(v[0], 1); }, {xi});
  expect_parity("int64 argmin", [](const std::vector<Tensor>& v) { return argmin(v[0], 0); }, {xi});
  // long int64 rows: the split (two-pass) path; values in -50..49, so ties and repeated extremes
  const Tensor xl = randint(-50, 50, {2, 40000});
  expect_parity("int64 sum long", [](const std::vector<Tensor>& v) { return sum(v[0], {1}); }, {xl});
  expect_parity("int64 max long", [](const std::vector<Tensor>& v) { return max(v[0], {1}); }, {xl});
  expect_parity("int64 min long", [](const std::vector<Tensor>& v) { return min(v[0], {1}); }, {xl});
  expect_parity("int64 argmax long", [](const std::vector<Tensor>& v) { return argmax(v[0], 1); }, {xl});
  expect_parity("int64 argmin long", [](const std::vector<Tensor>& v) { return argmin(v[0], 1); }, {xl});
}

// ---- matmul ---------------------------------------------------------------------------------------------
TEST(CudaParity, Matmul) {
  LINEA_REQUIRE_CUDA();
  manual_seed(6);
  auto mm = [](const std::vector<Tensor>& v) { return matmul(v[0], v[1]); };
  for (DType dt : kFloatTypes) {
    expect_parity(tag("2-d", dt), mm, {rnd({17, 33}, dt), rnd({33, 9}, dt)});
    expect_parity(tag("a transposed", dt), [](const std::vector<Tensor>& v) { return matmul(v[0].t(), v[1]); },
                  {rnd({33, 17}, dt), rnd({33, 9}, dt)});
    expect_parity(tag("b transposed", dt), [](const std::vector<Tensor>& v) { return matmul(v[0], v[1].t()); },
                  {rnd({17, 33}, dt), rnd({9, 33}, dt)});
    expect_parity(tag("both transposed", dt), [](const std::vector<Tensor>& v) { return matmul(v[0].t(), v[1].t()); },
                  {rnd({33, 17}, dt), rnd({9, 33}, dt)});
    expect_parity(tag("row slice (ld > cols)", dt),
                  [](const std::vector<Tensor>& v) { return matmul(v[0].narrow(1, 2, 20), v[1]); },
                  {rnd({11, 25}, dt), rnd({20, 6}, dt)});
    expect_parity(tag("batched", dt), mm, {rnd({4, 17, 33}, dt), rnd({4, 33, 9}, dt)});
    expect_parity(tag("shared right operand (folded)", dt), mm, {rnd({2, 3, 5, 7}, dt), rnd({7, 4}, dt)});
    // transposed square matrices, their stride that of a row-major stack: not folded
    expect_parity(tag("shared right operand, transposed left", dt),
                  [](const std::vector<Tensor>& v) { return matmul(v[0].transpose(1, 2), v[1]); },
                  {rnd({3, 5, 5}, dt), rnd({5, 4}, dt)});
    expect_parity(tag("shared left operand (stride 0)", dt), mm, {rnd({5, 7}, dt), rnd({3, 7, 4}, dt)});
    expect_parity(tag("broadcast batch dims (looped)", dt), mm, {rnd({2, 1, 5, 7}, dt), rnd({1, 3, 7, 4}, dt)});
    expect_parity(tag("permuted batch", dt),
                  [](const std::vector<Tensor>& v) { return matmul(v[0].transpose(0, 1), v[1]); },
                  {rnd({5, 3, 7}, dt), rnd({3, 7, 4}, dt)});
    expect_parity(tag("batched transposed", dt),
                  [](const std::vector<Tensor>& v) { return matmul(v[0].transpose(1, 2), v[1].transpose(1, 2)); },
                  {rnd({3, 7, 5}, dt), rnd({3, 4, 7}, dt)});
    expect_parity(tag("vector @ matrix", dt), mm, {rnd({7}, dt), rnd({7, 4}, dt)});
    expect_parity(tag("matrix @ vector", dt), mm, {rnd({5, 7}, dt), rnd({7}, dt)});
    expect_parity(tag("dot", dt), mm, {rnd({31}, dt), rnd({31}, dt)});
    expect_parity(tag("M = N = K = 1", dt), mm, {rnd({1, 1}, dt), rnd({1, 1}, dt)});
    expect_parity(tag("K = 1 outer product", dt), mm, {rnd({6, 1}, dt), rnd({1, 5}, dt)});
    expect_parity(
        tag("bmm", dt), [](const std::vector<Tensor>& v) { return bmm(v[0], v[1]); },
        {rnd({2, 65, 130}, dt), rnd({2, 130, 3}, dt)}, 4.0);  // K = 130: longer sums
  }
}

// Attention's operands: q, k, v [B, H, N, D] viewed from [B, N, H, D] (their B and H strides do
// not collapse into one), and the scores [B, H, N, M] times v: one library call each, whatever
// the batch layout (a pointer-array batched GEMM; before, one call per b).
TEST(CudaParity, MatmulAttentionLayouts) {
  LINEA_REQUIRE_CUDA();
  manual_seed(61);
  const int64_t B = 3, N = 5, M = 7, H = 2, D = 9;
  const auto heads = [](const Tensor& x) { return x.permute({0, 2, 1, 3}); };  // [B, L, H, D] -> [B, H, L, D]
  for (DType dt : kFloatTypes) {
    expect_parity(tag("q k^T", dt),
                  [&](const std::vector<Tensor>& v) { return matmul(heads(v[0]), heads(v[1]).transpose(-1, -2)); },
                  {rnd({B, N, H, D}, dt), rnd({B, M, H, D}, dt)});
    expect_parity(tag("p v", dt), [&](const std::vector<Tensor>& v) { return matmul(v[0], heads(v[1])); },
                  {rnd({B, H, N, M}, dt), rnd({B, M, H, D}, dt)});
    expect_parity(tag("three batch dims, one broadcast", dt),
                  [&](const std::vector<Tensor>& v) {
                    return matmul(v[0].permute({1, 0, 2, 3, 4}), v[1]);
                  },
                  {rnd({2, 3, 2, 4, 5}, dt), rnd({3, 1, 2, 5, 3}, dt)});
  }
  const Tensor q = heads(rnd({B, N, H, D}, DType::Float32).to(kCuda)),
               k = heads(rnd({B, M, H, D}, DType::Float32).to(kCuda));
  const cuda::Counters before = cuda::counters();
  const Tensor s = matmul(q, k.transpose(-1, -2));
  const cuda::Counters c = cuda::counters() - before;
  EXPECT_EQ(c.library_calls, 1) << c.str();
  EXPECT_LE(c.kernel_launches, 1) << c.str();  // the pointer arrays, written on the device
  EXPECT_EQ(c.h2d_copies + c.device_copies, 0) << c.str();
}

// The linear layer's fused pair (x @ w^T + b forward; dw and db in one call backward).
TEST(CudaParity, Linear) {
  LINEA_REQUIRE_CUDA();
  manual_seed(62);
  const Fn lin = [](const std::vector<Tensor>& v) { return linear(v[0], v[1], v[2]); };
  const Fn lin_nb = [](const std::vector<Tensor>& v) { return linear(v[0], v[1]); };
  for (DType dt : kFloatTypes) {
    expect_parity(tag("2-d", dt), lin, {rnd({13, 37}, dt), rnd({11, 37}, dt), rnd({11}, dt)});
    expect_parity(tag("3-d rows", dt), lin, {rnd({3, 7, 37}, dt), rnd({11, 37}, dt), rnd({11}, dt)});
    expect_parity(tag("no bias", dt), lin_nb, {rnd({3, 7, 37}, dt), rnd({11, 37}, dt)});
    expect_parity(tag("transposed input", dt),
                  [](const std::vector<Tensor>& v) { return linear(v[0].t(), v[1], v[2]); },
                  {rnd({37, 13}, dt), rnd({11, 37}, dt), rnd({11}, dt)});
    expect_parity(tag("one row, one output", dt), lin, {rnd({1, 5}, dt), rnd({1, 5}, dt), rnd({1}, dt)});
    expect_parity(tag("many rows (long bias-gradient sums)", dt), lin,
                  {rnd({1029, 6}, dt), rnd({3, 6}, dt), rnd({3}, dt)}, 4.0);
    // no input features: the output is the bias, copied (no GEMM)
    expect_parity(tag("no input features", dt), lin, {rnd({4, 0}, dt), rnd({3, 0}, dt), rnd({3}, dt)});
  }
}

// Linear layers packed in one buffer (MultiHeadAttention's q, k and v): one GEMM forward, and one
// each for x's gradient and for the weights' and biases' when the outputs' gradients come back as
// one buffer's column blocks (here through cat); against the CPU's. Then q, k and v as the heads
// of one such output: the attention's gradients come back packed the same way (so that the
// projections' backward takes them in two GEMMs), equal to the CPU's: softmax's and FAVOR+'s.
TEST(CudaParity, PackedLinearsAndAttentionGradients) {
  LINEA_REQUIRE_CUDA();
  manual_seed(65);
  const auto layers = [](const std::vector<Tensor>& v) {
    return linears(v[0], {narrow(v[1], 0, 0, 11), narrow(v[1], 0, 11, 5), narrow(v[1], 0, 16, 11)},
                   {narrow(v[2], 0, 0, 11), narrow(v[2], 0, 11, 5), narrow(v[2], 0, 16, 11)});
  };
  const Fn packed = [&](const std::vector<Tensor>& v) { return cat(layers(v), -1); };
  for (DType dt : kFloatTypes)
    expect_parity(tag("packed linears", dt), packed, {rnd({3, 37, 19}, dt), rnd({27, 19}, dt), rnd({27}, dt)});
  const Tensor x = rnd({3, 37, 19}, DType::Float32).to(kCuda).requires_grad_(true);
  const Tensor w = rnd({27, 19}, DType::Float32).to(kCuda).requires_grad_(true);
  const Tensor b = rnd({27}, DType::Float32).to(kCuda).requires_grad_(true);
  cuda::Counters before = cuda::counters();
  const Tensor y = packed({x, w, b});
  EXPECT_EQ((cuda::counters() - before).library_calls, 1);
  before = cuda::counters();
  y.backward(rnd(y.shape(), DType::Float32).to(kCuda));
  EXPECT_EQ((cuda::counters() - before).library_calls, 2);  // dx, and dw with db

  // q, k and v: heads of one [B, L, 3 H Dh] tensor; k and v only (cross-attention's memory).
  const int64_t B = 2, L = 37, H = 3, Dh = 20;
  const auto heads = [&](const Tensor& t, int64_t i) {
    return raw::permute(raw::reshape(raw::narrow(t, -1, i * H * Dh, H * Dh), {B, L, H, Dh}), {0, 2, 1, 3});
  };
  const Tensor p = rnd({B, L, 3 * H * Dh}, DType::Float32), q_apart = rnd({B, H, 29, Dh}, DType::Float32);
  const Tensor g = rnd({B, H, L, Dh}, DType::Float32), g29 = rnd({B, H, 29, Dh}, DType::Float32);
  for (bool with_q : {true, false}) {
    SCOPED_TRACE(with_q ? "q, k and v packed" : "k and v packed");
    const auto grads = [&](const Tensor& pp, const Tensor& qa, const Tensor& gg) {
      const Tensor q = with_q ? heads(pp, 0) : qa, k = heads(pp, 1), v = heads(pp, 2);
      const std::vector<Tensor> f = raw::sdpa(q, k, v, 0.3, /*causal=*/false, 0, Tensor());
      return raw::sdpa_backward(gg, q, k, v, f[0], f[1], 0.3, false, 0, Tensor());
    };
    const std::vector<Tensor> ref = grads(p, q_apart, with_q ? g : g29);
    const std::vector<Tensor> got = grads(p.to(kCuda), q_apart.to(kCuda), (with_q ? g : g29).to(kCuda));
    EXPECT_EQ(raw::joined_view({got[0], got[1], got[2]}, 1).defined(), with_q);
    EXPECT_TRUE(raw::joined_view({got[1], got[2]}, 1).defined());
    for (int i = 0; i < 3; ++i)
      EXPECT_TRUE(matches(got[i], ref[i], 1.0, ("d" + std::string("qkv").substr(i, 1)).c_str()));
  }
  // FAVOR+'s fused backward the same way (self-attention: q, k and v packed).
  const Tensor omega = rnd({H, 24, Dh}, DType::Float32);
  const auto favor_grads = [&](const Tensor& pp, const Tensor& w, const Tensor& gg) {
    const Tensor q = heads(pp, 0), k = heads(pp, 1), v = heads(pp, 2);
    const std::vector<Tensor> f = raw::favor_attention(q, k, v, w, 0.4, Tensor(), 1e-6);
    return raw::favor_attention_backward(gg, q, k, v, w, 0.4, f, 1e-6);
  };
  const std::vector<Tensor> ref = favor_grads(p, omega, g);
  const std::vector<Tensor> got = favor_grads(p.to(kCuda), omega.to(kCuda), g.to(kCuda));
  EXPECT_TRUE(raw::joined_view({got[0], got[1], got[2]}, 1).defined());
  for (int i = 0; i < 3; ++i)
    EXPECT_TRUE(matches(got[i], ref[i], 1.0, ("favor d" + std::string("qkv").substr(i, 1)).c_str()));
}

// Several linear layers of one input as one node (attention's q, k, v), x's gradient summed in
// the GEMMs (beta = 1); and matmul_into's accumulate in each of the CUDA matmul's paths (one
// GEMM of a folded batch, a strided batch, a pointer-array batch, a transposed operand, K = 0)
// against the CPU's, into the same random base.
TEST(CudaParity, LinearsAndAccumulatingMatmul) {
  LINEA_REQUIRE_CUDA();
  manual_seed(64);
  const Fn qkv = [](const std::vector<Tensor>& v) {
    return cat(linears(v[0], {v[1], v[2], v[3]}, {v[4], Tensor(), v[5]}), -1);
  };
  for (DType dt : kFloatTypes) {
    expect_parity(
        tag("linears", dt), qkv,
        {rnd({3, 37, 19}, dt), rnd({11, 19}, dt), rnd({5, 19}, dt), rnd({11, 19}, dt), rnd({11}, dt), rnd({11}, dt)});
    expect_parity(
        tag("linears, transposed input", dt),
        [&qkv](const std::vector<Tensor>& v) {
          std::vector<Tensor> t = v;
          t[0] = v[0].t();
          return qkv(t);
        },
        {rnd({19, 37}, dt), rnd({11, 19}, dt), rnd({5, 19}, dt), rnd({11, 19}, dt), rnd({11}, dt), rnd({11}, dt)});
    struct Case {
      const char* what;
      Tensor a, b;
    };
    const std::vector<Case> cases = {
        {"folded batch", rnd({3, 37, 19}, dt), rnd({19, 11}, dt)},
        {"strided batch", rnd({3, 37, 19}, dt), rnd({3, 19, 11}, dt)},
        {"pointer arrays", rnd({2, 5, 3, 19}, dt).permute({1, 0, 2, 3}), rnd({5, 2, 19, 11}, dt)},
        {"transposed", rnd({19, 37}, dt).t(), rnd({11, 19}, dt).t()},
        {"K = 0", rnd({37, 0}, dt), rnd({0, 11}, dt)},
    };
    for (const Case& c : cases) {
      SCOPED_TRACE(tag(c.what, dt));
      const Tensor base = rnd(raw::matmul(c.a, c.b).shape(), dt);
      Tensor ref = clone(base), got = base.to(kCuda);
      raw::matmul_into(c.a, c.b, ref, 1.0, /*accumulate=*/true);
      raw::matmul_into(c.a.to(kCuda), c.b.to(kCuda), got, 1.0, /*accumulate=*/true);
      EXPECT_TRUE(matches(got, ref, 1.0, "accumulated"));
    }
  }
}

// --precision tf32 / bf16: the float32 GEMMs' inputs rounded on the tensor cores, float32
// accumulation. Against the CPU's float32 with a tolerance of those inputs' precision; the
// emulator rounds exactly so, and there the result must also differ from full float32.
TEST(CudaParity, MatmulPrecision) {
  LINEA_REQUIRE_CUDA();
  manual_seed(63);
  const Tensor a = rnd({17, 64}, DType::Float32), b = rnd({64, 9}, DType::Float32);
  const Tensor ref = matmul(a, b);
  const Tensor full = matmul(a.to(kCuda), b.to(kCuda)).to(kCPU);
  for (MatmulPrecision p : {MatmulPrecision::TF32, MatmulPrecision::BF16}) {
    SCOPED_TRACE(precision_name(p));
    set_matmul_precision(p);
    const Tensor got = matmul(a.to(kCuda), b.to(kCuda)).to(kCPU);
    const Tensor lin = linear(a.to(kCuda), b.t().contiguous().to(kCuda), zeros({9}, TensorOptions(kCuda))).to(kCPU);
    set_matmul_precision(MatmulPrecision::Float32);
    // Unit roundoff 2^-11 (tf32) or 2^-8 (bf16) on each input: |error| <~ 2 u sum |a||b| over K = 64.
    const double u = p == MatmulPrecision::TF32 ? std::ldexp(1.0, -11) : std::ldexp(1.0, -8);
    EXPECT_TRUE(test::all_close(got, ref, 2 * u * 64 * 1.0, 0.0));
    EXPECT_TRUE(test::all_close(lin, ref, 2 * u * 64 * 1.0, 0.0));
#ifdef LINEA_CUDA_EMULATOR
    EXPECT_GT(max(abs(got - full)).item(), 0.0);
#endif
  }
  (void)full;
}

// The training step's fused pair against the CPU: grad_norm_guard (2 launches per 256
// gradients) and adam_multi_step (1 launch per 256 parameters), more tensors than one launch
// holds, sizes that are not multiples of the 4096-element chunk, empty ones, and a failed guard.
TEST(CudaParity, FusedOptimizerStep) {
  LINEA_REQUIRE_CUDA();
  manual_seed(64);
  for (DType dt : kFloatTypes) {
    std::vector<Tensor> p, g, m, v, pd, gd, md, vd;
    std::vector<int> group;
    for (int i = 0; i < 300; ++i) {
      const int64_t n = i % 37 == 0 ? 0 : i % 53 == 1 ? 9000 + i : 1 + (i * 7919) % 300;
      p.push_back(rnd({n}, dt));
      g.push_back(rnd({n}, dt, 2.0));
      m.push_back(zeros({n}, TensorOptions(dt)));
      v.push_back(zeros({n}, TensorOptions(dt)));
      for (auto [src, dst] :
           {std::make_pair(&p, &pd), std::make_pair(&g, &gd), std::make_pair(&m, &md), std::make_pair(&v, &vd)})
        dst->push_back(clone(src->back().to(kCuda)));
      group.push_back(i % 3 == 0 ? 1 : 0);
    }
    const Tensor hyper = from_vector<double>({0.01, 0.05, 0.002, 0.0}, {2, 2});
    const Tensor hyperd = hyper.to(kCuda);
    Tensor count = from_vector<int64_t>({4}, {1}), countd = count.to(kCuda);
    for (int step = 0; step < 2; ++step) {
      const Tensor loss = scalar_tensor(step == 0 ? 1.5 : NAN, TensorOptions(dt));
      const Tensor guard = raw::grad_norm_guard(g, loss, 3.0), guardd = raw::grad_norm_guard(gd, loss.to(kCuda), 3.0);
      const std::string what = tag(step == 0 ? "finite step" : "failed guard (NaN loss)", dt);
      EXPECT_TRUE(matches(guardd, guard, 4.0, (what + " guard").c_str()));
      raw::adam_multi_step(p, g, m, v, group, hyper, count, guard, 0.9, 0.99, 1e-8, true);
      raw::adam_multi_step(pd, gd, md, vd, group, hyperd, countd, guardd, 0.9, 0.99, 1e-8, true);
      EXPECT_EQ(countd.to(kCPU).item<int64_t>(), count.item<int64_t>()) << what;
      EXPECT_EQ(count.item<int64_t>(), 5) << what;  // counted once, not by the failed step
      for (size_t i = 0; i < p.size(); ++i) {
        EXPECT_TRUE(matches(pd[i], p[i], 4.0, (what + " param " + std::to_string(i)).c_str()));
        EXPECT_TRUE(matches(vd[i], v[i], 4.0, (what + " v " + std::to_string(i)).c_str()));
      }
    }
    // A finite loss with a gradient that is not fails the guard too: nothing moves.
    g[5] = full(g[5].shape(), INFINITY, TensorOptions(dt));
    gd[5] = g[5].to(kCuda);
    const Tensor p5 = clone(pd[5]),
                 guardd = raw::grad_norm_guard(gd, scalar_tensor(1.5, TensorOptions(dt, kCuda)), 3.0);
    EXPECT_EQ(guardd.to(kCPU).to_vector<double>()[2], 0.0) << tag("infinite gradient", dt);
    raw::adam_multi_step(pd, gd, md, vd, group, hyperd, countd, guardd, 0.9, 0.99, 1e-8, true);
    EXPECT_EQ(countd.to(kCPU).item<int64_t>(), 5) << tag("infinite gradient", dt);
    EXPECT_TRUE(test::all_close(pd[5].to(kCPU), p5.to(kCPU), 0, 0)) << tag("infinite gradient", dt);
  }
  // No tensors, or only empty ones: norm 0, coefficient 1, and the step counts.
  for (size_t n : {0, 3}) {
    const TensorOptions o(DType::Float32, kCuda);
    const std::vector<Tensor> none(n, empty({0}, o));
    const Tensor guard = raw::grad_norm_guard(none, scalar_tensor(2.0, o), 3.0);
    EXPECT_EQ(guard.to(kCPU).to_vector<double>(), (std::vector<double>{0.0, 1.0, 1.0})) << n << " empty";
    Tensor count = from_vector<int64_t>({7}, {1}).to(kCuda);
    raw::adam_multi_step(none, none, none, none, std::vector<int>(n, 0),
                         from_vector<double>({0.1, 0.0}, {1, 2}).to(kCuda), count, guard, 0.9, 0.99, 1e-8, true);
    EXPECT_EQ(count.to(kCPU).item<int64_t>(), 8) << n << " empty";
  }
}

// Dropout's fused kernel: the same Philox counters on both devices, so the same mask, bit for
// bit (forward and the backward that draws it again); odd sizes, inside a BatchRowsGuard.
TEST(CudaParity, DropoutEqualsTheCpuBitForBit) {
  LINEA_REQUIRE_CUDA();
  for (DType dt : kFloatTypes) {
    for (double p : {0.1, 0.5}) {
      const Tensor x0 = rnd({7, 13, 3}, dt), g = rnd({7, 13, 3}, dt);
      Tensor xc = x0.detach(), xd = x0.to(kCuda);
      xc.requires_grad_(true);
      xd.requires_grad_(true);
      BatchRowsGuard rows(5);
      manual_seed(31);
      const Tensor yc = dropout(xc, p, true);
      manual_seed(31);
      const Tensor yd = dropout(xd, p, true);
      yc.backward(g);
      yd.backward(g.to(kCuda));
      EXPECT_TRUE(test::all_close(yd.to(kCPU), yc, 0, 0)) << tag("forward", dt) << " p " << p;
      EXPECT_TRUE(test::all_close(xd.grad().to(kCPU), xc.grad(), 0, 0)) << tag("backward", dt) << " p " << p;
    }
  }
}

TEST(CudaParity, ActivationDropout) {
  LINEA_REQUIRE_CUDA();
  for (DType dt : kFloatTypes) {
    for (UnaryOp act : {UnaryOp::GeluErf, UnaryOp::GeluTanh, UnaryOp::Relu}) {
      for (const Shape& shape : {Shape{7, 13, 3}, Shape{3, 1001}}) {
        expect_parity(tag(std::string(unary_op_name(act)) + " " + shape_str(shape), dt),
                      [act](const std::vector<Tensor>& v) {
                        manual_seed(41);  // the same draw on both devices
                        return activation_dropout(v[0], act, 0.3, true);
                      },
                      {rnd(shape, dt)});
      }
    }
  }
}

// ---- fused nn ops -------------------------------------------------------------------------------------
TEST(CudaParity, Softmax) {
  LINEA_REQUIRE_CUDA();
  manual_seed(7);
  for (DType dt : kFloatTypes) {
    const Tensor x = rnd({4, 37, 6}, dt, 3.0);
    for (int64_t dim : {0, 1, 2}) {
      expect_parity(tag("softmax dim " + std::to_string(dim), dt),
                    [dim](const std::vector<Tensor>& v) { return softmax(v[0], dim); }, {x});
      expect_parity(tag("log_softmax dim " + std::to_string(dim), dt),
                    [dim](const std::vector<Tensor>& v) { return log_softmax(v[0], dim); }, {x});
    }
    expect_parity(tag("softmax long rows", dt), [](const std::vector<Tensor>& v) { return softmax(v[0], 1); },
                  {rnd({3, 1000}, dt)});
    expect_parity(tag("log_softmax transposed", dt),
                  [](const std::vector<Tensor>& v) { return log_softmax(v[0].t(), 1); }, {rnd({19, 5}, dt)});
    expect_parity(tag("softmax r = 1", dt), [](const std::vector<Tensor>& v) { return softmax(v[0], 1); },
                  {rnd({7, 1}, dt)});
    // partially masked rows (-inf), as attention masks produce
    const Tensor mask = from_vector<int64_t>({0, 1, 0, 0, 1, 1, 0, 0, 0, 1, 0, 1}, {3, 4}).to(DType::Bool);
    expect_parity(tag("softmax masked", dt),
                  [](const std::vector<Tensor>& v) { return softmax(masked_fill(v[0], v[1], -INFINITY), 1); },
                  {rnd({3, 4}, dt), mask});
    // Long columns, few of them: runs of rows on many blocks (ColumnRuns: 3 runs of 234 here, the
    // last 232), merged per column; column 2's first 300 rows -inf (a whole run of it)
    const Tensor hide = ints(
                            [] {
                              std::vector<int64_t> r(700 * 5, 0);
                              for (int64_t n = 0; n < 300; ++n) r[static_cast<size_t>(n * 5 + 2)] = 1;
                              return r;
                            }(),
                            {700, 5})
                            .to(DType::Bool);
    for (bool log : {false, true})
      expect_parity(tag(std::string(log ? "log_" : "") + "softmax long columns", dt),
                    [log](const std::vector<Tensor>& v) {
                      const Tensor x = masked_fill(v[0], v[1], -INFINITY);
                      return log ? masked_fill(log_softmax(x, 0), v[1], 0.0) : softmax(x, 0);
                    },
                    {rnd({700, 5}, dt, 3.0), hide});
  }
}

// ---- fused attention kernels -------------------------------------------------------------------
// The backend kernels called directly, their outputs filled with NaN first (a row or element the
// CUDA kernel forgets to write fails), against the CPU kernel on the same random inputs. Sizes
// are not multiples of the CUDA tiles (16 or 32 rows, head dims padded to 32/64/128), with
// cross-attention, causal masks with a query offset (a decoding step), key padding, a batch
// whose keys are all padding (rows that see nothing: out 0, lse -inf, zero gradients), and keys
// split in ranges (few query tiles).
TEST(CudaParity, SoftmaxAttentionKernel) {
  LINEA_REQUIRE_CUDA();
  manual_seed(11);
  struct Case {
    int64_t B, H, N, M, D, E;
    bool causal;
    int64_t offset;
    bool pad;
  };
  const std::vector<Case> cases = {
      {2, 3, 37, 45, 17, 23, false, 0, true},   // cross-attention, padding, odd sizes
      {2, 4, 50, 50, 16, 16, false, 0, false},  // the ViT's heads: 50 tokens, head dim 16
      {1, 2, 50, 50, 64, 64, true, 0, false},   // causal self-attention
      {2, 1, 5, 70, 32, 40, true, 65, true},    // a few new queries after 65 cached keys
      {1, 1, 33, 20, 96, 80, false, 0, false},  // head dims of the 128 tiles
      {3, 2, 1, 1, 8, 8, true, 0, false},       // one token
      // Few query tiles over many keys: the forward and dq kernels split the keys in two ranges
      // (640 + the rest), merged afterwards; a decoding step with padding (a batch all padded),
      // and LARA's landmarks over their keys (head dims of the 64 tiles, LARA's at D = 64).
      {2, 1, 5, 1100, 17, 23, true, 1095, true},
      {1, 1, 20, 1030, 40, 16, false, 0, true},
      {1, 1, 9, 1040, 12, 16, false, 0, true},      // and those of the 16 tiles
      {1, 1, 7, 1030, 80, 100, true, 1023, false},  // and of the 128 tiles (float32 only)
  };
  for (DType dt : kFloatTypes) {
    for (const Case& c : cases) {
      const int64_t dim = std::max(c.D, c.E);
      if (dt == DType::Float64 && dim > 64) continue;  // float64 tiles stop at 64
      SCOPED_TRACE(tag("B " + std::to_string(c.B) + " H " + std::to_string(c.H) + " N " + std::to_string(c.N) + " M " +
                           std::to_string(c.M) + " D " + std::to_string(c.D) + " E " + std::to_string(c.E) +
                           (c.causal ? " causal" : "") + (c.pad ? " padded" : ""),
                       dt));
      const Tensor q = rnd({c.B, c.H, c.N, c.D}, dt), k = rnd({c.B, c.H, c.M, c.D}, dt),
                   v = rnd({c.B, c.H, c.M, c.E}, dt), dout = rnd({c.B, c.H, c.N, c.E}, dt);
      const Tensor pad = c.pad ? key_padding(c.B, c.M) : Tensor();
      const double scale = 1.0 / std::sqrt(static_cast<double>(c.D));
      const TensorOptions cpu_opts(dt);
      const Tensor qd = q.to(kCuda), kd = k.to(kCuda), vd = v.to(kCuda), dd = dout.to(kCuda),
                   pd = pad.defined() ? pad.to(kCuda) : Tensor();
      // plain; with the probabilities dropped (both devices draw the same factors); with a key bias
      // and a gradient of lse (LARA's landmarks)
      const Tensor bias = rnd({c.B, c.H, c.M}, dt), bias_d = bias.to(kCuda);
      const Tensor dlse = rnd({c.B, c.H, c.N}, dt), dlse_d = dlse.to(kCuda);
      for (int variant = 0; variant < 3; ++variant) {
        const FoldedDropout drop = variant == 1 ? FoldedDropout{0.3, 1234, 7, 2, nullptr} : FoldedDropout{};
        const Tensor b = variant == 2 ? bias : Tensor(), bd = variant == 2 ? bias_d : Tensor();
        const Tensor gl = variant == 2 ? dlse : Tensor(), gl_d = variant == 2 ? dlse_d : Tensor();
        SCOPED_TRACE(variant == 0 ? "plain" : variant == 1 ? "dropout 0.3" : "key bias, dlse");
        Tensor out = empty({c.B, c.H, c.N, c.E}, cpu_opts), lse = empty({c.B, c.H, c.N}, cpu_opts);
        cpu::sdpa_forward(q, k, v, scale, c.causal, c.offset, pad, b, drop, out, lse, Tensor());
        Tensor out_d = poisoned(out.shape(), dt), lse_d = poisoned(lse.shape(), dt);
        LINEA_BACKEND(kCuda, sdpa_forward, qd, kd, vd, scale, c.causal, c.offset, pd, bd, drop, out_d, lse_d, Tensor());
        const double long_sum = 4;  // sums over up to 128 dims and 70 keys, in another order
        EXPECT_TRUE(matches(out_d, out, long_sum, "out"));
        EXPECT_TRUE(matches(lse_d, lse, long_sum, "lse"));

        Tensor dq = empty(q.shape(), cpu_opts), dk = empty(k.shape(), cpu_opts), dv = empty(v.shape(), cpu_opts),
               db = b.defined() ? empty(b.shape(), cpu_opts) : Tensor();
        cpu::sdpa_backward(q, k, v, out, lse, Tensor(), dout, gl, scale, c.causal, c.offset, pad, b, drop, dq, dk, dv,
                           db);
        Tensor dq_d = poisoned(q.shape(), dt), dk_d = poisoned(k.shape(), dt), dv_d = poisoned(v.shape(), dt),
               db_d = b.defined() ? poisoned(b.shape(), dt) : Tensor();
        LINEA_BACKEND(kCuda, sdpa_backward, qd, kd, vd, out_d, lse_d, Tensor(), dd, gl_d, scale, c.causal, c.offset, pd,
                      bd, drop, dq_d, dk_d, dv_d, db_d);
        EXPECT_TRUE(matches(dq_d, dq, long_sum, "dq"));
        EXPECT_TRUE(matches(dk_d, dk, long_sum, "dk"));
        EXPECT_TRUE(matches(dv_d, dv, long_sum, "dv"));
        EXPECT_TRUE(matches(db_d, db, long_sum, "dbias"));
      }
    }
  }
}

// RA's fused draw (sdpa_sample) on both devices: every draw an inverse-CDF draw of its row's
// probabilities (test::inverse_cdf_draws: the key of the float64 definition, or where u lies within
// rounding of a boundary a neighbour across it). Query blocks of 64 rows, key tiles of 64 and head
// dims in chunks of 32 all cut off-size; more draws than a warp's 32 (and than two passes' 64) and
// a single draw; padding with a batch all padded (key 0); a single key; the output poisoned before
// the call. float32 takes the tensor cores (3xTF32 scores: TF32's alone miss this tolerance), and
// the SIMT products under LINEA_EMU_CC=75 (tests/cuda_emu/run.sh); float64 the SIMT products.
TEST(CudaParity, AttentionSampleKernel) {
  LINEA_REQUIRE_CUDA();
  manual_seed(12);
  struct Case {
    int64_t B, H, N, M, D, S;
    int pad;  // 0 none, 1 key_padding (the last example all padded), 2 the first 70 keys padded
  };
  const std::vector<Case> cases = {{2, 1, 70, 130, 40, 33, 1},
                                   {1, 2, 5, 64, 64, 70, 0},
                                   {3, 1, 65, 1, 7, 4, 1},
                                   {1, 1, 3, 200, 16, 1, 0},
                                   // a first key tile all hidden: the running max stays -inf through it
                                   {1, 2, 9, 150, 24, 40, 2}};
  for (DType dt : kFloatTypes)
    for (const Case& c : cases) {
      SCOPED_TRACE(tag("B " + std::to_string(c.B) + " H " + std::to_string(c.H) + " N " + std::to_string(c.N) + " M " +
                           std::to_string(c.M) + " D " + std::to_string(c.D) + " S " + std::to_string(c.S) + " pad " +
                           std::to_string(c.pad),
                       dt));
      const Tensor q = rnd({c.B, c.H, c.N, c.D}, dt, 0.5), k = rnd({c.B, c.H, c.M, c.D}, dt);
      const Tensor u = rand({c.B, c.H, c.N, c.S}, test::f64()).to(dt);
      Tensor pad;
      if (c.pad == 1) pad = key_padding(c.B, c.M);
      if (c.pad == 2) {
        std::vector<int64_t> mask(static_cast<size_t>(c.B * c.M));
        for (size_t i = 0; i < mask.size(); ++i) mask[i] = static_cast<int64_t>(i) % c.M < 70;
        pad = ints(mask, {c.B, c.M}).to(DType::Bool);
      }
      const double scale = 0.7, tol = dt == DType::Float64 ? 1e-12 : 5e-5;
      Tensor out = empty(u.shape(), TensorOptions(DType::Int64));
      cpu::sdpa_sample(q, k, pad, u, scale, out);
      Tensor out_d = full(u.shape(), -5, TensorOptions(DType::Int64).with_device(kCuda));
      LINEA_BACKEND(kCuda, sdpa_sample, q.to(kCuda), k.to(kCuda), pad.defined() ? pad.to(kCuda) : Tensor(), u.to(kCuda),
                    scale, out_d);
      EXPECT_TRUE(out_d.is_cuda());
      EXPECT_TRUE(test::inverse_cdf_draws(out_d, q, k, u, scale, pad, tol)) << "CUDA";
      EXPECT_TRUE(test::inverse_cdf_draws(out, q, k, u, scale, pad, tol)) << "CPU";
    }
}

// float32 q, k, v rounded as the tensor cores read them: to bfloat16 (to nearest even), or to
// TF32 (to nearest, ties away: cuda/mma.cuh's round_tf32).
Tensor round_for(MatmulPrecision p, const Tensor& x) {
  std::vector<float> v = x.to_vector<float>();
  for (float& f : v) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    u = p == MatmulPrecision::BF16 ? ((u + 0x7fffu + ((u >> 16) & 1u)) >> 16) << 16 : (u + 0x1000u) & 0xffffe000u;
    std::memcpy(&f, &u, 4);
  }
  return from_vector<float>(v, x.shape());
}

// The tensor-core kernels under --precision bf16 and tf32 (head dims up to 128):
// against the CPU kernels on the same inputs rounded to bf16 or TF32, so that what is left is the
// rounding of the probabilities and score gradients before their products (relative 2^-9 or
// 2^-11 each) and the order of the sums. Sizes off the 64-row, 64-key and 32-query tiles, head
// dims of each tile width (16, 32, 64, 128), padding, causal with an offset, every key of a batch
// padded, dropout and a key bias. (Under the default precision the same kernels split each
// operand in three TF32 products: SoftmaxAttentionKernel holds them to float32's tolerance.)
TEST(CudaParity, SoftmaxAttentionTensorCores) {
  LINEA_REQUIRE_CUDA();
  manual_seed(19);
  struct Case {
    int64_t B, H, N, M, D, E;
    bool causal;
    int64_t offset;
    bool pad;
  };
  const std::vector<Case> cases = {
      {2, 2, 70, 150, 40, 24, false, 0, true},   // cross-attention, padding, 3 key tiles
      {2, 4, 50, 50, 16, 16, false, 0, false},   // the ViT's heads: 50 tokens, head dim 16
      {1, 2, 50, 50, 64, 64, true, 0, false},    // causal
      {1, 1, 150, 150, 24, 32, true, 0, true},   // causal over 3 key tiles: later tiles skip early queries
      {1, 1, 5, 140, 20, 17, true, 131, false},  // a few new queries after 131 cached keys
      {1, 1, 65, 33, 96, 128, false, 0, false},  // head dims of the 128 tiles, a second row tile
      {2, 1, 1, 1, 8, 8, true, 0, false},        // one token
      // Unmasked tiles (no per-element checks) beside masked ones, over 4 key tiles: both stages
      // of the double buffer twice; causal, where a row tile's first key tiles are fully visible.
      {1, 2, 70, 230, 32, 32, false, 0, false},
      {1, 1, 200, 200, 64, 48, true, 0, false},
      {1, 1, 40, 150, 128, 100, false, 0, false},  // head dims of 128 (70 KB of tiles), 3 key tiles
      {1, 2, 3, 0, 8, 8, false, 0, false},         // no keys: out 0, lse -inf
      {1, 1, 20, 1030, 32, 24, true, 1020, true},  // keys in two ranges (see SoftmaxAttentionKernel)
  };
  struct Restore {
    ~Restore() { set_matmul_precision(MatmulPrecision::Float32); }
  } restore;
  for (const MatmulPrecision precision : {MatmulPrecision::BF16, MatmulPrecision::TF32})
    for (const Case& c : cases) {
      const bool bf16 = precision == MatmulPrecision::BF16;
      SCOPED_TRACE(std::string(bf16 ? "bf16" : "tf32") + " B " + std::to_string(c.B) + " H " + std::to_string(c.H) +
                   " N " + std::to_string(c.N) + " M " + std::to_string(c.M) + " D " + std::to_string(c.D) + " E " +
                   std::to_string(c.E) + (c.causal ? " causal" : "") + (c.pad ? " padded" : ""));
      // The rounding of P and dS: 2^-9 (bf16) or 2^-11 (TF32) relative.
      const double tol = bf16 ? 1e-2 : 2.5e-3;
      const DType dt = DType::Float32;
      const Tensor q = rnd({c.B, c.H, c.N, c.D}, dt), k = rnd({c.B, c.H, c.M, c.D}, dt),
                   v = rnd({c.B, c.H, c.M, c.E}, dt), dout = rnd({c.B, c.H, c.N, c.E}, dt);
      const Tensor qr = round_for(precision, q), kr = round_for(precision, k), vr = round_for(precision, v),
                   dr = round_for(precision, dout);
      const Tensor qd = q.to(kCuda), kd = k.to(kCuda), vd = v.to(kCuda), dd = dout.to(kCuda);
      const Tensor pad = c.pad ? key_padding(c.B, c.M) : Tensor();
      const double scale = 1.0 / std::sqrt(static_cast<double>(c.D));
      const Tensor bias = rnd({c.B, c.H, c.M}, dt);
      for (int variant = 0; variant < 3; ++variant) {
        const FoldedDropout drop = variant == 1 ? FoldedDropout{0.3, 1234, 7, 2, nullptr} : FoldedDropout{};
        const Tensor b = variant == 2 ? bias : Tensor();
        SCOPED_TRACE(variant == 0 ? "plain" : variant == 1 ? "dropout 0.3" : "key bias");
        Tensor out = empty({c.B, c.H, c.N, c.E}, TensorOptions(dt)), lse = empty({c.B, c.H, c.N}, TensorOptions(dt));
        cpu::sdpa_forward(qr, kr, vr, scale, c.causal, c.offset, pad, b, drop, out, lse, Tensor());
        Tensor out_d = poisoned(out.shape(), dt), lse_d = poisoned(lse.shape(), dt);
        const Tensor pd = pad.defined() ? pad.to(kCuda) : Tensor(), bd = b.defined() ? b.to(kCuda) : Tensor();
        set_matmul_precision(precision);
        LINEA_BACKEND(kCuda, sdpa_forward, qd, kd, vd, scale, c.causal, c.offset, pd, bd, drop, out_d, lse_d, Tensor());
        set_matmul_precision(MatmulPrecision::Float32);
        // |out| <= max |v| ~ 4: the probabilities' rounding moves it by about 2^-9 (2^-11) of that.
        EXPECT_TRUE(test::all_close(out_d.to(kCPU), out, tol, tol)) << "out";
        EXPECT_TRUE(test::all_close(lse_d.to(kCPU), lse, 1e-4, 1e-5)) << "lse";
#ifdef LINEA_CUDA_EMULATOR
        if (c.M > 1) {
          EXPECT_GT(max(abs(out_d.to(kCPU) - out)).item(), 0.0) << "the probabilities were not rounded";
        }
#endif

        // The backward from the CPU's out and lse, so that only its own rounding is measured.
        Tensor dq = empty(q.shape(), TensorOptions(dt)), dk = empty(k.shape(), TensorOptions(dt)),
               dv = empty(v.shape(), TensorOptions(dt)),
               db = b.defined() ? empty(b.shape(), TensorOptions(dt)) : Tensor();
        cpu::sdpa_backward(qr, kr, vr, out, lse, Tensor(), dr, Tensor(), scale, c.causal, c.offset, pad, b, drop, dq,
                           dk, dv, db);
        Tensor dq_d = poisoned(q.shape(), dt), dk_d = poisoned(k.shape(), dt), dv_d = poisoned(v.shape(), dt),
               db_d = b.defined() ? poisoned(b.shape(), dt) : Tensor();
        set_matmul_precision(precision);
        LINEA_BACKEND(kCuda, sdpa_backward, qd, kd, vd, out.to(kCuda), lse.to(kCuda), Tensor(), dd, Tensor(), scale,
                      c.causal, c.offset, pd, bd, drop, dq_d, dk_d, dv_d, db_d);
        set_matmul_precision(MatmulPrecision::Float32);
        EXPECT_TRUE(test::all_close(dq_d.to(kCPU), dq, 2 * tol, 2 * tol)) << "dq";
        EXPECT_TRUE(test::all_close(dk_d.to(kCPU), dk, 2 * tol, 2 * tol)) << "dk";
        EXPECT_TRUE(test::all_close(dv_d.to(kCPU), dv, 2 * tol, 2 * tol)) << "dv";
        if (b.defined()) {
          EXPECT_TRUE(test::all_close(db_d.to(kCPU), db, 2 * tol, 2 * tol)) << "dbias";
        }
      }
    }
}

// The kernels read q, k, v, dout and out and write out, dq, dk and dv where the heads lie (any
// batch, head and row strides): the same bits as on dense [B, H, L, D] copies, in every path
// (float64 SIMT, 3xTF32, bf16, TF32), and nothing written between a view's rows. Operands are
// heads of [B, L, H, pitch] buffers (a projection's layout; pitch past the head dims: rows off 16
// bytes) and keys and values shared by all heads (head stride 0); the key padding's rows lie apart
// as a decoding cache's do (in_wider_rows).
TEST(CudaParity, SoftmaxAttentionHeadStrides) {
  LINEA_REQUIRE_CUDA();
  manual_seed(29);
  struct Case {
    int64_t B, H, N, M, D, E, pitch;
    bool causal, pad, shared_kv;
  };
  const std::vector<Case> cases = {
      {2, 3, 37, 45, 17, 23, 26, false, true, false},   // cross-attention, padding, odd rows
      {2, 4, 50, 50, 16, 16, 16, false, false, false},  // the ViT's heads, rows on 16 bytes
      {1, 3, 70, 70, 32, 32, 36, true, false, true},    // causal, one key/value head for all
  };
  // The same values (the inputs are finite: a NaN, such as an unwritten poisoned element, differs).
  const auto same_bits = [](const Tensor& got, const Tensor& ref, const char* what) {
    const std::vector<double> a = got.to(kCPU).to(DType::Float64).to_vector<double>(),
                              b = ref.to(kCPU).to(DType::Float64).to_vector<double>();
    size_t differ = 0;
    for (size_t i = 0; i < a.size(); ++i) differ += !(a[i] == b[i]);
    EXPECT_EQ(differ, 0u) << what << ": " << differ << " of " << a.size() << " differ";
  };
  struct Restore {
    ~Restore() { set_matmul_precision(MatmulPrecision::Float32); }
  } restore;
  const std::vector<std::pair<DType, MatmulPrecision>> paths = {{DType::Float64, MatmulPrecision::Float32},
                                                                {DType::Float32, MatmulPrecision::Float32},
                                                                {DType::Float32, MatmulPrecision::BF16},
                                                                {DType::Float32, MatmulPrecision::TF32}};
  for (const auto& [dt, precision] : paths)
    for (const Case& c : cases) {
      SCOPED_TRACE(tag(std::string(precision_name(precision)) + " B " + std::to_string(c.B) + " H " +
                           std::to_string(c.H) + " N " + std::to_string(c.N) + " M " + std::to_string(c.M) + " D " +
                           std::to_string(c.D) + " E " + std::to_string(c.E) + " pitch " + std::to_string(c.pitch),
                       dt));
      const int64_t kvH = c.shared_kv ? 1 : c.H;
      const auto filled = [&](int64_t H, int64_t L, int64_t dim) {  // random heads of a poisoned buffer
        Tensor view = heads(c.B, H, L, dim, c.pitch, dt);
        view.copy_(rnd(view.shape(), dt).to(kCuda));
        return view;
      };
      Tensor q = filled(c.H, c.N, c.D), dout = filled(c.H, c.N, c.E), k = filled(kvH, c.M, c.D),
             v = filled(kvH, c.M, c.E);
      if (c.shared_kv) {
        k = expand(k, {c.B, c.H, c.M, c.D});
        v = expand(v, {c.B, c.H, c.M, c.E});
      }
      const Tensor pad = c.pad ? key_padding(c.B, c.M).to(kCuda) : Tensor();
      const Tensor pad_s = c.pad ? in_wider_rows(key_padding(c.B, c.M)) : Tensor();  // rows M + 3 apart
      const double scale = 1.0 / std::sqrt(static_cast<double>(c.D));
      const FoldedDropout drop{0.2, 99, 3, 1, nullptr};
      set_matmul_precision(precision);
      // Reference: dense copies, dense outputs.
      const Tensor qc = contiguous(q), kc = contiguous(k), vc = contiguous(v), dc = contiguous(dout);
      Tensor out = poisoned({c.B, c.H, c.N, c.E}, dt), lse = poisoned({c.B, c.H, c.N}, dt);
      LINEA_BACKEND(kCuda, sdpa_forward, qc, kc, vc, scale, c.causal, 0, pad, Tensor(), drop, out, lse, Tensor());
      Tensor dq = poisoned(q.shape(), dt), dk = poisoned(k.shape(), dt), dv = poisoned(v.shape(), dt);
      LINEA_BACKEND(kCuda, sdpa_backward, qc, kc, vc, out, lse, Tensor(), dc, Tensor(), scale, c.causal, 0, pad,
                    Tensor(), drop, dq, dk, dv, Tensor());
      // Strided: the views in, outputs into heads of poisoned buffers.
      Tensor out_s = heads(c.B, c.H, c.N, c.E, c.pitch, dt), lse_s = poisoned({c.B, c.H, c.N}, dt);
      LINEA_BACKEND(kCuda, sdpa_forward, q, k, v, scale, c.causal, 0, pad_s, Tensor(), drop, out_s, lse_s, Tensor());
      Tensor dq_s = heads(c.B, c.H, c.N, c.D, c.pitch, dt), dk_s = heads(c.B, c.H, c.M, c.D, c.pitch, dt),
             dv_s = heads(c.B, c.H, c.M, c.E, c.pitch, dt);
      LINEA_BACKEND(kCuda, sdpa_backward, q, k, v, out_s, lse_s, Tensor(), dout, Tensor(), scale, c.causal, 0, pad_s,
                    Tensor(), drop, dq_s, dk_s, dv_s, Tensor());
      set_matmul_precision(MatmulPrecision::Float32);
      same_bits(out_s, out, "out");
      same_bits(lse_s, lse, "lse");
      same_bits(dq_s, dq, "dq");
      same_bits(dk_s, dk, "dk");
      same_bits(dv_s, dv, "dv");
      for (const auto& [view, dim, what] : {std::tuple{out_s, c.E, "out"}, std::tuple{dq_s, c.D, "dq"},
                                            std::tuple{dk_s, c.D, "dk"}, std::tuple{dv_s, c.E, "dv"}})
        gaps_untouched(view, dim, c.pitch, what);
    }
}

// Called directly (not through raw::as_head_rows), the CUDA kernels refuse what they cannot read
// as rows of heads, as the CPU's do (one rule, is_head_rows in core/kernels.h): a row's values
// apart, rows that overlap (an expand along L, whose outputs' rows would race); naming the device,
// the op and the strides. The same tensors copied contiguous run.
TEST(CudaParity, FusedAttentionKernelsRefuseLayoutsTheyCannotRead) {
  LINEA_REQUIRE_CUDA();
  manual_seed(31);
  const int64_t B = 1, H = 2, N = 5, M = 7, D = 4, S = 8;
  const auto on_gpu = [](const Tensor& t) { return t.to(kCuda); };
  const Tensor q = on_gpu(randn({B, H, N, D})), k = on_gpu(randn({B, H, M, D})), v = on_gpu(randn({B, H, M, D}));
  const Tensor columns = transpose(on_gpu(randn({B, H, D, N})), 2, 3);       // values N apart
  const Tensor one_row = expand(on_gpu(randn({B, H, 1, D})), {B, H, N, D});  // rows 0 apart
  const TensorOptions gpu(kCuda);
  const Tensor out = empty({B, H, N, D}, gpu), lse = empty({B, H, N}, gpu);
  const auto sdpa = [&](const Tensor& qq, const Tensor& o) {
    LINEA_BACKEND(kCuda, sdpa_forward, qq, k, v, 0.5, false, 0, Tensor(), Tensor(), FoldedDropout(), o, lse, Tensor());
  };
  EXPECT_LINEA_ERROR(sdpa(columns, out),
                     "sdpa: the CUDA kernel reads and writes rows of contiguous values, rows apart");
  EXPECT_LINEA_ERROR(sdpa(one_row, out), "strides [");
  EXPECT_LINEA_ERROR(sdpa(q, expand(empty({B, H, 1, D}, gpu), {B, H, N, D})),
                     "sdpa: the CUDA kernel reads and writes rows");
  EXPECT_NO_THROW(sdpa(contiguous(columns), out));
  EXPECT_NO_THROW(sdpa(contiguous(one_row), out));
  // FAVOR+'s fused forward, by the same rule.
  const Tensor omega = on_gpu(randn({H, S, D}));
  const auto favor = [&](const Tensor& qq) {
    LINEA_BACKEND(kCuda, favor_attention_forward, qq, k, v, omega, 0.5, Tensor(), 1e-6, false, 64,
                  empty({B, H, N, D}, gpu), empty({B, H, N}, gpu), empty({B, H, S, D + 1}, gpu),
                  empty({B, H, N, S}, gpu), empty({B, H, M, S}, gpu));
  };
  EXPECT_LINEA_ERROR(favor(one_row), "favor_attention: the CUDA kernel reads and writes rows");
  EXPECT_NO_THROW(favor(contiguous(one_row)));
}

// A query whose scores are all NaN gets NaN out and lse on both devices and in both CUDA paths
// (not the zeros and -inf of a query that sees no key), the other rows stay finite.
TEST(CudaParity, SoftmaxAttentionPropagatesNaN) {
  LINEA_REQUIRE_CUDA();
  manual_seed(23);
  std::vector<float> qv = rnd({1, 1, 3, 8}, DType::Float32).to_vector<float>();
  for (int d = 8; d < 16; ++d) qv[d] = NAN;  // row 1
  const Tensor q = from_vector<float>(qv, {1, 1, 3, 8}), k = rnd({1, 1, 5, 8}, DType::Float32),
               v = rnd({1, 1, 5, 4}, DType::Float32);
  struct Restore {
    ~Restore() { set_matmul_precision(MatmulPrecision::Float32); }
  } restore;
  for (MatmulPrecision p : {MatmulPrecision::Float32, MatmulPrecision::BF16}) {
    SCOPED_TRACE(precision_name(p));
    Tensor out = poisoned({1, 1, 3, 4}, DType::Float32), lse = poisoned({1, 1, 3}, DType::Float32);
    set_matmul_precision(p);
    LINEA_BACKEND(kCuda, sdpa_forward, q.to(kCuda), k.to(kCuda), v.to(kCuda), 0.5, false, 0, Tensor(), Tensor(),
                  FoldedDropout{}, out, lse, Tensor());
    set_matmul_precision(MatmulPrecision::Float32);
    const std::vector<float> o = out.to(kCPU).to_vector<float>(), l = lse.to(kCPU).to_vector<float>();
    for (int n = 0; n < 3; ++n) {
      EXPECT_EQ(std::isnan(l[n]), n == 1) << "lse row " << n;
      for (int e = 0; e < 4; ++e) EXPECT_EQ(std::isnan(o[n * 4 + e]), n == 1) << "out row " << n;
    }
  }
}

// Bidirectional linear attention's kernels, as the softmax ones above: positive features (the
// performer's), some query rows so small that the denominator guard is active, NaN-poisoned
// outputs, sizes that are not powers of two.
// A factor per query row [1, 1, N, 1] (float64): 1, or for the rows `tiny` picks 1e-7 and -1e-7
// in turn, so that a linear attention's denominator falls under its guard with either sign.
template <typename Pick> Tensor tiny_rows(int64_t N, Pick tiny) {
  std::vector<double> f(static_cast<size_t>(N), 1.0);
  double sign = 1.0;
  for (int64_t n = 0; n < N; ++n)
    if (tiny(n)) {
      f[static_cast<size_t>(n)] = sign * 1e-7;
      sign = -sign;
    }
  return from_vector<double>(f, {1, 1, N, 1});
}

TEST(CudaParity, LinearAttentionKernel) {
  LINEA_REQUIRE_CUDA();
  manual_seed(13);
  struct Case {
    int64_t B, H, N, M, S, E;
  };
  // 700 keys: the key sums in 3 runs of rows (ColumnRuns), the last one short (234, 234, 232); S
  // and E past a warp's 32 lanes (the row passes take a warp per row: a short last round)
  const std::vector<Case> cases = {
      {2, 3, 37, 45, 17, 23}, {1, 1, 1, 1, 1, 1}, {1, 2, 70, 5, 64, 16}, {1, 2, 9, 700, 8, 5}, {1, 2, 11, 13, 40, 37}};
  const double guard = 1e-3;
  for (DType dt : kFloatTypes) {
    for (const Case& c : cases) {
      SCOPED_TRACE(tag("B " + std::to_string(c.B) + " H " + std::to_string(c.H) + " N " + std::to_string(c.N) + " M " +
                           std::to_string(c.M) + " S " + std::to_string(c.S) + " E " + std::to_string(c.E),
                       dt));
      Tensor pq = exp(rnd({c.B, c.H, c.N, c.S}, dt, 0.5)), pk = exp(rnd({c.B, c.H, c.M, c.S}, dt, 0.5));
      // every fifth query row tiny, every other one of those negative: its denominator falls under
      // the guard, which keeps its sign
      pq = mul(pq, tiny_rows(c.N, [](int64_t n) { return n % 5 == 2; }).to(dt));
      const Tensor v = rnd({c.B, c.H, c.M, c.E}, dt), dout = rnd({c.B, c.H, c.N, c.E}, dt);
      const TensorOptions cpu_opts(dt);
      const Shape out_s{c.B, c.H, c.N, c.E}, den_s{c.B, c.H, c.N}, kvz_s{c.B, c.H, c.S, c.E + 1};
      Tensor out = empty(out_s, cpu_opts), den = empty(den_s, cpu_opts), kvz = empty(kvz_s, cpu_opts);
      cpu::linear_attention_forward(pq, pk, v, guard, out, den, kvz);
      const Tensor pqd = pq.to(kCuda), pkd = pk.to(kCuda), vd = v.to(kCuda), dd = dout.to(kCuda);
      Tensor out_d = poisoned(out_s, dt), den_d = poisoned(den_s, dt), kvz_d = poisoned(kvz_s, dt);
      LINEA_BACKEND(kCuda, linear_attention_forward, pqd, pkd, vd, guard, out_d, den_d, kvz_d);
      const double long_sum = 8;  // sums over up to 64 features and 45 keys, in another order
      EXPECT_TRUE(matches(out_d, out, long_sum, "out"));
      EXPECT_TRUE(matches(den_d, den, long_sum, "den"));
      EXPECT_TRUE(matches(kvz_d, kvz, long_sum, "kvz"));

      Tensor dpq = empty(pq.shape(), cpu_opts), dpk = empty(pk.shape(), cpu_opts), dv = empty(v.shape(), cpu_opts);
      cpu::linear_attention_backward(pq, pk, v, out, den, kvz, dout, guard, dpq, dpk, dv);
      Tensor dpq_d = poisoned(pq.shape(), dt), dpk_d = poisoned(pk.shape(), dt), dv_d = poisoned(v.shape(), dt);
      LINEA_BACKEND(kCuda, linear_attention_backward, pqd, pkd, vd, out_d, den_d, kvz_d, dd, guard, dpq_d, dpk_d, dv_d);
      EXPECT_TRUE(matches(dpq_d, dpq, long_sum, "dphi_q"));
      EXPECT_TRUE(matches(dpk_d, dpk, long_sum, "dphi_k"));
      EXPECT_TRUE(matches(dv_d, dv, long_sum, "dv"));
    }
  }
}

// Causal linear attention's kernels, as above: N off the chunk (padded chunks) and on it (the
// inputs used in place), chunks of one row and longer than N, with and without a carried state
// (and its gradient), tiny query rows under the guard.
TEST(CudaParity, CausalLinearAttentionKernel) {
  LINEA_REQUIRE_CUDA();
  manual_seed(21);
  struct Case {
    int64_t B, H, N, S, E, chunk;
    bool state;
  };
  const std::vector<Case> cases = {{2, 3, 37, 17, 23, 8, true}, {1, 2, 40, 5, 3, 8, false},   {1, 1, 1, 1, 1, 4, true},
                                   {2, 1, 9, 6, 4, 1, false},   {1, 2, 70, 64, 16, 64, true}, {1, 1, 5, 3, 2, 16, true},
                                   {1, 2, 19, 40, 37, 8, true}};  // S and E past a warp's lanes
  const double guard = 1e-3;
  for (DType dt : kFloatTypes) {
    for (const Case& c : cases) {
      SCOPED_TRACE(tag("B " + std::to_string(c.B) + " H " + std::to_string(c.H) + " N " + std::to_string(c.N) + " S " +
                           std::to_string(c.S) + " E " + std::to_string(c.E) + " chunk " + std::to_string(c.chunk) +
                           (c.state ? " state" : ""),
                       dt));
      const int64_t C = (c.N + c.chunk - 1) / c.chunk;
      Tensor pq = exp(rnd({c.B, c.H, c.N, c.S}, dt, 0.5)), pk = exp(rnd({c.B, c.H, c.N, c.S}, dt, 0.5));
      // without a state, every fifth query row tiny, every other one of those negative: its
      // denominator falls under the guard, which keeps its sign (with a state, the guard's 1/den~
      // would only magnify the rounding of the state's product)
      pq = mul(pq, tiny_rows(c.N, [&](int64_t n) { return !c.state && n % 5 == 2; }).to(dt));
      const Tensor v = rnd({c.B, c.H, c.N, c.E}, dt), dout = rnd({c.B, c.H, c.N, c.E}, dt);
      const Tensor state = c.state ? exp(rnd({c.B, c.H, c.S, c.E + 1}, dt, 0.5)) : Tensor();
      const TensorOptions cpu_opts(dt);
      const Shape out_s{c.B, c.H, c.N, c.E}, den_s{c.B, c.H, c.N}, states_s{c.B, c.H, C, c.S, c.E + 1},
          state_s{c.B, c.H, c.S, c.E + 1};
      Tensor out = empty(out_s, cpu_opts), den = empty(den_s, cpu_opts), states = empty(states_s, cpu_opts),
             final = empty(state_s, cpu_opts);
      cpu::causal_linear_attention_forward(pq, pk, v, state, c.chunk, guard, out, den, states, final);
      const Tensor pqd = pq.to(kCuda), pkd = pk.to(kCuda), vd = v.to(kCuda), dd = dout.to(kCuda),
                   sd = c.state ? state.to(kCuda) : Tensor();
      Tensor out_d = poisoned(out_s, dt), den_d = poisoned(den_s, dt), states_d = poisoned(states_s, dt),
             final_d = poisoned(state_s, dt);
      LINEA_BACKEND(kCuda, causal_linear_attention_forward, pqd, pkd, vd, sd, c.chunk, guard, out_d, den_d, states_d,
                    final_d);
      const double long_sum = 8;  // sums over up to 64 features and 70 keys, in another order
      EXPECT_TRUE(matches(out_d, out, long_sum, "out"));
      EXPECT_TRUE(matches(den_d, den, long_sum, "den"));
      EXPECT_TRUE(matches(states_d, states, long_sum, "states"));
      EXPECT_TRUE(matches(final_d, final, long_sum, "final"));

      Tensor dpq = empty(pq.shape(), cpu_opts), dpk = empty(pk.shape(), cpu_opts), dv = empty(v.shape(), cpu_opts),
             dstate = c.state ? empty(state_s, cpu_opts) : Tensor();
      cpu::causal_linear_attention_backward(pq, pk, v, out, den, states, dout, c.chunk, guard, dpq, dpk, dv, dstate);
      Tensor dpq_d = poisoned(pq.shape(), dt), dpk_d = poisoned(pk.shape(), dt), dv_d = poisoned(v.shape(), dt),
             dstate_d = c.state ? poisoned(state_s, dt) : Tensor();
      LINEA_BACKEND(kCuda, causal_linear_attention_backward, pqd, pkd, vd, out_d, den_d, states_d, dd, c.chunk, guard,
                    dpq_d, dpk_d, dv_d, dstate_d);
      EXPECT_TRUE(matches(dpq_d, dpq, long_sum, "dphi_q"));
      EXPECT_TRUE(matches(dpk_d, dpk, long_sum, "dphi_k"));
      EXPECT_TRUE(matches(dv_d, dv, long_sum, "dv"));
      if (c.state) {
        EXPECT_TRUE(matches(dstate_d, dstate, long_sum, "dstate"));
      }
    }
  }
}

// The positive random features' kernels, as above: both stabilizers (per row for queries, per
// (b, h) over the unpadded rows for keys), padded rows and a batch that is all padding,
// NaN-poisoned outputs, the weight gradient with and without.
TEST(CudaParity, PositiveFeaturesKernel) {
  LINEA_REQUIRE_CUDA();
  manual_seed(14);
  struct Case {
    int64_t B, H, L, D, S;
  };
  // (rows wider than a warp's 32 lanes in both D and S: the fourth case; more rows than a block's
  // 256 threads, each thread's part of the sequence max several rows: the last)
  const std::vector<Case> cases = {
      {2, 3, 37, 17, 23}, {1, 1, 1, 1, 1}, {3, 2, 70, 16, 64}, {2, 1, 9, 40, 70}, {1, 3, 600, 8, 5}};
  for (DType dt : kFloatTypes) {
    for (const Case& c : cases) {
      for (bool per_row : {true, false}) {
        for (bool padded : {false, true}) {
          SCOPED_TRACE(tag("B " + std::to_string(c.B) + " H " + std::to_string(c.H) + " L " + std::to_string(c.L) +
                               " D " + std::to_string(c.D) + " S " + std::to_string(c.S) +
                               (per_row ? " per row" : " per sequence") + (padded ? " padded" : ""),
                           dt));
          const Tensor x = rnd({c.B, c.H, c.L, c.D}, dt, 0.5), w = rnd({c.H, c.S, c.D}, dt),
                       dphi = rnd({c.B, c.H, c.L, c.S}, dt);
          Tensor pad;
          if (padded) {  // batch 0: every fourth row padded; the last batch: all of them
            std::vector<int64_t> mask(static_cast<size_t>(c.B * c.L), 0);
            for (int64_t l = 0; l < c.L; ++l) mask[l] = l % 4 == 3;
            for (int64_t l = 0; l < c.L; ++l) mask[(c.B - 1) * c.L + l] = c.B > 1 ? 1 : mask[l];
            pad = ints(mask, {c.B, c.L}).to(DType::Bool);
          }
          const TensorOptions cpu_opts(dt);
          Tensor phi = empty(dphi.shape(), cpu_opts);
          cpu::positive_features_forward(x, w, per_row, pad, phi);
          const Tensor xd = x.to(kCuda), wd = w.to(kCuda), gd = dphi.to(kCuda),
                       pd = pad.defined() ? pad.to(kCuda) : Tensor();
          Tensor phi_d = poisoned(phi.shape(), dt);
          LINEA_BACKEND(kCuda, positive_features_forward, xd, wd, per_row, pd, phi_d);
          const double long_sum = 8;  // sums over up to 17 dims, exp of them
          EXPECT_TRUE(matches(phi_d, phi, long_sum, "phi"));
          for (bool want_w : {true, false}) {
            Tensor dx = empty(x.shape(), cpu_opts), dw = want_w ? empty(w.shape(), cpu_opts) : Tensor();
            cpu::positive_features_backward(x, w, phi, dphi, dx, dw);
            Tensor dx_d = poisoned(x.shape(), dt), dw_d = want_w ? poisoned(w.shape(), dt) : Tensor();
            LINEA_BACKEND(kCuda, positive_features_backward, xd, wd, phi_d, gd, dx_d, dw_d);
            EXPECT_TRUE(matches(dx_d, dx, long_sum, "dx"));
            if (want_w) {
              EXPECT_TRUE(matches(dw_d, dw, long_sum * 4, "domega"));  // summed over B * L rows
            }
          }
        }
      }
    }
  }
}

// FAVOR+ attention's fused kernels (cuda/favor_attention.cu) against the CPU's composed op
// (positive_features, then linear_attention): sizes off the 64-row tiles and the 64-wide blocks
// (S, D or E past 64 take two blocks: float32 only, float64 does not fit the emulator's 227 KB of
// shared memory there and must decline), several runs of key and query tiles (M = 600, N = 330),
// key padding with a batch that is all padding (its denominators 0: the guard), the heads of
// [B, L, H, pitch] buffers in and out (nothing written between a view's rows), the padding a view
// of a wider mask's rows, NaN-poisoned outputs. Where the kernels decline (favor_attention_fused), the raw op composes
// the two ops on CUDA: compared too. Causal (N = M, chunks of 64 rows: a scan over the chunk states, each chunk's own
// keys through its masked products; against positive features, then causal_linear_attention): one row, a short last
// chunk, several chunks (N = 200: three whole and one of 8), two whole chunks, S, D or E in two blocks; float64 is
// never fused causal (the key gradients' tiles exceed a block's shared memory), nor a chunk other than 64.
TEST(CudaParity, FavorAttentionKernel) {
  LINEA_REQUIRE_CUDA();
  manual_seed(31);
  struct Case {
    int64_t B, H, N, M, D, E, S, pitch;
    bool pad, fits_f64, causal;
  };
  const std::vector<Case> cases = {
      {2, 3, 37, 45, 17, 23, 23, 26, true, true, false},    {1, 1, 1, 1, 1, 1, 1, 1, false, true, false},
      {1, 2, 330, 600, 16, 40, 50, 48, true, true, false},  {2, 1, 70, 9, 64, 64, 64, 64, false, true, false},
      {1, 1, 130, 200, 16, 40, 70, 40, true, false, false},  // S in two blocks
      {1, 2, 70, 9, 70, 65, 23, 72, false, false, false},    // D and E in two blocks
      {2, 3, 45, 45, 17, 23, 23, 26, true, false, true},    {1, 1, 1, 1, 1, 1, 1, 1, false, false, true},
      {1, 2, 200, 200, 16, 40, 50, 48, true, false, true},  {2, 1, 128, 128, 64, 64, 64, 64, false, false, true},
      {1, 1, 130, 130, 16, 40, 70, 40, true, false, true},  // causal, S in two blocks
      {1, 2, 70, 70, 70, 65, 23, 72, false, false, true}};  // causal, D and E in two blocks
  const auto filled = [&](int64_t B, int64_t H, int64_t L, int64_t dim, int64_t pitch, DType dt) {
    Tensor view = heads(B, H, L, dim, pitch, dt);
    view.copy_(rnd(view.shape(), dt).to(kCuda));
    return view;
  };
  const double guard = 1e-30;
  for (DType dt : kFloatTypes) {
    for (const Case& c : cases) {
      SCOPED_TRACE(tag("B " + std::to_string(c.B) + " H " + std::to_string(c.H) + " N " + std::to_string(c.N) + " M " +
                           std::to_string(c.M) + " D " + std::to_string(c.D) + " E " + std::to_string(c.E) + " S " +
                           std::to_string(c.S) + (c.pad ? " padded" : "") + (c.causal ? " causal" : ""),
                       dt));
      const Tensor q = filled(c.B, c.H, c.N, c.D, c.pitch, dt), k = filled(c.B, c.H, c.M, c.D, c.pitch, dt),
                   v = filled(c.B, c.H, c.M, c.E, c.pitch, dt), dout = filled(c.B, c.H, c.N, c.E, c.pitch, dt);
      const Tensor w = rnd({c.H, c.S, c.D}, dt), pad = c.pad ? key_padding(c.B, c.M) : Tensor();
      const double scale = std::pow(static_cast<double>(c.D), -0.25);
      // Reference: the CPU's composed op.
      const Tensor qh = q.to(kCPU), kh = k.to(kCPU), vh = v.to(kCPU), gh = dout.to(kCPU);
      const std::vector<Tensor> ref = raw::favor_attention(qh, kh, vh, w, scale, pad, guard, c.causal, 64);
      const std::vector<Tensor> dref =
          raw::favor_attention_backward(gh, qh, kh, vh, w, scale, ref, guard, c.causal, 64);

      const Tensor wd = w.to(kCuda), pd = pad.defined() ? in_wider_rows(pad) : Tensor();
      const Shape kvz_s = c.causal ? Shape{c.B, c.H, (c.N + 63) / 64, c.S, c.E + 1} : Shape{c.B, c.H, c.S, c.E + 1};
      std::vector<Tensor> fwd = {heads(c.B, c.H, c.N, c.E, c.pitch, dt), poisoned({c.B, c.H, c.N}, dt),
                                 poisoned(kvz_s, dt), poisoned({c.B, c.H, c.N, c.S}, dt),
                                 poisoned({c.B, c.H, c.M, c.S}, dt)};
      const bool fits = dt == DType::Float32 || c.fits_f64;
      const double long_sum = 8;  // sums over up to 600 keys and 70 features, exp of sums over D
      ASSERT_EQ(LINEA_BACKEND(kCuda, favor_attention_fused, q, k, v, wd, c.causal, 64), fits);
      if (c.causal) {
        ASSERT_FALSE(LINEA_BACKEND(kCuda, favor_attention_fused, q, k, v, wd, true, 32));
      }
      if (!fits) {  // the raw op composes
        const std::vector<Tensor> got = raw::favor_attention(q, k, v, wd, scale, pd, guard, c.causal, 64);
        EXPECT_TRUE(matches(got[0], ref[0], long_sum, "out (composed)"));
        const std::vector<Tensor> dgot =
            raw::favor_attention_backward(dout, q, k, v, wd, scale, got, guard, c.causal, 64);
        for (size_t i = 0; i < 3; ++i) EXPECT_TRUE(matches(dgot[i], dref[i], long_sum, "gradient (composed)"));
        continue;
      }
      LINEA_BACKEND(kCuda, favor_attention_forward, q, k, v, wd, scale, pd, guard, c.causal, 64, fwd[0], fwd[1], fwd[2],
                    fwd[3], fwd[4]);
      const char* names[] = {"out", "den", c.causal ? "states" : "kvz", "phi_q", "phi_k"};
      for (size_t i = 0; i < 5; ++i) EXPECT_TRUE(matches(fwd[i], ref[i], long_sum, names[i]));
      std::vector<Tensor> d = {heads(c.B, c.H, c.N, c.D, c.pitch, dt), heads(c.B, c.H, c.M, c.D, c.pitch, dt),
                               heads(c.B, c.H, c.M, c.E, c.pitch, dt)};
      LINEA_BACKEND(kCuda, favor_attention_backward, q, k, v, wd, scale, c.causal, 64, fwd[0], fwd[1], fwd[2], fwd[3],
                    fwd[4], dout, guard, d[0], d[1], d[2]);
      EXPECT_TRUE(matches(d[0], dref[0], long_sum, "dq"));
      EXPECT_TRUE(matches(d[1], dref[1], long_sum, "dk"));
      EXPECT_TRUE(matches(d[2], dref[2], long_sum, "dv"));
      gaps_untouched(fwd[0], c.E, c.pitch, "out");
      gaps_untouched(d[0], c.D, c.pitch, "dq");
      gaps_untouched(d[1], c.D, c.pitch, "dk");
      gaps_untouched(d[2], c.E, c.pitch, "dv");
    }
  }
}

// A decoding step of causal FAVOR+ (favor_attention_step: the causal kernels with the running
// sums coming in and going out) against the CPU's composed op: a first step (no sums), one
// position, a step of 70 (two chunks) after earlier sums, sums whose stabilizer is above the
// step's keys' and below them, key padding with a batch all padding (a view of a wider mask's
// rows); NaN-poisoned outputs.
// float64 composes on CUDA, compared too.
TEST(CudaParity, FavorAttentionStepKernel) {
  LINEA_REQUIRE_CUDA();
  manual_seed(33);
  struct Case {
    int64_t B, H, T, D, E, S, pitch;
    bool sums, pad;
    double c;  // the running stabilizer (the step's keys' log-factors are about 0 to 10)
  };
  const std::vector<Case> cases = {{2, 3, 5, 17, 23, 23, 26, false, true, 0},
                                   {1, 2, 1, 16, 40, 50, 48, true, false, 30},
                                   {2, 1, 70, 16, 40, 50, 40, true, true, -5},
                                   {1, 1, 3, 64, 64, 64, 64, true, false, 2}};
  const auto filled = [&](int64_t B, int64_t H, int64_t L, int64_t dim, int64_t pitch, DType dt) {
    Tensor view = heads(B, H, L, dim, pitch, dt);
    view.copy_(rnd(view.shape(), dt).to(kCuda));
    return view;
  };
  const double guard = 1e-30, long_sum = 8;
  for (DType dt : kFloatTypes) {
    for (const Case& c : cases) {
      SCOPED_TRACE(tag("B " + std::to_string(c.B) + " H " + std::to_string(c.H) + " T " + std::to_string(c.T) + " S " +
                           std::to_string(c.S) + (c.sums ? " after sums" : "") + (c.pad ? " padded" : ""),
                       dt));
      const Tensor q = filled(c.B, c.H, c.T, c.D, c.pitch, dt), k = filled(c.B, c.H, c.T, c.D, c.pitch, dt),
                   v = filled(c.B, c.H, c.T, c.E, c.pitch, dt);
      const Tensor w = rnd({c.H, c.S, c.D}, dt), pad = c.pad ? key_padding(c.B, c.T) : Tensor();
      const Tensor sums = c.sums ? abs(rnd({c.B, c.H, c.S, c.E + 1}, dt)) : Tensor();
      const Tensor cs = c.sums ? add(rnd({c.B, c.H, 1, 1}, dt), c.c) : Tensor();
      const double scale = std::pow(static_cast<double>(c.D), -0.25);
      const std::vector<Tensor> ref =
          raw::favor_attention_step(q.to(kCPU), k.to(kCPU), v.to(kCPU), w, scale, pad, guard, sums, cs, 64);

      const Tensor wd = w.to(kCuda), pd = pad.defined() ? in_wider_rows(pad) : Tensor();
      const Tensor sd = sums.defined() ? sums.to(kCuda) : Tensor(), cd = cs.defined() ? cs.to(kCuda) : Tensor();
      const bool fits = dt == DType::Float32;
      ASSERT_EQ(LINEA_BACKEND(kCuda, favor_attention_fused, q, k, v, wd, true, 64), fits);
      std::vector<Tensor> got;
      if (fits) {
        got = {heads(c.B, c.H, c.T, c.E, c.pitch, dt), poisoned({c.B, c.H, c.S, c.E + 1}, dt),
               poisoned({c.B, c.H, 1, 1}, dt)};
        LINEA_BACKEND(kCuda, favor_attention_step, q, k, v, wd, scale, pd, guard, sd, cd, got[0], got[1], got[2]);
        gaps_untouched(got[0], c.E, c.pitch, "out");
      } else {
        got = raw::favor_attention_step(q, k, v, wd, scale, pd, guard, sd, cd, 64);  // composed
      }
      EXPECT_TRUE(matches(got[0], ref[0], long_sum, "out"));
      EXPECT_TRUE(matches(got[1], ref[1], long_sum, "sums"));
      EXPECT_TRUE(matches(got[2], ref[2], 1, "c"));
    }
  }
}

// FAVOR+ attention's kernels under --precision tf32 and bf16 (the products' inputs rounded as
// the tensor cores read them, the sums, exponentials and features float32: cuda/favor_attention.cu)
// against the CPU's composed op in float64 on the same inputs: within what the rounding of the
// products' inputs moves them (checked relative to each output's largest value), and not equal
// to the default precision's results (so the rounding took place). Non-causal and causal, sizes
// off the tiles, padding, S, D or E in two blocks, heads of wider rows, NaN-poisoned outputs.
// (Under the default precision the kernels take three TF32 products per product:
// FavorAttentionKernel holds them to float32's tolerance.)
TEST(CudaParity, FavorAttentionTensorCores) {
  LINEA_REQUIRE_CUDA();
  manual_seed(37);
  struct Case {
    int64_t B, H, N, M, D, E, S, pitch;
    bool pad, causal;
  };
  const std::vector<Case> cases = {{2, 3, 37, 45, 17, 23, 23, 26, true, false},
                                   {1, 2, 130, 200, 16, 40, 70, 40, true, false},  // S in two blocks
                                   {1, 1, 70, 9, 70, 65, 23, 72, false, false},    // D and E in two blocks
                                   {2, 3, 45, 45, 17, 23, 23, 26, true, true},
                                   {1, 2, 200, 200, 16, 40, 50, 48, false, true}};
  struct Restore {
    ~Restore() { set_matmul_precision(MatmulPrecision::Float32); }
  } restore;
  const DType dt = DType::Float32;
  const double guard = 1e-30;
  // Each output within tol of its largest value: the rounding of the products' inputs (2^-9 for
  // bf16, 2^-11 for TF32 relative) moves the logits, and through exp the features, by about that
  // times the sums' magnitudes (on the emulator at most 0.024 for bf16, 0.0028 for TF32).
  const auto near = [](const Tensor& got, const Tensor& ref, double tol, const char* what) {
    const double top = max(abs(ref)).item();
    return test::all_close(got.to(kCPU).to(DType::Float64), ref, tol * top, 0.0) << " [" << what << "]";
  };
  for (const Case& c : cases) {
    const auto filled = [&](int64_t L, int64_t dim) {
      Tensor view = heads(c.B, c.H, L, dim, c.pitch, dt);
      view.copy_(rnd(view.shape(), dt).to(kCuda));
      return view;
    };
    const Tensor q = filled(c.N, c.D), k = filled(c.M, c.D), v = filled(c.M, c.E), dout = filled(c.N, c.E);
    const Tensor w = rnd({c.H, c.S, c.D}, dt), pad = c.pad ? key_padding(c.B, c.M) : Tensor();
    const double scale = std::pow(static_cast<double>(c.D), -0.25);
    const auto f64 = [](const Tensor& x) { return x.to(kCPU).to(DType::Float64); };
    const std::vector<Tensor> ref =
        raw::favor_attention(f64(q), f64(k), f64(v), f64(w), scale, pad, guard, c.causal, 64);
    const std::vector<Tensor> dref =
        raw::favor_attention_backward(f64(dout), f64(q), f64(k), f64(v), f64(w), scale, ref, guard, c.causal, 64);
    const Tensor wd = w.to(kCuda), pd = pad.defined() ? in_wider_rows(pad) : Tensor();
    const Shape kvz_s = c.causal ? Shape{c.B, c.H, (c.N + 63) / 64, c.S, c.E + 1} : Shape{c.B, c.H, c.S, c.E + 1};
    // The kernels' outputs at a precision: out, den, kvz, phi_q, phi_k, dq, dk, dv.
    const auto run = [&](MatmulPrecision precision) {
      set_matmul_precision(precision);
      std::vector<Tensor> o = {heads(c.B, c.H, c.N, c.E, c.pitch, dt),
                               poisoned({c.B, c.H, c.N}, dt),
                               poisoned(kvz_s, dt),
                               poisoned({c.B, c.H, c.N, c.S}, dt),
                               poisoned({c.B, c.H, c.M, c.S}, dt),
                               heads(c.B, c.H, c.N, c.D, c.pitch, dt),
                               heads(c.B, c.H, c.M, c.D, c.pitch, dt),
                               heads(c.B, c.H, c.M, c.E, c.pitch, dt)};
      EXPECT_TRUE(LINEA_BACKEND(kCuda, favor_attention_fused, q, k, v, wd, c.causal, 64));
      LINEA_BACKEND(kCuda, favor_attention_forward, q, k, v, wd, scale, pd, guard, c.causal, 64, o[0], o[1], o[2], o[3],
                    o[4]);
      LINEA_BACKEND(kCuda, favor_attention_backward, q, k, v, wd, scale, c.causal, 64, o[0], o[1], o[2], o[3], o[4],
                    dout, guard, o[5], o[6], o[7]);
      set_matmul_precision(MatmulPrecision::Float32);
      return o;
    };
    const std::vector<Tensor> fp32 = run(MatmulPrecision::Float32);
    for (const MatmulPrecision precision : {MatmulPrecision::BF16, MatmulPrecision::TF32}) {
      const bool bf16 = precision == MatmulPrecision::BF16;
      SCOPED_TRACE(std::string(bf16 ? "bf16" : "tf32") + " B " + std::to_string(c.B) + " H " + std::to_string(c.H) +
                   " N " + std::to_string(c.N) + " M " + std::to_string(c.M) + " D " + std::to_string(c.D) + " E " +
                   std::to_string(c.E) + " S " + std::to_string(c.S) + (c.pad ? " padded" : "") +
                   (c.causal ? " causal" : ""));
      const double tol = bf16 ? 0.06 : 8e-3;
      const std::vector<Tensor> got = run(precision);
      const char* names[] = {"out", "den", c.causal ? "states" : "kvz", "phi_q", "phi_k", "dq", "dk", "dv"};
      for (size_t i = 0; i < got.size(); ++i) {
        const Tensor& r = i < 5 ? ref[i] : dref[i - 5];
        EXPECT_TRUE(near(got[i], r, tol, names[i]));
        if (max(abs(r)).item() > 0) {  // (one chunk's states: all 0)
          EXPECT_GT(max(abs(f64(got[i]) - f64(fp32[i]))).item(), 0.0) << names[i] << " not rounded";
        }
      }
      gaps_untouched(got[0], c.E, c.pitch, "out");
      gaps_untouched(got[5], c.D, c.pitch, "dq");
      gaps_untouched(got[6], c.D, c.pitch, "dk");
      gaps_untouched(got[7], c.E, c.pitch, "dv");
    }
  }
}

// LARA's mixture-weight kernels, as above: sizes off every block shape, N past one column
// block's 256 threads, a beta large enough that the floor clamps some weights (no gradient
// there), NaN-poisoned outputs.
TEST(CudaParity, LaraMixtureKernel) {
  LINEA_REQUIRE_CUDA();
  manual_seed(15);
  struct Case {
    int64_t B, H, N, C, D;
  };
  // N = 300 and 700: the column sums over n in 2 and 3 runs of rows (ColumnRuns), 700's last short;
  // C and D past a warp's 32 lanes (the passes take a warp per row: a short last round)
  const std::vector<Case> cases = {
      {2, 3, 37, 17, 23}, {1, 1, 1, 1, 1}, {1, 2, 300, 16, 8}, {1, 1, 700, 3, 4}, {2, 2, 20, 40, 36}};
  const double floor = 1e-8;
  const double q_scale = 0.6;  // q~ = 0.6 q: the scale in the GEMMs' alpha
  for (DType dt : kFloatTypes) {
    for (const Case& c : cases) {
      for (double beta : {1.0, 40.0}) {
        SCOPED_TRACE(tag("B " + std::to_string(c.B) + " H " + std::to_string(c.H) + " N " + std::to_string(c.N) +
                             " C " + std::to_string(c.C) + " D " + std::to_string(c.D) + " beta " +
                             std::to_string(beta),
                         dt));
        const Tensor q = rnd({c.B, c.H, c.N, c.D}, dt, 0.5), qbar = rnd({c.B, c.H, c.C, c.D}, dt, 0.5),
                     w = rnd({c.B, c.H, c.C, c.D}, dt, 0.5), self_w = exp(rnd({c.B, c.H, c.C}, dt, 0.3)),
                     bias = rnd({c.B, c.H, c.C}, dt), dmix = rnd({c.B, c.H, c.N, c.C}, dt);
        const TensorOptions cpu_opts(dt);
        const Shape ms{c.B, c.H, c.N, c.C};
        Tensor mix = empty(ms, cpu_opts), t = empty(ms, cpu_opts), a = empty(ms, cpu_opts);
        cpu::lara_mixture_forward(q, qbar, w, self_w, bias, beta, floor, q_scale, mix, t, a);
        const Tensor qd = q.to(kCuda), qbd = qbar.to(kCuda), wd = w.to(kCuda), swd = self_w.to(kCuda),
                     bd = bias.to(kCuda), gd = dmix.to(kCuda);
        Tensor mix_d = poisoned(ms, dt), t_d = poisoned(ms, dt), a_d = poisoned(ms, dt);
        LINEA_BACKEND(kCuda, lara_mixture_forward, qd, qbd, wd, swd, bd, beta, floor, q_scale, mix_d, t_d, a_d);
        const double long_sum = 8;  // sums over up to 300 rows and 23 dims, exp and log of them
        EXPECT_TRUE(matches(mix_d, mix, long_sum, "mix"));
        EXPECT_TRUE(matches(t_d, t, long_sum, "t"));
        EXPECT_TRUE(matches(a_d, a, long_sum * beta, "a"));  // beta times t's error

        Tensor dq = empty(q.shape(), cpu_opts), dqbar = empty(qbar.shape(), cpu_opts), dw = empty(w.shape(), cpu_opts),
               dsw = empty(self_w.shape(), cpu_opts), db = empty(bias.shape(), cpu_opts);
        cpu::lara_mixture_backward(q, qbar, w, mix, t, a, dmix, beta, floor, q_scale, dq, dqbar, dw, dsw, db);
        Tensor dq_d = poisoned(q.shape(), dt), dqbar_d = poisoned(qbar.shape(), dt), dw_d = poisoned(w.shape(), dt),
               dsw_d = poisoned(self_w.shape(), dt), db_d = poisoned(bias.shape(), dt);
        // from the CPU's forward state, so that a clamp decided differently by a rounding
        // cannot make the gradients differ
        LINEA_BACKEND(kCuda, lara_mixture_backward, qd, qbd, wd, mix.to(kCuda), t.to(kCuda), a.to(kCuda), gd, beta,
                      floor, q_scale, dq_d, dqbar_d, dw_d, dsw_d, db_d);
        const double grad_sum = long_sum * beta;  // dt is beta times dalpha
        EXPECT_TRUE(matches(dq_d, dq, grad_sum, "dq"));
        EXPECT_TRUE(matches(dqbar_d, dqbar, grad_sum, "dqbar"));
        EXPECT_TRUE(matches(dw_d, dw, grad_sum, "dw"));
        EXPECT_TRUE(matches(dsw_d, dsw, grad_sum, "dself_w"));
        EXPECT_TRUE(matches(db_d, db, grad_sum, "dbias"));
      }
    }
  }
}

// LARA's proposal-weight kernels against the CPU's: C past a warp's 32 lanes (the forward's lanes
// along c', two rounds) and D past them (the backward's lanes along d), C = 1, sizes off 32,
// NaN-poisoned outputs; the backward from the CPU's p.
TEST(CudaParity, LaraProposalsKernel) {
  LINEA_REQUIRE_CUDA();
  manual_seed(16);
  struct Case {
    int64_t B, H, C, D;
  };
  const std::vector<Case> cases = {{2, 3, 17, 23}, {1, 1, 1, 1}, {1, 2, 70, 5}, {2, 1, 9, 45}};
  for (DType dt : kFloatTypes)
    for (const Case& c : cases) {
      SCOPED_TRACE(tag("B " + std::to_string(c.B) + " H " + std::to_string(c.H) + " C " + std::to_string(c.C) + " D " +
                           std::to_string(c.D),
                       dt));
      const Shape cd{c.B, c.H, c.C, c.D}, rows{c.B, c.H, c.C}, cc{c.B, c.H, c.C, c.C};
      const Tensor w = rnd(cd, dt, 0.5), mu = rnd(cd, dt, 0.5), lse_k = rnd(rows, dt), gs = rnd(rows, dt),
                   gb = rnd(rows, dt);
      const TensorOptions cpu_opts(dt);
      Tensor p = empty(cc, cpu_opts), self_w = empty(rows, cpu_opts), bias = empty(rows, cpu_opts);
      cpu::lara_proposals_forward(w, mu, lse_k, p, self_w, bias);
      const Tensor wd = w.to(kCuda), mud = mu.to(kCuda);
      Tensor p_d = poisoned(cc, dt), self_d = poisoned(rows, dt), bias_d = poisoned(rows, dt);
      LINEA_BACKEND(kCuda, lara_proposals_forward, wd, mud, lse_k.to(kCuda), p_d, self_d, bias_d);
      const double sums = 4;  // dots of up to 45 terms, exp and log of sums of up to 70
      EXPECT_TRUE(matches(p_d, p, sums, "p"));
      EXPECT_TRUE(matches(self_d, self_w, sums, "self_w"));
      EXPECT_TRUE(matches(bias_d, bias, sums, "bias"));

      Tensor dw = empty(cd, cpu_opts), dmu = empty(cd, cpu_opts);
      cpu::lara_proposals_backward(w, mu, p, gs, gb, dw, dmu);
      Tensor dw_d = poisoned(cd, dt), dmu_d = poisoned(cd, dt);
      LINEA_BACKEND(kCuda, lara_proposals_backward, wd, mud, p.to(kCuda), gs.to(kCuda), gb.to(kCuda), dw_d, dmu_d);
      EXPECT_TRUE(matches(dw_d, dw, sums, "dw"));
      EXPECT_TRUE(matches(dmu_d, dmu, sums, "dmu"));
    }
}

// The CUDA Toeplitz attention kernels on CPU copies' inputs against the CPU kernels, outputs
// poisoned, in each chunk size LINEA_TOEPLITZ_CHUNK_BYTES is set to (0: the default); a second
// run gives the same bits.
void expect_toeplitz_parity(const Tensor& c, const Tensor& pq, const Tensor& pk, const Tensor& v, const Tensor& dy,
                            int64_t fft_len, const std::vector<int64_t>& chunk_bytes, double long_sum) {
  const DType dt = v.dtype();
  const TensorOptions cpu_opts(dt);
  Tensor y = empty({pq.size(0), pq.size(1), pq.size(2), v.size(3)}, cpu_opts);
  cpu::toeplitz_attention_forward(c, pq, pk, v, fft_len, y);
  Tensor dc = empty(c.shape(), cpu_opts), dpq = empty(pq.shape(), cpu_opts), dpk = empty(pk.shape(), cpu_opts),
         dv = empty(v.shape(), cpu_opts);
  cpu::toeplitz_attention_backward(c, pq, pk, v, dy, fft_len, dc, dpq, dpk, dv);
  const Tensor cd = c.to(kCuda), pqd = pq.to(kCuda), pkd = pk.to(kCuda), vd = v.to(kCuda), dyd = dy.to(kCuda);
  const char* env = "LINEA_TOEPLITZ_CHUNK_BYTES";
  for (int64_t bytes : chunk_bytes) {
    SCOPED_TRACE("chunk bytes " + std::to_string(bytes));
    if (bytes)
      ::setenv(env, std::to_string(bytes).c_str(), 1);
    else
      ::unsetenv(env);
    std::vector<Tensor> runs;
    for (int run = 0; run < 2; ++run) {
      Tensor y_d = poisoned(y.shape(), dt), dc_d = poisoned(dc.shape(), dt), dpq_d = poisoned(pq.shape(), dt),
             dpk_d = poisoned(pk.shape(), dt), dv_d = poisoned(v.shape(), dt);
      LINEA_BACKEND(kCuda, toeplitz_attention_forward, cd, pqd, pkd, vd, fft_len, y_d);
      LINEA_BACKEND(kCuda, toeplitz_attention_backward, cd, pqd, pkd, vd, dyd, fft_len, dc_d, dpq_d, dpk_d, dv_d);
      EXPECT_TRUE(matches(y_d, y, long_sum, "y"));
      EXPECT_TRUE(matches(dc_d, dc, long_sum * 4, "dc"));  // summed over the batch too
      EXPECT_TRUE(matches(dpq_d, dpq, long_sum, "dphi_q"));
      EXPECT_TRUE(matches(dpk_d, dpk, long_sum, "dphi_k"));
      EXPECT_TRUE(matches(dv_d, dv, long_sum, "dv"));
      runs.push_back(cat({reshape(y_d, {-1}), reshape(dc_d, {-1}), reshape(dpq_d, {-1}), reshape(dpk_d, {-1}),
                          reshape(dv_d, {-1})},
                         0)
                         .to(kCPU));
    }
    EXPECT_TRUE(test::all_close(runs[0], runs[1], 0.0, 0.0)) << "two runs differ";
  }
  ::unsetenv(env);
}

struct ToeplitzCase {
  int64_t B, H, N, M, S, E, n;  // n: the transform length (0: the direct path)
  bool per_batch;               // c [B, H, L] rather than [H, L]
  std::string str() const {
    return "B " + std::to_string(B) + " H " + std::to_string(H) + " N " + std::to_string(N) + " M " +
           std::to_string(M) + " S " + std::to_string(S) + " E " + std::to_string(E) + " n " + std::to_string(n) +
           (per_batch ? " c per (b, h)" : "");
  }
  // c, phi_q, phi_k, v, dy
  std::vector<Tensor> inputs(DType dt) const {
    const int64_t L = N + M - 1;
    return {per_batch ? rnd({B, H, L}, dt, 0.5) : rnd({H, L}, dt, 0.5), exp(rnd({B, H, N, S}, dt, 0.5)),
            exp(rnd({B, H, M, S}, dt, 0.5)), rnd({B, H, M, E}, dt), rnd({B, H, N, E}, dt)};
  }
};

// The Toeplitz attention kernels (nprf_rpe's FFT path), as above: c per head and per (b, h),
// even and odd transform lengths, length 1 and 2; each case in the default chunks, in chunks of
// one (b, h, channel) group and of two (a head's channels split between chunks).
TEST(CudaParity, ToeplitzAttentionKernel) {
  LINEA_REQUIRE_CUDA();
  manual_seed(16);
  const std::vector<ToeplitzCase> cases = {{2, 3, 7, 9, 5, 3, 16, false},
                                           {2, 1, 12, 5, 4, 5, 23, true},
                                           {1, 2, 1, 1, 1, 1, 1, false},
                                           {1, 1, 1, 2, 2, 2, 2, true},
                                           // past one 32 x 32 tile of rows and features
                                           {1, 2, 45, 38, 37, 2, 83, false}};
  for (DType dt : kFloatTypes)
    for (const ToeplitzCase& c : cases) {
      SCOPED_TRACE(tag(c.str(), dt));
      const std::vector<Tensor> x = c.inputs(dt);
      const int64_t group_bytes = c.S * 2 * (c.n / 2 + 1) * static_cast<int64_t>(dtype_size(dt));
      const double long_sum = 16;  // transforms of up to 23 points over up to 12 keys, 5 features
      expect_toeplitz_parity(x[0], x[1], x[2], x[3], x[4], c.n, {0, group_bytes, 2 * group_bytes}, long_sum);
    }
}

// The direct path of the same op (fft length 0): in float32 the tensor-core tiles of the softmax
// kernels (toeplitz_forward_mma, toeplitz_backward_mma: E - 1 columns by mma, the last as the row
// sums' key weights, dc in bands of diagonals; E = 1 declines), in float64 batched GEMMs over
// chunks of query rows, the bias table applied in between, dc summed along diagonals: in the
// default chunks and in chunks of one and of two query rows. Sizes off the 64-row tiles, E - 1 = 64 and S = 40
// (nprf_rpe's shape: DM = 64), c per (b, h); N = 79 puts the first key tile of the first band's
// window at the last key of warp 0's rows (band diagonal 63 of row 15: the dc kernel's tile skip).
TEST(CudaParity, ToeplitzAttentionDirectKernel) {
  LINEA_REQUIRE_CUDA();
  manual_seed(17);
  const std::vector<ToeplitzCase> cases = {{2, 3, 7, 9, 5, 3, 0, false},      {2, 1, 12, 5, 4, 5, 0, true},
                                           {1, 2, 1, 1, 1, 1, 0, false},      {1, 1, 79, 33, 6, 4, 0, false},
                                           {1, 2, 130, 75, 40, 65, 0, false}, {2, 1, 65, 140, 17, 20, 0, true}};
  for (DType dt : kFloatTypes)
    for (const ToeplitzCase& c : cases) {
      SCOPED_TRACE(tag(c.str(), dt));
      const std::vector<Tensor> x = c.inputs(dt);
      const int64_t row_bytes = c.B * c.H * c.M * static_cast<int64_t>(dtype_size(dt));
      const double long_sum = 8;  // sums over up to 79 rows and 33 keys in another order
      expect_toeplitz_parity(x[0], x[1], x[2], x[3], x[4], 0, {0, row_bytes, 2 * row_bytes}, long_sum);
    }
}

// The direct path's tensor-core tiles under --precision bf16 and tf32 (P and dS rounded like
// softmax's): within 2^-7 (bf16) and 2^-9 (TF32) of the largest value of each result, against the
// CPU kernel in float32; under the emulator, rounded at all.
TEST(CudaParity, ToeplitzAttentionTensorCores) {
  LINEA_REQUIRE_CUDA();
  manual_seed(18);
  struct Restore {
    ~Restore() { set_matmul_precision(MatmulPrecision::Float32); }
  } restore;
  const std::vector<ToeplitzCase> cases = {{1, 2, 130, 75, 40, 65, 0, false}, {2, 1, 65, 140, 17, 20, 0, true}};
  for (const MatmulPrecision precision : {MatmulPrecision::BF16, MatmulPrecision::TF32})
    for (const ToeplitzCase& c : cases) {
      const bool bf16 = precision == MatmulPrecision::BF16;
      SCOPED_TRACE(std::string(bf16 ? "bf16 " : "tf32 ") + c.str());
      const DType dt = DType::Float32;
      const std::vector<Tensor> x = c.inputs(dt);
      Tensor y = empty({c.B, c.H, c.N, c.E}, TensorOptions(dt)), dpq = empty(x[1].shape(), TensorOptions(dt)),
             dpk = empty(x[2].shape(), TensorOptions(dt)), dv = empty(x[3].shape(), TensorOptions(dt)),
             dc = empty(x[0].shape(), TensorOptions(dt));
      cpu::toeplitz_attention_forward(x[0], x[1], x[2], x[3], 0, y);
      cpu::toeplitz_attention_backward(x[0], x[1], x[2], x[3], x[4], 0, dc, dpq, dpk, dv);
      std::vector<Tensor> d;
      for (const Tensor& t : x) d.push_back(t.to(kCuda));
      Tensor y_d = poisoned(y.shape(), dt), dc_d = poisoned(dc.shape(), dt), dpq_d = poisoned(dpq.shape(), dt),
             dpk_d = poisoned(dpk.shape(), dt), dv_d = poisoned(dv.shape(), dt);
      set_matmul_precision(precision);
      LINEA_BACKEND(kCuda, toeplitz_attention_forward, d[0], d[1], d[2], d[3], 0, y_d);
      LINEA_BACKEND(kCuda, toeplitz_attention_backward, d[0], d[1], d[2], d[3], d[4], 0, dc_d, dpq_d, dpk_d, dv_d);
      set_matmul_precision(MatmulPrecision::Float32);
      const double tol = bf16 ? 1.0 / 128 : 1.0 / 512;  // measured: at most 0.54 and 0.26 of these
      const std::vector<std::pair<const char*, std::pair<Tensor, Tensor>>> results = {
          {"y", {y_d, y}}, {"dphi_q", {dpq_d, dpq}}, {"dphi_k", {dpk_d, dpk}}, {"dv", {dv_d, dv}}, {"dc", {dc_d, dc}}};
      for (const auto& [what, r] : results) {
        const Tensor got = r.first.to(kCPU);
        const double most = max(abs(r.second)).item(), err = max(abs(got - r.second)).item();
        EXPECT_LE(err, tol * most) << what << ": " << err << " from values up to " << most;
#ifdef LINEA_CUDA_EMULATOR
        EXPECT_GT(err, 0.0) << what << ": not rounded";
#endif
      }
    }
}

// Through the public op: the values and the gradients of every input.
TEST(CudaParity, ScaledDotProductAttention) {
  LINEA_REQUIRE_CUDA();
  manual_seed(12);
  for (DType dt : kFloatTypes) {
    const Tensor pad = ints({0, 0, 1, 0, 1, 0, 0, 0, 0, 1, 0, 0, 0, 0}, {2, 7}).to(DType::Bool);
    expect_parity(
        tag("sdpa padded", dt),
        [](const std::vector<Tensor>& x) {
          return scaled_dot_product_attention(x[0], x[1], x[2], 0.3, false, 0, x[3]);
        },
        {rnd({2, 2, 19, 12}, dt), rnd({2, 2, 7, 12}, dt), rnd({2, 2, 7, 9}, dt), pad}, 4);
    expect_parity(
        tag("sdpa causal", dt),
        [](const std::vector<Tensor>& x) { return scaled_dot_product_attention(x[0], x[1], x[2], 0.25, true); },
        {rnd({1, 3, 41, 16}, dt), rnd({1, 3, 41, 16}, dt), rnd({1, 3, 41, 16}, dt)}, 4);
  }
}

TEST(CudaParity, AddLayerNorm) {
  LINEA_REQUIRE_CUDA();
  manual_seed(18);
  for (DType dt : kFloatTypes) {
    expect_parity(tag("sum and norm", dt),
                  [](const std::vector<Tensor>& v) {
                    auto [s, y] = add_layer_norm(v[0], v[1], {33}, v[2], v[3]);
                    return add(mul(s, 0.25), y);
                  },
                  {rnd({6, 5, 33}, dt, 2.0), rnd({6, 5, 33}, dt), rnd({33}, dt), rnd({33}, dt)});
    expect_parity(tag("no affine, many rows", dt),
                  [](const std::vector<Tensor>& v) { return add_layer_norm(v[0], v[1], {7}).second; },
                  {rnd({301, 7}, dt), rnd({301, 7}, dt)});
    expect_parity(tag("with the residual's dropout", dt),
                  [](const std::vector<Tensor>& v) {
                    manual_seed(55);  // the same draw on both devices
                    auto [s, y] = add_layer_norm(v[0], v[1], {9}, v[2], Tensor(), 1e-5, 0.3);
                    return add(mul(s, 0.5), y);
                  },
                  {rnd({5, 7, 9}, dt), rnd({5, 7, 9}, dt), rnd({9}, dt)});
    // The backward's kernel with the sum's gradient added and r's through the dropout, over rows
    // past one chunk of 64 (several blocks, their dw sums added by the last).
    expect_parity(tag("dropout, 301 rows", dt),
                  [](const std::vector<Tensor>& v) {
                    manual_seed(56);
                    auto [s, y] = add_layer_norm(v[0], v[1], {33}, v[2], v[3], 1e-5, 0.2);
                    return add(mul(s, 0.5), y);
                  },
                  {rnd({7, 43, 33}, dt), rnd({7, 43, 33}, dt), rnd({33}, dt), rnd({33}, dt)});
    expect_parity(tag("dropout, the sum only", dt),
                  [](const std::vector<Tensor>& v) {
                    manual_seed(57);
                    return add_layer_norm(v[0], v[1], {9}, v[2], Tensor(), 1e-5, 0.3).first;
                  },
                  {rnd({5, 7, 9}, dt), rnd({5, 7, 9}, dt), rnd({9}, dt)});
  }
}

// add_layer_norm's backward kernel against the CPU's (the three steps) into poisoned outputs: with
// and without the sum's own gradient and the dropout, rows past one block's chunk of 64, a row
// longer than a block's threads and not a multiple of them.
TEST(CudaParity, AddLayerNormBackwardKernel) {
  LINEA_REQUIRE_CUDA();
  manual_seed(19);
  for (DType dt : kFloatTypes)
    for (auto [batch, rows_per, cols] : std::vector<std::array<int64_t, 3>>{{7, 43, 33}, {2, 3, 1030}})
      for (bool with_sum : {true, false})
        for (double p : {0.25, 0.0}) {
          SCOPED_TRACE(tag(std::to_string(batch * rows_per) + " x " + std::to_string(cols) + (with_sum ? " sum" : "") +
                               " p " + std::to_string(p),
                           dt));
          const int64_t rows = batch * rows_per;
          const Tensor x = rnd({batch, rows_per, cols}, dt), g = rnd(x.shape(), dt), w = rnd({cols}, dt);
          const Tensor gsum = with_sum ? rnd(x.shape(), dt) : Tensor();
          const Tensor mean = rnd({rows}, dt), rstd = add(rand({rows}).to(dt), 0.5);
          const FoldedDropout drop{p, 1234, 5, 3, nullptr};
          const TensorOptions o(dt);
          Tensor dx = empty(x.shape(), o), dr = p > 0 ? empty(x.shape(), o) : Tensor(), dw = empty({cols}, o),
                 db = empty({cols}, o);
          cpu::add_layer_norm_backward(g, gsum, x, w, mean, rstd, drop, dx, dr, dw, db, rows, cols);
          Tensor dx_d = poisoned(x.shape(), dt), dr_d = p > 0 ? poisoned(x.shape(), dt) : Tensor(),
                 dw_d = poisoned({cols}, dt), db_d = poisoned({cols}, dt);
          LINEA_BACKEND(kCuda, add_layer_norm_backward, g.to(kCuda), with_sum ? gsum.to(kCuda) : Tensor(), x.to(kCuda),
                        w.to(kCuda), mean.to(kCuda), rstd.to(kCuda), drop, dx_d, dr_d, dw_d, db_d, rows, cols);
          EXPECT_TRUE(matches(dx_d, dx, 1.0, "dx"));
          EXPECT_TRUE(matches(dr_d, dr, 1.0, "dr"));
          EXPECT_TRUE(matches(dw_d, dw, 4.0, "dw"));
          EXPECT_TRUE(matches(db_d, db, 4.0, "db"));
        }
}

TEST(CudaParity, LayerNorm) {
  LINEA_REQUIRE_CUDA();
  manual_seed(8);
  for (DType dt : kFloatTypes) {
    expect_parity(tag("weight and bias", dt),
                  [](const std::vector<Tensor>& v) { return layer_norm(v[0], {33}, v[1], v[2]); },
                  {rnd({6, 5, 33}, dt, 2.0), rnd({33}, dt), rnd({33}, dt)});
    expect_parity(tag("2 normalized dims", dt),
                  [](const std::vector<Tensor>& v) {
                    return layer_norm(v[0], {4, 7}, v[1], v[2], 1e-3);
                  },
                  {rnd({10, 4, 7}, dt), rnd({4, 7}, dt), rnd({4, 7}, dt)});
    expect_parity(tag("no affine", dt), [](const std::vector<Tensor>& v) { return layer_norm(v[0], {9}); },
                  {rnd({11, 9}, dt)});
    expect_parity(tag("weight only", dt), [](const std::vector<Tensor>& v) { return layer_norm(v[0], {9}, v[1]); },
                  {rnd({11, 9}, dt), rnd({9}, dt)});
    expect_parity(tag("bias only, transposed input", dt),
                  [](const std::vector<Tensor>& v) { return layer_norm(v[0].t(), {9}, Tensor(), v[1]); },
                  {rnd({9, 11}, dt), rnd({9}, dt)});
    // many rows: dw/db reduced over several chunks; wide rows: a block per row
    expect_parity(tag("many rows", dt), [](const std::vector<Tensor>& v) { return layer_norm(v[0], {20}, v[1], v[2]); },
                  {rnd({301, 20}, dt), rnd({20}, dt), rnd({20}, dt)});
    expect_parity(tag("wide rows", dt),
                  [](const std::vector<Tensor>& v) { return layer_norm(v[0], {1000}, v[1], v[2]); },
                  {rnd({3, 1000}, dt), rnd({1000}, dt), rnd({1000}, dt)});
    expect_parity(tag("one column", dt), [](const std::vector<Tensor>& v) { return layer_norm(v[0], {1}, v[1]); },
                  {rnd({5, 1}, dt), rnd({1}, dt)});
  }
}

// normalize, kernel against kernel into poisoned outputs: a warp per row (rows past a block's 8
// warps, rows longer than a warp's 32 lanes and not a multiple of them, one column), zero rows and
// rows the eps clamps; then through autograd on a transposed input.
TEST(CudaParity, Normalize) {
  LINEA_REQUIRE_CUDA();
  manual_seed(9);
  struct Case {
    int64_t rows, cols;
    double eps, scale;
  };
  const std::vector<Case> cases = {
      {301, 20, 1e-12, 1.0}, {21, 1000, 1e-12, 1.0}, {5, 1, 1e-12, 1.0}, {9, 33, 3.0, 0.1}};
  for (DType dt : kFloatTypes)
    for (const Case& c : cases) {
      SCOPED_TRACE(tag(std::to_string(c.rows) + " x " + std::to_string(c.cols) + " eps " + std::to_string(c.eps), dt));
      // the rows, then as many zero rows and rows 100 times longer
      const Tensor x0 = rnd({c.rows, c.cols}, dt, c.scale);
      const Tensor x = cat({x0, mul(x0, 0.0), mul(x0, 100.0)}, 0), g = rnd(x.shape(), dt);
      const int64_t rows = x.size(0);
      Tensor y = empty(x.shape(), TensorOptions(dt)), dx = empty(x.shape(), TensorOptions(dt));
      cpu::normalize(x, c.eps, y, rows, c.cols);
      cpu::normalize_backward(g, x, c.eps, dx, rows, c.cols);
      Tensor y_d = poisoned(x.shape(), dt), dx_d = poisoned(x.shape(), dt);
      LINEA_BACKEND(kCuda, normalize, x.to(kCuda), c.eps, y_d, rows, c.cols);
      LINEA_BACKEND(kCuda, normalize_backward, g.to(kCuda), x.to(kCuda), c.eps, dx_d, rows, c.cols);
      EXPECT_TRUE(matches(y_d, y, 1.0, "y"));
      EXPECT_TRUE(matches(dx_d, dx, 1.0, "dx"));
    }
  for (DType dt : kFloatTypes)
    expect_parity(tag("autograd, transposed", dt), [](const std::vector<Tensor>& v) { return normalize(v[0].t()); },
                  {rnd({7, 5}, dt)});
}

// sq_norm, kernel against kernel into poisoned outputs: a warp per row forward (rows past a block's
// 8 warps, rows longer than 32 lanes and not a multiple of them, one column, no columns), a thread
// an element backward; then through autograd on a transposed input.
TEST(CudaParity, SqNorm) {
  LINEA_REQUIRE_CUDA();
  manual_seed(9);
  struct Case {
    int64_t rows, cols;
    double scale;
  };
  const std::vector<Case> cases = {{301, 20, 1.0}, {21, 1000, -0.5}, {5, 1, 2.0}, {9, 33, 0.5}, {4, 0, 1.0}};
  for (DType dt : kFloatTypes)
    for (const Case& c : cases) {
      SCOPED_TRACE(tag(std::to_string(c.rows) + " x " + std::to_string(c.cols), dt));
      const Tensor x = rnd({c.rows, c.cols}, dt), g = rnd({c.rows}, dt);
      Tensor y = empty({c.rows}, TensorOptions(dt)), dx = empty(x.shape(), TensorOptions(dt));
      cpu::sq_norm(x, c.scale, y, c.rows, c.cols);
      cpu::sq_norm_backward(g, x, c.scale, dx, c.rows, c.cols);
      Tensor y_d = poisoned(y.shape(), dt), dx_d = poisoned(x.shape(), dt);
      LINEA_BACKEND(kCuda, sq_norm, x.to(kCuda), c.scale, y_d, c.rows, c.cols);
      LINEA_BACKEND(kCuda, sq_norm_backward, g.to(kCuda), x.to(kCuda), c.scale, dx_d, c.rows, c.cols);
      EXPECT_TRUE(matches(y_d, y, 1.0, "y"));
      EXPECT_TRUE(matches(dx_d, dx, 1.0, "dx"));
    }
  for (DType dt : kFloatTypes)
    expect_parity(tag("autograd, transposed", dt), [](const std::vector<Tensor>& v) { return sq_norm(v[0].t(), -0.5); },
                  {rnd({7, 5}, dt)});
}

// sums_ratio, kernel against kernel into poisoned outputs: a thread an element forward, a warp per
// row backward (rows past a block's 8 warps, rows longer than 32 lanes and not a multiple of
// them, one column), dens the guard clamps, a flag per batch and per query hiding rows.
TEST(CudaParity, SumsRatio) {
  LINEA_REQUIRE_CUDA();
  manual_seed(9);
  struct Case {
    int64_t B, H, N, E;
  };
  const std::vector<Case> cases = {{2, 3, 50, 20}, {1, 2, 3, 70}, {3, 1, 4, 1}};
  const double tiny = 1e-18;
  for (DType dt : kFloatTypes)
    for (const Case& c : cases)
      for (int flags : {0, 1, 2}) {  // none, per batch, per query
        SCOPED_TRACE(tag(std::to_string(c.N) + " x " + std::to_string(c.E) + " flags " + std::to_string(flags), dt));
        Tensor y = rnd({c.B, c.H, c.N, c.E + 1}, dt);
        narrow(y, 3, c.E, 1).copy_(exp(rnd({c.B, c.H, c.N, 1}, dt)));
        narrow(narrow(y, 2, 0, 1), 3, c.E, 1).fill_(0.0);  // the first query's dens clamped
        // per batch: every other batch hidden; per query: every third (b + n) hidden
        const int64_t per = flags == 2 ? c.N : 1;
        std::vector<int64_t> flag(static_cast<size_t>(c.B * per));
        for (int64_t i = 0; i < c.B * per; ++i) flag[i] = flags == 1 ? i % 2 == 0 : (i / per + i % per) % 3 != 0;
        const Tensor vis = flags == 0 ? Tensor() : ints(flag, {c.B, 1, per, 1}).to(DType::Bool);
        const Tensor g = rnd({c.B, c.H, c.N, c.E}, dt);
        const Tensor vis2 = vis.defined() ? contiguous(reshape(vis, {c.B, vis.size(2)})) : Tensor();
        const int64_t rows = c.B * c.H * c.N, group = c.H * c.N;
        Tensor out = empty(g.shape(), TensorOptions(dt)), dy = empty(y.shape(), TensorOptions(dt));
        cpu::sums_ratio(y, vis2, group, tiny, out, rows, c.E);
        cpu::sums_ratio_backward(g, y, vis2, group, tiny, dy, rows, c.E);
        const Tensor vis_d = vis2.defined() ? vis2.to(kCuda) : Tensor();
        Tensor out_d = poisoned(out.shape(), dt), dy_d = poisoned(y.shape(), dt);
        LINEA_BACKEND(kCuda, sums_ratio, y.to(kCuda), vis_d, group, tiny, out_d, rows, c.E);
        LINEA_BACKEND(kCuda, sums_ratio_backward, g.to(kCuda), y.to(kCuda), vis_d, group, tiny, dy_d, rows, c.E);
        EXPECT_TRUE(matches(out_d, out, 1.0, "out"));
        EXPECT_TRUE(matches(dy_d, dy, 1.0, "dy"));
      }
}

TEST(CudaParity, CrossEntropy) {
  LINEA_REQUIRE_CUDA();
  manual_seed(9);
  const Tensor target = ints({3, 0, 10, -100, 7, 7, 1, 2, -100, 5, 9, 4, 6}, {13});
  for (DType dt : kFloatTypes) {
    const Tensor logits = rnd({13, 11}, dt, 2.0);
    for (double s : {0.0, 0.1}) {
      for (Reduction red : {Reduction::Mean, Reduction::Sum, Reduction::None}) {
        const std::string name = "smoothing " + std::to_string(s) + " reduction " + std::to_string(int(red));
        expect_parity(tag(name, dt),
                      [s, red](const std::vector<Tensor>& v) { return cross_entropy(v[0], v[1], -100, s, red); },
                      {logits, target});
      }
    }
    expect_parity(tag("transposed logits, ignore_index 7", dt),
                  [](const std::vector<Tensor>& v) { return cross_entropy(v[0].t(), v[1], 7, 0.2); },
                  {rnd({11, 13}, dt), ints({3, 0, 10, 7, 7, 1, 2, 7, 5, 9, 4, 6, 0}, {13})});
    expect_parity(tag("many classes", dt), [](const std::vector<Tensor>& v) { return cross_entropy(v[0], v[1]); },
                  {rnd({3, 1000}, dt), ints({999, 0, 512}, {3})});
    expect_parity(tag("single row [C]", dt), [](const std::vector<Tensor>& v) { return cross_entropy(v[0], v[1]); },
                  {rnd({5}, dt), scalar_tensor(2, TensorOptions(DType::Int64))});
    // Masked classes (-inf logits) without smoothing: a finite loss (no 0 * -inf from the
    // smoothing's sum)
    expect_parity(tag("masked classes", dt), [](const std::vector<Tensor>& v) { return cross_entropy(v[0], v[1]); },
                  {from_vector<double>({0.5, -INFINITY, 1.0, -INFINITY, 2.0, 0.3}, {2, 3}).to(dt), ints({0, 2}, {2})});
    // The plain summed cross-entropy beside the smoothed loss, through autograd.
    expect_parity(tag("nll beside smoothing 0.1", dt),
                  [](const std::vector<Tensor>& v) {
                    Tensor nll;
                    cross_entropy(v[0], v[1], -100, 0.1, Reduction::Mean, &nll);
                    return nll;
                  },
                  {logits, target});
    // The rows' kernel into poisoned outputs, nll written beside the smoothed loss: the CPU's
    // values, and on the device the bits of its own loss at smoothing 0.
    const TensorOptions o(dt);
    Tensor loss = empty({13}, o), lse = empty({13}, o), nll = empty({13}, o);
    cpu::cross_entropy(logits, target, -100, 0.1, loss, lse, nll);
    const Tensor ld = logits.to(kCuda), td = target.to(kCuda);
    Tensor loss_d = poisoned({13}, dt), lse_d = poisoned({13}, dt), nll_d = poisoned({13}, dt);
    LINEA_BACKEND(kCuda, cross_entropy, ld, td, -100, 0.1, loss_d, lse_d, nll_d);
    EXPECT_TRUE(matches(loss_d, loss, 1.0, "loss"));
    EXPECT_TRUE(matches(lse_d, lse, 1.0, "lse"));
    EXPECT_TRUE(matches(nll_d, nll, 1.0, "nll"));
    Tensor plain_d = poisoned({13}, dt);
    LINEA_BACKEND(kCuda, cross_entropy, ld, td, -100, 0.0, plain_d, lse_d, Tensor());
    EXPECT_EQ(max(abs(nll_d - plain_d)).item(), 0.0);
  }
}

// The mean over many rows (several per thread of the mean's one block), some ignored, and over
// none kept (0, not NaN); a training call's launches: the rows' kernel and the mean's forward,
// the division and the rows' backward, which reads the expanded g / count in place.
TEST(CudaParity, CrossEntropyMean) {
  LINEA_REQUIRE_CUDA();
  manual_seed(11);
  std::vector<int64_t> tv(1037);
  for (size_t i = 0; i < tv.size(); ++i) tv[i] = i % 5 == 3 ? -100 : static_cast<int64_t>((i * 5) % 7);
  const Tensor target = ints(tv, {1037}), none = full({300}, -100.0, TensorOptions(DType::Int64));
  const Fn mean = [](const std::vector<Tensor>& v) { return cross_entropy(v[0], v[1], -100, 0.1); };
  for (DType dt : kFloatTypes) {
    expect_parity(tag("1037 rows", dt), mean, {rnd({1037, 7}, dt, 2.0), target});
    expect_parity(tag("every row ignored", dt), mean, {rnd({300, 7}, dt), none});
    expect_parity(tag("no rows", dt), mean, {rnd({0, 7}, dt), ints({}, {0})});
  }
  // The two kernels into poisoned outputs: the mean and its count, and the rows' backward reading
  // one gradient value for every row (a stride-0 expand).
  for (int64_t n : {1037, 0}) {
    SCOPED_TRACE(n);
    const Tensor loss = rnd({n}, DType::Float64), t = narrow(target, 0, 0, n), x = rnd({n, 7}, DType::Float64);
    const Tensor lse = logsumexp(x, {1}), g0 = rnd({}, DType::Float64), g = g0.expand({n});
    const TensorOptions o(DType::Float64);
    Tensor out = empty({}, o), count = empty({}, o), dx = empty({n, 7}, o);
    cpu::cross_entropy_mean(loss, t, -100, out, count);
    cpu::cross_entropy_backward(g, x, t, lse, -100, 0.1, dx);
    Tensor out_d = poisoned({}, DType::Float64), count_d = poisoned({}, DType::Float64),
           dx_d = poisoned({n, 7}, DType::Float64);
    LINEA_BACKEND(kCuda, cross_entropy_mean, loss.to(kCuda), t.to(kCuda), -100, out_d, count_d);
    LINEA_BACKEND(kCuda, cross_entropy_backward, g0.to(kCuda).expand({n}), x.to(kCuda), t.to(kCuda), lse.to(kCuda),
                  -100, 0.1, dx_d);
    EXPECT_TRUE(matches(out_d, out, 1.0, "mean"));
    EXPECT_TRUE(matches(count_d, count, 1.0, "count"));
    EXPECT_TRUE(matches(dx_d, dx, 1.0, "dlogits"));
  }
  Tensor logits = rnd({1037, 7}, DType::Float32).to(kCuda).requires_grad_(true);
  const Tensor tc = target.to(kCuda), one = full({}, 1.0, TensorOptions(DType::Float32, kCuda));
  const cuda::Counters before = cuda::counters();
  cross_entropy(logits, tc, -100, 0.1).backward(one);
  const cuda::Counters c = cuda::counters() - before;
  EXPECT_EQ(c.kernel_launches, 4) << c.str();
  EXPECT_EQ(c.library_calls + c.device_copies + c.h2d_copies + c.host_syncs, 0) << c.str();
}

TEST(CudaParity, Dropout) {
  LINEA_REQUIRE_CUDA();
  manual_seed(10);
  // The statistics and the gradient rule (the masks themselves: DropoutEqualsTheCpuBitForBit).
  const double p = 0.3;
  Tensor x = ones({100000}, TensorOptions(DType::Float32, kCuda)).requires_grad_(true);
  Tensor y = dropout(x, p, true);
  ASSERT_TRUE(y.is_cuda());
  const std::vector<double> v = y.to_vector<double>();
  int64_t zeros_n = 0;
  for (double e : v) {
    if (e == 0.0)
      ++zeros_n;
    else
      EXPECT_NEAR(e, 1.0 / (1.0 - p), 1e-6);
  }
  EXPECT_NEAR(static_cast<double>(zeros_n) / v.size(), p, 0.01);
  y.backward(ones({100000}, TensorOptions(DType::Float32, kCuda)));
  EXPECT_TRUE(test::all_close(x.grad().to(kCPU), y.detach().to(kCPU), 0, 0));  // grad = mask
}

// Per-example draws use Linea's own Philox counters on both devices: the same numbers, so a
// data-parallel run's dropout masks and attention samples do not depend on the device. Rows of
// 21 values: each row's last normal is half of a pair.
TEST(CudaParity, PerExampleDrawsEqualTheCpus) {
  LINEA_REQUIRE_CUDA();
  for (DType dt : {DType::Float32, DType::Float64}) {
    for (int64_t first : {0, 5}) {
      BatchRowsGuard rows(first);
      manual_seed(21);  // both generators: {21, 0}
      const Tensor uc = uniform_per_example({3, 3, 7}, -1.0, 2.0, TensorOptions(dt));
      const Tensor zc = normal_per_example({3, 3, 7}, 0.5, 2.0, TensorOptions(dt));
      const Tensor ug = uniform_per_example({3, 3, 7}, -1.0, 2.0, TensorOptions(dt, kCuda));
      const Tensor zg = normal_per_example({3, 3, 7}, 0.5, 2.0, TensorOptions(dt, kCuda));
      ASSERT_TRUE(ug.is_cuda());
      EXPECT_EQ(ug.to(kCPU).to_vector<double>(), uc.to_vector<double>());
      // Box-Muller's log/cos may round differently in the last bit on the GPU.
      EXPECT_TRUE(test::all_close(zg.to(kCPU), zc, dt == DType::Float32 ? 1e-6 : 1e-13, 1e-6));
      EXPECT_EQ(get_rng_state(kCuda)[1], 8u);  // two draws: one counter value (4 words) each
    }
  }
}

// Inside a draw capture (a CUDA graph's, apps/common/graph_steps.cpp) a per-example draw numbers
// itself from 0 and adds the device counter each replay sets: the numbers of the uncaptured draw
// at that counter.
TEST(CudaParity, CapturedPerExampleDrawsAddTheirBase) {
  LINEA_REQUIRE_CUDA();
  const TensorOptions o(DType::Float32, kCuda);
  for (bool normal : {false, true}) {
    SCOPED_TRACE(normal ? "normal" : "uniform");
    const auto draw = [&] {
      return normal ? normal_per_example({3, 5}, 0.5, 2.0, o) : uniform_per_example({3, 5}, -1.0, 2.0, o);
    };
    manual_seed(8);
    (void)draw();  // the counter past 0
    const uint64_t at = detail::next_example_draw(kCuda);
    const Tensor want = draw();
    const Tensor base = from_vector<int64_t>({static_cast<int64_t>(at)}, {1}).to(kCuda);
    detail::begin_draw_capture(static_cast<const uint64_t*>(base.data_ptr()));
    const Tensor got = draw();
    EXPECT_EQ(detail::end_draw_capture(), 1);
    EXPECT_EQ(got.to(kCPU).to_vector<double>(), want.to(kCPU).to_vector<double>());
  }
}

// A fork on CUDA restores both generators (an evaluation on the GPU also draws on the CPU).
TEST(CudaParity, ForkRngRestoresBothGenerators) {
  LINEA_REQUIRE_CUDA();
  manual_seed(4);
  (void)rand({3}, TensorOptions(DType::Float32, kCuda));
  const auto cpu = get_rng_state(kCPU), gpu = get_rng_state(kCuda);
  {
    const ForkRng fork(kCuda);
    (void)rand({3}, TensorOptions(DType::Float32, kCuda));
    (void)rand({3});
    EXPECT_NE(get_rng_state(kCuda), gpu);
  }
  EXPECT_EQ(get_rng_state(kCPU), cpu);
  EXPECT_EQ(get_rng_state(kCuda), gpu);
}

// ---- indexing --------------------------------------------------------------------------------------------
TEST(CudaParity, Indexing) {
  LINEA_REQUIRE_CUDA();
  manual_seed(11);
  const Tensor idx = ints({2, 0, 8, 2, 5, 2}, {6});  // repeats: index_add accumulates
  for (DType dt : kFloatTypes) {
    expect_parity(tag("index_select dim 1", dt),
                  [](const std::vector<Tensor>& v) { return index_select(v[0], 1, v[1]); }, {rnd({5, 9, 4}, dt), idx});
    expect_parity(tag("index_select dim 0 of a transposed", dt),
                  [](const std::vector<Tensor>& v) { return index_select(v[0].t(), 0, v[1]); }, {rnd({3, 9}, dt), idx});
    expect_parity(tag("embedding", dt), [](const std::vector<Tensor>& v) { return embedding(v[0], v[1]); },
                  {rnd({10, 6}, dt), ints({1, 9, 1, 0, 4, 4, 4, 7, 2, 3, 1, 8}, {3, 4})});
    expect_parity(tag("embedding, padding row 4 used", dt),
                  [](const std::vector<Tensor>& v) { return embedding(v[0], v[1], 4); },
                  {rnd({10, 6}, dt), ints({1, 9, 1, 0, 4, 4, 4, 7, 2, 3, 1, 8}, {3, 4})});
    // The input embedding: a learned table at an offset, then the table as long as the rows, a
    // padding row used, no positions.
    const Tensor tokens = ints({1, 9, 1, 0, 4, 4, 4, 7, 2, 3, 1, 8}, {3, 4});
    expect_parity(tag("embed_tokens, learned positions at 2", dt),
                  [](const std::vector<Tensor>& v) { return embed_tokens(v[0], v[1], 2.5, v[2], 2, 4); },
                  {rnd({10, 6}, dt), tokens, rnd({7, 6}, dt)});
    expect_parity(tag("embed_tokens, 4 positions", dt),
                  [](const std::vector<Tensor>& v) { return embed_tokens(v[0], v[1], -0.3, v[2]); },
                  {rnd({10, 6}, dt), tokens, rnd({4, 6}, dt)});
    expect_parity(tag("embed_tokens, no positions", dt),
                  [](const std::vector<Tensor>& v) { return embed_tokens(v[0], v[1], 8.0, Tensor()); },
                  {rnd({10, 6}, dt), tokens});
    const Tensor gidx =
        ints({0, 6, 3, 3, 1, 2, 2, 5, 0, 6, 4, 1, 1, 1, 0, 6, 5, 4, 3, 2}, {4, 5, 1}).expand({4, 5, 3}).contiguous();
    expect_parity(tag("gather dim 1", dt), [](const std::vector<Tensor>& v) { return gather(v[0], 1, v[1]); },
                  {rnd({4, 7, 3}, dt), gidx});
    expect_parity(
        tag("gather smaller index", dt),
        [](const std::vector<Tensor>& v) { return gather(v[0], 1, v[1].narrow(0, 0, 3).narrow(2, 0, 2).contiguous()); },
        {rnd({4, 7, 3}, dt), gidx});
    expect_parity(tag("gather dim 0", dt), [](const std::vector<Tensor>& v) { return gather(v[0], 0, v[1]); },
                  {rnd({7, 4}, dt), ints({0, 6, 3, 3, 1, 2, 2, 5}, {2, 4})});
    expect_parity(tag("scatter_add dim 1", dt),
                  [](const std::vector<Tensor>& v) { return scatter_add(v[0], 1, v[2], v[1]); },
                  {rnd({4, 7, 3}, dt), rnd({4, 5, 3}, dt), gidx});
    expect_parity(tag("scatter_add dim 0", dt),
                  [](const std::vector<Tensor>& v) { return scatter_add(v[0], 0, v[2], v[1]); },
                  {rnd({7, 4}, dt), rnd({2, 4}, dt), ints({0, 6, 3, 3, 1, 2, 2, 5}, {2, 4})});
    for (int64_t dim : {0, 1, 2})
      expect_parity(tag("cumsum dim " + std::to_string(dim), dt),
                    [dim](const std::vector<Tensor>& v) { return cumsum(v[0], dim); }, {rnd({5, 37, 3}, dt)});
    expect_parity(tag("cumsum transposed", dt), [](const std::vector<Tensor>& v) { return cumsum(v[0].t(), 1); },
                  {rnd({300, 4}, dt)});
    // sorted rows with ties (zeros summed), values on the elements too (a cdf times 1.0)
    const Tensor cdf = cumsum(relu(rnd({3, 2, 37}, dt)), -1);
    for (bool right : {false, true})
      expect_parity(tag(std::string("searchsorted") + (right ? " right" : " left"), dt),
                    [right](const std::vector<Tensor>& v) {
                      return searchsorted(v[0], cat({v[1], narrow(v[0], -1, 0, 5)}, -1), right);
                    },
                    {cdf, rnd({3, 2, 23}, dt, 4.0)});
  }
  // data-moving kernels on integer and bool data
  expect_parity("index_select int64", [](const std::vector<Tensor>& v) { return index_select(v[0], 0, v[1]); },
                {ints({10, 11, 12, 13, 14, 15, 16, 17, 18}, {9}), idx});
  expect_parity("index_select bool", [](const std::vector<Tensor>& v) { return index_select(v[0], 1, v[1]); },
                {gt(randn({2, 9}), 0.0), idx});
  expect_parity("gather bool", [](const std::vector<Tensor>& v) { return gather(v[0], 0, v[1]); },
                {gt(randn({7, 4}), 0.0), ints({0, 6, 3, 3, 1, 2, 2, 5}, {2, 4})});
  expect_parity("contiguous of a transposed bool", [](const std::vector<Tensor>& v) { return contiguous(v[0].t()); },
                {gt(randn({5, 3}), 0.0)});
  expect_parity("cumsum int64", [](const std::vector<Tensor>& v) { return cumsum(v[0], 0); },
                {ints({1, -2, 3, 4, 5, 6}, {3, 2})});
  // index_select's and gather's backward add into their zeros in place: a memset and the adding
  // kernels, no copy of the zeros.
  for (int gathered = 0; gathered < 2; ++gathered) {
    SCOPED_TRACE(gathered ? "gather" : "index_select");
    const Tensor x = rnd({5, 9, 4}, DType::Float32).to(kCuda).requires_grad_(true);
    const Tensor y = gathered ? gather(x, 1, zeros({5, 3, 4}, TensorOptions(DType::Int64, kCuda)))
                              : index_select(x, 1, idx.to(kCuda));
    const Tensor gy = rnd(y.shape(), DType::Float32).to(kCuda);
    const cuda::Counters before = cuda::counters();
    y.backward(gy);
    const cuda::Counters c = cuda::counters() - before;
    EXPECT_EQ(c.device_copies, 1) << c.str();  // the zeros' memset
    EXPECT_EQ(c.h2d_copies + c.host_syncs, 0) << c.str();
  }
}

// The ViT's class token and positions: through autograd (one and no prefix rows, a transposed
// x, sequences of no tokens); the two kernels into NaN-poisoned outputs, bit for bit (the batch
// summed in the same order), 37 rows of batch over 67 x 9 columns (not a multiple of the block);
// a training call's launches.
TEST(CudaParity, PrependAndAddPositions) {
  LINEA_REQUIRE_CUDA();
  manual_seed(12);
  for (DType dt : kFloatTypes) {
    expect_parity(tag("one prefix row", dt),
                  [](const std::vector<Tensor>& v) { return prepend_and_add_positions(v[0], v[1], v[2]); },
                  {rnd({3, 7, 5}, dt), rnd({1, 5}, dt), rnd({8, 5}, dt)});
    expect_parity(
        tag("no prefix, transposed x", dt),
        [](const std::vector<Tensor>& v) { return prepend_and_add_positions(v[0].transpose(1, 2), Tensor(), v[1]); },
        {rnd({3, 5, 7}, dt), rnd({7, 5}, dt)});
    expect_parity(tag("no tokens, the prefix alone", dt),
                  [](const std::vector<Tensor>& v) { return prepend_and_add_positions(v[0], v[1], v[2]); },
                  {rnd({3, 0, 5}, dt), rnd({2, 5}, dt), rnd({2, 5}, dt)});
    const int64_t B = 37, P = 2, N = 65, D = 9;
    const Tensor x = rnd({B, N, D}, dt), c = rnd({P, D}, dt), pos = rnd({P + N, D}, dt), g = rnd({B, P + N, D}, dt);
    const TensorOptions o(dt);
    Tensor out = empty({B, P + N, D}, o), dx = empty({B, N, D}, o), dc = empty({P, D}, o), dpos = empty({P + N, D}, o);
    cpu::prepend_and_add_positions(x, c, pos, out);
    cpu::prepend_and_add_positions_backward(g, P, dx, dc, dpos);
    Tensor out_d = poisoned(out.shape(), dt), dx_d = poisoned(dx.shape(), dt), dc_d = poisoned(dc.shape(), dt),
           dpos_d = poisoned(dpos.shape(), dt);
    LINEA_BACKEND(kCuda, prepend_and_add_positions, x.to(kCuda), c.to(kCuda), pos.to(kCuda), out_d);
    LINEA_BACKEND(kCuda, prepend_and_add_positions_backward, g.to(kCuda), P, dx_d, dc_d, dpos_d);
    for (const auto& [got, want, name] : {std::tuple{out_d, out, "out"}, std::tuple{dx_d, dx, "dx"},
                                          std::tuple{dc_d, dc, "dprefix"}, std::tuple{dpos_d, dpos, "dpositions"}})
      EXPECT_EQ(max(abs(got.to(kCPU) - want)).item(), 0.0) << name << " (" << dtype_name(dt) << ")";
    // Only dpositions wanted (dx and dprefix not asked for).
    Tensor only = poisoned(dpos.shape(), dt);
    LINEA_BACKEND(kCuda, prepend_and_add_positions_backward, g.to(kCuda), P, Tensor(), Tensor(), only);
    EXPECT_EQ(max(abs(only.to(kCPU) - dpos)).item(), 0.0);
  }
  const Tensor x = rnd({4, 6, 8}, DType::Float32).to(kCuda).requires_grad_(true);
  const Tensor c = rnd({1, 8}, DType::Float32).to(kCuda).requires_grad_(true);
  const Tensor pos = rnd({7, 8}, DType::Float32).to(kCuda).requires_grad_(true);
  const Tensor gy = rnd({4, 7, 8}, DType::Float32).to(kCuda);
  const cuda::Counters before = cuda::counters();
  const Tensor y = prepend_and_add_positions(x, c, pos);
  const cuda::Counters mid = cuda::counters();
  y.backward(gy);
  const cuda::Counters f = mid - before, b = cuda::counters() - mid;
  EXPECT_EQ(f.kernel_launches, 1) << f.str();
  EXPECT_EQ(b.kernel_launches, 1) << b.str();
  EXPECT_EQ(f.library_calls + f.device_copies + b.library_calls + b.device_copies, 0) << b.str();
}

// index_add and scatter_add add each target's sources in position order on both devices, so the
// results are the CPU's bit for bit and the same in every run, however often indices repeat (the
// embedding's backward, where every frequent token is such a repeat). Sources of mixed magnitudes
// make the rounding depend on the order; 3000 positions, and 70000 (past one block's sort).
TEST(CudaParity, IndexAddAndScatterAddEqualTheCpuBitForBit) {
  LINEA_REQUIRE_CUDA();
  manual_seed(23);
  const Tensor skewed = mul(randint(0, 8, {3000}), randint(0, 8, {3000}));  // 0..49, many zeros and small values
  for (DType dt : kFloatTypes) {
    SCOPED_TRACE(dtype_name(dt));
    const Tensor base = rnd({3, 50, 33}, dt), src = mul(rnd({3, 3000, 33}, dt), exp(rnd({3, 3000, 33}, dt, 3.0)));
    const Tensor cpu = raw::index_add(base, 1, skewed, src);
    const Tensor gpu1 = raw::index_add(base.to(kCuda), 1, skewed.to(kCuda), src.to(kCuda)).to(kCPU);
    const Tensor gpu2 = raw::index_add(base.to(kCuda), 1, skewed.to(kCuda), src.to(kCuda)).to(kCPU);
    EXPECT_EQ(gpu1.to_vector<double>(), cpu.to_vector<double>());
    EXPECT_EQ(gpu2.to_vector<double>(), gpu1.to_vector<double>());

    const Tensor sidx = randint(0, 20, {4, 500, 3}), ssrc = mul(rnd({4, 500, 3}, dt), exp(rnd({4, 500, 3}, dt, 3.0)));
    const Tensor sbase = rnd({4, 20, 3}, dt);
    const Tensor scpu = raw::scatter_add(sbase, 1, sidx, ssrc);
    const Tensor sgpu = raw::scatter_add(sbase.to(kCuda), 1, sidx.to(kCuda), ssrc.to(kCuda)).to(kCPU);
    EXPECT_EQ(sgpu.to_vector<double>(), scpu.to_vector<double>());

    // The embedding's weight gradient through autograd.
    const Tensor w = rnd({50, 16}, dt), tokens = skewed.narrow(0, 0, 2048).reshape({32, 64});
    const Tensor gout = mul(rnd({32, 64, 16}, dt), exp(rnd({32, 64, 16}, dt, 3.0)));
    Tensor wc = clone(w).requires_grad_(true), wg = w.to(kCuda).requires_grad_(true);
    embedding(wc, tokens).backward(gout);
    embedding(wg, tokens.to(kCuda)).backward(gout.to(kCuda));
    EXPECT_EQ(wg.grad().to(kCPU).to_vector<double>(), wc.grad().to_vector<double>());

    // More positions than one block of threads could sort (the sort once was a single block's):
    // the same bits too.
    const Tensor many = randint(0, 40, {70000}), msrc = mul(rnd({70000, 2}, dt), exp(rnd({70000, 2}, dt, 3.0)));
    const Tensor mbase = rnd({40, 2}, dt);
    EXPECT_EQ(raw::index_add(mbase.to(kCuda), 0, many.to(kCuda), msrc.to(kCuda)).to(kCPU).to_vector<double>(),
              raw::index_add(mbase, 0, many, msrc).to_vector<double>());
    const Tensor mi = many.reshape({35000, 2}), ms = msrc.narrow(0, 0, 35000).contiguous();
    EXPECT_EQ(raw::scatter_add(mbase.to(kCuda), 0, mi.to(kCuda), ms.to(kCuda)).to(kCPU).to_vector<double>(),
              raw::scatter_add(mbase, 0, mi, ms).to_vector<double>());
  }
  // Scaled (the input embedding's sqrt(dim)): the product and the sum rounded apart on the GPU too,
  // as on the CPU. Kernel calls against the CPU's: index_add into the same random base, and the
  // embedding's forward into a NaN-poisoned output (35 rows of 13: not a multiple of the block).
  for (DType dt : kFloatTypes) {
    SCOPED_TRACE(dtype_name(dt));
    const Tensor base = rnd({50, 33}, dt), src = mul(rnd({3000, 33}, dt), exp(rnd({3000, 33}, dt, 3.0)));
    Tensor cpu = clone(base), gpu = base.to(kCuda);
    cpu::index_add(cpu, skewed, src, 1, 50, 33, 0.37);
    LINEA_BACKEND(kCuda, index_add, gpu, skewed.to(kCuda), src.to(kCuda), 1, 50, 33, 0.37);
    EXPECT_EQ(gpu.to(kCPU).to_vector<double>(), cpu.to_vector<double>());

    // (row 0 of the table zero and the scale negative: -0 without a table, on both devices)
    const Tensor w = cat({zeros({1, 13}, TensorOptions(dt)), rnd({49, 13}, dt)}, 0), pos = rnd({9, 13}, dt),
                 tok = skewed.narrow(0, 0, 35);
    for (const Tensor& p : {pos, Tensor()}) {
      SCOPED_TRACE(p.defined() ? "positions" : "none");
      Tensor out = empty({35, 13}, TensorOptions(dt)), out_d = poisoned({35, 13}, dt);
      cpu::embed_tokens(w, tok, -5.7, p, 2, 7, out);  // 5 rows of 7 positions from 2 (9 in the table)
      LINEA_BACKEND(kCuda, embed_tokens, w.to(kCuda), tok.to(kCuda), -5.7, p.defined() ? p.to(kCuda) : Tensor(), 2, 7,
                    out_d);
      const std::vector<double> got = out_d.to(kCPU).to_vector<double>(), ref = out.to_vector<double>();
      EXPECT_EQ(got, ref);
      size_t signs = 0;
      for (size_t i = 0; i < got.size(); ++i) signs += std::signbit(got[i]) != std::signbit(ref[i]);
      EXPECT_EQ(signs, 0u);
    }
  }
  {  // A training call: the forward one kernel; with a fixed table the backward the weight's only
    // (the positions to sort, CUB's sort, the sorted add; the zeros and the padding row memsets),
    // with a learned one its sum besides.
    const Tensor tokc = ints({1, 9, 1, 0, 4, 4, 4, 7, 2, 3, 1, 8}, {3, 4}).to(kCuda);
    const Tensor pos = rnd({4, 6}, DType::Float32).to(kCuda), g = rnd({3, 4, 6}, DType::Float32).to(kCuda);
    for (bool learned : {false, true}) {
      SCOPED_TRACE(learned ? "learned" : "fixed");
      Tensor w = rnd({10, 6}, DType::Float32).to(kCuda).requires_grad_(true);
      Tensor p = learned ? pos.detach().requires_grad_(true) : pos;
      cuda::Counters before = cuda::counters();
      const Tensor y = embed_tokens(w, tokc, 8.0, p, 0, 2);
      cuda::Counters n = cuda::counters() - before;
      EXPECT_EQ(n.kernel_launches, 1) << n.str();
      before = cuda::counters();
      y.backward(g);
      n = cuda::counters() - before;
      EXPECT_EQ(n.kernel_launches, learned ? 3 : 2) << n.str();
      EXPECT_EQ(n.device_copies, 2) << n.str();
    }
  }
  // int64 values (exact sums)
  const Tensor ibase = randint(-9, 9, {50, 3}), isrc = randint(-1000, 1000, {3000, 3});
  EXPECT_EQ(raw::index_add(ibase.to(kCuda), 0, skewed.to(kCuda), isrc.to(kCuda)).to(kCPU).to_vector<int64_t>(),
            raw::index_add(ibase, 0, skewed, isrc).to_vector<int64_t>());
  const Tensor iidx = randint(0, 50, {3000, 3});
  EXPECT_EQ(raw::scatter_add(ibase.to(kCuda), 0, iidx.to(kCuda), isrc.to(kCuda)).to(kCPU).to_vector<int64_t>(),
            raw::scatter_add(ibase, 0, iidx, isrc).to_vector<int64_t>());
}

// A beam reorder of a key/value cache: the filled rows [0, 6) of a [5, 3, 11, 5] buffer selected
// along dim 0 into those of a new buffer, whose room keeps its poison (the kernel writes only the
// rows kept), in float32, int64 and bool (the padding buffer, [B, cap]); and index_select of the
// filled part, which reads the rows in place, forward and backward.
TEST(CudaParity, IndexSelectIntoABuffersPart) {
  LINEA_REQUIRE_CUDA();
  manual_seed(31);
  const Tensor idx = ints({4, 0, 4, 2, 1, 3, 0}, {7});  // more rows than the source: a select, not a permutation
  // x's rows [0, 6) along `along` selected at idx into a new buffer of x's room, poisoned (7).
  const auto into_part = [](int64_t along) {
    return [along](const std::vector<Tensor>& v) {
      Shape s = v[0].shape();
      s[0] = v[1].numel();
      Tensor buf = full(s, 7.0, v[0].options());
      raw::index_select_out(narrow(buf, along, 0, 6), narrow(v[0], along, 0, 6), 0, v[1]);
      return buf;
    };
  };
  expect_parity("float32 rows of a part", into_part(2), {rnd({5, 3, 11, 5}, DType::Float32), idx}, 1.0, false);
  expect_parity("int64 rows of a part", into_part(2), {randint(-50, 50, {5, 3, 11, 5}), idx}, 1.0, false);
  expect_parity("bool padding rows", into_part(1), {gt(randn({5, 13}), 0.0), idx}, 1.0, false);
  // into a contiguous tensor, and a contiguous source into a part
  expect_parity(
      "float32 a part into a tensor",
      [](const std::vector<Tensor>& v) {
        Tensor out = full({7, 3, 6, 5}, 7.0, v[0].options());
        raw::index_select_out(out, narrow(v[0], 2, 0, 6), 0, v[1]);
        return out;
      },
      {rnd({5, 3, 11, 5}, DType::Float32), idx}, 1.0, false);
  expect_parity(
      "float32 a tensor into a part",
      [](const std::vector<Tensor>& v) {
        Tensor buf = full({7, 3, 11, 5}, 7.0, v[0].options());
        raw::index_select_out(narrow(buf, 2, 0, 6), v[0], 0, v[1]);
        return buf;
      },
      {rnd({5, 3, 6, 5}, DType::Float32), idx}, 1.0, false);
  expect_parity("index_select of a part",
                [](const std::vector<Tensor>& v) { return index_select(narrow(v[0], 2, 0, 6), 0, v[1]); },
                {rnd({5, 3, 11, 5}, DType::Float32), idx});
  // a bad device index: reported at the next synchronization
  const Tensor x = randn({4, 3, 9, 2}, TensorOptions(DType::Float32, kCuda));
  Tensor out = empty({2, 3, 5, 2}, x.options());
  raw::index_select_out(out, narrow(x, 2, 0, 5), 0, ints({1, 4}, {2}).to(kCuda));
  EXPECT_LINEA_ERROR(out.to(kCPU), "index_select", "out of range");
}

TEST(CudaParity, BadIndicesAreReported) {
  LINEA_REQUIRE_CUDA();
  const Tensor x = randn({4, 3}, TensorOptions(DType::Float32, kCuda));
  const Tensor bad = ints({1, 4}, {2}).to(kCuda);
  EXPECT_LINEA_ERROR(index_select(x, 0, bad).to(kCPU), "out of range");
  EXPECT_LINEA_ERROR(embed_tokens(x, bad, 2.0, Tensor()).to(kCPU), "embed_tokens");
  // Both ends of the range, by every op that reports: what a bad index selected is 0, what it
  // added is skipped, the rest as asked.
  const std::vector<double> xv = x.to(kCPU).to_vector<double>();
  const TensorOptions o(DType::Float32, kCuda);
  for (int64_t b : {int64_t{-1}, int64_t{4}}) {
    SCOPED_TRACE("index " + std::to_string(b));
    const std::string size4 = "index " + std::to_string(b) + " is out of range for a dim of size 4";
    const Tensor idx = ints({1, b}, {2}).to(kCuda);
    const std::vector<double> row1(xv.begin() + 3, xv.begin() + 6);
    const Tensor sel = index_select(x, 0, idx);
    EXPECT_LINEA_ERROR(sel.to(kCPU), "index_select: " + size4);
    EXPECT_EQ(sel.to(kCPU).to_vector<double>(), (std::vector<double>{row1[0], row1[1], row1[2], 0, 0, 0}));
    const Tensor emb = embed_tokens(x, idx, 2.0, Tensor());
    EXPECT_LINEA_ERROR(emb.to(kCPU), "embed_tokens: " + size4);
    EXPECT_EQ(emb.to(kCPU).to_vector<double>(), (std::vector<double>{2 * row1[0], 2 * row1[1], 2 * row1[2], 0, 0, 0}));
    const Tensor added = raw::index_add(zeros({4, 3}, o), 0, idx, ones({2, 3}, o));
    EXPECT_LINEA_ERROR(added.to(kCPU), "index_add: " + size4);
    EXPECT_EQ(added.to(kCPU).to_vector<double>(), (std::vector<double>{0, 0, 0, 1, 1, 1, 0, 0, 0, 0, 0, 0}));
    const Tensor scattered =
        scatter_add(zeros({4, 3}, o), 0, ints({1, b, 2, 0, 0, 3}, {2, 3}).to(kCuda), ones({2, 3}, o));
    EXPECT_LINEA_ERROR(scattered.to(kCPU), "scatter_add: " + size4);
    EXPECT_EQ(scattered.to(kCPU).to_vector<double>(), (std::vector<double>{1, 1, 0, 1, 0, 0, 0, 0, 1, 0, 0, 1}));
    const Tensor gathered = raw::gather(x, 1, ints({0, b, 2, 1, 0, 0, 1, 1}, {4, 2}).to(kCuda));  // a dim of size 3
    EXPECT_LINEA_ERROR(gathered.to(kCPU),
                       "gather: index " + std::to_string(b) + " is out of range for a dim of size 3");
    EXPECT_EQ(gathered.to(kCPU).to_vector<double>(),
              (std::vector<double>{xv[0], 0, xv[5], xv[4], xv[6], xv[6], xv[10], xv[10]}));
  }
  const Tensor logits = randn({2, 5}, TensorOptions(DType::Float32, kCuda));
  EXPECT_LINEA_ERROR(cross_entropy(logits, ints({1, 5}, {2}).to(kCuda)).item(), "cross_entropy");
  EXPECT_LINEA_ERROR(cross_entropy(logits, ints({-3, 1}, {2}).to(kCuda)).item(), "cross_entropy");
  // The backward of a row with a bad target (its forward reported it) is 0: no read at that class.
  Tensor dx = poisoned({2, 5}, DType::Float32);
  LINEA_BACKEND(kCuda, cross_entropy_backward, ones({2}, logits.options()), logits, ints({-3, 5}, {2}).to(kCuda),
                zeros({2}, logits.options()), -100, 0.0, dx);
  EXPECT_EQ(dx.to(kCPU).to_vector<double>(), std::vector<double>(10, 0.0));
  // the device is still usable afterwards
  EXPECT_NEAR(sum(ones({10}, TensorOptions(DType::Float32, kCuda))).item(), 10.0, 0.0);
}

// ---- FFT -----------------------------------------------------------------------------------------------
TEST(CudaParity, Fft) {
  LINEA_REQUIRE_CUDA();
  manual_seed(12);
  // Transform errors grow with the length and the whole signal's magnitude: scale 20.
  const double s = 20.0;
  for (DType dt : kFloatTypes) {
    for (int64_t n : {37, 64, 1, 2}) {
      expect_parity(
          tag("rfft n=" + std::to_string(n), dt), [n](const std::vector<Tensor>& v) { return rfft(v[0], n); },
          {rnd({3, n}, dt)}, s);
      expect_parity(
          tag("irfft n=" + std::to_string(n), dt), [n](const std::vector<Tensor>& v) { return irfft(v[0], n); },
          {rnd({3, n / 2 + 1, 2}, dt)}, s);
    }
    expect_parity(
        tag("rfft padded", dt), [](const std::vector<Tensor>& v) { return rfft(v[0], 64); }, {rnd({2, 50}, dt)}, s);
    expect_parity(
        tag("rfft truncated", dt), [](const std::vector<Tensor>& v) { return rfft(v[0], 20); }, {rnd({2, 50}, dt)}, s);
    expect_parity(
        tag("rfft dim 0 of a transposed", dt), [](const std::vector<Tensor>& v) { return rfft(v[0].t(), 36, 0); },
        {rnd({4, 36}, dt)}, s);
    expect_parity(
        tag("irfft dim 1", dt), [](const std::vector<Tensor>& v) { return irfft(v[0], 36, 1); },
        {rnd({2, 19, 3, 2}, dt)}, s);
    // round trip on the device, and rfft leaves its input alone
    const Tensor x = rnd({5, 37}, dt).to(kCuda);
    const Tensor before = x.to(kCPU);
    const Tensor back = irfft(rfft(x, 37), 37);
    EXPECT_TRUE(matches(back, before, s, "irfft(rfft(x))"));
    EXPECT_TRUE(test::all_close(x.to(kCPU), before, 0, 0));
  }
}

// ---- random ----------------------------------------------------------------------------------------------
TEST(CudaRandom, SeedReproducibleAndStateRestores) {
  LINEA_REQUIRE_CUDA();
  for (DType dt : kFloatTypes) {
    const TensorOptions o(dt, kCuda);
    manual_seed(1234);
    const Tensor a1 = randn({1001}, o), b1 = rand({64, 3}, o), c1 = randn({2048}, o);
    manual_seed(1234);
    const Tensor a2 = randn({1001}, o), b2 = rand({64, 3}, o), c2 = randn({2048}, o);
    EXPECT_TRUE(test::all_close(a1.to(kCPU), a2.to(kCPU), 0, 0));
    EXPECT_TRUE(test::all_close(b1.to(kCPU), b2.to(kCPU), 0, 0));
    EXPECT_TRUE(test::all_close(c1.to(kCPU), c2.to(kCPU), 0, 0));
    // successive draws differ
    EXPECT_FALSE(test::all_close(a1.narrow(0, 0, 1000).to(kCPU), c1.narrow(0, 0, 1000).to(kCPU), 1e-3, 0));
    // state save / restore
    const std::vector<uint64_t> st = get_rng_state(kCuda);
    ASSERT_EQ(st.size(), 2u);
    const Tensor d1 = uniform({333}, -2.0, 3.0, o);
    set_rng_state(st, kCuda);
    const Tensor d2 = uniform({333}, -2.0, 3.0, o);
    EXPECT_TRUE(test::all_close(d1.to(kCPU), d2.to(kCPU), 0, 0));
  }
}

TEST(CudaRandom, Distributions) {
  LINEA_REQUIRE_CUDA();
  manual_seed(99);
  for (DType dt : kFloatTypes) {
    const TensorOptions o(dt, kCuda);
    const int64_t n = 200001;  // odd: the normal path through scratch
    const std::vector<double> z = normal({n}, 1.5, 2.0, o).to_vector<double>();
    double m = 0, v = 0;
    for (double e : z) m += e;
    m /= n;
    for (double e : z) v += (e - m) * (e - m);
    v /= n - 1;
    EXPECT_NEAR(m, 1.5, 0.03);
    EXPECT_NEAR(std::sqrt(v), 2.0, 0.03);
    const std::vector<double> u = uniform({n}, -1.0, 3.0, o).to_vector<double>();
    double mu = 0;
    for (double e : u) {
      EXPECT_GE(e, -1.0);
      EXPECT_LT(e, 3.0);
      mu += e;
    }
    EXPECT_NEAR(mu / n, 1.0, 0.02);
  }
  const std::vector<int64_t> r = randint(3, 9, {5000}, kCuda).to_vector<int64_t>();
  for (int64_t e : r) {
    EXPECT_GE(e, 3);
    EXPECT_LT(e, 9);
  }
  std::vector<int64_t> perm = randperm(100, kCuda).to_vector<int64_t>();
  std::sort(perm.begin(), perm.end());
  for (int64_t i = 0; i < 100; ++i) EXPECT_EQ(perm[static_cast<size_t>(i)], i);
}

// ---- allocator -----------------------------------------------------------------------------------------------
#ifdef LINEA_WITH_CUDA
TEST(CudaAllocator, LoopReusesBlocks) {
  LINEA_REQUIRE_CUDA();
  if (!cuda::allocator().caching()) GTEST_SKIP() << "LINEA_NO_CUDA_MEMORY_CACHING=1: no block is reused";
  const TensorOptions o(DType::Float32, kCuda);
  auto step = [&] {
    Tensor a = randn({256, 37}, o);
    Tensor b = matmul(a, a.t());
    Tensor c = softmax(b, 1).sum();
    return c.item();
  };
  step();  // warm-up: fills the cache (and creates cuBLAS' handle)
  const AllocatorStats s0 = cuda::allocator().stats();
  for (int i = 0; i < 20; ++i) step();
  const AllocatorStats s1 = cuda::allocator().stats();
  EXPECT_EQ(s1.num_raw_allocs, s0.num_raw_allocs) << "steady-state loop should reuse cached blocks";
  EXPECT_GT(s1.num_allocs, s0.num_allocs);
  EXPECT_EQ(s1.allocated_bytes, s0.allocated_bytes) << "all step temporaries freed";
  // empty tensors allocate fine
  EXPECT_EQ(empty({0, 3}, o).numel(), 0);
}
#endif

// ---- optimizer steps -----------------------------------------------------------------------------------------
// raw::sgd_step / raw::adam_step (one fused kernel per parameter) on CPU tensors and on CUDA copies, several
// steps in a row so that the state written by one step is read by the next; awkward sizes (1, odd, a
// non-multiple of the block size) and, for 2-D parameters, a non-contiguous (transposed) gradient. Each step
// adds a few roundings to the state, so the float32 tolerance is scaled by the step count.
TEST(CudaParity, OptimizerSteps) {
  LINEA_REQUIRE_CUDA();
  const std::vector<Shape> shapes = {{0}, {1}, {7}, {3, 86}, {1031, 3}};
  struct SgdCfg {
    double momentum, dampening, wd;
    bool nesterov;
  };
  const std::vector<SgdCfg> sgd_cfgs = {{0.0, 0.0, 0.0, false}, {0.9, 0.1, 0.01, false}, {0.9, 0.0, 0.05, true}};
  for (DType dt : kFloatTypes) {
    for (const Shape& shape : shapes) {
      // A gradient for step s: contiguous, or for 2-D shapes at odd steps a transposed view on both devices.
      auto grads = [&](int s) {
        if (shape.size() == 2 && s % 2 == 1) {
          Tensor g = rnd({shape[1], shape[0]}, dt);
          return std::make_pair(g.transpose(0, 1), g.to(kCuda).transpose(0, 1));
        }
        Tensor g = rnd(shape, dt);
        return std::make_pair(g, g.to(kCuda));
      };
      for (const SgdCfg& c : sgd_cfgs) {
        Tensor p = rnd(shape, dt), pd = p.to(kCuda);
        Tensor buf, bufd;
        if (c.momentum != 0.0) {
          buf = zeros(shape, TensorOptions(dt));
          bufd = zeros(shape, TensorOptions(dt, kCuda));
        }
        for (int s = 0; s < 3; ++s) {
          auto [g, gd] = grads(s);
          raw::sgd_step(p, g, buf, 0.1, c.momentum, c.dampening, c.wd, c.nesterov, s == 0);
          raw::sgd_step(pd, gd, bufd, 0.1, c.momentum, c.dampening, c.wd, c.nesterov, s == 0);
          const std::string what = "sgd_step " + shape_str(shape) + " momentum " + std::to_string(c.momentum) +
                                   (c.nesterov ? " nesterov" : "") + " step " + std::to_string(s);
          EXPECT_TRUE(matches(pd, p, s + 1, (what + " param").c_str()));
          if (buf.defined()) {
            EXPECT_TRUE(matches(bufd, buf, s + 1, (what + " buf").c_str()));
          }
        }
      }
      for (bool decoupled : {false, true}) {
        Tensor p = rnd(shape, dt), pd = p.to(kCuda);
        Tensor m = zeros(shape, TensorOptions(dt)), md = zeros(shape, TensorOptions(dt, kCuda));
        Tensor v = zeros(shape, TensorOptions(dt)), vd = zeros(shape, TensorOptions(dt, kCuda));
        const double wd = decoupled ? 0.1 : 0.01;
        for (int s = 1; s <= 3; ++s) {
          auto [g, gd] = grads(s);
          raw::adam_step(p, g, m, v, 0.01, 0.9, 0.999, 1e-8, wd, decoupled, s);
          raw::adam_step(pd, gd, md, vd, 0.01, 0.9, 0.999, 1e-8, wd, decoupled, s);
          const std::string what =
              std::string(decoupled ? "adamw_step " : "adam_step ") + shape_str(shape) + " step " + std::to_string(s);
          EXPECT_TRUE(matches(pd, p, s + 1, (what + " param").c_str()));
          EXPECT_TRUE(matches(md, m, s + 1, (what + " exp_avg").c_str()));
          EXPECT_TRUE(matches(vd, v, s + 1, (what + " exp_avg_sq").c_str()));
        }
      }
    }
  }
}

// Every op that takes several tensors refuses them on two devices, naming itself, before any
// kernel reads a host pointer on the device (or a device pointer on the host): one case per check.
TEST(CudaParity, TensorsOnTwoDevicesAreRefused) {
  LINEA_REQUIRE_CUDA();
  const auto g = [](const Tensor& x) { return x.to(kCuda); };
  const TensorOptions i64(DType::Int64), b8(DType::Bool);
  const Tensor x23 = zeros({2, 3}), w43 = zeros({4, 3}), v3 = zeros({3}), i2 = zeros({2}, i64), rows2 = zeros({2});
  const Tensor y = zeros({1, 1, 2, 3}), vis = zeros({1, 1, 2, 1}, b8), t32 = zeros({3, 2}), i32 = zeros({3, 2}, i64);
  const FoldedDropout none;
  const std::vector<std::pair<std::string, std::function<void()>>> cases = {
      {"add", [&] { raw::binary(BinaryOp::Add, rows2, g(rows2)); }},
      {"where", [&] { raw::where(g(zeros({2}, b8)), rows2, rows2); }},
      {"where", [&] { raw::where(zeros({2}, b8), rows2, g(rows2)); }},
      {"masked_fill", [&] { raw::masked_fill(rows2, g(zeros({2}, b8)), 1.0); }},
      {"linear", [&] { raw::linear(x23, g(w43), Tensor()); }},
      {"linear", [&] { raw::linear(x23, w43, g(zeros({4}))); }},
      {"linear_weight_grad",
       [&] {
         raw::linear_weight_grad(g(zeros({2, 4})), x23, true);
       }},
      {"matmul", [&] { raw::matmul(x23, g(t32)); }},
      {"matmul",
       [&] {
         raw::matmul_into(x23, t32, g(zeros({2, 2})));
       }},
      {"softmax_backward", [&] { raw::softmax_backward(g(x23), x23, 1, false); }},
      {"layer_norm", [&] { raw::layer_norm(x23, 1, g(v3), Tensor(), 1e-5); }},
      {"layer_norm", [&] { raw::layer_norm(x23, 1, v3, g(v3), 1e-5); }},
      {"add_layer_norm", [&] { raw::add_layer_norm(x23, g(x23), none, 1, Tensor(), Tensor(), 1e-5); }},
      {"layer_norm_backward",
       [&] { raw::layer_norm_backward(g(x23), x23, 1, Tensor(), Tensor(), zeros({2}), zeros({2})); }},
      {"normalize_backward", [&] { raw::normalize_backward(g(x23), x23, 1e-12); }},
      {"sums_ratio", [&] { raw::sums_ratio(y, g(vis), 1e-6); }},
      {"sums_ratio_backward",
       [&] {
         raw::sums_ratio_backward(g(zeros({1, 1, 2, 2})), y, Tensor(), 1e-6);
       }},
      {"sq_norm_backward", [&] { raw::sq_norm_backward(g(rows2), x23, 1.0); }},
      {"cross_entropy", [&] { raw::cross_entropy_rows(x23, g(i2), -100, 0.0); }},
      {"cross_entropy_backward", [&] { raw::cross_entropy_rows_backward(g(rows2), x23, i2, rows2, -100, 0.0); }},
      {"cross_entropy_mean", [&] { raw::cross_entropy_mean(rows2, g(i2), -100); }},
      {"index_select", [&] { raw::index_select(t32, 0, g(i2)); }},
      {"index_select",
       [&] {
         raw::index_select_out(g(zeros({2, 2})), t32, 0, i2);
       }},
      {"index_add",
       [&] {
         raw::index_add_(zeros({3, 2}), 0, g(i2), zeros({2, 2}));
       }},
      {"index_add",
       [&] {
         raw::index_add_(zeros({3, 2}), 0, i2, g(zeros({2, 2})));
       }},
      {"embed_tokens",
       [&] {
         raw::embed_tokens(t32, g(zeros({1, 2}, i64)), 1.0, Tensor(), 0);
       }},
      {"embed_tokens",
       [&] {
         raw::embed_tokens(t32, zeros({1, 2}, i64), 1.0, g(zeros({4, 2})), 0);
       }},
      {"embedding_weight_grad",
       [&] {
         raw::embedding_weight_grad(g(zeros({1, 2, 2})), zeros({1, 2}, i64), 3, 1.0, -1);
       }},
      {"prepend_and_add_positions",
       [&] {
         raw::prepend_and_add_positions(zeros({1, 2, 2}), g(zeros({1, 2})), zeros({3, 2}));
       }},
      {"prepend_and_add_positions",
       [&] {
         raw::prepend_and_add_positions(zeros({1, 2, 2}), zeros({1, 2}), g(zeros({3, 2})));
       }},
      {"gather", [&] { raw::gather(t32, 0, g(i32)); }},
      {"scatter_add",
       [&] {
         raw::scatter_add_(zeros({3, 2}), 0, g(i32), t32);
       }},
      {"scatter_add",
       [&] {
         raw::scatter_add_(zeros({3, 2}), 0, i32, g(t32));
       }},
      {"cat",
       [&] {
         raw::cat({rows2, g(rows2)}, 0);
       }},
      {"searchsorted", [&] { raw::searchsorted(v3, g(rows2)); }},
      {"sgd_step", [&] { raw::sgd_step(x23, g(x23), Tensor(), 0.1, 0, 0, 0, false, false); }},
  };
  for (const auto& [op, call] : cases) {
    SCOPED_TRACE(op);
    EXPECT_LINEA_ERROR(call(), op + ": expected all tensors on the same device, got ");
  }
}

}  // namespace
}  // namespace linea
