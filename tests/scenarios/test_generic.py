"""scenario.name: pettingzoo / gymnasium: any env from the scenario file, checked before a run starts."""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
from gymnasium import spaces
from pettingzoo import ParallelEnv
from pettingzoo.test import parallel_api_test

from marl_q.cli import main as cli_main
from marl_q.config import build_config
from marl_q.errors import ConfigError
from scenarios.adapt import FlatParallelEnv
from scenarios.generic import GymnasiumConfig, PettingZooConfig, make_gymnasium, make_parallel

ROOT = Path(__file__).resolve().parents[2]
HAS_SISL = importlib.util.find_spec("pymunk") is not None
SISL_REASON = "needs the optional SISL extra (pymunk, Box2D): pip install -e '.[sisl]'"
REFERENCE = "mpe2.simple_reference_v3:parallel_env"
LISTENER = "mpe2.simple_speaker_listener_v4:parallel_env"


# ----------------------------------------------------------------------------- a user's bad env
class DictObsEnv(ParallelEnv):
    """Two agents whose observations are dicts (what marl-q's heads cannot take)."""

    metadata = {"name": "dict_obs"}

    def __init__(self) -> None:
        self.possible_agents = ["a", "b"]
        self.agents = []

    def observation_space(self, agent):
        return spaces.Dict({"x": spaces.Box(0, 1, (2,))})

    def action_space(self, agent):
        return spaces.Discrete(2)


def raising_factory(**kwargs):
    raise RuntimeError("the simulator licence has expired")


NOT_CALLABLE = 42


def _raw(env: str, **scenario) -> dict:
    return {"run": {"seed": 0, "total_env_steps": 200, "progress": False, "plots": False},
            "backend": {"name": "sim", "workers": 1},
            "scenario": {"name": "pettingzoo", "env": env, **scenario},
            "algorithm": {"name": "iac"}}


# ----------------------------------------------------------------------------- the adapter
@pytest.mark.parametrize("env,common,agent_id", [
    (REFERENCE, False, False), (REFERENCE, False, True), (LISTENER, True, True),
    ("mpe2.simple_adversary_v3:parallel_env", True, False), ("mpe2.simple_reference_v3:env", False, False)])
def test_adapter_passes_the_parallel_api_test(env, common, agent_id):
    parallel_api_test(make_parallel(PettingZooConfig(env=env, common_spaces=common, agent_id=agent_id), seed=0),
                      num_cycles=40)


@pytest.mark.skipif(not HAS_SISL, reason=SISL_REASON)
@pytest.mark.parametrize("env", ["sisl/pursuit-v5", "sisl/multiwalker-v9"])
def test_sisl_envs_by_registered_id_pass_the_parallel_api_test(env):
    adapted = make_parallel(PettingZooConfig(env=env, kwargs={"max_cycles": 50}), seed=0)
    assert all(len(adapted.observation_space(a).shape) == 1 for a in adapted.possible_agents)
    parallel_api_test(adapted, num_cycles=20)


def test_observations_padded_masked_and_tagged_as_by_hand():
    """speaker (obs 3, actions 3) and listener (obs 11, actions 5), padded to 11 + 2 id bits."""
    from mpe2 import simple_speaker_listener_v4

    raw = simple_speaker_listener_v4.parallel_env(continuous_actions=False)
    raw_obs, _ = raw.reset(seed=5)
    env = make_parallel(PettingZooConfig(env=LISTENER, common_spaces=True, agent_id=True), seed=5)
    obs, infos = env.reset(seed=5)
    speaker, listener = env.possible_agents
    assert env.observation_space(speaker).shape == (13,)
    np.testing.assert_array_equal(obs[speaker][:3], raw_obs[speaker])
    np.testing.assert_array_equal(obs[speaker][3:11], np.zeros(8))
    np.testing.assert_array_equal(obs[speaker][11:], [1, 0])
    np.testing.assert_array_equal(obs[listener][:11], raw_obs[listener])
    np.testing.assert_array_equal(obs[listener][11:], [0, 1])
    np.testing.assert_array_equal(infos[speaker]["action_mask"], [1, 1, 1, 0, 0])
    np.testing.assert_array_equal(infos[listener]["action_mask"], [1, 1, 1, 1, 1])
    # a padded action is played as the agent's action 0: the same next observation as action 0
    raw_next, *_ = raw.step({speaker: 0, listener: 2})
    next_obs, *_ = env.step({speaker: 4, listener: 2})
    np.testing.assert_array_equal(next_obs[listener][:11], raw_next[listener])
    np.testing.assert_array_equal(env.state(), raw.state())


