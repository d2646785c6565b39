#!/usr/bin/env bash
# The test command. On a fresh Debian machine it installs the packages the build needs,
# configures and builds Linea (Release; the CUDA backend too whenever nvcc is found), runs
# every test with ctest, then builds the suites again under AddressSanitizer +
# UndefinedBehaviorSanitizer (CPU only) and runs them once more, then fuzzes every reader of
# outside input for a bounded time (tests/fuzz/run.sh). Exits non-zero on any failure.
#
#   tests/run.sh                   everything
#   LINEA_SKIP_SANITIZERS=1 tests/run.sh   skip the sanitizer pass
#   LINEA_SKIP_FUZZ=1 tests/run.sh         skip the fuzz pass
#   LINEA_FUZZ_SECONDS=N           seconds per fuzz target (default 20)
#   LINEA_SKIP_CUDA_EMU=1 tests/run.sh     skip the CUDA-emulator pass
#   LINEA_BUILD_DIR=dir            where the main build goes (default build/release)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

# Totals over every pass, for the closing line.
PASSED=0
SKIPPED=0
LOGS=$(mktemp -d)
trap 'rm -rf "$LOGS"' EXIT
# count_ctest LOG: adds a ctest run's passed/skipped counts (the run already succeeded).
count_ctest() {
  local total skipped
  total=$(grep -oE 'tests failed out of [0-9]+' "$1" | grep -oE '[0-9]+$' || echo 0)
  skipped=$(grep -cE '^[[:space:]]+[0-9]+ - .* \(Skipped\)$' "$1" || true)
  PASSED=$((PASSED + total - skipped))
  SKIPPED=$((SKIPPED + skipped))
}

JOBS=$(nproc)
PACKAGES=(cmake ninja-build g++ make pkg-config python3 libopenblas-dev libfftw3-dev libgtest-dev zlib1g-dev
  nlohmann-json3-dev libstb-dev libcli11-dev libopenblas-openmp-dev gnuplot-nox
  libsword-dev sword-text-web sword-text-sparv libsentencepiece-dev mmseqs2 mmseqs2-examples
  libopenmpi-dev openmpi-bin clang libclang-rt-dev libomp-dev dataset-fashion-mnist)

# ---- packages -------------------------------------------------------------------------------
bash tests/install_packages.sh "${PACKAGES[@]}"

# ---- main build and tests -----------------------------------------------------------------------
BUILD=${LINEA_BUILD_DIR:-build/release}
# Without a GPU the CUDA kernels only have to compile here (their tests run on the emulator below):
# for one architecture, where CMakeLists.txt's default builds sm_80 and sm_90: the same device code
# twice (nothing in cuda/ branches between them).
ARCHS=()
if [ ! -e /dev/nvidiactl ] && ! nvidia-smi -L >/dev/null 2>&1; then ARCHS=(-DCMAKE_CUDA_ARCHITECTURES=90); fi
echo "== configure ($BUILD)"
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release "${ARCHS[@]}"
echo "== build"
cmake --build "$BUILD" -j"$JOBS"
echo "== test"
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-$JOBS}
# ctest runs JOBS tests at once, each with JOBS OpenMP threads: more threads than cores. libgomp's
# threads spin at every barrier by default, waiting for a thread that is not running: a 3 s
# gradcheck took 80 s beside another test. Passive threads sleep instead (the whole pass: 681 s
# -> 209 s on 2 cores).
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
# The CPU FFT plans' wisdom (core/cpu/fftw.h) in the build folder, not the user's ~/.cache.
export LINEA_FFTW_WISDOM=${LINEA_FFTW_WISDOM:-$(cd "$BUILD" && pwd)/fftw-wisdom}
ctest --test-dir "$BUILD" -j"$JOBS" --output-on-failure --timeout 900 2>&1 | tee "$LOGS/main.log"
count_ctest "$LOGS/main.log"

