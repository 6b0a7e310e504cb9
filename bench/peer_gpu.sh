#!/usr/bin/env bash
# The PyTorch peers of peakbound's benches on one GPU (issue 16; scripts/gpu-check runs this):
#   bash bench/peer_gpu.sh OUT_DIR [BUDGET]
# With the python on PATH (no venv, no pip: the GPU image's torch), one after the other:
#   bench/peer_vocab.py --device cuda          -> OUT_DIR/peer-vocab.json       (bench vocab)
#   bench/peer_checkpoint.py --device cuda     -> OUT_DIR/peer-checkpoint.json  (bench checkpoint)
#   bench/peer_fsdp2.py --device "$device" --budget BUDGET (default 16GiB), FSDP2 with CPU-offloaded
#     optimizer, one rank, plain python (the script sets the env:// defaults itself)
#                                              -> OUT_DIR/peer-fsdp2.json       (bench reach)
# Each JSON file holds the peer's one JSON line; its stderr is OUT_DIR/peer-NAME.log. Every peer
# runs under `timeout`: PEER_TIMEOUT seconds (default 120) for vocab and checkpoint,
# PEER_FSDP2_TIMEOUT (default 240) for fsdp2, whose reach search starts no trial after
# PEER_FSDP2_TIME_LIMIT seconds (default 120; --time-limit) so that it still writes its JSON
# (the reach found so far, "search_stopped" set). Extra flags for a peer: PEER_VOCAB_ARGS,
# PEER_CHECKPOINT_ARGS, PEER_FSDP2_ARGS (split on spaces). PYTHON overrides the interpreter;
# PEER_DEVICE=cpu runs the same on the CPU (for trying the script without a GPU; small shapes
# through the *_ARGS).
# A peer that fails (non-zero exit, timeout, no JSON line; e.g. peer_fsdp2 without transformers)
# is named on stderr and in OUT_DIR/peer-summary.txt, and the others still run. Exit status 0
# whatever the peers did; 2 for a usage error.
set -uo pipefail
if [[ $# -lt 1 || $# -gt 2 || "$1" == -* ]]; then
  echo "usage: bash bench/peer_gpu.sh OUT_DIR [BUDGET (default 16GiB)]" >&2
  exit 2
fi
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out="$1"
budget="${2:-16GiB}"
device="${PEER_DEVICE:-cuda}"
mkdir -p "$out" || exit 2
PY="${PYTHON:-$(command -v python3 || command -v python)}"
if [[ -z "$PY" ]]; then
  echo "peer_gpu: no python3 or python on PATH" >&2
  exit 2
fi
summary="$out/peer-summary.txt"
: > "$summary"
failed=()

note() { echo "peer_gpu: $*" | tee -a "$summary" >&2; }

# run_peer NAME SECONDS SCRIPT ARGS...: OUT_DIR/peer-NAME.json and .log; notes the outcome.
run_peer() {
  local name="$1" secs="$2" script="$3"
  shift 3
  local json="$out/peer-$name.json" log="$out/peer-$name.log" t0=$SECONDS rc
  note "$name: $PY $script $* (timeout ${secs} s)"
  timeout -k 15 "$secs" "$PY" "$ROOT/bench/$script" "$@" > "$json" 2> "$log"
  rc=$?
  local took=$((SECONDS - t0))
  local has_json=no
  if [[ -s "$json" ]] && "$PY" -c 'import json, sys
lines = [l for l in open(sys.argv[1]) if l.strip()]
json.loads(lines[-1])' "$json" 2>/dev/null; then
    has_json=yes
  fi
  if [[ $rc -eq 0 && $has_json == yes ]]; then
    note "$name: ok in ${took} s -> $json"
    return
  fi
  local why="exit $rc"
  [[ $rc -eq 124 || $rc -eq 137 ]] && why="timed out after ${secs} s"
  local last
  last="$(grep -v '^\s*$' "$log" | grep -v '^USDT:\|^ERROR:.*DeviceProperties' | tail -n 1 | cut -c1-300)"
  note "$name: FAILED ($why, ${took} s; JSON line: $has_json) ${last:+- $last}"
  failed+=("$name")
}

note "out $out, budget $budget, device $device, python $PY"
# shellcheck disable=SC2086  # the *_ARGS are word-split on purpose
run_peer vocab "${PEER_TIMEOUT:-120}" peer_vocab.py --device "$device" ${PEER_VOCAB_ARGS:-}
# shellcheck disable=SC2086
run_peer checkpoint "${PEER_TIMEOUT:-120}" peer_checkpoint.py --device "$device" ${PEER_CHECKPOINT_ARGS:-}
# shellcheck disable=SC2086
run_peer fsdp2 "${PEER_FSDP2_TIMEOUT:-240}" peer_fsdp2.py --device "$device" --budget "$budget" \
  --time-limit "${PEER_FSDP2_TIME_LIMIT:-120}" ${PEER_FSDP2_ARGS:-}

if [[ ${#failed[@]} -gt 0 ]]; then
  note "failed: ${failed[*]} (the others' JSON is in $out)"
else
  note "all three peers ran"
fi
exit 0
