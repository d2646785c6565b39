// The `performer` mechanism (attention/performer/): gradient checks (float64, omega explicit) of
// the bidirectional, causal (several chunks), padded, cross-attention, relu and trf variants; the
// FAVOR+ claim that phi(q~).phi(k~) is unbiased for exp(q~.k~) (orthogonal and i.i.d. rows, trf
// too); causal performer == masked quadratic attention with the same features, for any chunk
// length and with a query offset, and future tokens never reach past outputs; padded keys change
// nothing, however large; the redraw schedule, eval determinism and the sample API; forward ==
// attention_matrix @ v (causal with an offset too; zero rows where every key is padded); finiteness in
// float32 at |q~| = |k~| = 5; errors. The fused feature op (positive_features, performer's and
// nprf_rpe's map on the CPU) against the formula by loops, in blocks and with padding, and its
// gradient check through a ratio in which its stabilizer cancels; the fused bidirectional
// linear_attention against the composed formula, guard included, and its gradient check; the
// fused causal_linear_attention against the masked quadratic formula for chunks of 1 to more than
// N rows, with and without a carried state (and the final state it hands on), and its gradient
// check in all four inputs.
#include <algorithm>
#include <array>
#include <cmath>
#include <memory>
#include <vector>

#include "attention/performer/performer.h"
#include "attention/transformer.h"
#include "tests/test_util.h"

namespace linea {
namespace {

using attn::causal_hidden;
using attn::FeatureMap;
using attn::PerformerAttention;
using test::all_close;
using test::f64;
using test::randn64;
using Fn = std::function<Tensor(const std::vector<Tensor>&)>;

Tensor r64(const Shape& s) { return randn(s, f64()); }

// A float64 performer with omega [H, S, D] set explicitly (so it is a deterministic function).
std::shared_ptr<PerformerAttention> performer64(int64_t H, int64_t D, int64_t S, FeatureMap kind, int64_t chunk,
                                                Tensor* omega_out = nullptr) {
  auto p = std::make_shared<PerformerAttention>(H, D, S, kind, /*redraw=*/1, chunk);
  p->to(DType::Float64);
  Tensor w = attn::orthogonal_gaussian(H, S, D);
  p->set_samples({{"omega", w}});
  if (omega_out) *omega_out = w;
  return p;
}

Fn forward_fn(const std::shared_ptr<PerformerAttention>& p, attn::AttentionOptions o) {
  return [p, o](const std::vector<Tensor>& x) { return p->forward(x[0], x[1], x[2], o); };
}

// The independent reference: phi's from performer_features (unstabilized), then by loops
// out_n = sum_{m visible} (phi_q[n].phi_k[m]) v_m / sum_{m visible} phi_q[n].phi_k[m], where m is
// visible iff !pad[b][m] && (!causal || m <= offset + n); a row with no visible key gives zeros.
Tensor reference(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& omega, FeatureMap kind, bool causal,
                 const std::vector<int>& pad = {}, int64_t offset = 0) {
  NoGradGuard ng;
  const int64_t B = q.size(0), H = q.size(1), N = q.size(2), M = k.size(2), Dv = v.size(3);
  Tensor fq = attn::performer_features(attn::scaled(q), omega, kind),
         fk = attn::performer_features(attn::scaled(k), omega, kind);
  const int64_t F = fq.size(3);
  auto pq = fq.to_vector<double>(), pk = fk.to_vector<double>(), vv = v.contiguous().to_vector<double>();
  std::vector<double> out(static_cast<size_t>(B * H * N * Dv), 0.0);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t n = 0; n < N; ++n) {
        std::vector<double> num(Dv, 0.0);
        double den = 0;
        for (int64_t m = 0; m < M; ++m) {
          if ((!pad.empty() && pad[b * M + m]) || (causal && m > offset + n)) continue;
          double a = 0;
          for (int64_t f = 0; f < F; ++f) a += pq[((b * H + h) * N + n) * F + f] * pk[((b * H + h) * M + m) * F + f];
          den += a;
          for (int64_t e = 0; e < Dv; ++e) num[e] += a * vv[((b * H + h) * M + m) * Dv + e];
        }
        if (den == 0) continue;
        for (int64_t e = 0; e < Dv; ++e) out[((b * H + h) * N + n) * Dv + e] = num[e] / den;
      }
  return from_vector<double>(out, {B, H, N, Dv});
}

Tensor mask_of(const std::vector<int>& pad, int64_t B, int64_t M) {
  return from_vector<int64_t>(std::vector<int64_t>(pad.begin(), pad.end()), {B, M});
}

double max_abs(const Tensor& t) {
  double m = 0;
  for (double x : t.to_vector<double>()) m = std::max(m, std::fabs(x));
  return m;
}

bool all_finite(const Tensor& t) {
  for (double x : t.to_vector<double>())
    if (!std::isfinite(x)) return false;
  return true;
}

// ---- gradient checks --------------------------------------------------------------------------
TEST(GradCheck, PerformerBidirectional) {
  manual_seed(40);
  auto p = performer64(2, 4, 6, FeatureMap::Softmax, 64);
  EXPECT_GRADCHECK(forward_fn(p, {}), {randn64({2, 2, 5, 4}), randn64({2, 2, 5, 4}), randn64({2, 2, 5, 3})});
}

TEST(GradCheck, PerformerCausalChunks) {
  manual_seed(41);
  attn::AttentionOptions o;
  o.causal = true;
  // N = 7 with chunk 3: chunks of 3, 3, 1 (state carried twice, N not a multiple of the chunk).
  auto p = performer64(2, 4, 6, FeatureMap::Softmax, 3);
  EXPECT_GRADCHECK(forward_fn(p, o), {randn64({2, 2, 7, 4}), randn64({2, 2, 7, 4}), randn64({2, 2, 7, 3})});
}

TEST(GradCheck, PerformerPadded) {
  manual_seed(42);
  attn::AttentionOptions o;
  // Batch 1 has every key padded: outputs and gradients zero.
  o.key_padding_mask = mask_of({0, 1, 0, 0, 1, 1, 1, 1, 1, 1}, 2, 5);
  auto p = performer64(2, 4, 6, FeatureMap::Softmax, 2);
  EXPECT_GRADCHECK(forward_fn(p, o), {randn64({2, 2, 5, 4}), randn64({2, 2, 5, 4}), randn64({2, 2, 5, 3})});
  // Causal and padded: query 0 of batch 0 sees no key (key 0 padded).
  o.causal = true;
  o.key_padding_mask = mask_of({1, 0, 0, 1, 0, 0, 0, 0, 0, 1}, 2, 5);
  EXPECT_GRADCHECK(forward_fn(p, o), {randn64({2, 2, 5, 4}), randn64({2, 2, 5, 4}), randn64({2, 2, 5, 3})});
}

TEST(GradCheck, PerformerCrossAttention) {
  manual_seed(43);
  auto p = performer64(2, 4, 6, FeatureMap::Softmax, 2);
  EXPECT_GRADCHECK(forward_fn(p, {}), {randn64({2, 2, 3, 4}), randn64({2, 2, 6, 4}), randn64({2, 2, 6, 2})});
  // Causal with M != N both ways (top-left aligned), chunk 2.
  attn::AttentionOptions o;
  o.causal = true;
  EXPECT_GRADCHECK(forward_fn(p, o), {randn64({1, 2, 3, 4}), randn64({1, 2, 6, 4}), randn64({1, 2, 6, 2})});
  EXPECT_GRADCHECK(forward_fn(p, o), {randn64({1, 2, 6, 4}), randn64({1, 2, 3, 4}), randn64({1, 2, 3, 2})});
}

TEST(GradCheck, PerformerReluKernel) {
  manual_seed(44);
  auto p = performer64(2, 4, 6, FeatureMap::Relu, 2);
  EXPECT_GRADCHECK(forward_fn(p, {}), {randn64({2, 2, 5, 4}), randn64({2, 2, 5, 4}), randn64({2, 2, 5, 3})});
  attn::AttentionOptions o;
  o.causal = true;
  EXPECT_GRADCHECK(forward_fn(p, o), {randn64({1, 2, 5, 4}), randn64({1, 2, 5, 4}), randn64({1, 2, 5, 3})});
}

TEST(GradCheck, PerformerTrfKernel) {
  manual_seed(45);
  // Many features so the signed denominators stay away from zero at these inputs.
  auto p = performer64(2, 4, 32, FeatureMap::Trf, 2);
  EXPECT_GRADCHECK(forward_fn(p, {}), {randn64({2, 2, 5, 4}, 0.5), randn64({2, 2, 5, 4}, 0.5), randn64({2, 2, 5, 3})});
  attn::AttentionOptions o;
  o.causal = true;
  o.key_padding_mask = mask_of({0, 0, 1, 0, 0}, 1, 5);
  EXPECT_GRADCHECK(forward_fn(p, o), {randn64({1, 2, 5, 4}, 0.5), randn64({1, 2, 5, 4}, 0.5), randn64({1, 2, 5, 3})});
}

TEST(GradCheck, PerformerMultiHeadAttentionInputs) {
  manual_seed(46);
  auto mha = std::make_shared<attn::MultiHeadAttention>(4, 2, "performer:features=6,chunk=2");
  mha->to(DType::Float64);
  mha->eval();  // omega: the buffer, fixed
  attn::AttentionOptions o;
  o.causal = true;
  o.key_padding_mask = mask_of({0, 0, 1, 0, 0, 0}, 2, 3);
  const Fn f = [&](const std::vector<Tensor>& x) { return mha->forward(x[0], x[0], o); };
  EXPECT_GRADCHECK(f, {randn64({2, 3, 4}, 3.0)});
}

// ---- the paper's claim: unbiased kernel estimate ----------------------------------------------
// For P pairs (q~, k~) in the scaled space, R independent W's (R "heads" of orthogonal_gaussian,
// or i.i.d. rows) give R independent estimates phi(q~).phi(k~); their mean must be within 4
// standard errors (sample standard deviation / sqrt(R)) of exp(q~.k~).
void expect_unbiased(FeatureMap kind, bool orthogonal, uint64_t seed) {
  manual_seed(seed);
  const int64_t R = 4000, S = 8, D = 4, P = 5;
  // Pairs with |q~|, |k~| in [0.4, 1.2] and dot products of both signs.
  const std::vector<double> qn = {0.4, 0.8, 1.0, 1.2, 0.6}, kn = {1.0, 0.7, 1.1, 0.9, 1.2};
  Tensor uq = r64({P, D}), uk = r64({P, D});
  uq = uq / sqrt(sum(square(uq), {-1}, true)) * from_vector<double>(qn, {P, 1});
  uk = uk / sqrt(sum(square(uk), {-1}, true)) * from_vector<double>(kn, {P, 1});
  Tensor omega = orthogonal ? attn::orthogonal_gaussian(R, S, D) : r64({R, S, D});
  // x [1, R, P, D]: every draw sees the same P pairs.
  Tensor fq = attn::performer_features(expand(reshape(uq, {1, 1, P, D}), {1, R, P, D}), omega, kind);
  Tensor fk = attn::performer_features(expand(reshape(uk, {1, 1, P, D}), {1, R, P, D}), omega, kind);
  auto est = sum(fq * fk, {-1}).to_vector<double>();  // [1, R, P]
  auto dots = sum(uq * uk, {-1}).to_vector<double>();
  for (int64_t p = 0; p < P; ++p) {
    double mean = 0, m2 = 0;
    for (int64_t r = 0; r < R; ++r) mean += est[r * P + p];
    mean /= R;
    for (int64_t r = 0; r < R; ++r) m2 += (est[r * P + p] - mean) * (est[r * P + p] - mean);
    const double se = std::sqrt(m2 / (R - 1) / R), target = std::exp(dots[p]);
    EXPECT_LT(std::fabs(mean - target), 4 * se)
        << attn::feature_map_name(kind) << (orthogonal ? " orthogonal" : " iid") << " pair " << p << ": mean "
        << mean << " vs exp(q.k) " << target << ", se " << se;
    EXPECT_LT(se, 0.05 * target) << "the test is too weak to see a bias";  // meaningful precision
  }
}

TEST(PerformerStatistics, SoftmaxFeaturesUnbiasedOrthogonal) { expect_unbiased(FeatureMap::Softmax, true, 50); }
TEST(PerformerStatistics, SoftmaxFeaturesUnbiasedIid) { expect_unbiased(FeatureMap::Softmax, false, 51); }
TEST(PerformerStatistics, TrfFeaturesUnbiasedOrthogonal) { expect_unbiased(FeatureMap::Trf, true, 52); }
TEST(PerformerStatistics, TrfFeaturesUnbiasedIid) { expect_unbiased(FeatureMap::Trf, false, 53); }

TEST(PerformerStatistics, OrthogonalRowsAreOrthogonalWithinABlock) {
  manual_seed(54);
  auto p = std::make_shared<PerformerAttention>(1, 4, 8);  // two 4x4 blocks
  auto w = p->omega().to(DType::Float64);
  Tensor g = matmul(w, transpose(w, -2, -1));  // [1, 8, 8]
  auto gv = g.to_vector<double>();
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < 4; ++j)
      if (i != j) {
        EXPECT_NEAR(gv[i * 8 + j], 0.0, 1e-5);
        EXPECT_NEAR(gv[(i + 4) * 8 + j + 4], 0.0, 1e-5);
      }
  auto iid = std::make_shared<PerformerAttention>(1, 4, 8, FeatureMap::Softmax, 1, 64, /*orthogonal=*/false);
  auto wi = iid->omega().to(DType::Float64);
  EXPECT_GT(std::fabs(matmul(wi, transpose(wi, -2, -1)).to_vector<double>()[1]), 1e-5);
}

