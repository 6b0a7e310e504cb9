"""The parameters of one sublayer fixture (a norm in front of a transformers module) and
their seeding, shared by make_deepseek_fixture.py and make_gptoss_fixture.py.

Every tensor draws N(0, 1) from the fixture's generator in the dict's order (the norm
first, then the module's named_parameters()); norm weights become 1 + 0.1 r, every other
tensor draw(name, tensor, r). The fixtures regenerate byte for byte as long as the order
and the draws stay.
"""

import torch


def sublayer_params(norm_name, norm, prefix, module):
    """{norm_name: norm.weight, prefix + name: tensor for module's named_parameters()}."""
    params = {norm_name: norm.weight}
    for n, t in module.named_parameters():
        params[prefix + n] = t
    return params


def seed_parameters(params, g, draw):
    with torch.no_grad():
        for n, t in params.items():
            r = torch.randn(t.shape, generator=g)
            t.copy_(1.0 + 0.1 * r if n.endswith("layernorm.weight") else draw(n, t, r))
