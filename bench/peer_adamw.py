#!/usr/bin/env python3
"""Peer comparison for `peakbound bench optimizer`: the CPU AdamW step of PyTorch
(torch.optim.AdamW, foreach and fused) and, when it can be built, DeepSpeed's
DeepSpeedCPUAdam, on the same parameter count and thread count, beside
peakbound's own update measured by the built binary in the same run.

It creates its own virtual environment (build/peer-venv, ignored by git) with
`python3 -m venv` and installs torch (and tries deepspeed) from PyPI, then re-runs
itself inside it. Prints one JSON object with the fields of `peakbound bench
optimizer` that apply to a CPU-only optimizer (runs[].name, step_seconds,
optimizer_device_bytes, adam_params_per_second, memory_bandwidth_gbps,
roofline_fraction) plus the ratios peakbound / peer.

    python3 bench/peer_adamw.py [--params 64M] [--threads 2] [--steps 5] [--warmup 2] [--rounds 3]
                                [--peakbound build/release/peakbound] [--no-deepspeed]
"""
import argparse
import contextlib
import json
import os
import platform
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VENV = os.path.join(ROOT, "build", "peer-venv")


def parse_count(text):
    """'64M' -> 67108864 (K/M/G are powers of 1024, as peakbound's --params)."""
    text = text.strip()
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:].upper())
    return int(float(text[:-1]) * mult) if mult else int(text)


def in_venv():
    return os.path.realpath(sys.prefix) == os.path.realpath(VENV)


def ensure_venv(want_deepspeed):
    """Creates the venv and installs what it needs; returns notes on what failed."""
    notes = {}
    py = os.path.join(VENV, "bin", "python")
    if not os.path.exists(py):
        subprocess.run([sys.executable, "-m", "venv", VENV], check=True)
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
    return {"copy_gbps": 8 * n / copy / 1e9, "read_modify_write_gbps": 20 * n / rmw / 1e9, "buffer_bytes": n * 4}


def torch_runs(torch, n, warmup, steps, hp):
    runs = []
    for name, kw in [("torch_adamw_foreach", {"foreach": True}), ("torch_adamw_fused", {"fused": True})]:
        p = torch.nn.Parameter(torch.randn(n, dtype=torch.float32))
        p.grad = torch.randn(n, dtype=torch.float32) * 1e-3
        try:
            opt = torch.optim.AdamW([p], lr=hp["lr"], betas=(hp["beta1"], hp["beta2"]), eps=hp["eps"],
                                    weight_decay=hp["weight_decay"], **kw)
            secs = best_seconds(opt.step, warmup, steps)
        except Exception as e:  # e.g. a torch without the fused CPU kernel
            runs.append({"name": name, "error": str(e).splitlines()[0]})
            continue
        state = opt.state[p]
        runs.append({"name": name, "step_seconds": secs, "optimizer_device_bytes": 0,
                     "host_optimizer_bytes": 4 * n + sum(t.numel() * t.element_size() for t in state.values()
                                                         if torch.is_tensor(t) and t.numel() == n),
                     "bytes_per_param": 28,  # reads p, g, m, v; writes p, m, v (all fp32)
                     "adam_params_per_second": n / secs})
        del opt, p
    return runs


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


def deepspeed_run(torch, n, warmup, steps, hp):
    try:
        from deepspeed.ops.adam import DeepSpeedCPUAdam
        p = torch.nn.Parameter(torch.randn(n, dtype=torch.float32))
        p.grad = torch.randn(n, dtype=torch.float32) * 1e-3
        opt = DeepSpeedCPUAdam([p], lr=hp["lr"], betas=(hp["beta1"], hp["beta2"]), eps=hp["eps"],
                               weight_decay=hp["weight_decay"], adamw_mode=True)
        secs = best_seconds(opt.step, warmup, steps)
    except BaseException as e:  # the JIT build of cpu_adam can fail in many ways
        msg = str(e).strip().splitlines()
        return {"name": "deepspeed_cpu_adam", "error": (msg[-1] if msg else type(e).__name__)[:600]}
    return {"name": "deepspeed_cpu_adam", "step_seconds": secs, "optimizer_device_bytes": 0,
            "bytes_per_param": 28, "adam_params_per_second": n / secs}