def test_state_concat_is_every_agents_observation_in_order():
    env = make_parallel(PettingZooConfig(env=REFERENCE, state="concat", agent_id=True), seed=1)
    obs, _ = env.reset(seed=1)
    state = env.state()
    assert env.state_space.shape == state.shape == (2 * 21,)
    np.testing.assert_array_equal(state, np.concatenate([obs[a][:21] for a in env.possible_agents]))
    env_state = make_parallel(PettingZooConfig(env=REFERENCE, state="env"), seed=1)
    env_state.reset(seed=1)
    np.testing.assert_array_equal(env_state.state(), np.asarray(env_state.inner.state(), np.float32).reshape(-1))


def test_gymnasium_by_id_and_flattened_observations():
    env = make_gymnasium(GymnasiumConfig(env="Pendulum-v1", num_envs=3), seed=0)
    assert env.num_envs == 3 and env.single_observation_space.shape == (3,)
    assert isinstance(env.single_action_space, spaces.Box)
    obs, *_ = env.step(np.zeros((3, 1), np.float32))
    assert obs.shape == (3, 3)
    cfg = GymnasiumConfig(env="tests.scenarios.test_generic:matrix_obs_env", num_envs=2)
    cfg.validate()
    env = make_gymnasium(cfg, seed=0)
    assert env.single_observation_space.shape == (6,)


def matrix_obs_env() -> gym.Env:
    """A one-step env with a (2, 3) Box observation."""

    class Matrix(gym.Env):
        observation_space = spaces.Box(-1, 1, (2, 3), np.float32)
        action_space = spaces.Discrete(2)

        def reset(self, seed=None, options=None):
            super().reset(seed=seed)
            return np.zeros((2, 3), np.float32), {}

        def step(self, action):
            return np.ones((2, 3), np.float32), 1.0, True, False, {}

    return Matrix()


def test_a3c_runs_on_a_gymnasium_id(tmp_path):
    raw = {"run": {"seed": 0, "total_env_steps": 400, "progress": False, "plots": False},
           "backend": {"name": "sim", "workers": 2},
           "scenario": {"name": "gymnasium", "env": "CartPole-v1", "num_envs": 2},
           "algorithm": {"name": "a3c"}}
    from marl_q.experiment import run_experiment

    summary = run_experiment(build_config(raw), tmp_path / "run")
    assert summary["env_steps"] >= 400 and summary["episodes"] > 0


# ----------------------------------------------------------------------------- bad input
@pytest.mark.parametrize("env,kwargs,match", [
    ("no_such_package.envs:make", {}, r"cannot import module 'no_such_package.envs'"),
    ("mpe2.simple_reference_v3:no_such_env", {}, r"module 'mpe2.simple_reference_v3' has no attribute 'no_such_env'"),
    ("tests.scenarios.test_generic:NOT_CALLABLE", {}, r"is not callable"),
    ("tests.scenarios.test_generic:raising_factory", {}, r"raised RuntimeError: the simulator licence has expired"),
    ("tests.scenarios.test_generic:DictObsEnv", {}, r"agent 'a': observation space Dict\(.*not supported"),
    (REFERENCE, {"no_such_kwarg": 1}, r"raised TypeError: .*no_such_kwarg"),
    ("sisl/pursuit-v9", {}, r"did you mean 'sisl/pursuit-v5'"),
    ("simple_reference", {}, r"neither an import path"),
])
def test_bad_envs_are_config_errors_naming_the_problem(env, kwargs, match):
    with pytest.raises(ConfigError, match=match):
        build_config(_raw(env, kwargs=kwargs))


