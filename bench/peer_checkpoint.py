#!/usr/bin/env python3
"""Peer for `peakbound bench checkpoint`: torch.utils.checkpoint over the same stack of blocks.

One process, one device. The stack is `bench checkpoint`'s (src/peakbound/bench/checkpoint_run.h,
src/peakbound/layers/residual_mlp_block.h): L pre-norm residual SwiGLU MLP blocks, f32,
    y = x + W_down (silu(W_gate n) * (W_up n)),   n = rmsnorm(x) * w_norm  (eps 1e-5)
x, y [T, H]; W_gate, W_up [F, H]; W_down [H, F] (nn.Linear, no bias); w_norm ~ 1 + N(0, 0.1),
W ~ N(0, 1) / sqrt(fan_in); F = 8/3 H rounded up to a multiple of 64 unless --ffn is given.
Defaults are the bench's: L 8, T 2048, H 256 (F 704). The RMSNorm is nn.RMSNorm (F.rms_norm).

A step (as the bench's): gradients zeroed in place (not timed; they stay allocated, like
peakbound's, which are allocated with the parameters), then forward of x [T, H] (requires_grad)
through the L blocks and y.backward(dy) with a fixed dy [T, H] ~ N(0, 1) / T; parameters and x
get their gradients. Two variants on the same parameters and inputs:
  checkpoint     every block called through torch.utils.checkpoint.checkpoint(block, h,
                 use_reentrant=False): only each block's input (its boundary, [T, H]) is kept
                 from forward to backward, on the device, and the block's internals are
                 recomputed in backward (the peer of the bench's resident baseline);
  no_checkpoint  plain autograd: every block's internals saved (what checkpointing saves).

Memory: the peak the step adds beyond what exists before it (parameters, gradients, x, dy):
  cuda: torch.cuda.max_memory_allocated() after - torch.cuda.memory_allocated() before, after
        torch.cuda.reset_peak_memory_stats() ("memory_method": "cuda_max_allocated");
  cpu:  VmHWM after - VmRSS before with VmHWM reset through /proc/self/clear_refs and glibc's
        M_MMAP_THRESHOLD at 128 KiB (as bench/peer_fsdp2.py).
Time: --warmup untimed steps per variant, then --reps timed steps per variant, interleaved,
torch.cuda.synchronize() around each on cuda: "seconds" is the best, "seconds_median" the median,
"seconds_all" all of them (forward + backward, the bench's "seconds").
Check: the two variants' y, dx and parameter gradients are compared ("max_abs_diff",
"bitwise_equal"); checkpointing recomputes the same ops, so they should agree.

Output: one JSON line on stdout (logs on stderr):
  {"peer": "torch_checkpoint", "device", "device_name", "torch", "float32_matmul_precision",
   "dtype": "f32", "layers": L,
   "tokens": T, "hidden": H, "ffn": F, "boundary_bytes": T H 4 (one block's input),
   "peak_added_bytes", "step_seconds": [..], "step_seconds_median", "tokens_per_second"
   (all of the checkpoint variant), "runs": [{"name": "checkpoint"|"no_checkpoint",
   "peak_added_bytes", "seconds", "seconds_median", "seconds_all", "tokens_per_second"}],
   "checkpoint_peak_reduction": 1 - checkpoint / no_checkpoint added peak,
   "max_abs_diff", "bitwise_equal", "memory_method", "error" (only on failure)}
Exit status 0; 1 when a variant failed (e.g. CUDA out of memory: "error"); 2 for bad flags or
--device cuda without a CUDA device (one line on stderr).

    python bench/peer_checkpoint.py --device cuda
    python bench/peer_checkpoint.py --device cpu --layers 4 --tokens 256 --hidden 64
"""
import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.dont_write_bytecode = True  # no bench/__pycache__ from importing peer_fsdp2
from peer_fsdp2 import (cpu_name, open_torch,  # noqa: E402
                        error_text, log, trim)


