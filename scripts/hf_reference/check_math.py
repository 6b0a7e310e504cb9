#!/usr/bin/env python3
"""Recompute tests/fixtures/hf/<family>/ from the checkpoint alone, in fp64, without transformers.

Why: this is the math the C++ side implements, written out plainly from config.json and
model.safetensors (per-expert tensors, as saved). If it matches reference.safetensors (the loss,
the logits and every gradient, to the tolerance below), the math stated here and in README.md is
the math transformers ran. Needs only torch and safetensors:
  scripts/hf_reference/.venv/bin/python scripts/hf_reference/check_math.py
"""

import json
import os
import sys

import torch
from safetensors.torch import load_file

TOL = 1e-5  # relative: max|a-b| / max|ref| over each tensor (the project's fp32 tolerance); fp32 reference vs fp64 recompute


def rms_norm(x, w, eps):
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def rope(x, theta):
    # x: [B, H, T, D]. Half-split ("rotate_half") layout: pairs are (i, i + D/2), not (2i, 2i+1).
    D = x.shape[-1]
    T = x.shape[-2]
    inv_freq = 1.0 / (theta ** (torch.arange(0, D, 2, dtype=torch.float64) / D))
    ang = torch.arange(T, dtype=torch.float64)[:, None] * inv_freq[None, :]  # [T, D/2]
    cos = torch.cat([ang.cos(), ang.cos()], -1)
    sin = torch.cat([ang.sin(), ang.sin()], -1)
    x1, x2 = x[..., : D // 2], x[..., D // 2:]
    return x * cos + torch.cat([-x2, x1], -1) * sin


def forward(cfg, W, ids):
    fam = cfg["model_type"]
    B, T = ids.shape
    H, KV, Dh = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    E = cfg.get("num_experts") or cfg["num_local_experts"]
    k = cfg["num_experts_per_tok"]
    eps = cfg["rms_norm_eps"]
    theta = cfg.get("rope_theta") or cfg["rope_parameters"]["rope_theta"]
    renorm = cfg.get("norm_topk_prob", True)  # Mixtral always renormalises the top-k
    moe = "mlp" if fam == "qwen3_moe" else "block_sparse_moe"
    names = ("gate_proj", "up_proj", "down_proj") if fam == "qwen3_moe" else ("w1", "w3", "w2")

    x = W["model.embed_tokens.weight"][ids]  # [B, T, C]
    router_logits = []
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    for l in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{l}."
        h = rms_norm(x, W[p + "input_layernorm.weight"], eps)
        q = (h @ W[p + "self_attn.q_proj.weight"].T).view(B, T, H, Dh)
        kk = (h @ W[p + "self_attn.k_proj.weight"].T).view(B, T, KV, Dh)
        v = (h @ W[p + "self_attn.v_proj.weight"].T).view(B, T, KV, Dh)
        if fam == "qwen3_moe":  # per-head RMSNorm over head_dim, before RoPE
            q = rms_norm(q, W[p + "self_attn.q_norm.weight"], eps)
            kk = rms_norm(kk, W[p + "self_attn.k_norm.weight"], eps)
        q, kk, v = (t.transpose(1, 2) for t in (q, kk, v))  # [B, heads, T, Dh]
        q, kk = rope(q, theta), rope(kk, theta)
        rep = H // KV  # query head h reads kv head h // rep
        kk = kk.repeat_interleave(rep, dim=1)
        v = v.repeat_interleave(rep, dim=1)
        s = (q @ kk.transpose(-1, -2)) * Dh ** -0.5
        s = s.masked_fill(~causal, float("-inf")).softmax(-1)
        a = (s @ v).transpose(1, 2).reshape(B, T, H * Dh)
        x = x + a @ W[p + "self_attn.o_proj.weight"].T

        h = rms_norm(x, W[p + "post_attention_layernorm.weight"], eps).reshape(B * T, -1)
        logits_r = h @ W[p + moe + ".gate.weight"].T  # [N, E]
        router_logits.append(logits_r)
        probs = logits_r.softmax(-1)
        topv, topi = probs.topk(k, dim=-1)
        if renorm:
            topv = topv / topv.sum(-1, keepdim=True)
        y = torch.zeros_like(h)
        for e in range(E):
            rows, slot = (topi == e).nonzero(as_tuple=True)
            if rows.numel() == 0:
                continue
            pe = p + f"{moe}.experts.{e}."
            xe = h[rows]
            g = xe @ W[pe + names[0] + ".weight"].T
            u = xe @ W[pe + names[1] + ".weight"].T
            o = (torch.nn.functional.silu(g) * u) @ W[pe + names[2] + ".weight"].T
            y = y.index_add(0, rows, o * topv[rows, slot][:, None])
        x = x + y.view(B, T, -1)

    x = rms_norm(x, W["model.norm.weight"], eps)
    logits = x @ W["lm_head.weight"].T
    V = logits.shape[-1]
    ce = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, V), ids[:, 1:].reshape(-1))
    rows = torch.cat(router_logits, 0)  # all layers' rows together: one balance loss
    pr = rows.softmax(-1)
    f = torch.zeros(E, dtype=torch.float64).index_add(
        0, pr.topk(k, -1).indices.reshape(-1), torch.ones(rows.shape[0] * k, dtype=torch.float64))
    f = f / rows.shape[0]
    P = pr.sum(0) / rows.shape[0]
    aux = E * (f * P).sum()
    return ce + cfg["router_aux_loss_coef"] * aux, ce, aux, logits


def rel(a, b):
    return float((a.detach().double() - b.double()).abs().max() / b.double().abs().max())


def check(d):
    cfg = json.load(open(os.path.join(d, "config.json")))
    W = {n: t.double().requires_grad_(True) for n, t in load_file(os.path.join(d, "model.safetensors")).items()}
    ref = load_file(os.path.join(d, "reference.safetensors"))
    loss, ce, aux, logits = forward(cfg, W, ref["input_ids"].long())
    loss.backward()
    errs = {"loss": rel(loss, ref["loss"]), "ce_loss": rel(ce, ref["ce_loss"]),
            "aux_loss": rel(aux, ref["aux_loss"]), "logits": rel(logits, ref["logits"])}
    errs["grads(max)"] = max(rel(W[n].grad, ref["grad." + n]) for n in W)
    worst = max(errs.values())
    print(f"{d}: " + ", ".join(f"{k} {v:.2e}" for k, v in errs.items()))
    return worst <= TOL


# The families whose math forward() writes out (plain RoPE, no window, biases, sinks, shared
# experts or sigmoid router); the others are checked against transformers alone.
RECOMPUTED = ("qwen3_moe", "mixtral")


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else "tests/fixtures/hf"
    dirs = [f for f in sorted(os.listdir(root)) if os.path.isfile(os.path.join(root, f, "config.json"))]
    skipped = [f for f in dirs if f not in RECOMPUTED]
    if skipped:
        print("not recomputed here (transformers is their reference): " + ", ".join(skipped))
    ok = all([check(os.path.join(root, f)) for f in dirs if f in RECOMPUTED])
    if not ok:
        sys.exit(f"fp64 recompute differs from the fixture by more than {TOL} relative")


if __name__ == "__main__":
    main()
