#!/usr/bin/env python3
"""Peer comparison for `peakbound bench optimizer`: the CPU AdamW step of PyTorch
(torch.optim.AdamW, fused and foreach) and, when asked and buildable, DeepSpeed's
DeepSpeedCPUAdam, on the same parameter count and thread count, beside peakbound's
own update measured by the built binary (the update stage of its offload_serial
schedule, clipping excluded) in the same run.

Rows (each side labelled with the tensors it reads and writes and its bytes per
parameter, so the bandwidth comparison is honest):
  f32   peakbound with f32 gradients and f32 parameters (its parameters are the
        master weights, as torch's) against torch fused on f32 everything;
  bf16  peakbound with bf16 gradients in and bf16 parameters out (fp32 master, m, v)
        against the same torch fused f32 step.
The machine may be shared, so the sides take turns for --rounds rounds (peakbound
f32, torch fused, peakbound bf16, torch foreach, then again), each round keeping the
fastest of its --steps timed steps, and every ratio is reported per round with its
min, median and max (never only the best).

It creates its own virtual environment (build/peer-venv, ignored by git) with
`python3 -m venv` and installs torch from PyPI, then re-runs itself inside it;
--venv DIR uses an existing environment that has torch instead (nothing installed).

    python3 bench/peer_adamw.py [--params 64M] [--threads 2] [--steps 5] [--warmup 2] [--rounds 5]
                                [--peakbound build/release/peakbound] [--venv DIR] [--deepspeed]
"""
import argparse
import contextlib
import json
import os
import platform
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_VENV = os.path.join(ROOT, "build", "peer-venv")

# What each side reads and writes per parameter (bytes), for the bandwidth comparison.
TORCH_F32 = {"reads": {"param": 4, "grad": 4, "exp_avg": 4, "exp_avg_sq": 4},
             "writes": {"param": 4, "exp_avg": 4, "exp_avg_sq": 4}}


def peakbound_traffic(param_dtype, grad_dtype):
    size = {"f32": 4, "bf16": 2}
    reads = {"master": 4, "m": 4, "v": 4, "grad_" + grad_dtype: size[grad_dtype]}
    writes = {"master": 4, "m": 4, "v": 4}
    if param_dtype != "f32":  # f32 parameters are the master weights: no copy written
        writes["param_" + param_dtype] = size[param_dtype]
    return {"reads": reads, "writes": writes}


def total_bytes(traffic):
    return sum(traffic["reads"].values()) + sum(traffic["writes"].values())


def parse_count(text):
    """'64M' -> 67108864 (K/M/G are powers of 1024, as peakbound's --params)."""
    text = text.strip()
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:].upper())
    return int(float(text[:-1]) * mult) if mult else int(text)


def ensure_venv(venv, want_deepspeed):
    """Creates the venv and installs what it needs; returns notes on what failed."""
    notes = {}
    py = os.path.join(venv, "bin", "python")
    if not os.path.exists(py):
        subprocess.run([sys.executable, "-m", "venv", venv], check=True)
    pip = [py, "-m", "pip", "install", "--disable-pip-version-check", "-q"]

    def have(mod):
        return subprocess.run([py, "-c", f"import {mod}"], capture_output=True).returncode == 0

    if not have("torch"):
        # Plain PyPI only: Linux wheels there are the CUDA build (large); it runs on CPU.
        r = subprocess.run(pip + ["torch", "numpy"], capture_output=True, text=True)
        if r.returncode != 0:
            raise SystemExit("peer_adamw: pip install torch failed:\n" + r.stderr[-2000:])
    if want_deepspeed and not have("deepspeed"):
        # DeepSpeed ships an sdist whose setup imports torch: build without isolation.
        subprocess.run(pip + ["ninja", "py-cpuinfo", "packaging", "setuptools", "wheel"], capture_output=True)
        r = subprocess.run(pip + ["--no-build-isolation", "deepspeed"], capture_output=True, text=True,
                           env=dict(os.environ, DS_BUILD_OPS="0"))
        if r.returncode != 0:
            notes["deepspeed_install"] = "pip install deepspeed failed: " + r.stderr.strip()[-600:]
    return notes


def best_seconds(fn, warmup, reps):
    for _ in range(warmup):
        fn()
    best = float("inf")
    for _ in range(max(reps, 1)):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def measure_bandwidth(torch, nbytes):
    """A copy kernel over buffers far larger than the last-level cache, as peakbound's."""
    n = nbytes // 4
    a = torch.ones(n, dtype=torch.float32)
    b = torch.empty_like(a)
    copy = best_seconds(lambda: b.copy_(a), 1, 4)
    rmw = best_seconds(lambda: a.mul_(0.5).add_(b), 1, 4)  # two passes: 8 + 12 bytes per element
    return {"copy_gbps": 8 * n / copy / 1e9, "read_modify_write_gbps": 20 * n / rmw / 1e9}


