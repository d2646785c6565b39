// Fused CPU softmax attention (see attention.h). Work items are blocks of at most kMaxRows query
// rows of one (b, h); each item's scores [rows, M] live in a per-thread buffer (one workspace
// from the allocator), GEMMs by OpenBLAS (the OpenMP build runs single-threaded inside our
// parallel region, one GEMM per thread).
#include "core/cpu/attention.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <limits>
#include <type_traits>
#include <vector>

#include "core/cpu/gemm.h"
#include "core/cpu/vec_math.h"
#include "core/cpu/workspace.h"
#include "core/kernels.h"
#include "core/search_math.h"

namespace linea::cpu {

namespace {

using detail::gemm;
using detail::Workspace;

// Query rows per work item: about kBlockBytes of scores (256 rows at M = 4096 in float32), which
// stay in L2/L3 between the GEMMs that read them. Fewer rows would cost more packing: OpenBLAS
// packs the whole of k (or v) again for every block (measured: apps/bench/README.md).
constexpr int64_t kBlockBytes = int64_t(4) << 20;
constexpr int64_t kMinRows = 32, kMaxRows = 256;

// x[j] = exp(x[j] - shift): float32 through the vectorizable vm::exp, float64 through libm.
LINEA_VEC_CLONES void exp_shifted(float* x, int64_t n, float shift) {
#pragma omp simd
  for (int64_t j = 0; j < n; ++j) x[j] = vm::exp(x[j] - shift);
}
void exp_shifted(double* x, int64_t n, double shift) {
  for (int64_t j = 0; j < n; ++j) x[j] = std::exp(x[j] - shift);
}

// The shapes and masks of one call.
struct Problem {
  int64_t B, H, N, M, D, E;
  bool causal;
  int64_t offset;
  const uint8_t* pad;  // [B, M] (rows pad_ld apart) or null
  int64_t pad_ld;
  int64_t R;           // query rows per block: at most kMaxRows, the blocks as even as possible
  FoldedDropout drop;  // of the probabilities (p == 0: none)
  int64_t blocks() const { return N == 0 ? 0 : (N + R - 1) / R; }
  // Keys [0, keys_of_block) are visible to some row of the block starting at query i0.
  int64_t keys_of_block(int64_t i0, int64_t rows) const { return causal ? std::min(M, i0 + rows + offset) : M; }
  // Keys [0, end) pass the causal test for query i (padding aside); at most mv.
  int64_t visible_end(int64_t i, int64_t mv) const { return causal ? std::clamp<int64_t>(i + offset + 1, 0, mv) : mv; }
  const uint8_t* pad_of(int64_t b) const { return pad ? pad + b * pad_ld : nullptr; }
};

// A [B, H, L, X] operand or result where it lies: any batch, head and row strides, a row's X values
// contiguous (the heads of a [B, L, H, X] projection in place, as the CUDA kernels take them;
// check_head_rows in core/kernels.h), the rows ld apart for the GEMMs.
template <typename T> struct Heads {
  T* p;
  int64_t batch, head, ld, H;
  T* at(int64_t bh, int64_t row = 0) const { return p + bh / H * batch + bh % H * head + row * ld; }
};
template <typename T> Heads<T> heads_of(const Tensor& t) {
  // One row (or empty rows): any stride will do, but BLAS wants ld >= the row's length.
  const int64_t ld = t.size(2) > 1 && t.size(3) > 0 ? t.stride(2) : std::max<int64_t>(t.size(3), 1);
  return {t.data<std::remove_const_t<T>>(), t.stride(0), t.stride(1), ld, t.size(1)};
}

// Vectorized row helpers (the max, the sum in double, the scaling).
template <typename T> LINEA_VEC_CLONES T row_max(const T* s, int64_t n) {
  T mx = -std::numeric_limits<T>::infinity();
#pragma omp simd reduction(max : mx)
  for (int64_t j = 0; j < n; ++j) mx = s[j] > mx ? s[j] : mx;
  return mx;
}
template <typename T> LINEA_VEC_CLONES double row_sum(const T* s, int64_t n) {
  double sum = 0;
#pragma omp simd reduction(+ : sum)
  for (int64_t j = 0; j < n; ++j) sum += static_cast<double>(s[j]);
  return sum;
}
template <typename T> LINEA_VEC_CLONES void row_scale(T* s, int64_t n, T a) {
#pragma omp simd
  for (int64_t j = 0; j < n; ++j) s[j] *= a;
}

// Softmax of one row of scaled scores s [mv] in place over the visible keys (the first ve, minus
// padded ones), zeros elsewhere. Returns the row's log-sum-exp, -inf (and a zero row) when no key
// is visible.
template <typename T> T softmax_row(T* s, int64_t mv, int64_t ve, const uint8_t* padb) {
  constexpr T kNegInf = -std::numeric_limits<T>::infinity();
  if (padb)
    for (int64_t j = 0; j < ve; ++j)
      if (padb[j]) s[j] = kNegInf;  // exp gives exactly 0
  const T mx = row_max(s, ve);
  if (mx == kNegInf) {
    // No key visible, unless the visible scores are NaN (row_max skips them): never hide a NaN.
    bool nan = false;
    for (int64_t j = 0; j < ve; ++j) nan = nan || s[j] != s[j];
    std::fill(s, s + mv, nan ? std::numeric_limits<T>::quiet_NaN() : T(0));
    return nan ? std::numeric_limits<T>::quiet_NaN() : kNegInf;
  }
  exp_shifted(s, ve, mx);
  std::fill(s + ve, s + mv, T(0));
  const double sum = row_sum(s, ve);
  row_scale(s, ve, static_cast<T>(1.0 / sum));
  return mx + static_cast<T>(std::log(sum));
}

// p_m *= its dropout factor for m < mv: row n of head h of example b, elements (h N + n) M + m.
template <typename T> void drop_row(const Problem& p, int64_t b, int64_t h, int64_t n, T* row, int64_t mv) {
  const auto d = example_dropout<T>(p.drop);
  const int64_t j0 = (h * p.N + n) * p.M;
  for (int64_t m = 0; m < mv; ++m) row[m] *= d.factor(b, j0 + m);
}

// p = exp(s - lse) over the visible keys, 0 elsewhere (the forward's probabilities again).
template <typename T> void probabilities_row(T* s, int64_t mv, int64_t ve, const uint8_t* padb, T lse) {
  if (lse == -std::numeric_limits<T>::infinity()) {
    std::fill(s, s + mv, T(0));
    return;
  }
  exp_shifted(s, ve, lse);
  if (padb)
    for (int64_t j = 0; j < ve; ++j)
      if (padb[j]) s[j] = T(0);
  std::fill(s + ve, s + mv, T(0));
}

// s[r, m] += bias[m] for the block's rows (bias null: nothing).
template <typename T> void add_key_bias(T* s, int64_t rows, int64_t ld, int64_t mv, const T* bias) {
  if (!bias) return;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t m = 0; m < mv; ++m) s[r * ld + m] += bias[m];
}

// Runs block(s, bh, i0, rows) for each block of query rows [i0, i0 + rows) of each (b, h), the
// blocks spread over the threads; s: the thread's scratch for R x M scores (null without scratch).
template <typename T, typename Block> void for_each_block(const Problem& p, bool scratch, Block&& block) {
  const int64_t nblk = p.blocks(), items = p.B * p.H * nblk, rm = p.R * p.M;
  const int nt = omp_get_max_threads();
  Workspace<T> ws(scratch ? nt * Workspace<T>::rounded(rm) : 0);
  std::vector<T*> scores(static_cast<size_t>(nt), nullptr);
  if (scratch)
    for (T*& t : scores) t = ws.take(rm);
#pragma omp parallel num_threads(nt)
  {
    T* s = scores[static_cast<size_t>(omp_get_thread_num())];
#pragma omp for schedule(dynamic)
    for (int64_t it = 0; it < items; ++it) {
      const int64_t i0 = (it % nblk) * p.R;
      block(s, it / nblk, i0, std::min(p.R, p.N - i0));
    }
  }
}

template <typename T>
void forward_impl(const Problem& p, T scale, Heads<const T> q, Heads<const T> k, Heads<const T> v, const T* bias,
                  Heads<T> out, T* lse, T* probs) {
  // Scratch scores unless the probabilities are kept.
  for_each_block<T>(p, !probs, [&](T* s, int64_t bh, int64_t i0, int64_t rows) {
    const int64_t b = bh / p.H, mv = p.keys_of_block(i0, rows);
    const uint8_t* padb = p.pad_of(b);
    T* ob = out.at(bh, i0);
    T* lb = lse + bh * p.N + i0;
    // The block's scores: in the kept probabilities when there are any, else in scratch.
    T* sb = probs ? probs + (bh * p.N + i0) * p.M : s;
    const int64_t ld = probs ? p.M : mv;
    if (probs)  // keys [mv, M) are hidden from the whole block: probability 0
      for (int64_t r = 0; r < rows; ++r) std::fill(sb + r * p.M + mv, sb + (r + 1) * p.M, T(0));
    if (mv == 0) {
      for (int64_t r = 0; r < rows; ++r) std::fill(ob + r * out.ld, ob + r * out.ld + p.E, T(0));
      std::fill(lb, lb + rows, -std::numeric_limits<T>::infinity());
      return;
    }
    gemm(false, true, rows, mv, p.D, scale, q.at(bh, i0), q.ld, k.at(bh), k.ld, T(0), sb, ld);
    add_key_bias(sb, rows, ld, mv, bias ? bias + bh * p.M : nullptr);
    for (int64_t r = 0; r < rows; ++r) {
      lb[r] = softmax_row(sb + r * ld, mv, p.visible_end(i0 + r, mv), padb);
      if (p.drop.p > 0) drop_row(p, b, bh % p.H, i0 + r, sb + r * ld, mv);  // lse stays the undropped one
    }
    gemm(false, false, rows, p.E, mv, T(1), sb, ld, v.at(bh), v.ld, T(0), ob, out.ld);
  });
}

// One row of sdpa_sample: s [M] (scaled scores) becomes the running sums E_m of e_m = exp(s_m -
// max) over the unpadded keys, in key order; returns the last key with e_m > 0 (0: none).
template <typename T> int64_t cumulative_exp(T* s, int64_t M, const uint8_t* padb) {
  constexpr T kNegInf = -std::numeric_limits<T>::infinity();
  if (padb)
    for (int64_t m = 0; m < M; ++m)
      if (padb[m]) s[m] = kNegInf;  // exp gives exactly 0
  const T mx = row_max(s, M);
  if (mx == kNegInf) {  // no key visible: every draw is key 0
    std::fill(s, s + M, T(0));
    return 0;
  }
  exp_shifted(s, M, mx);
  int64_t last = 0;
  T sum = 0;
  for (int64_t m = 0; m < M; ++m) {
    if (s[m] > T(0)) last = m;
    sum += s[m];
    s[m] = sum;
  }
  return last;
}

// sdpa_sample: a block of query rows' scores by one GEMM, then per row its running sums in place
// and each draw by binary search in them (sorted_position, as searchsorted).
template <typename T>
void sample_impl(const Problem& p, T scale, Heads<const T> q, Heads<const T> k, const T* u, int64_t S, int64_t* out) {
  for_each_block<T>(p, true, [&](T* s, int64_t bh, int64_t i0, int64_t rows) {
    gemm(false, true, rows, p.M, p.D, scale, q.at(bh, i0), q.ld, k.at(bh), k.ld, T(0), s, p.M);
    for (int64_t r = 0; r < rows; ++r) {
      T* e = s + r * p.M;
      const int64_t last = cumulative_exp(e, p.M, p.pad_of(bh / p.H));
      const int64_t row = bh * p.N + i0 + r;
      for (int64_t j = 0; j < S; ++j)
        out[row * S + j] = std::min(sorted_position(e, p.M, u[row * S + j] * e[p.M - 1], true), last);
    }
  });
}

// dp = p (dp - d): the softmax backward of one row.
template <typename T> LINEA_VEC_CLONES void softmax_grad_row(const T* p, T* dp, int64_t n, T d) {
#pragma omp simd
  for (int64_t j = 0; j < n; ++j) dp[j] = p[j] * (dp[j] - d);
}

// With dropout factors z: dp = p (z dp - d) (dp the gradient of the dropped z p), then p = z p
// for dV.
template <typename T>
void dropped_softmax_grad_row(const Problem& p, int64_t b, int64_t h, int64_t n, T* pr, T* dp, int64_t mv, T d) {
  const auto drop = example_dropout<T>(p.drop);
  const int64_t j0 = (h * p.N + n) * p.M;
  for (int64_t m = 0; m < mv; ++m) {
    const T z = drop.factor(b, j0 + m);
    dp[m] = pr[m] * (z * dp[m] - d);
    pr[m] *= z;
  }
}

// dk, dv or dbias rows [0, mv) of one (b, h): where a block's GEMMs accumulate them (the head of the
// result itself, or the thread's own copy of it), ld apart.
template <typename T> struct Acc {
  T* p;
  int64_t ld;
};

// One block's share of the backward: dq rows written, dk, dv and dbias rows [0, mv) accumulated
// (db null: no bias). The block's probabilities come from the forward's kept ones or are
// recomputed into s.
template <typename T>
void backward_block(const Problem& p, T scale, int64_t bh, int64_t i0, Heads<const T> q, Heads<const T> k,
                    Heads<const T> v, const T* bias, Heads<const T> out, const T* lse, const T* probs,
                    Heads<const T> dout, const T* dlse, Heads<T> dq, Acc<T> dk, Acc<T> dv, T* db, T* s, T* dp) {
  const int64_t rows = std::min(p.R, p.N - i0), mv = p.keys_of_block(i0, rows), b = bh / p.H;
  const T* qb = q.at(bh, i0);
  const T* kb = k.at(bh);
  const T* ob = out.at(bh, i0);
  const T* gb = dout.at(bh, i0);
  T* dqb = dq.at(bh, i0);
  if (mv == 0) {
    for (int64_t r = 0; r < rows; ++r) std::fill(dqb + r * dq.ld, dqb + r * dq.ld + p.D, T(0));
    return;
  }
  const T* pb = s;
  int64_t ld = mv;
  if (probs) {
    pb = probs + (bh * p.N + i0) * p.M;
    ld = p.M;
  } else {
    gemm(false, true, rows, mv, p.D, scale, qb, q.ld, kb, k.ld, T(0), s, mv);  // scores
    add_key_bias(s, rows, mv, mv, bias ? bias + bh * p.M : nullptr);
    for (int64_t r = 0; r < rows; ++r)
      probabilities_row(s + r * mv, mv, p.visible_end(i0 + r, mv), p.pad_of(b), lse[bh * p.N + i0 + r]);
  }
  gemm(false, true, rows, mv, p.E, T(1), gb, dout.ld, v.at(bh), v.ld, T(0), dp, mv);  // dP = dO V^T
  for (int64_t r = 0; r < rows; ++r) {
    // dS = P (dP - rowsum(dO * O) + dlse), the softmax backward and the lse's (with dropout: P (Z
    // dP - ...), P = Z P)
    double dot = 0;
    for (int64_t e = 0; e < p.E; ++e) dot += static_cast<double>(gb[r * dout.ld + e]) * ob[r * out.ld + e];
    if (dlse) dot -= dlse[bh * p.N + i0 + r];
    const T d = static_cast<T>(dot);
    if (p.drop.p > 0)
      dropped_softmax_grad_row(p, b, bh % p.H, i0 + r, s + r * mv, dp + r * mv, mv, d);
    else
      softmax_grad_row(pb + r * ld, dp + r * mv, mv, d);
  }
  gemm(true, false, mv, p.E, rows, T(1), pb, ld, gb, dout.ld, T(1), dv.p, dv.ld);  // dV += P^T dO
  // dbias += the column sums of dS
  if (db)
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t m = 0; m < mv; ++m) db[m] += dp[r * mv + m];
  gemm(false, false, rows, p.D, mv, scale, dp, mv, kb, k.ld, T(0), dqb, dq.ld);  // dQ = scale dS K
  gemm(true, false, mv, p.D, rows, scale, dp, mv, qb, q.ld, T(1), dk.p, dk.ld);  // dK += scale dS^T Q
}

