// The nprf_rpe mechanism (see nprf_rpe.h): normalized positive random features, a relative
// position bias per head, and the two Toeplitz sums over keys by FFT (toeplitz.h).
#include "attention/nprf_rpe/nprf_rpe.h"

#include <cctype>
#include <cmath>
#include <sstream>
#include <string>

#include "attention/nprf_rpe/toeplitz.h"

namespace linea::attn {

namespace {

constexpr const char* kWho = "nprf_rpe";
// The longest max_len (positions 2^20 apart); above it the bias table alone would be gigabytes.
constexpr int64_t kMaxRpeLength = int64_t{1} << 20;

// The smallest denominator used as is. Its square stays a normal number, so the backward of the
// division stays finite even where the guard is active.
double tiny(DType dt) { return dt == DType::Float32 ? 1e-18 : 1e-140; }

// Max over dims, kept, outside the graph: a stabilizer that cancels in the ratio.
Tensor detached_max(const Tensor& x, const std::vector<int64_t>& dims) {
  return max(x.detach(), dims, /*keepdim=*/true);
}

// What the FFT and the dense paths share, all stabilized (the stabilizers cancel in out_i).
struct Terms {
  Tensor phi_q;    // [B, H, N, S]  exp(W q^ - |q^|^2/2 - max_s) / sqrt(S)
  Tensor phi_k;    // [B, H, M, S]  exp(W k^ - |k^|^2/2 - max_{m,s}) / sqrt(S), zero at padded keys
  Tensor c;        // [H, N+M-1]    exp(b_t - max b) for t = j - i = -(N-1)..(M-1); zero for t > 0 if causal
  Tensor visible;  // Bool [B, 1, N|1, 1]: the query sees at least one key; undefined when all do
};

void check_tables(const Tensor& q, const Tensor& k, const Tensor& omega, const Tensor& rpe, int64_t offset) {
  const int64_t H = q.size(1), D = q.size(3), N = q.size(2), M = k.size(2);
  raw::check_defined(kWho, omega, "omega");
  raw::check_defined(kWho, rpe, "rpe");
  LINEA_CHECK(omega.dim() == 3 && omega.size(0) == H && omega.size(2) == D && omega.size(1) > 0, kWho,
              ": omega must be [H, S, D] = [", H, ", S, ", D, "] for q ", shape_str(q.shape()), ", got ",
              shape_str(omega.shape()));
  LINEA_CHECK(rpe.dim() == 2 && rpe.size(0) == H && rpe.size(1) % 2 == 1, kWho, ": rpe must be [H, 2L-1] with H = ", H,
              ", got ", shape_str(rpe.shape()));
  LINEA_CHECK(is_floating(omega.dtype()) && is_floating(rpe.dtype()), kWho, ": omega and rpe must be floating, got ",
              dtype_name(omega.dtype()), " and ", dtype_name(rpe.dtype()));
  LINEA_CHECK(N > 0 && M > 0, kWho, ": empty sequences are not supported, got q ", shape_str(q.shape()), ", k ",
              shape_str(k.shape()));
  const int64_t L = (rpe.size(1) + 1) / 2;
  // Relative positions j - (n + offset) run from -(N-1+offset) to M-1-offset.
  LINEA_CHECK(N + offset <= L && M - offset <= L, kWho, ": ", N, " queries at positions ", offset, "..",
              offset + N - 1, " and ", M, " keys need relative positions beyond max_len = ", L,
              " (the relative positions -(L-1)..(L-1) of rpe ", shape_str(rpe.shape()), "); use a larger nprf_rpe:max_len");
}

Terms terms(const Tensor& q, const Tensor& k, const Tensor& omega_in, const Tensor& rpe_in, const AttentionOptions& opts) {
  const int64_t B = q.size(0), N = q.size(2), M = k.size(2), o = opts.query_offset;
  const int64_t L = (rpe_in.size(1) + 1) / 2;
  Tensor omega = to(to(omega_in, q.device()), q.dtype());
  Tensor rpe = to(to(rpe_in, q.device()), q.dtype());
  Terms t;

  // Query features stabilized per row (phi(q^_i) / max_s phi(q^_i)_s), key features per (b, h)
  // over the unpadded keys, padded keys exactly 0 (fused: autograd's positive_features). padded:
  // Bool [B, M] or undefined.
  Tensor padded = key_padding_bool(opts);
  t.phi_q = positive_features(normalize(q), omega, /*per_row=*/true, Tensor());  // [B, H, N, S]; q^ = q / |q|
  t.phi_k = positive_features(normalize(k), omega, /*per_row=*/false, padded);   // [B, H, M, S]

  // Bias of the relative positions j - (n + o) for j - n = -(N-1)..(M-1), i.e. rpe indices
  // L-N-o .. L+M-2-o; causal hides the positive ones (c index > N-1+o): their c is 0.
  const int64_t shown = opts.causal ? std::min(N + o, N + M - 1) : N + M - 1;
  Tensor b = narrow(rpe, 1, L - N - o, shown);                     // [H, shown]
  t.c = exp(sub(b, detached_max(b, {1})));                         // max 1 per head
  if (shown < N + M - 1) t.c = pad(t.c, 1, 0, N + M - 1 - shown);  // [H, N+M-1]

  // Which queries see a key at all (only padding can leave one without): an exact mask, since
  // the FFT leaves rounding noise where the true sums are 0.
  if (padded.defined()) {
    Tensor keep = (~padded).to(q.dtype());  // [B, M]
    Tensor seen;
    if (opts.causal) {
      // keys 0..min(i + o, M-1) are visible to query i: count the unpadded ones by a prefix sum.
      const TensorOptions io(DType::Int64, q.device());
      Tensor last = clamp(arange(static_cast<double>(o), static_cast<double>(o + N), 1.0, io), 0.0,
                          static_cast<double>(M - 1));
      seen = reshape(index_select(cumsum(keep, 1), 1, last), {B, 1, N, 1});
    } else {
      seen = reshape(max(keep, {1}), {B, 1, 1, 1});
    }
    t.visible = seen > 0.0;
  }
  return t;
}

// num / den with den guarded; queries that see no key get exactly 0.
Tensor guarded_ratio(const Tensor& num, const Tensor& den, const Tensor& visible) {
  Tensor d = den;
  if (visible.defined()) d = where(visible, d, scalar_tensor(1.0, d.options()));
  Tensor r = div(num, clamp(d, tiny(d.dtype()), INFINITY));
  if (visible.defined()) r = where(visible, r, scalar_tensor(0.0, r.options()));
  return r;
}

// The dense [B, H, N, M] matrix A_ij = e^{b_{j-i}} phi(q^_i).phi(k^_j), row-normalized.
Tensor dense_attention(const Terms& t, int64_t N, int64_t M) {
  Tensor a = mul(matmul(t.phi_q, transpose(t.phi_k, -2, -1)), unsqueeze(toeplitz_matrix(t.c, N, M), 0));
  return guarded_ratio(a, sum(a, {-1}, /*keepdim=*/true), t.visible);
}

// The FFT path composed from ops, on t's terms (defined below).
Tensor fft_composed(const Terms& t, const Tensor& v, int64_t B, int64_t H, int64_t N, int64_t M, int64_t Dv,
                    int64_t S);

}  // namespace

Tensor nprf_rpe_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& omega, const Tensor& rpe,
                          const AttentionOptions& opts, bool dense) {
  check_attention_inputs(kWho, q, k, v, opts);
  check_tables(q, k, omega, rpe, opts.query_offset);
  const int64_t N = q.size(2), M = k.size(2);
  Terms t = terms(q, k, omega, rpe, opts);
  // [num, den] in one product: v with a column of ones; the dense path takes the sums directly
  // (fft length 0: term by term in tiles, never the [N, M] matrix), the other by FFT.
  Tensor y = toeplitz_attention(t.c, t.phi_q, t.phi_k, pad(v, -1, 0, 1, 1.0), dense ? 0 : fft_length(N + M - 1));
  return sums_ratio(y, t.visible, tiny(y.dtype()));  // guarded_ratio of y's [num, den], one kernel each way
}

