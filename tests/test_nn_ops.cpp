// Forward values of matmul/bmm, softmax, log_softmax, layer_norm, cross_entropy and dropout
// against naive loops, the no-copy handling of transposed operands, and the errors bad
// inputs raise. Sizes above the kernels' OpenMP threshold are included so that the
// parallel paths are exercised too.
// Not here: gradients (tests/test_gradcheck_nn.cpp).
#include <array>
#include <cmath>
#include <tuple>
#include <vector>

#include "core/allocator.h"
#include "nn/module.h"
#include "tests/test_util.h"

namespace linea {
namespace {

using test::all_close;
using test::f64;

// Row-major [M, K] @ [K, N].
std::vector<double> naive_mm(const std::vector<double>& a, const std::vector<double>& b, int64_t M, int64_t K,
                             int64_t N) {
  std::vector<double> c(static_cast<size_t>(M * N), 0.0);
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) {
      double s = 0;
      for (int64_t k = 0; k < K; ++k) s += a[i * K + k] * b[k * N + j];
      c[i * N + j] = s;
    }
  return c;
}

Tensor vec_tensor(const std::vector<double>& v, const Shape& s) { return from_vector<double>(v, s); }

// ---- matmul ----------------------------------------------------------------------------------

TEST(Matmul, OddSizesMatchNaive) {
  manual_seed(11);
  for (auto [M, K, N] :
       std::vector<std::array<int64_t, 3>>{{1, 1, 1}, {7, 5, 3}, {13, 1, 9}, {2, 17, 1}, {33, 65, 31}}) {
    Tensor a = randn({M, K}, f64()), b = randn({K, N}, f64());
    Tensor ref = vec_tensor(naive_mm(a.to_vector<double>(), b.to_vector<double>(), M, K, N), {M, N});
    EXPECT_TRUE(all_close(matmul(a, b), ref, 1e-12, 1e-12)) << M << "x" << K << "x" << N;
    // float32 through sgemm.
    EXPECT_TRUE(all_close(matmul(a.to(DType::Float32), b.to(DType::Float32)), ref, 1e-4, 1e-4));
  }
}

TEST(Matmul, OneDimensional) {
  manual_seed(12);
  Tensor v = randn({5}, f64()), w = randn({5}, f64()), m = randn({5, 3}, f64()), n = randn({7, 5}, f64());
  const auto vv = v.to_vector<double>(), wv = w.to_vector<double>();
  double dot = 0;
  for (int i = 0; i < 5; ++i) dot += vv[i] * wv[i];
  Tensor d = matmul(v, w);
  EXPECT_EQ(d.dim(), 0);
  EXPECT_NEAR(d.item(), dot, 1e-12);

  Tensor vm = matmul(v, m);  // [3]
  EXPECT_EQ(vm.shape(), (Shape{3}));
  EXPECT_TRUE(all_close(vm, vec_tensor(naive_mm(vv, m.to_vector<double>(), 1, 5, 3), {3}), 1e-12, 1e-12));

  Tensor nv = matmul(n, v);  // [7]
  EXPECT_EQ(nv.shape(), (Shape{7}));
  EXPECT_TRUE(all_close(nv, vec_tensor(naive_mm(n.to_vector<double>(), vv, 7, 5, 1), {7}), 1e-12, 1e-12));

  // 1-D against a batch: [5] @ [2, 5, 3] -> [2, 3].
  Tensor bm = randn({2, 5, 3}, f64());
  Tensor r = matmul(v, bm);
  ASSERT_EQ(r.shape(), (Shape{2, 3}));
  for (int64_t i = 0; i < 2; ++i) EXPECT_TRUE(all_close(r.select(0, i), matmul(v, bm.select(0, i)), 1e-12, 1e-12));
}

TEST(Matmul, BroadcastBatch) {
  manual_seed(13);
  // [2, 1, 3, 5] @ [4, 5, 2] -> [2, 4, 3, 2]
  Tensor a = randn({2, 1, 3, 5}, f64()), b = randn({4, 5, 2}, f64());
  Tensor c = matmul(a, b);
  ASSERT_EQ(c.shape(), (Shape{2, 4, 3, 2}));
  const auto av = a.to_vector<double>(), bv = b.to_vector<double>(), cv = c.to_vector<double>();
  for (int64_t i = 0; i < 2; ++i)
    for (int64_t j = 0; j < 4; ++j) {
      std::vector<double> ai(av.begin() + i * 15, av.begin() + (i + 1) * 15);
      std::vector<double> bj(bv.begin() + j * 10, bv.begin() + (j + 1) * 10);
      const auto ref = naive_mm(ai, bj, 3, 5, 2);
      for (int64_t e = 0; e < 6; ++e) EXPECT_NEAR(cv[(i * 4 + j) * 6 + e], ref[e], 1e-12);
    }
  // A shared right operand (one folded GEMM) and a shared left operand.
  Tensor x = randn({3, 4, 5}, f64()), w = randn({5, 6}, f64());
  Tensor xw = matmul(x, w);
  ASSERT_EQ(xw.shape(), (Shape{3, 4, 6}));
  Tensor lhs = randn({4, 5}, f64()), rhs = randn({3, 5, 6}, f64());
  Tensor lx = matmul(lhs, rhs);
  ASSERT_EQ(lx.shape(), (Shape{3, 4, 6}));
  // An expanded (stride-0 batch) right operand.
  Tensor ex = matmul(x, w.unsqueeze(0).expand({3, 5, 6}));
  for (int64_t i = 0; i < 3; ++i) {
    const auto xi = x.select(0, i).to_vector<double>();
    const Tensor ref = vec_tensor(naive_mm(xi, w.to_vector<double>(), 4, 5, 6), {4, 6});
    EXPECT_TRUE(all_close(xw.select(0, i), ref, 1e-12, 1e-12));
    EXPECT_TRUE(all_close(ex.select(0, i), ref, 1e-12, 1e-12));
    EXPECT_TRUE(
        all_close(lx.select(0, i),
                  vec_tensor(naive_mm(lhs.to_vector<double>(), rhs.select(0, i).to_vector<double>(), 4, 5, 6), {4, 6}),
                  1e-12, 1e-12));
  }
  // Many small matrices (the OpenMP batch path), float32.
  Tensor p = randn({64, 5, 7}), q = randn({64, 7, 3});
  Tensor pq = matmul(p, q);
  for (int64_t i : {0, 31, 63})
    EXPECT_TRUE(all_close(
        pq.select(0, i),
        vec_tensor(naive_mm(p.select(0, i).to_vector<double>(), q.select(0, i).to_vector<double>(), 5, 7, 3), {5, 3}),
        1e-4, 1e-4));
}

TEST(Matmul, TransposedAndStridedOperands) {
  manual_seed(14);
  Tensor at = randn({6, 4}, f64()), bt = randn({5, 6}, f64());
  Tensor a = at.t(), b = bt.t();  // [4, 6] and [6, 5], column-major views
  ASSERT_FALSE(a.is_contiguous());
  Tensor ref = matmul(a.contiguous(), b.contiguous());
  EXPECT_TRUE(all_close(matmul(a, b), ref, 1e-12, 1e-12));
  EXPECT_TRUE(all_close(matmul(a, b.contiguous()), ref, 1e-12, 1e-12));
  EXPECT_TRUE(all_close(matmul(a.contiguous(), b), ref, 1e-12, 1e-12));
  // Row-major with padding (a narrow of the columns): lda > cols, read in place.
  Tensor wide = randn({4, 9}, f64());
  Tensor narrowed = wide.narrow(1, 2, 6);
  EXPECT_TRUE(all_close(matmul(narrowed, b), matmul(narrowed.contiguous(), b), 1e-12, 1e-12));
  // Column step 2: neither layout, copied first.
  Tensor strided = wide.slice(1, 0, 9, 2).narrow(1, 0, 4);  // [4, 4], strides (9, 2)
  Tensor sq = randn({4, 3}, f64());
  EXPECT_TRUE(all_close(matmul(strided, sq), matmul(strided.contiguous(), sq), 1e-12, 1e-12));
  // Batched transposed views, and a permuted batch.
  Tensor x = randn({3, 6, 4}, f64()).transpose(1, 2);  // [3, 4, 6]
  Tensor y = randn({3, 5, 6}, f64()).transpose(1, 2);  // [3, 6, 5]
  EXPECT_TRUE(all_close(bmm(x, y), bmm(x.contiguous(), y.contiguous()), 1e-12, 1e-12));
  Tensor z = randn({4, 3, 6}, f64()).permute({1, 0, 2});  // [3, 4, 6]
  EXPECT_TRUE(all_close(matmul(z, y), matmul(z.contiguous(), y.contiguous()), 1e-12, 1e-12));
}

TEST(Matmul, TransposedViewsAreNotCopied) {
  // Counting CPU allocations: transposed (column-major) operands and a padded row-major one
  // cost only the output; a column-strided operand costs one copy more.
  manual_seed(21);
  NoGradGuard no_grad;
  Tensor at = randn({48, 32}), bt = randn({40, 48}), wide = randn({32, 60});
  Tensor a = at.t(), b = bt.t(), padded = wide.narrow(1, 0, 48), strided = wide.slice(1, 0, 60, 2).narrow(1, 0, 20);
  auto allocs = [] { return cpu_allocator().stats().num_allocs; };
  size_t n0 = allocs();
  Tensor c = matmul(a, b);
  EXPECT_EQ(allocs() - n0, 1u);
  n0 = allocs();
  c = matmul(padded, b);
  EXPECT_EQ(allocs() - n0, 1u);
  Tensor col_major = randn({8, 20}).t();
  n0 = allocs();
  c = matmul(strided, col_major);
  EXPECT_EQ(allocs() - n0, 2u);  // the copy of `strided`, the output
  // Batched transposed views with a broadcast batch dim.
  Tensor x = randn({3, 6, 4}).transpose(1, 2), y = randn({5, 6}).t();
  n0 = allocs();
  c = matmul(x, y);
  EXPECT_EQ(allocs() - n0, 1u);
}

TEST(Matmul, EmptyDims) {
  Tensor c = matmul(randn({3, 0}, f64()), randn({0, 4}, f64()));
  ASSERT_EQ(c.shape(), (Shape{3, 4}));
  for (double v : c.to_vector<double>()) EXPECT_EQ(v, 0.0);
  EXPECT_EQ(matmul(randn({0, 3}), randn({3, 4})).shape(), (Shape{0, 4}));
  EXPECT_EQ(matmul(randn({0, 2, 3}), randn({3, 4})).shape(), (Shape{0, 2, 4}));
}

TEST(Matmul, BadInputs) {
  EXPECT_LINEA_ERROR(matmul(randn({2, 3}), randn({4, 5})), "matmul: shapes cannot be multiplied ([2, 3] and [4, 5])");
  EXPECT_LINEA_ERROR(matmul(randn({3}), randn({4})), "matmul: shapes cannot be multiplied ([3] and [4])");
  EXPECT_LINEA_ERROR(matmul(randn({2, 2, 3}), randn({3, 3, 4})), "matmul");  // batch 2 vs 3
  EXPECT_LINEA_ERROR(matmul(randn({2, 3}), randn({3, 4}, f64())), "matmul");
  EXPECT_LINEA_ERROR(matmul(randn({2, 3}), randn({3, 4}, f64())), "float64");
  EXPECT_LINEA_ERROR(matmul(zeros({2, 3}, TensorOptions(DType::Int64)), zeros({3, 4}, TensorOptions(DType::Int64))),
                     "matmul: expected a to be float32 or float64, got int64");
  EXPECT_LINEA_ERROR(matmul(scalar_tensor(1.0), randn({3})), "matmul");
  EXPECT_LINEA_ERROR(bmm(randn({2, 3}), randn({3, 4})), "bmm");
  EXPECT_LINEA_ERROR(bmm(randn({2, 2, 3}), randn({3, 3, 4})), "bmm: batch sizes differ");
  EXPECT_LINEA_ERROR(bmm(randn({2, 2, 3}), randn({2, 4, 4})), "bmm: shapes cannot be multiplied");
  EXPECT_LINEA_ERROR(matmul(Tensor(), randn({3})), test::undefined_arg("matmul", "a"));
  EXPECT_LINEA_ERROR(matmul(randn({3}), Tensor()), test::undefined_arg("matmul", "b"));
  EXPECT_LINEA_ERROR(matmul(randn({2, 3}), randn({3, 4}), NAN), "matmul: alpha must be finite, got nan");
  // matmul_into (the backward's GEMMs): out must be a defined row-major [.., M, N] of a's dtype.
  const Tensor a = randn({2, 3}), b = randn({3, 4});
  EXPECT_LINEA_ERROR(raw::matmul_into(a, randn({4, 4}), zeros({2, 4}), 1.0), "matmul: shapes cannot be multiplied");
  EXPECT_LINEA_ERROR(raw::matmul_into(a, b, Tensor(), 1.0), test::undefined_arg("matmul", "out"));
  EXPECT_LINEA_ERROR(raw::matmul_into(a, b, zeros({2, 5}), 1.0),
                     "matmul: out has shape [2, 5], expected [2, 4] for [2, 3] @ [3, 4]");
  EXPECT_LINEA_ERROR(raw::matmul_into(randn({3}), b, zeros({4}), 1.0),
                     "matmul: writing into out needs a and b of at least 2 dims, got [3] @ [3, 4]");
  EXPECT_LINEA_ERROR(raw::matmul_into(a, b, zeros({2, 4}, f64()), 1.0), "matmul: dtype mismatch");
  EXPECT_LINEA_ERROR(raw::matmul_into(a, b, zeros({4, 2}).t(), 1.0),
                     "matmul: out's matrices must be row-major, got strides [1, 2]");
  EXPECT_LINEA_ERROR(raw::empty_like_layout(Tensor()), test::undefined_arg("empty_like_layout", "t"));
}

// matmul_into with accumulate: out += a @ b (the GEMM's beta = 1) in each of the CPU kernel's
// paths: one GEMM, a transposed operand, a batch folded into one GEMM (a shared right operand),
// a batch of GEMMs; an empty sum leaves out as it was.
TEST(Matmul, IntoAccumulates) {
  manual_seed(77);
  struct Case {
    Tensor a, b;
  };
  const std::vector<Case> cases = {
      {randn({5, 7}, f64()), randn({7, 3}, f64())},    {randn({7, 5}, f64()).t(), randn({3, 7}, f64()).t()},
      {randn({2, 4, 7}, f64()), randn({7, 3}, f64())}, {randn({2, 4, 7}, f64()), randn({2, 7, 3}, f64())},
      {randn({5, 0}, f64()), randn({0, 3}, f64())},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(shape_str(c.a.shape()) + " @ " + shape_str(c.b.shape()));
    const Tensor base = randn(raw::matmul(c.a, c.b).shape(), f64());
    Tensor out = clone(base);
    raw::matmul_into(c.a, c.b, out, 0.5, /*accumulate=*/true);
    EXPECT_TRUE(all_close(out, base + matmul(c.a, c.b) * 0.5, 1e-12, 1e-12));
    raw::matmul_into(c.a, c.b, out, 0.5);  // overwrites
    EXPECT_TRUE(all_close(out, matmul(c.a, c.b) * 0.5, 1e-12, 1e-12));
  }
  // float32, through OpenBLAS's sgemm
  const Tensor a = randn({9, 6}), b = randn({6, 4}), base = randn({9, 4});
  Tensor out = clone(base);
  raw::matmul_into(a, b, out, 1.0, true);
  EXPECT_TRUE(all_close(out, base + matmul(a, b), 1e-5, 1e-5));
}

// linears: the outputs of linear, layer by layer, bit for bit; the gradients of the separate
// layers (x's summed by the engine there, in the GEMMs here).
TEST(Linears, EqualLinearLayerByLayer) {
  manual_seed(78);
  for (DType dt : {DType::Float64, DType::Float32}) {
    SCOPED_TRACE(dtype_name(dt));
    const TensorOptions o(dt);
    const Tensor x = randn({2, 5, 8}, o), w0 = randn({8, 8}, o), w1 = randn({3, 8}, o), w2 = randn({8, 8}, o),
                 b0 = randn({8}, o), b2 = randn({8}, o), gy = randn({2, 5, 19}, o);
    std::vector<Tensor> leaves{x, w0, w1, w2, b0, b2};
    std::vector<std::vector<Tensor>> grads;
    for (int fused = 0; fused < 2; ++fused) {
      std::vector<Tensor> in;
      for (const Tensor& t : leaves) in.push_back(t.detach().requires_grad_(true));
      std::vector<Tensor> y =
          fused ? linears(in[0], {in[1], in[2], in[3]}, {in[4], Tensor(), in[5]})
                : std::vector<Tensor>{linear(in[0], in[1], in[4]), linear(in[0], in[2]), linear(in[0], in[3], in[5])};
      const Tensor ref0 = linear(x, w0, b0), ref1 = linear(x, w1), ref2 = linear(x, w2, b2);
      EXPECT_EQ(max(abs(y[0] - ref0)).item(), 0.0);
      EXPECT_EQ(max(abs(y[1] - ref1)).item(), 0.0);
      EXPECT_EQ(max(abs(y[2] - ref2)).item(), 0.0);
      cat(y, -1).backward(gy);
      grads.emplace_back();
      for (const Tensor& t : in) grads.back().push_back(t.grad());
    }
    const double tol = dt == DType::Float64 ? 1e-12 : 1e-5;
    for (size_t i = 0; i < leaves.size(); ++i) EXPECT_TRUE(all_close(grads[1][i], grads[0][i], tol, tol)) << i;
  }
}

// Weights and biases packed in one buffer (MultiHeadAttention's q, k and v): the same outputs and
// gradients as layer by layer, the outputs column blocks of one tensor, and each weight's
// gradient a row block of one.
TEST(Linears, PackedLayersEqualLayerByLayer) {
  manual_seed(79);
  for (DType dt : {DType::Float64, DType::Float32}) {
    SCOPED_TRACE(dtype_name(dt));
    const TensorOptions o(dt);
    const double tol = dt == DType::Float64 ? 1e-12 : 1e-5;
    const Tensor x = randn({2, 5, 8}, o), gy = randn({2, 5, 19}, o);
    std::vector<Tensor> w{randn({8, 8}, o), randn({3, 8}, o), randn({8, 8}, o)},
        b{randn({8}, o), randn({3}, o), randn({8}, o)};
    std::vector<std::vector<Tensor>> grads;
    for (int packed = 0; packed < 2; ++packed) {
      std::vector<Tensor> in{x.detach().requires_grad_(true)};
      for (const auto* list : {&w, &b})
        for (const Tensor& t : *list) in.push_back(clone(t).requires_grad_(true));
      if (packed) {
        nn::pack_together({in[1], in[2], in[3]});
        nn::pack_together({in[4], in[5], in[6]});
      }
      const std::vector<Tensor> y = linears(in[0], {in[1], in[2], in[3]}, {in[4], in[5], in[6]});
      if (packed) {
        EXPECT_TRUE(raw::joined_view(y, -1).defined());
      }
      cat(y, -1).backward(gy);
      grads.emplace_back();
      for (const Tensor& t : in) grads.back().push_back(t.grad());
      if (packed) {
        EXPECT_TRUE(raw::joined_view({in[1].grad(), in[2].grad(), in[3].grad()}, 0).defined());
      }
      for (int i = 0; i < 3; ++i) EXPECT_TRUE(all_close(y[i], linear(x, w[i], b[i]), tol, tol)) << i;
    }
    for (size_t i = 0; i < grads[0].size(); ++i) EXPECT_TRUE(all_close(grads[1][i], grads[0][i], tol, tol)) << i;
  }
  // Weights packed but one bias missing: layer by layer (the outputs apart).
  Tensor w0 = randn({4, 3}), w1 = randn({4, 3}), b0 = randn({4});
  nn::pack_together({w0, w1});
  const Tensor x = randn({2, 3});
  const std::vector<Tensor> y = linears(x, {w0, w1}, {b0, Tensor()});
  EXPECT_FALSE(raw::joined_view(y, -1).defined());
  EXPECT_TRUE(all_close(y[1], linear(x, w1), 1e-6, 1e-6));
}

TEST(Linears, BadInputs) {
  const Tensor x = randn({3, 4}), w = randn({5, 4});
  EXPECT_LINEA_ERROR(linears(x, {}, {}), "linears: expected as many biases as weights");
  EXPECT_LINEA_ERROR(linears(x, {w, w}, {Tensor()}), "got 2 weights and 1 biases");
  EXPECT_LINEA_ERROR(linears(x, {w, randn({5, 3})}, {Tensor(), Tensor()}),
                     "linear: expected x [..., K] and weight [N, K], got x [3, 4] and weight [5, 3]");
  EXPECT_LINEA_ERROR(linears(x, {w}, {randn({4})}), "linear: bias must be [5]");
  const Tensor u, i = zeros({3, 4}, TensorOptions(DType::Int64));
  EXPECT_LINEA_ERROR(linear(u, w), test::undefined_arg("linear", "x"));
  EXPECT_LINEA_ERROR(linear(x, u), test::undefined_arg("linear", "weight"));
  EXPECT_LINEA_ERROR(linear(i, zeros({5, 4}, TensorOptions(DType::Int64))),
                     "linear: expected x to be float32 or float64, got int64");
  EXPECT_LINEA_ERROR(linear(x, randn({5, 4}, f64())), "linear: dtype mismatch: float32 (shape [3, 4]) vs float64");
  EXPECT_LINEA_ERROR(linear(x, w, randn({5}, f64())), "linear: dtype mismatch: float32 (shape [3, 4]) vs float64");
  // linear_weight_grad (the backward's): grad [..., N] over x's rows, in x's dtype.
  EXPECT_LINEA_ERROR(raw::linear_weight_grad(u, x, false), test::undefined_arg("linear_weight_grad", "grad"));
  EXPECT_LINEA_ERROR(raw::linear_weight_grad(randn({3, 5}), u, false), "linear_weight_grad: argument 'x' is an");
  EXPECT_LINEA_ERROR(raw::linear_weight_grad(randn({2, 5}), x, false),
                     "linear_weight_grad: grad [2, 5] does not match x [3, 4]");
  EXPECT_LINEA_ERROR(raw::linear_weight_grad(randn({3, 5}, f64()), x, true), "linear_weight_grad: dtype mismatch");
}

// ---- softmax ---------------------------------------------------------------------------------

// Softmax over dim 1 of x [outer, r, inner], naively.
std::vector<double> naive_softmax(const std::vector<double>& x, int64_t outer, int64_t r, int64_t inner, bool log) {
  std::vector<double> y(x.size());
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t j = 0; j < inner; ++j) {
      double m = -INFINITY, s = 0;
      for (int64_t k = 0; k < r; ++k) m = std::max(m, x[(o * r + k) * inner + j]);
      for (int64_t k = 0; k < r; ++k) s += std::exp(x[(o * r + k) * inner + j] - m);
      for (int64_t k = 0; k < r; ++k) {
        const double v = x[(o * r + k) * inner + j] - m;
        y[(o * r + k) * inner + j] = log ? v - std::log(s) : std::exp(v) / s;
      }
    }
  return y;
}

