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


if __name__ == "__main__":
    main()
