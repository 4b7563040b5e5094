"""The actor-critic core: A2C as a special case of PPO, flat parameters, rollouts."""
from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from agents.actor_critic import ActorCriticWorker
from agents.heads import FlatParameters, MLPConfig, build_mlp
from marl_q.config import build_config


def test_flat_parameters_share_storage_and_gradients():
    torch.manual_seed(0)
    a, b = build_mlp(MLPConfig(hidden=[5]), 3, 2), build_mlp(MLPConfig(hidden=[4]), 3, 1)
    ref_a, ref_b = copy.deepcopy(a), copy.deepcopy(b)
    flat = FlatParameters(a, b)
    x = torch.randn(7, 3)
    torch.testing.assert_close(a(x), ref_a(x))
    (a(x).sum() + b(x).pow(2).sum()).backward()
    (ref_a(x).sum() + ref_b(x).pow(2).sum()).backward()
    ref = torch.cat([p.grad.flatten() for m in (ref_a, ref_b) for p in m.parameters()])
    torch.testing.assert_close(flat.flat.grad, ref)
    new = np.arange(flat.size, dtype=np.float32) / flat.size
    flat.load(new)
    np.testing.assert_array_equal(torch.cat([p.detach().flatten() for p in a.parameters()]).numpy(),
                                  new[: sum(p.numel() for p in a.parameters())])


def test_rollout_masks_autoreset_steps_and_counts_true_episodes(small_raw):
    small_raw["scenario"]["max_episode_steps"] = 7
    small_raw["algorithm"]["n_steps"] = 20
    cfg = build_config(small_raw)
    w = ActorCriticWorker(cfg, 0)
    batch, episodes, steps = w.rollout()
    valid = batch["valid"]
    # every step after an episode end only resets that env: masked out
    assert not valid[1:][batch["dones"][:-1]].any()
    assert steps == valid.sum()
    assert all(1 <= e["length"] <= 7 for e in episodes)
    # each finished episode's length is its count of valid steps, rewards are 1 per step in CartPole
    assert all(e["return"] == e["length"] for e in episodes)
    assert sum(e["length"] for e in episodes) <= steps


def test_worker_push_is_a_finite_gradient_of_the_right_size(small_raw):
    cfg = build_config(small_raw)
    w = ActorCriticWorker(cfg, 0)
    from marl_q.messages import SERVER, Message

    w.deliver(Message(SERVER, "w0", "params", {"params": w.flat.numpy()}, base_version=4))
    assert w.ready()
    work = w.step()
    (msg,) = work.messages
    assert msg.kind == "grad" and msg.base_version == 4 and msg.seq == 1
    assert msg.payload["grad"].shape == (w.flat.size,) and np.isfinite(msg.payload["grad"]).all()
    assert not w.ready() and work.env_steps > 0


