#!/usr/bin/env bash
# The GPU checks of the training-step work in one command, for a lent GPU machine that has the
# CUDA toolkit and PyTorch but none of the project's packages (a build carried there by
# ../shared/tools/gpu-bundle.sh). Two halves:
#
#   apps/bench/gpu_check.sh bundle BUILD_DIR OUT_DIR   here: packs the test and benchmark
#       executables (test_cuda_parity, test_cuda_basics, test_attention_cuda, test_gpu_step,
#       train-step) and this script with the comparison scripts into OUT_DIR (git-ignored gpu/)
#   gpu/run.sh bash gpu/scripts/gpu_check.sh run LOG_DIR     there (from the repository root,
#       LOG_DIR = $OUT): the CUDA tests, then apps/bench/gpu_compare.sh, every log under LOG_DIR
#
# Each part is time-boxed (timeout), so that one hang leaves the rest of the device time.
set -uo pipefail
mode=${1:-}
case "$mode" in
  bundle)
    BUILD=$2 OUT=$3
    HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
    bash "$HERE/../../../shared/tools/gpu-bundle.sh" "$BUILD" "$OUT" test_cuda_parity test_cuda_basics \
      test_attention_cuda test_gpu_step train-step || exit 1
    mkdir -p "$OUT/scripts"
    cp "$HERE/gpu_check.sh" "$HERE/gpu_compare.sh" "$HERE/torch_train_step.py" "$OUT/scripts/"
    ;;
  run)
    LOG=$2
    G=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)  # the bundle folder (scripts/ inside it)
    mkdir -p "$LOG"
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$LOG/gpu.txt" 2>&1
    for t in test_cuda_basics test_cuda_parity test_attention_cuda test_gpu_step; do
      echo "== $t"
      timeout 240 "$G/run.sh" bin/$t --gtest_brief=1 > "$LOG/$t.log" 2>&1
      echo "exit $?: $(grep -E '^\[  (PASSED|FAILED) ' "$LOG/$t.log" | tr '\n' ' ')"
    done
    echo "== gpu_compare"
    timeout 300 bash "$G/scripts/gpu_compare.sh" --train-step "$G/run.sh $G/bin/train-step" --out "$LOG/compare" \
      > "$LOG/gpu_compare.log" 2>&1
    echo "exit $?"
    tail -n 14 "$LOG/gpu_compare.log"
    ;;
  *)
    sed -n 2,14p "$0"
    exit 2
    ;;
esac
