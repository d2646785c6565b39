// CPU matmul kernel (linea::cpu::matmul) on OpenBLAS: one cblas_sgemm / cblas_dgemm per
// matrix of the batch, operands read in place. A column-major operand (a transposed view)
// is passed as CblasTrans with its leading dimension, never copied; broadcast batch dims
// (stride 0) simply repeat an offset. When the right operand is shared by the whole batch
// and the left one is a row-major stack of matrices, the batch is folded into M and done as
// one GEMM. Also the linear layer's pair (linear, linear_weight_grad): the same GEMMs with the
// bias added, and reduced, as the composed matmul + add and its backward did it.
// Not here: argument checks, 1-D promotion, broadcasting and copies of unsupported layouts
// (raw::matmul in core/ops_nn.cpp does those), and any autograd.
#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "core/cpu/strided.h"
#include "core/kernels.h"
#include "core/matmul_layout.h"

namespace linea::cpu {

namespace {

using linea::detail::MatLayout;
using linea::detail::matmul_layout;

inline void gemm(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int m, int n, int k, double alpha, const float* a, int lda,
                 const float* b, int ldb, double beta, float* c, int ldc) {
  cblas_sgemm(CblasRowMajor, ta, tb, m, n, k, static_cast<float>(alpha), a, lda, b, ldb, static_cast<float>(beta), c,
              ldc);
}
inline void gemm(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int m, int n, int k, double alpha, const double* a, int lda,
                 const double* b, int ldb, double beta, double* c, int ldc) {
  cblas_dgemm(CblasRowMajor, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

// Element offsets of each batch matrix of t (batch dims = all but the last two), in the
// row-major order of the batch index.
std::vector<int64_t> batch_offsets(const Tensor& t, int64_t batch) {
  const int64_t nb = t.dim() - 2;
  std::vector<int64_t> offs(static_cast<size_t>(batch));
  std::vector<int64_t> idx(static_cast<size_t>(std::max<int64_t>(nb, 0)), 0);
  int64_t off = 0;
  for (int64_t i = 0; i < batch; ++i) {
    offs[i] = off;
    for (int64_t d = nb - 1; d >= 0; --d) {  // odometer increment
      off += t.stride(d);
      if (++idx[d] < t.size(d)) break;
      off -= t.stride(d) * t.size(d);
      idx[d] = 0;
    }
  }
  return offs;
}

// With OpenBLAS's OpenMP build (what CMake links when it is installed), a batch of at least
// as many matrices as threads runs one GEMM per thread (OpenBLAS runs single-threaded inside
// our parallel region): GEMMs with a small side, [4096, 64] x [64, 16] say, gain nothing from
// OpenBLAS's own threads, so one GEMM per thread is how such a batch uses the cores. With the
// pthread build the loop stays sequential: calling it from an OpenMP-parallel loop is much
// slower on batches of small GEMMs (figures: apps/bench/README.md).
bool blas_is_openmp() {
  static const bool openmp = openblas_get_parallel() == 2;  // 0 sequential, 1 pthreads, 2 OpenMP
  return openmp;
}

// One GEMM per batch entry (or one for the folded batch). a, b, c point at element 0.
template <typename T>
void batched_gemm(const T* pa, const T* pb, T* pc, MatLayout la, MatLayout lb, int64_t ldc, int64_t M, int64_t N,
                  int64_t K, int64_t batch, const std::vector<int64_t>& offa, const std::vector<int64_t>& offb,
                  const std::vector<int64_t>& offc, double alpha, double beta) {
  const CBLAS_TRANSPOSE ta = la.trans ? CblasTrans : CblasNoTrans;
  const CBLAS_TRANSPOSE tb = lb.trans ? CblasTrans : CblasNoTrans;
  // Fold the batch into M when b is the same matrix for every batch entry and a's and c's
  // matrices are consecutive row blocks with a common leading dimension (e.g. [B, L, D] @ [D, E]).
  bool fold = batch > 1 && !la.trans;
  for (int64_t i = 0; fold && i < batch; ++i)
    fold = offb[i] == offb[0] && offa[i] == offa[0] + i * M * la.ld && offc[i] == offc[0] + i * M * ldc;
  if (fold) {
    gemm(ta, tb, static_cast<int>(batch * M), static_cast<int>(N), static_cast<int>(K), alpha, pa + offa[0],
         static_cast<int>(la.ld), pb + offb[0], static_cast<int>(lb.ld), beta, pc + offc[0], static_cast<int>(ldc));
    return;
  }
  const auto one = [&](int64_t i) {
    gemm(ta, tb, static_cast<int>(M), static_cast<int>(N), static_cast<int>(K), alpha, pa + offa[i],
         static_cast<int>(la.ld), pb + offb[i], static_cast<int>(lb.ld), beta, pc + offc[i], static_cast<int>(ldc));
  };
  const int threads = omp_get_max_threads();
  const bool par = threads > 1 && batch >= threads && blas_is_openmp() && !omp_in_parallel();
  if (!par) {
    // No OpenMP region around the calls, not even an inactive one: inside it, OpenBLAS's own
    // parallel GEMM is a nested region and gets a fresh team of threads at every call (a
    // linear layer's single GEMM ran measurably slower that way: apps/bench/README.md).
    for (int64_t i = 0; i < batch; ++i) one(i);
    return;
  }
#pragma omp parallel for schedule(static) num_threads(threads)
  for (int64_t i = 0; i < batch; ++i) one(i);
}

}  // namespace

// out [batch..., M, N] (+)= alpha a [batch..., M, K] @ b [batch..., K, N]; out's matrices row-major.
void matmul(const Tensor& a, const Tensor& b, const Tensor& out, double alpha, bool accumulate) {
  const int64_t M = out.size(-2), N = out.size(-1), K = a.size(-1);
  if (out.numel() == 0) return;
  if (K == 0) {
    if (!accumulate) fill(out, 0.0);  // an empty sum
    return;
  }
  const int64_t batch = out.numel() / (M * N);
  const MatLayout la = matmul_layout(a), lb = matmul_layout(b), lc = matmul_layout(out);
  LINEA_CHECK(!lc.trans || M <= 1, "matmul: the output's matrices must be row-major, got strides ",
              shape_str(out.strides()));
  const std::vector<int64_t> offa = batch_offsets(a, batch), offb = batch_offsets(b, batch),
                             offc = batch_offsets(out, batch);
  LINEA_DISPATCH_FLOAT(out.dtype(), "matmul", [&] {
    batched_gemm<scalar_t>(a.data<scalar_t>(), b.data<scalar_t>(), out.data<scalar_t>(), la, lb, lc.ld, M, N, K, batch,
                           offa, offb, offc, alpha, accumulate ? 1.0 : 0.0);
  });
}

namespace {
Tensor transposed(const Tensor& t) {
  return as_strided(t, {t.size(1), t.size(0)}, {t.stride(1), t.stride(0)}, t.offset());
}
}  // namespace

// out [R, N] = x [R, K] @ w^T + b: the GEMM, then the bias added row by row (as the composed
// matmul + add computed it)
void linear(const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& out) {
  matmul(x, transposed(w), out, 1.0, false);
  if (!b.defined() || out.numel() == 0) return;
  const int64_t R = out.size(0), N = out.size(1);
  dispatch_float(out.dtype(), "linear", [&](auto tag_) {
    using T = decltype(tag_);
    T* o = out.data<T>();
    const T* pb = b.data<T>();
#pragma omp parallel for schedule(static) if (R * N >= detail::kParallelGrain)
    for (int64_t r = 0; r < R; ++r)
      for (int64_t j = 0; j < N; ++j) o[r * N + j] = o[r * N + j] + pb[j];
  });
}

// dw [N, K] = g^T @ x; db [N] = sums of g [R, N] over its rows
void linear_weight_grad(const Tensor& g, const Tensor& x, const Tensor& dw, const Tensor& db) {
  matmul(transposed(g), x, dw, 1.0, false);
  if (db.defined()) reduce(ReduceOp::Sum, g, db, 1, g.size(0), g.size(1));
}

}  // namespace linea::cpu
