"""The Q-learner's update on a flat parameter buffer (agents/q_learning.py ``QLearner._init_flat_adam``)
against the torch.optim path it replaced, bit for bit:

- ``clip_flat_grad`` is ``nn.utils.clip_grad_norm_`` on the same gradients, clipping or not;
- ``flush_denormals`` zeroes subnormal results inside its block only, and leaves the default after;
- a QLearner (DQN with clipping that bites, through the hand-written MLP pass ``numpy_heads.TorchMLP``
  with Huber or MSE, PER weights, ReLU or tanh; QMIX with its mixer in the buffer; a circuit head with
  three learning rates) takes the same parameters, losses, TD errors and Adam moments over many updates
  as a twin that runs autograd and steps torch.optim.Adam (foreach, as the learner did) after
  nn.utils.clip_grad_norm_;
- the checkpoint's ``optim.<i>.*`` arrays are torch.optim.Adam's state_dict, and come back;
- a QWorker acting through its numpy MLP with the float64 weights it keeps between pulls gives the
  Q-values the uncached forward gives at its parameters now, after a pull and after an evaluator's load.
"""
from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from agents.heads import Tanh
from agents.numpy_heads import NumpyMLP
from agents.q_learning import QConfig, QDims, QLearner, QWorker, build_q_network
from agents.value_targets import QMixer
from marl_q.config import load_config
from marl_q.messages import Message
from marl_q.services import PARAMS
from marl_q.optim import clip_flat_grad, flush_denormals

SCEN = Path(__file__).resolve().parents[2] / "scenarios"


@pytest.mark.parametrize("max_norm", [0.05, 1e6])  # clipping, and a bound no gradient reaches
def test_clip_flat_grad_is_clip_grad_norm_to_the_bit(max_norm):
    torch.manual_seed(0)
    shapes = [(7, 3), (7,), (2, 7), (2,)]
    grads = [torch.randn(s) for s in shapes]
    flat = torch.cat([g.reshape(-1) for g in grads])
    views, offset = [], 0
    for s in shapes:
        n = int(np.prod(s))
        views.append(flat[offset:offset + n].view(s))
        offset += n
    params = [nn.Parameter(torch.zeros(s)) for s in shapes]
    for p, g in zip(params, grads):
        p.grad = g.clone()
    ref_norm = nn.utils.clip_grad_norm_(params, max_norm)
    norm = clip_flat_grad(flat, views, max_norm)
    assert torch.equal(norm, ref_norm)
    assert torch.equal(flat, torch.cat([p.grad.reshape(-1) for p in params]))
    assert (norm > max_norm) == (max_norm == 0.05)


def test_flush_denormals_zeroes_subnormals_inside_the_block_only():
    tiny = torch.finfo(torch.float32).tiny
    x = torch.full((64,), tiny)
    assert (x * 0.5).gt(0).all()  # a subnormal result, kept by default
    with flush_denormals():
        assert torch.equal(x * 0.5, torch.zeros(64))
        assert torch.equal(torch.full((64,), tiny * 0.25) + 0.0, torch.zeros(64))  # read as zero
    assert (x * 0.5).gt(0).all()  # the default again


def _reference_step(learner: QLearner, opt: torch.optim.Optimizer):
    """The learner's old ``_descend``: torch.optim.Adam (foreach) after nn.utils.clip_grad_norm_."""
    def descend(loss):
        opt.zero_grad()
        loss.backward()
        if learner.hp.grad_clip is not None:
            nn.utils.clip_grad_norm_(learner.params, learner.hp.grad_clip)
        opt.step()
        learner.updates += 1
    return descend


def _twins(hp: QConfig, kind: str, net: nn.Module, dims: QDims) -> tuple[QLearner, QLearner, torch.optim.Optimizer]:
    torch.manual_seed(1)
    fast = QLearner(hp, kind, copy.deepcopy(net), dims)
    torch.manual_seed(1)  # the mixer's draws
    ref = QLearner(hp, kind, copy.deepcopy(net), dims)
    groups: dict[float, list[nn.Parameter]] = {}
    for name, p in zip(ref.param_names, ref.params):
        groups.setdefault(fast.adams[fast.slots[ref.param_names.index(name)][0]].lr, []).append(p)
    opt = torch.optim.Adam([{"params": ps, "lr": lr} for lr, ps in groups.items()], lr=hp.lr, eps=hp.adam_eps,
                           foreach=True)
    ref._descend = _reference_step(ref, opt)
    ref._mlp = None  # autograd
    return fast, ref, opt


