#!/usr/bin/env bash
# The GPU checks of the training-step work in one command, for a lent GPU machine that has the
# CUDA toolkit and PyTorch but none of the project's packages (a build carried there by
# ../shared/tools/gpu-bundle.sh). Two halves:
#
#   apps/bench/gpu_check.sh bundle BUILD_DIR OUT_DIR   here: packs the test and benchmark
#       executables (test_cuda_parity, test_cuda_basics, test_attention_cuda, test_gpu_step,
#       train-step, attention-scaling, protein-bench-context) and this script with the comparison
#       scripts into OUT_DIR (git-ignored gpu/)
#   gpu/run.sh bash gpu/scripts/gpu_check.sh run LOG_DIR     there (from the repository root,
#       LOG_DIR = $OUT): the CUDA tests, then apps/bench/gpu_compare.sh, every log under LOG_DIR
#   bash gpu/scripts/gpu_check.sh attention LOG_DIR    there, a second call: compute-sanitizer
#       (memcheck, racecheck) over the fused attention kernels' parity tests, then
#       torch_attention.py --device cuda (every mechanism against PyTorch, SDPA in float32 and
#       bfloat16 beside them; time and peak memory) at L = 1k..64k, D = 64 and 128, B = 4, H = 8,
#       64 features, and protein-bench-context --device cuda; ATTN_LENGTHS overrides the lengths
#
# Each part is time-boxed (timeout), so that one hang leaves the rest of the device time.
set -uo pipefail
mode=${1:-}
case "$mode" in
  bundle)
    BUILD=$2 OUT=$3
    HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
    bash "$HERE/../../../shared/tools/gpu-bundle.sh" "$BUILD" "$OUT" test_cuda_parity test_cuda_basics \
      test_attention_cuda test_gpu_step train-step attention-scaling protein-bench-context || exit 1
    mkdir -p "$OUT/scripts"
    cp "$HERE/gpu_check.sh" "$HERE/gpu_compare.sh" "$HERE/torch_train_step.py" "$HERE/torch_attention.py" \
      "$OUT/scripts/"
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
  attention)
    LOG=$2
    G=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
    mkdir -p "$LOG"
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$LOG/gpu.txt" 2>&1
    KERNELS='CudaParity.*Attention*:CudaParity.*Kernel*:CudaParity.Fft'
    for tool in memcheck racecheck; do
      echo "== compute-sanitizer $tool"
      timeout 150 compute-sanitizer --tool "$tool" --error-exitcode 9 "$G/run.sh" bin/test_cuda_parity \
        --gtest_brief=1 --gtest_filter="$KERNELS" > "$LOG/sanitizer_$tool.log" 2>&1
      echo "exit $?: $(grep -E 'ERROR SUMMARY|^\[  (PASSED|FAILED) ' "$LOG/sanitizer_$tool.log" | tr '\n' ' ')"
    done
    echo "== attention vs PyTorch"
    timeout 420 python3 "$G/scripts/torch_attention.py" --linea "$G/run.sh $G/bin/attention-scaling" --device cuda \
      --lengths "${ATTN_LENGTHS:-1024,4096,16384,65536}" --dims 64,128 --batch 4 --heads 8 --features 64 --bf16 \
      --repeats 3 --json "$LOG/attention_vs_torch.jsonl" > "$LOG/attention_vs_torch.log" 2>&1
    echo "exit $?"
    sed -n '/^forward+backward/,$p' "$LOG/attention_vs_torch.log"
    echo "== protein-bench-context"
    timeout 150 "$G/run.sh" bin/protein-bench-context --device cuda --lengths 8192,16384,32768,65536 --json "$LOG/protein_bench_context.json" \
      > "$LOG/protein_bench_context.log" 2>&1
    echo "exit $?"
    tail -n 12 "$LOG/protein_bench_context.log"
    ;;
  *)
    sed -n 2,14p "$0"
    exit 2
    ;;
esac