class TorchAdamW:
    """One torch.optim.AdamW over n f32 parameters, kept across rounds (steady state)."""

    def __init__(self, torch, name, n, hp, **kw):
        self.name = name
        self.p = torch.nn.Parameter(torch.randn(n, dtype=torch.float32))
        self.p.grad = torch.randn(n, dtype=torch.float32) * 1e-3
        self.opt = torch.optim.AdamW([self.p], lr=hp["lr"], betas=(hp["beta1"], hp["beta2"]), eps=hp["eps"],
                                     weight_decay=hp["weight_decay"], **kw)

    def round(self, warmup, steps):
        return best_seconds(self.opt.step, warmup, steps)


@contextlib.contextmanager
def stdout_to_stderr():
    """DeepSpeed logs to stdout and its extension build prints there: keep stdout for the JSON."""
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    try:
        with contextlib.redirect_stdout(sys.stderr):
            yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


def deepspeed_seconds(torch, n, warmup, steps, hp):
    from deepspeed.ops.adam import DeepSpeedCPUAdam
    p = torch.nn.Parameter(torch.randn(n, dtype=torch.float32))
    p.grad = torch.randn(n, dtype=torch.float32) * 1e-3
    opt = DeepSpeedCPUAdam([p], lr=hp["lr"], betas=(hp["beta1"], hp["beta2"]), eps=hp["eps"],
                           weight_decay=hp["weight_decay"], adamw_mode=True)
    return best_seconds(opt.step, warmup, steps)


