#!/usr/bin/env python3
"""Regenerate tests/fixtures/hf/deepseek_v3_parts/ from transformers' own DeepSeek-V3 modules.

Why: peakbound builds DeepSeek-V3 (model_type deepseek_v3, Kimi-K2's architecture too) from
parts, each matched against the transformers code it stands for before a model uses it. This
writes, in f32 on the CPU:

  deepseek_v3_parts.safetensors
    mlp.{x, dy, y, dx}, mlp.<name>, mlp.grad.<name>
                              the MoE sublayer as the decoder layer runs it:
                              y = x + DeepseekV3MoE(post_attention_layernorm(x)): the sigmoid
                              router with its e_score_correction_bias (for the choice only),
                              group-limited top-k (4 groups of 2 experts, the best 2 groups
                              kept), renormalised weights times routed_scaling_factor 2.5,
                              eager routed experts, and 2 shared experts (one MLP of width
                              2 x moe_intermediate_size); every parameter seeded; <name> is the
                              checkpoint name under model.layers.0 (mlp.gate.weight,
                              mlp.gate.e_score_correction_bias, mlp.experts.3.up_proj.weight,
                              mlp.shared_experts.down_proj.weight...): the routed experts are
                              split out of transformers' fused in-memory tensors as
                              save_pretrained writes them
    mlp.loads [E]             how many of the tokens' top-k slots chose each expert
    layer.<case>.{x, dy, y, dx}, layer.<case>.<name>, layer.<case>.grad.<name>
                              the attention sublayer as the decoder layer runs it:
                              y = x + DeepseekV3Attention(input_layernorm(x)) with its rotary
                              embedding, eager attention, one sequence of 29 tokens, every
                              parameter seeded (norm weights 1 + jitter); cases:
                              `lora` (q_lora_rank 12: q_a_proj, q_a_layernorm, q_b_proj;
                              interleaved RoPE; plain rope_theta) and `plain_yarn` (q_proj;
                              rotate_half RoPE; attention_bias; YaRN factor 4 over 8 positions
                              with mscale 0.8 and mscale_all_dim 1.2, so cos and sin carry
                              get_mscale(4, 0.8) / get_mscale(4, 1.2) and the softmax scale
                              get_mscale(4, 1.2)^2); <name> is the HF name under model.layers.0
  reference.json              versions, the shapes and routing settings, the smallest margins
                              of the choice (top-k and group) so a reimplementation knows how
                              far the routing is from a tie

Run from the repository root with the virtual environment of requirements.txt:
  scripts/hf_reference/.venv/bin/python scripts/hf_reference/make_deepseek_fixture.py
"""
import argparse
import json
import os
import platform

import torch
import transformers
from safetensors.torch import save_file
from transformers import DeepseekV3Config

from sublayer_seed import seed_parameters, sublayer_params

SEED = 31
MLP = dict(T=31, H=24, F=10, E=8, K=3, n_group=4, topk_group=2, n_shared=2, routed_scaling_factor=2.5,
           norm_topk_prob=True, rms_norm_eps=1e-6)


def mlp_case(g):
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3MoE, DeepseekV3RMSNorm
    M = MLP
    cfg = DeepseekV3Config(hidden_size=M["H"], moe_intermediate_size=M["F"], n_routed_experts=M["E"],
                           num_experts_per_tok=M["K"], n_group=M["n_group"], topk_group=M["topk_group"],
                           n_shared_experts=M["n_shared"], routed_scaling_factor=M["routed_scaling_factor"],
                           norm_topk_prob=M["norm_topk_prob"], rms_norm_eps=M["rms_norm_eps"],
                           num_hidden_layers=1)
    cfg._experts_implementation = "eager"
    mlp = DeepseekV3MoE(cfg).float()
    norm = DeepseekV3RMSNorm(M["H"], eps=cfg.rms_norm_eps)
    params = sublayer_params("post_attention_layernorm.weight", norm, "mlp.", mlp)
    # The fused experts [E, out, in] by their input width, the rest by their last axis.
    seed_parameters(params, g, lambda n, t, r: r / t.shape[2] ** 0.5 if n.startswith("mlp.experts.")
                    else r / t.shape[-1] ** 0.5)
    with torch.no_grad():
        mlp.gate.e_score_correction_bias.copy_(0.05 * torch.randn(M["E"], generator=g))
    x = torch.randn(1, M["T"], M["H"], generator=g).requires_grad_(True)
    y = x + mlp(norm(x))
    dy = torch.randn(y.shape, generator=g)
    (y * dy).sum().backward()
    with torch.no_grad():  # the routing transformers chose, and how far it is from a tie
        h = norm(x)[0]
        logits = torch.nn.functional.linear(h.float(), mlp.gate.weight.float())
        _, _, ids = mlp.gate(h)
        loads = torch.bincount(ids.reshape(-1), minlength=M["E"]).float()
        choice = (logits.sigmoid() + mlp.gate.e_score_correction_bias).double()
        per = M["E"] // M["n_group"]
        groups = choice.view(-1, M["n_group"], per).topk(2, dim=-1)[0].sum(-1)
        gs = groups.sort(dim=-1, descending=True).values
        group_margin = float((gs[:, M["topk_group"] - 1] - gs[:, M["topk_group"]]).min())
        keep = torch.zeros_like(groups).scatter_(1, groups.topk(M["topk_group"], dim=-1)[1], 1.0)
        masked = choice.masked_fill(~keep.repeat_interleave(per, dim=1).bool(), float("-inf"))
        ms = masked.sort(dim=-1, descending=True).values
        topk_margin = float((ms[:, M["K"] - 1] - ms[:, M["K"]]).min())
    out = {"x": x[0], "dy": dy[0], "y": y[0], "dx": x.grad[0], "loads": loads,
           "mlp.gate.e_score_correction_bias": mlp.gate.e_score_correction_bias.clone()}
    for n, t in params.items():
        if n == "mlp.experts.gate_up_proj":  # [E, 2F, H] = cat(gate, up) on dim 1
            for prefix, src in (("", t), ("grad.", t.grad)):
                for e in range(M["E"]):
                    out[f"{prefix}mlp.experts.{e}.gate_proj.weight"] = src[e, :M["F"]]
                    out[f"{prefix}mlp.experts.{e}.up_proj.weight"] = src[e, M["F"]:]
        elif n == "mlp.experts.down_proj":  # [E, H, F]
            for prefix, src in (("", t), ("grad.", t.grad)):
                for e in range(M["E"]):
                    out[f"{prefix}mlp.experts.{e}.down_proj.weight"] = src[e]
        else:
            out[n] = t
            out["grad." + n] = t.grad
    return out, topk_margin, group_margin


