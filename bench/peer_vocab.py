#!/usr/bin/env python3
"""Peer for `peakbound bench vocab`: the materialized vocabulary projection + loss in PyTorch.

One process, one device. Inputs (made before anything is measured, seeded --seed):
hidden [T, H] ~ N(0, 1) and W [V, H] ~ N(0, 1) * 2 / sqrt(H) (as `bench vocab` draws them),
both requires_grad, targets [T] uniform in [0, V). A step is
    logits = hidden @ W.T            [T, V], materialized (fp32; with --dtype bf16 the GEMM is
                                     bf16 and the logits are upcast to fp32 for the loss)
    loss = F.cross_entropy(logits, targets)      (mean over the T tokens)
    loss.backward()                  -> hidden.grad [T, H], W.grad [V, H]
with hidden.grad and W.grad set to None before the step, so the gradients the step makes are
part of what it adds ("grad_bytes" says how much of it they are: (T + V) H elements).
Defaults are `peakbound bench vocab`'s (src/peakbound/cli/vocab_flags.h): T 4096 tokens,
H 256, V 16384, f32; compare with its P = 1 run, whose "vocab_peak_bytes" counts the loss's
own device buffers (logits [T, V] turned into their gradient in place, the hidden copy, dHidden)
with W and dW outside the device.

Memory: the peak the step adds beyond its inputs.
  cuda: torch.cuda.max_memory_allocated() after the step - torch.cuda.memory_allocated() just
        before it, after torch.cuda.reset_peak_memory_stats() ("memory_method":
        "cuda_max_allocated"; tensors, not the caching allocator's reserve);
  cpu:  VmHWM after the step - VmRSS before it, VmHWM reset through /proc/self/clear_refs
        (or VmRSS sampled every 1 ms), glibc's M_MMAP_THRESHOLD set to 128 KiB so freed
        tensors leave the resident set (as bench/peer_fsdp2.py: "memory_method" says which).
Time: --warmup untimed steps, then --reps timed steps (torch.cuda.synchronize() around each on
cuda); "step_seconds" lists them, "step_seconds_median" is their median.

Variants: the top-level fields are the eager step (torch.compile OFF: the plain materialized
peer). --compile both (the default) also runs the same step function through torch.compile
(Inductor, default mode) and reports it under "compiled" with the same fields (or "error" when
compilation fails, e.g. no Triton or no C++ compiler); --compile off skips it, --compile on runs
only the compiled one (then also under "compiled", the top level is null).

Output: one JSON line on stdout (logs on stderr):
  {"peer": "torch_materialized_ce", "device": "cpu"|"cuda", "device_name": str, "torch": str,
   "float32_matmul_precision": torch's setting ("highest" by default: no TF32),
   "dtype": "f32"|"bf16", "tokens": T, "hidden": H, "vocab": V, "compile": false,
   "peak_added_bytes": int, "grad_bytes": int, "logits_bytes": T V 4,
   "step_seconds": [s, ...], "step_seconds_median": s, "tokens_per_second": T / median,
   "loss": float, "memory_method": str, "compiled": {... same fields ...} or absent,
   "error": str (only on failure)}
Exit status: 0; 1 when a measured variant failed (its "error" says why, e.g. CUDA out of memory);
2 for bad flags or --device cuda without a CUDA device (one line on stderr).

    python bench/peer_vocab.py --device cuda                     # bench vocab's defaults
    python bench/peer_vocab.py --device cpu --tokens 256 --vocab 2048 --hidden 64
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


def make_inputs(torch, args, device, dtype):
    g = torch.Generator().manual_seed(args.seed)
    hidden = torch.randn(args.tokens, args.hidden, generator=g)
    weight = torch.randn(args.vocab, args.hidden, generator=g) * (2.0 / args.hidden ** 0.5)
    targets = torch.randint(0, args.vocab, (args.tokens,), generator=g, dtype=torch.long)
    hidden = hidden.to(device=device, dtype=dtype).requires_grad_(True)
    weight = weight.to(device=device, dtype=dtype).requires_grad_(True)
    return hidden, weight, targets.to(device)


def loss_fn(hidden, weight, targets):
    import torch.nn.functional as F
    logits = hidden @ weight.t()
    return F.cross_entropy(logits.float(), targets)


def measure(torch, args, fn, inputs, meter, sync):
    hidden, weight, targets = inputs

    def step():
        hidden.grad = None
        weight.grad = None
        loss = fn(hidden, weight, targets)
        loss.backward()
        return loss.detach()

    out = {}
    try:
        for _ in range(args.warmup):
            step()
        sync()
        trim()
        if device_is_cuda(hidden):
            torch.cuda.empty_cache()
        hidden.grad = None
        weight.grad = None
        trim()
        meter.start()
        loss = step()
        sync()
        out["peak_added_bytes"] = int(meter.stop())
        out["loss"] = float(loss)
        times = []
        for _ in range(args.reps):
            sync()
            t0 = time.perf_counter()
            step()
            sync()
            times.append(time.perf_counter() - t0)
        out["step_seconds"] = times
        out["step_seconds_median"] = statistics.median(times)
        out["tokens_per_second"] = args.tokens / out["step_seconds_median"]
    except Exception as e:  # CUDA OOM (a RuntimeError), compile failures (many kinds)
        out = {"error": error_text(e)}
    hidden.grad = None
    weight.grad = None
    trim()
    if device_is_cuda(hidden):
        torch.cuda.empty_cache()
    return out


def device_is_cuda(t):
    return t.device.type == "cuda"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--tokens", type=int, default=4096, help="T (bench vocab's --tokens)")
    ap.add_argument("--hidden", type=int, default=256, help="H")
    ap.add_argument("--vocab", type=int, default=16384, help="V")
    ap.add_argument("--dtype", choices=["f32", "bf16"], default="f32",
                    help="of hidden, W and the GEMM; the loss is fp32 either way")
    ap.add_argument("--compile", choices=["both", "off", "on"], default="both",
                    help="also (both) or only (on) the torch.compile'd step")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--threads", type=int, default=0, help="CPU threads; 0 = torch's default")
    args = ap.parse_args()
    for name in ("tokens", "hidden", "vocab", "reps"):
        if getattr(args, name) < 1:
            ap.error(f"--{name} must be >= 1")
    if args.warmup < 0:
        ap.error("--warmup must be >= 0")

    torch, device, meter, sync = open_torch(args.device, args.threads, "peer_vocab")
    cuda = args.device == "cuda"
    dtype = {"f32": torch.float32, "bf16": torch.bfloat16}[args.dtype]
    elem = 2 if args.dtype == "bf16" else 4

    result = {"peer": "torch_materialized_ce", "device": args.device,
              "device_name": torch.cuda.get_device_name(device) if cuda else cpu_name(),
              "torch": torch.__version__,
              "float32_matmul_precision": torch.get_float32_matmul_precision(),
              "dtype": args.dtype, "tokens": args.tokens,
              "hidden": args.hidden, "vocab": args.vocab, "compile": False,
              "grad_bytes": (args.tokens + args.vocab) * args.hidden * elem,
              "logits_bytes": args.tokens * args.vocab * 4, "memory_method": meter.method}
    failed = False
    try:
        inputs = make_inputs(torch, args, device, dtype)
    except Exception as e:
        result["error"] = error_text(e)
        print(json.dumps(result), flush=True)
        sys.exit(1)
    keys = ("peak_added_bytes", "step_seconds", "step_seconds_median", "tokens_per_second", "loss")
    if args.compile in ("both", "off"):
        r = measure(torch, args, loss_fn, inputs, meter, sync)
        result.update({k: r.get(k) for k in keys})
        if "error" in r:
            result["error"] = r["error"]
            failed = True
        log(f"peer_vocab eager: {r}")
    else:
        result.update({k: None for k in keys})
    if args.compile in ("both", "on"):
        t0 = time.perf_counter()
        try:
            compiled = torch.compile(loss_fn)
        except Exception as e:
            r = {"error": error_text(e)}
        else:
            r = measure(torch, args, compiled, inputs, meter, sync)
        r["compile"] = True
        r["seconds_including_compile"] = round(time.perf_counter() - t0, 2)
        failed = failed or "error" in r
        result["compiled"] = r
        log(f"peer_vocab compiled: {r}")
    print(json.dumps(result), flush=True)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