def test_a2c_update_gradient_equals_a_direct_computation():
    """The single-pass A2C gradient against the textbook loss built from n-step returns."""
    from agents.actor_critic import ActorCriticConfig, actor_critic_update
    from agents.returns import discounted_returns

    torch.manual_seed(1)
    rng = np.random.default_rng(0)
    actor, critic = build_mlp(MLPConfig(hidden=[8]), 4, 2), build_mlp(MLPConfig(hidden=[8]), 4, 1)
    ref_actor, ref_critic = copy.deepcopy(actor), copy.deepcopy(critic)
    flat = FlatParameters(actor, critic)
    T, N = 5, 3
    batch = {"obs": rng.normal(size=(T + 1, N, 4)).astype(np.float32),
             "actions": rng.integers(0, 2, size=(T, N)), "rewards": rng.normal(size=(T, N)),
             "terminated": rng.random((T, N)) < 0.2, "valid": np.ones((T, N), dtype=bool)}
    batch["dones"] = batch["terminated"] | (rng.random((T, N)) < 0.1)
    ac = ActorCriticConfig(ent_coef=0.01, max_grad_norm=None, reward_scale=0.5)
    diag = actor_critic_update(ac, actor, critic, flat, None, rng, batch)
    # reference: V on every obs, R_t by the n-step recursion, loss = -A log pi - c H + vf (R - V)^2
    obs = torch.from_numpy(batch["obs"])
    v = ref_critic(obs).squeeze(-1)
    nv = v[1:].detach().numpy().astype(np.float64)
    R = torch.tensor(discounted_returns(batch["rewards"] * 0.5, nv, batch["terminated"], batch["dones"], ac.gamma),
                     dtype=torch.float32)
    adv = (R - v[:T]).detach()
    logp_all = torch.log_softmax(ref_actor(obs[:T]), -1)
    logp = logp_all.gather(2, torch.from_numpy(batch["actions"])[..., None]).squeeze(-1)
    ent = -(logp_all.exp() * logp_all).sum(-1).mean()
    loss = -(adv * logp).mean() - 0.01 * ent + 0.5 * ((R - v[:T]) ** 2).mean()
    loss.backward()
    ref = torch.cat([p.grad.flatten() for m in (ref_actor, ref_critic) for p in m.parameters()])
    torch.testing.assert_close(flat.flat.grad, ref, rtol=1e-4, atol=1e-6)
    # train.csv's row of this update, against the same reference (CleanRL's definitions)
    err, ret = (R - v[:T]).detach().numpy(), R.numpy()
    assert diag["policy_loss"] == pytest.approx(float(-(adv * logp).mean().detach()), rel=1e-5)
    assert diag["value_loss"] == pytest.approx(float(((R - v[:T]) ** 2).mean().detach()), rel=1e-5)
    assert diag["entropy"] == pytest.approx(float(ent.detach()), rel=1e-5)
    assert diag["explained_variance"] == pytest.approx(1.0 - np.var(err) / np.var(ret), rel=1e-4)
    assert diag["approx_kl"] == 0.0 and diag["clipfrac"] is None  # one pass at the rollout's parameters, no clip


def _ppo_batch(T=8, N=3, seed=5):
    rng = np.random.default_rng(seed)
    batch = {"obs": rng.normal(size=(T + 1, N, 4)).astype(np.float32),
             "actions": rng.integers(0, 2, size=(T, N)), "rewards": rng.normal(size=(T, N)),
             "terminated": rng.random((T, N)) < 0.2, "valid": rng.random((T, N)) < 0.8}
    batch["dones"] = batch["terminated"] | (rng.random((T, N)) < 0.1)
    return batch


def _ppo_update(ac, batch):
    from agents.actor_critic import actor_critic_update, make_optimizer

    torch.manual_seed(6)
    actor, critic = build_mlp(MLPConfig(hidden=[8]), 4, 2), build_mlp(MLPConfig(hidden=[8]), 4, 1)
    flat = FlatParameters(actor, critic)
    diag = actor_critic_update(ac, actor, critic, flat, make_optimizer("adam", flat.flat, ac),
                               np.random.default_rng(7), batch)
    return diag, flat.numpy()


@pytest.mark.parametrize("fast_path", [False, True])
def test_ppo_diagnostics_are_cleanrls_last_minibatch_and_mean_clip_fraction(monkeypatch, fast_path):
    """approx_kl is the last minibatch's, clipfrac the mean over every minibatch of every epoch (CleanRL);
    a single clipped pass is at ratio 1 (KL 0, nothing clipped). The torch path takes them from
    ``ratio_stats``, the numpy epochs (``fast_path``, mlp heads) from ``loss_grad``'s terms."""
    import agents.actor_critic as ac_mod
    from agents.actor_critic import PPOConfig
    from agents.losses import loss_grad, ratio_stats

    batch = _ppo_batch()
    seen = []

    def spy(*args, **kw):
        seen.append(ratio_stats(*args, **kw))
        return seen[-1]

    def spy_terms(*args, **kw):
        out = loss_grad(*args, **kw)
        seen.append(dict(args[6]))  # the terms it filled
        return out

    if fast_path:
        monkeypatch.setattr(ac_mod, "loss_grad", spy_terms)
    else:
        monkeypatch.setattr(ac_mod, "ratio_stats", spy)
    ppo = PPOConfig(n_steps=8, epochs=3, minibatches=2, lr=0.05, fast_path=fast_path)
    diag, _ = _ppo_update(ppo, batch)
    assert len(seen) == 6
    assert diag["approx_kl"] == seen[-1]["approx_kl"] > 0
    assert diag["clipfrac"] == pytest.approx(np.mean([s["clipfrac"] for s in seen])) and diag["clipfrac"] > 0
    assert all(np.isfinite(diag[k]) for k in diag)
    seen.clear()
    one_pass, _ = _ppo_update(PPOConfig(n_steps=8, epochs=1, minibatches=1, fast_path=fast_path), batch)
    assert one_pass["approx_kl"] == pytest.approx(0.0, abs=1e-7) and one_pass["clipfrac"] == 0.0