template <typename T>
void backward_impl(const Problem& p, T scale, Heads<const T> q, Heads<const T> k, Heads<const T> v, const T* bias,
                   Heads<const T> out, const T* lse, const T* probs, Heads<const T> dout, const T* dlse, Heads<T> dq,
                   Heads<T> dk, Heads<T> dv, T* db) {
  const int64_t BH = p.B * p.H, nblk = p.blocks(), kd = p.M * p.D, ve = p.M * p.E, rm = p.R * p.M, be = db ? p.M : 0;
  const int nt = omp_get_max_threads();
  // Whole heads per thread when there are enough (each accumulates into its own dk, dv rows); else
  // blocks of a head on several threads, each summing into its own dense copy of dk and dv.
  const bool by_head = BH >= nt;
  const int64_t acc =
      by_head ? 0
              : nt * (Workspace<T>::rounded(BH * kd) + Workspace<T>::rounded(BH * ve) + Workspace<T>::rounded(BH * be));
  Workspace<T> ws((probs ? 1 : 2) * nt * Workspace<T>::rounded(rm) + acc);
  std::vector<T*> s(static_cast<size_t>(nt)), dp(s.size()), acc_k(s.size()), acc_v(s.size()), acc_b(s.size());
  for (int t = 0; t < nt; ++t) {
    s[static_cast<size_t>(t)] = probs ? nullptr : ws.take(rm);
    dp[static_cast<size_t>(t)] = ws.take(rm);
    if (!by_head) {
      acc_k[static_cast<size_t>(t)] = ws.take(BH * kd);
      acc_v[static_cast<size_t>(t)] = ws.take(BH * ve);
      acc_b[static_cast<size_t>(t)] = db ? ws.take(BH * be) : nullptr;
    }
  }
  if (by_head) {
#pragma omp parallel num_threads(nt)
    {
      const size_t t = static_cast<size_t>(omp_get_thread_num());
#pragma omp for schedule(dynamic)
      for (int64_t bh = 0; bh < BH; ++bh) {
        for (int64_t m = 0; m < p.M; ++m) {
          std::fill(dk.at(bh, m), dk.at(bh, m) + p.D, T(0));
          std::fill(dv.at(bh, m), dv.at(bh, m) + p.E, T(0));
        }
        if (db) std::fill(db + bh * be, db + (bh + 1) * be, T(0));
        for (int64_t blk = 0; blk < nblk; ++blk)
          backward_block(p, scale, bh, blk * p.R, q, k, v, bias, out, lse, probs, dout, dlse, dq,
                         Acc<T>{dk.at(bh), dk.ld}, Acc<T>{dv.at(bh), dv.ld}, db ? db + bh * be : nullptr, s[t], dp[t]);
      }
    }
    return;
  }
#pragma omp parallel num_threads(nt)
  {
    const size_t t = static_cast<size_t>(omp_get_thread_num());
    std::fill(acc_k[t], acc_k[t] + BH * kd, T(0));
    std::fill(acc_v[t], acc_v[t] + BH * ve, T(0));
    // Static (below): which blocks a thread sums into its copy must not depend on timing, or the
    // sums' bits would (dynamic scheduling made two identical calls differ under load;
    // AttentionSuite.SameBitsUnderLoad).
    if (db) std::fill(acc_b[t], acc_b[t] + BH * be, T(0));
#pragma omp for schedule(static)
    for (int64_t it = 0; it < BH * nblk; ++it) {
      const int64_t bh = it / nblk;
      backward_block(p, scale, bh, (it % nblk) * p.R, q, k, v, bias, out, lse, probs, dout, dlse, dq,
                     Acc<T>{acc_k[t] + bh * kd, p.D}, Acc<T>{acc_v[t] + bh * ve, p.E},
                     db ? acc_b[t] + bh * be : nullptr, s[t], dp[t]);
    }
  }
  if (db) {  // the threads' dbias copies, summed in thread order
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < BH * be; ++i) {
      T sb = 0;
      for (size_t t = 0; t < acc_b.size(); ++t) sb += acc_b[t][i];
      db[i] = sb;
    }
  }
  // The threads' dk and dv copies, summed in thread order into the results' rows.
