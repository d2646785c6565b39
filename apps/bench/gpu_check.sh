#!/usr/bin/env bash
# The GPU checks in one call, for a lent GPU machine that has the CUDA toolkit and PyTorch but
# none of the project's packages (a build carried there by ../shared/tools/gpu-bundle.sh):
#
#   apps/bench/gpu_check.sh bundle BUILD_DIR OUT_DIR [BASE_BUILD_DIR]   here: packs the test and
#       benchmark executables (test_cuda_parity, test_cuda_basics, test_attention_cuda,
#       test_gpu_step, train-step, attention-scaling, attention-decode, protein-bench-context) and
#       this script with the comparison scripts into OUT_DIR (git-ignored gpu/); with BASE_BUILD_DIR,
#       that build's attention-scaling too, as attention-scaling-base, for the `ab` part (build it
#       from a worktree of the commit to compare with: cmake --build DIR --target attention-scaling)
#   gpu/run.sh bash scripts/gpu_check.sh run LOG_DIR [PART...]   there, from the repository
#       root, LOG_DIR = $OUT. The parts, in this order of priority (all by default):
#         correct    the CUDA test binaries (parity, basics, attention, training steps) one after
#                    another, and beside them compute-sanitizer memcheck and racecheck over the
#                    fused attention kernels' parity tests: correctness only, so they share the
#                    card; the timed parts after it run alone
#         ab         (a bundle with a base build) attention-scaling of this build and of the base
#                    one, one after the other, on the same shapes: the changes timed in one run
#                    (AB_LENGTHS, 1024,4096,16384; AB_DEVICE=cpu tries the plumbing here)
#         attention  torch_attention.py --device cuda: every mechanism against PyTorch (SDPA in
#                    float32 and bfloat16 beside them; time and peak memory; softmax, performer
#                    and lara also under --precision bf16) at L = 1k..16k
#                    (ATTN_LENGTHS), then performer, lara and nprf_rpe against SDPA at 64k
#                    (ATTN_LONG; softmax's float32 kernels take minutes there and the goals stop
#                    at 16k for it), D = 64 and 128, B = 4, H = 8, 64 features
#         compare    gpu_compare.sh: the apps' training steps against PyTorch's
#         protein    protein-bench-context --device cuda at 8k..64k tokens
#         nprf       nprf_rpe's dense (direct) path against its FFT path at 256..8k (dense=auto's fit)
#         causal     softmax and performer, causal, Linea alone at 1k..16k, and a decoding step
#                    of each after 128..4k positions (attention-decode)
#       Not run by default (name it): profile  ncu's time of every kernel (gpu__time_duration,
#                    summed per kernel name, largest first) of softmax at L = 4k (float32 and
#                    bf16), performer and lara at L = 16k and the default ViT's eager training
#                    step: where the time goes.
#       (tests and sanitize are the two halves of correct, alone.)
#
set -uo pipefail
mode=${1:-}
case "$mode" in
  bundle)
    BUILD=$2 OUT=$3 BASE=${4:-}
    HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
    # unpacked by an earlier run.sh here (it would travel too), or an earlier bundle's base
    rm -rf "$OUT/bin" "$OUT/lib" "$OUT/data" "$OUT/base-commit"
    EXES=(test_cuda_parity test_cuda_basics test_attention_cuda test_gpu_step train-step attention-scaling
      attention-decode protein-bench-context)
    # gpu-bundle.sh takes one build folder: the executables gathered in one, linked, not copied
    PACK=$(mktemp -d)
    trap 'rm -rf "$PACK"' EXIT
    for n in "${EXES[@]}"; do
      f=$(find "$BUILD" -type f -name "$n" -perm -u+x | head -n 1)
      [ -n "$f" ] || { echo "gpu_check bundle: no $n under $BUILD" >&2; exit 1; }
      ln "$f" "$PACK/$n" 2>/dev/null || cp "$f" "$PACK/$n"
    done
    if [ -n "$BASE" ]; then
      f=$(find "$BASE" -type f -name attention-scaling -perm -u+x | head -n 1)
      [ -n "$f" ] || { echo "gpu_check bundle: no attention-scaling under $BASE" >&2; exit 1; }
      cp "$f" "$PACK/attention-scaling-base"
      git -C "$BASE" rev-parse --short HEAD > "$PACK/base-commit" 2>/dev/null || echo "?" > "$PACK/base-commit"
      EXES+=(attention-scaling-base)
    fi
    bash "$HERE/../../../shared/tools/gpu-bundle.sh" "$PACK" "$OUT" "${EXES[@]}" || exit 1
    [ -z "$BASE" ] || cp "$PACK/base-commit" "$OUT/base-commit"
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
    PARTS=${*:-correct ab attention compare nprf protein causal}
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
      echo "$log: exit $? (limit $t s, $SECONDS s into the run): $(grep -E '^\[  (PASSED|FAILED) |ERROR SUMMARY|RACECHECK SUMMARY' "$W/$log" | tr '\n' ' ')"
    }
    {
      nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>&1
      "$G/run.sh" true || echo "the bundle did not unpack"  # once, before parts run side by side
      for p in $PARTS; do
        case "$p" in
          tests)
            for t in test_cuda_basics test_cuda_parity test_attention_cuda test_gpu_step; do
              part 120 "$t.log" "$G/run.sh" bin/$t --gtest_brief=1
            done
            ;;
          sanitize)
            for tool in memcheck racecheck; do
              part 150 "sanitizer_$tool.log" compute-sanitizer --tool "$tool" --error-exitcode 9 "$G/run.sh" \
                bin/test_cuda_parity --gtest_brief=1 \
                --gtest_filter='CudaParity.*Attention*:CudaParity.*Kernel*:CudaParity.Fft'
            done
            ;;
          ab)
            if [ ! -e "$G/base-commit" ]; then
              echo "== ab: skipped (no base build in the bundle)"
              continue
            fi
            echo "== ab: attention-scaling of this build against the base build ($(cat "$G/base-commit")), same run"
            for pr in fp32 bf16; do
              # ra: its draw (sample_attention_keys) against the base's composed one where the base predates it
              [ "$pr" = fp32 ] && specs=softmax,performer:features=64,lara:samples=64,nprf_rpe:features=64,redraw=0,dense=0,ra
              [ "$pr" = bf16 ] && specs=softmax,performer:features=64,lara:samples=64
              for i in 1 2; do  # base, this build, base, this build: load on the card hits both
                for b in attention-scaling-base attention-scaling; do
                  part 45 "ab_${pr}_${b}_$i.log" "$G/run.sh" bin/$b --device "${AB_DEVICE:-cuda}" --precision $pr --batch 4 --heads 8 \
                    --dim 64 --specs "$specs" --lengths ${AB_LENGTHS:-1024,4096,16384} --repeats 3 --json "$W/ab_${pr}_${b}_$i.jsonl"
                done
              done
            done
            python3 - "$W" <<'PY'
