"""Level-Based Foraging over arrays: lbforaging 2.0.0's ``ForagingEnv`` (vector observations) without its
per-player objects, every copy and every agent stepped in one compiled call.

``ForagingNative(task)`` is a PettingZoo ``ParallelEnv`` that reproduces
``FlatParallelEnv(TupleParallelEnv(gymnasium.make("lbforaging:" + task)))`` (what ``scenario.name:
gymnasium`` makes of it) step for step: agents ``agent_0`` .. ``agent_{N-1}``, the same float32
observations, the same rewards (``common_reward``: every agent gets their mean), every agent
terminated (never truncated) when the food is gone or the step limit is reached, and the same reset
draws from the same seed. ``task`` is one of lbforaging's registered ids,
``Foraging[-2s]-{S}x{S}-{N}p-{F}f[-coop]-v3`` (``-2s``: sight 2, else the whole field; ``-coop``:
every food's level is the sum of the three lowest agents' levels, so it needs them all). The package is
not needed to run it; tests/scenarios/test_lbf_native.py compares the two when it is installed.

What it copies from lbforaging/foraging/environment.py (2.0.0):

- **reset**: gymnasium's ``np.random.Generator``, reseeded only when a seed is given. Players are placed
  in order, each at the first uniformly drawn cell that holds neither food nor a player, where "a
  player" includes the cells that the players not yet placed held in the *previous* episode
  (lbforaging checks every player's position, old ones included: two resets from one seed can start
  differently, and here too). Then levels are drawn in [1, 2], and the foods placed at uniform cells
  of the interior (rows and columns 1 .. S-2) with no food in their 3 x 3 block nor two cells away in
  line, and no player on them. The same generator calls in the same order (two ``permutation``s and
  scalar ``integers``), so the same seed gives the same episode.
- **step**: an action that is not valid from the current state (moving off the field or onto food;
  loading with no food beside) becomes "none". Players that target one cell (a player that stays
  targets its own) all stay; the others move (two players may swap). Then the loading players, in
  index order, each with the first food beside it (north, south, west, east, with lbforaging's checks
  ``row > 1`` / ``col > 1``), load it with every loading player beside that food if their levels sum to
  at least its level: each then gets ``level * food / (levels' sum * food spawned this episode)`` and the
  food goes; otherwise each loses ``penalty``. The episode ends when no food is left or after
  ``max_episode_steps`` (50) steps.
- **observation** (float32, 3F + 3N) of agent i: the foods in its view (the field's rows and columns
  within ``sight`` of it, clipped to the field), row-major, as (row, col, level) relative to the view's
  corner, then (-1, -1, 0) for the rest; then the players whose relative position (their position -
  its position + min(sight, its position), per axis) lies in [0, 2 sight], itself first, then the
  others in index order, as (row, col, level), then (-1, -1, 0).

One deliberate difference: lbforaging keeps its loading players in a ``set`` of ``Player`` objects and
pops them in the set's order, which follows their memory addresses; where that order matters (a
loading player beside two foods, one of which another loading player is beside) its outcome differs
from run to run. Here they load in index order; the tests give lbforaging the same order.

``ForagingNative.batched(envs)`` -> ``ForagingBatch``: E copies as (E, ...) arrays, stepped and observed
by one compiled loop each (numba, compiled on first use and cached; without numba, or with
``MARLQ_KERNELS=0``, the same functions run as Python). Not supported: grid observations,
``observe_agent_levels: false``, per-food or per-player level lists, rendering.

``python -m scenarios.lbf_native --steps 20000`` times lbforaging against one copy of this env and
against a batch of 8 copies, with random actions, in one run.
"""
from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import Any, Callable, Optional

import numpy as np
from gymnasium import spaces
import pettingzoo
from pettingzoo import ParallelEnv

from marl_q.compiled import njit_or_python
from scenarios.native import (NativeBatch, NativeEnv, bare_task, bench_main, check_engine, need_package, package_env,
                              time_engines)
from scenarios.spec import ScenarioSpec

