#!/usr/bin/env python3
"""PyTorch/transformers reference for peakbound's `train` on the built-in copy task: does bf16
with fp32 masters learn it as f32 does? (docs/precision.md, "Training in bf16").
Run with scripts/hf_reference/.venv/bin/python (torch, transformers); --help for the flags.

Model: bench/peer_fsdp2_model.json as Qwen3MoeForCausalLM (q_norm/k_norm -> Identity, as
bench/peer_fsdp2.py does), every non-norm weight re-drawn N(0, 0.02), norms 1 (peakbound's init).
Task: CopyTask{vocab 16384, S 128, symbols 64}: BOS, r_1..r_63, SEP, r_1..r_63, filler; inputs =
tok[0:128], target[i] = tok[i+1] where tok[i+1] is in the second copy after its first symbol
(62 scored tokens per sequence), else ignored.
Hyper-parameters: peakbound train defaults: AdamW(betas 0.9/0.95, eps 1e-8, wd 0), peak lr 2e-3,
linear warm-up 10 steps, cosine to 2e-4 at step 300, clip 1.0, loss = CE (mean over the scored
tokens of the 4 sequences) + 0.01 * transformers' router aux loss. 4 sequences per step.
Held-out: CE over the scored tokens of 16 fixed held-out sequences (peakbound: 4 eval batches x
4 ranks x 1 sequence) every 50 steps.

Variants: f32 | bf16master (bf16 model computes, fp32 masters + fp32 AdamW, round-to-nearest
copy back) | autocast (torch.autocast cpu bf16, fp32 params).
"""
import argparse
import json
import os
import math
import sys
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

CONFIG = os.path.join(os.path.dirname(os.path.abspath(__file__)), "peer_fsdp2_model.json")
BOS, SEP, FIRST = 0, 1, 2
IGNORE = -100


def copy_sequence(rng, S=128, symbols=64):
    n = (S - 1) // 2
    total = S + 1
    tok = np.full(total, SEP, dtype=np.int64)
    scored = np.zeros(total, dtype=bool)
    tok[0] = BOS
    seg = FIRST + rng.integers(0, symbols, size=n)
    tok[1:1 + n] = seg
    tok[2 + n:2 + 2 * n] = seg
    scored[3 + n:2 + 2 * n] = True  # i > 0 of the second copy
    for p in range(2 + 2 * n, total):
        tok[p] = FIRST + rng.integers(0, symbols)
    inputs = tok[:-1].copy()
    targets = np.where(scored[1:], tok[1:], IGNORE)
    return inputs, targets


def batch(seed, stream, first, count, S, symbols):
    ins, tgs = [], []
    for k in range(count):
        rng = np.random.default_rng([seed, stream, first + k])
        i, t = copy_sequence(rng, S, symbols)
        ins.append(i)
        tgs.append(t)
    return torch.tensor(np.stack(ins)), torch.tensor(np.stack(tgs))


def lr_at(step, base=2e-3, min_lr=2e-4, warmup=10, total=300):
    if warmup > 0 and step <= warmup:
        return base * step / warmup
    if total <= warmup:
        return base
    progress = (min(step, total) - warmup) / (total - warmup)
    return min_lr + (base - min_lr) * 0.5 * (1 + math.cos(math.pi * progress))


def build_model(seed):
    from transformers import AutoConfig, AutoModelForCausalLM
    with open(CONFIG) as f:
        fields = json.load(f)
    config = AutoConfig.for_model(fields.pop("model_type"), **fields)
    config.use_cache = False
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa", dtype=torch.float32)
    for layer in model.model.layers:
        layer.self_attn.q_norm = nn.Identity()
        layer.self_attn.k_norm = nn.Identity()
    g = torch.Generator().manual_seed(1000 + seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.fill_(1.0)
            else:
                p.copy_(torch.randn(p.shape, generator=g) * config.initializer_range)
    return model, config


def losses(model, config, ids, tgt, ctx):
    with ctx():
        out = model(input_ids=ids, output_router_logits=True)
        logits = out.logits.float()
        ce = F.cross_entropy(logits.view(-1, logits.shape[-1]), tgt.view(-1), ignore_index=IGNORE)
        aux = out.aux_loss.float() if getattr(out, "aux_loss", None) is not None else torch.zeros(())
    return ce, aux


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--variant", choices=["f32", "bf16master", "autocast"], required=True)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--eval-seqs", type=int, default=16)
    ap.add_argument("--eval-every", type=int, default=50)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    S, symbols = 128, 64

    model, config = build_model(a.seed)
    coef = config.router_aux_loss_coef
    nparams = sum(p.numel() for p in model.parameters())
    import contextlib
    if a.variant == "f32":
        run_model = model
        masters = list(model.parameters())
        ctx = contextlib.nullcontext
    elif a.variant == "autocast":
        run_model = model
        masters = list(model.parameters())
        ctx = lambda: torch.autocast("cpu", dtype=torch.bfloat16)
    else:
        masters = [p.detach().clone().requires_grad_(False) for p in model.parameters()]
        run_model = model.to(torch.bfloat16)  # round-to-nearest of the fp32 init
        ctx = contextlib.nullcontext
        for m in masters:
            m.grad = torch.zeros_like(m)
    opt = torch.optim.AdamW(masters, lr=2e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.0,
                            foreach=False)
    eval_ids, eval_tgt = batch(a.seed, 1, 0, a.eval_seqs, S, symbols)

    def evaluate():
        run_model.eval()
        with torch.no_grad():
            ce, _ = losses(run_model, config, eval_ids, eval_tgt, ctx)
        run_model.train()
        return ce.item()

    log = open(a.out, "w")
    rec = {"variant": a.variant, "seed": a.seed, "params": nparams, "threads": a.threads,
           "torch": torch.__version__}
    log.write(json.dumps(rec) + "\n")
    t0 = time.time()
    run_model.train()
    for step in range(1, a.steps + 1):
        ids, tgt = batch(a.seed, 0, (step - 1) * a.batch, a.batch, S, symbols)
        for g in opt.param_groups:
            g["lr"] = lr_at(step, total=a.steps)
        run_model.zero_grad(set_to_none=True)
        ce, aux = losses(run_model, config, ids, tgt, ctx)
        loss = ce + coef * aux
        loss.backward()
        if a.variant == "bf16master":
            for m, p in zip(masters, run_model.parameters()):
                m.grad.copy_(p.grad if p.grad is not None else torch.zeros_like(p))
        gn = torch.nn.utils.clip_grad_norm_(masters, 1.0).item()
        opt.step()
        if a.variant == "bf16master":
            with torch.no_grad():
                for m, p in zip(masters, run_model.parameters()):
                    p.copy_(m)  # fp32 -> bf16, round to nearest even
        else:
            opt.zero_grad(set_to_none=True)
        r = {"step": step, "ce": ce.item(), "aux": aux.item(), "gnorm": gn, "lr": lr_at(step, total=a.steps),
             "t": round(time.time() - t0, 2)}
        if step % a.eval_every == 0 or step == a.steps:
            r["eval"] = evaluate()
            print(f"{a.variant} seed {a.seed} step {step} ce {r['ce']:.4f} eval {r['eval']:.4f} "
                  f"t {r['t']:.0f}s", flush=True)
        log.write(json.dumps(r) + "\n")
        log.flush()
    log.close()


if __name__ == "__main__":
    main()
