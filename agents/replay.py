"""Replay storage for value-based learners: a ring buffer, prioritized replay, n-step windows, episodes.

Conventions (docs/value_based.md derives each piece).
- Storage is one preallocated numpy array per declared ``Field``, shaped (capacity, *field.shape); a
  stored transition is a row index, never a Python object. A multi-agent field carries its agent
  axis in its shape: obs (n_agents, obs_dim), action (n_agents,), avail (n_agents, n_actions); the
  global state (state_dim,) and a team reward () have none.
- A chunk is a mapping field name -> array (B, *field.shape). Row j of a chunk goes to row
  (pos + j) mod capacity, so the oldest rows are overwritten first; a chunk longer than the capacity
  leaves its last ``capacity`` rows, as writing it row by row would.
- Randomness comes only from a ``numpy.random.Generator`` the caller hands in. No buffer owns an RNG,
  so ``state_dict()`` is plain arrays: the filled rows, the write index, the size, the insert count.
- A replayed transition is (obs, action, reward, next_obs, terminated, discount, ...): ``reward`` the
  n-step sum, ``next_obs`` the bootstrap observation and ``discount`` gamma^k (``n_step_chunk``).
  next_obs is stored rather than read from a later row, because rows of several envs interleave and an
  n-step window's bootstrap state is k steps on; it doubles the observation bytes (``nbytes``).
- Input a user's config can get wrong raises ``ReplayConfigError`` (a ConfigError, so exit code 2
  once a config key feeds it, and a ValueError), naming the key and the value.
"""
from __future__ import annotations

import math
from typing import Any, Mapping, NamedTuple, Optional, Sequence

import numpy as np

from marl_q.errors import ConfigError


class ReplayConfigError(ConfigError, ValueError):
    """A replay setting or a chunk that cannot work (names the key and the value)."""


class Field(NamedTuple):
    """One stored quantity: its name, the shape of one transition's value, its dtype."""

    name: str
    shape: tuple[int, ...] = ()
    dtype: Any = np.float32


def transition_fields(obs_shape: Sequence[int], n_agents: Optional[int] = None, n_actions: Optional[int] = None,
                      state_dim: Optional[int] = None, per_agent_reward: bool = False) -> list[Field]:
    """The fields of a value-based learner's transitions (what ``n_step_chunk`` returns).

    ``n_agents`` None: single agent, no agent axis. ``n_actions`` given: the action masks ``avail`` and
    ``next_avail`` are stored. ``state_dim`` given: the global states ``state`` and ``next_state``
    (QMIX's mixer input). The reward is a team reward unless ``per_agent_reward`` (IQL on its own
    rewards)."""
    agent = () if n_agents is None else (int(n_agents),)
    obs = agent + tuple(int(s) for s in obs_shape)
    fields = [Field("obs", obs), Field("action", agent, np.int64),
              Field("reward", agent if per_agent_reward else ()), Field("next_obs", obs),
              Field("terminated", (), np.bool_), Field("discount", ())]
    if n_actions is not None:
        fields += [Field("avail", agent + (int(n_actions),), np.bool_),
                   Field("next_avail", agent + (int(n_actions),), np.bool_)]
    if state_dim is not None:
        fields += [Field("state", (int(state_dim),)), Field("next_state", (int(state_dim),))]
    return fields


def _positive_int(key: str, value: Any) -> int:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ReplayConfigError(f"{key} must be an integer >= 1, got {value!r}")
    return int(value)


def _unit_interval(key: str, value: Any) -> float:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.number)) or not 0.0 <= value <= 1.0:
        raise ReplayConfigError(f"{key} must lie in [0, 1], got {value!r}")
    return float(value)


def _plain_fields(fields: Sequence[Field]) -> list[tuple[str, tuple[int, ...], str]]:
    """Fields as plain tuples (name, shape, dtype string): ``Field(*t)`` makes each again."""
    return [(f.name, tuple(f.shape), np.dtype(f.dtype).str) for f in fields]