TEST(Softmax, MatchesNaiveAndRowsSumToOne) {
  manual_seed(15);
  // {shape, dim, outer, r, inner}; the large ones take the parallel paths.
  struct Case {
    Shape shape;
    int64_t dim, outer, r, inner;
  };
  for (const Case& c : {Case{{4, 7}, -1, 4, 7, 1}, Case{{3, 5, 6}, 1, 3, 5, 6}, Case{{5, 4}, 0, 1, 5, 4},
                        Case{{300, 200}, 1, 300, 200, 1}, Case{{6, 40, 300}, 1, 6, 40, 300}}) {
    Tensor x = mul(randn(c.shape, f64()), 3.0);
    const auto xv = x.to_vector<double>();
    for (bool log : {false, true}) {
      Tensor y = log ? log_softmax(x, c.dim) : softmax(x, c.dim);
      EXPECT_TRUE(all_close(y, vec_tensor(naive_softmax(xv, c.outer, c.r, c.inner, log), c.shape), 1e-12, 1e-10))
          << shape_str(c.shape) << " dim " << c.dim << " log " << log;
    }
    Tensor sums = sum(softmax(x, c.dim), {c.dim});
    EXPECT_TRUE(all_close(sums, ones(sums.shape(), f64()), 1e-12, 0));
    // float32 kernel, on a transposed view.
    Tensor xt = x.to(DType::Float32).transpose(0, -1).contiguous().transpose(0, -1);
    EXPECT_TRUE(all_close(softmax(xt, c.dim), vec_tensor(naive_softmax(xv, c.outer, c.r, c.inner, false), c.shape),
                          1e-6, 1e-4));
  }
}

