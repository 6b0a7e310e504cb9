#!/usr/bin/env bash
# Runs bench/peer_fsdp2.py (real PyTorch FSDP2 on 4 CPU ranks, the peer of `peakbound bench reach`):
# creates bench/.venv-peer from bench/peer_requirements.txt if it is missing, then launches
#   torchrun --standalone --nproc-per-node 4 bench/peer_fsdp2.py "$@"
# Arguments go to the script (see its docstring): e.g.
#   bash bench/peer_fsdp2.sh --budget 256MiB --throughput-at 256,512
# The one JSON line is on stdout; logs are on stderr. PEER_RANKS overrides the rank count (4).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/bench/.venv-peer"
if [[ ! -x "$VENV/bin/torchrun" ]]; then
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install --disable-pip-version-check -q -r "$ROOT/bench/peer_requirements.txt" >&2
fi
exec "$VENV/bin/torchrun" --standalone --nproc-per-node "${PEER_RANKS:-4}" "$ROOT/bench/peer_fsdp2.py" "$@"