ATT = dict(T=29, H=24, heads=3, q_lora_rank=12, kv_lora_rank=10, qk_nope_head_dim=6, qk_rope_head_dim=4,
           v_head_dim=5)
ATT_CASES = {
    "lora": dict(q_lora_rank=ATT["q_lora_rank"], rope_interleave=True, attention_bias=False,
                 rope_parameters={"rope_type": "default", "rope_theta": 10000.0}),
    "plain_yarn": dict(q_lora_rank=None, rope_interleave=False, attention_bias=True,
                       rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                                        "original_max_position_embeddings": 8, "mscale": 0.8,
                                        "mscale_all_dim": 1.2, "beta_fast": 32.0, "beta_slow": 1.0}),
}


def attention_case(g, case):
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import (DeepseekV3Attention, DeepseekV3RMSNorm,
                                                                      DeepseekV3RotaryEmbedding)
    A, C = ATT, ATT_CASES[case]
    cfg = DeepseekV3Config(hidden_size=A["H"], num_attention_heads=A["heads"], num_key_value_heads=A["heads"],
                           q_lora_rank=C["q_lora_rank"], kv_lora_rank=A["kv_lora_rank"],
                           qk_nope_head_dim=A["qk_nope_head_dim"], qk_rope_head_dim=A["qk_rope_head_dim"],
                           v_head_dim=A["v_head_dim"], rope_interleave=C["rope_interleave"],
                           attention_bias=C["attention_bias"], rope_parameters=C["rope_parameters"],
                           num_hidden_layers=1, max_position_embeddings=64, rms_norm_eps=1e-6)
    cfg._attn_implementation = "eager"
    attn = DeepseekV3Attention(cfg, 0).float()
    norm = DeepseekV3RMSNorm(A["H"], eps=cfg.rms_norm_eps)
    rope = DeepseekV3RotaryEmbedding(cfg)
    params = sublayer_params("input_layernorm.weight", norm, "self_attn.", attn)
    # Weights by their input width, biases 0.5 r.
    seed_parameters(params, g, lambda n, t, r: r / t.shape[1] ** 0.5 if n.endswith("weight") else 0.5 * r)
    T = A["T"]
    x = torch.randn(1, T, A["H"], generator=g).requires_grad_(True)
    cos, sin = rope(x, torch.arange(T)[None])
    mask = torch.full((T, T), torch.finfo(torch.float32).min).triu(1)[None, None]
    o, _ = attn(hidden_states=norm(x), position_embeddings=(cos, sin), attention_mask=mask)
    y = x + o
    dy = torch.randn(y.shape, generator=g)
    (y * dy).sum().backward()
    out = {"x": x[0], "dy": dy[0], "y": y[0], "dx": x.grad[0]}
    for n, t in params.items():
        out[n] = t
        out["grad." + n] = t.grad
    return out, {"softmax_scale": float(attn.scaling), "rope_attention_scaling": float(rope.attention_scaling)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="tests/fixtures/hf", help="fixture root (default %(default)s)")
    a = ap.parse_args()
    g = torch.Generator().manual_seed(SEED)
    tensors = {}
    mlp_tensors, topk_margin, group_margin = mlp_case(g)
    for name, t in mlp_tensors.items():
        tensors[f"mlp.{name}"] = t.detach()
    scales = {}
    for case in ATT_CASES:
        case_tensors, scales[case] = attention_case(g, case)
        for name, t in case_tensors.items():
            tensors[f"layer.{case}.{name}"] = t.detach()
    d = os.path.join(a.out, "deepseek_v3_parts")
    os.makedirs(d, exist_ok=True)
    path = os.path.join(d, "deepseek_v3_parts.safetensors")
    save_file({k: t.contiguous() for k, t in tensors.items()}, path)
    os.chmod(path, 0o644)
    with open(os.path.join(d, "reference.json"), "w") as f:
        json.dump({"transformers": transformers.__version__, "torch": torch.__version__,
                   "python": platform.python_version(), "seed": SEED, "mlp": MLP,
                   "mlp_topk_choice_margin": topk_margin, "mlp_group_score_margin": group_margin,
                   "attention": ATT, "attention_cases": ATT_CASES, "attention_scales": scales,
                   "module": "transformers.models.deepseek_v3.modeling_deepseek_v3.DeepseekV3MoE, DeepseekV3Attention"},
                  f, indent=1)
        f.write("\n")
    print(json.dumps({"out": d, "tensors": len(tensors), "topk_margin": topk_margin,
                      "group_margin": group_margin}))


if __name__ == "__main__":
    main()
