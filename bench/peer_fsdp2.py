#!/usr/bin/env python3
"""Peer for `peakbound bench reach`: real PyTorch FSDP2 training of the same model (CPU or GPU).

Builds peakbound's `tiny-moe` preset as Hugging Face transformers' Qwen3MoeForCausalLM from
bench/peer_fsdp2_model.json (q_norm / k_norm replaced by nn.Identity: tiny-moe has no QK-norm),
fp32 parameters, sdpa attention. Each decoder layer gets non-reentrant activation checkpointing
(checkpoint_wrapper) and is then wrapped by FSDP2 `fully_shard` on a 1-D "cpu" device mesh over
the ranks (gloo; for GPUs see "On a GPU" below); the root model is fully_shard-ed last. AdamW
(lr 2e-3, betas (0.9, 0.95), weight decay 0), grad-norm clip 1.0.

Precision (--precision): f32 (the default) computes in fp32 throughout. bf16 is FSDP2's own
mixed precision, as peakbound's bf16 is: every fully_shard gets
mp_policy=MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32), so the
sharded parameters, their gradients and AdamW's state stay fp32 while the all-gathered
parameters, the forward and the backward are bf16 and gradients are reduce-scattered in fp32
(on the CPU torch's bf16 matmuls are oneDNN's, AMX where the CPU has it). The output's
"precision" says which; `peakbound bench reach --peer-json` refuses a peer of the other precision.

Data: each rank trains on its own sequence of S token ids drawn uniformly from the vocabulary
(torch.Generator seeded 1234 + 7919 * rank + S); labels = the ids (transformers shifts them):
loss = mean cross-entropy over the S-1 targets + 0.01 * router aux loss, as transformers
computes it with output_router_logits=True.

Allocator: by default (--malloc mmap) the script sets glibc's M_MMAP_THRESHOLD to 128 KiB with
mallopt at start-up, so every tensor of 128 KiB or more is its own mmap and leaves the resident
set when freed; with glibc's default dynamic threshold (--malloc default) freed blocks up to
32 MiB stay in the heap, and fragmentation adds 150-190 MiB of resident memory per step here
that no tensor holds. The default gives torch the larger reach (the conservative comparison).
On cuda the default is --malloc default: the device figure does not depend on it, and mmap'ing
every temporary of the CPU optimizer step would only slow torch down.

Memory (--device cpu): the peak a rank's training step (forward, backward, clip, optimizer
step, zero_grad) adds = VmHWM after the step - VmRSS just before it; before the step the script runs
gc.collect() and glibc malloc_trim(0), then writes "5" to /proc/self/clear_refs, which resets
VmHWM to the current VmRSS (if clear_refs is not writable, a thread samples VmRSS every 1 ms
instead: "memory_method" says which). The value is the max over ranks (all_reduce MAX). Each
context runs 1 warm-up step first (AdamW states exist from the first step on, and the
allocator has seen the sizes), then the measured step; on cuda only the first trial warms up
(--trial-warmup, default 1 on cpu and 0 on cuda: the device figure counts allocated tensor
bytes, which the caching allocator's history does not change, and the AdamW states exist after
the first trial), which halves the search's time. Everything the step made is freed
(and trimmed) before the next context; the model and optimizer are kept.

On a GPU (--device cuda): one rank per GPU (torch.cuda.set_device(LOCAL_RANK)), process group
"cpu:gloo,cuda:nccl" (NCCL for FSDP2's collectives on the GPU; gloo for the CPU tensors: the
offloaded gradients' norm in clip_grad_norm_ and the script's own reductions), the 1-D mesh on
"cuda". --cpu-offload (the default on cuda; --no-cpu-offload turns it off) passes
offload_policy=CPUOffloadPolicy() to every fully_shard: the sharded parameters, gradients and
AdamW states live in pinned host memory and the optimizer step runs on the CPU; the GPU holds
only what forward and backward all-gather and compute. Memory on cuda: the step's peak added on
the device = torch.cuda.max_memory_allocated() after the step - torch.cuda.memory_allocated()
just before it, torch.cuda.reset_peak_memory_stats() having been called just before
("memory_method": "cuda_max_allocated"; tensors only, not the caching allocator's reserve, the
CUDA context or NCCL's buffers); each trial also reports "host_added_peak_bytes" (the resident
meter above, informational: the offloaded optimizer works there). A torch.cuda.OutOfMemoryError
during a step counts as not fitting: the FSDP2 iteration state is reset
(reset_iter_state, or reshard on older torch) and the cache emptied before the next context.
Without torchrun (RANK unset) the script sets the env:// defaults itself (one rank,
MASTER_ADDR 127.0.0.1, a free port), so `python bench/peer_fsdp2.py --device cuda ...` runs
on one GPU. No CUDA device: one line "peer_fsdp2: CUDA is not available" and exit 2; no
transformers: one line and exit 2.

Launch (4 ranks; bench/peer_fsdp2.sh creates the venv and runs this):
    torchrun --nproc-per-node 4 bench/peer_fsdp2.py --budget 256MiB [--start-context 256]
             [--throughput-at 512,1024] [--config bench/peer_fsdp2_model.json]
    torchrun --nproc-per-node 4 bench/peer_fsdp2.py --contexts 256,512 [--budget B]
    torchrun --standalone --nproc-per-node 1 bench/peer_fsdp2.py --device cuda --budget 16GiB
    python bench/peer_fsdp2.py --device cuda --budget 16GiB        (one GPU, no torchrun)

Output: one JSON line on stdout from rank 0 (logs go to stderr):
  {"peer": "torch_fsdp2", "torch": str, "transformers": str, "ranks": 4, "threads_per_rank": n,
   "budget_bytes": B or null, "attention": "sdpa", "activation_checkpointing": true,
   "reach_tokens": S* or null, "tokens_per_second_at_reach": float or null,
   "trials": [{"context": S, "added_peak_bytes": int or null, "fits": bool or null,
               "step_seconds": float or null, "loss": float or null (mean over ranks),
               "error": str (only on failure)}],
   "tokens_per_second_at": {"S": tokens/s, ...},
   plus informational fields: "attention_kernel", "memory_method", "malloc",
   "experts_implementation", "data", "model_params", "contexts_multiple_of", "wall_seconds",
   "device" ("cpu" or "cuda"), "device_name", "cpu_offload", "backend", "trial_warmup_steps",
   "float32_matmul_precision" (torch's default "highest": fp32 GEMMs without TF32),
   "precision" ("f32" or "bf16", --precision),
   "search_stopped" (null, or why the search stopped early); on cuda each trial also
   has "host_added_peak_bytes" and the top level "host_memory_method"}
  Search mode (--budget without --contexts): contexts double from --start until a step's added
  peak exceeds B (or raises RuntimeError/MemoryError, CUDA OOM included), then bisection
  (contexts rounded to a multiple of 4) until the bracket is narrower than
  max(64, last good doubling context / 16).
  --time-limit T: no trial starts once T seconds have passed since start-up (reach_tokens is
  then the largest fitting context so far, a lower bound, and "search_stopped" says so; else it
  is null). reach_tokens = the largest fitting context; tokens_per_second_at_reach and every
  --throughput-at S = ranks * S / (mean wall time of 3 steps after 1 warm-up), the time of a step
  being the max over ranks. --contexts mode measures just those contexts (fits and
  reach_tokens only when --budget is given). tokens = ranks x S (every rank its own sequence).
"""
import argparse
import contextlib
import ctypes
import gc
import json
import math
import os
import re
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_CONFIG = os.path.join(ROOT, "bench", "peer_fsdp2_model.json")
DEFAULT_PARAMS = 19276032  # tiny-moe, as built from DEFAULT_CONFIG
MULTIPLE = 4
MMAP_THRESHOLD = 128 << 10


