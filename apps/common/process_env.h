// Environment settings the apps and benchmarks need before their libraries load, and the
// restart that applies them.
//
//   int main(int argc, char** argv) {
//     linea::apps::tune_process(argv);  // first: may restart the process
//
// Two settings, each only when the user has not chosen one:
//
// - OpenBLAS's kernels (OPENBLAS_CORETYPE): OpenBLAS picks them from the CPU's model number
//   when it loads, and a release older than the CPU falls back to generic SSE3 kernels
//   (core/runtime.h, fitting_blas_kernels). Then the variable is set to the core type that
//   matches the CPU's vector units: on a Xeon of model 207 under Debian's OpenBLAS 0.3.21,
//   "Prescott" -> "SkylakeX" made softmax attention several times faster.
// - OpenMP's spin-waiting (GOMP_SPINCOUNT=10000; apps only, `short_openmp_spin`): with neither
//   OMP_WAIT_POLICY nor GOMP_SPINCOUNT set, a libgomp worker that runs out of work spins for
//   about 300,000 iterations before it sleeps. A training step is many short parallel loops
//   between serial stretches (autograd, small ops, the loader's prefetch thread), so on a 2-core
//   machine the spinning worker took CPU time the others needed, and the default ViT trained
//   markedly slower than with GOMP_SPINCOUNT=10000. Fully passive waiting
//   (OMP_WAIT_POLICY=passive) costs the short loops instead. The figures: apps/bench/README.md,
//   "Environment switches".
//
// Both libraries read their variables once, when they load, so when anything was set the
// program restarts itself (execv of /proc/self/exe with the same arguments) and the restarted
// process finds the variables set and goes on. If the restart fails, the program goes on as
// it was. A user's own OMP_WAIT_POLICY, GOMP_SPINCOUNT or OPENBLAS_CORETYPE is left alone.
#pragma once

namespace linea::apps {

void tune_process(char** argv, bool short_openmp_spin = true);

}  // namespace linea::apps
