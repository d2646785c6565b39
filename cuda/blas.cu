// CUDA matmul (linea::cuda::matmul) on cuBLAS: one library call per matmul, whatever the
// layout of its batch dims, with alpha (the attention's 1/sqrt(D) folded into the GEMM) and an
// output whose matrices are row-major but whose batch dims may be strided (a gradient written
// straight in the layout of its input).
//  - Batch dims that collapse to one uniform stride per operand (stride 0 included: a broadcast
//    operand): cublasGemmStridedBatchedEx.
//  - A shared right operand with a row-major stack of left matrices: one plain GEMM, the batch
//    folded into M.
//  - Anything else (attention's q, k, v [B, H, N, D] viewed from [B, N, H, D], whose B and H
//    strides do not collapse): cublasGemmBatchedEx over arrays of pointers that one small kernel
//    writes into scratch device memory, so nothing is copied from the host and the pair can be
//    captured in a CUDA graph.
// And the linear layer's GEMMs with an epilogue, on cuBLASLt (linear: out = x @ w^T + b with
// the bias added by the GEMM; linear_weight_grad: dw = g^T @ x with db, the column sums of g,
// reduced by the same call), so a Linear costs one call forward and two backward. Plans
// (descriptors and the heuristic's algorithm) are cached by shape; where cuBLASLt offers no
// algorithm the plain GEMM and a separate kernel do the work.
// Transposed (column-major) operands are passed as CUBLAS_OP_T with their leading dimension,
// never copied. The row-major/column-major swap is done in one place, gemm_call() below (and
// lt_call() for cuBLASLt).
// Float32 GEMMs run at the precision set by linea::set_matmul_precision (core/precision.h):
// full float32 by default, as the CPU; TF32 or bf16 on the tensor cores with float32
// accumulation when asked. Float64 is always full precision.
// Not here: argument checks, 1-D promotion, broadcasting and copies of unsupported layouts
// (raw::matmul in core/ops_nn.cpp), and any autograd.
#include <cublasLt.h>

#include <climits>
#include <map>
#include <mutex>
#include <tuple>
#include <vector>

#include "core/cuda_interface.h"
#include "core/kernels.h"
#include "core/matmul_layout.h"
#include "core/precision.h"
#include "cuda/common.cuh"
#include "cuda/cublas_library.h"