// ---- causal == masked quadratic with the same features ----------------------------------------
TEST(PerformerCausal, EqualsMaskedQuadraticForEveryChunkLength) {
  manual_seed(60);
  const int64_t B = 2, H = 2, N = 7, D = 4, S = 5;
  Tensor q = r64({B, H, N, D}), k = r64({B, H, N, D}), v = r64({B, H, N, 3});
  attn::AttentionOptions o;
  o.causal = true;
  for (FeatureMap kind : {FeatureMap::Softmax, FeatureMap::Relu, FeatureMap::Trf})
    for (int64_t chunk : {1, 3, 7, 10}) {
      Tensor w;
      auto p = performer64(H, D, S, kind, chunk, &w);
      // trf's features are signed: at S = 5 some denominators nearly cancel (outputs near -1600 from
      // inputs near 1), and the order |k|^2 is summed in moves the 12th digit there.
      const double tol = kind == FeatureMap::Trf ? 1e-10 : 1e-12;
      EXPECT_TRUE(all_close(p->forward(q, k, v, o), reference(q, k, v, w, kind, true), tol, tol))
          << attn::feature_map_name(kind) << " chunk " << chunk;
    }
  // Padded and causal; and M != N both ways (keys m <= n only).
  Tensor w;
  auto p = performer64(H, D, S, FeatureMap::Softmax, 3, &w);
  const std::vector<int> pad = {1, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1};
  o.key_padding_mask = mask_of(pad, B, N);
  EXPECT_TRUE(
      all_close(p->forward(q, k, v, o), reference(q, k, v, w, FeatureMap::Softmax, true, pad), 1e-12, 1e-12));
  o.key_padding_mask = Tensor();
  Tensor k9 = r64({B, H, 9, D}), v9 = r64({B, H, 9, 3});
  EXPECT_TRUE(
      all_close(p->forward(q, k9, v9, o), reference(q, k9, v9, w, FeatureMap::Softmax, true), 1e-12, 1e-12));
  Tensor k4 = narrow(k, 2, 0, 4), v4 = narrow(v, 2, 0, 4);
  EXPECT_TRUE(
      all_close(p->forward(q, k4, v4, o), reference(q, k4, v4, w, FeatureMap::Softmax, true), 1e-12, 1e-12));
  // A query offset (query n at position 2 + n), with as many keys as queries and with more.
  o.query_offset = 2;
  for (const auto& [kk, vv] : {std::pair{k, v}, std::pair{k9, v9}})
    EXPECT_TRUE(
        all_close(p->forward(q, kk, vv, o), reference(q, kk, vv, w, FeatureMap::Softmax, true, {}, 2), 1e-12, 1e-12))
        << "offset 2, " << kk.size(2) << " keys";
}