def peakbound_round(binary, n, threads, warmup, steps, dtype, bandwidth_bytes):
    """peakbound's update on the same sizes: the offload_serial update stage (the update alone)."""
    cmd = [binary, "bench", "optimizer", "--schedules", "offload_serial", "--params", str(n),
           "--threads", str(threads), "--param-dtype", dtype, "--grad-dtype", dtype, "--warmup", str(warmup),
           "--steps", str(steps), "--bandwidth-bytes", bandwidth_bytes, "--json"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit("peer_adamw: peakbound failed: " + " ".join(cmd) + "\n" + r.stderr.strip()[-2000:])
    j = json.loads(r.stdout)
    return {"command": " ".join(cmd[1:]), "adam_params_per_second": j["adam_params_per_second"],
            "memory_bandwidth_gbps": j["memory_bandwidth_gbps"], "bytes_per_param": j["bytes_per_param"]["update"],
            "bitwise_equal": j["bitwise_equal"]}


def spread(xs):
    return {"min": min(xs), "median": statistics.median(xs), "max": max(xs)}


def loadavg():
    try:
        return list(os.getloadavg())
    except OSError:
        return None


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--params", default="64M")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--steps", type=int, default=5, help="timed steps a side takes per round (its fastest kept)")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=5, help="rounds of turns (at least 5 for a spread)")
    ap.add_argument("--bandwidth-bytes", default="256M")
    ap.add_argument("--peakbound", default=os.path.join(ROOT, "build", "release", "peakbound"))
    ap.add_argument("--venv", default=None, help="an existing environment with torch (nothing is installed)")
    ap.add_argument("--no-foreach", action="store_true", help="skip torch's foreach AdamW")
    ap.add_argument("--deepspeed", action="store_true", help="also DeepSpeedCPUAdam (installs and builds it)")
    ap.add_argument("--no-deepspeed", action="store_true", help=argparse.SUPPRESS)  # the default now
    args = ap.parse_args()
    if args.rounds < 1:
        raise SystemExit("peer_adamw: --rounds must be at least 1")
    if not os.path.exists(args.peakbound):
        raise SystemExit(f"peer_adamw: no peakbound binary at {args.peakbound} (build it or pass --peakbound)")

    venv = os.path.realpath(args.venv or DEFAULT_VENV)
    if os.path.realpath(sys.prefix) != venv:
        notes = {} if args.venv else ensure_venv(venv, args.deepspeed)
        env = dict(os.environ, PEER_ADAMW_NOTES=json.dumps(notes))
        py = os.path.join(venv, "bin", "python")
        os.execve(py, [py, os.path.abspath(__file__)] + sys.argv[1:], env)

    import torch

    n = parse_count(args.params)
    torch.set_num_threads(args.threads)
    hp = {"lr": 1e-3, "beta1": 0.9, "beta2": 0.999, "eps": 1e-8, "weight_decay": 0.01}
    out = {"benchmark": "optimizer_peers",
           "config": {"params": n, "threads": args.threads, "warmup_steps": args.warmup, "timed_steps": args.steps,
                      "rounds": args.rounds, "hyper_parameters": hp,
                      "statistic": "per round each side's fastest timed step; per-round ratios as min/median/max"},
           "machine": {"python": platform.python_version(), "torch": torch.__version__,
                       "torch_threads": torch.get_num_threads(),
                       "cpu_capability": torch.backends.cpu.get_cpu_capability(),
                       "hardware_threads": os.cpu_count(), "loadavg_start": loadavg()},
           "notes": json.loads(os.environ.get("PEER_ADAMW_NOTES", "{}"))}

    peers = [TorchAdamW(torch, "torch_adamw_fused", n, hp, fused=True)]
    if not args.no_foreach:
        peers.append(TorchAdamW(torch, "torch_adamw_foreach", n, hp, foreach=True))
    rates = {name: [] for name in ["peakbound_f32", "peakbound_bf16"] + [p.name for p in peers]}
    bandwidths, pb_info = [], {}
    for _ in range(args.rounds):
        bw = measure_bandwidth(torch, parse_count(args.bandwidth_bytes))
        bandwidths.append(max(bw.values()))
        # Turns: peakbound f32, torch fused, peakbound bf16, the other peers.
        turns = [("peakbound_f32", "f32"), peers[0], ("peakbound_bf16", "bf16")] + peers[1:]
        for t in turns:
            if isinstance(t, tuple):
                r = peakbound_round(args.peakbound, n, args.threads, args.warmup, args.steps, t[1],
                                    args.bandwidth_bytes)
                rates[t[0]].append(r["adam_params_per_second"])
                bandwidths.append(r["memory_bandwidth_gbps"])
                info = pb_info.setdefault(t[0], {"command": r["command"], "bytes_per_param_bench": r["bytes_per_param"],
                                                 "bitwise_equal": True})
                info["bitwise_equal"] = info["bitwise_equal"] and r["bitwise_equal"]
            else:
                rates[t.name].append(n / t.round(args.warmup, args.steps))
    out["machine"]["loadavg_end"] = loadavg()
    if args.deepspeed:
        with stdout_to_stderr():
            try:
                rates["deepspeed_cpu_adam"] = [n / deepspeed_seconds(torch, n, args.warmup, args.steps, hp)]
            except BaseException as e:  # the JIT build of cpu_adam can fail in many ways
                msg = str(e).strip().splitlines()
                out["notes"]["deepspeed"] = (msg[-1] if msg else type(e).__name__)[:600]

    # One denominator for everyone: the best bandwidth either program measured.
    bandwidth = max(bandwidths)
    out["memory_bandwidth_gbps"] = bandwidth

    def side(name, traffic, extra=None):
        b = total_bytes(traffic)
        s = {"name": name, **traffic, "bytes_per_param": b,
             "adam_params_per_second": spread(rates[name]),
             "roofline_fraction": spread([r * b / (bandwidth * 1e9) for r in rates[name]]),
             "per_round_params_per_second": rates[name]}
        s.update(extra or {})
        return s

    fused = side("torch_adamw_fused", TORCH_F32)
    out["peers"] = [fused] + [side(p.name, TORCH_F32) for p in peers[1:]]
    if "deepspeed_cpu_adam" in rates:
        out["peers"].append(side("deepspeed_cpu_adam", TORCH_F32))
    out["rows"] = []
    for dtype in ("f32", "bf16"):
        name = "peakbound_" + dtype
        traffic = peakbound_traffic(dtype, dtype)
        pb = side(name, traffic, pb_info[name])
        if pb["bytes_per_param_bench"] != pb["bytes_per_param"]:
            raise SystemExit(f"peer_adamw: {name}: the bench counts {pb['bytes_per_param_bench']} bytes a parameter, "
                             f"this script {pb['bytes_per_param']}")
        ratios = [a / b for a, b in zip(rates[name], rates["torch_adamw_fused"])]
        out["rows"].append({
            "row": f"{dtype} grads in, {dtype} params out (peakbound) vs torch fused f32",
            "peakbound": pb,
            "torch_fused_bytes_per_param": fused["bytes_per_param"],
            "ratio_peakbound_over_torch_fused": {**spread(ratios), "per_round": ratios},
            # Throughput per byte moved: above 1 when peakbound uses the bandwidth better.
            "bandwidth_ratio_peakbound_over_torch_fused": spread(
                [r * pb["bytes_per_param"] / fused["bytes_per_param"] for r in ratios]),
        })
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
