#!/usr/bin/env bash
# Fuzzes every parser of user input (tests/fuzz: the size parser, config.json importer,
# --config files, safetensors header, token files, memory timelines): builds the libFuzzer targets with clang
# and ASan/UBSan in build/fuzz, then runs each for a bounded time over a COPY of its
# committed seed corpus (tests/fuzz/corpus/<target>; the committed corpus never grows here),
# with its dictionary (tests/fuzz/dict/<target>.dict), two targets at a time. Prints per
# target the inputs it ran; exits non-zero when any target finds a crash, a sanitizer
# report, a hang (-timeout), too much memory or an error outside the parser's contract
# (tests/fuzz/fuzz_check.h). A finding's input is kept as build/fuzz/findings/<target>/crash-*
# and its log in build/fuzz/logs/<target>.log; replay it with
#   build/fuzz/tests/fuzz/fuzz_<target> build/fuzz/findings/<target>/crash-...
# Usage: scripts/fuzz.sh [seconds-per-target]   (default 20, or $PEAKBOUND_FUZZ_SECONDS)
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${1:-${PEAKBOUND_FUZZ_SECONDS:-20}}"
build=build/fuzz
start=$(date +%s)

# The compiler is chosen once, when the build folder is made (naming it again later would
# make CMake discard its cache).
if [ ! -f "$build/CMakeCache.txt" ]; then
  CC=clang CXX=clang++ cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DPEAKBOUND_FUZZ=ON -DPEAKBOUND_BUILD_TESTS=OFF -DPEAKBOUND_WITH_MPI=OFF -DPEAKBOUND_WITH_CUDA=OFF >/dev/null
fi
cmake --build "$build" --target fuzz
built=$(date +%s)

targets=()
for src in tests/fuzz/fuzz_*.cc; do
  name=$(basename "$src" .cc)
  targets+=("${name#fuzz_}")
done

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
rm -rf "$build/findings" "$build/logs"
mkdir -p "$build/logs"

# One target: its corpus copied, its own findings folder, its exit status in $work/<t>.rc.
run_one() {
  local t=$1 dict=()
  mkdir -p "$work/$t" "$build/findings/$t"
  cp tests/fuzz/corpus/"$t"/* "$work/$t/"
  if [ -f tests/fuzz/dict/"$t".dict ]; then dict=(-dict=tests/fuzz/dict/"$t".dict); fi
  local rc=0
  "$build/tests/fuzz/fuzz_$t" "$work/$t" "${dict[@]}" -max_total_time="$seconds" -timeout=5 \
    -rss_limit_mb=2048 -print_final_stats=1 -artifact_prefix="$build/findings/$t/" \
    >"$build/logs/$t.log" 2>&1 || rc=$?
  echo "$rc" >"$work/$t.rc"
}

# Two at a time (each target is one process).
for ((i = 0; i < ${#targets[@]}; i += 2)); do
  run_one "${targets[i]}" &
  if ((i + 1 < ${#targets[@]})); then run_one "${targets[i + 1]}" & fi
  wait
done

failed=0
for t in "${targets[@]}"; do
  rc=$(cat "$work/$t.rc")
  runs=$(grep -o 'stat::number_of_executed_units: [0-9]*' "$build/logs/$t.log" | tail -1 | awk '{print $2}')
  if [ "$rc" = 0 ]; then
    printf 'fuzz: %-20s %9s inputs in %s s, no finding\n' "$t" "${runs:-?}" "$seconds"
  else
    failed=1
    printf 'fuzz: %-20s FAILED (exit %s) after %s inputs; input in %s/findings/%s/\n' \
      "$t" "$rc" "${runs:-?}" "$build" "$t"
    grep -E '^fuzz: |ERROR: |SUMMARY: |^    #[0-9]+ ' "$build/logs/$t.log" | head -30 | sed 's/^/  /'
  fi
done
echo "fuzz: build $((built - start)) s, runs $(($(date +%s) - built)) s"
exit "$failed"
