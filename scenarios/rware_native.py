"""The multi-robot warehouse over arrays: rware 2.0.0's ``Warehouse`` (its registered tasks, flattened
observations) without its per-robot objects and its networkx graph, every copy stepped in one compiled call.

``WarehouseNative(task)`` is a PettingZoo ``ParallelEnv`` that reproduces
``FlatParallelEnv(TupleParallelEnv(gymnasium.make("rware:" + task)))`` (what ``scenario.name:
gymnasium`` makes of it) step for step: agents ``agent_0`` .. ``agent_{N-1}``, the same float32
observations, the same rewards (``common_reward``: every agent gets their mean), every agent
terminated (never truncated) after 500 steps, and the same reset draws from the same seed. ``task`` is one
of rware's registered ids, ``rware-{tiny,small,medium,large}-{N}ag[-easy|-hard]-v2`` (N 1..19). The
package is not needed to run it; tests/scenarios/test_rware_native.py compares the two when it is.

What it copies from rware/warehouse.py (2.0.0), for a warehouse of ``shelf_rows`` x ``shelf_columns``
blocks of columns 8 high (tiny 1 x 3, small 2 x 3, medium 2 x 5, large 3 x 5):

- **layout**: a grid of (9 rows + 2) x (3 columns + 1) cells; highways on every third column, every ninth
  row, the bottom row and the two queue columns above the goals; a shelf on every other cell (numbered
  row by row); two goals in the bottom row's middle.
- **reset**: gymnasium's ``np.random.Generator`` (reseeded only when a seed is given): the robots' cells
  (distinct, any cell, ``choice`` without replacement), their directions, and the requested shelves
  (``request_queue_size``: N, x2 easy, x0.5 hard), drawn as rware draws them. Shelves back in place,
  robots unloaded.
- **step**: a robot carrying a shelf may not drive into a cell holding a standing shelf (its move is
  cancelled). The moves then resolve as rware's graph of (cell -> target) edges does: in each connected
  group, a cycle commits its robots (a two-robot swap commits none) and a robot standing still commits
  itself only; a group without a cycle commits its longest chain into the free cell; every other robot
  that wanted to move stays. Where two equally long chains meet at a free cell, rware's winner follows
  the iteration order of a Python ``set`` of cell tuples inside networkx (``dag_longest_path`` over the
  component's subgraph): the loops flag those steps and ``networkx_commits`` runs rware's own calls. Then turns (left / right), pick-up (a shelf under an unloaded
  robot) and put-down (only off the highways). A requested shelf at a goal pays 1 to the robot there and
  is replaced in the queue by a shelf drawn uniformly from the ones not requested.
- **observation** (float32, 8 + 7 per cell of the 3 x 3 view): x, y, carrying, direction one-hot (up,
  down, left, right), on a highway; then per cell, row by row: a robot there, its direction one-hot (up
  when none), a shelf there, whether it is requested. Outside the grid: nothing.

``WarehouseNative.batched(envs)`` -> ``WarehouseBatch``: E copies as (E, ...) arrays, moved and observed
by compiled loops (``marl_q.compiled``; Python where numba is off); deliveries, which draw from a copy's
generator, run in Python for the copies that have one. Not supported: messages (``msg_bits``), image
observations, other sensor ranges, global or two-stage rewards, an inactivity limit, rendering.

``python -m scenarios.rware_native --steps 20000`` times rware against one copy and a batch of 8.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable, Optional

import numpy as np
import pettingzoo
from gymnasium import spaces
from pettingzoo import ParallelEnv

from marl_q.compiled import njit_or_python
from scenarios.native import (NativeBatch, NativeEnv, bare_task, bench_main, check_engine, need_package, package_env,
                              time_engines)
from scenarios.spec import ScenarioSpec

N_ACTIONS = 5  # noop, forward, left, right, toggle load
NOOP, FORWARD, LEFT, RIGHT, TOGGLE = range(N_ACTIONS)
UP, DOWN, WEST, EAST = range(4)  # rware's Direction: UP, DOWN, LEFT, RIGHT
SIZES = {"tiny": (1, 3), "small": (2, 3), "medium": (2, 5), "large": (3, 5)}
DIFFICULTY = {"-easy": 2.0, "": 1.0, "-hard": 0.5}
TASK = re.compile(r"^rware-(tiny|small|medium|large)-(\d+)ag(-easy|-hard)?-v2$")
TASK_FORM = "rware-{tiny,small,medium,large}-{N}ag[-easy|-hard]-v2 with N in 1..19 (rware 2.0.0's ids)"
COLUMN_HEIGHT = 8
SENSOR = 1
OBS_DIM = 8 + 7 * (2 * SENSOR + 1) ** 2


@dataclass(frozen=True)
class Layout:
    """One rware task: the grid, its highways, goals and shelf cells, and the request queue's size."""

    rows: int
    cols: int
    agents: int
    queue: int
    max_steps: int = 500

    @classmethod
    def of(cls, task: Any) -> "Layout":
        text = bare_task(task, "rware")
        m = TASK.match(text) if isinstance(text, str) else None
        if m is None or not 1 <= int(m.group(2)) <= 19:
            raise ValueError(f"scenario.task must be an rware id, {TASK_FORM}; got {task!r}")
        shelf_rows, shelf_cols = SIZES[m.group(1)]
        agents = int(m.group(2))
        layout = cls(rows=(COLUMN_HEIGHT + 1) * shelf_rows + 2, cols=3 * shelf_cols + 1, agents=agents,
                     queue=int(agents * DIFFICULTY[m.group(3) or ""]))
        shelves = int((layout.highways() == 0).sum())
        if layout.queue > shelves:  # rware registers such ids, but its reset cannot draw the requests
            raise ValueError(f"scenario.task {task!r} requests {layout.queue} shelves at a time of the {shelves} "
                             "its warehouse has (rware's reset fails on it too)")
        return layout

    def highways(self) -> np.ndarray:
        """(rows, cols) uint8, rware's highway_func."""
        y, x = np.indices((self.rows, self.cols))
        queue = (y > self.rows - (COLUMN_HEIGHT + 3)) & ((x == self.cols // 2 - 1) | (x == self.cols // 2))
        return ((x % 3 == 0) | (y % (COLUMN_HEIGHT + 1) == 0) | (y == self.rows - 1) | queue).astype(np.uint8)

    def goals(self) -> np.ndarray:
        """(2, 2) int64 goal cells as (x, y), rware's order."""
        return np.array([[self.cols // 2 - 1, self.rows - 1], [self.cols // 2, self.rows - 1]], dtype=np.int64)

    def shelf_cells(self) -> np.ndarray:
        """(S, 2) int64: each shelf's starting (x, y), shelf k + 1 at row k (row-major over the non-highway cells)."""
        y, x = np.nonzero(self.highways() == 0)
        return np.stack([x, y], axis=1).astype(np.int64)


# ----------------------------------------------------------------------------- the loops
def _fill_py(pos, shelf_pos, e, agent_at, shelf_at):
    """Copy e's grid layers, as rware's _recalc_grid: the robot (index + 1) and the shelf (id) on each cell."""
    agent_at[:, :] = 0
    shelf_at[:, :] = 0
    for s in range(shelf_pos.shape[1]):
        shelf_at[shelf_pos[e, s, 1], shelf_pos[e, s, 0]] = s + 1
    for i in range(pos.shape[1]):
        agent_at[pos[e, i, 1], pos[e, i, 0]] = i + 1


_fill = _fill_py  # compiled by kernels() before the loops that call it


def _plan_py(pos, direction, carrying, shelf_pos, highway, actions, active, act, tx, ty, commit, tie):
    """Each robot's action after rware's checks, its target cell and whether its move commits, in the copies e
    with ``active[e]``; pos (E, N, 2) (x, y), direction (E, N), carrying (E, N) (shelf id, 0 none), shelf_pos
    (E, S, 2), highway (H, W), actions (E, N). Writes act, tx, ty (E, N) int64, commit (E, N) bool, and tie
    (E,): a free cell that two equally long chains of robots move into, whose winner rware's networkx calls
    pick by Python's set order (the caller resolves those copies with the same calls)."""
    E, N = pos.shape[0], pos.shape[1]
    H, W = highway.shape[0], highway.shape[1]
    agent_at = np.zeros((H, W), dtype=np.int64)
    shelf_at = np.zeros((H, W), dtype=np.int64)
    succ = np.empty(N, dtype=np.int64)
    on_cycle = np.zeros(N, dtype=np.bool_)
    dist = np.zeros(N, dtype=np.int64)
    seen = np.zeros(N, dtype=np.int64)
    for e in range(E):
        tie[e] = False
        for i in range(N):
            commit[e, i] = False
        if not active[e]:
            continue
        _fill(pos, shelf_pos, e, agent_at, shelf_at)
        for i in range(N):  # the requested cells, a carrying robot's move into a standing shelf cancelled
            x, y = pos[e, i, 0], pos[e, i, 1]
            a = actions[e, i]
            tx[e, i], ty[e, i] = x, y
            if a == FORWARD:
                d = direction[e, i]
                if d == UP:
                    ty[e, i] = max(0, y - 1)
                elif d == DOWN:
                    ty[e, i] = min(H - 1, y + 1)
                elif d == WEST:
                    tx[e, i] = max(0, x - 1)
                else:
                    tx[e, i] = min(W - 1, x + 1)
                moves = tx[e, i] != x or ty[e, i] != y
                other = agent_at[ty[e, i], tx[e, i]]
                if carrying[e, i] != 0 and moves and shelf_at[ty[e, i], tx[e, i]] != 0 and not (
                        other != 0 and carrying[e, other - 1] != 0):
                    a = NOOP
                    tx[e, i], ty[e, i] = x, y
            act[e, i] = a
        for i in range(N):  # the graph's one out-edge per robot: to the robot at its target (-1: a free cell)
            if tx[e, i] == pos[e, i, 0] and ty[e, i] == pos[e, i, 1]:
                succ[i] = i
            else:
                succ[i] = agent_at[ty[e, i], tx[e, i]] - 1
            on_cycle[i] = False
            dist[i] = 0
        for i in range(N):  # cycles (a robot standing still is one of length 1); a swap commits nobody
            for j in range(N):
                seen[j] = 0
            k, step = i, 1
            while k >= 0 and seen[k] == 0:
                seen[k] = step
                step += 1
                k = succ[k]
            if k == i:
                on_cycle[i] = True
                commit[e, i] = step - seen[k] != 2
        for _ in range(N):  # the longest chain of robots ending at each robot (trees only), to a fixed point
            for j in range(N):
                t = succ[j]
                if t >= 0 and t != j and not on_cycle[t] and dist[j] + 1 > dist[t]:
                    dist[t] = dist[j] + 1
        for i in range(N):  # each free target cell, once (at its lowest-index robot): commit its longest chain
            if succ[i] != -1:
                continue
            first = True
            for j in range(i):
                if succ[j] == -1 and tx[e, j] == tx[e, i] and ty[e, j] == ty[e, i]:
                    first = False
                    break
            if not first:
                continue
            best = -1
            for j in range(i, N):
                if succ[j] == -1 and tx[e, j] == tx[e, i] and ty[e, j] == ty[e, i]:
                    if best < 0 or dist[j] > dist[best]:
                        best = j
                    elif dist[j] == dist[best]:
                        tie[e] = True
            k = best
            while k >= 0:
                commit[e, k] = True
                nxt = -1
                for j in range(N):
                    if succ[j] == k and j != k:
                        if nxt < 0 or dist[j] > dist[nxt]:
                            nxt = j
                        elif dist[j] == dist[nxt]:
                            tie[e] = True
                k = nxt


def _apply_py(pos, direction, carrying, shelf_pos, highway, active, act, tx, ty, commit, goals, goal_shelf,
              goal_agent):
    """rware's second half of a step in the copies e with ``active[e]``, from ``_plan_py``'s act, targets and
    commits: moves (a move that did not commit stays), turns, pick-up, put-down (off the highways only). Writes
    goal_shelf (E, 2), the shelf id at each goal afterwards (0: none), and goal_agent (E, 2), the robot there
    (-1: none); the caller pays deliveries (they draw from the copy's generator)."""
    E, N = pos.shape[0], pos.shape[1]
    H, W = highway.shape[0], highway.shape[1]
    agent_at = np.zeros((H, W), dtype=np.int64)
    shelf_at = np.zeros((H, W), dtype=np.int64)
    for e in range(E):
        goal_shelf[e, 0], goal_shelf[e, 1] = 0, 0
        goal_agent[e, 0], goal_agent[e, 1] = -1, -1
        if not active[e]:
            continue
        _fill(pos, shelf_pos, e, agent_at, shelf_at)  # the grid before the moves: rware recalculates it after them
        for i in range(N):
            a = act[e, i]
            if a == FORWARD and not commit[e, i]:
                a = NOOP
            if a == FORWARD:
                pos[e, i, 0], pos[e, i, 1] = tx[e, i], ty[e, i]
                if carrying[e, i] != 0:
                    shelf_pos[e, carrying[e, i] - 1, 0] = tx[e, i]
                    shelf_pos[e, carrying[e, i] - 1, 1] = ty[e, i]
            elif a == LEFT:  # rware's wraplist: up, right, down, left
                d = direction[e, i]
                direction[e, i] = WEST if d == UP else (UP if d == EAST else (EAST if d == DOWN else DOWN))
            elif a == RIGHT:
                d = direction[e, i]
                direction[e, i] = EAST if d == UP else (DOWN if d == EAST else (WEST if d == DOWN else UP))
            elif a == TOGGLE:
                x, y = pos[e, i, 0], pos[e, i, 1]
                if carrying[e, i] == 0:
                    carrying[e, i] = shelf_at[y, x]
                elif highway[y, x] == 0:
                    carrying[e, i] = 0
        _fill(pos, shelf_pos, e, agent_at, shelf_at)
        for g in range(2):
            goal_shelf[e, g] = shelf_at[goals[g, 1], goals[g, 0]]
            goal_agent[e, g] = agent_at[goals[g, 1], goals[g, 0]] - 1


def networkx_commits(starts: list[tuple[int, int]], targets: list[tuple[int, int]]) -> list[bool]:
    """Which robots' moves commit, by rware's own networkx calls on the (cell -> target) edges in robot order
    (rware/warehouse.py's step): used where two equally long chains reach one free cell, whose winner follows
    the iteration order of networkx's component sets."""
    import networkx as nx

    G = nx.DiGraph()
    for start, target in zip(starts, targets):
        G.add_edge(start, target)
    robot_at = {cell: i for i, cell in enumerate(starts)}
    committed = set()
    for comp in [G.subgraph(c).copy() for c in nx.weakly_connected_components(G)]:
        try:
            cycle = nx.algorithms.find_cycle(comp)
            if len(cycle) == 2:
                continue
            committed.update(robot_at[edge[0]] for edge in cycle if edge[0] in robot_at)
        except nx.NetworkXNoCycle:
            committed.update(robot_at[cell] for cell in nx.algorithms.dag_longest_path(comp) if cell in robot_at)
    return [i in committed for i in range(len(starts))]


def _observe_py(pos, direction, carrying, shelf_pos, highway, requested, obs):
    """Every robot's observation of every copy into obs (E, N, 71) float32 (the module docstring)."""
    E, N = pos.shape[0], pos.shape[1]
    H, W = highway.shape[0], highway.shape[1]
    agent_at = np.zeros((H, W), dtype=np.int64)
    shelf_at = np.zeros((H, W), dtype=np.int64)
    for e in range(E):
        _fill(pos, shelf_pos, e, agent_at, shelf_at)
        for i in range(N):
            o = obs[e, i]
            x, y = pos[e, i, 0], pos[e, i, 1]
            for k in range(o.shape[0]):
                o[k] = 0.0
            o[0], o[1] = x, y
            o[2] = 1.0 if carrying[e, i] != 0 else 0.0
            o[3 + direction[e, i]] = 1.0
            o[7] = highway[y, x]
            k = 8
            for yy in range(y - SENSOR, y + SENSOR + 1):
                for xx in range(x - SENSOR, x + SENSOR + 1):
                    inside = 0 <= yy < H and 0 <= xx < W
                    a = agent_at[yy, xx] if inside else 0
                    s = shelf_at[yy, xx] if inside else 0
                    if a == 0:
                        o[k + 1] = 1.0  # "up" when no robot is there, as rware writes it
                    else:
                        o[k] = 1.0
                        o[k + 1 + direction[e, a - 1]] = 1.0
                    if s != 0:
                        o[k + 5] = 1.0
                        o[k + 6] = 1.0 if requested[e, s] else 0.0
                    k += 7


_KERNELS: Optional[tuple[Callable[..., None], Callable[..., None], Callable[..., None]]] = None


def kernels() -> tuple[Callable[..., None], Callable[..., None], Callable[..., None]]:
    """(plan, apply, observe), compiled on first use where ``marl_q.compiled.allowed()``, else the Python functions."""
    global _KERNELS, _fill
    if _KERNELS is None:
        (_fill,) = njit_or_python(_fill_py)  # the loops below call it: numba binds it when it compiles them
        _KERNELS = njit_or_python(_plan_py, _apply_py, _observe_py)  # type: ignore[assignment]
    return _KERNELS


# ----------------------------------------------------------------------------- the copies
class WarehouseBatch(NativeBatch):
    """E copies of ``WarehouseNative`` as (E, ...) arrays (``scenarios.native.NativeBatch``): pos (E, N, 2)
    (x, y), direction (E, N), carrying (E, N) (shelf id, 0 none), shelf_pos (E, S, 2), queue (E, Q) (the
    requested shelf ids, in rware's order), requested (E, S + 1) (by shelf id), steps (E,). Built from
    copies, it takes over their generators and state, so copy e is ``envs[e]`` step for step."""

    STATE = ("pos", "direction", "carrying", "shelf_pos", "queue", "requested", "steps")
    n_actions = N_ACTIONS

    def allocate(self, env: "WarehouseNative") -> dict[str, np.ndarray]:
        N, S, Q = env.layout.agents, len(env.start_shelves), env.layout.queue
        return {"pos": np.zeros((1, N, 2), dtype=np.int64), "direction": np.zeros((1, N), dtype=np.int64),
                "carrying": np.zeros((1, N), dtype=np.int64), "shelf_pos": env.start_shelves[None].copy(),
                "queue": np.zeros((1, Q), dtype=np.int64), "requested": np.zeros((1, S + 1), dtype=bool),
                "steps": np.zeros(1, dtype=np.int64)}

    def _reset(self, e: int) -> None:
        rng, L = self.generators[e], self.env.layout
        self.shelf_pos[e] = self.env.start_shelves
        cells = rng.choice(np.arange(L.rows * L.cols), size=L.agents, replace=False)
        self.pos[e, :, 0], self.pos[e, :, 1] = cells % L.cols, cells // L.cols
        self.direction[e] = rng.choice(4, size=L.agents)
        self.carrying[e] = 0
        self.queue[e] = rng.choice(len(self.env.start_shelves), size=L.queue, replace=False) + 1
        self.requested[e] = False
        self.requested[e, self.queue[e]] = True
        self.steps[e] = 0

    def _step(self, actions: np.ndarray, active: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        E, N, env = self.num_envs, self.n_agents, self.env
        act, tx, ty = (np.empty((E, N), dtype=np.int64) for _ in range(3))
        commit, tie = np.empty((E, N), dtype=bool), np.empty(E, dtype=bool)
        plan, apply, _ = kernels()
        plan(self.pos, self.direction, self.carrying, self.shelf_pos, env.highway, actions, active, act, tx, ty,
             commit, tie)
        for e in np.flatnonzero(tie):
            commit[e] = networkx_commits([(int(x), int(y)) for x, y in self.pos[e]],
                                         [(int(x), int(y)) for x, y in zip(tx[e], ty[e])])
        goal_shelf = np.empty((E, 2), dtype=np.int64)
        goal_agent = np.empty((E, 2), dtype=np.int64)
        apply(self.pos, self.direction, self.carrying, self.shelf_pos, env.highway, active, act, tx, ty, commit,
              env.goals, goal_shelf, goal_agent)
        rewards = np.zeros((E, N))
        for e in np.flatnonzero(self.requested[np.arange(E)[:, None], goal_shelf].any(axis=1)):
            for g in range(2):  # rware's order: goal by goal, each delivery replaced from the copy's generator
                shelf = int(goal_shelf[e, g])
                if shelf == 0 or not self.requested[e, shelf]:  # (goal 0's new request may be goal 1's shelf)
                    continue
                candidates = np.flatnonzero(~self.requested[e, 1:]) + 1
                new = int(candidates[self.generators[e].choice(len(candidates))])
                self.queue[e, int(np.flatnonzero(self.queue[e] == shelf)[0])] = new
                self.requested[e, shelf], self.requested[e, new] = False, True
                rewards[e, goal_agent[e, g]] += 1.0
        self.steps[active] += 1
        return rewards, active & (self.steps >= env.layout.max_steps)

    def observations(self) -> np.ndarray:
        obs = np.empty((self.num_envs, self.n_agents, OBS_DIM), dtype=np.float32)
        kernels()[2](self.pos, self.direction, self.carrying, self.shelf_pos, self.env.highway, self.requested, obs)
        return obs


class WarehouseNative(NativeEnv):
    """One rware task as a PettingZoo ParallelEnv (the module docstring); arguments checked with clear messages."""

    metadata = {"name": "rware_native", "is_parallelizable": True}
    batch_class = WarehouseBatch

    def __init__(self, task: str = "rware-tiny-2ag-v2", common_reward: bool = False) -> None:
        self.task = task
        self.layout = Layout.of(task)
        self.highway = self.layout.highways()
        self.goals = self.layout.goals()
        self.start_shelves = self.layout.shelf_cells()
        self._start(self.layout, self.layout.agents, common_reward, spaces.Box(-np.inf, np.inf, (OBS_DIM,), np.float32))


def bench(task: str = "rware-tiny-2ag-v2", steps: int = 20000, copies: int = 8, seed: int = 0) -> dict[str, float]:
    """rware's env (when installed), one ``WarehouseNative`` and a batch of ``copies``: env steps per CPU second
    with random actions, in one process (``scenarios.native.time_engines``)."""
    Layout.of(task)
    return time_engines(lambda: WarehouseNative(task), "rware", task, steps, copies, seed)


# ----------------------------------------------------------------------------- the scenario
RWARE_ENGINES = ("native", "rware")


@dataclass
class RwareConfig:
    """The multi-robot warehouse: ``task`` an rware id (``rware-{tiny,small,medium,large}-{N}ag[-easy|-hard]-v2``);
    ``common_reward``: every agent learns from the mean of the agents' rewards; ``engine``: ``native`` (this
    module, no package needed) or ``rware`` (the package's env through ``scenario.name: gymnasium``'s
    adapter, the ``.[epymarl-envs]`` extra)."""

    task: str = "rware-tiny-2ag-v2"
    common_reward: bool = False
    engine: str = "native"

    def validate(self) -> None:
        check_engine(self.engine, RWARE_ENGINES)
        WarehouseNative(self.task, self.common_reward)  # the task and the keys, checked
        if self.engine == "rware":
            need_package("rware")


def rware_env(task: str = "rware-tiny-2ag-v2", common_reward: bool = False, engine: str = "native") -> ParallelEnv:
    """One rware task as a ParallelEnv: native, or rware's env behind the gymnasium scenario's adapter."""
    check_engine(engine, RWARE_ENGINES)
    native = WarehouseNative(task, common_reward)
    return native if engine == "native" else package_env("rware", task, common_reward)


def _make_rware(cfg: RwareConfig, seed: int) -> ParallelEnv:
    env = rware_env(cfg.task, cfg.common_reward, cfg.engine)
    env.reset(seed=seed)
    return env


SCENARIOS = {
    "rware": ScenarioSpec(
        config=RwareConfig, make=_make_rware, kind="parallel",
        help="the multi-robot warehouse (rware 2.0.0's tasks): robots deliver requested shelves (engine native | rware)",
    ),
}

pettingzoo.register("parallel", "marlq/rware-v0", rware_env)


if __name__ == "__main__":
    bench_main(bench, "rware", "rware-tiny-2ag-v2")
