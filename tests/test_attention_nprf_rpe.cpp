// The nprf_rpe mechanism and its Toeplitz product: the Toeplitz product (FFT and dense) against
// a naive loop; the dense path against the formula computed by naive float64 loops; the FFT path
// against the dense path (~1e-10 in float64: bidirectional and causal, odd and power-of-two N,
// cross-attention, padded keys); query offsets (also past every key) against the loops; padding,
// fully padded rows (the weights and the composed path too), causality, the bias and a constant
// shift of it (float32, past exp's range); feature
// redraws, eval determinism, explicit and frozen samples; the choice of path under dense=auto
// (dense for short, FFT for long sequences) and auto's output against the forced paths; parameter
// shape and init; errors; float32 robustness; gradient checks (float64) of both paths; the fused
// toeplitz_attention kernel (the CPU FFT path) against loops and the composed path, its gradient
// check and errors; CUDA parity (skipped without a GPU).
#include <array>
#include <cmath>
#include <functional>
#include <limits>
#include <vector>

#include "attention/nprf_rpe/nprf_rpe.h"
#include "attention/multihead.h"
#include "attention/nprf_rpe/toeplitz.h"
#include "tests/test_util.h"

namespace linea {
namespace {

using attn::NprfPath;
using attn::NprfRpeAttention;
using attn::AttentionOptions;
using test::all_close;
using test::f64;

Tensor r64(const Shape& s, double scale = 1.0) { return mul(randn(s, f64()), scale); }

Tensor mask_of(const std::vector<int>& pad, int64_t B, int64_t M) {
  return from_vector<int64_t>(std::vector<int64_t>(pad.begin(), pad.end()), {B, M});
}

AttentionOptions options(bool causal, const Tensor& pad = Tensor()) {
  AttentionOptions o;
  o.causal = causal;
  o.key_padding_mask = pad;
  return o;
}

// y [B, H, N, C] with y_i = sum_j c[h][j - i + N - 1] x_j, by loops.
Tensor naive_toeplitz(const Tensor& c, const Tensor& x, int64_t N) {
  const int64_t B = x.size(0), H = x.size(1), M = x.size(2), C = x.size(3), T = N + M - 1;
  auto cv = c.to_vector<double>(), xv = x.to_vector<double>();
  std::vector<double> y(static_cast<size_t>(B * H * N * C), 0.0);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < N; ++i)
        for (int64_t j = 0; j < M; ++j) {
          const double cij = c.dim() == 2 ? cv[h * T + j - i + N - 1] : cv[(b * H + h) * T + j - i + N - 1];
          for (int64_t e = 0; e < C; ++e) y[((b * H + h) * N + i) * C + e] += cij * xv[((b * H + h) * M + j) * C + e];
        }
  return from_vector<double>(y, {B, H, N, C});
}

// The nprf_rpe formula by loops, without stabilizers: for each (b, h, i), query i at position
// o + i (o = offset), weights A_ij = exp(rpe[h][j - (o + i) + L - 1]) phi(q^_i).phi(k^_j) over
// visible keys j (unpadded; causal: j <= o + i), out_i = sum A v / sum A.
Tensor naive_nprf(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& omega, const Tensor& rpe,
                  bool causal, const std::vector<int>& pad = {}, int64_t offset = 0) {
  const int64_t B = q.size(0), H = q.size(1), N = q.size(2), D = q.size(3), M = k.size(2), Dv = v.size(3);
  const int64_t S = omega.size(1), L = (rpe.size(1) + 1) / 2;
  auto qv = q.to_vector<double>(), kv = k.to_vector<double>(), vv = v.to_vector<double>();
  auto wv = omega.to_vector<double>(), bv = rpe.to_vector<double>();
  auto phi = [&](const double* x, int64_t h, std::vector<double>& out) {
    double n2 = 0;
    for (int64_t d = 0; d < D; ++d) n2 += x[d] * x[d];
    const double inv = n2 > 0 ? 1 / std::sqrt(n2) : 0.0;
    out.assign(S, 0.0);
    for (int64_t s = 0; s < S; ++s) {
      double dot = 0;
      for (int64_t d = 0; d < D; ++d) dot += wv[(h * S + s) * D + d] * x[d] * inv;
      out[s] = std::exp(dot - 0.5 * n2 * inv * inv) / std::sqrt(static_cast<double>(S));
    }
  };
  std::vector<double> out(static_cast<size_t>(B * H * N * Dv), 0.0), pq, pk;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < N; ++i) {
        phi(&qv[((b * H + h) * N + i) * D], h, pq);
        double z = 0;
        std::vector<double> acc(Dv, 0.0);
        for (int64_t j = 0; j < M; ++j) {
          if ((!pad.empty() && pad[b * M + j]) || (causal && j > offset + i)) continue;
          phi(&kv[((b * H + h) * M + j) * D], h, pk);
          double a = 0;
          for (int64_t s = 0; s < S; ++s) a += pq[s] * pk[s];
          a *= std::exp(bv[h * (2 * L - 1) + j - offset - i + L - 1]);
          z += a;
          for (int64_t e = 0; e < Dv; ++e) acc[e] += a * vv[((b * H + h) * M + j) * Dv + e];
        }
        if (z == 0) continue;
        for (int64_t e = 0; e < Dv; ++e) out[((b * H + h) * N + i) * Dv + e] = acc[e] / z;
      }
  return from_vector<double>(out, {B, H, N, Dv});
}

// A float64 layer with explicit features omega [H, S, D] and random bias (std `bias_std`).
std::shared_ptr<NprfRpeAttention> layer64(int64_t H, int64_t D, int64_t S, int64_t L, double bias_std, NprfPath dense,
                                          Tensor* omega_out = nullptr) {
  auto m = std::make_shared<NprfRpeAttention>(H, D, S, L, 1, dense);
  m->to(DType::Float64);
  Tensor omega = attn::orthogonal_gaussian(H, S, D);
  m->set_samples({{"omega", omega}});
  if (bias_std > 0) {
    NoGradGuard ng;
    Tensor rpe = m->rpe();
    rpe.copy_(r64(rpe.shape(), bias_std));
  }
  if (omega_out) *omega_out = omega;
  return m;
}

// ---- the Toeplitz product ------------------------------------------------------------------

TEST(NprfRpeToeplitz, FftLengthIsSmoothAndLargeEnough) {
  EXPECT_EQ(attn::fft_length(1), 1);
  EXPECT_EQ(attn::fft_length(7), 8);
  EXPECT_EQ(attn::fft_length(11), 12);
  EXPECT_EQ(attn::fft_length(13), 15);
  EXPECT_EQ(attn::fft_length(17), 18);
  EXPECT_EQ(attn::fft_length(97), 100);
  EXPECT_EQ(attn::fft_length(1025), 1080);
  EXPECT_LINEA_ERROR(attn::fft_length(0), "fft_length: length must be >= 1, got 0");
  EXPECT_LINEA_ERROR(attn::fft_length(std::numeric_limits<int64_t>::max()),
                     "fft_length: length 9223372036854775807 is too large");
}