def parse_bytes(text):
    """'256MiB' -> 268435456; units as peakbound's parse_bytes (K/KiB.. x1024, KB.. x1000)."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:[eE][0-9]+)?)\s*([A-Za-z]*)\s*", text)
    if not m:
        raise SystemExit(f"--budget: cannot parse '{text}'")
    mult = {"": 1, "b": 1, "k": 1 << 10, "kib": 1 << 10, "m": 1 << 20, "mib": 1 << 20,
            "g": 1 << 30, "gib": 1 << 30, "t": 1 << 40, "tib": 1 << 40, "kb": 10**3,
            "mb": 10**6, "gb": 10**9, "tb": 10**12}.get(m.group(2).lower())
    if mult is None:
        raise SystemExit(f"--budget: unknown unit '{m.group(2)}' "
                         "(use B, KiB, MiB, GiB, TiB, KB, MB, GB, TB)")
    return int(float(m.group(1)) * mult)


def parse_list(text):
    return [int(x) for x in text.split(",") if x.strip()] if text else []


def log(*a):
    print(*a, file=sys.stderr, flush=True)


# ---- resident memory -------------------------------------------------------------------

def _status_kib(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


_libc = ctypes.CDLL("libc.so.6")


def trim():
    gc.collect()
    _libc.malloc_trim(0)


def clear_refs_works():
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return _status_kib("VmHWM") <= _status_kib("VmRSS") + (1 << 20)
    except OSError:
        return False


class PeakMeter:
    """Resident high-water mark since start(): VmHWM after clear_refs, or a 1 ms VmRSS sampler."""

    def __init__(self):
        self.method = "clear_refs+VmHWM" if clear_refs_works() else "VmRSS sampled every 1 ms"

    def start(self):
        self._base = _status_kib("VmRSS")
        if self.method.startswith("clear_refs"):
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
            return
        self._peak = self._base
        self._stop = threading.Event()

        def run():
            while not self._stop.is_set():
                self._peak = max(self._peak, _status_kib("VmRSS"))
                time.sleep(0.001)

        self._thread = threading.Thread(target=run, daemon=True)
        self._thread.start()

    def stop(self):
        """The bytes the resident set peaked above its size at start()."""
        if self.method.startswith("clear_refs"):
            return _status_kib("VmHWM") - self._base
        self._stop.set()
        self._thread.join()
        return max(self._peak, _status_kib("VmRSS")) - self._base


class CudaPeakMeter:
    """Device tensor bytes allocated at peak since start() beyond those allocated at start()."""

    method = "cuda_max_allocated"

    def __init__(self, torch):
        self.torch = torch

    def start(self):
        self.torch.cuda.synchronize()
        self.torch.cuda.reset_peak_memory_stats()
        self._base = self.torch.cuda.memory_allocated()

    def stop(self):
        self.torch.cuda.synchronize()
        return self.torch.cuda.max_memory_allocated() - self._base


def open_torch(device_kind, threads, who):
    """The single-device peers' start-up (peer_vocab, peer_checkpoint): the mmap threshold
    for the resident-set figure (cpu only, before torch allocates), torch, the CUDA check
    (a clear line and exit 2 without a GPU), the thread count. Returns (torch, device,
    meter, sync)."""
    if device_kind == "cpu" and _libc.mallopt(-3, MMAP_THRESHOLD) != 1:
        raise SystemExit("mallopt(M_MMAP_THRESHOLD) failed")
    import torch
    cuda = device_kind == "cuda"
    if cuda and not torch.cuda.is_available():
        print(f"{who}: CUDA is not available (--device cuda); torch "
              f"{torch.__version__}, built with CUDA {torch.version.cuda}", file=sys.stderr)
        sys.exit(2)
    if threads:
        torch.set_num_threads(threads)
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    meter = CudaPeakMeter(torch) if cuda else PeakMeter()
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    return torch, device, meter, sync


def env_defaults():
    """Plain `python` (no torchrun): one rank, env:// rendezvous on a free local port."""
    if "RANK" in os.environ:
        return
    import socket
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(port))
    os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1")