TEST(Softmax, LargeLogitsAreStable) {
  Tensor x = tensor<float>({1000.f, 1001.f, 999.f, -1000.f, -1001.f, -999.f}, {2, 3});
  const auto y = softmax(x, -1).to_vector<double>();
  const auto ly = log_softmax(x, -1).to_vector<double>();
  const double e = std::exp(1.0), z = 1 + e + 1 / e;
  const std::vector<double> ref = {1 / z, e / z, 1 / (e * z), 1 / z, 1 / (e * z), e / z};
  for (int i = 0; i < 6; ++i) {
    ASSERT_TRUE(std::isfinite(y[i]) && std::isfinite(ly[i]));
    EXPECT_NEAR(y[i], ref[i], 1e-6);
    EXPECT_NEAR(ly[i], std::log(ref[i]), 2e-4);  // float32 spacing near 1000 is 6e-5
  }
  EXPECT_LINEA_ERROR(softmax(randn({2, 3}), 2), "softmax");
  EXPECT_LINEA_ERROR(log_softmax(zeros({2, 3}, TensorOptions(DType::Int64)), 1), "log_softmax");
}

TEST(Softmax, BadInputs) {
  EXPECT_LINEA_ERROR(softmax(Tensor(), 0), test::undefined_arg("softmax", "x"));
  // The backward (raw, for custom ops): grad and output alike, floating.
  const Tensor y = randn({2, 3}), i = zeros({2, 3}, TensorOptions(DType::Int64));
  EXPECT_LINEA_ERROR(raw::softmax_backward(Tensor(), y, 1, false), test::undefined_arg("softmax_backward", "grad"));
  EXPECT_LINEA_ERROR(raw::softmax_backward(y, Tensor(), 1, true), test::undefined_arg("log_softmax_backward", "y"));
  EXPECT_LINEA_ERROR(raw::softmax_backward(randn({2, 3}, f64()), y, 1, false), "softmax_backward: dtype mismatch");
  EXPECT_LINEA_ERROR(raw::softmax_backward(i, i, 1, false),
                     "softmax_backward: expected y to be float32 or float64, got int64");
  EXPECT_LINEA_ERROR(raw::softmax_backward(randn({3, 2}), y, 1, false),
                     "softmax_backward: grad [3, 2] and output [2, 3] differ in shape");
}

