#!/usr/bin/env python3
"""Regenerate tests/fixtures/hf/deepseek_v3_router/ from transformers' own DeepSeek-V3 router.

Why: peakbound's sigmoid group-limited router (src/peakbound/kernels/cpu/moe_router_sigmoid.h)
must select the experts and give the weights and the logits' gradient transformers'
DeepseekV3TopkRouter does. For each case this draws seeded router logits (through the router's
own f32 linear from random hidden states and weights), a random e_score_correction_bias and
random upstream gradients of the top-k weights, runs the router forward and backward in f32,
and writes:

  router.safetensors   <case>.logits [T, E], <case>.bias [E], <case>.ids [T, K] (int64, the
                       order transformers returns), <case>.weights [T, K], <case>.dweights
                       [T, K], <case>.dlogits [T, E] (d sum(weights * dweights) / d logits)
  reference.json       versions and each case's routing settings

Run from the repository root with the virtual environment of requirements.txt:
  scripts/hf_reference/.venv/bin/python scripts/hf_reference/make_router_fixture.py
"""
import argparse
import json
import os
import platform

import torch
import transformers
from safetensors.torch import save_file
from transformers import DeepseekV3Config
from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3TopkRouter

# DeepSeek-V3's shape in small (groups of experts, top-k groups, renormalized, scaled) and
# Kimi-K2's (one group, no group limit); T odd.
CASES = {
    "grouped": dict(T=37, H=24, E=16, K=3, n_group=4, topk_group=2, norm_topk_prob=True,
                    routed_scaling_factor=2.5, seed=11),
    "one_group": dict(T=29, H=20, E=12, K=4, n_group=1, topk_group=1, norm_topk_prob=False,
                      routed_scaling_factor=1.0, seed=12),
}


def run(case):
    g = torch.Generator().manual_seed(case["seed"])
    cfg = DeepseekV3Config(hidden_size=case["H"], n_routed_experts=case["E"], num_experts_per_tok=case["K"],
                           n_group=case["n_group"], topk_group=case["topk_group"],
                           norm_topk_prob=case["norm_topk_prob"],
                           routed_scaling_factor=case["routed_scaling_factor"])
    router = DeepseekV3TopkRouter(cfg)
    with torch.no_grad():
        router.weight.copy_(torch.randn(case["E"], case["H"], generator=g) * 0.5)
        router.e_score_correction_bias.copy_(torch.randn(case["E"], generator=g) * 0.05)
    x = torch.randn(case["T"], case["H"], generator=g)
    logits, weights, ids = router(x)
    logits.retain_grad()
    dweights = torch.randn(weights.shape, generator=g)
    (weights * dweights).sum().backward()
    return {"logits": logits.detach(), "bias": router.e_score_correction_bias.detach().clone(),
            "ids": ids.to(torch.int64), "weights": weights.detach(), "dweights": dweights,
            "dlogits": logits.grad.detach()}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="tests/fixtures/hf", help="fixture root (default %(default)s)")
    a = ap.parse_args()
    torch.manual_seed(0)
    tensors = {}
    for name, case in CASES.items():
        for k, v in run(case).items():
            tensors[f"{name}.{k}"] = v.contiguous()
    d = os.path.join(a.out, "deepseek_v3_router")
    os.makedirs(d, exist_ok=True)
    save_file(tensors, os.path.join(d, "router.safetensors"))
    os.chmod(os.path.join(d, "router.safetensors"), 0o644)
    with open(os.path.join(d, "reference.json"), "w") as f:
        json.dump({"transformers": transformers.__version__, "torch": torch.__version__,
                   "python": platform.python_version(),
                   "module": "transformers.models.deepseek_v3.modeling_deepseek_v3.DeepseekV3TopkRouter",
                   "cases": CASES}, f, indent=1)
        f.write("\n")
    print(json.dumps({"out": d, "tensors": len(tensors)}))


if __name__ == "__main__":
    main()