TEST(NprfRpeToeplitz, FftAndDenseMatchNaiveLoop) {
  manual_seed(11);
  // (N, M): square odd/even/power of two, cross-attention both ways, single rows/columns.
  for (auto [N, M] : std::vector<std::pair<int64_t, int64_t>>{{7, 7}, {8, 8}, {16, 16}, {5, 9}, {9, 4}, {1, 6}, {6, 1},
                                                             {1, 1}}) {
    SCOPED_TRACE("N=" + std::to_string(N) + " M=" + std::to_string(M));
    Tensor c = r64({3, N + M - 1}), x = r64({2, 3, M, 4});
    Tensor ref = naive_toeplitz(c, x, N);
    EXPECT_TRUE(all_close(attn::toeplitz_matmul(c, x, N, /*fft=*/true), ref, 1e-12, 1e-10));
    EXPECT_TRUE(all_close(attn::toeplitz_matmul(c, x, N, /*fft=*/false), ref, 1e-12, 1e-12));
    // Per-batch coefficients [B, H, N+M-1].
    Tensor cb = r64({2, 3, N + M - 1});
    EXPECT_TRUE(all_close(attn::toeplitz_matmul(cb, x, N, true), naive_toeplitz(cb, x, N), 1e-12, 1e-10));
  }
  // float32 through FFTW's single-precision path.
  Tensor c = r64({2, 20}), x = r64({1, 2, 11, 3});
  Tensor y32 = attn::toeplitz_matmul(c.to(DType::Float32), x.to(DType::Float32), 10, true);
  EXPECT_EQ(y32.dtype(), DType::Float32);
  EXPECT_TRUE(all_close(y32, naive_toeplitz(c, x, 10), 1e-4, 1e-4));
}

TEST(NprfRpeToeplitz, BadArgumentsThrow) {
  Tensor x = r64({1, 2, 5, 3});
  EXPECT_LINEA_ERROR(attn::toeplitz_matmul(r64({2, 8}), x, 5), "offsets");
  EXPECT_LINEA_ERROR(attn::toeplitz_matmul(r64({3, 9}), x, 5), "toeplitz_matmul: c must be");
  EXPECT_LINEA_ERROR(attn::toeplitz_matmul(r64({2, 9}), r64({2, 5, 3}), 5), "x must be [B, H, M, C]");
  EXPECT_LINEA_ERROR(attn::toeplitz_matmul_channels_first(r64({2, 9}), r64({2, 3, 5}), 5),
                     "toeplitz_matmul: x must be [B, H, M, C] ([B, H, C, M] channels first), got [2, 3, 5]");
  EXPECT_LINEA_ERROR(attn::toeplitz_matmul(Tensor(), x, 5), test::undefined_arg("toeplitz_matmul", "c"));
  EXPECT_LINEA_ERROR(attn::toeplitz_matmul_channels_first(r64({2, 9}), Tensor(), 5),
                     test::undefined_arg("toeplitz_matmul", "x"));
  EXPECT_LINEA_ERROR(attn::toeplitz_matmul(r64({2, 4}), x, 0), "toeplitz_matmul: N must be >= 1, got 0");
  EXPECT_LINEA_ERROR(attn::toeplitz_matmul(zeros({2, 9}, TensorOptions(DType::Int64)), x, 5),
                     "toeplitz_matmul: c must be floating, got int64");
  EXPECT_LINEA_ERROR(attn::toeplitz_matmul(r64({2, 9}).to(DType::Float32), x, 5), "toeplitz_matmul: dtype mismatch");
  EXPECT_LINEA_ERROR(attn::toeplitz_matrix(r64({2, 8}), 5, 5),
                     "toeplitz_matrix: c [2, 8] must hold the 9 offsets -(N-1)..(M-1) for N = 5, M = 5");
  EXPECT_LINEA_ERROR(attn::toeplitz_matrix(r64({}), 1, 1), "toeplitz_matrix: c [] must hold the 1 offsets");
}

TEST(GradCheck, NprfRpeToeplitzFft) {
  manual_seed(12);
  Tensor c = test::randn64({2, 8}), x = test::randn64({2, 2, 5, 2});
  EXPECT_GRADCHECK([](const std::vector<Tensor>& in) { return attn::toeplitz_matmul(in[0], in[1], 4, true); }, {c, x});
}

// The fused toeplitz_attention op (nprf_rpe's CPU FFT path) against its definition by loops,
// with c per head and per (batch, head), and its gradient check in float64.
Tensor naive_toeplitz_attention(const Tensor& c, const Tensor& pq, const Tensor& pk, const Tensor& v) {
  const int64_t B = pq.size(0), H = pq.size(1), N = pq.size(2), M = pk.size(2), S = pq.size(3), E = v.size(3);
  auto cv = c.to_vector<double>(), qv = pq.to_vector<double>(), kv = pk.to_vector<double>(), vv = v.to_vector<double>();
  const bool per_batch = c.dim() == 3;
  std::vector<double> y(static_cast<size_t>(B * H * N * E), 0.0);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < N; ++i)
        for (int64_t j = 0; j < M; ++j) {
          double dot = 0;
          for (int64_t s = 0; s < S; ++s) dot += qv[((b * H + h) * N + i) * S + s] * kv[((b * H + h) * M + j) * S + s];
          const double w = dot * cv[((per_batch ? b * H : 0) + h) * (N + M - 1) + (j - i + N - 1)];
          for (int64_t e = 0; e < E; ++e) y[((b * H + h) * N + i) * E + e] += w * vv[((b * H + h) * M + j) * E + e];
        }
  return from_vector<double>(y, {B, H, N, E});
}

