// The nn layers' forward values against naive loops (Linear, Embedding, LayerNorm, PatchEmbed token
// order, positional tables), initialization (FeedForward's and the learned positions' too), Dropout
// modes (p = 1 included), parameter counts, module tree printing, state_dict names, transformer
// blocks' masking behaviour and their training dropout (each residual branch's, layers and stacks,
// against the pre-LN formulas written out), losses, and the errors for wrong input shapes, unknown
// attention specs and a decoding state of another depth.
// Not here: gradient checks (tests/test_gradcheck_layers.cpp), attention values
// (tests/test_attention_softmax.cpp).
#include <cmath>
#include <functional>
#include <set>
#include <vector>

#include "attention/softmax/softmax.h"
#include "attention/transformer.h"
#include "nn/init.h"
#include "nn/layers.h"
#include "nn/loss.h"
#include "tests/test_util.h"

namespace linea {
namespace {

using test::all_close;
using test::f64;

void set_(Tensor t, const Tensor& v) {
  NoGradGuard ng;
  t.copy_(v);
}

std::vector<std::string> keys(const nn::Module& m) {
  std::vector<std::string> out;
  for (auto& [k, _] : m.state_dict()) out.push_back(k);
  return out;
}

// ---- init -------------------------------------------------------------------------------------
TEST(Init, TruncNormalIsBoundedDeterministicAndHasTheRightSpread) {
  manual_seed(1);
  Tensor a = empty({200, 100});
  nn::init::trunc_normal_(a);
  manual_seed(1);
  Tensor b = empty({200, 100}, f64());
  nn::init::trunc_normal_(b);
  EXPECT_TRUE(all_close(a, b.to(DType::Float32), 0, 0));  // same draws whatever the dtype
  auto v = b.to_vector<double>();
  double s = 0, s2 = 0, mx = 0;
  for (double x : v) {
    s += x;
    s2 += x * x;
    mx = std::max(mx, std::fabs(x));
  }
  const double n = static_cast<double>(v.size()), mean = s / n, sd = std::sqrt(s2 / n - mean * mean);
  EXPECT_LE(mx, 0.04);
  EXPECT_GT(mx, 0.035);  // the tails are reached
  EXPECT_NEAR(mean, 0.0, 5e-4);
  // Std of N(0, 1) truncated to [-2, 2] is 0.8796; times 0.02.
  EXPECT_NEAR(sd, 0.02 * 0.8796, 4e-4);
  // Other bounds and a mean shift.
  Tensor c = empty({1000}, f64());
  nn::init::trunc_normal_(c, 1.0, 5.0, -1.0, 0.5);
  for (double x : c.to_vector<double>()) {
    EXPECT_GE(x, 4.0);
    EXPECT_LE(x, 5.5);
  }
  EXPECT_LINEA_ERROR(nn::init::trunc_normal_(c, 1.0, 0.0, 1.0, -1.0), "empty interval");
  EXPECT_LINEA_ERROR(nn::init::trunc_normal_(c, 1.0, 0.0, 8.0, 9.0), "too small to sample");
  EXPECT_LINEA_ERROR(nn::init::trunc_normal_(c, 1.0, 0.0, 3.0, 3.2), "too small to sample");  // 6.6e-4 < 1e-3
  nn::init::trunc_normal_(c, 1.0, 0.0, -3.0, -2.5);                                           // 4.9e-3: drawn
  for (double x : c.to_vector<double>()) EXPECT_TRUE(x >= -3.0 && x <= -2.5) << x;
  EXPECT_LINEA_ERROR(nn::init::trunc_normal_(zeros({2}, TensorOptions(DType::Int64))), "expected a floating tensor");
}

TEST(Init, FillsAndUniformBounds) {
  Tensor t = empty({30, 20});
  nn::init::ones_(t);
  for (double x : t.to_vector<double>()) EXPECT_EQ(x, 1.0);
  nn::init::zeros_(t);
  for (double x : t.to_vector<double>()) EXPECT_EQ(x, 0.0);
  nn::init::constant_(t, 2.5);
  for (double x : t.to_vector<double>()) EXPECT_EQ(x, 2.5);
  EXPECT_EQ(nn::init::fan_in_out(t), std::make_pair(int64_t{20}, int64_t{30}));
  EXPECT_EQ(nn::init::fan_in_out(empty({4, 3, 2, 2})), std::make_pair(int64_t{12}, int64_t{16}));
  nn::init::xavier_uniform_(t);
  const double xb = std::sqrt(6.0 / 50.0);
  double mx = 0;
  for (double x : t.to_vector<double>()) mx = std::max(mx, std::fabs(x));
  EXPECT_LE(mx, xb);
  EXPECT_GT(mx, 0.8 * xb);
  nn::init::kaiming_uniform_(t);
  const double kb = std::sqrt(6.0 / 20.0);
  mx = 0;
  for (double x : t.to_vector<double>()) mx = std::max(mx, std::fabs(x));
  EXPECT_LE(mx, kb);
  EXPECT_GT(mx, 0.8 * kb);
  // A gain scales xavier's bound; a 1-d tensor of n has fan_in = fan_out = n.
  const auto max_abs = [](const Tensor& x) {
    double m = 0;
    for (double v : x.to_vector<double>()) m = std::max(m, std::fabs(v));
    return m;
  };
  nn::init::xavier_uniform_(t, 3.0);
  EXPECT_LE(max_abs(t), 3.0 * xb);
  EXPECT_GT(max_abs(t), 0.8 * 3.0 * xb);
  EXPECT_EQ(nn::init::fan_in_out(empty({40})), std::make_pair(int64_t{40}, int64_t{40}));
  Tensor row = empty({400});
  nn::init::xavier_uniform_(row);
  EXPECT_LE(max_abs(row), std::sqrt(6.0 / 800.0));
  EXPECT_GT(max_abs(row), 0.8 * std::sqrt(6.0 / 800.0));
  EXPECT_LINEA_ERROR(nn::init::uniform_(t, 1.0, 0.0), "init::uniform_: invalid range [1, 0)");
  EXPECT_LINEA_ERROR(nn::init::uniform_(t, 0.0, INFINITY), "init::uniform_: invalid range");
  EXPECT_LINEA_ERROR(nn::init::normal_(t, 0.0, -1.0), "init::normal_: invalid mean 0 / std -1");
  EXPECT_LINEA_ERROR(nn::init::xavier_uniform_(empty({0, 0})), "init::xavier_uniform_: zero fans for shape [0, 0]");
  EXPECT_LINEA_ERROR(nn::init::kaiming_uniform_(empty({3, 0})), "init::kaiming_uniform_: zero fan_in for shape [3, 0]");
}

// The scaled embedding: N(0, dim^-1/2) drawn as normal_ draws it, the padding row zero after.
TEST(Init, ScaledEmbeddingIsNormalOverSqrtDimWithAZeroPaddingRow) {
  Tensor t = empty({200, 64}), want = empty({200, 64});
  manual_seed(3);
  nn::init::scaled_embedding_(t, 7);
  manual_seed(3);
  nn::init::normal_(want, 0.0, 0.125);
  want.narrow(0, 7, 1).fill_(0.0);
  EXPECT_TRUE(all_close(t, want, 0, 0));
  const std::vector<float> v = t.to_vector<float>();
  double sq = 0;
  for (float x : v) sq += double(x) * x;
  EXPECT_NEAR(std::sqrt(sq / (199 * 64)), 0.125, 0.005);
  manual_seed(3);
  nn::init::scaled_embedding_(t);  // no padding row
  EXPECT_GT(sum(abs(t.narrow(0, 7, 1))).item(), 0.0);
  EXPECT_LINEA_ERROR(nn::init::scaled_embedding_(empty({64})),
                     "init::scaled_embedding_: expected a table [num, dim], got [64]");
  EXPECT_LINEA_ERROR(nn::init::scaled_embedding_(t, 200),
                     "init::scaled_embedding_: padding_idx 200 is outside the table's 200 rows");
  EXPECT_LINEA_ERROR(nn::init::scaled_embedding_(t, -2), "padding_idx -2");
}

// ---- Linear -----------------------------------------------------------------------------------
// Every initializer names itself for an undefined or integer tensor and a bad distribution.
TEST(Init, BadTargetsAndDistributionsAreNamed) {
  const Tensor none, ints = zeros({2, 2}, TensorOptions(DType::Int64));
  const std::vector<std::pair<std::string, std::function<void(const Tensor&)>>> inits = {
      {"init::constant_", [](const Tensor& t) { nn::init::constant_(t, 1.0); }},
      {"init::uniform_", [](const Tensor& t) { nn::init::uniform_(t, 0.0, 1.0); }},
      {"init::normal_", [](const Tensor& t) { nn::init::normal_(t, 0.0, 1.0); }},
      {"init::trunc_normal_", [](const Tensor& t) { nn::init::trunc_normal_(t, 1.0); }},
      {"init::xavier_uniform_", [](const Tensor& t) { nn::init::xavier_uniform_(t); }},
      {"init::kaiming_uniform_", [](const Tensor& t) { nn::init::kaiming_uniform_(t); }},
      {"init::scaled_embedding_", [](const Tensor& t) { nn::init::scaled_embedding_(t); }}};
  for (const auto& [op, init] : inits) {
    EXPECT_LINEA_ERROR(init(none), op + ": tensor is undefined");
    EXPECT_LINEA_ERROR(init(ints), op + ": expected a floating tensor, got int64 (shape [2, 2])");
  }
  const Tensor t = empty({4, 3});
  EXPECT_LINEA_ERROR(nn::init::trunc_normal_(t, -1.0), "init::trunc_normal_: invalid mean 0 / std -1");
  EXPECT_LINEA_ERROR(nn::init::trunc_normal_(t, 1.0, NAN), "init::trunc_normal_: invalid mean nan / std 1");
  EXPECT_LINEA_ERROR(nn::init::normal_(t, INFINITY, 1.0), "init::normal_: invalid mean inf / std 1");
  EXPECT_LINEA_ERROR(nn::init::fan_in_out(none),
                     "init: fan_in/fan_out need a tensor with at least one dim, got undefined");
  EXPECT_LINEA_ERROR(nn::init::fan_in_out(scalar_tensor(1.0)),
                     "init: fan_in/fan_out need a tensor with at least one dim, got []");
  EXPECT_LINEA_ERROR(nn::init::xavier_uniform_(scalar_tensor(1.0)), "init: fan_in/fan_out need a tensor");
}

TEST(Linear, ValuesMatchNaiveWithWeightOutIn) {
  manual_seed(2);
  auto lin = std::make_shared<nn::Linear>(3, 2);
  EXPECT_EQ(lin->weight().shape(), Shape({2, 3}));  // [out, in], as PyTorch
  EXPECT_EQ(lin->bias().shape(), Shape({2}));
  set_(lin->weight(), tensor<float>({1, 2, 3, 4, 5, 6}, {2, 3}));
  set_(lin->bias(), tensor<float>({0.5f, -1}, {2}));
  Tensor x = tensor<float>({1, 0, -1, 2, 1, 0}, {2, 3});
  // y[i][o] = sum_j x[i][j] * W[o][j] + b[o]
  EXPECT_TRUE(all_close(lin->forward(x), tensor<float>({-1.5f, -3, 4.5f, 12}, {2, 2}), 0, 0));
  // Any leading dims: [2, 2, 3] -> [2, 2, 2], row by row the same.
  manual_seed(3);
  Tensor x3 = randn({2, 2, 3});
  Tensor y3 = (*lin)(x3);
  EXPECT_EQ(y3.shape(), Shape({2, 2, 2}));
  EXPECT_TRUE(all_close(y3.select(0, 1), lin->forward(x3.select(0, 1)), 1e-6, 1e-6));
  auto wv = lin->weight().to_vector<double>();
  auto xv = x3.to_vector<double>();
  auto yv = y3.to_vector<double>();
  for (int r = 0; r < 4; ++r)
    for (int o = 0; o < 2; ++o) {
      double ref = o == 0 ? 0.5 : -1.0;
      for (int j = 0; j < 3; ++j) ref += xv[r * 3 + j] * wv[o * 3 + j];
      EXPECT_NEAR(yv[r * 2 + o], ref, 1e-5);
    }
  // No bias.
  auto nob = std::make_shared<nn::Linear>(3, 2, false);
  EXPECT_FALSE(nob->bias().defined());
  EXPECT_EQ(nob->named_parameters().size(), 1u);
  set_(nob->weight(), tensor<float>({1, 2, 3, 4, 5, 6}, {2, 3}));
  EXPECT_TRUE(all_close(nob->forward(x), tensor<float>({-2, -2, 4, 13}, {2, 2}), 0, 0));
}

TEST(Linear, DefaultInitIsPyTorchsAndSeeded) {
  manual_seed(4);
  auto a = std::make_shared<nn::Linear>(16, 8);
  manual_seed(4);
  auto b = std::make_shared<nn::Linear>(16, 8);
  EXPECT_TRUE(all_close(a->weight(), b->weight(), 0, 0));
  EXPECT_TRUE(all_close(a->bias(), b->bias(), 0, 0));
  for (const Tensor& t : {a->weight(), a->bias()})
    for (double x : t.to_vector<double>()) EXPECT_LE(std::fabs(x), 0.25);  // 1/sqrt(16)
  a->reset_parameters_trunc_normal();
  for (double x : a->weight().to_vector<double>()) EXPECT_LE(std::fabs(x), 0.04);
  for (double x : a->bias().to_vector<double>()) EXPECT_EQ(x, 0.0);
  // FeedForward's two layers start so too.
  nn::FeedForward ff(16, 32);
  for (const auto& [name, t] : ff.named_parameters())
    for (double x : t.to_vector<double>()) {
      if (name.find("bias") != std::string::npos) EXPECT_EQ(x, 0.0) << name;
      EXPECT_LE(std::fabs(x), 0.04) << name;
    }
}

// ---- Embedding --------------------------------------------------------------------------------
TEST(Embedding, LooksUpRows) {
  manual_seed(5);
  auto emb = std::make_shared<nn::Embedding>(6, 3);
  Tensor idx = tensor<int64_t>({5, 0, 2, 2}, {2, 2});
  Tensor out = emb->forward(idx);
  EXPECT_EQ(out.shape(), Shape({2, 2, 3}));
  EXPECT_TRUE(all_close(out.select(0, 0).select(0, 0), emb->weight().select(0, 5), 0, 0));
  EXPECT_TRUE(all_close(out.select(0, 1).select(0, 1), emb->weight().select(0, 2), 0, 0));
  for (double x : emb->weight().to_vector<double>()) EXPECT_LE(std::fabs(x), 0.04);
}

TEST(Embedding, PaddingIdxRowStartsAtZeroAndGetsNoGradient) {
  manual_seed(6);
  auto emb = std::make_shared<nn::Embedding>(6, 3, /*padding_idx=*/2);
  EXPECT_TRUE(all_close(emb->weight().select(0, 2), zeros({3}), 0, 0));
  // The output at a padding position is still the row itself (PyTorch), here made non-zero.
  set_(emb->weight().narrow(0, 2, 1), full({1, 3}, 0.7));
  Tensor idx = tensor<int64_t>({2, 1, 2, 4, 1, 2}, {2, 3});
  Tensor out = emb->forward(idx);
  EXPECT_TRUE(all_close(out.select(0, 0).select(0, 0), full({3}, 0.7), 0, 0));
  Tensor g = randn({2, 3, 3});
  sum(out * g).backward();
  Tensor grad = emb->weight().grad();
  ASSERT_TRUE(grad.defined());
  EXPECT_TRUE(all_close(grad.select(0, 2), zeros({3}), 0, 0));  // padding row: no gradient
  // Row 1 is used twice: its gradient is the sum of the two output gradients.
  EXPECT_TRUE(all_close(grad.select(0, 1), g.select(0, 0).select(0, 1) + g.select(0, 1).select(0, 1), 1e-6, 1e-6));
  EXPECT_TRUE(all_close(grad.select(0, 4), g.select(0, 1).select(0, 0), 1e-6, 1e-6));
  EXPECT_TRUE(all_close(grad.select(0, 0), zeros({3}), 0, 0));  // unused
  EXPECT_EQ(emb->str(), "Embedding(6, 3, padding_idx=2)");
}

TEST(Embedding, BadInputsThrow) {
  auto emb = std::make_shared<nn::Embedding>(4, 2);
  EXPECT_LINEA_ERROR(emb->forward(zeros({3})), "Embedding: index must be int64");
  EXPECT_THROW(emb->forward(tensor<int64_t>({4}, {1})), Error);  // out of range
  EXPECT_LINEA_ERROR(std::make_shared<nn::Embedding>(4, 2, 4), "padding_idx 4 out of range");
}

// ---- LayerNorm --------------------------------------------------------------------------------
TEST(LayerNorm, ValuesMatchNaive) {
  manual_seed(7);
  auto ln = std::make_shared<nn::LayerNorm>(4, 1e-5);
  set_(ln->weight(), tensor<float>({1, 2, 0.5f, -1}, {4}));
  set_(ln->bias(), tensor<float>({0, 1, 0, 2}, {4}));
  Tensor x = randn({3, 4});
  auto xv = x.to_vector<double>();
  std::vector<double> ref(12);
  const double w[4] = {1, 2, 0.5, -1}, b[4] = {0, 1, 0, 2};
  for (int r = 0; r < 3; ++r) {
    double m = 0, v = 0;
    for (int j = 0; j < 4; ++j) m += xv[r * 4 + j] / 4;
    for (int j = 0; j < 4; ++j) v += (xv[r * 4 + j] - m) * (xv[r * 4 + j] - m) / 4;
    for (int j = 0; j < 4; ++j) ref[r * 4 + j] = (xv[r * 4 + j] - m) / std::sqrt(v + 1e-5) * w[j] + b[j];
  }
  EXPECT_TRUE(all_close(ln->forward(x), from_vector<double>(ref, {3, 4}, TensorOptions()), 1e-5, 1e-5));
  auto fresh = std::make_shared<nn::LayerNorm>(Shape{2, 3});
  EXPECT_TRUE(all_close(fresh->weight(), ones({2, 3}), 0, 0));
  EXPECT_TRUE(all_close(fresh->bias(), zeros({2, 3}), 0, 0));
  EXPECT_EQ(fresh->forward(randn({5, 2, 3})).shape(), Shape({5, 2, 3}));
  EXPECT_EQ(std::make_shared<nn::LayerNorm>(4, 1e-5, false)->num_parameters(), 0);
}

// ---- PatchEmbed -------------------------------------------------------------------------------
TEST(PatchEmbed, TokensAreRowMajorPatchesLikeANaiveLoop) {
  manual_seed(8);
  const int64_t B = 2, C = 3, S = 6, p = 2, dim = 5, n = S / p;
  auto pe = std::make_shared<nn::PatchEmbed>(S, p, C, dim);
  pe->to(DType::Float64);
  EXPECT_EQ(pe->num_patches(), 9);
  EXPECT_EQ(pe->proj()->weight().shape(), Shape({dim, C * p * p}));
  Tensor img = randn({B, C, S, S}, f64());
  Tensor out = pe->forward(img);
  ASSERT_EQ(out.shape(), Shape({B, n * n, dim}));
  auto iv = img.to_vector<double>(), wv = pe->proj()->weight().to_vector<double>(),
       bv = pe->proj()->bias().to_vector<double>(), ov = out.to_vector<double>();
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < n; ++j) {
        // Patch (i, j) is token i * n + j; its vector is ordered (c, y, x), as a Conv2d weight.
        std::vector<double> vec;
        for (int64_t c = 0; c < C; ++c)
          for (int64_t y = 0; y < p; ++y)
            for (int64_t x = 0; x < p; ++x) vec.push_back(iv[((b * C + c) * S + i * p + y) * S + j * p + x]);
        for (int64_t o = 0; o < dim; ++o) {
          double ref = bv[o];
          for (size_t t = 0; t < vec.size(); ++t) ref += wv[o * C * p * p + t] * vec[t];
          EXPECT_NEAR(ov[(b * n * n + i * n + j) * dim + o], ref, 1e-12) << b << " " << i << " " << j << " " << o;
        }
      }
}

TEST(PatchEmbed, BadInputsThrow) {
  auto pe = std::make_shared<nn::PatchEmbed>(8, 4, 1, 6);
  EXPECT_LINEA_ERROR(pe->forward(zeros({2, 8, 8})), "PatchEmbed: expected images [B, 1, 8, 8], got [2, 8, 8]");
  EXPECT_LINEA_ERROR(pe->forward(zeros({2, 3, 8, 8})), "got [2, 3, 8, 8]");
  EXPECT_LINEA_ERROR(pe->forward(zeros({2, 1, 8, 12})), "got [2, 1, 8, 12]");
  EXPECT_LINEA_ERROR(std::make_shared<nn::PatchEmbed>(10, 4, 1, 6), "image_size 10 is not divisible by patch_size 4");
}

// ---- positional embeddings --------------------------------------------------------------------
TEST(PositionalEmbedding, SinusoidalTableHasVaswaniValues) {
  auto pe = std::make_shared<nn::SinusoidalPositionalEmbedding>(50, 8);
  EXPECT_TRUE(pe->parameters().empty());
  EXPECT_EQ(keys(*pe), std::vector<std::string>{"pe"});
  auto t = pe->table().to_vector<double>();
  for (int pos : {0, 1, 7, 49})
    for (int i = 0; i < 4; ++i) {
      const double angle = pos / std::pow(10000.0, 2.0 * i / 8.0);
      EXPECT_NEAR(t[pos * 8 + 2 * i], std::sin(angle), 1e-6);
      EXPECT_NEAR(t[pos * 8 + 2 * i + 1], std::cos(angle), 1e-6);
    }
  EXPECT_NEAR(t[1 * 8 + 0], std::sin(1.0), 1e-7);  // pos 1, i = 0: sin(1)
  // forward adds rows offset .. offset + L.
  Tensor x = randn({2, 3, 8});
  EXPECT_TRUE(all_close(pe->forward(x, 5), x + pe->table().narrow(0, 5, 3), 0, 0));
  // An odd dim: the last column is a sine.
  auto odd = std::make_shared<nn::SinusoidalPositionalEmbedding>(4, 5);
  EXPECT_NEAR(odd->table().to_vector<double>()[3 * 5 + 4], std::sin(3.0 / std::pow(10000.0, 4.0 / 5.0)), 1e-6);
}

TEST(PositionalEmbedding, LearnedAddsRowsAndChecksLength) {
  manual_seed(9);
  auto pe = std::make_shared<nn::LearnedPositionalEmbedding>(6, 4);
  EXPECT_EQ(pe->num_parameters(), 24);
  for (double w : pe->weight().to_vector<double>()) EXPECT_LE(std::fabs(w), 0.04);  // trunc normal, std 0.02
  Tensor x = randn({2, 4, 4});
  EXPECT_TRUE(all_close(pe->forward(x), x + pe->weight().narrow(0, 0, 4), 0, 0));
  EXPECT_TRUE(all_close(pe->forward(x, 2), x + pe->weight().narrow(0, 2, 4), 0, 0));
  EXPECT_LINEA_ERROR(pe->forward(x, 3), "positions [3, 7) exceed max_len 6");
  EXPECT_LINEA_ERROR(pe->forward(randn({2, 4, 5})), "expected input [B, L, 4], got [2, 4, 5]");
  auto sin = std::make_shared<nn::SinusoidalPositionalEmbedding>(3, 4);
  EXPECT_LINEA_ERROR(sin->forward(x), "SinusoidalPositionalEmbedding: positions [0, 4) exceed max_len 3");
}

// ---- Dropout and activations ------------------------------------------------------------------
TEST(Dropout, TrainVersusEval) {
  manual_seed(10);
  auto drop = std::make_shared<nn::Dropout>(0.25);
  Tensor x = ones({4000});
  EXPECT_TRUE(drop->is_training());
  auto v = drop->forward(x).to_vector<double>();
  int zeros_n = 0;
  for (double y : v) {
    EXPECT_TRUE(y == 0.0 || std::fabs(y - 1.0 / 0.75) < 1e-6) << y;
    zeros_n += y == 0.0;
  }
  EXPECT_NEAR(zeros_n / 4000.0, 0.25, 0.04);
  drop->eval();
  EXPECT_TRUE(all_close(drop->forward(x), x, 0, 0));
  // eval() reaches nested dropouts.
  auto ff = std::make_shared<nn::FeedForward>(4, 8, 0.5);
  ff->eval();
  Tensor in = randn({3, 4});
  EXPECT_TRUE(all_close(ff->forward(in), ff->forward(in), 0, 0));
  ff->train();
  EXPECT_FALSE(all_close(ff->forward(in), ff->forward(in), 1e-7, 0));
  EXPECT_LINEA_ERROR(std::make_shared<nn::Dropout>(1.5), "Dropout: probability p must be in [0, 1], got 1.5");
  // p = 1 drops everything (as PyTorch), with a zero gradient.
  Tensor x1 = randn({3, 5}).requires_grad_(true);
  Tensor dropped = nn::Dropout(1.0).forward(x1);
  EXPECT_TRUE(all_close(dropped, zeros({3, 5}), 0, 0));
  sum(dropped).backward();
  EXPECT_TRUE(all_close(x1.grad(), zeros({3, 5}), 0, 0));
}

TEST(Activations, ValuesAndFactory) {
  Tensor x = tensor<double>({-1.0, 0.0, 2.0}, {3});
  EXPECT_TRUE(all_close(nn::ReLU().forward(x), tensor<double>({0, 0, 2}, {3}), 0, 0));
  auto g = nn::make_activation("gelu");
  const double ref = 2.0 * 0.5 * (1 + std::erf(2.0 / std::sqrt(2.0)));
  EXPECT_NEAR(g->forward(x).to_vector<double>()[2], ref, 1e-12);
  EXPECT_EQ(g->str(), "GELU(approximate='none')");
  EXPECT_EQ(nn::make_activation("gelu_tanh")->str(), "GELU(approximate='tanh')");
  EXPECT_LINEA_ERROR(nn::make_activation("swish"), "unknown activation 'swish'");
}

// ---- module trees -----------------------------------------------------------------------------
TEST(Modules, ParameterCounts) {
  EXPECT_EQ(std::make_shared<nn::Linear>(3, 4)->num_parameters(), 16);
  EXPECT_EQ(std::make_shared<nn::Embedding>(10, 4)->num_parameters(), 40);
  EXPECT_EQ(std::make_shared<nn::LayerNorm>(8)->num_parameters(), 16);
  EXPECT_EQ(std::make_shared<nn::FeedForward>(4, 8)->num_parameters(), 4 * 8 + 8 + 8 * 4 + 4);
  EXPECT_EQ(std::make_shared<nn::PatchEmbed>(28, 4, 1, 64)->num_parameters(), 16 * 64 + 64);
  EXPECT_EQ(std::make_shared<attn::MultiHeadAttention>(8, 2)->num_parameters(), 4 * (64 + 8));
  const int64_t enc_layer = 2 * 16 + 4 * 72 + (8 * 16 + 16 + 16 * 8 + 8);
  EXPECT_EQ(std::make_shared<attn::TransformerEncoderLayer>(8, 2, 16)->num_parameters(), enc_layer);
  EXPECT_EQ(std::make_shared<attn::TransformerEncoder>(3, 8, 2, 16)->num_parameters(), 3 * enc_layer + 16);
  const int64_t dec_layer = 3 * 16 + 8 * 72 + (8 * 16 + 16 + 16 * 8 + 8);
  EXPECT_EQ(std::make_shared<attn::TransformerDecoder>(2, 8, 2, 16)->num_parameters(), 2 * dec_layer + 16);
  // The ViT of DESIGN.md's performance notes (dim 64, depth 6, 4 heads, MLP 128): its blocks.
  EXPECT_EQ(std::make_shared<attn::TransformerEncoder>(6, 64, 4, 128)->num_parameters(),
            6 * (2 * 128 + 4 * (64 * 64 + 64) + (64 * 128 + 128 + 128 * 64 + 64)) + 128);
}

TEST(Modules, TreePrinting) {
  auto ff = std::make_shared<nn::FeedForward>(4, 8, 0.1);
  EXPECT_EQ(ff->str(),
            "FeedForward(\n"
            "  (fc1): Linear(in_features=4, out_features=8, bias=true)\n"
            "  (act): GELU(approximate='none')\n"
            "  (drop): Dropout(p=0.1)\n"
            "  (fc2): Linear(in_features=8, out_features=4, bias=true)\n"
            ")");
  auto enc = std::make_shared<attn::TransformerEncoder>(2, 8, 2, 16);
  const std::string s = enc->str();
  for (const char* part : {"TransformerEncoder(\n  (layers): ModuleList(\n    (0): TransformerEncoderLayer(\n",
                           "      (ln1): LayerNorm([8], eps=1e-05, elementwise_affine=true)\n",
                           "      (attn): MultiHeadAttention(dim=8, heads=2, spec='softmax',\n",
                           "        (q_proj): Linear(in_features=8, out_features=8, bias=true)\n",
                           "        (mechanism): SoftmaxAttention(heads=2, head_dim=4, dropout=0)\n",
                           "    (1): TransformerEncoderLayer(", "  (norm): LayerNorm([8]"})
    EXPECT_NE(s.find(part), std::string::npos) << "missing: " << part << "\nin:\n" << s;
  auto pe = std::make_shared<nn::PatchEmbed>(28, 4, 1, 64);
  EXPECT_EQ(pe->str().substr(0, pe->str().find('\n')),
            "PatchEmbed(image_size=28, patch_size=4, in_channels=1, dim=64, num_patches=49,");
}

TEST(Modules, StateDictKeys) {
  auto enc = std::make_shared<attn::TransformerEncoder>(2, 8, 2, 16);
  auto k = keys(*enc);
  const std::set<std::string> ks(k.begin(), k.end());
  for (const char* name :
       {"layers.0.attn.q_proj.weight", "layers.0.attn.out_proj.bias", "layers.0.ln1.weight", "layers.0.ln2.bias",
        "layers.1.mlp.fc1.weight", "layers.1.mlp.fc2.bias", "norm.weight", "norm.bias"})
    EXPECT_EQ(ks.count(name), 1u) << name;
  EXPECT_EQ(k.size(), 2u * 16 + 2);  // per layer: 2 LN x 2, 4 projections x 2, 2 MLP Linear x 2
  auto dec = std::make_shared<attn::TransformerDecoder>(1, 8, 2, 16);
  auto dk = keys(*dec);
  const std::set<std::string> dks(dk.begin(), dk.end());
  for (const char* name : {"layers.0.self_attn.v_proj.weight", "layers.0.cross_attn.k_proj.weight", "layers.0.ln3.bias",
                           "layers.0.mlp.fc1.bias", "norm.weight"})
    EXPECT_EQ(dks.count(name), 1u) << name;
  // A state dict round trip between two differently seeded models reproduces the outputs.
  manual_seed(11);
  auto a = std::make_shared<attn::TransformerEncoder>(1, 8, 2, 16);
  manual_seed(12);
  auto b = std::make_shared<attn::TransformerEncoder>(1, 8, 2, 16);
  Tensor x = randn({2, 3, 8});
  EXPECT_FALSE(all_close(a->forward(x), b->forward(x), 1e-6, 0));
  b->load_state_dict(a->state_dict());
  EXPECT_TRUE(all_close(a->forward(x), b->forward(x), 0, 0));
}

TEST(Modules, ToFloat64ConvertsEverything) {
  auto dec = std::make_shared<attn::TransformerDecoder>(1, 4, 2, 8);
  auto pos = std::make_shared<nn::SinusoidalPositionalEmbedding>(5, 4);
  dec->to(DType::Float64);
  pos->to(DType::Float64);
  for (auto& [n, t] : dec->named_parameters()) EXPECT_EQ(t.dtype(), DType::Float64) << n;
  EXPECT_EQ(pos->table().dtype(), DType::Float64);
  Tensor y = dec->forward(pos->forward(randn({1, 3, 4}, f64())), randn({1, 2, 4}, f64()));
  EXPECT_EQ(y.dtype(), DType::Float64);
}

// ---- transformer blocks -----------------------------------------------------------------------
TEST(Transformer, DecoderIsCausalAndIgnoresPaddedMemory) {
  manual_seed(13);
  auto dec = std::make_shared<attn::TransformerDecoder>(2, 8, 2, 16);
  dec->eval();
  Tensor x = randn({2, 5, 8}), mem = randn({2, 4, 8});
  Tensor mem_pad = tensor<bool>({false, false, true, true, false, false, false, true}, {2, 4});
  Tensor y = dec->forward(x, mem, mem_pad);
  EXPECT_EQ(y.shape(), Shape({2, 5, 8}));
  // Changing targets at positions >= 3 leaves outputs at positions < 3 unchanged.
  Tensor x2 = cat({x.narrow(1, 0, 3), randn({2, 2, 8})}, 1);
  Tensor y2 = dec->forward(x2, mem, mem_pad);
  EXPECT_TRUE(all_close(y2.narrow(1, 0, 3), y.narrow(1, 0, 3), 1e-5, 1e-5));
  EXPECT_FALSE(all_close(y2.narrow(1, 3, 2), y.narrow(1, 3, 2), 1e-5, 0));
  // Changing padded memory positions changes nothing.
  Tensor keep = tensor<float>({1, 1, 0, 0, 1, 1, 1, 0}, {2, 4, 1});
  Tensor mem2 = mem * keep + randn({2, 4, 8}) * (1.0 - keep);
  EXPECT_TRUE(all_close(dec->forward(x, mem2, mem_pad), y, 1e-5, 1e-5));
  EXPECT_FALSE(all_close(dec->forward(x, mem2), dec->forward(x, mem), 1e-5, 0));  // unmasked: it would
}

TEST(Transformer, EncoderPaddingAndCausalOptions) {
  manual_seed(14);
  auto enc = std::make_shared<attn::TransformerEncoder>(2, 8, 4, 16, 0.1);
  enc->eval();
  Tensor x = randn({1, 6, 8});
  Tensor y = enc->forward(x);
  EXPECT_EQ(y.shape(), Shape({1, 6, 8}));
  // Padded positions (4, 5) do not influence the others.
  attn::AttentionOptions o;
  o.key_padding_mask = tensor<int64_t>({0, 0, 0, 0, 1, 1}, {1, 6});
  Tensor yp = enc->forward(x, o);
  Tensor x2 = cat({x.narrow(1, 0, 4), randn({1, 2, 8})}, 1);
  EXPECT_TRUE(all_close(enc->forward(x2, o).narrow(1, 0, 4), yp.narrow(1, 0, 4), 1e-5, 1e-5));
  EXPECT_TRUE(all_close(enc->forward(x.narrow(1, 0, 4)), yp.narrow(1, 0, 4), 1e-5, 1e-5));
  // Causal: position 0 depends on itself only.
  attn::AttentionOptions c;
  c.causal = true;
  EXPECT_TRUE(all_close(enc->forward(x, c).narrow(1, 0, 1), enc->forward(x.narrow(1, 0, 1)), 1e-5, 1e-5));
}

// A layer's child module by its registered name.
template <class M> std::shared_ptr<M> child(const nn::Module& m, const std::string& name) {
  for (const auto& [n, c] : m.children())
    if (n == name) return std::dynamic_pointer_cast<M>(c);
  return nullptr;
}

// In training, each residual branch goes through the layer's dropout before it is added (folded
// into the next norm's kernel): the same draws and values as the pre-LN formulas written out,
// x + drop(attn(ln1(x))) and then y + drop(mlp(ln2(y))), with the same seed.
TEST(Transformer, TrainingDropsEachResidualBranch) {
  manual_seed(15);
  const double p = 0.3;
  Tensor x = randn({2, 5, 8}), mem = randn({2, 4, 8});
  const Tensor tgt_pad = tensor<bool>({false, false, false, false, true, false, false, false, false, false}, {2, 5});
  const Tensor mem_pad = tensor<bool>({false, false, true, true, false, false, false, false}, {2, 4});
  using LN = nn::LayerNorm;
  {
    auto layer = std::make_shared<attn::TransformerEncoderLayer>(8, 2, 16, p);
    manual_seed(16);
    const Tensor out = layer->forward(x);
    manual_seed(16);
    const Tensor h = child<LN>(*layer, "ln1")->forward(x);
    const Tensor y = x + dropout(layer->attn()->forward(h, h), p, true);
    const Tensor m = layer->mlp()->forward(child<LN>(*layer, "ln2")->forward(y));
    EXPECT_TRUE(all_close(out, y + dropout(m, p, true), 1e-6, 1e-6));
  }
  auto layer = std::make_shared<attn::TransformerDecoderLayer>(8, 2, 16, p);
  manual_seed(17);
  const Tensor out = layer->forward(x, mem, mem_pad, tgt_pad);
  manual_seed(17);
  attn::AttentionOptions self_opts, cross_opts;
  self_opts.causal = true;
  self_opts.key_padding_mask = tgt_pad;
  cross_opts.key_padding_mask = mem_pad;
  const Tensor h = child<LN>(*layer, "ln1")->forward(x);
  const Tensor y = x + dropout(layer->self_attn()->forward(h, h, self_opts), p, true);
  const Tensor h2 = child<LN>(*layer, "ln2")->forward(y);
  const Tensor z = y + dropout(layer->cross_attn()->forward(h2, mem, cross_opts), p, true);
  const Tensor m = layer->mlp()->forward(child<LN>(*layer, "ln3")->forward(z));
  EXPECT_TRUE(all_close(out, z + dropout(m, p, true), 1e-6, 1e-6));
  // The stacks: each layer's output, dropout included, into the next, then the final norm.
  auto enc = std::make_shared<attn::TransformerEncoder>(2, 8, 2, 16, p);
  manual_seed(18);
  const Tensor enc_out = enc->forward(x);
  manual_seed(18);
  EXPECT_TRUE(all_close(enc_out, enc->norm()->forward(enc->layer(1)->forward(enc->layer(0)->forward(x))), 1e-6, 1e-6));
  auto dec = std::make_shared<attn::TransformerDecoder>(2, 8, 2, 16, p);
  manual_seed(19);
  const Tensor dec_out = dec->forward(x, mem, mem_pad, tgt_pad);
  manual_seed(19);
  const Tensor d0 = dec->layer(0)->forward(x, mem, mem_pad, tgt_pad);
  EXPECT_TRUE(all_close(dec_out, dec->norm()->forward(dec->layer(1)->forward(d0, mem, mem_pad, tgt_pad)), 1e-6, 1e-6));
  // The cross-attention takes the self-attention's spec unless given its own.
  EXPECT_EQ(attn::TransformerDecoderLayer(8, 2, 16, 0.0, "performer:features=4").cross_attn()->spec(),
            "performer:features=4");
  EXPECT_EQ(attn::TransformerDecoderLayer(8, 2, 16, 0.0, "performer:features=4", "softmax").cross_attn()->spec(),
            "softmax");
}

TEST(Transformer, BadInputsThrow) {
  auto enc = std::make_shared<attn::TransformerEncoder>(1, 8, 2, 16);
  EXPECT_LINEA_ERROR(enc->forward(zeros({2, 3, 6})), "TransformerEncoderLayer: expected x [B, L, 8], got [2, 3, 6]");
  auto dec = std::make_shared<attn::TransformerDecoder>(1, 8, 2, 16);
  EXPECT_LINEA_ERROR(dec->forward(zeros({2, 3, 8}), zeros({2, 3})), "expected memory [B, L, 8], got [2, 3]");
  EXPECT_LINEA_ERROR(dec->forward(zeros({2, 3, 8}), zeros({1, 3, 8})), "batch of x [2, 3, 8] and memory [1, 3, 8]");
  EXPECT_LINEA_ERROR(std::make_shared<attn::TransformerEncoder>(0, 8, 2, 16), "depth must be positive");
  EXPECT_LINEA_ERROR(std::make_shared<attn::TransformerEncoderLayer>(8, 3, 16),
                     "TransformerEncoderLayer: dim 8 is not divisible by heads 3");
  EXPECT_LINEA_ERROR(std::make_shared<attn::TransformerDecoderLayer>(8, 3, 16),
                     "TransformerDecoderLayer: dim 8 is not divisible by heads 3");
  // A decoding state of a decoder of another depth.
  auto deep = std::make_shared<attn::TransformerDecoder>(2, 8, 2, 16);
  attn::DecoderState state = deep->start(zeros({2, 3, 8}));
  EXPECT_LINEA_ERROR(dec->step(zeros({2, 1, 8}), state),
                     "TransformerDecoder::step: the state was made for 2 layers, this decoder has 1");
  EXPECT_LINEA_ERROR(std::make_shared<attn::TransformerEncoder>(1, 8, 2, 16, 0.0, "flash"),
                     "unknown attention 'flash' (known: lara, nprf_rpe, performer, ra, softmax");
  EXPECT_LINEA_ERROR(std::make_shared<attn::TransformerDecoder>(1, 8, 2, 16, 0.0, "softmax", "softmax:"),
                     "no options after ':'");
}

TEST(Layers, WrongInputShapesThrow) {
  EXPECT_LINEA_ERROR(std::make_shared<nn::Linear>(3, 2)->forward(zeros({2, 4})),
                     "Linear: expected input [..., 3] (in_features=3), got [2, 4]");
  EXPECT_LINEA_ERROR(std::make_shared<nn::Linear>(3, 2)->forward(Tensor()), "Linear");
  EXPECT_LINEA_ERROR(std::make_shared<nn::LayerNorm>(Shape{2, 3})->forward(zeros({4, 3, 2})),
                     "LayerNorm: expected input [..., 2, 3] (normalized_shape [2, 3]), got [4, 3, 2]");
  EXPECT_LINEA_ERROR(std::make_shared<nn::FeedForward>(4, 8)->forward(zeros({2, 5})),
                     "Linear: expected input [..., 4]");
  EXPECT_LINEA_ERROR(std::make_shared<nn::Linear>(0, 2), "in_features and out_features must be positive");
  EXPECT_LINEA_ERROR(nn::LayerNorm(4, 0.0), "LayerNorm: eps must be positive, got 0");
  EXPECT_LINEA_ERROR(nn::LearnedPositionalEmbedding(8, 4).forward(zeros({1, 3, 4}), -1),
                     "LearnedPositionalEmbedding: positions [-1, 2) exceed max_len 8");
  EXPECT_LINEA_ERROR(nn::SinusoidalPositionalEmbedding(8, 4).forward(zeros({1, 3, 4}), 6),
                     "SinusoidalPositionalEmbedding: positions [6, 9) exceed max_len 8");
  EXPECT_LINEA_ERROR(attn::make_attention("unknown_mech:x=1", 2, 4), "unknown attention 'unknown_mech' (known: ");
}

// Each layer names itself and the argument at fault: undefined inputs and sizes out of range.
TEST(Layers, UndefinedInputsAndBadSizesAreNamed) {
  using test::undefined_arg;
  EXPECT_LINEA_ERROR(nn::LearnedPositionalEmbedding(8, 4).forward(Tensor()),
                     undefined_arg("LearnedPositionalEmbedding", "x"));
  EXPECT_LINEA_ERROR(nn::Embedding(4, 2).forward(Tensor()), undefined_arg("Embedding", "index"));
  nn::LayerNorm ln(3);
  EXPECT_LINEA_ERROR(ln.forward(Tensor()), undefined_arg("LayerNorm", "input"));
  EXPECT_LINEA_ERROR(ln.forward_add(Tensor(), zeros({2, 3})), undefined_arg("LayerNorm", "input"));
  EXPECT_LINEA_ERROR(ln.forward_add(zeros({2, 3}), Tensor()), undefined_arg("LayerNorm", "residual"));
  EXPECT_LINEA_ERROR(ln.forward_add(zeros({2, 4}), zeros({2, 4})),
                     "LayerNorm: expected input [..., 3] (normalized_shape [3]), got [2, 4]");
  EXPECT_LINEA_ERROR(nn::Dropout(0.1).forward(Tensor()), undefined_arg("Dropout", "input"));
  EXPECT_LINEA_ERROR(nn::GELU().forward(Tensor()), undefined_arg("GELU", "input"));
  EXPECT_LINEA_ERROR(nn::ReLU().forward(Tensor()), undefined_arg("ReLU", "input"));
  EXPECT_LINEA_ERROR(nn::PatchEmbed(8, 4, 1, 6).forward(Tensor()), undefined_arg("PatchEmbed", "images"));

  EXPECT_LINEA_ERROR(nn::Embedding(0, 2), "Embedding: sizes must be positive, got num_embeddings=0, embedding_dim=2");
  EXPECT_LINEA_ERROR(nn::Embedding(4, 0), "Embedding: sizes must be positive, got num_embeddings=4, embedding_dim=0");
  EXPECT_LINEA_ERROR(nn::LayerNorm(Shape{}), "LayerNorm: normalized_shape must not be empty");
  EXPECT_LINEA_ERROR(nn::LayerNorm(Shape{2, 0}), "LayerNorm: normalized_shape must be positive, got [2, 0]");
  EXPECT_LINEA_ERROR(nn::PatchEmbed(8, 0, 1, 6),
                     "PatchEmbed: sizes must be positive, got image_size=8, patch_size=0, in_channels=1, dim=6");
  EXPECT_LINEA_ERROR(nn::PatchEmbed(8, 4, 1, 0), "PatchEmbed: sizes must be positive");
  EXPECT_LINEA_ERROR(nn::LearnedPositionalEmbedding(0, 4),
                     "LearnedPositionalEmbedding: sizes must be positive, got max_len=0, dim=4");
  EXPECT_LINEA_ERROR(nn::SinusoidalPositionalEmbedding(8, 0),
                     "SinusoidalPositionalEmbedding: sizes must be positive, got max_len=8, dim=0");
}

// ---- losses -----------------------------------------------------------------------------------
TEST(Loss, CrossEntropyFlattensSequences) {
  manual_seed(15);
  Tensor logits = randn({2, 3, 5}, f64());
  Tensor target = tensor<int64_t>({1, 4, -100, 0, 2, 2}, {2, 3});
  // Mean over the 5 non-ignored rows, by hand.
  auto lv = logits.to_vector<double>();
  auto tv = target.to_vector<int64_t>();
  for (double s : {0.0, 0.2}) {
    double total = 0;
    int count = 0;
    std::vector<double> rows(6, 0.0);
    for (int r = 0; r < 6; ++r) {
      if (tv[r] == -100) continue;
      double mx = -INFINITY, z = 0, sum_x = 0;
      for (int c = 0; c < 5; ++c) mx = std::max(mx, lv[r * 5 + c]);
      for (int c = 0; c < 5; ++c) {
        z += std::exp(lv[r * 5 + c] - mx);
        sum_x += lv[r * 5 + c];
      }
      const double lse = mx + std::log(z);
      rows[r] = lse - (1 - s) * lv[r * 5 + tv[r]] - s / 5 * sum_x;
      total += rows[r];
      ++count;
    }
    EXPECT_NEAR(cross_entropy(logits, target, -100, s).item(), total / count, 1e-12) << s;
    Tensor none = cross_entropy(logits, target, -100, s, Reduction::None);
    EXPECT_EQ(none.shape(), Shape({2, 3}));
    EXPECT_TRUE(all_close(none, from_vector<double>(rows, {2, 3}), 1e-12, 1e-12));
    EXPECT_NEAR(cross_entropy(logits, target, -100, s, Reduction::Sum).item(), total, 1e-12);
  }
  // [N, C] rows and [C] with a 0-d target pass straight through.
  EXPECT_NEAR(cross_entropy(logits.reshape({6, 5}), target.reshape({6})).item(), cross_entropy(logits, target).item(),
              1e-12);
  EXPECT_NEAR(cross_entropy(logits.select(0, 0).select(0, 0), tensor<int64_t>({1}, {})).item(),
              cross_entropy(logits, target, -100, 0, Reduction::None).to_vector<double>()[0], 1e-12);
}

TEST(Loss, MseValues) {
  Tensor p = tensor<double>({1, 2, 3, 4}, {2, 2}), t = tensor<double>({0, 2, 5, 1}, {2, 2});
  EXPECT_DOUBLE_EQ(nn::mse_loss(p, t).item(), (1 + 0 + 4 + 9) / 4.0);
  EXPECT_DOUBLE_EQ(nn::mse_loss(p, t, Reduction::Sum).item(), 14.0);
  EXPECT_TRUE(all_close(nn::mse_loss(p, t, Reduction::None), tensor<double>({1, 0, 4, 9}, {2, 2}), 0, 0));
}

TEST(Loss, BadInputsThrow) {
  EXPECT_LINEA_ERROR(cross_entropy(zeros({2, 3, 5}), zeros({2, 4}, TensorOptions(DType::Int64))),
                     "cross_entropy: target [2, 4] does not match logits [2, 3, 5] (expected target [2, 3])");
  EXPECT_LINEA_ERROR(cross_entropy(zeros({2, 5}), zeros({2})), "target must be int64");
  EXPECT_LINEA_ERROR(cross_entropy(zeros({2, 5}), zeros({2, 5}, TensorOptions(DType::Int64))),
                     "need a target with one dim fewer");
  EXPECT_LINEA_ERROR(nn::mse_loss(zeros({2, 3}), zeros({3, 2})), "mse_loss: pred [2, 3] and target [3, 2]");
}

}  // namespace
}  // namespace linea
