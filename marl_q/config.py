"""Scenario files -> a typed, validated config with defaults filled.

A scenario file has fixed sections (`run`, `backend`, `server`) and chosen sections whose schema
comes from a registry: `scenario.name`, `algorithm.name`, `actor.head`, `critic.head`. Every value
is checked against its field's type where it enters; a mistake names the dotted key, the value and
what was expected, and an unknown key suggests the closest valid one.
"""
from __future__ import annotations

import dataclasses
import difflib
import inspect
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Optional, Sequence, Union

import yaml

from marl_q.errors import RAY_MISSING, ConfigError
from marl_q.quantum import QPUConfig
from marl_q.registry import ALGORITHMS, BACKENDS, HEADS, SCENARIOS, Registry, unknown_choice_message


# ----------------------------------------------------------------------------- fixed sections
@dataclass
class RunConfig:
    """What to run for how long, and what to keep."""

    seed: int = 0
    total_env_steps: Optional[int] = None  # the run stops at whichever budget is reached first
    total_episodes: Optional[int] = None
    checkpoint_every: int = 0  # server updates between checkpoints; 0 = only at the end
    keep_checkpoints: int = 2  # the newest this many are kept (older ones pruned once a new one reads back)
    # stop cleanly after this many server updates (checkpoint, status "stopped"), to be continued with
    # `marlq resume RUN_DIR` (e.g. in time-limited job slots); resume ignores it unless set again
    stop_after_updates: Optional[int] = None
    progress: bool = True  # a progress bar on stderr
    solve_return: Optional[float] = None  # a training mean that counts as solved (CartPole: 475)
    solve_window: int = 100  # episodes in that mean
    plots: bool = True  # draw plots into the run directory when the run ends
    # every this many env steps: eval_episodes greedy episodes of the current policy -> eval.csv
    eval_every: Optional[int] = None
    eval_episodes: int = 10
    tensorboard: bool = False  # also log every row written as TensorBoard scalars (marl_q/tracking.py)
    # when the run completes, keep comm.csv, train.csv and their wall-clock sidecars gzip-compressed
    # (marl_q/rundir.py: about a fifth of the bytes; every marl-q reader opens either form)
    compress_logs: bool = False
    report_team: Optional[str] = None  # the team whose return is `return` (marl_q/teams.py); default: the first


@dataclass
class ComputeProfile:
    """Virtual compute time of a worker's step in `sim`: cost * step_s * factor * lognormal jitter."""

    step_s: float = 1e-4  # virtual seconds per unit of cost (one env step for actor-critic)
    jitter: float = 0.0  # sigma of a mean-one lognormal factor
    stragglers: list[int] = field(default_factory=list)  # worker indices that run slower
    straggler_factor: float = 1.0  # how much slower
    # `constant`: workers differ only by the factors above; `lognormal`: worker i's steps also take a
    # factor drawn once per worker from a mean-one lognormal of sigma `speed_sigma` (seeded by run.seed)
    speeds: Literal["constant", "lognormal"] = "constant"
    speed_sigma: float = 1.0


@dataclass
class NetworkProfile:
    """Virtual delay of a message in `sim`: latency + bytes / bandwidth, times lognormal jitter."""

    latency_s: float = 1e-3
    bandwidth_bytes_per_s: float = 1.25e8  # 1 Gb/s
    jitter: float = 0.0


@dataclass
class FaultConfig:
    """Faults injected into the network and workers; each is a ledger row (kind ``fault:<name>``).

    sim: a lost worker->server message is resent by the worker's transport after `retransmit_s`
    (so a loss shows up as delay plus a resend); a duplicated one arrives a second time
    `dup_delay_s` later (the server applies it at most once). A crashed worker loses its state and
    in-flight work and comes back `restart_s` later as a fresh worker that says hello.
    local and ray: only `duplicate` (the backend hands a worker's message to the server a second
    time, right after the first, drawn from a generator seeded by run.seed); to kill worker
    processes there, use `backend.kill`.
    """

    loss: float = 0.0
    retransmit_s: float = 0.05
    duplicate: float = 0.0
    dup_delay_s: float = 0.01
    spike_p: float = 0.0  # probability of a delay spike on any message
    spike_s: float = 0.1
    crash: dict[int, float] = field(default_factory=dict)  # worker index -> virtual time of a crash
    restart_s: float = 0.1
    # a worker leaves when a step ends with this probability (its push is never sent) and rejoins with
    # its state after an exponential time of mean `rejoin_s`, saying hello for fresh parameters
    dropout: float = 0.0
    rejoin_s: float = 1.0

    def validate(self) -> None:
        for key in ("loss", "duplicate", "spike_p", "dropout"):
            if not 0.0 <= getattr(self, key) < 1.0:
                raise ValueError(f"{key}: a probability in [0, 1), got {getattr(self, key)}")
        for key in ("retransmit_s", "dup_delay_s", "spike_s", "restart_s", "rejoin_s"):
            if getattr(self, key) < 0:
                raise ValueError(f"{key}: must be >= 0, got {getattr(self, key)}")

    @property
    def any(self) -> bool:
        return bool(self.loss or self.duplicate or self.spike_p or self.crash or self.dropout)

    @property
    def sim_only(self) -> list[str]:
        """The faults set here that only the sim backend can inject."""
        return [k for k in ("loss", "spike_p", "crash", "dropout") if getattr(self, k)]