N_ACTIONS = 6  # none, north, south, west, east, load
NONE, NORTH, SOUTH, WEST, EAST, LOAD = range(N_ACTIONS)
TASK = re.compile(r"^Foraging(-2s)?-(\d+)x(\d+)-(\d+)p-(\d+)f(-coop)?-v3$")
TASK_FORM = "Foraging[-2s]-{S}x{S}-{N}p-{F}f[-coop]-v3 with S in 5..19, N in 2..9, F in 1..4 (lbforaging 2.0.0's ids)"


@dataclass(frozen=True)
class Rules:
    """One LBF task: what lbforaging's registration passes to ``ForagingEnv`` for its id."""

    size: int
    players: int
    foods: int
    sight: int
    coop: bool
    max_episode_steps: int = 50
    min_player_level: int = 1
    max_player_level: int = 2
    min_food_level: int = 1
    penalty: float = 0.0

    @property
    def obs_dim(self) -> int:
        return 3 * self.foods + 3 * self.players

    @property
    def max_food_level(self) -> int:
        """The observation bound lbforaging gives food levels (the three highest player levels' sum)."""
        return min(3, self.players) * self.max_player_level


def parse_task(task: Any) -> Rules:
    """The rules of an lbforaging id (an ``lbforaging:`` prefix is allowed); ValueError naming the form."""
    text = bare_task(task, "lbforaging")
    m = TASK.match(text) if isinstance(text, str) else None
    if m is None:
        raise ValueError(f"scenario.task must be an lbforaging id, {TASK_FORM}; got {task!r}")
    two_s, rows, cols, players, foods, coop = m.groups()
    rows, cols, players, foods = int(rows), int(cols), int(players), int(foods)
    if rows != cols or not 5 <= rows <= 19 or not 2 <= players <= 9 or not 1 <= foods <= 4:
        raise ValueError(f"scenario.task {task!r} is not one of lbforaging's ids: {TASK_FORM}")
    return Rules(size=rows, players=players, foods=foods, sight=2 if two_s else rows, coop=bool(coop))


# ----------------------------------------------------------------------------- the loops
def _step_py(field, pos, level, steps, spawned, actions, active, max_steps, penalty, rewards, ended):
    """Step the copies e with ``active[e]``: field (E, S, S) int64 food levels, pos (E, N, 2) int64,
    level (E, N) int64, steps (E,) int64, spawned (E,) int64 (the food levels placed at reset), actions
    (E, N) int64. Writes rewards (E, N) float64 (0 for copies not stepped) and ended (E,) bool."""
    E, N = pos.shape[0], pos.shape[1]
    S = field.shape[1]
    target = np.empty((N, 2), dtype=np.int64)
    loading = np.zeros(N, dtype=np.bool_)
    beside = np.zeros(N, dtype=np.bool_)
    for e in range(E):
        for i in range(N):
            rewards[e, i] = 0.0
        ended[e] = False
        if not active[e]:
            continue
        steps[e] += 1
        f = field[e]
        for i in range(N):
            r, c = pos[e, i, 0], pos[e, i, 1]
            a = actions[e, i]
            valid = a == NONE
            if a == NORTH:
                valid = r > 0 and f[r - 1, c] == 0
            elif a == SOUTH:
                valid = r < S - 1 and f[r + 1, c] == 0
            elif a == WEST:
                valid = c > 0 and f[r, c - 1] == 0
            elif a == EAST:
                valid = c < S - 1 and f[r, c + 1] == 0
            elif a == LOAD:  # lbforaging's adjacent_food: the neighbours' sum, indexes clipped to the field
                valid = (f[max(r - 1, 0), c] + f[min(r + 1, S - 1), c] + f[r, max(c - 1, 0)]
                         + f[r, min(c + 1, S - 1)]) > 0
            if not valid:
                a = NONE
            target[i, 0], target[i, 1] = r, c
            if a == NORTH:
                target[i, 0] = r - 1
            elif a == SOUTH:
                target[i, 0] = r + 1
            elif a == WEST:
                target[i, 1] = c - 1
            elif a == EAST:
                target[i, 1] = c + 1
            loading[i] = a == LOAD
        for i in range(N):  # a cell targeted by two or more players: none of them moves
            alone = True
            for j in range(N):
                if j != i and target[j, 0] == target[i, 0] and target[j, 1] == target[i, 1]:
                    alone = False
                    break
            if alone:
                pos[e, i, 0], pos[e, i, 1] = target[i, 0], target[i, 1]
        for i in range(N):
            if not loading[i]:
                continue
            r, c = pos[e, i, 0], pos[e, i, 1]  # lbforaging's adjacent_food_location, its checks as they are
            if r > 1 and f[r - 1, c] > 0:
                fr, fc = r - 1, c
            elif r < S - 1 and f[r + 1, c] > 0:
                fr, fc = r + 1, c
            elif c > 1 and f[r, c - 1] > 0:
                fr, fc = r, c - 1
            elif c < S - 1 and f[r, c + 1] > 0:
                fr, fc = r, c + 1
            else:  # not reachable: a valid load keeps its food until a load that takes this player too
                loading[i] = False
                continue
            food = f[fr, fc]
            total = 0
            for j in range(N):  # the loading players beside the food (this one among them)
                dr, dc = abs(pos[e, j, 0] - fr), abs(pos[e, j, 1] - fc)
                beside[j] = loading[j] and ((dr == 1 and dc == 0) or (dc == 1 and dr == 0))
                if beside[j]:
                    total += level[e, j]
            for j in range(N):
                if beside[j]:
                    loading[j] = False
                    if total < food:
                        rewards[e, j] -= penalty
                    else:
                        rewards[e, j] = float(level[e, j] * food) / float(total * spawned[e])
            if total >= food:
                f[fr, fc] = 0
        left = 0
        for r in range(S):
            for c in range(S):
                left += f[r, c]
        ended[e] = left == 0 or max_steps <= steps[e]