Tensor nprf_rpe_attention_fft_composed(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& omega,
                                       const Tensor& rpe, const AttentionOptions& opts) {
  check_attention_inputs(kWho, q, k, v, opts);
  check_tables(q, k, omega, rpe, opts.query_offset);
  return fft_composed(terms(q, k, omega, rpe, opts), v, q.size(0), q.size(1), q.size(2), k.size(2), v.size(3),
                      omega.size(1));
}

namespace {
Tensor fft_composed(const Terms& t, const Tensor& v, int64_t B, int64_t H, int64_t N, int64_t M, int64_t Dv,
                    int64_t S) {
  // The two sums over keys as Toeplitz products along keys, channels first (the FFT's layout):
  //   ykv_i = sum_j e^{b_{j-i}} phi(k^_j) v_j^T   (S*Dv channels: phi(k^_j)_s v_je)
  //   yk_i  = sum_j e^{b_{j-i}} phi(k^_j)         (S channels)
  // Padded keys are zero rows of phi_k, so they add nothing.
  Tensor pk = transpose(t.phi_k, -2, -1);                                                 // [B, H, S, M]
  Tensor kv = reshape(mul(unsqueeze(pk, 3), unsqueeze(transpose(v, -2, -1), 2)), {B, H, S * Dv, M});
  Tensor ykv = reshape(toeplitz_matmul_channels_first(t.c, kv, N), {B, H, S, Dv, N});    // [B, H, S, Dv, N]
  Tensor yk = toeplitz_matmul_channels_first(t.c, pk, N);                                 // [B, H, S, N]
  // out_i = phi(q^_i) . ykv_i / phi(q^_i) . yk_i
  Tensor pq = transpose(t.phi_q, -2, -1);                                                 // [B, H, S, N]
  Tensor num = transpose(sum(mul(unsqueeze(pq, 3), ykv), {2}), -2, -1);                  // [B, H, N, Dv]
  Tensor den = transpose(sum(mul(pq, yk), {2}, /*keepdim=*/true), -2, -1);               // [B, H, N, 1]
  return guarded_ratio(num, den, t.visible);
}
}  // namespace

