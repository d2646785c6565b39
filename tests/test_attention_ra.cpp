// Randomized attention (`ra`, attention/ra): values against a naive float64 loop implementation of
// the formulas given explicit samples (unbiased, biased, padded with its weights, eval), float64
// gradchecks with frozen samples, the RA paper's claim (the average over S samples converges to
// softmax attention with an error falling like 1/sqrt(S); biased RA keeps a bias), the index
// sampler (the fused op against its float64 definition and the composed formula; never a padded
// key, frequencies follow pi), padding invariance, train/eval/freeze behaviour, float32 finiteness
// for large inputs, and errors.
#include <cmath>
#include <string>
#include <vector>

#include "attention/ra/ra.h"
#include "attention/softmax/softmax.h"
#include "attention/transformer.h"
#include "tests/test_util.h"

namespace linea {
namespace {

using test::all_close;
using test::f64;
using test::randn64;

// ---- the naive reference ------------------------------------------------------------------------
// RA by loops in float64, from the formulas of ra.h: for each (b, h, n) and sample s,
//   w = q~ + k~[index] + eps (unbiased) or q~ + sum_m pi_m k~_m + eps (biased), eps = 0 if absent,
//   a_s(m) = exp(w.k~_m - |k~_m|^2/2) / sum over visible m' (padded keys invisible),
// A[n, m] = mean_s a_s(m); out = A v. A query with no visible key gets zeros.
struct NaiveRa {
  std::vector<double> A;  // [B, H, N, M]
  Tensor out;             // [B, H, N, Dv]
};

NaiveRa naive_ra(const Tensor& q, const Tensor& k, const Tensor& v, const std::vector<int>& pad, bool biased,
                 const Tensor& index, const Tensor& eps, int64_t S) {
  const int64_t B = q.size(0), H = q.size(1), N = q.size(2), D = q.size(3), M = k.size(2), Dv = v.size(3);
  const double sc = std::pow(static_cast<double>(D), -0.25);
  auto qv = q.to_vector<double>(), kv = k.to_vector<double>(), vv = v.to_vector<double>();
  std::vector<double> ev = eps.defined() ? eps.to_vector<double>() : std::vector<double>();
  std::vector<int64_t> iv = index.defined() ? index.to_vector<int64_t>() : std::vector<int64_t>();
  NaiveRa r;
  r.A.assign(static_cast<size_t>(B * H * N * M), 0.0);
  std::vector<double> out(static_cast<size_t>(B * H * N * Dv), 0.0);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h) {
      const int64_t bh = b * H + h;
      auto qt = [&](int64_t n, int64_t d) { return sc * qv[static_cast<size_t>((bh * N + n) * D + d)]; };
      auto kt = [&](int64_t m, int64_t d) { return sc * kv[static_cast<size_t>((bh * M + m) * D + d)]; };
      auto visible = [&](int64_t m) { return pad.empty() || !pad[static_cast<size_t>(b * M + m)]; };
      for (int64_t n = 0; n < N; ++n) {
        // pi over visible keys
        std::vector<double> pi(static_cast<size_t>(M), 0.0);
        double mx = -INFINITY;
        for (int64_t m = 0; m < M; ++m) {
          if (!visible(m)) continue;
          double s = 0;
          for (int64_t d = 0; d < D; ++d) s += qt(n, d) * kt(m, d);
          pi[static_cast<size_t>(m)] = s;
          mx = std::max(mx, s);
        }
        if (mx == -INFINITY) continue;  // no visible key: zeros
        double z = 0;
        for (int64_t m = 0; m < M; ++m)
          if (visible(m)) z += std::exp(pi[static_cast<size_t>(m)] - mx);
        for (int64_t m = 0; m < M; ++m)
          pi[static_cast<size_t>(m)] = visible(m) ? std::exp(pi[static_cast<size_t>(m)] - mx) / z : 0.0;
        for (int64_t s = 0; s < S; ++s) {
          std::vector<double> w(static_cast<size_t>(D));
          for (int64_t d = 0; d < D; ++d) {
            double c = qt(n, d);
            if (biased) {
              for (int64_t m = 0; m < M; ++m) c += pi[static_cast<size_t>(m)] * kt(m, d);
            } else {
              c += kt(iv[static_cast<size_t>((bh * N + n) * S + s)], d);
            }
            if (!ev.empty()) c += ev[static_cast<size_t>(((bh * N + n) * S + s) * D + d)];
            w[static_cast<size_t>(d)] = c;
          }
          std::vector<double> lg(static_cast<size_t>(M));
          double lmx = -INFINITY;
          for (int64_t m = 0; m < M; ++m) {
            if (!visible(m)) continue;
            double dot = 0, nk = 0;
            for (int64_t d = 0; d < D; ++d) {
              dot += w[static_cast<size_t>(d)] * kt(m, d);
              nk += kt(m, d) * kt(m, d);
            }
            lg[static_cast<size_t>(m)] = dot - 0.5 * nk;
            lmx = std::max(lmx, lg[static_cast<size_t>(m)]);
          }
          double lz = 0;
          for (int64_t m = 0; m < M; ++m)
            if (visible(m)) lz += std::exp(lg[static_cast<size_t>(m)] - lmx);
          for (int64_t m = 0; m < M; ++m)
            if (visible(m))
              r.A[static_cast<size_t>((bh * N + n) * M + m)] += std::exp(lg[static_cast<size_t>(m)] - lmx) / lz / S;
        }
        for (int64_t m = 0; m < M; ++m)
          for (int64_t e = 0; e < Dv; ++e)
            out[static_cast<size_t>((bh * N + n) * Dv + e)] +=
                r.A[static_cast<size_t>((bh * N + n) * M + m)] * vv[static_cast<size_t>((bh * M + m) * Dv + e)];
      }
    }
  r.out = from_vector<double>(out, {B, H, N, Dv});
  return r;
}

Tensor r64(const Shape& s) { return randn(s, f64()); }

Tensor mask_of(const std::vector<int>& pad, int64_t B, int64_t M) {
  return from_vector<int64_t>(std::vector<int64_t>(pad.begin(), pad.end()), {B, M});
}

std::shared_ptr<attn::RandomizedAttention> make(int64_t H, int64_t D, int64_t S, bool biased) {
  return std::make_shared<attn::RandomizedAttention>(H, D, S, biased);
}

// ---- values against the naive loops ------------------------------------------------------------
TEST(RandomizedAttention, UnbiasedMatchesNaiveLoops) {
  manual_seed(1);
  const int64_t B = 2, H = 2, N = 5, M = 7, D = 4, Dv = 3, S = 3;  // cross-attention: M != N
  Tensor q = r64({B, H, N, D}), k = r64({B, H, M, D}), v = r64({B, H, M, Dv});
  Tensor index = randint(0, M, {B, H, N, S}), eps = r64({B, H, N, S, D});
  auto ra = make(H, D, S, false);
  ra->set_samples({{"ra_index", index}, {"eps", eps}});
  NaiveRa ref = naive_ra(q, k, v, {}, false, index, eps, S);
  EXPECT_TRUE(all_close(ra->forward(q, k, v, {}), ref.out, 1e-12, 1e-12));
  EXPECT_TRUE(all_close(ra->attention_matrix(q, k, {}), from_vector<double>(ref.A, {B, H, N, M}), 1e-12, 1e-12));
  // Eval changes nothing for unbiased RA when the samples are given.
  ra->eval();
  EXPECT_TRUE(all_close(ra->forward(q, k, v, {}), ref.out, 1e-12, 1e-12));
}

TEST(RandomizedAttention, BiasedMatchesNaiveLoopsTrainAndEval) {
  manual_seed(2);
  const int64_t B = 2, H = 3, N = 6, M = 4, D = 5, Dv = 2, S = 2;
  Tensor q = r64({B, H, N, D}), k = r64({B, H, M, D}), v = r64({B, H, M, Dv});
  Tensor eps = r64({B, H, N, S, D});
  auto ra = make(H, D, S, true);
  ra->set_samples({{"eps", eps}});
  EXPECT_TRUE(all_close(ra->forward(q, k, v, {}), naive_ra(q, k, v, {}, true, {}, eps, S).out, 1e-12, 1e-12));
  // Eval: eps = 0, nothing drawn or recorded.
  ra->eval();
  ra->clear_samples();
  EXPECT_TRUE(all_close(ra->forward(q, k, v, {}), naive_ra(q, k, v, {}, true, {}, {}, 1).out, 1e-12, 1e-12));
  EXPECT_EQ(ra->last_samples().count("eps"), 0u);
}

TEST(RandomizedAttention, PaddedMatchesNaiveLoopsWithDrawnSamples) {
  manual_seed(3);
  const int64_t B = 3, H = 2, N = 4, M = 6, D = 3, Dv = 2, S = 4;
  // batch 0 pads keys 1 and 4, batch 1 every key, batch 2 only key 5.
  const std::vector<int> pad = {0, 1, 0, 0, 1, 0, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 1};
  attn::AttentionOptions o;
  o.key_padding_mask = mask_of(pad, B, M);
  Tensor q = r64({B, H, N, D}), k = r64({B, H, M, D}), v = r64({B, H, M, Dv});
  for (bool biased : {false, true}) {
    SCOPED_TRACE(biased ? "biased" : "unbiased");
    auto ra = make(H, D, S, biased);
    Tensor out = ra->forward(q, k, v, o);               // drawn samples, recorded in last_samples()
    const attn::AttentionSamples s = ra->last_samples();  // a copy: later forwards overwrite it
    NaiveRa ref = naive_ra(q, k, v, pad, biased, biased ? Tensor() : s.at("ra_index"), s.at("eps"), S);
    EXPECT_TRUE(all_close(out, ref.out, 1e-12, 1e-12));
    EXPECT_EQ(max(abs(select(out, 0, 1))).item<double>(), 0.0);  // fully padded batch: zeros
    // Bool mask: the same.
    o.key_padding_mask = ne(mask_of(pad, B, M), 0.0);
    ra->set_samples(s);
    EXPECT_TRUE(all_close(ra->forward(q, k, v, o), ref.out, 1e-12, 1e-12));
    // The weights with the same samples: zero at padded keys, zero rows where every key is.
    ra->set_samples(s);
    EXPECT_TRUE(all_close(ra->attention_matrix(q, k, o), from_vector<double>(ref.A, {B, H, N, M}), 1e-12, 1e-12));
    o.key_padding_mask = mask_of(pad, B, M);
  }
}

// ---- gradchecks (float64, samples frozen) --------------------------------------------------------
using Fn = std::function<Tensor(const std::vector<Tensor>&)>;

Fn frozen_forward(const std::shared_ptr<attn::RandomizedAttention>& ra, const attn::AttentionOptions& o,
                  const std::vector<Tensor>& x) {
  ra->freeze_samples(true);
  ra->forward(x[0].detach(), x[1].detach(), x[2].detach(), o);  // draws the samples once
  return [ra, o](const std::vector<Tensor>& in) { return ra->forward(in[0], in[1], in[2], o); };
}

TEST(GradCheck, RaUnbiased) {
  manual_seed(4);
  auto ra = make(2, 4, 2, false);
  std::vector<Tensor> x = {randn64({2, 2, 5, 4}), randn64({2, 2, 4, 4}), randn64({2, 2, 4, 3})};
  EXPECT_GRADCHECK(frozen_forward(ra, {}, x), x);
}

TEST(GradCheck, RaBiased) {
  manual_seed(5);
  auto ra = make(2, 4, 2, true);
  std::vector<Tensor> x = {randn64({2, 2, 5, 4}), randn64({2, 2, 6, 4}), randn64({2, 2, 6, 3})};
  EXPECT_GRADCHECK(frozen_forward(ra, {}, x), x);
  ra->eval();  // eps = 0
  EXPECT_GRADCHECK(frozen_forward(ra, {}, x), x);
}

TEST(GradCheck, RaPadded) {
  manual_seed(6);
  attn::AttentionOptions o;
  o.key_padding_mask = tensor<int64_t>({0, 1, 0, 0, 1, 1, 1, 1, 1, 1}, {2, 5});  // batch 1 fully padded
  for (bool biased : {false, true}) {
    SCOPED_TRACE(biased ? "biased" : "unbiased");
    auto ra = make(2, 3, 2, biased);
    std::vector<Tensor> x = {randn64({2, 2, 4, 3}), randn64({2, 2, 5, 3}), randn64({2, 2, 5, 2})};
    EXPECT_GRADCHECK(frozen_forward(ra, o, x), x);
  }
}

// ---- the paper's claim: the sample average converges to softmax ----------------------------------
// Mean squared error to exact softmax attention of the S-sample estimate, over all outputs.
double mse_to_softmax(bool biased, int64_t S, const Tensor& q, const Tensor& k, const Tensor& v) {
  auto ra = make(q.size(1), q.size(3), S, biased);
  NoGradGuard ng;
  Tensor out = ra->forward(q, k, v, {});
  return mean(square(sub(out, attn::softmax_attention(q, k, v)))).item<double>();
}

// Unbiased RA: E_w[sum_m softmax_m(log xi(k~_m, w)) v_m] over w ~ sum_m pi_nm N(q~_n + k~_m, I) IS
// softmax attention (the mixture's density is proportional to exp(w.q~_n - |w|^2/2) sum_m
// xi(k~_m, w)), and the S samples are independent, so E[MSE(S)] = sigma^2 / S exactly: the RMSE
// falls like S^-1/2 (log-log slope -1/2). The fluctuation of the measured MSE: it averages the
// squared errors of K = B*H*N = 128 independent queries, each (CLT, bounded terms) about
// sigma_n^2 / S * chi^2_1, so its relative sd is about sqrt(2/K) = 0.125, i.e. sd(ln RMSE) about
// 0.06 per point; the least-squares slope over ln S = ln 16 .. ln 1024 (sum of squared deviations
// 9.6) then has sd about 0.06 / sqrt(9.6) = 0.02, and the window [-0.65, -0.35] is 7 sd wide on
// each side. Fresh samples at every S (independent points).
TEST(RandomizedAttention, AverageConvergesToSoftmaxAsInverseSqrtSamples) {
  manual_seed(7);
  const int64_t B = 2, H = 4, N = 16, D = 8;
  Tensor q = mul(r64({B, H, N, D}), 1.5), k = mul(r64({B, H, N, D}), 1.5), v = r64({B, H, N, 4});
  const std::vector<int64_t> Ss = {16, 64, 256, 1024};
  std::vector<double> x, y;
  for (int64_t S : Ss) {
    const double mse = mse_to_softmax(false, S, q, k, v);
    x.push_back(std::log(static_cast<double>(S)));
    y.push_back(0.5 * std::log(mse));  // ln RMSE
  }
  double mx = 0, my = 0;
  for (size_t i = 0; i < x.size(); ++i) mx += x[i] / x.size(), my += y[i] / y.size();
  double sxy = 0, sxx = 0;
  for (size_t i = 0; i < x.size(); ++i) sxy += (x[i] - mx) * (y[i] - my), sxx += (x[i] - mx) * (x[i] - mx);
  const double slope = sxy / sxx;
  std::string rmse = "RMSE at S = 16, 64, 256, 1024:";
  for (double ly : y) rmse += " " + std::to_string(std::exp(ly));
  EXPECT_GE(slope, -0.65) << rmse;  // measured: -0.49 (other seeds: -0.48 .. -0.51)
  EXPECT_LE(slope, -0.35) << rmse;
}

// Biased RA: E[MSE(S)] = |bias|^2 + sigma_b^2 / S. Going from S = 64 to S = 1024 divides an
// unbiased MSE by 16; the biased one stays above its bias. The check: MSE_b(1024) > MSE_b(64) / 4
// (a quarter: four times the 1/16 of an unbiased estimator, far beyond the 12% sd of each MSE),
// and MSE_b(1024) is several times the unbiased MSE at the same S (measured: 0.017 at S = 64,
// 0.014 at S = 1024, against 4e-4 for unbiased RA at S = 1024).
TEST(RandomizedAttention, BiasedDoesNotConvergeToSoftmax) {
  manual_seed(8);
  const int64_t B = 2, H = 4, N = 16, D = 8;
  Tensor q = mul(r64({B, H, N, D}), 1.5), k = mul(r64({B, H, N, D}), 1.5), v = r64({B, H, N, 4});
  const double b64 = mse_to_softmax(true, 64, q, k, v), b1024 = mse_to_softmax(true, 1024, q, k, v);
  const double u1024 = mse_to_softmax(false, 1024, q, k, v);
  EXPECT_GT(b1024, b64 / 4) << "biased MSE at S=64: " << b64 << ", S=1024: " << b1024;
  EXPECT_GT(b1024, 4 * u1024) << "biased " << b1024 << " vs unbiased " << u1024 << " at S=1024";
}

// ---- the index sampler ------------------------------------------------------------------------
// The fused sampler RA draws with (sample_attention_keys) against its definition in float64
// (test::inverse_cdf_draws) and against the composed formula it replaced (masked_softmax, cumsum,
// searchsorted of u times the total, clamped to the last key with p > 0): sizes off every tile, a
// scale, padding with one batch all padded (key 0), more draws than a warp's 32.
TEST(RandomizedAttention, FusedSamplerIsTheInverseCdfOfTheComposedProbabilities) {
  manual_seed(4);
  const int64_t B = 3, H = 2, N = 9, M = 70, D = 37, S = 35;
  const double scale = 0.6;
  std::vector<int> pad(static_cast<size_t>(B * M), 0);
  for (int64_t m = 0; m < M; ++m) {
    pad[static_cast<size_t>(m)] = m % 3 == 1;
    pad[static_cast<size_t>(2 * M + m)] = 1;
  }
  const Tensor pm = mask_of(pad, B, M).to(DType::Bool);
  for (DType dt : {DType::Float64, DType::Float32}) {
    SCOPED_TRACE(dtype_name(dt));
    const Tensor q = mul(randn({B, H, N, D}, f64()), 0.8).to(dt), k = randn({B, H, M, D}, f64()).to(dt);
    const Tensor u = rand({B, H, N, S}, f64()).to(dt);
    const Tensor idx = sample_attention_keys(q, k, u, scale, pm);
    EXPECT_TRUE(test::inverse_cdf_draws(idx, q, k, u, scale, pm, dt == DType::Float64 ? 1e-12 : 5e-5));
    const Tensor pi = attn::masked_softmax(mul(matmul(q, transpose(k, -2, -1)), scale), reshape(pm, {B, 1, 1, M}), -1);
    const Tensor cdf = cumsum(pi, -1);
    const Tensor count = searchsorted(cdf, u * narrow(cdf, 3, M - 1, 1), /*right=*/true);
    const Tensor pos = reshape(arange(0.0, static_cast<double>(M), 1.0, TensorOptions(DType::Int64)), {1, 1, 1, M});
    const Tensor composed = minimum(count, max(where(pi > 0.0, pos, 0.0), {-1}, true));
    // Both the same draws up to rounding at a boundary (float32 sums in another order); in float64 equal.
    EXPECT_TRUE(test::inverse_cdf_draws(composed, q, k, u, scale, pm, dt == DType::Float64 ? 1e-12 : 5e-5));
    const auto a = idx.to_vector<int64_t>();
    if (dt == DType::Float64) {
      EXPECT_EQ(a, composed.to_vector<int64_t>());
    }
    for (int64_t i = 2 * H * N * S; i < B * H * N * S; ++i) ASSERT_EQ(a[static_cast<size_t>(i)], 0) << "all padded";
  }
  EXPECT_LINEA_ERROR(sample_attention_keys(randn({1, 1, 2, 3}), randn({1, 1, 0, 3}), rand({1, 1, 2, 4}), 1.0),
                     "sdpa_sample: needs at least one key");
  EXPECT_LINEA_ERROR(sample_attention_keys(randn({1, 1, 2, 3}), randn({1, 1, 5, 3}), rand({1, 1, 3, 4}), 1.0),
                     "sdpa_sample: expected u [B, H, N, S] = [1, 1, 2, S], got [1, 1, 3, 4]");
}

// The checker above can fail: a draw moved to the next key, to a padded key or past the last
// visible key, draws of another shape, and draws checked against another scale.
TEST(RandomizedAttention, InverseCdfCheckerFailsWrongDraws) {
  manual_seed(5);
  const int64_t B = 1, H = 1, N = 4, M = 6, D = 3, S = 8;
  const Tensor pm = tensor<bool>({false, false, true, false, false, true}, {B, M});
  const Tensor q = randn({B, H, N, D}, f64()), k = randn({B, H, M, D}, f64()), u = rand({B, H, N, S}, f64());
  const Tensor idx = sample_attention_keys(q, k, u, 1.0, pm);
  ASSERT_TRUE(test::inverse_cdf_draws(idx, q, k, u, 1.0, pm, 1e-12));
  std::vector<int64_t> v = idx.to_vector<int64_t>();
  for (int64_t wrong : {v[0] + 1, int64_t{2}, int64_t{5}}) {
    if (wrong == v[0]) continue;
    std::vector<int64_t> w = v;
    w[0] = wrong;
    EXPECT_FALSE(test::inverse_cdf_draws(from_vector<int64_t>(w, idx.shape()), q, k, u, 1.0, pm, 1e-12)) << wrong;
  }
  EXPECT_FALSE(test::inverse_cdf_draws(narrow(idx, 3, 0, S - 1), q, k, u, 1.0, pm, 1e-12));
  EXPECT_FALSE(test::inverse_cdf_draws(idx, q, k, u, 0.5, pm, 1e-12) &&
               test::inverse_cdf_draws(idx, q, k, u, 2.0, pm, 1e-12));  // another scale: other draws
}

// m_ns ~ Cat(pi_n): never a padded key (even when padded keys would score highest), and the
// frequencies over S = 4000 draws match pi within 5 binomial standard errors (36 cells: a false
// alarm has probability below 36 * 6e-7).
TEST(RandomizedAttention, IndexSamplerFollowsPiAndNeverPicksPaddedKeys) {
  manual_seed(9);
  const int64_t B = 2, H = 1, N = 3, M = 6, D = 4, S = 4000;
  Tensor q = r64({B, H, N, D});
  Tensor k = r64({B, H, M, D});
  // Padded keys aligned with the queries' sum: they would dominate pi if they were not masked.
  const std::vector<int> pad = {1, 0, 0, 1, 0, 0, 0, 0, 1, 1, 1, 0};
  Tensor pm = reshape(mask_of(pad, B, M).to(DType::Bool), {B, 1, M, 1});
  k = where(pm, mul(sum(q, {2}, true), 3.0), k);
  attn::AttentionOptions o;
  o.key_padding_mask = mask_of(pad, B, M);
  auto ra = make(H, D, S, false);
  ra->forward(q, k, r64({B, H, M, 2}), o);
  auto idx = ra->last_samples().at("ra_index").to_vector<int64_t>();
  // pi by the exact mechanism's attention matrix (softmax of q.k/sqrt(D) = q~.k~).
  auto pi = attn::SoftmaxAttention(H, D).attention_matrix(q, k, o).to_vector<double>();
  for (int64_t bn = 0; bn < B * N; ++bn) {
    const int64_t b = bn / N;
    std::vector<double> count(static_cast<size_t>(M), 0.0);
    for (int64_t s = 0; s < S; ++s) {
      const int64_t m = idx[static_cast<size_t>(bn * S + s)];
      ASSERT_TRUE(m >= 0 && m < M);
      ASSERT_FALSE(pad[static_cast<size_t>(b * M + m)]) << "padded key " << m << " drawn for batch " << b;
      count[static_cast<size_t>(m)] += 1;
    }
    for (int64_t m = 0; m < M; ++m) {
      const double p = pi[static_cast<size_t>(bn * M + m)], f = count[static_cast<size_t>(m)] / S;
      EXPECT_LE(std::fabs(f - p), 5 * std::sqrt(p * (1 - p) / S) + 1e-12) << "row " << bn << " key " << m;
    }
  }
}

// ---- padding, modes, samples ---------------------------------------------------------------------
TEST(RandomizedAttention, PaddedKeysDoNotChangeOutputs) {
  const int64_t B = 2, H = 2, N = 5, M = 6, D = 4;
  const std::vector<int> pad = {0, 0, 1, 0, 0, 1, 1, 0, 0, 0, 0, 0};
  attn::AttentionOptions o;
  o.key_padding_mask = mask_of(pad, B, M);
  Tensor pm = reshape(mask_of(pad, B, M).to(DType::Bool), {B, 1, M, 1});
  for (bool biased : {false, true}) {
    SCOPED_TRACE(biased ? "biased" : "unbiased");
    manual_seed(10);
    Tensor q = r64({B, H, N, D}), k = r64({B, H, M, D}), v = r64({B, H, M, 3});
    Tensor k2 = where(pm, mul(r64(k.shape()), 5.0), k), v2 = where(pm, mul(r64(v.shape()), 5.0), v);
    auto ra = make(H, D, 3, biased);
    // Same seed, new padded content: the draws (indices included) and the outputs are unchanged.
    manual_seed(11);
    Tensor a = ra->forward(q, k, v, o);
    manual_seed(11);
    Tensor b = ra->forward(q, k2, v2, o);
    EXPECT_TRUE(all_close(b, a, 1e-12, 1e-12));
  }
}

TEST(RandomizedAttention, TrainDrawsEvalFreezeAndSetSamples) {
  manual_seed(12);
  const int64_t B = 2, H = 2, N = 5, D = 4;
  Tensor q = r64({B, H, N, D}), k = r64({B, H, N, D}), v = r64({B, H, N, 3});
  auto diff = [](const Tensor& a, const Tensor& b) { return max(abs(sub(a, b))).item<double>(); };
  for (bool biased : {false, true}) {
    SCOPED_TRACE(biased ? "biased" : "unbiased");
    auto ra = make(H, D, 2, biased);
    EXPECT_EQ(ra->sample_names().size(), biased ? 1u : 2u);
    EXPECT_GT(diff(ra->forward(q, k, v, {}), ra->forward(q, k, v, {})), 1e-6) << "training redraws";
    // Frozen: the draws of the next forward are reused.
    ra->freeze_samples(true);
    Tensor a = ra->forward(q, k, v, {});
    EXPECT_EQ(diff(ra->forward(q, k, v, {}), a), 0.0);
    // forward == attention_matrix @ v with the same samples.
    EXPECT_TRUE(all_close(matmul(ra->attention_matrix(q, k, {}), v), a, 1e-13, 1e-12));
    // Explicit samples reproduce the frozen forward in a fresh layer.
    auto other = make(H, D, 2, biased);
    other->set_samples(ra->last_samples());
    EXPECT_EQ(diff(other->forward(q, k, v, {}), a), 0.0);
    ra->clear_samples();
    ra->eval();
    const double eval_diff = diff(ra->forward(q, k, v, {}), ra->forward(q, k, v, {}));
    if (biased) {
      EXPECT_EQ(eval_diff, 0.0) << "biased RA is deterministic in eval";
    } else {
      EXPECT_GT(eval_diff, 1e-6) << "unbiased RA stays a sample in eval (documented)";
    }
  }
}

TEST(RandomizedAttention, SpecOptionsAndMultiHeadAttention) {
  auto k = attn::make_attention("ra:samples=5,biased=1", 2, 4);
  auto* ra = dynamic_cast<attn::RandomizedAttention*>(k.get());
  ASSERT_NE(ra, nullptr);
  EXPECT_EQ(ra->samples(), 5);
  EXPECT_TRUE(ra->biased());
  auto d = attn::make_attention("ra", 2, 4);
  EXPECT_EQ(dynamic_cast<attn::RandomizedAttention*>(d.get())->samples(), 1);
  EXPECT_FALSE(dynamic_cast<attn::RandomizedAttention*>(d.get())->biased());
  EXPECT_NE(k->str().find("samples=5"), std::string::npos);
  manual_seed(13);
  attn::MultiHeadAttention mha(8, 2, "ra:samples=2");
  EXPECT_EQ(mha.forward(randn({2, 5, 8}), randn({2, 3, 8})).shape(), Shape({2, 5, 8}));  // cross-attention
}

TEST(RandomizedAttention, Float32FiniteForLargeInputs) {
  manual_seed(14);
  const int64_t B = 2, H = 2, N = 8, D = 16;
  const auto [q, k] = test::extreme_scores(B, H, N, D);
  Tensor v = randn({B, H, N, 3});
  std::vector<int> pad(static_cast<size_t>(B * N), 0);
  for (int64_t m = 0; m < N; ++m) pad[static_cast<size_t>(N + m)] = 1;  // batch 1 fully padded
  pad[3] = 1;
  for (bool biased : {false, true})
    for (bool padded : {false, true}) {
      SCOPED_TRACE(std::string(biased ? "biased" : "unbiased") + (padded ? " padded" : ""));
      attn::AttentionOptions o;
      if (padded) o.key_padding_mask = mask_of(pad, B, N);
      Tensor qq = q.detach(), kk = k.detach(), vv = v.detach();
      for (Tensor* t : {&qq, &kk, &vv}) t->requires_grad_(true);
      Tensor out = make(H, D, 4, biased)->forward(qq, kk, vv, o);
      sum(square(out)).backward();
      for (const Tensor& t : {out, qq.grad(), kk.grad(), vv.grad()}) ASSERT_TRUE(test::all_finite(t));
      if (padded) {
        EXPECT_EQ(max(abs(select(out, 0, 1))).item<float>(), 0.0f);
      }
    }
}

TEST(RandomizedAttention, Errors) {
  Tensor q = randn({1, 2, 3, 4}), k = randn({1, 2, 5, 4}), v = randn({1, 2, 5, 2});
  attn::AttentionOptions causal;
  causal.causal = true;
  EXPECT_LINEA_ERROR(make(2, 4, 1, false)->forward(q, k, v, causal), "ra: causal attention is not supported");
  EXPECT_LINEA_ERROR(make(2, 4, 1, true)->attention_matrix(q, k, causal), "ra: causal");
  EXPECT_LINEA_ERROR(attn::make_attention("ra:samples=0", 2, 4), "samples must be positive");
  EXPECT_LINEA_ERROR(attn::make_attention("ra:samples=-3", 2, 4), "samples must be positive");
  EXPECT_LINEA_ERROR(attn::make_attention("ra:samples=1000000000000", 2, 4),
                     "ra: samples 1000000000000 is more than the limit of 65536");
  EXPECT_LINEA_ERROR(attn::make_attention("ra:biased=maybe", 2, 4), "expects a boolean");
  EXPECT_LINEA_ERROR(attn::make_attention("ra:features=4", 2, 4), "unknown option");
  EXPECT_LINEA_ERROR(make(2, 4, 1, false)->forward(q, randn({1, 2, 5, 3}), v, {}), "ra");
  // Sample shapes, dtypes and values.
  auto ra = make(2, 4, 2, false);
  ra->set_samples({{"eps", randn({1, 2, 3, 1, 4})}});
  EXPECT_LINEA_ERROR(ra->forward(q, k, v, {}), "sample 'eps' has shape [1, 2, 3, 1, 4]");
  ra->clear_samples();
  ra->set_samples({{"ra_index", randint(0, 5, {1, 2, 3, 3})}});
  EXPECT_LINEA_ERROR(ra->forward(q, k, v, {}), "sample 'ra_index' has shape");
  ra->set_samples({{"ra_index", randint(0, 6, {1, 2, 3, 2}).fill_(5)}});
  EXPECT_LINEA_ERROR(ra->forward(q, k, v, {}), "values must lie in [0, M = 5), got values in [5, 5]");
  ra->set_samples({{"ra_index", randint(0, 6, {1, 2, 3, 2}).fill_(-1)}});
  EXPECT_LINEA_ERROR(ra->forward(q, k, v, {}), "values must lie in [0, M = 5), got values in [-1, -1]");
  ra->set_samples({{"ra_index", zeros({1, 2, 3, 2})}});
  EXPECT_LINEA_ERROR(ra->forward(q, k, v, {}), "must be int64");
  EXPECT_LINEA_ERROR(make(2, 4, 2, true)->set_samples({{"ra_index", randint(0, 5, {1, 2, 3, 2})}}),
                     "unknown sample 'ra_index'");
}

}  // namespace
}  // namespace linea
