#!/usr/bin/env python3
"""Regenerate tests/fixtures/hf/<family>/ from Hugging Face transformers' own MoE models.

Why: peakbound's MoE transformer is matched against an implementation it did not write.
For each family (qwen3_moe, mixtral) this builds a tiny seeded random model with
transformers, saves it with save_pretrained (the same on-disk layout as a real hub
checkpoint), runs one fixed batch forward and backward in fp32 on the CPU, and writes:

  <family>/config.json, <family>/model.safetensors   save_pretrained output (the checkpoint)
  <family>/reference.safetensors   input_ids, loss, ce_loss, aux_loss, logits, and
                                   grad.<name> for every tensor in model.safetensors
  <family>/reference.json          versions, config values, the loss formula, routing margins

Gradients are named like the *saved checkpoint* tensors (not like transformers' in-memory
parameters, which fuse experts): they are produced by the same save path, so a loader that
reads model.safetensors can compare each gradient against the tensor it loaded.

Run it from the repository root with the virtual environment of requirements.txt:
  scripts/hf_reference/.venv/bin/python scripts/hf_reference/make_fixtures.py
"""

import argparse
import json
import os
import platform
import re
import shutil
import sys
import tempfile

import torch
import transformers
from safetensors.torch import load_file, save_file

SEED = 1234
BATCH = 2
SEQ = 16
# RMSNorm weights start at 1 in transformers; a checkpoint that keeps them at 1 cannot tell a
# loader that drops or misplaces a norm weight. Perturb them (seeded) so every tensor matters.
NORM_JITTER = 0.1
# transformers initialises with std 0.02; that leaves the routers close to uniform and top-k
# choices close to ties. A larger std gives decisive routing (see "topk_margin" in the json).
INIT_STD = 0.1
# Smallest allowed gap between the k-th and (k+1)-th router probability over every row of
# every layer; fp32 forward noise is ~1e-6, so a gap above this keeps routing unambiguous.
MIN_TOPK_MARGIN = 1e-5

COMMON = dict(
    vocab_size=256,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=8,
    num_experts_per_tok=2,
    rms_norm_eps=1e-6,
    router_aux_loss_coef=0.01,
    output_router_logits=True,
    tie_word_embeddings=False,
    initializer_range=INIT_STD,
    max_position_embeddings=64,
    attention_dropout=0.0,
    hidden_act="silu",
)


def qwen3_moe_config():
    return transformers.Qwen3MoeConfig(
        **COMMON,
        num_experts=8,
        moe_intermediate_size=16,
        intermediate_size=64,  # dense-MLP width; unused because every layer is MoE
        norm_topk_prob=True,
        decoder_sparse_step=1,
        mlp_only_layers=[],
        use_sliding_window=False,
        attention_bias=False,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
    )


def qwen3_moe_yarn_config():
    # Qwen3-MoE with YaRN (rope_type "yarn", as Qwen3 configs extend past their 32K
    # pretraining length), scaled so that it acts within the 16-token batch: an original
    # length of 8 and factor 4 interpolate every frequency but the first (head_dim 8).
    cfg = qwen3_moe_config()
    cfg.rope_parameters = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                           "original_max_position_embeddings": 8}
    return cfg


def mixtral_config():
    return transformers.MixtralConfig(
        **COMMON,
        num_local_experts=8,
        intermediate_size=16,
        sliding_window=None,
        router_jitter_noise=0.0,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
    )


def mixtral_sliding_config():
    # Mixtral with a sliding window of 5 keys (every layer slides whenever it is set), so
    # most of the 16-token rows see only part of their prefix.
    cfg = mixtral_config()
    cfg.sliding_window = 5
    return cfg


def qwen2_moe_config():
    # Qwen2-MoE: q/k/v biases, one shared expert behind its sigmoid gate, top-k weights not
    # renormalised, and a sliding window of 5 on layer 0 only (transformers 5.24 slides the
    # even layers below max_window_layers).
    return transformers.Qwen2MoeConfig(
        **COMMON,
        num_experts=8,
        moe_intermediate_size=16,
        shared_expert_intermediate_size=24,
        intermediate_size=64,  # dense-MLP width; unused because every layer is MoE
        norm_topk_prob=False,
        decoder_sparse_step=1,
        mlp_only_layers=[],
        use_sliding_window=True,
        sliding_window=5,
        max_window_layers=2,
        qkv_bias=True,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
    )


