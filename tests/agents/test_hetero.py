"""Heterogeneous agents without padding (agents/mappo.py, ``share_params: false`` with spaces that
differ): each agent's networks sized from its own spaces, checked against the spaces themselves, the
heads called directly, a hand-made env that asserts every action it gets, a task whose optimum is
known, a second identical run and a stopped-and-resumed one."""
from __future__ import annotations

import copy
import csv
from typing import Any

import numpy as np
import pytest
import torch
from gymnasium import spaces
from pettingzoo import ParallelEnv
from torch import nn

from agents.mappo import PerAgent, TeamWorker, build_team_models, describe_team, make_env
from marl_q.config import build_config
from marl_q.experiment import run_experiment

HETERO = "tests.agents.test_hetero:HeteroEnv"
LISTENER = "mpe2.simple_speaker_listener_v4:parallel_env"
TEAM = ("ippo", "mappo", "ia2c", "maa2c")
OBS = {"a": 2, "b": 4}
ACTS = {"a": 2, "b": 3}
GOAL = {"a": 1, "b": 2}  # the action each agent is rewarded (1) for


class HeteroEnv(ParallelEnv):
    """Two agents of different observation (2, 4) and action (2, 3) sizes; five steps an episode.
    Each agent's observation is its id times one plus the step, in every column; an agent gets 1 for
    its GOAL action, 0 otherwise. An action outside the agent's own space fails the step."""

    metadata = {"name": "hetero"}

    def __init__(self, max_cycles: int = 5) -> None:
        self.possible_agents, self.agents = ["a", "b"], []
        self.max_cycles, self.t = max_cycles, 0
        self.received: list[dict[str, int]] = []

    def observation_space(self, agent):
        return spaces.Box(-10, 10, (OBS[agent],), np.float32)

    def action_space(self, agent):
        return spaces.Discrete(ACTS[agent])

    def _obs(self) -> dict[str, np.ndarray]:
        return {a: np.full(OBS[a], (i + 1) * (1 + self.t), np.float32) for i, a in enumerate(self.agents)}

    def reset(self, seed=None, options=None):
        self.agents, self.t = list(self.possible_agents), 0
        return self._obs(), {a: {} for a in self.agents}

    def step(self, actions):
        for a, act in actions.items():
            assert self.action_space(a).contains(int(act)), (a, act)
        self.received.append({a: int(x) for a, x in actions.items()})
        self.t += 1
        rew = {a: float(int(actions[a]) == GOAL[a]) for a in self.agents}
        trunc = {a: self.t >= self.max_cycles for a in self.agents}
        obs = self._obs()
        if self.t >= self.max_cycles:
            self.agents = []
        return obs, rew, {a: False for a in rew}, trunc, {a: {} for a in rew}

    def state(self):
        return np.array([self.t, 1.0, 2.0], np.float32)


def _raw(alg: str, env: str = HETERO, *, steps: int = 200, workers: int = 1, share: bool = False,
         kwargs: Any = None, **alg_keys: Any) -> dict:
    algorithm: dict[str, Any] = {"name": alg, "envs_per_worker": 2, "n_steps": 5, "share_params": share}
    if alg in ("ippo", "mappo"):
        algorithm["epochs"] = 2
    algorithm.update(alg_keys)
    return {"run": {"seed": 0, "total_env_steps": steps, "progress": False, "plots": False},
            "backend": {"name": "sim", "workers": workers},
            "scenario": {"name": "pettingzoo", "env": env, "common_spaces": False,
                         "kwargs": ({} if env == HETERO else {"max_cycles": 10}) if kwargs is None else kwargs},
            "algorithm": algorithm,
            "actor": {"head": "mlp", "hidden": [16]}, "critic": {"head": "mlp", "hidden": [16]}}


def _linears(module: nn.Module) -> list[nn.Linear]:
    return [m for m in module.modules() if isinstance(m, nn.Linear)]


# ----------------------------------------------------------------------------- networks
@pytest.mark.parametrize("alg", TEAM)
@pytest.mark.parametrize("env,obs,acts", [
    (HETERO, OBS, ACTS),
    (LISTENER, {"speaker_0": 3, "listener_0": 11}, {"speaker_0": 3, "listener_0": 5})])
def test_each_agents_networks_are_sized_from_its_own_spaces(alg, env, obs, acts):
    cfg = build_config(_raw(alg, env))
    scenario_env = make_env(cfg, 0)
    desc = describe_team(cfg, scenario_env)
    actor, critic, dist = build_team_models(cfg, desc)
    state_dim = int(np.asarray(scenario_env.state()).size)
    assert isinstance(actor, PerAgent) and isinstance(critic, PerAgent)
    assert desc.agents == list(obs) and dist.n == max(acts.values())
    for i, agent in enumerate(desc.agents):
        assert scenario_env.observation_space(agent).shape == (obs[agent],)
        assert scenario_env.action_space(agent).n == acts[agent]
        a_layers, c_layers = _linears(actor.heads[i]), _linears(critic.heads[i])
        assert a_layers[0].in_features == obs[agent] and a_layers[-1].out_features == acts[agent]
        central = alg in ("mappo", "maa2c")
        assert c_layers[0].in_features == (state_dim if central else obs[agent]) and c_layers[-1].out_features == 1