def _as_field(field: Field, value: Any, rows: Optional[int]) -> np.ndarray:
    """``value`` as an array (rows, *field.shape) of the field's dtype; a wrong shape or kind raises."""
    arr = np.asarray(value)
    if arr.shape[1:] != field.shape or arr.ndim != len(field.shape) + 1 or (rows is not None and len(arr) != rows):
        want = "(" + ", ".join([str(rows) if rows is not None else "B", *map(str, field.shape)]) + ")"
        raise ReplayConfigError(f"replay field {field.name!r}: expected shape {want}, got {arr.shape}")
    if field.dtype == np.bool_:
        return arr if arr.dtype == np.bool_ else arr != 0
    if not np.can_cast(arr.dtype, field.dtype, casting="same_kind"):
        raise ReplayConfigError(f"replay field {field.name!r}: cannot store {arr.dtype} values as {field.dtype}")
    return arr.astype(field.dtype, copy=False)


class ReplayBuffer:
    """A ring buffer of ``capacity`` transitions with uniform sampling (Mnih et al. 2015)."""

    def __init__(self, fields: Sequence[Field], capacity: int) -> None:
        self.capacity = _positive_int("replay.capacity", capacity)
        self.fields = tuple(Field(f.name, tuple(int(s) for s in f.shape), np.dtype(f.dtype)) for f in fields)
        names = [f.name for f in self.fields]
        if len(set(names)) != len(names) or not names:
            raise ValueError(f"replay fields need distinct names, got {names}")
        self.data = {f.name: np.zeros((self.capacity, *f.shape), f.dtype) for f in self.fields}
        self.pos = 0  # the row the next transition goes to
        self.size = 0  # rows holding a transition: rows [0, size)
        self.inserted = 0  # transitions ever added (what a ledger counts)

    def __len__(self) -> int:
        return self.size

    @property
    def bytes_per_transition(self) -> int:
        """Bytes one stored transition takes: sum over fields of prod(shape) * itemsize."""
        return sum(math.prod(f.shape) * f.dtype.itemsize for f in self.fields)

    @property
    def nbytes(self) -> int:
        """Bytes the buffer holds in its arrays (allocated for the whole capacity)."""
        return sum(a.nbytes for a in self.data.values())

    def check_batch_size(self, batch_size: int) -> None:
        """Raise when a batch cannot come from this buffer (a capacity smaller than the batch)."""
        batch_size = _positive_int("batch_size", batch_size)
        if batch_size > self.capacity:
            raise ReplayConfigError(
                f"replay.capacity={self.capacity} is smaller than a batch (batch_size={batch_size})")

    def _rows(self, chunk: Mapping[str, Any]) -> dict[str, np.ndarray]:
        names = {f.name for f in self.fields}
        missing, extra = sorted(names - set(chunk)), sorted(set(chunk) - names)
        if missing or extra:
            raise ReplayConfigError(f"replay chunk: missing fields {missing}, unknown fields {extra}")
        first = self.fields[0]
        rows = len(_as_field(first, chunk[first.name], None))
        return {f.name: _as_field(f, chunk[f.name], rows) for f in self.fields}

    def add(self, chunk: Mapping[str, Any]) -> np.ndarray:
        """Write a chunk of B transitions (vectorised, wrapping around); returns the rows written."""
        arrays = self._rows(chunk)
        total = len(next(iter(arrays.values())))
        keep = min(total, self.capacity)
        start = (self.pos + total - keep) % self.capacity
        rows = (start + np.arange(keep)) % self.capacity
        first = min(keep, self.capacity - start)  # rows [start, start+first), then [0, keep-first)
        for name, arr in arrays.items():
            tail = arr[total - keep:]
            self.data[name][start:start + first] = tail[:first]
            self.data[name][:keep - first] = tail[first:]
        self.pos = (self.pos + total) % self.capacity
        self.size = min(self.capacity, self.size + total)
        self.inserted += total
        return rows

    def gather(self, rows: np.ndarray) -> dict[str, np.ndarray]:
        """The stored transitions at ``rows`` (copies)."""
        return {name: arr[rows] for name, arr in self.data.items()}

    def _sample_rows(self, batch_size: int, rng: np.random.Generator) -> np.ndarray:
        self.check_batch_size(batch_size)
        if self.size == 0:
            raise ValueError("cannot sample from an empty replay buffer")
        return rng.integers(0, self.size, size=batch_size)

    def sample(self, batch_size: int, rng: np.random.Generator) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """``batch_size`` rows drawn uniformly with replacement from the filled ones, and their transitions."""
        rows = self._sample_rows(batch_size, rng)
        return rows, self.gather(rows)

    # the most bytes of filled rows a pickle (the sim backend's snapshot) may hold; None: no limit
    snapshot_max_bytes: Optional[int] = None

    def layout(self) -> dict[str, Any]:
        """The constructor's arguments as plain data: ``fields`` as (name, shape, dtype string) tuples,
        ``capacity`` (a subclass adds its own): what ``from_state`` builds an empty buffer of this shape
        from."""
        return {"fields": _plain_fields(self.fields), "capacity": self.capacity}

    @classmethod
    def from_state(cls, layout: Mapping[str, Any], state: Mapping[str, np.ndarray],
                   snapshot_max_bytes: Optional[int] = None) -> "ReplayBuffer":
        """A buffer of ``layout`` (``layout()``) holding ``state`` (``state_dict()``): what a pickle of a
        buffer holds and rebuilds (``__reduce__``); ``snapshot_max_bytes`` as the pickled buffer had it."""
        args = dict(layout)
        for key in ("fields", "episode_fields"):  # (an episode buffer's too)
            if key in args:
                args[key] = [Field(*f) for f in args[key]]
        buffer = cls(**args)
        buffer.load_state_dict(state)
        if snapshot_max_bytes is not None:
            buffer.snapshot_max_bytes = snapshot_max_bytes
        return buffer

    def __reduce__(self) -> tuple[Any, ...]:
        # a pickle (the sim backend's snapshot) holds the buffer as data, its layout and state_dict(): the
        # filled rows only, not the whole preallocated capacity, so a run's snapshot grows with the
        # buffer's content, and no attribute name of this class is in the file. Past snapshot_max_bytes
        # it refuses (TypeError: the sim backend then checkpoints without a snapshot and says so once)
        filled = self.size * self.bytes_per_transition
        if self.snapshot_max_bytes is not None and filled > self.snapshot_max_bytes:
            raise TypeError(f"the replay buffer holds {filled} bytes, more than "
                            f"algorithm.replay.snapshot_max_bytes={self.snapshot_max_bytes}")
        return type(self).from_state, (self.layout(), self.state_dict(), self.snapshot_max_bytes)

    def state_dict(self) -> dict[str, np.ndarray]:
        """Plain arrays: ``data.<field>`` (the filled rows, views of the storage: save them before the
        next add), ``capacity``, ``pos``, ``size``, ``inserted``."""
        state = {"capacity": np.array(self.capacity), "pos": np.array(self.pos), "size": np.array(self.size),
                 "inserted": np.array(self.inserted)}
        state.update({f"data.{name}": arr[:self.size] for name, arr in self.data.items()})
        return state

    def load_state_dict(self, state: Mapping[str, np.ndarray]) -> None:
        """Restore what ``state_dict`` returned; a state of another layout raises, naming the key."""
        for key in ("capacity", "pos", "size", "inserted"):
            if key not in state:
                raise ValueError(f"replay state: missing {key!r}")
        if int(state["capacity"]) != self.capacity:
            raise ValueError(f"replay state: capacity {int(state['capacity'])} != this buffer's {self.capacity}")
        size, pos = int(state["size"]), int(state["pos"])
        if not 0 <= size <= self.capacity or not 0 <= pos < self.capacity:
            raise ValueError(f"replay state: size {size} / pos {pos} outside capacity {self.capacity}")
        for f in self.fields:
            key = f"data.{f.name}"
            arr = state.get(key)
            if arr is None or arr.shape != (size, *f.shape) or arr.dtype != f.dtype:
                got = "missing" if arr is None else f"{arr.dtype} {arr.shape}"
                raise ValueError(f"replay state: {key} must be {f.dtype} {(size, *f.shape)}, got {got}")
        for f in self.fields:
            self.data[f.name][:size] = state[f"data.{f.name}"]
            self.data[f.name][size:] = 0
        self.pos, self.size, self.inserted = pos, size, int(state["inserted"])


