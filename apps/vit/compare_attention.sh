#!/usr/bin/env bash
# Trains the same ViT with each attention mechanism at one fixed, equal budget (the same epochs,
# batch, schedule and seed) and prints a table of test accuracy and training images/s, each
# with its ratio to softmax measured in the same run. Run it on an otherwise idle machine.
#
#   apps/vit/compare_attention.sh                       1 epoch each, outputs in runs/compare/<spec>/
#   EPOCHS=3 apps/vit/compare_attention.sh --threads 2  other vit flags apply to every run
#   SPECS="softmax performer:features=64" apps/vit/compare_attention.sh
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
VIT=${VIT:-build/release/apps/vit/vit}
OUT=${LINEA_OUT:-runs/compare}
SPECS=${SPECS:-softmax performer ra lara nprf_rpe}
EPOCHS=${EPOCHS:-1}
[ -x "$VIT" ] || { echo "compare_attention: $VIT not built (apps/quickstart.sh or cmake --build build/release --target vit)"; exit 1; }

field() { grep -oE "\"$2\": [0-9.eE+-]+" "$1" | head -1 | awk '{print $2}'; }
rows=()
for spec in $SPECS; do
  dir="$OUT/${spec//[:=,]/_}"
  echo "== $spec"
  "$VIT" --epochs "$EPOCHS" "$@" --attention "$spec" --out "$dir" --no-progress | grep -E "^epoch .*test loss|^vit: device" || true
  rows+=("$spec|$(field "$dir/summary.json" test_accuracy)|$(field "$dir/summary.json" train_images_per_s)|$(field "$dir/summary.json" eval_images_per_s)|$(field "$dir/summary.json" wall_time_s)")
done
device=$(grep -oE '"device": "[^"]*"' "$OUT/${SPECS%% *}/summary.json" | head -1 | cut -d'"' -f4)
echo
echo "budget: vit --epochs $EPOCHS $* (the same for every spec); device: $device"
echo "| attention | test accuracy | train images/s | vs first | eval images/s | wall |"
echo "|---|---|---|---|---|---|"
base=""
for r in "${rows[@]}"; do
  IFS='|' read -r spec acc ips eips wall <<<"$r"
  [ -n "$base" ] || base=$ips
  awk -v s="$spec" -v a="$acc" -v i="$ips" -v b="$base" -v e="$eips" -v w="$wall" \
    'BEGIN { printf "| %s | %.2f%% | %.0f | %.2fx | %.0f | %d:%02d |\n", s, 100 * a, i, i / b, e, int(w / 60), int(w) % 60 }'
done
