// Tensor data model: creation, views and strides, copies and dtype conversion, elementwise
// and reduction values against direct computation, printing, random generators, bad input; and
// the tests' own helpers (all_close, EXPECT_LINEA_ERROR) failing where they must.
#include <cmath>
#include <cstdlib>
#include <limits>

#include <gtest/gtest-spi.h>

#include "core/allocator.h"
#include "test_util.h"

using namespace linea;
using namespace linea::test;

TEST(Tensor, CreationAndItem) {
  EXPECT_EQ(zeros({2, 3}).shape(), (Shape{2, 3}));
  EXPECT_EQ(zeros({2, 3}).dtype(), DType::Float32);
  EXPECT_EQ(ones({4}, f64()).to_vector<double>(), std::vector<double>(4, 1.0));
  EXPECT_DOUBLE_EQ(full({}, 2.5).item(), 2.5);
  EXPECT_EQ(arange(0, 5, 2, TensorOptions(DType::Int64)).to_vector<int64_t>(), (std::vector<int64_t>{0, 2, 4}));
  EXPECT_EQ(arange(3.0).to_vector<float>(), (std::vector<float>{0, 1, 2}));
  Tensor t = tensor<float>({1, 2, 3, 4, 5, 6}, {2, 3});
  EXPECT_EQ(t.numel(), 6);
  EXPECT_EQ(t.strides(), (Strides{3, 1}));
  EXPECT_LINEA_ERROR(t.item(), "one element");
  // An integer read as an integer is exact (2^62 + 1 is not a double); a float read as one must fit.
  const int64_t big = (int64_t{1} << 62) + 1;
  EXPECT_EQ(from_vector<int64_t>({big}, {1}).item<int64_t>(), big);
  EXPECT_EQ(from_vector<int64_t>({std::numeric_limits<int64_t>::min()}, {}).item<int64_t>(),
            std::numeric_limits<int64_t>::min());
  EXPECT_EQ(full({}, -2.75).item<int64_t>(), -2);
  EXPECT_LINEA_ERROR(full({}, 9.3e18).item<int64_t>(), "is not an int64 value");
  EXPECT_LINEA_ERROR(full({}, std::nan("")).item<int64_t>(), "is not an int64 value");
  EXPECT_LINEA_ERROR(t.item<int64_t>(), "one element");
  EXPECT_LINEA_ERROR(tensor<float>({1, 2, 3}, {2, 2}), "do not fill");
}

// Shapes whose element count or strides do not fit in int64 (e.g. read from a corrupt file) are
// errors, not signed overflow; an empty tensor may still have large dims (tests/fuzz).
TEST(Tensor, ShapesTooLargeForInt64Throw) {
  const int64_t big = int64_t{1} << 32;
  EXPECT_EQ(shape_numel({0, big, big}), 0);
  EXPECT_EQ(shape_numel({big, big, 0}), 0);
  EXPECT_LINEA_ERROR(shape_numel({big, big}), "shape [4294967296, 4294967296] has more elements than int64 can count");
  EXPECT_LINEA_ERROR(contiguous_strides({0, big, big}), "is too large: its strides overflow int64");
  EXPECT_LINEA_ERROR(zeros({0, big, big}), "shape [0, 4294967296, 4294967296] is too large");
  EXPECT_EQ(contiguous_strides({big, 0, 3}), (Strides{3, 3, 1}));
  EXPECT_EQ(zeros({big, 0}).numel(), 0);
  EXPECT_TRUE(shape_fits({0, big, big - 1}) == false && shape_fits({big, 0, 2}) && shape_fits({}));
}

// joined_view: the view equal to cat(parts, dim) where the parts lie one after another along dim
// in one storage; undefined for anything else (a gap, another order, another storage or layout).
TEST(Tensor, JoinedViewOfConsecutiveParts) {
  const Tensor t = arange(60.0, f64()).reshape({3, 4, 5});
  const std::vector<Tensor> rows{t.narrow(1, 0, 1), t.narrow(1, 1, 2), t.narrow(1, 3, 1)};
  const Tensor j = raw::joined_view(rows, 1);
  ASSERT_TRUE(j.defined());
  EXPECT_EQ(j.shape(), t.shape());
  EXPECT_EQ(j.impl().storage, t.impl().storage);
  EXPECT_EQ(j.to_vector<double>(), cat(rows, 1).to_vector<double>());
  // Along the last dim of a transposed view (parts strided along dim), and a single part.
  const Tensor tt = t.transpose(0, 2);  // [5, 4, 3]
  const Tensor jt = raw::joined_view({tt.narrow(2, 1, 1), tt.narrow(2, 2, 1)}, -1);
  ASSERT_TRUE(jt.defined());
  EXPECT_EQ(jt.to_vector<double>(), tt.narrow(2, 1, 2).to_vector<double>());
  EXPECT_EQ(raw::joined_view({rows[1]}, 0).to_vector<double>(), rows[1].to_vector<double>());
  // Not joined: a gap, the wrong order, another dim, another storage, other strides, nothing.
  EXPECT_FALSE(raw::joined_view({t.narrow(1, 0, 1), t.narrow(1, 2, 2)}, 1).defined());
  EXPECT_FALSE(raw::joined_view({rows[1], rows[0]}, 1).defined());
  EXPECT_FALSE(raw::joined_view(rows, 2).defined());
  EXPECT_FALSE(raw::joined_view({rows[0], clone(rows[1])}, 1).defined());
  EXPECT_FALSE(raw::joined_view({t.narrow(1, 0, 1), t.slice(1, 1, 3, 2)}, 1).defined());
  EXPECT_FALSE(raw::joined_view({}, 0).defined());
  EXPECT_FALSE(raw::joined_view({Tensor(), rows[0]}, 0).defined());
  EXPECT_FALSE(raw::joined_view({t.narrow(1, 0, 0), rows[0]}, 1).defined());  // empty parts: nothing to gain
  // A part at the right offset of another storage; parts along a broadcast (stride 0) dim.
  const Tensor twin = arange(60.0, f64()).reshape({3, 4, 5});
  EXPECT_FALSE(raw::joined_view({rows[0], twin.narrow(1, 1, 2)}, 1).defined());
  const Tensor e = arange(3.0).reshape({1, 3}).expand({4, 3});
  EXPECT_FALSE(raw::joined_view({e.narrow(0, 0, 2), e.narrow(0, 2, 2)}, 0).defined());
}

