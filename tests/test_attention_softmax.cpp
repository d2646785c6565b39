// Softmax attention and MultiHeadAttention: values against naive float64 loops (causal mask,
// padding, cross-attention with N != M), the invariance of unpadded outputs to padded keys,
// fully masked rows, attention dropout, spec parsing (typed values: exponents, non-finite numbers,
// booleans in any case), the mechanism registry (refused registrations; the mechanisms per use,
// descriptions, lengths filled in), MultiHeadAttention's checks of a mechanism object (heads,
// head dim, use, output shape) and of its caches, the base class's own checks (support in words,
// undefined or mistyped samples, a second redraw schedule), and errors.
// Not here: gradient checks (tests/test_gradcheck_layers.cpp).
#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <tuple>
#include <vector>

#include "attention/softmax/softmax.h"
#include "attention/transformer.h"
#include "core/cpu/attention.h"
#include "tests/test_util.h"

namespace linea {
namespace {

using test::all_close;
using test::f64;

// out [B, H, N, Dv] by loops: key m is visible to query n iff !pad[b][m] && (!causal || m <= n);
// a query that sees no key gets zeros.
Tensor naive_attention(const Tensor& q, const Tensor& k, const Tensor& v, bool causal,
                       const std::vector<int>& pad = {}) {
  const int64_t B = q.size(0), H = q.size(1), N = q.size(2), D = q.size(3), M = k.size(2), Dv = v.size(3);
  auto qv = q.to_vector<double>(), kv = k.to_vector<double>(), vv = v.to_vector<double>();
  std::vector<double> out(static_cast<size_t>(B * H * N * Dv), 0.0);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t n = 0; n < N; ++n) {
        std::vector<double> s(M);
        std::vector<bool> vis(M);
        double mx = -INFINITY;
        for (int64_t m = 0; m < M; ++m) {
          vis[m] = (pad.empty() || !pad[b * M + m]) && (!causal || m <= n);
          double dot = 0;
          for (int64_t d = 0; d < D; ++d) dot += qv[((b * H + h) * N + n) * D + d] * kv[((b * H + h) * M + m) * D + d];
          s[m] = dot / std::sqrt(static_cast<double>(D));
          if (vis[m]) mx = std::max(mx, s[m]);
        }
        double z = 0;
        for (int64_t m = 0; m < M; ++m) z += vis[m] ? std::exp(s[m] - mx) : 0.0;
        if (z == 0) continue;
        for (int64_t m = 0; m < M; ++m) {
          if (!vis[m]) continue;
          const double w = std::exp(s[m] - mx) / z;
          for (int64_t e = 0; e < Dv; ++e)
            out[((b * H + h) * N + n) * Dv + e] += w * vv[((b * H + h) * M + m) * Dv + e];
        }
      }
  return from_vector<double>(out, {B, H, N, Dv});
}

Tensor r64(const Shape& s) { return randn(s, f64()); }

Tensor mask_of(const std::vector<int>& pad, int64_t B, int64_t M) {
  std::vector<int64_t> v(pad.begin(), pad.end());
  return from_vector<int64_t>(v, {B, M});
}

TEST(SoftmaxAttention, NoMaskMatchesNaive) {
  manual_seed(1);
  Tensor q = r64({2, 3, 4, 5}), k = r64({2, 3, 6, 5}), v = r64({2, 3, 6, 2});
  EXPECT_TRUE(all_close(attn::softmax_attention(q, k, v), naive_attention(q, k, v, false), 1e-12, 1e-10));
}

TEST(SoftmaxAttention, CausalMatchesNaiveMaskedLoops) {
  manual_seed(2);
  attn::AttentionOptions o;
  o.causal = true;
  Tensor q = r64({2, 2, 5, 3}), k = r64({2, 2, 5, 3}), v = r64({2, 2, 5, 4});
  Tensor out = attn::softmax_attention(q, k, v, o);
  EXPECT_TRUE(all_close(out, naive_attention(q, k, v, true), 1e-12, 1e-10));
  // The first query sees only the first key: its output is v[0].
  EXPECT_TRUE(all_close(out.narrow(2, 0, 1), v.narrow(2, 0, 1), 1e-12, 0));
  // Float32 too, through the registered mechanism.
  auto mech = attn::make_attention("softmax", 2, 3);
  Tensor out32 = mech->forward(q.to(DType::Float32), k.to(DType::Float32), v.to(DType::Float32), o);
  EXPECT_EQ(out32.dtype(), DType::Float32);
  EXPECT_TRUE(all_close(out32, out.to(DType::Float32), 1e-5, 1e-4));
}

TEST(SoftmaxAttention, CausalCrossLengthsAlignTopLeft) {
  manual_seed(3);
  attn::AttentionOptions o;
  o.causal = true;
  for (auto [N, M] : {std::pair<int64_t, int64_t>{3, 6}, {6, 3}}) {
    Tensor q = r64({1, 2, N, 4}), k = r64({1, 2, M, 4}), v = r64({1, 2, M, 3});
    EXPECT_TRUE(all_close(attn::softmax_attention(q, k, v, o), naive_attention(q, k, v, true), 1e-12, 1e-10))
        << "N=" << N << " M=" << M;
  }
}

TEST(SoftmaxAttention, PaddingMatchesNaive) {
  manual_seed(4);
  const std::vector<int> pad = {0, 1, 0, 0, 1, 1, 0, 0, 0, 1};  // [2, 5]
  Tensor q = r64({2, 2, 3, 4}), k = r64({2, 2, 5, 4}), v = r64({2, 2, 5, 3});
  for (bool causal : {false, true}) {
    attn::AttentionOptions o;
    o.causal = causal;
    o.key_padding_mask = mask_of(pad, 2, 5);
    Tensor ref = naive_attention(q, k, v, causal, pad);
    EXPECT_TRUE(all_close(attn::softmax_attention(q, k, v, o), ref, 1e-12, 1e-10)) << "causal " << causal;
    o.key_padding_mask = ne(mask_of(pad, 2, 5), 0.0);  // the same mask as Bool
    EXPECT_TRUE(all_close(attn::softmax_attention(q, k, v, o), ref, 1e-12, 1e-10)) << "bool, causal " << causal;
  }
}

TEST(SoftmaxAttention, PaddedKeysDoNotChangeUnpaddedOutputs) {
  manual_seed(5);
  const int64_t B = 2, H = 2, N = 4, M = 3, P = 4, D = 3;
  Tensor q = r64({B, H, N, D}), k = r64({B, H, M, D}), v = r64({B, H, M, D});
  for (bool causal : {false, true}) {
    attn::AttentionOptions plain;
    plain.causal = causal;
    Tensor ref = attn::softmax_attention(q, k, v, plain);
    // Append P keys/values with large random values, all marked as padding.
    Tensor k2 = cat({k, r64({B, H, P, D}) * 10.0}, 2), v2 = cat({v, r64({B, H, P, D}) * 10.0}, 2);
    std::vector<int> pad;
    for (int64_t b = 0; b < B; ++b)
      for (int64_t m = 0; m < M + P; ++m) pad.push_back(m >= M);
    attn::AttentionOptions padded = plain;
    padded.key_padding_mask = mask_of(pad, B, M + P);
    EXPECT_TRUE(all_close(attn::softmax_attention(q, k2, v2, padded), ref, 1e-12, 1e-10)) << "causal " << causal;
  }
}

TEST(SoftmaxAttention, FullyMaskedRowGivesZerosNotNaN) {
  manual_seed(6);
  Tensor q = test::randn64({2, 1, 3, 2}), k = test::randn64({2, 1, 4, 2}), v = test::randn64({2, 1, 4, 3});
  attn::AttentionOptions o;
  o.key_padding_mask = tensor<bool>({false, true, false, false, true, true, true, true}, {2, 4});
  Tensor out = attn::softmax_attention(q, k, v, o);
  EXPECT_TRUE(all_close(out.select(0, 1), zeros({1, 3, 3}, f64()), 0, 0));
  EXPECT_TRUE(all_close(out, naive_attention(q, k, v, false, {0, 1, 0, 0, 1, 1, 1, 1}), 1e-12, 1e-10));
  // Gradients are finite everywhere and zero for the fully masked batch.
  sum(out * out).backward();
  for (const Tensor& t : {q, k, v})
    for (double g : t.grad().to_vector<double>()) EXPECT_TRUE(std::isfinite(g));
  EXPECT_TRUE(all_close(q.grad().select(0, 1), zeros({1, 3, 2}, f64()), 0, 0));
  // Causal + padding: query 0 of a batch whose key 0 is padded sees nothing.
  o.causal = true;
  o.key_padding_mask = tensor<int64_t>({1, 0, 0, 0, 0, 0, 0, 0}, {2, 4});
  Tensor c = attn::softmax_attention(q.detach(), k.detach(), v.detach(), o);
  EXPECT_TRUE(all_close(c.select(0, 0).narrow(1, 0, 1), zeros({1, 1, 3}, f64()), 0, 0));
  EXPECT_TRUE(all_close(c, naive_attention(q, k, v, true, {1, 0, 0, 0, 0, 0, 0, 0}), 1e-12, 1e-10));
  // Float32: the finite fill value does not overflow into NaN either.
  Tensor c32 = attn::softmax_attention(q.detach().to(DType::Float32), k.detach().to(DType::Float32),
                                       v.detach().to(DType::Float32), o);
  for (double x : c32.to_vector<double>()) EXPECT_TRUE(std::isfinite(x));
}

TEST(SoftmaxAttention, DropoutOnWeightsOnlyWhileTraining) {
  manual_seed(7);
  Tensor q = r64({1, 2, 6, 4}), k = r64({1, 2, 6, 4}), v = r64({1, 2, 6, 4});
  auto mech = attn::make_attention("softmax:dropout=0.5", 2, 4);
  auto dmech = std::dynamic_pointer_cast<attn::SoftmaxAttention>(mech);
  ASSERT_NE(dmech, nullptr);
  EXPECT_DOUBLE_EQ(dmech->dropout(), 0.5);
  Tensor ref = attn::softmax_attention(q, k, v);
  mech->eval();
  EXPECT_TRUE(all_close(mech->forward(q, k, v, {}), ref, 0, 0));
  mech->train();
  manual_seed(8);
  Tensor a = mech->forward(q, k, v, {});
  EXPECT_FALSE(all_close(a, ref, 1e-6, 0));
  manual_seed(8);
  EXPECT_TRUE(all_close(mech->forward(q, k, v, {}), a, 0, 0));  // deterministic under the seed
}

// The fused CPU kernel (scaled_dot_product_attention) against the composed formula, values and
// gradients, with the probabilities kept and recomputed: one block of query rows and several
// (at most 256 rows a block: N = 300, 520), N != M, causal masks with offsets, padding (a fully
// padded batch too), one head (several threads share a head's blocks) and several (a head per
// thread), float64 and float32; with dropout of the probabilities too (the generator at the same
// state: both draw the same mask).
TEST(SoftmaxAttention, FusedKernelMatchesComposed) {
  manual_seed(9);
  struct Case {
    int64_t B, H, N, M;
    bool causal;
    int64_t offset;
    bool pad;
  };
  const std::vector<Case> cases = {{1, 1, 1, 1, false, 0, false},   {1, 1, 65, 65, false, 0, false},
                                   {2, 3, 64, 130, false, 0, true}, {1, 1, 130, 130, true, 0, false},
                                   {2, 2, 70, 75, true, 5, true},   {1, 1, 3, 129, true, 126, false},
                                   {1, 2, 129, 7, false, 0, true},  {2, 1, 5, 1, true, 0, false},
                                   {1, 2, 300, 40, false, 0, true}, {1, 1, 520, 530, true, 10, true}};
  for (const Case& c : cases)
    for (DType dt : {DType::Float64, DType::Float32})
      for (int variant = 0; variant < 3; ++variant) {  // probabilities recomputed, kept, dropped
        const bool keep = variant == 1;
        const double p = variant == 2 ? 0.3 : 0.0;
        const TensorOptions o(dt);
        const int64_t D = 5, E = 3;
        Tensor q = randn({c.B, c.H, c.N, D}, o), k = randn({c.B, c.H, c.M, D}, o), v = randn({c.B, c.H, c.M, E}, o);
        Tensor g = randn({c.B, c.H, c.N, E}, o);
        attn::AttentionOptions opts;
        opts.causal = c.causal;
        opts.query_offset = c.offset;
        if (c.pad) {
          std::vector<int64_t> pad(static_cast<size_t>(c.B * c.M), 0);
          for (int64_t m = 0; m < c.M; m += 3) pad[static_cast<size_t>(m)] = 1;  // batch 0: every third key
          if (c.B > 1)                                                           // the last batch: every key
            for (int64_t m = 0; m < c.M; ++m) pad[static_cast<size_t>((c.B - 1) * c.M + m)] = 1;
          opts.key_padding_mask = from_vector<int64_t>(pad, {c.B, c.M});
        }
        std::vector<Tensor> grads[2];
        Tensor outs[2];
        for (int composed = 0; composed < 2; ++composed) {
          Tensor qq = q.detach().requires_grad_(true), kk = k.detach().requires_grad_(true),
                 vv = v.detach().requires_grad_(true);
          manual_seed(11);
          outs[composed] = composed ? attn::softmax_attention_composed(qq, kk, vv, opts, p, true)
                                    : scaled_dot_product_attention(qq, kk, vv, 1.0 / std::sqrt(double(D)), c.causal,
                                                                   c.offset, attn::key_padding_bool(opts), keep, p);
          sum(outs[composed] * g).backward();
          grads[composed] = {qq.grad(), kk.grad(), vv.grad()};
        }
        const double rtol = dt == DType::Float64 ? 1e-11 : 2e-5, atol = dt == DType::Float64 ? 1e-12 : 2e-6;
        const std::string what = "B" + std::to_string(c.B) + " H" + std::to_string(c.H) + " N" + std::to_string(c.N) +
                                 " M" + std::to_string(c.M) + (c.causal ? " causal" : "") + (c.pad ? " pad" : "") +
                                 " " + dtype_name(dt) +
                                 (keep    ? " kept"
                                  : p > 0 ? " dropped"
                                          : " recomputed");
        EXPECT_TRUE(all_close(outs[0], outs[1], rtol, atol)) << what;
        for (int i = 0; i < 3; ++i)
          EXPECT_TRUE(all_close(grads[0][i], grads[1][i], rtol, atol)) << what << " grad " << i;
      }
}

// The CPU kernel reads q, k, v, out and dout and writes out, dq, dk and dv where the heads lie (any
// batch, head and row strides, as the CUDA kernels do): the same bits as on dense [B, H, L, D]
// copies, with the probabilities recomputed, kept and dropped, the backward by whole heads (B H at
// least the threads) and by blocks of one head, and nothing written between a view's rows.
// Operands are heads of poisoned [B, L, H, pitch] buffers (a projection's layout), keys and values
// shared by all heads (head stride 0), the key padding's rows apart as a decoding cache's are.
TEST(SoftmaxAttention, FusedKernelReadsHeadsInPlace) {
  manual_seed(31);
  struct Case {
    int64_t B, H, N, M, D, E, pitch;
    bool causal, pad, shared_kv;
  };
  const std::vector<Case> cases = {
      {2, 3, 37, 45, 5, 7, 9, false, true, false},  // cross-attention, padding, the backward by heads
      {1, 1, 300, 40, 6, 6, 8, true, true, false},  // two blocks of one head: the backward by blocks
      {2, 2, 20, 20, 4, 4, 4, true, false, true},   // causal, one key/value head for all
  };
  const auto poisoned = [](const Shape& shape, DType dt) { return full(shape, NAN, TensorOptions(dt)); };
  const auto same_bits = [](const Tensor& got, const Tensor& ref, const std::string& what) {
    const std::vector<double> a = got.to(DType::Float64).to_vector<double>(),
                              b = ref.to(DType::Float64).to_vector<double>();
    size_t differ = 0;
    for (size_t i = 0; i < a.size(); ++i) differ += !(a[i] == b[i]);  // an unwritten NaN differs
    EXPECT_EQ(differ, 0u) << what << ": " << differ << " of " << a.size() << " differ";
  };
  for (DType dt : {DType::Float64, DType::Float32})
    for (const Case& c : cases)
      for (int variant = 0; variant < 3; ++variant) {  // probabilities recomputed, kept, dropped
        const std::string what = std::string(dtype_name(dt)) + " B" + std::to_string(c.B) + " H" + std::to_string(c.H) +
                                 " N" + std::to_string(c.N) + " variant " + std::to_string(variant);
        SCOPED_TRACE(what);
        const auto heads = [&](int64_t H, int64_t L, int64_t dim) {  // heads of a poisoned buffer
          return narrow(permute(poisoned({c.B, L, H, c.pitch}, dt), {0, 2, 1, 3}), 3, 0, dim);
        };
        const auto filled = [&](int64_t H, int64_t L, int64_t dim) {
          Tensor view = heads(H, L, dim);
          view.copy_(randn(view.shape(), TensorOptions(dt)));
          return view;
        };
        const int64_t kvH = c.shared_kv ? 1 : c.H;
        Tensor q = filled(c.H, c.N, c.D), dout = filled(c.H, c.N, c.E), k = filled(kvH, c.M, c.D),
               v = filled(kvH, c.M, c.E);
        if (c.shared_kv) {
          k = expand(k, {c.B, c.H, c.M, c.D});
          v = expand(v, {c.B, c.H, c.M, c.E});
        }
        Tensor pad, pad_s;
        if (c.pad) {  // batch 0: every third key; the last: every key. pad_s: columns 2.. of unpadded rows M + 3 wide
          std::vector<int64_t> mask(static_cast<size_t>(c.B * c.M), 0);
          for (int64_t m = 0; m < c.M; m += 3) mask[static_cast<size_t>(m)] = 1;
          if (c.B > 1) std::fill(mask.end() - c.M, mask.end(), 1);
          pad = from_vector<int64_t>(mask, {c.B, c.M}).to(DType::Bool);
          pad_s = narrow(zeros({c.B, c.M + 3}, TensorOptions(DType::Bool)), 1, 2, c.M);
          pad_s.copy_(pad);
        }
        const double scale = 1.0 / std::sqrt(static_cast<double>(c.D));
        const FoldedDropout drop = variant == 2 ? FoldedDropout{0.2, 99, 3, 1, nullptr} : FoldedDropout();
        const auto probs = [&] { return variant == 1 ? poisoned({c.B, c.H, c.N, c.M}, dt) : Tensor(); };
        // Reference: dense copies, dense outputs.
        const Tensor qc = contiguous(q), kc = contiguous(k), vc = contiguous(v), dc = contiguous(dout);
        Tensor out = poisoned({c.B, c.H, c.N, c.E}, dt), lse = poisoned({c.B, c.H, c.N}, dt), p = probs();
        cpu::sdpa_forward(qc, kc, vc, scale, c.causal, 0, pad, Tensor(), drop, out, lse, p);
        Tensor dq = poisoned(q.shape(), dt), dk = poisoned(k.shape(), dt), dv = poisoned(v.shape(), dt);
        cpu::sdpa_backward(qc, kc, vc, out, lse, p, dc, Tensor(), scale, c.causal, 0, pad, Tensor(), drop, dq, dk, dv,
                           Tensor());
        // In place: the views in, the outputs into heads of poisoned buffers.
        Tensor out_s = heads(c.H, c.N, c.E), lse_s = poisoned({c.B, c.H, c.N}, dt), p_s = probs();
        cpu::sdpa_forward(q, k, v, scale, c.causal, 0, pad_s, Tensor(), drop, out_s, lse_s, p_s);
        Tensor dq_s = heads(c.H, c.N, c.D), dk_s = heads(c.H, c.M, c.D), dv_s = heads(c.H, c.M, c.E);
        cpu::sdpa_backward(q, k, v, out_s, lse_s, p_s, dout, Tensor(), scale, c.causal, 0, pad_s, Tensor(), drop, dq_s,
                           dk_s, dv_s, Tensor());
        same_bits(out_s, out, "out");
        same_bits(lse_s, lse, "lse");
        if (p.defined()) same_bits(p_s, p, "probs");
        same_bits(dq_s, dq, "dq");
        same_bits(dk_s, dk, "dk");
        same_bits(dv_s, dv, "dv");
        for (const auto& [view, dim, name] : {std::tuple{out_s, c.E, "out"}, std::tuple{dq_s, c.D, "dq"},
                                              std::tuple{dk_s, c.D, "dk"}, std::tuple{dv_s, c.E, "dv"}}) {
          if (dim == c.pitch) continue;
          const Tensor buffer = as_strided(view, {view.size(0), view.size(2), view.size(1), c.pitch},
                                           {view.stride(0), view.stride(2), view.stride(1), 1}, view.offset());
          const std::vector<double> gap = narrow(buffer, 3, dim, c.pitch - dim).to(DType::Float64).to_vector<double>();
          EXPECT_TRUE(std::all_of(gap.begin(), gap.end(), [](double x) { return std::isnan(x); }))
              << name << " wrote between its rows";
        }
      }
}

// Called directly (not through raw::as_head_rows), the CPU kernel refuses what it cannot read as
// rows: a row's values apart, rows that overlap (an expand along L), padding values apart; naming
// the op and the strides. The same tensors copied contiguous run.
TEST(SoftmaxAttention, FusedKernelRefusesLayoutsItCannotRead) {
  manual_seed(37);
  const int64_t B = 1, H = 2, N = 4, M = 6, D = 3;
  const Tensor q = randn({B, H, N, D}), k = randn({B, H, M, D}), v = randn({B, H, M, D});
  const Tensor pad = zeros({B, M}, TensorOptions(DType::Bool));
  const Tensor columns = transpose(randn({B, H, D, N}), 2, 3);       // values N apart
  const Tensor one_row = expand(randn({B, H, 1, D}), {B, H, N, D});  // rows 0 apart
  const Tensor pad_apart = as_strided(zeros({B, 2 * M}, TensorOptions(DType::Bool)), {B, M}, {2 * M, 2}, 0);
  const auto forward = [&](const Tensor& qq, const Tensor& pp) {
    Tensor out = empty({B, H, N, D}), lse = empty({B, H, N});
    cpu::sdpa_forward(qq, k, v, 0.5, false, 0, pp, Tensor(), FoldedDropout(), out, lse, Tensor());
    return std::pair{out, lse};
  };
  const auto expect_refused = [](const std::function<void()>& call, const std::string& op, const std::string& what) {
    try {
      call();
      ADD_FAILURE() << what << ": no error";
    } catch (const Error& e) {
      const std::string m = e.what();
      EXPECT_EQ(m.rfind(op + ": the CPU kernel reads", 0), 0u) << what << ": " << m;
      EXPECT_NE(m.find("strides"), std::string::npos) << what << ": " << m;
    }
  };
  expect_refused([&] { forward(columns, Tensor()); }, "sdpa", "q's values apart");
  expect_refused([&] { forward(one_row, Tensor()); }, "sdpa", "q's rows overlapping");
  expect_refused([&] { forward(q, pad_apart); }, "sdpa", "padding values apart");
  const auto [out, lse] = forward(q, pad);
  const auto backward = [&](const Tensor& dout) {
    Tensor dq = empty(q.shape()), dk = empty(k.shape()), dv = empty(v.shape());
    cpu::sdpa_backward(q, k, v, out, lse, Tensor(), dout, Tensor(), 0.5, false, 0, pad, Tensor(), FoldedDropout(), dq,
                       dk, dv, Tensor());
  };
  expect_refused([&] { backward(columns); }, "sdpa_backward", "dout's values apart");
  const Tensor u = rand({B, H, N, 2}), idx = empty({B, H, N, 2}, TensorOptions(DType::Int64));
  expect_refused([&] { cpu::sdpa_sample(one_row, k, Tensor(), u, 0.5, idx); }, "sdpa_sample", "q's rows overlapping");
  // The same values, contiguous, run.
  EXPECT_NO_THROW(forward(contiguous(columns), contiguous(pad_apart)));
  EXPECT_NO_THROW(backward(contiguous(columns)));
  EXPECT_NO_THROW(cpu::sdpa_sample(contiguous(one_row), k, Tensor(), u, 0.5, idx));
}

// A key bias [B, H, M] added to the scores (what RA's estimator passes): the fused kernel against
// softmax(scale q k^T + bias) composed from ops, values and the gradients of q, k, v and the
// bias, with the probabilities kept and recomputed, by head (several heads) and by block (one
// head, N past one block), causal with an offset and padded.
TEST(SoftmaxAttention, KeyBiasMatchesComposed) {
  manual_seed(13);
  struct Case {
    int64_t B, H, N, M;
    bool causal;
    int64_t offset;
    bool pad;
  };
  const std::vector<Case> cases = {{2, 3, 9, 13, false, 0, true},
                                   {1, 1, 300, 40, false, 0, false},
                                   {2, 2, 20, 25, true, 5, true},
                                   {1, 1, 1, 1, false, 0, false}};
  for (const Case& c : cases)
    for (DType dt : {DType::Float64, DType::Float32})
      for (bool keep : {false, true}) {
        const TensorOptions o(dt);
        const int64_t D = 5, E = 3;
        const double scale = 1.0 / std::sqrt(double(D));
        Tensor q = randn({c.B, c.H, c.N, D}, o), k = randn({c.B, c.H, c.M, D}, o), v = randn({c.B, c.H, c.M, E}, o);
        Tensor bias = randn({c.B, c.H, c.M}, o), g = randn({c.B, c.H, c.N, E}, o);
        attn::AttentionOptions opts;
        opts.causal = c.causal;
        opts.query_offset = c.offset;
        if (c.pad) {
          std::vector<int64_t> pad(static_cast<size_t>(c.B * c.M), 0);
          for (int64_t m = 1; m < c.M; m += 3) pad[static_cast<size_t>(m)] = 1;
          opts.key_padding_mask = from_vector<int64_t>(pad, {c.B, c.M});
        }
        std::vector<Tensor> grads[2];
        Tensor outs[2];
        for (int composed = 0; composed < 2; ++composed) {
          Tensor qq = q.detach().requires_grad_(true), kk = k.detach().requires_grad_(true),
                 vv = v.detach().requires_grad_(true), bb = bias.detach().requires_grad_(true);
          if (composed) {
            Tensor scores = add(matmul(qq, transpose(kk, -2, -1), scale), unsqueeze(bb, 2));
            outs[1] = matmul(attn::masked_softmax(scores, attn::attention_mask(opts, c.N, c.M, q.device()), -1), vv);
          } else {
            outs[0] = scaled_dot_product_attention(qq, kk, vv, scale, c.causal, c.offset, attn::key_padding_bool(opts),
                                                   keep, 0.0, bb);
          }
          sum(outs[composed] * g).backward();
          grads[composed] = {qq.grad(), kk.grad(), vv.grad(), bb.grad()};
        }
        const double rtol = dt == DType::Float64 ? 1e-11 : 2e-5, atol = dt == DType::Float64 ? 1e-12 : 2e-6;
        const std::string what = "B" + std::to_string(c.B) + " H" + std::to_string(c.H) + " N" + std::to_string(c.N) +
                                 " M" + std::to_string(c.M) + " " + dtype_name(dt) + (keep ? " kept" : " recomputed");
        EXPECT_TRUE(all_close(outs[0], outs[1], rtol, atol)) << what;
        for (int i = 0; i < 4; ++i)
          EXPECT_TRUE(all_close(grads[0][i], grads[1][i], rtol, atol)) << what << " grad " << i;
      }
}

TEST(SoftmaxAttention, FusedKernelPropagatesNaN) {
  // A query whose scores are all NaN gets NaN, not the zeros of a query that sees no key.
  Tensor q = test::randn64({1, 1, 3, 2}), k = test::randn64({1, 1, 4, 2}), v = test::randn64({1, 1, 4, 2});
  std::vector<double> qv = q.to_vector<double>();
  qv[0] = NAN;
  Tensor qn = from_vector<double>(qv, {1, 1, 3, 2});
  Tensor out = scaled_dot_product_attention(qn, k, v, 0.5);
  std::vector<double> o = out.to_vector<double>();
  EXPECT_TRUE(std::isnan(o[0]) && std::isnan(o[1]));
  for (size_t i = 2; i < o.size(); ++i) EXPECT_TRUE(std::isfinite(o[i]));
}

TEST(SoftmaxAttention, FusedKernelKeepsProbabilitiesUpToTheBound) {
  const Tensor q = zeros({4, 8, 2048, 16}), k = zeros({4, 8, 2048, 16}), k_long = zeros({4, 8, 2049, 16});
  EXPECT_TRUE(attn::fused_kernel_keeps_probs(q, k));  // 4 * 8 * 2048^2 floats = 512 MiB
  EXPECT_FALSE(attn::fused_kernel_keeps_probs(q, k_long));
  EXPECT_FALSE(attn::fused_kernel_keeps_probs(q.to(DType::Float64), k.to(DType::Float64)));
}

// softmax_attention goes through the fused kernel, dropout while training included: the
// composed formula's values, the same mask under the same seed.
TEST(SoftmaxAttention, LayerPathsAgree) {
  manual_seed(10);
  Tensor q = randn({2, 2, 9, 4}), k = randn({2, 2, 11, 4}), v = randn({2, 2, 11, 3});
  const Tensor ref = attn::softmax_attention_composed(q, k, v);
  EXPECT_TRUE(all_close(attn::softmax_attention(q, k, v), ref, 1e-5, 1e-6));
  EXPECT_TRUE(all_close(attn::softmax_attention(q, k, v, {}, 0.5, false), ref, 1e-5, 1e-6));  // eval: no dropout
  manual_seed(12);
  const Tensor dropped = attn::softmax_attention(q, k, v, {}, 0.5, true);
  EXPECT_FALSE(all_close(dropped, ref, 1e-3, 0));
  manual_seed(12);
  EXPECT_TRUE(all_close(dropped, attn::softmax_attention_composed(q, k, v, {}, 0.5, true), 1e-5, 1e-6));
}

// The attention with its log-sum-exp: out as scaled_dot_product_attention gives it, lse the
// composed log-sum-exp of the visible scores (-inf for a row that sees no key).
TEST(SoftmaxAttention, LseMatchesTheComposedFormula) {
  manual_seed(14);
  const Tensor q = test::randn64({2, 2, 5, 3}), k = test::randn64({2, 2, 6, 3}), v = test::randn64({2, 2, 6, 4}),
               bias = test::randn64({2, 2, 6});
  const Tensor pad = tensor<bool>({false, true, false, false, true, false, true, true, true, true, true, true}, {2, 6});
  for (bool causal : {false, true}) {
    SCOPED_TRACE(causal ? "causal" : "bidirectional");
    auto [out, lse] = scaled_dot_product_attention_lse(q, k, v, 0.6, causal, 1, pad, bias);
    EXPECT_TRUE(
        all_close(out, scaled_dot_product_attention(q, k, v, 0.6, causal, 1, pad, false, 0.0, bias), 1e-12, 1e-12));
    Tensor hidden = unsqueeze(unsqueeze(pad, 1), 1);  // [B, 1, 1, M]
    if (causal) {                                     // key m hidden from query n when m > n + 1
      std::vector<double> later;
      for (int n = 0; n < 5; ++n)
        for (int m = 0; m < 6; ++m) later.push_back(m > n + 1);
      hidden = logical_or(hidden, from_vector<double>(later, {5, 6}, TensorOptions(DType::Bool)));
    }
    const Tensor scores = add(mul(matmul(q, transpose(k, 2, 3)), 0.6), unsqueeze(bias, 2));
    const Tensor ref = logsumexp(masked_fill(scores, hidden, -INFINITY), {3});
    const std::vector<double> got = lse.to_vector<double>(), want = ref.to_vector<double>();
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i) {
      if (std::isinf(want[i])) {
        EXPECT_EQ(got[i], want[i]) << i;  // batch 1 sees no key
      } else {
        EXPECT_NEAR(got[i], want[i], 1e-12) << i;
      }
    }
  }
}

