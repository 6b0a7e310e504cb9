"""peakbound's schedules as PyTorch drop-ins (CPU tensors; they import torch).

    from peakbound.torch import ring_dtp_cross_entropy
    loss = ring_dtp_cross_entropy(hidden, lm_head.weight, labels)
    # == F.cross_entropy(hidden @ lm_head.weight.T, labels), without the [tokens, vocab] logits

The library computes on the tensors' own memory (DLPack, no copies of hidden or weight);
its scratch lives in a peakbound device Arena sized by the schedule's footprint, so the
peak the schedule adds is the footprint's: one [chunk, vocab] logits block, whatever the
token count (`last_stats()` reports the measured peak of the last call).
"""

from __future__ import annotations

import ctypes
from typing import Any, Iterable, Optional

import torch
import torch.distributed as dist

from . import _core

__all__ = ["ring_dtp_cross_entropy", "last_stats", "vocab_shard", "OffloadStreamAdamW"]

_last: Optional[dict] = None


def last_stats() -> Optional[dict]:
    """What the last ring_dtp_cross_entropy call measured: the Arena's peak (peak_bytes)
    beside the schedule's footprint (footprint_bytes), its mode, and the valid tokens."""
    return None if _last is None else dict(_last)


def _check(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor) -> None:
    where = "ring_dtp_cross_entropy"
    for name, t in (("hidden", hidden), ("weight", weight), ("targets", targets)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{where}: {name} must be a torch.Tensor, not {type(t).__name__}")
        if t.device.type != "cpu":
            raise ValueError(f"{where}: {name} is on {t.device}; the drop-ins take CPU tensors in this version")
    if hidden.dtype not in (torch.float32, torch.bfloat16):
        raise TypeError(f"{where}: hidden must be float32 or bfloat16, not {hidden.dtype}")
    if weight.dtype != hidden.dtype:
        raise TypeError(f"{where}: weight ({weight.dtype}) and hidden ({hidden.dtype}) must have one dtype")
    if targets.dtype not in (torch.int64, torch.int32):
        raise TypeError(f"{where}: targets must be int64 or int32, not {targets.dtype}")
    if weight.dim() != 2:
        raise ValueError(f"{where}: weight must be [vocab, hidden], got {list(weight.shape)}")
    if hidden.dim() < 1 or hidden.shape[-1] != weight.shape[1]:
        raise ValueError(f"{where}: hidden's last dimension ({hidden.shape[-1] if hidden.dim() else 'none'}) must be "
                         f"weight's hidden size ({weight.shape[1]})")
    if targets.numel() * hidden.shape[-1] != hidden.numel():
        raise ValueError(f"{where}: targets has {targets.numel()} entries for "
                         f"{hidden.numel() // max(1, hidden.shape[-1])} hidden rows")


def _flat(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor) -> tuple:
    """What the library reads: hidden as [T, H], weight, int32 targets [T], each contiguous
    (a view where it already is, else one copy)."""
    h = hidden.detach().reshape(-1, hidden.shape[-1]).contiguous()
    return h, weight.detach().contiguous(), targets.reshape(-1).to(torch.int32).contiguous()


def _mean(loss_sum: float, count: int, dtype: torch.dtype) -> torch.Tensor:
    """F.cross_entropy's mean over the valid targets (NaN when there are none)."""
    return torch.tensor(loss_sum / count if count > 0 else float("nan"), dtype=dtype)


def _bits(t: torch.Tensor) -> torch.Tensor:
    """bf16 tensors cross as their int16 bits (the library's bf16 is the same 16 bits)."""
    return t.view(torch.int16) if t.dtype == torch.bfloat16 else t


class _RingDtpCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, targets, ignore_index, chunk):  # type: ignore[override]
        global _last
        h, w, t = _flat(hidden, weight, targets)
        count = int((t != ignore_index).sum())
        want_grad = ctx.needs_input_grad[0] or ctx.needs_input_grad[1]
        scale = 1.0 / count if count > 0 else 0.0
        run = _core.ring_dtp_fused_bf16 if h.dtype == torch.bfloat16 else _core.ring_dtp_fused_f32
        d_h = torch.empty_like(h) if want_grad else None
        d_w = torch.zeros(w.shape, dtype=torch.float32) if want_grad else None
        r = run(_bits(h), t, _bits(w), scale, None if d_h is None else _bits(d_h), d_w, chunk, ignore_index)
        _last = {"peak_bytes": r.peak_bytes, "footprint_bytes": r.footprint_bytes, "mode": r.mode,
                 "tokens": h.shape[0], "valid_tokens": r.count}
        ctx.shape, ctx.weight_dtype, ctx.d_h, ctx.d_w = hidden.shape, weight.dtype, d_h, d_w
        return _mean(r.loss_sum, r.count, hidden.dtype)

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        d_h, d_w = ctx.d_h, ctx.d_w
        ctx.d_h = ctx.d_w = None
        g = grad.to(torch.float32)
        one = bool(g == 1)
        dh = dw = None
        if ctx.needs_input_grad[0]:
            dh = (d_h if one else (d_h.float() * g).to(d_h.dtype)).reshape(ctx.shape)
        if ctx.needs_input_grad[1]:
            dw = (d_w if one else d_w * g).to(ctx.weight_dtype)
        return dh, dw, None, None, None


