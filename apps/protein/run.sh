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

PACKAGES=(cmake ninja-build g++ make pkg-config libopenblas-dev libopenblas-openmp-dev libfftw3-dev zlib1g-dev
  nlohmann-json3-dev libstb-dev libcli11-dev libgtest-dev gnuplot-nox mmseqs2 mmseqs2-examples)
bash tests/install_packages.sh "${PACKAGES[@]}"

BUILD=${LINEA_BUILD_DIR:-build/release}
echo "== build ($BUILD, Release)"
mkdir -p "$BUILD"
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release >"$BUILD/configure.log" 2>&1 ||
  { cat "$BUILD/configure.log"; exit 1; }
grep -E "Linea: (CUDA backend|OpenBLAS)" "$BUILD/configure.log" || true
cmake --build "$BUILD" -j"$(nproc)" --target protein
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

field() { grep -oE "\"$1\": [0-9.eE+-]+" "$OUT/summary.json" | head -1 | awk -v s="$2" '{printf "%.2f", $2 * s}'; }
echo
echo "protein: test masked accuracy $(field test_masked_accuracy 100)%, perplexity $(field test_perplexity 1);" \
  "empirical baseline $(field baseline_masked_accuracy 100)%, $(field baseline_perplexity 1); after" \
  "$(((end - start) / 60)) min $(((end - start) % 60)) s"
echo "protein: outputs: $OUT/summary.json, $OUT/metrics.jsonl, $OUT/curves.png; checkpoint $OUT/checkpoint"
echo "protein: use it with: $PROTEIN fill --checkpoint $OUT/checkpoint 'MKT<mask>LLIL<mask>AV'"
echo "protein:              $PROTEIN embed --checkpoint $OUT/checkpoint seqs.fasta --out emb.safetensors"