namespace linea::cuda {

using namespace linea::cuda::detail;

namespace {

using linea::detail::MatLayout;
using linea::detail::matmul_layout;

template <typename T> struct Gemm;
template <> struct Gemm<float> {
  static constexpr cudaDataType_t type = CUDA_R_32F;
  static cublasComputeType_t compute() {
    switch (matmul_precision()) {
      case MatmulPrecision::TF32:
        return CUBLAS_COMPUTE_32F_FAST_TF32;
      case MatmulPrecision::BF16:
        return CUBLAS_COMPUTE_32F_FAST_16BF;
      default:
        return CUBLAS_COMPUTE_32F;
    }
  }
};
template <> struct Gemm<double> {
  static constexpr cudaDataType_t type = CUDA_R_64F;
  static cublasComputeType_t compute() { return CUBLAS_COMPUTE_64F; }
};

int as_int(int64_t v, const char* what) {
  LINEA_CHECK(v >= 0 && v <= INT_MAX, "matmul: ", what, " = ", v, " is too large for cuBLAS (int32)");
  return static_cast<int>(v);
}

// One GEMM call in row-major terms: C [M, N] = alpha A [M, K] @ B [K, N] for `count` products,
// the i-th at a + i*sa, b + i*sb, c + i*sc (strided; C's rows ldc apart), or at the pointers of
// the device arrays pa, pb, pc (pointer-array batched; a, b, c unused).
//
// The one place where row-major meets cuBLAS's column-major convention. Row-major C [M, N]
// (ldc) read column-major is C^T [N, M], so we ask cuBLAS for
//   C^T [N, M] = B^T [N, K] @ A^T [K, M]      (cuBLAS m = N, n = M, k = K; its "A" is our b).
// An operand X [R, C] stored row-major (stride (ld, 1)) reads column-major as X^T with that
// ld: CUBLAS_OP_N yields X^T. Stored column-major (stride (1, ld)) it reads as X: CUBLAS_OP_T
// yields X^T.
template <typename T>
void gemm_call(const T* a, MatLayout la, int64_t sa, const T* b, MatLayout lb, int64_t sb, T* c, int64_t ldc_,
               int64_t sc, int64_t M, int64_t N, int64_t K, int64_t count, double alpha, const T* const* pa = nullptr,
               const T* const* pb = nullptr, T* const* pc = nullptr, double beta = 0.0) {
  const cublasOperation_t op_b = lb.trans ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_a = la.trans ? CUBLAS_OP_T : CUBLAS_OP_N;
  const int m = as_int(N, "N"), n = as_int(M, "M"), k = as_int(K, "K"), batch = as_int(count, "batch");
  const int lda = as_int(lb.ld, "ld(b)"), ldb = as_int(la.ld, "ld(a)"), ldc = as_int(ldc_, "ld(out)");
  // alpha and beta in the compute type's scalar type: float for the 32F types, double for 64F.
  const T al = static_cast<T>(alpha), be = static_cast<T>(beta);
  constexpr cudaDataType_t type = Gemm<T>::type;
  const cublasComputeType_t compute = Gemm<T>::compute();
  count_work(counter_cells().library_calls);
  if (pa != nullptr) {
    LINEA_CUBLAS_CHECK(cublas_api().cublasGemmBatchedEx(
        cublas(), op_b, op_a, m, n, k, &al, reinterpret_cast<const void* const*>(pb), type, lda,
        reinterpret_cast<const void* const*>(pa), type, ldb, &be, reinterpret_cast<void* const*>(pc), type, ldc, batch,
        compute, CUBLAS_GEMM_DEFAULT));
    return;
  }
  LINEA_CUBLAS_CHECK(cublas_api().cublasGemmStridedBatchedEx(cublas(), op_b, op_a, m, n, k, &al, b, type, lda, sb, a,
                                                             type, ldb, sa, &be, c, type, ldc, sc, batch, compute,
                                                             CUBLAS_GEMM_DEFAULT));
}

// The pointers of product i of a batch of `count`: a, b and c at their batch offsets (the
// calculator over the batch dims).
template <typename T>
__global__ void batch_pointers_kernel(const T* a, const T* b, T* c, OffsetCalc<3> oc, int64_t count, const T** pa,
                                      const T** pb, T** pc) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t off[3];
    oc.get(i, off);
    pa[i] = a + off[0];
    pb[i] = b + off[1];
    pc[i] = c + off[2];
  }
}

template <typename T> void matmul_impl(const Tensor& a, const Tensor& b, const Tensor& out, double alpha, double beta) {
  const int64_t M = out.size(-2), N = out.size(-1), K = a.size(-1);
  const MatLayout la = matmul_layout(a), lb = matmul_layout(b), lc = matmul_layout(out);
  LINEA_CHECK(!lc.trans || M <= 1, "matmul: the output's matrices must be row-major, got strides ",
              shape_str(out.strides()));
  const T* pa = cptr<T>(a);
  const T* pb = cptr<T>(b);
  T* pc = ptr<T>(out);

  // Batch dims (all but the last two; a and b already expanded to out's): the calculator
  // drops size-1 dims and merges the ones that collapse in all three operands.
  const Shape batch(out.shape().begin(), out.shape().end() - 2);
  const Strides sa(a.strides().begin(), a.strides().end() - 2), sb(b.strides().begin(), b.strides().end() - 2),
      sc(out.strides().begin(), out.strides().end() - 2);
  const int64_t count = shape_numel(batch);
  bool unused = false;
  const OffsetCalc<3> oc = make_offset_calc<3>(batch, {&sa, &sb, &sc}, "matmul", &unused);

  if (oc.ndim == 1) {  // one uniform stride per operand (or no batch at all)
    const int64_t stride_a = count > 1 ? oc.strides[0][0] : 0, stride_b = count > 1 ? oc.strides[1][0] : 0,
                  stride_c = count > 1 ? oc.strides[2][0] : 0;
    if (count > 1 && stride_b == 0 && !la.trans && stride_a == M * la.ld && stride_c == M * lc.ld) {
      // A shared right operand and a row-major stack of left matrices: one GEMM of M * count rows.
      gemm_call<T>(pa, la, 0, pb, lb, 0, pc, lc.ld, 0, M * count, N, K, 1, alpha, nullptr, nullptr, nullptr, beta);
    } else {
      gemm_call<T>(pa, la, stride_a, pb, lb, stride_b, pc, lc.ld, stride_c, M, N, K, count, alpha, nullptr, nullptr,
                   nullptr, beta);
    }
    return;
  }
  // Pointer arrays for the batch, written on the device by one kernel into scratch memory
  // (freed at once: the GEMM after it on the stream reads them first).
  DeviceBuffer arrays(3 * sizeof(void*) * static_cast<size_t>(count));
  const T** arr_a = arrays.as<const T*>();
  const T** arr_b = arr_a + count;
  T** arr_c = arrays.as<T*>() + 2 * count;
  batch_pointers_kernel<T><<<grid_for(count), kBlockSize, 0, stream()>>>(pa, pb, pc, oc, count, arr_a, arr_b, arr_c);
  LINEA_KERNEL_LAUNCH_CHECK();
  gemm_call<T>(nullptr, la, 0, nullptr, lb, 0, nullptr, lc.ld, 0, M, N, K, count, alpha, arr_a, arr_b, arr_c, beta);
}

