"""The versioned format of a sim snapshot's state, and the one table of migrations from older versions.

A snapshot file (``ckpt_<n>.sim.pkl``, written and hash-checked by ``marl_q.rundir``) holds

    {"format": FORMAT, "format_version": FORMAT_VERSION, "state": state}

where ``state`` is what the sim backend's ``capture()`` returns plus the runtime's part:

- ``mode`` (the sim's schedule), the sim's counters and clock (``now``, ``seq``, ``k``, ``busy``, ...);
- ``timing_rng`` (and ``pick_rng`` under a schedule): NumPy generators as data,
  ``{"bit_generator": name, "state": ...}`` (``rng_state`` / ``rng_from_state``);
- ``rngs``: the process-wide generators (torch, NumPy's legacy global, ``random``) as their states;
- ``workers``, ``heap`` / ``inbox`` (messages and finished steps in flight), ``algorithm`` and
  ``service``: the run's objects, pickled with torch's pickler (tensors stored once, views kept) and
  environments captured by their full state (``rundir._FullStatePickler``: an ``EzPickle`` env is saved
  by its attributes, not by its constructor, so that the episode it is in goes on). Parameters,
  optimiser moments and replay buffers travel as tensors and arrays. Two objects are pickled as data
  rebuilt by a named constructor (``__reduce__``), so no attribute name of theirs is in the file: a
  replay buffer as ``ReplayBuffer.from_state(layout, state_dict(), snapshot_max_bytes)`` (its filled
  rows only), a flat parameter buffer as ``FlatParameters.from_state(flat, modules)`` (its storage
  and modules; the views into it are seated again). A circuit or head saves none of its caches.

Version 0 is every snapshot written before this header existed: the bare state dict, pickled (or
torch-saved) whole. Reading a file upgrades it step by step through ``MIGRATIONS`` (version v -> v + 1),
so a class's own code only ever sees the current layout: no class keeps a ``__setstate__`` for old
files. A version newer than this marl-q, or a state of the wrong shape, is a ``CheckpointError`` (one
line, exit code 2 at ``marlq resume``).

Adding a migration: bump ``FORMAT_VERSION`` to N + 1, write ``_vN_to_vN1(state) -> state`` below (it
gets the state as version N left it, objects of the then-current classes already unpickled, and must
return it as version N + 1 has it), add it to ``MIGRATIONS`` under N, and add a test that a file of
version N resumes (tests/marl_q/test_state_format.py). The migrations find objects by the name of
their class (``V0_FIXES``), not by importing it: this module sits below ``agents/`` and ``circuits/``
in the import graph (docs/circuits.md, "Layering"), and a class the file names is imported by
unpickling it anyway, with the modules it imports. What a migration needs of those packages it takes
from the modules already loaded (``_loaded``).
"""
from __future__ import annotations

import sys
from collections import deque
from types import ModuleType
from typing import Any, Callable, Iterator

import numpy as np

from marl_q.errors import CheckpointError

FORMAT = "marl-q sim snapshot"
FORMAT_VERSION = 7


def pack(state: dict[str, Any]) -> dict[str, Any]:
    """The object a snapshot file holds for ``state`` (the current version)."""
    return {"format": FORMAT, "format_version": FORMAT_VERSION, "state": state}


def version_of(obj: Any) -> Any:
    """The format version of a snapshot file's object (0: a bare state from before the header)."""
    if isinstance(obj, dict) and obj.get("format") == FORMAT:
        return obj.get("format_version")
    return 0


def unpack(obj: Any, where: str) -> dict[str, Any]:
    """The state of a snapshot file's object (``where`` names the file in errors), upgraded to the
    current version through ``MIGRATIONS``."""
    version = version_of(obj)
    if not isinstance(version, int) or isinstance(version, bool) or not 0 <= version <= FORMAT_VERSION:
        raise CheckpointError(f"{where}: sim snapshot of state format version {version!r}, but this marl-q reads "
                              f"versions 0 to {FORMAT_VERSION} (written by a newer marl-q? resume it with that one)")
    state = obj if version == 0 else obj.get("state")
    if not isinstance(state, dict):
        raise CheckpointError(f"{where}: sim snapshot (state format version {version}) holds a "
                              f"{type(state).__name__}, not a state")
    return upgrade(state, version)