TEST(PerformerCausal, FutureTokensDoNotChangePastOutputs) {
  manual_seed(61);
  const int64_t N = 9, n0 = 4;
  Tensor q = r64({2, 2, N, 4}), k = r64({2, 2, N, 4}), v = r64({2, 2, N, 3});
  // Keys and values after position n0 replaced (with larger ones, which also moves the key stabilizer).
  Tensor k2 = cat({narrow(k, 2, 0, n0 + 1), r64({2, 2, N - n0 - 1, 4}) * 2.0}, 2);
  Tensor v2 = cat({narrow(v, 2, 0, n0 + 1), r64({2, 2, N - n0 - 1, 3})}, 2);
  attn::AttentionOptions o;
  o.causal = true;
  for (int64_t chunk : {1, 2, 4, 64}) {
    auto p = performer64(2, 4, 8, FeatureMap::Softmax, chunk);
    Tensor a = p->forward(q, k, v, o), b = p->forward(q, k2, v2, o);
    EXPECT_TRUE(all_close(narrow(a, 2, 0, n0 + 1), narrow(b, 2, 0, n0 + 1), 1e-12, 1e-12)) << "chunk " << chunk;
    EXPECT_GT(max_abs(narrow(a, 2, n0 + 1, N - n0 - 1) - narrow(b, 2, n0 + 1, N - n0 - 1)), 1e-3);
  }
}

// ---- padding and cross-attention --------------------------------------------------------------
TEST(PerformerPadding, AppendedPaddedKeysChangeNothing) {
  manual_seed(70);
  const int64_t B = 2, H = 2, D = 4, M = 5, extra = 3;
  Tensor q = r64({B, H, 8, D}), k = r64({B, H, M, D}), v = r64({B, H, M, 3});
  // Appended keys with large norms: they would dominate the key stabilizer if not left out (trf's
  // log-factor |k~|^2/2 near 1,600 against near 1: the real keys' exp(1 - 1600) would underflow).
  Tensor kp = cat({k, r64({B, H, extra, D}) * 40.0}, 2), vp = cat({v, r64({B, H, extra, 3}) * 100.0}, 2);
  std::vector<int> pad(B * (M + extra), 0);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t m = M; m < M + extra; ++m) pad[b * (M + extra) + m] = 1;
  attn::AttentionOptions padded;
  padded.key_padding_mask = mask_of(pad, B, M + extra);
  for (FeatureMap kind : {FeatureMap::Softmax, FeatureMap::Relu, FeatureMap::Trf}) {
    Tensor w;
    auto p = performer64(H, D, 16, kind, 3, &w);
    Tensor ref = p->forward(q, k, v, {});
    EXPECT_TRUE(all_close(p->forward(q, kp, vp, padded), ref, 1e-12, 1e-10)) << attn::feature_map_name(kind);
    EXPECT_TRUE(all_close(ref, reference(q, k, v, w, kind, false), 1e-12, 1e-10));
    // Causal too (queries 0..7 see keys m <= n; the appended keys 5..7 are padded).
    attn::AttentionOptions c = padded, c0;
    c.causal = c0.causal = true;
    EXPECT_TRUE(all_close(p->forward(q, kp, vp, c), p->forward(q, k, v, c0), 1e-12, 1e-10));
  }
}

TEST(PerformerPadding, FullyPaddedRowGivesZerosNotNaN) {
  manual_seed(71);
  attn::AttentionOptions o;
  o.key_padding_mask = tensor<bool>({false, true, false, true, true, true, true, true}, {2, 4});
  for (const char* spec :
       {"performer:features=8", "performer:features=8,feature_map=relu", "performer:features=8,feature_map=trf"})
    for (bool causal : {false, true}) {
      o.causal = causal;
      auto p = attn::make_attention(spec, 2, 4);
      p->eval();
      Tensor q = randn({2, 2, 3, 4}), k = randn({2, 2, 4, 4}), v = randn({2, 2, 4, 3});
      q.requires_grad_(true);
      Tensor out = p->forward(q, k, v, o);
      EXPECT_TRUE(all_finite(out)) << spec;
      EXPECT_EQ(max_abs(narrow(out, 0, 1, 1)), 0.0) << spec;
      EXPECT_GT(max_abs(narrow(out, 0, 0, 1)), 0.0) << spec;
      sum(out).backward();
      EXPECT_TRUE(all_finite(q.grad())) << spec;
      EXPECT_EQ(max_abs(narrow(q.grad(), 0, 1, 1)), 0.0) << spec;
      const Tensor a = p->attention_matrix(q.detach(), k, o);  // the same guard: zero rows
      EXPECT_TRUE(all_finite(a)) << spec;
      EXPECT_EQ(max_abs(narrow(a, 0, 1, 1)), 0.0) << spec;
    }
}

// ---- randomness: redraw schedule, eval, sample API --------------------------------------------
TEST(PerformerSamples, TrainingRedrawsOnSchedule) {
  manual_seed(80);
  Tensor q = randn({1, 2, 4, 4}), k = randn({1, 2, 4, 4}), v = randn({1, 2, 4, 3});
  // redraw=1 (default): two training forwards use different W and give different outputs.
  auto p = attn::make_attention("performer:features=8", 2, 4);
  p->train();
  Tensor a = p->forward(q, k, v, {});
  Tensor wa = p->last_samples().at("omega");
  Tensor b = p->forward(q, k, v, {});
  EXPECT_GT(max_abs(a - b), 1e-6);
  EXPECT_GT(max_abs(wa - p->last_samples().at("omega")), 1e-3);
  // redraw=3: new W at training forwards 1, 4, 7 (the first included), kept in between.
  auto r = std::dynamic_pointer_cast<PerformerAttention>(attn::make_attention("performer:features=8,redraw=3", 2, 4));
  ASSERT_TRUE(r != nullptr);
  Tensor prev = clone(r->omega());
  for (int t = 1; t <= 7; ++t) {
    r->forward(q, k, v, {});
    const bool changed = max_abs(r->omega() - prev) > 0;
    EXPECT_EQ(changed, t == 1 || t == 4 || t == 7) << "training forward " << t;
    EXPECT_EQ(max_abs(r->last_samples().at("omega") - r->omega()), 0.0);  // forward used the buffer
    prev = clone(r->omega());
  }
  EXPECT_EQ(r->redraw_calls(), 7);
  // Eval calls are not counted.
  r->eval();
  r->forward(q, k, v, {});
  EXPECT_EQ(r->redraw_calls(), 7);
  r->train();
  // redraw=0: never.
  auto never = std::dynamic_pointer_cast<PerformerAttention>(attn::make_attention("performer:features=8,redraw=0", 2, 4));
  Tensor w0 = clone(never->omega());
  Tensor n1 = never->forward(q, k, v, {}), n2 = never->forward(q, k, v, {});
  EXPECT_EQ(max_abs(never->omega() - w0), 0.0);
  EXPECT_EQ(max_abs(n1 - n2), 0.0);
}