TEST(NprfRpeToeplitz, FusedAttentionMatchesNaiveLoop) {
  manual_seed(13);
  // B * H = 1 (features split over threads) and 6 (a (b, h) per thread); N > M, N < M, N = 1;
  // past the direct path's tiles of 64 rows and 256 keys.
  for (auto [B, H, N, M] :
       std::vector<std::array<int64_t, 4>>{{1, 1, 7, 4}, {2, 3, 5, 9}, {1, 2, 1, 6}, {1, 2, 70, 300}}) {
    for (bool per_batch : {false, true}) {
      SCOPED_TRACE("B=" + std::to_string(B) + " H=" + std::to_string(H) + " N=" + std::to_string(N) +
                   " M=" + std::to_string(M) + (per_batch ? " c per batch" : " c per head"));
      Tensor c = per_batch ? r64({B, H, N + M - 1}) : r64({H, N + M - 1});
      Tensor pq = exp(r64({B, H, N, 3})), pk = exp(r64({B, H, M, 3})), v = r64({B, H, M, 2});
      Tensor ref = naive_toeplitz_attention(c, pq, pk, v);
      EXPECT_TRUE(all_close(toeplitz_attention(c, pq, pk, v, attn::fft_length(N + M - 1)), ref, 1e-11, 1e-11));
      // Any length >= N + M - 1 gives the same sums; length 0 is the direct path.
      EXPECT_TRUE(all_close(toeplitz_attention(c, pq, pk, v, N + M + 6), ref, 1e-11, 1e-11));
      EXPECT_TRUE(all_close(toeplitz_attention(c, pq, pk, v, 0), ref, 1e-12, 1e-12)) << "direct";
      Tensor ref32 = ref.to(DType::Float32);
      for (int64_t len : {attn::fft_length(N + M - 1), int64_t{0}})
        EXPECT_TRUE(all_close(toeplitz_attention(c.to(DType::Float32), pq.to(DType::Float32), pk.to(DType::Float32),
                                                 v.to(DType::Float32), len),
                              ref32, 1e-4, 1e-4))
            << "fft length " << len;
    }
  }
}

TEST(GradCheck, NprfRpeFusedToeplitzAttention) {
  manual_seed(14);
  const std::function<Tensor(const std::vector<Tensor>&)> f = [](const std::vector<Tensor>& x) {
    return toeplitz_attention(x[0], x[1], x[2], x[3], attn::fft_length(x[1].size(2) + x[2].size(2) - 1));
  };
  EXPECT_GRADCHECK(f, {test::randn64({2, 6}), test::randn64({1, 2, 4, 3}), test::randn64({1, 2, 3, 3}),
                       test::randn64({1, 2, 3, 2})});
  EXPECT_GRADCHECK(f, {test::randn64({2, 1, 8}), test::randn64({2, 1, 3, 2}), test::randn64({2, 1, 6, 2}),
                       test::randn64({2, 1, 6, 3})});
  // The direct path (fft length 0), c per head (dc summed over the batch) and per (b, h), and past
  // its tiles of 64 rows and 256 keys.
  const std::function<Tensor(const std::vector<Tensor>&)> direct = [](const std::vector<Tensor>& x) {
    return toeplitz_attention(x[0], x[1], x[2], x[3], 0);
  };
  EXPECT_GRADCHECK(direct, {test::randn64({2, 6}), test::randn64({2, 2, 4, 3}), test::randn64({2, 2, 3, 3}),
                            test::randn64({2, 2, 3, 2})});
  EXPECT_GRADCHECK(direct, {test::randn64({2, 1, 8}), test::randn64({2, 1, 3, 2}), test::randn64({2, 1, 6, 2}),
                            test::randn64({2, 1, 6, 3})});
  EXPECT_GRADCHECK(direct, {test::randn64({1, 326}), test::randn64({1, 1, 67, 2}), test::randn64({1, 1, 260, 2}),
                            test::randn64({1, 1, 260, 1})});
}

TEST(NprfRpeToeplitz, FusedAttentionBadArgumentsThrow) {
  Tensor c = r64({2, 8}), pq = r64({1, 2, 4, 3}), pk = r64({1, 2, 5, 3}), v = r64({1, 2, 5, 2});
  EXPECT_LINEA_ERROR(toeplitz_attention(c, pq, pk, v, 7), "fft length 7 is below N + M - 1 = 8");
  EXPECT_LINEA_ERROR(toeplitz_attention(r64({2, 9}), pq, pk, v, 8), "c must be [H, N+M-1] = [2, 8]");
  EXPECT_LINEA_ERROR(toeplitz_attention(c, pq, r64({1, 2, 5, 4}), v, 8), "expected phi_q [B, H, N, S]");
  EXPECT_LINEA_ERROR(toeplitz_attention(c, pq, pk, v.to(DType::Float32), 8), "float64");
  EXPECT_LINEA_ERROR(toeplitz_attention(c, r64({1, 2, 0, 3}), pk, v, 8), "empty sequences");
}

// ---- the mechanism: values ------------------------------------------------------------------

TEST(NprfRpe, DenseMatchesNaiveFormula) {
  manual_seed(21);
  const int64_t B = 2, H = 2, D = 4, S = 6, L = 9;
  Tensor omega = attn::orthogonal_gaussian(H, S, D), rpe = r64({H, 2 * L - 1});
  Tensor q = r64({B, H, 7, D}), k = r64({B, H, 9, D}), v = r64({B, H, 9, 3});
  for (bool causal : {false, true}) {
    SCOPED_TRACE(causal ? "causal" : "bidirectional");
    EXPECT_TRUE(all_close(attn::nprf_rpe_attention(q, k, v, omega, rpe, options(causal), true),
                          naive_nprf(q, k, v, omega, rpe, causal), 1e-12, 1e-10));
    std::vector<int> pad = {0, 0, 1, 0, 0, 0, 1, 0, 1, /**/ 1, 1, 0, 0, 0, 0, 0, 0, 0};
    Tensor mask = mask_of(pad, B, 9);
    EXPECT_TRUE(all_close(attn::nprf_rpe_attention(q, k, v, omega, rpe, options(causal, mask), true),
                          naive_nprf(q, k, v, omega, rpe, causal, pad), 1e-12, 1e-10));
  }
}

// Queries at positions o, o + 1, ... (decoding's offset), also past every key (o >= M: causal
// hides nothing then), by either path.
TEST(NprfRpe, QueryOffsetMatchesNaiveFormula) {
  manual_seed(28);
  const int64_t B = 2, H = 2, D = 4, S = 6, L = 18, N = 7, M = 9;
  Tensor omega = attn::orthogonal_gaussian(H, S, D), rpe = r64({H, 2 * L - 1});
  Tensor q = r64({B, H, N, D}), k = r64({B, H, M, D}), v = r64({B, H, M, 3});
  const std::vector<int> pad = {0, 0, 1, 0, 0, 0, 1, 0, 1, /**/ 1, 1, 0, 0, 0, 0, 0, 0, 0};
  for (int64_t o : {2, 9, 11})
    for (bool causal : {false, true})
      for (bool dense : {false, true}) {
        SCOPED_TRACE("offset " + std::to_string(o) + (causal ? " causal" : "") + (dense ? " dense" : " fft"));
        AttentionOptions opts = options(causal, mask_of(pad, B, M));
        opts.query_offset = o;
        EXPECT_TRUE(all_close(attn::nprf_rpe_attention(q, k, v, omega, rpe, opts, dense),
                              naive_nprf(q, k, v, omega, rpe, causal, pad, o), 1e-10, 1e-10));
      }
}