// ---- layer norm --------------------------------------------------------------------------------

TEST(LayerNorm, NormalizesRowsAndMatchesNaive) {
  manual_seed(16);
  for (auto [rows, cols] : std::vector<std::pair<int64_t, int64_t>>{{5, 8}, {700, 96}}) {
    Tensor x = add(mul(randn({rows, cols}, f64()), 4.0), 3.0);
    Tensor y = layer_norm(x, {cols}, Tensor(), Tensor(), 0.0);
    EXPECT_TRUE(all_close(mean(y, {1}), zeros({rows}, f64()), 1e-12, 0));
    EXPECT_TRUE(all_close(mean(mul(y, y), {1}), ones({rows}, f64()), 1e-10, 0));

    Tensor w = randn({cols}, f64()), b = randn({cols}, f64());
    const double eps = 1e-5;
    Tensor ya = layer_norm(x, {cols}, w, b, eps);
    const auto xv = x.to_vector<double>(), wv = w.to_vector<double>(), bv = b.to_vector<double>();
    std::vector<double> ref(xv.size());
    for (int64_t i = 0; i < rows; ++i) {
      double mu = 0, var = 0;
      for (int64_t c = 0; c < cols; ++c) mu += xv[i * cols + c] / cols;
      for (int64_t c = 0; c < cols; ++c) var += (xv[i * cols + c] - mu) * (xv[i * cols + c] - mu) / cols;
      for (int64_t c = 0; c < cols; ++c)
        ref[i * cols + c] = (xv[i * cols + c] - mu) / std::sqrt(var + eps) * wv[c] + bv[c];
    }
    EXPECT_TRUE(all_close(ya, vec_tensor(ref, {rows, cols}), 1e-10, 1e-10));
    // float32 on a transposed view.
    Tensor x32 = x.to(DType::Float32).t().contiguous().t();
    EXPECT_TRUE(all_close(layer_norm(x32, {cols}, w.to(DType::Float32), b.to(DType::Float32), eps),
                          vec_tensor(ref, {rows, cols}), 1e-4, 1e-4));
  }
  // Several normalized dims equal one flattened dim.
  Tensor x = randn({2, 3, 4}, f64());
  EXPECT_TRUE(all_close(layer_norm(x, {3, 4}).reshape({2, 12}), layer_norm(x.reshape({2, 12}), {12}), 1e-12, 0));
}

TEST(LayerNorm, BackwardParamGradsOnLargeInput) {
  // dw = sum_rows g * xhat and db = sum_rows g, with rows above the parallel threshold.
  manual_seed(17);
  const int64_t rows = 600, cols = 80;
  Tensor x = randn({rows, cols}, f64());
  Tensor w = ones({cols}, f64()), b = zeros({cols}, f64());
  w.requires_grad_(true);
  b.requires_grad_(true);
  Tensor g = randn({rows, cols}, f64());
  Tensor y = layer_norm(x, {cols}, w, b, 1e-5);
  y.backward(g);
  Tensor xhat = layer_norm(x, {cols}, Tensor(), Tensor(), 1e-5);
  EXPECT_TRUE(all_close(w.grad(), sum(mul(g, xhat), {0}), 1e-9, 1e-9));
  EXPECT_TRUE(all_close(b.grad(), sum(g, {0}), 1e-9, 1e-9));
}

TEST(LayerNorm, BadInputs) {
  EXPECT_LINEA_ERROR(layer_norm(randn({2, 3}), {4}), "layer_norm");
  EXPECT_LINEA_ERROR(layer_norm(randn({2, 3}), {2, 3, 1}), "layer_norm");
  EXPECT_LINEA_ERROR(layer_norm(randn({2, 3}), {3}, randn({4})), "layer_norm: weight has shape [4]");
  EXPECT_LINEA_ERROR(layer_norm(randn({2, 3}), {3}, Tensor(), randn({2})), "layer_norm: bias");
  EXPECT_LINEA_ERROR(layer_norm(randn({2, 3}), {3}, randn({3}, f64())), "layer_norm");
  const Tensor x = randn({2, 3});
  EXPECT_LINEA_ERROR(layer_norm(zeros({2, 3}, TensorOptions(DType::Int64)), {3}),
                     "layer_norm: expected x to be float32 or float64, got int64");
  EXPECT_LINEA_ERROR(layer_norm(x, {3}, Tensor(), Tensor(), -1.0), "layer_norm: eps must be >= 0, got -1");
  EXPECT_LINEA_ERROR(add_layer_norm(x, Tensor(), {3}), test::undefined_arg("add_layer_norm", "r"));
  EXPECT_LINEA_ERROR(add_layer_norm(x, randn({2, 3}, f64()), {3}), "add_layer_norm: dtype mismatch");
  EXPECT_LINEA_ERROR(add_layer_norm(x, randn({1, 3}), {3}), "add_layer_norm: x [2, 3] and r [1, 3] differ in shape");
  EXPECT_LINEA_ERROR(add_layer_norm(x, x, {3}, Tensor(), Tensor(), -1.0), "add_layer_norm: eps must be >= 0, got -1");
  EXPECT_LINEA_ERROR(add_layer_norm(x, x, {3}, Tensor(), Tensor(), 1e-5, 1.5),
                     "add_layer_norm: dropout must be in [0, 1], got 1.5");
  // The backward (raw, for custom ops): grad like x, mean and rstd one per row.
  const Tensor m = zeros({2}), s = ones({2});
  EXPECT_LINEA_ERROR(raw::layer_norm_backward(Tensor(), x, 1, Tensor(), Tensor(), m, s),
                     test::undefined_arg("layer_norm_backward", "grad"));
  EXPECT_LINEA_ERROR(raw::layer_norm_backward(randn({2, 3}, f64()), x, 1, Tensor(), Tensor(), m, s),
                     "layer_norm_backward: dtype mismatch");
  EXPECT_LINEA_ERROR(raw::layer_norm_backward(randn({3, 2}), x, 1, Tensor(), Tensor(), m, s),
                     "layer_norm_backward: grad [3, 2] and input [2, 3] differ in shape");
  EXPECT_LINEA_ERROR(raw::layer_norm_backward(x, x, 1, Tensor(), Tensor(), zeros({3}), s),
                     "layer_norm_backward: mean/rstd [3]/[2] do not have 2 rows");
  EXPECT_LINEA_ERROR(raw::add_layer_norm_backward(Tensor(), Tensor(), x, 1, Tensor(), Tensor(), m, s, FoldedDropout{}),
                     "add_layer_norm_backward: neither the norm nor the sum has a gradient");
}

// ---- normalize ---------------------------------------------------------------------------------

// The composed x rsqrt(max(|x|^2, eps^2)) that the fused op replaces.
Tensor composed_normalize(const Tensor& x, double eps) {
  return mul(x, rsqrt(clamp(sum(square(x), {-1}, true), eps * eps, INFINITY)));
}

TEST(Normalize, BadInputs) {
  EXPECT_LINEA_ERROR(normalize(Tensor()), test::undefined_arg("normalize", "x"));
  EXPECT_LINEA_ERROR(normalize(zeros({2, 3}, TensorOptions(DType::Int64))),
                     "normalize: expected x to be float32 or float64, got int64");
  const Tensor x = randn({2, 3});
  EXPECT_LINEA_ERROR(raw::normalize_backward(Tensor(), x, 1e-12), test::undefined_arg("normalize_backward", "grad"));
  EXPECT_LINEA_ERROR(raw::normalize_backward(randn({2, 3}, f64()), x, 1e-12), "normalize_backward: dtype mismatch");
  EXPECT_LINEA_ERROR(raw::normalize_backward(randn({3, 2}), x, 1e-12), "normalize_backward: grad [3, 2] and x [2, 3]");
}

