#!/usr/bin/env bash
# Trains the default translate model with several attention layouts at one fixed, equal budget
# (the same epochs, batches, schedule and seed) and prints a table of test BLEU (beam and
# greedy), training target tokens/s and beam-search decoding sentences/s, the speeds with their
# ratio to the first layout measured in the same run. Run it on an otherwise idle machine: the
# speeds are only comparable when nothing else runs.
#
#   apps/translate/compare_attention.sh                 2 epochs each, outputs in runs/translate-compare/
#   EPOCHS=8 apps/translate/compare_attention.sh        other budgets; other translate train flags
#   LAYOUTS="softmax/softmax/softmax softmax/performer/softmax" apps/translate/compare_attention.sh
# A layout is ENCODER/DECODER/CROSS attention specs (translate train --enc-attention ...).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
TRANSLATE=${TRANSLATE:-build/release/apps/translate/translate}
DATA=${LINEA_DATA:-data/translate}
OUT=${LINEA_OUT:-runs/translate-compare}
LAYOUTS=${LAYOUTS:-softmax/softmax/softmax softmax/performer/softmax softmax/nprf_rpe/softmax \
performer/performer/softmax nprf_rpe/nprf_rpe/softmax}
EPOCHS=${EPOCHS:-2}
[ -x "$TRANSLATE" ] || { echo "compare_attention: $TRANSLATE not built (apps/translate/run.sh builds it)"; exit 1; }
[ -f "$DATA/data.json" ] || { echo "compare_attention: no prepared data in $DATA (apps/translate/run.sh prepares it)"; exit 1; }

field() { grep -oE "\"$2\": [0-9.eE+-]+" "$1" | head -1 | awk '{print $2}'; }
rows=()
for layout in $LAYOUTS; do
  IFS=/ read -r enc dec cross <<<"$layout"
  dir="$OUT/${layout//[\/:=,]/_}"
  echo "== encoder $enc, decoder $dec, cross $cross"
  "$TRANSLATE" train --data "$DATA" --epochs "$EPOCHS" --patience 0 "$@" --enc-attention "$enc" --dec-attention "$dec" \
    --cross-attention "$cross" --out "$dir" --no-progress | grep -E "^epoch .*valid|^translate: (device|test)" || true
  s="$dir/summary.json"
  rows+=("$layout|$(field "$s" test_bleu)|$(field "$s" test_bleu_greedy)|$(field "$s" train_tokens_per_s)|$(field "$s" decode_beam_sentences_per_s)|$(field "$s" wall_time_s)")
done
first=${LAYOUTS%% *}
device=$(grep -oE '"device": "[^"]*"' "$OUT/${first//[\/:=,]/_}/summary.json" | head -1 | cut -d'"' -f4)
echo
echo "budget: translate train --epochs $EPOCHS $* (the same for every layout); device: $device"
echo "| encoder / decoder / cross | test BLEU (beam) | greedy | train tokens/s | vs first | beam sentences/s | vs first | wall |"
echo "|---|---|---|---|---|---|---|---|"
base_t="" base_d=""
for r in "${rows[@]}"; do
  IFS='|' read -r layout bleu greedy tps dps wall <<<"$r"
  [ -n "$base_t" ] || { base_t=$tps; base_d=$dps; }
  awk -v l="${layout//\// \/ }" -v b="$bleu" -v g="$greedy" -v t="$tps" -v bt="$base_t" -v d="$dps" -v bd="$base_d" -v w="$wall" \
    'BEGIN { printf "| %s | %.2f | %.2f | %.0f | %.2fx | %.1f | %.2fx | %d:%02d |\n", l, b, g, t, t / bt, d, d / bd, int(w / 60), int(w) % 60 }'
done
