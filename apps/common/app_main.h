// What every app's main() does first and when it fails.
//
//   int main(int argc, char** argv) {
//     linea::apps::start_app(argv);  // first: may restart the process, then joins an MPI job
//     ... parse flags ...
//     try { ... } catch (const std::exception& e) { return linea::apps::fail(e); }
//   }
//
// start_app sets OpenMP's spin-waiting and OpenBLAS's kernels (process_env.h; may restart the
// process, so it comes first), then starts linea::dist (nn/dist.h): under `mpirun -np N` the process becomes one rank
// of N, otherwise it stays single-process. With several ranks on one machine and no
// OMP_NUM_THREADS set, each rank takes its share of the cores (cores / ranks on the machine, at
// least 1), so N ranks do not oversubscribe them; --threads still overrides. Only rank 0's
// stdout is kept (LINEA_DIST_ALL_STDOUT=1 keeps every rank's); errors go to stderr from any rank.
// fail prints "error: <message>" and returns 1 (an Interrupted run, apps/common/interrupt.h:
// its message and 128 + the signal); with several ranks it names the rank and ends
// the whole job (MPI_Abort), so that the others do not wait for it forever.
#pragma once

#include <exception>

namespace linea::apps {

void start_app(char** argv);
int fail(const std::exception& e);

}  // namespace linea::apps