def test_per_agent_heads_of_their_own_sizes_read_their_own_columns_and_pad_their_outputs():
    torch.manual_seed(0)
    heads = [nn.Linear(2, 2), nn.Linear(4, 3)]
    per = PerAgent(heads, [2, 4], 3)
    feats = torch.randn(6, 4)
    agent = torch.tensor([1, 0, 0, 1, 1, 0])
    out = per(torch.cat([feats, torch.eye(2)[agent]], dim=1))
    for row in range(6):
        i = int(agent[row])
        own = heads[i](feats[row:row + 1, :[2, 4][i]])[0]
        torch.testing.assert_close(out[row, :own.shape[0]], own)
        assert torch.all(out[row, own.shape[0]:] == 0)
    out.sum().backward()
    assert all(h.weight.grad is not None and h.weight.grad.abs().sum() > 0 for h in heads)


# ----------------------------------------------------------------------------- rollout
@pytest.mark.parametrize("alg", ["ippo", "mappo"])
def test_actions_stay_in_each_agents_own_space_even_when_the_padding_would_win(alg):
    """Agent a's own two logits are pushed to -20, so its padded third output (0) would win every
    draw if it were not masked: a still never gets action 2 (HeteroEnv asserts every action too)."""
    worker = TeamWorker(build_config(_raw(alg, n_steps=20)), 0)
    a = worker.desc.agents.index("a")
    with torch.no_grad():
        _linears(worker.actor.heads[a])[-1].bias.fill_(-20.0)
    batch, _, _ = worker.rollout()
    N = len(worker.desc.agents)
    for i, agent in enumerate(worker.desc.agents):
        rows = [e * N + i for e in range(len(worker.envs))]
        valid = batch["valid"][:, rows]
        taken = batch["actions"][:, rows][valid]
        assert valid.sum() >= 20 and taken.max() < ACTS[agent]
        expected = np.tile((np.arange(3) < ACTS[agent]).astype(np.float32), (int(valid.sum()), 1))
        np.testing.assert_array_equal(batch["avail"][:, rows][valid], expected)
    b_taken = batch["actions"][:, [e * N + 1 - a for e in range(len(worker.envs))]]
    assert np.any(b_taken == 2)  # b's third action is its own
    received = [step for env in worker.envs for step in env.inner.received]
    assert received and {s["a"] for s in received} <= {0, 1} and {s["b"] for s in received} <= {0, 1, 2}


def test_the_rows_hold_each_agents_own_observation_zero_padded_then_its_id():
    worker = TeamWorker(build_config(_raw("ippo", n_steps=3)), 0)
    batch, _, _ = worker.rollout()
    N, E = 2, len(worker.envs)
    obs = batch["obs"].reshape(4, E, N, -1)  # T + 1 rows; step 0 only reset the copies
    assert obs.shape[-1] == 4 + 2
    for t, env_t in ((1, 0), (2, 1), (3, 2)):  # after the reset, the env's clock t reads env_t
        for i, agent in enumerate(("a", "b")):
            row = obs[t, :, i]
            np.testing.assert_array_equal(row[:, :OBS[agent]], np.full((E, OBS[agent]), (i + 1) * (1 + env_t)))
            np.testing.assert_array_equal(row[:, OBS[agent]:4], 0.0)
            np.testing.assert_array_equal(row[:, 4:], np.tile(np.eye(2)[i], (E, 1)))


# ----------------------------------------------------------------------------- runs
@pytest.mark.parametrize("alg", TEAM)
def test_a_short_run_on_speaker_listener_completes(alg, tmp_path):
    summary = run_experiment(build_config(_raw(alg, LISTENER)), tmp_path / "run")
    assert summary["status"] == "completed" and summary["env_steps"] >= 200
    rows = list(csv.DictReader(open(tmp_path / "run" / "metrics.csv")))
    assert len(rows) == summary["episodes"] > 0 and {int(r["length"]) for r in rows} == {10}


