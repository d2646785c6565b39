// cuBLAS and cuBLASLt, opened on first use (dlopen) instead of linked. Loading libcublasLt runs
// its static initializers, about half a second of CPU time; linked, every program built on Linea
// paid that at start, GPU or not: each ctest case, an app's --help (twice: the apps restart
// themselves, apps/common/process_env.h). cuFFT, cuRAND and NCCL load in milliseconds and stay
// linked.
//
//   LINEA_CUBLAS_CHECK(cublas_api().cublasCreate(&handle));
//
// Each pointer has the type of cuBLAS's own declaration of the function. Internal to cuda/.
#pragma once

#include <cublasLt.h>
#include <cublas_v2.h>

namespace linea::cuda::detail {

// The functions Linea calls (names as cublas_v2.h maps them: cublasCreate is cublasCreate_v2).
#define LINEA_CUBLAS_FUNCTIONS(X)         \
  X(cublasCreate)                         \
  X(cublasSetStream)                      \
  X(cublasSetMathMode)                    \
  X(cublasSetWorkspace)                   \
  X(cublasGetStatusName)                  \
  X(cublasGetStatusString)                \
  X(cublasLtCreate)                       \
  X(cublasLtMatmulDescCreate)             \
  X(cublasLtMatmulDescSetAttribute)       \
  X(cublasLtMatrixLayoutCreate)           \
  X(cublasLtMatmulPreferenceCreate)       \
  X(cublasLtMatmulPreferenceSetAttribute) \
  X(cublasLtMatmulPreferenceDestroy)      \
  X(cublasLtMatmulAlgoGetHeuristic)       \
  X(cublasLtMatmul)

// cuBLAS overloads these two in C++ (a legacy compute-type argument), so decltype cannot name them:
// the types of their C declarations.
#define LINEA_CUBLAS_OVERLOADED(X) X(cublasGemmBatchedEx) X(cublasGemmStridedBatchedEx)
using CublasGemmBatchedEx = cublasStatus_t (*)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int,
                                               const void*, const void* const[], cudaDataType, int, const void* const[],
                                               cudaDataType, int, const void*, void* const[], cudaDataType, int, int,
                                               cublasComputeType_t, cublasGemmAlgo_t);
using CublasGemmStridedBatchedEx = cublasStatus_t (*)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int,
                                                      int, const void*, const void*, cudaDataType, int, long long,
                                                      const void*, cudaDataType, int, long long, const void*, void*,
                                                      cudaDataType, int, long long, int, cublasComputeType_t,
                                                      cublasGemmAlgo_t);

struct CublasApi {
#define LINEA_CUBLAS_POINTER(name) decltype(&::name) name = nullptr;
  LINEA_CUBLAS_FUNCTIONS(LINEA_CUBLAS_POINTER)
#undef LINEA_CUBLAS_POINTER
  CublasGemmBatchedEx cublasGemmBatchedEx = nullptr;
  CublasGemmStridedBatchedEx cublasGemmStridedBatchedEx = nullptr;
};

// Opens libcublas.so.<major> (which brings libcublasLt) on the first call: by its name (the
// loader's search: LD_LIBRARY_PATH, the system's cache), then in the toolkit's library folder
// the build found. Throws linea::Error naming the library when it cannot be opened.
const CublasApi& cublas_api();

}  // namespace linea::cuda::detail
