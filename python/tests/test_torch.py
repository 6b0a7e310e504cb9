"""peakbound.torch's drop-ins against PyTorch's own functions."""

import pytest

torch = pytest.importorskip("torch")  # python/requirements-test.txt installs it: a skip is a broken venv
import torch.nn.functional as F  # noqa: E402

import peakbound  # noqa: E402
from peakbound.torch import last_stats, ring_dtp_cross_entropy  # noqa: E402


def reference(hidden, weight, targets, ignore_index=-100):
    """F.cross_entropy of the materialized logits, in float64: loss and both gradients."""
    h = hidden.detach().double().requires_grad_()
    w = weight.detach().double().requires_grad_()
    loss = F.cross_entropy((h @ w.T).reshape(-1, w.shape[0]), targets.reshape(-1), ignore_index=ignore_index)
    loss.backward()
    return loss.detach(), h.grad, w.grad


def ours(hidden, weight, targets, **kw):
    h = hidden.detach().clone().requires_grad_()
    w = weight.detach().clone().requires_grad_()
    loss = ring_dtp_cross_entropy(h, w, targets, **kw)
    loss.backward()
    return loss.detach(), h.grad, w.grad


def rel(a, b):
    return float((a.double() - b.double()).abs().max() / max(float(b.double().abs().max()), 1e-30))


SHAPES = [  # (leading shape of hidden, H, V, chunk): sizes the chunk does not divide, one row, 3-D hidden
    ((1,), 8, 5, 0), ((37,), 24, 101, 16), ((3, 41), 32, 257, 50), ((300,), 16, 1000, 0), ((2, 5), 64, 33, 1),
]


@pytest.mark.parametrize("lead, H, V, chunk", SHAPES)
def test_f32_equals_cross_entropy_in_loss_and_both_gradients(lead, H, V, chunk):
    g = torch.Generator().manual_seed(H * V + len(lead))
    hidden = torch.randn(*lead, H, generator=g)
    weight = torch.randn(V, H, generator=g) * 0.3
    targets = torch.randint(0, V, lead, generator=g)
    if targets.numel() > 7:
        targets.view(-1)[::7] = -100  # ignored targets
    if targets.numel() > 1:
        targets.view(-1)[1] = V - 1
    loss, dh, dw = ours(hidden, weight, targets, chunk=chunk)
    rl, rdh, rdw = reference(hidden, weight, targets)
    assert abs(float(loss) - float(rl)) <= 1e-5 * max(1.0, abs(float(rl)))
    assert dh.shape == hidden.shape and dw.shape == weight.shape and dh.dtype == dw.dtype == torch.float32
    assert rel(dh, rdh) <= 1e-5 and rel(dw, rdw) <= 1e-5
    # Also against float32 PyTorch as a user would call it.
    assert abs(float(loss) - float(F.cross_entropy((hidden @ weight.T).reshape(-1, V), targets.reshape(-1)))) <= 1e-5 * max(1.0, abs(float(rl)))


def test_every_token_to_one_class_and_scaled_gradient():
    g = torch.Generator().manual_seed(3)
    hidden, weight = torch.randn(65, 16, generator=g), torch.randn(40, 16, generator=g)
    targets = torch.full((65,), 39)
    h = hidden.clone().requires_grad_()
    w = weight.clone().requires_grad_()
    (ring_dtp_cross_entropy(h, w, targets) * 2.5).backward()
    _, rdh, rdw = reference(hidden, weight, targets)
    assert rel(h.grad, 2.5 * rdh) <= 1e-5 and rel(w.grad, 2.5 * rdw) <= 1e-5


def test_every_target_ignored_is_nan_like_cross_entropy():
    hidden, weight = torch.randn(4, 8), torch.randn(6, 8)
    targets = torch.full((4,), -100)
    assert torch.isnan(ring_dtp_cross_entropy(hidden, weight, targets))
    assert torch.isnan(F.cross_entropy(hidden @ weight.T, targets))


def test_no_grad_is_the_forward_alone():
    g = torch.Generator().manual_seed(5)
    hidden, weight = torch.randn(50, 16, generator=g), torch.randn(70, 16, generator=g)
    targets = torch.randint(0, 70, (50,), generator=g)
    with torch.no_grad():
        loss = ring_dtp_cross_entropy(hidden, weight, targets)
    assert abs(float(loss) - float(reference(hidden, weight, targets)[0])) <= 1e-5


def test_bf16_is_within_bf16_rounding_of_pytorch():
    g = torch.Generator().manual_seed(7)
    hidden = torch.randn(97, 64, generator=g).bfloat16()
    weight = (torch.randn(301, 64, generator=g) * 0.2).bfloat16()
    targets = torch.randint(0, 301, (97,), generator=g)
    loss, dh, dw = ours(hidden, weight, targets)
    rl, rdh, rdw = reference(hidden, weight, targets)  # float64 of the same bf16 inputs
    assert loss.dtype == dh.dtype == dw.dtype == torch.bfloat16
    assert abs(float(loss) - float(rl)) <= 1e-2 * abs(float(rl))  # the loss returned in bf16 (8 bits)
    assert rel(dh, rdh) <= 1e-2 and rel(dw, rdw) <= 1e-2