@dataclass
class KillConfig:
    """local and ray: kill worker `worker`'s process `at_s` wall seconds after the run started (every
    worker has said hello; process start-up takes seconds and is not counted)."""

    worker: int
    at_s: float


@dataclass
class RayConfig:
    """ray: where to run and what each worker actor asks for."""

    address: Optional[str] = None  # "host:port" of a running head (`ray start --head`); null: a local instance
    num_cpus_per_worker: float = 1.0
    resources: dict[str, float] = field(default_factory=dict)  # custom resources per worker actor
    connect_timeout_s: float = 20.0  # how long to try reaching `address` before giving up
    include_dashboard: bool = False  # a local instance's dashboard (bound to 127.0.0.1)
    max_in_flight: int = 64  # pushes a worker may have outstanding before it waits for replies

    def validate(self) -> None:
        if self.num_cpus_per_worker < 0:
            raise ValueError(f"num_cpus_per_worker: must be >= 0, got {self.num_cpus_per_worker}")
        if self.connect_timeout_s <= 0:
            raise ValueError(f"connect_timeout_s: must be positive, got {self.connect_timeout_s}")
        if self.max_in_flight < 1:
            raise ValueError(f"max_in_flight: must be at least 1, got {self.max_in_flight}")
        for name, amount in self.resources.items():
            if amount < 0:
                raise ValueError(f"resources.{name}: must be >= 0, got {amount}")


@dataclass
class BackendConfig:
    """Where workers run: `sim` (virtual clock), `local` (OS processes) or `ray`."""

    name: str = "sim"
    workers: int = 1
    compute: ComputeProfile = field(default_factory=ComputeProfile)
    network: NetworkProfile = field(default_factory=NetworkProfile)
    # sim only: `events` lets compute and network times decide who acts next; the others pick the
    # active worker of each step from a schedule (LSVI's episode-by-episode asynchrony).
    schedule: Literal["events", "uniform", "round_robin", "zipf"] = "events"
    zipf_a: float = 1.5
    threads_per_worker: int = 1  # torch threads inside each worker
    max_restarts: int = 3  # local, ray: a worker process that dies is restarted up to this many times
    reply_timeout_s: float = 120.0  # local: a silent worker for this long is treated as failed
    # local: a worker process that has not said hello this long after it started is treated as failed
    # (the limit is multiplied by workers per core when there are more workers than cores)
    hello_timeout_s: float = 30.0
    # local: run even when workers exceed 4 per CPU core (refused otherwise, naming both numbers)
    oversubscribe: bool = False
    # local, ray, for tests and fault studies: worker index -> its first process exits (code 3)
    # after that many steps, as if killed
    crash_after_steps: dict[int, int] = field(default_factory=dict)
    # local, ray: kill schedule, e.g. [{worker: 1, at_s: 2.0}] (SIGKILL on local, ray.kill on ray);
    # each kill is a fault:kill ledger row and the worker is restarted (sim: faults.crash)
    kill: list[KillConfig] = field(default_factory=list)
    faults: FaultConfig = field(default_factory=FaultConfig)  # sim: all; local, ray: duplicate
    ray: RayConfig = field(default_factory=RayConfig)
    # ray: which nodes take the worker actors: `default` (Ray's own scheduler), `spread` (the least loaded
    # node first), `pack` (fill one node before the next) or a custom resource label (only nodes that have it)
    placement: str = "default"
    # ray: the server actor's node: `driver` (where `marlq run` runs), `head`, or a custom resource label
    server_placement: str = "driver"


