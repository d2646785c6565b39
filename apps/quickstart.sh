#!/usr/bin/env bash
# README command #1: train a Vision Transformer on Fashion-MNIST, end to end, on a fresh Debian
# machine. Installs what is missing (build packages, gnuplot, the dataset-fashion-mnist package),
# builds Linea in Release (build/release, shared with tests/run.sh; only the vit target), trains
# the default ViT (GPU when one is usable, else every CPU core) and prints the test accuracy and
# where the outputs are.
#
#   apps/quickstart.sh                          the default run, outputs in runs/quickstart/
#   apps/quickstart.sh --attention lara         any vit flag is passed on (vit --help)
#   apps/quickstart.sh --resume                 continue an interrupted run
#   LINEA_OUT=runs/other apps/quickstart.sh     another output folder
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

PACKAGES=(cmake ninja-build g++ make pkg-config libopenblas-dev libopenblas-openmp-dev libfftw3-dev zlib1g-dev
  nlohmann-json3-dev libstb-dev libcli11-dev libgtest-dev gnuplot-nox dataset-fashion-mnist)
bash tests/install_packages.sh "${PACKAGES[@]}"

BUILD=${LINEA_BUILD_DIR:-build/release}
echo "== build ($BUILD, Release)"
mkdir -p "$BUILD"
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release >"$BUILD/configure.log" 2>&1 ||
  { cat "$BUILD/configure.log"; exit 1; }
grep -E "Linea: (CUDA backend|OpenBLAS)" "$BUILD/configure.log" || true
cmake --build "$BUILD" -j"$(nproc)" --target vit

OUT=${LINEA_OUT:-runs/quickstart}
echo "== train (outputs in $OUT)"
start=$(date +%s)
"$BUILD/apps/vit/vit" --out "$OUT" "$@"
end=$(date +%s)

accuracy=$(grep -oE '"test_accuracy": [0-9.eE+-]+' "$OUT/summary.json" | head -1 | awk '{printf "%.2f", 100 * $2}')
echo
echo "quickstart: test accuracy ${accuracy}% after $(((end - start) / 60)) min $(((end - start) % 60)) s of training"
echo "quickstart: outputs: $OUT/summary.json, $OUT/metrics.jsonl, $OUT/curves.png, checkpoint $OUT/checkpoint"
echo "quickstart: classify an image with: $BUILD/apps/vit/vit --predict IMAGE.png --checkpoint $OUT/checkpoint"