TEST(SoftmaxAttention, FusedKernelBadInputsThrow) {
  Tensor q = zeros({1, 2, 3, 4}), k = zeros({1, 2, 5, 4}), v = zeros({1, 2, 5, 6});
  EXPECT_LINEA_ERROR(scaled_dot_product_attention(q, zeros({1, 1, 5, 4}), v, 1.0), "shapes do not match");
  EXPECT_LINEA_ERROR(scaled_dot_product_attention(q, k, zeros({1, 2, 4, 6}), 1.0), "shapes do not match");
  EXPECT_LINEA_ERROR(scaled_dot_product_attention(q, k, v.to(DType::Float64), 1.0), "float64");
  EXPECT_LINEA_ERROR(scaled_dot_product_attention(q, k, v, 1.0, true, -1), "query offset must be >= 0");
  EXPECT_LINEA_ERROR(scaled_dot_product_attention(q, k, v, 1.0, false, 0, zeros({1, 5})),
                     "key padding must be bool [B, M] = [1, 5]");
  EXPECT_LINEA_ERROR(scaled_dot_product_attention(q, k, v, INFINITY), "scale must be finite");
  EXPECT_LINEA_ERROR(scaled_dot_product_attention(q, k, v, 1.0, false, 0, {}, false, 0.0, zeros({1, 2, 3})),
                     "sdpa: key bias must be [B, H, M] = [1, 2, 5], got [1, 2, 3]");
  EXPECT_LINEA_ERROR(scaled_dot_product_attention(q, k, v, 1.0, false, 0, {}, false, 0.0, zeros({1, 2, 5}, f64())),
                     "float64");
  EXPECT_LINEA_ERROR(scaled_dot_product_attention(q, k, v, 1.0, false, 0, {}, false, 1.0),
                     "dropout_p must be in [0, 1), got 1");
  EXPECT_LINEA_ERROR(scaled_dot_product_attention_lse(q, k, zeros({1, 2, 4, 6}), 1.0), "shapes do not match");
  EXPECT_LINEA_ERROR(scaled_dot_product_attention(zeros({2, 3, 4}), k, v, 1.0),
                     "sdpa: expected q [B, H, N, D], k [B, H, M, D], v [B, H, M, E], got q [2, 3, 4]");
  EXPECT_LINEA_ERROR(scaled_dot_product_attention(zeros({1, 2, 3, 0}), zeros({1, 2, 5, 0}), v, 1.0),
                     "sdpa: head dims must be positive, got q [1, 2, 3, 0] and v [1, 2, 5, 6]");
  EXPECT_LINEA_ERROR(scaled_dot_product_attention(Tensor(), k, v, 1.0), "sdpa: argument 'q' is an undefined tensor");
  EXPECT_LINEA_ERROR(scaled_dot_product_attention_lse(q, zeros({2, 5, 4}), v, 1.0),
                     "sdpa: expected q [B, H, N, D], k [B, H, M, D], v [B, H, M, E], got q [1, 2, 3, 4], k [2, 5, 4]");
  // The public op keeps no probabilities with dropout (see autograd/ops.h); the raw op refuses both.
  FoldedDropout drop;
  drop.p = 0.1;
  EXPECT_LINEA_ERROR(raw::sdpa(q, k, v, 1.0, false, 0, Tensor(), /*keep_probs=*/true, drop),
                     "sdpa: kept probabilities and dropout do not go together");
  drop.p = 1.0;
  EXPECT_LINEA_ERROR(raw::sdpa(q, k, v, 1.0, false, 0, Tensor(), false, drop),
                     "sdpa: dropout probability must be in [0, 1), got 1");
  // The gradient of lse must be shaped as lse.
  const std::vector<Tensor> f = raw::sdpa(q, k, v, 1.0, false, 0, Tensor());
  EXPECT_LINEA_ERROR(raw::sdpa_backward(zeros({1, 2, 3, 6}), q, k, v, f[0], f[1], 1.0, false, 0, Tensor(), Tensor(),
                                        FoldedDropout(), Tensor(), zeros({1, 2, 4})),
                     "sdpa_backward: dlse [1, 2, 4] does not match lse [1, 2, 3]");
}

