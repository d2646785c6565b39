// Linear randomized attention (`lara`, attention/lara): values against a naive float64 loop
// implementation of lara.h's formulas given explicit samples (proposals qk and mixed,
// adaptive, N % C != 0, N <= C, padding with an all-padded segment and a fully padded batch,
// eval with w = mu, beta and noise other than 1), float64 gradchecks with frozen samples (inputs
// and the adaptive proposal's parameters), padding invariance, train/eval/freeze behaviour, the
// cached segment matrices following the length and dtype, float32 finiteness for large inputs,
// errors, and the fused mixture weights (the CPU path) against the composed formula, clamp
// included, with their gradient check.
// The cross-mechanism claim (LARA below Performer at equal sample count) is in
// tests/test_attention_claims.cpp.
#include <cmath>
#include <map>
#include <vector>

#include "attention/lara/lara.h"
#include "attention/transformer.h"
#include "tests/test_util.h"

namespace linea {
namespace {

using test::all_close;
using test::f64;
using test::randn64;
using Lara = attn::LinearRandomizedAttention;

// ---- the naive reference ------------------------------------------------------------------------
struct NaiveOpts {
  int64_t C = 16;
  bool mixed = false;
  double noise = 1.0, beta = 1.0;
  std::vector<int> pad;  // [B * N], 1 = padded key; empty = none
  Tensor eps;            // [B, H, C_eff, D]; undefined = eval (w = mu)
  // adaptive: mu -> LayerNorm(W mu + b) * g + gb (eps 1e-5); W empty = not adaptive
  std::vector<double> W, b, g, gb;
};

struct NaiveLara {
  Tensor A;    // [B, H, N, N]
  Tensor out;  // [B, H, N, Dv]
};

// LARA by loops in float64, written from lara.h's formulas (segments, q-_c, k-_c, mu_c, w_c,
// l_cc', f_c, t_nc, alpha_nc, log u_nc); a batch with every key padded gives zeros.
NaiveLara naive_lara(const Tensor& q, const Tensor& k, const Tensor& v, const NaiveOpts& o) {
  const int64_t B = q.size(0), H = q.size(1), N = q.size(2), D = q.size(3), Dv = v.size(3);
  const double sc = std::pow(static_cast<double>(D), -0.25);
  auto qv = q.to_vector<double>(), kv = k.to_vector<double>(), vv = v.to_vector<double>();
  std::vector<double> ev = o.eps.defined() ? o.eps.to_vector<double>() : std::vector<double>();
  // Segments: C_eff = min(C, N); the first C_eff - N % C_eff have floor(N / C_eff) tokens, the rest one more.
  const int64_t Ce = std::min(o.C, N), base = N / Ce, longer = N % Ce;
  std::vector<int64_t> seg(static_cast<size_t>(N));
  for (int64_t c = 0, n = 0; c < Ce; ++c)
    for (int64_t i = 0; i < base + (c >= Ce - longer ? 1 : 0); ++i) seg[static_cast<size_t>(n++)] = c;
  using Vec = std::vector<double>;
  auto dot = [&](const Vec& a, const Vec& b) {
    double s = 0;
    for (int64_t d = 0; d < D; ++d) s += a[static_cast<size_t>(d)] * b[static_cast<size_t>(d)];
    return s;
  };
  std::vector<double> A(static_cast<size_t>(B * H * N * N), 0.0), out(static_cast<size_t>(B * H * N * Dv), 0.0);
  for (int64_t bb = 0; bb < B; ++bb)
    for (int64_t h = 0; h < H; ++h) {
      const int64_t bh = bb * H + h;
      auto visible = [&](int64_t m) { return o.pad.empty() || !o.pad[static_cast<size_t>(bb * N + m)]; };
      bool any = false;
      for (int64_t m = 0; m < N; ++m) any = any || visible(m);
      if (!any) continue;
      std::vector<Vec> qt(N, Vec(D)), kt(N, Vec(D));
      for (int64_t n = 0; n < N; ++n)
        for (int64_t d = 0; d < D; ++d) {
          qt[n][d] = sc * qv[static_cast<size_t>((bh * N + n) * D + d)];
          kt[n][d] = sc * kv[static_cast<size_t>((bh * N + n) * D + d)];
        }
      // segment means
      std::vector<Vec> qbar(Ce, Vec(D, 0.0)), kbar(Ce, Vec(D, 0.0));
      std::vector<double> qn(Ce, 0.0), kn(Ce, 0.0);
      for (int64_t n = 0; n < N; ++n) {
        const int64_t c = seg[n];
        qn[c] += 1;
        for (int64_t d = 0; d < D; ++d) qbar[c][d] += qt[n][d];
        if (!visible(n)) continue;
        kn[c] += 1;
        for (int64_t d = 0; d < D; ++d) kbar[c][d] += kt[n][d];
      }
      for (int64_t c = 0; c < Ce; ++c)
        for (int64_t d = 0; d < D; ++d) {
          qbar[c][d] /= qn[c];
          kbar[c][d] = kn[c] > 0 ? kbar[c][d] / kn[c] : 0.0;
        }
      // proposal means
      std::vector<Vec> mu(Ce, Vec(D));
      for (int64_t c = 0; c < Ce; ++c) {
        Vec extra = kbar[c];
        if (o.mixed) {
          Vec s(Ce);
          double mx = -INFINITY, z = 0;
          for (int64_t c2 = 0; c2 < Ce; ++c2) mx = std::max(mx, s[c2] = dot(kbar[c], kbar[c2]));
          for (int64_t c2 = 0; c2 < Ce; ++c2) z += std::exp(s[c2] - mx);
          extra.assign(D, 0.0);
          for (int64_t c2 = 0; c2 < Ce; ++c2)
            for (int64_t d = 0; d < D; ++d) extra[d] += std::exp(s[c2] - mx) / z * kbar[c2][d];
        }
        for (int64_t d = 0; d < D; ++d) mu[c][d] = qbar[c][d] + extra[d];
        if (!o.W.empty()) {
          Vec y(D);
          double mean = 0, var = 0;
          for (int64_t i = 0; i < D; ++i) {
            y[i] = o.b[i];
            for (int64_t j = 0; j < D; ++j) y[i] += o.W[static_cast<size_t>(i * D + j)] * mu[c][j];
            mean += y[i] / D;
          }
          for (int64_t i = 0; i < D; ++i) var += (y[i] - mean) * (y[i] - mean) / D;
          for (int64_t i = 0; i < D; ++i) mu[c][i] = (y[i] - mean) / std::sqrt(var + 1e-5) * o.g[i] + o.gb[i];
        }
      }
      // samples
      std::vector<Vec> w = mu;
      if (!ev.empty())
        for (int64_t c = 0; c < Ce; ++c)
          for (int64_t d = 0; d < D; ++d) w[c][d] += o.noise * ev[static_cast<size_t>((bh * Ce + c) * D + d)];
      // l_cc', and the self weight exp(l_cc) / sum_c' exp(l_cc')
      std::vector<double> self(Ce), lcc(Ce);
      for (int64_t c = 0; c < Ce; ++c) {
        Vec l(Ce);
        double mx = -INFINITY, z = 0;
        for (int64_t c2 = 0; c2 < Ce; ++c2) mx = std::max(mx, l[c2] = dot(w[c], mu[c2]) - 0.5 * dot(mu[c2], mu[c2]));
        for (int64_t c2 = 0; c2 < Ce; ++c2) z += std::exp(l[c2] - mx);
        lcc[c] = l[c];
        self[c] = std::exp(l[c] - mx) / z;
      }
      // t_nc: softmax over n of q~_n.q-_c
      std::vector<Vec> t(N, Vec(Ce));
      for (int64_t c = 0; c < Ce; ++c) {
        double mx = -INFINITY, z = 0;
        for (int64_t n = 0; n < N; ++n) mx = std::max(mx, t[n][c] = dot(qt[n], qbar[c]));
        for (int64_t n = 0; n < N; ++n) z += std::exp(t[n][c] - mx);
        for (int64_t n = 0; n < N; ++n) t[n][c] = std::exp(t[n][c] - mx) / z;
      }
      // f_c's key weights and log sum_m xi(k~_m, w_c)
      std::vector<Vec> pk(Ce, Vec(N, 0.0));
      std::vector<double> lse(Ce);
      for (int64_t c = 0; c < Ce; ++c) {
        Vec lk(N);
        double mx = -INFINITY, z = 0;
        for (int64_t m = 0; m < N; ++m)
          if (visible(m)) mx = std::max(mx, lk[m] = dot(w[c], kt[m]) - 0.5 * dot(kt[m], kt[m]));
        for (int64_t m = 0; m < N; ++m)
          if (visible(m)) z += std::exp(lk[m] - mx);
        for (int64_t m = 0; m < N; ++m) pk[c][m] = visible(m) ? std::exp(lk[m] - mx) / z : 0.0;
        lse[c] = mx + std::log(z);
      }
      // log u_nc, its softmax over c, the attention row and the output
      for (int64_t n = 0; n < N; ++n) {
        double tmean = 0;
        for (int64_t c = 0; c < Ce; ++c) tmean += t[n][c] / Ce;
        Vec lu(Ce);
        double mx = -INFINITY, z = 0;
        for (int64_t c = 0; c < Ce; ++c) {
          const double alpha = std::max(self[c] + o.beta * (t[n][c] - tmean), 1e-8);
          lu[c] = std::log(alpha) + dot(w[c], qt[n]) - 0.5 * dot(qt[n], qt[n]) + lse[c] - lcc[c];
          mx = std::max(mx, lu[c]);
        }
        for (int64_t c = 0; c < Ce; ++c) z += std::exp(lu[c] - mx);
        for (int64_t c = 0; c < Ce; ++c) {
          const double wt = std::exp(lu[c] - mx) / z;
          for (int64_t m = 0; m < N; ++m) A[static_cast<size_t>((bh * N + n) * N + m)] += wt * pk[c][m];
        }
        for (int64_t m = 0; m < N; ++m)
          for (int64_t e = 0; e < Dv; ++e)
            out[static_cast<size_t>((bh * N + n) * Dv + e)] +=
                A[static_cast<size_t>((bh * N + n) * N + m)] * vv[static_cast<size_t>((bh * N + m) * Dv + e)];
      }
    }
  return {from_vector<double>(A, {B, H, N, N}), from_vector<double>(out, {B, H, N, Dv})};
}

Tensor r64(const Shape& s) { return randn(s, f64()); }

Tensor mask_of(const std::vector<int>& pad, int64_t B, int64_t M) {
  return from_vector<int64_t>(std::vector<int64_t>(pad.begin(), pad.end()), {B, M});
}

// Builds lara from a spec (so the factory's options are exercised), float64.
std::shared_ptr<Lara> make(const std::string& spec, int64_t H, int64_t D) {
  auto k = std::dynamic_pointer_cast<Lara>(attn::make_attention(spec, H, D));
  EXPECT_NE(k, nullptr);
  k->to(DType::Float64);
  return k;
}

// Mechanism vs naive with explicit eps (train) and without (eval), forward and attention matrix.
void expect_matches_naive(const std::string& spec, NaiveOpts o, int64_t B, int64_t H, int64_t N, int64_t D,
                          int64_t Dv) {
  SCOPED_TRACE(spec);
  Tensor q = r64({B, H, N, D}), k = r64({B, H, N, D}), v = r64({B, H, N, Dv});
  attn::AttentionOptions opts;
  if (!o.pad.empty()) opts.key_padding_mask = mask_of(o.pad, B, N);
  auto lara = make(spec, H, D);
  o.eps = r64({B, H, std::min(o.C, N), D});
  lara->set_samples({{"eps", o.eps}});
  NaiveLara ref = naive_lara(q, k, v, o);
  EXPECT_TRUE(all_close(lara->forward(q, k, v, opts), ref.out, 1e-12, 1e-12)) << "train";
  EXPECT_TRUE(all_close(lara->attention_matrix(q, k, opts), ref.A, 1e-12, 1e-12)) << "train attention_matrix";
  lara->eval();
  o.eps = Tensor();
  ref = naive_lara(q, k, v, o);
  EXPECT_TRUE(all_close(lara->forward(q, k, v, opts), ref.out, 1e-12, 1e-12)) << "eval";
  EXPECT_TRUE(all_close(lara->attention_matrix(q, k, opts), ref.A, 1e-12, 1e-12)) << "eval attention_matrix";
}

// ---- values against the naive loops ------------------------------------------------------------
TEST(LinearRandomizedAttention, QkProposalMatchesNaiveLoops) {
  manual_seed(1);
  NaiveOpts o;
  o.C = 3;  // N = 8: segments of 2, 3, 3
  expect_matches_naive("lara:samples=3", o, 2, 2, 8, 4, 3);
  o.C = 4;  // N % C == 0
  expect_matches_naive("lara:samples=4", o, 1, 3, 8, 5, 2);
}

TEST(LinearRandomizedAttention, MixedProposalMatchesNaiveLoops) {
  manual_seed(2);
  NaiveOpts o;
  o.C = 4;  // N = 10: segments of 2, 2, 3, 3
  o.mixed = true;
  expect_matches_naive("lara:samples=4,proposal=mixed", o, 2, 2, 10, 4, 3);
}

TEST(LinearRandomizedAttention, FewerTokensThanLandmarks) {
  manual_seed(3);
  NaiveOpts o;
  o.C = 16;  // the default: N = 5 tokens, each its own segment
  expect_matches_naive("lara", o, 2, 2, 5, 4, 3);
  o.C = 6;  // N == C
  o.mixed = true;
  expect_matches_naive("lara:samples=6,proposal=mixed", o, 1, 2, 6, 3, 2);
  // The sizes themselves.
  EXPECT_EQ(Lara::segment_sizes(8, 3), (std::vector<int64_t>{2, 3, 3}));
  EXPECT_EQ(Lara::segment_sizes(10, 4), (std::vector<int64_t>{2, 2, 3, 3}));
  EXPECT_EQ(Lara::segment_sizes(3, 16), (std::vector<int64_t>{1, 1, 1}));
  EXPECT_EQ(Lara::segment_sizes(12, 4), (std::vector<int64_t>{3, 3, 3, 3}));
}

TEST(LinearRandomizedAttention, PaddedMatchesNaiveLoops) {
  manual_seed(4);
  NaiveOpts o;
  o.C = 4;  // N = 8: segments {0,1} {2,3} {4,5} {6,7}
  // batch 0: keys 2, 3 (a whole segment) and 6 padded; batch 1: every key; batch 2: none.
  o.pad = {0, 0, 1, 1, 0, 0, 1, 0, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0};
  expect_matches_naive("lara:samples=4", o, 3, 2, 8, 4, 3);
  o.mixed = true;
  expect_matches_naive("lara:samples=4,proposal=mixed", o, 3, 2, 8, 4, 3);
  // The fully padded batch attends to nothing.
  auto lara = make("lara:samples=4", 2, 4);
  attn::AttentionOptions opts;
  opts.key_padding_mask = mask_of(o.pad, 3, 8);
  Tensor out = lara->forward(r64({3, 2, 8, 4}), r64({3, 2, 8, 4}), r64({3, 2, 8, 3}), opts);
  EXPECT_EQ(max(abs(select(out, 0, 1))).item<double>(), 0.0);
}

TEST(LinearRandomizedAttention, BetaAndNoiseMatchNaiveLoops) {
  manual_seed(5);
  NaiveOpts o;
  o.C = 3;
  o.beta = 0.3;
  o.noise = 0.5;
  expect_matches_naive("lara:samples=3,beta=0.3,noise=0.5", o, 2, 2, 7, 4, 3);
  o.beta = 0.0;  // alpha_nc = exp(l_cc - logsumexp_c' l_cc'), the same for every query
  o.noise = 2.0;
  expect_matches_naive("lara:samples=3,beta=0,noise=2", o, 2, 2, 7, 4, 3);
  o.beta = 4.0;  // many alpha_nc clipped at 1e-8
  expect_matches_naive("lara:samples=3,beta=4,noise=2", o, 2, 2, 7, 4, 3);
}

TEST(LinearRandomizedAttention, AdaptiveProposalMatchesNaiveLoops) {
  manual_seed(6);
  const int64_t B = 2, H = 2, N = 7, D = 4, C = 3;
  auto lara = make("lara:samples=3,adaptive=1", H, D);
  ASSERT_TRUE(lara->adaptive());
  std::map<std::string, Tensor> params;
  for (auto& [name, p] : lara->named_parameters()) {
    NoGradGuard ng;
    nn::replace_data(p, add(mul(randn(p.shape(), f64()), 0.5), name == "mu_norm.weight" ? 1.0 : 0.0));
    params[name] = p;
  }
  ASSERT_EQ(params.size(), 4u);  // mu_proj.{weight,bias}, mu_norm.{weight,bias}
  NaiveOpts o;
  o.C = C;
  o.W = params.at("mu_proj.weight").to_vector<double>();
  o.b = params.at("mu_proj.bias").to_vector<double>();
  o.g = params.at("mu_norm.weight").to_vector<double>();
  o.gb = params.at("mu_norm.bias").to_vector<double>();
  o.eps = r64({B, H, C, D});
  Tensor q = r64({B, H, N, D}), k = r64({B, H, N, D}), v = r64({B, H, N, 3});
  lara->set_samples({{"eps", o.eps}});
  EXPECT_TRUE(all_close(lara->forward(q, k, v, {}), naive_lara(q, k, v, o).out, 1e-12, 1e-12));
}

// ---- gradchecks (float64, samples frozen) --------------------------------------------------------
using Fn = std::function<Tensor(const std::vector<Tensor>&)>;

// gradcheck with respect to q, k, v and every parameter of the mechanism (adaptive proposal):
// the parameters go in as extra inputs and, inside f, each parameter's autograd state points at
// its leaf (gradcheck detaches its inputs into fresh leaves sharing storage), as in
// tests/test_gradcheck_layers.cpp.
::testing::AssertionResult lara_grad_ok(const std::shared_ptr<Lara>& lara, const attn::AttentionOptions& o,
                                        std::vector<Tensor> inputs) {
  lara->freeze_samples(true);
  lara->forward(inputs[0].detach(), inputs[1].detach(), inputs[2].detach(), o);  // draws eps once
  std::vector<Tensor> params = lara->parameters();
  std::vector<std::shared_ptr<detail::AutogradMeta>> saved;
  for (auto& p : params) {
    saved.push_back(p.impl().autograd);
    inputs.push_back(p);
  }
  auto f = [&](const std::vector<Tensor>& x) {
    for (size_t i = 0; i < params.size(); ++i) params[i].impl().autograd = x[3 + i].impl().autograd;
    return lara->forward(x[0], x[1], x[2], o);
  };
  GradcheckResult r = gradcheck(f, inputs, test::suite_gradcheck_options());
  for (size_t i = 0; i < params.size(); ++i) params[i].impl().autograd = saved[i];
  if (r.ok) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << r.message;
}

std::vector<Tensor> qkv(int64_t B, int64_t H, int64_t N, int64_t D, int64_t Dv) {
  return {randn64({B, H, N, D}), randn64({B, H, N, D}), randn64({B, H, N, Dv})};
}

TEST(GradCheck, LaraQk) {
  manual_seed(7);
  EXPECT_TRUE(lara_grad_ok(make("lara:samples=2", 2, 4), {}, qkv(2, 2, 5, 4, 3)));  // N % C != 0
  EXPECT_TRUE(lara_grad_ok(make("lara:samples=3,beta=0.5,noise=0.7", 1, 3), {}, qkv(1, 1, 4, 3, 2)));
  auto eval = make("lara:samples=2", 2, 4);
  eval->eval();  // w = mu
  EXPECT_TRUE(lara_grad_ok(eval, {}, qkv(2, 2, 5, 4, 3)));
}

TEST(GradCheck, LaraMixed) {
  manual_seed(8);
  EXPECT_TRUE(lara_grad_ok(make("lara:samples=3,proposal=mixed", 2, 4), {}, qkv(2, 2, 5, 4, 3)));
}

TEST(GradCheck, LaraAdaptive) {
  manual_seed(9);
  for (const char* spec : {"lara:samples=2,adaptive=1", "lara:samples=2,adaptive=1,proposal=mixed"}) {
    SCOPED_TRACE(spec);
    auto lara = make(spec, 2, 4);
    for (auto& p : lara->parameters()) {
      NoGradGuard ng;
      nn::replace_data(p, add(mul(randn(p.shape(), f64()), 0.5), p.dim() == 1 ? 0.5 : 0.0));
    }
    EXPECT_TRUE(lara_grad_ok(lara, {}, qkv(2, 2, 5, 4, 3)));
  }
}

TEST(GradCheck, LaraPadded) {
  manual_seed(10);
  attn::AttentionOptions o;
  // batch 0: keys 2 and 3 (a whole segment of 2) padded; batch 1: every key.
  o.key_padding_mask = tensor<int64_t>({0, 0, 1, 1, 0, 1, 1, 1, 1, 1}, {2, 5});
  EXPECT_TRUE(lara_grad_ok(make("lara:samples=2", 2, 3), o, qkv(2, 2, 5, 3, 2)));
  EXPECT_TRUE(lara_grad_ok(make("lara:samples=2,proposal=mixed", 1, 3), o, qkv(2, 1, 5, 3, 2)));
}

// ---- padding, modes, samples ---------------------------------------------------------------------
TEST(LinearRandomizedAttention, PaddedKeysDoNotChangeOutputs) {
  const int64_t B = 2, H = 2, N = 9, D = 4;
  const std::vector<int> pad = {0, 0, 1, 0, 0, 1, 1, 1, 0, 1, 0, 0, 0, 0, 0, 0, 0, 1};
  attn::AttentionOptions o;
  o.key_padding_mask = mask_of(pad, B, N);
  Tensor pm = reshape(mask_of(pad, B, N).to(DType::Bool), {B, 1, N, 1});
  for (const char* spec : {"lara:samples=3", "lara:samples=4,proposal=mixed", "lara:samples=3,adaptive=1"}) {
    SCOPED_TRACE(spec);
    manual_seed(11);
    Tensor q = r64({B, H, N, D}), k = r64({B, H, N, D}), v = r64({B, H, N, 3});
    Tensor k2 = where(pm, mul(r64(k.shape()), 5.0), k), v2 = where(pm, mul(r64(v.shape()), 5.0), v);
    auto lara = make(spec, H, D);
    manual_seed(12);  // the same draws for both calls
    Tensor a = lara->forward(q, k, v, o);
    manual_seed(12);
    EXPECT_TRUE(all_close(lara->forward(q, k2, v2, o), a, 1e-12, 1e-12));
  }
}

TEST(LinearRandomizedAttention, TrainDrawsEvalFreezeAndSetSamples) {
  manual_seed(13);
  const int64_t B = 2, H = 2, N = 7, D = 4;
  Tensor q = r64({B, H, N, D}), k = r64({B, H, N, D}), v = r64({B, H, N, 3});
  auto diff = [](const Tensor& a, const Tensor& b) { return max(abs(sub(a, b))).item<double>(); };
  auto lara = make("lara:samples=3", H, D);
  EXPECT_EQ(lara->sample_names(), std::vector<std::string>{"eps"});
  EXPECT_GT(diff(lara->forward(q, k, v, {}), lara->forward(q, k, v, {})), 1e-6) << "training redraws";
  EXPECT_EQ(lara->last_samples().at("eps").shape(), Shape({B, H, 3, D}));
  lara->freeze_samples(true);
  Tensor a = lara->forward(q, k, v, {});
  EXPECT_EQ(diff(lara->forward(q, k, v, {}), a), 0.0);
  // forward == attention_matrix @ v with the same samples; rows of the matrix sum to 1 (each is
  // a convex combination of the C softmax rows of f_c).
  Tensor attn = lara->attention_matrix(q, k, {});
  EXPECT_TRUE(all_close(matmul(attn, v), a, 1e-13, 1e-12));
  EXPECT_TRUE(all_close(sum(attn, {-1}), ones({B, H, N}, f64()), 1e-13, 0));
  auto other = make("lara:samples=3", H, D);
  other->set_samples(lara->last_samples());
  EXPECT_EQ(diff(other->forward(q, k, v, {}), a), 0.0);
  // Eval: w = mu, deterministic, nothing drawn; noise = 0 in training gives the same.
  lara->clear_samples();
  lara->eval();
  Tensor e = lara->forward(q, k, v, {});
  EXPECT_EQ(diff(lara->forward(q, k, v, {}), e), 0.0);
  EXPECT_EQ(lara->last_samples().count("eps"), 0u);
  auto quiet = make("lara:samples=3,noise=0", H, D);
  EXPECT_TRUE(all_close(quiet->forward(q, k, v, {}), e, 1e-14, 1e-12));
}

TEST(LinearRandomizedAttention, SpecOptionsAndMultiHeadAttention) {
  auto d = make("lara", 2, 4);
  EXPECT_EQ(d->samples(), 16);
  EXPECT_EQ(d->proposal(), Lara::Proposal::QK);
  EXPECT_FALSE(d->adaptive());
  EXPECT_EQ(d->noise(), 1.0);
  EXPECT_EQ(d->beta(), 1.0);
  EXPECT_TRUE(d->parameters().empty());
  auto m = make("lara:samples=5,proposal=mixed,adaptive=1,noise=0.5,beta=2", 2, 4);
  EXPECT_EQ(m->samples(), 5);
  EXPECT_EQ(m->proposal(), Lara::Proposal::Mixed);
  EXPECT_TRUE(m->adaptive());
  EXPECT_EQ(m->noise(), 0.5);
  EXPECT_EQ(m->beta(), 2.0);
  EXPECT_EQ(m->parameters().size(), 4u);
  EXPECT_NE(m->str().find("proposal=mixed"), std::string::npos);
  manual_seed(14);
  attn::MultiHeadAttention mha(8, 2, "lara:samples=3,adaptive=1");
  EXPECT_EQ(mha.forward(randn({2, 5, 8}), randn({2, 5, 8})).shape(), Shape({2, 5, 8}));
  EXPECT_EQ(mha.named_parameters().size(), 8u + 4u);  // 4 projections (weight, bias) + the proposal's
}

// The segment matrices are cached per length, dtype and device: one layer run at two lengths in
// float32, then in float64, gives what a new layer gives each time.
TEST(LinearRandomizedAttention, SegmentsFollowTheLengthAndDtype) {
  manual_seed(16);
  auto lara = attn::make_attention("lara:samples=3", 2, 4);
  lara->eval();
  const auto fresh = [](const Tensor& q, const Tensor& k, const Tensor& v) {
    auto l = make("lara:samples=3", 2, 4);
    l->eval();
    return l->forward(q, k, v, {});
  };
  for (int64_t N : {7, 5}) {
    Tensor q = r64({2, 2, N, 4}), k = r64({2, 2, N, 4}), v = r64({2, 2, N, 3});
    const auto f32 = [](const Tensor& t) { return t.to(DType::Float32); };
    EXPECT_TRUE(all_close(lara->forward(f32(q), f32(k), f32(v), {}).to(DType::Float64), fresh(q, k, v), 1e-5, 1e-5))
        << N;
  }
  lara->to(DType::Float64);
  Tensor q = r64({2, 2, 5, 4}), k = r64({2, 2, 5, 4}), v = r64({2, 2, 5, 3});
  EXPECT_TRUE(all_close(lara->forward(q, k, v, {}), fresh(q, k, v), 1e-12, 1e-12));
}

TEST(LinearRandomizedAttention, Float32FiniteForLargeInputs) {
  manual_seed(15);
  const int64_t B = 2, H = 2, N = 8, D = 16;
  const auto [q, k] = test::extreme_scores(B, H, N, D);
  Tensor v = randn({B, H, N, 3});
  std::vector<int> pad(static_cast<size_t>(B * N), 0);
  for (int64_t m = 0; m < N; ++m) pad[static_cast<size_t>(N + m)] = 1;  // batch 1 fully padded
  pad[2] = pad[3] = 1;                                                  // batch 0: a whole segment
  for (const char* spec : {"lara:samples=4", "lara:samples=4,proposal=mixed", "lara:samples=3,adaptive=1"})
    for (bool padded : {false, true}) {
      SCOPED_TRACE(std::string(spec) + (padded ? " padded" : ""));
      attn::AttentionOptions o;
      if (padded) o.key_padding_mask = mask_of(pad, B, N);
      Tensor qq = q.detach(), kk = k.detach(), vv = v.detach();
      for (Tensor* t : {&qq, &kk, &vv}) t->requires_grad_(true);
      auto lara = attn::make_attention(spec, H, D);
      Tensor out = lara->forward(qq, kk, vv, o);
      sum(square(out)).backward();
      for (const Tensor& t : {out, qq.grad(), kk.grad(), vv.grad()}) ASSERT_TRUE(test::all_finite(t));
      if (padded) {
        EXPECT_EQ(max(abs(select(out, 0, 1))).item<float>(), 0.0f);
      }
      lara->eval();
      ASSERT_TRUE(test::all_finite(lara->forward(q, k, v, o)));
    }
}

// ---- the fused mixture weights (the CPU path) --------------------------------------------------------
// Inputs of lara_mixture: q [B, H, N, D], qbar and w [B, H, C, D], self_w (positive) and bias [B, H, C].
std::vector<Tensor> mixture_inputs(int64_t B, int64_t H, int64_t N, int64_t C, int64_t D) {
  return {randn64({B, H, N, D}), randn64({B, H, C, D}), randn64({B, H, C, D}), exp(randn64({B, H, C})),
          randn64({B, H, C})};
}

TEST(LaraMixture, FusedEqualsComposed) {
  manual_seed(70);
  // beta = 40 pushes some alpha below the floor: the clamp is exercised too. q_scale s: the
  // weights of q~ = s q, composed from the scaled copy.
  for (double beta : {0.0, 1.0, 40.0})
    for (double s : {1.0, 0.6}) {
      SCOPED_TRACE("beta " + std::to_string(beta) + " q_scale " + std::to_string(s));
      const std::vector<Tensor> in = mixture_inputs(2, 3, 50, 6, 4);
      const Tensor fused = lara_mixture(in[0], in[1], in[2], in[3], in[4], beta, 1e-8, s);
      EXPECT_TRUE(all_close(fused, attn::mixture_weights(in[0] * s, in[1], in[2], in[3], in[4], beta), 1e-12, 1e-13));
      std::vector<Tensor> in32;
      for (const Tensor& t : in) in32.push_back(t.to(DType::Float32));
      EXPECT_TRUE(all_close(lara_mixture(in32[0], in32[1], in32[2], in32[3], in32[4], beta, 1e-8, s).to(DType::Float64),
                            fused, 1e-4, 1e-5));
      // The gradients equal those through the scaled copy (whose backward scales q's by s).
      std::vector<Tensor> a, b;
      for (const Tensor& t : in) {
        a.push_back(t.detach().requires_grad_(true));
        b.push_back(t.detach().requires_grad_(true));
      }
      const Tensor g = randn64(fused.shape());
      lara_mixture(a[0], a[1], a[2], a[3], a[4], beta, 1e-8, s).backward(g);
      lara_mixture(b[0] * s, b[1], b[2], b[3], b[4], beta, 1e-8).backward(g);
      for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(all_close(a[i].grad(), b[i].grad(), 1e-12, 1e-12)) << i;
    }
}

TEST(GradCheck, LaraMixtureFused) {
  manual_seed(71);
  for (double beta : {1.0, 40.0}) {
    std::vector<Tensor> in = mixture_inputs(2, 2, 7, 3, 4);
    if (beta > 1) {  // check that the clamp is active somewhere, so its zero gradient is checked
      NoGradGuard ng;
      const Tensor t = softmax(matmul(in[0], transpose(in[1], -2, -1)), 2);
      const Tensor a = unsqueeze(in[3], 2) + (t - mean(t, {-1}, true)) * beta;
      ASSERT_LT(min(a).item<double>(), 1e-8);
    }
    EXPECT_GRADCHECK(
        [beta](const std::vector<Tensor>& x) { return lara_mixture(x[0], x[1], x[2], x[3], x[4], beta, 1e-8); }, in)
        << beta;
    EXPECT_GRADCHECK(
        [beta](const std::vector<Tensor>& x) { return lara_mixture(x[0], x[1], x[2], x[3], x[4], beta, 1e-8, 0.7); },
        in)
        << beta << " q_scale 0.7";
  }
}

TEST(LaraMixture, BadInputsThrow) {
  const std::vector<Tensor> in = mixture_inputs(1, 2, 5, 3, 4);
  EXPECT_LINEA_ERROR(lara_mixture(in[0], in[1], randn64({1, 2, 3, 5}), in[3], in[4], 1.0, 1e-8),
                     "lara_mixture: expected q [B, H, N, D], qbar and w [B, H, C, D], self_w and bias [B, H, C]");
  EXPECT_LINEA_ERROR(lara_mixture(in[0], in[1], in[2], randn64({1, 2, 4}), in[4], 1.0, 1e-8), "self_w [1, 2, 4]");
  EXPECT_LINEA_ERROR(lara_mixture(in[0], in[1], in[2], in[3], in[4].to(DType::Float32), 1.0, 1e-8), "lara_mixture");
}

// ---- the fused proposal weights (the CPU path) -------------------------------------------------
// Inputs of lara_proposals: w and mu [B, H, C, D], lse_k [B, H, C].
std::vector<Tensor> proposal_inputs(int64_t B, int64_t H, int64_t C, int64_t D) {
  return {randn64({B, H, C, D}), randn64({B, H, C, D}), randn64({B, H, C})};
}

// Values and gradients against the composed formula (both outputs weighted), in float64 and
// float32, and with w and mu one tensor (the layer in eval, where w = mu).
TEST(LaraProposals, FusedEqualsComposed) {
  manual_seed(72);
  for (bool same : {false, true})
    for (int64_t C : {1, 5, 40}) {
      SCOPED_TRACE(std::string(same ? "w = mu" : "w, mu") + " C " + std::to_string(C));
      std::vector<Tensor> in = proposal_inputs(2, 3, C, 7);
      if (same) in[0] = in[1];
      auto [self_w, bias] = lara_proposals(in[0], in[1], in[2]);
      auto [self_ref, bias_ref] = attn::proposal_weights(in[0], in[1], in[2]);
      EXPECT_TRUE(all_close(self_w, self_ref, 1e-12, 1e-14));
      EXPECT_TRUE(all_close(bias, bias_ref, 1e-12, 1e-12));
      auto [self32, bias32] =
          lara_proposals(in[0].to(DType::Float32), in[1].to(DType::Float32), in[2].to(DType::Float32));
      EXPECT_TRUE(all_close(self32.to(DType::Float64), self_w, 1e-4, 1e-6));
      EXPECT_TRUE(all_close(bias32.to(DType::Float64), bias, 1e-4, 1e-4));

      const Tensor gs = randn64(self_w.shape()), gb = randn64(bias.shape());
      std::vector<Tensor> a, b;
      for (const Tensor& t : {in[0], in[1], in[2]}) {
        a.push_back(t.detach().requires_grad_(true));
        b.push_back(t.detach().requires_grad_(true));
      }
      if (same) a[0] = a[1], b[0] = b[1];
      auto [sa, ba] = lara_proposals(a[0], a[1], a[2]);
      sum(sa * gs + ba * gb).backward();
      auto [sb, bb] = attn::proposal_weights(b[0], b[1], b[2]);
      sum(sb * gs + bb * gb).backward();
      for (size_t i = same ? 1 : 0; i < a.size(); ++i)
        EXPECT_TRUE(all_close(a[i].grad(), b[i].grad(), 1e-11, 1e-12)) << i;
    }
}

// Both outputs, and each alone (then the other's gradient is absent at the node).
TEST(GradCheck, LaraProposalsFused) {
  manual_seed(73);
  for (int which : {0, 1, 2}) {
    SCOPED_TRACE(which == 0 ? "both" : which == 1 ? "self_w only" : "bias only");
    const Fn f = [which](const std::vector<Tensor>& x) {
      auto [self_w, bias] = lara_proposals(x[0], x[1], x[2]);
      return which == 1 ? self_w : which == 2 ? bias : cat({self_w, bias}, 2);
    };
    EXPECT_GRADCHECK(f, proposal_inputs(2, 2, 4, 3));
  }
  // w and mu one tensor
  EXPECT_GRADCHECK(
      [](const std::vector<Tensor>& x) {
        auto [self_w, bias] = lara_proposals(x[0], x[0], x[1]);
        return cat({self_w, bias}, 2);
      },
      {randn64({1, 2, 5, 3}), randn64({1, 2, 5})});
}

TEST(LaraProposals, BadInputsThrow) {
  const std::vector<Tensor> in = proposal_inputs(1, 2, 3, 4);
  EXPECT_LINEA_ERROR(
      lara_proposals(in[0], randn64({1, 2, 3, 5}), in[2]),
      "lara_proposals: expected w and mu [B, H, C, D], lse_k [B, H, C] (all dims > 0), got w [1, 2, 3, 4], "
      "mu [1, 2, 3, 5]");
  EXPECT_LINEA_ERROR(lara_proposals(in[0], in[1], randn64({1, 2, 4})), "lse_k [1, 2, 4]");
  EXPECT_LINEA_ERROR(lara_proposals(in[0], in[1].to(DType::Float32), in[2]), "lara_proposals");
  EXPECT_LINEA_ERROR(lara_proposals(randn64({1, 2, 0, 4}), randn64({1, 2, 0, 4}), randn64({1, 2, 0})), "all dims > 0");
  const TensorOptions i64(DType::Int64);
  EXPECT_LINEA_ERROR(lara_proposals(zeros({1, 2, 3, 4}, i64), zeros({1, 2, 3, 4}, i64), zeros({1, 2, 3}, i64)),
                     "lara_proposals: expected float32 or float64, got int64");
}

TEST(LinearRandomizedAttention, Errors) {
  Tensor q = randn({1, 2, 6, 4}), k = randn({1, 2, 6, 4}), v = randn({1, 2, 6, 2});
  auto lara = attn::make_attention("lara:samples=3", 2, 4);
  attn::AttentionOptions causal;
  causal.causal = true;
  EXPECT_LINEA_ERROR(lara->forward(q, k, v, causal), "lara: causal attention is not supported");
  EXPECT_LINEA_ERROR(lara->attention_matrix(q, k, causal), "lara: causal");
  EXPECT_LINEA_ERROR(lara->forward(q, randn({1, 2, 5, 4}), randn({1, 2, 5, 2}), {}),
                     "lara: only self-attention is supported");
  EXPECT_LINEA_ERROR(lara->forward(q, k, randn({1, 2, 5, 2}), {}), "shapes do not match");
  EXPECT_LINEA_ERROR(lara->forward(randn({1, 2, 6, 8}), randn({1, 2, 6, 8}), v, {}),
                     "lara: built for 2 heads of dim 4, got q [1, 2, 6, 8]");
  EXPECT_LINEA_ERROR(Lara(2, 4, 3, Lara::Proposal::QK, false, -1.0, 1.0), "lara: noise must be >= 0, got -1");
  EXPECT_LINEA_ERROR(Lara(2, 4, 3, Lara::Proposal::QK, false, 1.0, INFINITY), "lara: beta must be finite");
  EXPECT_LINEA_ERROR(attn::make_attention("lara:samples=0", 2, 4), "samples must be positive");
  EXPECT_LINEA_ERROR(attn::make_attention("lara:samples=1000000000000", 2, 4),
                     "lara: samples 1000000000000 is more than the limit of 65536");
  EXPECT_LINEA_ERROR(attn::make_attention("lara:proposal=kq", 2, 4), "proposal must be qk or mixed");
  EXPECT_LINEA_ERROR(attn::make_attention("lara:noise=-1", 2, 4), "noise must be >= 0");
  EXPECT_LINEA_ERROR(attn::make_attention("lara:beta=x", 2, 4), "expects a number");
  EXPECT_LINEA_ERROR(attn::make_attention("lara:adaptive=2", 2, 4), "expects a boolean");
  EXPECT_LINEA_ERROR(attn::make_attention("lara:landmarks=4", 2, 4), "unknown option");
  // eps must be [B, H, C_eff, D]: C_eff = 3 here, min(C, N) = N = 2 below.
  lara->set_samples({{"eps", randn({1, 2, 4, 4})}});
  EXPECT_LINEA_ERROR(lara->forward(q, k, v, {}),
                     "sample 'eps' has shape [1, 2, 4, 4] but this call needs [1, 2, 3, 4]");
  lara->set_samples({{"eps", randn({1, 2, 3, 4})}});
  EXPECT_LINEA_ERROR(lara->forward(narrow(q, 2, 0, 2), narrow(k, 2, 0, 2), narrow(v, 2, 0, 2), {}),
                     "needs [1, 2, 2, 4]");
  EXPECT_LINEA_ERROR(lara->set_samples({{"omega", randn({2, 3, 4})}}), "unknown sample 'omega'");
}

}  // namespace
}  // namespace linea