def _batch(rng: np.random.Generator, dims: QDims, B: int, scale: float) -> dict[str, np.ndarray]:
    agent = (dims.n_agents,) if dims.n_agents else ()
    batch = {"obs": rng.normal(size=(B, *agent, dims.obs_dim)).astype(np.float32),
             "action": rng.integers(0, dims.n_actions, (B, *agent)),
             "reward": (scale * rng.normal(size=B)).astype(np.float32),
             "next_obs": rng.normal(size=(B, *agent, dims.obs_dim)).astype(np.float32),
             "terminated": rng.random(B) < 0.1, "discount": np.full(B, 0.99, np.float32)}
    if dims.n_agents:
        batch["avail"] = np.ones((B, *agent, dims.n_actions), bool)
        batch["next_avail"] = np.ones((B, *agent, dims.n_actions), bool)
    if dims.state_dim:
        batch["state"] = rng.normal(size=(B, dims.state_dim)).astype(np.float32)
        batch["next_state"] = rng.normal(size=(B, dims.state_dim)).astype(np.float32)
    return batch


def _assert_same_run(fast: QLearner, ref: QLearner, opt: torch.optim.Optimizer, dims: QDims, steps: int,
                     scale: float, B: int = 32, weighted: bool = False) -> None:
    rng = np.random.default_rng(0)
    for step in range(steps):
        batch = _batch(rng, dims, B, scale)
        w = rng.uniform(0.1, 1.0, B) if weighted else None  # PER's importance weights (float64, as sampled)
        loss_fast, td_fast = fast.update(batch, w)
        loss_ref, td_ref = ref.update(batch, w)
        assert loss_fast == loss_ref, step
        np.testing.assert_array_equal(td_fast, td_ref)
        if step % 20 == 0:
            fast.update_target()
            ref.update_target()
    for a, b in zip(fast.params, ref.params):
        assert torch.equal(a, b)
    # the moments, as the checkpoint numbers them, are torch.optim.Adam's state_dict
    ours = fast.adam_state()
    theirs = {f"{i}.{k}": np.asarray(v) for i, st in opt.state_dict()["state"].items() for k, v in st.items()}
    assert sorted(ours) == sorted(theirs)
    for key in theirs:
        assert ours[key].dtype == theirs[key].dtype and ours[key].shape == theirs[key].shape, key
        np.testing.assert_array_equal(ours[key], theirs[key], err_msg=key)


@pytest.mark.parametrize("loss, act, double, weighted", [("huber", nn.ReLU, False, False),
                                                         ("mse", nn.Tanh, True, True), ("mse", Tanh, True, False)])
def test_dqn_update_matches_autograd_torch_adam_and_clip_grad_norm_bit_for_bit(loss, act, double, weighted):
    """A 4-64-64-2 MLP (SB3's CartPole net, narrower), the gradient norm clipped in most updates."""
    dims = QDims(obs_dim=4, n_actions=2)
    hp = QConfig(lr=2.3e-3, grad_clip=0.3, double=double, loss=loss)
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(4, 64), act(), nn.Linear(64, 64), act(), nn.Linear(64, 2))
    fast, ref, opt = _twins(hp, "dqn", net, dims)
    assert fast._mlp is not None  # the hand-written pass
    _assert_same_run(fast, ref, opt, dims, steps=150, scale=30.0, weighted=weighted)


@pytest.mark.parametrize("hypernet_layers, loss, weighted", [(2, "huber", False), (1, "mse", True)])
def test_qmix_update_with_its_mixer_in_the_flat_buffer_matches_bit_for_bit(hypernet_layers, loss, weighted):
    """The hand-written pass (agents' MLP, QMixer.backward) against autograd and torch.optim.Adam; the
    Huber loss's both branches (scale 3 puts TD errors beyond delta 1), PER's weights, both hypernet forms."""
    dims = QDims(obs_dim=4, n_actions=3, n_agents=2, state_dim=5, agents=("a", "b"))
    hp = QConfig(lr=5e-3, grad_clip=10.0, double=True, mixer_embed_dim=4, hypernet_embed=8,
                 hypernet_layers=hypernet_layers, loss=loss)
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 3))
    fast, ref, opt = _twins(hp, "qmix", net, dims)
    assert fast._mlp is not None  # the hand-written pass
    assert any(n.startswith("mixer.") for n in fast.param_names)
    _assert_same_run(fast, ref, opt, dims, steps=60, scale=3.0, weighted=weighted)