TEST(Normalize, MatchesComposedKeepsZeroRowsAndChecksInputs) {
  manual_seed(18);
  for (auto [rows, cols] : std::vector<std::pair<int64_t, int64_t>>{{5, 8}, {700, 96}, {3, 1}}) {
    Tensor x = mul(randn({rows, cols}, f64()), 3.0);
    x = cat({x, zeros({1, cols}, f64()), mul(ones({1, cols}, f64()), 1e-14)}, 0);  // a zero row, a clamped one
    const Tensor y = normalize(x);
    EXPECT_TRUE(all_close(y, composed_normalize(x, 1e-12), 1e-14, 1e-14));
    EXPECT_TRUE(all_close(sum(square(narrow(y, 0, 0, rows)), {-1}), ones({rows}, f64()), 1e-12, 0));
    EXPECT_TRUE(all_close(select(y, 0, rows), zeros({cols}, f64()), 0, 0));
    // float32, on a transposed view; its gradient against the composed one's
    Tensor x32 = x.to(DType::Float32).t().contiguous().t();
    EXPECT_TRUE(all_close(normalize(x32), composed_normalize(x, 1e-12).to(DType::Float32), 1e-5, 1e-5));
    Tensor a = x.detach().requires_grad_(true), b = x.detach().requires_grad_(true);
    const Tensor g = randn(x.shape(), f64());
    normalize(a, 0.5).backward(g);
    composed_normalize(b, 0.5).backward(g);
    EXPECT_TRUE(all_close(a.grad(), b.grad(), 1e-12, 1e-12));
  }
  EXPECT_LINEA_ERROR(normalize(zeros({2, 3}, TensorOptions(DType::Int64))), "normalize");
  EXPECT_LINEA_ERROR(normalize(randn({})), "normalize: needs a dim to normalize over, got a tensor of shape []");
  EXPECT_LINEA_ERROR(normalize(randn({2, 3}), 0.0), "normalize: eps must be positive and finite, got 0");
  // float32 with an eps whose square underflows (1e-60): the norm is clamped, not its square, so a
  // zero row stays zero (not 0 / 0) forward and backward; an eps that is itself 0 in float32 is refused.
  Tensor z = zeros({2, 3}).requires_grad_(true);
  const Tensor yz = normalize(z, 1e-30);
  EXPECT_TRUE(all_close(yz, zeros({2, 3}), 0, 0));
  yz.backward(ones({2, 3}));
  EXPECT_TRUE(all_close(z.grad(), full({2, 3}, 1e30), 0, 1e-6));
  EXPECT_LINEA_ERROR(normalize(randn({2, 3}), 1e-50), "normalize: eps 1e-50 rounds to 0 in float32");
}

// ---- sums_ratio --------------------------------------------------------------------------------

// num / max(den, tiny), 0 where not visible, composed from ops (nprf_rpe's guarded_ratio).
Tensor composed_sums_ratio(const Tensor& y, const Tensor& visible, double tiny) {
  const int64_t E = y.size(3) - 1;
  Tensor d = narrow(y, 3, E, 1);
  if (visible.defined()) d = where(visible, d, scalar_tensor(1.0, d.options()));
  Tensor r = div(narrow(y, 3, 0, E), clamp(d, tiny, INFINITY));
  if (visible.defined()) r = where(visible, r, scalar_tensor(0.0, r.options()));
  return r;
}

// Values and gradients against the composed formula: rows all visible, a flag per batch and per
// query, dens below tiny (clamped: no gradient to them) and zero dens in hidden rows.
TEST(SumsRatio, MatchesComposedAndChecksInputs) {
  manual_seed(20);
  const int64_t B = 2, H = 3, N = 5, E = 4;
  Tensor y = randn({B, H, N, E + 1}, f64());
  narrow(y, 3, E, 1).copy_(exp(randn({B, H, N, 1}, f64())));  // positive dens
  const auto at = [](const Tensor& t, int64_t b, int64_t h, int64_t n, int64_t e) {
    return select(select(select(select(t, 0, b), 0, h), 0, n), 0, e);
  };
  at(y, 1, 2, 3, E).fill_(1e-30);  // a den the guard clamps (visible in every case but per batch)
  at(y, 0, 1, 3, E).fill_(0.0);    // a zero den, in a row hidden per query
  const double tiny = 1e-18;
  Tensor per_query = rand({B, 1, N, 1}, f64()) > 0.3;
  at(per_query, 0, 0, 3, 0).fill_(0.0);
  at(per_query, 1, 0, 3, 0).fill_(1.0);
  const Tensor per_batch = tensor<bool>({true, false}, {B, 1, 1, 1});
  for (const Tensor& vis : {Tensor(), per_query, per_batch}) {
    SCOPED_TRACE(vis.defined() ? shape_str(vis.shape()) : "all visible");
    const Tensor out = sums_ratio(y, vis, tiny);
    EXPECT_TRUE(all_close(out, composed_sums_ratio(y, vis, tiny), 0, 1e-15));
    EXPECT_TRUE(all_close(sums_ratio(y.to(DType::Float32), vis, tiny),
                          composed_sums_ratio(y, vis, tiny).to(DType::Float32), 1e-6, 1e-6));
    Tensor a = y.detach().requires_grad_(true), b = y.detach().requires_grad_(true);
    const Tensor g = randn(out.shape(), f64());
    sums_ratio(a, vis, tiny).backward(g);
    composed_sums_ratio(b, vis, tiny).backward(g);
    EXPECT_TRUE(all_close(a.grad(), b.grad(), 1e-13, 1e-13));
  }
  EXPECT_LINEA_ERROR(sums_ratio(randn({2, 3, 4}), Tensor(), tiny),
                     "sums_ratio: expected y [B, H, N, E + 1] holding [num, den] (E >= 1), got [2, 3, 4]");
  EXPECT_LINEA_ERROR(sums_ratio(randn({2, 3, 4, 1}), Tensor(), tiny), "got [2, 3, 4, 1]");
  EXPECT_LINEA_ERROR(sums_ratio(randn({2, 3, 4, 5}), ones({2, 1, 3, 1}) > 0.0, tiny),
                     "sums_ratio: visible must be Bool [B, 1, N or 1, 1] = [2, 1, 4 or 1, 1] for y [2, 3, 4, 5], got "
                     "bool [2, 1, 3, 1]");
  EXPECT_LINEA_ERROR(sums_ratio(randn({2, 3, 4, 5}), ones({2, 1, 4, 1}), tiny), "got float32 [2, 1, 4, 1]");
  EXPECT_LINEA_ERROR(sums_ratio(zeros({2, 3, 4, 5}, TensorOptions(DType::Int64)), Tensor(), tiny), "sums_ratio");
  // The backward (raw, for custom ops): a gradient of y's dtype, shaped like y less its last column.
  const Tensor y4 = randn({2, 3, 4, 5});
  EXPECT_LINEA_ERROR(raw::sums_ratio_backward(Tensor(), y4, Tensor(), tiny),
                     test::undefined_arg("sums_ratio_backward", "grad"));
  EXPECT_LINEA_ERROR(raw::sums_ratio_backward(randn({2, 3, 4, 4}, f64()), y4, Tensor(), tiny),
                     "sums_ratio_backward: dtype mismatch");
  EXPECT_LINEA_ERROR(raw::sums_ratio_backward(randn({2, 3, 4, 5}), y4, Tensor(), tiny),
                     "sums_ratio_backward: grad [2, 3, 4, 5] is not y [2, 3, 4, 5] less its last column");
}

// ---- sq_norm -----------------------------------------------------------------------------------