// The bias enters as exp(b - max b): a constant added to every offset's bias changes nothing, even
// one that exp() alone would overflow in float32.
TEST(NprfRpe, ConstantBiasShiftChangesNothing) {
  manual_seed(29);
  const int64_t B = 2, H = 2, D = 4, S = 8, L = 12;
  Tensor omega = attn::orthogonal_gaussian(H, S, D).to(DType::Float32), rpe = randn({H, 2 * L - 1});
  Tensor q = randn({B, H, 10, D}), k = randn({B, H, 10, D}), v = randn({B, H, 10, 3});
  for (bool causal : {false, true})
    for (bool dense : {false, true}) {
      SCOPED_TRACE(std::string(causal ? "causal" : "bidirectional") + (dense ? " dense" : " fft"));
      const Tensor ref = attn::nprf_rpe_attention(q, k, v, omega, rpe, options(causal), dense);
      const Tensor shifted = attn::nprf_rpe_attention(q, k, v, omega, rpe + 200.0, options(causal), dense);
      EXPECT_TRUE(all_close(shifted, ref, 1e-5, 1e-5));
    }
}

TEST(NprfRpe, FftMatchesDense) {
  manual_seed(22);
  const int64_t B = 2, H = 3, D = 8, S = 16, L = 40;
  Tensor omega = attn::orthogonal_gaussian(H, S, D), rpe = r64({H, 2 * L - 1});
  // odd and power-of-two N, cross-attention both ways
  for (auto [N, M] : std::vector<std::pair<int64_t, int64_t>>{{13, 13}, {32, 32}, {9, 20}, {21, 6}}) {
    Tensor q = r64({B, H, N, D}, 2.0), k = r64({B, H, M, D}, 2.0), v = r64({B, H, M, 5});
    std::vector<int> pad(static_cast<size_t>(B * M), 0);
    pad[1] = pad[M - 1] = pad[M] = pad[M + 2] = 1;
    for (bool causal : {false, true})
      for (bool padded : {false, true}) {
        SCOPED_TRACE("N=" + std::to_string(N) + " M=" + std::to_string(M) + (causal ? " causal" : "") +
                     (padded ? " padded" : ""));
        AttentionOptions o = options(causal, padded ? mask_of(pad, B, M) : Tensor());
        Tensor fft = attn::nprf_rpe_attention(q, k, v, omega, rpe, o, false);
        Tensor dense = attn::nprf_rpe_attention(q, k, v, omega, rpe, o, true);
        EXPECT_TRUE(all_close(fft, dense, 1e-10, 1e-10));
        // The fused CPU kernel and the composed FFT path (the CUDA one).
        EXPECT_TRUE(all_close(fft, attn::nprf_rpe_attention_fft_composed(q, k, v, omega, rpe, o), 1e-10, 1e-10));
        if (N == 13) {
          std::vector<int> p = padded ? pad : std::vector<int>{};
          EXPECT_TRUE(all_close(dense, naive_nprf(q, k, v, omega, rpe, causal, p), 1e-12, 1e-10));
        }
      }
  }
}

TEST(NprfRpe, ForwardIsAttentionMatrixTimesV) {
  manual_seed(23);
  Tensor omega;
  auto m = layer64(2, 4, 8, 16, 1.0, NprfPath::Fft, &omega);
  Tensor q = r64({2, 2, 6, 4}), k = r64({2, 2, 10, 4}), v = r64({2, 2, 10, 3});
  Tensor mask = mask_of({0, 0, 0, 1, 0, 0, 0, 0, 0, 1, /**/ 0, 1, 0, 0, 0, 0, 0, 0, 0, 0}, 2, 10);
  for (bool causal : {false, true}) {
    AttentionOptions o = options(causal, mask);
    Tensor a = m->attention_matrix(q, k, o);
    ASSERT_EQ(a.shape(), (Shape{2, 2, 6, 10}));
    EXPECT_TRUE(all_close(m->forward(q, k, v, o), matmul(a, v), 1e-10, 1e-10));
    EXPECT_TRUE(all_close(sum(a, {-1}), ones({2, 2, 6}, f64()), 1e-12, 1e-12));  // every row sees a key
    EXPECT_EQ(raw::reduce(ReduceOp::Min, a, {}, false).item(), 0.0);  // hidden entries exactly 0, none negative
  }
  EXPECT_TRUE(all_close(m->last_samples().at("omega"), omega, 0, 0));
}

TEST(NprfRpe, AppendedPaddedKeysLeaveOutputsUnchanged) {
  manual_seed(24);
  auto m = layer64(2, 4, 8, 16, 1.0, NprfPath::Fft);
  Tensor q = r64({2, 2, 7, 4}), k = r64({2, 2, 7, 4}), v = r64({2, 2, 7, 3});
  Tensor k2 = cat({k, r64({2, 2, 4, 4}, 5.0)}, 2), v2 = cat({v, r64({2, 2, 4, 3}, 5.0)}, 2);
  std::vector<int> pad(22, 0);
  for (int j = 7; j < 11; ++j) pad[j] = pad[11 + j] = 1;
  for (bool causal : {false, true}) {
    Tensor ref = m->forward(q, k, v, options(causal));
    EXPECT_TRUE(all_close(m->forward(q, k2, v2, options(causal, mask_of(pad, 2, 11))), ref, 1e-10, 1e-10));
  }
}

