"""scenarios/small_reward.py: the small-reward tracking task (spaces, episode length, reward bounds,
seeding) and its scenario file, which sets no algorithm, actor or critic key."""
from __future__ import annotations

from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

from marl_q.config import load_config
from scenarios.small_reward import ENV_ID, MAX_REWARD, SmallRewardEnv, scripted_returns, tracking_action

ROOT = Path(__file__).resolve().parents[2]


def rollout(env: gym.Env, seed: int, policy) -> tuple[list[np.ndarray], list[float], list[bool], list[bool]]:
    """One episode from reset(seed); observations, rewards, terminated and truncated flags."""
    obs, _ = env.reset(seed=seed)
    seen, rewards, terms, truncs = [obs], [], [], []
    while True:
        obs, reward, term, trunc, _ = env.step(policy(obs))
        seen.append(obs)
        rewards.append(reward)
        terms.append(term)
        truncs.append(trunc)
        if term or trunc:
            return seen, rewards, terms, truncs


def test_spaces_and_gymnasium_checks():
    env = gym.make(ENV_ID)
    assert env.action_space == gym.spaces.Discrete(3)
    assert env.observation_space.shape == (2,) and env.observation_space.dtype == np.float32
    check_env(SmallRewardEnv(), skip_render_check=True)


def test_episode_is_200_steps_truncated_with_rewards_in_0_to_0_1():
    env = SmallRewardEnv()
    rng = np.random.default_rng(0)
    for seed in range(3):
        obs, rewards, terms, truncs = rollout(env, seed, lambda o: int(rng.integers(3)))
        assert len(rewards) == 200 and truncs[-1] and not any(truncs[:-1]) and not any(terms)
        assert all(0.0 < r <= MAX_REWARD for r in rewards)
        assert all(o.dtype == np.float32 and abs(o[0]) <= 1.0 for o in obs)


def test_band_reward_is_0_or_0_1():
    _, rewards, _, _ = rollout(SmallRewardEnv(band=0.1), 0, tracking_action)
    assert set(rewards) <= {0.0, MAX_REWARD} and MAX_REWARD in rewards


def test_same_seed_same_episode_other_seed_another():
    a = rollout(SmallRewardEnv(), 7, tracking_action)
    b = rollout(SmallRewardEnv(), 7, tracking_action)
    c = rollout(SmallRewardEnv(), 8, tracking_action)
    assert np.array_equal(np.stack(a[0]), np.stack(b[0])) and a[1] == b[1]
    assert not np.array_equal(np.stack(a[0]), np.stack(c[0]))


def test_random_policy_well_below_the_scripted_tracker():
    """What makes it a task: moving towards the observed target earns twice what random actions do."""
    random, tracker = np.mean(scripted_returns("random", 20)), np.mean(scripted_returns("tracking", 20))
    assert 2.0 < random < 7.0 and tracker > 2 * random
    assert scripted_returns("random", 3, seed=5) == scripted_returns("random", 3, seed=5)


@pytest.mark.parametrize("kwargs, needle", [({"max_steps": 0}, "max_steps"), ({"noise": -1.0}, "noise"),
                                            ({"scale": 0.0}, "scale")])
def test_bad_parameters_name_the_key(kwargs, needle):
    with pytest.raises(ValueError, match=needle):
        SmallRewardEnv(**kwargs)


def test_out_of_space_action_is_refused():
    env = SmallRewardEnv()
    env.reset(seed=0)
    with pytest.raises(ValueError, match="action 3"):
        env.step(3)


def test_scenario_file_uses_defaults_only():
    """small_reward_ppo.yaml sets no algorithm knob and no head option: it runs marl-q's defaults."""
    raw = (ROOT / "scenarios" / "small_reward_ppo.yaml").read_text()
    cfg = load_config(ROOT / "scenarios" / "small_reward_ppo.yaml")
    assert cfg.algorithm.name == "ppo" and cfg.scenario.env == ENV_ID
    assert "actor:" not in raw and "critic:" not in raw and "n_steps" not in raw
    assert cfg.actor.out_gain == 0.01 and cfg.critic.out_gain == 1.0