@dataclass
class StalenessConfig:
    """Weight w(s) of an update that is s versions old (see marl_q/staleness.py)."""

    rule: str = "constant"
    a: float = 0.5
    b: int = 4


@dataclass
class ServerConfig:
    """How the server aggregates updates."""

    aggregation: str = "hogwild"  # sync | hogwild | buffered
    buffer_k: int = 4  # buffered: apply after this many updates
    staleness: StalenessConfig = field(default_factory=StalenessConfig)
    max_staleness: Optional[int] = None  # drop (and count) updates staler than this
    server_lr: float = 1.0  # eta_g for parameter deltas


# ----------------------------------------------------------------------------- chosen sections
ENV_FACTORIES = ("parallel_env", "env", "raw_env")  # the usual callables of an env module, left out of its name


def scenario_label(name: str, env: Any = None) -> str:
    """A scenario as titles and progress bars name it: ``scenario.name``, followed for the generic
    scenarios by the env they load (``scenario.env``: `gymnasium Pendulum-v1`,
    `pettingzoo mpe2.simple_reference_v3`)."""
    if not isinstance(env, str) or not env:
        return str(name)
    module, _, attr = env.partition(":")
    return f"{name} {module if attr in ENV_FACTORIES else env}"


class Choice:
    """A section whose schema was chosen by a discriminator (e.g. ``algorithm.name``).

    Attribute access falls through to the chosen dataclass, so ``cfg.algorithm.lr`` works, and
    ``cfg.algorithm.name`` is the chosen name.
    """

    def __init__(self, key: str, name: str, params: Any) -> None:
        object.__setattr__(self, "_key", key)
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "params", params)

    def __getattr__(self, item: str) -> Any:
        return getattr(object.__getattribute__(self, "params"), item)

    def __setattr__(self, item: str, value: Any) -> None:
        setattr(self.params, item, value)

    def to_dict(self) -> dict[str, Any]:
        body = to_plain(self.params) if self.params is not None else {}
        return {self._key: self.name, **body}

    def __repr__(self) -> str:
        return f"Choice({self._key}={self.name!r}, {self.params!r})"


@dataclass
class ExperimentConfig:
    """The whole resolved configuration of one run."""

    run: RunConfig
    backend: BackendConfig
    server: ServerConfig
    scenario: Choice
    algorithm: Choice
    actor: Choice
    critic: Choice
    qpu: QPUConfig = field(default_factory=QPUConfig)  # the QPU profile of the resource ledger's time estimate
    # one learner per team (``learners:``, agents/team_learners.py): team -> its sections; None: one learner
    learners: Optional[dict[str, "Learner"]] = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "run": to_plain(self.run),
            "backend": to_plain(self.backend),
            "server": to_plain(self.server),
            "scenario": self.scenario.to_dict(),
            "algorithm": self.algorithm.to_dict(),
            "actor": self.actor.to_dict(),
            "critic": self.critic.to_dict(),
            # only when set: the config.yaml of a run without a QPU estimate stays as it was
            **({"qpu": to_plain(self.qpu)} if self.qpu.profile is not None else {}),
            # only when set: a one-learner run's config.yaml stays as it was
            **({"learners": {team: l.to_dict() for team, l in self.learners.items()}} if self.learners else {}),
        }

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.to_dict(), sort_keys=False)


@dataclass
class Learner:
    """One team's learner (``learners.<team>``): its algorithm, actor and critic sections, each the file's
    section with the learner's keys over it."""

    algorithm: Choice
    actor: Choice
    critic: Choice

    def to_dict(self) -> dict[str, Any]:
        """Every key of the learner's sections, resolved: read back over any ``algorithm`` section (a
        run's config.yaml has the file's resolved), it gives this learner again."""
        return {**self.algorithm.to_dict(), "actor": self.actor.to_dict(), "critic": self.critic.to_dict()}

    def config(self, cfg: "ExperimentConfig") -> "ExperimentConfig":
        """``cfg`` as this learner sees it: its sections in place of the file's, and no ``learners``."""
        return dataclasses.replace(cfg, algorithm=self.algorithm, actor=self.actor, critic=self.critic, learners=None)


FIXED = {"run": RunConfig, "backend": BackendConfig, "server": ServerConfig, "qpu": QPUConfig}
# section -> (discriminator key, registry, default name)
CHOSEN: dict[str, tuple[str, Registry, Optional[str]]] = {
    "scenario": ("name", SCENARIOS, None),
    "algorithm": ("name", ALGORITHMS, None),
    "actor": ("head", HEADS, "mlp"),
    "critic": ("head", HEADS, "mlp"),
}
LEARNERS = "learners"  # the optional section of one learner per team (``build_learners``)
SECTIONS = list(FIXED) + list(CHOSEN) + [LEARNERS]