def _observe_py(field, pos, level, sight, n_foods, obs):
    """Every agent's observation of every copy into obs (E, N, 3F + 3N) float32 (the module docstring)."""
    E, N = pos.shape[0], pos.shape[1]
    S = field.shape[1]
    for e in range(E):
        for i in range(N):
            o = obs[e, i]
            for k in range(n_foods + N):
                o[3 * k] = -1.0
                o[3 * k + 1] = -1.0
                o[3 * k + 2] = 0.0
            r, c = pos[e, i, 0], pos[e, i, 1]
            r0, c0 = max(r - sight, 0), max(c - sight, 0)
            k = 0
            for y in range(r0, min(r + sight + 1, S)):
                for x in range(c0, min(c + sight + 1, S)):
                    if field[e, y, x] != 0 and k < n_foods:
                        o[3 * k] = y - r0
                        o[3 * k + 1] = x - c0
                        o[3 * k + 2] = field[e, y, x]
                        k += 1
            k = n_foods
            for step in range(N):  # itself first, then the others in index order
                j = i if step == 0 else (step - 1 if step - 1 < i else step)
                ty = pos[e, j, 0] - r + min(sight, r)
                tx = pos[e, j, 1] - c + min(sight, c)
                if min(ty, tx) >= 0 and max(ty, tx) <= 2 * sight:
                    o[3 * k] = ty
                    o[3 * k + 1] = tx
                    o[3 * k + 2] = level[e, j]
                    k += 1


_KERNELS: Optional[tuple[Callable[..., None], Callable[..., None]]] = None


def kernels() -> tuple[Callable[..., None], Callable[..., None]]:
    """(step, observe): numba-compiled on first use (cached on disk), or the Python functions where
    ``marl_q.compiled.allowed()`` is false. Lazy, so that importing the scenarios does not import numba."""
    global _KERNELS
    if _KERNELS is None:
        _KERNELS = njit_or_python(_step_py, _observe_py)  # type: ignore[assignment]
    return _KERNELS


