"""peakbound.plan against `peakbound plan --json` (the CLI the package carries)."""

import json

import pytest

import peakbound
from conftest import cli


def cli_plan(*args: str) -> dict:
    return json.loads(cli("plan", "--json", *args).stdout)


@pytest.mark.parametrize("model", ["tiny-moe", "qwen3-30b-a3b", "deepseek-v3", "gpt-oss-120b", "mixtral-8x22b", "kimi-k2", "tiny-deepseek"])
def test_presets_equal_the_cli(model):
    p = peakbound.plan(model=model, context="128K", devices=8, device_memory="80GiB")
    assert p.to_dict() == cli_plan("--model", model, "--seq-len", "128K", "--devices", "8", "--device-memory", "80GiB")
    assert str(p) == cli("plan", "--model", model, "--seq-len", "128K", "--devices", "8",
                         "--device-memory", "80GiB").stdout


def test_the_issues_example_and_typed_fields():
    p = peakbound.plan(model="qwen3-30b-a3b", context="128K", devices=8, device_memory="80GiB")
    assert p.model == "qwen3-30b-a3b"
    assert p.run.context == 131072 and p.layout.devices == 8
    assert p.peak_bytes.scheduled == p["peak_bytes"]["scheduled"] < p.peak_bytes.baseline
    assert isinstance(p.fits.scheduled, bool)
    assert "qwen3-30b-a3b" in repr(p) and "peak" in str(p)
    with pytest.raises(AttributeError, match="no field 'nope'"):
        p.nope
    import copy
    import pickle
    assert copy.deepcopy(p).to_dict() == p.to_dict() and str(copy.copy(p)) == str(p)
    assert pickle.loads(pickle.dumps(p.peak_bytes)).to_dict() == p.peak_bytes.to_dict()


def test_defaults_are_the_clis():
    assert peakbound.plan().to_dict() == cli_plan()


def test_every_knob_reaches_the_planner():
    kw = dict(model="tiny-moe", context=70001, devices=6, device_memory="3GiB", host_memory="64GiB", cp=2,
              ep=2, vocab_group=3, schedules=["llep", "dtp", "sco"], precision="f32", vocab_chunk=129,
              skew=1.5, keep_attention=True, prefetch_depth=0, trainer_defaults=True)
    args = ["--model", "tiny-moe", "--seq-len", "70001", "--devices", "6", "--device-memory", "3GiB",
            "--host-memory", "64GiB", "--cp", "2", "--ep", "2", "--vocab-group", "3", "--schedules", "llep,dtp,sco",
            "--precision", "f32", "--vocab-chunk", "129", "--skew", "1.5", "--keep-attention",
            "--prefetch-depth", "0", "--trainer-defaults"]
    assert peakbound.plan(**kw).to_dict() == cli_plan(*args)
    # A changed input changes the result (the keywords are not ignored).
    assert peakbound.plan(**{**kw, "vocab_chunk": 64}).to_dict() != cli_plan(*args)


ODD = {"model_type": "qwen3_moe", "vocab_size": 1003, "hidden_size": 96, "intermediate_size": 160,
       "moe_intermediate_size": 40, "num_hidden_layers": 3, "num_attention_heads": 6, "num_key_value_heads": 2,
       "head_dim": 16, "num_experts": 7, "num_experts_per_tok": 3, "decoder_sparse_step": 1,
       "max_position_embeddings": 4096, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "norm_topk_prob": True,
       "tie_word_embeddings": False}


def test_an_odd_config_as_dict_and_as_file(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(ODD))
    by_dict = peakbound.plan(model=ODD, context=5003, devices=3, device_memory="1GiB", ep=1)
    by_path = peakbound.plan(model=path, context=5003, devices=3, device_memory="1GiB", ep=1)
    ref = cli_plan("--model", str(path), "--seq-len", "5003", "--devices", "3", "--device-memory", "1GiB", "--ep", "1")
    assert by_path.to_dict() == ref
    assert {k: v for k, v in by_dict.to_dict().items() if k != "model"} == {k: v for k, v in ref.items() if k != "model"}


def test_reach_equals_the_clis():
    p = peakbound.plan(model="qwen3-30b-a3b", context="128K", devices=64, device_memory="80GiB")
    r = p.reach()
    ref = cli_plan("--model", "qwen3-30b-a3b", "--seq-len", "128K", "--devices", "64", "--device-memory", "80GiB",
                   "--reach")
    assert (r.baseline, r.scheduled, r.ratio) == (ref["reach_tokens"]["baseline"], ref["reach_tokens"]["scheduled"],
                                                  ref["reach_ratio"])
    assert r.scheduled > r.baseline > 0
    assert peakbound.plan(model="qwen3-30b-a3b", context="128K", devices=64, device_memory="80GiB",
                          reach=True).to_dict() == ref
    # Where the baseline's fixed state alone is over the budget it fits no context: no ratio
    # (4 devices: at 8 the baseline fits 16460 tokens since a one-rank store lives in the
    # optimizer's shard instead of beside it).
    r4 = peakbound.plan(model="qwen3-30b-a3b", context="128K", devices=4, device_memory="80GiB").reach()
    assert r4.baseline == 0 and r4.ratio is None and r4.scheduled > 0


@pytest.mark.parametrize("kw, message", [
    (dict(devices=0), "peakbound.plan: --devices"),
    (dict(device_memory="lots"), "--device-memory: 'lots' is not a number"),
    (dict(model="no-such-model"), "no-such-model"),
    (dict(nonsense=1), "unknown key 'nonsense'"),
    (dict(cp=3, devices=8), None),
])
def test_bad_values_raise_the_libraries_one_line_error(kw, message):
    with pytest.raises(ValueError) as e:
        peakbound.plan(**kw)
    assert isinstance(e.value, peakbound.Error)
    text = str(e.value)
    assert "\n" not in text and text
    if message:
        assert message in text
    # The CLI says the same (its line after "peakbound: error: ").
    if "nonsense" not in kw:
        args = [a for k, v in kw.items() for a in (f"--{k.replace('_', '-')}", str(v))]
        r = cli("plan", *args, check=False)
        assert r.returncode != 0 and text.split(": ", 1)[-1] in r.stderr


@pytest.mark.parametrize("kw", [dict(devices=[8]), dict(context={"a": 1}), dict(cp=object())])
def test_wrong_types_raise_type_error(kw):
    with pytest.raises(TypeError, match="peakbound.plan: .* must be a str, int, float, bool or path"):
        peakbound.plan(**kw)