TEST(PerformerSamples, EvalIsDeterministicAndUsesTheBuffer) {
  manual_seed(81);
  Tensor q = randn({2, 2, 5, 4}), k = randn({2, 2, 5, 4}), v = randn({2, 2, 5, 3});
  auto p = std::dynamic_pointer_cast<PerformerAttention>(attn::make_attention("performer:features=8", 2, 4));
  p->train();
  p->forward(q, k, v, {});  // a redraw
  p->eval();
  Tensor w = clone(p->omega());
  Tensor a = p->forward(q, k, v, {}), b = p->forward(q, k, v, {});
  EXPECT_EQ(max_abs(a - b), 0.0);
  EXPECT_EQ(max_abs(p->omega() - w), 0.0);
  EXPECT_EQ(max_abs(p->last_samples().at("omega") - w), 0.0);
  // The same as passing the buffer's W explicitly.
  auto e = attn::make_attention("performer:features=8", 2, 4);
  e->set_samples({{"omega", w}});
  EXPECT_TRUE(all_close(e->forward(q, k, v, {}), a, 0, 0));
}

TEST(PerformerSamples, ExplicitAndFrozenSamplesAreDeterministic) {
  manual_seed(82);
  Tensor q = randn({1, 2, 5, 4}), k = randn({1, 2, 5, 4}), v = randn({1, 2, 5, 3});
  auto p = std::dynamic_pointer_cast<PerformerAttention>(attn::make_attention("performer:features=8", 2, 4));
  p->train();
  // set_samples: W used as given, in training too, and the buffer is left alone.
  Tensor w = attn::orthogonal_gaussian(2, 8, 4);  // float64: converted to the inputs' float32
  Tensor buf = clone(p->omega());
  p->set_samples({{"omega", w}});
  Tensor a = p->forward(q, k, v, {}), b = p->forward(q, k, v, {});
  EXPECT_EQ(max_abs(a - b), 0.0);
  EXPECT_TRUE(all_close(p->last_samples().at("omega"), w.to(DType::Float32), 0, 0));
  EXPECT_EQ(max_abs(p->omega() - buf), 0.0);
  // freeze: the next forward draws (a redraw in training), later ones reuse it.
  p->clear_samples();
  p->freeze_samples();
  Tensor f1 = p->forward(q, k, v, {}), f2 = p->forward(q, k, v, {});
  EXPECT_EQ(max_abs(f1 - f2), 0.0);
  EXPECT_GT(max_abs(f1 - a), 1e-6);
  p->freeze_samples(false);
  EXPECT_GT(max_abs(p->forward(q, k, v, {}) - f1), 1e-6);
  // Two layers seeded alike draw alike.
  manual_seed(5);
  auto x = attn::make_attention("performer:features=8", 2, 4);
  Tensor xo = x->forward(q, k, v, {});
  manual_seed(5);
  auto y = attn::make_attention("performer:features=8", 2, 4);
  EXPECT_EQ(max_abs(y->forward(q, k, v, {}) - xo), 0.0);
}

TEST(PerformerSamples, StateDictHoldsOmega) {
  manual_seed(83);
  auto mha = std::make_shared<attn::MultiHeadAttention>(8, 2, "performer:features=16");
  nn::StateDict sd = mha->state_dict();
  ASSERT_EQ(sd.count("mechanism.omega"), 1u);
  EXPECT_EQ(sd.at("mechanism.omega").shape(), Shape({2, 16, 4}));
  EXPECT_EQ(sd.at("mechanism.omega").dtype(), DType::Float32);
  EXPECT_EQ(mha->mechanism()->sample_names(), std::vector<std::string>({"omega"}));
  // Loading another model's omega makes eval outputs agree.
  auto other = std::make_shared<attn::MultiHeadAttention>(8, 2, "performer:features=16");
  other->load_state_dict(sd);
  mha->eval();
  other->eval();
  Tensor x = randn({2, 3, 8});
  EXPECT_EQ(max_abs(mha->forward(x, x) - other->forward(x, x)), 0.0);
  mha->to(DType::Float64);
  EXPECT_EQ(mha->state_dict().at("mechanism.omega").dtype(), DType::Float64);
}

// ---- attention matrix, float32 range, errors --------------------------------------------------
TEST(Performer, ForwardEqualsAttentionMatrixTimesV) {
  manual_seed(90);
  Tensor q = r64({2, 2, 6, 4}), k = r64({2, 2, 6, 4}), v = r64({2, 2, 6, 3});
  Tensor k8 = r64({2, 2, 8, 4}), v8 = r64({2, 2, 8, 3});
  for (FeatureMap kind : {FeatureMap::Softmax, FeatureMap::Relu, FeatureMap::Trf}) {
    auto p = performer64(2, 4, 16, kind, 4);
    attn::AttentionOptions o;
    EXPECT_TRUE(all_close(p->forward(q, k, v, o), matmul(p->attention_matrix(q, k, o), v), 1e-12, 1e-10));
    o.causal = true;
    EXPECT_TRUE(all_close(p->forward(q, k, v, o), matmul(p->attention_matrix(q, k, o), v), 1e-12, 1e-10));
    Tensor a = p->attention_matrix(q, k, o);  // causal: zero above the diagonal
    EXPECT_EQ(max_abs(narrow(narrow(a, 2, 0, 1), 3, 1, 5)), 0.0);
    o.key_padding_mask = mask_of({0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0}, 2, 8);
    EXPECT_TRUE(all_close(p->forward(q, k8, v8, o), matmul(p->attention_matrix(q, k8, o), v8), 1e-12, 1e-10));
    o.causal = false;
    EXPECT_TRUE(all_close(p->forward(q, k8, v8, o), matmul(p->attention_matrix(q, k8, o), v8), 1e-12, 1e-10));
    if (kind != FeatureMap::Trf) {  // positive features: rows are probability vectors
      EXPECT_TRUE(all_close(sum(p->attention_matrix(q, k8, o), {-1}), ones({2, 2, 6}, f64()), 1e-12, 0));
    }
    // Causal with a query offset (query n at position 2 + n): keys up to 2 + n.
    o = {};
    o.causal = true;
    o.query_offset = 2;
    EXPECT_TRUE(all_close(p->forward(q, k8, v8, o), matmul(p->attention_matrix(q, k8, o), v8), 1e-12, 1e-10));
    a = p->attention_matrix(q, k8, o);
    EXPECT_EQ(max_abs(narrow(narrow(a, 2, 0, 1), 3, 3, 5)), 0.0);
    EXPECT_GT(max_abs(narrow(narrow(a, 2, 0, 1), 3, 2, 1)), 0.0);
  }
}

TEST(Performer, FiniteInFloat32AtLargeNorms) {
  manual_seed(91);
  const int64_t B = 2, H = 2, N = 40, D = 16;
  // |q~| = |k~| = 5, i.e. |q| = 5 D^(1/4).
  auto at_norm = [&](Tensor x) { return x / sqrt(sum(square(x), {-1}, true)) * (5.0 * std::pow(D, 0.25)); };
  Tensor q = at_norm(randn({B, H, N, D})), k = at_norm(randn({B, H, N, D})), v = randn({B, H, N, 8});
  q.requires_grad_(true);
  k.requires_grad_(true);
  attn::AttentionOptions o;
  o.key_padding_mask = zeros({B, N}, DType::Bool);  // nothing padded: exercises the masked path
  for (const char* spec : {"performer:features=32,chunk=8", "performer:features=32,chunk=8,feature_map=relu",
                           "performer:features=32,chunk=8,feature_map=trf"})
    for (bool causal : {false, true}) {
      o.causal = causal;
      auto p = attn::make_attention(spec, H, D);
      p->eval();
      Tensor out = p->forward(q, k, v, o);
      EXPECT_TRUE(all_finite(out)) << spec << (causal ? " causal" : "");
      q.zero_grad();
      k.zero_grad();
      sum(out).backward();
      EXPECT_TRUE(all_finite(q.grad()) && all_finite(k.grad())) << spec << (causal ? " causal" : "");
      // float32 agrees with float64 on the same W (the stabilizers keep float32 in range).
      if (std::string(spec).find("trf") == std::string::npos) {
        auto p64 = attn::make_attention(spec, H, D);
        p64->set_samples({{"omega", p->last_samples().at("omega")}});
        Tensor ref =
            p64->forward(q.detach().to(DType::Float64), k.detach().to(DType::Float64), v.to(DType::Float64), o);
        EXPECT_TRUE(all_close(out.to(DType::Float64), ref, 1e-3, 1e-3)) << spec << (causal ? " causal" : "");
      }
    }
}