def upgrade(state: dict[str, Any], version: int) -> dict[str, Any]:
    """``state``, of format ``version``, brought to the current version by the migrations of
    ``MIGRATIONS``, one version at a time (objects in it are fixed in place)."""
    while version < FORMAT_VERSION:
        state = MIGRATIONS[version](state)
        version += 1
    return state


# -- data for generators -------------------------------------------------------------------------

def rng_state(rng: np.random.Generator) -> dict[str, Any]:
    """A NumPy generator as data: its bit generator's name and state."""
    return {"bit_generator": type(rng.bit_generator).__name__, "state": rng.bit_generator.state}


def rng_from_state(data: dict[str, Any]) -> np.random.Generator:
    """The generator ``rng_state`` described, continuing its stream."""
    bit_generator = getattr(np.random, data["bit_generator"])()
    bit_generator.state = data["state"]
    return np.random.Generator(bit_generator)


# -- finding objects in an unpickled state -------------------------------------------------------

_LEAVES = (str, bytes, bytearray, int, float, complex, bool, type(None), np.ndarray, np.generic, type,
           ModuleType)


def _reachable(root: Any) -> Iterator[Any]:
    """Every object reachable from ``root`` through containers and instance dicts, each once, in the
    order first reached (tensors and arrays are leaves)."""
    seen: set[int] = set()
    todo: deque[Any] = deque([root])
    while todo:
        obj = todo.popleft()
        if isinstance(obj, _LEAVES) or id(obj) in seen:
            continue
        seen.add(id(obj))
        if _is_tensor(obj):
            continue
        yield obj
        if isinstance(obj, dict):
            todo.extend(obj.values())
        elif isinstance(obj, (list, tuple, set, frozenset, deque)):
            todo.extend(obj)
        inner = getattr(obj, "__dict__", None)
        if isinstance(inner, dict):
            todo.extend(inner.values())


def _is_tensor(obj: Any) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(obj, torch.Tensor)


def _class_names(obj: Any) -> set[str]:
    """The dotted names (module.qualname) of ``obj``'s class and its bases: how a migration knows an
    object without importing its class (this module sits below ``agents/`` and ``circuits/``)."""
    return {f"{cls.__module__}.{cls.__qualname__}" for cls in type(obj).__mro__}


def _loaded(name: str) -> ModuleType:
    """Module ``name``, which unpickling the objects a migration fixes has imported (their classes'
    modules import it)."""
    return sys.modules[name]


# -- version 0 -> 1 ------------------------------------------------------------------------------
# Version 0 pickled the run's live objects with nothing to say which layout their attributes had;
# classes took up older layouts in their own ``__setstate__``. Those fixes are here now, class by
# class, in the order they must run (a worker's fix builds numpy twins from its heads, so circuits
# and heads are brought up to date first). Each applies to an object whose attributes show the
# older layout and leaves a current one as it is.

def _circuit_options(circuit: Any) -> None:
    # pickled before ``options`` existed: the rotation was kept; the entangler was only read at
    # construction (into the permutation buffers), so None stands for it
    if "options" not in circuit.__dict__:
        circuit.__dict__["options"] = _loaded("circuits.blocks").LayerOptions(circuit.__dict__["rotation"], None)


def _shot_sampler(sampler: Any) -> None:
    # version 0 pickled the sampler as {seed, state} (torch.Generator did not pickle then)
    if "generator" not in sampler.__dict__:
        torch = sys.modules["torch"]
        sampler.generator = torch.Generator()
        sampler.generator.set_state(sampler.__dict__.pop("state"))


def _vqc_layout(vqc: Any) -> None:
    # pickled before shots and noise existed: an exact head with fresh counters
    if "hardware" not in vqc.__dict__ and "hardware" not in vqc._modules:
        vqc.hardware = None
    if "resource_counts" not in vqc.__dict__:
        vqc.resource_counts = _loaded("circuits.gradients").new_counts()
    vqc.__dict__.setdefault("_act_weights", None)
    vqc.__dict__.setdefault("_act_blocks", None)
    hardware = vqc._modules.get("hardware")
    density = getattr(hardware, "density", None)
    if density is not None and not hasattr(density, "diagonal_noise"):
        # pickled before the density path held Pauli components: rebuilt for this spec (the same
        # channels; values agree to float rounding)
        hardware.density = type(density)(vqc.cfg, _loaded("circuits.vqc").COMPLEX_DTYPES[vqc.cfg.dtype])