def test_image_observations_are_refused_naming_the_space():
    with pytest.raises(ConfigError, match=r"image observations \(Box\(0, 255, \(96, 96, 3\), uint8\)\)"):
        build_config({**_raw(""), "scenario": {"name": "gymnasium", "env": "tests.scenarios.test_generic:image_env"},
                      "algorithm": {"name": "a3c"}})


def image_env() -> gym.Env:
    class Image(gym.Env):
        observation_space = spaces.Box(0, 255, (96, 96, 3), np.uint8)
        action_space = spaces.Discrete(2)

    return Image()


def test_bad_env_exits_2_and_leaves_no_run_directory(tmp_path, capsys):
    cfg = tmp_path / "bad.yaml"
    cfg.write_text(textwrap.dedent("""
        run: {total_env_steps: 100}
        scenario: {name: pettingzoo, env: "no_such_package.envs:make"}
        algorithm: {name: iac}
    """))
    out = tmp_path / "run"
    assert cli_main(["run", str(cfg), "--out", str(out), "--quiet"]) == 2
    assert "cannot import module 'no_such_package.envs'" in capsys.readouterr().err
    assert not out.exists()


# ----------------------------------------------------------------------------- registration
def _python(code: str, extra_path: Path | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(extra_path) if extra_path else "", str(ROOT),
                                                    env.get("PYTHONPATH", "")) if p)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT, timeout=120)


def test_import_scenarios_registers_every_marlq_env_with_pettingzoo():
    done = _python("import scenarios, pettingzoo\n"
                   "ids = sorted(k for k in pettingzoo.parallel_registry if k.startswith('marlq/'))\n"
                   "print(' '.join(ids))\n"
                   "env = pettingzoo.make('parallel', 'marlq/spread-v0')\n"
                   "print(len(env.possible_agents))")
    assert done.returncode == 0, done.stderr
    ids, n_agents = done.stdout.split("\n")[:2]
    assert {"marlq/spread-v0", "marlq/speaker_listener-v0", "marlq/team_cue-v0", "marlq/penalty_cue-v0"} <= set(ids.split())
    assert n_agents == "3"


def test_an_installed_package_registers_a_scenario_through_its_entry_point(tmp_path):
    """A distribution outside the repository (a dist-info with an entry point on sys.path)."""
    pkg = tmp_path / "my_marlq_plugin"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(textwrap.dedent('''
        from dataclasses import dataclass
        import gymnasium as gym
        from scenarios.spec import ScenarioSpec

        @dataclass
        class TwoCartPoles:
            num_envs: int = 2

        def make(cfg, seed):
            env = gym.make_vec("CartPole-v1", num_envs=cfg.num_envs, vectorization_mode="sync")
            env.reset(seed=seed)
            return env

        SCENARIOS = {"my_cartpole": ScenarioSpec(TwoCartPoles, make, "gym_vector", "a user's own scenario")}
    '''))
    dist = tmp_path / "my_marlq_plugin-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: my-marlq-plugin\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[marl_q.plugins]\nmine = my_marlq_plugin\n")
    done = _python("from marl_q.config import build_config\n"
                   "from marl_q.experiment import run_experiment\n"
                   "cfg = build_config({'run': {'total_env_steps': 100, 'progress': False, 'plots': False},"
                   " 'scenario': {'name': 'my_cartpole'}, 'algorithm': {'name': 'a2c'}})\n"
                   "print(run_experiment(cfg, None)['env_steps'])", extra_path=tmp_path)
    assert done.returncode == 0, done.stderr
    assert int(done.stdout.strip()) >= 100
