#!/usr/bin/env bash
# Installs what is missing, builds (the library, the CLI and the Python package), and runs
# the main job on its built-in default:
# `peakbound train` on the built-in tiny-moe model and copy task, 4 MPI ranks (on any
# number of cores), every schedule on (PipelinedLLEP, Ring-DTP, SCO, OffloadStreamAdamW).
# It prints the plan before step 1, the loss as it falls below what a model blind to the
# context can reach, and the planned-vs-measured peak per component at the end.
# Extra arguments go to `peakbound train` (e.g. --steps 50, --schedules none); its
# defaults are this job's (300 steps of 128-token sequences, held-out loss every 50).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh release
# The Python package too (build/venv-python: `import peakbound`; scripts/python.sh).
bash scripts/python.sh install >/dev/null
echo "python: build/venv-python/bin/python imports peakbound ($(build/venv-python/bin/python -c 'import peakbound; print(peakbound.__version__)'))"
./build/release/peakbound --version
ranks="${PEAKBOUND_RANKS:-4}"
# Shared memory moves large messages in one copy (CMA) where this machine lets one process
# read another's memory, else without it (containers often bar it; `peakbound info
# --mpi-single-copy` probes); a value already set wins. Ranks waiting in MPI yield their
# core, so 4 ranks share 2 cores without spinning.
OMPI_MCA_btl_vader_single_copy_mechanism="${OMPI_MCA_btl_vader_single_copy_mechanism:-$(./build/release/peakbound info --mpi-single-copy)}"
export OMPI_MCA_btl_vader_single_copy_mechanism OMPI_MCA_mpi_yield_when_idle=1
root=()
if [ "$(id -u)" = 0 ]; then root=(--allow-run-as-root); fi
exec mpirun "${root[@]}" --oversubscribe -np "$ranks" ./build/release/peakbound train "$@"