def test_peak_memory_does_not_grow_with_the_token_count():
    g = torch.Generator().manual_seed(11)
    H, V = 32, 4096
    weight = torch.randn(V, H, generator=g) * 0.1
    peaks = []
    for T in (512, 4096, 32768):
        hidden = torch.randn(T, H, generator=g)
        targets = torch.randint(0, V, (T,), generator=g)
        ours(hidden, weight, targets, chunk=256)
        s = last_stats()
        assert s["tokens"] == T and s["mode"] == "fused"
        assert s["peak_bytes"] == s["footprint_bytes"]  # measured == the schedule's footprint
        peaks.append(s["peak_bytes"])
    assert peaks[0] == peaks[1] == peaks[2]
    assert peaks[0] < 256 * V * 4 * 2  # about one [chunk, V] fp32 block, not [T, V] (32768 x 4096 x 4 = 512 MiB)


def test_bad_arguments():
    h, w, t = torch.randn(4, 8), torch.randn(6, 8), torch.randint(0, 6, (4,))
    with pytest.raises(ValueError, match="target"):
        ring_dtp_cross_entropy(h, w, torch.tensor([0, 1, 6, 2]))
    with pytest.raises(ValueError, match="hidden's last dimension"):
        ring_dtp_cross_entropy(torch.randn(4, 9), w, t)
    with pytest.raises(ValueError, match="targets has 3 entries"):
        ring_dtp_cross_entropy(h, w, t[:3])
    with pytest.raises(TypeError, match="float32 or bfloat16"):
        ring_dtp_cross_entropy(h.double(), w.double(), t)
    with pytest.raises(TypeError, match="one dtype"):
        ring_dtp_cross_entropy(h, w.bfloat16(), t)
    with pytest.raises(TypeError, match="targets must be int64 or int32"):
        ring_dtp_cross_entropy(h, w, t.float())
    with pytest.raises(TypeError, match="torch.Tensor"):
        ring_dtp_cross_entropy(h.numpy(), w, t)
    with pytest.raises(peakbound.Error, match="vocab"):
        ring_dtp_cross_entropy(h, w[:0], t)
    with pytest.raises(ValueError, match="chunk must be 0"):
        ring_dtp_cross_entropy(h, w, t, chunk=-1)


# ---- the vocabulary sharded over a torch.distributed group (gloo, 2 and 3 processes) ----

def _sharded_worker(rank, world, init_file, V, dtype_name):
    import torch.distributed as dist
    from peakbound.torch import vocab_shard

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        g = torch.Generator().manual_seed(1)
        H = 24
        W = torch.randn(V, H, generator=g) * 0.3
        T = [37, 50, 1][:world]  # token counts that differ between ranks, one rank with a single token
        hidden_all = [torch.randn(t, H, generator=g) for t in T]
        targets_all = [torch.randint(0, V, (t,), generator=g) for t in T]
        targets_all[0][::5] = -100
        dtype = torch.float32 if dtype_name == "f32" else torch.bfloat16
        off, rows = vocab_shard(V)
        h = hidden_all[rank].to(dtype).detach().clone().requires_grad_()
        w = W[off:off + rows].to(dtype).detach().clone().requires_grad_()
        loss = ring_dtp_cross_entropy(h, w, targets_all[rank], group=dist.group.WORLD, chunk=16)
        loss.backward()
        stats = last_stats()
        # The reference: F.cross_entropy over every rank's tokens together on the whole head,
        # in float64 (the same bf16 inputs for bf16).
        Wd = W.to(dtype).double().detach().requires_grad_()
        hs = [x.to(dtype).double().detach().requires_grad_() for x in hidden_all]
        whole = F.cross_entropy(torch.cat(hs) @ Wd.T, torch.cat(targets_all))
        whole.backward()
        bound = 1e-5 if dtype_name == "f32" else 1e-2
        mine, ref = float(loss.detach()), float(whole.detach())
        assert abs(mine - ref) <= bound * abs(ref), (mine, ref)
        assert rel(h.grad, hs[rank].grad) <= bound, rel(h.grad, hs[rank].grad)
        assert rel(w.grad, Wd.grad[off:off + rows]) <= bound, rel(w.grad, Wd.grad[off:off + rows])
        assert stats["peak_bytes"] <= stats["footprint_bytes"], stats
        # An incoming gradient that differs between ranks is refused (on every rank).
        h2 = h.detach().clone().requires_grad_()
        try:
            (ring_dtp_cross_entropy(h2, w, targets_all[rank], group=dist.group.WORLD) * (1 + rank)).backward()
            raise AssertionError("rank-dependent gradient scales were accepted")
        except ValueError as e:
            assert "differs between the group's ranks" in str(e)
        # A shard of the wrong size (two rows more on rank 0: no split of any vocabulary has
        # it) is one line on every rank.
        bad = torch.cat([w.detach(), w.detach()[:2]]) if rank == 0 else w.detach()
        try:
            ring_dtp_cross_entropy(h, bad, targets_all[rank], group=dist.group.WORLD)
            raise AssertionError("a shard of the wrong size was accepted")
        except ValueError as e:
            assert "vocab_shard" in str(e)
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("world, V, dtype", [(2, 101, "f32"), (2, 40, "f32"), (3, 101, "f32"), (2, 77, "bf16")])
def test_sharded_over_a_gloo_group_equals_cross_entropy_of_the_whole_head(tmp_path, world, V, dtype):
    import torch.multiprocessing as mp
    mp.spawn(_sharded_worker, args=(world, str(tmp_path / "init"), V, dtype), nprocs=world, join=True)


def test_group_without_torch_distributed():
    with pytest.raises(ValueError, match="not initialized"):
        ring_dtp_cross_entropy(torch.randn(4, 8), torch.randn(6, 8), torch.randint(0, 6, (4,)), group=object())