TEST(SoftmaxAttention, BadInputsThrow) {
  Tensor q = zeros({1, 2, 3, 4}), k = zeros({1, 2, 5, 4}), v = zeros({1, 2, 5, 6});
  EXPECT_LINEA_ERROR(attn::softmax_attention(zeros({2, 3, 4}), k, v), "expected q [B, H, N, D]");
  EXPECT_LINEA_ERROR(attn::softmax_attention(q, zeros({1, 2, 5, 3}), v), "shapes do not match");
  EXPECT_LINEA_ERROR(attn::softmax_attention(q, k, zeros({1, 2, 4, 6})), "shapes do not match");
  EXPECT_LINEA_ERROR(attn::softmax_attention(q, k, zeros({1, 2, 5, 6}, f64())), "float64");
  attn::AttentionOptions o;
  o.key_padding_mask = zeros({1, 4}, TensorOptions(DType::Int64));
  EXPECT_LINEA_ERROR(attn::softmax_attention(q, k, v, o), "key_padding_mask must be [B, M] = [1, 5]");
  o.key_padding_mask = zeros({1, 5});
  EXPECT_LINEA_ERROR(attn::softmax_attention(q, k, v, o), "key_padding_mask must be bool or int64");
}

// ---- MultiHeadAttention ----------------------------------------------------------------------
TEST(MultiHeadAttention, ShapeAndParameterNames) {
  manual_seed(9);
  auto mha = std::make_shared<attn::MultiHeadAttention>(8, 2);
  EXPECT_EQ(mha->forward(randn({3, 5, 8}), randn({3, 5, 8})).shape(), Shape({3, 5, 8}));
  std::vector<std::string> names;
  for (auto& [n, t] : mha->named_parameters()) names.push_back(n);
  EXPECT_EQ(names, (std::vector<std::string>{"q_proj.weight", "q_proj.bias", "k_proj.weight", "k_proj.bias",
                                             "v_proj.weight", "v_proj.bias", "out_proj.weight", "out_proj.bias"}));
  EXPECT_EQ(mha->num_parameters(), 4 * (8 * 8 + 8));
  EXPECT_EQ(mha->head_dim(), 4);
  EXPECT_EQ(mha->mechanism()->type_name(), "SoftmaxAttention");
  // Biases start at zero, every projection's weights within the truncated normal's +-2 std (0.02).
  for (const auto& p : {mha->q_proj(), mha->k_proj(), mha->v_proj(), mha->out_proj()}) {
    for (double b : p->bias().to_vector<double>()) EXPECT_EQ(b, 0.0);
    for (double w : p->weight().to_vector<double>()) EXPECT_LE(std::fabs(w), 0.04);
  }
  // Cross-attention with another key/value width, without biases.
  auto cross = std::make_shared<attn::MultiHeadAttention>(8, 4, "softmax",
                                                          attn::MultiHeadOptions{attn::AttentionUse::Cross, false, 6});
  EXPECT_EQ(cross->forward(randn({2, 3, 8}), randn({2, 7, 6})).shape(), Shape({2, 3, 8}));
  EXPECT_EQ(cross->k_proj()->weight().shape(), Shape({8, 6}));
  EXPECT_EQ(cross->named_parameters().size(), 4u);
  EXPECT_EQ(cross->str().substr(0, 80),
            "MultiHeadAttention(dim=8, heads=4, spec='softmax', kv_dim=6, use=cross-attention");
  // q, k and v's weights and biases packed one after another (one GEMM for the projections of one
  // input), through a change of dtype too; the cross layer's k and v (the memory's).
  mha->to(DType::Float64);
  for (const auto* m : {mha.get(), cross.get()}) {
    EXPECT_TRUE(raw::joined_view({m->k_proj()->weight(), m->v_proj()->weight()}, 0).defined());
    EXPECT_EQ(raw::joined_view({m->q_proj()->weight(), m->k_proj()->weight(), m->v_proj()->weight()}, 0).defined(),
              m == mha.get());
  }
  EXPECT_TRUE(raw::joined_view({mha->q_proj()->bias(), mha->k_proj()->bias(), mha->v_proj()->bias()}, 0).defined());
  EXPECT_EQ(mha->q_proj()->weight().dtype(), DType::Float64);
}