def error_text(e, limit=400):
    """'Type: first line of the message', for the JSON."""
    msg = str(e).strip()
    return f"{type(e).__name__}: {msg.splitlines()[0] if msg else ''}"[:limit]


def cpu_name():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "cpu"


# ---- model -----------------------------------------------------------------------------

def build(args, torch, dist):
    import torch.nn as nn
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
        CheckpointImpl, checkpoint_wrapper)
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from transformers import AutoConfig, AutoModelForCausalLM

    import transformers
    with open(args.config) as f:
        fields = json.load(f)
    if int(transformers.__version__.split(".")[0]) < 5:
        # transformers 4 (a GPU image may have one) names two fields the old way: without
        # this its Qwen3MoeConfig would keep its own defaults (128 experts, its rope_theta).
        if "num_local_experts" in fields:
            fields.setdefault("num_experts", fields["num_local_experts"])
        if "rope_theta" in fields.get("rope_parameters", {}):
            fields.setdefault("rope_theta", fields["rope_parameters"]["rope_theta"])
    config = AutoConfig.for_model(fields.pop("model_type"), **fields)
    config.use_cache = False
    torch.manual_seed(0)  # same initial weights on every rank before sharding
    try:
        model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa",
                                                 dtype=torch.float32)
    except TypeError:  # transformers < 4.56 calls it torch_dtype
        model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa",
                                                 torch_dtype=torch.float32)
    for layer in model.model.layers:
        layer.self_attn.q_norm = nn.Identity()
        layer.self_attn.k_norm = nn.Identity()
    params = sum(p.numel() for p in model.parameters())
    if args.config == DEFAULT_CONFIG and params != DEFAULT_PARAMS and dist.get_rank() == 0:
        log(f"peer_fsdp2: WARNING: {params} parameters, not tiny-moe's {DEFAULT_PARAMS}: this "
            f"transformers ({transformers.__version__}) reads bench/peer_fsdp2_model.json "
            "differently, so the model is not peakbound's")
    mesh = init_device_mesh(args.device, (dist.get_world_size(),))
    shard_kw = {"mesh": mesh}
    if args.precision == "bf16":
        from torch.distributed.fsdp import MixedPrecisionPolicy
        shard_kw["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16,
                                                     reduce_dtype=torch.float32)
    if args.cpu_offload:
        from torch.distributed.fsdp import CPUOffloadPolicy
        shard_kw["offload_policy"] = CPUOffloadPolicy()
    # fully_shard moves each module's parameters and buffers to the mesh's device (cuda);
    # with CPUOffloadPolicy the shards then live in pinned host memory.
    for i, layer in enumerate(model.model.layers):
        wrapped = layer
        if not args.no_activation_checkpointing:
            wrapped = checkpoint_wrapper(layer, checkpoint_impl=CheckpointImpl.NO_REENTRANT)
        fully_shard(wrapped, **shard_kw)
        model.model.layers[i] = wrapped
    fully_shard(model, **shard_kw)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3, betas=(0.9, 0.95), weight_decay=0.0)
    return config, model, opt, params