# ----------------------------------------------------------------------------- reset (lbforaging's draws)
def _occupied(players: np.ndarray, placed: np.ndarray, row: int, col: int) -> bool:
    for j in range(len(players)):
        if placed[j] and players[j, 0] == row and players[j, 1] == col:
            return True
    return False


def reset_copy(rng: np.random.Generator, rules: Rules, field: np.ndarray, pos: np.ndarray, level: np.ndarray,
               placed: np.ndarray) -> int:
    """A new episode in one copy's arrays, with lbforaging's calls on ``rng`` in its order; ``placed[j]``:
    player j has a position (from this reset or an earlier one), which blocks its cell. Returns the food
    levels placed (their sum)."""
    S, N = rules.size, rules.players
    field[...] = 0
    rng.permutation(N)  # lbforaging permutes the (here equal) per-player level bounds
    for i in range(N):
        for _ in range(1000):
            row, col = int(rng.integers(0, S)), int(rng.integers(0, S))
            if field[row, col] == 0 and not _occupied(pos, placed, row, col):
                pos[i] = row, col
                placed[i] = True
                level[i] = rng.integers(np.int64(rules.min_player_level), np.int64(rules.max_player_level) + 1)
                break
    top = int(sum(sorted(int(x) for x in level)[:3]))
    low = top if rules.coop else rules.min_food_level
    rng.permutation(rules.foods)  # and the per-food level bounds
    count = 0
    for _ in range(1000):
        if count >= rules.foods:
            break
        row, col = int(rng.integers(1, S - 1)), int(rng.integers(1, S - 1))
        block = field[max(row - 1, 0):min(row + 2, S), max(col - 1, 0):min(col + 2, S)].sum()
        line = (field[max(row - 2, 0):min(row + 3, S), col].sum() + field[row, max(col - 2, 0):min(col + 3, S)].sum())
        if block > 0 or line > 0 or field[row, col] != 0 or _occupied(pos, placed, row, col):
            continue
        field[row, col] = low if low == top else rng.integers(np.int64(low), np.int64(top) + 1)
        count += 1
    return int(field.sum())


