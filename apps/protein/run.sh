#!/usr/bin/env bash
# The protein app end to end on a fresh Debian machine: installs what is missing (build
# packages, mmseqs2 and its example sequences), builds the protein target in Release
# (build/release, shared with tests/run.sh), prepares the UniProt sequences once with the
# cluster split (data/protein), trains the default recipe (GPU when one is usable, else every CPU
# core), and prints test masked accuracy and perplexity beside the empirical baseline.
#
#   apps/protein/run.sh                                 the default run, outputs in runs/protein/
#   apps/protein/run.sh --attention performer           any `protein train` flag is passed on
#   apps/protein/run.sh --resume                        continue an interrupted run
#   LINEA_OUT=runs/other apps/protein/run.sh            another output folder
#   LINEA_DATA=data/mine apps/protein/run.sh            prepared data elsewhere (made if missing)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."

source apps/common/app_script.sh
app_build mmseqs2 mmseqs2-examples -- protein
PROTEIN="$BUILD/apps/protein/protein"

DATA=${LINEA_DATA:-data/protein}
if [ ! -f "$DATA/data.json" ]; then
  echo "== prepare ($DATA)"
  "$PROTEIN" prepare --out "$DATA"
fi

OUT=${LINEA_OUT:-runs/protein}
echo "== train (outputs in $OUT)"
start=$(date +%s)
"$PROTEIN" train --data "$DATA" --out "$OUT" "$@"
end=$(date +%s)

echo
echo "protein: test masked accuracy $(app_field test_masked_accuracy 100)%, perplexity $(app_field test_perplexity);" \
  "empirical baseline $(app_field baseline_masked_accuracy 100)%, $(app_field baseline_perplexity); after" \
  "$(app_elapsed "$start" "$end")"
echo "protein: outputs: $OUT/summary.json, $OUT/metrics.jsonl, $OUT/curves.png; checkpoint $OUT/checkpoint"
echo "protein: use it with: $PROTEIN fill --checkpoint $OUT/checkpoint 'MKT<mask>LLIL<mask>AV'"
echo "protein:              $PROTEIN embed --checkpoint $OUT/checkpoint seqs.fasta --out emb.safetensors"
