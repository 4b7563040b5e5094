"""Any PettingZoo or Gymnasium environment, named in the scenario file.

```yaml
scenario:
  name: pettingzoo
  env: mpe2.simple_reference_v3:parallel_env   # an import path "package.module:callable" ...
  # env: sisl/pursuit-v5                       # ... or a PettingZoo-registered id
  kwargs: {max_cycles: 25, continuous_actions: false}
  common_spaces: false    # pad observations and discrete actions to one size (action masks in infos)
  agent_id: false         # append a one-hot agent index to each observation
  state: auto             # auto | concat | env: what the centralised critics see
```

```yaml
scenario:
  name: gymnasium
  env: Pendulum-v1        # a Gymnasium id, or "package.module:callable" returning a gymnasium.Env
  kwargs: {}
  num_envs: 8             # copies stepped together (gymnasium's SyncVectorEnv)
```

The factory is called once when the config is loaded, so that a path that does not import, a
factory that raises, or a space marl-q cannot drive is an error (exit 2) before a run directory
exists. An AEC environment is converted with PettingZoo's ``aec_to_parallel``; every parallel env
goes through ``scenarios.adapt.FlatParallelEnv`` (flat float32 observations, a global state).
Gymnasium observations are flattened (``FlattenObservation``) when they are a Box of rank > 1.
"""
from __future__ import annotations

import difflib
import functools
import importlib
from dataclasses import dataclass, field
from typing import Any, Callable, Literal

import gymnasium as gym
import pettingzoo
from pettingzoo import AECEnv, ParallelEnv
from pettingzoo.utils.conversions import aec_to_parallel

from scenarios.adapt import FlatParallelEnv, SpaceError, check_action_space, flat_obs_size
from scenarios.spec import ScenarioSpec


