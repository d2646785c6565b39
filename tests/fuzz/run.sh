#!/usr/bin/env bash
# Builds the libFuzzer targets (tests/fuzz/fuzz_*.cpp; clang, ASan + UBSan) in build/fuzz and
# runs each for a bounded time, nproc targets at once. First every committed regression input
# (tests/fuzz/regressions/<target>/*: crashes found earlier, minimized) runs once; then each
# target fuzzes from its corpus (build/fuzz/corpus/<target>), the generated seeds
# (fuzz_make_seeds -> build/fuzz/seeds/<target>) and any committed seeds (tests/fuzz/seeds/<target>).
# Exits non-zero on any crash, leak, timeout (an input running over 10 s), out-of-memory
# (2 GB), sanitizer report or failed invariant; the input that did it is saved under
# build/fuzz/artifacts/<target>/ and the log under build/fuzz/logs/<target>.log.
#
#   tests/fuzz/run.sh                      every target, 20 s each
#   tests/fuzz/run.sh safetensors image    only these targets
#   LINEA_FUZZ_SECONDS=600 tests/fuzz/run.sh   longer runs (seconds per target)
#   LINEA_FUZZ_BUILD_DIR=dir               the build folder (default build/fuzz)
#
# Reproduce a failure: build/fuzz/tests/fuzz/fuzz_<target> build/fuzz/artifacts/<target>/crash-...
# Add it as a regression: tests/fuzz/regressions/<target>/<what-it-was> (after the fix).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."

SECONDS_EACH=${LINEA_FUZZ_SECONDS:-20}
BUILD=${LINEA_FUZZ_BUILD_DIR:-build/fuzz}
JOBS=$(nproc)
ALL=(safetensors idx fasta image attention_spec checkpoint app_data text tokenizer)
# Longest input per target: room for a few small tensors, images, files or lines, no more (larger
# inputs mostly slow the search down).
declare -A MAX_LEN=([safetensors]=4096 [idx]=4096 [fasta]=4096 [image]=8192 [attention_spec]=256
  [checkpoint]=8192 [app_data]=4096 [text]=2048 [tokenizer]=8192)
