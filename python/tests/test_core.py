"""The package itself: its version, its CLI, and the OpenBLAS kernels it chose."""

import json
import subprocess
import sys

import peakbound
from conftest import cli


def test_version_and_the_carried_cli():
    assert peakbound.__version__ == cli("--version").stdout.split()[1]
    r = subprocess.run([sys.executable, "-m", "peakbound", "--version"], capture_output=True, text=True)
    assert r.returncode == 0 and peakbound.__version__ in r.stdout


def test_openblas_kernels_are_the_clis_choice():
    info = json.loads(cli("info", "--json").stdout)
    assert peakbound._core.blas_core_name() == info["blas_core"], info