# ----------------------------------------------------------------------------- loading
def load_config(path: str | Path, overrides: list[str] = (), seed: Optional[int] = None) -> ExperimentConfig:
    """Read a scenario YAML file, apply ``key=value`` overrides and validate everything."""
    raw = read_yaml(path)
    for item in overrides:
        apply_override(raw, item)
    if seed is not None:
        raw.setdefault("run", {})["seed"] = seed
    try:
        return build_config(raw, source=str(path))
    except ConfigError as exc:
        hint = _switched_choice_hint(read_yaml(path), overrides, str(exc))
        if hint:
            raise ConfigError(hint) from None
        raise


def _switched_choice_hint(file_raw: dict[str, Any], overrides: Sequence[str], message: str) -> Optional[str]:
    """When ``--set actor.head=vqc`` leaves the file's options of the old head behind (``actor.hidden``) and
    they fail, the message names the override the user typed and the way to replace the whole section."""
    for item in overrides:
        key, _, value = item.partition("=")
        section, _, field = key.strip().partition(".")
        if section not in CHOSEN or field != CHOSEN[section][0]:
            continue
        old = file_raw.get(section) if isinstance(file_raw.get(section), dict) else {}
        if str(old.get(field, CHOSEN[section][2])) == value.strip():
            continue
        left = [k for k in old if k != field and not any(o.partition("=")[0].strip() == f"{section}.{k}"
                                                       for o in overrides)]
        if left and message.startswith(f"{section}"):
            return (f"--set {item}: the file's {section} options ({', '.join(f'{section}.{k}' for k in left)}) "
                    f"belong to {field} {old.get(field, CHOSEN[section][2])!r}; replace the whole section "
                    f"instead, e.g. --set '{section}={{{field}: {value.strip()}, ...}}'")
    return None


def read_yaml(path: str | Path) -> dict[str, Any]:
    """Parse a YAML mapping, turning file and syntax problems into ConfigErrors that name the file."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"{p}: no such config file")
    try:
        data = yaml.safe_load(p.read_text())
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError(f"{p}: malformed YAML{where}: {problem}") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{p}: expected a mapping of sections at the top, got {type(data).__name__}")
    return data


def apply_override(raw: dict[str, Any], item: str) -> None:
    """Set a dotted key from ``key=value``; the value is parsed as YAML (so 3, 0.1, true, [1,2] are typed)."""
    if "=" not in item:
        raise ConfigError(f"--set {item!r}: expected key=value, e.g. --set server.aggregation=sync")
    key, text = item.split("=", 1)
    key = key.strip()
    parts = key.split(".")
    if not key or any(not p for p in parts):
        raise ConfigError(f"--set {item!r}: malformed key {key!r}")
    try:
        value = yaml.safe_load(text) if text.strip() else ""
    except yaml.YAMLError:
        value = text
    node = raw
    for i, part in enumerate(parts[:-1]):
        child = node.get(part)
        if child is None:
            child = node[part] = {}
        if not isinstance(child, dict):
            raise ConfigError(f"--set {item!r}: {'.'.join(parts[: i + 1])} is a value, not a section")
        node = child
    node[parts[-1]] = value


def build_config(raw: dict[str, Any], source: str = "<config>") -> ExperimentConfig:
    """Validate a raw mapping into an ExperimentConfig. ``source``: the scenario file it was read from; its
    folder goes to a section's ``validate(source_dir=...)``. The fixed sections are checked first, so
    their mistakes show before any component's module is imported (each chosen name imports its own)."""
    source_dir = Path(source).resolve().parent if Path(source).is_file() else None
    unknown = [k for k in raw if k not in SECTIONS]
    for k in unknown:
        raise ConfigError(unknown_key_message(str(k), SECTIONS, ""))
    out: dict[str, Any] = {}
    for name, cls in FIXED.items():
        out[name] = build_dataclass(cls, raw.get(name) or {}, name)
    for name in CHOSEN:
        out[name] = build_choice(name, raw.get(name), source_dir)
    if raw.get(LEARNERS) is not None:
        out[LEARNERS] = build_learners(raw, source_dir)
    cfg = ExperimentConfig(**out)
    validate_cross(cfg)
    return cfg


