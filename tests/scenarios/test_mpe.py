"""mpe2 scenarios: PettingZoo conformance, registration, the common-spaces padding and bad arguments."""
from __future__ import annotations

import numpy as np
import pettingzoo
import pytest
from pettingzoo.test import parallel_api_test, parallel_seed_test

from scenarios import SCENARIOS
from scenarios.mpe import SpeakerListenerConfig, SpreadConfig, speaker_listener_env, spread_env


@pytest.mark.parametrize(
    "factory",
    [lambda: spread_env(3, 10), lambda: speaker_listener_env(10), lambda: speaker_listener_env(10, common_spaces=True)],
    ids=["spread", "speaker_listener", "speaker_listener_common"],
)
def test_passes_parallel_api_and_seed_tests(factory) -> None:
    parallel_api_test(factory(), num_cycles=30)
    parallel_seed_test(factory, num_cycles=30)


def test_spread_shapes_and_state() -> None:
    env = SCENARIOS["spread"].make(SpreadConfig(n_agents=3, max_cycles=25), seed=0)
    obs, _ = env.reset(seed=0)
    assert sorted(obs) == ["agent_0", "agent_1", "agent_2"]
    assert all(o.shape == (18,) for o in obs.values())
    assert env.state().shape == (54,)
    assert all(env.action_space(a).n == 5 for a in env.possible_agents)


def test_common_spaces_pads_observations_and_masks_actions() -> None:
    raw = speaker_listener_env(25)
    assert raw.action_space("speaker_0").n == 3 and raw.action_space("listener_0").n == 5
    env = SCENARIOS["speaker_listener"].make(SpeakerListenerConfig(common_spaces=True), seed=3)
    obs, infos = env.reset(seed=3)
    raw_obs, _ = raw.reset(seed=3)
    assert obs["speaker_0"].shape == (11,)
    np.testing.assert_allclose(obs["speaker_0"][:3], raw_obs["speaker_0"])
    np.testing.assert_array_equal(obs["speaker_0"][3:], 0.0)
    np.testing.assert_allclose(obs["listener_0"], raw_obs["listener_0"])
    assert infos["speaker_0"]["action_mask"].tolist() == [1, 1, 1, 0, 0]
    assert infos["listener_0"]["action_mask"].tolist() == [1, 1, 1, 1, 1]
    # a padded action is played as action 0: the same next state as playing 0 in the raw env
    obs_a, rew_a, *_ = env.step({"speaker_0": 4, "listener_0": 2})
    obs_b, rew_b, *_ = raw.step({"speaker_0": 0, "listener_0": 2})
    np.testing.assert_allclose(obs_a["listener_0"], obs_b["listener_0"])
    assert rew_a == rew_b
    np.testing.assert_allclose(env.state(), raw.state())


def test_registered_with_pettingzoo() -> None:
    env = pettingzoo.make("parallel", "marlq/spread-v0", n_agents=2)
    assert len(env.possible_agents) == 2
    env = pettingzoo.make("parallel", "marlq/speaker_listener-v0", common_spaces=True)
    assert env.action_space("speaker_0").n == 5


@pytest.mark.parametrize(
    "call, key",
    [
        (lambda: spread_env(n_agents=0), "n_agents"),
        (lambda: spread_env(local_ratio=1.5), "local_ratio"),
        (lambda: speaker_listener_env(max_cycles=-1), "max_cycles"),
        (lambda: speaker_listener_env(common_spaces="yes"), "common_spaces"),
    ],
)
def test_bad_arguments_are_named(call, key: str) -> None:
    with pytest.raises(ValueError, match=f"scenario.{key}"):
        call()
