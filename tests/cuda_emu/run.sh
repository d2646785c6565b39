#!/usr/bin/env bash
# Runs the CUDA parity tests without a GPU: Linea's cuda/ code on a host emulation of CUDA.
# Blocks run one after another (run.sh runs the parity and attention tests once more with
# EMU_REVERSE_BLOCKS=1, last block first: a block that writes past its part of an output clobbers a
# neighbour in one order or the other; with EMU_REVERSE_THREADS=1, a block's threads last to first
# between barriers: a thread that reads a shared slot another writes in the same step sees the old
# value in one order and the new one in the other; and with LINEA_NO_CUDA_MEMORY_CACHING=1, every
# buffer a device allocation of its own size: fresh device memory is all 0xFF bytes, a NaN, so a
# read past a buffer fails ASan and a read of memory nothing wrote shows in the results), a block's
# threads are fibers switched at __syncthreads() (a barrier reached by only some threads aborts),
# a launch's shared memory is the bytes it asked for (ASan fails an access past them), launch
# configurations are checked (over 48 KB of dynamic shared memory only for a kernel that opted in),
# a cp.async copy lands at the wait that completes its group (a tile read before its wait holds
# stale bytes), and cuBLAS / cuFFT / cuRAND are naive host fakes that check their arguments as
# documented (the FFT fakes scribble over their inputs). Built with ASan + UBSan by default (SAN=
# to turn off). Catches indexing, launch-geometry, barrier, cp.async and library-argument bugs; it
# sees a data race only where the other order of a block's threads changes a result, and not
# warp-level behaviour or speed: run the real tests on a GPU for those.
# The binary steps runs apps/tests/test_gpu_step.cpp: what one training step of the
# default ViT and a small translate model asks of the device (core/cuda_counters.h), pinned.
# EMU_TRACE_MALLOC=1 prints every cudaMalloc (to find what allocates in a step),
# EMU_TRACE_LAUNCHES=1 every kernel launch (its name, grid and block) and library call in order
# (to find which launches a launch budget counts); EMU_MAX_BLOCKS=N caps grid_for's grids at N
# blocks (65,536 on a GPU, which no test's tensor fills: the parity tests run once more at 3, so
# that every grid-stride loop takes more than one turn); LINEA_EMU_CC=75 emulates an sm_75
# device (the softmax parity, RA's draw and FAVOR+ attention run once more so: their float32 SIMT
# kernels, which sm_80 and newer leave for the tensor cores); EMU_LT_NO_ALGO=1 has cuBLASLt find no
# algorithm (the linear layer's parity runs once more so: its GEMM-then-bias fallback). Built with
# gcov's counters too: after an unfiltered run, kernel_coverage.py lists the kernels and template
# instances no test ran, and a kernel that none ran fails the run (a kernel no test runs is one no
# test compares with the CPU path).
#   tests/cuda_emu/run.sh [gtest args]          e.g. --gtest_filter=CudaParity.Matmul
# Needs: g++, libgtest-dev, OpenBLAS, FFTW, and the CUDA toolkit headers (no GPU, no driver).
set -euo pipefail
EMU=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
B=${LINEA_EMU_BUILD:-/tmp/linea-cuda-emu}
python3 "$EMU/rewrite.py" "$EMU/../.." "$B/src"
make -s -C "$EMU" -j"$(nproc)" B="$B" COV=--coverage
find "$B/obj" -name '*.gcda' -delete  # counts of this run only
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=0}
# Every test of the binaries below is a job of its own, run nproc at once from one queue (the
# emulator runs a kernel's blocks on one core, and a binary's tests take from milliseconds to a
# minute: a shard per core left one idle for minutes); their outputs are printed in the queue's
# order. gcov merges the processes' counts under a lock.
JOBS=()
# add_tests [VAR=VALUE...] BIN [gtest args]: a job per test of BIN that the gtest args select.
add_tests() {
  local vars=(OMP_NUM_THREADS=1) bin list test
  while [[ $1 == *=* ]]; do
    vars+=("$1")
    shift
  done
  bin=$1
  shift
  list=$("$bin" --gtest_list_tests "$@")  # (a binary that cannot list stops the run here)
  for test in $(awk '/^Running main/ {next} /^[^ ]/ {suite = $1; next} {print suite $1}' <<< "$list"); do
    JOBS+=("$(printf '%q ' env "${vars[@]}" "$bin" --gtest_brief=1 "$@" --gtest_filter="$test")")
  done
}
# run_jobs: runs JOBS, nproc at once; fails when one fails.
run_jobs() {
  local logs i running=0 status=0 n
  n=$(nproc)
  logs=$(mktemp -d)
  for i in "${!JOBS[@]}"; do
    if ((running == n)); then
      wait -n || status=1
      running=$((running - 1))
    fi
    bash -c "${JOBS[$i]}" > "$logs/$i" 2>&1 &
    running=$((running + 1))
  done
  for ((; running > 0; running--)); do wait -n || status=1; done
  for i in "${!JOBS[@]}"; do cat "$logs/$i"; done
  rm -rf "$logs"
  return $status
}
"$B/basics" --gtest_brief=1
add_tests "$B/steps" "$@"  # the longest tests first
add_tests "$B/parity" "$@"
add_tests "$B/attention" "$@"
add_tests LINEA_EMU_CC=75 "$B/parity" \
  --gtest_filter='CudaParity.SoftmaxAttentionKernel:CudaParity.SoftmaxAttentionPropagatesNaN:CudaParity.AttentionSampleKernel:CudaParity.FavorAttentionKernel:CudaParity.FavorAttentionStepKernel'
add_tests EMU_LT_NO_ALGO=1 "$B/parity" --gtest_filter='CudaParity.Linear'
if [ $# -eq 0 ]; then  # once more: blocks and threads last to first, every buffer an allocation of its own
  add_tests EMU_REVERSE_BLOCKS=1 EMU_REVERSE_THREADS=1 LINEA_NO_CUDA_MEMORY_CACHING=1 "$B/parity"
  add_tests EMU_REVERSE_BLOCKS=1 EMU_REVERSE_THREADS=1 LINEA_NO_CUDA_MEMORY_CACHING=1 "$B/attention"
  # and the parity tests on grids of at most 3 blocks: every grid-stride loop takes several turns
  add_tests EMU_MAX_BLOCKS=3 "$B/parity"
fi
run_jobs
# Every kernel ran in some test above (all of them run when no filter is given).
if [ $# -eq 0 ]; then python3 "$EMU/kernel_coverage.py" "$B" --require-every-kernel; fi
