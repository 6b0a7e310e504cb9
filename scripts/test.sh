#!/usr/bin/env bash
# Installs what is missing, builds, and runs the whole test suite (unit and mpi).
# Usage: scripts/test.sh [preset]   (release by default; `asan` for the sanitizer build)
set -euo pipefail
cd "$(dirname "$0")/.."
preset="${1:-release}"
bash scripts/setup.sh
bash scripts/build.sh "$preset"
ctest --preset "$preset" --output-on-failure
# The installed package, used the way a consumer would (release only: the asan build
# would need the consumer built with the sanitizers too).
if [ "$preset" = release ]; then
  bash scripts/example.sh "$preset"
fi
