"""Any PettingZoo or Gymnasium environment, named in the scenario file.

```yaml
scenario:
  name: pettingzoo
  env: mpe2.simple_reference_v3:parallel_env   # an import path "package.module:callable" ...
  # env: sisl/pursuit-v5                       # ... or a PettingZoo-registered id
  # env: mypackage:my_team/Game-v0             # ... or module:EnvId (importing the module registers it)
  kwargs: {max_cycles: 25, continuous_actions: false}
  common_spaces: false    # pad observations and discrete actions to one size (action masks in infos)
  agent_id: false         # append a one-hot agent index to each observation
  state: auto             # auto | concat | env: what the centralised critics see
  teams: {good: agent_, adv: adversary_}  # agent -> team, by prefix or list (marl_q/teams.py)
```

```yaml
scenario:
  name: gymnasium
  env: Pendulum-v1        # a Gymnasium id, "package.module:callable" returning a gymnasium.Env,
                          # or "module:EnvId" (gym_6G:6G-v0), as gymnasium.make takes it
  kwargs: {}
  num_envs: 8             # copies stepped together (gymnasium's SyncVectorEnv)
  agents: auto            # auto | single | tuple: one agent, or Tuple spaces with one entry per agent
  common_reward: false    # tuple envs: every agent receives the mean of the agents' rewards
```

A Gymnasium env whose observation and action spaces are both Tuples of N entries (lbforaging,
rware: ``env: lbforaging:Foraging-8x8-2p-2f-coop-v3``) is a multi-agent env: ``agents: auto``
detects it from the spaces (``tuple`` insists on it, ``single`` refuses it), and the scenario is
then of kind ``parallel``: ``scenarios.adapt.TupleParallelEnv`` reads it as a PettingZoo
ParallelEnv, behind ``FlatParallelEnv`` like any PettingZoo env, for the multi-agent learners (one
env per call; the learner's ``envs_per_worker`` sets the copies and ``num_envs`` is unused).

``module:attr`` is read as Gymnasium reads it: import the module, then call ``attr`` if it is a
callable attribute, else make the id ``attr`` if importing the module registered it. The module is
found as ``python -m`` finds one: in the current directory first, then in the scenario file's
folder, then among the installed packages. The folder it was found in is recorded as
``scenario.module_dir`` (it can also be given, relative to the scenario file), so that worker
processes (local, ray) and ``marlq resume`` import the same file from any directory; it is on
``sys.path`` only while the module is imported and the env made.

The factory is called once when the config is loaded, so that a path that does not import, a
factory that raises, or a space marl-q cannot drive is an error (exit 2) before a run directory
exists; a module of a PettingZoo family that the installed version lacks (``pettingzoo.sisl.waterworld_v4``)
or an unknown id is named with what the installed PettingZoo (or mpe2) has. An AEC environment is
converted with PettingZoo's ``aec_to_parallel``, except a turn-based game (one PettingZoo will not
convert: tictactoe_v3, connect_four_v3), which is played natively (``scenario.turns``, kind ``aec``:
scenarios/aec.py); every parallel env goes through
``scenarios.adapt.FlatParallelEnv`` (flat float32 observations, a global state). Gymnasium
observations are flattened (``FlattenObservation``) when they are a Box of rank > 1.
"""
from __future__ import annotations

import contextlib
import difflib
import functools
import importlib
import importlib.metadata
import importlib.util
import pkgutil
import re
import sys
from dataclasses import dataclass, field
from importlib.machinery import PathFinder
from pathlib import Path
from types import ModuleType
from typing import Any, Callable, Collection, Iterator, Literal, Optional

import gymnasium as gym
import pettingzoo
from pettingzoo import AECEnv, ParallelEnv
from pettingzoo.utils.conversions import aec_to_parallel

from scenarios.adapt import (FlatParallelEnv, SpaceError, TupleParallelEnv, check_action_space, flat_obs_size,
                             tuple_agents)
from scenarios.aec import TurnGame, TurnsConfig, make_turn_game, turn_based_env
from scenarios.spec import ScenarioSpec