// MHA output recomputed by hand: projections by the module's Linear layers (tested on their
// own), heads split by index, naive attention, heads merged, out_proj.
Tensor naive_mha(attn::MultiHeadAttention& mha, const Tensor& xq, const Tensor& xkv, bool causal,
                 const std::vector<int>& pad) {
  const int64_t B = xq.size(0), N = xq.size(1), M = xkv.size(1), H = mha.heads(), Dh = mha.head_dim();
  auto heads = [&](const Tensor& x, int64_t L) {  // [B, L, H*Dh] -> [B, H, L, Dh] by loops
    auto xv = x.to_vector<double>();
    std::vector<double> out(xv.size());
    for (int64_t b = 0; b < B; ++b)
      for (int64_t l = 0; l < L; ++l)
        for (int64_t h = 0; h < H; ++h)
          for (int64_t d = 0; d < Dh; ++d) out[((b * H + h) * L + l) * Dh + d] = xv[(b * L + l) * H * Dh + h * Dh + d];
    return from_vector<double>(out, {B, H, L, Dh});
  };
  Tensor o = naive_attention(heads(mha.q_proj()->forward(xq), N), heads(mha.k_proj()->forward(xkv), M),
                             heads(mha.v_proj()->forward(xkv), M), causal, pad);
  auto ov = o.to_vector<double>();
  std::vector<double> merged(ov.size());
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t n = 0; n < N; ++n)
        for (int64_t d = 0; d < Dh; ++d) merged[(b * N + n) * H * Dh + h * Dh + d] = ov[((b * H + h) * N + n) * Dh + d];
  return mha.out_proj()->forward(from_vector<double>(merged, {B, N, H * Dh}));
}