// A 2-D tensor's transpose, as a view.
Tensor transposed(const Tensor& t) {
  return as_strided(t, {t.size(1), t.size(0)}, {t.stride(1), t.stride(0)}, t.offset());
}

// ---- cuBLASLt: GEMMs with an epilogue ---------------------------------------------------------------
// The epilogues Linea uses: the bias added to every row of the output, or the bias gradient
// (the sums over the reduced dim of the left operand's transpose, see matmul_bias_grad).
enum class Epilogue { Bias, BiasGrad };

struct LtContext {
  std::mutex mu;
  cublasLtHandle_t handle = nullptr;
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
  // One plan per shape: the descriptors and the heuristic's algorithm (absent: none offered).
  struct Plan {
    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatrixLayout_t la = nullptr, lb = nullptr, lc = nullptr;
    bool have_algo = false;
    cublasLtMatmulAlgo_t algo{};
  };
  std::map<std::tuple<int, int, int, int, int, int, int, int, int, int, int>, Plan> plans;
};

LtContext& lt() {
  static LtContext* ctx = [] {
    auto* c = new LtContext();  // leaked, like the other handles
    stream();                   // the device selected (or a clear error) before the handle is made
    LINEA_CUBLAS_CHECK(cublas_api().cublasLtCreate(&c->handle));
    const BlasWorkspace w = blas_workspace();
    c->workspace = w.p;
    c->workspace_bytes = w.bytes;
    return c;
  }();
  return *ctx;
}

