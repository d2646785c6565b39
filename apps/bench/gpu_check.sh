#!/usr/bin/env bash
# The GPU checks in one call, for a lent GPU machine that has the CUDA toolkit and PyTorch but
# none of the project's packages (a build carried there by ../shared/tools/gpu-bundle.sh):
#
#   apps/bench/gpu_check.sh bundle BUILD_DIR OUT_DIR   here: packs the test and benchmark
#       executables (test_cuda_parity, test_cuda_basics, test_attention_cuda, test_gpu_step,
#       train-step, attention-scaling, protein-bench-context) and this script with the comparison
#       scripts into OUT_DIR (git-ignored gpu/)
#   gpu/run.sh bash scripts/gpu_check.sh run LOG_DIR [PART...]   there, from the repository
#       root, LOG_DIR = $OUT. The parts, in this order of priority (all by default):
#         tests      the CUDA test binaries (parity, basics, attention, training steps)
#         attention  torch_attention.py --device cuda: every mechanism against PyTorch (SDPA in
#                    float32 and bfloat16 beside them; time and peak memory) at L = 1k..64k
#                    (ATTN_LENGTHS), D = 64 and 128, B = 4, H = 8, 64 features
#         compare    gpu_compare.sh: the apps' training steps against PyTorch's
#         protein    protein-bench-context --device cuda at 8k..64k tokens
#         sanitize   compute-sanitizer memcheck and racecheck over the fused attention kernels'
#                    parity tests
#
# A lease has 15 minutes of device time, its start included, and one command at most 10: the
# whole run keeps within GPU_CHECK_BUDGET seconds (540 by default; give the call 600). Each part
# is time-boxed to what is left of it, a part that would get under 30 s is skipped, and the
# output says so. Only a few files come back from a lease: everything lands in LOG_DIR as
# summary.txt (what this prints) and logs.tar.gz (every log and JSON file).
set -uo pipefail
mode=${1:-}
case "$mode" in
  bundle)
    BUILD=$2 OUT=$3
    HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
    rm -rf "$OUT/bin" "$OUT/lib" "$OUT/data"  # unpacked by an earlier run.sh here: it would travel too
    bash "$HERE/../../../shared/tools/gpu-bundle.sh" "$BUILD" "$OUT" test_cuda_parity test_cuda_basics \
      test_attention_cuda test_gpu_step train-step attention-scaling protein-bench-context || exit 1
    mkdir -p "$OUT/scripts"
    cp "$HERE/gpu_check.sh" "$HERE/gpu_compare.sh" "$HERE/torch_train_step.py" "$HERE/torch_attention.py" \
      "$OUT/scripts/"
    # what a lease carries is at most 64 MiB, the checkout included
    size=$(du -sm "$OUT" | cut -f1)
    ((size <= 48)) || { echo "gpu_check bundle: $OUT is $size MiB, too large to carry" >&2; exit 1; }
    ;;
  run)
    LOG=$2
    shift 2
    PARTS=${*:-tests attention compare protein sanitize}
    G=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)  # the bundle folder (scripts/ inside it)
    mkdir -p "$LOG"
    W=$(mktemp -d)  # the logs, packed into LOG at the end
    BUDGET=${GPU_CHECK_BUDGET:-540}
    # part SECONDS LOGFILE CMD...: CMD under a timeout of SECONDS or what is left of the budget
    # (less 10 s for packing), output to W/LOGFILE; skipped when that is under 30 s.
    part() {
      local want=$1 log=$2 left t
      shift 2
      left=$((BUDGET - SECONDS - 10))
      t=$((want < left ? want : left))
      if ((t < 30)); then
        echo "skipped: $left s of the budget left"
        return 0
      fi
      timeout "$t" "$@" > "$W/$log" 2>&1
      echo "exit $? (limit $t s, $SECONDS s into the run): $(grep -E '^\[  (PASSED|FAILED) |ERROR SUMMARY' "$W/$log" | tr '\n' ' ')"
    }
    {
      nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>&1
      for p in $PARTS; do
        case "$p" in
          tests)
            for t in test_cuda_basics test_cuda_parity test_attention_cuda test_gpu_step; do
              echo "== $t"
              part 120 "$t.log" "$G/run.sh" bin/$t --gtest_brief=1
            done
            ;;
          attention)
            echo "== attention vs PyTorch"
            part 240 attention_vs_torch.log python3 "$G/scripts/torch_attention.py" --linea "$G/run.sh $G/bin/attention-scaling" \
              --device cuda --lengths "${ATTN_LENGTHS:-1024,4096,16384,65536}" --dims 64,128 --batch 4 --heads 8 \
              --features 64 --bf16 --repeats 3 --json "$W/attention_vs_torch.jsonl"
            sed -n '/^forward+backward/,$p' "$W/attention_vs_torch.log"
            ;;
          compare)
            echo "== gpu_compare"
            part 180 gpu_compare.log bash "$G/scripts/gpu_compare.sh" --train-step "$G/run.sh $G/bin/train-step" \
              --out "$W/compare"
            tail -n 14 "$W/gpu_compare.log"
            ;;
          protein)
            echo "== protein-bench-context"
            part 120 protein_bench_context.log "$G/run.sh" bin/protein-bench-context --device cuda \
              --lengths 8192,16384,32768,65536 --json "$W/protein_bench_context.json"
            tail -n 12 "$W/protein_bench_context.log"
            ;;
          sanitize)
            for tool in memcheck racecheck; do
              echo "== compute-sanitizer $tool"
              part 150 "sanitizer_$tool.log" compute-sanitizer --tool "$tool" --error-exitcode 9 "$G/run.sh" \
                bin/test_cuda_parity --gtest_brief=1 \
                --gtest_filter='CudaParity.*Attention*:CudaParity.*Kernel*:CudaParity.Fft'
            done
            ;;
          *) echo "unknown part '$p' (tests, attention, compare, protein, sanitize)" ;;
        esac
      done
      echo "run took $SECONDS s"
    } 2>&1 | tee "$W/summary.txt"
    cp "$W/summary.txt" "$LOG/summary.txt"
    tar -czf "$LOG/logs.tar.gz" -C "$W" .
    ;;
  *)
    sed -n 2,24p "$0"
    exit 2
    ;;
esac