TEST(SqNorm, MatchesComposedAndChecksInputs) {
  manual_seed(19);
  for (auto [rows, cols] : std::vector<std::pair<int64_t, int64_t>>{{5, 8}, {700, 96}, {3, 1}}) {
    const Tensor x = mul(randn({2, rows, cols}, f64()), 3.0);
    for (double s : {1.0, -0.5}) {
      const Tensor y = sq_norm(x, s);
      EXPECT_EQ(y.shape(), (Shape{2, rows}));
      EXPECT_TRUE(all_close(y, mul(sum(square(x), {-1}), s), 1e-13, 1e-13));
      // float32 on a transposed view
      const Tensor x32 = x.to(DType::Float32).transpose(0, 1).contiguous().transpose(0, 1);
      EXPECT_TRUE(all_close(sq_norm(x32, s), mul(sum(square(x), {-1}), s).to(DType::Float32), 1e-4, 1e-5));
      // the gradient against the composed one's
      Tensor a = x.detach().requires_grad_(true), b = x.detach().requires_grad_(true);
      const Tensor g = randn({2, rows}, f64());
      sq_norm(a, s).backward(g);
      mul(sum(square(b), {-1}), s).backward(g);
      EXPECT_TRUE(all_close(a.grad(), b.grad(), 1e-13, 1e-13));
    }
  }
  // A row of no columns sums to 0; a vector to a 0-d tensor.
  EXPECT_TRUE(all_close(sq_norm(randn({3, 0})), zeros({3}), 0, 0));
  EXPECT_TRUE(all_close(sq_norm(full({4}, 2.0), 0.5), full({}, 8.0), 0, 0));
  EXPECT_LINEA_ERROR(sq_norm(Tensor()), test::undefined_arg("sq_norm", "x"));
  EXPECT_LINEA_ERROR(sq_norm(zeros({2, 3}, TensorOptions(DType::Int64))),
                     "sq_norm: expected x to be float32 or float64, got int64");
  EXPECT_LINEA_ERROR(sq_norm(randn({})), "sq_norm: needs a dim to sum over, got a tensor of shape []");
  EXPECT_LINEA_ERROR(raw::sq_norm_backward(randn({3}), randn({2, 3}), 1.0),
                     "sq_norm_backward: grad [3] is not x [2, 3] without its last dim");
  EXPECT_LINEA_ERROR(raw::sq_norm_backward(Tensor(), randn({2, 3}), 1.0),
                     test::undefined_arg("sq_norm_backward", "grad"));
  EXPECT_LINEA_ERROR(raw::sq_norm_backward(randn({2}, f64()), randn({2, 3}), 1.0), "sq_norm_backward: dtype mismatch");
}

// ---- cross-entropy -----------------------------------------------------------------------------

// Per-row loss: lse - (1 - s) x[t] - s / C sum_c x[c]; 0 for ignored rows.
std::vector<double> naive_ce_rows(const std::vector<double>& x, const std::vector<int64_t>& t, int64_t C,
                                  int64_t ignore, double s) {
  std::vector<double> out(t.size());
  for (size_t i = 0; i < t.size(); ++i) {
    if (t[i] == ignore) {
      out[i] = 0;
      continue;
    }
    double m = -INFINITY, se = 0;
    for (int64_t c = 0; c < C; ++c) m = std::max(m, x[i * C + c]);
    for (int64_t c = 0; c < C; ++c) se += std::exp(x[i * C + c] - m);
    const double lse = m + std::log(se);
    // smoothed target distribution q = (1 - s) onehot + s / C: loss = -sum_c q_c log p_c
    double l = 0;
    for (int64_t c = 0; c < C; ++c) {
      const double q = (c == t[i] ? 1 - s : 0) + s / C;
      l -= q * (x[i * C + c] - lse);
    }
    out[i] = l;
  }
  return out;
}

TEST(CrossEntropy, MatchesNaiveFormula) {
  manual_seed(18);
  const int64_t N = 6, C = 5;
  Tensor x = mul(randn({N, C}, f64()), 2.0);
  const std::vector<int64_t> tv = {0, 4, 2, 2, 1, 3};
  Tensor t = from_vector<int64_t>(tv, {N});
  for (double s : {0.0, 0.1, 1.0}) {
    const auto ref = naive_ce_rows(x.to_vector<double>(), tv, C, -100, s);
    EXPECT_TRUE(all_close(cross_entropy(x, t, -100, s, Reduction::None), vec_tensor(ref, {N}), 1e-12, 1e-12));
    double total = 0;
    for (double v : ref) total += v;
    EXPECT_NEAR(cross_entropy(x, t, -100, s, Reduction::Sum).item(), total, 1e-12);
    EXPECT_NEAR(cross_entropy(x, t, -100, s).item(), total / N, 1e-12);
    // float32 on a transposed view.
    Tensor x32 = x.to(DType::Float32).t().contiguous().t();
    EXPECT_NEAR(cross_entropy(x32, t, -100, s).item(), total / N, 1e-5);
  }
  // Without smoothing, loss = -log_softmax(x)[t].
  const auto ls = log_softmax(x, 1).to_vector<double>();
  const auto rows = cross_entropy(x, t, -100, 0.0, Reduction::None).to_vector<double>();
  for (int64_t i = 0; i < N; ++i) EXPECT_NEAR(rows[i], -ls[i * C + tv[i]], 1e-12);
  // A single sample: logits [C], 0-d target.
  Tensor l1 = cross_entropy(x.select(0, 1), full({}, 4.0, TensorOptions(DType::Int64)));
  EXPECT_EQ(l1.dim(), 0);
  EXPECT_NEAR(l1.item(), rows[1], 1e-12);
  // Large, parallel path.
  Tensor big = mul(randn({500, 100}), 5.0);
  Tensor bt = randint(0, 100, {500});
  const auto bref = naive_ce_rows(big.to_vector<double>(), bt.to_vector<int64_t>(), 100, -100, 0.05);
  EXPECT_TRUE(all_close(cross_entropy(big, bt, -100, 0.05, Reduction::None), vec_tensor(bref, {500}), 1e-4, 1e-5));
}

TEST(CrossEntropy, IgnoreIndex) {
  manual_seed(19);
  const int64_t C = 4;
  Tensor x = randn({5, C}, f64());
  x.requires_grad_(true);
  const std::vector<int64_t> tv = {1, -100, 3, -100, 0};
  Tensor t = from_vector<int64_t>(tv, {5});
  const auto ref = naive_ce_rows(x.detach().to_vector<double>(), tv, C, -100, 0.1);
  Tensor rows = cross_entropy(x, t, -100, 0.1, Reduction::None);
  EXPECT_EQ(rows.to_vector<double>()[1], 0.0);
  EXPECT_EQ(rows.to_vector<double>()[3], 0.0);
  // The mean is over the 3 non-ignored rows.
  Tensor loss = cross_entropy(x, t, -100, 0.1);
  EXPECT_NEAR(loss.item(), (ref[0] + ref[2] + ref[4]) / 3, 1e-12);
  loss.backward();
  const auto g = x.grad().to_vector<double>();
  for (int64_t c = 0; c < C; ++c) {
    EXPECT_EQ(g[1 * C + c], 0.0);
    EXPECT_EQ(g[3 * C + c], 0.0);
  }
  double row0 = 0;
  for (int64_t c = 0; c < C; ++c) row0 += std::fabs(g[c]);
  EXPECT_GT(row0, 0.0);
  // All rows ignored: loss 0 (not NaN), gradient 0. No rows: 0.
  Tensor all_ignored = full({5}, -1.0, TensorOptions(DType::Int64));
  Tensor x2 = x.detach().requires_grad_(true);
  Tensor none = cross_entropy(x2, all_ignored, -1);
  EXPECT_EQ(none.item(), 0.0);
  none.backward();
  for (double v : x2.grad().to_vector<double>()) EXPECT_EQ(v, 0.0);
  EXPECT_EQ(cross_entropy(randn({0, C}, f64()), zeros({0}, TensorOptions(DType::Int64))).item(), 0.0);
}

// The plain summed cross-entropy beside a smoothed loss, from the one pass: the bits of
// cross_entropy(..., 0, Sum) for every reduction and smoothing, ignored rows left out, 3-d logits
// flattened, no rows; no gradient, and the loss's own gradient unchanged.
TEST(CrossEntropy, NllBesideTheLoss) {
  manual_seed(20);
  for (DType dt : {DType::Float32, DType::Float64}) {
    const Tensor x = mul(randn({2, 5, 7}, TensorOptions(dt)), 3.0);
    const Tensor t = from_vector<int64_t>({1, 0, 6, 3, 0, 2, 0, 5, 0, 4}, {2, 5});  // pad (ignore) 0
    const Tensor plain = cross_entropy(x, t, 0, 0.0, Reduction::Sum);
    for (double s : {0.0, 0.1, 1.0})
      for (Reduction red : {Reduction::Mean, Reduction::Sum, Reduction::None}) {
        SCOPED_TRACE(std::to_string(s) + " " + std::to_string(static_cast<int>(red)) + " " + dtype_name(dt));
        const Tensor xg = x.detach().requires_grad_(true), xr = x.detach().requires_grad_(true);
        Tensor nll;
        const Tensor loss = cross_entropy(xg, t, 0, s, red, &nll);
        ASSERT_TRUE(nll.defined());
        EXPECT_EQ(nll.dim(), 0);
        EXPECT_FALSE(nll.requires_grad());
        EXPECT_EQ(nll.item(), plain.item());
        const Tensor ref = cross_entropy(xr, t, 0, s, red);
        EXPECT_EQ(max(abs(loss - ref)).item(), 0.0);
        sum(loss).backward();
        sum(ref).backward();
        EXPECT_EQ(max(abs(xg.grad() - xr.grad())).item(), 0.0);
      }
  }
  Tensor nll;
  cross_entropy(randn({0, 3}), zeros({0}, TensorOptions(DType::Int64)), -100, 0.1, Reduction::Mean, &nll);
  EXPECT_EQ(nll.item(), 0.0);
}