def resolved_ffn(hidden, ffn):
    return ffn if ffn > 0 else (8 * hidden // 3 + 63) // 64 * 64


def make_stack(torch, args, ffn, device):
    nn = torch.nn
    F = torch.nn.functional

    class Block(nn.Module):
        def __init__(self, g):
            super().__init__()
            H = args.hidden
            self.norm = nn.RMSNorm(H, eps=1e-5)
            self.gate = nn.Linear(H, ffn, bias=False)
            self.up = nn.Linear(H, ffn, bias=False)
            self.down = nn.Linear(ffn, H, bias=False)
            with torch.no_grad():
                self.norm.weight.copy_(1.0 + 0.1 * torch.randn(H, generator=g))
                for lin, fan_in in ((self.gate, H), (self.up, H), (self.down, ffn)):
                    lin.weight.copy_(torch.randn(lin.weight.shape, generator=g) / fan_in ** 0.5)

        def forward(self, x):
            n = self.norm(x)
            return x + self.down(F.silu(self.gate(n)) * self.up(n))

    blocks = nn.ModuleList()
    for l in range(args.layers):
        blocks.append(Block(torch.Generator().manual_seed(args.seed + 1000 + l)))
    return blocks.to(device)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--layers", type=int, default=8, help="L (bench checkpoint's --layers)")
    ap.add_argument("--tokens", type=int, default=2048, help="T")
    ap.add_argument("--hidden", type=int, default=256, help="H")
    ap.add_argument("--ffn", type=int, default=0, help="F; 0 = 8/3 H rounded up to 64")
    ap.add_argument("--dtype", choices=["f32"], default="f32")
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--threads", type=int, default=0, help="CPU threads; 0 = torch's default")
    args = ap.parse_args()
    for name in ("layers", "tokens", "hidden", "reps"):
        if getattr(args, name) < 1:
            ap.error(f"--{name} must be >= 1")
    if args.ffn < 0 or args.warmup < 0:
        ap.error("--ffn and --warmup must be >= 0")

    torch, device, meter, sync = open_torch(args.device, args.threads, "peer_checkpoint")
    cuda = args.device == "cuda"
    from torch.utils.checkpoint import checkpoint
    ffn = resolved_ffn(args.hidden, args.ffn)
    T, H = args.tokens, args.hidden

    result = {"peer": "torch_checkpoint", "device": args.device,
              "device_name": torch.cuda.get_device_name(device) if cuda else cpu_name(),
              "torch": torch.__version__,
              "float32_matmul_precision": torch.get_float32_matmul_precision(),
              "dtype": args.dtype, "layers": args.layers,
              "tokens": T, "hidden": H, "ffn": ffn, "boundary_bytes": T * H * 4,
              "memory_method": meter.method}
    errors = []
    try:
        blocks = make_stack(torch, args, ffn, device)
        g = torch.Generator().manual_seed(args.seed)
        x = torch.randn(T, H, generator=g).to(device).requires_grad_(True)
        dy = (torch.randn(T, H, generator=g) / T).to(device)
        params = [p for p in blocks.parameters()] + [x]
    except Exception as e:
        result["error"] = error_text(e)
        print(json.dumps(result), flush=True)
        sys.exit(1)

    def forward(use_ckpt):
        h = x
        for b in blocks:
            h = checkpoint(b, h, use_reentrant=False) if use_ckpt else b(h)
        return h

    def zero_grads():
        for p in params:
            if p.grad is not None:
                p.grad.zero_()

    def step(use_ckpt):
        """One step; returns (seconds of forward + backward, y detached)."""
        zero_grads()
        sync()
        t0 = time.perf_counter()
        y = forward(use_ckpt)
        y.backward(dy)
        sync()
        return time.perf_counter() - t0, y.detach()

    variants = [("checkpoint", True), ("no_checkpoint", False)]
    runs = {name: {"name": name} for name, _ in variants}
    outputs = {}
    for name, use_ckpt in variants:  # warm-up, then the measured step of each alone
        r = runs[name]
        try:
            for _ in range(args.warmup):
                step(use_ckpt)
            if params[0].grad is None:  # no warm-up: make the gradients exist beforehand
                step(use_ckpt)
            trim()
            if cuda:
                torch.cuda.empty_cache()
            zero_grads()
            meter.start()
            _, y = step(use_ckpt)
            r["peak_added_bytes"] = int(meter.stop())
            outputs[name] = [y.clone()] + [p.grad.detach().clone() for p in params]
            del y
        except Exception as e:  # CUDA OOM is a RuntimeError
            r["error"] = error_text(e)
            errors.append(f"{name}: {r['error']}")
        trim()
        if cuda:
            torch.cuda.empty_cache()
    times = {name: [] for name, _ in variants}
    for _ in range(args.reps):  # interleaved, so a change of load falls on both alike
        for name, use_ckpt in variants:
            if "error" in runs[name]:
                continue
            try:
                times[name].append(step(use_ckpt)[0])
            except Exception as e:
                runs[name]["error"] = error_text(e)
                errors.append(f"{name}: {runs[name]['error']}")
    for name, _ in variants:
        r, ts = runs[name], times[name]
        if ts and "error" not in r:
            r.update({"seconds": min(ts), "seconds_median": statistics.median(ts),
                      "seconds_all": ts, "tokens_per_second": T / min(ts)})
    ck, nc = runs["checkpoint"], runs["no_checkpoint"]
    result["peak_added_bytes"] = ck.get("peak_added_bytes")
    result["step_seconds"] = ck.get("seconds_all")
    result["step_seconds_median"] = ck.get("seconds_median")
    result["tokens_per_second"] = ck.get("tokens_per_second")
    result["runs"] = [ck, nc]
    if ck.get("peak_added_bytes") and nc.get("peak_added_bytes"):
        result["checkpoint_peak_reduction"] = 1.0 - ck["peak_added_bytes"] / nc["peak_added_bytes"]
    if len(outputs) == 2:
        a, b = outputs["checkpoint"], outputs["no_checkpoint"]
        result["max_abs_diff"] = max(float((u - v).abs().max()) for u, v in zip(a, b))
        result["bitwise_equal"] = all(torch.equal(u, v) for u, v in zip(a, b))
    if errors:
        result["error"] = "; ".join(errors)
    log(f"peer_checkpoint: {runs}")
    print(json.dumps(result), flush=True)
    sys.exit(1 if errors else 0)


if __name__ == "__main__":
    main()
