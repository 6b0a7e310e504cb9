#!/usr/bin/env bash
# Installs what is missing, builds, and runs the whole test suite (unit and mpi; in the
# release pass also the Python package's tests, scripts/python.sh, and the fuzz targets,
# scripts/fuzz.sh).
# Usage: scripts/test.sh [preset]   (release by default; `asan` for the sanitizer build)
set -euo pipefail
cd "$(dirname "$0")/.."
preset="${1:-release}"
# Tests at once: one per core (PEAKBOUND_TEST_JOBS overrides). Each case is its own process
# with its own temporary names; on 2 cores this takes the release pass from about 10 minutes
# to about 6.5.
jobs="${PEAKBOUND_TEST_JOBS:-$(nproc)}"
# Each step says how long it took, so a slow CI run shows where its time went.
timed() {
  local what="$1" t0
  shift
  t0=$(date +%s)
  "$@"
  echo "test.sh: $preset $what took $(( $(date +%s) - t0 )) s"
}
timed setup bash scripts/setup.sh
timed build bash scripts/build.sh "$preset"
if [ "$preset" = release ]; then
  timed tests ctest --preset "$preset" --output-on-failure -j "$jobs"
else
  # The slow end-to-end cases run once, in the release pass (tests/slow_e2e.txt says why).
  skip=$(grep -v '^#' tests/slow_e2e.txt | grep . | sed 's/[.]/\\./g' | paste -sd'|')
  timed tests ctest --preset "$preset" --output-on-failure -j "$jobs" -E "^($skip)\$"
fi
# The installed package, used the way a consumer would (release only: the asan build
# would need the consumer built with the sanitizers too).
if [ "$preset" = release ]; then
  timed example bash scripts/example.sh "$preset"
fi
# The Python package (release only: the module links the release library): its venv
# (build/venv-python, pinned requirements), `pip install .` from the release tree (nothing
# compiled twice), and its tests with pytest (scripts/python.sh). PEAKBOUND_SKIP_PYTHON=1
# leaves it out.
if [ "$preset" = release ] && [ "${PEAKBOUND_SKIP_PYTHON:-0}" != "1" ]; then
  timed python bash scripts/python.sh test
fi
# The parsers of user input under libFuzzer, a bounded time each (scripts/fuzz.sh; its own
# clang build in build/fuzz). Once, in the release pass: the fuzz build has ASan/UBSan itself.
# PEAKBOUND_SKIP_FUZZ=1 leaves it out.
if [ "$preset" = release ] && [ "${PEAKBOUND_SKIP_FUZZ:-0}" != "1" ]; then
  timed fuzz bash scripts/fuzz.sh
fi
