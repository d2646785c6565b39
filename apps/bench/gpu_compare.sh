#!/usr/bin/env bash
# Linea against PyTorch 2.x on one GPU, in one go: the vit and translate training steps
# (train-step, bench_train_step.cpp; torch_train_step.py) on the same synthetic batches, each
# configuration Linea then PyTorch back to back, and the host time per small op; then a table
# of units per second with the ratio Linea / PyTorch, the device named, every number also in
# OUT/gpu_compare.jsonl. Needs a CUDA device, Linea's train-step and a PyTorch with CUDA.
#
#   apps/bench/gpu_compare.sh [--train-step build/release/apps/bench/train-step] [--out DIR] [--steps 60]
#
# On a machine that has none of the project's Debian packages, carry the binary with
# ../shared/tools/gpu-bundle.sh and give its run wrapper too: --train-step "BUNDLE/run.sh
# BUNDLE/bin/train-step" (apps/bench/gpu_check.sh does). PyTorch runs outside the wrapper, with
# its own CUDA libraries.
set -euo pipefail
TRAIN_STEP=build/release/apps/bench/train-step
OUT=gpu_compare
STEPS=60
while (($#)); do
  case "$1" in
    --train-step) TRAIN_STEP=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    --steps) STEPS=$2; shift 2 ;;
    *) echo "gpu_compare.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)  # absolute: the wrapper changes directory
read -ra TS <<<"$TRAIN_STEP"
J="$OUT/gpu_compare.jsonl"
: > "$J"
# case label | Linea flags | PyTorch flags
CASES=(
  "vit b128 fp32|--model vit --batch 128|--model vit --batch 128"
  "vit b128 CUDA graph|--model vit --batch 128 --cuda-graph|--model vit --batch 128 --cuda-graph"
  "vit b512 fp32|--model vit --batch 512|--model vit --batch 512"
  "translate fp32|--model translate|--model translate"
  "translate bf16|--model translate --precision bf16|--model translate --autocast bf16"
  # last: compiling takes PyTorch most of a minute, and a time-boxed run may stop here
  "vit b128 fp32, torch.compile|--model vit --batch 128|--model vit --batch 128 --compile"
)
for c in "${CASES[@]}"; do
  IFS='|' read -r label lf tf <<<"$c"
  echo "== $label"
  # shellcheck disable=SC2086
  "${TS[@]}" $lf --steps "$STEPS" --json "$OUT/linea.tmp" || echo '{"failed": true}' > "$OUT/linea.tmp"
  # shellcheck disable=SC2086
  python3 "$HERE/torch_train_step.py" $tf --steps "$STEPS" --json "$OUT/torch.tmp" || echo '{"failed": true}' > "$OUT/torch.tmp"
  python3 - "$label" "$OUT/linea.tmp" "$OUT/torch.tmp" >> "$J" <<'PY'
import json, sys
label, l, t = sys.argv[1], json.loads(open(sys.argv[2]).readlines()[-1]), json.loads(open(sys.argv[3]).readlines()[-1])
print(json.dumps({"case": label, "linea": l, "pytorch": t}))
PY
  rm -f "$OUT/linea.tmp" "$OUT/torch.tmp"
done
echo "== host time per op"
"${TS[@]}" --op-cost --json "$OUT/linea.tmp"
python3 "$HERE/torch_train_step.py" --op-cost --json "$OUT/torch.tmp"
python3 - "host us per op" "$OUT/linea.tmp" "$OUT/torch.tmp" >> "$J" <<'PY'
import json, sys
label, l, t = sys.argv[1], json.loads(open(sys.argv[2]).readlines()[-1]), json.loads(open(sys.argv[3]).readlines()[-1])
print(json.dumps({"case": label, "linea": l, "pytorch": t}))
PY
rm -f "$OUT/linea.tmp" "$OUT/torch.tmp"
python3 - "$J" <<'PY'
import json, sys
rows = [json.loads(x) for x in open(sys.argv[1])]
dev = next((r["pytorch"].get("device_name") for r in rows if r["pytorch"].get("device_name")), "?")
print(f"\nLinea against PyTorch on {dev} (units/s: images for vit, target tokens for translate)")
print("| case | Linea | PyTorch | Linea / PyTorch |\n|---|---|---|---|")
for r in rows:
    l, t = r["linea"], r["pytorch"]
    if r["case"] == "host us per op":
        if "host_us_per_op" in l and "host_us_per_op" in t:
            print(f"| host time per small op (us, lower is better) | {l['host_us_per_op']:.2f} | {t['host_us_per_op']:.2f} | "
                  f"{t['host_us_per_op'] / l['host_us_per_op']:.2f}x faster |")
        continue
    if "units_per_s" not in l or "units_per_s" not in t:
        print(f"| {r['case']} | {'failed' if 'units_per_s' not in l else round(l['units_per_s'])} | "
              f"{'failed' if 'units_per_s' not in t else round(t['units_per_s'])} | - |")
        continue
    print(f"| {r['case']} | {l['units_per_s']:,.0f} ({l['launches_per_step']} launches, "
          f"{l['graph_launches_per_step']} graph) | {t['units_per_s']:,.0f} | {l['units_per_s'] / t['units_per_s']:.2f}x |")
PY
