"""Shared by the Python package's tests: the CLI the package carries, run as a process."""

import os
import subprocess

import peakbound


def launch_env() -> dict:
    """This process's environment without its MPI launcher's variables (a test run under
    mpirun must not make the processes it starts believe they are its ranks)."""
    return {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_", "PMIX_"))}


def cli(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run([peakbound.cli_path(), *args], capture_output=True, text=True, check=check, env=launch_env())
