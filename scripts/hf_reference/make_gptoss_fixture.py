#!/usr/bin/env python3
"""Regenerate tests/fixtures/hf/gpt_oss_parts/ from transformers' own gpt-oss modules.

Why: peakbound builds gpt-oss (model_type gpt_oss) from parts, each matched against the
transformers code it stands for before a model uses it. This writes, in f32 on the CPU:

  gpt_oss_parts.safetensors
    swiglu.gate_up [T, 2I]    seeded values, about a third past the clamp limit 7 either way,
                              gate and up interleaved along the last axis (gpt-oss's layout)
    swiglu.out [T, I]         GptOssExperts._apply_gate(gate_up)
    swiglu.dout [T, I]        a seeded upstream gradient
    swiglu.dgate_up [T, 2I]   d sum(out * dout) / d gate_up (autograd), interleaved
  reference.json              versions, alpha and limit

Run from the repository root with the virtual environment of requirements.txt:
  scripts/hf_reference/.venv/bin/python scripts/hf_reference/make_gptoss_fixture.py
"""
import argparse
import json
import os
import platform

import torch
import transformers
from safetensors.torch import save_file
from transformers import GptOssConfig
from transformers.models.gpt_oss.modeling_gpt_oss import GptOssExperts

T, I = 23, 13
SEED = 77


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="tests/fixtures/hf", help="fixture root (default %(default)s)")
    a = ap.parse_args()
    g = torch.Generator().manual_seed(SEED)
    cfg = GptOssConfig(hidden_size=8, intermediate_size=I, num_local_experts=2)
    experts = GptOssExperts(cfg)
    gate_up = (torch.randn(T, 2 * I, generator=g) * 7.0).requires_grad_(True)
    with torch.no_grad():  # the clamp bounds themselves (torch stops the gradient on them)
        gate_up[0, 0] = cfg.swiglu_limit
        gate_up[0, 1] = -cfg.swiglu_limit
        gate_up[0, 3] = cfg.swiglu_limit
    out = experts._apply_gate(gate_up)
    dout = torch.randn(out.shape, generator=g)
    (out * dout).sum().backward()
    d = os.path.join(a.out, "gpt_oss_parts")
    os.makedirs(d, exist_ok=True)
    path = os.path.join(d, "gpt_oss_parts.safetensors")
    save_file({"swiglu.gate_up": gate_up.detach().contiguous(), "swiglu.out": out.detach().contiguous(),
               "swiglu.dout": dout.contiguous(), "swiglu.dgate_up": gate_up.grad.contiguous()}, path)
    os.chmod(path, 0o644)
    with open(os.path.join(d, "reference.json"), "w") as f:
        json.dump({"transformers": transformers.__version__, "torch": torch.__version__,
                   "python": platform.python_version(), "seed": SEED, "T": T, "I": I,
                   "swiglu_alpha": experts.alpha, "swiglu_limit": experts.limit,
                   "module": "transformers.models.gpt_oss.modeling_gpt_oss.GptOssExperts._apply_gate"}, f, indent=1)
        f.write("\n")
    print(json.dumps({"out": d}))


if __name__ == "__main__":
    main()