// ---- the fused feature op ------------------------------------------------------------------------
// phi by loops: exp(x.w_s - |x|^2/2 - c) / sqrt(S), c the row's max (per_row) or the max over the
// (b, h)'s unpadded rows; padded rows 0.
Tensor features_by_loops(const Tensor& x, const Tensor& omega, bool per_row, const std::vector<int>& pad) {
  const int64_t B = x.size(0), H = x.size(1), L = x.size(2), D = x.size(3), S = omega.size(1);
  const auto xv = x.contiguous().to_vector<double>(), wv = omega.contiguous().to_vector<double>();
  std::vector<double> l(static_cast<size_t>(B * H * L * S)), out(l.size(), 0.0);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h) {
      double c_seq = -INFINITY;
      for (int64_t i = 0; i < L; ++i) {
        const double* xi = &xv[static_cast<size_t>(((b * H + h) * L + i) * D)];
        double half = 0;
        for (int64_t j = 0; j < D; ++j) half += 0.5 * xi[j] * xi[j];
        for (int64_t s = 0; s < S; ++s) {
          double dot = 0;
          for (int64_t j = 0; j < D; ++j) dot += xi[j] * wv[static_cast<size_t>((h * S + s) * D + j)];
          l[static_cast<size_t>(((b * H + h) * L + i) * S + s)] = dot - half;
          if (pad.empty() || !pad[b * L + i]) c_seq = std::max(c_seq, dot - half);
        }
      }
      for (int64_t i = 0; i < L; ++i) {
        if (!pad.empty() && pad[b * L + i]) continue;
        const size_t row = static_cast<size_t>(((b * H + h) * L + i) * S);
        const double c = per_row ? *std::max_element(l.begin() + row, l.begin() + row + S) : c_seq;
        for (int64_t s = 0; s < S; ++s) out[row + s] = std::exp(l[row + s] - c) / std::sqrt(double(S));
      }
    }
  return from_vector<double>(out, {B, H, L, S});
}

TEST(PositiveFeatures, MatchesTheFormulaInBlocksAndWithPadding) {
  manual_seed(60);
  // L = 300: two row blocks of the kernel; batch 1 fully padded, batch 0 partly.
  const int64_t B = 2, H = 3, L = 300, D = 5, S = 7;
  Tensor x = randn64({B, H, L, D}), w = randn64({H, S, D});
  std::vector<int> pad(static_cast<size_t>(B * L), 0);
  for (int64_t i = 0; i < L; ++i) pad[static_cast<size_t>(L + i)] = 1;
  for (int64_t i = 250; i < L; i += 3) pad[static_cast<size_t>(i)] = 1;
  const Tensor mask = mask_of(pad, B, L).to(DType::Bool);
  for (bool per_row : {true, false}) {
    EXPECT_TRUE(all_close(positive_features(x, w, per_row), features_by_loops(x, w, per_row, {}), 1e-12, 1e-13))
        << per_row;
    const Tensor padded = positive_features(x, w, per_row, mask);
    EXPECT_TRUE(all_close(padded, features_by_loops(x, w, per_row, pad), 1e-12, 1e-13)) << per_row;
    EXPECT_EQ(max_abs(narrow(padded, 0, 1, 1)), 0.0);  // all padding: zeros, not NaN
    // float32 agrees with float64 to float32 rounding; a strided x is read correctly.
    const Tensor x32 = transpose(contiguous(transpose(x, 1, 2)).to(DType::Float32), 1, 2);
    EXPECT_TRUE(
        all_close(positive_features(x32, w.to(DType::Float32), per_row, mask).to(DType::Float64), padded, 1e-5, 1e-6))
        << per_row;
  }
}

// The stabilizer is a constant in the op's gradient, so the check goes through a ratio in which it
// cancels (as it does in attention): phi over its sum across s (per row) or across (l, s) per (b, h).
TEST(GradCheck, PositiveFeaturesThroughARatio) {
  manual_seed(61);
  Tensor w = randn64({2, 5, 3});
  const Tensor pad = mask_of({0, 0, 1, 0, 0, 0, 1, 0}, 2, 4).to(DType::Bool);
  for (bool per_row : {true, false}) {
    const std::vector<int64_t> dims = per_row ? std::vector<int64_t>{3} : std::vector<int64_t>{2, 3};
    EXPECT_GRADCHECK(
        [&](const std::vector<Tensor>& in) {
          const Tensor phi = positive_features(in[0], in[1], per_row, pad);
          return phi / (sum(phi, dims, /*keepdim=*/true) + 1e-300);
        },
        {randn64({2, 2, 4, 3}), w});
  }
}

TEST(PositiveFeatures, BadInputsThrow) {
  const Tensor x = randn({1, 2, 3, 4}), w = randn({2, 5, 4});
  EXPECT_LINEA_ERROR(positive_features(randn({2, 3, 4}), w, true),
                     "positive_features: expected x [B, H, L, D] and omega [H, S, D], got x [2, 3, 4]");
  EXPECT_LINEA_ERROR(positive_features(x, randn({2, 5, 3}), true), "omega [2, 5, 3]");
  EXPECT_LINEA_ERROR(positive_features(x, randn({2, 0, 4}), true), "has no features");
  EXPECT_LINEA_ERROR(positive_features(x, w.to(DType::Float64), true), "positive_features");
  EXPECT_LINEA_ERROR(positive_features(x, w, false, zeros({1, 4}, DType::Bool)),
                     "positive_features: pad must be a Bool [B, L] = [1, 3], got bool [1, 4]");
  EXPECT_LINEA_ERROR(positive_features(zeros({1, 2, 3, 4}, DType::Int64), zeros({2, 5, 4}, DType::Int64), true),
                     "positive_features: expected float32 or float64");
}

// ---- the fused linear attention -------------------------------------------------------------------
// The composed formula: (phi_q KV) / den~, den~ = den with |den| < guard set to +-guard.
Tensor linear_attention_composed(const Tensor& pq, const Tensor& pk, const Tensor& v, double guard) {
  const Tensor num = matmul(pq, matmul(transpose(pk, -2, -1), v));
  const Tensor den = matmul(pq, unsqueeze(sum(pk, {2}), -1));
  const Tensor d = den.detach();
  const Tensor signed_guard = where(d >= 0.0, scalar_tensor(guard, d.options()), -guard);
  return num / where(abs(d) < guard, signed_guard, den);
}