Tensor nprf_rpe_attention_matrix(const Tensor& q, const Tensor& k, const Tensor& omega, const Tensor& rpe,
                                 const AttentionOptions& opts) {
  check_attention_inputs(std::string(kWho) + " attention_matrix", q, k, k, opts);
  check_tables(q, k, omega, rpe, opts.query_offset);
  return dense_attention(terms(q, k, omega, rpe, opts), q.size(2), k.size(2));
}

// ---- the choice of path ------------------------------------------------------------------------

// Both paths compute the same formula; which is faster depends on shapes only, so the choice is a
// cost model of the shapes, fitted to forward+backward CPU timings of both paths (the timings and
// the fit: apps/bench/README.md, "nprf_rpe: the dense or the FFT path"). In units of one term of
// the dense path's GEMMs:
//   FFT    ~ 5 * S*(Dv+1)*(N+M)*log2(N+M)     (S*(Dv+1) channels, v and a column of ones)
//   dense  ~ N*M*(S+Dv+5)                     (the direct kernel's GEMMs over S and Dv, and the bias
//                                              table applied per entry)
// So auto switches to FFT at N = M ~ 800 (S = Dv = 16), ~1500 (S = 64, Dv = 16: the ViT's heads
// at the default features) and ~4000 (S = Dv = 64). Both paths hold O((N + M) S) memory; the
// dense one is also the more accurate in float32 (nprf_rpe.h).
// On CUDA the direct kernel gains more on the FFT path than on the CPU: timed on an H200
// (2026-11-28, B = 4, H = 8, Dv = 64, forward+backward; gpu_check.sh's nprf part) dense won up to
// N = M = 2048 at S = 16 (9.1 against 11.4 ms; FFT at 4096: 22.7 against 36.0) and up to 4096 at
// S = 64 (40.9 against 100 ms; FFT at 8192: 184 against 201). Any weight of the FFT term
// between 1.39 and 1.87 splits those four pairs right: 1.6, so N = M ~ 2400 at S = 16, ~6900 at
// S = 64 (Dv = 64).
bool nprf_rpe_prefers_dense(int64_t N, int64_t M, int64_t S, int64_t Dv, bool cuda) {
  const double n = static_cast<double>(N), m = static_cast<double>(M);
  const double dense_cost = n * m * static_cast<double>(S + Dv + 5);
  const double fft_cost = 5.0 * static_cast<double>(S) * static_cast<double>(Dv + 1) * (n + m) * std::log2(n + m);
  return dense_cost <= (cuda ? 1.6 : 1.0) * fft_cost;
}

// ---- the layer ------------------------------------------------------------------------------

