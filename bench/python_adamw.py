#!/usr/bin/env python3
"""peakbound.torch.OffloadStreamAdamW against torch.optim.AdamW(fused=True) on the CPU,
side by side on the same parameters and gradients: one JSON object on stdout.

The two take turns for --rounds rounds (peakbound, then torch, per round), each round
keeping the median of its --steps timed steps after --warmup; every ratio is reported per
round with its min, median and max. Run it in the package's venv:

    bash scripts/python.sh install
    build/venv-python/bin/python bench/python_adamw.py [--params 64M] [--tensors 8] [--dtype f32|bf16]
"""
import argparse
import json
import os
import platform
import statistics
import time

import torch

import peakbound
from peakbound.torch import OffloadStreamAdamW


def count(text: str) -> int:
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:].upper(), 1)
    return int(text[:-1] if mult > 1 else text) * mult


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--params", default="64M")
    ap.add_argument("--tensors", type=int, default=8)
    ap.add_argument("--dtype", choices=["f32", "bf16"], default="f32")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    n = count(a.params)
    dtype = torch.float32 if a.dtype == "f32" else torch.bfloat16
    sizes = [n // a.tensors + (1 if i < n % a.tensors else 0) for i in range(a.tensors)]
    def make():  # every side the same parameters and gradients
        g = torch.Generator().manual_seed(0)
        ps = [torch.nn.Parameter(torch.randn(s, generator=g).to(dtype)) for s in sizes]
        for p in ps:
            p.grad = torch.randn(p.shape, generator=g).to(dtype)
        return ps

    # torch's fused CPU AdamW updates the parameters themselves (bf16 parameters: in bf16,
    # no fp32 master); peakbound keeps m and v (and a bf16 parameter's fp32 master) in its
    # host memory, directly on the tensors or streamed through the offload schedule.
    sides = {"peakbound_direct": OffloadStreamAdamW(make(), lr=1e-4),
             "peakbound_streamed": OffloadStreamAdamW(make(), lr=1e-4, streamed=True),
             "torch_fused": torch.optim.AdamW(make(), lr=1e-4, fused=True)}

    def params(opt):
        return [p.detach() for group in opt.param_groups for p in group["params"]]

    def timed(opt) -> float:
        for _ in range(a.warmup):
            opt.step()
        ts = []
        for _ in range(a.steps):
            t0 = time.perf_counter()
            opt.step()
            ts.append(time.perf_counter() - t0)
        return statistics.median(ts)

    rounds = []
    for _ in range(a.rounds):
        r = {name: timed(opt) for name, opt in sides.items()}
        r["speedup_direct"] = r["torch_fused"] / r["peakbound_direct"]
        r["speedup_streamed"] = r["torch_fused"] / r["peakbound_streamed"]
        rounds.append(r)

    def spread(key):
        xs = [r[key] for r in rounds]
        return {"min": min(xs), "median": statistics.median(xs), "max": max(xs)}
    # Every side took the same steps on the same gradients: the parameters' largest
    # difference from torch's, over the largest parameter (bf16: each side's own rounding).
    ref = params(sides["torch_fused"])

    def max_rel_err(name):
        mine = params(sides[name])
        return max(float((a.double() - b.double()).abs().max()) for a, b in zip(mine, ref)) / \
            max(float(b.double().abs().max()) for b in ref)

    print(json.dumps({
        "bench": "python_adamw", "params": n, "tensors": a.tensors, "dtype": a.dtype,
        "threads": torch.get_num_threads(), "torch": torch.__version__, "peakbound": peakbound.__version__,
        "cpu": platform.processor() or platform.machine(), "load": os.getloadavg()[0],
        "rounds": rounds,
        "statistic": "per round each side's median step seconds; speedup = torch fused seconds / peakbound seconds",
        "speedup_direct": spread("speedup_direct"), "speedup_streamed": spread("speedup_streamed"),
        "max_rel_err_vs_torch": {"direct": max_rel_err("peakbound_direct"),
                                 "streamed": max_rel_err("peakbound_streamed")},
    }))


if __name__ == "__main__":
    main()