class SumTree:
    """Sums and minima of ``capacity`` non-negative leaves, as two complete binary trees in numpy arrays.

    Node 1 is the root, node j's children are 2j and 2j+1, leaf i is node L + i with L the smallest
    power of two >= capacity. Unwritten leaves count 0 in the sums and +inf in the minima. An update
    recomputes every ancestor from its two children, one vectorised step per level, so a node's value
    depends only on the leaves below it (no drift from adding differences, and the same tree whatever
    the order of updates).
    """

    def __init__(self, capacity: int) -> None:
        self.capacity = _positive_int("replay.capacity", capacity)
        self.first_leaf = 1 << (self.capacity - 1).bit_length()
        self.sums = np.zeros(2 * self.first_leaf)
        self.mins = np.full(2 * self.first_leaf, np.inf)

    @property
    def total(self) -> float:
        """The sum of all leaves."""
        return float(self.sums[1])

    @property
    def min(self) -> float:
        """The smallest written leaf (+inf when none is)."""
        return float(self.mins[1])

    def get(self, leaves: np.ndarray) -> np.ndarray:
        """The values at leaf indices ``leaves``."""
        return self.sums[self.first_leaf + np.asarray(leaves)]

    def update(self, leaves: np.ndarray, values: np.ndarray) -> None:
        """Set leaves to values (a repeated leaf takes its last value) and recompute their ancestors."""
        leaves = np.asarray(leaves, dtype=np.int64).reshape(-1)
        values = np.broadcast_to(np.asarray(values, dtype=np.float64), leaves.shape)
        if leaves.size == 0:
            return
        if leaves.min() < 0 or leaves.max() >= self.capacity:
            raise IndexError(f"sum-tree leaves must lie in [0, {self.capacity}), got {leaves.min()}..{leaves.max()}")
        if not np.all(np.isfinite(values) & (values >= 0)):
            raise ValueError("sum-tree values must be finite and >= 0")
        _, last = np.unique(leaves[::-1], return_index=True)
        keep = len(leaves) - 1 - last
        nodes = leaves[keep] + self.first_leaf
        self.sums[nodes] = values[keep]
        self.mins[nodes] = values[keep]
        while nodes[0] > 1:  # all nodes sit at one depth
            nodes = np.unique(nodes >> 1)
            left, right = 2 * nodes, 2 * nodes + 1
            self.sums[nodes] = self.sums[left] + self.sums[right]
            self.mins[nodes] = np.minimum(self.mins[left], self.mins[right])

    def find(self, prefixes: np.ndarray) -> np.ndarray:
        """For each prefix sum u in [0, total), the leaf i with sum(leaves < i) <= u < sum(leaves <= i).

        One vectorised descent: go right when u >= the left child's sum (subtracting it), never into a
        zero subtree, so a zero leaf is never returned even when rounding puts u at the total."""
        u = np.asarray(prefixes, dtype=np.float64).reshape(-1).copy()
        nodes = np.ones(len(u), dtype=np.int64)
        if len(u) and self.total <= 0:
            raise ValueError("cannot search a sum tree whose total is 0")
        depth = self.first_leaf.bit_length() - 1
        for _ in range(depth):
            left = self.sums[2 * nodes]
            right_sum = self.sums[2 * nodes + 1]
            go_right = (u >= left) & (right_sum > 0)
            u = np.where(go_right, u - left, u)
            nodes = 2 * nodes + go_right
        return nodes - self.first_leaf


