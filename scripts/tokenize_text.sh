#!/usr/bin/env bash
# Runs scripts/tokenize_text.py in a venv that has the `tokenizers` package, creating it
# on first use under build/venv-tokenize (python3 -m venv; Debian 12 needs python3-venv,
# which scripts/setup.sh installs) from scripts/tokenize_requirements.txt.
#   scripts/tokenize_text.sh a.txt b.txt -o data/train.bin --train-vocab 8192 --eot --val-fraction 0.05
#   scripts/tokenize_text.sh --print-python   # create the venv if needed; print its python
# PEAKBOUND_TOKENIZE_VENV overrides the venv's folder.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
venv="${PEAKBOUND_TOKENIZE_VENV:-$here/../build/venv-tokenize}"
req="$here/tokenize_requirements.txt"
py="$venv/bin/python"
stamp="$venv/.requirements"

if ! { [ -x "$py" ] && cmp -s "$req" "$stamp" && "$py" -c "import tokenizers" 2>/dev/null; }; then
  mkdir -p "$(dirname "$venv")"
  if ! python3 -m venv --clear "$venv" >/dev/null 2>&1; then
    echo "tokenize_text: error: cannot create a venv at $venv (Debian needs python3-venv: scripts/setup.sh)" >&2
    exit 1
  fi
  if ! "$venv/bin/pip" install -q --disable-pip-version-check --no-deps -r "$req" >"$venv/pip.log" 2>&1; then
    echo "tokenize_text: error: pip could not install $(grep -v '^#' "$req" | tr '\n' ' ')(no network? see $venv/pip.log)" >&2
    exit 1
  fi
  cp "$req" "$stamp"
fi

if [ "${1:-}" = "--print-python" ]; then
  echo "$py"
  exit 0
fi
exec "$py" "$here/tokenize_text.py" "$@"