// Float32 GEMM on cuBLASLt, column-major: D [m, n] = op_a(A) [m, k] @ op_b(B) [k, n] with the
// epilogue (vector: the bias [m], or the bias gradient [n] = sums over k of op_b(B)). Returns
// false, having done nothing, when cuBLASLt offers no algorithm for it.
bool lt_call(cublasOperation_t op_a, cublasOperation_t op_b, int m, int n, int k, const float* A, int lda,
             const float* B, int ldb, float* D, int ldd, Epilogue epi, float* vector) {
  LtContext& c = lt();
  const CublasApi& api = cublas_api();
  std::lock_guard<std::mutex> lock(c.mu);
  const cublasComputeType_t compute = Gemm<float>::compute();
  // The heuristic's choice depends on the pointers' alignment too (a view may start anywhere).
  const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0 ? 1 : 0; };
  const int alignment = aligned(A) | aligned(B) << 1 | aligned(D) << 2 | aligned(vector) << 3;
  const auto key = std::make_tuple(int(op_a), int(op_b), m, n, k, lda, ldb, ldd, int(epi), int(compute), alignment);
  auto it = c.plans.find(key);
  if (it == c.plans.end()) {
    LtContext::Plan p;
    LINEA_CUBLAS_CHECK(api.cublasLtMatmulDescCreate(&p.desc, compute, CUDA_R_32F));
    const int32_t ta = op_a, tb = op_b;
    LINEA_CUBLAS_CHECK(api.cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
    LINEA_CUBLAS_CHECK(api.cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
    const uint32_t e = epi == Epilogue::Bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_BGRADB;
    LINEA_CUBLAS_CHECK(api.cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &e, sizeof(e)));
    // The heuristic looks at the vector's alignment: give it the one this call has.
    LINEA_CUBLAS_CHECK(
        api.cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &vector, sizeof(vector)));
    const bool na = op_a == CUBLAS_OP_N, nb = op_b == CUBLAS_OP_N;
    LINEA_CUBLAS_CHECK(api.cublasLtMatrixLayoutCreate(&p.la, CUDA_R_32F, na ? m : k, na ? k : m, lda));
    LINEA_CUBLAS_CHECK(api.cublasLtMatrixLayoutCreate(&p.lb, CUDA_R_32F, nb ? k : n, nb ? n : k, ldb));
    LINEA_CUBLAS_CHECK(api.cublasLtMatrixLayoutCreate(&p.lc, CUDA_R_32F, m, n, ldd));
    // The pointers' alignment (PyTorch's gemm_and_bias does the same): the heuristic may not
    // assume more than the call has.
    cublasLtMatmulPreference_t pref = nullptr;
    LINEA_CUBLAS_CHECK(api.cublasLtMatmulPreferenceCreate(&pref));
    LINEA_CUBLAS_CHECK(api.cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                                &c.workspace_bytes, sizeof(c.workspace_bytes)));
    const cublasLtMatmulPreferenceAttributes_t attrs[4] = {
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES};
    const int bits[4] = {0, 1, 2, 2};
    for (int i = 0; i < 4; ++i) {
      const uint32_t bytes = (alignment >> bits[i]) & 1 ? 16 : 4;
      LINEA_CUBLAS_CHECK(api.cublasLtMatmulPreferenceSetAttribute(pref, attrs[i], &bytes, sizeof(bytes)));
    }
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    const cublasStatus_t st =
        api.cublasLtMatmulAlgoGetHeuristic(c.handle, p.desc, p.la, p.lb, p.lc, p.lc, pref, 1, &result, &found);
    (void)api.cublasLtMatmulPreferenceDestroy(pref);
    p.have_algo = st == CUBLAS_STATUS_SUCCESS && found > 0 && result.state == CUBLAS_STATUS_SUCCESS;
    if (p.have_algo) p.algo = result.algo;
    it = c.plans.emplace(key, p).first;
  }
  const LtContext::Plan& p = it->second;
  if (!p.have_algo) return false;
  LINEA_CUBLAS_CHECK(
      api.cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &vector, sizeof(vector)));
  const float one = 1.0f, zero = 0.0f;
  count_work(counter_cells().library_calls);
  LINEA_CUBLAS_CHECK(api.cublasLtMatmul(c.handle, p.desc, &one, A, p.la, B, p.lb, &zero, D, p.lc, D, p.lc, &p.algo,
                                        c.workspace, c.workspace_bytes, stream()));
  return true;
}

// out [rows, N] += bias [N] (row broadcast), in place: the fallback of linear.
template <typename T> __global__ void add_bias_kernel(T* out, const T* bias, int64_t rows, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < rows * n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    out[i] = out[i] + bias[i % n];
}

}  // namespace

namespace detail {
template <typename T>
void gemm_strided(const T* a, bool a_trans, int64_t lda, int64_t sa, const T* b, bool b_trans, int64_t ldb, int64_t sb,
                  T* c, int64_t ldc, int64_t sc, int64_t M, int64_t N, int64_t K, int64_t count, double alpha,
                  double beta) {
  gemm_call<T>(a, MatLayout{a_trans, lda}, sa, b, MatLayout{b_trans, ldb}, sb, c, ldc, sc, M, N, K, count, alpha,
               nullptr, nullptr, nullptr, beta);
}
template void gemm_strided<float>(const float*, bool, int64_t, int64_t, const float*, bool, int64_t, int64_t, float*,
                                  int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, double, double);
template void gemm_strided<double>(const double*, bool, int64_t, int64_t, const double*, bool, int64_t, int64_t,
                                   double*, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, double, double);
}  // namespace detail