# ---- the vocabulary sharded over a torch.distributed group ---------------------------

_TORCH_DTYPES = {"f32": torch.float32, "f64": torch.float64, "bf16": torch.bfloat16, "i32": torch.int32,
                 "i64": torch.int64, "u8": torch.uint8}
_OPS = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX} if dist.is_available() else {}


class _TorchGroup:
    """What peakbound's communicator calls (python/src/module.cc, PyCommunicator): a
    torch.distributed group's collectives and point-to-point calls on CPU tensors that view
    the library's buffers (no copies). Ranks are the group's own."""

    def __init__(self, group):
        self.group = group
        self.rank = dist.get_rank(group)
        self.size = dist.get_world_size(group)
        self._global = [dist.get_global_rank(group, r) for r in range(self.size)] if group is not None else \
            list(range(self.size))

    @staticmethod
    def _bytes(ptr: int, nbytes: int) -> torch.Tensor:
        if nbytes == 0:
            return torch.empty(0, dtype=torch.uint8)
        return torch.frombuffer((ctypes.c_char * nbytes).from_address(ptr), dtype=torch.uint8)

    def _view(self, ptr: int, count: int, dtype: str) -> torch.Tensor:
        t = _TORCH_DTYPES[dtype]
        return self._bytes(ptr, count * t.itemsize).view(t)

    def isend(self, ptr, nbytes, dst, tag):
        return dist.isend(self._bytes(ptr, nbytes), self._global[dst], group=self.group, tag=tag)

    def irecv(self, ptr, nbytes, src, tag):
        return dist.irecv(self._bytes(ptr, nbytes), self._global[src], group=self.group, tag=tag)

    def all_reduce(self, ptr, count, dtype, op):
        dist.all_reduce(self._view(ptr, count, dtype), op=_OPS[op], group=self.group)

    def all_gather(self, send, recv, count, dtype):
        out = self._view(recv, count * self.size, dtype)
        dist.all_gather(list(out.chunk(self.size)) if count else [out] * self.size, self._view(send, count, dtype),
                        group=self.group)

    def reduce_scatter(self, send, recv, count, dtype, op):
        src = self._view(send, count * self.size, dtype).clone()
        dist.all_reduce(src, op=_OPS[op], group=self.group)
        self._view(recv, count, dtype).copy_(src[self.rank * count:(self.rank + 1) * count])

    def broadcast(self, ptr, count, dtype, root):
        dist.broadcast(self._view(ptr, count, dtype), self._global[root], group=self.group)

    def barrier(self):
        dist.barrier(group=self.group)


def vocab_shard(vocab: int, group=None) -> tuple:
    """(offset, rows): this rank's rows of a vocabulary of `vocab` rows sharded over the
    group, as ring_dtp_cross_entropy expects them (the first vocab % P ranks one more)."""
    return tuple(_core.vocab_shard(vocab, dist.get_world_size(group), dist.get_rank(group)))