import json, os, sys
w = sys.argv[1]
def rows(name):
    out = {}
    for i in (1, 2):
        p = os.path.join(w, f"{name}_{i}.jsonl")
        if not os.path.exists(p):
            continue
        for line in open(p):
            r = json.loads(line)
            if r.get("status") == "ok":
                out.setdefault((r["spec"], r["length"]), []).append(r["ms"])
    return out
for pr in ("fp32", "bf16"):
    base, new = rows(f"ab_{pr}_attention-scaling-base"), rows(f"ab_{pr}_attention-scaling")
    for key in sorted(base, key=lambda k: (k[0], k[1])):
        if key in new:
            b, n = min(base[key]), min(new[key])
            print(f"  {pr} {key[0][:40]:40s} L={key[1]:<6d} base {b:9.2f} ms  now {n:9.2f} ms  {b / n:5.2f}x"
                  " (best of the two runs each)")
PY
            ;;
          correct)
            echo "== tests, compute-sanitizer memcheck and racecheck, side by side"
            (for t in test_cuda_basics test_cuda_parity test_attention_cuda test_gpu_step; do
              part 50 "$t.log" "$G/run.sh" bin/$t --gtest_brief=1
            done) &
            part 60 sanitizer_memcheck.log compute-sanitizer --tool memcheck --error-exitcode 9 "$G/run.sh" \
              bin/test_cuda_parity --gtest_brief=1 \
              --gtest_filter='CudaParity.*Attention*:CudaParity.*Kernel*:CudaParity.Fft' &
            # racecheck is slow (over 110 s for these tests on an H200): the softmax kernels in one
            # process, the other kernels in another
            part 150 sanitizer_racecheck_softmax.log compute-sanitizer --tool racecheck --error-exitcode 9 \
              "$G/run.sh" bin/test_cuda_parity --gtest_brief=1 --gtest_filter='CudaParity.SoftmaxAttention*' &
            part 150 sanitizer_racecheck_other.log compute-sanitizer --tool racecheck --error-exitcode 9 \
              "$G/run.sh" bin/test_cuda_parity --gtest_brief=1 \
              --gtest_filter='CudaParity.*Kernel*:CudaParity.Fft:-CudaParity.SoftmaxAttention*' &
            wait
            ;;
          attention)
            echo "== attention vs PyTorch"
            part 170 attention_vs_torch.log python3 "$G/scripts/torch_attention.py" --linea "$G/run.sh $G/bin/attention-scaling" \
              --device cuda --lengths "${ATTN_LENGTHS:-1024,4096,8192,16384}" --dims 64,128 --batch 4 --heads 8 \
              --features 64 --bf16 --repeats 3 --json "$W/attention_vs_torch.jsonl"
            sed -n '/^forward+backward/,$p' "$W/attention_vs_torch.log"
            part 80 attention_vs_torch_long.log python3 "$G/scripts/torch_attention.py" --linea "$G/run.sh $G/bin/attention-scaling" \
              --device cuda --lengths "${ATTN_LONG:-65536}" --specs performer,lara,nprf_rpe --dims 64,128 --batch 4 \
              --heads 8 --features 64 --bf16 --repeats 3 --json "$W/attention_vs_torch_long.jsonl"
            sed -n '/^forward+backward/,$p' "$W/attention_vs_torch_long.log"
            ;;
          nprf)
            echo "== nprf_rpe: the dense (direct) path against the FFT path, for dense=auto"
            part 40 nprf_dense_sweep.log "$G/run.sh" bin/attention-scaling --device cuda --batch 4 --heads 8 --dim 64 \
              --specs nprf_rpe:features=16,redraw=0,dense=0,nprf_rpe:features=16,redraw=0,dense=1,nprf_rpe:features=64,redraw=0,dense=0,nprf_rpe:features=64,redraw=0,dense=1 \
              --lengths 256,512,1024,2048,4096,8192 --repeats 5 --json "$W/nprf_dense_sweep.jsonl"
            grep -E '^  L=' "$W/nprf_dense_sweep.log"
            ;;
          causal)
            echo "== causal self-attention (Linea alone)"
            part 40 causal.log "$G/run.sh" bin/attention-scaling --device cuda --batch 4 --heads 8 --dim 64 --causal \
              --specs softmax,performer:features=64 --lengths 1024,4096,16384 --repeats 3 --json "$W/causal.jsonl"
            grep -E '^  L=' "$W/causal.log"
            part 40 decode.log "$G/run.sh" bin/attention-decode --device cuda --batch 4 --heads 8 --dim 64 \
              --specs softmax,performer --length 4096 --report 128,1024,4096
            grep -E '^(softmax|performer) ' "$W/decode.log"
            ;;
          compare)
            echo "== gpu_compare"
            part 110 gpu_compare.log bash "$G/scripts/gpu_compare.sh" --train-step "$G/run.sh $G/bin/train-step" \
              --out "$W/compare"
            tail -n 14 "$W/gpu_compare.log"
            ;;
          protein)
            echo "== protein-bench-context"
            part 80 protein_bench_context.log "$G/run.sh" bin/protein-bench-context --device cuda \
              --lengths 8192,16384,32768,65536 --json "$W/protein_bench_context.json"
            tail -n 12 "$W/protein_bench_context.log"
            ;;
          profile)
            echo "== profile: ncu's kernel times, summed per kernel name"
            # name precision spec length: the softmax kernels at 4k (forward, dq, dk/dv apart), the
            # GEMM-and-kernel mechanisms at 16k
            for job in "softmax fp32 softmax 4096" "softmax_bf16 bf16 softmax 4096" \
              "performer fp32 performer:features=64 16384" "lara fp32 lara:samples=64 16384"; do
              set -- $job
              part 90 "profile_$1.csv" ncu --metrics gpu__time_duration.sum --csv "$G/run.sh" \
                bin/attention-scaling --device cuda --precision "$2" --batch 4 --heads 8 --dim 64 --specs "$3" \
                --lengths "$4" --repeats 3
            done
            # the ViT's steps 3 and 4 or so (about 280 launches a step): past the warm-up's allocations
            part 90 profile_vit.csv ncu --metrics gpu__time_duration.sum --csv --launch-skip 600 --launch-count 560 \
              "$G/run.sh" bin/train-step --model vit --device cuda --steps 3 --warmup 2
            python3 - "$W" <<'PY'
