"""The server's fused flat optimizers against torch.optim, step by step; the learning-rate schedule's factor."""
from __future__ import annotations

import pytest
import torch

from marl_q.optim import FlatAdam, FlatRMSprop, FlatSGD, lr_factor


@pytest.mark.parametrize("flat_cls, torch_cls, kw", [
    (FlatSGD, torch.optim.SGD, {}),
    (FlatRMSprop, torch.optim.RMSprop, {"alpha": 0.99, "eps": 1e-5}),
    (FlatAdam, torch.optim.Adam, {"eps": 1e-8}),
])
def test_matches_torch_optim_bit_for_bit_over_many_steps(flat_cls, torch_cls, kw):
    """The same ops in the same order: the workers' optimizers replaced torch.optim's without moving a bit
    (and an older snapshot's torch optimizer is continued by one of these, marl_q.state_format)."""
    torch.manual_seed(0)
    start = torch.randn(11_013)
    ref = torch.nn.Parameter(start.clone())
    ref_opt = torch_cls([ref], lr=3e-3, **kw)
    mine = start.clone()
    opt = flat_cls(mine, lr=3e-3, **kw)
    for step in range(300):
        g = torch.randn(11_013) * (1 + step % 5)
        if step == 30:  # a schedule changes the lr between steps
            opt.lr = 1e-3
            ref_opt.param_groups[0]["lr"] = 1e-3
        ref.grad = g.clone()
        ref_opt.step()
        opt.step(g)
        assert torch.equal(mine, ref.detach()), step


def test_state_round_trip_continues_identically():
    torch.manual_seed(1)
    a = torch.randn(50)
    opt = FlatAdam(a, lr=1e-2)
    for _ in range(5):
        opt.step(torch.randn(50))
    b = a.clone()
    opt_b = FlatAdam(b, lr=1e-2)
    opt_b.load_state_dict(opt.state_dict())
    g = torch.randn(50)
    opt.step(g)
    opt_b.step(g)
    torch.testing.assert_close(a, b)


def test_lr_factor_is_one_when_constant_and_one_minus_progress_when_linear():
    assert [lr_factor("constant", p) for p in (0.0, 0.4, 1.0)] == [1.0, 1.0, 1.0]
    assert [lr_factor("linear", p) for p in (0.0, 0.25, 0.5, 1.0)] == [1.0, 0.75, 0.5, 0.0]
    assert lr_factor("linear", 1.2) == 0.0  # never negative past the budget
    with pytest.raises(ValueError, match="lr_schedule: 'constant' or 'linear', got 'cosine'"):
        lr_factor("cosine", 0.5)
