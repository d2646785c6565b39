#!/usr/bin/env bash
# README command #1: train a Vision Transformer on Fashion-MNIST, end to end, on a fresh Debian
# machine. Installs what is missing (build packages, gnuplot, the dataset-fashion-mnist package),
# builds Linea in Release (build/release, shared with tests/run.sh; only the vit target), trains
# the default ViT (GPU when one is usable, else every CPU core) within 10 minutes (vit
# --time-budget 540: the epochs that fit at the speed of a probe, at most the default 8; a slower
# CPU trains fewer; a tenth of the 10 minutes is kept because a shared machine's speed swings
# while it runs) and prints the test accuracy and where the outputs are.
#
#   apps/quickstart.sh                          the default run, outputs in runs/quickstart/
#   apps/quickstart.sh --attention lara         any vit flag is passed on (vit --help)
#   apps/quickstart.sh --resume                 continue an interrupted run
#   LINEA_OUT=runs/other apps/quickstart.sh     another output folder
#   LINEA_TIME_BUDGET=0 apps/quickstart.sh      no budget: all 8 epochs, however long they take
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

source apps/common/app_script.sh
app_build dataset-fashion-mnist -- vit

OUT=${LINEA_OUT:-runs/quickstart}
echo "== train (outputs in $OUT)"
start=$(date +%s)
"$BUILD/apps/vit/vit" --out "$OUT" --time-budget "${LINEA_TIME_BUDGET:-540}" "$@"
end=$(date +%s)

echo
echo "quickstart: test accuracy $(app_field test_accuracy 100)% after $(app_elapsed "$start" "$end") of training"
echo "quickstart: outputs: $OUT/summary.json, $OUT/metrics.jsonl, $OUT/curves.png, checkpoint $OUT/checkpoint"
echo "quickstart: classify an image with: $BUILD/apps/vit/vit --predict IMAGE.png --checkpoint $OUT/checkpoint"