def build_choice(name: str, section: Any, source_dir: Optional[Path] = None, path: Optional[str] = None) -> Choice:
    """A chosen section (``CHOSEN[name]``) from its raw mapping; ``path``: how errors name it (default ``name``)."""
    key, registry, default = CHOSEN[name]
    path = path or name
    if section is None:
        section = {}
    if not isinstance(section, dict):
        raise ConfigError(f"{path}: expected a mapping, got {section!r}")
    section = dict(section)
    choice = section.pop(key, default)
    if choice is None:
        raise ConfigError(f"{path}.{key}: missing (choices: {', '.join(registry.names())})")
    entry = registry.get(str(choice), key=f"{path}.{key}")
    if name in ("actor", "critic") and "recurrent" in section and not (
            dataclasses.is_dataclass(entry.config) and "recurrent" in {f.name for f in dataclasses.fields(entry.config)}):
        raise ConfigError(f"{path}.recurrent: head {choice!r} cannot carry a hidden state; recurrent policies "
                          f"need {name}.head: mlp (docs/recurrent.md)")
    params = build_dataclass(entry.config, section, path, source_dir) if entry.config is not None else None
    if params is None and section:
        raise ConfigError(f"{path}: {key} {choice!r} takes no options, got {sorted(section)}")
    if callable(getattr(params, "for_role", None)):  # a head's defaults that depend on its section
        params.for_role(name)
    return Choice(key, str(choice), params)


def build_learners(raw: dict[str, Any], source_dir: Optional[Path] = None) -> dict[str, Learner]:
    """``learners``: team -> the learner's keys. A learner's algorithm section is the file's ``algorithm``
    section with the learner's keys (all but ``actor`` and ``critic``) over it; its ``actor`` and
    ``critic`` are the file's sections with the learner's ``actor`` / ``critic`` keys over them (one that
    names another head replaces the section). Which teams and algorithms may have learners is the team
    learners' check (agents/team_learners.py)."""
    spec = raw.get(LEARNERS)
    if not isinstance(spec, dict) or not spec:
        raise ConfigError(f"{LEARNERS}: expected a mapping of team -> its learner's keys (e.g. "
                          f"{{good: {{name: mappo}}, adv: {{name: ippo}}}}), got {spec!r}")
    base = raw.get("algorithm") if isinstance(raw.get("algorithm"), dict) else {}
    if base.get("name") is not None:
        _team_learner(str(base["name"]), "algorithm.name")
    out: dict[str, Learner] = {}
    for team, keys in spec.items():
        path = f"{LEARNERS}.{team}"
        keys = {} if keys is None else keys
        if not isinstance(keys, dict):
            raise ConfigError(f"{path}: expected a mapping of the learner's keys, got {keys!r}")
        own = {k: v for k, v in keys.items() if k not in ("actor", "critic")}
        if own.get("name") is not None:
            _team_learner(str(own["name"]), f"{path}.name")
        sections = {"algorithm": _merged(raw.get("algorithm"), own, "algorithm", path)}
        for role in ("actor", "critic"):
            sections[role] = _merged(raw.get(role), keys.get(role), role, f"{path}.{role}")
        out[str(team)] = Learner(build_choice("algorithm", sections["algorithm"], source_dir, path),
                                 build_choice("actor", sections["actor"], source_dir, f"{path}.actor"),
                                 build_choice("critic", sections["critic"], source_dir, f"{path}.critic"))
    return out


def _team_learner(name: str, key: str) -> None:
    """A ConfigError unless algorithm ``name`` can be a team's learner (its family has ``team_learners``)."""
    if not getattr(ALGORITHMS.get(name, key=key).obj, "team_learners", None):
        raise ConfigError(f"{key}: algorithm {name!r} cannot be a team's learner in learners: (ippo, mappo, ia2c "
                          "or maa2c can)")


def _merged(base: Any, over: Any, name: str, path: str) -> dict[str, Any]:
    """The file's section ``name`` with a learner's keys over it; keys naming another choice replace it."""
    if over is None:
        over = {}
    if not isinstance(over, dict):
        raise ConfigError(f"{path}: expected a mapping, got {over!r}")
    base = dict(base) if isinstance(base, dict) else {}
    key, _, default = CHOSEN[name]
    if key in over and str(over[key]) != str(base.get(key, default)) and name != "algorithm":
        return dict(over)  # another head: the file's options belong to its own
    return {**base, **over}


