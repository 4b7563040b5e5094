"""ippo, mappo, ia2c, maa2c (agents/mappo.py) and the Gaussian actor-critic, each against an
independent reference: hand-computed GAE, the heads called directly, env.state(), a custom env
whose deaths are known, the CLI's exit status, and a second identical run."""
from __future__ import annotations

import copy
import csv
import importlib.util
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from gymnasium import spaces
from pettingzoo import ParallelEnv
from torch import nn

from agents.actor_critic import ActorCriticConfig, ActorCriticWorker, actor_critic_update
from agents.distributions import Categorical, DiagGaussian, LogStd
from agents.heads import FlatParameters, count_params
from agents.mappo import PerAgent, TeamWorker, build_team_models, describe_team, make_env
from agents.value_norm import ValueNorm
from marl_q.config import build_config
from marl_q.experiment import run_experiment

HAS_SISL = importlib.util.find_spec("pymunk") is not None
SISL_REASON = "needs the optional SISL extra (pymunk, Box2D): pip install -e '.[sisl]'"
REFERENCE = "mpe2.simple_reference_v3:parallel_env"
LISTENER = "mpe2.simple_speaker_listener_v4:parallel_env"
ADVERSARY = "mpe2.simple_adversary_v3:parallel_env"
TEAM = ("ippo", "mappo", "ia2c", "maa2c")
COMA_FAMILY = ("coma", "iac", "central_v")
SMALL_HEADS = {"actor": {"head": "mlp", "hidden": [16]}, "critic": {"head": "mlp", "hidden": [16]}}


def _raw(alg: str, env: str, *, kwargs: Any = None, common: bool = True, steps: int = 200, workers: int = 1,
         **alg_keys: Any) -> dict:
    algorithm: dict[str, Any] = {"name": alg}
    if alg in COMA_FAMILY:
        algorithm["eval_episodes"] = 1  # the greedy evaluation at the end, kept tiny
    else:
        algorithm.update({"envs_per_worker": 2, "n_steps": 5})
        if alg in ("ippo", "mappo"):
            algorithm["epochs"] = 2
    algorithm.update(alg_keys)
    return {"run": {"seed": 0, "total_env_steps": steps, "progress": False, "plots": False},
            "backend": {"name": "sim", "workers": workers},
            "scenario": {"name": "pettingzoo", "env": env, "kwargs": {"max_cycles": 10} if kwargs is None else kwargs,
                         "common_spaces": common},
            "algorithm": algorithm, **copy.deepcopy(SMALL_HEADS)}