class PrioritizedReplayBuffer(ReplayBuffer):
    """Proportional prioritized replay (Schaul et al. 2016): P(i) = p_i^alpha / sum_j p_j^alpha.

    p_i = |delta_i| + ``priority_eps`` after an update; a new transition gets the largest p seen so far
    (1 before any update), so it is replayed at least once soon. The tree stores p_i^alpha. Importance
    weights w_i = (N P(i))^-beta / max_j w_j with the max over the whole buffer (the smallest P), as
    OpenAI Baselines and RLlib do, so w <= 1; N cancels: w_i = (P(i) / P_min)^-beta.
    """

    def __init__(self, fields: Sequence[Field], capacity: int, alpha: float, priority_eps: float = 1e-6) -> None:
        super().__init__(fields, capacity)
        self.alpha = _unit_interval("replay.alpha", alpha)
        if not (isinstance(priority_eps, (int, float)) and priority_eps > 0 and math.isfinite(priority_eps)):
            raise ReplayConfigError(f"replay.priority_eps must be a finite number > 0, got {priority_eps!r}")
        self.priority_eps = float(priority_eps)
        self.tree = SumTree(self.capacity)
        self.max_priority = 1.0

    @property
    def nbytes(self) -> int:
        """Bytes of the transitions plus the two trees (2 L float64 each, L >= capacity a power of two)."""
        return super().nbytes + self.tree.sums.nbytes + self.tree.mins.nbytes

    def add(self, chunk: Mapping[str, Any]) -> np.ndarray:
        """Write a chunk; its transitions get the largest priority seen so far."""
        rows = super().add(chunk)
        self.tree.update(rows, self.max_priority ** self.alpha)
        return rows

    def sample(self, batch_size: int, rng: np.random.Generator, beta: float = 1.0
               ) -> tuple[np.ndarray, dict[str, np.ndarray], np.ndarray]:
        """``batch_size`` rows drawn i.i.d. with probability P(i), their transitions, and float32 weights.

        Each draw is u ~ U[0, total) and the leaf whose prefix interval holds u (not Schaul's stratified
        segments: i.i.d. draws keep the batch a sample of P and the test a plain chi-square)."""
        beta = _unit_interval("replay.beta", beta)
        self.check_batch_size(batch_size)
        if self.size == 0:
            raise ValueError("cannot sample from an empty replay buffer")
        total = self.tree.total
        rows = self.tree.find(rng.random(batch_size) * total)
        probs = self.tree.get(rows) / total
        weights = (probs / (self.tree.min / total)) ** -beta
        return rows, self.gather(rows), weights.astype(np.float32)

    def update_priorities(self, rows: np.ndarray, td_errors: np.ndarray) -> None:
        """Set p_i = |delta_i| + priority_eps for the sampled ``rows`` (a repeated row takes its last delta)."""
        rows = np.asarray(rows, dtype=np.int64).reshape(-1)
        p = np.abs(np.asarray(td_errors, dtype=np.float64)).reshape(-1) + self.priority_eps
        if p.shape != rows.shape:
            raise ValueError(f"update_priorities: {len(rows)} rows but {p.size} TD errors")
        if not np.all(np.isfinite(p)):
            raise ValueError("update_priorities: TD errors must be finite")
        if rows.size and (rows.min() < 0 or rows.max() >= self.size):
            raise IndexError(f"update_priorities: rows must lie in [0, {self.size})")
        self.tree.update(rows, p ** self.alpha)
        if p.size:
            self.max_priority = max(self.max_priority, float(p.max()))

    def layout(self) -> dict[str, Any]:
        return dict(super().layout(), alpha=self.alpha, priority_eps=self.priority_eps)

    def state_dict(self) -> dict[str, np.ndarray]:
        """The ring buffer's arrays plus ``priorities`` (the filled leaves, p^alpha), ``max_priority``, ``alpha``."""
        state = super().state_dict()
        state.update(priorities=self.tree.get(np.arange(self.size)), max_priority=np.array(self.max_priority),
                     alpha=np.array(self.alpha))
        return state

    def load_state_dict(self, state: Mapping[str, np.ndarray]) -> None:
        """Restore the transitions and rebuild the trees from the stored leaves."""
        for key in ("priorities", "max_priority", "alpha"):
            if key not in state:
                raise ValueError(f"prioritized replay state: missing {key!r}")
        if float(state["alpha"]) != self.alpha:
            raise ValueError(f"prioritized replay state: alpha {float(state['alpha'])} != this buffer's {self.alpha}")
        super().load_state_dict(state)
        if state["priorities"].shape != (self.size,):
            raise ValueError(f"prioritized replay state: priorities must have shape ({self.size},)")
        self.tree = SumTree(self.capacity)
        self.tree.update(np.arange(self.size), state["priorities"])
        self.max_priority = float(state["max_priority"])