def gpt_oss_config():
    # gpt-oss: q/k/v/o biases, a sink logit per head, layer 0 sliding (window 5) and layer 1
    # full, the released YaRN (factor 32 over 4096: within the batch it acts through its
    # frequencies and the 1.35 factor on cos and sin), the router's bias and softmax over the
    # top-k logits, fused interleaved experts with biases and the clamped SwiGLU.
    cfg = transformers.GptOssConfig(
        **COMMON,
        num_local_experts=8,
        intermediate_size=16,
        sliding_window=5,
        layer_types=["sliding_attention", "full_attention"],
        attention_bias=True,
    )
    cfg._experts_implementation = "eager"
    return cfg


# DeepSeek-V3's MoE at the families' size, shared by dots1 and deepseek_v3: 3 layers, layer 0
# dense, 8 experts in 4 groups of 2 with the best 2 kept, top-3 renormalised and times 2.5.
DEEPSEEK_MOE = dict(num_hidden_layers=3, num_experts_per_tok=3, n_routed_experts=8, moe_intermediate_size=16,
                    intermediate_size=48, first_k_dense_replace=1, n_group=4, topk_group=2, norm_topk_prob=True,
                    routed_scaling_factor=2.5)


def dots1_config():
    # dots.llm1: Qwen3's attention (q/k norms) with DeepSeek-V3's MoE: the sigmoid router with
    # its e_score_correction_bias (jittered: transformers starts it at 0), 8 experts in 4
    # groups of 2 with the best 2 groups kept, top-3, renormalised and times 2.5, two shared
    # experts as one MLP; layer 0 dense (first_k_dense_replace 1), layer 2 sliding (window 5,
    # max_window_layers 2). No aux loss (transformers' Dots1ForCausalLM adds none).
    c = {k: v for k, v in COMMON.items() if k not in ("router_aux_loss_coef", "output_router_logits")}
    return transformers.Dots1Config(
        **c | DEEPSEEK_MOE,
        n_shared_experts=2,
        sliding_window=5,
        max_window_layers=2,
        attention_bias=False,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
    )


def deepseek_v3_config():
    # DeepSeek-V3: multi-head latent attention (q_lora_rank 12, kv_lora_rank 10, qk = 6 nope +
    # 4 interleaved rope, v 5) with DeepSeek's YaRN (factor 4 over 16 positions, mscale =
    # mscale_all_dim = 1: cos and sin unscaled, the softmax scale times get_mscale(4)^2), and
    # dots1's MoE (the sigmoid router with seeded correction biases, 4 groups of 2 experts, the
    # best 2 kept, top-3 x 2.5) with one shared expert; layer 0 dense. No aux loss.
    c = {k: v for k, v in COMMON.items()
         if k not in ("router_aux_loss_coef", "output_router_logits", "head_dim", "num_key_value_heads")}
    return transformers.DeepseekV3Config(
        **c | DEEPSEEK_MOE,
        num_key_value_heads=4,
        n_shared_experts=1,
        q_lora_rank=12,
        kv_lora_rank=10,
        qk_nope_head_dim=6,
        qk_rope_head_dim=4,
        v_head_dim=5,
        rope_interleave=True,
        attention_bias=False,
        rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                         "original_max_position_embeddings": 16, "mscale": 1.0, "mscale_all_dim": 1.0,
                         "beta_fast": 32.0, "beta_slow": 1.0},
    )


FAMILIES = {
    "qwen3_moe": (qwen3_moe_config, transformers.Qwen3MoeForCausalLM),
    "mixtral": (mixtral_config, transformers.MixtralForCausalLM),
    "qwen3_moe_yarn": (qwen3_moe_yarn_config, transformers.Qwen3MoeForCausalLM),
    "mixtral_sliding": (mixtral_sliding_config, transformers.MixtralForCausalLM),
    "qwen2_moe": (qwen2_moe_config, transformers.Qwen2MoeForCausalLM),
    "gpt_oss": (gpt_oss_config, transformers.GptOssForCausalLM),
    "dots1": (dots1_config, transformers.Dots1ForCausalLM),
    "deepseek_v3": (deepseek_v3_config, transformers.DeepseekV3ForCausalLM),
}

BUFFER_SUFFIX = "e_score_correction_bias"  # a torch buffer in the checkpoint: no gradient