# what twins pickled before the block sweeps and the kernels called ``use_blocks`` (their flags were
# then this and ``kernels``)
_TWIN_LEGACY_BLOCKS = {"circuits.twins.NumpyVQC": "adjoint", "circuits.twins.NumpyVQCActing": "statevector"}


def _twin_flags(twin: Any) -> None:
    # a twin pickled before the block sweeps or the kernels existed keeps the executors it ran on: the
    # resumed run computes what the snapshot's would have, to the bit
    state = twin.__dict__
    if "use_kernels" not in state:
        legacy = _TWIN_LEGACY_BLOCKS[f"{type(twin).__module__}.{type(twin).__qualname__}"]
        state["use_blocks"] = state.pop(legacy, False)
        state["use_kernels"] = state.pop("kernels", False)
        state.pop("adjoint", None)
    # ... and one pickled before the columns kernels keeps the blocks for its training calls of many rows
    state.setdefault("use_columns", False)
    state.pop("_planner", None)


def _acting_twin_caches(twin: Any) -> None:
    # blocks pickled by an earlier version (``_blocks``) lack what the current forward reads: rebuilt
    twin.__dict__.pop("_blocks", None)
    twin.__dict__["_per_weights"] = None


def _actor_critic_worker(worker: Any) -> None:
    # a worker from before the forward reuse, the numpy path, the quantum-resource ledger,
    # continuous actions or agents.rollout takes them up
    state = worker.__dict__
    had = set(state)
    if "_reuse_act_forward" not in had:
        worker._reuse_act_forward = worker._one_step_reuse(worker.ac)
        worker._rollout_logits = None
    if "_np_heads" not in had:
        worker._init_numpy_path()
    if "resources" not in had:
        worker.resources = _loaded("agents.heads").resumed_heads({"actor": worker.actor, "critic": worker.critic})
    if "dist" not in had:  # every actor-critic policy was a softmax
        worker.dist = _loaded("agents.distributions").Categorical(int(worker.env.single_action_space.n))
    if "book" not in had and "ep_return" in had:  # the loop's state sat on the worker
        worker.adopt_rollout_state(state)


def _team_worker(worker: Any) -> None:
    # before TeamDescription.central: whether the critic reads the global state sat on the worker only
    # (the description's class default, False, would size a centralised critic's rows by the observation)
    desc = worker.__dict__.get("desc")
    if desc is not None and "central" not in desc.__dict__:
        desc.central = bool(worker.__dict__.get("central", False))


def _routing_worker(worker: Any) -> None:
    # before the quantum-resource ledger or train.csv
    state = worker.__dict__
    if "resources" not in state:
        worker.resources = _loaded("agents.heads").resumed_heads({"actor": worker.actor, "critic": worker.critic})
    state.setdefault("_trained", [])


def _coma_worker(worker: Any) -> None:
    # before the numpy actor or the quantum-resource ledger
    state = worker.__dict__
    had = set(state)
    if "_np_actor" not in had:
        worker._init_numpy_actor()
    if "resources" not in had:
        worker.resources = _loaded("agents.heads").resumed_heads({"actor": worker.actor})


def _sim_generators_as_data(state: dict[str, Any]) -> None:
    # version 0 pickled the sim's generators as objects
    for key in ("timing_rng", "pick_rng"):
        if isinstance(state.get(key), np.random.Generator):
            state[key] = rng_state(state[key])


# (class, fix) in the order the fixes run
V0_FIXES: tuple[tuple[str, Callable[[Any], None]], ...] = (
    ("circuits.engine.CompiledCircuit", _circuit_options),
    ("circuits.shots.ShotSampler", _shot_sampler),
    ("circuits.vqc.VQC", _vqc_layout),
    ("circuits.twins.NumpyVQC", _twin_flags),
    ("circuits.twins.NumpyVQCActing", _acting_twin_caches),
    ("agents.actor_critic.ActorCriticWorker", _actor_critic_worker),
    ("agents.mappo.TeamWorker", _team_worker),
    ("agents.routing.RoutingPPOWorker", _routing_worker),
    ("agents.coma.ComaWorker", _coma_worker),
)


def _v0_to_v1(state: dict[str, Any]) -> dict[str, Any]:
    found: dict[str, list[Any]] = {name: [] for name, _ in V0_FIXES}
    for obj in _reachable(state):
        for name in _class_names(obj) & found.keys():
            found[name].append(obj)
    for name, fix in V0_FIXES:
        for obj in found[name]:
            fix(obj)
    _sim_generators_as_data(state)
    return state


