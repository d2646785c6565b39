// The apps' and benchmarks' environment settings (see process_env.h).
#include "apps/common/process_env.h"

#include <unistd.h>

#include <cstdlib>
#include <string>

#include "core/runtime.h"

namespace linea::apps {

void tune_process(char** argv, bool short_openmp_spin) {
  bool changed = false;
  if (short_openmp_spin && std::getenv("OMP_WAIT_POLICY") == nullptr && std::getenv("GOMP_SPINCOUNT") == nullptr)
    changed = setenv("GOMP_SPINCOUNT", "10000", /*overwrite=*/0) == 0 || changed;
  if (std::getenv("OPENBLAS_CORETYPE") == nullptr) {
    const std::string kernels = fitting_blas_kernels();
    if (!kernels.empty()) changed = setenv("OPENBLAS_CORETYPE", kernels.c_str(), /*overwrite=*/0) == 0 || changed;
  }
  if (changed) execv("/proc/self/exe", argv);  // returns only on failure: go on as we are
}

}  // namespace linea::apps
