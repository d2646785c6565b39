// The OpenMP spin-wait setting of the apps (see openmp_wait.h).
#include "apps/common/openmp_wait.h"

#include <unistd.h>

#include <cstdlib>

namespace linea::apps {

void shorten_openmp_spin(char** argv) {
  if (std::getenv("OMP_WAIT_POLICY") != nullptr || std::getenv("GOMP_SPINCOUNT") != nullptr) return;
  if (setenv("GOMP_SPINCOUNT", "10000", /*overwrite=*/0) != 0) return;
  execv("/proc/self/exe", argv);  // returns only on failure: go on as we are
}

}  // namespace linea::apps
