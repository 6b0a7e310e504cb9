"""peakbound.Run (the library's run object) against `peakbound train` (the CLI it carries)."""

import json
import os
import shutil
import subprocess
import sys

import pytest

import peakbound
from conftest import cli, launch_env

SETTINGS = dict(model="tiny-moe", steps=20, seq_len=96, eval_every=10, eval_batches=2)


def cli_args(settings):
    return [a for k, v in settings.items() for a in (f"--{k.replace('_', '-')}", str(v))]


def read_metrics(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.parametrize("precision", ["bf16", "f32"])
def test_twenty_steps_give_the_clis_losses_bit_for_bit(tmp_path, precision):
    s = {**SETTINGS, "precision": precision}
    cli("train", *cli_args(s), "--metrics", str(tmp_path / "cli.jsonl"), "--json")
    ref = read_metrics(tmp_path / "cli.jsonl")
    with peakbound.Run(s, metrics=tmp_path / "py.jsonl") as run:
        steps = list(run)
        assert run.done and run.steps_done == 20
        summary = run.finish()
    assert len(steps) == len(ref) == 20
    for mine, theirs in zip(steps, ref):
        for k in ("step", "loss", "ce", "aux", "lr", "grad_norm", "scored_tokens", "eval_loss", "skipped"):
            assert mine.get(k) == theirs.get(k), (k, mine, theirs)
    # The run's own metrics file is the same lines.
    assert [m["loss"] for m in read_metrics(tmp_path / "py.jsonl")] == [m["loss"] for m in ref]
    assert summary.first_loss == steps[0]["ce"] and summary.final_loss == steps[-1]["ce"]
    assert summary.steps == 20
    # Planned beside measured: the table the CLI prints, every component measured == planned.
    assert "planned" in run.table and "measured" in run.table
    assert summary.peaks.total.measured_bytes > 0
    for name, c in summary.peaks.items():
        assert c["measured_bytes"] == c["planned_bytes"], name


MPI_SCRIPT = """
import json, os, sys
import peakbound
with peakbound.Run(model="tiny-moe", steps=4, seq_len=64, eval_batches=0, precision="f32") as run:
    steps = list(run)
    run.finish()
with open(os.path.join(sys.argv[1], "rank-" + os.environ["OMPI_COMM_WORLD_RANK"] + ".json"), "w") as f:
    json.dump({"rank_steps": [[s["loss"], s["grad_norm"]] for s in steps], "ranks": run.summary["ranks"]}, f)
"""


@pytest.mark.skipif(shutil.which("mpirun") is None, reason="no mpirun (scripts/setup.sh installs openmpi-bin)")
def test_two_ranks_under_mpirun_give_the_clis_losses(tmp_path):
    root = ["--allow-run-as-root"] if os.geteuid() == 0 else []
    env = {**launch_env(), "OMPI_MCA_mpi_yield_when_idle": "1"}
    r = subprocess.run(["mpirun", *root, "--oversubscribe", "-np", "2", sys.executable, "-c", MPI_SCRIPT,
                        str(tmp_path)], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank-{i}.json").read_text()) for i in range(2)]
    assert len(ranks) == 2 and all(x["ranks"] == 2 for x in ranks)
    assert ranks[0]["rank_steps"] == ranks[1]["rank_steps"]  # every rank's step says the same
    subprocess.run(["mpirun", *root, "--oversubscribe", "-np", "2", peakbound.cli_path(), "train", "--model",
                    "tiny-moe", "--steps", "4", "--seq-len", "64", "--eval-batches", "0", "--precision", "f32",
                    "--metrics", str(tmp_path / "cli.jsonl")], capture_output=True, text=True, env=env, check=True,
                   timeout=300)
    ref = [[m["loss"], m["grad_norm"]] for m in read_metrics(tmp_path / "cli.jsonl")]
    assert ranks[0]["rank_steps"] == ref


def test_save_and_resume_continue_exactly(tmp_path):
    s = {**SETTINGS, "steps": 6, "precision": "f32", "eval_batches": 0}
    with peakbound.Run(s) as straight:
        losses = [st["loss"] for st in straight]
    with peakbound.Run({**s, "steps": 6}) as first:
        for _ in range(3):
            first.step()
        where = first.save(tmp_path / "ckpt")
        assert where.endswith("step-00000003") and (tmp_path / "ckpt").is_dir()
        assert first.last_saved == where
        with pytest.raises(ValueError, match="saves to"):
            first.save(tmp_path / "elsewhere")
    with peakbound.Run.resume(tmp_path / "ckpt", s) as resumed:
        assert resumed.steps_done == 3
        rest = [st["loss"] for st in resumed]
    assert rest == losses[3:]


def test_save_into_a_file_is_refused_as_save_dir_is(tmp_path):
    (tmp_path / "a-file").write_text("x")
    with peakbound.Run({**SETTINGS, "steps": 1, "eval_batches": 0}) as run:
        run.step()
        with pytest.raises(peakbound.Error, match="exists and is not a folder"):
            run.save(tmp_path / "a-file")


def test_evaluate_and_finish_order(tmp_path):
    with peakbound.Run({**SETTINGS, "steps": 2, "eval_every": 0}) as run:
        with pytest.raises(ValueError, match="step until done"):
            run.finish()
        run.step()
        loss = run.evaluate()
        assert 0 < loss < 20
        run.step()
        with pytest.raises(ValueError, match="every step is taken"):
            run.step()
        run.finish()
        assert run.summary["steps"] == 2


def test_a_closed_run_refuses_in_one_line():
    run = peakbound.Run({**SETTINGS, "steps": 1, "eval_batches": 0})
    run.close()
    for call in (run.step, run.evaluate, run.finish, lambda: run.done):
        with pytest.raises(peakbound.Error, match="this run is closed"):
            call()


def test_print_receives_the_clis_lines():
    lines = []
    with peakbound.Run({**SETTINGS, "steps": 1, "eval_batches": 0}, print=lines.append) as run:
        list(run)
        run.finish()
    text = "".join(lines)
    assert "plan" in text.lower()


@pytest.mark.parametrize("kw, message", [
    (dict(seq_len=3), "--seq-len"),
    (dict(steps=0), "--steps"),
    (dict(precision="fp8"), "--precision"),
    (dict(schedules="llep,nope"), "--schedules"),
    (dict(model="no-such-model"), "no-such-model"),
    (dict(cp=3), None),
    (dict(bogus=True), "unknown key 'bogus'"),
])
def test_bad_settings_raise_the_libraries_one_line_error(kw, message):
    with pytest.raises(ValueError) as e:
        peakbound.Run({**SETTINGS, **kw})
    text = str(e.value)
    assert isinstance(e.value, peakbound.Error) and text and "\n" not in text
    if message:
        assert message in text


def test_wrong_types_raise_type_error():
    with pytest.raises(TypeError):
        peakbound.Run(steps=[1])
    with pytest.raises(TypeError):
        peakbound.Run(print=3)
    with pytest.raises(TypeError):
        peakbound.Run(json=True)
