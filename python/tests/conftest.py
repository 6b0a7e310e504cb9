"""Shared by the Python package's tests: the CLI the package carries, run as a process."""

import json
import os
import subprocess

import pytest

import peakbound


def cli(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_", "PMIX_"))}
    return subprocess.run([peakbound.cli_path(), *args], capture_output=True, text=True, check=check, env=env)


def cli_json(*args: str) -> dict:
    """The last stdout line of a CLI command given --json, parsed."""
    out = cli(*args).stdout.strip().splitlines()
    return json.loads("\n".join(out) if out and out[0].startswith("{") and not out[-1].startswith("{") else out[-1])


@pytest.fixture
def tmp(tmp_path):
    return tmp_path
