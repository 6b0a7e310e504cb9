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
    attention.<case>.{q, k, v, sinks, out, dout, dq, dk, dv, dsinks}
                              transformers' gpt-oss eager_attention_forward (its sinks join
                              every softmax denominator) on seeded q [T, Hq, D], k and v
                              [T, Hkv, D], sinks [Hq], causal (case `full`) and with a
                              sliding window of 7 keys (case `window7`), and autograd's
                              gradients of sum(out * dout); token-major as peakbound's kernels
    layer.<case>.{x, dy, y, dx}
    layer.<case>.<name> / layer.<case>.grad.<name>
                              the attention sublayer as the decoder layer runs it:
                              y = x + GptOssAttention(input_layernorm(x)) with its rotary
                              embedding (the config's YaRN), eager attention, every parameter
                              seeded (q/k/v/o biases, sinks, nonzero), x [T, H] one sequence;
                              case `full` (full_attention) and `sliding` (sliding_attention,
                              sliding_window 5); <name> is the HF name under
                              model.layers.0 (input_layernorm.weight, self_attn.q_proj.bias...)
    mlp.{x, dy, y, dx}, mlp.<name>, mlp.grad.<name>
                              the MoE sublayer as the decoder layer runs it:
                              y = x + GptOssMLP(post_attention_layernorm(x)) (the router's
                              bias and top-k softmax, the fused interleaved experts with their
                              biases and the clamped SwiGLU, eager experts), every parameter
                              seeded, weights scaled so that some gate and up values pass the
                              clamp; <name> is the HF name under model.layers.0
                              (mlp.router.bias, mlp.experts.gate_up_proj...)
  reference.json              versions, alpha and limit, the attention shapes

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

from sublayer_seed import seed_parameters, sublayer_params

T, I = 23, 13
SEED = 77
ATT = dict(T=29, Hq=4, Hkv=2, D=8)
WINDOWS = {"full": 0, "window7": 7}


class _Stub(torch.nn.Module):  # what eager_attention_forward reads from its module
    def __init__(self, sinks, groups):
        super().__init__()
        self.sinks = sinks
        self.num_key_value_groups = groups
        self.training = False


def attention_case(g, window):
    from transformers.models.gpt_oss.modeling_gpt_oss import eager_attention_forward
    T, Hq, Hkv, D = ATT["T"], ATT["Hq"], ATT["Hkv"], ATT["D"]
    q = torch.randn(T, Hq, D, generator=g).requires_grad_(True)
    k = torch.randn(T, Hkv, D, generator=g).requires_grad_(True)
    v = torch.randn(T, Hkv, D, generator=g).requires_grad_(True)
    sinks = torch.randn(Hq, generator=g).requires_grad_(True)
    i = torch.arange(T)[:, None]
    j = torch.arange(T)[None, :]
    visible = (j <= i) & ((i - j < window) if window > 0 else torch.ones(T, T, dtype=torch.bool))
    mask = torch.zeros(T, T).masked_fill(~visible, torch.finfo(torch.float32).min)[None, None]
    out, _ = eager_attention_forward(_Stub(sinks, Hq // Hkv), q.transpose(0, 1)[None], k.transpose(0, 1)[None],
                                     v.transpose(0, 1)[None], mask, scaling=D ** -0.5)
    out = out[0]  # [T, Hq, D]
    dout = torch.randn(out.shape, generator=g)
    (out * dout).sum().backward()
    return {"q": q, "k": k, "v": v, "sinks": sinks, "out": out, "dout": dout, "dq": q.grad, "dk": k.grad,
            "dv": v.grad, "dsinks": sinks.grad}


LAYER = dict(T=29, H=24, Hq=4, Hkv=2, D=8, sliding_window=5)


def layer_case(g, layer_type):
    from transformers.models.gpt_oss.modeling_gpt_oss import GptOssAttention, GptOssRMSNorm, GptOssRotaryEmbedding
    L = LAYER
    cfg = GptOssConfig(hidden_size=L["H"], num_attention_heads=L["Hq"], num_key_value_heads=L["Hkv"],
                       head_dim=L["D"], num_hidden_layers=1, sliding_window=L["sliding_window"],
                       layer_types=[layer_type], num_local_experts=2, intermediate_size=8)
    cfg._attn_implementation = "eager"
    attn = GptOssAttention(cfg, 0).float()
    norm = GptOssRMSNorm(L["H"], eps=cfg.rms_norm_eps)
    rope = GptOssRotaryEmbedding(cfg)
    params = sublayer_params("input_layernorm.weight", norm, "self_attn.", attn)
    # Weights by their input width, biases and sinks 0.5 r.
    seed_parameters(params, g, lambda n, t, r: r / t.shape[1] ** 0.5 if n.endswith("weight") else 0.5 * r)
    T = L["T"]
    x = torch.randn(1, T, L["H"], generator=g).requires_grad_(True)
    pos = torch.arange(T)[None]
    cos, sin = rope(x, pos)
    i = torch.arange(T)[:, None]
    j = torch.arange(T)[None, :]
    W = L["sliding_window"] if layer_type == "sliding_attention" else 0
    visible = (j <= i) & ((i - j < W) if W > 0 else torch.ones(T, T, dtype=torch.bool))
    mask = torch.zeros(T, T).masked_fill(~visible, torch.finfo(torch.float32).min)[None, None]
    o, _ = attn(hidden_states=norm(x), position_embeddings=(cos, sin), attention_mask=mask)
    y = x + o
    dy = torch.randn(y.shape, generator=g)
    (y * dy).sum().backward()
    out = {"x": x[0], "dy": dy[0], "y": y[0], "dx": x.grad[0]}
    for n, t in params.items():
        out[n] = t
        out["grad." + n] = t.grad
    return out, float(rope.attention_scaling)


MLP = dict(T=29, H=24, F=13, E=6, K=2)


def mlp_case(g):
    from transformers.models.gpt_oss.modeling_gpt_oss import GptOssMLP, GptOssRMSNorm
    M = MLP
    cfg = GptOssConfig(hidden_size=M["H"], intermediate_size=M["F"], num_local_experts=M["E"],
                       num_experts_per_tok=M["K"], num_hidden_layers=1)
    cfg._experts_implementation = "eager"
    mlp = GptOssMLP(cfg).float()
    norm = GptOssRMSNorm(M["H"], eps=cfg.rms_norm_eps)
    params = sublayer_params("post_attention_layernorm.weight", norm, "mlp.", mlp)

    def draw(n, t, r):
        if n == "mlp.router.weight":
            return r / t.shape[1] ** 0.5
        if n in ("mlp.experts.gate_up_proj", "mlp.experts.down_proj"):  # [E, in, out]
            return 4.0 * r / t.shape[1] ** 0.5
        return 0.5 * r  # biases

    seed_parameters(params, g, draw)
    x = torch.randn(1, M["T"], M["H"], generator=g).requires_grad_(True)
    o, _ = mlp(norm(x))
    y = x + o
    dy = torch.randn(y.shape, generator=g)
    (y * dy).sum().backward()
    with torch.no_grad():  # how far the routing is from a tie (the reimplementation must pick the same experts)
        logits = torch.nn.functional.linear(norm(x)[0], mlp.router.weight, mlp.router.bias).double()
        top = logits.sort(dim=-1, descending=True).values
        margin = float((top[:, M["K"] - 1] - top[:, M["K"]]).min())
        gate_up = norm(x)[0] @ mlp.experts.gate_up_proj + mlp.experts.gate_up_proj_bias[:, None, :]
        clamped = float((gate_up.abs() >= cfg.swiglu_limit).double().mean())
    out = {"x": x[0], "dy": dy[0], "y": y[0], "dx": x.grad[0]}
    for n, t in params.items():
        out[n] = t
        out["grad." + n] = t.grad
    return out, margin, clamped


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
    tensors = {"swiglu.gate_up": gate_up.detach(), "swiglu.out": out.detach(), "swiglu.dout": dout,
               "swiglu.dgate_up": gate_up.grad}
    for case, window in WINDOWS.items():
        for name, t in attention_case(g, window).items():
            tensors[f"attention.{case}.{name}"] = t.detach()
    layer_scaling = None
    for case, layer_type in {"full": "full_attention", "sliding": "sliding_attention"}.items():
        tensors_case, layer_scaling = layer_case(g, layer_type)
        for name, t in tensors_case.items():
            tensors[f"layer.{case}.{name}"] = t.detach()
    mlp_tensors, mlp_margin, mlp_clamped = mlp_case(g)
    for name, t in mlp_tensors.items():
        tensors[f"mlp.{name}"] = t.detach()
    d = os.path.join(a.out, "gpt_oss_parts")
    os.makedirs(d, exist_ok=True)
    path = os.path.join(d, "gpt_oss_parts.safetensors")
    save_file({k: t.contiguous() for k, t in tensors.items()}, path)
    os.chmod(path, 0o644)
    with open(os.path.join(d, "reference.json"), "w") as f:
        json.dump({"transformers": transformers.__version__, "torch": torch.__version__,
                   "python": platform.python_version(), "seed": SEED, "T": T, "I": I,
                   "swiglu_alpha": experts.alpha, "swiglu_limit": experts.limit, "attention": ATT,
                   "attention_windows": WINDOWS, "layer": LAYER, "mlp": MLP, "mlp_topk_logit_margin": mlp_margin,
                   "mlp_fraction_of_gate_up_at_or_past_the_limit": mlp_clamped,
                   "layer_rope": GptOssConfig().rope_parameters, "layer_attention_scaling": layer_scaling,
                   "module": "transformers.models.gpt_oss.modeling_gpt_oss.GptOssExperts._apply_gate"}, f, indent=1)
        f.write("\n")
    print(json.dumps({"out": d}))


if __name__ == "__main__":
    main()