def peakbound_run(binary, n, threads, warmup, steps):
    """peakbound's update on the same sizes (its offload_serial update stage is the update alone)."""
    if not binary or not os.path.exists(binary):
        return None
    cmd = [binary, "bench", "optimizer", "--params", str(n), "--threads", str(threads), "--warmup", str(warmup),
           "--steps", str(steps), "--json"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        return {"error": r.stderr.strip()}
    j = json.loads(r.stdout)
    return {"command": " ".join(cmd[1:]), "adam_params_per_second": j["adam_params_per_second"],
            "roofline_fraction": j["roofline_fraction"], "memory_bandwidth_gbps": j["memory_bandwidth_gbps"],
            "speedup_stream_vs_serial": j.get("speedup_stream_vs_serial"),
            "step_roofline_fraction": j.get("step_roofline_fraction"),
            "pipeline_efficiency": j.get("pipeline_efficiency"),
            "bytes_per_param": j["bytes_per_param"]["update"]}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--params", default="64M")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--bandwidth-bytes", default="256M")
    ap.add_argument("--peakbound", default=os.path.join(ROOT, "build", "release", "peakbound"))
    ap.add_argument("--no-deepspeed", action="store_true")
    ap.add_argument("--rounds", type=int, default=3, help="peakbound and the peers take turns this many times")
    args = ap.parse_args()

    if not in_venv():
        notes = ensure_venv(not args.no_deepspeed)
        env = dict(os.environ, PEER_ADAMW_NOTES=json.dumps(notes))
        os.execve(os.path.join(VENV, "bin", "python"), [os.path.join(VENV, "bin", "python")] + sys.argv, env)

    import torch

    n = parse_count(args.params)
    torch.set_num_threads(args.threads)
    hp = {"lr": 1e-3, "beta1": 0.9, "beta2": 0.999, "eps": 1e-8, "weight_decay": 0.01}
    out = {"benchmark": "optimizer_peers",
           "config": {"params": n, "threads": args.threads, "warmup_steps": args.warmup, "timed_steps": args.steps,
                      "rounds": args.rounds,
                      "dtype": "f32 params, grads and states (torch.optim needs grads in the params' dtype)"},
           "machine": {"python": platform.python_version(), "torch": torch.__version__,
                       "torch_threads": torch.get_num_threads(), "cpu_capability": torch.backends.cpu.get_cpu_capability(),
                       "hardware_threads": os.cpu_count()},
           "notes": json.loads(os.environ.get("PEER_ADAMW_NOTES", "{}"))}
    # The machine is shared: peakbound and the peers take turns for --rounds rounds and
    # each keeps its best, so one disturbed stretch does not decide a ratio.
    best = {}
    pb = None
    bws = []

    def keep(r):
        name = r["name"]
        if "step_seconds" not in r:
            best.setdefault(name, r)
        elif "step_seconds" not in best.get(name, {}) or r["step_seconds"] < best[name]["step_seconds"]:
            best[name] = r

    for _ in range(args.rounds):
        bws.append(measure_bandwidth(torch, parse_count(args.bandwidth_bytes)))
        for r in torch_runs(torch, n, args.warmup, args.steps, hp):
            keep(r)
        if not args.no_deepspeed:
            with stdout_to_stderr():
                try:
                    import deepspeed  # noqa: F401
                    keep(deepspeed_run(torch, n, args.warmup, args.steps, hp))
                except BaseException as e:
                    keep({"name": "deepspeed_cpu_adam", "error": "deepspeed not importable: " + str(e).splitlines()[0]})
        r = peakbound_run(args.peakbound, n, args.threads, args.warmup, args.steps)
        if r and "adam_params_per_second" in r and (pb is None or r["adam_params_per_second"] > pb["adam_params_per_second"]):
            pb = r
        elif pb is None:
            pb = r
    out["bandwidth_kernels"] = {k: max(b[k] for b in bws) for k in bws[0]}
    out["memory_bandwidth_gbps"] = max(out["bandwidth_kernels"]["copy_gbps"], out["bandwidth_kernels"]["read_modify_write_gbps"])
    runs = list(best.values())
    out["peakbound"] = pb
    # One denominator for everyone: the best bandwidth either program measured.
    if pb and "memory_bandwidth_gbps" in pb:
        out["memory_bandwidth_gbps"] = max(out["memory_bandwidth_gbps"], pb["memory_bandwidth_gbps"])
        if "adam_params_per_second" in pb:
            pb["roofline_fraction_common_bandwidth"] = pb["adam_params_per_second"] / (
                out["memory_bandwidth_gbps"] * 1e9 / pb["bytes_per_param"])
    for r in runs:
        if "adam_params_per_second" in r:
            r["roofline_fraction"] = r["adam_params_per_second"] / (out["memory_bandwidth_gbps"] * 1e9 / r["bytes_per_param"])
    out["runs"] = runs
    if pb and "adam_params_per_second" in pb:
        out["ratios_peakbound_over_peer"] = {r["name"]: pb["adam_params_per_second"] / r["adam_params_per_second"]
                                             for r in runs if "adam_params_per_second" in r}
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