// out [R, N] = x [R, K] @ w^T + b; w [N, K] contiguous, b [N] or undefined, out contiguous
void linear(const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& out) {
  const int64_t R = x.size(0), K = x.size(1), N = w.size(0);
  if (out.numel() == 0) return;
  const Tensor wt = transposed(w);  // [K, N], column-major
  if (b.defined() && out.dtype() == DType::Float32 && K > 0) {
    const MatLayout lx = matmul_layout(x);
    // Row-major out = x @ w^T is column-major out^T [N, R] = w [N, K] @ x^T [K, R] (see
    // gemm_call): cuBLASLt's A is w (stored [N, K] row-major = column-major [K, N]: op T), its
    // B is x^T; the bias has one value per row of out^T.
    if (lt_call(CUBLAS_OP_T, lx.trans ? CUBLAS_OP_T : CUBLAS_OP_N, as_int(N, "N"), as_int(R, "R"), as_int(K, "K"),
                cptr<float>(w), as_int(K, "K"), cptr<float>(x), as_int(lx.ld, "ld(x)"), ptr<float>(out), as_int(N, "N"),
                Epilogue::Bias, const_cast<float*>(cptr<float>(b))))
      return;
  }
  matmul(x, wt, out, 1.0, false);
  if (!b.defined()) return;
  LINEA_DISPATCH_FLOAT(out.dtype(), "linear", [&] {
    add_bias_kernel<scalar_t>
        <<<grid_for(R * N), kBlockSize, 0, stream()>>>(ptr<scalar_t>(out), cptr<scalar_t>(b), R, N);
    LINEA_KERNEL_LAUNCH_CHECK();
  });
}

// dw [N, K] = g^T @ x; db [N] = sums of g over its rows, or undefined; g [R, N] contiguous
void linear_weight_grad(const Tensor& g, const Tensor& x, const Tensor& dw, const Tensor& db) {
  const int64_t R = g.size(0), N = g.size(1), K = x.size(1);
  if (dw.numel() == 0 && (!db.defined() || db.numel() == 0)) return;
  if (db.defined() && dw.dtype() == DType::Float32 && R > 0 && dw.numel() > 0) {
    const MatLayout lx = matmul_layout(x);
    // Column-major dw^T [K, N] = x^T [K, R] @ g [R, N]: cuBLASLt's A is x^T (x row-major
    // [R, K] reads column-major as x^T [K, R]: op N), its B is g (row-major [R, N] reads as g^T
    // [N, R]: op T gives g [R, N]), and the sums of B over k = R are the bias gradient (BGRADB).
    if (lt_call(lx.trans ? CUBLAS_OP_T : CUBLAS_OP_N, CUBLAS_OP_T, as_int(K, "K"), as_int(N, "N"), as_int(R, "R"),
                cptr<float>(x), as_int(lx.ld, "ld(x)"), cptr<float>(g), as_int(N, "N"), ptr<float>(dw), as_int(K, "K"),
                Epilogue::BiasGrad, ptr<float>(db)))
      return;
  }
  matmul(transposed(g), x, dw, 1.0, false);
  if (db.defined()) reduce(ReduceOp::Sum, g, db, 1, R, N);
}

// out [batch..., M, N] (+)= alpha a [batch..., M, K] @ b [batch..., K, N]; out's matrices row-major
void matmul(const Tensor& a, const Tensor& b, const Tensor& out, double alpha, bool accumulate) {
  LINEA_CHECK(a.dim() >= 2 && a.dim() == b.dim() && a.dim() == out.dim() && a.size(-1) == b.size(-2) &&
                  a.size(-2) == out.size(-2) && b.size(-1) == out.size(-1),
              "matmul: shapes do not match: a ", shape_str(a.shape()), ", b ", shape_str(b.shape()), ", out ",
              shape_str(out.shape()));
  if (out.numel() == 0) return;
  if (a.size(-1) == 0) {
    if (!accumulate) fill(out, 0.0);  // an empty sum
    return;
  }
  LINEA_DISPATCH_FLOAT(out.dtype(), "matmul", [&] { matmul_impl<scalar_t>(a, b, out, alpha, accumulate ? 1.0 : 0.0); });
}

}  // namespace linea::cuda
