"""The team cue game: PettingZoo conformance, its reward by hand, its state, bad sizes."""
from __future__ import annotations

import numpy as np
import pettingzoo
import pytest
from pettingzoo.test import parallel_api_test, parallel_seed_test

from scenarios import SCENARIOS
from scenarios.team_cue import TeamCueConfig, TeamCueEnv


def test_passes_parallel_api_test() -> None:
    parallel_api_test(TeamCueEnv(n_agents=3, n_cues=3, episode_length=5), num_cycles=40)


def test_passes_parallel_seed_test() -> None:
    parallel_seed_test(lambda: TeamCueEnv(n_agents=3, n_cues=3, episode_length=5), num_cycles=40)


def test_registered_with_pettingzoo_and_marl_q() -> None:
    env = pettingzoo.make("parallel", "marlq/team_cue-v0", n_agents=2)
    assert env.possible_agents == ["agent_0", "agent_1"]
    assert SCENARIOS["team_cue"].kind == "parallel"
    made = SCENARIOS["team_cue"].make(TeamCueConfig(n_agents=4), seed=1)
    assert len(made.possible_agents) == 4


def test_team_reward_is_the_fraction_of_agents_answering_cue_plus_index_mod_k() -> None:
    env = TeamCueEnv(n_agents=4, n_cues=3, episode_length=2)
    obs, _ = env.reset(seed=7)
    cues = {a: int(np.argmax(o)) for a, o in obs.items()}
    state = env.state().reshape(4, 3)
    assert [int(np.argmax(row)) for row in state] == [cues[a] for a in env.possible_agents]
    # agent i's right answer is (cue_i + i) mod 3; agents 0 and 2 answer right, 1 and 3 do not.
    right = {a: (cues[a] + i) % 3 for i, a in enumerate(env.possible_agents)}
    actions = {a: right[a] if i in (0, 2) else (right[a] + 1) % 3 for i, a in enumerate(env.possible_agents)}
    _, rewards, terminated, truncated, _ = env.step(actions)
    assert rewards == {a: 0.5 for a in env.possible_agents}
    assert not any(terminated.values()) and not any(truncated.values())
    _, _, _, truncated, _ = env.step({a: 0 for a in env.possible_agents})
    assert all(truncated.values()) and env.agents == []


def test_without_id_shift_the_right_answer_is_the_cue_for_everyone() -> None:
    env = TeamCueEnv(n_agents=3, n_cues=3, episode_length=1, id_shift=False)
    obs, _ = env.reset(seed=2)
    _, rewards, *_ = env.step({a: int(np.argmax(o)) for a, o in obs.items()})
    assert rewards == {a: 1.0 for a in env.possible_agents}


@pytest.mark.parametrize(
    "kwargs, key",
    [({"n_agents": 0}, "n_agents"), ({"n_cues": 1}, "n_cues"), ({"episode_length": 2.5}, "episode_length"),
     ({"id_shift": 1}, "id_shift")],
)
def test_bad_sizes_are_named(kwargs: dict, key: str) -> None:
    with pytest.raises(ValueError, match=f"scenario.{key}"):
        TeamCueEnv(**kwargs)


def test_action_out_of_range_is_rejected_with_the_range() -> None:
    env = TeamCueEnv(n_agents=2, n_cues=3)
    env.reset(seed=0)
    with pytest.raises(ValueError, match="0..2"):
        env.step({"agent_0": 3, "agent_1": 0})