def test_diagnostics_leave_the_update_bit_for_bit(monkeypatch):
    """The parameters after a PPO update are the same bytes when the diagnostics are not computed."""
    import agents.actor_critic as ac_mod
    from agents.actor_critic import PPOConfig

    batch = _ppo_batch()
    ppo = PPOConfig(n_steps=8, epochs=3, minibatches=2, lr=0.05)
    _, with_diag = _ppo_update(ppo, batch)
    monkeypatch.setattr(ac_mod, "ratio_stats", lambda *a, **k: {"approx_kl": 0.0, "clipfrac": 0.0})
    monkeypatch.setattr(ac_mod, "explained_variance", lambda *a: None)
    _, without = _ppo_update(ppo, batch)
    assert with_diag.tobytes() == without.tobytes()


def test_diffqas_heads_report_their_selected_architecture(small_raw):
    from marl_q.experiment import run_experiment

    small_raw["run"]["total_env_steps"] = 200
    small_raw["actor"] = {"head": "diffqas", "n_qubits": 4, "layers": 1, "top_k": 2}
    summary = run_experiment(build_config(small_raw), None)
    arch = summary["actor_architecture"]
    assert arch["pool_size"] >= 2 and len(arch["selected"]) == 2
    assert "critic_architecture" not in summary  # an mlp critic chooses nothing


def test_a2c_fast_path_matches_the_general_path_with_masked_steps():
    """A single pass with a value clip too wide to bind gives the clip-free (A2C) gradient, with
    invalid steps masked out, with and without the entropy term."""
    from agents.actor_critic import ActorCriticConfig, actor_critic_update

    for ent_coef in (0.0, 0.01):
        torch.manual_seed(2)
        rng = np.random.default_rng(3)
        T, N = 4, 3
        batch = {"obs": rng.normal(size=(T + 1, N, 4)).astype(np.float32),
                 "actions": rng.integers(0, 2, size=(T, N)), "rewards": rng.normal(size=(T, N)),
                 "terminated": rng.random((T, N)) < 0.2, "valid": rng.random((T, N)) < 0.7}
        batch["dones"] = batch["terminated"] | (rng.random((T, N)) < 0.1)
        assert not batch["valid"].all() and batch["valid"].any()
        grads = []
        for value_clip in (None, 1e9):
            torch.manual_seed(2)
            actor, critic = build_mlp(MLPConfig(hidden=[8]), 4, 2), build_mlp(MLPConfig(hidden=[8]), 4, 1)
            flat = FlatParameters(actor, critic)
            ac = ActorCriticConfig(ent_coef=ent_coef, max_grad_norm=0.5, value_clip=value_clip)
            actor_critic_update(ac, actor, critic, flat, None, np.random.default_rng(0), batch)
            grads.append(flat.flat.grad.clone())
        assert float(grads[0].abs().max()) > 0
        torch.testing.assert_close(grads[0], grads[1], rtol=1e-5, atol=1e-7)