def validate_cross(cfg: ExperimentConfig) -> None:
    """Checks that span sections or need registries."""
    from marl_q.registry import AGGREGATIONS, STALENESS

    BACKENDS.get(cfg.backend.name, key="backend.name")
    AGGREGATIONS.get(cfg.server.aggregation, key="server.aggregation")
    STALENESS.get(cfg.server.staleness.rule, key="server.staleness.rule")
    positive = {
        "backend.workers": cfg.backend.workers,
        "server.buffer_k": cfg.server.buffer_k,
        "run.solve_window": cfg.run.solve_window,
    }
    for key, value in positive.items():
        if value < 1:
            raise ConfigError(f"{key}: must be at least 1, got {value}")
    for key, value in (("run.total_env_steps", cfg.run.total_env_steps), ("run.total_episodes", cfg.run.total_episodes)):
        if value is not None and value < 1:
            raise ConfigError(f"{key}: must be positive, got {value}")
    if cfg.run.total_env_steps is None and cfg.run.total_episodes is None:
        raise ConfigError("run: set run.total_env_steps or run.total_episodes (the run needs a budget)")
    if cfg.run.checkpoint_every < 0:
        raise ConfigError(f"run.checkpoint_every: must be >= 0, got {cfg.run.checkpoint_every}")
    if cfg.run.keep_checkpoints < 1:
        raise ConfigError(f"run.keep_checkpoints: must be at least 1, got {cfg.run.keep_checkpoints}")
    if cfg.run.eval_every is not None and cfg.run.eval_every < 1:
        raise ConfigError(f"run.eval_every: must be positive or null, got {cfg.run.eval_every}")
    if cfg.run.eval_episodes < 1:
        raise ConfigError(f"run.eval_episodes: must be at least 1, got {cfg.run.eval_episodes}")
    if cfg.run.eval_every is not None and not callable(getattr(ALGORITHMS.get(cfg.algorithm.name).obj,
                                                               "evaluate_returns", None)):
        raise ConfigError(f"run.eval_every: algorithm {cfg.algorithm.name!r} has no evaluation during training "
                          "(the actor-critic family, mappo/ippo/ia2c/maa2c and the COMA family have)")
    if cfg.run.report_team is not None and not getattr(ALGORITHMS.get(cfg.algorithm.name).obj, "reports_teams", False):
        raise ConfigError(f"run.report_team: algorithm {cfg.algorithm.name!r} reports no per-team returns "
                          "(the team actor-critics ippo, mappo, ia2c and maa2c do)")
    if cfg.run.stop_after_updates is not None and cfg.run.stop_after_updates < 1:
        raise ConfigError(f"run.stop_after_updates: must be positive or null, got {cfg.run.stop_after_updates}")
    if cfg.server.max_staleness is not None and cfg.server.max_staleness < 0:
        raise ConfigError(f"server.max_staleness: must be >= 0 or null, got {cfg.server.max_staleness}")
    validate_faults(cfg)
    validate_placement(cfg)
    for i in cfg.backend.compute.stragglers:
        if not 0 <= i < cfg.backend.workers:
            raise ConfigError(
                f"backend.compute.stragglers: worker index {i} out of range for {cfg.backend.workers} workers"
            )
    nonneg = {
        "backend.compute.step_s": cfg.backend.compute.step_s,
        "backend.compute.jitter": cfg.backend.compute.jitter,
        "backend.compute.speed_sigma": cfg.backend.compute.speed_sigma,
        "backend.network.latency_s": cfg.backend.network.latency_s,
        "backend.network.jitter": cfg.backend.network.jitter,
    }
    for key, value in nonneg.items():
        if value < 0:
            raise ConfigError(f"{key}: must be >= 0, got {value}")
    if cfg.backend.network.bandwidth_bytes_per_s <= 0:
        raise ConfigError("backend.network.bandwidth_bytes_per_s: must be positive")
    if cfg.backend.compute.straggler_factor <= 0:
        raise ConfigError("backend.compute.straggler_factor: must be positive")
    for key in ("reply_timeout_s", "hello_timeout_s"):
        if getattr(cfg.backend, key) <= 0:
            raise ConfigError(f"backend.{key}: must be positive, got {getattr(cfg.backend, key)}")
    for role in ("actor", "critic"):
        # an algorithm's recurrent_policies: True (either role) or the roles that may be recurrent
        allowed = getattr(ALGORITHMS.get(cfg.algorithm.name).obj, "recurrent_policies", False)
        if getattr(getattr(cfg, role).params, "recurrent", None) is not None and \
                not (allowed is True or (allowed and role in allowed)):
            if allowed:
                raise ConfigError(f"{role}.recurrent: algorithm {cfg.algorithm.name!r} has no {role} to make "
                                  f"recurrent (only {', '.join(f'{r}.recurrent' for r in allowed)})")
            raise ConfigError(f"{role}.recurrent: algorithm {cfg.algorithm.name!r} has no recurrent policies "
                              "(ippo, mappo, ia2c and maa2c have; docs/recurrent.md)")
    from marl_q.registry import algorithm_class

    check = getattr(algorithm_class(cfg), "check_config", None)
    if check is not None:
        check(cfg)


