#!/usr/bin/env bash
# Installs a built peakbound into a temporary prefix, builds examples/consumer against
# it with find_package(peakbound) and runs its two programs (a head step; a whole
# training run through train/run.h): proves the installed package (headers,
# library, CMake config) is usable on its own. Usage: scripts/example.sh [preset]
# (release by default; the preset must be built, e.g. by scripts/build.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
preset="${1:-release}"
build="build/$preset"
[ -f "$build/CMakeCache.txt" ] || { echo "example: $build is not configured: run scripts/build.sh $preset" >&2; exit 1; }
work="$(mktemp -d "${TMPDIR:-/tmp}/peakbound-example.XXXXXX")"
trap 'rm -rf "$work"' EXIT
start=$(date +%s)
cmake --install "$build" --prefix "$work/prefix" >/dev/null
cmake -S examples/consumer -B "$work/build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
      -DCMAKE_PREFIX_PATH="$work/prefix" >/dev/null
cmake --build "$work/build"
"$work/build/peakbound_consumer"
"$work/build/peakbound_run"
echo "example: installed package built and ran in $(( $(date +%s) - start )) s"
