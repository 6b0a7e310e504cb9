#!/usr/bin/env python3
"""Regenerate tests/fixtures/hf/mxfp4/ from transformers' own MXFP4 dequantization.

Why: gpt-oss's hub checkpoints store expert weights as MXFP4 `<w>_blocks` (U8 [E, N, G, 16])
and `<w>_scales` (U8 [E, N, G]); peakbound dequantizes them on import (src/peakbound/io/mxfp4.h)
and must give transformers' parameter bit for bit. This writes seeded random blocks (every
byte value) and scales (the range real checkpoints use, plus 0 for subnormal results and 252,
the largest that keeps 6.0 finite in f32) at odd sizes, and transformers'
`convert_moe_packed_tensors` output in f32 and in bf16 (the dtype from_pretrained dequantizes
to by default):

  mxfp4/mxfp4.safetensors   w_blocks, w_scales, w_f32 [E, G*32, N], w_bf16 [E, G*32, N]
  mxfp4/reference.json      versions and shapes

and a tiny gpt-oss model directory whose experts are stored as the hub's are:

  gpt_oss_mxfp4/config.json, model.safetensors   GptOssForCausalLM (hidden 32, experts of
                            width 32, so both expert weights are whole 32-blocks) saved by
                            save_pretrained, then each layer's mlp.experts.gate_up_proj and
                            down_proj replaced by seeded `_blocks` / `_scales` (and
                            quantization_config set as the hub's config.json has it)
  gpt_oss_mxfp4/dequantized.safetensors   convert_moe_packed_tensors of each (f32), under
                            the weight's name: what the loader must dequantize them to

Run from the repository root with the virtual environment of requirements.txt:
  scripts/hf_reference/.venv/bin/python scripts/hf_reference/make_mxfp4_fixture.py
"""
import argparse
import json
import os
import platform

import torch
import transformers
from safetensors.torch import save_file
from transformers.integrations.mxfp4 import convert_moe_packed_tensors

E, N, G = 3, 5, 3  # N odd, K = 96
SEED = 4321


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="tests/fixtures/hf", help="fixture root (default %(default)s)")
    a = ap.parse_args()
    g = torch.Generator().manual_seed(SEED)
    blocks = torch.randint(0, 256, (E, N, G, 16), generator=g, dtype=torch.int32).to(torch.uint8)
    scales = torch.randint(110, 136, (E, N, G), generator=g, dtype=torch.int32).to(torch.uint8)
    scales[0, 0, 0] = 0    # subnormal results
    scales[2, 4, 2] = 252  # the largest exponent at which 6.0 stays finite in f32
    w_f32 = convert_moe_packed_tensors(blocks.clone(), scales.clone(), dtype=torch.float32)
    w_bf16 = convert_moe_packed_tensors(blocks.clone(), scales.clone(), dtype=torch.bfloat16)
    assert tuple(w_f32.shape) == (E, G * 32, N), w_f32.shape
    assert torch.isfinite(w_f32).all()
    d = os.path.join(a.out, "mxfp4")
    os.makedirs(d, exist_ok=True)
    save_file({"w_blocks": blocks.contiguous(), "w_scales": scales.contiguous(), "w_f32": w_f32.contiguous(),
               "w_bf16": w_bf16.contiguous()}, os.path.join(d, "mxfp4.safetensors"))
    with open(os.path.join(d, "reference.json"), "w") as f:
        json.dump({"transformers": transformers.__version__, "torch": torch.__version__,
                   "python": platform.python_version(), "seed": SEED, "E": E, "N": N, "G": G,
                   "function": "transformers.integrations.mxfp4.convert_moe_packed_tensors"}, f, indent=1)
        f.write("\n")
    print(json.dumps({"out": d, "shape": list(w_f32.shape)}))
    model_dir(a.out, g)


def model_dir(out, g):
    import tempfile
    from safetensors.torch import load_file
    cfg = transformers.GptOssConfig(vocab_size=64, hidden_size=32, intermediate_size=32, num_hidden_layers=2,
                                    num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                                    num_local_experts=4, num_experts_per_tok=2, sliding_window=5,
                                    layer_types=["sliding_attention", "full_attention"], max_position_embeddings=64,
                                    tie_word_embeddings=False)
    torch.manual_seed(SEED)
    model = transformers.GptOssForCausalLM(cfg).float()
    d = os.path.join(out, "gpt_oss_mxfp4")
    os.makedirs(d, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        model.save_pretrained(tmp, safe_serialization=True)
        tensors = load_file(os.path.join(tmp, "model.safetensors"))
        config = json.load(open(os.path.join(tmp, "config.json")))
    config["quantization_config"] = {"quant_method": "mxfp4",
                                     "modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router",
                                                                "model.embed_tokens", "lm_head"]}
    dequantized = {}
    for name in sorted(tensors):
        if not (name.endswith("mlp.experts.gate_up_proj") or name.endswith("mlp.experts.down_proj")):
            continue
        e, k, n = tensors.pop(name).shape  # transformers' parameter [E, G*32, N]
        blocks = torch.randint(0, 256, (e, n, k // 32, 16), generator=g, dtype=torch.int32).to(torch.uint8)
        scales = torch.randint(118, 124, (e, n, k // 32), generator=g, dtype=torch.int32).to(torch.uint8)
        tensors[name + "_blocks"] = blocks
        tensors[name + "_scales"] = scales
        dequantized[name] = convert_moe_packed_tensors(blocks.clone(), scales.clone(), dtype=torch.float32).contiguous()
        assert tuple(dequantized[name].shape) == (e, k, n)
    save_file({k: t.contiguous() for k, t in tensors.items()}, os.path.join(d, "model.safetensors"))
    save_file(dequantized, os.path.join(d, "dequantized.safetensors"))
    for f in ("model.safetensors", "dequantized.safetensors"):
        os.chmod(os.path.join(d, f), 0o644)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(config, f, indent=2, sort_keys=True)
        f.write("\n")
    print(json.dumps({"out": d, "mxfp4": sorted(dequantized)}))


if __name__ == "__main__":
    main()
