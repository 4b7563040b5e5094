"""The penalty cue game: PettingZoo conformance, its reward against hand-computed cases, bad sizes."""
from __future__ import annotations

import numpy as np
import pettingzoo
import pytest
from pettingzoo.test import parallel_api_test, parallel_seed_test

from scenarios import SCENARIOS
from scenarios.penalty_cue import PenaltyCueConfig, PenaltyCueEnv, agent_payoffs


def test_passes_parallel_api_test() -> None:
    parallel_api_test(PenaltyCueEnv(n_agents=3, n_cues=3, episode_length=5), num_cycles=40)


def test_passes_parallel_seed_test() -> None:
    parallel_seed_test(lambda: PenaltyCueEnv(n_agents=3, n_cues=3, episode_length=5), num_cycles=40)


def test_registered_with_pettingzoo_and_marl_q() -> None:
    env = pettingzoo.make("parallel", "marlq/penalty_cue-v0", n_agents=2)
    assert env.possible_agents == ["agent_0", "agent_1"]
    assert env.action_space("agent_0").n == 4  # 3 answers + abstain
    assert SCENARIOS["penalty_cue"].kind == "parallel"
    made = SCENARIOS["penalty_cue"].make(PenaltyCueConfig(n_agents=4), seed=1)
    assert len(made.possible_agents) == 4


def test_agent_payoffs_by_hand() -> None:
    # K = 3, cues (2, 0, 1, 1): right answers (2+0, 0+1, 1+2, 1+3) mod 3 = (2, 1, 0, 1); abstain is 3.
    cues = np.array([2, 0, 1, 1])
    assert agent_payoffs(cues, np.array([2, 1, 0, 1]), 3, 0.5).tolist() == [1.0, 1.0, 1.0, 1.0]
    assert agent_payoffs(cues, np.array([2, 0, 3, 2]), 3, 0.5).tolist() == [1.0, -0.5, 0.0, -0.5]
    assert agent_payoffs(cues, np.array([3, 3, 3, 3]), 3, 2.0).tolist() == [0.0, 0.0, 0.0, 0.0]
    assert agent_payoffs(cues, np.array([0, 0, 1, 0]), 3, 0.0).tolist() == [0.0, 0.0, 0.0, 0.0]


def test_team_reward_is_the_mean_payoff_for_every_agent_and_the_game_terminates() -> None:
    env = PenaltyCueEnv(n_agents=4, n_cues=3, episode_length=2, penalty=0.5)
    obs, _ = env.reset(seed=7)
    cues = [int(np.argmax(obs[a])) for a in env.possible_agents]
    state = env.state()
    assert [int(np.argmax(row)) for row in state[:12].reshape(4, 3)] == cues
    assert state[12:].tolist() == [1.0, 0.0]  # round 0 of 2
    right = [(c + i) % 3 for i, c in enumerate(cues)]
    # agent 0 right (+1), agent 1 wrong (-0.5), agent 2 abstains (0), agent 3 right (+1): mean 1.5 / 4
    actions = {"agent_0": right[0], "agent_1": (right[1] + 1) % 3, "agent_2": 3, "agent_3": right[3]}
    _, rewards, terminated, truncated, _ = env.step(actions)
    assert rewards == {a: 0.375 for a in env.possible_agents}
    assert not any(terminated.values()) and not any(truncated.values())
    obs, _, terminated, truncated, _ = env.step({a: 3 for a in env.possible_agents})
    assert all(terminated.values()) and not any(truncated.values()) and env.agents == []


def test_optimal_play_earns_one_per_round() -> None:
    env = PenaltyCueEnv(n_agents=5, n_cues=4, episode_length=3, penalty=1.0)
    obs, _ = env.reset(seed=3)
    total = 0.0
    while env.agents:
        acts = {a: (int(np.argmax(obs[a])) + i) % 4 for i, a in enumerate(env.agents)}
        obs, rewards, *_ = env.step(acts)
        total += rewards["agent_0"]
    assert total == 3.0


def test_without_cues_it_is_the_repeated_penalty_matrix_game() -> None:
    env = PenaltyCueEnv(n_agents=4, n_cues=3, episode_length=2, penalty=0.5, cues=False)
    obs, _ = env.reset(seed=5)
    assert all(o.tolist() == [1.0, 0.0, 0.0] for o in obs.values()) and env.state()[:12].sum() == 4
    # right answers i mod 3 = (0, 1, 2, 0): two right, one wrong, one abstaining -> (1 + 1 - 0.5 + 0) / 4
    _, rewards, *_ = env.step({"agent_0": 0, "agent_1": 1, "agent_2": 0, "agent_3": 3})
    assert rewards["agent_0"] == 0.375 and env.state()[12:].tolist() == [0.0, 1.0]
    obs, *_ = env.step({a: 3 for a in env.possible_agents})
    assert all(o.tolist() == [1.0, 0.0, 0.0] for o in obs.values())


def test_shipped_scenario_file_loads() -> None:
    from pathlib import Path

    from marl_q.config import load_config

    cfg = load_config(str(Path(__file__).parents[2] / "scenarios" / "penalty_cue_coma.yaml"), [], seed=0)
    assert cfg.scenario.name == "penalty_cue" and cfg.scenario.cues is False and cfg.scenario.n_agents == 50


@pytest.mark.parametrize(
    "kwargs, key",
    [({"n_agents": 0}, "n_agents"), ({"n_cues": 1}, "n_cues"), ({"episode_length": 2.5}, "episode_length"),
     ({"penalty": -1.0}, "penalty"), ({"penalty": float("nan")}, "penalty"), ({"cues": 0}, "cues")],
)
def test_bad_sizes_are_named(kwargs: dict, key: str) -> None:
    with pytest.raises(ValueError, match=f"scenario.{key}"):
        PenaltyCueEnv(**kwargs)


def test_bad_actions_are_rejected() -> None:
    env = PenaltyCueEnv(n_agents=2, n_cues=2, episode_length=1)
    env.reset(seed=0)
    with pytest.raises(ValueError, match="0..2"):
        env.step({"agent_0": 3, "agent_1": 0})
    with pytest.raises(ValueError, match="one action per live agent"):
        env.step({"agent_0": 0})
