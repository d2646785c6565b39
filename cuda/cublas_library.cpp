// Opening cuBLAS on first use (see cublas_library.h).
#include "cuda/cublas_library.h"

#include <dlfcn.h>

#include <string>

#include "core/error.h"

namespace linea::cuda::detail {

namespace {

// The exported name: the argument is macro-expanded first (cublasCreate -> cublasCreate_v2).
#define LINEA_SYMBOL_NAME(name) LINEA_SYMBOL_TEXT(name)
#define LINEA_SYMBOL_TEXT(name) #name

#ifndef LINEA_CUDA_EMULATOR
void* open_cublas() {
  const std::string soname = "libcublas.so." + std::to_string(CUBLAS_VER_MAJOR);
  void* lib = dlopen(soname.c_str(), RTLD_NOW | RTLD_LOCAL);
#ifdef LINEA_CUDA_LIBRARY_DIR
  if (lib == nullptr) lib = dlopen((std::string(LINEA_CUDA_LIBRARY_DIR) + "/" + soname).c_str(), RTLD_NOW | RTLD_LOCAL);
#endif
  if (lib == nullptr) {
    const char* why = dlerror();
    LINEA_FAIL("cuda: cannot load cuBLAS (", soname, "): ", why ? why : "not found",
               "; add the CUDA toolkit's lib folder to LD_LIBRARY_PATH");
  }
  return lib;
}
#endif

}  // namespace

const CublasApi& cublas_api() {
  static const CublasApi api = [] {
    CublasApi a;
#ifdef LINEA_CUDA_EMULATOR
    // tests/cuda_emu links its host fakes of these functions into the test binaries (the
    // assignment checks the overloaded ones' types against cuBLAS's declarations).
#define LINEA_CUBLAS_BIND(name) a.name = &::name;
#else
    void* lib = open_cublas();  // never closed: the handles made from it live as long as the process
#define LINEA_CUBLAS_BIND(name)                                                     \
  a.name = reinterpret_cast<decltype(a.name)>(dlsym(lib, LINEA_SYMBOL_NAME(name))); \
  LINEA_CHECK(a.name != nullptr, "cuda: cuBLAS has no ", LINEA_SYMBOL_NAME(name),   \
              " (older than the headers Linea was built with?)");
#endif
    LINEA_CUBLAS_FUNCTIONS(LINEA_CUBLAS_BIND)
    LINEA_CUBLAS_OVERLOADED(LINEA_CUBLAS_BIND)
#undef LINEA_CUBLAS_BIND
    return a;
  }();
  return api;
}

}  // namespace linea::cuda::detail
