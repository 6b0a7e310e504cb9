"""peakbound.Run (the library's run object) against `peakbound train` (the CLI it carries)."""

import json

import pytest

import peakbound
from conftest import cli

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