class NStep(NamedTuple):
    """n-step windows of a (T, N) chunk; see ``n_step_windows``."""

    returns: np.ndarray  # (T, N, ...) sum_{j<k} gamma^j r_{t+j}
    last: np.ndarray  # (T, N) int: t + k - 1, the step whose next_obs is the bootstrap state
    discount: np.ndarray  # (T, N) gamma^k
    terminated: np.ndarray  # (T, N) bool: the window ended at a termination (no bootstrap)
    complete: np.ndarray  # (T, N) bool: k == n, or the window ended with its episode


def n_step_windows(rewards: np.ndarray, terminated: np.ndarray, truncated: np.ndarray, gamma: float,
                   n: int) -> NStep:
    """n-step reward sums, bootstrap steps and discounts for T consecutive steps of N envs.

    The window of step t covers steps t..t+k-1 with k = n, cut short
    - at the first step t' >= t that terminated: k = t'-t+1, no bootstrap (``terminated`` True);
    - at the first step t' >= t that was truncated: k = t'-t+1, bootstrap from next_obs[t'] (with
      Gymnasium's next-step autoreset the truncated episode's final observation, as agents/returns.py
      assumes); a step both terminated and truncated counts as terminated;
    - at the end of the chunk: k = T - t, bootstrap from next_obs[T-1] (``complete`` False; a worker that
      wants every window of length n keeps its last n-1 steps and sends them again with the next chunk).
    The target is then R_t + gamma^k (1 - terminated) max_a Q(next_obs[t+k-1], a).
    ``rewards`` (T, N, ...) (trailing axes, e.g. agents, are summed alike); ``terminated``/``truncated`` (T, N).
    """
    n = _positive_int("replay.n_step", n)
    gamma = _unit_interval("algorithm.gamma", gamma)
    rewards = np.asarray(rewards, dtype=np.float64)
    term = np.asarray(terminated, dtype=bool)
    trunc = np.asarray(truncated, dtype=bool)
    if term.ndim != 2 or trunc.shape != term.shape or rewards.shape[:2] != term.shape:
        raise ValueError(f"n_step_windows: rewards (T, N, ...), terminated and truncated (T, N); got "
                         f"{rewards.shape}, {term.shape}, {trunc.shape}")
    T = term.shape[0]
    extra = (1,) * (rewards.ndim - 2)
    returns = np.zeros_like(rewards)
    k = np.zeros(term.shape, dtype=np.int64)
    open_ = np.ones(term.shape, dtype=bool)  # the window of step t still takes steps
    ended_term = np.zeros(term.shape, dtype=bool)
    ended = np.zeros(term.shape, dtype=bool)
    for j in range(min(n, T)):  # add step t+j to every window still open (rows t < T - j)
        active = open_[:T - j]
        returns[:T - j] += np.where(active.reshape(active.shape + extra), gamma ** j * rewards[j:], 0.0)
        k[:T - j] += active
        hit_term = active & term[j:]
        hit_end = hit_term | (active & trunc[j:])
        ended_term[:T - j] |= hit_term
        ended[:T - j] |= hit_end
        open_[:T - j] &= ~hit_end
    last = np.arange(T)[:, None] + k - 1
    return NStep(returns, last, gamma ** k.astype(np.float64), ended_term, (k == n) | ended)


