#!/usr/bin/env bash
# Installs the Debian 12 packages peakbound needs to build and test, only those missing.
# Idempotent: a second run installs nothing and takes about a second.
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config
  libopenblas-dev        # CPU GEMM (OpenBLAS, pthread build)
  libopenmpi-dev openmpi-bin   # MPI communicator and mpirun
  nlohmann-json3-dev     # JSON reports, HF config.json import
  libcli11-dev           # command-line parsing
  libtomlplusplus-dev    # --config files: a real TOML parser (toml++ 3.x)
  libgtest-dev libgmock-dev    # unit tests
  libbenchmark-dev       # micro-benchmarks of kernels
  python3-venv           # scripts/tokenize_text.sh and scripts/python.sh: their venvs
  python3-dev            # scripts/python.sh: Python.h for the package's extension module
  clang libclang-rt-dev  # scripts/fuzz.sh: clang and libFuzzer's runtime (libclang_rt.fuzzer)
  llvm                   # scripts/fuzz.sh: llvm-symbolizer, for a finding's stack trace
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all ${#packages[@]} packages present"
  exit 0
fi

echo "setup: installing ${missing[*]}"
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "setup: done"