import csv, io, os, sys
for name in ("profile_softmax.csv", "profile_softmax_bf16.csv", "profile_performer.csv", "profile_lara.csv",
             "profile_vit.csv"):
    path = os.path.join(sys.argv[1], name)
    if not os.path.exists(path):
        continue
    text = open(path, errors="replace").read()
    start = text.find('"ID"')
    totals, counts = {}, {}
    for r in csv.DictReader(io.StringIO(text[start:] if start >= 0 else "")):
        if r.get("Metric Name") != "gpu__time_duration.sum":
            continue
        scale = {"nsecond": 1e-3, "usecond": 1.0, "msecond": 1e3}.get(r.get("Metric Unit"), 1.0)
        k = r["Kernel Name"][:90]
        totals[k] = totals.get(k, 0.0) + float(r["Metric Value"].replace(",", "")) * scale
        counts[k] = counts.get(k, 0) + 1
    all_us = sum(totals.values()) or 1.0
    print(f"{name}: {sum(counts.values())} kernels, {all_us / 1e3:.2f} ms in all")
    for k in sorted(totals, key=totals.get, reverse=True)[:15]:
        print(f"  {totals[k] / 1e3:9.3f} ms {100 * totals[k] / all_us:5.1f}% {counts[k]:5d}x  {k}")
PY
            ;;
          *) echo "unknown part '$p' (correct, attention, compare, protein, nprf, causal, profile; tests, sanitize)" ;;
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