TEST(MultiHeadAttention, CrossAttentionDifferentLengthsMatchesNaive) {
  manual_seed(10);
  auto mha = std::make_shared<attn::MultiHeadAttention>(6, 3, "softmax",
                                                        attn::MultiHeadOptions{attn::AttentionUse::Cross, true, 4});
  mha->to(DType::Float64);
  {
    NoGradGuard ng;
    for (auto& p : mha->parameters()) p.copy_(randn(p.shape(), f64()) * 0.5);
  }
  Tensor xq = r64({2, 3, 6}), xkv = r64({2, 7, 4});
  EXPECT_TRUE(all_close(mha->forward(xq, xkv), naive_mha(*mha, xq, xkv, false, {}), 1e-10, 1e-8));
  attn::AttentionOptions o;
  o.key_padding_mask = mask_of({0, 0, 0, 0, 0, 1, 1, 0, 1, 0, 1, 0, 0, 1}, 2, 7);
  EXPECT_TRUE(all_close(mha->forward(xq, xkv, o),
                        naive_mha(*mha, xq, xkv, false, {0, 0, 0, 0, 0, 1, 1, 0, 1, 0, 1, 0, 0, 1}), 1e-10, 1e-8));
  // Causal, with as many keys as queries.
  o = {};
  o.causal = true;
  Tensor xs = r64({2, 3, 4});
  EXPECT_TRUE(all_close(mha->forward(xq, xs, o), naive_mha(*mha, xq, xs, true, {}), 1e-10, 1e-8));
}

