"""SpreadNative against mpe2's simple_spread_v3, step by step, plus PettingZoo's API tests."""
from __future__ import annotations

import numpy as np
import pytest
from mpe2 import simple_spread_v3
from pettingzoo.test import parallel_api_test, parallel_seed_test

from scenarios.spread_native import SpreadNative, bench


def _mpe2(n: int, local_ratio: float, max_cycles: int = 25):
    return simple_spread_v3.parallel_env(N=n, local_ratio=local_ratio, max_cycles=max_cycles,
                                         continuous_actions=False)


def _assert_same_dicts(got: dict, want: dict, what: str) -> None:
    assert list(got) == list(want), f"{what}: agents {list(got)} != {list(want)}"
    for agent, w in want.items():
        g = got[agent]
        if isinstance(w, np.ndarray):
            assert g.dtype == w.dtype and g.shape == w.shape, what
            np.testing.assert_allclose(g, w, rtol=0, atol=1e-6, err_msg=f"{what} {agent}")
        elif isinstance(w, float):
            assert abs(g - w) <= 1e-6, f"{what} {agent}: {g} != {w}"
        else:
            assert g == w, f"{what} {agent}: {g!r} != {w!r}"


@pytest.mark.parametrize("n", [2, 3, 4])
@pytest.mark.parametrize("local_ratio", [0.0, 0.5, 1.0])
def test_native_equals_mpe2_step_by_step(n: int, local_ratio: float) -> None:
    ref, nat = _mpe2(n, local_ratio), SpreadNative(n, local_ratio, 25)
    assert nat.possible_agents == ref.possible_agents
    assert nat.state_space == ref.state_space
    for a in ref.possible_agents:
        assert nat.observation_space(a) == ref.observation_space(a)
        assert nat.action_space(a) == ref.action_space(a)
    collisions = 0
    for seed in range(3):
        rng = np.random.default_rng(100 * n + seed)
        # a seeded reset, an unseeded one (continues the RNG stream) and a reseed to a new seed
        for reset_seed in (seed, None, 1000 + seed):
            obs_r, info_r = ref.reset(seed=reset_seed)
            obs_n, info_n = nat.reset(seed=reset_seed)
            _assert_same_dicts(obs_n, obs_r, "reset obs")
            assert info_n == info_r and nat.agents == ref.agents
            np.testing.assert_allclose(nat.state(), ref.state(), rtol=0, atol=1e-6)
            steps = 0
            while ref.agents:
                actions = {a: int(rng.integers(5)) for a in ref.agents}
                want = ref.step(actions)
                got = nat.step(actions)
                for name, g, w in zip(("obs", "rewards", "terminations", "truncations", "infos"), got, want):
                    _assert_same_dicts(g, dict(w), f"N={n} lr={local_ratio} seed={reset_seed} t={steps} {name}")
                assert nat.agents == ref.agents
                np.testing.assert_allclose(nat.state(), ref.state(), rtol=0, atol=1e-6)
                steps += 1
                gap = np.linalg.norm(nat.pos[:, None, :] - nat.pos[None, :, :], axis=-1)
                collisions += int((gap < 0.3).sum()) - n  # pairs in contact (the diagonal is not)
            assert steps == 25 and nat.agents == []
    # the contact force between agents (size 0.15 each) acted in some of the compared steps
    assert collisions > 0


def test_collisions_are_exercised_and_penalised_alike() -> None:
    """With local_ratio 1 the reward is minus the collision count: both engines count the same."""
    ref, nat = _mpe2(4, 1.0), SpreadNative(4, 1.0, 25)
    penalties = 0
    for seed in range(8):
        ref.reset(seed=seed)
        nat.reset(seed=seed)
        rng = np.random.default_rng(seed)
        while nat.agents:
            actions = {a: int(rng.integers(5)) for a in nat.agents}
            _, r_n, *_ = nat.step(actions)
            _, r_r, *_ = ref.step(actions)
            assert r_n == dict(r_r)
            penalties += sum(1 for v in r_n.values() if v < 0)
    assert penalties > 0  # some steps had agents in contact (size 0.15 each)


def test_same_seed_same_episode_and_different_seeds_differ() -> None:
    def rollout(seed: int) -> list[np.ndarray]:
        env = SpreadNative(3, 0.5, 10)
        rng = np.random.default_rng(7)
        obs, _ = env.reset(seed=seed)
        states = [env.state()]
        while env.agents:
            env.step({a: int(rng.integers(5)) for a in env.agents})
            states.append(env.state())
        return states

    a, b, c = rollout(5), rollout(5), rollout(6)
    assert len(a) == 11
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    assert not np.array_equal(a[0], c[0])


def test_passes_pettingzoo_parallel_api_and_seed_tests() -> None:
    parallel_api_test(SpreadNative(3, 0.5, 10), num_cycles=30)
    parallel_seed_test(lambda: SpreadNative(3, 0.5, 10), num_cycles=30)


def test_end_of_episode_and_misuse() -> None:
    env = SpreadNative(2, 0.5, 2)
    with pytest.raises(RuntimeError, match="reset"):
        env.step({"agent_0": 0, "agent_1": 0})
    env.reset(seed=0)
    env.step({"agent_0": 0, "agent_1": 0})
    _, _, term, trunc, _ = env.step({"agent_0": 0, "agent_1": 0})
    assert trunc == {"agent_0": True, "agent_1": True} and not any(term.values()) and env.agents == []
    assert env.step({}) == ({}, {}, {}, {}, {})  # as mpe2's parallel wrapper answers
    env.reset(seed=0)
    with pytest.raises(ValueError, match="agent_1"):
        env.step({"agent_0": 0, "agent_1": 5})
    with pytest.raises(ValueError, match="continuous_actions"):
        SpreadNative(3, continuous_actions=True)


RATE_KEYS = ("mpe2_steps_per_s", "native_steps_per_s")


def test_bench_reports_both_engines() -> None:
    """The benchmark's report is complete and self-consistent (no bound on the rates: tests never time)."""
    r = bench(steps=50)
    mpe2_rate, native_rate = (r[key] for key in RATE_KEYS)
    assert set(r) == {"steps", "speedup", *RATE_KEYS} and r["steps"] == 50
    assert np.isfinite([mpe2_rate, native_rate, r["speedup"]]).all()
    assert r["speedup"] == pytest.approx(native_rate / mpe2_rate)


def test_engine_config_key_dispatches_and_rejects_bad_values() -> None:
    from marl_q.config import load_config
    from marl_q.errors import ConfigError
    from scenarios import SCENARIOS
    from scenarios.mpe import SpreadConfig, spread_env

    assert SpreadConfig().engine == "native"
    assert isinstance(SCENARIOS["spread"].make(SpreadConfig(n_agents=2), seed=0), SpreadNative)
    mpe2_env = SCENARIOS["spread"].make(SpreadConfig(n_agents=2, engine="mpe2"), seed=0)
    assert not isinstance(mpe2_env, SpreadNative) and mpe2_env.metadata["name"] == "simple_spread_v3"
    with pytest.raises(ValueError, match=r"scenario\.engine.*native, mpe2.*'numba'"):
        spread_env(engine="numba")
    cfg = load_config("scenarios/spread_coma.yaml", ["scenario.engine=mpe2"])
    assert cfg.scenario.engine == "mpe2"
    with pytest.raises(ConfigError, match=r"scenario\.engine must be one of native, mpe2"):
        load_config("scenarios/spread_coma.yaml", ["scenario.engine=fast"])