# -- version 1 -> 2 ------------------------------------------------------------------------------
# Version 1's team workers (agents.mappo.TeamWorker) kept a plain EpisodeBook: no per-agent returns
# (returns.csv, marl_q/teams.py). Their book becomes an AgentEpisodeBook whose episodes under way have
# NaN per-agent returns (agents.rollout.AgentEpisodeBook.taking_over); the run's return is unchanged.
# (A turn-based game's worker, agents.mappo.TurnWorker, keeps its plain book: it has no teams.)

def _v1_to_v2(state: dict[str, Any]) -> dict[str, Any]:
    for obj in _reachable(state):
        names = _class_names(obj)
        team = "agents.mappo.TeamWorker" in names and "agents.mappo.TurnWorker" not in names  # a turn game's: as is
        book = obj.__dict__.get("book") if team else None
        if book is not None and type(book).__name__ == "EpisodeBook":
            obj.book = _loaded("agents.rollout").AgentEpisodeBook.taking_over(book, len(obj.desc.agents))
    return state


# -- version 2 -> 3 ------------------------------------------------------------------------------
# Version 2's Q-learners (agents.q_learning.QLearner) stepped torch.optim.Adam (``optimizer``) over their
# parameters (``params``). Their parameters now sit in one flat buffer that FlatAdams step
# (``QLearner._init_update``), which takes over the optimizer's moments and step count: the same
# numbers, so the resumed run goes on as the snapshot's would have.

def _v2_to_v3(state: dict[str, Any]) -> dict[str, Any]:
    for obj in list(_reachable(state)):
        if "agents.q_learning.QLearner" in _class_names(obj) and "optimizer" in obj.__dict__:
            optimizer = obj.__dict__.pop("optimizer")
            obj.__dict__.pop("params", None)
            obj._init_update(optimizer.state_dict())
    return state


# -- version 3 -> 4 ------------------------------------------------------------------------------
# Version 3 (and every version before it) pickled a replay buffer (agents.replay.ReplayBuffer and its
# subclasses) as its attribute dict with ``data`` cut to the filled rows, and a flat parameter buffer
# (agents.heads.FlatParameters) as {flat, modules, size}; each class's ``__setstate__`` rebuilt the rest.
# Those are gone: both now pickle as data through a named constructor (``__reduce__``), so an older
# file's objects come back as their saved attribute dicts and are rebuilt here, in place (the state's
# other references to them stay good), by that same constructor from what the current pickle would
# hold of them. The earlier steps never read a buffer's rows or a parameter's gradient: they see these
# objects as saved, which is all they read (a flat buffer's modules hold the same values, views or
# not). A flat buffer an earlier step built (a Q-learner's, version 2 -> 3) has today's layout
# (``writes``) and is left as it is: seating its views again would replace parameters that step's
# objects hold. The same version moved a routing worker's decisions onto agents.rollout's loop: its
# episode under way goes from its own counters to an EpisodeBook (``_routing_book``).

def _v3_layout(obj: Any) -> bool:
    names = _class_names(obj)
    if "agents.heads.FlatParameters" in names:
        return "writes" not in obj.__dict__
    return "agents.replay.ReplayBuffer" in names


def _routing_book(worker: Any) -> None:
    # version 3's routing worker (agents.routing.RoutingPPOWorker) kept its episode under way in its own
    # ``_window`` (return, decisions, first outcome); its decisions now go through agents.rollout, whose
    # EpisodeBook keeps the return and length (the same running sums), the first outcome beside it
    window = worker.__dict__.pop("_window", None)
    if window is not None:
        worker.book = _loaded("agents.rollout").EpisodeBook.resumed(
            np.array([window["return"]], dtype=np.float64), np.array([window["length"]], dtype=np.int64))
        worker.first_outcome = window["first_outcome"]


def _v3_to_v4(state: dict[str, Any]) -> dict[str, Any]:
    for obj in list(_reachable(state)):
        if _v3_layout(obj):
            rebuild, args = obj.__reduce__()[:2]
            fresh = rebuild(*args)
            obj.__dict__.clear()
            obj.__dict__.update(fresh.__dict__)
        elif "agents.routing.RoutingPPOWorker" in _class_names(obj):
            _routing_book(obj)
    return state