class _RingDtpShardedCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, targets, group, ignore_index, chunk):  # type: ignore[override]
        global _last
        g = _TorchGroup(group)
        h, w, t = _flat(hidden, weight, targets)
        # Every rank's token count and shard rows (the footprint and the shard check need them).
        counts = torch.tensor([h.shape[0], w.shape[0]], dtype=torch.int64)
        every = [torch.empty(2, dtype=torch.int64) for _ in range(g.size)]
        dist.all_gather(every, counts, group=group)
        vocab = int(sum(int(x[1]) for x in every))
        for q in range(g.size):  # every rank checks every rank's shard: all refuse together, none waits
            rows = _core.vocab_shard(vocab, g.size, q)[1]
            if int(every[q][1]) != rows:
                raise ValueError(f"ring_dtp_cross_entropy: rank {q} holds {int(every[q][1])} vocabulary rows; its "
                                 f"shard of {vocab} over {g.size} ranks has {rows} (peakbound.torch.vocab_shard)")
        loss = _core.RingDtpShard(g, vocab, h.shape[1], [int(x[0]) for x in every], chunk, ignore_index,
                                  h.dtype == torch.bfloat16)
        loss_sum, count = loss.forward(h.data_ptr(), t.data_ptr(), w.data_ptr())
        # The group's mean: every rank's summed loss over every rank's valid targets.
        total = torch.tensor([loss_sum, float(count)], dtype=torch.float64)
        dist.all_reduce(total, group=group)
        loss_sum, count = float(total[0]), int(total[1])
        _last = {"peak_bytes": loss.peak_bytes(), "footprint_bytes": loss.footprint_bytes(), "mode": loss.mode(),
                 "tokens": h.shape[0], "valid_tokens": count}
        if ctx.needs_input_grad[0] or ctx.needs_input_grad[1]:
            ctx.loss, ctx.keep = loss, (h, t, w)  # the schedule reads them again in its backward
        else:
            loss.discard()
        ctx.shape, ctx.count, ctx.weight_dtype, ctx.group = hidden.shape, count, weight.dtype, group
        return _mean(loss_sum, count, hidden.dtype)

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        loss, (h, _, w) = ctx.loss, ctx.keep
        ctx.loss = ctx.keep = None
        # One scale for the whole group (each rank's contributions to every rank's tokens are
        # computed with it): the incoming gradients must agree.
        g = torch.tensor([float(grad), -float(grad)], dtype=torch.float64)
        dist.all_reduce(g, op=dist.ReduceOp.MAX, group=ctx.group)
        if float(g[0]) != -float(g[1]):
            raise ValueError("ring_dtp_cross_entropy: the loss's incoming gradient differs between the group's ranks "
                             f"({-float(g[1])} to {float(g[0])}); the group's loss is one value: scale it alike everywhere")
        scale = float(grad) / ctx.count if ctx.count > 0 else 0.0
        d_h = torch.empty_like(h)
        d_w = torch.zeros(w.shape, dtype=torch.float32)
        loss.backward(scale, d_h.data_ptr(), d_w.data_ptr())  # collective: every rank's backward runs it
        dh = d_h.reshape(ctx.shape) if ctx.needs_input_grad[0] else None
        dw = d_w.to(ctx.weight_dtype) if ctx.needs_input_grad[1] else None
        return dh, dw, None, None, None, None


def ring_dtp_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, group=None, *,
                           ignore_index: int = -100, chunk: int = 0) -> torch.Tensor:
    """F.cross_entropy(hidden @ weight.T, targets) (mean over the targets that are not
    ignore_index) by Ring-DTP: the logits exist only as [chunk, vocab] blocks folded into
    an online log-sum-exp, each turned into its gradient at once (the fused one-rank form:
    3 GEMMs a block). hidden [..., H], weight [V, H], targets [...] (int64 or int32), float32
    or bfloat16 (bf16 products summed in fp32, the gradients of hidden in bf16). chunk: rows
    per block (0: the schedule's default). Autograd gives hidden's and weight's gradients.

    group: None (the whole vocabulary on this rank), or a torch.distributed process group
    (torch.distributed.group.WORLD for every rank; gloo on CPU tensors) over which the
    vocabulary is sharded: weight is then this rank's shard, vocab_shard(V, group)'s rows
    of the whole [V, H] head, and hidden and targets this rank's own tokens (their counts
    may differ between ranks). The loss is the group's: F.cross_entropy over every rank's
    tokens together (the same value on every rank), and the gradients are its gradients:
    hidden's for this rank's tokens, weight's for this rank's shard. The forward and the
    backward are collective (every rank calls both), and the loss's incoming gradient must
    be the same on every rank (ValueError otherwise)."""
    if isinstance(ignore_index, bool) or not isinstance(ignore_index, int):
        raise TypeError("ring_dtp_cross_entropy: ignore_index must be an int")
    if isinstance(chunk, bool) or not isinstance(chunk, int):
        raise TypeError("ring_dtp_cross_entropy: chunk must be an int")
    if chunk < 0:
        raise ValueError("ring_dtp_cross_entropy: chunk must be 0 (the default) or positive")
    _check(hidden, weight, targets)
    if group is not None:
        if not dist.is_available() or not dist.is_initialized():
            raise ValueError("ring_dtp_cross_entropy: group given but torch.distributed is not initialized")
        if group is dist.group.WORLD:
            group = None  # torch's own spelling of the default group
        if dist.get_world_size(group) > 1:
            return _RingDtpShardedCrossEntropy.apply(hidden, weight, targets, group, ignore_index, chunk)
    return _RingDtpCrossEntropy.apply(hidden, weight, targets, ignore_index, chunk)


