"""The COMA critic check: Monte Carlo action values by hand, the comparison, a run end to end."""
from __future__ import annotations

import numpy as np
import pytest

from analysis.coma_critic import check_run, compare, main, mc_action_values
from marl_q.config import build_config
from marl_q.errors import RunDirError, UserError
from marl_q.experiment import run_experiment


class TwoStepMatch:
    """Two agents, two actions, two steps; agent i earns 1 per step it plays action i."""

    def __init__(self) -> None:
        self.agents, self.t = ["a0", "a1"], 0

    def step(self, actions):
        rewards = {a: float(actions[a] == i) for i, a in enumerate(["a0", "a1"])}
        self.t += 1
        if self.t == 2:
            self.agents = []
        return {a: np.zeros(1) for a in self.agents}, rewards, {}, {}, {}


def _team(rewards):
    return sum(rewards.values())


def test_monte_carlo_values_are_exact_under_a_deterministic_policy() -> None:
    always_one = lambda obs: np.array([[0.0, 1.0], [0.0, 1.0]])  # noqa: E731
    values = mc_action_values(TwoStepMatch(), {}, np.array([1, 1]), 0, always_one, _team, 0.9, 1,
                              np.random.default_rng(0))
    # agent 0: step 1 earns [u'==0] + 1 (agent 1 plays 1); step 2 both play 1: 0 + 1, discounted by 0.9
    assert values.tolist() == pytest.approx([2.0 + 0.9, 1.0 + 0.9])


def test_monte_carlo_values_average_the_policy_after_the_first_step() -> None:
    uniform = lambda obs: np.full((2, 2), 0.5)  # noqa: E731
    values = mc_action_values(TwoStepMatch(), {}, np.array([0, 0]), 1, uniform, _team, 0.5, 4000,
                              np.random.default_rng(1))
    # agent 1, u'=0: step 1 earns 1 (agent 0 plays 0) + 0; u'=1: 1 + 1; step 2: expected 0.5 + 0.5 = 1, x 0.5
    # the second-step sum has variance 0.5, so the mean over 4000 copies has std 0.5 * sqrt(0.5 / 4000) ~ 0.006
    assert values.tolist() == pytest.approx([1.5, 2.5], abs=0.04)


def test_compare_measures_agreement() -> None:
    rng = np.random.default_rng(2)
    truth = rng.normal(size=(50, 5))
    same = compare(truth * 3.0, truth)
    assert same["correlation"] == pytest.approx(1.0) and same["argmax_agreement"] == 1.0
    flipped = compare(-truth, truth)
    assert flipped["correlation"] == pytest.approx(-1.0) and flipped["argmax_agreement"] == 0.0
    # halves that agree perfectly: reliability 1, ceiling 1; independent noise halves: about 0
    assert compare(truth, truth, (truth, truth))["mc_ceiling"] == pytest.approx(1.0)
    noise = compare(truth, truth, (rng.normal(size=(2000, 5)), rng.normal(size=(2000, 5))))
    assert abs(noise["mc_reliability"]) < 0.1 and noise["mc_ceiling"] < 0.25
    # halves each carrying the signal plus unit noise: r = 1/2, R = 2/3 (Spearman-Brown), ceiling sqrt(2/3)
    signal = rng.normal(size=(20000, 5))
    noisy = compare(signal, signal, (signal + rng.normal(size=signal.shape), signal + rng.normal(size=signal.shape)))
    assert noisy["mc_reliability"] == pytest.approx(2 / 3, abs=0.02)
    assert noisy["mc_ceiling"] == pytest.approx(np.sqrt(2 / 3), abs=0.02)
    noop = np.zeros((4, 5))
    noop[:, 0] = 1.0
    assert compare(noop, truth[:4])["critic_argmax_noop"] == 1.0


def _tiny_run(tmp_path, algorithm: str):
    raw = {
        "run": {"seed": 0, "total_env_steps": 100, "progress": False, "plots": False},
        "backend": {"name": "sim", "workers": 2},
        "server": {"aggregation": "buffered", "buffer_k": 2},
        "scenario": {"name": "team_cue", "n_agents": 3, "n_cues": 3, "episode_length": 5},
        "algorithm": {"name": algorithm, "eval_episodes": 1, "gamma": 0.0},
        "actor": {"head": "mlp", "hidden": [8]},
        "critic": {"head": "mlp", "hidden": [8]},
    }
    out = tmp_path / algorithm
    run_experiment(build_config(raw), out=out)
    return out


def test_a_coma_run_is_checked_end_to_end_and_other_runs_are_refused(tmp_path, capsys) -> None:
    run = _tiny_run(tmp_path, "coma")
    r = check_run(run, states=3, rollouts=1, max_t=3)
    assert r["pairs"] == 9  # 3 states x 3 agents
    assert -1.0 <= r["correlation"] <= 1.0 and len(r["mc_mean_by_action"]) == 3
    assert r["mc_reliability"] is None  # one rollout: no halves to compare
    assert main([str(run), "--states", "2", "--rollouts", "1", "--max-t", "3"]) == 0
    assert "correlation of the critic's advantages" in capsys.readouterr().out
    with pytest.raises(UserError, match="has no per-action critic"):
        check_run(_tiny_run(tmp_path, "iac"))
    with pytest.raises(RunDirError, match="not a run directory"):
        check_run(tmp_path / "nowhere")
    with pytest.raises(UserError, match="rollouts: must be at least 1"):
        check_run(run, rollouts=0)
    assert main([str(tmp_path / "nowhere")]) == 2
    assert "not a run directory" in capsys.readouterr().err