TEST(LinearAttention, MatchesTheComposedFormula) {
  manual_seed(62);
  // N, M = 1100, 700: several row blocks of the kernel on both sides.
  for (auto [B, H, N, M] : std::vector<std::array<int64_t, 4>>{{2, 3, 5, 4}, {1, 2, 1100, 700}}) {
    const Tensor pq = exp(randn64({B, H, N, 6})), pk = exp(randn64({B, H, M, 6})), v = randn64({B, H, M, 3});
    EXPECT_TRUE(
        all_close(linear_attention(pq, pk, v, 1e-30), linear_attention_composed(pq, pk, v, 1e-30), 1e-12, 1e-12));
    const Tensor out32 = linear_attention(pq.to(DType::Float32), pk.to(DType::Float32), v.to(DType::Float32), 1e-30);
    EXPECT_TRUE(all_close(out32.to(DType::Float64), linear_attention_composed(pq, pk, v, 1e-30), 1e-4, 1e-5));
  }
  // Signed features (trf-like) with denominators near 0: the guard keeps the sign; a zero row of
  // phi_q gives 0 / guard = 0.
  Tensor pq = randn64({1, 1, 6, 4}), pk = randn64({1, 1, 5, 4}), v = randn64({1, 1, 5, 2});
  pq = cat({narrow(pq, 2, 0, 5), zeros({1, 1, 1, 4}, f64())}, 2);
  for (double guard : {1e-30, 0.5, 3.0})
    EXPECT_TRUE(
        all_close(linear_attention(pq, pk, v, guard), linear_attention_composed(pq, pk, v, guard), 1e-12, 1e-12))
        << guard;
}

TEST(GradCheck, LinearAttention) {
  manual_seed(63);
  EXPECT_GRADCHECK([](const std::vector<Tensor>& in) { return linear_attention(exp(in[0]), exp(in[1]), in[2], 1e-30); },
                   {randn64({2, 2, 5, 3}), randn64({2, 2, 4, 3}), randn64({2, 2, 4, 2})});
  // Signed features, the first two query rows scaled by 1e-3 so that the guard is active there
  // (checked): no gradient goes through a guarded den.
  const Tensor row_scale = from_vector<double>({1e-3, 1e-3, 1, 1, 1, 1}, {1, 1, 6, 1});
  const Tensor pq = randn64({1, 1, 6, 3}), pk = randn64({1, 1, 4, 3}), v = randn64({1, 1, 4, 2});
  const std::vector<double> den = matmul(pq * row_scale, unsqueeze(sum(pk, {2}), -1)).to_vector<double>();
  ASSERT_LT(std::fabs(den[0]), 0.3);
  ASSERT_LT(std::fabs(den[1]), 0.3);
  EXPECT_GRADCHECK(
      [row_scale](const std::vector<Tensor>& in) { return linear_attention(in[0] * row_scale, in[1], in[2], 0.3); },
      {pq, pk, v});
}

TEST(LinearAttention, BadInputsThrow) {
  const Tensor pq = rand({1, 2, 3, 4}), pk = rand({1, 2, 5, 4}), v = randn({1, 2, 5, 6});
  EXPECT_LINEA_ERROR(linear_attention(pq, rand({1, 2, 5, 3}), v, 0.0),
                     "linear_attention: expected phi_q [B, H, N, S], phi_k [B, H, M, S], v [B, H, M, E], got phi_q "
                     "[1, 2, 3, 4], phi_k [1, 2, 5, 3], v [1, 2, 5, 6]");
  EXPECT_LINEA_ERROR(linear_attention(pq, pk, randn({1, 2, 4, 6}), 0.0), "linear_attention: expected");
  EXPECT_LINEA_ERROR(linear_attention(pq, pk, randn({1, 2, 5, 0}), 0.0), "every dim must be positive");
  EXPECT_LINEA_ERROR(linear_attention(pq, pk, v, -1.0), "guard must be finite and >= 0, got -1");
  EXPECT_LINEA_ERROR(linear_attention(pq, pk, v.to(DType::Float64), 0.0), "linear_attention");
}

// ---- FAVOR+ attention in one op -----------------------------------------------------------------
// The composed formula: the two ops on the scaled inputs.
Tensor favor_composed(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& w, double scale,
                      const Tensor& pad, double guard) {
  return linear_attention(positive_features(q * scale, w, true), positive_features(k * scale, w, false, pad), v, guard);
}

TEST(FavorAttention, MatchesTheComposedFormula) {
  manual_seed(66);
  const Tensor q = randn64({2, 3, 7, 5}), k = randn64({2, 3, 9, 5}), v = randn64({2, 3, 9, 4}),
               w = randn64({3, 6, 5}).detach();  // a constant: the features are samples
  const Tensor pad = mask_of({0, 1, 0, 0, 0, 0, 0, 1, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1}, 2, 9).to(DType::Bool);
  for (const Tensor& p : {Tensor(), pad}) {
    const Tensor got = favor_attention(q, k, v, w, 0.7, p, 1e-30);
    EXPECT_TRUE(all_close(got, favor_composed(q, k, v, w, 0.7, p, 1e-30), 1e-12, 1e-12));
    if (p.defined()) {
      EXPECT_EQ(max_abs(narrow(got, 0, 1, 1)), 0.0);  // every key padded: 0 / guard
    }
  }
  // Heads split off a projection (strided views) read as they are.
  const Tensor qs = transpose(contiguous(transpose(q, 1, 2)), 1, 2);
  EXPECT_TRUE(all_close(favor_attention(qs, k, v, w, 0.7, pad, 1e-30), favor_composed(q, k, v, w, 0.7, pad, 1e-30),
                        1e-12, 1e-12));
}

TEST(GradCheck, FavorAttention) {
  manual_seed(67);
  const Tensor w = randn64({2, 4, 3}).detach();
  const Tensor pad = mask_of({0, 0, 1, 0, 1, 1, 1, 1}, 2, 4).to(DType::Bool);
  EXPECT_GRADCHECK(
      [&](const std::vector<Tensor>& in) { return favor_attention(in[0], in[1], in[2], w, 0.8, pad, 1e-30); },
      {randn64({2, 2, 5, 3}), randn64({2, 2, 4, 3}), randn64({2, 2, 4, 2})});
}

// Causal: the features, then causal_linear_attention in chunks (3 rows: a short last chunk).
TEST(FavorAttention, CausalMatchesTheComposedFormula) {
  manual_seed(68);
  const Tensor q = randn64({2, 3, 7, 5}), k = randn64({2, 3, 7, 5}), v = randn64({2, 3, 7, 4}),
               w = randn64({3, 6, 5}).detach();
  const Tensor pad = mask_of({0, 1, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1}, 2, 7).to(DType::Bool);
  for (const Tensor& p : {Tensor(), pad}) {
    const Tensor got = favor_attention(q, k, v, w, 0.7, p, 1e-30, /*causal=*/true, 3);
    const Tensor want = causal_linear_attention(positive_features(q * 0.7, w, true),
                                                positive_features(k * 0.7, w, false, p), v, Tensor(), 3, 1e-30);
    EXPECT_TRUE(all_close(got, want, 1e-12, 1e-12));
    // Query n sees keys m <= n only: the first row is v's first row (where that key is not padded).
    if (!p.defined()) {
      EXPECT_TRUE(all_close(narrow(got, 2, 0, 1), narrow(v, 2, 0, 1), 1e-12, 1e-12));
    }
  }
}

TEST(GradCheck, FavorAttentionCausal) {
  manual_seed(69);
  const Tensor w = randn64({2, 4, 3}).detach();
  const Tensor pad = mask_of({0, 1, 0, 0, 0, 1, 1, 0, 1, 1}, 2, 5).to(DType::Bool);
  EXPECT_GRADCHECK(
      [&](const std::vector<Tensor>& in) {
        return favor_attention(in[0], in[1], in[2], w, 0.8, pad, 1e-30, /*causal=*/true, 2);
      },
      {randn64({2, 2, 5, 3}), randn64({2, 2, 5, 3}), randn64({2, 2, 5, 2})});
}