def validate_faults(cfg: ExperimentConfig) -> None:
    """Fault injection, kill schedules and the Ray section against the chosen backend."""
    b = cfg.backend
    for i in list(b.faults.crash) + list(b.crash_after_steps):
        if not 0 <= i < b.workers:
            raise ConfigError(f"backend: crash of worker index {i}, out of range for {b.workers} workers")
    for n, kill in enumerate(b.kill):
        if not 0 <= kill.worker < b.workers:
            raise ConfigError(f"backend.kill[{n}].worker: index {kill.worker} out of range for {b.workers} workers")
        if kill.at_s < 0:
            raise ConfigError(f"backend.kill[{n}].at_s: must be >= 0, got {kill.at_s}")
    real = b.name in ("local", "ray")
    if b.kill and not real:
        raise ConfigError(f"backend.kill: kill schedules need backend.name: local or ray (got {b.name!r}); "
                          "in sim, use backend.faults.crash: {worker index: virtual time}")
    if b.faults.any and not real and (b.name != "sim" or b.schedule != "events"):
        raise ConfigError("backend.faults: injected faults need backend.name: sim with schedule: events")
    if real and b.faults.sim_only:
        raise ConfigError(f"backend.faults: {', '.join(b.faults.sim_only)} need backend.name: sim with "
                          f"schedule: events; {b.name} injects only faults.duplicate (and kills via backend.kill)")
    if b.name == "ray":
        import importlib.util

        try:
            found = importlib.util.find_spec("ray") is not None
        except (ImportError, ValueError):  # a broken or blocked installation
            found = False
        if not found:
            raise ConfigError(RAY_MISSING)


WORKER_PLACEMENTS = ("default", "spread", "pack")
SERVER_PLACEMENTS = ("driver", "head")
RAY_BUILTIN_RESOURCES = ("CPU", "GPU", "memory", "object_store_memory")


def validate_placement(cfg: ExperimentConfig) -> None:
    """backend.placement and backend.server_placement: a keyword or a custom resource label, on ray only."""
    b = cfg.backend
    for key, value, keywords in (("placement", b.placement, WORKER_PLACEMENTS),
                                 ("server_placement", b.server_placement, SERVER_PLACEMENTS)):
        if value in keywords:
            if value != keywords[0] and b.name != "ray":
                raise ConfigError(f"backend.{key}: {value!r} places Ray actors; it needs backend.name: ray "
                                  f"(got {b.name!r})")
            continue
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_.-]*", value) or value in RAY_BUILTIN_RESOURCES:
            raise ConfigError(f"backend.{key}: expected {', '.join(keywords)} or a custom resource label "
                              f"(letters, digits, _ . -; not {', '.join(RAY_BUILTIN_RESOURCES)}), got {value!r}")
        if b.name != "ray":
            raise ConfigError(f"backend.{key}: a resource label ({value!r}) places Ray actors; it needs "
                              f"backend.name: ray (got {b.name!r})")


# ----------------------------------------------------------------------------- typed coercion
def unknown_key_message(key: str, valid: list[str], path: str) -> str:
    close = difflib.get_close_matches(key, valid, n=1, cutoff=0.5)
    where = f"{path}.{key}" if path else key
    hint = f"; did you mean {(path + '.' if path else '') + close[0]!r}?" if close else ""
    return f"{where}: unknown key{hint} (valid keys here: {', '.join(valid)})"


