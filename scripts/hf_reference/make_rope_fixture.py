#!/usr/bin/env python3
"""Regenerate tests/fixtures/hf/rope_yarn/reference.json from transformers' own YaRN.

Why: peakbound reads rope_type "yarn" from config.json (src/peakbound/model/hf_config.cc) and
computes its frequencies and cos/sin factor (src/peakbound/model/rope_scaling.h); both must be
transformers' (modeling_rope_utils._compute_yarn_parameters). For each case this builds the
family's config with transformers, asks transformers' rope init function for the inverse
frequencies (float32) and the attention factor, and writes the config.json text beside them:

  reference.json  {case: {"config": config.json as a dict, "dim": rotary dim,
                          "inv_freq": [...], "attention_factor": x}}

Cases: Qwen3-MoE's long-context form (factor 4 over 32768), gpt-oss-120b's (factor 32,
truncate false), DeepSeek-V3's (factor 40, mscale = mscale_all_dim = 1), one with
mscale 0.707 against mscale_all_dim 1 (their ratio scales cos and sin), one without a factor
(max_position_embeddings / original), one with an explicit attention_factor, and one in the
legacy rope_scaling spelling with "type".

Run from the repository root with the virtual environment of requirements.txt:
  scripts/hf_reference/.venv/bin/python scripts/hf_reference/make_rope_fixture.py
"""
import argparse
import json
import os
import platform

import torch
import transformers
from transformers import DeepseekV3Config, GptOssConfig, Qwen3MoeConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS


def cases():
    small = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, vocab_size=64)
    yield "qwen3_moe", Qwen3MoeConfig(**small, head_dim=128, max_position_embeddings=131072, rope_parameters={
        "rope_type": "yarn", "rope_theta": 1000000.0, "factor": 4.0, "original_max_position_embeddings": 32768})
    yield "gpt_oss", GptOssConfig(**small, head_dim=64, max_position_embeddings=131072, rope_parameters={
        "rope_type": "yarn", "rope_theta": 150000.0, "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
        "original_max_position_embeddings": 4096, "truncate": False})
    yield "deepseek_v3", DeepseekV3Config(**small, first_k_dense_replace=1, max_position_embeddings=163840,
                                          qk_rope_head_dim=64, rope_parameters={
        "rope_type": "yarn", "rope_theta": 10000.0, "factor": 40.0, "beta_fast": 32, "beta_slow": 1, "mscale": 1.0,
        "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096})
    yield "mscale_ratio", DeepseekV3Config(**small, first_k_dense_replace=1, max_position_embeddings=163840,
                                           qk_rope_head_dim=64,
                                           rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 16.0,
                                                            "mscale": 0.707, "mscale_all_dim": 1.0,
                                                            "original_max_position_embeddings": 4096})
    yield "no_factor", Qwen3MoeConfig(**small, head_dim=64, max_position_embeddings=65536, rope_parameters={
        "rope_type": "yarn", "rope_theta": 10000.0, "factor": None, "original_max_position_embeddings": 8192})
    yield "attention_factor", Qwen3MoeConfig(**small, head_dim=32, max_position_embeddings=65536, rope_parameters={
        "rope_type": "yarn", "rope_theta": 10000.0, "factor": 8.0, "attention_factor": 1.25,
        "original_max_position_embeddings": 8192})


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="tests/fixtures/hf", help="fixture root (default %(default)s)")
    a = ap.parse_args()
    out = {"transformers": transformers.__version__, "torch": torch.__version__, "python": platform.python_version(),
           "function": "transformers.modeling_rope_utils._compute_yarn_parameters", "cases": {}}
    for name, cfg in cases():
        inv_freq, attention_factor = ROPE_INIT_FUNCTIONS["yarn"](cfg, "cpu")
        as_dict = json.loads(cfg.to_json_string(use_diff=False))
        out["cases"][name] = {"config": as_dict, "dim": 2 * len(inv_freq),
                              "inv_freq": [float(x) for x in inv_freq.tolist()],
                              "attention_factor": float(attention_factor)}
    # The legacy spelling: transformers 4's rope_scaling with "type", read the same way.
    legacy = json.loads(json.dumps(out["cases"]["qwen3_moe"]))
    params = legacy["config"].pop("rope_parameters")
    legacy["config"]["rope_theta"] = params.pop("rope_theta")
    params["type"] = params.pop("rope_type")
    legacy["config"]["rope_scaling"] = params
    out["cases"]["legacy_rope_scaling"] = legacy
    d = os.path.join(a.out, "rope_yarn")
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "reference.json"), "w") as f:
        json.dump(out, f, indent=1, sort_keys=True)
        f.write("\n")
    print(json.dumps({"out": d, "cases": list(out["cases"])}))


if __name__ == "__main__":
    main()