@pytest.mark.parametrize("kind, agent_id", [("iql", True), ("vdn", True), ("iql", False)])
def test_iql_and_vdn_updates_match_autograd_bit_for_bit(kind, agent_id):
    dims = QDims(obs_dim=4, n_actions=3, n_agents=3, agents=("a", "b", "c"), agent_id=agent_id)
    hp = QConfig(lr=5e-3, grad_clip=1.0, double=kind == "vdn", agent_id=agent_id)
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(4 + 3 * agent_id, 16), nn.Tanh(), nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 3))
    fast, ref, opt = _twins(hp, kind, net, dims)
    assert fast._mlp is not None
    _assert_same_run(fast, ref, opt, dims, steps=60, scale=3.0)


def test_qmix_mixer_gradient_against_finite_differences():
    """QMixer.backward's d Q_tot / d agent_qs and d / d parameters, in float64, against central
    differences of the forward (an independent reference, beside the bit test against autograd)."""
    torch.manual_seed(3)
    mixer = QMixer(3, 4, embed_dim=5, hypernet_layers=2, hypernet_embed=6).double()
    for p_ in mixer.parameters():
        p_.grad = torch.zeros_like(p_)
    qs = torch.randn(7, 3, dtype=torch.float64)
    state = torch.randn(7, 4, dtype=torch.float64)
    out, cache = mixer.forward_cached(qs, state)
    torch.testing.assert_close(out, mixer(qs, state), rtol=0, atol=0)
    upstream = torch.randn(7, dtype=torch.float64)
    g_qs = mixer.backward(cache, upstream)

    def f() -> float:
        with torch.no_grad():
            return float((mixer(qs, state) * upstream).sum())

    eps = 1e-6
    for tensor, grad in [(qs, g_qs)] + [(p_.data, p_.grad) for p_ in mixer.parameters()]:
        numeric = torch.zeros_like(tensor)
        flat = tensor.view(-1)
        for i in range(flat.numel()):
            keep = float(flat[i])
            flat[i] = keep + eps
            up = f()
            flat[i] = keep - eps
            down = f()
            flat[i] = keep
            numeric.view(-1)[i] = (up - down) / (2 * eps)
        torch.testing.assert_close(grad, numeric, rtol=1e-6, atol=1e-7)


def test_circuit_head_with_three_learning_rates_matches_bit_for_bit():
    cfg = load_config(SCEN / "cartpole_qdqn_skolik.yaml", ["run.progress=false", "run.plots=false",
                                                          "algorithm.lr_input_scale=0.003"])
    dims = QDims(4, 2)
    torch.manual_seed(0)
    net = build_q_network(cfg, dims)
    fast, ref, opt = _twins(cfg.algorithm.params, "dqn", net, dims)
    assert len(fast.adams) == 3
    _assert_same_run(fast, ref, opt, dims, steps=8, scale=1.0, B=8)


def test_adam_state_round_trips_and_continues_identically():
    dims = QDims(obs_dim=4, n_actions=2)
    hp = QConfig(lr=1e-2)
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    a = QLearner(hp, "dqn", copy.deepcopy(net), dims)
    assert a.adam_state() == {}  # as torch's before the first step
    rng = np.random.default_rng(3)
    for _ in range(5):
        a.update(_batch(rng, dims, 8, 1.0))
    b = QLearner(hp, "dqn", copy.deepcopy(net), dims)
    with torch.no_grad():
        b.flat.flat.copy_(a.flat.flat)
    b.load_adam_state(a.adam_state())
    batch = _batch(rng, dims, 8, 1.0)
    assert a.update(batch)[0] == b.update(batch)[0]
    assert torch.equal(a.flat.flat, b.flat.flat)


def test_q_worker_acts_with_kept_weights_as_the_uncached_forward_after_each_change():
    cfg = load_config(SCEN / "cartpole_dqn.yaml", ["run.progress=false", "run.plots=false"])
    worker = QWorker(cfg, 0)
    assert isinstance(worker._np_net, NumpyMLP)
    obs = np.random.default_rng(0).normal(size=(1, 4)).astype(np.float32)

    def uncached() -> np.ndarray:
        return NumpyMLP(worker.net).forward(obs.astype(np.float64))[0]

    first = worker.q_values(obs)
    np.testing.assert_array_equal(first, uncached())
    new = worker.flat.numpy() * np.float32(1.5)
    worker.deliver(Message("server", worker.name, PARAMS, {PARAMS: new}, base_version=1))  # a pull
    assert not np.array_equal(worker.q_values(obs), first)
    np.testing.assert_array_equal(worker.q_values(obs), uncached())
    worker.flat.load(new * np.float32(0.5))  # an evaluator's load, then its greedy episodes
    worker.play_greedy(1, seed=3)
    np.testing.assert_array_equal(worker.q_values(obs), uncached())