TEST(MultiHeadAttention, PaddedTokensDoNotChangeOutputs) {
  manual_seed(11);
  auto mha = std::make_shared<attn::MultiHeadAttention>(4, 2);
  mha->to(DType::Float64);
  Tensor xq = r64({2, 3, 4}), xkv = r64({2, 5, 4});
  Tensor ref = mha->forward(xq, xkv);
  Tensor xkv2 = cat({xkv, r64({2, 3, 4}) * 5.0}, 1);
  std::vector<int64_t> pad(16, 0);
  for (int64_t b = 0; b < 2; ++b)
    for (int64_t m = 5; m < 8; ++m) pad[b * 8 + m] = 1;
  attn::AttentionOptions o;
  o.key_padding_mask = from_vector<int64_t>(pad, {2, 8});
  EXPECT_TRUE(all_close(mha->forward(xq, xkv2, o), ref, 1e-12, 1e-10));
  // Every key padded: the attention output is zero, so the module returns out_proj's bias.
  o.key_padding_mask = ones({2, 8}, TensorOptions(DType::Int64));
  {
    NoGradGuard ng;
    Tensor bias = mha->out_proj()->bias();
    bias.copy_(r64({4}));
  }
  Tensor all_pad = mha->forward(xq, xkv2, o);
  EXPECT_TRUE(all_close(all_pad, mha->out_proj()->bias().expand({2, 3, 4}), 1e-12, 0));
}

TEST(MultiHeadAttention, BadInputsThrow) {
  auto mha = std::make_shared<attn::MultiHeadAttention>(8, 2);
  EXPECT_LINEA_ERROR(mha->forward(zeros({2, 3, 6}), zeros({2, 3, 8})), "expected x_q [B, N, 8]");
  EXPECT_LINEA_ERROR(mha->forward(zeros({3, 8}), zeros({3, 8})), "expected x_q [B, N, 8]");
  EXPECT_LINEA_ERROR(mha->forward(zeros({2, 3, 8}), zeros({2, 3, 5})), "expected x_kv [2, M, 8]");
  EXPECT_LINEA_ERROR(mha->forward(zeros({2, 3, 8}), zeros({1, 3, 8})), "expected x_kv [2, M, 8]");
  attn::AttentionOptions o;
  o.key_padding_mask = zeros({2, 4}, TensorOptions(DType::Bool));
  EXPECT_LINEA_ERROR(mha->forward(zeros({2, 3, 8}), zeros({2, 3, 8}), o), "key_padding_mask must be [B, M] = [2, 3]");
  EXPECT_LINEA_ERROR(std::make_shared<attn::MultiHeadAttention>(8, 3), "dim 8 is not divisible by heads 3");
  EXPECT_LINEA_ERROR(std::make_shared<attn::MultiHeadAttention>(8, 2, "nope"), "unknown attention 'nope' (known: ");
  EXPECT_LINEA_ERROR(std::make_shared<attn::MultiHeadAttention>(8, 2, "softmax:drop=0.1"), "unknown option drop");
}

// ---- specs and the registry -------------------------------------------------------------------
TEST(AttentionSpec, ParsesNameAndOptions) {
  attn::AttentionSpec s = attn::AttentionSpec::parse(" toy:features=128, kind=relu,redraw=1,eps=1e-3 ");
  EXPECT_EQ(s.name, "toy");
  EXPECT_EQ(s.options.size(), 4u);
  EXPECT_EQ(s.get_int("features", 0), 128);
  EXPECT_EQ(s.get_string("kind", "exp"), "relu");
  EXPECT_TRUE(s.get_bool("redraw", false));
  EXPECT_DOUBLE_EQ(s.get_double("eps", 0.0), 1e-3);
  EXPECT_EQ(s.get_int("absent", 7), 7);  // default
  EXPECT_FALSE(s.has("other"));
  EXPECT_NO_THROW(s.check_all_used());
  EXPECT_EQ(s.str(), "toy:eps=1e-3,features=128,kind=relu,redraw=1");
  attn::AttentionSpec plain = attn::AttentionSpec::parse("softmax");
  EXPECT_EQ(plain.name, "softmax");
  EXPECT_TRUE(plain.options.empty());
  EXPECT_EQ(plain.str(), "softmax");
}