def sigmoid_routed(cfg):
    """DeepSeek-V3's router (sigmoid scores, a correction bias for the choice, groups)."""
    return hasattr(cfg, "n_group") and cfg.model_type in ("dots1", "deepseek_v3")


def sigmoid_choice(cfg, logits, bias):
    """The router's choice as DeepseekV3TopkRouter / Dots1TopkRouter make it, in double:
    (the top-k expert ids sorted, the smallest top-k margin, the smallest group margin)."""
    k, G, kg = cfg.num_experts_per_tok, cfg.n_group, cfg.topk_group
    choice = logits.double().sigmoid() + bias.double()
    E = choice.shape[-1]
    groups = choice.view(-1, G, E // G).topk(2, dim=-1)[0].sum(-1)
    gs = groups.sort(dim=-1, descending=True).values
    group_margin = float((gs[:, kg - 1] - gs[:, kg]).min()) if kg < G else float("inf")
    keep = torch.zeros_like(groups).scatter_(1, groups.topk(kg, dim=-1)[1], 1.0)
    masked = choice.masked_fill(~keep.repeat_interleave(E // G, dim=1).bool(), float("-inf"))
    ms = masked.sort(dim=-1, descending=True).values
    ids = masked.topk(k, dim=-1).indices.sort(dim=-1).values
    return ids, float((ms[:, k - 1] - ms[:, k]).min()), group_margin


def router_biases(model):
    return [m.gate.e_score_correction_bias.detach() for m in model.modules() if hasattr(m, "gate")
            and hasattr(m.gate, BUFFER_SUFFIX)]


def num_experts_of(cfg):
    return getattr(cfg, "num_experts", None) or cfg.num_local_experts


def build_model(family):
    make_cfg, cls = FAMILIES[family]
    cfg = make_cfg()
    cfg._attn_implementation = "eager"
    torch.manual_seed(SEED)
    model = cls(cfg).to(torch.float32)
    with torch.no_grad():
        gen = torch.Generator().manual_seed(SEED + 1)
        for name, p in model.named_parameters():
            # Biases start at 0 in transformers: jittered too, so a loader or a forward
            # that drops one shows (no family without biases draws more).
            if "norm" in name or name.endswith(".bias") or name.endswith("_bias"):
                p.add_(NORM_JITTER * torch.randn(p.shape, generator=gen))
        for name, b in model.named_buffers():  # DeepSeek's correction bias: 0 at first
            if name.endswith(BUFFER_SUFFIX):
                b.copy_(0.05 * torch.randn(b.shape, generator=gen))
    model.train()  # dropout is 0 and jitter is 0: train mode changes nothing numerically
    return cfg, model


def batch(cfg):
    gen = torch.Generator().manual_seed(SEED + 2)
    return torch.randint(0, cfg.vocab_size, (BATCH, SEQ), generator=gen, dtype=torch.int64)


def save_like_checkpoint(model, tensors_by_param, tmp):
    """Write tensors_by_param (in-memory param name -> tensor) through save_pretrained, so they
    get exactly the names and layout the checkpoint has; returns name -> tensor as saved."""
    backup = {n: p.detach().clone() for n, p in model.named_parameters()}
    with torch.no_grad():
        for n, p in model.named_parameters():
            p.copy_(tensors_by_param[n])
    model.save_pretrained(tmp, safe_serialization=True)
    with torch.no_grad():
        for n, p in model.named_parameters():
            p.copy_(backup[n])
    out = load_file(os.path.join(tmp, "model.safetensors"))
    return out


def recompute_losses(cfg, logits, router_logits, input_ids):
    """The loss as the C++ side should form it, written from the math, not from transformers."""
    V = cfg.vocab_size
    E = num_experts_of(cfg)
    k = cfg.num_experts_per_tok
    # Causal LM: token t predicts token t+1; the last position of each row has no target.
    ce = torch.nn.functional.cross_entropy(
        logits[:, :-1, :].reshape(-1, V).double(), input_ids[:, 1:].reshape(-1)
    )
    if sigmoid_routed(cfg):  # no load-balancing loss
        return ce, torch.zeros((), dtype=torch.float64)
    # Switch-Transformer balance loss over ALL layers' rows at once (L*N rows):
    #   f_e = (#top-k assignments to e over all rows) / rows;  P_e = sum softmax_e / rows
    #   aux = E * sum_e f_e * P_e
    rows = torch.cat([r.double() for r in router_logits], dim=0)
    probs = torch.softmax(rows, dim=-1)
    sel = torch.topk(probs, k, dim=-1).indices
    counts = torch.zeros(E, dtype=torch.float64).scatter_add_(
        0, sel.reshape(-1), torch.ones(sel.numel(), dtype=torch.float64))
    f = counts / rows.shape[0]
    P = probs.sum(0) / rows.shape[0]
    aux = E * (f * P).sum()
    return ce, aux


def topk_margin(cfg, router_logits, biases=None):
    """Smallest gap between the k-th and (k+1)-th router probability over all rows: how far
    every routing decision is from a tie (an fp32 reimplementation must pick the same experts).
    Sigmoid routing: the smallest gap of the biased choice, in the top-k and between groups."""
    k = cfg.num_experts_per_tok
    if sigmoid_routed(cfg):
        return min(min(sigmoid_choice(cfg, r, b)[1:]) for r, b in zip(router_logits, biases))
    m = float("inf")
    for r in router_logits:
        p = torch.softmax(r.double(), dim=-1).sort(dim=-1, descending=True).values
        m = min(m, float((p[:, k - 1] - p[:, k]).min()))
    return m


def split_fused(params_grads, cfg):
    """In-memory (fused) parameter name -> tensor, rewritten by hand into the checkpoint's
    per-expert names; used to check save_pretrained's conversion independently. gpt-oss's
    checkpoint keeps the in-memory fused tensors as they are."""
    if cfg.model_type == "gpt_oss":
        return dict(params_grads)
    qwen = ("mlp.experts.{e}.gate_proj.weight", "mlp.experts.{e}.up_proj.weight",
            "mlp.experts.{e}.down_proj.weight", "mlp.gate.weight")
    gate_up_names = {"qwen3_moe": qwen, "qwen2_moe": qwen, "dots1": qwen, "deepseek_v3": qwen,
                     "mixtral": ("block_sparse_moe.experts.{e}.w1.weight",
                                 "block_sparse_moe.experts.{e}.w3.weight",
                                 "block_sparse_moe.experts.{e}.w2.weight",
                                 "block_sparse_moe.gate.weight")}[cfg.model_type]
    out = {}
    for n, t in params_grads.items():
        m = re.match(r"(model\.layers\.\d+\.)mlp\.(experts\.gate_up_proj|experts\.down_proj|gate\.weight)$", n)
        if not m:
            out[n] = t
            continue
        pre, what = m.groups()
        if what == "gate.weight":
            out[pre + gate_up_names[3]] = t
            continue
        for e in range(t.shape[0]):
            if what == "experts.gate_up_proj":
                inter = t.shape[1] // 2  # rows [0, I) are gate, [I, 2I) are up (chunk(2) order)
                out[pre + gate_up_names[0].format(e=e)] = t[e, :inter]
                out[pre + gate_up_names[1].format(e=e)] = t[e, inter:]
            else:
                out[pre + gate_up_names[2].format(e=e)] = t[e]
    return out


def ref_biases(ref):
    names = [n for n in ref if n.startswith("bias.")]
    return [ref[n] for n in sorted(names, key=lambda n: int(n.split(".")[3]))]


def verify_reload(family, d, cfg, ref):
    """Load the written directory the way a user would (from_pretrained), rerun the batch and
    compare with what was written: the checkpoint, the names and the gradients agree."""
    cls = FAMILIES[family][1]
    model = cls.from_pretrained(d, dtype=torch.float32, attn_implementation="eager")
    model.train()
    out = model(input_ids=ref["input_ids"], labels=ref["input_ids"], output_router_logits=True)
    out.loss.backward()
    if sigmoid_routed(cfg):  # the correction bias came back from the checkpoint
        for b, want in zip(router_biases(model), ref_biases(ref)):
            if not torch.equal(b, want):
                sys.exit(f"{family}: the reloaded e_score_correction_bias differs from the saved one")
    worst = 0.0
    def rel(a, b):
        return float((a.double() - b.double()).abs().max() / b.double().abs().max().clamp_min(1e-30))
    worst = max(worst, rel(out.loss.detach(), ref["loss"]), rel(out.logits.detach(), ref["logits"]))
    grads = split_fused({n: p.grad for n, p in model.named_parameters()}, cfg)
    names = {n[len("grad."):] for n in ref if n.startswith("grad.")}
    if sorted(grads) != sorted(names):
        sys.exit(f"{family}: hand-split gradient names differ from the checkpoint's: "
                 f"{sorted(set(grads) ^ names)[:6]}")
    for n, g in grads.items():
        worst = max(worst, rel(g, ref["grad." + n]))
    if worst > 1e-6:
        sys.exit(f"{family}: reloaded model differs from the fixture by {worst:.3e} relative")
    return worst


def make(family, out_root):
    cfg, model = build_model(family)
    input_ids = batch(cfg)
    out = model(input_ids=input_ids, labels=input_ids, output_router_logits=True)
    out.loss.backward()

    ce, aux = recompute_losses(cfg, out.logits.detach(), [r.detach() for r in out.router_logits],
                               input_ids)
    coef = getattr(cfg, "router_aux_loss_coef", 0.0) if not sigmoid_routed(cfg) else 0.0
    total = ce + coef * aux
    aux_out = out.aux_loss.detach() if out.aux_loss is not None else torch.zeros(())
    checks = {
        "aux_loss_vs_recomputed_rel": abs(float(aux_out) - float(aux)) / max(abs(float(aux)), 1e-30),
        "loss_vs_ce_plus_coef_aux_rel": abs(float(out.loss.detach()) - float(total)) / abs(float(total)),
    }
    for name, v in checks.items():
        if v > 1e-5:
            sys.exit(f"{family}: {name} = {v:.3e}; transformers' loss is not ce + coef * aux")

    d = os.path.join(out_root, family)
    if os.path.isdir(d):
        shutil.rmtree(d)
    os.makedirs(d)
    model.save_pretrained(d, safe_serialization=True)
    # Only the checkpoint proper: generation_config.json is not a model input.
    for extra in os.listdir(d):
        if extra not in ("config.json", "model.safetensors"):
            os.remove(os.path.join(d, extra))

    params = dict(model.named_parameters())
    with tempfile.TemporaryDirectory() as tmp:
        grads = save_like_checkpoint(model, {n: p.grad for n, p in params.items()}, tmp)
    saved = load_file(os.path.join(d, "model.safetensors"))
    assert sorted(grads) == sorted(saved), "gradient names differ from checkpoint names"
    # The correction bias is a buffer: the checkpoint holds its value, no gradient exists.
    grads = {n: g for n, g in grads.items() if not n.endswith(BUFFER_SUFFIX)}

    ref = {
        "input_ids": input_ids.contiguous(),
        "loss": out.loss.detach().reshape(()).float().contiguous(),
        "ce_loss": ce.reshape(()).float().contiguous(),
        "aux_loss": aux_out.reshape(()).float().contiguous(),
        "logits": out.logits.detach().float().contiguous(),
    }
    for n, g in grads.items():
        ref["grad." + n] = g.float().contiguous()
    for n, t in saved.items():  # the biases the batch was routed with (bias.<checkpoint name>)
        if n.endswith(BUFFER_SUFFIX):
            ref["bias." + n] = t.float().contiguous()
    save_file(ref, os.path.join(d, "reference.safetensors"))
    reload_rel = verify_reload(family, d, cfg, ref)
    margin = topk_margin(cfg, [r.detach() for r in out.router_logits], router_biases(model))
    if margin < MIN_TOPK_MARGIN:
        sys.exit(f"{family}: top-k margin {margin:.3e} < {MIN_TOPK_MARGIN}: routing too close "
                 "to a tie for an fp32 reimplementation to be held to the same experts")

    cfg_json = json.load(open(os.path.join(d, "config.json")))
    info = {
        "family": family,
        "generated_by": "scripts/hf_reference/make_fixtures.py",
        "versions": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "transformers": transformers.__version__,
        },
        "model_class": type(model).__name__,
        "attn_implementation": "eager",
        "dtype": "float32",
        "device": "cpu",
        "seed": SEED,
        "init_std": INIT_STD,
        "norm_weight_jitter": NORM_JITTER,
        "batch": BATCH,
        "seq_len": SEQ,
        "attention_mask": None,
        "labels": "labels = input_ids; transformers shifts inside (position t predicts t+1; the "
                  "last position of each row is ignored), mean over BATCH*(SEQ-1) targets",
        "loss_formula": "loss = ce_loss + router_aux_loss_coef * aux_loss (transformers adds the "
                        "aux term inside forward when labels and output_router_logits are given)",
        "aux_loss_formula": "rows = concat over layers of router logits [BATCH*SEQ, E] -> "
                            "[L*BATCH*SEQ, E]; p = softmax(rows) in fp32; f_e = count of top-k "
                            "picks of e / (L*BATCH*SEQ); P_e = sum_rows p_e / (L*BATCH*SEQ); "
                            "aux = E * sum_e f_e * P_e (no gradient through f)",
        "router_aux_loss_coef": coef,
        "checks": checks,
        "ce_loss_fp64": float(ce),
        "aux_loss_fp64": float(aux),
        "loss_fp64": float(total),
        "topk_margin": margin,
        "reload_max_rel": reload_rel,
        "checkpoint_tensors": {n: list(t.shape) for n, t in sorted(saved.items())},
        "in_memory_parameters": {n: list(p.shape) for n, p in sorted(params.items())},
        "config": cfg_json,
    }
    with open(os.path.join(d, "reference.json"), "w") as fh:
        json.dump(info, fh, indent=1, sort_keys=True)
        fh.write("\n")
    print(f"{family}: loss {float(out.loss):.6f} = ce {float(ce):.6f} + {coef} * aux "
          f"{float(aux_out):.6f}; topk margin {info['topk_margin']:.3e}; "
          f"{len(saved)} checkpoint tensors")


def run_loaded(family, d, dtype, input_ids):
    """from_pretrained of the fixture directory in `dtype`, one forward and backward of the
    batch: the output, the model and its gradients under the checkpoint's names."""
    cls = FAMILIES[family][1]
    model = cls.from_pretrained(d, dtype=dtype, attn_implementation="eager")
    model.train()
    out = model(input_ids=input_ids, labels=input_ids, output_router_logits=True)
    out.loss.backward()
    return out, model, split_fused({n: p.grad for n, p in model.named_parameters()}, model.config)


def routing_flips(cfg, ref_router_logits, router_logits, biases=None):
    """Rows (over all layers) whose top-k expert set under `router_logits` differs from the
    one under `ref_router_logits`, with the reference's k-th minus (k+1)-th probability
    there, and the largest change of a router probability (sigmoid routing: of a score)."""
    k = cfg.num_experts_per_tok
    flips, noise = [], 0.0
    if sigmoid_routed(cfg):
        for layer, (a, b, bias) in enumerate(zip(ref_router_logits, router_logits, biases)):
            noise = max(noise, float((a.double().sigmoid() - b.double().sigmoid()).abs().max()))
            sa, sb = sigmoid_choice(cfg, a, bias)[0], sigmoid_choice(cfg, b, bias)[0]
            for row in (sa != sb).any(dim=-1).nonzero().flatten().tolist():
                flips.append({"layer": layer, "row": row, "fp32_experts": sa[row].tolist(),
                              "bf16_experts": sb[row].tolist(), "fp32_margin": float("nan")})
        return flips, noise
    for layer, (a, b) in enumerate(zip(ref_router_logits, router_logits)):
        pa = torch.softmax(a.double(), dim=-1)
        pb = torch.softmax(b.double(), dim=-1)
        noise = max(noise, float((pa - pb).abs().max()))
        sa = pa.topk(k, dim=-1).indices.sort(dim=-1).values
        sb = pb.topk(k, dim=-1).indices.sort(dim=-1).values
        srt = pa.sort(dim=-1, descending=True).values
        for row in (sa != sb).any(dim=-1).nonzero().flatten().tolist():
            flips.append({"layer": layer, "row": row, "fp32_experts": sa[row].tolist(),
                          "bf16_experts": sb[row].tolist(),
                          "fp32_margin": float(srt[row, k - 1] - srt[row, k])})
    return flips, noise


def make_bf16(family, out_root):
    """reference_bf16.{safetensors,json} for an existing fixture directory, left as it is:
    the committed model.safetensors loaded by transformers in bf16 (from_pretrained rounds
    each fp32 weight to nearest bf16, as peakbound's bf16 load does), the batch of
    reference.safetensors run forward and backward. The loss and logits are transformers'
    (its cross-entropy upcasts the bf16 logits to fp32); the gradients are the bf16
    parameters' bf16 gradients, widened exactly to fp32."""
    d = os.path.join(out_root, family)
    ref = load_file(os.path.join(d, "reference.safetensors"))
    input_ids = ref["input_ids"]
    out32, _, _ = run_loaded(family, d, torch.float32, input_ids)
    out, model, grads = run_loaded(family, d, torch.bfloat16, input_ids)
    cfg = model.config
    names = {n[len("grad."):] for n in ref if n.startswith("grad.")}
    if sorted(grads) != sorted(names):
        sys.exit(f"{family}: bf16 gradient names differ from the fixture's: {sorted(set(grads) ^ names)[:6]}")
    ce, aux = recompute_losses(cfg, out.logits.detach().float(), [r.detach().float() for r in out.router_logits],
                               input_ids)
    res = {
        "input_ids": input_ids.contiguous(),
        "loss": out.loss.detach().reshape(()).float().contiguous(),
        "ce_loss": ce.reshape(()).float().contiguous(),
        "aux_loss": (out.aux_loss.detach() if out.aux_loss is not None else torch.zeros(())).reshape(())
        .float().contiguous(),
        "logits": out.logits.detach().float().contiguous(),
    }
    for n, g in grads.items():
        res["grad." + n] = g.float().contiguous()
    save_file(res, os.path.join(d, "reference_bf16.safetensors"))

    def rel(a, b):
        return float((a.double() - b.double()).abs().max() / b.double().abs().max().clamp_min(1e-30))

    def cos(a, b):
        a, b = a.double().flatten(), b.double().flatten()
        return float((a @ b) / (a.norm() * b.norm()).clamp_min(1e-300))

    cosines = {n: cos(g, ref["grad." + n]) for n, g in grads.items()}
    worst = min(cosines, key=cosines.get)
    flips, noise = routing_flips(cfg, [r.detach() for r in out32.router_logits],
                                 [r.detach() for r in out.router_logits], router_biases(model))
    info = {
        "family": family,
        "generated_by": "scripts/hf_reference/make_fixtures.py --dtype bf16",
        "versions": {"python": platform.python_version(), "torch": torch.__version__,
                     "transformers": transformers.__version__},
        "dtype": "bfloat16 (from_pretrained(dtype=torch.bfloat16) of model.safetensors)",
        "gradients": "bf16 gradients of the bf16 parameters, widened exactly to fp32",
        "batch": "input_ids of reference.safetensors",
        "loss_rel_vs_fp32": abs(float(out.loss.detach()) - float(ref["loss"])) / abs(float(ref["loss"])),
        "ce_loss_rel_vs_fp32": abs(float(ce) - float(ref["ce_loss"])) / abs(float(ref["ce_loss"])),
        "aux_loss_rel_vs_fp32": abs(float(res["aux_loss"]) - float(ref["aux_loss"])) / max(abs(float(ref["aux_loss"])), 1e-30),
        "logits_rel_vs_fp32": rel(out.logits.detach(), ref["logits"]),
        "grad_cosine_vs_fp32": cosines,
        "worst_grad_cosine": {"tensor": worst, "cosine": cosines[worst]},
        "router_prob_max_change_vs_fp32": noise,
        "routing_flips_vs_fp32": flips,
    }
    with open(os.path.join(d, "reference_bf16.json"), "w") as fh:
        json.dump(info, fh, indent=1, sort_keys=True)
        fh.write("\n")
    print(f"{family} bf16: loss {float(out.loss.detach()):.6f} ({info['loss_rel_vs_fp32']:.2e} rel of fp32), worst grad "
          f"cosine {cosines[worst]:.6f} ({worst}), router probabilities moved <= {noise:.2e}, "
          f"{len(flips)} top-k flips" + "".join(f"; layer {f['layer']} row {f['row']} {f['fp32_experts']} -> "
                                               f"{f['bf16_experts']} (fp32 margin {f['fp32_margin']:.2e})"
                                               for f in flips))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="tests/fixtures/hf", help="fixture root (default %(default)s)")
    ap.add_argument("--dtype", choices=("f32", "bf16"), default="f32",
                    help="f32: build the families and their fp32 references; bf16: add reference_bf16.* to "
                         "the existing family directories, which stay as they are (default %(default)s)")
    ap.add_argument("families", nargs="*", default=list(FAMILIES), help="default: all")
    args = ap.parse_args()
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)  # same reductions on every machine
    for fam in args.families:
        (make_bf16 if args.dtype == "bf16" else make)(fam, args.out)


if __name__ == "__main__":
    main()