_DTYPES = {torch.float32: "f32", torch.bfloat16: "bf16"}


class OffloadStreamAdamW(torch.optim.Optimizer):
    """torch.optim.AdamW whose optimizer state (exp_avg, exp_avg_sq, and for bfloat16
    parameters the fp32 master weights) lives in peakbound's host memory and is updated by
    the OffloadStreamAdamW schedule's kernel (AVX2 / AVX-512, one fused pass a tensor).
    Within 1e-6 of torch.optim.AdamW on the same inputs over 20 steps (the same formula:
    decoupled weight decay, bias corrections, eps added to sqrt(v_hat)); float32 or
    bfloat16 parameters (bf16: the fp32 master is the truth, the parameter its rounding,
    as mixed-precision training keeps them).

    CPU tensors' "device" is host memory, so by default the update runs on them where they
    are (a float32 parameter is its own master weight, as in torch.optim). streamed=True
    runs the offload_stream schedule itself instead, as for a GPU's tensors: each
    gradient copied in bucket by bucket (bucket_bytes), updated, the parameter copied
    back; the same bits, the copies' cost on top (bench/python_adamw.py measures both).

    lr may change between steps (param_groups[i]["lr"], schedulers); betas, eps and
    weight_decay are fixed at construction, one set for all groups (ValueError otherwise).
    amsgrad, maximize and sparse gradients are not supported. state_dict() is
    torch.optim.AdamW's layout (step, exp_avg, exp_avg_sq per parameter, plus "master" for
    a bf16 parameter); load_state_dict() takes it back, or an AdamW one.
    """

    def __init__(self, params: Iterable[Any], lr: float = 1e-3, betas: tuple = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 1e-2, *, streamed: bool = False, bucket_bytes: int = 0,
                 threads: Optional[int] = None):
        if not 0.0 <= lr:
            raise ValueError(f"OffloadStreamAdamW: invalid learning rate {lr}")
        if not (0.0 <= betas[0] < 1.0 and 0.0 <= betas[1] < 1.0):
            raise ValueError(f"OffloadStreamAdamW: invalid betas {betas}")
        if not 0.0 <= eps or not 0.0 <= weight_decay:
            raise ValueError("OffloadStreamAdamW: eps and weight_decay must be >= 0")
        super().__init__(params, dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay))
        self._hyper = None
        for g in self.param_groups:
            h = (tuple(g["betas"]), g["eps"], g["weight_decay"])
            if self._hyper is not None and h != self._hyper:
                raise ValueError("OffloadStreamAdamW: betas, eps and weight_decay must be the same in every group")
            self._hyper = h
        self._params = [p for g in self.param_groups for p in g["params"]]
        for p in self._params:
            if p.device.type != "cpu":
                raise ValueError(f"OffloadStreamAdamW: a parameter is on {p.device}; the drop-ins take CPU tensors in "
                                 "this version")
            if p.dtype not in _DTYPES:
                raise TypeError(f"OffloadStreamAdamW: parameters must be float32 or bfloat16, not {p.dtype}")
            if not p.is_contiguous():
                raise ValueError("OffloadStreamAdamW: parameters must be contiguous")
        (b1, b2), eps_, wd = self._hyper
        self._core = _core.OffloadStreamAdamW(
            [(p.data_ptr(), p.numel(), _DTYPES[p.dtype]) for p in self._params], b1, b2, eps_, wd, bool(streamed),
            bucket_bytes, threads if threads is not None else torch.get_num_threads())
        self._addr = [p.data_ptr() for p in self._params]
        for i, p in enumerate(self._params):  # master = the parameter, m = v = 0
            master = p.detach().to(torch.float32).contiguous()
            self._core.restore(i, master.data_ptr(), 0, 0, 0)

    def _check_unmoved(self) -> None:
        for i, p in enumerate(self._params):
            if p.data_ptr() != self._addr[i]:
                raise RuntimeError("OffloadStreamAdamW: a parameter's storage moved since the optimizer was built "
                                   "(p.data = ...); build the optimizer after the model's final placement")

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self._check_unmoved()
        for g in self.param_groups:
            if (tuple(g["betas"]), g["eps"], g["weight_decay"]) != self._hyper:
                raise ValueError("OffloadStreamAdamW: betas, eps and weight_decay are fixed at construction")
        work, keep = [], []
        index = {id(p): i for i, p in enumerate(self._params)}
        for g in self.param_groups:
            for p in g["params"]:
                if p.grad is None:
                    continue
                if p.grad.is_sparse:
                    raise TypeError("OffloadStreamAdamW: sparse gradients are not supported")
                grad = p.grad if p.grad.is_contiguous() else p.grad.contiguous()
                if grad.dtype != p.dtype:
                    raise TypeError(f"OffloadStreamAdamW: a {p.dtype} parameter has a {grad.dtype} gradient")
                keep.append(grad)
                work.append((index[id(p)], grad.data_ptr(), _DTYPES[grad.dtype], float(g["lr"])))
        self._core.step(work)
        return loss

    def state_dict(self) -> dict:
        sd = super().state_dict()  # param_groups with indices; state empty (ours is in the library)
        state = {}
        for i, p in enumerate(self._params):
            steps = self._core.steps_taken(i)
            if steps == 0:
                continue
            master, m, v = (torch.empty(p.numel(), dtype=torch.float32) for _ in range(3))
            self._core.read_state(i, master.data_ptr(), m.data_ptr(), v.data_ptr())
            state[i] = {"step": torch.tensor(float(steps)), "exp_avg": m.view(p.shape).to(p.dtype),
                        "exp_avg_sq": v.view(p.shape).to(p.dtype), "master": master.view(p.shape)}
            if p.dtype == torch.float32:
                del state[i]["master"]  # the parameter is its master
            else:
                state[i]["exp_avg"], state[i]["exp_avg_sq"] = m.view(p.shape), v.view(p.shape)
        sd["state"] = state
        return sd

    def load_state_dict(self, state_dict: dict) -> None:
        groups = state_dict["param_groups"]
        if len(groups) != len(self.param_groups) or any(
                len(a["params"]) != len(b["params"]) for a, b in zip(groups, self.param_groups)):
            raise ValueError("OffloadStreamAdamW: the state_dict's parameter groups do not match this optimizer's")
        for mine, theirs in zip(self.param_groups, groups):
            if (tuple(theirs["betas"]), theirs["eps"], theirs["weight_decay"]) != self._hyper:
                raise ValueError("OffloadStreamAdamW: the state_dict's betas, eps or weight_decay differ from this "
                                 "optimizer's (fixed at construction)")
            mine["lr"] = theirs["lr"]
        order = [i for g in groups for i in g["params"]]
        for i, p in enumerate(self._params):
            s = state_dict["state"].get(order[i])
            if s is None:
                master = p.detach().to(torch.float32).contiguous()
                self._core.restore(i, master.data_ptr(), 0, 0, 0)
                continue
            master = s.get("master", p.detach()).to(torch.float32).contiguous()
            m = s["exp_avg"].to(torch.float32).contiguous()
            v = s["exp_avg_sq"].to(torch.float32).contiguous()
            for name, t in (("master", master), ("exp_avg", m), ("exp_avg_sq", v)):
                if t.numel() != p.numel():
                    raise ValueError(f"OffloadStreamAdamW: parameter {i}'s {name} has {t.numel()} elements, "
                                     f"not {p.numel()}")
            self._core.restore(i, master.data_ptr(), m.data_ptr(), v.data_ptr(), int(s["step"]))

    def host_bytes(self) -> int:
        """The peak of peakbound's host memory for the optimizer (m, v, bf16 parameters' masters;
        streamed: every master and the staging buckets too)."""
        return self._core.host_bytes()
