"""Scripted spread controllers: steering by hand, the assignment against brute force, the scale."""
from __future__ import annotations

import itertools

import numpy as np
import pytest

from scenarios.spread_scripted import POLICIES, episode_returns, joint_action, main, steer, targets


@pytest.mark.parametrize("offset, velocity, action", [
    ((0.5, 0.1), (0.0, 0.0), 2), ((-0.5, 0.1), (0.0, 0.0), 1), ((0.1, 0.5), (0.0, 0.0), 4),
    ((0.1, -0.5), (0.0, 0.0), 3), ((0.01, -0.02), (0.0, 0.0), 0),
    ((0.3, 0.0), (1.0, 0.0), 1),  # moving right fast past a near target: brake
])
def test_steer_moves_toward_the_offset_and_brakes(offset, velocity, action) -> None:
    assert steer(np.array(offset), np.array(velocity)) == action


def _obs(agent_pos: np.ndarray, landmarks: np.ndarray, i: int) -> np.ndarray:
    n = len(agent_pos)
    others = np.concatenate([agent_pos[j] - agent_pos[i] for j in range(n) if j != i])
    return np.concatenate([np.zeros(2), agent_pos[i], (landmarks - agent_pos[i]).ravel(), others, np.zeros(2 * (n - 1))])


@pytest.mark.parametrize("seed", range(5))
def test_assignment_is_the_least_total_distance_permutation(seed: int) -> None:
    rng = np.random.default_rng(seed)
    agents, landmarks = rng.uniform(-1, 1, (3, 2)), rng.uniform(-1, 1, (3, 2))
    obs = [_obs(agents, landmarks, i) for i in range(3)]
    chosen = targets("assignment", obs)
    total = {p: sum(np.linalg.norm(agents[i] - landmarks[p[i]]) for i in range(3)) for p in itertools.permutations(range(3))}
    assert sorted(chosen) == [0, 1, 2]
    assert total[tuple(chosen)] == pytest.approx(min(total.values()), abs=1e-12)
    nearest = targets("nearest", obs)
    assert all(np.linalg.norm(agents[i] - landmarks[nearest[i]]) == pytest.approx(
        np.linalg.norm(agents[i] - landmarks, axis=1).min()) for i in range(3))
    assert targets("by_index", obs) == [0, 1, 2]


def test_the_reference_scale_orders_the_policies_on_the_same_episodes() -> None:
    r = {p: episode_returns(p, 30, seed=7) for p in POLICIES}
    assert r["noop"].mean() < r["nearest"].mean() < r["by_index"].mean() < r["assignment"].mean()
    assert np.array_equal(r["nearest"], episode_returns("nearest", 30, seed=7))  # deterministic


def test_unknown_policy_and_bad_episode_count_are_named(capsys) -> None:
    with pytest.raises(ValueError, match="unknown scripted policy 'random'"):
        joint_action("random", [np.zeros(18)] * 3)
    with pytest.raises(ValueError, match="episodes: must be at least 1"):
        episode_returns("noop", 0)
    with pytest.raises(SystemExit) as exit_info:
        main(["--episodes", "0"])
    assert exit_info.value.code == 2
    assert "--episodes: must be at least 1" in capsys.readouterr().err


def test_run_as_a_module_without_the_package_importing_it_first() -> None:
    """`python -m scenarios.<module>`: the package collects its scenarios on first use, not on import,
    so runpy finds the module not yet imported (no RuntimeWarning) and the scenarios are all there."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-W", "error::RuntimeWarning", "-m", "scenarios.spread_scripted",
                           "--episodes", "1"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "found in sys.modules" not in done.stderr and "by_index" in done.stdout
    import scenarios

    assert {"spread", "cartpole", "penalty_cue"} <= set(scenarios.SCENARIOS)
    with pytest.raises(AttributeError, match="no attribute 'SCENARIO'"):
        scenarios.SCENARIO  # noqa: B018  (a typo is still an AttributeError)