def batch(torch, vocab, context, rank, device="cpu"):
    """The same ids on every device: drawn on the CPU, then moved."""
    g = torch.Generator().manual_seed(1234 + 7919 * rank + context)
    return torch.randint(0, vocab, (1, context), generator=g, dtype=torch.long).to(device)


def reset_fsdp(model):
    """After an exception aborted a step mid-flight: FSDP2's iteration state back to idle."""
    if hasattr(model, "reset_iter_state"):  # torch >= 2.15
        model.reset_iter_state()
        return
    from torch.distributed.fsdp import FSDPModule
    for m in model.modules():
        if isinstance(m, FSDPModule):
            m.reshard()


def train_step(torch, model, opt, ids):
    out = model(input_ids=ids, labels=ids, output_router_logits=True)
    loss = out.loss
    del out
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    opt.zero_grad(set_to_none=True)
    value = float(loss.detach())
    del loss
    return value


def attention_kernel(torch, model, vocab, rank, device):
    """Which aten attention op sdpa dispatches to here (one no-grad forward at 64 tokens)."""
    from torch.profiler import ProfilerActivity, profile
    ids = batch(torch, vocab, 64, rank, device)
    with torch.no_grad(), profile(activities=[ProfilerActivity.CPU]) as prof:
        model(input_ids=ids)
    names = {e.key for e in prof.key_averages()}
    hits = sorted(n for n in names if "scaled_dot_product" in n or "flash_attention" in n
                  or "efficient_attention" in n)
    return ",".join(hits) or "unknown"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", default=DEFAULT_CONFIG)
    ap.add_argument("--budget", default=None, help="bytes, e.g. 256MiB")
    ap.add_argument("--start", "--start-context", dest="start", type=int, default=256,
                    help="first context of the search (under torchrun write --start-context: "
                         "torchrun 2.15 takes --start as an abbreviation of its own options)")
    ap.add_argument("--max-context", type=int, default=1 << 20)
    ap.add_argument("--contexts", default="", help="S1,S2,...: measure only these")
    ap.add_argument("--throughput-at", default="", help="S1,S2,...: steady-state tokens/s")
    ap.add_argument("--threads", type=int, default=0, help="per rank; 0 = max(1, cores // ranks)")
    ap.add_argument("--no-activation-checkpointing", action="store_true",
                    help="for checking what checkpointing saves; the comparison uses it")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                    help="cpu: gloo ranks, resident memory; cuda: one rank per GPU, nccl, "
                         "torch.cuda.max_memory_allocated")
    ap.add_argument("--cpu-offload", action=argparse.BooleanOptionalAction, default=None,
                    help="fully_shard(offload_policy=CPUOffloadPolicy()): parameters, gradients "
                         "and optimizer states on the host, optimizer step on the CPU (default: "
                         "on for cuda; cuda only)")
    ap.add_argument("--trial-warmup", type=int, default=None,
                    help="untimed steps before each search/--contexts trial after the first "
                         "(which always has 1); default 1 on cpu, 0 on cuda")
    ap.add_argument("--time-limit", type=float, default=0,
                    help="seconds since start after which no new trial starts (the reach found "
                         "so far is reported, \"search_stopped\" says so); 0 = none")
    ap.add_argument("--precision", choices=["f32", "bf16"], default="f32",
                    help="f32, or bf16: FSDP2's MixedPrecisionPolicy (bf16 compute, fp32 "
                         "parameters, gradients reduced in fp32)")
    ap.add_argument("--malloc", choices=["mmap", "default"], default=None,
                    help="mmap: mallopt(M_MMAP_THRESHOLD, 128 KiB), so freed tensors leave the "
                         "resident set (the default on cpu); default: glibc's dynamic threshold "
                         "(the default on cuda)")
    args = ap.parse_args()
    if args.malloc is None:
        args.malloc = "default" if args.device == "cuda" else "mmap"
    budget = parse_bytes(args.budget) if args.budget else None
    contexts = parse_list(args.contexts)
    if budget is None and not contexts and not args.throughput_at:
        raise SystemExit("give --budget B (search), --contexts S1,.. or --throughput-at S1,..")
    if args.trial_warmup is not None and args.trial_warmup < 0:
        ap.error("--trial-warmup must be >= 0")
    if args.cpu_offload is None:
        args.cpu_offload = args.device == "cuda"
    elif args.cpu_offload and args.device != "cuda":
        ap.error("--cpu-offload needs --device cuda (on the CPU everything is on the host already)")

    wall0 = time.time()
    malloc = "glibc default (dynamic mmap threshold)"
    if args.malloc == "mmap":
        if _libc.mallopt(-3, MMAP_THRESHOLD) != 1:  # M_MMAP_THRESHOLD
            raise SystemExit("mallopt(M_MMAP_THRESHOLD) failed")
        malloc = f"mallopt M_MMAP_THRESHOLD={MMAP_THRESHOLD}"
    import torch
    import torch.distributed as dist
    cuda = args.device == "cuda"
    if cuda and not torch.cuda.is_available():
        print("peer_fsdp2: CUDA is not available (--device cuda); torch "
              f"{torch.__version__}, built with CUDA {torch.version.cuda}", file=sys.stderr)
        sys.exit(2)
    try:
        import transformers
    except ImportError as e:
        print(f"peer_fsdp2: transformers is not installed ({e}); it builds the model "
              "(pip install -r bench/peer_requirements.txt)", file=sys.stderr)
        sys.exit(2)

    env_defaults()
    timeout = __import__("datetime").timedelta(minutes=10)
    if cuda:
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        if local_rank >= torch.cuda.device_count():
            print(f"peer_fsdp2: LOCAL_RANK {local_rank} but only {torch.cuda.device_count()} "
                  "CUDA devices", file=sys.stderr)
            sys.exit(2)
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
        backend = "cpu:gloo,cuda:nccl"
        try:
            dist.init_process_group(backend, timeout=timeout, device_id=device)
        except TypeError:  # torch without device_id
            dist.init_process_group(backend, timeout=timeout)
        device_name = torch.cuda.get_device_name(device)
    else:
        device = torch.device("cpu")
        backend = "gloo"
        dist.init_process_group(backend, timeout=timeout)
        device_name = cpu_name()
    rank, world = dist.get_rank(), dist.get_world_size()
    cores = len(os.sched_getaffinity(0))
    threads = args.threads or max(1, cores // world)
    torch.set_num_threads(threads)

    config, model, opt, params = build(args, torch, dist)
    vocab = config.vocab_size
    host_meter = PeakMeter()
    meter = CudaPeakMeter(torch) if cuda else host_meter
    experts = getattr(model.config, "_experts_implementation_internal", None) or getattr(
        model.config, "_experts_implementation", None) or "unknown"
    kernel = attention_kernel(torch, model, vocab, rank, device)
    if rank == 0:
        log(f"peer_fsdp2: {world} ranks x {threads} threads on {device_name}, {params} params, "
            f"memory by {meter.method}, attention kernel {kernel}"
            + (f", CPU offload {'on' if args.cpu_offload else 'off'}" if cuda else ""))

    def sync():
        if cuda:
            torch.cuda.synchronize()

    def reduce_max(values):
        t = torch.tensor(values, dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return t.tolist()

    def run_steps(context, steps, warmup=1):
        """`warmup` + `steps` timed steps; returns (times, added peak of the first timed
        step, error text, the first timed step's loss averaged over ranks, its added host
        peak on cuda), maxima over ranks."""
        ids = batch(torch, vocab, context, rank, device)
        err = ""
        times, added, host_added, losses = [], 0.0, 0.0, []
        try:
            for _ in range(warmup):
                train_step(torch, model, opt, ids)
            for i in range(steps):
                trim()
                sync()
                dist.barrier()
                if i == 0:
                    if cuda:
                        host_meter.start()
                    meter.start()
                t0 = time.perf_counter()
                losses.append(train_step(torch, model, opt, ids))
                sync()
                times.append(time.perf_counter() - t0)
                if i == 0:
                    added = meter.stop()
                    if cuda:
                        host_added = host_meter.stop()
        except (RuntimeError, MemoryError) as e:  # torch.cuda.OutOfMemoryError is a RuntimeError
            err = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300]
            log(f"rank {rank} context {context}: {err}")
        if err:
            reset_fsdp(model)
        opt.zero_grad(set_to_none=True)
        del ids
        trim()
        if err and cuda:  # an OOM: hand the cached blocks back before the next context
            torch.cuda.empty_cache()
        failed = 1.0 if err else 0.0
        red = reduce_max([failed, added, host_added] + (times if not err else [0.0] * steps))
        if red[0] > 0:
            return None, None, err or "failed on another rank", None, None
        loss = torch.tensor([losses[0]], dtype=torch.float64)
        dist.all_reduce(loss)  # mean over ranks of the measured step's loss
        return red[3:], int(red[1]), "", loss.item() / world, int(red[2])

    trials = []
    trial_warmup = args.trial_warmup if args.trial_warmup is not None else (0 if cuda else 1)
    stopped = []

    def out_of_time():
        """--time-limit passed (the same answer on every rank): start no more trials."""
        if not args.time_limit:
            return False
        over = reduce_max([time.time() - wall0])[0] > args.time_limit
        if over and not stopped:
            stopped.append(f"time limit {args.time_limit:g} s")
            if rank == 0:
                log(f"  time limit {args.time_limit:g} s passed: no more trials")
        return over

    def trial(context):
        # The first trial always warms up: AdamW's states exist from then on.
        times, added, err, loss, host_added = run_steps(context, 1,
                                                        trial_warmup if trials else 1)
        t = {"context": context, "added_peak_bytes": added,
             "fits": (None if budget is None else (not err and added <= budget)),
             "step_seconds": times[0] if times else None, "loss": loss}
        if cuda:
            t["host_added_peak_bytes"] = host_added
        if err:
            t["error"] = err
            t["fits"] = False if budget is not None else None
        trials.append(t)
        if rank == 0:
            log(f"  context {context}: added peak {added / 2**20:.1f} MiB"
                if added is not None else f"  context {context}: {err}",
                f"step {t['step_seconds']:.2f} s" if t["step_seconds"] else "",
                "" if t["fits"] is None else ("fits" if t["fits"] else "over budget"))
        return bool(t["fits"])

    def round_ctx(x):
        return max(MULTIPLE, int(round(x / MULTIPLE)) * MULTIPLE)

    reach = None
    if contexts:
        for s in contexts:
            if out_of_time():
                break
            if trial(s):
                reach = max(reach or 0, s)
    elif budget is not None:
        good, bad, s = None, None, round_ctx(args.start)
        while s <= args.max_context and not out_of_time():
            if trial(s):
                good, s = s, s * 2
            else:
                bad = s
                break
        if good is None and bad is not None:  # even --start does not fit: halve down
            s = bad // 2
            while s >= MULTIPLE and not out_of_time():
                s = round_ctx(s)
                if trial(s):
                    good = s
                    break
                bad, s = s, s // 2
        if good is not None and bad is not None:
            grain = max(64, good // 16)
            while bad - good > grain and not out_of_time():
                mid = round_ctx((good + bad) / 2)
                if mid <= good or mid >= bad:
                    break
                if trial(mid):
                    good = mid
                else:
                    bad = mid
        reach = good

    def throughput(context):
        times, _, err, _, _ = run_steps(context, 3)
        if err:
            return None
        return world * context / (sum(times) / len(times))

    tps_at = {}
    for s in parse_list(args.throughput_at):
        tps_at[str(s)] = throughput(s)
        if rank == 0:
            log(f"  throughput at {s}: {tps_at[str(s)]}")
    tps_reach = None
    if reach is not None:
        tps_reach = tps_at.get(str(reach)) or throughput(reach)

    if rank == 0:
        print(json.dumps({
            "peer": "torch_fsdp2", "torch": torch.__version__,
            "transformers": transformers.__version__,
            "ranks": world, "threads_per_rank": threads, "budget_bytes": budget,
            "attention": "sdpa", "activation_checkpointing": not args.no_activation_checkpointing,
            "reach_tokens": reach, "tokens_per_second_at_reach": tps_reach,
            "trials": trials, "tokens_per_second_at": tps_at,
            "attention_kernel": kernel, "memory_method": meter.method, "malloc": malloc,
            "experts_implementation": experts,
            "data": "uniform random ids, one sequence per rank", "model_params": params,
            "contexts_multiple_of": MULTIPLE, "wall_seconds": round(time.time() - wall0, 1),
            "device": args.device, "device_name": device_name, "cpu_offload": args.cpu_offload,
            "backend": backend, "trial_warmup_steps": trial_warmup,
            "float32_matmul_precision": torch.get_float32_matmul_precision(),
            "precision": args.precision,
            "search_stopped": stopped[0] if stopped else None,
            **({"host_memory_method": host_meter.method} if cuda else {}),
        }), flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