TEST(Tensor, ViewsShareStorage) {
  Tensor t = arange(24.0, f64()).reshape({2, 3, 4});
  Tensor p = t.permute({2, 0, 1});
  EXPECT_EQ(p.shape(), (Shape{4, 2, 3}));
  EXPECT_FALSE(p.is_contiguous());
  EXPECT_EQ(p.impl().storage, t.impl().storage);
  Tensor n = t.narrow(2, 1, 2);
  EXPECT_EQ(n.to_vector<double>()[0], 1.0);
  Tensor s = t.slice(2, 0, 4, 3);  // columns 0, 3
  EXPECT_EQ(s.to_vector<double>(), (std::vector<double>{0, 3, 4, 7, 8, 11, 12, 15, 16, 19, 20, 23}));
  Tensor e = arange(3.0).reshape({3, 1}).expand({3, 2});
  EXPECT_EQ(e.strides()[1], 0);
  EXPECT_EQ(e.to_vector<float>(), (std::vector<float>{0, 0, 1, 1, 2, 2}));
  EXPECT_EQ(t.unsqueeze(0).shape(), (Shape{1, 2, 3, 4}));
  EXPECT_EQ(t.unsqueeze(-1).shape(), (Shape{2, 3, 4, 1}));
  EXPECT_EQ(t.select(1, -1).to_vector<double>(), (std::vector<double>{8, 9, 10, 11, 20, 21, 22, 23}));
  // view on a transposed tensor that keeps contiguity chunks works; one that breaks them fails.
  Tensor tt = t.transpose(0, 1);  // [3, 2, 4]
  EXPECT_EQ(tt.view({3, 2, 2, 2}).shape(), (Shape{3, 2, 2, 2}));
  EXPECT_LINEA_ERROR(tt.view({6, 4}), "view");
  EXPECT_EQ(tt.reshape({6, 4}).to_vector<double>()[4], 12.0);
  // A size-1 dim's stride never breaks a view; an empty tensor views as anything of its size.
  const Tensor odd = arange(6.0, f64()).reshape({1, 2, 3}).permute({1, 0, 2});  // [2, 1, 3], strides [3, 6, 1]
  EXPECT_EQ(odd.view({6}).to_vector<double>(), (std::vector<double>{0, 1, 2, 3, 4, 5}));
  EXPECT_EQ(zeros({3, 0}).t().view({-1}).shape(), (Shape{0}));
  // The strides torch gives: a scalar's new dims, and unsqueeze's new dim (stride of the next
  // dim times its size), so such views stay contiguous.
  EXPECT_EQ(full({}, 2.0).view({1, 1}).strides(), (Strides{1, 1}));
  EXPECT_EQ(zeros({2, 3}).unsqueeze(1).strides(), (Strides{3, 3, 1}));
  EXPECT_EQ(zeros({2, 3}).unsqueeze(0).strides(), (Strides{6, 3, 1}));
  // squeeze leaves a dim that is not 1; contiguous returns a contiguous tensor itself.
  EXPECT_EQ(squeeze(zeros({2, 3}), 0).shape(), (Shape{2, 3}));
  EXPECT_TRUE(contiguous(t).same(t));
  // reshape views when the strides allow (the same storage) and copies only when they do not;
  // expand's -1 keeps a dim; a scalar transposes to itself; to() of the same dtype is the tensor.
  Tensor rv = t.reshape({6, 4});
  EXPECT_EQ(rv.impl().storage, t.impl().storage);
  EXPECT_NE(tt.reshape({6, 4}).impl().storage, t.impl().storage);
  EXPECT_EQ(arange(3.0).reshape({3, 1}).expand({-1, 2}).shape(), (Shape{3, 2}));
  EXPECT_EQ(transpose(full({}, 2.0), 0, -1).item(), 2.0);
  EXPECT_TRUE(t.to(DType::Float64).same(t));
  // slice: Python's negative and out-of-order bounds.
  const Tensor r = arange(5.0, f64());
  EXPECT_EQ(r.slice(0, 1, -1).to_vector<double>(), (std::vector<double>{1, 2, 3}));
  EXPECT_EQ(r.slice(0, -3, 5, 2).to_vector<double>(), (std::vector<double>{2, 4}));
  EXPECT_EQ(r.slice(0, 3, 1).shape(), (Shape{0}));
  EXPECT_EQ(r.slice(0, 3, -4).shape(), (Shape{0}));
}

TEST(Tensor, ContiguousCopyAndConversion) {
  Tensor t = arange(6.0, f64()).reshape({2, 3}).t();
  Tensor c = t.contiguous();
  EXPECT_TRUE(c.is_contiguous());
  EXPECT_EQ(c.to_vector<double>(), (std::vector<double>{0, 3, 1, 4, 2, 5}));
  EXPECT_EQ(t.to(DType::Int64).dtype(), DType::Int64);
  EXPECT_EQ(tensor<double>({1.7, -2.2}, {2}).to(DType::Int64).to_vector<int64_t>(), (std::vector<int64_t>{1, -2}));
  Tensor dst = zeros({2, 3}, f64());
  dst.copy_(arange(3.0));  // broadcast + dtype conversion
  EXPECT_EQ(dst.to_vector<double>(), (std::vector<double>{0, 1, 2, 0, 1, 2}));
}

TEST(Tensor, UnaryValues) {
  std::vector<double> xs = {-2.0, -0.5, 0.25, 1.5};
  Tensor x = from_vector<double>(xs, {4});
  auto check = [&](const Tensor& y, const std::function<double(double)>& f) {
    auto v = y.to_vector<double>();
    for (size_t i = 0; i < xs.size(); ++i) EXPECT_NEAR(v[i], f(xs[i]), 1e-12) << "at " << xs[i];
  };
  check(exp(x), [](double a) { return std::exp(a); });
  check(abs(x), [](double a) { return std::fabs(a); });
  check(tanh(x), [](double a) { return std::tanh(a); });
  check(sigmoid(x), [](double a) { return 1 / (1 + std::exp(-a)); });
  check(relu(x), [](double a) { return a > 0 ? a : 0; });
  check(gelu(x), [](double a) { return 0.5 * a * (1 + std::erf(a / std::sqrt(2.0))); });
  check(gelu(x, true),
        [](double a) { return 0.5 * a * (1 + std::tanh(std::sqrt(2 / M_PI) * (a + 0.044715 * a * a * a))); });
  check(sin(x), [](double a) { return std::sin(a); });
  check(cos(x), [](double a) { return std::cos(a); });
  check(clamp(x, -1.0, 1.0), [](double a) { return std::min(1.0, std::max(-1.0, a)); });
  check(pow(abs(x), 1.5), [](double a) { return std::pow(std::fabs(a), 1.5); });
  check(rsqrt(abs(x)), [](double a) { return 1 / std::sqrt(std::fabs(a)); });
  check(sign(x), [](double a) { return (a > 0) - (a < 0); });
  // Sigmoid is stable on both tails.
  auto s = sigmoid(tensor<float>({-1000.f, 1000.f}, {2})).to_vector<float>();
  EXPECT_EQ(s[0], 0.0f);
  EXPECT_EQ(s[1], 1.0f);
}

TEST(Tensor, BinaryBroadcastValues) {
  Tensor a = arange(6.0, f64()).reshape({2, 3});
  Tensor b = tensor<double>({10, 20, 30}, {3});
  EXPECT_EQ((a + b).to_vector<double>(), (std::vector<double>{10, 21, 32, 13, 24, 35}));
  EXPECT_EQ((a * b.reshape({3, 1}).narrow(0, 0, 2).reshape({2, 1})).to_vector<double>(),
            (std::vector<double>{0, 10, 20, 60, 80, 100}));
  EXPECT_EQ(maximum(a, full({}, 2.0, f64())).to_vector<double>(), (std::vector<double>{2, 2, 2, 3, 4, 5}));
  Tensor m = gt(a, 2.5);
  EXPECT_EQ(m.dtype(), DType::Bool);
  EXPECT_EQ(m.to_vector<int>(), (std::vector<int>{0, 0, 0, 1, 1, 1}));
  EXPECT_EQ(where(m, a, neg(a)).to_vector<double>(), (std::vector<double>{0, -1, -2, 3, 4, 5}));
  EXPECT_EQ(masked_fill(a, lt(b, 25.0), -1.0).to_vector<double>(), (std::vector<double>{-1, -1, 2, -1, -1, 5}));
  Tensor big = randn({300, 257}, f64());  // above the parallel threshold, odd row length
  Tensor col = randn({300, 1}, f64());
  auto r = (big - col).to_vector<double>();
  auto vb = big.to_vector<double>(), vc = col.to_vector<double>();
  for (int i = 0; i < 300; i += 37)
    for (int j = 0; j < 257; j += 31) EXPECT_EQ(r[i * 257 + j], vb[i * 257 + j] - vc[i]);
}