TEST(AttentionSpec, MalformedSpecsThrow) {
  EXPECT_LINEA_ERROR(attn::AttentionSpec::parse(""), "empty spec");
  EXPECT_LINEA_ERROR(attn::AttentionSpec::parse(":features=1"), "missing mechanism name");
  EXPECT_LINEA_ERROR(attn::AttentionSpec::parse("performer:"), "no options after ':'");
  EXPECT_LINEA_ERROR(attn::AttentionSpec::parse("performer:features"), "option 'features' has no value");
  EXPECT_LINEA_ERROR(attn::AttentionSpec::parse("performer:features="), "option 'features' has an empty value");
  EXPECT_LINEA_ERROR(attn::AttentionSpec::parse("performer:=3"), "has an empty key");
  EXPECT_LINEA_ERROR(attn::AttentionSpec::parse("performer:a=1,,b=2"), "empty option");
  EXPECT_LINEA_ERROR(attn::AttentionSpec::parse("performer:a=1,"), "empty option");
  EXPECT_LINEA_ERROR(attn::AttentionSpec::parse("performer:a=1,a=2"), "option 'a' given twice");
  EXPECT_LINEA_ERROR(attn::AttentionSpec::parse("per former"), "invalid mechanism name");
  EXPECT_LINEA_ERROR(attn::AttentionSpec::parse("ra:samples=1:2"), "invalid value '1:2'");
}

TEST(AttentionSpec, TypedGettersRejectBadValuesAndUnusedKeys) {
  attn::AttentionSpec s = attn::AttentionSpec::parse("x:n=12x,p=abc,b=maybe,ok=3");
  EXPECT_LINEA_ERROR(s.get_int("n", 0), "option 'n' expects an integer, got '12x'");
  EXPECT_LINEA_ERROR(s.get_double("p", 0), "option 'p' expects a number, got 'abc'");
  EXPECT_LINEA_ERROR(s.get_bool("b", false), "option 'b' expects a boolean");
  EXPECT_EQ(s.get_int("ok", 0), 3);
  EXPECT_NO_THROW(s.check_all_used());  // every key was asked about
  attn::AttentionSpec t = attn::AttentionSpec::parse("x:features=4,featurs=5");
  EXPECT_EQ(t.get_int("features", 0), 4);
  EXPECT_LINEA_ERROR(t.check_all_used(), "unknown option featurs for 'x' (known options: features)");
  attn::AttentionSpec u = attn::AttentionSpec::parse("x:a=1");
  EXPECT_LINEA_ERROR(u.check_all_used(), "it takes no options");
  attn::AttentionSpec w = attn::AttentionSpec::parse("x:a=1,b=2");
  EXPECT_LINEA_ERROR(w.check_all_used(), "unknown options a, b for 'x'");
  // Numbers with an exponent sign; not infinite or NaN.
  attn::AttentionSpec f = attn::AttentionSpec::parse("x:e=2.5e+3,inf=inf,nan=nan");
  EXPECT_EQ(f.get_double("e", 0), 2500.0);
  EXPECT_LINEA_ERROR(f.get_double("inf", 0), "option 'inf' expects a number, got 'inf'");
  EXPECT_LINEA_ERROR(f.get_double("nan", 0), "option 'nan' expects a number, got 'nan'");
  // Booleans in any case: 1/true/yes/on, 0/false/no/off.
  attn::AttentionSpec b = attn::AttentionSpec::parse("x:a=Yes,b=ON,c=TRUE,d=No,e=off,f=False");
  for (const char* k : {"a", "b", "c"}) EXPECT_TRUE(b.get_bool(k, false)) << k;
  for (const char* k : {"d", "e", "f"}) EXPECT_FALSE(b.get_bool(k, true)) << k;
}

// A toy mechanism for the registry test: the mean of v over keys, scaled by an option.
class MeanValueAttention : public attn::AttentionMechanism {
 public:
  MeanValueAttention(int64_t heads, int64_t head_dim, double scale)
      : AttentionMechanism("MeanValueAttention", heads, head_dim), scale_(scale) {}
  Tensor forward(const Tensor& q, const Tensor& k, const Tensor& v, const attn::AttentionOptions& opts) override {
    attn::check_attention_inputs("mean attention", q, k, v, opts);
    return mean(v, {2}, true).expand({q.size(0), q.size(1), q.size(2), v.size(3)}) * scale_;
  }

 private:
  double scale_;
};

TEST(AttentionRegistry, RegisterAndMake) {
  EXPECT_LINEA_ERROR(attn::make_attention("mean_test", 2, 4),
                     "unknown attention 'mean_test' (known: lara, nprf_rpe, performer, ra, softmax");
  attn::register_attention("mean_test", [](const attn::AttentionSpec& s, int64_t heads, int64_t head_dim) {
    return std::make_shared<MeanValueAttention>(heads, head_dim, s.get_double("scale", 1.0));
  });
  auto names = attn::registered_attentions();
  EXPECT_NE(std::find(names.begin(), names.end(), "mean_test"), names.end());
  EXPECT_NE(std::find(names.begin(), names.end(), "softmax"), names.end());
  EXPECT_LINEA_ERROR(
      attn::register_attention("mean_test", [](const attn::AttentionSpec&, int64_t h,
                                               int64_t d) { return std::make_shared<MeanValueAttention>(h, d, 1.0); }),
      "'mean_test' is already registered");
  auto mech = attn::make_attention("mean_test:scale=2", 2, 4);
  EXPECT_EQ(mech->heads(), 2);
  EXPECT_EQ(mech->head_dim(), 4);
  Tensor v = randn({1, 2, 3, 4});
  EXPECT_TRUE(all_close(mech->forward(randn({1, 2, 5, 4}), randn({1, 2, 3, 4}), v, {}).narrow(2, 0, 1),
                        mean(v, {2}, true) * 2.0, 1e-6, 1e-6));
  EXPECT_LINEA_ERROR(attn::make_attention("mean_test:scal=2", 2, 4), "unknown option scal");
  // A MultiHeadAttention runs it by spec.
  auto mha = std::make_shared<attn::MultiHeadAttention>(8, 2, "mean_test:scale=0.5");
  EXPECT_EQ(mha->mechanism()->type_name(), "MeanValueAttention");
  EXPECT_EQ(mha->forward(randn({2, 3, 8}), randn({2, 6, 8})).shape(), Shape({2, 3, 8}));
  EXPECT_LINEA_ERROR(attn::make_attention("softmax", 0, 4), "heads and head_dim must be positive");
  // Registrations that cannot work are refused; so is a factory that returns nothing.
  const attn::AttentionFactory mean_factory = [](const attn::AttentionSpec&, int64_t h, int64_t d) {
    return std::make_shared<MeanValueAttention>(h, d, 1.0);
  };
  EXPECT_LINEA_ERROR(attn::register_attention("mean test", mean_factory),
                     "register_attention: invalid name 'mean test'");
  EXPECT_LINEA_ERROR(attn::register_attention("empty_test", attn::AttentionFactory()),
                     "register_attention: empty factory for 'empty_test'");
  attn::register_attention("null_test", [](const attn::AttentionSpec&, int64_t, int64_t) {
    return std::shared_ptr<attn::AttentionMechanism>();
  });
  EXPECT_LINEA_ERROR(attn::make_attention("null_test", 2, 4),
                     "make_attention: the factory of 'null_test' returned null");
}

