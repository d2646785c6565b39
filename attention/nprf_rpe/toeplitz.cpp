// Toeplitz products by FFT (and densely, for reference); see toeplitz.h.
#include "attention/nprf_rpe/toeplitz.h"

#include <limits>

namespace linea::attn {

int64_t fft_length(int64_t min_len) {
  LINEA_CHECK(min_len >= 1, "fft_length: length must be >= 1, got ", min_len);
  LINEA_CHECK(min_len <= std::numeric_limits<int64_t>::max() / 5, "fft_length: length ", min_len, " is too large");
  for (int64_t n = min_len;; ++n) {  // 5-smooth numbers are dense enough: a handful of steps
    int64_t r = n;
    for (int64_t p : {2, 3, 5})
      while (r % p == 0) r /= p;
    if (r == 1) return n;
  }
}

namespace {
// xt [B, H, C, M] (channels first).
void check_toeplitz_args(const Tensor& c, const Tensor& xt, int64_t N) {
  const char* op = "toeplitz_matmul";
  raw::check_defined(op, c, "c");
  raw::check_defined(op, xt, "x");
  LINEA_CHECK(xt.dim() == 4, op, ": x must be [B, H, M, C] ([B, H, C, M] channels first), got ",
              shape_str(xt.shape()));
  LINEA_CHECK(N >= 1, op, ": N must be >= 1, got ", N);
  const int64_t M = xt.size(3);
  LINEA_CHECK(
      (c.dim() == 2 && c.size(0) == xt.size(1)) || (c.dim() == 3 && c.size(0) == xt.size(0) && c.size(1) == xt.size(1)),
      op, ": c must be [H, N+M-1] or [B, H, N+M-1] for ", xt.size(0), " batches of ", xt.size(1), " heads, got ",
      shape_str(c.shape()));
  LINEA_CHECK(c.size(-1) == N + M - 1, op, ": c ", shape_str(c.shape()), " must hold the ", N + M - 1,
              " offsets -(N-1)..(M-1) for N = ", N, ", M = ", M);
  LINEA_CHECK(is_floating(c.dtype()), op, ": c must be floating, got ", dtype_name(c.dtype()));
  raw::check_same_dtype(op, c, xt);
  raw::check_same_device(op, c, xt);
}

// Something derived from c: 3-D (from a per-head c [H, ..]) gets a leading batch dim of 1 to
// broadcast against [B, H, ...]; 4-D (from a per-batch c [B, H, ..]) is returned as is.
Tensor batched(const Tensor& t) { return t.dim() == 3 ? unsqueeze(t, 0) : t; }
}  // namespace

Tensor toeplitz_matrix(const Tensor& c, int64_t N, int64_t M) {
  LINEA_CHECK(c.dim() >= 1 && c.size(-1) == N + M - 1, "toeplitz_matrix: c ", shape_str(c.shape()),
              " must hold the ", N + M - 1, " offsets -(N-1)..(M-1) for N = ", N, ", M = ", M);
  // index[i, j] = (j - i) + (N - 1), gathered from c's last dim.
  const TensorOptions io(DType::Int64, c.device());
  Tensor rows = reshape(arange(0.0, static_cast<double>(N), 1.0, io), {N, 1});
  Tensor cols = reshape(arange(static_cast<double>(N - 1), static_cast<double>(N - 1 + M), 1.0, io), {1, M});
  Tensor index = reshape(cols - rows, {N * M});
  Shape out = c.shape();
  out.back() = N;
  out.push_back(M);
  return reshape(index_select(c, -1, index), out);  // [.., N, M]
}

Tensor toeplitz_matmul(const Tensor& c, const Tensor& x, int64_t N, bool fft) {
  LINEA_CHECK(x.defined() && x.dim() == 4, "toeplitz_matmul: x must be [B, H, M, C], got ",
              x.defined() ? shape_str(x.shape()) : std::string("undefined"));
  return transpose(toeplitz_matmul_channels_first(c, transpose(x, 2, 3), N, fft), 2, 3);  // [B, H, N, C]
}

Tensor toeplitz_matmul_channels_first(const Tensor& c, const Tensor& xt, int64_t N, bool fft) {
  check_toeplitz_args(c, xt, N);
  const int64_t M = xt.size(3);
  // [B, H, C, M] @ T^T [B|1, H, M, N]
  if (!fft) return matmul(xt, transpose(batched(toeplitz_matrix(c, N, M)), -2, -1));

  // Circulant embedding: g [.., H, n] holds c_t at t mod n, i.e. c_0..c_{M-1}, zeros, then
  // c_{-(N-1)}..c_{-1} at the end. Then y_i = sum_j g_{(j-i) mod n} x_j for i < N, whose DFT is
  // Y_k = X_k conj(G_k) (a cross-correlation), and no term wraps around because n >= N+M-1.
  const int64_t n = fft_length(N + M - 1);
  std::vector<Tensor> parts = {narrow(c, -1, N - 1, M)};
  if (n > N + M - 1) {
    Shape zs = c.shape();
    zs.back() = n - (N + M - 1);
    parts.push_back(zeros(zs, c.options()));
  }
  if (N > 1) parts.push_back(narrow(c, -1, 0, N - 1));
  Tensor g = parts.size() == 1 ? parts[0] : cat(parts, -1);  // [.., H, n]

  Tensor G = unsqueeze(batched(rfft(g, n, -1)), 2);     // [B|1, H, 1, F, 2]
  Tensor X = rfft(xt, n, -1);                           // [B, H, C, F, 2] (M zero-padded to n)
  Tensor gr = select(G, -1, 0), gi = select(G, -1, 1);  // [B|1, H, 1, F]
  Tensor xr = select(X, -1, 0), xi = select(X, -1, 1);  // [B, H, C, F]
  Tensor Y = stack({add(mul(xr, gr), mul(xi, gi)), sub(mul(xi, gr), mul(xr, gi))}, -1);  // X conj(G)
  return narrow(irfft(Y, n, -1), -1, 0, N);                                             // [B, H, C, N]
}

}  // namespace linea::attn