#pragma omp parallel for schedule(static)
  for (int64_t row = 0; row < BH * p.M; ++row) {
    const int64_t bh = row / p.M, m = row % p.M;
    T* dkr = dk.at(bh, m);
    T* dvr = dv.at(bh, m);
    for (int64_t d = 0; d < p.D; ++d) {
      T sum = 0;
      for (size_t t = 0; t < acc_k.size(); ++t) sum += acc_k[t][row * p.D + d];
      dkr[d] = sum;
    }
    for (int64_t e = 0; e < p.E; ++e) {
      T sum = 0;
      for (size_t t = 0; t < acc_v.size(); ++t) sum += acc_v[t][row * p.E + e];
      dvr[e] = sum;
    }
  }
}

Problem problem_of(const char* op, const Tensor& q, const Tensor& k, const Tensor& v, bool causal, int64_t offset,
                   const Tensor& pad, const FoldedDropout& drop) {
  LINEA_CHECK(!pad.defined() || pad.size(1) <= 1 || pad.stride(1) == 1, op,
              ": the CPU kernel reads key padding rows of contiguous values, got strides ", shape_str(pad.strides()));
  const int64_t N = q.size(2), M = k.size(2);
  const int64_t rows =
      std::clamp<int64_t>(kBlockBytes / std::max<int64_t>(M * dtype_size(q.dtype()), 1), kMinRows, kMaxRows);
  const int64_t nblk = std::max<int64_t>((N + rows - 1) / rows, 1);
  const uint8_t* pad_rows = pad.defined() ? static_cast<const uint8_t*>(pad.data_ptr()) : nullptr;
  const int64_t pad_ld = pad.defined() ? pad.stride(0) : 0;
  const int64_t R = std::max<int64_t>((N + nblk - 1) / nblk, 1);
  return {q.size(0), q.size(1), N, M, q.size(3), v.size(3), causal, offset, pad_rows, pad_ld, R, drop};
}

}  // namespace