def env_forms(what: str) -> str:
    """The forms scenario.env takes, in one clause (for the errors that refuse one)."""
    example, module_example = (("Pendulum-v1", "gym_6G:6G-v0") if what == "Gymnasium"
                               else ("sisl/pursuit-v5", "scenarios.mpe:marlq/spread-v0"))
    return (f"scenario.env takes a registered id ({example}), module:EnvId (importing the module registers "
            f"EnvId: {module_example}) or package.module:callable")


def find_module_dir(env: str, source_dir: Optional[Path] = None) -> Optional[str]:
    """The folder the module of ``env`` (``module:...``) is imported from when it is the user's own file,
    searched as ``python -m`` does: the current directory first, then the scenario file's folder
    ``source_dir``; None for an installed (or already imported) module, or an env that is no import path."""
    module_name, sep, _ = env.partition(":")
    if not sep or not module_name:
        return None
    top = module_name.split(".")[0]
    if top in sys.modules:
        return None
    importlib.invalidate_caches()  # a module written a moment ago (a test, a notebook) is seen
    namespace: Optional[Path] = None
    for folder in [Path.cwd()] + ([Path(source_dir)] if source_dir is not None else []):
        spec = PathFinder.find_spec(top, [str(folder)])
        if spec is None:
            continue
        if spec.origin is not None:  # a module or a regular package
            return str(folder.resolve())
        namespace = namespace or folder  # a folder without __init__.py: yields to an installed package
    if namespace is not None:
        installed = importlib.util.find_spec(top)
        if installed is None or installed.origin is None:
            return str(namespace.resolve())
    return None


@contextlib.contextmanager
def module_path(folder: Optional[str]) -> Iterator[None]:
    """``folder`` first on sys.path while the user's env module is imported and its env made (so the
    module's own imports of files beside it work), and off it again afterwards."""
    if not folder:
        yield
        return
    sys.path.insert(0, folder)
    try:
        yield
    finally:
        try:
            sys.path.remove(folder)  # the first occurrence: the one inserted here
        except ValueError:
            pass


def import_env_module(module_name: str, module_dir: Optional[str] = None) -> ModuleType:
    """Import the module of scenario.env (from ``module_dir`` first when given); a ValueError naming it,
    and for a PettingZoo family what the installed version has, when it does not import."""
    try:
        with module_path(module_dir):
            return importlib.import_module(module_name)
    except ImportError as exc:
        where = f" from {module_dir} or the installed packages" if module_dir else ""
        raise ValueError(f"scenario.env: cannot import module {module_name!r}{where} ({one_line(exc)})"
                         f"{family_hint(module_name, exc)}") from None


def load_factory(path: str, module_dir: Optional[str] = None, what: str = "Gymnasium",
                 registered: Optional[Callable[[], Collection[str]]] = None,
                 make_id: Optional[Callable[..., Any]] = None) -> Callable[..., Any]:
    """What an import path ``module:attr`` names, as a callable taking the scenario's kwargs: the
    attribute when it is callable (``package.module:callable``); else, when importing the module
    registered ``attr`` as an id (``registered()`` lists the ids), ``make_id(attr, **kwargs)``
    (``module:EnvId``, what ``gymnasium.make("module:EnvId")`` does). A ValueError naming the module,
    the attribute and the accepted forms otherwise."""
    module_name, _, attr = path.partition(":")
    if not module_name or not attr:
        raise ValueError(f"scenario.env: {path!r} is not an import path; {env_forms(what)}")
    module = import_env_module(module_name, module_dir)
    obj: Any = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            obj = None
            break
        obj = getattr(obj, part)
    if obj is not None:
        if not callable(obj):
            raise ValueError(f"scenario.env: {path!r} is not callable (a {type(obj).__name__}); {env_forms(what)}")
        return obj
    if registered is not None and make_id is not None and attr in registered():
        return functools.partial(make_id, attr)
    close = difflib.get_close_matches(attr, list(registered()), n=1) if registered is not None else []
    version = _version(module_name.split(".")[0])
    installed = f" {module_name.split('.')[0]} {version} is installed" if version != "?" else ""
    hint = f" (did you mean {module_name}:{close[0]}?{installed})" if close else ""
    raise ValueError(f"scenario.env: module {module_name!r} has no attribute {attr!r} and registers no {what} id "
                     f"{attr!r}{hint}; {env_forms(what)}")