# ---- sanitizers (CPU only) ---------------------------------------------------------------------
if [ "${LINEA_SKIP_SANITIZERS:-0}" != 1 ]; then
  SAN=build/asan
  echo "== configure ($SAN: ASan + UBSan, CPU only)"
  # Without MPI: Open MPI's own allocations would drown LeakSanitizer's report (the MPI tests ran above).
  # -O1 and line tables only (-g1: enough for the sanitizers' stack traces) build in about 60% of
  # -O2 -g's time. The CUDA-only suites are not built: without CUDA they only skip.
  cmake -S . -B "$SAN" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DLINEA_CUDA=OFF -DLINEA_SANITIZE=ON \
    -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1 -DNDEBUG" -DLINEA_BUILD_APPS=OFF -DLINEA_MPI=OFF
  cmake --build "$SAN" -j"$JOBS"
  # Without the CPU allocator's cache (LINEA_NO_CPU_MEMORY_CACHING=1): each tensor is then a block of
  # its own size, so ASan sees a read past its end or after its free (a cached block hides both).
  echo "== test under sanitizers (gradchecks by 4 random probes per input; the full Jacobians ran above)"
  LINEA_GRADCHECK_PROBES=${LINEA_GRADCHECK_PROBES:-4} LINEA_NO_CPU_MEMORY_CACHING=1 \
  ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1} \
  LSAN_OPTIONS=${LSAN_OPTIONS:-suppressions=$PWD/tests/lsan.supp} \
  UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1} \
    ctest --test-dir "$SAN" -j"$JOBS" --output-on-failure --timeout 1800 2>&1 | tee "$LOGS/asan.log"
  count_ctest "$LOGS/asan.log"
fi
# ---- fuzzing (CPU only) ------------------------------------------------------------------------
# libFuzzer targets for every reader of outside input (safetensors, IDX, FASTA, images, attention
# specs, checkpoints, the apps' files and text), built with clang + ASan + UBSan in build/fuzz:
# the committed regression inputs first, then LINEA_FUZZ_SECONDS of fuzzing per target. Each
# target that runs clean counts as one passed test.
if [ "${LINEA_SKIP_FUZZ:-0}" != 1 ]; then
  echo "== fuzzing (tests/fuzz/run.sh, ${LINEA_FUZZ_SECONDS:-20} s per target)"
  LINEA_FUZZ_SECONDS=${LINEA_FUZZ_SECONDS:-20} bash tests/fuzz/run.sh 2>&1 | tee "$LOGS/fuzz.log"
  PASSED=$((PASSED + $(grep -cE ' ok$' "$LOGS/fuzz.log" || true)))
fi
# ---- CUDA kernels on the host emulator (no GPU needed) ----------------------------------------
# Without a GPU the parity tests above skip. This pass compiles the unmodified cuda/ sources
# with g++ against a host emulation of CUDA (tests/cuda_emu/run.sh: blocks run in turn, threads
# as fibers, __syncthreads a real barrier; cuBLAS/cuFFT/cuRAND are argument-checking host
# fakes) and runs the parity tests there, so indexing, launch-geometry and barrier bugs fail
# CI. It sees a data race only where the other order of a block's threads changes a result, and
# not warp behaviour or speed: those need a real GPU.
CUDA_INC=${CUDA_HOME:-/usr/local/cuda}/include
if [ "${LINEA_SKIP_CUDA_EMU:-0}" != 1 ] && [ -f "$CUDA_INC/cuda_runtime.h" ]; then
  echo "== CUDA parity tests on the host emulator"
  LINEA_EMU_BUILD=$PWD/build/cuda-emu bash tests/cuda_emu/run.sh 2>&1 | tee "$LOGS/emu.log"
  # gtest's closing lines: "[  PASSED  ] N tests." and "[  SKIPPED ] N tests."
  emu_passed=$(awk '/^\[  PASSED  \] [0-9]+/ {s += $4} END {print s + 0}' "$LOGS/emu.log")
  emu_skipped=$(awk '/^\[  SKIPPED \] [0-9]+/ {s += $4} END {print s + 0}' "$LOGS/emu.log")
  PASSED=$((PASSED + ${emu_passed:-0}))
  SKIPPED=$((SKIPPED + ${emu_skipped:-0}))
fi
echo "== all tests passed (skipped: CUDA tests without a GPU)"
echo "summary: $PASSED passed, 0 failed, $SKIPPED skipped"
