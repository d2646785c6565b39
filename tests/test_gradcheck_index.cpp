// Gradient checks (float64, central differences vs backward) of the indexing, joining,
// prefix-sum and real-FFT ops: index_select, embedding, embed_tokens, gather, scatter_add, cat,
// stack, split, chunk, cumsum, rfft, irfft. Each family includes a non-contiguous (transposed or
// sliced) input; the FFTs are checked for even and odd n, with padding (n > L) and truncation
// (n < L), and along a non-last dim. Forward values are in test_index_ops.cpp.
#include <vector>

#include "tests/test_util.h"

namespace linea::test {
namespace {

using Inputs = std::vector<Tensor>;

// A float64 leaf of `shape` sliced out of a wider tensor (non-contiguous along the last dim).
Tensor randn64_sliced(const Shape& shape) {
  Shape wide = shape;
  wide.back() = 2 * shape.back() + 1;
  Tensor base = randn(wide, f64());
  base.requires_grad_(true);
  return base.slice(-1, 1, wide.back(), 2);  // every other column: a differentiable view
}

// Complex product of two spectra [..., 2] (re, im).
Tensor cmul(const Tensor& a, const Tensor& b) {
  Tensor ar = a.select(-1, 0), ai = a.select(-1, 1), br = b.select(-1, 0), bi = b.select(-1, 1);
  return stack({ar * br - ai * bi, ar * bi + ai * br}, -1);
}

TEST(GradCheck, IndexSelect) {
  manual_seed(100);
  Tensor idx = tensor<int64_t>({3, 0, 3, 1}, {4});  // repeats: gradients accumulate
  Tensor x = randn64({4, 3, 2});
  for (int64_t dim : {0, -1}) {
    Tensor i = dim == 0 ? idx : tensor<int64_t>({1, 1, 0}, {3});
    EXPECT_GRADCHECK([&](const Inputs& in) { return index_select(in[0], dim, i); }, {x});
  }
  Tensor xt = randn64_transposed({5, 4});  // non-contiguous
  EXPECT_GRADCHECK([&](const Inputs& in) { return index_select(in[0], 1, idx); }, {xt});
  EXPECT_GRADCHECK([&](const Inputs& in) { return index_select(in[0], 0, tensor<int64_t>({4}, {})); }, {xt});
}

TEST(GradCheck, Embedding) {
  manual_seed(101);
  Tensor w = randn64({6, 3});
  Tensor idx = tensor<int64_t>({1, 4, 1, 0, 4, 4}, {2, 3});  // repeated indices
  EXPECT_GRADCHECK([&](const Inputs& in) { return embedding(in[0], idx); }, {w});
  Tensor ws = randn64_sliced({6, 3});  // non-contiguous weight
  EXPECT_GRADCHECK([&](const Inputs& in) { return embedding(in[0], idx); }, {ws});
  // the gradient of a repeated row is the sum of its uses
  Tensor w2 = randn64({6, 3});
  embedding(w2, idx).sum().backward();
  auto g = w2.grad().to_vector<double>();
  const double counts[6] = {1, 2, 0, 0, 3, 0};
  for (int64_t v = 0; v < 6; ++v)
    for (int64_t d = 0; d < 3; ++d) EXPECT_EQ(g[v * 3 + d], counts[v]) << "row " << v;
  // padding_idx: a padding row the batch does not use changes nothing; a used one gets no
  // gradient (by design not its derivative), the other rows theirs.
  EXPECT_GRADCHECK([&](const Inputs& in) { return embedding(in[0], idx, 2); }, {w});
  Tensor w3 = randn64({6, 3});
  embedding(w3, idx, 4).sum().backward();
  g = w3.grad().to_vector<double>();
  const double pad_counts[6] = {1, 2, 0, 0, 0, 0};
  for (int64_t v = 0; v < 6; ++v)
    for (int64_t d = 0; d < 3; ++d) EXPECT_EQ(g[v * 3 + d], pad_counts[v]) << "row " << v;
  EXPECT_EQ(max(abs(embedding(w3, idx, 4) - embedding(w3, idx))).item(), 0.0);  // the row itself forward
}

// The weight and a learned positions table, scaled, at an offset (rows 2..4 of 5) and from 0,
// with an unused padding row; non-contiguous leaves whose table is exactly the rows' length; one
// sequence (a 1-d index).
TEST(GradCheck, EmbedTokens) {
  manual_seed(104);
  Tensor w = randn64({6, 3}), pos = randn64({5, 3});
  Tensor idx = tensor<int64_t>({1, 4, 1, 0, 4, 4}, {2, 3});  // [B, L] = [2, 3], repeated indices
  for (int64_t offset : {0, 2})
    EXPECT_GRADCHECK([&](const Inputs& in) { return embed_tokens(in[0], idx, 1.7, in[1], offset); }, {w, pos});
  EXPECT_GRADCHECK([&](const Inputs& in) { return embed_tokens(in[0], idx, 0.5, in[1], 1, 2); }, {w, pos});
  Tensor ws = randn64_sliced({6, 3}), ps = randn64_sliced({3, 3});
  EXPECT_GRADCHECK([&](const Inputs& in) { return embed_tokens(in[0], idx, -2.0, in[1]); }, {ws, ps});
  EXPECT_GRADCHECK(
      [&](const Inputs& in) {
        return embed_tokens(in[0], tensor<int64_t>({2, 2, 5}, {3}), 3.0, in[1], 2);
      },
      {w, pos});
  EXPECT_GRADCHECK([&](const Inputs& in) { return embed_tokens(in[0], idx, 3.0, Tensor()); }, {w});
}

// One and two prefix rows and none; a non-contiguous x and positions.
TEST(GradCheck, PrependAndAddPositions) {
  manual_seed(105);
  const Tensor x = randn64({2, 3, 4});
  for (int64_t P : {1, 2})
    EXPECT_GRADCHECK([](const Inputs& in) { return prepend_and_add_positions(in[0], in[1], in[2]); },
                     {x, randn64({P, 4}), randn64({P + 3, 4})});
  EXPECT_GRADCHECK([](const Inputs& in) { return prepend_and_add_positions(in[0], Tensor(), in[1]); },
                   {x, randn64({3, 4})});
  EXPECT_GRADCHECK([](const Inputs& in) { return prepend_and_add_positions(in[0], in[1], in[2]); },
                   {randn64({2, 4, 3}).transpose(1, 2), randn64({1, 4}), randn64_transposed({4, 4})});
}

TEST(GradCheck, Gather) {
  manual_seed(102);
  Tensor x = randn64({3, 4});
  Tensor i1 = tensor<int64_t>({0, 3, 3, 1, 2, 2, 0, 0}, {2, 4});  // dim 1, smaller in dim 0
  EXPECT_GRADCHECK([&](const Inputs& in) { return gather(in[0], 1, i1); }, {x});
  Tensor i0 = tensor<int64_t>({2, 0, 1, 2, 2, 2, 0, 1, 1, 0}, {5, 2});  // dim 0, repeats
  EXPECT_GRADCHECK([&](const Inputs& in) { return gather(in[0], 0, i0); }, {x});
  Tensor xt = randn64_transposed({3, 4});  // non-contiguous
  EXPECT_GRADCHECK([&](const Inputs& in) { return gather(in[0], -1, i1); }, {xt});
}

TEST(GradCheck, ScatterAdd) {
  manual_seed(103);
  Tensor x = randn64({3, 4});
  Tensor src = randn64({3, 5});
  Tensor idx = tensor<int64_t>({0, 3, 3, 1, 0, 2, 2, 2, 1, 0, 3, 3, 3, 3, 3}, {3, 5});  // dim 1, repeats
  EXPECT_GRADCHECK([&](const Inputs& in) { return scatter_add(in[0], 1, idx, in[1]); }, {x, src});
  Tensor xt = randn64_transposed({3, 4});  // non-contiguous base and src
  Tensor st = randn64_transposed({2, 4});
  Tensor i0 = tensor<int64_t>({2, 0, 2, 1, 1, 1, 0, 2}, {2, 4});  // dim 0
  EXPECT_GRADCHECK([&](const Inputs& in) { return scatter_add(in[0], 0, i0, in[1]); }, {xt, st});
  // only src requires grad
  Tensor xc = randn({3, 4}, f64());
  EXPECT_GRADCHECK([&](const Inputs& in) { return scatter_add(in[0], 1, idx, in[1]); }, {xc, src});
}

TEST(GradCheck, Cat) {
  manual_seed(104);
  Tensor a = randn64({2, 3});
  Tensor b = randn64_transposed({2, 1});  // non-contiguous
  Tensor c = randn64_sliced({2, 2});
  EXPECT_GRADCHECK([](const Inputs& in) { return cat({in[0], in[1], in[2]}, 1); }, {a, b, c});
  Tensor d = randn64({1, 3});
  Tensor e = randn({3, 3}, f64());  // no grad: its slot gets nothing
  EXPECT_GRADCHECK([](const Inputs& in) { return cat({in[0], in[1], in[2]}, -2); }, {a, e, d});
  // the same tensor twice
  EXPECT_GRADCHECK([](const Inputs& in) { return cat({in[0], in[0]}, 0); }, {a});
}

TEST(GradCheck, Pad) {
  manual_seed(109);
  Tensor a = randn64({2, 3});
  Tensor b = randn64_transposed({3, 2});  // non-contiguous
  for (int64_t dim : {0, 1, -1}) {
    EXPECT_GRADCHECK([&](const Inputs& in) { return pad(in[0], dim, 2, 1, 0.5); }, {a});
    EXPECT_GRADCHECK([&](const Inputs& in) { return pad(in[0], dim, 0, 3); }, {b});
  }
  EXPECT_GRADCHECK([](const Inputs& in) { return pad(in[0], 1, 0, 0); }, {a});
}

TEST(GradCheck, Stack) {
  manual_seed(105);
  Tensor a = randn64({2, 3});
  Tensor b = randn64_transposed({2, 3});  // non-contiguous
  for (int64_t dim : {0, 1, 2, -1})
    EXPECT_GRADCHECK([&](const Inputs& in) { return stack({in[0], in[1]}, dim); }, {a, b});
}

TEST(GradCheck, Split) {
  manual_seed(106);
  Tensor x = randn64_transposed({3, 7});  // non-contiguous
  // pieces recombined in reverse order with distinct weights, so each piece's gradient is checked
  EXPECT_GRADCHECK(
      [](const Inputs& in) {
        auto p = split(in[0], 3, 1);  // 3, 3, 1
        return cat({p[2] * 3.0, p[1] * 2.0, p[0]}, 1);
      },
      {x});
  EXPECT_GRADCHECK(
      [](const Inputs& in) {
        auto p = split(in[0], std::vector<int64_t>{1, 2}, 0);
        return cat({p[1] * -1.5, p[0] * 0.5}, 0);
      },
      {x});
}

TEST(GradCheck, Chunk) {
  manual_seed(107);
  Tensor x = randn64_sliced({2, 7});  // non-contiguous
  EXPECT_GRADCHECK(
      [](const Inputs& in) {
        auto p = chunk(in[0], 3, -1);  // 3, 3, 1: the last piece is smaller
        return cat({p[2] * 3.0, p[0] * -1.0, p[1] * 2.0}, 1);
      },
      {x});
  // an unused piece gets a zero gradient
  EXPECT_GRADCHECK([](const Inputs& in) { return chunk(in[0], 2, 0)[1] * 2.0; }, {x});
}

TEST(GradCheck, Cumsum) {
  manual_seed(108);
  Tensor x = randn64({3, 4, 2});
  for (int64_t dim : {0, 1, -1}) EXPECT_GRADCHECK([&](const Inputs& in) { return cumsum(in[0], dim); }, {x});
  Tensor xt = randn64_transposed({4, 5});  // non-contiguous
  EXPECT_GRADCHECK([](const Inputs& in) { return cumsum(in[0], 0); }, {xt});
  EXPECT_GRADCHECK([](const Inputs& in) { return cumsum(in[0], 1); }, {xt});
}

TEST(GradCheck, Rfft) {
  manual_seed(109);
  Tensor x = randn64({2, 6});
  // even/odd n; n == L, n > L (padding), n < L (truncation)
  for (int64_t n : {6, 7, 8, 9, 4, 5, 1, 2}) {
    EXPECT_GRADCHECK([&](const Inputs& in) { return rfft(in[0], n, -1); }, {x}) << "n=" << n;
  }
  // non-last dim of a non-contiguous input
  Tensor xt = randn64_transposed({5, 3});  // [5, 3], transform along dim 0 (L = 5)
  for (int64_t n : {5, 6, 3, 8})
    EXPECT_GRADCHECK([&](const Inputs& in) { return rfft(in[0], n, 0); }, {xt}) << "n=" << n;
  Tensor x3 = randn64_sliced({2, 4, 3});
  EXPECT_GRADCHECK([](const Inputs& in) { return rfft(in[0], 7, 1); }, {x3});
}

TEST(GradCheck, Irfft) {
  manual_seed(110);
  for (int64_t n : {6, 7, 1, 2}) {
    const int64_t F = n / 2 + 1;
    Tensor spec = randn64({3, F, 2});
    EXPECT_GRADCHECK([&](const Inputs& in) { return irfft(in[0], n, -1); }, {spec}) << "n=" << n;
  }
  // non-last dim of a non-contiguous spectrum: [F, 2 (batch), 2 (re, im)] from a permuted tensor
  for (int64_t n : {8, 9}) {
    const int64_t F = n / 2 + 1;
    Tensor base = randn({2, F, 2}, f64());
    base.requires_grad_(true);
    Tensor spec = base.permute({1, 0, 2});  // [F, 2, 2], non-contiguous
    ASSERT_FALSE(spec.is_contiguous());
    EXPECT_GRADCHECK([&](const Inputs& in) { return irfft(in[0], n, 0); }, {spec}) << "n=" << n;
  }
}

TEST(GradCheck, RfftIrfftRoundTrip) {
  manual_seed(111);
  // irfft(rfft(x, n), n): padding then truncating back, even and odd n
  Tensor x = randn64_transposed({2, 5});
  for (int64_t n : {5, 8, 9, 3}) {
    EXPECT_GRADCHECK([&](const Inputs& in) { return irfft(rfft(in[0], n, -1), n, -1); }, {x}) << "n=" << n;
  }
  // the attention layer's use: a Toeplitz-style circular convolution through the spectrum,
  // differentiated with respect to both the signal and the kernel
  Tensor sig = randn64({3, 6});
  Tensor ker = randn64_sliced({1, 11});
  for (int64_t n : {11, 12}) {
    EXPECT_GRADCHECK(
        [&](const Inputs& in) { return irfft(cmul(rfft(in[0], n, -1), rfft(in[1], n, -1)), n, -1).narrow(-1, 0, 6); },
        {sig, ker})
        << "n=" << n;
  }
}

}  // namespace
}  // namespace linea::test