void sdpa_forward(const Tensor& q, const Tensor& k, const Tensor& v, double scale, bool causal, int64_t offset,
                  const Tensor& pad, const Tensor& bias, const FoldedDropout& drop, const Tensor& out,
                  const Tensor& lse, const Tensor& probs) {
  check_head_rows("sdpa", {&q, &k, &v, &out});
  const Problem p = problem_of("sdpa", q, k, v, causal, offset, pad, drop);
  LINEA_DISPATCH_FLOAT(q.dtype(), "sdpa", [&] {
    using T = scalar_t;
    forward_impl<T>(p, static_cast<T>(scale), heads_of<const T>(q), heads_of<const T>(k), heads_of<const T>(v),
                    bias.defined() ? bias.data<T>() : nullptr, heads_of<T>(out), lse.data<T>(),
                    probs.defined() ? probs.data<T>() : nullptr);
  });
}

void sdpa_sample(const Tensor& q, const Tensor& k, const Tensor& pad, const Tensor& u, double scale,
                 const Tensor& out) {
  check_head_rows("sdpa_sample", {&q, &k});
  const Problem p = problem_of("sdpa_sample", q, k, k, false, 0, pad, FoldedDropout());
  LINEA_DISPATCH_FLOAT(q.dtype(), "sdpa_sample", [&] {
    using T = scalar_t;
    sample_impl<T>(p, static_cast<T>(scale), heads_of<const T>(q), heads_of<const T>(k), u.data<T>(), u.size(3),
                   out.data<int64_t>());
  });
}

void sdpa_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                   const Tensor& probs, const Tensor& dout, const Tensor& dlse, double scale, bool causal,
                   int64_t offset, const Tensor& pad, const Tensor& bias, const FoldedDropout& drop, const Tensor& dq,
                   const Tensor& dk, const Tensor& dv, const Tensor& dbias) {
  check_head_rows("sdpa_backward", {&q, &k, &v, &out, &dout, &dq, &dk, &dv});
  const Problem p = problem_of("sdpa_backward", q, k, v, causal, offset, pad, drop);
  LINEA_DISPATCH_FLOAT(q.dtype(), "sdpa_backward", [&] {
    using T = scalar_t;
    backward_impl<T>(p, static_cast<T>(scale), heads_of<const T>(q), heads_of<const T>(k), heads_of<const T>(v),
                     bias.defined() ? bias.data<T>() : nullptr, heads_of<const T>(out), lse.data<T>(),
                     probs.defined() ? probs.data<T>() : nullptr, heads_of<const T>(dout),
                     dlse.defined() ? dlse.data<T>() : nullptr, heads_of<T>(dq), heads_of<T>(dk), heads_of<T>(dv),
                     dbias.defined() ? dbias.data<T>() : nullptr);
  });
}

}  // namespace linea::cpu