# ----------------------------------------------------------------------------- copies
class ForagingBatch(NativeBatch):
    """E copies of ``ForagingNative`` as (E, ...) arrays (``scenarios.native.NativeBatch``): field (E, S, S)
    food levels, pos (E, N, 2), level (E, N), placed (E, N) (a player has a position, old or new), steps
    (E,), spawned (E,) (the food levels placed at reset). Built from copies, it takes over their generators
    and state, so copy e here is ``envs[e]`` step for step (tests/scenarios/test_lbf_native.py)."""

    STATE = ("field", "pos", "level", "placed", "steps", "spawned")
    n_actions = N_ACTIONS

    def allocate(self, env: "ForagingNative") -> dict[str, np.ndarray]:
        S, N = env.rules.size, env.rules.players
        return {"field": np.zeros((1, S, S), dtype=np.int64), "pos": np.zeros((1, N, 2), dtype=np.int64),
                "level": np.zeros((1, N), dtype=np.int64), "placed": np.zeros((1, N), dtype=bool),
                "steps": np.zeros(1, dtype=np.int64), "spawned": np.zeros(1, dtype=np.int64)}

    def _reset(self, e: int) -> None:
        self.spawned[e] = reset_copy(self.generators[e], self.env.rules, self.field[e], self.pos[e], self.level[e],
                                     self.placed[e])
        self.steps[e] = 0

    def _step(self, actions: np.ndarray, active: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        rewards = np.empty((self.num_envs, self.n_agents))
        ended = np.empty(self.num_envs, dtype=bool)
        rules = self.env.rules
        kernels()[0](self.field, self.pos, self.level, self.steps, self.spawned, actions, active,
                     rules.max_episode_steps, rules.penalty, rewards, ended)
        return rewards, ended

    def observations(self) -> np.ndarray:
        rules = self.env.rules
        obs = np.empty((self.num_envs, rules.players, rules.obs_dim), dtype=np.float32)
        kernels()[1](self.field, self.pos, self.level, rules.sight, rules.foods, obs)
        return obs


class ForagingNative(NativeEnv):
    """One LBF task as a PettingZoo ParallelEnv (the module docstring); arguments checked with clear messages."""

    metadata = {"name": "lbf_native", "is_parallelizable": True}
    batch_class = ForagingBatch

    def __init__(self, task: str = "Foraging-8x8-2p-2f-coop-v3", common_reward: bool = False,
                 penalty: float = 0.0) -> None:
        if isinstance(penalty, bool) or not isinstance(penalty, (int, float)) or not 0.0 <= float(penalty) < float("inf"):
            raise ValueError(f"scenario.penalty must be a number >= 0, got {penalty!r}")
        self.task = task
        self.rules = rules = dataclasses.replace(parse_task(task), penalty=float(penalty))
        S, N = rules.size, rules.players
        low = np.array([-1, -1, 0] * (rules.foods + N), dtype=np.float32)
        high = np.array([S - 1, S - 1, rules.max_food_level] * rules.foods + [S - 1, S - 1, rules.max_player_level] * N,
                        dtype=np.float32)
        self._start(rules, N, common_reward, spaces.Box(low, high, (rules.obs_dim,), np.float32))


def bench(task: str = "Foraging-8x8-2p-2f-coop-v3", steps: int = 20000, copies: int = 8, seed: int = 0
          ) -> dict[str, float]:
    """lbforaging's env (when installed), one ``ForagingNative`` and a batch of ``copies``: env steps per CPU
    second with random actions, in one process (``scenarios.native.time_engines``)."""
    parse_task(task)
    return time_engines(lambda: ForagingNative(task), "lbforaging", task, steps, copies, seed)


# ----------------------------------------------------------------------------- the scenario
LBF_ENGINES = ("native", "lbforaging")


@dataclass
class LBFConfig:
    """Level-Based Foraging: ``task`` an lbforaging id (``Foraging[-2s]-{S}x{S}-{N}p-{F}f[-coop]-v3``);
    ``common_reward``: every agent learns from the mean of the agents' rewards (EPyMARL's common reward,
    scaled by 1/N); ``penalty``: what each agent of a failed load loses (lbforaging's ``penalty``, 0 in its
    registered ids); ``engine``: ``native`` (this module, no package needed) or ``lbforaging`` (the
    package's own env through ``scenario.name: gymnasium``'s adapter, the ``.[epymarl-envs]`` extra)."""

    task: str = "Foraging-8x8-2p-2f-coop-v3"
    common_reward: bool = False
    penalty: float = 0.0
    engine: str = "native"

    def validate(self) -> None:
        check_engine(self.engine, LBF_ENGINES)
        ForagingNative(self.task, self.common_reward, self.penalty)  # the task and the keys, checked
        if self.engine == "lbforaging":
            need_package("lbforaging")


def lbf_env(task: str = "Foraging-8x8-2p-2f-coop-v3", common_reward: bool = False, penalty: float = 0.0,
            engine: str = "native") -> ParallelEnv:
    """One LBF task as a ParallelEnv: native, or lbforaging's env behind the gymnasium scenario's adapter."""
    check_engine(engine, LBF_ENGINES)
    native = ForagingNative(task, common_reward, penalty)
    if engine == "native":
        return native
    return package_env("lbforaging", task, common_reward, {"penalty": native.rules.penalty} if native.rules.penalty else {})


def _make_lbf(cfg: LBFConfig, seed: int) -> ParallelEnv:
    env = lbf_env(cfg.task, cfg.common_reward, cfg.penalty, cfg.engine)
    env.reset(seed=seed)
    return env


SCENARIOS = {
    "lbf": ScenarioSpec(
        config=LBFConfig, make=_make_lbf, kind="parallel",
        help="Level-Based Foraging (lbforaging 2.0.0's tasks): agents load food together (engine native | lbforaging)",
    ),
}

pettingzoo.register("parallel", "marlq/lbf-v0", lbf_env)


if __name__ == "__main__":
    bench_main(bench, "lbforaging", "Foraging-8x8-2p-2f-coop-v3")