TARGETS=("$@")
((${#TARGETS[@]})) || TARGETS=("${ALL[@]}")
for t in "${TARGETS[@]}"; do
  [[ -n "${MAX_LEN[$t]:-}" ]] || { echo "tests/fuzz/run.sh: unknown target '$t' (targets: ${ALL[*]})" >&2; exit 2; }
done

# ---- build --------------------------------------------------------------------------------------
if ! grep -q '^LINEA_FUZZ:BOOL=ON' "$BUILD/CMakeCache.txt" 2>/dev/null; then
  echo "== configure ($BUILD: clang, libFuzzer + ASan + UBSan, CPU only)"
  CC=clang CXX=clang++ cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DLINEA_CUDA=OFF \
    -DLINEA_MPI=OFF -DLINEA_BUILD_TESTS=OFF -DLINEA_FUZZ=ON || exit 1
fi
echo "== build fuzz targets"
cmake --build "$BUILD" --target fuzzers -j"$JOBS" || exit 1
rm -rf "$BUILD/seeds"
"$BUILD/tests/fuzz/fuzz_make_seeds" "$BUILD/seeds" || exit 1

# One thread: the targets' tensors are tiny, and libFuzzer measures one thread's work. No CPU
# allocator cache: each tensor a block of its own size, so ASan sees a reader write or read past it.
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 LINEA_NO_CPU_MEMORY_CACHING=1
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1}
export LSAN_OPTIONS=${LSAN_OPTIONS:-suppressions=$PWD/tests/lsan.supp:print_suppressions=0}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
FLAGS=(-timeout=10 -rss_limit_mb=2048 -print_final_stats=1)
REPORT='ERROR: AddressSanitizer|ERROR: LeakSanitizer|runtime error:|ERROR: libFuzzer|linea fuzz: .*invariant failed'

mkdir -p "$BUILD/logs"
# fuzz_one T: T's regression inputs, then T fuzzed; its messages go to $BUILD/logs/T.out, its
# summary line to T.summary, and T.failed is written when it failed.
fuzz_one() {
  local t=$1 exe="$BUILD/tests/fuzz/fuzz_$1" out="$BUILD/logs/$1.out"
  rm -f "$BUILD/logs/$t.failed" "$BUILD/logs/$t.summary"
  : > "$out"
  [[ -x "$exe" ]] || {
    echo "== $t: $exe was not built" >> "$out"
    echo "$t (not built)" > "$BUILD/logs/$t.failed"
    return
  }

  # ---- regression inputs: each must run clean ---------------------------------------------------
  local regress=(tests/fuzz/regressions/"$t"/*)
  if [[ -e "${regress[0]}" ]]; then
    echo "== $t: ${#regress[@]} regression inputs" >> "$out"
    if ! "$exe" "${FLAGS[@]}" "${regress[@]}" > "$BUILD/logs/$t.regressions.log" 2>&1 ||
      grep -qE "$REPORT" "$BUILD/logs/$t.regressions.log"; then
      grep -E "$REPORT|Running: " "$BUILD/logs/$t.regressions.log" | tail -5 >> "$out"
      echo "$t (regression input, see $BUILD/logs/$t.regressions.log)" >> "$BUILD/logs/$t.failed"
    fi
  fi

  # ---- fuzzing --------------------------------------------------------------------------------
  echo "== $t: fuzzing for ${SECONDS_EACH} s" >> "$out"
  local corpus="$BUILD/corpus/$t"
  mkdir -p "$corpus" "$BUILD/artifacts/$t"
  local dirs=("$corpus" "$BUILD/seeds/$t")
  [[ -d tests/fuzz/seeds/$t ]] && dirs+=("tests/fuzz/seeds/$t")
  local log="$BUILD/logs/$t.log" rc execs last cov ft corp status
  # The outer timeout only guards against a fuzzer that never stops (-max_total_time ends it).
  timeout -k 10 $((SECONDS_EACH + 300)) "$exe" "${FLAGS[@]}" -max_total_time="$SECONDS_EACH" \
    -max_len="${MAX_LEN[$t]}" -artifact_prefix="$BUILD/artifacts/$t/" "${dirs[@]}" > "$log" 2>&1
  rc=$?
  execs=$(grep -oE 'stat::number_of_executed_units: [0-9]+' "$log" | grep -oE '[0-9]+$' || true)
  last=$(grep -E '^#[0-9]+' "$log" | tail -1)
  cov=$(grep -oE 'cov: [0-9]+' <<<"$last" | grep -oE '[0-9]+' || true)
  ft=$(grep -oE 'ft: [0-9]+' <<<"$last" | grep -oE '[0-9]+' || true)
  corp=$(grep -oE 'corp: [0-9]+/[0-9]+[a-zA-Z]*' <<<"$last" | cut -d' ' -f2 || true)
  status=ok
  if ((rc != 0)) || grep -qE "$REPORT" "$log"; then
    status="FAILED (exit $rc)"
    grep -E "$REPORT|SUMMARY|Test unit written|==[0-9]+== ERROR" "$log" | head -8 >> "$out"
    echo "$t (see $log)" >> "$BUILD/logs/$t.failed"
  fi
  printf '%-15s %10s execs  cov %6s  ft %6s  corpus %-14s %s\n' "$t" "${execs:-?}" "${cov:-?}" "${ft:-?}" \
    "${corp:-?}" "$status" > "$BUILD/logs/$t.summary"
}

# The targets run nproc at once (each fuzzes on one core for its SECONDS_EACH); their messages
# are printed in the targets' order.
running=0
for t in "${TARGETS[@]}"; do
  if ((running == JOBS)); then
    wait -n
    running=$((running - 1))
  fi
  fuzz_one "$t" &
  running=$((running + 1))
done
wait
FAILED=()
SUMMARY=()
for t in "${TARGETS[@]}"; do
  cat "$BUILD/logs/$t.out"
  [[ -f "$BUILD/logs/$t.summary" ]] && SUMMARY+=("$(cat "$BUILD/logs/$t.summary")")
  [[ -f "$BUILD/logs/$t.failed" ]] && mapfile -t -O "${#FAILED[@]}" FAILED < "$BUILD/logs/$t.failed"
done

# Scratch folders of targets that ended without their exit cleanup (fuzz_util.h scratch_dir).
for d in /dev/shm/linea-fuzz-* "${TMPDIR:-/tmp}"/linea-fuzz-*; do
  [[ -d "$d" ]] && ! kill -0 "${d##*-}" 2>/dev/null && rm -rf "$d"
done

echo "== fuzz summary (${SECONDS_EACH} s per target; cov: edges covered; corpus: inputs/bytes)"
printf '%s\n' "${SUMMARY[@]}"
if ((${#FAILED[@]})); then
  echo "== fuzzing FAILED: ${FAILED[*]}"
  exit 1
fi
echo "== fuzzing passed: no crash, leak, timeout or sanitizer report"