def _rows(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


# ----------------------------------------------------------------------------- 1. any env
PURSUIT = pytest.param("sisl/pursuit-v5", {"max_cycles": 10, "n_pursuers": 4, "n_evaders": 6},
                       marks=pytest.mark.skipif(not HAS_SISL, reason=SISL_REASON), id="pursuit")
ENVS = [pytest.param(REFERENCE, None, id="reference"), pytest.param(LISTENER, None, id="speaker_listener"),
        pytest.param(ADVERSARY, None, id="adversary"), PURSUIT]


@pytest.mark.parametrize("env,kwargs", ENVS)
@pytest.mark.parametrize("alg", TEAM + COMA_FAMILY)
def test_every_algorithm_runs_end_to_end_on_any_parallel_env(alg, env, kwargs, tmp_path):
    summary = run_experiment(build_config(_raw(alg, env, kwargs=kwargs)), tmp_path / "run")
    assert summary["status"] == "completed" and summary["env_steps"] >= 200
    rows = _rows(tmp_path / "run" / "metrics.csv")
    assert len(rows) == summary["episodes"] > 0
    assert all(np.isfinite(float(r["return"])) for r in rows)
    # every episode ran to the max_cycles truncation (none of these envs ends earlier)
    assert {int(r["length"]) for r in rows} == {10}


# ----------------------------------------------------------------------------- 2. bad input


@pytest.mark.skipif(not HAS_SISL, reason=SISL_REASON)
@pytest.mark.parametrize("alg", COMA_FAMILY)
def test_coma_family_refuses_continuous_actions(alg, cli_run):
    code, err, out = cli_run(_raw(alg, "sisl/multiwalker-v9", common=False))
    assert code == 2 and not out.exists()
    assert f"algorithm {alg}: agent 'walker_0' has a non-discrete action space Box(" in err


@pytest.mark.parametrize("alg,match", [
    ("mappo", "the agents' observation sizes differ (speaker_0: 3, listener_0: 11)"),
    ("ia2c", "the agents' observation sizes differ (speaker_0: 3, listener_0: 11)"),
    ("coma", "different ones (speaker_0: 3, listener_0: 5)"),
    ("central_v", "different ones (speaker_0: 3, listener_0: 5)")])
def test_unequal_spaces_without_common_spaces_exit_2_naming_agents_and_sizes(alg, match, cli_run):
    code, err, out = cli_run(_raw(alg, LISTENER, common=False))
    assert code == 2 and not out.exists()
    assert match in err and "common_spaces" in err


def test_unequal_action_spaces_with_equal_observations_are_named(cli_run):
    """Equal observation sizes but action spaces that differ: the team family names those."""
    code, err, out = cli_run(_raw("ippo", "tests.agents.test_mappo:UnequalActionsEnv", kwargs={}, common=False))
    assert code == 2 and not out.exists()
    assert "the agents' action spaces differ (a: Discrete(2), b: Discrete(3))" in err


class UnequalActionsEnv(ParallelEnv):
    metadata = {"name": "unequal_actions"}

    def __init__(self) -> None:
        self.possible_agents, self.agents = ["a", "b"], []

    def observation_space(self, agent):
        return spaces.Box(-1, 1, (2,), np.float32)

    def action_space(self, agent):
        return spaces.Discrete(2 if agent == "a" else 3)

    def reset(self, seed=None, options=None):
        self.agents = list(self.possible_agents)
        return {a: np.zeros(2, np.float32) for a in self.agents}, {a: {} for a in self.agents}

    def state(self):
        return np.zeros(2, np.float32)


# ----------------------------------------------------------------------------- 5. PerAgent
def test_per_agent_routes_each_row_to_its_own_head():
    torch.manual_seed(0)
    heads = [nn.Linear(3, 2) for _ in range(3)]
    per = PerAgent(heads)
    feats = torch.randn(7, 3)
    agent = torch.tensor([2, 0, 1, 1, 2, 0, 2])
    out = per(torch.cat([feats, torch.eye(3)[agent]], dim=1))
    for row in range(7):
        torch.testing.assert_close(out[row], heads[int(agent[row])](feats[row:row + 1])[0])
    out.sum().backward()  # gradients reach each head through its rows only
    assert all(h.weight.grad is not None and h.weight.grad.abs().sum() > 0 for h in heads)


@pytest.mark.parametrize("alg", ["ippo", "mappo"])
def test_share_params_false_gives_one_actor_and_critic_per_agent(alg):
    shared_cfg = build_config(_raw(alg, REFERENCE, agent_id=False))
    own_cfg = build_config(_raw(alg, REFERENCE, share_params=False))
    env = make_env(shared_cfg, 0)
    desc = describe_team(shared_cfg, env)
    actor, critic, _ = build_team_models(shared_cfg, desc)
    own_actor, own_critic, _ = build_team_models(own_cfg, describe_team(own_cfg, env))
    n = len(desc.agents)
    assert n == 2 and isinstance(own_actor, PerAgent) and isinstance(own_critic, PerAgent)
    assert count_params(own_actor) == n * count_params(actor)
    assert count_params(own_critic) == n * count_params(critic)
    env.close()


# ----------------------------------------------------------------------------- 6. death masking
class DeathEnv(ParallelEnv):
    """Agent "a" terminates at step 2, "b" plays on until the truncation at step 6; reward 1 each step
    (PettingZoo's convention: the step that ends an agent still returns its observation, and the
    agent is gone from ``agents`` and from later steps)."""

    metadata = {"name": "death"}
    DIE_AT, LENGTH = 2, 6

    def __init__(self) -> None:
        self.possible_agents, self.agents, self.t = ["a", "b"], [], 0

    def observation_space(self, agent):
        return spaces.Box(-10, 10, (2,), np.float32)

    def action_space(self, agent):
        return spaces.Discrete(2)

    def _obs(self, agent):
        return np.array([self.t / 10, self.possible_agents.index(agent)], np.float32)

    def state(self):
        return np.array([self.t / 10, len(self.agents)], np.float32)

    def reset(self, seed=None, options=None):
        self.t, self.agents = 0, list(self.possible_agents)
        return {a: self._obs(a) for a in self.agents}, {a: {} for a in self.agents}

    def step(self, actions):
        assert set(actions) <= set(self.agents), f"actions for agents not in play: {set(actions) - set(self.agents)}"
        self.t += 1
        acting = list(self.agents)
        obs = {a: self._obs(a) for a in acting}
        rew = {a: 1.0 for a in acting}
        term = {a: a == "a" and self.t == self.DIE_AT for a in acting}
        trunc = {a: self.t == self.LENGTH for a in acting}
        self.agents = [a for a in acting if not (term[a] or trunc[a])]
        return obs, rew, term, trunc, {a: {} for a in acting}


def _death_worker(alg: str = "ia2c", **alg_keys) -> TeamWorker:
    raw = _raw(alg, "tests.agents.test_mappo:DeathEnv", kwargs={}, common=False, envs_per_worker=1, n_steps=8,
               **alg_keys)
    return TeamWorker(build_config(raw), 0)


def test_a_dead_agents_later_steps_are_invalid_and_it_gets_no_actions():
    worker = _death_worker()  # DeathEnv.step asserts that no action is sent for an agent out of play
    batch, episodes, steps = worker.rollout()
    # step 0 resets (masked); env steps 1..6 at rows 1..6; row 7 resets again
    np.testing.assert_array_equal(batch["valid"][:, 0], [0, 1, 1, 0, 0, 0, 0, 0])  # agent a: dies at env step 2
    np.testing.assert_array_equal(batch["valid"][:, 1], [0, 1, 1, 1, 1, 1, 1, 0])  # agent b: plays to 6
    np.testing.assert_array_equal(batch["terminated"][:, 0], [0, 0, 1, 0, 0, 0, 0, 0])
    assert steps == 6 and len(episodes) == 1
    assert episodes[0]["length"] == 6 and episodes[0]["return"] == 2 + 6  # a's 2 rewards and b's 6


def test_a_dead_agents_rows_do_not_contribute_to_the_pushed_gradient():
    worker = _death_worker()
    batch, _, _ = worker.rollout()
    vn = copy.deepcopy(worker.value_norm)

    def gradient(b):
        worker.value_norm = copy.deepcopy(vn)
        worker.learn(b)
        return worker.flat.grad_numpy().copy()

    base = gradient(batch)
    dead = copy.deepcopy(batch)
    dead["rewards"][~dead["valid"]] = 1000.0  # the dead agent's (and the reset steps') rows
    dead["actions"][~dead["valid"]] = 1 - dead["actions"][~dead["valid"]]
    np.testing.assert_array_equal(gradient(dead), base)
    live = copy.deepcopy(batch)
    live["rewards"][3, 1] += 5.0  # a valid row of agent b: the gradient must move (the check bites)
    assert not np.allclose(gradient(live), base)


# ----------------------------------------------------------------------------- 7. value normalisation wiring
def test_gae_uses_denormalised_values_and_the_critic_learns_normalised_returns(monkeypatch):
    import agents.actor_critic as ac_module

    seen: dict[str, Any] = {}
    real_loss = ac_module.actor_critic_loss

    def spy(ac, logp, adv, values, ret, **kw):
        seen.update(adv=adv.detach().numpy().copy(), values=values.detach().numpy().copy(),
                    ret=ret.detach().numpy().copy())
        return real_loss(ac, logp, adv, values, ret, **kw)

    monkeypatch.setattr(ac_module, "actor_critic_loss", spy)
    critic = nn.Linear(1, 1)  # V_norm(o) = o[0]: an output we control
    with torch.no_grad():
        critic.weight.fill_(1.0)
        critic.bias.zero_()
    actor = nn.Linear(1, 2)
    flat = FlatParameters(actor, critic)
    x = np.array([0.5, 1.0, -0.5, 2.0])  # the critic's (normalised) outputs on obs 0..3
    batch = {"obs": x.reshape(4, 1, 1).astype(np.float32), "actions": np.array([[0], [1], [0]]),
             "rewards": np.array([[1.0], [0.0], [2.0]]), "terminated": np.array([[False], [False], [True]]),
             "dones": np.array([[False], [False], [True]]), "valid": np.ones((3, 1), bool)}
    vn = ValueNorm(beta=0.9)
    vn.update(np.array([1.0, 2.0, 3.0]))  # mu 2, var 2/3
    ac = ActorCriticConfig(gamma=0.9, gae_lambda=0.8, max_grad_norm=None)
    actor_critic_update(ac, actor, critic, flat, None, np.random.default_rng(0), batch, value_norm=vn)
    # by hand: de-normalised values, GAE backwards, returns = A + V
    v = x * np.sqrt(2 / 3) + 2.0
    d2 = 2.0 - v[2]  # terminal: no bootstrap
    d1 = 0.0 + 0.9 * v[2] - v[1]
    d0 = 1.0 + 0.9 * v[1] - v[0]
    a2 = d2
    a1 = d1 + 0.9 * 0.8 * a2
    a0 = d0 + 0.9 * 0.8 * a1
    adv = np.array([a0, a1, a2])
    ret = adv + v[:3]
    np.testing.assert_allclose(seen["adv"], adv, rtol=1e-5)
    # the statistics took in these returns (beta 0.9 from m=0.2, s=0.1*14/3, d=0.1), then normalised them
    m = 0.9 * 0.2 + 0.1 * ret.mean()
    s = 0.9 * 0.1 * 14 / 3 + 0.1 * (ret ** 2).mean()
    d = 0.9 * 0.1 + 0.1
    mu, var = m / d, s / d - (m / d) ** 2
    np.testing.assert_allclose(seen["ret"], (ret - mu) / np.sqrt(var), rtol=1e-5)
    np.testing.assert_allclose(seen["values"], x[:3], rtol=1e-6)  # the loss compares the raw outputs


# ----------------------------------------------------------------------------- 8. critic inputs
@pytest.mark.parametrize("alg", ["mappo", "ippo"])
def test_critic_input_is_state_plus_id_for_mappo_and_obs_plus_id_for_ippo(alg):
    worker = TeamWorker(build_config(_raw(alg, REFERENCE)), 0)
    batch, _, _ = worker.rollout()
    E, N = len(worker.envs), len(worker.desc.agents)
    obs_dim = worker.desc.obs_dim
    state_dim = int(np.asarray(worker.envs[0].state()).size)
    assert (obs_dim, N) == (21, 2) and state_dim == worker.desc.state_dim > 0
    assert batch["obs"].shape == (6, E * N, obs_dim + N)
    critic_width = (state_dim if alg == "mappo" else obs_dim) + N
    # ippo's critic reads the actor's rows (the batch holds them once)
    assert ("critic_obs" in batch) == (alg == "mappo")
    critic_obs = batch.get("critic_obs", batch["obs"])
    assert critic_obs.shape == (6, E * N, critic_width)
    # the bootstrap rows (after the last step) against the envs themselves
    last = critic_obs[-1]
    for e, env in enumerate(worker.envs):
        for i, agent in enumerate(worker.desc.agents):
            row = last[e * N + i]
            base = np.asarray(env.state(), np.float32) if alg == "mappo" else worker.vec.obs[e][agent]
            np.testing.assert_array_equal(row[:-N], base)
            np.testing.assert_array_equal(row[-N:], np.eye(N)[i])
            np.testing.assert_array_equal(batch["obs"][-1, e * N + i, :obs_dim], worker.vec.obs[e][agent])


# ----------------------------------------------------------------------------- 9. the server's options
ASYNC = [("mappo", {"aggregation": "sync"}), ("mappo", {"aggregation": "buffered", "buffer_k": 2}),
         ("mappo", {"aggregation": "hogwild", "staleness": {"rule": "poly"}}),
         ("ia2c", {"aggregation": "hogwild", "staleness": {"rule": "poly"}})]


@pytest.mark.parametrize("alg,server", ASYNC, ids=["mappo-sync", "mappo-buffered", "mappo-hogwild", "ia2c-hogwild"])
def test_server_aggregation_options_run_and_fill_the_ledger(alg, server, tmp_path):
    raw = _raw(alg, REFERENCE, steps=300, workers=2)
    raw["server"] = server
    summary = run_experiment(build_config(raw), tmp_path / "run")
    assert summary["status"] == "completed" and summary["updates"] > 0
    updates = [r for r in _rows(tmp_path / "run" / "comm.csv") if r["kind"] in ("grad", "delta")]
    assert updates and {r["kind"] for r in updates} == {"grad" if alg == "ia2c" else "delta"}
    assert all(r["staleness"] != "" for r in updates)
    assert {r["src"] for r in updates} == {"w0", "w1"}
    if server["aggregation"] == "hogwild":  # two workers racing: some updates arrive stale
        assert max(int(r["staleness"]) for r in updates) >= 1


def test_the_same_config_twice_on_sim_is_byte_identical(tmp_path):
    raw = _raw("mappo", LISTENER, steps=200, workers=2, minibatches=2)
    raw["server"] = {"aggregation": "hogwild", "staleness": {"rule": "poly"}}
    for name in ("one", "two"):
        run_experiment(build_config(copy.deepcopy(raw)), tmp_path / name)
    for fname in ("metrics.csv", "comm.csv"):
        one, two = (tmp_path / "one" / fname).read_bytes(), (tmp_path / "two" / fname).read_bytes()
        assert one == two and one.count(b"\n") > 2, fname


# ----------------------------------------------------------------------------- 11. continuous single agent
PENDULUM = {"run": {"seed": 0, "total_env_steps": 256, "progress": False, "plots": False},
            "backend": {"name": "sim", "workers": 1},
            "scenario": {"name": "gymnasium", "env": "Pendulum-v1", "num_envs": 2},
            "algorithm": {"name": "ppo", "n_steps": 32, "epochs": 2, "minibatches": 2, "init_log_std": -0.5},
            **SMALL_HEADS}


def test_ppo_on_pendulum_learns_a_log_std_and_sends_actions_within_bounds(tmp_path):
    summary = run_experiment(build_config(copy.deepcopy(PENDULUM)), tmp_path / "run")
    assert summary["status"] == "completed" and summary["env_steps"] >= 256
    worker = ActorCriticWorker(build_config(copy.deepcopy(PENDULUM)), 0)
    assert isinstance(worker.actor, LogStd) and isinstance(worker.dist, DiagGaussian)
    assert worker.actor.log_std.requires_grad
    torch.testing.assert_close(worker.actor.log_std.detach(), torch.full((1,), -0.5))
    with torch.no_grad():
        worker.actor.log_std.fill_(1.5)  # std 4.5 against bounds of +-2: most raw samples fall outside
    sent = []
    real_step = worker.env.step

    def recording_step(actions):
        sent.append(np.array(actions, copy=True))
        return real_step(actions)

    worker.env.step = recording_step
    before = worker.flat.numpy().copy()
    batch, _, _ = worker.rollout()
    sent = np.stack(sent)
    assert sent.shape == (32, 2, 1)
    assert np.all(sent >= -2.0) and np.all(sent <= 2.0)
    assert np.any(np.abs(batch["actions"]) > 2.0)  # the loss keeps the unclipped samples
    np.testing.assert_array_equal(sent, np.clip(batch["actions"], -2.0, 2.0))
    worker.learn(batch)
    after = dict(zip([n for n, _ in worker.actor.named_parameters()], worker.actor.parameters()))
    assert not np.allclose(worker.flat.numpy(), before)
    assert after["log_std"].item() != 1.5  # the log-std is trained


# ----------------------------------------------------------------------------- masks and bounds in the team rollout
def test_padded_actions_are_never_taken_even_when_the_actor_prefers_them():
    """speaker_listener with common_spaces: the speaker has 3 real actions of 5; an actor whose logits
    favour the padding (actions 3, 4) by 20 nats still never takes them, and the loss sees the masks."""
    worker = TeamWorker(build_config(_raw("mappo", LISTENER, n_steps=12)), 0)
    last = [m for m in worker.actor.modules() if isinstance(m, nn.Linear)][-1]
    with torch.no_grad():
        last.bias.copy_(torch.tensor([0.0, 0.0, 0.0, 20.0, 20.0]))
    batch, _, _ = worker.rollout()
    N = len(worker.desc.agents)
    speaker = worker.desc.agents.index("speaker_0")
    rows = [e * N + speaker for e in range(len(worker.envs))]
    valid = batch["valid"][:, rows]
    assert valid.sum() > 10
    assert np.all(batch["actions"][:, rows][valid] < 3)
    np.testing.assert_array_equal(batch["avail"][:, rows][valid], np.tile([1, 1, 1, 0, 0], (int(valid.sum()), 1)))
    listener_rows = [e * N + 1 - speaker for e in range(len(worker.envs))]
    assert np.any(batch["actions"][:, listener_rows][batch["valid"][:, listener_rows]] >= 3)  # the bias bites


@pytest.mark.skipif(not HAS_SISL, reason=SISL_REASON)
def test_team_gaussian_actions_are_clipped_to_the_bounds_before_the_env():
    worker = TeamWorker(build_config(_raw("ippo", "sisl/multiwalker-v9", common=False, init_log_std=1.0)), 0)
    assert isinstance(worker.dist, DiagGaussian) and isinstance(worker.actor, LogStd)
    sent = []
    for env in worker.envs:
        real = env.step

        def step(actions, real=real):
            sent.extend(np.asarray(a) for a in actions.values())
            return real(actions)

        env.step = step
    batch, _, _ = worker.rollout()
    sent = np.stack(sent)
    assert sent.shape[1] == 4 and len(sent) > 0
    assert np.all(sent >= -1.0) and np.all(sent <= 1.0)
    assert np.any(np.abs(batch["actions"]) > 1.0)  # raw samples (std e) often leave the box
