"""peakbound.torch.OffloadStreamAdamW against torch.optim.AdamW."""

import pytest

torch = pytest.importorskip("torch")  # python/requirements-test.txt installs it: a skip is a broken venv

from peakbound.torch import OffloadStreamAdamW  # noqa: E402

SIZES = [(7,), (33, 5), (1,), (300, 41), (3, 3, 3)]  # odd element counts, one bigger than a small bucket


def params(dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(*s, generator=g).to(dtype)) for s in SIZES]


def grads(step, ps, seed=100):
    g = torch.Generator().manual_seed(seed + step)
    return [torch.randn(p.shape, generator=g).to(p.dtype) for p in ps]


def build(opt_cls, ps, **kw):
    return opt_cls([{"params": ps[:2]}, {"params": ps[2:], "lr": 3e-3}], lr=1e-2, betas=(0.9, 0.95), eps=1e-8,
                   weight_decay=0.1, **kw)


def steps_of(opt, ps, first, steps, lr_at=None):
    for t in range(first, first + steps):
        for i, (p, gr) in enumerate(zip(ps, grads(t, ps))):
            p.grad = None if (i == 2 and t % 3 == 0) else gr  # a parameter without a gradient some steps
        if lr_at is not None:
            opt.param_groups[0]["lr"] = lr_at(t)
        opt.step()
    return opt


def run(opt_cls, ps, steps, lr_at=None, **kw):
    return steps_of(build(opt_cls, ps, **kw), ps, 0, steps, lr_at)


def max_rel(a, b):
    return max(float((x.double() - y.double()).abs().max() / y.double().abs().max()) for x, y in zip(a, b))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_streamed_is_bitwise_the_direct_update(dtype):
    direct, streamed = params(dtype), params(dtype)
    run(OffloadStreamAdamW, direct, 7)
    opt = run(OffloadStreamAdamW, streamed, 7, streamed=True, bucket_bytes=256)  # several buckets a tensor
    for a, b in zip(direct, streamed):
        assert torch.equal(a.detach(), b.detach())
    assert opt.host_bytes() > 0


def test_f32_within_1e6_of_torch_adamw_over_20_steps():
    ours, ref = params(), params()
    lr_at = lambda t: 1e-2 * (1 - t / 40)  # noqa: E731  an lr that changes every step
    run(OffloadStreamAdamW, ours, 20, lr_at=lr_at)
    run(torch.optim.AdamW, ref, 20, lr_at=lr_at)
    assert max_rel([p.detach() for p in ours], [p.detach() for p in ref]) <= 1e-6
    # The update is real: the parameters moved.
    assert max_rel([p.detach() for p in ours], [p.detach() for p in params()]) > 1e-3


def test_bf16_master_is_fp32_adamw_and_the_parameter_its_rounding():
    ours, ref = params(torch.bfloat16), [torch.nn.Parameter(p.detach().float()) for p in params(torch.bfloat16)]
    opt = OffloadStreamAdamW([{"params": ours[:2]}, {"params": ours[2:], "lr": 3e-3}], lr=1e-2, betas=(0.9, 0.95),
                             weight_decay=0.1)
    tref = torch.optim.AdamW([{"params": ref[:2]}, {"params": ref[2:], "lr": 3e-3}], lr=1e-2, betas=(0.9, 0.95),
                             weight_decay=0.1)
    for t in range(20):
        gs = grads(t, ours)
        for p, q, gr in zip(ours, ref, gs):
            p.grad, q.grad = gr, gr.float()
        opt.step()
        tref.step()
    sd = opt.state_dict()
    masters = [sd["state"][i]["master"] for i in range(len(ours))]
    assert max_rel(masters, [q.detach() for q in ref]) <= 1e-6
    for p, m in zip(ours, masters):
        assert torch.equal(p.detach(), m.to(torch.bfloat16))


def test_state_dict_round_trip_continues_bit_for_bit():
    straight = params()
    run(OffloadStreamAdamW, straight, 20)
    first = params()
    opt = run(OffloadStreamAdamW, first, 10)
    sd = opt.state_dict()
    assert set(sd["state"]) == set(range(len(SIZES)))
    assert all(float(s["step"]) == (6 if i == 2 else 10) for i, s in sd["state"].items())  # 2: no grad at 0, 3, 6, 9
    again = [torch.nn.Parameter(p.detach().clone()) for p in first]
    opt2 = build(OffloadStreamAdamW, again)
    opt2.load_state_dict(sd)
    steps_of(opt2, again, 10, 10)
    for a, b in zip(again, straight):
        assert torch.equal(a.detach(), b.detach())
    # torch.optim.AdamW takes the same state_dict (its layout) and goes on within 1e-6.
    third = [torch.nn.Parameter(p.detach().clone()) for p in first]
    t_opt = build(torch.optim.AdamW, third)
    t_opt.load_state_dict(sd)
    steps_of(t_opt, third, 10, 10)
    assert max_rel([p.detach() for p in third], [p.detach() for p in straight]) <= 1e-6


def test_host_memory_holds_the_state():
    ps = params()
    n = sum(p.numel() for p in ps)
    assert run(OffloadStreamAdamW, ps, 1).host_bytes() >= 8 * n  # m and v (f32: the parameter is the master)
    assert run(OffloadStreamAdamW, params(torch.bfloat16), 1).host_bytes() >= 12 * n  # and the fp32 master


def test_bad_arguments():
    with pytest.raises(TypeError, match="float32 or bfloat16"):
        OffloadStreamAdamW([torch.nn.Parameter(torch.zeros(3, dtype=torch.float64))])
    with pytest.raises(ValueError, match="same in every group"):
        OffloadStreamAdamW([{"params": params()[:1]}, {"params": params()[1:2], "eps": 1e-6}])
    with pytest.raises(ValueError, match="invalid learning rate"):
        OffloadStreamAdamW(params(), lr=-1)
    ps = params()
    opt = OffloadStreamAdamW(ps)
    ps[1].data = torch.zeros_like(ps[1].data)
    with pytest.raises(RuntimeError, match="moved"):
        opt.step()
