"""The ``mlp`` heads' tanh (agents.heads.tanh: numpy's vectorised kernel) against torch.tanh and autograd."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from agents.heads import MLPConfig, Tanh, build_mlp, tanh
from agents.numpy_heads import NumpyMLP, TorchMLP


def _ulps(a: torch.Tensor, b: torch.Tensor) -> int:
    """The largest distance in units in the last place between two float tensors of the same dtype."""
    kind = {torch.float32: torch.int32, torch.float64: torch.int64}[a.dtype]
    ia, ib = a.view(kind).to(torch.int64), b.view(kind).to(torch.int64)
    return int((ia - ib).abs().max())


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_tanh_is_torchs_to_one_ulp_everywhere_it_is_used(dtype):
    """Hidden-layer pre-activations span a few units; the tails saturate to +-1 exactly in both."""
    g = torch.Generator().manual_seed(0)
    x = torch.cat([torch.randn(200_000, generator=g, dtype=dtype) * s for s in (0.01, 1.0, 4.0, 30.0)])
    x = torch.cat([x, torch.tensor([0.0, -0.0, 1e-30, -1e-30, 20.0, -20.0, float("inf"), -float("inf")], dtype=dtype)])
    ours, ref = tanh(x), torch.tanh(x)
    assert ours.dtype == dtype and ours.shape == x.shape
    assert _ulps(ours, ref) <= 1
    assert torch.equal(tanh(x[-4:]), torch.tensor([1.0, -1.0, 1.0, -1.0], dtype=dtype))
    assert torch.isnan(tanh(torch.tensor([float("nan")], dtype=dtype))).all()


def test_tanh_gradients_are_autograds_tanh_backward_of_its_output():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(300, 7, generator=g, dtype=torch.float64, requires_grad=True)
    torch.autograd.gradcheck(tanh, (x,))
    torch.autograd.gradgradcheck(tanh, (x,))  # a second derivative (create_graph) through the custom backward
    x32 = x.detach().float().requires_grad_()
    w = torch.randn(300, 7, generator=g)
    y = tanh(x32)
    (y * w).sum().backward()
    assert torch.equal(x32.grad, torch.ops.aten.tanh_backward(w, y.detach()))


def test_tanh_without_a_graph_and_on_non_contiguous_input():
    x = torch.randn(64, 40)[:, ::3]  # a strided view
    with torch.inference_mode():
        assert torch.equal(tanh(x), tanh(x.contiguous()))
    with torch.no_grad():
        y = tanh(x.clone().requires_grad_())
        assert not y.requires_grad


def test_tanh_under_vmap_and_on_other_tensors_is_torchs():
    """torch.func transforms (batched seeds' vmap) and tensors numpy cannot hold take torch.tanh."""
    x = torch.randn(5, 32)
    assert torch.equal(torch.func.vmap(tanh)(x), torch.tanh(x))
    half = x.to(torch.bfloat16)
    assert torch.equal(tanh(half), torch.tanh(half))
    grads = torch.func.grad(lambda v: tanh(v).sum())(x)
    assert torch.allclose(grads, 1 - torch.tanh(x) ** 2)


def test_mlp_heads_use_it_and_their_twins_still_read_the_layer():
    net = build_mlp(MLPConfig(hidden=[16, 16]), 5, 3)
    acts = [m for m in net if not isinstance(m, nn.Linear)]
    assert len(acts) == 2 and all(type(m) is Tanh for m in acts)
    assert NumpyMLP.supports(net)
    x = torch.randn(40, 5)
    with torch.no_grad():
        out, _ = TorchMLP(net).forward(x)
        assert torch.equal(out, net(x))  # the Q-learners' fast forward: the module's own kernel
    relu = build_mlp(MLPConfig(hidden=[8], activation="relu"), 5, 3)
    assert not any(isinstance(m, nn.Tanh) for m in relu)


def test_a_module_from_an_older_snapshot_keeps_torchs_kernel():
    """Runs recorded before heads.Tanh hold nn.Tanh layers; their twins use torch.tanh, so their resumes
    continue bit for bit."""
    net = nn.Sequential(nn.Linear(5, 16), nn.Tanh(), nn.Linear(16, 3))
    x = torch.randn(40, 5)
    with torch.no_grad():
        out, _ = TorchMLP(net).forward(x)
        assert torch.equal(out, net(x))
    legacy = TorchMLP(net)
    legacy.layers = [(kind, None if kind == "tanh" else module) for kind, module in legacy.layers]  # as pickled before
    with torch.no_grad():
        assert torch.equal(legacy.forward(x)[0], net(x))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device here (GPU paths are optional; "
                    "circuits/gpu_check.py runs this on a GPU machine)")
def test_an_mlp_head_on_cuda_takes_torchs_tanh_and_its_gradients():
    net = build_mlp(MLPConfig(hidden=[32, 32]), 6, 4).cuda()
    ref = nn.Sequential(*[nn.Tanh() if isinstance(m, Tanh) else m for m in net])  # the same Linear modules
    x = torch.randn(100, 6, device="cuda")
    out = net(x)
    assert out.is_cuda and torch.equal(out, ref(x))
    (g,) = torch.autograd.grad(out.square().sum(), net[0].weight)
    (g_ref,) = torch.autograd.grad(ref(x).square().sum(), net[0].weight)
    assert torch.equal(g, g_ref)
