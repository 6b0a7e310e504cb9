"""The transformers side of `peakbound export`: loads an exported folder with
transformers' own from_pretrained and checks the loss its logits give against peakbound's.

    check_export.py PEAKBOUND_BINARY EXPORTED_DIR [--windows 4 --context 16]

Writes a token file (llm.c format) of random ids, runs `peakbound eval --model
EXPORTED_DIR` on it (the mean cross-entropy over every window's S targets, no aux loss) and
computes the same number from the logits transformers produces for each window (fp32, CPU,
eager attention, cross-entropy in double). Exits 1 when the two differ by more than 1e-5
relative. Needs the venv of README.md (torch, transformers, safetensors, numpy).
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
import torch
from transformers import AutoConfig, AutoModelForCausalLM


def write_tokens(path, tokens):
    header = np.zeros(256, dtype=np.int32)
    header[0], header[1], header[2] = 20240520, 1, len(tokens)
    with open(path, "wb") as f:
        f.write(header.tobytes())
        f.write(np.asarray(tokens, dtype=np.uint16).tobytes())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("binary")
    ap.add_argument("exported")
    ap.add_argument("--windows", type=int, default=4)
    ap.add_argument("--context", type=int, default=16)
    a = ap.parse_args()

    torch.manual_seed(0)
    torch.set_num_threads(1)
    config = AutoConfig.from_pretrained(a.exported)
    config.output_router_logits = False
    model = AutoModelForCausalLM.from_pretrained(a.exported, config=config, torch_dtype=torch.float32,
                                                 attn_implementation="eager")
    model.eval()
    rng = np.random.default_rng(1)
    S, N = a.context, a.windows
    tokens = rng.integers(0, config.vocab_size, size=N * S + 1)

    total, count = 0.0, 0
    with torch.no_grad():
        for i in range(N):
            ids = torch.tensor(tokens[i * S:i * S + S][None, :], dtype=torch.long)
            targets = torch.tensor(tokens[i * S + 1:i * S + S + 1], dtype=torch.long)
            logits = model(input_ids=ids).logits[0].double()
            total += torch.nn.functional.cross_entropy(logits, targets, reduction="sum").item()
            count += S
    hf_loss = total / count

    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "tokens.bin")
        write_tokens(path, tokens)
        out = subprocess.run([a.binary, "eval", "--precision", "f32", "--model", a.exported, "--data", path, "--context", str(S), "--windows",
                              str(N), "--json"], capture_output=True, text=True, check=True)
        pb = json.loads(out.stdout.strip().splitlines()[-1])
    rel = abs(pb["loss"] - hf_loss) / abs(hf_loss)
    print(json.dumps({"transformers_loss": hf_loss, "peakbound_loss": pb["loss"], "tokens": count,
                      "rel_diff": rel, "model_type": config.model_type}))
    return 0 if rel <= 1e-5 else 1


if __name__ == "__main__":
    sys.exit(main())