// The mean's kernel: sum(loss) / count bit for bit, count the rows kept (at least 1); its input
// checked.
TEST(CrossEntropy, MeanKernel) {
  manual_seed(21);
  for (DType dt : {DType::Float32, DType::Float64}) {
    const Tensor loss = randn({1000}, TensorOptions(dt));
    std::vector<int64_t> tv(1000);
    for (size_t i = 0; i < tv.size(); ++i) tv[i] = i % 3 == 0 ? -100 : 1;
    const std::vector<Tensor> mc = raw::cross_entropy_mean(loss, from_vector<int64_t>(tv, {1000}), -100);
    EXPECT_EQ(mc[1].item(), 666.0);
    EXPECT_EQ(mc[0].item(), (sum(loss) / full({}, 666.0, TensorOptions(dt))).item());
    EXPECT_EQ(raw::cross_entropy_mean(loss, full({1000}, 4.0, TensorOptions(DType::Int64)), 4)[1].item(), 1.0);
  }
  const Tensor t = zeros({3}, TensorOptions(DType::Int64));
  EXPECT_LINEA_ERROR(
      raw::cross_entropy_mean(randn({3}), zeros({3}), 0),
      "cross_entropy_mean: expected loss [N] and an Int64 target [N], got loss [3] and target float32 [3]");
  EXPECT_LINEA_ERROR(raw::cross_entropy_mean(randn({4}), t, 0), "got loss [4] and target int64 [3]");
  EXPECT_LINEA_ERROR(raw::cross_entropy_mean(randn({3, 1}), t, 0), "got loss [3, 1]");
  EXPECT_LINEA_ERROR(raw::cross_entropy_mean(t, t, 0),
                     "cross_entropy_mean: expected loss to be float32 or float64, got int64");
  EXPECT_LINEA_ERROR(raw::cross_entropy_mean(Tensor(), t, 0), test::undefined_arg("cross_entropy_mean", "loss"));
  EXPECT_LINEA_ERROR(raw::cross_entropy_mean(randn({3}), Tensor(), 0),
                     test::undefined_arg("cross_entropy_mean", "target"));
}

// The per-row kernel and its backward (raw, for custom ops) check what cross_entropy checks before
// them, and the rest: logits with no classes, a gradient and lse of the logits' dtype, one per row.
TEST(CrossEntropy, RawRowsCheckTheirArguments) {
  const Tensor u, x = randn({3, 4}), t = tensor<int64_t>({0, 1, 2}, {3}),
                  i64 = zeros({3, 4}, TensorOptions(DType::Int64));
  EXPECT_LINEA_ERROR(raw::cross_entropy_rows(u, t, -100, 0.0, false), test::undefined_arg("cross_entropy", "logits"));
  EXPECT_LINEA_ERROR(raw::cross_entropy_rows(x, u, -100, 0.0, false), test::undefined_arg("cross_entropy", "target"));
  EXPECT_LINEA_ERROR(raw::cross_entropy_rows(i64, t, -100, 0.0, false),
                     "cross_entropy: expected logits to be float32 or float64, got int64");
  EXPECT_LINEA_ERROR(raw::cross_entropy_rows(randn({3}), t, -100, 0.0, false),
                     "cross_entropy: expected logits [N, C], got [3]");
  EXPECT_LINEA_ERROR(raw::cross_entropy_rows(x, zeros({3}, f64()), -100, 0.0, false),
                     "cross_entropy: expected target of dtype int64, got float64");
  EXPECT_LINEA_ERROR(raw::cross_entropy_rows(x, tensor<int64_t>({0, 1}, {2}), -100, 0.0, false),
                     "cross_entropy: target [2] does not match logits [3, 4] (expected [3])");
  EXPECT_LINEA_ERROR(raw::cross_entropy_rows(x, t, -100, -0.5, false),
                     "cross_entropy: label smoothing must be in [0, 1], got -0.5");
  // Rows of no classes, every target ignored: no class to take the softmax over.
  EXPECT_LINEA_ERROR(cross_entropy(randn({2, 0}), full({2}, -100.0, TensorOptions(DType::Int64))),
                     "cross_entropy: logits [2, 0] have no classes");

  const Tensor g = ones({3}), lse = zeros({3});
  const char* back = "cross_entropy_backward";
  EXPECT_LINEA_ERROR(raw::cross_entropy_rows_backward(g, randn({3}), t, lse, -100, 0.0),
                     "cross_entropy_backward: expected logits [N, C], got [3]");
  EXPECT_LINEA_ERROR(raw::cross_entropy_rows_backward(u, x, t, lse, -100, 0.0), test::undefined_arg(back, "grad"));
  EXPECT_LINEA_ERROR(raw::cross_entropy_rows_backward(ones({3}, f64()), x, t, lse, -100, 0.0),
                     "cross_entropy_backward: dtype mismatch: float64 (shape [3]) vs float32 (shape [3, 4])");
  EXPECT_LINEA_ERROR(raw::cross_entropy_rows_backward(g, x, t, zeros({3}, f64()), -100, 0.0),
                     "cross_entropy_backward: dtype mismatch: float64 (shape [3]) vs float32 (shape [3, 4])");
  EXPECT_LINEA_ERROR(raw::cross_entropy_rows_backward(ones({2}), x, t, lse, -100, 0.0),
                     "cross_entropy_backward: grad [2] and lse [3] must be [3]");
  EXPECT_LINEA_ERROR(raw::cross_entropy_rows_backward(g, x, t, zeros({3, 1}), -100, 0.0),
                     "cross_entropy_backward: grad [3] and lse [3, 1] must be [3]");
}

TEST(CrossEntropy, BadTargets) {
  Tensor x = randn({3, 4});
  EXPECT_LINEA_ERROR(cross_entropy(x, tensor<int64_t>({0, 4, 1}, {3})), "cross_entropy: target value 4");
  EXPECT_LINEA_ERROR(cross_entropy(x, tensor<int64_t>({0, -3, 1}, {3})), "target value -3");
  EXPECT_LINEA_ERROR(cross_entropy(x, tensor<int64_t>({0, 1}, {2})), "cross_entropy: target [2]");
  EXPECT_LINEA_ERROR(cross_entropy(x, zeros({3}, f64())), "int64");
  EXPECT_LINEA_ERROR(cross_entropy(x, zeros({3, 1}, TensorOptions(DType::Int64))), "cross_entropy");
  EXPECT_LINEA_ERROR(cross_entropy(randn({2, 3, 4}), zeros({2}, TensorOptions(DType::Int64))), "cross_entropy");
  EXPECT_LINEA_ERROR(cross_entropy(x, tensor<int64_t>({0, 1, 2}, {3}), -100, 1.5), "label smoothing");
  EXPECT_LINEA_ERROR(cross_entropy(randn({4}), tensor<int64_t>({1}, {1})), "0-d target");
}

TEST(LayerNormForward, AddLayerNormEqualsAddThenNorm) {
  // The fused residual sum and norm: the same bits as add, then layer_norm.
  for (DType dt : {DType::Float32, DType::Float64}) {
    const Tensor x = randn({3, 5, 40}).to(dt), r = randn({3, 5, 40}).to(dt), w = randn({40}).to(dt),
                 b = randn({40}).to(dt);
    auto [s, y] = add_layer_norm(x, r, {40}, w, b);
    EXPECT_TRUE(all_close(s, add(x, r), 0, 0));
    EXPECT_TRUE(all_close(y, layer_norm(add(x, r), {40}, w, b), 0, 0));
  }
  EXPECT_LINEA_ERROR(add_layer_norm(randn({3, 4}), randn({1, 4}), {4}), "the residual sum does not broadcast");
}