def load_factory(path: str, key: str = "scenario.env") -> Callable[..., Any]:
    """The callable an import path ``package.module:attr`` names; a ValueError that names the module
    or the attribute when it does not import or is not callable."""
    module_name, _, attr = path.partition(":")
    if not module_name or not attr:
        raise ValueError(f"{key}: {path!r} is not an import path of the form package.module:callable")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"{key}: cannot import module {module_name!r} ({exc})") from None
    obj: Any = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ValueError(f"{key}: module {module_name!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise ValueError(f"{key}: {path!r} is not callable (a {type(obj).__name__})")
    return obj


def _unknown_id(env: str, registered: list[str], what: str) -> str:
    """The error for an env that is neither an import path nor a known id, with the closest id."""
    close = difflib.get_close_matches(env, registered, n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    return f"scenario.env: {env!r} is neither an import path (package.module:callable) nor a {what} id{hint}"


def _call(factory: Callable[..., Any], what: str, kwargs: dict[str, Any]) -> Any:
    try:
        return factory(**kwargs)
    except Exception as exc:  # the user's factory: show its own message
        raise ValueError(f"scenario.env: {what} raised {type(exc).__name__}: {exc}") from None


# ----------------------------------------------------------------------------- PettingZoo
@dataclass
class PettingZooConfig:
    """A PettingZoo env by import path or registered id; see the module docstring."""

    env: str = ""
    kwargs: dict[str, Any] = field(default_factory=dict)
    common_spaces: bool = False
    agent_id: bool = False
    state: Literal["auto", "concat", "env"] = "auto"

    def validate(self) -> None:
        if not self.env:
            raise ValueError("env: missing; an import path (mpe2.simple_reference_v3:parallel_env) or a "
                             "PettingZoo-registered id (sisl/pursuit-v5)")
        make_parallel(self, seed=0).close()  # import, build and check the spaces now, before any run


def raw_parallel_env(cfg: PettingZooConfig) -> ParallelEnv:
    """The user's env as a ParallelEnv (AEC converted), before marl-q's adapter."""
    if ":" in cfg.env:
        env = _call(load_factory(cfg.env), repr(cfg.env), dict(cfg.kwargs))
    else:
        registered = sorted(set(pettingzoo.parallel_registry) | set(pettingzoo.aec_registry))
        if cfg.env not in registered:
            raise ValueError(_unknown_id(cfg.env, registered, "PettingZoo-registered"))
        kind = "parallel" if cfg.env in pettingzoo.parallel_registry else "aec"
        env = _call(lambda **kw: pettingzoo.make(kind, cfg.env, **kw), repr(cfg.env), dict(cfg.kwargs))
    if isinstance(env, AECEnv):
        env = aec_to_parallel(env)
    if not isinstance(env, ParallelEnv) and not hasattr(env, "possible_agents"):
        raise ValueError(f"scenario.env: {cfg.env!r} returned a {type(env).__name__}, not a PettingZoo env")
    return env


def make_parallel(cfg: PettingZooConfig, seed: int) -> FlatParallelEnv:
    """The configured env behind marl-q's adapter, reset with ``seed``."""
    inner = raw_parallel_env(cfg)
    try:
        env = FlatParallelEnv(inner, common_spaces=cfg.common_spaces, agent_id=cfg.agent_id, state=cfg.state)
    except SpaceError as exc:
        inner.close()
        raise ValueError(f"scenario.env {cfg.env!r}: {exc}") from None
    env.reset(seed=seed)
    return env


# ----------------------------------------------------------------------------- Gymnasium
@dataclass
class GymnasiumConfig:
    """A Gymnasium env by id or import path, vectorised; see the module docstring."""

    env: str = ""
    kwargs: dict[str, Any] = field(default_factory=dict)
    num_envs: int = 8

    def validate(self) -> None:
        if not self.env:
            raise ValueError("env: missing; a Gymnasium id (Pendulum-v1) or an import path package.module:callable")
        if self.num_envs < 1:
            raise ValueError(f"num_envs: must be at least 1, got {self.num_envs}")
        single_env(self).close()  # import, build and check the spaces now, before any run


def single_env(cfg: GymnasiumConfig) -> gym.Env:
    """One copy of the configured env, observation flattened, spaces checked."""
    if ":" in cfg.env:  # package.module:callable (a function or a class)
        env = _call(load_factory(cfg.env), repr(cfg.env), dict(cfg.kwargs))
    else:
        if cfg.env not in gym.registry:
            raise ValueError(_unknown_id(cfg.env, list(gym.registry), "registered Gymnasium"))
        env = _call(lambda **kw: gym.make(cfg.env, **kw), repr(cfg.env), dict(cfg.kwargs))
    if not isinstance(env, gym.Env):
        raise ValueError(f"scenario.env: {cfg.env!r} returned a {type(env).__name__}, not a gymnasium.Env")
    try:
        flat_obs_size("env", env.observation_space)
        check_action_space("env", env.action_space)
    except SpaceError as exc:
        env.close()
        raise ValueError(f"scenario.env {cfg.env!r}: {exc}".replace("agent 'env': ", "")) from None
    if len(env.observation_space.shape) != 1:
        env = gym.wrappers.FlattenObservation(env)
    return env


def make_gymnasium(cfg: GymnasiumConfig, seed: int) -> gym.vector.VectorEnv:
    """``num_envs`` copies in a SyncVectorEnv (next-step autoreset, Gymnasium's default), reset with ``seed``."""
    # partials, not lambdas: a sim checkpoint pickles the workers' environments
    env = gym.vector.SyncVectorEnv([functools.partial(single_env, cfg) for _ in range(cfg.num_envs)])
    env.reset(seed=seed)
    return env


SCENARIOS = {
    "pettingzoo": ScenarioSpec(PettingZooConfig, make_parallel, "parallel",
                               "any PettingZoo env: scenario.env an import path or a registered id"),
    "gymnasium": ScenarioSpec(GymnasiumConfig, make_gymnasium, "gym_vector",
                              "any Gymnasium env (a2c/a3c/ppo): scenario.env an id or an import path"),
}
