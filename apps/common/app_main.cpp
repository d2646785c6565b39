// The apps' start and failure path (see app_main.h).
#include "apps/common/app_main.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <thread>

#include "apps/common/interrupt.h"
#include "apps/common/process_env.h"
#include "core/runtime.h"
#include "nn/dist.h"

namespace linea::apps {

void start_app(char** argv) {
  tune_process(argv);
  dist::init();
  // Only rank 0 prints progress and results; the others' stdout goes nowhere (stderr stays).
  if (dist::rank() != 0 && std::getenv("LINEA_DIST_ALL_STDOUT") == nullptr) {
    if (std::freopen("/dev/null", "w", stdout) == nullptr) std::perror("start_app: /dev/null");
  }
  if (dist::local_size() > 1 && std::getenv("OMP_NUM_THREADS") == nullptr) {
    const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    set_num_threads(std::max(1, cores / dist::local_size()));
  }
}

int fail(const std::exception& e) {
  // An interrupted run saved its checkpoint on every rank: not an error, and no abort.
  if (const auto* i = dynamic_cast<const Interrupted*>(&e)) {
    if (dist::rank() == 0) std::fprintf(stderr, "%s\n", i->what());
    return i->exit_code();
  }
  if (dist::world_size() > 1) dist::abort_job("error", e.what(), 1);
  std::fprintf(stderr, "error: %s\n", e.what());
  return 1;
}

}  // namespace linea::apps