TEST(NprfRpe, FullyPaddedRowsGiveZerosNotNaN) {
  manual_seed(25);
  for (bool dense : {false, true}) {
    auto m = layer64(2, 4, 8, 8, 1.0, dense ? NprfPath::Dense : NprfPath::Fft);
    Tensor q = test::randn64({2, 2, 5, 4}), k = test::randn64({2, 2, 5, 4}), v = test::randn64({2, 2, 5, 3});
    // batch 0: every key padded; batch 1: keys 0, 1 padded, so causal queries 0, 1 see nothing.
    Tensor mask = mask_of({1, 1, 1, 1, 1, /**/ 1, 1, 0, 0, 0}, 2, 5);
    for (bool causal : {false, true}) {
      SCOPED_TRACE(std::string(dense ? "dense" : "fft") + (causal ? " causal" : ""));
      Tensor out = m->forward(q, k, v, options(causal, mask));
      EXPECT_TRUE(all_close(out.narrow(0, 0, 1), zeros({1, 2, 5, 3}, f64()), 0, 0));
      if (causal) {
        EXPECT_TRUE(all_close(out.narrow(0, 1, 1).narrow(2, 0, 2), zeros({1, 2, 2, 3}, f64()), 0, 0));
      }
      // The weights and the composed FFT path (CUDA's) give the same exact zeros.
      const Tensor a = m->attention_matrix(q.detach(), k.detach(), options(causal, mask));
      EXPECT_TRUE(all_close(a.narrow(0, 0, 1), zeros({1, 2, 5, 5}, f64()), 0, 0));
      const Tensor composed = attn::nprf_rpe_attention_fft_composed(
          q.detach(), k.detach(), v.detach(), m->last_samples().at("omega"), m->rpe().detach(), options(causal, mask));
      EXPECT_TRUE(all_close(composed, out.detach(), 0, 1e-10));
      EXPECT_TRUE(all_close(composed.narrow(0, 0, 1), zeros({1, 2, 5, 3}, f64()), 0, 0));
      if (causal) {
        EXPECT_TRUE(all_close(composed.narrow(0, 1, 1).narrow(2, 0, 2), zeros({1, 2, 2, 3}, f64()), 0, 0));
      }
      // Gradients are finite, and zero for the queries that see nothing.
      sum(square(out)).backward();
      for (Tensor t : {q, k, v}) {
        for (double g : t.grad().to_vector<double>()) ASSERT_TRUE(std::isfinite(g));
        t.zero_grad();
      }
    }
  }
}

TEST(NprfRpe, CausalFutureTokensDoNotChangePast) {
  manual_seed(26);
  auto m = layer64(2, 4, 8, 16, 1.0, NprfPath::Fft);
  Tensor q = r64({2, 2, 11, 4}), k = r64({2, 2, 11, 4}), v = r64({2, 2, 11, 3});
  Tensor out = m->forward(q, k, v, options(true));
  const int64_t t = 6;  // change positions t.. of q, k and v
  auto change = [&](const Tensor& x) { return cat({x.narrow(2, 0, t), r64({2, 2, 11 - t, x.size(3)}, 3.0)}, 2); };
  Tensor out2 = m->forward(change(q), change(k), change(v), options(true));
  EXPECT_TRUE(all_close(out2.narrow(2, 0, t), out.narrow(2, 0, t), 1e-10, 1e-10));
  EXPECT_FALSE(all_close(out2.narrow(2, t, 11 - t), out.narrow(2, t, 11 - t), 1e-3, 0));
  // The first query sees only the first key.
  EXPECT_TRUE(all_close(out.narrow(2, 0, 1), v.narrow(2, 0, 1), 1e-10, 1e-10));
}

TEST(NprfRpe, LargeZeroOffsetBiasAttendsToOwnPosition) {
  manual_seed(27);
  const int64_t L = 12, N = 10;
  auto m = layer64(2, 4, 8, L, 0.0, NprfPath::Fft);
  Tensor q = r64({1, 2, N, 4}), k = r64({1, 2, N, 4}), v = r64({1, 2, N, 3});
  Tensor flat = m->forward(q, k, v, {});
  {
    NoGradGuard ng;
    Tensor b0 = m->rpe().narrow(1, L - 1, 1);
    b0.fill_(30.0);  // b_0 = 30, every other offset 0
  }
  Tensor a = m->attention_matrix(q, k, {});
  // Off-diagonal weights are ~ e^-30 times a ratio of feature products (bounded by e^{2|w|}).
  for (int64_t h = 0; h < 2; ++h)
    for (int64_t i = 0; i < N; ++i) EXPECT_GT(a.select(1, h).select(1, i).select(1, i).item(), 0.999);
  Tensor out = m->forward(q, k, v, {});
  EXPECT_TRUE(all_close(out, v, 1e-3, 0));
  EXPECT_FALSE(all_close(flat, v, 1e-1, 0));  // without the bias it is not the identity
}

// ---- the choice of path (dense=auto) --------------------------------------------------------

TEST(NprfRpe, AutoPicksDenseForShortAndFftForLong) {
  using attn::nprf_rpe_prefers_dense;
  // Default features S = 64, Dv = 16 (the ViT app's heads): dense up to N = M ~ 1500 (the direct
  // kernel measured 1.1x faster at 1024, FFT 1.4x faster at 2048).
  EXPECT_TRUE(nprf_rpe_prefers_dense(50, 50, 64, 16));
  EXPECT_TRUE(nprf_rpe_prefers_dense(1024, 1024, 64, 16));
  EXPECT_FALSE(nprf_rpe_prefers_dense(2048, 2048, 64, 16));
  // Dv = 64 (the protein app's heads): dense up to ~4000 (measured 1.5x faster at 2048, 1.2x at
  // 4096: the rule is near the even point there).
  EXPECT_TRUE(nprf_rpe_prefers_dense(2048, 2048, 64, 64));
  EXPECT_FALSE(nprf_rpe_prefers_dense(8192, 8192, 64, 64));
  // Fewer FFT channels S*Dv: the FFT path pays off sooner (S = Dv = 16: dense 1.15x faster at 512,
  // FFT 1.4x faster at 1024).
  EXPECT_TRUE(nprf_rpe_prefers_dense(512, 512, 16, 16));
  EXPECT_FALSE(nprf_rpe_prefers_dense(1024, 1024, 16, 16));
  // On CUDA, the pairs timed on an H200 (Dv = 64; nprf_rpe.cpp): dense at 2048 and FFT at 4096
  // for S = 16, dense at 4096 and FFT at 8192 for S = 64; the CPU's rule would take FFT at 4096.
  EXPECT_TRUE(nprf_rpe_prefers_dense(2048, 2048, 16, 64, /*cuda=*/true));
  EXPECT_FALSE(nprf_rpe_prefers_dense(4096, 4096, 16, 64, /*cuda=*/true));
  EXPECT_TRUE(nprf_rpe_prefers_dense(4096, 4096, 64, 64, /*cuda=*/true));
  EXPECT_FALSE(nprf_rpe_prefers_dense(4096, 4096, 64, 64));
  EXPECT_FALSE(nprf_rpe_prefers_dense(8192, 8192, 64, 64, /*cuda=*/true));
  // Cross-attention: few queries over many keys stays dense.
  EXPECT_TRUE(nprf_rpe_prefers_dense(64, 16384, 16, 16));
  EXPECT_TRUE(nprf_rpe_prefers_dense(16384, 64, 16, 16));
  // One switch along the length: once FFT, FFT for every longer sequence.
  for (int64_t S : {1, 16, 64, 256}) {
    bool was_dense = true;
    int switches = 0;
    for (int64_t N = 1; N <= (1 << 20); N *= 2) {
      const bool d = nprf_rpe_prefers_dense(N, N, S, 16);
      switches += d != was_dense;
      EXPECT_FALSE(d && !was_dense) << "S=" << S << " N=" << N;
      was_dense = d;
    }
    EXPECT_EQ(switches, 1) << "S=" << S;
  }

  // Through the layer: auto asks the rule with its features and head dim (or the given Dv);
  // dense=0 / dense=1 force one path at every length.
  auto layer = [](const std::string& spec) {
    auto m = std::dynamic_pointer_cast<NprfRpeAttention>(attn::make_attention(spec, 4, 16));
    EXPECT_NE(m, nullptr);
    return m;
  };
  auto a = layer("nprf_rpe");
  EXPECT_EQ(a->dense(), NprfPath::Auto);
  EXPECT_TRUE(a->uses_dense(50, 50));
  EXPECT_FALSE(a->uses_dense(8192, 8192));
  EXPECT_TRUE(a->uses_dense(2048, 2048, /*Dv=*/64));
  EXPECT_TRUE(layer("nprf_rpe:features=16")->uses_dense(64, 64));
  EXPECT_FALSE(layer("nprf_rpe:features=16")->uses_dense(1024, 1024));
  EXPECT_FALSE(layer("nprf_rpe:dense=0")->uses_dense(50, 50));
  EXPECT_TRUE(layer("nprf_rpe:dense=1")->uses_dense(8192, 8192));
}