# -- version 4 -> 5 ------------------------------------------------------------------------------
# Version 5's acting twins (circuits.twins.NumpyVQCActing) act through the columns kernels past the
# per-row kernels' rows at 5-8 qubits (``use_columns``, which version 4's acting twins carried but never
# acted on: they took the numpy blocks there); a version-4 acting twin keeps the blocks, so the resumed
# run computes what the snapshot's would have. A training twin (circuits.twins.NumpyVQC) pickled in
# version 4 before the columns kernels existed has no ``use_columns``: it keeps the blocks too.

def _v4_to_v5(state: dict[str, Any]) -> dict[str, Any]:
    for obj in _reachable(state):
        names = _class_names(obj)
        if "circuits.twins.NumpyVQCActing" in names:
            obj.__dict__["use_columns"] = False
        elif "circuits.twins.NumpyVQC" in names:
            obj.__dict__.setdefault("use_columns", False)
        else:
            continue
        obj.__dict__.pop("_planner", None)
    return state


# -- version 5 -> 6 ------------------------------------------------------------------------------
# Version 5's actor-critic workers that run their own epochs (PPO's deltas, the team learners, routing
# PPO) stepped a torch.optim optimizer (Adam, RMSprop or SGD) on their one flat parameter tensor, held as
# ``optimizer``. They now step marl_q.optim's flat optimizer of the same kind (agents.actor_critic.
# make_optimizer), which does the same arithmetic op for op; it takes over the torch optimizer's
# parameter, hyperparameters, moments and step count, so the resumed run goes on bit for bit.

def _flat_optimizer(optimizer: Any) -> Any:
    """marl_q.optim's optimizer that continues a torch.optim Adam / RMSprop / SGD of one parameter."""
    from marl_q.optim import FlatAdam, FlatRMSprop, FlatSGD

    [group] = optimizer.param_groups
    [param] = group["params"]
    state = optimizer.state.get(param, {})
    kind = type(optimizer).__name__
    if kind == "Adam":
        flat = FlatAdam(param, group["lr"], betas=tuple(group["betas"]), eps=group["eps"])
        if state:
            flat.exp_avg.copy_(state["exp_avg"])
            flat.exp_avg_sq.copy_(state["exp_avg_sq"])
    elif kind == "RMSprop":
        flat = FlatRMSprop(param, group["lr"], alpha=group["alpha"], eps=group["eps"])
        if state:
            flat.square_avg.copy_(state["square_avg"])
    elif kind == "SGD":
        flat = FlatSGD(param, group["lr"])
    else:
        raise CheckpointError(f"sim snapshot: a worker's optimizer is torch.optim.{kind}, which no marl-q learner "
                              "made (Adam, RMSprop or SGD)")
    if state and "step" in state:
        flat.steps = int(state["step"])
    return flat


def _v5_to_v6(state: dict[str, Any]) -> dict[str, Any]:
    torch = sys.modules.get("torch")
    if torch is None:  # nothing in the file was a tensor, so no optimizer either
        return state
    for obj in list(_reachable(state)):
        inner = getattr(obj, "__dict__", None)
        if isinstance(inner, dict) and isinstance(inner.get("optimizer"), torch.optim.Optimizer):
            inner["optimizer"] = _flat_optimizer(inner["optimizer"])
    return state


# -- version 6 -> 7 ------------------------------------------------------------------------------
# Version 6's recurrent Q-learner workers (agents.q_learning.SequenceAssembler) stepped one env copy (a
# TeamEnv) and kept its open episode as plain values: ``steps`` (a list of step dicts), ``first``,
# ``start`` and ``covered`` (ints). Version 7's assembler keeps one of each per env copy (a recurrent
# dqn steps a Gymnasium vector of several), as lists; version 6's one copy is copy 0.

def _v6_to_v7(state: dict[str, Any]) -> dict[str, Any]:
    for obj in _reachable(state):
        if "agents.q_learning.SequenceAssembler" in _class_names(obj) and isinstance(obj.__dict__.get("first"), int):
            for key in ("steps", "first", "start", "covered"):
                obj.__dict__[key] = [obj.__dict__[key]]
    return state


# version v -> the function that takes a state of version v to version v + 1
MIGRATIONS: dict[int, Callable[[dict[str, Any]], dict[str, Any]]] = {
    0: _v0_to_v1,
    1: _v1_to_v2,
    2: _v2_to_v3,
    3: _v3_to_v4,
    4: _v4_to_v5,
    5: _v5_to_v6,
    6: _v6_to_v7,
}
