#!/usr/bin/env bash
# The Python package (pyproject.toml, python/): a venv in build/venv-python with the
# pinned requirements (python/requirements-*.txt), the package installed into it from the
# release build tree (the library and CLI objects the test suite built are reused: nothing
# is compiled a second time), then its tests (pytest python/tests).
#   scripts/python.sh venv      # create or update the venv only (build requirements); print its python
#   scripts/python.sh install   # venv + `pip install .` into it (build/release); scripts/run.sh runs this
#   scripts/python.sh test      # + the test requirements, install, pytest (the README's test command)
# PEAKBOUND_PYTHON_VENV overrides the venv's folder.
set -euo pipefail
cd "$(dirname "$0")/.."
what="${1:-test}"
venv="${PEAKBOUND_PYTHON_VENV:-$PWD/build/venv-python}"
py="$venv/bin/python"

# Installs requirement file $1 into the venv unless its stamp says it is there already.
need() {
  local req="$1" stamp="$venv/.$(basename "$1")"
  cmp -s "$req" "$stamp" 2>/dev/null && return 0
  if ! "$venv/bin/pip" install -q --disable-pip-version-check -r "$req" >"$venv/pip.log" 2>&1; then
    echo "python.sh: error: pip could not install the requirements of $req (no network? see $venv/pip.log)" >&2
    exit 1
  fi
  cp "$req" "$stamp"
}
# The build's requirements (scikit-build-core, nanobind) always; the tests' (pytest, torch,
# transformers: ~5 GB) only for `test`. A venv whose build requirements changed is made anew.
if ! { [ -x "$py" ] && cmp -s python/requirements-build.txt "$venv/.requirements-build.txt"; }; then
  mkdir -p "$(dirname "$venv")"
  if ! python3 -m venv --clear "$venv" >/dev/null 2>&1; then
    echo "python.sh: error: cannot create a venv at $venv (Debian needs python3-venv: scripts/setup.sh)" >&2
    exit 1
  fi
fi
need python/requirements-build.txt
if [ "$what" = test ]; then need python/requirements-test.txt; fi
if [ "$what" = venv ]; then
  echo "$py"
  exit 0
fi

# The release tree with the module on (scripts/build.sh's configure, plus this venv's
# python), then `pip install .` pointed at the same tree: scikit-build-core reconfigures
# it with the same cache and builds the module and the CLI (already built: nothing to do)
# and installs them with python/peakbound.
cmake --preset release -DPEAKBOUND_PYTHON=ON -DPython_EXECUTABLE="$py" >/dev/null
cmake --build --preset release --target peakbound_python peakbound
"$venv/bin/pip" install -q --disable-pip-version-check --no-build-isolation --no-deps \
  -C build-dir=build/release -C cmake.define.PEAKBOUND_BUILD_TESTS=ON -C cmake.define.Python_EXECUTABLE="$py" . \
  >"$venv/install.log" 2>&1 || { tail -30 "$venv/install.log" >&2; echo "python.sh: error: pip install . failed (see $venv/install.log)" >&2; exit 1; }
if [ "$what" = install ]; then
  exit 0
fi
# From outside the source tree, so that the installed package is what is imported.
cd python/tests
exec "$py" -m pytest -q -p no:cacheprovider .