# packages whose import registers multi-agent Gymnasium ids (Tuple spaces), by the ids' prefix; the
# ``epymarl-envs`` extra installs the versions the docs name
TUPLE_ID_PACKAGES = {"Foraging": "lbforaging", "rware-": "rware"}
TUPLE_EXTRA = "pip install 'marl-q[epymarl-envs]'"


def package_ids_hint(env_id: str) -> str:
    """For an unknown Gymnasium id of a package that registers ids when imported (lbforaging, rware):
    the module:EnvId to write, with the closest id the installed version registers, or how to install it."""
    for prefix, package in TUPLE_ID_PACKAGES.items():
        if not env_id.startswith(prefix):
            continue
        if importlib.util.find_spec(package) is None:
            return f"; {prefix}* ids are registered by {package}, which is not installed ({TUPLE_EXTRA})"
        importlib.import_module(package)
        own = [i for i in gym.registry if i.startswith(prefix)]
        close = difflib.get_close_matches(env_id, own, n=1)
        example = close[0] if close else (own[0] if own else env_id)
        return (f"; {prefix}* ids are registered by importing {package} ({package} {_version(package)}): "
                f"write scenario.env: {package}:{example}")
    return ""


def _unknown_id(env: str, registered: list[str], what: str, more: str = "") -> str:
    """The error for an env that is neither an import path nor a known id, with the closest id (and
    ``more``, what the installed version has)."""
    close = difflib.get_close_matches(env, registered, n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    return f"scenario.env: {env!r} is neither an import path nor a registered {what} id{hint}{more}; {env_forms(what)}"


def _call(factory: Callable[..., Any], what: str, kwargs: dict[str, Any]) -> Any:
    try:
        return factory(**kwargs)
    except Exception as exc:  # the user's factory: show its own message
        raise ValueError(f"scenario.env: {what} raised {type(exc).__name__}: {exc}") from None


def one_line(exc: BaseException) -> str:
    """An exception's message on one line."""
    return " ".join(str(exc).split())


def resolve_module_dir(cfg: Any, source_dir: Optional[Path]) -> None:
    """Set ``cfg.module_dir`` (a user-given one made absolute against the scenario file's folder, or the
    folder the env's module was found in); it travels in the config to every worker process and to
    ``marlq resume``, so they all import the same file whatever their current directory."""
    if cfg.module_dir:
        folder = Path(source_dir or Path.cwd()) / Path(cfg.module_dir).expanduser()
        if not folder.is_dir():
            raise ValueError(f"module_dir: {cfg.module_dir!r} is not a folder ({folder})")
        cfg.module_dir = str(folder.resolve())
    else:
        cfg.module_dir = find_module_dir(cfg.env, source_dir)
        module_name = cfg.env.partition(":")[0] if ":" in cfg.env else ""
        top = module_name.split(".")[0]
        if cfg.module_dir is None and top and top not in sys.modules and importlib.util.find_spec(top) is None:
            beside = f", beside the scenario file ({source_dir})" if source_dir is not None else ""
            raise ValueError(f"scenario.env: cannot import module {module_name!r}: no {top}.py or {top}/ in the "
                             f"current directory ({Path.cwd()}){beside} or among the installed packages")


# ----------------------------------------------------------------------------- PettingZoo families
ENV_MODULE = re.compile(r"[a-z0-9_]+_v[0-9]+")
MOVED = {"mpe": "mpe2", "magent": "magent2"}  # families PettingZoo moved into packages of their own


def _env_modules(package: str) -> list[str]:
    """The env modules (``name_vN``) of an installed package, found without importing them."""
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        return []
    if spec is None or not spec.submodule_search_locations:
        return []
    return sorted(m.name for m in pkgutil.iter_modules(spec.submodule_search_locations) if ENV_MODULE.fullmatch(m.name))


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "?"


def pettingzoo_families() -> dict[str, list[str]]:
    """Each env family the installed PettingZoo ships (atari, butterfly, classic, sisl, ...) -> its env modules."""
    found = {m.name: _env_modules(f"pettingzoo.{m.name}") for m in pkgutil.iter_modules(pettingzoo.__path__) if m.ispkg}
    return {name: mods for name, mods in sorted(found.items()) if mods}


def _moved_hint(family: str) -> str:
    """Where a family PettingZoo moved out lives now, and what that package has (when installed)."""
    package = MOVED[family]
    mods = _env_modules(package)
    if not mods:
        return f"; PettingZoo {pettingzoo.__version__} ships no {family}: it moved to the {package} package (not installed)"
    return (f"; PettingZoo {pettingzoo.__version__} ships no {family}: it moved to {package} {_version(package)}, "
            f"which has {', '.join(mods)} (use {package}.<module>:parallel_env)")


def family_hint(module_name: str, exc: BaseException) -> str:
    """For a module of a known PettingZoo family (pettingzoo.sisl.x, pettingzoo.mpe.x, mpe2.x) that is not
    installed: what the installed PettingZoo (or mpe2) has; "" for any other module."""
    parts = module_name.split(".")
    missing = getattr(exc, "name", None)
    if parts[0] in MOVED.values():
        package = parts[0]
        if missing is not None and missing != module_name:
            return ""  # the module is there and lacks something it imports
        mods = _env_modules(package)
        return f"; {package} {_version(package)} has {', '.join(mods)}" if mods else ""
    if parts[0] != "pettingzoo" or len(parts) < 2:
        return ""
    family = parts[1]
    if family in MOVED:
        return _moved_hint(family)
    families = pettingzoo_families()
    if family not in families:
        return (f"; PettingZoo {pettingzoo.__version__} has no family {family!r} (its families: "
                f"{', '.join(families)}; mpe moved to mpe2, magent to magent2)")
    if missing is not None and not module_name.startswith(missing):
        return f"; PettingZoo's {family} envs need its extra: pip install 'pettingzoo[{family}]'"
    return f"; PettingZoo {pettingzoo.__version__}'s {family} has {', '.join(families[family])}"


def registry_hint(env_id: str, registered: list[str]) -> str:
    """For an unknown PettingZoo id: the ids the installed PettingZoo registers in its family, or where a
    moved family went."""
    family = env_id.split("/")[0] if "/" in env_id else ""
    if family in MOVED:
        return _moved_hint(family)
    same = [r for r in registered if r.startswith(f"{family}/")] if family else []
    if same:
        return f"; PettingZoo {pettingzoo.__version__} registers in {family}: {', '.join(same)}"
    families = sorted({r.split("/")[0] for r in registered if "/" in r})
    return f"; the registered families are {', '.join(families)}"


# ----------------------------------------------------------------------------- PettingZoo
@dataclass
class PettingZooConfig:
    """A PettingZoo env by import path or registered id; see the module docstring."""

    env: str = ""
    kwargs: dict[str, Any] = field(default_factory=dict)
    common_spaces: bool = False
    agent_id: bool = False
    state: Literal["auto", "concat", "env"] = "auto"
    module_dir: Optional[str] = None
    # a turn-based (AEC) game's opponents (scenarios/aec.py, TurnsConfig); set, defaults filled in, when
    # validated on such a game: the scenario is then of kind aec
    turns: Optional[dict[str, Any]] = None
    # agent -> team, by lists of agents or name prefixes (marl_q/teams.py); checked against the env's
    # agents by the learners that report per-team returns
    teams: Optional[dict[str, Any]] = None

    def validate(self, source_dir: Optional[Path] = None) -> None:
        if not self.env:
            raise ValueError("env: missing; " + env_forms("PettingZoo"))
        resolve_module_dir(self, source_dir)
        env = raw_env(self)
        if turn_based_env(env):  # played natively (scenarios/aec.py), not converted
            try:
                self.turns = TurnsConfig.from_dict(self.turns).as_dict()
                TurnGame(env)
            finally:
                env.close()
            return
        env.close()
        if self.turns is not None:
            raise ValueError(f"turns: {self.env!r} is not a turn-based game (an AEC env PettingZoo cannot make parallel)")
        make_parallel(self, seed=0).close()  # import, build and check the spaces now, before any run


def _pettingzoo_ids() -> list[str]:
    return sorted(set(pettingzoo.parallel_registry) | set(pettingzoo.aec_registry))


def _make_pettingzoo(env_id: str, **kwargs: Any) -> Any:
    """``pettingzoo.make`` of a registered id, parallel where it is registered so, else AEC."""
    return pettingzoo.make("parallel" if env_id in pettingzoo.parallel_registry else "aec", env_id, **kwargs)


def raw_parallel_env(cfg: PettingZooConfig) -> ParallelEnv:
    """The user's env as a ParallelEnv (AEC converted), before marl-q's adapter."""
    env = raw_env(cfg)
    if isinstance(env, AECEnv):
        env = aec_to_parallel(env)
    if not isinstance(env, ParallelEnv) and not hasattr(env, "possible_agents"):
        raise ValueError(f"scenario.env: {cfg.env!r} returned a {type(env).__name__}, not a PettingZoo env")
    return env


def raw_env(cfg: PettingZooConfig) -> Any:
    """The user's env as its factory returns it."""
    what = "PettingZoo"
    module_dir = getattr(cfg, "module_dir", None)  # absent from a snapshot's config taken before it existed
    with module_path(module_dir):
        if ":" in cfg.env:
            factory = load_factory(cfg.env, module_dir, what, _pettingzoo_ids, _make_pettingzoo)
        else:
            registered = _pettingzoo_ids()
            if cfg.env not in registered:
                raise ValueError(_unknown_id(cfg.env, registered, what, registry_hint(cfg.env, registered)))
            factory = functools.partial(_make_pettingzoo, cfg.env)
        return _call(factory, repr(cfg.env), dict(cfg.kwargs))


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


def pettingzoo_kind(cfg: PettingZooConfig) -> str:
    """``aec`` for a turn-based game (``turns`` set when validated), else ``parallel``."""
    return "aec" if getattr(cfg, "turns", None) is not None else "parallel"


def make_pettingzoo(cfg: PettingZooConfig, seed: int) -> FlatParallelEnv | TurnGame:
    """``make_parallel``, or for a turn-based game its ``scenarios.aec.TurnGame``, reset with ``seed``."""
    if pettingzoo_kind(cfg) == "aec":
        return make_turn_game(raw_env(cfg), seed)
    return make_parallel(cfg, seed)


# ----------------------------------------------------------------------------- Gymnasium
AGENTS = ("auto", "single", "tuple")


@dataclass
class GymnasiumConfig:
    """A Gymnasium env by id or import path, vectorised; or, with Tuple spaces, a multi-agent env;
    see the module docstring."""

    env: str = ""
    kwargs: dict[str, Any] = field(default_factory=dict)
    num_envs: int = 8
    module_dir: Optional[str] = None
    agents: Literal["auto", "single", "tuple"] = "auto"  # resolved to single or tuple when validated
    common_reward: bool = False

    def validate(self, source_dir: Optional[Path] = None) -> None:
        if not self.env:
            raise ValueError("env: missing; " + env_forms("Gymnasium"))
        if self.num_envs < 1:
            raise ValueError(f"num_envs: must be at least 1, got {self.num_envs}")
        resolve_module_dir(self, source_dir)
        # import, build and check the spaces now, before any run; "auto" becomes what the spaces say
        env = checked_env(self)
        self.agents = "tuple" if isinstance(env, FlatParallelEnv) else "single"
        env.close()
        if self.common_reward and self.agents == "single":
            raise ValueError(f"common_reward: true needs a multi-agent env (Tuple spaces); {self.env!r} is single-agent")


def raw_gym_env(cfg: GymnasiumConfig) -> gym.Env:
    """The user's Gymnasium env as its factory returns it."""
    module_dir = getattr(cfg, "module_dir", None)  # absent from a snapshot's config taken before it existed
    with module_path(module_dir):
        if ":" in cfg.env:  # package.module:callable (a function or a class) or module:EnvId
            factory = load_factory(cfg.env, module_dir, "Gymnasium", lambda: gym.registry, gym.make)
        else:
            # lbforaging's and rware's ids exist only in a process that imported the package; a bare id of
            # theirs is refused always, not only in a fresh process, so a config is valid or not whatever
            # was imported before it (workers and `marlq resume` run in fresh processes)
            hint = package_ids_hint(cfg.env)
            if cfg.env not in gym.registry:
                raise ValueError(_unknown_id(cfg.env, list(gym.registry), "Gymnasium", hint))
            if hint:
                raise ValueError(f"scenario.env: {cfg.env!r} is registered only in a process that imported its "
                                 f"package{hint}; {env_forms('Gymnasium')}")
            factory = functools.partial(gym.make, cfg.env)
        env = _call(factory, repr(cfg.env), dict(cfg.kwargs))
    if not isinstance(env, gym.Env):
        raise ValueError(f"scenario.env: {cfg.env!r} returned a {type(env).__name__}, not a gymnasium.Env")
    return env


def checked_env(cfg: GymnasiumConfig) -> gym.Env | FlatParallelEnv:
    """One copy of the configured env, its spaces checked against ``cfg.agents``: a single-agent
    gymnasium.Env (observation flattened), or a Tuple-space env behind TupleParallelEnv and
    FlatParallelEnv (not reset yet)."""
    env = raw_gym_env(cfg)
    agents = getattr(cfg, "agents", "single")  # absent from a snapshot's config taken before it existed
    try:
        n = tuple_agents(env.observation_space, env.action_space)
    except SpaceError as exc:
        env.close()
        raise ValueError(f"scenario.env {cfg.env!r}: {exc}") from None
    if agents == "tuple" and n is None:
        env.close()
        raise ValueError(f"scenario.agents: tuple, but {cfg.env!r} has the observation space {env.observation_space} "
                         f"and the action space {env.action_space}, not Tuples with one entry per agent")
    if agents == "single" and n is not None:
        env.close()
        raise ValueError(f"scenario.agents: single, but {cfg.env!r} is a multi-agent env (Tuple spaces of {n} "
                         "agents); use agents: auto or tuple")
    if n is not None:
        try:
            return FlatParallelEnv(TupleParallelEnv(env, common_reward=getattr(cfg, "common_reward", False)))
        except SpaceError as exc:
            env.close()
            raise ValueError(f"scenario.env {cfg.env!r}: {exc}") from None
    try:
        flat_obs_size("env", env.observation_space)
        check_action_space("env", env.action_space)
    except SpaceError as exc:
        env.close()
        raise ValueError(f"scenario.env {cfg.env!r}: {exc}".replace("agent 'env': ", "")) from None
    if len(env.observation_space.shape) != 1:
        env = gym.wrappers.FlattenObservation(env)
    return env


def single_env(cfg: GymnasiumConfig) -> gym.Env:
    """One copy of a single-agent configured env, observation flattened, spaces checked."""
    env = checked_env(cfg)
    if isinstance(env, FlatParallelEnv):
        env.close()
        raise ValueError(f"scenario.env {cfg.env!r} is a multi-agent env (Tuple spaces): it makes a ParallelEnv")
    return env


def gymnasium_kind(cfg: GymnasiumConfig) -> str:
    """``parallel`` for a multi-agent (Tuple-space) env, ``gym_vector`` for a single-agent one. A config
    not validated (``agents: auto``) is resolved by building one env."""
    agents = getattr(cfg, "agents", "single")
    if agents == "auto":
        env = checked_env(cfg)
        agents = "tuple" if isinstance(env, FlatParallelEnv) else "single"
        env.close()
    return "parallel" if agents == "tuple" else "gym_vector"


def make_gymnasium(cfg: GymnasiumConfig, seed: int) -> gym.vector.VectorEnv | FlatParallelEnv:
    """A single-agent env: ``num_envs`` copies in a SyncVectorEnv (next-step autoreset, Gymnasium's
    default), reset with ``seed``. A multi-agent (Tuple-space) env: one copy as a ParallelEnv
    (``FlatParallelEnv(TupleParallelEnv(env))``), reset with ``seed``."""
    if gymnasium_kind(cfg) == "parallel":
        env = checked_env(cfg)
        env.reset(seed=seed)
        return env
    # partials, not lambdas: a sim checkpoint pickles the workers' environments
    vec = gym.vector.SyncVectorEnv([functools.partial(single_env, cfg) for _ in range(cfg.num_envs)])
    vec.reset(seed=seed)
    return vec


SCENARIOS = {
    "pettingzoo": ScenarioSpec(PettingZooConfig, make_pettingzoo, "parallel",
                               "any PettingZoo env: scenario.env an import path or a registered id",
                               kind_of=pettingzoo_kind),
    "gymnasium": ScenarioSpec(GymnasiumConfig, make_gymnasium, "gym_vector",
                              "any Gymnasium env: scenario.env an id or an import path; single-agent (a2c/a3c/ppo), "
                              "or multi-agent with Tuple spaces (lbforaging, rware: ippo/mappo/...)",
                              kind_of=gymnasium_kind),
}
