#!/usr/bin/env bash
# Installs what is missing, builds, and runs the main job on its built-in default.
# Today that is the version banner and the checkpointed-step demo with the Arena's
# per-component report; the training demo replaces it as the schedules land.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh release
./build/release/peakbound --version
./build/release/peakbound demo "$@"