// Two steps of decoding equal the causal op over both (the second step's keys stabilized by the
// running max, the first step's sums rescaled to it), and the running sums are the keys' sums.
TEST(FavorAttention, StepsEqualTheCausalOp) {
  manual_seed(70);
  const Tensor q = randn64({2, 2, 7, 3}), k = randn64({2, 2, 7, 3}), v = randn64({2, 2, 7, 4}),
               w = randn64({2, 5, 3}).detach();
  const Tensor pad = mask_of({0, 1, 0, 0, 0, 0, 1, 1, 1, 1, 0, 0, 1, 0}, 2, 7).to(DType::Bool);
  NoGradGuard ng;
  const Tensor full = favor_attention(q, k, v, w, 0.9, pad, 1e-30, /*causal=*/true, 2);
  const auto part = [](const Tensor& x, int64_t from, int64_t n) { return narrow(x, x.dim() == 2 ? 1 : 2, from, n); };
  std::vector<Tensor> a = favor_attention_step(part(q, 0, 3), part(k, 0, 3), part(v, 0, 3), w, 0.9, part(pad, 0, 3),
                                               1e-30, Tensor(), Tensor(), 2);
  std::vector<Tensor> b =
      favor_attention_step(part(q, 3, 4), part(k, 3, 4), part(v, 3, 4), w, 0.9, part(pad, 3, 4), 1e-30, a[1], a[2], 2);
  EXPECT_TRUE(all_close(cat({a[0], b[0]}, 2), full, 1e-12, 1e-12));
  // sums = sum_m exp(l_m - c) / sqrt(S) [v_m, 1] over the unpadded keys, with c the largest l.
  const Tensor ks = k * 0.9, l = matmul(ks, transpose(w, -2, -1)) - sum(ks * ks, {-1}, true) * 0.5;
  const Tensor keep = (~reshape(pad, {2, 1, 7, 1})).to(DType::Float64);
  const Tensor c = max(masked_fill(l, reshape(pad, {2, 1, 7, 1}), -1e300), {2, 3}, true);
  const Tensor phi = exp(l - c) * keep / std::sqrt(5.0);
  const Tensor sums = matmul(transpose(phi, -2, -1), cat({v, ones({2, 2, 7, 1}, v.options())}, -1));
  EXPECT_TRUE(all_close(b[2], c, 0, 0));
  EXPECT_TRUE(all_close(b[1], sums, 1e-12, 1e-12));
}

TEST(FavorAttention, BadInputsThrow) {
  const Tensor q = randn({1, 2, 3, 4}), k = randn({1, 2, 5, 4}), v = randn({1, 2, 5, 6}), w = randn({2, 7, 4});
  EXPECT_LINEA_ERROR(favor_attention(q, k, v, randn({2, 7, 3}), 0.5, Tensor(), 0.0),
                     "favor_attention: expected omega [H, S, D] = [2, S, 4] with S > 0, got [2, 7, 3]");
  EXPECT_LINEA_ERROR(favor_attention(q, randn({1, 2, 5, 3}), v, w, 0.5, Tensor(), 0.0), "favor_attention:");
  EXPECT_LINEA_ERROR(favor_attention(q, k, v, w, 0.0, Tensor(), 0.0), "scale must be finite and > 0, got 0");
  EXPECT_LINEA_ERROR(favor_attention(randn({1, 2, 0, 4}), k, v, w, 0.5, Tensor(), 0.0),
                     "favor_attention: every dim must be positive, got q [1, 2, 0, 4]");
  EXPECT_LINEA_ERROR(favor_attention(q, k, v, w, 0.5, Tensor(), -1.0), "guard must be finite and >= 0, got -1");
  EXPECT_LINEA_ERROR(favor_attention(q, k, v, w, 0.5, zeros({1, 4}, DType::Bool), 0.0),
                     "favor_attention: key padding must be bool [B, M] = [1, 5]");
  EXPECT_LINEA_ERROR(favor_attention(q, k, v, w, 0.5, Tensor(), 0.0, /*causal=*/true),
                     "favor_attention: causal takes as many queries as keys (self-attention), got q [1, 2, 3, 4] and "
                     "k [1, 2, 5, 4]");
  EXPECT_LINEA_ERROR(favor_attention(k, k, v, w, 0.5, Tensor(), 0.0, /*causal=*/true, 0),
                     "favor_attention: chunk must be positive, got 0");
  const Tensor sums = rand({1, 2, 7, 7}), c = randn({1, 2, 1, 1});
  {
    NoGradGuard ng;
    EXPECT_LINEA_ERROR(favor_attention_step(k, k, v, w, 0.5, Tensor(), 0.0, sums, Tensor()),
                       "favor_attention_step: the running sums and their stabilizer come together, got sums "
                       "without c");
    EXPECT_LINEA_ERROR(favor_attention_step(k, k, v, w, 0.5, Tensor(), 0.0, rand({1, 2, 7, 6}), c),
                       "favor_attention_step: expected sums [1, 2, 7, 7] and c [1, 2, 1, 1], got [1, 2, 7, 6] and "
                       "[1, 2, 1, 1]");
  }
  Tensor kg = k.detach();
  kg.requires_grad_(true);
  EXPECT_LINEA_ERROR(favor_attention_step(kg, k, v, w, 0.5, Tensor(), 0.0, sums, c),
                     "favor_attention_step: decoding takes no gradient; run it under NoGradGuard");
  Tensor wg = w.detach();
  wg.requires_grad_(true);
  EXPECT_LINEA_ERROR(favor_attention(q, k, v, wg, 0.5, Tensor(), 0.0), "favor_attention: omega takes no gradient");
}

// ---- the fused causal linear attention --------------------------------------------------------
// The composed formula: [num, den] = tril(pq pk^T) [v, 1] + pq state, out = num / den~.
Tensor causal_linear_attention_composed(const Tensor& pq, const Tensor& pk, const Tensor& v, const Tensor& state,
                                        double guard) {
  const int64_t B = v.size(0), H = v.size(1), N = v.size(2), E = v.size(3);
  const Tensor v1 = cat({v, ones({B, H, N, 1}, v.options())}, -1);
  const Tensor a = masked_fill(matmul(pq, transpose(pk, -2, -1)), causal_hidden(N, N, 0, v.device()), 0.0);
  Tensor nd = matmul(a, v1);
  if (state.defined()) nd = nd + matmul(pq, state);
  const Tensor num = narrow(nd, -1, 0, E), den = narrow(nd, -1, E, 1), d = den.detach();
  const Tensor signed_guard = where(d >= 0.0, scalar_tensor(guard, d.options()), -guard);
  return num / where(abs(d) < guard, signed_guard, den);
}

TEST(CausalLinearAttention, MatchesTheComposedFormula) {
  manual_seed(64);
  const int64_t B = 2, H = 3, N = 13, S = 6, E = 4;
  const Tensor pq = exp(randn64({B, H, N, S})), pk = exp(randn64({B, H, N, S})), v = randn64({B, H, N, E});
  const Tensor state = exp(randn64({B, H, S, E + 1}));
  const Tensor v1 = cat({v, ones({B, H, N, 1}, f64())}, -1);
  for (const Tensor& st : {Tensor(), state}) {
    // 1: a scan over single rows; 4: a short last chunk; 13, 64: one chunk
    for (int64_t chunk : {1, 4, 13, 64}) {
      Tensor final;
      const Tensor out = causal_linear_attention(pq, pk, v, st, chunk, 1e-30, &final);
      EXPECT_TRUE(all_close(out, causal_linear_attention_composed(pq, pk, v, st, 1e-30), 1e-12, 1e-12)) << chunk;
      const Tensor sums = matmul(transpose(pk, -2, -1), v1);
      EXPECT_TRUE(all_close(final, st.defined() ? st + sums : sums, 1e-12, 1e-12)) << chunk;
      const Tensor out32 = causal_linear_attention(pq.to(DType::Float32), pk.to(DType::Float32), v.to(DType::Float32),
                                                   st.defined() ? st.to(DType::Float32) : Tensor(), chunk, 1e-30);
      EXPECT_TRUE(all_close(out32.to(DType::Float64), out, 1e-4, 1e-5)) << chunk;
    }
  }
  // Long enough for the kernel's threads (short calls run on one): 5 chunks of 64, the last short.
  const Tensor lq = exp(randn64({1, 2, 300, 16})), lk = exp(randn64({1, 2, 300, 16})), lv = randn64({1, 2, 300, 8});
  EXPECT_TRUE(all_close(causal_linear_attention(lq, lk, lv, Tensor(), 64, 1e-30),
                        causal_linear_attention_composed(lq, lk, lv, Tensor(), 1e-30), 1e-12, 1e-12));
  // Signed features with denominators near 0: the guard keeps the sign.
  const Tensor sq = randn64({1, 2, 9, 4}), sk = randn64({1, 2, 9, 4}), sv = randn64({1, 2, 9, 3});
  for (double guard : {1e-30, 0.5, 3.0})
    EXPECT_TRUE(all_close(causal_linear_attention(sq, sk, sv, Tensor(), 4, guard),
                          causal_linear_attention_composed(sq, sk, sv, Tensor(), guard), 1e-12, 1e-12))
        << guard;
}

