"""peakbound from Python, in the order a notebook would take it (run it as a script):

  1. will a Qwen3-MoE run fit? plan it, and the context reach of the schedules;
  2. train the built-in model for a few steps (the library's run object);
  3. swap a Hugging Face model's loss for Ring-DTP's, with the same loss as before.

    bash scripts/python.sh install
    build/venv-python/bin/python examples/python/quickstart.py
"""

import peakbound

# ---- 1. plan -----------------------------------------------------------------------------
p = peakbound.plan(model="qwen3-30b-a3b", context="128K", devices=8, device_memory="80GiB")
print(p)  # the table `peakbound plan` prints
gib = 2**30
print(f"scheduled peak {p.peak_bytes.scheduled / gib:.1f} GiB a device (baseline "
      f"{p.peak_bytes.baseline / gib:.1f} GiB), bound by {p.binding_component.scheduled}; "
      f"fits: {p.fits.scheduled}")
r = p.reach()
if r.ratio is None:  # the baseline's fixed state alone is over the budget: it fits no context
    print(f"context reach: {r.scheduled:,} tokens scheduled; the baseline fits no context on 8 devices")
else:
    print(f"context reach: {r.scheduled:,} tokens scheduled against {r.baseline:,} ({r.ratio:.1f}x)")
r = peakbound.plan(model="qwen3-30b-a3b", context="128K", devices=64, device_memory="80GiB").reach()
print(f"on 64 devices: {r.scheduled:,} tokens scheduled against {r.baseline:,} for the baseline ({r.ratio:.1f}x)")

# ---- 2. train ----------------------------------------------------------------------------
with peakbound.Run(model="tiny-moe", steps=8, seq_len=128, eval_every=4, eval_batches=2) as run:
    for stats in run:
        print(f"step {stats['step']}: loss {stats['loss']:.4f}, {stats['tokens_per_second']:.0f} tokens/s")
    summary = run.finish()
    print(run.table)  # planned beside measured peaks per component
    print(f"first loss {summary.first_loss:.4f}, last {summary.final_loss:.4f}")

# ---- 3. a Hugging Face model's loss by Ring-DTP ------------------------------------------
import torch  # noqa: E402
from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM  # noqa: E402

from peakbound.torch import last_stats, ring_dtp_cross_entropy  # noqa: E402

torch.manual_seed(0)
config = Qwen3MoeConfig(vocab_size=1000, hidden_size=64, intermediate_size=128, moe_intermediate_size=32,
                        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                        num_experts=4, num_experts_per_tok=2)
model = Qwen3MoeForCausalLM(config).eval()
ids = torch.randint(0, config.vocab_size, (2, 300))

# transformers' own loss: the whole [tokens, vocabulary] logits materialized.
hf_loss = model(input_ids=ids, labels=ids).loss
# The same loss from the last hidden states and the LM head's weight, the logits never whole.
hidden = model.model(input_ids=ids).last_hidden_state
loss = ring_dtp_cross_entropy(hidden[:, :-1], model.lm_head.weight, ids[:, 1:])
print(f"transformers' loss {hf_loss.item():.6f}, Ring-DTP's {loss.item():.6f} "
      f"(difference {abs(hf_loss.item() - loss.item()):.1e})")
loss.backward()  # gradients into the model, as from transformers' loss
s = last_stats()
print(f"Ring-DTP's scratch peak {s['peak_bytes']:,} B (its footprint {s['footprint_bytes']:,} B) against "
      f"{ids.numel() * config.vocab_size * 4:,} B of fp32 logits")
assert abs(hf_loss.item() - loss.item()) <= 1e-5 * abs(hf_loss.item())