// What the registry tells apps and tools: the mechanisms for each use, the flag help, each one's
// description, and a length option filled in where the spec leaves it out.
TEST(AttentionRegistry, UsesDescriptionsAndLengths) {
  const auto has = [](const std::vector<std::string>& names, const std::string& n) {
    return std::find(names.begin(), names.end(), n) != names.end();
  };
  const std::vector<std::string> causal = attn::attentions_for(attn::AttentionUse::CausalSelf),
                                 cross = attn::attentions_for(attn::AttentionUse::Cross);
  for (const char* n : {"softmax", "performer", "nprf_rpe"}) EXPECT_TRUE(has(causal, n) && has(cross, n)) << n;
  EXPECT_TRUE(has(cross, "ra"));
  EXPECT_FALSE(has(causal, "ra"));
  EXPECT_FALSE(has(causal, "lara") || has(cross, "lara"));
  EXPECT_TRUE(has(attn::attentions_for(attn::AttentionUse::Self), "lara"));
  const std::string help = attn::attention_flag_help(attn::AttentionUse::CausalSelf);
  EXPECT_EQ(help.find("lara"), std::string::npos) << help;
  EXPECT_NE(help.find("nprf_rpe, performer, softmax"), std::string::npos) << help;
  const std::string d = attn::describe_attentions();
  EXPECT_NE(d.find("performer: FAVOR+ random features"), std::string::npos) << d;
  EXPECT_NE(
      d.find("\n  supports: " + attn::attention_info("ra").support.str() + "\n  samples=1  samples S per query\n"),
      std::string::npos)
      << d;
  EXPECT_EQ(attn::with_length("nprf_rpe:features=8", 128), "nprf_rpe:features=8,max_len=128");
  EXPECT_EQ(attn::with_length("nprf_rpe:max_len=64", 128), "nprf_rpe:max_len=64");
  EXPECT_EQ(attn::with_length("softmax", 128), "softmax");
}

// A mechanism object given to MultiHeadAttention: checked against the layer's heads, head dim and
// use, and its output shape; the decoding caches check what the layer can do.
class OneColumnAttention : public attn::AttentionMechanism {  // returns [B, H, N, 1]: a bad shape
 public:
  OneColumnAttention(int64_t heads, int64_t head_dim) : AttentionMechanism("OneColumnAttention", heads, head_dim) {}
  Tensor forward(const Tensor& q, const Tensor&, const Tensor& v, const attn::AttentionOptions&) override {
    return mean(v, {2, 3}, true).expand({q.size(0), q.size(1), q.size(2), 1});
  }
};

TEST(MultiHeadAttention, ChecksItsMechanismAndUse) {
  using attn::AttentionUse;
  using attn::MultiHeadOptions;
  EXPECT_LINEA_ERROR(attn::MultiHeadAttention(8, 2, std::make_shared<MeanValueAttention>(2, 2, 1.0)),
                     "MultiHeadAttention: the MeanValueAttention was built for 2 heads of dim 2, this layer has 2 "
                     "heads of dim 4");
  EXPECT_LINEA_ERROR(attn::MultiHeadAttention(8, 2, std::make_shared<MeanValueAttention>(2, 4, 1.0),
                                              MultiHeadOptions{AttentionUse::Cross}),
                     "attention 'MeanValueAttention' cannot be used as cross-attention");
  attn::MultiHeadAttention bad(8, 2, std::make_shared<OneColumnAttention>(2, 4));
  EXPECT_LINEA_ERROR(bad.forward(randn({2, 3, 8}), randn({2, 3, 8})),
                     "MultiHeadAttention: mechanism 'OneColumnAttention' returned [2, 2, 3, 1], expected [2, 2, 3, 4]");
  attn::MultiHeadAttention wide(8, 2, "softmax", MultiHeadOptions{AttentionUse::Cross, true, 6});
  EXPECT_LINEA_ERROR(wide.start_self(), "start_self: a self-attention needs kv_dim == dim, got 6 and 8");
  attn::MultiHeadAttention lara(8, 2, "lara:samples=2");
  EXPECT_LINEA_ERROR(lara.start_cross(randn({2, 3, 8})),
                     "start_cross: attention 'lara:samples=2' does not support cross-attention");
}

// What the base class checks for every mechanism: its support in words, samples given undefined
// or of another kind than it draws, a second redraw schedule.
class TwoSchedulesAttention : public attn::AttentionMechanism {
 public:
  TwoSchedulesAttention() : AttentionMechanism("TwoSchedulesAttention", 2, 4) {
    init_redraw(1);
    init_redraw(2);
  }
  Tensor forward(const Tensor&, const Tensor&, const Tensor& v, const attn::AttentionOptions&) override { return v; }
};

TEST(AttentionMechanism, BaseClassChecks) {
  EXPECT_EQ(attn::make_attention("softmax", 2, 4)->support().str(),
            "bidirectional self-attention, causal self-attention, cross-attention, incremental decoding");
  EXPECT_EQ(attn::make_attention("ra", 2, 4)->support().str(), "bidirectional self-attention, cross-attention");
  EXPECT_EQ(attn::make_attention("lara", 2, 4)->support().str(), "bidirectional self-attention only");
  auto ra = attn::make_attention("ra:samples=2", 2, 4);
  EXPECT_LINEA_ERROR(ra->set_samples({{"eps", Tensor()}}), "RandomizedAttention: sample 'eps' is undefined");
  ra->set_samples({{"ra_index", zeros({1, 2, 3, 2}, TensorOptions(DType::Bool))}});
  EXPECT_LINEA_ERROR(ra->forward(randn({1, 2, 3, 4}), randn({1, 2, 5, 4}), randn({1, 2, 5, 2}), {}),
                     "ra: sample 'ra_index' must be int64, got bool");
  EXPECT_LINEA_ERROR(TwoSchedulesAttention(), "TwoSchedulesAttention: init_redraw called twice");
  // Dropout probabilities outside [0, 1), from a spec and to the functional form.
  EXPECT_LINEA_ERROR(attn::make_attention("softmax:dropout=1", 2, 4),
                     "SoftmaxAttention: dropout must be in [0, 1), got 1");
  EXPECT_LINEA_ERROR(attn::SoftmaxAttention(2, 4, -0.1), "SoftmaxAttention: dropout must be in [0, 1), got -0.1");
  const Tensor q = randn({1, 2, 3, 4});
  EXPECT_LINEA_ERROR(attn::softmax_attention(q, q, q, {}, 1.0, true), "softmax attention: dropout must be in [0, 1)");
  EXPECT_LINEA_ERROR(attn::softmax_attention_composed(q, q, q, {}, -0.5, false),
                     "softmax attention: dropout must be in [0, 1), got -0.5");
}

// ---- CUDA --------------------------------------------------------------------------------------
// The masked attention and a decoder (forward and parameter gradients) on CUDA match the CPU.
TEST(SoftmaxAttention, CudaMatchesCpu) {
  LINEA_REQUIRE_CUDA();
  const Device gpu("cuda");
  manual_seed(12);
  Tensor q = randn({2, 2, 4, 8}), k = randn({2, 2, 6, 8}), v = randn({2, 2, 6, 8});
  attn::AttentionOptions o;
  o.causal = true;
  o.key_padding_mask = tensor<int64_t>({1, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1}, {2, 6});  // batch 1 fully masked
  attn::AttentionOptions og = o;
  og.key_padding_mask = o.key_padding_mask.to(gpu);
  Tensor ref = attn::softmax_attention(q, k, v, o);
  Tensor out = attn::softmax_attention(q.to(gpu), k.to(gpu), v.to(gpu), og);
  EXPECT_TRUE(out.is_cuda());
  EXPECT_TRUE(all_close(out, ref, 1e-5, 1e-4));

  manual_seed(13);
  auto cpu_model = std::make_shared<attn::TransformerDecoder>(1, 8, 2, 16);
  auto gpu_model = std::make_shared<attn::TransformerDecoder>(1, 8, 2, 16);
  gpu_model->load_state_dict(cpu_model->state_dict());
  gpu_model->to(gpu);
  Tensor x = randn({2, 5, 8}), mem = randn({2, 6, 8});
  Tensor pad = tensor<bool>({false, false, false, false, true, true, false, false, false, true, true, true}, {2, 6});
  Tensor yc = cpu_model->forward(x, mem, pad);
  Tensor yg = gpu_model->forward(x.to(gpu), mem.to(gpu), pad.to(gpu));
  EXPECT_TRUE(all_close(yg, yc, 1e-4, 1e-4));
  sum(yc * yc).backward();
  sum(yg * yg).backward();
  auto pc = cpu_model->named_parameters(), pg = gpu_model->named_parameters();
  for (size_t i = 0; i < pc.size(); ++i)
    EXPECT_TRUE(all_close(pg[i].second.grad(), pc[i].second.grad(), 1e-4, 1e-3)) << pc[i].first;
}

}  // namespace
}  // namespace linea
