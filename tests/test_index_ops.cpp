// Forward values of the indexing, joining, prefix-sum and real-FFT ops against naive loops
// (the FFTs against an O(n^2) DFT in float64), their float32 variants, the parallel kernel paths
// on large inputs, and bad-input errors. Gradients are in test_gradcheck_index.cpp.
#include <algorithm>
#include <array>
#include <cmath>
#include <vector>

#include "tests/test_util.h"

namespace linea::test {
namespace {

constexpr double kPi = 3.14159265358979323846;

// Row-major strides of a shape, for the naive loops below.
std::vector<int64_t> rm_strides(const Shape& s) { return contiguous_strides(s); }

// ---- naive references -------------------------------------------------------------------

// rfft along `dim` of x (any shape) with padding/truncation to n: [.., n/2+1 at dim, .., 2].
std::vector<double> naive_rfft(const Tensor& x, int64_t n, int64_t dim) {
  const Shape xs = x.shape();
  const auto xv = x.to_vector<double>();
  const int64_t L = xs[dim], F = n / 2 + 1;
  Shape os = xs;
  os[dim] = F;
  os.push_back(2);
  const auto xst = rm_strides(xs), ost = rm_strides(os);
  std::vector<double> out(static_cast<size_t>(shape_numel(os)), 0.0);
  // iterate over all positions of x with dim fixed at 0
  const int64_t total = shape_numel(xs) / std::max<int64_t>(L, 1);
  for (int64_t p = 0; p < total; ++p) {
    // decompose p over xs without dim
    int64_t rem = p, xoff = 0, ooff = 0;
    for (int64_t d = static_cast<int64_t>(xs.size()) - 1; d >= 0; --d) {
      if (d == dim) continue;
      const int64_t c = rem % xs[d];
      rem /= xs[d];
      xoff += c * xst[d];
      ooff += c * ost[d];
    }
    for (int64_t k = 0; k < F; ++k) {
      double re = 0, im = 0;
      for (int64_t t = 0; t < std::min(L, n); ++t) {
        const double v = xv[static_cast<size_t>(xoff + t * xst[dim])];
        re += v * std::cos(2 * kPi * double(k * t) / double(n));
        im -= v * std::sin(2 * kPi * double(k * t) / double(n));
      }
      out[static_cast<size_t>(ooff + k * ost[dim])] = re;
      out[static_cast<size_t>(ooff + k * ost[dim] + 1)] = im;
    }
  }
  return out;
}

// Circular convolution of two length-n rows: y[i] = sum_j a[j] b[(i - j) mod n].
std::vector<double> naive_circconv(const std::vector<double>& a, const std::vector<double>& b) {
  const int64_t n = static_cast<int64_t>(a.size());
  std::vector<double> y(a.size(), 0.0);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < n; ++j) y[i] += a[j] * b[((i - j) % n + n) % n];
  return y;
}

Tensor f64_from(const std::vector<double>& v, const Shape& s) { return from_vector<double>(v, s); }

// Complex product of two spectra [..., 2] (re, im), with raw-free differentiable ops.
Tensor cmul(const Tensor& a, const Tensor& b) {
  Tensor ar = a.select(-1, 0), ai = a.select(-1, 1), br = b.select(-1, 0), bi = b.select(-1, 1);
  return stack({ar * br - ai * bi, ar * bi + ai * br}, -1);
}

// ---- FFT ----------------------------------------------------------------------------------

TEST(IndexOps, RfftMatchesNaiveDftEvenOdd) {
  manual_seed(1);
  for (int64_t n : {1, 2, 7, 8, 15, 16, 33}) {
    Tensor x = randn({3, n}, f64());
    Tensor y = rfft(x, n, -1);
    ASSERT_EQ(y.shape(), (Shape{3, n / 2 + 1, 2})) << "n=" << n;
    EXPECT_TRUE(all_close(y, f64_from(naive_rfft(x, n, 1), y.shape()), 1e-10, 1e-10)) << "n=" << n;
  }
}

TEST(IndexOps, RfftPaddingTruncationAndNonLastDim) {
  manual_seed(2);
  Tensor x = randn({5, 3, 4}, f64());  // transform along dim 0 (L = 5)
  for (int64_t n : {5, 8, 9, 3, 4}) {  // exact, padded even/odd, truncated odd/even
    Tensor y = rfft(x, n, 0);
    ASSERT_EQ(y.shape(), (Shape{n / 2 + 1, 3, 4, 2})) << "n=" << n;
    EXPECT_TRUE(all_close(y, f64_from(naive_rfft(x, n, 0), y.shape()), 1e-10, 1e-10)) << "n=" << n;
  }
  // middle dim of a non-contiguous (transposed) input
  Tensor xt = randn({4, 6, 3}, f64()).transpose(0, 2);  // [3, 6, 4]
  ASSERT_FALSE(xt.is_contiguous());
  Tensor y = rfft(xt, 7, 1);
  EXPECT_TRUE(all_close(y, f64_from(naive_rfft(xt, 7, 1), y.shape()), 1e-10, 1e-10));
}

TEST(IndexOps, RfftFloat32MatchesFloat64) {
  manual_seed(3);
  Tensor x = randn({4, 3, 50}, f64());
  Tensor y64 = rfft(x, 64, -1);
  Tensor y32 = rfft(x.to(DType::Float32), 64, -1);
  EXPECT_EQ(y32.dtype(), DType::Float32);
  EXPECT_TRUE(all_close(y32, y64, 1e-4, 1e-4));
  Tensor back32 = irfft(y32, 64, -1);
  EXPECT_EQ(back32.dtype(), DType::Float32);
  EXPECT_TRUE(all_close(back32.narrow(-1, 0, 50), x, 1e-5, 1e-5));
}

TEST(IndexOps, IrfftInvertsRfft) {
  manual_seed(4);
  for (int64_t n : {1, 2, 5, 6, 31, 64}) {
    Tensor x = randn({2, n, 3}, f64());
    Tensor back = irfft(rfft(x, n, 1), n, 1);
    ASSERT_EQ(back.shape(), x.shape());
    EXPECT_TRUE(all_close(back, x, 1e-12, 1e-10)) << "n=" << n;
  }
  // padding: irfft(rfft(x, n), n) is x followed by zeros
  Tensor x = randn({3, 10}, f64());
  Tensor back = irfft(rfft(x, 16, -1), 16, -1);
  EXPECT_TRUE(all_close(back.narrow(1, 0, 10), x, 1e-12, 1e-10));
  EXPECT_TRUE(all_close(back.narrow(1, 10, 6), zeros({3, 6}, f64()), 1e-12, 0));
}

TEST(IndexOps, IrfftIgnoresImagOfDcAndNyquistAndMatchesNaive) {
  // irfft of an arbitrary half spectrum equals the Hermitian-extended inverse DFT (imag parts of
  // DC and Nyquist ignored), computed naively.
  manual_seed(5);
  for (int64_t n : {6, 7}) {
    const int64_t F = n / 2 + 1;
    Tensor spec = randn({2, F, 2}, f64());
    auto sv = spec.to_vector<double>();
    std::vector<double> ref(static_cast<size_t>(2 * n), 0.0);
    for (int64_t b = 0; b < 2; ++b)
      for (int64_t t = 0; t < n; ++t) {
        double acc = 0;
        for (int64_t k = 0; k < F; ++k) {
          const double re = sv[(b * F + k) * 2], im = sv[(b * F + k) * 2 + 1];
          const double ang = 2 * kPi * double(k * t) / double(n);
          const bool edge = k == 0 || (n % 2 == 0 && k == n / 2);
          acc += (edge ? 1.0 : 2.0) * (re * std::cos(ang) - (edge ? 0.0 : im * std::sin(ang)));
        }
        ref[b * n + t] = acc / double(n);
      }
    EXPECT_TRUE(all_close(irfft(spec, n, 1), f64_from(ref, {2, n}), 1e-12, 1e-10)) << "n=" << n;
  }
}

TEST(IndexOps, CircularConvolutionViaFft) {
  manual_seed(6);
  for (int64_t n : {8, 9}) {
    Tensor a = randn({2, n}, f64()), b = randn({2, n}, f64());
    Tensor y = irfft(cmul(rfft(a, n, -1), rfft(b, n, -1)), n, -1);
    auto av = a.to_vector<double>(), bv = b.to_vector<double>();
    std::vector<double> ref;
    for (int64_t r = 0; r < 2; ++r) {
      std::vector<double> ar(av.begin() + r * n, av.begin() + (r + 1) * n);
      std::vector<double> br(bv.begin() + r * n, bv.begin() + (r + 1) * n);
      auto c = naive_circconv(ar, br);
      ref.insert(ref.end(), c.begin(), c.end());
    }
    EXPECT_TRUE(all_close(y, f64_from(ref, {2, n}), 1e-10, 1e-10)) << "n=" << n;
  }
}

TEST(IndexOps, ToeplitzProductViaFftMatchesDense) {
  // y_i = sum_j c_{i-j} x_j for i, j < L with c indexed by i-j in [-(L-1), L-1]: embed the
  // Toeplitz matrix in a circulant of size 2L (first column c_0..c_{L-1}, 0, c_{-(L-1)}..c_{-1}).
  manual_seed(7);
  const int64_t L = 9, n = 2 * L;
  Tensor c = randn({2 * L - 1}, f64());  // c[(i - j) + L - 1]
  Tensor x = randn({3, L}, f64());       // 3 rows, each transformed
  auto cv = c.to_vector<double>(), xv = x.to_vector<double>();
  std::vector<double> col(static_cast<size_t>(n), 0.0);
  for (int64_t d = 0; d < L; ++d) col[d] = cv[d + L - 1];      // c_d, d >= 0
  for (int64_t d = 1; d < L; ++d) col[n - d] = cv[L - 1 - d];  // c_{-d}
  Tensor colt = f64_from(col, {1, n});
  Tensor y = irfft(cmul(rfft(x, n, -1), rfft(colt, n, -1)), n, -1).narrow(-1, 0, L);
  std::vector<double> ref(static_cast<size_t>(3 * L), 0.0);
  for (int64_t r = 0; r < 3; ++r)
    for (int64_t i = 0; i < L; ++i)
      for (int64_t j = 0; j < L; ++j) ref[r * L + i] += cv[i - j + L - 1] * xv[r * L + j];
  EXPECT_TRUE(all_close(y, f64_from(ref, {3, L}), 1e-10, 1e-10));
}

TEST(IndexOps, FftLargeBatchUsesParallelPathConsistently) {
  // batch * n above the parallel threshold, odd row length (rows not all SIMD-aligned):
  // every row must equal the same row transformed alone.
  manual_seed(8);
  Tensor x = randn({301, 257}, TensorOptions(DType::Float32));
  Tensor y = rfft(x, 257, -1);
  for (int64_t r : {0, 1, 150, 300}) {
    Tensor yr = rfft(x.narrow(0, r, 1).contiguous(), 257, -1);
    EXPECT_TRUE(all_close(y.narrow(0, r, 1), yr, 0, 0)) << "row " << r;
  }
  Tensor back = irfft(y, 257, -1);
  EXPECT_TRUE(all_close(back, x, 1e-4, 1e-4));
}

// ---- cumsum -------------------------------------------------------------------------------

TEST(IndexOps, CumsumValues) {
  manual_seed(9);
  Tensor x = randn({3, 4, 5}, f64());
  auto xv = x.to_vector<double>();
  for (int64_t dim : {0, 1, 2}) {
    Shape s = x.shape();
    auto st = rm_strides(s);
    std::vector<double> ref(xv.size()), rev(xv.size());
    for (int64_t i = 0; i < 3; ++i)
      for (int64_t j = 0; j < 4; ++j)
        for (int64_t k = 0; k < 5; ++k) {
          int64_t idx[3] = {i, j, k};
          double acc = 0, racc = 0;
          for (int64_t m = 0; m < s[dim]; ++m) {
            int64_t q[3] = {i, j, k};
            q[dim] = m;
            const double v = xv[q[0] * st[0] + q[1] * st[1] + q[2] * st[2]];
            if (m <= idx[dim]) acc += v;
            if (m >= idx[dim]) racc += v;
          }
          ref[i * st[0] + j * st[1] + k * st[2]] = acc;
          rev[i * st[0] + j * st[1] + k * st[2]] = racc;
        }
    EXPECT_TRUE(all_close(cumsum(x, dim), f64_from(ref, s), 1e-12, 1e-12)) << "dim " << dim;
    EXPECT_TRUE(all_close(raw::cumsum(x, dim, true), f64_from(rev, s), 1e-12, 1e-12)) << "dim " << dim;
  }
  // negative dim, non-contiguous input, float32, int64
  Tensor xt = x.transpose(0, 2);  // [5, 4, 3]
  EXPECT_TRUE(all_close(cumsum(xt, -1), cumsum(xt.contiguous(), 2), 0, 0));
  EXPECT_TRUE(all_close(cumsum(x.to(DType::Float32), 1), cumsum(x, 1), 1e-5, 1e-5));
  Tensor xi = tensor<int64_t>({1, 2, 3, 4, 5, 6}, {2, 3});
  EXPECT_EQ(cumsum(xi, 1).to_vector<int64_t>(), (std::vector<int64_t>{1, 3, 6, 4, 9, 15}));
  EXPECT_EQ(cumsum(xi, 0).to_vector<int64_t>(), (std::vector<int64_t>{1, 2, 3, 5, 7, 9}));
}

TEST(IndexOps, CumsumLargeParallelMatchesSerial) {
  // [outer=2, r=3000, inner=40]: above the parallel threshold; integers make sums exact.
  Tensor x = randint(-5, 6, {2, 3000, 40}).to(DType::Float64);
  Tensor y = cumsum(x, 1);
  auto xv = x.to_vector<double>(), yv = y.to_vector<double>();
  bool ok = true;
  for (int64_t o = 0; o < 2 && ok; ++o)
    for (int64_t i = 0; i < 40 && ok; ++i) {
      double acc = 0;
      for (int64_t k = 0; k < 3000; ++k) {
        acc += xv[(o * 3000 + k) * 40 + i];
        if (yv[(o * 3000 + k) * 40 + i] != acc) ok = false;
      }
    }
  EXPECT_TRUE(ok);
}

// ---- searchsorted ---------------------------------------------------------------------------

// Rows with ties (repeated values, as a cdf over zero probabilities has), values on, between,
// below and above the elements and NaN: against counting by loops, both sides, float64 and
// float32, a 1-d row, and long rows on the parallel path.
TEST(IndexOps, SearchsortedCountsTheElementsBelow) {
  manual_seed(10);
  const std::vector<double> row = {-1.0, 0.0, 0.0, 0.0, 2.5, 3.0, 3.0, 7.0};
  const std::vector<double> vals = {-2.0, -1.0, 0.0, 1.0, 3.0, 7.0, 8.0, NAN};
  const std::vector<int64_t> left = {0, 0, 1, 4, 5, 7, 8, 8}, right = {0, 1, 4, 4, 7, 8, 8, 8};
  for (DType dt : {DType::Float64, DType::Float32}) {
    const Tensor s = f64_from(row, {8}).to(dt), v = f64_from(vals, {8}).to(dt);
    EXPECT_EQ(searchsorted(s, v).to_vector<int64_t>(), left);
    EXPECT_EQ(searchsorted(s, v, true).to_vector<int64_t>(), right);
  }
  // [2, 3, M] sorted rows against [2, 3, S] values, every value counted by a loop
  for (auto [M, S] : std::vector<std::array<int64_t, 2>>{{1, 5}, {9, 4}, {3000, 700}}) {
    const Tensor sorted = cumsum(relu(randn({2, 3, M}, f64())), -1), values = randn({2, 3, S}, f64()) * 3.0;
    const auto sv = sorted.to_vector<double>(), vv = values.to_vector<double>();
    for (bool r : {false, true}) {
      const auto got = searchsorted(sorted, values, r).to_vector<int64_t>();
      bool ok = true;
      for (int64_t i = 0; i < 6 * S && ok; ++i) {
        int64_t count = 0;
        for (int64_t m = 0; m < M; ++m) count += r ? sv[(i / S) * M + m] <= vv[i] : sv[(i / S) * M + m] < vv[i];
        ok = got[i] == count;
      }
      EXPECT_TRUE(ok) << "M " << M << " S " << S << (r ? " right" : " left");
    }
  }
}

TEST(IndexOps, SearchsortedBadInputsThrow) {
  const Tensor s = randn({2, 5}), v = randn({2, 3});
  EXPECT_LINEA_ERROR(searchsorted(s, randn({3, 3})),
                     "searchsorted: expected sorted [..., M] (M > 0) and values [..., S] with the same leading dims, "
                     "got sorted [2, 5], values [3, 3]");
  EXPECT_LINEA_ERROR(searchsorted(randn({2, 0}), v), "sorted [2, 0]");
  EXPECT_LINEA_ERROR(searchsorted(s, randn({2, 3, 1})), "values [2, 3, 1]");
  EXPECT_LINEA_ERROR(searchsorted(s, v.to(DType::Float64)), "searchsorted");
  EXPECT_LINEA_ERROR(searchsorted(s.to(DType::Int64), v.to(DType::Int64)), "searchsorted: expected float32 or float64");
}

// ---- index_select / index_add / embedding ------------------------------------------------

TEST(IndexOps, IndexSelectValues) {
  Tensor x = arange(24, f64()).reshape({2, 3, 4});
  Tensor idx = tensor<int64_t>({2, 0, 2}, {3});
  Tensor y = index_select(x, 1, idx);  // [2, 3, 4]
  ASSERT_EQ(y.shape(), (Shape{2, 3, 4}));
  auto yv = y.to_vector<double>();
  const int64_t iv[3] = {2, 0, 2};
  for (int64_t a = 0; a < 2; ++a)
    for (int64_t j = 0; j < 3; ++j)
      for (int64_t c = 0; c < 4; ++c) EXPECT_EQ(yv[(a * 3 + j) * 4 + c], double(a * 12 + iv[j] * 4 + c));
  // last dim, non-contiguous input, float32
  Tensor xt = x.transpose(1, 2);  // [2, 4, 3]
  Tensor z = index_select(xt.to(DType::Float32), 2, tensor<int64_t>({1}, {1}));
  ASSERT_EQ(z.shape(), (Shape{2, 4, 1}));
  EXPECT_TRUE(all_close(z, x.select(1, 1).unsqueeze(2), 0, 0));
  // int64 data
  Tensor xi = tensor<int64_t>({10, 20, 30}, {3});
  EXPECT_EQ(index_select(xi, 0, tensor<int64_t>({2, 2, 0}, {3})).to_vector<int64_t>(),
            (std::vector<int64_t>{30, 30, 10}));
}

// raw::index_select_out into a buffer's part (a key/value cache's beam reorder: rows [0, 6) of
// [B, H, 11, E] buffers) writes those rows alone, the rest of the buffer as it was, whatever the
// layouts on either side; index_select of such a part reads it in place with the same values.
TEST(IndexOps, IndexSelectOutWritesOnlyOut) {
  manual_seed(3);
  const Tensor buf = randn64({5, 3, 11, 4}), idx = tensor<int64_t>({4, 0, 4, 2}, {4});
  const Tensor part = narrow(buf, 2, 0, 6);
  const Tensor want = index_select(contiguous(part), 0, idx);  // [4, 3, 6, 4]
  // a part into a part, into a tensor, a tensor into a part, a part into a transposed part
  Tensor into = full({4, 3, 11, 4}, 7.0, f64());
  raw::index_select_out(narrow(into, 2, 0, 6), part, 0, idx);
  EXPECT_TRUE(all_close(narrow(into, 2, 0, 6), want, 0, 0));
  EXPECT_TRUE(all_close(narrow(into, 2, 6, 5), full({4, 3, 5, 4}, 7.0, f64()), 0, 0));
  Tensor whole = full({4, 3, 6, 4}, 7.0, f64());
  raw::index_select_out(whole, part, 0, idx);
  EXPECT_TRUE(all_close(whole, want, 0, 0));
  into = full({4, 3, 11, 4}, 7.0, f64());
  raw::index_select_out(narrow(into, 2, 0, 6), contiguous(part), 0, idx);
  EXPECT_TRUE(all_close(narrow(into, 2, 0, 6), want, 0, 0));
  EXPECT_TRUE(all_close(narrow(into, 2, 6, 5), full({4, 3, 5, 4}, 7.0, f64()), 0, 0));
  Tensor into_t = full({4, 4, 11, 3}, 7.0, f64());
  raw::index_select_out(narrow(into_t, 2, 0, 6).transpose(1, 3), part, 0, idx);
  EXPECT_TRUE(all_close(narrow(into_t, 2, 0, 6).transpose(1, 3), want, 0, 0));
  EXPECT_TRUE(all_close(narrow(into_t, 2, 6, 5), full({4, 4, 5, 3}, 7.0, f64()), 0, 0));
  // out's runs at two strides (a part of a part), x's at one: the select then a copy
  const Tensor part5 = narrow(randn64({5, 2, 3, 11, 4}), 3, 0, 6);
  Tensor into5 = full({4, 2, 4, 11, 4}, 7.0, f64());
  raw::index_select_out(narrow(narrow(into5, 2, 0, 3), 3, 0, 6), part5, 0, idx);
  EXPECT_TRUE(all_close(narrow(narrow(into5, 2, 0, 3), 3, 0, 6), index_select(contiguous(part5), 0, idx), 0, 0));
  EXPECT_TRUE(all_close(narrow(into5, 2, 3, 1), full({4, 2, 1, 11, 4}, 7.0, f64()), 0, 0));
  // along dim 1 (no rows of runs: the select then a copy), and index_select of the part in place
  Tensor cols = full({5, 2, 11, 4}, 7.0, f64());
  raw::index_select_out(narrow(cols, 2, 0, 6), part, 1, tensor<int64_t>({2, 0}, {2}));
  EXPECT_TRUE(all_close(narrow(cols, 2, 0, 6), index_select(contiguous(part), 1, tensor<int64_t>({2, 0}, {2})), 0, 0));
  EXPECT_TRUE(all_close(raw::index_select(part, 0, idx), want, 0, 0));
  // a bool padding buffer [B, cap]
  const Tensor pad = gt(randn({5, 13}), 0.0);
  Tensor pads = full({4, 13}, 1.0, TensorOptions(DType::Bool));
  raw::index_select_out(narrow(pads, 1, 0, 9), narrow(pad, 1, 0, 9), 0, idx);
  EXPECT_EQ(narrow(pads, 1, 0, 9).to(DType::Int64).to_vector<int64_t>(),
            index_select(narrow(pad, 1, 0, 9).contiguous(), 0, idx).to(DType::Int64).to_vector<int64_t>());
  EXPECT_EQ(narrow(pads, 1, 9, 4).to(DType::Int64).to_vector<int64_t>(), std::vector<int64_t>(16, 1));
  // bad input
  EXPECT_LINEA_ERROR(raw::index_select_out(whole, part, 0, tensor<int64_t>({4, 5, 0, 0}, {4})), "index_select",
                     "index 5 is out of range for dim 0 of size 5");
  EXPECT_LINEA_ERROR(raw::index_select_out(narrow(whole, 2, 0, 5), part, 0, idx), "index_select: out [4, 3, 5, 4]",
                     "must equal x [5, 3, 6, 4] with dim 0 of size 4");
  EXPECT_LINEA_ERROR(raw::index_select_out(whole.to(DType::Float32), part, 0, idx), "index_select");
}

TEST(IndexOps, IndexAddAccumulatesRepeats) {
  Tensor base = ones({4, 2}, f64());
  Tensor src = tensor<double>({1, 2, 3, 4, 5, 6}, {3, 2});
  Tensor out = raw::index_add(base, 0, tensor<int64_t>({3, 1, 3}, {3}), src);
  EXPECT_EQ(out.to_vector<double>(), (std::vector<double>{1, 1, 4, 5, 1, 1, 7, 9}));
  EXPECT_EQ(base.to_vector<double>(), (std::vector<double>(8, 1.0)));  // base untouched
  // In place (index_select's backward, into its zeros): the same sums in base itself; a view
  // that is not contiguous is refused, not written through wrong strides.
  raw::index_add_(base, 0, tensor<int64_t>({3, 1, 3}, {3}), src);
  EXPECT_EQ(base.to_vector<double>(), out.to_vector<double>());
  EXPECT_LINEA_ERROR(raw::index_add_(ones({2, 4}, f64()).t(), 0, tensor<int64_t>({3, 1, 3}, {3}), src),
                     "index_add: adds in place into a contiguous tensor, got [4, 2] with strides [1, 4]");
  EXPECT_LINEA_ERROR(
      raw::scatter_add_(ones({2, 4}, f64()).t(), 0, zeros({1, 2}, TensorOptions(DType::Int64)), ones({1, 2}, f64())),
      "scatter_add: adds in place into a contiguous tensor, got [4, 2]");
  Tensor sbase = zeros({2, 3}, f64());
  raw::scatter_add_(sbase, 1, tensor<int64_t>({2, 2, 0, 1}, {2, 2}), tensor<double>({1, 2, 3, 4}, {2, 2}));
  EXPECT_EQ(sbase.to_vector<double>(), (std::vector<double>{0, 0, 3, 3, 4, 0}));
}

TEST(IndexOps, IndexAddLargeDeterministicAndExact) {
  // Embedding-backward shape (outer = 1): many repeats into few rows, inner above one block.
  const int64_t V = 7, N = 600, D = 700;
  Tensor idx = randint(0, V, {N});
  Tensor src = randint(-3, 4, {N, D}).to(DType::Float64);
  Tensor out = raw::index_add(zeros({V, D}, f64()), 0, idx, src);
  auto iv = idx.to_vector<int64_t>();
  auto sv = src.to_vector<double>();
  std::vector<double> ref(static_cast<size_t>(V * D), 0.0);
  for (int64_t j = 0; j < N; ++j)
    for (int64_t c = 0; c < D; ++c) ref[iv[j] * D + c] += sv[j * D + c];
  EXPECT_TRUE(all_close(out, f64_from(ref, {V, D}), 0, 0));
  // float32 sums of non-integers: identical bits on a second run (fixed summation order)
  Tensor s32 = randn({N, D}, TensorOptions(DType::Float32));
  Tensor a = raw::index_add(zeros({V, D}), 0, idx, s32);
  Tensor b = raw::index_add(zeros({V, D}), 0, idx, s32);
  EXPECT_TRUE(all_close(a, b, 0, 0));
}

TEST(IndexOps, EmbeddingValues) {
  Tensor w = arange(15, f64()).reshape({5, 3});
  Tensor idx = tensor<int64_t>({4, 0, 4, 2}, {2, 2});
  Tensor y = embedding(w, idx);
  ASSERT_EQ(y.shape(), (Shape{2, 2, 3}));
  EXPECT_EQ(y.to_vector<double>(), (std::vector<double>{12, 13, 14, 0, 1, 2, 12, 13, 14, 6, 7, 8}));
}

// embed_tokens against the composed formula (scale * embedding + the table's rows): the same
// bits forward and the same gradients, a learned table at an offset and from 0, no table, a
// padding row used; a fixed table (a buffer: sinusoids) gets no gradient.
TEST(IndexOps, EmbedTokensEqualsTheComposedFormula) {
  manual_seed(12);
  const Tensor idx = tensor<int64_t>({3, 2, 2, 8, 0, 2, 5, 5, 1, 3, 7, 2}, {3, 4});
  for (DType dt : {DType::Float32, DType::Float64}) {
    const Tensor w = randn({9, 5}, TensorOptions(dt)), pos = randn({7, 5}, TensorOptions(dt));
    const Tensor g = randn({3, 4, 5}, TensorOptions(dt));
    for (int64_t offset : {0, 3})
      for (bool with_pos : {true, false}) {
        SCOPED_TRACE(std::string(dtype_name(dt)) + " offset " + std::to_string(offset) + (with_pos ? "" : " none"));
        Tensor w1 = clone(w).requires_grad_(true), p1 = clone(pos).requires_grad_(true);
        Tensor w2 = clone(w).requires_grad_(true), p2 = clone(pos).requires_grad_(true);
        Tensor fused = embed_tokens(w1, idx, 2.5, with_pos ? p1 : Tensor(), offset, 2);
        Tensor composed = embedding(w2, idx, 2) * 2.5;
        if (with_pos) composed = composed + narrow(p2, 0, offset, 4);
        EXPECT_TRUE(all_close(fused, composed, 0, 0));
        fused.backward(g);
        composed.backward(g);
        EXPECT_TRUE(all_close(w1.grad(), w2.grad(), 0, 0));
        auto gv = w1.grad().to_vector<double>();
        for (int64_t c = 0; c < 5; ++c) EXPECT_EQ(gv[2 * 5 + c], 0.0);  // the padding row, used three times
        if (with_pos) {
          EXPECT_TRUE(all_close(p1.grad(), p2.grad(), 0, 0));
          EXPECT_EQ(max(abs(narrow(p1.grad(), 0, offset == 0 ? 4 : 0, 3))).item(), 0.0);  // rows not used
        }
      }
    Tensor w3 = clone(w).requires_grad_(true);
    Tensor fixed = clone(pos);  // no grad
    embed_tokens(w3, idx, 1.0, fixed, 1).backward(g);
    EXPECT_FALSE(fixed.grad().defined());
    EXPECT_TRUE(w3.grad().defined());
    // no tokens, or sequences of none: an empty output, zero gradients
    for (const Shape& shape : {Shape{0, 4}, Shape{3, 0}}) {
      Tensor w4 = clone(w).requires_grad_(true), p4 = clone(pos).requires_grad_(true);
      Tensor y = embed_tokens(w4, zeros(shape, TensorOptions(DType::Int64)), 2.0, p4, 1);
      EXPECT_EQ(y.shape(), (Shape{shape[0], shape[1], 5}));
      y.sum().backward();
      EXPECT_EQ(max(abs(w4.grad())).item(), 0.0);
      EXPECT_EQ(max(abs(p4.grad())).item(), 0.0);
    }
  }
}

// The ViT's class token and positions in one op: the composed cat + add's bits forward, its
// gradients (the positions' a sum over the batch in another order: to rounding), with one and two
// prefix rows and none, a non-contiguous x, a batch of none; only the wanted gradients; bad input.
TEST(IndexOps, PrependAndAddPositionsEqualsTheComposedFormula) {
  manual_seed(13);
  for (DType dt : {DType::Float32, DType::Float64})
    for (int64_t P : {1, 2, 0})
      for (int64_t B : {3, 0}) {
        SCOPED_TRACE(std::string(dtype_name(dt)) + " P " + std::to_string(P) + " B " + std::to_string(B));
        const TensorOptions o(dt);
        const Tensor x = randn({B, 5, 4}, o), c = randn({P, 4}, o), pos = randn({P + 5, 4}, o);
        const Tensor g = randn({B, P + 5, 4}, o);
        std::vector<Tensor> a, b;
        for (const Tensor& t : {x, c, pos}) {
          a.push_back(clone(t).requires_grad_(true));
          b.push_back(clone(t).requires_grad_(true));
        }
        const Tensor fused = prepend_and_add_positions(a[0], P > 0 ? a[1] : Tensor(), a[2]);
        const Tensor composed = (P > 0 ? cat({b[1].unsqueeze(0).expand({B, P, 4}), b[0]}, 1) : b[0]) + b[2];
        EXPECT_TRUE(all_close(fused, composed, 0, 0));
        fused.backward(g);
        composed.backward(g);
        const double tol = dt == DType::Float32 ? 1e-6 : 1e-14;
        EXPECT_TRUE(all_close(a[0].grad(), b[0].grad(), 0, 0));
        EXPECT_TRUE(all_close(a[2].grad(), b[2].grad(), tol, tol));
        if (P > 0) {
          EXPECT_TRUE(all_close(a[1].grad(), b[1].grad(), tol, tol));
        }
      }
  // Sequences of no tokens: the prefix alone, with its positions, in every row of the batch.
  const Tensor c0 = randn({2, 4}).requires_grad_(true), p0 = randn({2, 4}).requires_grad_(true);
  const Tensor x0 = randn({3, 0, 4}).requires_grad_(true);
  const Tensor y0 = prepend_and_add_positions(x0, c0, p0);
  EXPECT_TRUE(all_close(y0, (c0 + p0).unsqueeze(0).expand({3, 2, 4}), 0, 0));
  y0.sum().backward();
  EXPECT_EQ(x0.grad().shape(), (Shape{3, 0, 4}));
  EXPECT_TRUE(all_close(p0.grad(), full({2, 4}, 3.0), 0, 0));
  EXPECT_TRUE(all_close(c0.grad(), full({2, 4}, 3.0), 0, 0));
  // A transposed x; positions that need no gradient get none, x's still comes.
  const Tensor xt = randn({4, 4, 5}).transpose(1, 2).requires_grad_(true), fixed = randn({6, 4});
  const Tensor y = prepend_and_add_positions(xt, randn({1, 4}), fixed);
  EXPECT_TRUE(all_close(narrow(y, 1, 1, 5), xt + narrow(fixed, 0, 1, 5), 0, 0));
  y.sum().backward();
  EXPECT_FALSE(fixed.grad().defined());
  EXPECT_EQ(xt.grad().shape(), (Shape{4, 5, 4}));
  const Tensor x = randn({2, 3, 4});
  EXPECT_LINEA_ERROR(prepend_and_add_positions(x, randn({1, 4}), randn({3, 4})),
                     "prepend_and_add_positions: expected x [B, N, D], prefix [P, D] (or none) and positions "
                     "[P + N, D], got x [2, 3, 4], prefix [1, 4], positions [3, 4]");
  EXPECT_LINEA_ERROR(prepend_and_add_positions(x, randn({1, 5}), randn({4, 4})), "prefix [1, 5]");
  EXPECT_LINEA_ERROR(prepend_and_add_positions(randn({3, 4}), Tensor(), randn({3, 4})), "got x [3, 4]");
  EXPECT_LINEA_ERROR(prepend_and_add_positions(x, Tensor(), randn({3, 4}, f64())), "prepend_and_add_positions");
  EXPECT_LINEA_ERROR(prepend_and_add_positions(x, Tensor(), Tensor()), "positions");
  EXPECT_LINEA_ERROR(prepend_and_add_positions(x, randn({}), randn({3, 4})), "prefix []");
  EXPECT_LINEA_ERROR(prepend_and_add_positions(zeros({2, 3, 4}, TensorOptions(DType::Int64)), Tensor(),
                                               zeros({3, 4}, TensorOptions(DType::Int64))),
                     "expected float32 or float64, got int64");
}

// ---- gather / scatter_add -------------------------------------------------------------------

TEST(IndexOps, GatherValues) {
  manual_seed(10);
  Tensor x = randn({3, 5, 4}, f64());
  auto xv = x.to_vector<double>();
  // dim 1, index smaller than x in the other dims
  Tensor idx = randint(0, 5, {2, 6, 3});
  Tensor y = gather(x, 1, idx);
  ASSERT_EQ(y.shape(), idx.shape());
  auto iv = idx.to_vector<int64_t>();
  auto yv = y.to_vector<double>();
  for (int64_t a = 0; a < 2; ++a)
    for (int64_t b = 0; b < 6; ++b)
      for (int64_t c = 0; c < 3; ++c) EXPECT_EQ(yv[(a * 6 + b) * 3 + c], xv[(a * 5 + iv[(a * 6 + b) * 3 + c]) * 4 + c]);
  // dim 0 and last dim on a transposed input, float32
  Tensor xt = x.transpose(0, 2);  // [4, 5, 3]
  Tensor i0 = randint(0, 4, {2, 5, 3});
  EXPECT_TRUE(all_close(gather(xt, 0, i0), gather(xt.contiguous(), 0, i0), 0, 0));
  Tensor i2 = randint(0, 3, {4, 5, 7});
  Tensor g2 = gather(xt.to(DType::Float32), -1, i2);
  auto xtv = xt.contiguous().to_vector<double>();
  auto i2v = i2.to_vector<int64_t>();
  auto g2v = g2.to_vector<double>();
  for (int64_t p = 0; p < 4 * 5; ++p)
    for (int64_t c = 0; c < 7; ++c) EXPECT_FLOAT_EQ(g2v[p * 7 + c], static_cast<float>(xtv[p * 3 + i2v[p * 7 + c]]));
}

TEST(IndexOps, ScatterAddValues) {
  manual_seed(11);
  Tensor base = randn({4, 3, 5}, f64());
  for (int64_t dim : {0, 1, 2}) {
    Shape is = {3, 2, 4};
    is[dim] = 6;  // more entries than base.size(dim): repeats are certain
    Tensor idx = randint(0, base.size(dim), is);
    Tensor src = randn(is, f64());
    Tensor out = scatter_add(base, dim, idx, src);
    auto ref = base.to_vector<double>();
    auto iv = idx.to_vector<int64_t>();
    auto sv = src.to_vector<double>();
    auto bst = rm_strides(base.shape());
    for (int64_t a = 0; a < is[0]; ++a)
      for (int64_t b = 0; b < is[1]; ++b)
        for (int64_t c = 0; c < is[2]; ++c) {
          const int64_t p = (a * is[1] + b) * is[2] + c;
          int64_t q[3] = {a, b, c};
          q[dim] = iv[p];
          ref[q[0] * bst[0] + q[1] * bst[1] + q[2] * bst[2]] += sv[p];
        }
    EXPECT_TRUE(all_close(out, f64_from(ref, base.shape()), 1e-12, 1e-12)) << "dim " << dim;
  }
}

TEST(IndexOps, ScatterAddLargeDeterministicAndExact) {
  // dim 0 with O = 1 (all work in inner blocks) and dim 1 with many outer tasks.
  for (int64_t dim : {0, 1}) {
    Shape bs = dim == 0 ? Shape{5, 2000} : Shape{300, 5, 30};
    Shape is = dim == 0 ? Shape{80, 2000} : Shape{300, 80, 30};
    Tensor idx = randint(0, 5, is);
    Tensor src = randint(-4, 5, is).to(DType::Float64);
    Tensor out = raw::scatter_add(zeros(bs, f64()), dim, idx, src);
    auto iv = idx.to_vector<int64_t>();
    auto sv = src.to_vector<double>();
    std::vector<double> ref(static_cast<size_t>(shape_numel(bs)), 0.0);
    if (dim == 0) {
      for (int64_t j = 0; j < 80; ++j)
        for (int64_t c = 0; c < 2000; ++c) ref[iv[j * 2000 + c] * 2000 + c] += sv[j * 2000 + c];
    } else {
      for (int64_t a = 0; a < 300; ++a)
        for (int64_t j = 0; j < 80; ++j)
          for (int64_t c = 0; c < 30; ++c) {
            const int64_t p = (a * 80 + j) * 30 + c;
            ref[(a * 5 + iv[p]) * 30 + c] += sv[p];
          }
    }
    EXPECT_TRUE(all_close(out, f64_from(ref, bs), 0, 0)) << "dim " << dim;
  }
}

// ---- cat / stack / split / chunk --------------------------------------------------------------

TEST(IndexOps, CatValues) {
  Tensor a = arange(6, f64()).reshape({2, 3});
  Tensor b = arange(10, 14, 1, f64()).reshape({2, 2});
  Tensor c = arange(20, 22, 1, f64()).reshape({1, 2}).transpose(0, 1);  // [2, 1] non-contiguous
  Tensor y = cat({a, b, c}, 1);
  ASSERT_EQ(y.shape(), (Shape{2, 6}));
  EXPECT_EQ(y.to_vector<double>(), (std::vector<double>{0, 1, 2, 10, 11, 20, 3, 4, 5, 12, 13, 21}));
  Tensor z = cat({a, a.narrow(0, 1, 1)}, -2);
  EXPECT_EQ(z.to_vector<double>(), (std::vector<double>{0, 1, 2, 3, 4, 5, 3, 4, 5}));
  // zero-length piece and float32
  Tensor e = zeros({2, 0}, TensorOptions(DType::Float32));
  Tensor w = cat({a.to(DType::Float32), e, b.to(DType::Float32)}, 1);
  EXPECT_EQ(w.dtype(), DType::Float32);
  EXPECT_EQ(w.to_vector<float>(), (std::vector<float>{0, 1, 2, 10, 11, 3, 4, 5, 12, 13}));
}

TEST(IndexOps, PadValues) {
  Tensor a = arange(6, f64()).reshape({2, 3});
  Tensor y = pad(a, 1, 1, 2, -1.0);
  ASSERT_EQ(y.shape(), (Shape{2, 6}));
  EXPECT_EQ(y.to_vector<double>(), (std::vector<double>{-1, 0, 1, 2, -1, -1, -1, 3, 4, 5, -1, -1}));
  Tensor z = pad(a.t(), -2, 0, 1);  // [3, 2] non-contiguous, one row of zeros after
  ASSERT_EQ(z.shape(), (Shape{4, 2}));
  EXPECT_TRUE(z.is_contiguous());
  EXPECT_EQ(z.to_vector<double>(), (std::vector<double>{0, 3, 1, 4, 2, 5, 0, 0}));
  EXPECT_EQ(pad(zeros({2, 0}, f64()), 1, 1, 1, 7.0).to_vector<double>(), (std::vector<double>{7, 7, 7, 7}));
  Tensor m = pad(gt(a, 2.5), 0, 1, 0, 1.0);  // Bool
  ASSERT_EQ(m.dtype(), DType::Bool);
  EXPECT_EQ(m.to(DType::Int64).to_vector<int64_t>(), (std::vector<int64_t>{1, 1, 1, 0, 0, 0, 1, 1, 1}));
  EXPECT_LINEA_ERROR(pad(a, 1, -1, 0), "pad: pads must be >= 0, got before = -1, after = 0 for dim 1 of [2, 3]");
  EXPECT_LINEA_ERROR(pad(a, 2, 1, 1), "pad");
  EXPECT_LINEA_ERROR(pad(scalar_tensor(1.0), 0, 1, 1), "pad: a zero-dim tensor has no dim to pad");
  EXPECT_LINEA_ERROR(pad(gt(a, 0.0), 0, 1, 1, 2.0), "pad: a Bool tensor pads with 0 or 1, got 2");
  EXPECT_LINEA_ERROR(pad(Tensor(), 0, 1, 1), "pad");
}

TEST(IndexOps, StackValues) {
  Tensor a = arange(6, f64()).reshape({2, 3});
  Tensor b = arange(10, 16, 1, f64()).reshape({3, 2}).t();  // [2, 3] non-contiguous
  Tensor s0 = stack({a, b}, 0);
  ASSERT_EQ(s0.shape(), (Shape{2, 2, 3}));
  EXPECT_EQ(s0.to_vector<double>(), (std::vector<double>{0, 1, 2, 3, 4, 5, 10, 12, 14, 11, 13, 15}));
  Tensor s2 = stack({a, b}, -1);
  ASSERT_EQ(s2.shape(), (Shape{2, 3, 2}));
  EXPECT_EQ(s2.to_vector<double>(), (std::vector<double>{0, 10, 1, 12, 2, 14, 3, 11, 4, 13, 5, 15}));
  EXPECT_TRUE(all_close(raw::stack({a, b}, 1), stack({a, b}, 1), 0, 0));
}

TEST(IndexOps, SplitAndChunkValues) {
  Tensor x = arange(14, f64()).reshape({2, 7});
  auto p = split(x, 3, 1);
  ASSERT_EQ(p.size(), 3u);
  EXPECT_EQ(p[0].to_vector<double>(), (std::vector<double>{0, 1, 2, 7, 8, 9}));
  EXPECT_EQ(p[1].to_vector<double>(), (std::vector<double>{3, 4, 5, 10, 11, 12}));
  EXPECT_EQ(p[2].to_vector<double>(), (std::vector<double>{6, 13}));
  auto q = split(x, std::vector<int64_t>{1, 0, 6}, -1);
  ASSERT_EQ(q.size(), 3u);
  EXPECT_EQ(q[0].shape(), (Shape{2, 1}));
  EXPECT_EQ(q[1].shape(), (Shape{2, 0}));
  EXPECT_EQ(q[2].to_vector<double>(), (std::vector<double>{1, 2, 3, 4, 5, 6, 8, 9, 10, 11, 12, 13}));
  // raw::split: the same pieces, as views of x, which joined_view joins back.
  const std::vector<Tensor> r = raw::split(x, {1, 0, 6}, -1);
  ASSERT_EQ(r.size(), 3u);
  for (size_t i = 0; i < r.size(); ++i) {
    EXPECT_EQ(r[i].shape(), q[i].shape());
    EXPECT_EQ(r[i].to_vector<double>(), q[i].to_vector<double>());
    EXPECT_TRUE(r[i].impl().storage == x.impl().storage);
  }
  const Tensor rows = raw::joined_view(raw::split(x, {1, 1}, 0), 0);
  ASSERT_TRUE(rows.defined());
  EXPECT_EQ(rows.to_vector<double>(), x.to_vector<double>());
  auto c = chunk(x, 3, 1);  // 7 = 3 + 3 + 1
  ASSERT_EQ(c.size(), 3u);
  EXPECT_EQ(c[0].shape(), (Shape{2, 3}));
  EXPECT_EQ(c[2].shape(), (Shape{2, 1}));
  EXPECT_EQ(c[2].to_vector<double>(), (std::vector<double>{6, 13}));
  auto c2 = chunk(x, 2, 0);
  ASSERT_EQ(c2.size(), 2u);
  EXPECT_EQ(c2[1].to_vector<double>(), (std::vector<double>{7, 8, 9, 10, 11, 12, 13}));
  auto c4 = chunk(x, 4, 1);  // ceil(7/4) = 2: pieces 2, 2, 2, 1
  EXPECT_EQ(c4.size(), 4u);
  EXPECT_TRUE(all_close(cat(c4, 1), x, 0, 0));
}

// ---- bad inputs -------------------------------------------------------------------------------

TEST(IndexOps, BadInputsThrow) {
  Tensor x = randn({5, 3}, f64());
  // index out of range: value, dim and size named
  EXPECT_LINEA_ERROR(index_select(x, 0, tensor<int64_t>({1, 5}, {2})), "index 5 is out of range for dim 0 of size 5");
  EXPECT_LINEA_ERROR(index_select(x, 1, tensor<int64_t>({-1}, {1})), "index_select: index -1 is out of range");
  EXPECT_LINEA_ERROR(gather(x, 1, tensor<int64_t>({0, 3}, {1, 2})), "gather: index 3 is out of range for dim 1");
  EXPECT_LINEA_ERROR(scatter_add(x, 0, tensor<int64_t>({9}, {1, 1}), zeros({1, 1}, f64())),
                     "scatter_add: index 9 is out of range for dim 0 of size 5");
  EXPECT_LINEA_ERROR(embedding(x, tensor<int64_t>({7}, {1})), "index 7 is out of range");
  EXPECT_LINEA_ERROR(embedding(x, tensor<int64_t>({1}, {1}), 5), "embedding: padding_idx 5 is out of range for 5 rows");
  EXPECT_LINEA_ERROR(embedding(x, tensor<int64_t>({1}, {1}), -2), "padding_idx -2");
  EXPECT_LINEA_ERROR(raw::index_add(x, 0, tensor<int64_t>({5}, {1}), zeros({1, 3}, f64())), "index_add: index 5");
  // wrong index dtype
  EXPECT_LINEA_ERROR(index_select(x, 0, tensor<double>({1.0}, {1})), "index_select: index must have dtype int64");
  EXPECT_LINEA_ERROR(gather(x, 0, zeros({1, 1}, f64())), "gather: index must have dtype int64");
  EXPECT_LINEA_ERROR(embedding(x, zeros({2}, f64())), "embedding: index must have dtype int64");
  // embed_tokens: the table's width, its rows, the sequence dim, the dtypes, padding_idx, values
  const Tensor ids = tensor<int64_t>({1, 2, 0, 4}, {2, 2});
  EXPECT_LINEA_ERROR(embed_tokens(x, ids, 1.0, zeros({4, 2}, f64())), "embed_tokens: positions must be [max_len, 3]");
  EXPECT_LINEA_ERROR(embed_tokens(x, ids, 1.0, zeros({4, 3}, f64()), 3),
                     "embed_tokens: positions [3, 5) of index [2, 2] exceed the table's 4 rows");
  EXPECT_LINEA_ERROR(embed_tokens(x, ids, 1.0, zeros({4, 3}, f64()), -1), "embed_tokens: positions [-1, 1)");
  EXPECT_LINEA_ERROR(embed_tokens(x, tensor<int64_t>({1}, {}), 1.0, zeros({4, 3}, f64())),
                     "embed_tokens: with positions the index needs a sequence dim");
  EXPECT_LINEA_ERROR(embed_tokens(x, ids, 1.0, zeros({4, 3})), "embed_tokens");  // float32 table, float64 weight
  EXPECT_LINEA_ERROR(embed_tokens(x, ids, 1.0, Tensor(), 0, 5), "embed_tokens: padding_idx 5 is out of range");
  EXPECT_LINEA_ERROR(embed_tokens(x, tensor<int64_t>({1, 7}, {2}), 1.0, Tensor()),
                     "embed_tokens: index 7 is out of range");
  EXPECT_LINEA_ERROR(embed_tokens(x, zeros({2}, f64()), 1.0, Tensor()), "embed_tokens: index must have dtype int64");
  EXPECT_LINEA_ERROR(embed_tokens(zeros({5}, f64()), ids, 1.0, Tensor()), "embed_tokens");
  // index rank / shape
  EXPECT_LINEA_ERROR(gather(x, 0, tensor<int64_t>({0}, {1})), "gather: index must have the same number of dims");
  EXPECT_LINEA_ERROR(gather(x, 0, zeros({2, 4}, TensorOptions(DType::Int64))), "gather: index [2, 4] is larger");
  EXPECT_LINEA_ERROR(scatter_add(x, 0, zeros({2, 2}, TensorOptions(DType::Int64)), zeros({2, 3}, f64())),
                     "scatter_add: src [2, 3] must have the index's shape [2, 2]");
  EXPECT_LINEA_ERROR(index_select(x, 0, zeros({1, 1}, TensorOptions(DType::Int64))), "index must be 0-d or 1-d");
  EXPECT_LINEA_ERROR(index_select(x, 2, tensor<int64_t>({0}, {1})), "index_select");
  // cat / stack
  EXPECT_LINEA_ERROR(cat({x, randn({5, 2, 1}, f64())}, 1), "cat: shapes must match except in dim 1");
  EXPECT_LINEA_ERROR(cat({x, randn({4, 2}, f64())}, 1), "[5, 3], [4, 2]");
  EXPECT_LINEA_ERROR(cat({}, 0), "cat: expected a non-empty list");
  EXPECT_LINEA_ERROR(cat({x, randn({5, 3})}, 0), "cat");  // float64 vs float32
  EXPECT_LINEA_ERROR(stack({x, randn({3, 5}, f64())}, 0), "stack: all inputs must have the same shape");
  EXPECT_LINEA_ERROR(raw::stack({x, randn({3, 5}, f64())}, 0), "stack: all inputs must have the same shape");
  // split / chunk
  EXPECT_LINEA_ERROR(split(x, std::vector<int64_t>{2, 2}, 0), "split: sizes [2, 2] sum to 4");
  EXPECT_LINEA_ERROR(split(x, 0, 0), "split: split_size must be positive");
  EXPECT_LINEA_ERROR(raw::split(x, {2, 2}, 0), "split: sizes [2, 2] sum to 4 but dim 0 of input [5, 3] has size 5");
  EXPECT_LINEA_ERROR(raw::split(x, {6, -1}, 0), "split: sizes must be non-negative");
  EXPECT_LINEA_ERROR(chunk(x, 0, 0), "chunk: number of chunks must be positive");
  // FFTs
  Tensor spec = randn({3, 5, 2}, f64());
  EXPECT_LINEA_ERROR(irfft(spec, 10, 1), "irfft: spectrum [3, 5, 2] has 5 entries at dim 1 but a length-10 output");
  EXPECT_LINEA_ERROR(irfft(randn({3, 6}, f64()), 10, 0), "irfft: spectrum must have a trailing (re, im) dim");
  EXPECT_LINEA_ERROR(rfft(x, 0, 0), "rfft: transform length n must be >= 1");
  EXPECT_LINEA_ERROR(rfft(tensor<int64_t>({1, 2}, {2}), 2, 0), "rfft: expected a floating input");
  EXPECT_LINEA_ERROR(rfft(x, 4, 2), "rfft");
  EXPECT_NO_THROW(irfft(spec, 8, 1));  // 8/2+1 = 5
  EXPECT_NO_THROW(irfft(spec, 9, 1));  // 9/2+1 = 5
  // cumsum
  EXPECT_LINEA_ERROR(cumsum(x, 3), "cumsum");
}

// Each index op names itself and the argument at fault, including the raw entries the backward
// passes use (index_add, embedding_weight_grad, prepend_and_add_positions_backward).
TEST(IndexOps, BadArgumentsNameTheOp) {
  const Tensor u, x = randn({5, 3}, f64()), s = full({}, 1.0, f64()), idx = tensor<int64_t>({1, 4}, {2});
  const Tensor fidx = tensor<double>({1.0}, {1}), i2 = zeros({1, 1}, TensorOptions(DType::Int64));
  EXPECT_LINEA_ERROR(index_select(u, 0, idx), undefined_arg("index_select", "x"));
  EXPECT_LINEA_ERROR(index_select(x, 0, u), undefined_arg("index_select", "index"));
  EXPECT_LINEA_ERROR(index_select(s, 0, idx), "index_select: input must have at least 1 dim, got []");
  EXPECT_LINEA_ERROR(raw::index_select_out(u, x, 0, idx), undefined_arg("index_select", "out"));

  const Tensor src = randn({2, 3}, f64());
  EXPECT_LINEA_ERROR(raw::index_add(u, 0, idx, src), undefined_arg("index_add", "base"));
  EXPECT_LINEA_ERROR(raw::index_add_(u, 0, idx, src), undefined_arg("index_add", "base"));
  EXPECT_LINEA_ERROR(raw::index_add(x, 0, u, src), undefined_arg("index_add", "index"));
  EXPECT_LINEA_ERROR(raw::index_add(x, 0, idx, u), undefined_arg("index_add", "src"));
  EXPECT_LINEA_ERROR(raw::index_add(x, 0, idx, randn({2, 3})), "index_add: dtype mismatch");
  EXPECT_LINEA_ERROR(raw::index_add(x, 0, fidx, randn({1, 3}, f64())), "index_add: index must have dtype int64");
  EXPECT_LINEA_ERROR(raw::index_add(s, 0, idx, src), "index_add: base must have at least 1 dim, got []");
  EXPECT_LINEA_ERROR(raw::index_add(x, 0, i2, randn({1, 3}, f64())), "index_add: index must be 0-d or 1-d, got [1, 1]");
  EXPECT_LINEA_ERROR(raw::index_add(x, 0, idx, randn({3, 3}, f64())),
                     "index_add: src [3, 3] must equal base [5, 3] with dim 0 of size 2 (the index length)");

  const Tensor ids = tensor<int64_t>({1, 2, 0, 4}, {2, 2});
  EXPECT_LINEA_ERROR(embed_tokens(u, ids, 1.0, Tensor()), undefined_arg("embed_tokens", "weight"));
  EXPECT_LINEA_ERROR(embed_tokens(x, u, 1.0, Tensor()), undefined_arg("embed_tokens", "index"));
  const Tensor g = randn({2, 3}, f64());
  EXPECT_LINEA_ERROR(raw::embedding_weight_grad(u, idx, 5, 1.0, -1), undefined_arg("embedding_weight_grad", "grad"));
  EXPECT_LINEA_ERROR(raw::embedding_weight_grad(g, u, 5, 1.0, -1), undefined_arg("embedding_weight_grad", "index"));
  EXPECT_LINEA_ERROR(raw::embedding_weight_grad(g, tensor<double>({1.0, 2.0}, {2}), 5, 1.0, -1),
                     "embedding_weight_grad: index must have dtype int64");
  EXPECT_LINEA_ERROR(raw::embedding_weight_grad(randn({3, 3}, f64()), idx, 5, 1.0, -1),
                     "embedding_weight_grad: grad [3, 3] must be [2, D] for an index of 2, padding_idx -1 in [-1, 5)");
  EXPECT_LINEA_ERROR(raw::embedding_weight_grad(g, idx, 5, 1.0, 5), "embedding_weight_grad: grad [2, 3] must be");
  EXPECT_LINEA_ERROR(raw::embedding_weight_grad(g, idx, 5, 1.0, -2), "padding_idx -2 in [-1, 5)");
  EXPECT_LINEA_ERROR(raw::embedding_weight_grad(g, tensor<int64_t>({1, 7}, {2}), 5, 1.0, -1),
                     "embedding_weight_grad: index 7 is out of range for dim 0 of size 5");

  const Tensor pos = randn({4, 3}, f64());
  EXPECT_LINEA_ERROR(prepend_and_add_positions(u, Tensor(), pos), undefined_arg("prepend_and_add_positions", "x"));
  const char* back = "prepend_and_add_positions_backward";
  EXPECT_LINEA_ERROR(raw::prepend_and_add_positions_backward(u, 0, true, false, true), undefined_arg(back, "grad"));
  EXPECT_LINEA_ERROR(raw::prepend_and_add_positions_backward(randn({4, 3}), 0, true, false, true),
                     "prepend_and_add_positions_backward: grad [4, 3] must be [B, P + N, D] with P = 0 in [0, 3]");
  EXPECT_LINEA_ERROR(raw::prepend_and_add_positions_backward(randn({2, 4, 3}), 5, true, true, true),
                     "with P = 5 in [0, 4]");
  EXPECT_LINEA_ERROR(raw::prepend_and_add_positions_backward(randn({2, 4, 3}), -1, true, true, true),
                     "with P = -1 in [0, 4]");
  EXPECT_LINEA_ERROR(
      raw::prepend_and_add_positions_backward(zeros({2, 4, 3}, TensorOptions(DType::Int64)), 1, true, true, true),
      "prepend_and_add_positions_backward: expected float32 or float64, got int64");

  const Tensor gi = zeros({1, 3}, TensorOptions(DType::Int64));
  EXPECT_LINEA_ERROR(gather(u, 0, gi), undefined_arg("gather", "x"));
  EXPECT_LINEA_ERROR(gather(x, 0, u), undefined_arg("gather", "index"));
  EXPECT_LINEA_ERROR(gather(s, 0, zeros({}, TensorOptions(DType::Int64))), "gather: input must have at least 1 dim");
  const Tensor gs = randn({1, 3}, f64());
  EXPECT_LINEA_ERROR(raw::scatter_add_(u, 0, gi, gs), undefined_arg("scatter_add", "base"));
  EXPECT_LINEA_ERROR(scatter_add(u, 0, gi, gs), undefined_arg("scatter_add", "base"));
  EXPECT_LINEA_ERROR(scatter_add(x, 0, u, gs), undefined_arg("scatter_add", "index"));
  EXPECT_LINEA_ERROR(scatter_add(x, 0, gi, u), undefined_arg("scatter_add", "src"));
  EXPECT_LINEA_ERROR(scatter_add(x, 0, gi, randn({1, 3})), "scatter_add: dtype mismatch");
  EXPECT_LINEA_ERROR(scatter_add(x, 0, zeros({1, 3}, f64()), gs), "scatter_add: index must have dtype int64");
  EXPECT_LINEA_ERROR(scatter_add(s, 0, zeros({}, TensorOptions(DType::Int64)), s),
                     "scatter_add: base must have at least 1 dim, got []");
  EXPECT_LINEA_ERROR(scatter_add(x, 0, zeros({1, 4}, TensorOptions(DType::Int64)), randn({1, 4}, f64())),
                     "scatter_add: index [1, 4] is larger than input [5, 3] at dim 1");

  EXPECT_LINEA_ERROR(cat({s, s}, 0), "cat: zero-dim tensors cannot be concatenated (input 0 has shape []");
  EXPECT_LINEA_ERROR(raw::stack({}, 0), "stack: expected a non-empty list of tensors");
  EXPECT_LINEA_ERROR(cumsum(u, 0), undefined_arg("cumsum", "x"));
  EXPECT_LINEA_ERROR(cumsum(zeros({3}, TensorOptions(DType::Bool)), 0), "cumsum: expected a numeric dtype, got bool");
  EXPECT_LINEA_ERROR(searchsorted(u, x), undefined_arg("searchsorted", "sorted"));
  EXPECT_LINEA_ERROR(searchsorted(x, u), undefined_arg("searchsorted", "values"));
  EXPECT_LINEA_ERROR(rfft(u, 4), undefined_arg("rfft", "x"));
  EXPECT_LINEA_ERROR(rfft(s, 1, 0), "rfft: input must have at least 1 dim, got []");
  EXPECT_LINEA_ERROR(irfft(u, 4), undefined_arg("irfft", "spec"));
  EXPECT_LINEA_ERROR(irfft(zeros({3, 2}, TensorOptions(DType::Int64)), 4, 0),
                     "irfft: expected a floating spectrum, got int64");
  EXPECT_LINEA_ERROR(irfft(randn({3, 1, 2}, f64()), 0, 1), "irfft: output length n must be >= 1, got 0");
}

}  // namespace
}  // namespace linea::test