TEST(NprfRpe, AutoOutputEqualsForcedPaths) {
  manual_seed(28);
  // S = D = Dv = 4: the rule switches near N = M = 120, so both sides are cheap to run.
  const int64_t B = 2, H = 2, D = 4, S = 4, L = 256;
  Tensor omega;
  auto a = layer64(H, D, S, L, 1.0, NprfPath::Auto, &omega);
  auto f = layer64(H, D, S, L, 0.0, NprfPath::Fft), d = layer64(H, D, S, L, 0.0, NprfPath::Dense);
  for (auto* m : {f.get(), d.get()}) {
    NoGradGuard ng;
    m->set_samples({{"omega", omega}});
    Tensor rpe = m->rpe();
    rpe.copy_(a->rpe());
  }
  for (int64_t N : {3, 256}) {
    const bool short_ = N == 3;
    ASSERT_EQ(a->uses_dense(N, N), short_) << "N=" << N;
    Tensor q = r64({B, H, N, D}), k = r64({B, H, N, D}), v = r64({B, H, N, D});
    std::vector<int> pad(static_cast<size_t>(B * N), 0);
    pad[1] = pad[N + 2] = 1;
    for (bool causal : {false, true}) {
      SCOPED_TRACE("N=" + std::to_string(N) + (causal ? " causal" : ""));
      AttentionOptions o = options(causal, mask_of(pad, B, N));
      Tensor out = a->forward(q, k, v, o), fft = f->forward(q, k, v, o), dense = d->forward(q, k, v, o);
      EXPECT_TRUE(all_close(fft, dense, 1e-10, 1e-10));
      // The paths round differently, so equality to the bit says which one auto took.
      EXPECT_FALSE(all_close(fft, dense, 0, 0));
      EXPECT_TRUE(all_close(out, short_ ? dense : fft, 0, 0));
    }
  }
}

// ---- the mechanism: samples, state, errors --------------------------------------------------

TEST(NprfRpe, TrainRedrawsEvalIsDeterministicSamplesCanBeFixed) {
  manual_seed(31);
  Tensor q = r64({1, 2, 6, 4}), k = r64({1, 2, 6, 4}), v = r64({1, 2, 6, 3});
  auto m = std::make_shared<NprfRpeAttention>(2, 4, 8, 8, /*redraw=*/1, NprfPath::Fft);
  m->to(DType::Float64);
  Tensor w0 = clone(m->omega());
  // Training: every forward draws new features (the first included), into the buffer.
  Tensor o1 = m->forward(q, k, v, {});
  Tensor held = m->last_samples().at("omega");  // not a copy: a redraw must not change it
  Tensor w1 = clone(held);
  EXPECT_FALSE(all_close(w1, w0, 1e-6, 0));
  EXPECT_TRUE(all_close(m->omega(), w1, 0, 0));
  Tensor o2 = m->forward(q, k, v, {});
  EXPECT_FALSE(all_close(o2, o1, 1e-8, 0));
  EXPECT_FALSE(all_close(m->last_samples().at("omega"), w1, 1e-6, 0));
  EXPECT_TRUE(all_close(m->omega(), m->last_samples().at("omega"), 0, 0));
  EXPECT_TRUE(all_close(held, w1, 0, 0));
  // Eval: the buffer, never redrawn.
  m->eval();
  Tensor e1 = m->forward(q, k, v, {}), e2 = m->forward(q, k, v, {});
  EXPECT_TRUE(all_close(e1, e2, 0, 0));
  EXPECT_TRUE(all_close(m->last_samples().at("omega"), m->omega(), 0, 0));
  // Frozen in training: the first draw is kept.
  m->train();
  m->freeze_samples();
  Tensor f1 = m->forward(q, k, v, {}), f2 = m->forward(q, k, v, {});
  EXPECT_TRUE(all_close(f1, f2, 0, 0));
  // Explicit omega: the functional form with that omega.
  m->clear_samples();
  Tensor omega = attn::orthogonal_gaussian(2, 8, 4);
  m->set_samples({{"omega", omega}});
  EXPECT_TRUE(all_close(m->forward(q, k, v, {}), attn::nprf_rpe_attention(q, k, v, omega, m->rpe()), 1e-14, 0));
  EXPECT_LINEA_ERROR(m->set_samples({{"eps", omega}}), "unknown sample 'eps'");
  m->set_samples({{"omega", r64({2, 7, 4})}});
  EXPECT_LINEA_ERROR(m->forward(q, k, v, {}), "sample 'omega' has shape");
  m->clear_samples();

  // redraw=2: new features at training forwards 1, 3, 5, ...; redraw=0: never.
  for (int64_t every : {2, 0}) {
    auto r = std::make_shared<NprfRpeAttention>(2, 4, 8, 8, every, NprfPath::Fft);
    std::vector<Tensor> seen;
    for (int i = 0; i < 4; ++i) {
      r->forward(q.to(DType::Float32), k.to(DType::Float32), v.to(DType::Float32), {});
      seen.push_back(clone(r->last_samples().at("omega")));
    }
    const bool changes = every == 2;
    EXPECT_TRUE(all_close(seen[1], seen[0], 0, 0));
    EXPECT_EQ(!all_close(seen[2], seen[1], 0, 0), changes);
    EXPECT_TRUE(all_close(seen[3], seen[2], 0, 0));
  }
}