def n_step_chunk(chunk: Mapping[str, Any], gamma: float, n: int, drop_incomplete: bool = False
                 ) -> dict[str, np.ndarray]:
    """Replay rows from a chunk of T steps of N envs, each value (T, N, ...).

    ``reward``, ``terminated`` and ``truncated`` are required. The result has T*N rows in (t, env) order:
    ``reward`` the n-step sum, ``terminated`` and ``discount`` from ``n_step_windows``; every key that
    starts with ``next_`` taken at the bootstrap step t+k-1, every other key at t; ``truncated`` dropped.
    ``drop_incomplete`` keeps only windows of length n or cut by their episode's end."""
    for key in ("reward", "terminated", "truncated"):
        if key not in chunk:
            raise ValueError(f"n_step_chunk: the chunk needs {key!r}")
    win = n_step_windows(chunk["reward"], chunk["terminated"], chunk["truncated"], gamma, n)
    T, N = win.last.shape
    env = np.broadcast_to(np.arange(N), (T, N))
    keep = win.complete.reshape(-1) if drop_incomplete else slice(None)
    out: dict[str, np.ndarray] = {}
    for key, value in chunk.items():
        if key in ("reward", "terminated", "truncated"):
            continue
        arr = np.asarray(value)
        if arr.shape[:2] != (T, N):
            raise ValueError(f"n_step_chunk: {key!r} must start with (T, N) = {(T, N)}, got {arr.shape}")
        picked = arr[win.last, env] if key.startswith("next_") else arr
        out[key] = picked.reshape(T * N, *arr.shape[2:])[keep]
    out["reward"] = win.returns.astype(np.float32).reshape(T * N, *win.returns.shape[2:])[keep]
    out["terminated"] = win.terminated.reshape(-1)[keep]
    out["discount"] = win.discount.astype(np.float32).reshape(-1)[keep]
    return out


