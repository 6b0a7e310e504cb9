"""examples/python/quickstart.py runs as the README says (it asserts its own results)."""

import pathlib
import subprocess
import sys

EXAMPLE = pathlib.Path(__file__).resolve().parents[2] / "examples" / "python" / "quickstart.py"


def test_quickstart_runs():
    r = subprocess.run([sys.executable, str(EXAMPLE)], capture_output=True, text=True, cwd=EXAMPLE.parent)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    assert "context reach" in r.stdout and "Ring-DTP's" in r.stdout