TEST(NprfRpe, ParametersBuffersAndSpec) {
  auto m = attn::make_attention("nprf_rpe:features=8,max_len=16", 3, 4);
  auto* n = dynamic_cast<NprfRpeAttention*>(m.get());
  ASSERT_NE(n, nullptr);
  EXPECT_EQ(n->features(), 8);
  EXPECT_EQ(n->max_len(), 16);
  EXPECT_EQ(n->redraw(), 1);
  EXPECT_EQ(n->dense(), NprfPath::Auto);  // the default
  auto params = m->named_parameters();
  ASSERT_EQ(params.size(), 1u);
  EXPECT_EQ(params[0].first, "rpe");
  EXPECT_EQ(params[0].second.shape(), (Shape{3, 31}));
  EXPECT_EQ(params[0].second.dtype(), DType::Float32);
  EXPECT_TRUE(all_close(params[0].second, zeros({3, 31}), 0, 0));
  auto bufs = m->named_buffers();  // the redraw schedule's counter, then the features
  ASSERT_EQ(bufs.size(), 2u);
  EXPECT_EQ(bufs[0].first, "redraw_calls");
  EXPECT_EQ(bufs[0].second.dtype(), DType::Int64);
  EXPECT_EQ(bufs[1].first, "omega");
  EXPECT_EQ(bufs[1].second.shape(), (Shape{3, 8, 4}));
  EXPECT_EQ(bufs[1].second.dtype(), DType::Float32);
  EXPECT_EQ(m->sample_names(), std::vector<std::string>{"omega"});
  auto d = attn::make_attention("nprf_rpe", 2, 4);
  auto* dn = dynamic_cast<NprfRpeAttention*>(d.get());
  EXPECT_EQ(dn->features(), 64);
  EXPECT_EQ(dn->max_len(), 512);
  auto mode = [](const std::string& spec) {
    return dynamic_cast<NprfRpeAttention*>(attn::make_attention(spec, 2, 4).get())->dense();
  };
  EXPECT_EQ(mode("nprf_rpe:dense=1,redraw=0"), NprfPath::Dense);
  EXPECT_EQ(mode("nprf_rpe:dense=true"), NprfPath::Dense);
  EXPECT_EQ(mode("nprf_rpe:dense=0"), NprfPath::Fft);
  EXPECT_EQ(mode("nprf_rpe:dense=off"), NprfPath::Fft);
  EXPECT_EQ(mode("nprf_rpe:dense=auto"), NprfPath::Auto);
  EXPECT_EQ(mode("nprf_rpe:dense=AUTO"), NprfPath::Auto);
  EXPECT_NE(m->str().find("max_len=16"), std::string::npos);
  EXPECT_NE(m->str().find("dense=auto"), std::string::npos);
  EXPECT_NE(attn::make_attention("nprf_rpe:dense=0", 2, 4)->str().find("dense=0"), std::string::npos);
  // Through MultiHeadAttention, self-attention with padding and a causal mask.
  manual_seed(32);
  attn::MultiHeadAttention mha(8, 2, "nprf_rpe:features=4,max_len=6");
  Tensor x = randn({2, 6, 8});
  Tensor y = mha(x, x, options(true, mask_of({0, 0, 0, 0, 1, 1, 0, 0, 0, 0, 0, 0}, 2, 6)));
  EXPECT_EQ(y.shape(), (Shape{2, 6, 8}));
  for (double e : y.to_vector<double>()) ASSERT_TRUE(std::isfinite(e));
  // The bias is trained: the gradient reaches the module's parameter.
  sum(square(y)).backward();
  Tensor g = mha.mechanism()->named_parameters()[0].second.grad();
  ASSERT_TRUE(g.defined());
  EXPECT_EQ(g.shape(), (Shape{2, 11}));
  EXPECT_GT(raw::reduce(ReduceOp::Max, raw::unary(UnaryOp::Abs, g), {}, false).item(), 0.0);
}

TEST(NprfRpe, LengthsBeyondMaxLenThrow) {
  auto m = attn::make_attention("nprf_rpe:features=4,max_len=8", 2, 4);
  Tensor ok = randn({1, 2, 8, 4}), long_ = randn({1, 2, 9, 4});
  EXPECT_NO_THROW(m->forward(ok, ok, ok, {}));
  EXPECT_LINEA_ERROR(m->forward(long_, long_, long_, {}), "max_len = 8");
  EXPECT_LINEA_ERROR(m->forward(ok, long_, long_, {}), "max_len");
  EXPECT_LINEA_ERROR(m->forward(long_, ok, ok, {}), "max_len");
  EXPECT_LINEA_ERROR(m->attention_matrix(long_, ok, {}), "max_len");
}

TEST(NprfRpe, BadOptionsAndInputsThrow) {
  EXPECT_LINEA_ERROR(attn::make_attention("nprf_rpe:features=0", 2, 4), "features must be > 0");
  EXPECT_LINEA_ERROR(attn::make_attention("nprf_rpe:max_len=0", 2, 4), "max_len must be > 0");
  // Errors, not allocations of terabytes (tests/fuzz: fuzz_attention_spec).
  EXPECT_LINEA_ERROR(attn::make_attention("nprf_rpe:features=1000000000000", 2, 4),
                     "nprf_rpe: features 1000000000000 is more than the limit of 65536");
  EXPECT_LINEA_ERROR(attn::make_attention("nprf_rpe:max_len=9223372036854775807", 2, 4),
                     "nprf_rpe: max_len 9223372036854775807 is more than the limit of 1048576");
  EXPECT_LINEA_ERROR(attn::make_attention("nprf_rpe:redraw=-1", 2, 4), "redraw must be >= 0");
  EXPECT_LINEA_ERROR(attn::make_attention("nprf_rpe:dense=maybe", 2, 4), "'dense' expects 0, 1 or auto, got 'maybe'");
  EXPECT_ANY_THROW(attn::make_attention("nprf_rpe:feature=8", 2, 4));
  auto m = attn::make_attention("nprf_rpe:features=4,max_len=8", 2, 4);
  Tensor q = randn({1, 2, 5, 4});
  EXPECT_LINEA_ERROR(m->forward(q, q, randn({1, 2, 4, 3}), {}), "nprf_rpe");
  EXPECT_LINEA_ERROR(m->forward(randn({1, 3, 5, 4}), randn({1, 3, 5, 4}), randn({1, 3, 5, 4}), {}), "built for 2 heads");
  EXPECT_LINEA_ERROR(m->forward(randn({1, 2, 0, 4}), q, q, {}), "empty sequences");
  EXPECT_LINEA_ERROR(m->forward(q, q, q, options(false, zeros({1, 4}, TensorOptions(DType::Int64)))),
                     "key_padding_mask must be [B, M]");
  EXPECT_LINEA_ERROR(attn::nprf_rpe_attention(q, q, q, randn({2, 4, 3}), zeros({2, 15})), "omega must be [H, S, D]");
  EXPECT_LINEA_ERROR(attn::nprf_rpe_attention(q, q, q, randn({2, 0, 4}), zeros({2, 15})),
                     "omega must be [H, S, D] = [2, S, 4] for q [1, 2, 5, 4], got [2, 0, 4]");
  EXPECT_LINEA_ERROR(attn::nprf_rpe_attention(q, q, q, randn({2, 4, 4}), zeros({2, 14})), "rpe must be [H, 2L-1]");
}

