#!/usr/bin/env bash
# The translate app end to end on a fresh Debian machine: installs what is missing (build
# packages, SWORD with the two Bible modules, SentencePiece), builds the translate target in
# Release (build/release, shared with tests/run.sh), prepares the English-Spanish Bible pairs once
# (data/translate), trains the default recipe (GPU when one is usable, else every CPU core),
# and prints test BLEU (beam and greedy) and where the outputs are.
#
#   apps/translate/run.sh                               the default run, outputs in runs/translate/
#   apps/translate/run.sh --dec-attention performer     any `translate train` flag is passed on
#   apps/translate/run.sh --resume                      continue an interrupted run
#   LINEA_OUT=runs/other apps/translate/run.sh          another output folder
#   LINEA_DATA=data/mine apps/translate/run.sh          prepared data elsewhere (made if missing)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."

source apps/common/app_script.sh
app_build libsword-dev sword-text-web sword-text-sparv libsentencepiece-dev -- translate linea-bleu
TRANSLATE="$BUILD/apps/translate/translate"

DATA=${LINEA_DATA:-data/translate}
if [ ! -f "$DATA/data.json" ]; then
  echo "== prepare ($DATA)"
  "$TRANSLATE" prepare --out "$DATA"
fi

OUT=${LINEA_OUT:-runs/translate}
echo "== train (outputs in $OUT)"
start=$(date +%s)
"$TRANSLATE" train --data "$DATA" --out "$OUT" "$@"
end=$(date +%s)

echo
echo "translate: test BLEU $(app_field test_bleu) (beam), $(app_field test_bleu_greedy) (greedy) after" \
  "$(app_elapsed "$start" "$end")"
echo "translate: outputs: $OUT/summary.json, $OUT/metrics.jsonl, $OUT/curves.png, $OUT/test.beam.*; checkpoint $OUT/checkpoint"
echo "translate: translate text with: $TRANSLATE decode --checkpoint $OUT/checkpoint < input.txt"
