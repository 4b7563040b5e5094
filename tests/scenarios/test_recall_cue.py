"""The recall cue game (scenarios/recall_cue.py): its rules by hand, and by brute force that its optimum
needs memory (every function of the current observation gets chance, 1/K, in expectation)."""
from __future__ import annotations

import itertools

import numpy as np
import pytest

from marl_q.config import build_config
from marl_q.errors import ConfigError
from scenarios.recall_cue import RecallCueEnv


def _episode(env: RecallCueEnv, policy) -> tuple[float, list[dict]]:
    """One episode with ``policy(agent index, t, obs) -> action``; the team return and the observations seen."""
    obs, _ = env.reset()
    total, seen, t = 0.0, [], 0
    while env.agents:
        seen.append(obs)
        obs, rew, term, trunc, _ = env.step({a: policy(i, t, obs[a]) for i, a in enumerate(env.possible_agents)})
        total += sum(rew.values())
        t += 1
    assert all(term.values()) and not any(trunc.values())
    return total, seen


def test_the_cue_shows_first_then_blanks_then_the_query_and_only_the_query_pays():
    env = RecallCueEnv(n_agents=2, n_cues=3, delay=2)
    env.reset(seed=5)
    total, seen = _episode(env, lambda i, t, o: int(env._cues[i]) if t == 3 else (int(env._cues[i]) + 1) % 3)
    cues = env._cues
    assert total == pytest.approx(1.0) and len(seen) == 4  # cue, 2 blanks, query
    for i, a in enumerate(env.possible_agents):
        assert seen[0][a].tolist() == [float(k == cues[i]) for k in range(3)] + [0.0]
        assert seen[1][a].tolist() == seen[2][a].tolist() == [0.0] * 4
        assert seen[3][a].tolist() == [0.0, 0.0, 0.0, 1.0]
    wrong, _ = _episode(env, lambda i, t, o: (int(env._cues[i]) + 1) % 3)
    assert wrong == 0.0
    half, _ = _episode(env, lambda i, t, o: int(env._cues[i]) if i == 0 else (int(env._cues[i]) + 1) % 3)
    assert half == pytest.approx(0.5)  # each agent earns 1/N


@pytest.mark.parametrize("n_cues,delay", [(2, 0), (2, 3), (3, 1)])
def test_every_policy_of_the_current_observation_gets_chance_and_memory_gets_one(n_cues, delay):
    """Brute force over every deterministic map observation -> action (a stochastic one is a mixture of
    these): the expected team return over the uniformly drawn cues is exactly 1/K for each, while the
    policy that remembers the first observation gets 1."""
    env = RecallCueEnv(n_agents=1, n_cues=n_cues, delay=delay)
    L = delay + 2
    observations = sorted({tuple(env.observation(t, c)) for t in range(L) for c in range(n_cues)})
    best = 0.0
    for table in itertools.product(range(n_cues), repeat=len(observations)):
        policy = dict(zip(observations, table))
        # the return given cue c, averaged over the K equally likely cues
        expected = np.mean([float(policy[tuple(env.observation(L - 1, c))] == c) for c in range(n_cues)])
        best = max(best, expected)
        assert expected == pytest.approx(1.0 / n_cues)
    assert best == pytest.approx(1.0 / n_cues)
    # the same check played in the env: a memoryless policy and a remembering one, many episodes
    env.reset(seed=0)
    rng = np.random.default_rng(1)
    table = {o: int(rng.integers(n_cues)) for o in observations}
    ff = np.mean([_episode(env, lambda i, t, o: table[tuple(o)])[0] for _ in range(3000)])
    assert abs(ff - 1.0 / n_cues) < 4 * np.sqrt((1 / n_cues) * (1 - 1 / n_cues) / 3000)
    memory: dict[int, int] = {}

    def remember(i: int, t: int, o: np.ndarray) -> int:
        if t == 0:
            memory[i] = int(np.argmax(o[:n_cues]))
        return memory[i]

    assert np.mean([_episode(env, remember)[0] for _ in range(200)]) == 1.0


def test_bad_sizes_are_config_errors():
    raw = {"run": {"total_env_steps": 10}, "scenario": {"name": "recall_cue", "n_cues": 1},
           "algorithm": {"name": "mappo"}}
    with pytest.raises(ConfigError, match="n_cues must be at least 2"):
        build_config(raw)
    raw["scenario"] = {"name": "recall_cue", "delay": -1}
    with pytest.raises(ConfigError, match="delay must be a non-negative integer"):
        build_config(raw)