TEST(NprfRpe, Float32LargeInputsStayFiniteAndAccurate) {
  manual_seed(33);
  const int64_t B = 2, H = 2, N = 64, D = 16, S = 32, L = 64;
  Tensor omega = attn::orthogonal_gaussian(H, S, D), rpe = r64({H, 2 * L - 1}, 3.0);
  Tensor q = r64({B, H, N, D}, 100.0), k = r64({B, H, N, D}, 100.0), v = r64({B, H, N, 8});
  std::vector<int> pad(B * N, 0);
  for (int j = 40; j < N; ++j) pad[N + j] = 1;
  for (bool causal : {false, true}) {
    SCOPED_TRACE(causal ? "causal" : "bidirectional");
    AttentionOptions o = options(causal, mask_of(pad, B, N));
    Tensor ref = attn::nprf_rpe_attention(q, k, v, omega, rpe, o, true);
    Tensor q32 = q.to(DType::Float32).detach(), k32 = k.to(DType::Float32).detach();
    q32.requires_grad_(true);
    k32.requires_grad_(true);
    Tensor rpe32 = rpe.to(DType::Float32).detach();
    rpe32.requires_grad_(true);
    Tensor out = attn::nprf_rpe_attention(q32, k32, v.to(DType::Float32), omega, rpe32, o, false);
    EXPECT_EQ(out.dtype(), DType::Float32);
    // Outputs are convex combinations of v rows (|v| ~ 1): absolute error ~ float32 rounding.
    EXPECT_TRUE(all_close(out, ref, 1e-4, 1e-4));
    sum(out).backward();
    for (const Tensor& t : {q32, k32, rpe32})
      for (double g : t.grad().to_vector<double>()) ASSERT_TRUE(std::isfinite(g));
  }
}

// ---- gradient checks (float64, fixed omega) --------------------------------------------------

// gradcheck of nprf_rpe in q, k, v and rpe: B=2, H=2, N=5, D=4, S=3, Dv=3, max_len 6.
::testing::AssertionResult nprf_grad_ok(bool causal, bool padded, bool dense, int64_t M = 5) {
  manual_seed(41);
  Tensor omega = attn::orthogonal_gaussian(2, 3, 4);
  Tensor q = test::randn64({2, 2, 5, 4}), k = test::randn64({2, 2, M, 4}), v = test::randn64({2, 2, M, 3});
  Tensor rpe = test::randn64({2, 11});
  std::vector<int> pad(static_cast<size_t>(2 * M), 0);
  pad[1] = pad[M] = 1;  // with causal, query 0 of batch 1 sees no key
  AttentionOptions o = options(causal, padded ? mask_of(pad, 2, M) : Tensor());
  return test::grad_ok(
      [&](const std::vector<Tensor>& in) { return attn::nprf_rpe_attention(in[0], in[1], in[2], omega, in[3], o, dense); },
      {q, k, v, rpe});
}

TEST(GradCheck, NprfRpeFftBidirectional) { EXPECT_TRUE(nprf_grad_ok(false, false, false)); }
TEST(GradCheck, NprfRpeFftCausal) { EXPECT_TRUE(nprf_grad_ok(true, false, false)); }
TEST(GradCheck, NprfRpeFftPadded) {
  EXPECT_TRUE(nprf_grad_ok(false, true, false));
  EXPECT_TRUE(nprf_grad_ok(true, true, false));
}
TEST(GradCheck, NprfRpeFftCrossAttention) { EXPECT_TRUE(nprf_grad_ok(false, false, false, 4)); }
TEST(GradCheck, NprfRpeDense) { EXPECT_TRUE(nprf_grad_ok(true, true, true)); }

// ---- CUDA parity ------------------------------------------------------------------------------

TEST(NprfRpe, CudaMatchesCpu) {
  LINEA_REQUIRE_CUDA();
  manual_seed(51);
  const Device cuda("cuda");
  const int64_t B = 2, H = 2, N = 37, M = 29, D = 8, S = 16, L = 40;
  Tensor omega = attn::orthogonal_gaussian(H, S, D), rpe = r64({H, 2 * L - 1});
  std::vector<int> pad(B * M, 0);
  pad[3] = pad[M + 7] = 1;
  for (DType dt : {DType::Float32, DType::Float64})
    for (bool causal : {false, true})
      for (bool dense : {false, true}) {
        SCOPED_TRACE(std::string(dtype_name(dt)) + (causal ? " causal" : "") + (dense ? " dense" : ""));
        std::vector<Tensor> cpu = {r64({B, H, N, D}).to(dt), r64({B, H, M, D}).to(dt), r64({B, H, M, 5}).to(dt),
                                   rpe.to(dt)};
        std::vector<Tensor> gpu;
        for (auto& t : cpu) {
          t = t.detach();
          gpu.push_back(t.to(cuda).detach());
          t.requires_grad_(true);
          gpu.back().requires_grad_(true);
        }
        Tensor mask = mask_of(pad, B, M);
        Tensor oc = attn::nprf_rpe_attention(cpu[0], cpu[1], cpu[2], omega, cpu[3], options(causal, mask), dense);
        Tensor og = attn::nprf_rpe_attention(gpu[0], gpu[1], gpu[2], omega, gpu[3], options(causal, mask.to(cuda)), dense);
        const double tol = dt == DType::Float32 ? 1e-4 : 1e-10;
        EXPECT_TRUE(all_close(og.to(kCPU), oc, tol, tol));
        Tensor w = r64(oc.shape()).to(dt);
        sum(mul(oc, w)).backward();
        sum(mul(og, w.to(cuda))).backward();
        for (size_t i = 0; i < cpu.size(); ++i) EXPECT_TRUE(all_close(gpu[i].grad().to(kCPU), cpu[i].grad(), tol, tol)) << i;
      }
}

}  // namespace
}  // namespace linea
