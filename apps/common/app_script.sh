# What the apps' run scripts (apps/quickstart.sh, apps/<app>/run.sh) share, sourced from the
# repository root:
#   app_build PACKAGE... -- TARGET...   installs the missing Debian packages (the build's and the
#                                       given ones), builds the targets in Release in $BUILD
#   app_field KEY [SCALE]               summary.json's number KEY (times SCALE), "%.2f"
#   app_elapsed START END               "N min S s"
# BUILD (default build/release, shared with tests/run.sh; LINEA_BUILD_DIR overrides) and OUT
# (the run's output folder: LINEA_OUT, else the script's default) are set by the caller.
BUILD=${LINEA_BUILD_DIR:-build/release}

# The packages every build needs.
APP_BUILD_PACKAGES=(cmake ninja-build g++ make pkg-config libopenblas-dev libopenblas-openmp-dev libfftw3-dev zlib1g-dev
  nlohmann-json3-dev libstb-dev libcli11-dev libgtest-dev gnuplot-nox)

app_build() {
  local packages=("${APP_BUILD_PACKAGES[@]}") targets=()
  while (($#)) && [ "$1" != "--" ]; do packages+=("$1"); shift; done
  (($#)) && shift
  targets=("$@")
  bash tests/install_packages.sh "${packages[@]}"
  echo "== build ($BUILD, Release)"
  mkdir -p "$BUILD"
  cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release >"$BUILD/configure.log" 2>&1 ||
    { cat "$BUILD/configure.log"; exit 1; }
  grep -E "Linea: (CUDA backend|OpenBLAS)" "$BUILD/configure.log" || true
  cmake --build "$BUILD" -j"$(nproc)" --target "${targets[@]}"
}

app_field() {
  grep -oE "\"$1\": [0-9.eE+-]+" "$OUT/summary.json" | head -1 | awk -v s="${2:-1}" '{printf "%.2f", $2 * s}'
}

app_elapsed() { echo "$((($2 - $1) / 60)) min $((($2 - $1) % 60)) s"; }