TEST(GradCheck, CausalLinearAttention) {
  manual_seed(65);
  // N = 7 in chunks of 3 (a short last chunk), with a state; then no state, chunks of 2.
  EXPECT_GRADCHECK(
      [](const std::vector<Tensor>& in) {
        return causal_linear_attention(exp(in[0]), exp(in[1]), in[2], exp(in[3]), 3, 1e-30);
      },
      {randn64({2, 2, 7, 3}), randn64({2, 2, 7, 3}), randn64({2, 2, 7, 2}), randn64({2, 2, 3, 3})});
  EXPECT_GRADCHECK(
      [](const std::vector<Tensor>& in) {
        return causal_linear_attention(exp(in[0]), exp(in[1]), in[2], Tensor(), 2, 1e-30);
      },
      {randn64({1, 2, 5, 3}), randn64({1, 2, 5, 3}), randn64({1, 2, 5, 2})});
  // Signed features, the first two query rows scaled by 1e-3 so that the guard is active there
  // (checked): no gradient goes through a guarded den.
  const Tensor row_scale = from_vector<double>({1e-3, 1e-3, 1, 1, 1, 1}, {1, 1, 6, 1});
  const Tensor pq = randn64({1, 1, 6, 3}), pk = randn64({1, 1, 6, 3}), v = randn64({1, 1, 6, 2});
  const Tensor den =
      matmul(masked_fill(matmul(pq * row_scale, transpose(pk, -2, -1)), causal_hidden(6, 6, 0, pq.device()), 0.0),
             ones({1, 1, 6, 1}, f64()));
  const std::vector<double> d = den.to_vector<double>();
  ASSERT_LT(std::fabs(d[0]), 0.3);
  ASSERT_LT(std::fabs(d[1]), 0.3);
  EXPECT_GRADCHECK(
      [row_scale](const std::vector<Tensor>& in) {
        return causal_linear_attention(in[0] * row_scale, in[1], in[2], Tensor(), 4, 0.3);
      },
      {pq, pk, v});
}

TEST(CausalLinearAttention, BadInputsThrow) {
  const Tensor pq = rand({1, 2, 3, 4}), pk = rand({1, 2, 3, 4}), v = randn({1, 2, 3, 5});
  EXPECT_LINEA_ERROR(causal_linear_attention(pq, rand({1, 2, 4, 4}), v, Tensor(), 2, 0.0),
                     "causal_linear_attention: expected phi_q and phi_k [B, H, N, S], v [B, H, N, E] (key m seen by "
                     "queries n >= m), got phi_q [1, 2, 3, 4], phi_k [1, 2, 4, 4], v [1, 2, 3, 5]");
  EXPECT_LINEA_ERROR(causal_linear_attention(pq, pk, randn({1, 2, 3, 0}), Tensor(), 2, 0.0),
                     "every dim must be positive");
  EXPECT_LINEA_ERROR(causal_linear_attention(pq, pk, v, zeros({1, 2, 4, 5}), 2, 0.0),
                     "causal_linear_attention: state must be [B, H, S, E + 1] = [1, 2, 4, 6], got [1, 2, 4, 5]");
  EXPECT_LINEA_ERROR(causal_linear_attention(pq, pk, v, Tensor(), 0, 0.0),
                     "causal_linear_attention: chunk must be positive, got 0");
  EXPECT_LINEA_ERROR(causal_linear_attention(pq, pk, v, Tensor(), 2, -1.0), "guard must be finite and >= 0, got -1");
  EXPECT_LINEA_ERROR(causal_linear_attention(pq, pk, v.to(DType::Float64), Tensor(), 2, 0.0),
                     "causal_linear_attention");
}

TEST(Performer, BadOptionsAndInputsThrow) {
  EXPECT_LINEA_ERROR(attn::make_attention("performer:features=0", 2, 4), "performer: features must be positive, got 0");
  // An error, not an allocation of terabytes (tests/fuzz: fuzz_attention_spec).
  EXPECT_LINEA_ERROR(attn::make_attention("performer:features=1000000000000", 2, 4),
                     "performer: features 1000000000000 is more than the limit of 65536");
  EXPECT_LINEA_ERROR(attn::make_attention("performer:feature_map=cosh", 2, 4),
                     "performer: unknown feature_map 'cosh'");
  EXPECT_LINEA_ERROR(attn::make_attention("performer:redraw=-1", 2, 4), "performer: redraw must be >= 0");
  EXPECT_LINEA_ERROR(attn::make_attention("performer:chunk=0", 2, 4), "performer: chunk must be positive");
  EXPECT_LINEA_ERROR(attn::make_attention("performer:orthogonal=maybe", 2, 4), "expects a boolean");
  EXPECT_LINEA_ERROR(attn::make_attention("performer:feature=8", 2, 4), "unknown option feature");
  auto p = attn::make_attention("performer:features=8", 2, 4);
  Tensor q = randn({1, 2, 3, 4}), v = randn({1, 2, 3, 5});
  EXPECT_LINEA_ERROR(p->forward(randn({1, 3, 3, 4}), randn({1, 3, 3, 4}), randn({1, 3, 3, 4}), {}),
                     "performer: built for 2 heads of dim 4");
  EXPECT_LINEA_ERROR(p->forward(q, randn({1, 2, 3, 5}), v, {}), "performer: shapes do not match");
  EXPECT_LINEA_ERROR(p->forward(randn({2, 3, 4}), q, v, {}), "performer: expected q [B, H, N, D]");
  EXPECT_LINEA_ERROR(p->forward(q, q, v.to(DType::Float64), {}), "performer");
  EXPECT_LINEA_ERROR(p->forward(zeros({1, 2, 3, 4}, DType::Int64), zeros({1, 2, 3, 4}, DType::Int64),
                                zeros({1, 2, 3, 5}, DType::Int64), {}),
                     "performer: expected float32/float64 inputs");
  attn::AttentionOptions o;
  o.key_padding_mask = zeros({1, 4}, DType::Bool);
  EXPECT_LINEA_ERROR(p->forward(q, q, v, o), "performer: key_padding_mask must be [B, M] = [1, 3]");
  EXPECT_LINEA_ERROR(p->forward(q, narrow(q, 2, 0, 0), narrow(v, 2, 0, 0), {}), "performer: empty sequence");
  p->set_samples({{"omega", zeros({2, 7, 4})}});
  EXPECT_LINEA_ERROR(p->forward(q, q, v, {}), "sample 'omega' has shape [2, 7, 4] but this call needs [2, 8, 4]");
  EXPECT_LINEA_ERROR(p->set_samples({{"eps", zeros({1})}}), "unknown sample 'eps'");
  EXPECT_LINEA_ERROR(attn::performer_features(randn({1, 2, 3, 4}), randn({2, 8, 5}), FeatureMap::Softmax),
                     "performer_features: expected x_scaled [B, H, L, D] and omega [H, S, D]");
  EXPECT_LINEA_ERROR(std::make_shared<PerformerAttention>(2, 4, -3), "performer: features must be positive, got -3");
}

}  // namespace
}  // namespace linea