class EpisodeBuffer(ReplayBuffer):
    """Whole episodes (or R2D2's fixed-length sequences) for recurrent agents, padded to ``max_len``
    steps, ``capacity`` of them.

    Each step field is stored (capacity, max_len, *shape); the added field ``mask`` (max_len,) is True
    on an episode's steps and False on the padding, whose values are zeros. ``episode_fields`` are
    stored once per row, unpadded (capacity, *shape): a sequence's start state, for example. Sampling
    draws whole rows uniformly (EPyMARL's episode buffer)."""

    def __init__(self, fields: Sequence[Field], capacity: int, max_len: int,
                 episode_fields: Sequence[Field] = ()) -> None:
        self.max_len = _positive_int("replay.max_episode_len", max_len)
        self.step_fields = tuple(Field(f.name, tuple(int(s) for s in f.shape), np.dtype(f.dtype)) for f in fields)
        self.episode_fields = tuple(Field(f.name, tuple(int(s) for s in f.shape), np.dtype(f.dtype))
                                    for f in episode_fields)
        if any(f.name == "mask" for f in self.step_fields + self.episode_fields):
            raise ValueError("'mask' is the episode buffer's own field; name the field otherwise")
        padded = [Field(f.name, (self.max_len, *f.shape), f.dtype) for f in self.step_fields]
        super().__init__(padded + [Field("mask", (self.max_len,), np.bool_)] + list(self.episode_fields), capacity)

    def layout(self) -> dict[str, Any]:
        return {"fields": _plain_fields(self.step_fields), "capacity": self.capacity, "max_len": self.max_len,
                "episode_fields": _plain_fields(self.episode_fields)}

    def pad(self, episodes: Mapping[str, Any], lengths: Any = None) -> dict[str, np.ndarray]:
        """E episodes, each step field (E, L, *shape) with L <= max_len and ``lengths`` (E,) (default L),
        each episode field (E, *shape), as the rows ``add_padded`` takes: padded to ``max_len`` with
        zeros, and ``mask``."""
        names = {f.name for f in self.step_fields + self.episode_fields}
        missing, extra = sorted(names - set(episodes)), sorted(set(episodes) - names)
        if missing or extra:
            raise ReplayConfigError(f"episode chunk: missing fields {missing}, unknown fields {extra}")
        first = np.asarray(episodes[self.step_fields[0].name])
        if first.ndim < 2:
            name = self.step_fields[0].name
            raise ReplayConfigError(f"episode field {name!r}: expected (E, L, ...), got {first.shape}")
        E, L = first.shape[:2]
        if L > self.max_len:
            raise ReplayConfigError(f"replay.max_episode_len={self.max_len} is shorter than an episode of {L} steps")
        lengths = np.full(E, L) if lengths is None else np.asarray(lengths, dtype=np.int64).reshape(-1)
        if lengths.shape != (E,) or (E and (lengths.min() < 1 or lengths.max() > L)):
            raise ReplayConfigError(f"episode lengths must be {E} integers in [1, {L}], got {lengths.tolist()}")
        mask = np.arange(self.max_len) < lengths[:, None]
        padded: dict[str, np.ndarray] = {"mask": mask}
        for f in self.step_fields:
            arr = _as_field(Field(f.name, (L, *f.shape), f.dtype), episodes[f.name], E)
            out = np.zeros((E, self.max_len, *f.shape), f.dtype)
            out[:, :L] = arr
            out[~mask] = 0
            padded[f.name] = out
        for f in self.episode_fields:
            padded[f.name] = _as_field(f, episodes[f.name], E)
        return padded

    def add(self, episodes: Mapping[str, Any], lengths: Any = None) -> np.ndarray:  # type: ignore[override]
        """Write E episodes (``pad``'s arguments); returns the rows written."""
        return self.add_padded(self.pad(episodes, lengths))

    def add_padded(self, rows: Mapping[str, Any]) -> np.ndarray:
        """Write rows already padded (every field as stored, ``mask`` included; what ``pad`` returns or a
        worker sent): each mask must be a prefix of at least one step, and the padding is zeroed."""
        arrays = self._rows(rows)
        mask = arrays["mask"]
        lengths = mask.sum(1)
        if len(mask) and (lengths.min() < 1 or (mask != (np.arange(self.max_len) < lengths[:, None])).any()):
            raise ReplayConfigError("episode mask: each row's steps must be a prefix of at least one step")
        for f in self.step_fields:
            arrays[f.name] = arrays[f.name].copy()
            arrays[f.name][~mask] = 0
        return super().add(arrays)


def sequence_windows(length: int, sequence: int, overlap: int) -> list[tuple[int, int]]:
    """R2D2's replay sequences of an episode of ``length`` steps: windows [s, min(s + sequence, length))
    starting at s = 0, S, 2S, ... with the stride S = sequence - overlap (adjacent windows share
    ``overlap`` steps), up to the first window that reaches the episode's end. An episode no longer
    than ``sequence`` is one window: EPyMARL's whole-episode replay."""
    sequence = _positive_int("replay.sequence", sequence)
    if isinstance(overlap, bool) or not isinstance(overlap, (int, np.integer)) or not 0 <= overlap < sequence:
        raise ReplayConfigError(f"replay.overlap must be an integer in [0, replay.sequence={sequence}), got {overlap!r}")
    out, s = [], 0
    while True:
        out.append((s, min(s + sequence, length)))
        if s + sequence >= length:
            return out
        s += sequence - overlap
