// CUDA matmul (linea::cuda::matmul) on cuBLAS: cublas{S,D}gemmStridedBatched over the batch
// dims that collapse to one uniform stride per operand (stride 0 included: a broadcast
// operand), a loop of such calls over the batch dims that do not, and one plain GEMM with
// the batch folded into M when the right operand is shared and the left one is a row-major
// stack of matrices. Transposed (column-major) operands are passed as CUBLAS_OP_T with their
// leading dimension, never copied. The row-major/column-major swap is done in one place,
// gemm_rowmajor() below. Float32 runs in full precision (no TF32), as the CPU does.
// Not here: argument checks, 1-D promotion, broadcasting and copies of unsupported layouts
// (raw::matmul in core/ops_nn.cpp), and any autograd.
#include <climits>
#include <vector>

#include "core/kernels.h"
#include "core/matmul_layout.h"
#include "cuda/common.cuh"

namespace linea::cuda {

using namespace linea::cuda::detail;

namespace {

using linea::detail::MatLayout;
using linea::detail::matmul_layout;

inline cublasStatus_t gemm_strided_batched(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n,
                                           int k, const float* A, int lda, long long sA, const float* B, int ldb,
                                           long long sB, float* C, int ldc, long long sC, int count) {
  const float one = 1.0f, zero = 0.0f;
  return cublasSgemmStridedBatched(h, ta, tb, m, n, k, &one, A, lda, sA, B, ldb, sB, &zero, C, ldc, sC, count);
}
inline cublasStatus_t gemm_strided_batched(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n,
                                           int k, const double* A, int lda, long long sA, const double* B, int ldb,
                                           long long sB, double* C, int ldc, long long sC, int count) {
  const double one = 1.0, zero = 0.0;
  return cublasDgemmStridedBatched(h, ta, tb, m, n, k, &one, A, lda, sA, B, ldb, sB, &zero, C, ldc, sC, count);
}

int as_int(int64_t v, const char* what) {
  LINEA_CHECK(v >= 0 && v <= INT_MAX, "matmul: ", what, " = ", v, " is too large for cuBLAS (int32)");
  return static_cast<int>(v);
}

// The one place where row-major meets cuBLAS's column-major convention.
// Row-major C [M, N] (ldc = N) read column-major is C^T [N, M], so we ask cuBLAS for
//   C^T [N, M] = B^T [N, K] @ A^T [K, M]      (cuBLAS m = N, n = M, k = K; its "A" is our b).
// An operand X [R, C] stored row-major (stride (ld, 1)) reads column-major as X^T with that
// ld: CUBLAS_OP_N yields X^T. Stored column-major (stride (1, ld)) it reads as X: CUBLAS_OP_T
// yields X^T. `count` products, the i-th at a + i*sa, b + i*sb, c + i*M*N.
template <typename T>
void gemm_rowmajor(const T* a, MatLayout la, int64_t sa, const T* b, MatLayout lb, int64_t sb, T* c, int64_t M,
                   int64_t N, int64_t K, int64_t count) {
  const cublasOperation_t op_b = lb.trans ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_a = la.trans ? CUBLAS_OP_T : CUBLAS_OP_N;
  LINEA_CUBLAS_CHECK(gemm_strided_batched(cublas(), op_b, op_a, as_int(N, "N"), as_int(M, "M"), as_int(K, "K"), b,
                                          as_int(lb.ld, "ld(b)"), sb, a, as_int(la.ld, "ld(a)"), sa, c, as_int(N, "N"),
                                          M * N, as_int(count, "batch")));
}

template <typename T> void matmul_impl(const Tensor& a, const Tensor& b, const Tensor& out) {
  const int64_t M = out.size(-2), N = out.size(-1), K = a.size(-1);
  const MatLayout la = matmul_layout(a), lb = matmul_layout(b);
  const T* pa = cptr<T>(a);
  const T* pb = cptr<T>(b);
  T* pc = ptr<T>(out);

  // Batch dims (all but the last two; a and b already expanded to out's). The innermost ones
  // that collapse to one stride per operand become the strided batch of each call.
  const int64_t nb = out.dim() - 2;
  int64_t inner_count = 1, sa = 0, sb = 0;
  int64_t d = nb - 1;
  bool started = false;
  for (; d >= 0; --d) {
    const int64_t n = out.size(d);
    if (n == 1) continue;
    if (!started) {
      sa = a.stride(d);
      sb = b.stride(d);
      inner_count = n;
      started = true;
    } else if (a.stride(d) == sa * inner_count && b.stride(d) == sb * inner_count) {
      inner_count *= n;
    } else {
      break;
    }
  }
  const int64_t outer_dims = d + 1;  // dims [0, outer_dims) are looped over
  int64_t outer_count = 1;
  for (int64_t e = 0; e < outer_dims; ++e) outer_count *= out.size(e);

  // One GEMM for a shared right operand and a row-major stack of left matrices.
  if (outer_count == 1 && inner_count > 1 && sb == 0 && !la.trans && sa == M * la.ld) {
    gemm_rowmajor(pa, la, 0, pb, lb, 0, pc, M * inner_count, N, K, 1);
    return;
  }

  // Odometer over the outer batch dims.
  std::vector<int64_t> idx(static_cast<size_t>(outer_dims), 0);
  int64_t off_a = 0, off_b = 0;
  for (int64_t t = 0; t < outer_count; ++t) {
    gemm_rowmajor(pa + off_a, la, sa, pb + off_b, lb, sb, pc + t * inner_count * M * N, M, N, K, inner_count);
    for (int64_t e = outer_dims - 1; e >= 0; --e) {
      off_a += a.stride(e);
      off_b += b.stride(e);
      if (++idx[static_cast<size_t>(e)] < out.size(e)) break;
      off_a -= a.stride(e) * out.size(e);
      off_b -= b.stride(e) * out.size(e);
      idx[static_cast<size_t>(e)] = 0;
    }
  }
}

}  // namespace

// a [batch..., M, K] @ b [batch..., K, N] -> out [batch..., M, N] (contiguous)
void matmul(const Tensor& a, const Tensor& b, const Tensor& out) {
  LINEA_CHECK(a.dim() >= 2 && a.dim() == b.dim() && a.dim() == out.dim() && a.size(-1) == b.size(-2) &&
                  a.size(-2) == out.size(-2) && b.size(-1) == out.size(-1),
              "matmul: shapes do not match: a ", shape_str(a.shape()), ", b ", shape_str(b.shape()), ", out ",
              shape_str(out.shape()));
  LINEA_CHECK(out.is_contiguous(), "matmul: expected a contiguous output");
  if (out.numel() == 0) return;
  if (a.size(-1) == 0) {
    fill(out, 0.0);
    return;
  }
  LINEA_DISPATCH_FLOAT(out.dtype(), "matmul", [&] { matmul_impl<scalar_t>(a, b, out); });
}

}  // namespace linea::cuda