NprfRpeAttention::NprfRpeAttention(int64_t heads, int64_t head_dim, int64_t features, int64_t max_len, int64_t redraw,
                                   NprfPath dense)
    : AttentionMechanism("NprfRpeAttention", heads, head_dim), features_(features), max_len_(max_len), dense_(dense) {
  LINEA_CHECK(heads > 0 && head_dim > 0, kWho, ": heads and head_dim must be positive, got ", heads, " and ", head_dim);
  LINEA_CHECK(features > 0, kWho, ": features must be > 0, got ", features);
  LINEA_CHECK(features <= kMaxRandomFeatures, kWho, ": features ", features, " is more than the limit of ",
              kMaxRandomFeatures);
  LINEA_CHECK(max_len > 0, kWho, ": max_len must be > 0, got ", max_len);
  // rpe holds 2 max_len - 1 biases per head.
  LINEA_CHECK(max_len <= kMaxRpeLength, kWho, ": max_len ", max_len, " is more than the limit of ", kMaxRpeLength);
  LINEA_CHECK(redraw >= 0, kWho, ": redraw must be >= 0 (0 = never), got ", redraw);
  init_redraw(redraw);
  rpe_ = register_parameter("rpe", zeros({heads, 2 * max_len - 1}, TensorOptions(DType::Float32)));
  omega_ = register_buffer("omega", orthogonal_gaussian(heads, features, head_dim).to(DType::Float32));
}

Tensor NprfRpeAttention::features_for(const Tensor& like) {
  const bool due = redraw_due();
  return sample("omega", {heads(), features_, head_dim()}, like, [&] {
    if (due) {
      NoGradGuard ng;
      Tensor fresh = orthogonal_gaussian(heads(), features_, head_dim());  // float64, CPU generator
      nn::replace_data(omega_, fresh.to(omega_.dtype()).to(omega_.device()));
    }
    return omega_.to(like.device()).to(like.dtype());
  });
}

Tensor NprfRpeAttention::forward(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& opts) {
  check_attention_inputs(kWho, q, k, v, opts);
  LINEA_CHECK(q.size(1) == heads() && q.size(3) == head_dim(), kWho, ": built for ", heads(), " heads of dim ",
              head_dim(), ", got q ", shape_str(q.shape()));
  return nprf_rpe_attention(q, k, v, features_for(q), rpe_, opts,
                            uses_dense(q.size(2), k.size(2), v.size(3), q.is_cuda()));
}

Tensor NprfRpeAttention::attention_matrix(const Tensor& q, const Tensor& k, const AttentionOptions& opts) {
  check_attention_inputs(std::string(kWho) + " attention_matrix", q, k, k, opts);
  LINEA_CHECK(q.size(1) == heads() && q.size(3) == head_dim(), kWho, ": built for ", heads(), " heads of dim ",
              head_dim(), ", got q ", shape_str(q.shape()));
  return nprf_rpe_attention_matrix(q, k, features_for(q), rpe_, opts);
}

std::string NprfRpeAttention::extra_repr() const {
  std::ostringstream os;
  os << "heads=" << heads() << ", head_dim=" << head_dim() << ", features=" << features_ << ", max_len=" << max_len_
     << ", redraw=" << redraw_every()
     << ", dense=" << (dense_ == NprfPath::Auto ? "auto" : dense_ == NprfPath::Dense ? "1" : "0");
  return os.str();
}

std::shared_ptr<AttentionMechanism> make_nprf_rpe(const AttentionSpec& spec, int64_t heads, int64_t head_dim) {
  const int64_t features = spec.get_int("features", 64);
  const int64_t max_len = spec.get_int("max_len", 512);
  const int64_t redraw = spec.get_int("redraw", 1);
  // dense=auto (any case), or a boolean (1/0, true/false, ...) forcing one path.
  NprfPath dense = NprfPath::Auto;
  const std::string given = spec.get_string("dense", "auto");
  std::string mode = given;
  for (char& ch : mode) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  if (mode != "auto") {
    try {
      dense = spec.get_bool("dense", false) ? NprfPath::Dense : NprfPath::Fft;
    } catch (const Error&) {
      LINEA_FAIL("attention spec '", spec.str(), "': option 'dense' expects 0, 1 or auto, got '", given, "'");
    }
  }
  return std::make_shared<NprfRpeAttention>(heads, head_dim, features, max_len, redraw, dense);
}

AttentionInfo nprf_rpe_info() {
  AttentionInfo i;
  i.name = "nprf_rpe";
  i.summary =
      "normalized positive random features with a relative positional bias, Toeplitz product by FFT, "
      "O(L log L)";
  i.support = {true, true, true, true};
  i.options = {{"features", "64", "random features"},
               {"max_len", "512", "longest sequence: the relative-position table spans 2 max_len - 1 offsets"},
               {"redraw", "1", "draw new features every N training forwards (0: never)"},
               {"dense", "auto", "1: the dense O(L^2) path; 0: the FFT path; auto: the faster for the shapes"}};
  i.factory = make_nprf_rpe;
  i.test_specs = {"nprf_rpe:features=8,max_len=8"};
  i.count_option = "features";
  i.length_option = "max_len";
  return i;
}

}  // namespace linea::attn
