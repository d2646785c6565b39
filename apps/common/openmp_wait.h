// Shorter spin-waiting for OpenMP's idle threads, set before the app starts its work.
//
// libgomp reads its wait policy once, when it is loaded: with neither OMP_WAIT_POLICY nor
// GOMP_SPINCOUNT set, a worker thread that runs out of work spins for about 300,000 iterations
// before it sleeps. A training step is many short parallel loops between serial stretches
// (autograd, small ops, the loader's prefetch thread), so on a 2-core machine the spinning
// worker took CPU time the others needed: the default ViT trained at 523-609 images/s with the
// default policy and 795-859 with GOMP_SPINCOUNT=10000 (three alternating runs each, same
// binary). Fully passive waiting (OMP_WAIT_POLICY=passive) costs the short loops instead
// (performer's forward+backward at L = 1024: 1.1 -> 5.0 ms).
//
//   int main(int argc, char** argv) {
//     linea::apps::shorten_openmp_spin(argv);  // first: may restart the process
//
// When the user has set neither variable, sets GOMP_SPINCOUNT=10000 and restarts the program
// (execv of /proc/self/exe with the same arguments), since libgomp is already loaded; the
// restarted process finds the variable set and goes on. If the restart fails, the program goes
// on with the default policy. A user's own OMP_WAIT_POLICY or GOMP_SPINCOUNT is left alone.
#pragma once

namespace linea::apps {

void shorten_openmp_spin(char** argv);

}  // namespace linea::apps