TEST(Tensor, ComparisonOperators) {
  Tensor a = tensor<double>({1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor b = tensor<double>({3, 2, 1}, {3});
  auto v = [](const Tensor& t) {
    EXPECT_EQ(t.dtype(), DType::Bool);
    return t.to_vector<int>();
  };
  EXPECT_EQ(v(a == b), (std::vector<int>{0, 1, 0, 0, 0, 0}));
  EXPECT_EQ(v(a != b), (std::vector<int>{1, 0, 1, 1, 1, 1}));
  EXPECT_EQ(v(a < b), (std::vector<int>{1, 0, 0, 0, 0, 0}));
  EXPECT_EQ(v(a >= b), (std::vector<int>{0, 1, 1, 1, 1, 1}));
  EXPECT_EQ(v(a == 2.0), (std::vector<int>{0, 1, 0, 0, 0, 0}));
  EXPECT_EQ(v(a != 2.0), (std::vector<int>{1, 0, 1, 1, 1, 1}));
  EXPECT_EQ(v(a < 2.0), (std::vector<int>{1, 0, 0, 0, 0, 0}));
  EXPECT_EQ(v(a <= 2.0), (std::vector<int>{1, 1, 0, 0, 0, 0}));
  EXPECT_EQ(v(a > 4.0), (std::vector<int>{0, 0, 0, 0, 1, 1}));
  EXPECT_EQ(v(a >= 4.0), (std::vector<int>{0, 0, 0, 1, 1, 1}));
  // Scalar on the left: 2 < a is a > 2.
  EXPECT_EQ(v(2.0 < a), v(a > 2.0));
  EXPECT_EQ(v(2.0 <= a), v(a >= 2.0));
  EXPECT_EQ(v(2.0 > a), v(a < 2.0));
  EXPECT_EQ(v(2.0 >= a), v(a <= 2.0));
  EXPECT_EQ(v(2.0 == a), v(a == 2.0));
  EXPECT_EQ(v(2.0 != a), v(a != 2.0));
  // Non-contiguous operand.
  EXPECT_EQ(v(a.t() > 2.0), (std::vector<int>{0, 1, 0, 1, 1, 1}));
  // Int64 against a scalar it cannot hold: compared exactly (in float64), not truncated.
  Tensor i = tensor<int64_t>({0, 1, 2}, {3});
  EXPECT_EQ(v(i > 0.5), (std::vector<int>{0, 1, 1}));
  EXPECT_EQ(v(i == 1.0), (std::vector<int>{0, 1, 0}));
  EXPECT_EQ(v(i == 0.5), (std::vector<int>{0, 0, 0}));
  Tensor bl = i > 0.0;
  EXPECT_EQ(v(bl == 0.5), (std::vector<int>{0, 0, 0}));
  EXPECT_EQ(v(bl == 1.0), (std::vector<int>{0, 1, 1}));
}

TEST(Tensor, LogicalOpsAndAnyAll) {
  Tensor a = tensor<double>({1, -2, 3, -4, 5, -6}, {2, 3}) > 0.0;  // [[1 0 1] [0 1 0]]
  Tensor b = tensor<double>({1, 1, 0}, {3}) > 0.5;                 // [1 1 0], broadcast
  EXPECT_EQ((a & b).to_vector<int>(), (std::vector<int>{1, 0, 0, 0, 1, 0}));
  EXPECT_EQ((a | b).to_vector<int>(), (std::vector<int>{1, 1, 1, 1, 1, 0}));
  EXPECT_EQ((~a).to_vector<int>(), (std::vector<int>{0, 1, 0, 1, 0, 1}));
  EXPECT_EQ(logical_and(a, b).dtype(), DType::Bool);
  EXPECT_EQ(logical_or(a.t(), b.reshape({3, 1})).to_vector<int>(), (std::vector<int>{1, 1, 1, 1, 1, 0}));
  EXPECT_EQ((~a.t()).to_vector<int>(), (std::vector<int>{0, 1, 1, 0, 0, 1}));
  EXPECT_EQ(any(a).item(), 1.0);
  EXPECT_EQ(all(a).item(), 0.0);
  EXPECT_EQ(any(a, {1}).to_vector<int>(), (std::vector<int>{1, 1}));
  EXPECT_EQ(all(a | b, {1}).to_vector<int>(), (std::vector<int>{1, 0}));
  EXPECT_EQ(all(a.t(), {1}, true).shape(), Shape({3, 1}));
  EXPECT_EQ(all(a.t(), {1}, true).to_vector<int>(), (std::vector<int>{0, 0, 0}));
  EXPECT_EQ(any(a, {0}).dtype(), DType::Bool);
  Tensor empty_mask = zeros({0}, TensorOptions(DType::Bool));
  EXPECT_EQ(any(empty_mask).item(), 0.0);  // as PyTorch: any of nothing is false, all is true
  EXPECT_EQ(all(empty_mask).item(), 1.0);
  EXPECT_LINEA_ERROR(logical_and(zeros({2}), zeros({2})), "logical_and: not defined for float32");
  EXPECT_LINEA_ERROR(~zeros({2, 3}), "logical_not: expected a bool tensor, got float32 (shape [2, 3])");
  EXPECT_LINEA_ERROR(any(zeros({2})), "any: expected a bool tensor");
  EXPECT_LINEA_ERROR(a & zeros({3}), "logical_and");
}

TEST(Tensor, WhereWithScalars) {
  Tensor a = tensor<double>({1, 2, 3, 4}, {2, 2});
  Tensor m = a > 2.5;
  EXPECT_EQ(where(m, a, 0.0).to_vector<double>(), (std::vector<double>{0, 0, 3, 4}));
  EXPECT_EQ(where(m, -1.0, a).to_vector<double>(), (std::vector<double>{1, 2, -1, -1}));
  EXPECT_EQ(where(m.t(), a, 0.0).to_vector<double>(), (std::vector<double>{0, 2, 0, 4}));
  EXPECT_EQ(where(m, a.to(DType::Float32), 0.5).dtype(), DType::Float32);
}

TEST(Tensor, CompoundAssignment) {
  Tensor a = tensor<double>({1, 2, 3, 4}, {2, 2});
  const Tensor alias = a;  // a handle: both see the write
  a += tensor<double>({10, 20}, {2});
  EXPECT_EQ(alias.to_vector<double>(), (std::vector<double>{11, 22, 13, 24}));
  a -= 1.0;
  EXPECT_EQ(a.to_vector<double>(), (std::vector<double>{10, 21, 12, 23}));
  a *= 2.0;
  EXPECT_EQ(a.to_vector<double>(), (std::vector<double>{20, 42, 24, 46}));
  a /= tensor<double>({2, 4}, {2, 1});
  EXPECT_EQ(a.to_vector<double>(), (std::vector<double>{10, 21, 6, 11.5}));
  a /= 4.0;  // a true division, not a multiplication by 0.25 rounded
  EXPECT_EQ(a.to_vector<double>(), (std::vector<double>{2.5, 5.25, 1.5, 2.875}));
  // Into a non-contiguous view writes through to the base.
  Tensor b = tensor<double>({1, 2, 3, 4, 5, 6}, {2, 3});
  b.t().narrow(0, 1, 1) *= tensor<double>({10, 100}, {2});
  EXPECT_EQ(b.to_vector<double>(), (std::vector<double>{1, 20, 3, 4, 500, 6}));
  b.t() -= b.t();
  EXPECT_EQ(b.to_vector<double>(), (std::vector<double>(6, 0.0)));
  Tensor i = tensor<int64_t>({1, 2}, {2});
  i *= 3.0;
  EXPECT_EQ(i.to_vector<int64_t>(), (std::vector<int64_t>{3, 6}));
  EXPECT_LINEA_ERROR(i *= 0.5, "operator*=: 0.5 cannot be written into a int64 tensor (shape [2])");
  EXPECT_LINEA_ERROR(i /= 2.0, "integer division");
  EXPECT_LINEA_ERROR(a += tensor<double>({1, 2, 3}, {3}), "[2, 2]");
  EXPECT_LINEA_ERROR(a += ones({2, 2}), "float32");
}

TEST(Tensor, CompoundAssignmentRefusedUnderAutograd) {
  Tensor w = tensor<double>({1, 2}, {2});
  w.requires_grad_();
  Tensor c = tensor<double>({1, 1}, {2});
  EXPECT_LINEA_ERROR(w += c, "operator+=: in-place arithmetic on a tensor that requires grad (a, shape [2])");
  EXPECT_LINEA_ERROR(w *= 2.0, "operator*=");
  EXPECT_LINEA_ERROR(c -= w, "operator-=: in-place arithmetic on a tensor that requires grad (b, shape [2])");
  EXPECT_EQ(w.to_vector<double>(), (std::vector<double>{1, 2}));  // nothing written
  {
    NoGradGuard no_grad;  // optimizer-style update: allowed, and it bumps the version
    w -= c * 0.5;
  }
  EXPECT_EQ(w.to_vector<double>(), (std::vector<double>{0.5, 1.5}));
  Tensor x = tensor<double>({1, 2}, {2});
  x.requires_grad_();
  Tensor y = x * 2.0, z = y * y;
  {
    NoGradGuard no_grad;
    y += 1.0;  // y was saved by z's backward
  }
  EXPECT_LINEA_ERROR(sum(z).backward(), "in-place");
}

TEST(Tensor, ReductionValues) {
  Tensor x = arange(24.0, f64()).reshape({2, 3, 4});
  EXPECT_DOUBLE_EQ(sum(x).item(), 276.0);
  EXPECT_EQ(sum(x, {1}).to_vector<double>(), (std::vector<double>{12, 15, 18, 21, 48, 51, 54, 57}));
  EXPECT_EQ(sum(x, {0, 2}).to_vector<double>(), (std::vector<double>{60, 92, 124}));
  EXPECT_EQ(sum(x, {0, 2}, true).shape(), (Shape{1, 3, 1}));
  EXPECT_EQ(sum(x, {2, 0}, true).shape(), (Shape{1, 3, 1}));  // dims in any order
  EXPECT_EQ(sum(x, {2, 0}).to_vector<double>(), (std::vector<double>{60, 92, 124}));
  EXPECT_EQ(max(x, {-1}).to_vector<double>(), (std::vector<double>{3, 7, 11, 15, 19, 23}));
  EXPECT_EQ(min(x.transpose(0, 2), {2}).to_vector<double>(),
            (std::vector<double>{0, 4, 8, 1, 5, 9, 2, 6, 10, 3, 7, 11}));
  EXPECT_EQ(argmax(neg(x), 1).to_vector<int64_t>(), std::vector<int64_t>(8, 0));
  EXPECT_EQ(argmax(tensor<float>({1, 5, 5, 2}, {4}), 0).item<int64_t>(), 1);  // first on ties
  EXPECT_NEAR(mean(x).item(), 11.5, 1e-12);
  EXPECT_NEAR(var(x).item(), 50.0, 1e-12);  // var of 0..23 with Bessel: 24*25/12 = 50
  EXPECT_NEAR(logsumexp(tensor<double>({1000, 1000}, {2}), {0}).item(), 1000 + std::log(2.0), 1e-9);
  EXPECT_EQ(logsumexp(full({3}, -INFINITY, f64()), {0}).item(), -INFINITY);
  EXPECT_EQ(sum(gt(x, 10.0)).item<int64_t>(), 13);  // bool sums count
  // ... into int64, each layout the reduction takes: rows (the last dim), the middle dim, dims
  // that are not one range (a permuted copy), nothing (zeros).
  const Tensor b = gt(x, 10.0);
  EXPECT_EQ(sum(b, {2}).dtype(), DType::Int64);
  EXPECT_EQ(sum(b, {2}).to_vector<int64_t>(), (std::vector<int64_t>{0, 0, 1, 4, 4, 4}));
  EXPECT_EQ(sum(b, {1}).to_vector<int64_t>(), (std::vector<int64_t>{0, 0, 0, 1, 3, 3, 3, 3}));
  EXPECT_EQ(sum(b, {0, 2}).to_vector<int64_t>(), (std::vector<int64_t>{4, 4, 5}));
  EXPECT_EQ(sum(zeros({0, 3}, TensorOptions(DType::Bool)), {0}).to_vector<int64_t>(), std::vector<int64_t>(3, 0));
  EXPECT_EQ(sum(zeros({0, 3}, TensorOptions(DType::Bool)), {0}).dtype(), DType::Int64);
  EXPECT_EQ(sum(zeros({0, 3}), {0}).to_vector<float>(), std::vector<float>(3, 0.0f));
  // Over nothing: logsumexp is -inf; a scalar's dim 0 or -1 reduces nothing (as torch).
  EXPECT_EQ(logsumexp(zeros({2, 0}), {1}).to_vector<float>(), std::vector<float>(2, -INFINITY));
  const Tensor s = full({}, 2.0, f64());
  EXPECT_EQ(sum(s, {0}).shape(), Shape{});
  EXPECT_EQ(sum(s, {-1}, true).item(), 2.0);
  EXPECT_EQ(max(s, {0}).item(), 2.0);
  EXPECT_EQ(argmax(s, 0).item<int64_t>(), 0);
  EXPECT_EQ(argmax(s, 0).shape(), Shape{});
}

TEST(Tensor, Printing) {
  Tensor t = tensor<float>({1.5f, -2.f, 3.f, 4.f}, {2, 2});
  std::string s = t.str();
  EXPECT_NE(s.find("1.5000"), std::string::npos) << s;
  EXPECT_NE(s.find("shape=[2, 2]"), std::string::npos) << s;
  EXPECT_NE(s.find("float32"), std::string::npos) << s;
  std::string big = zeros({100}).str();
  EXPECT_NE(big.find("..."), std::string::npos);
}

TEST(Random, SeedReproducesAndStateRestores) {
  manual_seed(42);
  auto a = randn({1000}).to_vector<float>();
  auto state = get_rng_state();
  auto b = rand({7}, f64()).to_vector<double>();
  manual_seed(42);
  EXPECT_EQ(randn({1000}).to_vector<float>(), a);
  set_rng_state(state);
  EXPECT_EQ(rand({7}, f64()).to_vector<double>(), b);
  EXPECT_NE(randn({1000}).to_vector<float>(), a);  // the generator advanced
}

// Draws inside a ForkRng leave the stream where it was, on leaving by an exception too.
TEST(Random, ForkRngLeavesTheStreamWhereItWas) {
  manual_seed(5);
  (void)rand({3});
  const auto start = get_rng_state();
  const auto next = rand({4}, f64()).to_vector<double>();
  set_rng_state(start);
  {
    const ForkRng fork;
    (void)randn({10});
    EXPECT_NE(get_rng_state(), start);  // the fork's draws moved the generator
  }
  EXPECT_EQ(get_rng_state(), start);
  try {
    const ForkRng fork;
    (void)rand({2});
    throw Error("inside the fork");
  } catch (const Error&) {
  }
  EXPECT_EQ(rand({4}, f64()).to_vector<double>(), next);
}

TEST(Random, Distributions) {
  manual_seed(7);
  const int n = 200000;
  Tensor z = randn({n}, f64());
  EXPECT_NEAR(mean(z).item(), 0.0, 0.01);
  EXPECT_NEAR(var(z).item(), 1.0, 0.02);
  Tensor u = uniform({n}, -2.0, 3.0, f64());
  EXPECT_NEAR(mean(u).item(), 0.5, 0.02);
  EXPECT_GE(min(u).item(), -2.0);
  EXPECT_LT(max(u).item(), 3.0);
  Tensor bern = bernoulli({n}, 0.3, f64());
  EXPECT_NEAR(mean(bern).item(), 0.3, 0.01);
  Tensor ri = randint(-3, 4, {n});
  EXPECT_EQ(min(ri).item<int64_t>(), -3);
  EXPECT_EQ(max(ri).item<int64_t>(), 3);
  auto p = randperm(50).to_vector<int64_t>();
  std::vector<int64_t> sorted = p;
  std::sort(sorted.begin(), sorted.end());
  for (int i = 0; i < 50; ++i) EXPECT_EQ(sorted[i], i);
  EXPECT_NE(p, sorted);
}

// A rank that runs examples [first, first + B) of a batch inside BatchRowsGuard(first) gets the
// rows one process drawing for the whole batch gets, and the generator moves the same way.
TEST(Random, PerExampleDrawsMatchTheWholeBatchsRows) {
  for (DType dt : {DType::Float32, DType::Float64}) {
    manual_seed(3);
    (void)rand({5});  // an offset that is not 0
    const auto start = get_rng_state();
    const Tensor u = uniform_per_example({7, 3, 5}, -1.0, 2.0, TensorOptions(dt));  // odd row length
    const Tensor z = normal_per_example({7, 3, 5}, 0.5, 2.0, TensorOptions(dt));
    const Tensor b = bernoulli_per_example({7, 3, 5}, 0.4, TensorOptions(DType::Bool));
    const auto after = get_rng_state();
    EXPECT_EQ(after[1], start[1] + 3);  // one counter value per draw, whatever the shape
    for (auto [first, count] : {std::pair<int64_t, int64_t>{0, 3}, {3, 4}, {6, 1}}) {
      set_rng_state(start);
      BatchRowsGuard rows(first);
      EXPECT_EQ(batch_first_row(), first);
      const Tensor us = uniform_per_example({count, 3, 5}, -1.0, 2.0, TensorOptions(dt));
      const Tensor zs = normal_per_example({count, 3, 5}, 0.5, 2.0, TensorOptions(dt));
      const Tensor bs = bernoulli_per_example({count, 3, 5}, 0.4, TensorOptions(DType::Bool));
      EXPECT_EQ(get_rng_state(), after);
      EXPECT_EQ(us.to_vector<double>(), u.narrow(0, first, count).to_vector<double>());
      EXPECT_EQ(zs.to_vector<double>(), z.narrow(0, first, count).to_vector<double>());
      EXPECT_EQ(bs.to_vector<double>(), b.narrow(0, first, count).to_vector<double>());
    }
    EXPECT_EQ(batch_first_row(), 0);
    // An example's numbers do not depend on its row length beyond it (padding keeps them).
    set_rng_state(start);
    const Tensor longer = uniform_per_example({7, 20}, -1.0, 2.0, TensorOptions(dt));
    EXPECT_EQ(longer.narrow(1, 0, 15).contiguous().to_vector<double>(),
              u.reshape({7, 15}).to_vector<double>());
    // Rows, draws and the plain stream differ.
    EXPECT_NE(u.select(0, 0).to_vector<double>(), u.select(0, 1).to_vector<double>());
    set_rng_state(start);
    EXPECT_NE(uniform({7, 3, 5}, -1.0, 2.0, TensorOptions(dt)).to_vector<double>(), u.to_vector<double>());
  }
  manual_seed(11);
  const int n = 100000;
  Tensor z = normal_per_example({10, n / 10}, 0.0, 1.0, f64());
  EXPECT_NEAR(mean(z).item(), 0.0, 0.015);
  EXPECT_NEAR(var(z).item(), 1.0, 0.03);
  Tensor u = uniform_per_example({n}, 0.0, 1.0, f64());
  EXPECT_NEAR(mean(u).item(), 0.5, 0.01);
  EXPECT_NEAR(mean(bernoulli_per_example({n, 1}, 0.3, f64())).item(), 0.3, 0.01);
  EXPECT_LINEA_ERROR(uniform_per_example({}, 0.0, 1.0), "the first dimension is the batch");
  EXPECT_LINEA_ERROR(BatchRowsGuard(-1), "negative first row");
}

TEST(Errors, MismatchesNameOpAndShapes) {
  Tensor a = zeros({2, 3}), b = zeros({4, 3}), d = zeros({2, 3}, f64());
  EXPECT_LINEA_ERROR(add(a, b), "add: shapes [2, 3] and [4, 3] cannot be broadcast");
  EXPECT_LINEA_ERROR(mul(a, d), "mul: dtype mismatch: float32 (shape [2, 3]) vs float64");
  EXPECT_LINEA_ERROR(sum(a, {2}), "sum: dim 2 out of range");
  EXPECT_LINEA_ERROR(a.reshape({5, -1}), "reshape: shape [5, -1] is invalid for a tensor of 6 elements");
  EXPECT_LINEA_ERROR(a.permute({0, 0}), "permute");
  EXPECT_LINEA_ERROR(a.narrow(1, 2, 2), "narrow: range [2, 4) out of bounds");
  EXPECT_LINEA_ERROR(a.expand({3, 3}), "expand: cannot expand shape [2, 3] to [3, 3]");
  EXPECT_LINEA_ERROR(where(a, a, a), "where: condition must be bool");
  EXPECT_LINEA_ERROR(exp(arange(3.0, TensorOptions(DType::Int64))), "exp: expected a floating dtype");
  EXPECT_LINEA_ERROR(Device("gpu"), "cannot parse 'gpu'");
  EXPECT_LINEA_ERROR(Tensor().shape(), "undefined tensor");
}

// Each op names itself and the argument at fault, not only "undefined tensor" from deep inside.
TEST(Errors, UndefinedArgumentsNameTheOp) {
  Tensor u, a = zeros({2, 3});  // copy_ needs a non-const destination
  EXPECT_LINEA_ERROR(reshape(u, {6}), undefined_arg("reshape", "x"));
  EXPECT_LINEA_ERROR(view(u, {6}), undefined_arg("view", "x"));
  EXPECT_LINEA_ERROR(permute(u, {1, 0}), undefined_arg("permute", "x"));
  EXPECT_LINEA_ERROR(transpose(u, 0, 1), undefined_arg("transpose", "x"));
  EXPECT_LINEA_ERROR(narrow(u, 0, 0, 1), undefined_arg("narrow", "x"));
  EXPECT_LINEA_ERROR(split(u, std::vector<int64_t>{1, 1}, 0), undefined_arg("split", "x"));
  EXPECT_LINEA_ERROR(slice(u, 0, 0, 1), undefined_arg("slice", "x"));
  EXPECT_LINEA_ERROR(unsqueeze(u, 0), undefined_arg("unsqueeze", "x"));
  EXPECT_LINEA_ERROR(squeeze(u, 0), undefined_arg("squeeze", "x"));
  EXPECT_LINEA_ERROR(expand(u, {2, 3}), undefined_arg("expand", "x"));
  EXPECT_LINEA_ERROR(clone(u), undefined_arg("clone", "x"));
  EXPECT_LINEA_ERROR(contiguous(u), undefined_arg("contiguous", "x"));
  EXPECT_LINEA_ERROR(to(u, DType::Float64), undefined_arg("to", "x"));
  EXPECT_LINEA_ERROR(to(u, kCPU), undefined_arg("to", "x"));
  EXPECT_LINEA_ERROR(u.copy_(a), undefined_arg("copy_", "dst"));
  EXPECT_LINEA_ERROR(a.copy_(u), undefined_arg("copy_", "src"));
  EXPECT_LINEA_ERROR(u.fill_(1.0), undefined_arg("fill_", "self"));
}

TEST(Errors, ViewArgumentsOutOfRange) {
  const Tensor a = zeros({2, 3}), s = zeros({});
  EXPECT_LINEA_ERROR(reshape(a, {-1, -1}), "reshape: only one dimension can be -1 in [-1, -1]");
  EXPECT_LINEA_ERROR(reshape(a, {-2, -3}), "reshape: invalid size -2 in [-2, -3]");
  EXPECT_LINEA_ERROR(reshape(a, {4}), "reshape: shape [4] is invalid for a tensor of 6 elements");
  EXPECT_LINEA_ERROR(view(a, {0, -1}), "view: shape [0, -1] is invalid for a tensor of 6 elements");
  EXPECT_LINEA_ERROR(permute(a, {0}), "permute: got 1 dims for a tensor of shape [2, 3]");
  EXPECT_LINEA_ERROR(narrow(s, 0, 0, 1), "narrow: cannot narrow a 0-d tensor");
  EXPECT_LINEA_ERROR(split(s, 1, 0), "split: cannot split a 0-d tensor");
  EXPECT_LINEA_ERROR(split(s, std::vector<int64_t>{1}, 0), "split: cannot split a 0-d tensor");
  EXPECT_LINEA_ERROR(slice(s, 0, 0, 1), "slice: cannot slice a 0-d tensor");
  EXPECT_LINEA_ERROR(slice(a, 1, 0, 3, 0), "slice: step must be positive, got 0");
  EXPECT_LINEA_ERROR(unsqueeze(a, 3), "unsqueeze: dim 3 out of range for a tensor with 2 dims (expected in [-3, 2])");
  EXPECT_LINEA_ERROR(unsqueeze(a, -4), "unsqueeze: dim -4 out of range");
  EXPECT_EQ(unsqueeze(a, 2).shape(), (Shape{2, 3, 1}));
  EXPECT_EQ(unsqueeze(a, -3).shape(), (Shape{1, 2, 3}));
  EXPECT_LINEA_ERROR(expand(a, {3}), "expand: cannot expand shape [2, 3] to [3] (fewer dims)");
  EXPECT_LINEA_ERROR(expand(a, {-1, 2, 3}), "expand: invalid size -1 in [-1, 2, 3] for a new leading dim");
}

TEST(Errors, ElementwiseAndReductionArguments) {
  const Tensor u, a = zeros({2, 3}), d = zeros({2, 3}, f64()), m = zeros({2, 3}, TensorOptions(DType::Bool));
  EXPECT_LINEA_ERROR(exp(u), undefined_arg("exp", "x"));
  EXPECT_LINEA_ERROR(add(u, a), undefined_arg("add", "a"));
  EXPECT_LINEA_ERROR(add(a, u), undefined_arg("add", "b"));
  EXPECT_LINEA_ERROR(Tensor(a) += u, undefined_arg("add", "b"));
  EXPECT_LINEA_ERROR(zeros({3}) += a, "add (in place): shape [2, 3] does not broadcast to [3]");
  EXPECT_LINEA_ERROR(where(u, a, a), undefined_arg("where", "cond"));
  EXPECT_LINEA_ERROR(where(m, u, a), undefined_arg("where", "a"));
  EXPECT_LINEA_ERROR(where(m, a, u), undefined_arg("where", "b"));
  EXPECT_LINEA_ERROR(masked_fill(u, m, 1.0), undefined_arg("masked_fill", "x"));
  EXPECT_LINEA_ERROR(masked_fill(a, u, 1.0), undefined_arg("masked_fill", "mask"));
  EXPECT_LINEA_ERROR(sum(u), undefined_arg("sum", "x"));

  EXPECT_LINEA_ERROR(arange(3.0, TensorOptions(DType::Bool)), "arange: bool output is not supported");
  EXPECT_LINEA_ERROR(where(m, a, d), "where: dtype mismatch: float32 (shape [2, 3]) vs float64");
  EXPECT_LINEA_ERROR(masked_fill(a, a, 1.0), "masked_fill: mask must be bool, got float32 (shape [2, 3])");
  EXPECT_LINEA_ERROR(masked_fill(zeros({3}), m, 1.0),
                     "masked_fill: mask of shape [2, 3] does not broadcast to the input shape [3]");
  EXPECT_LINEA_ERROR(sum(a, {1, -1}), "sum: dim 1 appears twice in [1, -1]");
  EXPECT_LINEA_ERROR(sum(a, {1, 0, 1}), "sum: dim 1 appears twice in [1, 0, 1]");
  EXPECT_LINEA_ERROR(logsumexp(zeros({2}, TensorOptions(DType::Int64)), {0}),
                     "logsumexp: expected a floating dtype, got int64");
  EXPECT_LINEA_ERROR(max(zeros({2, 0}), {1}), "max: cannot reduce over a zero-size dimension (shape [2, 0])");
  EXPECT_LINEA_ERROR(argmin(u, 0), undefined_arg("argmin", "x"));
  EXPECT_LINEA_ERROR(argmax(m, 0), "argmax: not defined for bool tensors");
  EXPECT_LINEA_ERROR(argmax(zeros({2, 0}), 1), "argmax: cannot reduce over a zero-size dimension (shape [2, 0])");
  EXPECT_LINEA_ERROR(sum_to(u, {2}), undefined_arg("sum_to", "g"));
  EXPECT_LINEA_ERROR(sum_to(zeros({3}), {2, 3}), "sum_to: cannot reduce shape [3] to [2, 3]");
  EXPECT_LINEA_ERROR(sum_to(a, {2}), "sum_to: cannot reduce shape [2, 3] to [2]");
  // raw-only guards: a comparison has no in-place form, and a backward's gradient matches its input.
  EXPECT_LINEA_ERROR(raw::binary_(BinaryOp::Eq, a, a), "eq: cannot write a comparison in place");
  EXPECT_LINEA_ERROR(raw::unary_backward(UnaryOp::Exp, zeros({2}), zeros({3}), Tensor(), 0.0, 0.0),
                     "exp backward: gradient shape [2] does not match input shape [3]");
}

TEST(Errors, DeviceMismatchAndMissingCuda) {
  if (cuda_available()) {
    Tensor a = zeros({2}), b = zeros({2}, Device("cuda"));
    EXPECT_LINEA_ERROR(add(a, b), "same device");
  } else {
    // No GPU (or no CUDA backend): creating a CUDA tensor is a clear error, not a crash.
    EXPECT_THROW(zeros({2}, Device("cuda")), linea::Error);
    EXPECT_THROW(zeros({2}).to(Device("cuda")), linea::Error);
  }
}

TEST(Helpers, DtypeLowestAndJoin) {
  EXPECT_EQ(dtype_lowest(DType::Float32), static_cast<double>(std::numeric_limits<float>::lowest()));
  EXPECT_EQ(dtype_lowest(DType::Float64), std::numeric_limits<double>::lowest());
  EXPECT_TRUE(std::isfinite(static_cast<float>(dtype_lowest(DType::Float32))));
  EXPECT_LINEA_ERROR(dtype_lowest(DType::Int64), "dtype_lowest: expected a floating dtype, got int64");
  EXPECT_EQ(join({"a", "b", "c"}), "a, b, c");
  EXPECT_EQ(join({"x"}, " | "), "x");
  EXPECT_EQ(join({"x", "y"}, "/"), "x/y");
  EXPECT_EQ(join({}), "");
}

TEST(Tensor, EmptyTensorsAreContiguous) {
  EXPECT_TRUE(zeros({4, 0}).is_contiguous());
  EXPECT_TRUE(zeros({0, 3}).t().is_contiguous());
  EXPECT_EQ(zeros({4, 0}).reshape({0, 4}).numel(), 0);
}

// ---- the CPU caching allocator's memory limit ----------------------------------------------------

namespace {
constexpr size_t kMiB = size_t{1} << 20;
// Sets the CPU allocator's limit for one test and restores the previous one (the allocator is
// shared by every test of this executable).
struct CpuLimit {
  size_t prev = cpu_allocator().limit();
  explicit CpuLimit(size_t bytes) { cpu_allocator().set_limit(bytes); }
  ~CpuLimit() { cpu_allocator().set_limit(prev); }
};
size_t live_bytes() { return cpu_allocator().stats().allocated_bytes; }
}  // namespace

TEST(Allocator, FormatBytes) {
  EXPECT_EQ(format_bytes(512), "512 B");
  EXPECT_EQ(format_bytes(3 * 1024), "3.0 KiB");
  EXPECT_EQ(format_bytes(12 * kMiB + kMiB / 2), "12.5 MiB");
  EXPECT_EQ(format_bytes(3 * (size_t{1} << 29)), "1.50 GiB");
}

TEST(Allocator, LimitRefusesABigTensorAndKeepsTheStats) {
  NoGradGuard ng;
  const size_t base = live_bytes();
  CpuLimit limit(base + 64 * kMiB);
  EXPECT_EQ(cpu_allocator().limit(), base + 64 * kMiB);
  Tensor keep = ones({4 * static_cast<int64_t>(kMiB) / 4});  // 4 MiB live
  const AllocatorStats before = cpu_allocator().stats();
  // 128 MiB of float32: over the limit whatever else is live.
  EXPECT_LINEA_ERROR(empty({32 * static_cast<int64_t>(kMiB)}),
                     "out of memory: allocating 128.0 MiB would exceed the limit of ");
  EXPECT_LINEA_ERROR(empty({32 * static_cast<int64_t>(kMiB)}), " in use)");
  const AllocatorStats after = cpu_allocator().stats();
  EXPECT_EQ(after.allocated_bytes, before.allocated_bytes);  // nothing half-allocated
  EXPECT_EQ(after.num_allocs, before.num_allocs);            // the refused request is not counted
  EXPECT_EQ(after.cached_bytes, 0u);                         // the cache went back to the system first
  // Smaller ones still work, and the live bytes never pass the limit.
  cpu_allocator().reset_peak();
  for (int i = 0; i < 3; ++i) {
    Tensor t = full({4 * static_cast<int64_t>(kMiB)}, 1.0);  // 16 MiB
    EXPECT_EQ(t.sum().item(), 4.0 * kMiB);
  }
  EXPECT_LE(cpu_allocator().stats().peak_allocated_bytes, cpu_allocator().limit());
  EXPECT_EQ(keep.sum().item(), static_cast<double>(kMiB));
}

TEST(Allocator, LimitCoversTheCache) {
  // Blocks freed into the cache count against the limit: a new block of another size first
  // returns cached blocks to the system, so live + cached never exceeds the limit.
  if (!cpu_allocator().caching()) GTEST_SKIP() << "LINEA_NO_CPU_MEMORY_CACHING=1: nothing is cached";
  NoGradGuard ng;
  cpu_allocator().empty_cache();
  const size_t base = live_bytes();
  CpuLimit limit(base + 40 * kMiB);
  for (int64_t mib : {8, 12, 16, 24, 20, 32}) {
    { Tensor t = zeros({mib * static_cast<int64_t>(kMiB) / 4}); }  // freed into the cache at once
    const AllocatorStats s = cpu_allocator().stats();
    EXPECT_LE(s.allocated_bytes + s.cached_bytes, cpu_allocator().limit()) << mib << " MiB";
    EXPECT_GE(s.cached_bytes, static_cast<size_t>(mib) * kMiB) << "the last block stays cached";
  }
  // Lowering the limit trims the cache too; 0 removes the limit.
  cpu_allocator().set_limit(live_bytes() + kMiB);
  EXPECT_LE(cpu_allocator().stats().cached_bytes, kMiB);
  cpu_allocator().set_limit(0);
  EXPECT_EQ(cpu_allocator().limit(), 0u);
  Tensor big = zeros({16 * static_cast<int64_t>(kMiB)});  // 64 MiB: fine without a limit
  EXPECT_EQ(big.numel(), 16 * static_cast<int64_t>(kMiB));
}

TEST(Allocator, FailedOpsLeakNothing) {
  {  // the ops below once without a limit, so that any state built at first use is not counted
    Tensor x = ones({4, 4});
    x.requires_grad_(true);
    sum(exp(x) * x).backward();
    Tensor y = exp(x.detach()) * 2.0 + 1.0;
    Tensor z = matmul(ones({4, 1}), ones({1, 4}));
  }
  const size_t base = live_bytes();
  {
    // A chain of ops whose third output does not fit: the first two are freed on the way out.
    CpuLimit limit(base + 10 * kMiB);
    auto chain = [] {
      NoGradGuard ng;
      Tensor x = ones({1024, 1024});  // 4 MiB
      Tensor y = exp(x);              // 4 MiB
      return y * 2.0 + 1.0;           // another 4 MiB: over
    };
    EXPECT_LINEA_ERROR(chain(), "out of memory");
    EXPECT_EQ(live_bytes(), base);
    // matmul's output alone is over the limit.
    EXPECT_LINEA_ERROR(matmul(ones({2048, 1}), ones({1, 2048})), "out of memory");
    EXPECT_EQ(live_bytes(), base);
  }
  {
    // Backward running out of memory: the forward fits, the first gradient buffer does not.
    Tensor x = ones({1024, 1024});
    x.requires_grad_(true);
    Tensor loss = sum(exp(x) * x);
    CpuLimit limit(live_bytes() + kMiB);
    EXPECT_LINEA_ERROR(loss.backward(), "out of memory");
  }
  EXPECT_EQ(live_bytes(), base);  // the graph, its saved tensors and any partial gradient are gone
  // And the allocator still works.
  Tensor t = full({256, 256}, 2.0);
  EXPECT_EQ(t.sum().item(), 2.0 * 256 * 256);
}

// Caching off (LINEA_NO_CPU_MEMORY_CACHING=1, LINEA_NO_CUDA_MEMORY_CACHING=1): each block raw, of
// the size asked, back at once when freed; a private pool (a CUDA graph's) still keeps its blocks.
namespace {
size_t raw_allocs = 0, raw_frees = 0, last_raw_size = 0;
void* counting_alloc(size_t n) {
  ++raw_allocs;
  last_raw_size = n;
  return std::malloc(n);
}
void counting_free(void* p) {
  ++raw_frees;
  std::free(p);
}
}  // namespace

TEST(Allocator, WithoutCachingEachBlockIsRawAndGoesBackAtOnce) {
  raw_allocs = raw_frees = last_raw_size = 0;  // (a repeated run)
  CachingAllocator a(counting_alloc, counting_free);
  EXPECT_TRUE(a.caching());
  a.deallocate(a.allocate(100));  // cached: a block of its size class, kept
  EXPECT_EQ(last_raw_size, 512u);
  EXPECT_EQ(a.stats().cached_bytes, 512u);
  a.deallocate(a.allocate(100));
  EXPECT_EQ(raw_allocs, 1u);
  a.set_caching(false);  // hands the cache back
  EXPECT_FALSE(a.caching());
  EXPECT_EQ(raw_frees, 1u);
  EXPECT_EQ(a.stats().cached_bytes, 0u);
  for (int i = 0; i < 2; ++i) {
    void* p = a.allocate(100);
    EXPECT_EQ(raw_allocs, 2u + i);
    EXPECT_EQ(last_raw_size, 100u);
    EXPECT_EQ(a.stats().allocated_bytes, 100u);
    a.deallocate(p);
    EXPECT_EQ(raw_frees, 2u + i);
    EXPECT_EQ(a.stats().allocated_bytes, 0u);
    EXPECT_EQ(a.stats().cached_bytes, 0u);
  }
  const int pool = a.create_pool();
  a.select_pool(pool);
  a.deallocate(a.allocate(100));
  a.deallocate(a.allocate(100));
  EXPECT_EQ(raw_allocs, 4u);  // one block, reused within the pool
  EXPECT_EQ(last_raw_size, 512u);
  EXPECT_EQ(a.stats().cached_bytes, 512u);
  a.release_pool(pool);  // its free block goes back at once
  EXPECT_EQ(raw_frees, 4u);
  EXPECT_EQ(a.stats().cached_bytes, 0u);
  a.set_caching(true);
  a.deallocate(a.allocate(100));
  EXPECT_EQ(last_raw_size, 512u);
  EXPECT_EQ(a.stats().cached_bytes, 512u);
  a.empty_cache();
  EXPECT_EQ(raw_frees, raw_allocs);
}

// The switches: "1" turns caching off, anything else (or nothing) leaves it on; the CPU
// allocator reads LINEA_NO_CPU_MEMORY_CACHING (tests/run.sh's sanitizer pass sets it).
TEST(Allocator, CachingSwitchIsOneToTurnItOff) {
  const char* name = "LINEA_TEST_NO_MEMORY_CACHING";
  unsetenv(name);
  EXPECT_TRUE(caching_wanted(name));
  for (const char* on : {"0", "", "yes", "11"}) {
    setenv(name, on, 1);
    EXPECT_TRUE(caching_wanted(name)) << on;
  }
  setenv(name, "1", 1);
  EXPECT_FALSE(caching_wanted(name));
  unsetenv(name);
  const char* cpu = std::getenv("LINEA_NO_CPU_MEMORY_CACHING");
  EXPECT_EQ(cpu_allocator().caching(), cpu == nullptr || std::string(cpu) != "1");
}

// ---- the tests' own helpers (tests/test_util.h) can fail ----------------------------------------
namespace {
void throws_linea_error() { LINEA_FAIL("op: the shapes [2] and [3] differ"); }
void returns_quietly() {}
}  // namespace

TEST(TestUtil, AllCloseFailsWhereItMust) {
  const Tensor a = tensor<double>({1.0, -2.0, 3.0}, {3});
  EXPECT_TRUE(all_close(a, a, 0, 0));
  EXPECT_TRUE(all_close(a + 1e-3, a, 1.1e-3, 0));  // atol
  EXPECT_FALSE(all_close(a + 1e-3, a, 0.9e-3, 0));
  EXPECT_TRUE(all_close(a * 1.001, a, 0, 1.1e-3));  // rtol of the second's magnitude
  EXPECT_FALSE(all_close(a * 1.001, a, 0, 0.9e-3));
  EXPECT_FALSE(all_close(a * 1.01, a, 0, 0.995e-2));     // would pass relative to the first's
  EXPECT_FALSE(all_close(a, reshape(a, {3, 1}), 1, 1));  // shapes differ
  const double nan = std::numeric_limits<double>::quiet_NaN(), inf = std::numeric_limits<double>::infinity();
  const Tensor with_nan = tensor<double>({nan, -2.0, 3.0}, {3}), with_inf = tensor<double>({inf, -2.0, 3.0}, {3});
  EXPECT_TRUE(all_close(with_nan, with_nan, 0, 0));  // NaN where the other has NaN
  EXPECT_FALSE(all_close(with_nan, a, 1e300, 1e300));
  EXPECT_FALSE(all_close(a, with_nan, 1e300, 1e300));
  EXPECT_TRUE(all_close(with_inf, with_inf, 0, 0));
  EXPECT_FALSE(all_close(with_inf, a, 1e300, 1e300));
  EXPECT_FALSE(all_close(with_inf, -with_inf, 1e300, 1e300));
  EXPECT_FALSE(all_close(tensor<double>({1.0, 2.0, 3.0, 4.0}, {4}), tensor<double>({1.0, 2.0, 3.0, 5.0}, {4}), 0.5, 0));
}

TEST(TestUtil, ExpectLineaErrorFailsWhereItMust) {
  EXPECT_NONFATAL_FAILURE(EXPECT_LINEA_ERROR(returns_quietly(), "anything"), "did not throw a linea::Error");
  EXPECT_NONFATAL_FAILURE(EXPECT_LINEA_ERROR(throws_linea_error(), "[2] and [4]"), "the shapes [2] and [3] differ");
  EXPECT_LINEA_ERROR(throws_linea_error(), "op:", "[2] and [3]");
}