def test_q_worker_with_skolik_circuit_acts_through_the_acting_twin():
    """The re-uploading Q-network of cartpole_qdqn_skolik.yaml (trainable input and output scales) acts
    through its acting twin on the statevector executor's blocks, one row per env step, with the torch
    head's bits (the same executor's readouts, the scales rounded as torch rounds them)."""
    from circuits.twins import NumpyVQCActing

    cfg = load_config(SCEN / "cartpole_qdqn_skolik.yaml", ["run.progress=false", "run.plots=false"])
    worker = QWorker(cfg, 0)
    assert isinstance(worker._np_net, NumpyVQCActing) and worker._np_net.plan(1).variant == "blocks"
    obs = np.random.default_rng(2).normal(size=(1, 4)).astype(np.float32)
    for _ in range(2):
        with torch.no_grad():
            want = worker.net(torch.from_numpy(obs)).numpy()
        np.testing.assert_array_equal(worker.q_values(obs), want)
        worker.flat.load(worker.flat.numpy() * np.float32(0.7))  # a pull: new weights and scales


def test_q_worker_acting_weights_check_the_flat_buffers_write_count():
    """The kept weights are keyed by the flat buffer and its ``writes``: kept while nothing writes it
    (the same arrays), taken again after any ``load`` (no clear by hand: a plain load between two acts),
    and a worker out of a snapshot (a new buffer, whose count starts again at 0) takes its own."""
    import pickle

    from agents.q_learning import _ACTING_WEIGHTS

    cfg = load_config(SCEN / "cartpole_dqn.yaml", ["run.progress=false", "run.plots=false"])
    worker = QWorker(cfg, 0)
    obs = np.random.default_rng(1).normal(size=(3, 4)).astype(np.float32)
    worker.q_values(obs)
    kept = _ACTING_WEIGHTS[worker.flat]
    worker.q_values(obs)
    assert _ACTING_WEIGHTS[worker.flat] is kept and kept[0] == worker.flat.writes == 0
    worker.flat.load(worker.flat.numpy() * np.float32(-2.0))
    assert worker.flat.writes == 1
    np.testing.assert_array_equal(worker.q_values(obs), NumpyMLP(worker.net).forward(obs.astype(np.float64))[0])
    assert _ACTING_WEIGHTS[worker.flat][0] == 1
    with torch.no_grad():  # the torch network is the reference the kept weights must equal
        torch_q = worker.net(torch.from_numpy(obs)).double().numpy()
    np.testing.assert_allclose(worker.q_values(obs), torch_q, rtol=1e-5, atol=1e-6)

    back = pickle.loads(pickle.dumps(worker))
    assert back.flat is not worker.flat and back.flat not in _ACTING_WEIGHTS and back.flat.writes == 0
    np.testing.assert_array_equal(back.q_values(obs), worker.q_values(obs))


@pytest.mark.parametrize("offset", [0, 1, 2, 3, 5])  # floats before the net's gradient in the flat buffer
@pytest.mark.parametrize("act", [nn.ReLU, nn.Tanh, Tanh])  # Tanh: heads' numpy-kernel layer
def test_torch_mlp_backward_is_autograds_at_every_alignment_of_the_gradient_views(offset, act):
    """``TorchMLP.backward`` writes each layer's gradient into views of one flat buffer, which start at
    any float's alignment. Its GEMMs are formed in fresh memory and copied there, as autograd's are:
    an MKL GEMM written straight into an unaligned view gave other last bits on AMD Zen 4 (and the QMIX
    golden's train.csv changed on that CPU only)."""
    from agents.numpy_heads import TorchMLP

    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(5, 16), act(), nn.Linear(16, 4))
    ref = copy.deepcopy(net)
    x, target = torch.randn(32, 5), torch.randn(32, 4)
    ((ref(x) - target) ** 2).mean().backward()  # autograd, each gradient in its own (aligned) tensor
    sizes = [p.numel() for p in net.parameters()]
    flat = torch.full((offset + sum(sizes) + 3,), float("nan"))
    start = offset
    for p, n in zip(net.parameters(), sizes):
        p.grad = flat[start:start + n].view_as(p)
        start += n
    mlp = TorchMLP(net)
    out, cache = mlp.forward(x)
    mlp.backward(cache, 2.0 * (out - target) / out.numel())  # d mean((out - target)^2) / d out
    for (name, a), b in zip(net.named_parameters(), ref.parameters()):
        assert torch.equal(a.grad, b.grad), name