@pytest.mark.parametrize("alg", ["ippo", "maa2c"])
def test_each_agent_learns_its_own_goal_action(alg, tmp_path):
    """Random play scores 5 * (1/2 + 1/3) = 4.17 an episode (standard deviation 1.54, so 0.24 for a
    mean of 40); the optimum, each agent always on its goal action, 10. The last 40 episodes' mean
    above 9 is 20 standard deviations above chance: both agents learnt their own action. The policy
    rebuilt from the run's checkpoint (``load_trained``, each agent's own networks) plays the goal
    actions greedily, and gives the actions beyond an agent's own space no logit and no draw."""
    from marl_q.rundir import load_trained

    run_experiment(build_config(_raw(alg, steps=3000, lr=0.003)), tmp_path / "run")
    returns = [float(r["return"]) for r in csv.DictReader(open(tmp_path / "run" / "metrics.csv"))]
    assert len(returns) >= 500
    assert 9.0 < np.mean(returns[-40:]) <= 10.0
    policy = load_trained(tmp_path / "run")
    obs, _ = HeteroEnv().reset()
    assert policy.agents == ["a", "b"] and policy.act(obs) == GOAL
    logits, probs = policy.logits(obs), policy.probs(obs)
    for agent in ("a", "b"):
        assert np.isneginf(logits[agent][ACTS[agent]:]).all() and np.isfinite(logits[agent][:ACTS[agent]]).all()
        assert probs[agent][ACTS[agent]:].sum() == 0.0 and abs(probs[agent].sum() - 1.0) < 1e-6
    rng = np.random.default_rng(0)
    drawn = [policy.act(obs, rng) for _ in range(300)]
    assert {d["a"] for d in drawn} <= {0, 1} and {d["b"] for d in drawn} <= {0, 1, 2}


def test_the_same_config_twice_on_sim_is_byte_identical(tmp_path):
    raw = _raw("mappo", LISTENER, steps=300, workers=2, minibatches=2)
    for name in ("one", "two"):
        run_experiment(build_config(copy.deepcopy(raw)), tmp_path / name)
    for fname in ("metrics.csv", "comm.csv", "train.csv"):
        one, two = (tmp_path / "one" / fname).read_bytes(), (tmp_path / "two" / fname).read_bytes()
        assert one == two and one.count(b"\n") > 2, fname


def test_a_stopped_and_resumed_run_equals_the_uninterrupted_one(exact_resume):
    exact_resume(lambda: _raw("ippo", LISTENER, steps=600), stop_after=5)


# ----------------------------------------------------------------------------- bad input


@pytest.mark.parametrize("alg", TEAM)
def test_shared_parameters_with_differing_spaces_still_ask_for_common_spaces(alg, cli_run):
    code, err, out = cli_run(_raw(alg, share=True))
    assert code == 2 and not out.exists()
    assert "the agents' observation sizes differ (a: 2, b: 4)" in err and "scenario.common_spaces: true" in err


def test_recurrent_heads_with_own_networks_stay_refused(cli_run):
    raw = _raw("mappo")
    raw["actor"]["recurrent"] = "gru"
    code, err, out = cli_run(raw)
    assert code == 2 and not out.exists()
    assert "actor.recurrent: needs algorithm.share_params: true" in err


class HeteroBoxEnv(HeteroEnv):
    """HeteroEnv's observations with one Box(2) action space for both agents; rewarded for action[0] > 0."""

    def action_space(self, agent):
        return spaces.Box(-1, 1, (2,), np.float32)

    def step(self, actions):
        self.t += 1
        rew = {a: float(actions[a][0] > 0) for a in self.agents}
        for a, act in actions.items():
            assert self.action_space(a).contains(np.asarray(act, np.float32)), (a, act)
        trunc = {a: self.t >= self.max_cycles for a in self.agents}
        obs = self._obs()
        if self.t >= self.max_cycles:
            self.agents = []
        return obs, rew, {a: False for a in rew}, trunc, {a: {} for a in rew}


@pytest.mark.parametrize("alg", ["ippo", "mappo"])
def test_box_actions_with_observations_of_their_own_sizes(alg, tmp_path):
    cfg = build_config(_raw(alg, "tests.agents.test_hetero:HeteroBoxEnv"))
    desc = describe_team(cfg, make_env(cfg, 0))
    actor, _, dist = build_team_models(cfg, desc)
    assert dist.continuous and not desc.masked
    for i, agent in enumerate(desc.agents):
        layers = _linears(actor.heads[i])
        assert layers[0].in_features == OBS[agent] and layers[-1].out_features == 2
    summary = run_experiment(cfg, tmp_path / "run")
    assert summary["status"] == "completed" and summary["env_steps"] >= 200


def test_box_and_discrete_agents_together_are_refused(cli_run):
    code, err, out = cli_run(_raw("ippo", "tests.agents.test_hetero:MixedEnv"))
    assert code == 2 and not out.exists()
    assert "with share_params: false the agents' action spaces must all be Discrete or all the same Box" in err


class MixedEnv(HeteroEnv):
    def action_space(self, agent):
        return spaces.Discrete(2) if agent == "a" else spaces.Box(-1, 1, (2,), np.float32)


def test_greedy_evaluation_takes_each_agents_own_actions(tmp_path):
    """The mode is taken under the same masks (HeteroEnv asserts every action): returns lie in [0, 10]."""
    raw = _raw("mappo", steps=400)
    raw["run"].update({"eval_every": 200, "eval_episodes": 4})
    run_experiment(build_config(raw), tmp_path / "run")
    rows = list(csv.DictReader(open(tmp_path / "run" / "eval.csv")))
    assert len(rows) == 2 and all(0.0 <= float(r["eval_return"]) <= 10.0 for r in rows)