def _one_step_workers(raw, fast_path=False):
    """Two one-step workers fed the same parameters for 30 steps: the first as configured, the second
    on the torch path without reuse (a second forward in the update); their pushed gradients."""
    from marl_q.messages import SERVER, Message

    raw["algorithm"]["n_steps"] = 1
    raw["algorithm"]["fast_path"] = fast_path
    cfg = build_config(raw)
    workers = [ActorCriticWorker(cfg, 0), ActorCriticWorker(cfg, 0)]
    assert workers[0]._reuse_act_forward
    assert (workers[0]._np_heads is not None) == fast_path
    workers[1]._reuse_act_forward = False  # the rollout's forward without graph, a second one in the update
    workers[1]._np_heads = None
    params = workers[0].flat.numpy()
    pushed = [[], []]
    for step in range(30):
        for i, w in enumerate(workers):
            w.deliver(Message(SERVER, "w0", "params", {"params": params}, base_version=step))
            pushed[i].append(w.step().messages[0].payload["grad"])
        params = params - 0.05 * pushed[0][-1]  # move the parameters so every step differentiates afresh
    return pushed


HYBRID_ACTOR = {"head": "hybrid", "n_qubits": 4, "layers": 2, "scaling": "bound", "bounds": [4.8, None, 0.418, None]}


def test_a_reused_forward_feeds_the_same_loss_bit_for_bit():
    """Handing actor_critic_update the actor's forward (as the one-step worker hands it the rollout's)
    changes only where the logits come from: the same tensor gives the same gradient, to the bit."""
    from agents.actor_critic import ActorCriticConfig, actor_critic_update

    rng = np.random.default_rng(5)
    T, N = 3, 2
    batch = {"obs": rng.normal(size=(T + 1, N, 4)).astype(np.float32),
             "actions": rng.integers(0, 2, size=(T, N)), "rewards": rng.normal(size=(T, N)),
             "terminated": np.zeros((T, N), dtype=bool), "valid": np.ones((T, N), dtype=bool)}
    batch["dones"] = batch["terminated"]
    grads = []
    for reuse in (False, True):
        torch.manual_seed(5)
        actor, critic = build_mlp(MLPConfig(hidden=[8]), 4, 2), build_mlp(MLPConfig(hidden=[8]), 4, 1)
        flat = FlatParameters(actor, critic)
        obs_all = torch.from_numpy(batch["obs"].reshape((T + 1) * N, -1))
        logits = actor(obs_all[: T * N]) if reuse else None
        actor_critic_update(ActorCriticConfig(ent_coef=0.01), actor, critic, flat, None, rng, batch, logits)
        grads.append(flat.flat.grad.numpy().copy())
    assert np.abs(grads[0]).max() > 0
    np.testing.assert_array_equal(grads[1], grads[0])


@pytest.mark.parametrize("actor", [None, HYBRID_ACTOR], ids=["mlp", "hybrid"])
def test_one_step_a2c_reuse_of_the_rollout_forward_pushes_the_same_gradient(small_raw, actor):
    """The one-step worker reuses its rollout's actor forward (on the observation it acted on) instead
    of a second forward in the update. The two forwards see the same numbers but not always the same
    kernel (torch's matmul may round a 1-row batch differently, ~1e-9 here): equal to float32 rounding,
    relative to the gradient's largest entry."""
    if actor is not None:
        small_raw["actor"] = dict(actor)
    pushed = _one_step_workers(small_raw)
    for reused, second in zip(*pushed):
        np.testing.assert_allclose(reused, second, rtol=1e-5, atol=1e-6 * max(1.0, np.abs(second).max()))
    assert any(np.abs(g).max() > 0 for g in pushed[0])


def test_one_step_numpy_path_pushes_the_torch_gradient(small_raw):
    """fast_path true (numpy forward and backward, float64) against the torch path (float32 autograd):
    the same actions are drawn and the pushed gradients agree to float32 rounding, MLP and hybrid."""
    for actor in (None, dict(HYBRID_ACTOR)):
        raw = copy.deepcopy(small_raw)
        if actor is not None:
            raw["actor"] = actor
        pushed = _one_step_workers(raw, fast_path=True)
        for fast, ref in zip(*pushed):
            np.testing.assert_allclose(fast, ref, rtol=1e-4, atol=1e-6 * max(1.0, np.abs(ref).max()))
        assert any(np.abs(g).max() > 0 for g in pushed[0])