TEST(LayerNormForward, AddLayerNormWithDropoutEqualsDropoutAddThenNorm) {
  // The residual branch's dropout folded into the sum: the same draws and bits as dropout(r, p),
  // add, layer_norm, forward and backward; whether both outputs get a gradient or one only (the
  // op is one node of two outputs), with the dropout or without.
  for (DType dt : {DType::Float32, DType::Float64})
    for (double p : {0.3, 0.0})
      for (int used : {3, 1, 2}) {  // 1: the sum, 2: the norm, 3: both
        SCOPED_TRACE(std::string(dtype_name(dt)) + " p " + std::to_string(p) + " used " + std::to_string(used));
        const Tensor x0 = randn({3, 5, 40}).to(dt), r0 = randn({3, 5, 40}).to(dt), w = randn({40}).to(dt);
        const Tensor gs = randn({3, 5, 40}).to(dt), gy = randn({3, 5, 40}).to(dt);
        Tensor x = x0.detach(), r = r0.detach(), x2 = x0.detach(), r2 = r0.detach();
        Tensor w1 = w.detach(), w2 = w.detach();
        for (Tensor* t : {&x, &r, &x2, &r2, &w1, &w2}) t->requires_grad_(true);
        const auto loss = [used, &gs, &gy](const Tensor& s, const Tensor& y) {
          if (used == 1) return (s * gs).sum();
          if (used == 2) return (y * gy).sum();
          return (s * gs + y * gy).sum();
        };
        manual_seed(91);
        auto [s, y] = add_layer_norm(x, r, {40}, w1, Tensor(), 1e-5, p);
        EXPECT_EQ(s.grad_fn_name(), "add_layer_norm");
        loss(s, y).backward();
        manual_seed(91);
        const Tensor s2 = add(x2, p > 0 ? dropout(r2, p, true) : r2);
        const Tensor y2 = layer_norm(s2, {40}, w2);
        loss(s2, y2).backward();
        EXPECT_TRUE(all_close(s, s2, 0, 0));
        EXPECT_TRUE(all_close(y, y2, 0, 0));
        EXPECT_TRUE(all_close(x.grad(), x2.grad(), 0, 0));
        EXPECT_TRUE(all_close(r.grad(), r2.grad(), 0, 0));
        EXPECT_EQ(w1.grad().defined(), used != 1);
        if (used != 1) {
          EXPECT_TRUE(all_close(w1.grad(), w2.grad(), 0, 0));
        }
      }
}

TEST(LayerNormForward, AddLayerNormOfNothingEqualsAddThenNorm) {
  // No rows, or rows of no columns: the backward's own branch (layer_norm_backward's zeros, the
  // sum's gradient added, r's through the dropout) against the composed ops.
  for (const Shape& shape : {Shape{0, 40}, Shape{3, 0}})
    for (double p : {0.3, 0.0}) {
      SCOPED_TRACE(shape_str(shape) + " p " + std::to_string(p));
      const Shape norm{shape[1]};
      const Tensor w = randn(norm, f64()), b = randn(norm, f64()), gs = randn(shape, f64()), gy = randn(shape, f64());
      std::vector<std::vector<Tensor>> grads;
      for (int fused = 0; fused < 2; ++fused) {
        Tensor x = randn(shape, f64()).requires_grad_(true), r = randn(shape, f64()).requires_grad_(true);
        Tensor wl = w.detach().requires_grad_(true), bl = b.detach().requires_grad_(true);
        manual_seed(92);
        Tensor s, y;
        if (fused) {
          std::tie(s, y) = add_layer_norm(x, r, norm, wl, bl, 1e-5, p);
        } else {
          s = add(x, p > 0 ? dropout(r, p, true) : r);
          y = layer_norm(s, norm, wl, bl);
        }
        EXPECT_EQ(s.shape(), shape);
        EXPECT_EQ(y.shape(), shape);
        (s * gs + y * gy).sum().backward();
        grads.push_back({x.grad(), r.grad(), wl.grad(), bl.grad()});
      }
      for (size_t i = 0; i < grads[0].size(); ++i) {
        ASSERT_TRUE(grads[1][i].defined()) << i;
        EXPECT_EQ(grads[1][i].shape(), grads[0][i].shape()) << i;
        EXPECT_TRUE(all_close(grads[1][i], grads[0][i], 0, 0)) << i;
      }
      for (double v : grads[1][2].to_vector<double>()) EXPECT_EQ(v, 0.0);  // dw: a sum over no rows, or empty
    }
}

// ---- dropout -----------------------------------------------------------------------------------

TEST(Dropout, KeepRateAndScaling) {
  manual_seed(20);
  const int64_t n = 200000;
  Tensor x = add(rand({n}, f64()), 1.0);  // in [1, 2): never 0
  for (double p : {0.1, 0.5, 0.8}) {
    Tensor y = dropout(x, p, true);
    const auto xv = x.to_vector<double>(), yv = y.to_vector<double>();
    int64_t kept = 0;
    for (int64_t i = 0; i < n; ++i) {
      if (yv[i] != 0.0) {
        ++kept;
        ASSERT_NEAR(yv[i], xv[i] / (1 - p), 1e-12);
      }
    }
    const double rate = static_cast<double>(kept) / n;
    EXPECT_NEAR(rate, 1 - p, 5 * std::sqrt(p * (1 - p) / n)) << "p " << p;
  }
  // Evaluation mode and p == 0 are the identity; p == 1 gives zeros.
  EXPECT_TRUE(all_close(dropout(x, 0.5, false), x, 0, 0));
  EXPECT_TRUE(all_close(dropout(x, 0.0, true), x, 0, 0));
  EXPECT_TRUE(all_close(dropout(x, 1.0, true), zeros({n}, f64()), 0, 0));
  // The same seed gives the same mask.
  manual_seed(5);
  Tensor a = dropout(x, 0.3, true);
  manual_seed(5);
  EXPECT_TRUE(all_close(dropout(x, 0.3, true), a, 0, 0));
  EXPECT_LINEA_ERROR(dropout(x, 1.5, true), "dropout");
  EXPECT_LINEA_ERROR(dropout(x, -0.1, true), "dropout: probability p must be in [0, 1], got -0.1");
}

TEST(Dropout, FusedKernelEqualsTheComposedFormula) {
  // One kernel draws and applies the mask (and draws it again for the backward); the composed
  // bernoulli_per_example(1 - p) / (1 - p) times x, with the same generator state, gives the
  // same bits, forward and backward, inside a BatchRowsGuard too.
  for (DType dt : {DType::Float32, DType::Float64}) {
    for (double p : {0.1, 0.5}) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + " p " + std::to_string(p));
      const Tensor x0 = randn({5, 7, 3}).to(dt), g = randn({5, 7, 3}).to(dt);
      Tensor x = x0.detach();
      x.requires_grad_(true);
      BatchRowsGuard rows(11);
      manual_seed(77);
      const Tensor fused = dropout(x, p, true);
      fused.backward(g);
      manual_seed(77);
      const Tensor mask = bernoulli_per_example(x0.shape(), 1.0 - p, x0.options()) * (1.0 / (1.0 - p));
      EXPECT_TRUE(all_close(fused, x0 * mask, 0, 0));
      EXPECT_TRUE(all_close(x.grad(), g * mask, 0, 0));
    }
  }
}

TEST(Dropout, ActivationFoldedIntoItEqualsActivationThenDropout) {
  // activation_dropout: the activation and the dropout after it in one op; the same draws and bits
  // as act then dropout, forward and backward, inside a BatchRowsGuard too.
  for (DType dt : {DType::Float32, DType::Float64}) {
    for (UnaryOp act : {UnaryOp::GeluErf, UnaryOp::GeluTanh, UnaryOp::Relu}) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + " " + unary_op_name(act));
      const Tensor x0 = randn({4, 6, 33}).to(dt), g = randn({4, 6, 33}).to(dt);
      Tensor x = x0.detach(), x2 = x0.detach();
      x.requires_grad_(true);
      x2.requires_grad_(true);
      BatchRowsGuard rows(3);
      manual_seed(19);
      const Tensor fused = activation_dropout(x, act, 0.2, true);
      fused.backward(g);
      manual_seed(19);
      const Tensor a = act == UnaryOp::Relu ? relu(x2) : gelu(x2, act == UnaryOp::GeluTanh);
      const Tensor composed = dropout(a, 0.2, true);
      composed.backward(g);
      EXPECT_TRUE(all_close(fused, composed, 0, 0));
      EXPECT_TRUE(all_close(x.grad(), x2.grad(), 0, 0));
      // Off (eval or p = 0): the activation alone.
      EXPECT_TRUE(all_close(activation_dropout(x0, act, 0.2, false), a, 0, 0));
    }
  }
  EXPECT_LINEA_ERROR(activation_dropout(randn({2, 3}), UnaryOp::Sigmoid, 0.1, true),
                     "the activation must be gelu, gelu(tanh) or relu, got sigmoid");
  EXPECT_LINEA_ERROR(activation_dropout(randn({2, 3}), UnaryOp::Relu, 1.5, true), "p must be in [0, 1], got 1.5");
}

TEST(Dropout, FeedForwardFoldsItsDropoutIntoTheActivation) {
  // FeedForward in training runs activation_dropout: the same values as fc1, act, dropout, fc2.
  for (const char* name : {"gelu", "gelu_tanh", "relu"}) {
    SCOPED_TRACE(name);
    nn::FeedForward ff(12, 20, 0.25, name);
    const Tensor x = randn({3, 5, 12});
    manual_seed(8);
    const Tensor y = ff(x);
    manual_seed(8);
    const std::shared_ptr<nn::UnaryModule> act = nn::make_activation(name);
    const Tensor y2 = (*ff.fc2())(dropout((*act)((*ff.fc1())(x)), 0.25, true));
    EXPECT_TRUE(all_close(y, y2, 0, 0));
  }
}

}  // namespace
}  // namespace linea