def build_dataclass(cls: type, data: Any, path: str, source_dir: Optional[Path] = None) -> Any:
    """Build dataclass ``cls`` from a mapping, checking every key and type, then call its ``validate()``;
    one that takes ``source_dir`` gets the scenario file's folder (None without a file), to resolve
    paths the file names."""
    if isinstance(data, cls):
        return data
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping, got {data!r}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    for key in data:
        if key not in fields:
            raise ConfigError(unknown_key_message(str(key), list(fields), path))
    kwargs = {key: coerce(value, hints[key], f"{path}.{key}") for key, value in data.items()}
    try:
        obj = cls(**kwargs)
    except (TypeError, ValueError) as exc:
        raise ConfigError(_join_key(path, str(exc), fields)) from None
    post = getattr(obj, "validate", None)
    if callable(post):
        takes_dir = "source_dir" in inspect.signature(post).parameters
        try:
            post(source_dir=source_dir) if takes_dir else post()
        except ConfigError:
            raise
        except ValueError as exc:
            raise ConfigError(_join_key(path, str(exc), fields)) from None
    return obj


def _join_key(path: str, message: str, fields: Any) -> str:
    """``algorithm`` + ``epochs: must be ...`` -> ``algorithm.epochs: must be ...`` (one style for every error)."""
    head, sep, _ = message.partition(": ")
    if sep and head.startswith(f"{path}."):  # already named in full (scenario.env: ...)
        return message
    if sep and head.split(".")[0].split("[")[0] in fields:
        return f"{path}.{message}"
    return f"{path}: {message}"


def _type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin is Literal:
        return " | ".join(repr(a) for a in typing.get_args(tp))
    if origin in (Union, types.UnionType):
        return " or ".join(_type_name(a) for a in typing.get_args(tp))
    if tp is type(None):
        return "null"
    if origin is not None:
        args = ", ".join(_type_name(a) for a in typing.get_args(tp))
        return f"{getattr(origin, '__name__', str(origin))}[{args}]"
    return getattr(tp, "__name__", str(tp))


def coerce(value: Any, tp: Any, path: str) -> Any:
    """Check ``value`` against type ``tp`` (with a few lossless conversions) or raise a ConfigError."""
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if tp is Any:
        return value
    if origin in (Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        options = [a for a in args if a is not type(None)]
        if len(options) == 1:  # Optional[X]: X's own message is the most precise
            return coerce(value, options[0], path)
        for arg in options:
            try:
                return coerce(value, arg, path)
            except ConfigError:
                pass
        raise ConfigError(f"{path}: expected {_type_name(tp)}, got {value!r}")
    if origin is Literal:
        if value in args:
            return value
        raise ConfigError(unknown_choice_message(path, value, [str(a) for a in args]))
    if origin in (list, tuple) or tp in (list, tuple):
        if isinstance(value, (list, tuple)):
            if origin is tuple and args and args[-1] is not Ellipsis:
                if len(value) != len(args):
                    raise ConfigError(f"{path}: expected {len(args)} items, got {len(value)}")
                return tuple(coerce(v, a, f"{path}[{i}]") for i, (v, a) in enumerate(zip(value, args)))
            item = args[0] if args else Any
            items = [coerce(v, item, f"{path}[{i}]") for i, v in enumerate(value)]
            return tuple(items) if origin is tuple else items
        raise ConfigError(f"{path}: expected a list, got {value!r}")
    if origin is dict or tp is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{path}: expected a mapping, got {value!r}")
        kt, vt = args if args else (Any, Any)
        return {coerce(k, kt, f"{path}.<key>"): coerce(v, vt, f"{path}.{k}") for k, v in value.items()}
    if dataclasses.is_dataclass(tp):
        return build_dataclass(tp, value, path)
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{path}: expected true or false, got {value!r}")
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        num = _number(value)
        if num is not None and float(num).is_integer():
            return int(num)
        raise ConfigError(f"{path}: expected an integer, got {value!r}")
    if tp is float:
        num = _number(value)
        if num is not None:
            return float(num)
        raise ConfigError(f"{path}: expected a number, got {value!r}")
    if tp is str:
        if isinstance(value, str):
            return value
        raise ConfigError(f"{path}: expected a string, got {value!r}")
    if isinstance(tp, type) and isinstance(value, tp):
        return value
    raise ConfigError(f"{path}: expected {_type_name(tp)}, got {value!r}")


def _number(value: Any) -> Optional[float]:
    """A number from an int, a float, or a numeric string such as '1e5' (YAML reads that as text)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return value
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return None
    return None


def to_plain(obj: Any) -> Any:
    """Dataclasses -> dicts of YAML-safe values (tuples become lists)."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_plain(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, Choice):
        return obj.to_dict()
    if isinstance(obj, (list, tuple)):
        return [to_plain(v) for v in obj]
    if isinstance(obj, dict):
        return {k: to_plain(v) for k, v in obj.items()}
    return obj
