"""simple_spread_v3 (discrete actions) in numpy over arrays: mpe2's task without its per-entity objects.

``SpreadNative(N, local_ratio, max_cycles)`` is a PettingZoo ``ParallelEnv`` that reproduces
``mpe2.simple_spread_v3.parallel_env(N=N, local_ratio=local_ratio, max_cycles=max_cycles,
continuous_actions=False)`` step for step: the same agent names, spaces, ``state()``, reset RNG
draws (same seed -> same episode), physics, rewards, truncation and the agents list emptying when
the episode ends. mpe2 runs a pure-python particle world behind AEC->parallel wrappers; here one
step is a handful of numpy operations on (N, 2) position/velocity arrays.

What it copies from mpe2 (mpe2/simple_spread, _mpe_utils/core.py, _mpe_utils/simple_env.py):

- reset: one ``np.random.Generator`` (gymnasium's ``seeding.np_random``), reseeded only when a seed
  is given; positions drawn ``uniform(-1, 1)`` agents first, then landmarks (2 draws each);
  velocities zero. The constructor draws once from an unseeded generator, as mpe2 does.
- actions: 0 none, 1 left, 2 right, 3 down, 4 up; force = 5.0 (sensitivity) x unit direction.
- physics (dt 0.1, damping 0.25, mass 1): agent-agent soft contact force
  ``100 * d / |d| * 1e-3 * logaddexp(0, -(|d| - 0.3) / 1e-3)`` (agent size 0.15, landmarks do not
  collide), summed per agent in mpe2's order (action force, then partners by index); then
  ``pos += vel*dt; vel = vel*(1-damping) + force*dt``.
- rewards: global = -sum over landmarks of the nearest agent's distance; local = -(number of other
  agents closer than 0.3); reward = global*(1-local_ratio) + local*local_ratio.
- observation (float32, 6N): own velocity, own position, landmark offsets, other agents' offsets,
  other agents' (always zero) communication; ``state()`` concatenates all agents' observations.
- after ``max_cycles`` steps every agent is truncated (never terminated) and ``agents`` empties.

The floating-point operations follow mpe2's order, so results are equal bit for bit in practice
(tests/scenarios/test_spread_native.py compares both step by step). Not supported: continuous
actions, rendering, curriculum, partial observability, ``terminate_on_success``.

``bench(steps)`` times mpe2 against this env with random actions in one run
(``python -m scenarios.spread_native --steps 20000``).
"""
from __future__ import annotations

import argparse
import functools
import time
from typing import Any, Callable, Optional

import numpy as np
from gymnasium import spaces
from gymnasium.utils import seeding
from pettingzoo import ParallelEnv

from marl_q.compiled import njit_or_python

# mpe2's constants (World, Agent and SimpleEnv._set_action defaults; simple_spread's sizes)
DIM_P = 2
DIM_C = 2
DT = 0.1
DAMPING = 0.25
CONTACT_FORCE = 1e2
CONTACT_MARGIN = 1e-3
AGENT_SIZE = 0.15
MASS = 1.0
SENSITIVITY = 5.0
N_ACTIONS = 5
# discrete action -> unit direction, scaled by the sensitivity as mpe2 does (u *= sensitivity)
_DIRECTIONS = np.array([[0.0, 0.0], [-1.0, 0.0], [1.0, 0.0], [0.0, -1.0], [0.0, 1.0]]) * SENSITIVITY


class SpreadNative(ParallelEnv):
    """mpe2's simple_spread_v3 (discrete actions) as numpy arrays; see the module docstring."""

    metadata = {"name": "simple_spread_v3", "render_modes": [], "is_parallelizable": True, "render_fps": 10}

    def __init__(self, N: int = 3, local_ratio: float = 0.5, max_cycles: int = 25,
                 continuous_actions: bool = False) -> None:
        if continuous_actions:
            raise ValueError("SpreadNative: continuous_actions is not supported (use engine mpe2)")
        if not 0.0 <= local_ratio <= 1.0:
            raise ValueError(f"local_ratio must lie in [0, 1], got {local_ratio!r}")
        self.n = int(N)
        self.local_ratio = local_ratio
        self.max_cycles = max_cycles
        self.render_mode = None
        self.possible_agents = [f"agent_{i}" for i in range(self.n)]
        self.agents: list[str] = []
        obs_dim = 6 * self.n  # vel 2 + pos 2 + landmarks 2N + others 2(N-1) + comm 2(N-1)
        self._obs_space = spaces.Box(low=-np.float32(np.inf), high=+np.float32(np.inf), shape=(obs_dim,),
                                     dtype=np.float32)
        self._act_space = spaces.Discrete(N_ACTIONS)
        self.state_space = spaces.Box(low=-np.float32(np.inf), high=+np.float32(np.inf),
                                      shape=(obs_dim * self.n,), dtype=np.float32)
        off = ~np.eye(self.n, dtype=bool)
        self._eye = np.eye(self.n)
        self._others = np.nonzero(off)  # (i, j) with j != i, row-major: partners of i by index
        self._dist_min = AGENT_SIZE + AGENT_SIZE
        self.steps = 0
        self._started = False
        self._pairs: Optional[tuple[np.ndarray, np.ndarray]] = None  # (delta, dist) at the current positions
        self.np_random, _ = seeding.np_random(None)  # mpe2's constructor resets from an unseeded RNG
        self._reset_world()

    @functools.lru_cache(maxsize=None)
    def observation_space(self, agent: str) -> spaces.Space:
        return self._obs_space

    @functools.lru_cache(maxsize=None)
    def action_space(self, agent: str) -> spaces.Space:
        return self._act_space

    def _reset_world(self) -> None:
        # mpe2 draws uniform(-1, 1, 2) per agent, then per landmark; one draw of (2N, 2) is the same stream
        pos = self.np_random.uniform(-1, +1, (2 * self.n, DIM_P))
        self.pos = pos[: self.n].copy()
        self.landmarks = pos[self.n:].copy()
        self.vel = np.zeros((self.n, DIM_P))
        self._pairs = None

    def _observations(self) -> np.ndarray:
        """(N, 6N) float32: row i is agent i's observation."""
        n = self.n
        obs = np.zeros((n, 6 * n))
        obs[:, 0:2] = self.vel
        obs[:, 2:4] = self.pos
        obs[:, 4:4 + 2 * n] = (self.landmarks[None, :, :] - self.pos[:, None, :]).reshape(n, 2 * n)
        rel = self.pos[None, :, :] - self.pos[:, None, :]  # rel[i, j] = pos_j - pos_i
        obs[:, 4 + 2 * n:2 + 4 * n] = rel[self._others].reshape(n, 2 * (n - 1))
        # the last 2(N-1) entries are the other agents' communication: silent agents, always zero
        return obs.astype(np.float32)

    def state(self) -> np.ndarray:
        return self._observations().reshape(-1)

    def reset(self, seed: Optional[int] = None, options: Optional[dict] = None) -> tuple[dict, dict]:
        if seed is not None:
            self.np_random, _ = seeding.np_random(seed)
        self._reset_world()
        self.agents = self.possible_agents[:]
        self.steps = 0
        self._started = True
        obs = self._observations()
        return {a: obs[i] for i, a in enumerate(self.agents)}, {a: {} for a in self.agents}

    def step(self, actions: dict[str, Any]) -> tuple[dict, dict, dict, dict, dict]:
        if not self._started:
            raise RuntimeError("SpreadNative: reset() must be called before step()")
        if not self.agents:  # mpe2's parallel wrapper answers a step after the end with empty dicts
            return {}, {}, {}, {}, {}
        idx = np.empty(self.n, dtype=np.intp)
        for i, agent in enumerate(self.possible_agents):
            u = actions[agent]
            if type(u) is int and 0 <= u < N_ACTIONS:  # the common case, without Discrete.contains' cost
                idx[i] = u
                continue
            if not self._act_space.contains(u):
                raise ValueError(f"SpreadNative: action {u!r} for {agent} is not in {self._act_space}")
            idx[i] = int(u)
        self._physics(_DIRECTIONS[idx])
        rewards = self._rewards()
        self.steps += 1
        truncated = self.steps >= self.max_cycles
        obs = self._observations()
        agents = self.agents
        observations = {a: obs[i] for i, a in enumerate(agents)}
        reward_d = {a: float(rewards[i]) for i, a in enumerate(agents)}
        terminations = {a: False for a in agents}
        truncations = {a: truncated for a in agents}
        infos: dict[str, dict] = {a: {} for a in agents}
        if truncated:
            self.agents = []
        return observations, reward_d, terminations, truncations, infos

    def _pair_distances(self) -> tuple[np.ndarray, np.ndarray]:
        """(delta, dist) between agents at the current positions, computed once per position update."""
        if self._pairs is None:
            delta = self.pos[:, None, :] - self.pos[None, :, :]  # delta[i, j] = pos_i - pos_j
            dist = np.sqrt(np.square(delta[..., 0]) + np.square(delta[..., 1]))
            self._pairs = (delta, dist)
        return self._pairs

    def _physics(self, u: np.ndarray) -> None:
        delta, dist = self._pair_distances()
        dist = dist + self._eye  # no self-contact (distance 0 -> 1); keeps the division finite
        k = CONTACT_MARGIN
        penetration = np.logaddexp(0, -(dist - self._dist_min) / k) * k
        contact = CONTACT_FORCE * delta / dist[..., None] * penetration[..., None]  # on i from j
        force = u + 0.0
        for j in range(self.n):  # mpe2 adds the pair forces in partner order; the diagonal adds zero
            force = contact[:, j] + force
        self.pos += self.vel * DT
        self._pairs = None
        self.vel = self.vel * (1 - DAMPING)
        self.vel += (force / MASS) * DT

    def _rewards(self) -> np.ndarray:
        d_lm = self.pos[None, :, :] - self.landmarks[:, None, :]  # (L, N, 2): agent - landmark
        nearest = np.sqrt(np.square(d_lm[..., 0]) + np.square(d_lm[..., 1])).min(axis=1)
        global_reward = 0.0
        for m in nearest.tolist():  # sequential, as mpe2 accumulates it
            global_reward -= m
        _, dist = self._pair_distances()
        collisions = (dist < self._dist_min).sum(axis=1) - 1  # minus the agent itself
        local = -collisions.astype(np.float64)
        return global_reward * (1 - self.local_ratio) + local * self.local_ratio

    def render(self) -> None:
        return None

    def close(self) -> None:
        return None


    @classmethod
    def batched(cls, envs: list["SpreadNative"]) -> "SpreadBatch":
        """These copies stepped together as arrays (``SpreadBatch``); agents.rollout's team vector uses it."""
        return SpreadBatch(envs)


class SpreadBatch:
    """E copies of ``SpreadNative`` as (E, N, ...) arrays: every copy and every agent stepped in one call.

    It takes over the copies' random generators (the same objects: a copy's resets continue its
    stream), so copy e here is ``envs[e]`` step for step: the same reset draws, and per element the
    same floating-point operations in the same order as ``SpreadNative`` (equal bit for bit,
    tests/agents/test_rollout.py). Its step and observations are loops over copies and agents, compiled
    by numba (``kernels()``; the same functions in plain Python where ``marl_q.compiled.allowed()`` is
    false), with numpy's logaddexp between them. What the copies' own ``pos``/``vel`` hold afterwards is
    not kept up to date; the batch holds the state.

    ``reset(e, seed)`` restarts copy e (a new generator from ``seed`` when one is given);
    ``step(actions, active)`` steps the copies in ``active`` with actions (E, N) and returns their
    rewards (E, N), whether each episode was terminated there (E,; never) and truncated there (E,); ``observations()`` (E, N, 6N)
    float32 and ``states()`` (E, 6N N) are at the current positions.
    """

    def __init__(self, envs: list[SpreadNative]) -> None:
        first = envs[0]
        if any(env.n != first.n or env.local_ratio != first.local_ratio or env.max_cycles != first.max_cycles
               for env in envs):
            raise ValueError("SpreadBatch: the copies differ in N, local_ratio or max_cycles")
        self.n, self.local_ratio, self.max_cycles = first.n, first.local_ratio, first.max_cycles
        self.possible_agents = list(first.possible_agents)
        self.num_envs = E = len(envs)
        self.generators = [env.np_random for env in envs]
        self.pos = np.stack([env.pos for env in envs])
        self.landmarks = np.stack([env.landmarks for env in envs])
        self.vel = np.stack([env.vel for env in envs])
        self.steps = np.array([env.steps for env in envs], dtype=np.int64)
        self._dist_min = first._dist_min
        self._all = np.ones(E, dtype=bool)

    def reset(self, e: int, seed: Optional[int] = None) -> None:
        if seed is not None:
            self.generators[e], _ = seeding.np_random(seed)
        pos = self.generators[e].uniform(-1, +1, (2 * self.n, DIM_P))  # SpreadNative._reset_world's draw
        self.pos[e] = pos[: self.n]
        self.landmarks[e] = pos[self.n:]
        self.vel[e] = 0.0
        self.steps[e] = 0

    def step(self, actions: np.ndarray, active: Optional[np.ndarray] = None
             ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Step the copies in ``active`` (None: all) with ``actions`` (E, N) ints in [0, 5); rewards
        (E, N) (0 for a copy not stepped), terminated (E,) (never: spread only truncates) and truncated
        (E,) (False for a copy not stepped)."""
        actions = np.asarray(actions)
        if actions.shape != (self.num_envs, self.n) or not np.issubdtype(actions.dtype, np.integer):
            raise ValueError(f"SpreadBatch: actions must be ({self.num_envs}, {self.n}) integers in "
                             f"[0, {N_ACTIONS}), got {actions.dtype} {actions.shape}")
        active = self._all if active is None else active
        contact, step, _ = kernels()
        # the contact's soft penetration, numpy's logaddexp between the two loops: the single copy's
        # function (SpreadNative._physics), so its bits are the same on every CPU's numpy
        penetration = np.empty((self.num_envs, self.n, self.n))
        contact(self.pos, active, self._dist_min, CONTACT_MARGIN, penetration)
        np.logaddexp(0, penetration, out=penetration)
        rewards = np.zeros((self.num_envs, self.n))
        if not step(self.pos, self.vel, self.landmarks, self.steps, actions, active, penetration, _DIRECTIONS,
                    self.local_ratio, self._dist_min, CONTACT_MARGIN, rewards):
            raise ValueError(f"SpreadBatch: actions must be ({self.num_envs}, {self.n}) integers in "
                             f"[0, {N_ACTIONS}), got values outside it")
        truncated = active & (self.steps >= self.max_cycles)
        return rewards, np.zeros(self.num_envs, dtype=bool), truncated

    def observations(self) -> np.ndarray:
        """(E, N, 6N) float32: [e, i] is agent i's observation in copy e (SpreadNative._observations)."""
        obs = np.empty((self.num_envs, self.n, 6 * self.n), dtype=np.float32)
        kernels()[2](self.pos, self.vel, self.landmarks, obs)
        return obs

    def states(self, obs: Optional[np.ndarray] = None) -> np.ndarray:
        """(E, 6N N): every copy's ``state()`` (its agents' observations concatenated)."""
        return (self.observations() if obs is None else obs).reshape(self.num_envs, -1)


# ----------------------------------------------------------------------------- the batch's loops
# Per element, SpreadNative's floating-point operations in its order (IEEE-exact +, -, *, / and sqrt, the
# same in numba and numpy), so a batch equals its copies stepped one at a time bit for bit; the one
# transcendental function, the contact's logaddexp, stays numpy's (SpreadBatch.step).
def _contact_py(pos: np.ndarray, active: np.ndarray, dist_min: float, k: float, out: np.ndarray) -> None:
    """out[e, i, j] = -(|pos_i - pos_j| + [i == j] - dist_min) / k: logaddexp(0, .)'s argument (0 for a
    copy not stepped)."""
    E, N = pos.shape[0], pos.shape[1]
    for e in range(E):
        if not active[e]:
            out[e] = 0.0
            continue
        for i in range(N):
            for j in range(N):
                dx = pos[e, i, 0] - pos[e, j, 0]
                dy = pos[e, i, 1] - pos[e, j, 1]
                d = np.sqrt(dx * dx + dy * dy) + (1.0 if i == j else 0.0)
                out[e, i, j] = -(d - dist_min) / k


def _step_py(pos: np.ndarray, vel: np.ndarray, landmarks: np.ndarray, steps: np.ndarray, actions: np.ndarray,
             active: np.ndarray, softplus: np.ndarray, directions: np.ndarray, local_ratio: float,
             dist_min: float, k: float, rewards: np.ndarray) -> bool:
    """The active copies' physics (softplus = logaddexp(0, _contact's argument)), step count and rewards;
    False (nothing stepped) where an action lies outside [0, 5)."""
    E, N = pos.shape[0], pos.shape[1]
    n_actions = directions.shape[0]
    for e in range(E):  # every copy's, stepped or not, as SpreadNative checks what it is handed
        for i in range(N):
            if actions[e, i] < 0 or actions[e, i] >= n_actions:
                return False
    force = np.empty((N, 2))
    for e in range(E):
        if not active[e]:
            continue
        for i in range(N):
            fx = directions[actions[e, i], 0] + 0.0
            fy = directions[actions[e, i], 1] + 0.0
            for j in range(N):  # partner order, as mpe2 adds them (the diagonal adds zero)
                # (the pair's offset and distance as _contact_py computed them: recomputed, the same bits,
                # cheaper than an (E, N, N, 3) array written there and read back here)
                dx = pos[e, i, 0] - pos[e, j, 0]
                dy = pos[e, i, 1] - pos[e, j, 1]
                d = np.sqrt(dx * dx + dy * dy) + (1.0 if i == j else 0.0)
                penetration = softplus[e, i, j] * k
                fx = CONTACT_FORCE * dx / d * penetration + fx
                fy = CONTACT_FORCE * dy / d * penetration + fy
            force[i, 0] = fx
            force[i, 1] = fy
        for i in range(N):
            for c in range(2):
                pos[e, i, c] += vel[e, i, c] * DT
                vel[e, i, c] = vel[e, i, c] * (1 - DAMPING)
                vel[e, i, c] += (force[i, c] / MASS) * DT
        steps[e] += 1
        global_reward = 0.0
        for m in range(landmarks.shape[1]):  # each landmark's nearest agent, subtracted in order
            nearest = np.inf
            for i in range(N):
                dx = pos[e, i, 0] - landmarks[e, m, 0]
                dy = pos[e, i, 1] - landmarks[e, m, 1]
                nearest = min(nearest, np.sqrt(dx * dx + dy * dy))
            global_reward = global_reward - nearest
        for i in range(N):
            collisions = -1  # the agent itself
            for j in range(N):
                dx = pos[e, i, 0] - pos[e, j, 0]
                dy = pos[e, i, 1] - pos[e, j, 1]
                if np.sqrt(dx * dx + dy * dy) < dist_min:
                    collisions += 1
            rewards[e, i] = global_reward * (1 - local_ratio) + -float(collisions) * local_ratio
    return True


def _observe_py(pos: np.ndarray, vel: np.ndarray, landmarks: np.ndarray, out: np.ndarray) -> None:
    """out[e, i] = agent i's observation (float32): own velocity and position, landmark offsets, the other
    agents' offsets in index order, their (silent) communication."""
    E, N, L = pos.shape[0], pos.shape[1], landmarks.shape[1]
    for e in range(E):
        for i in range(N):
            o = out[e, i]
            o[0] = vel[e, i, 0]
            o[1] = vel[e, i, 1]
            o[2] = pos[e, i, 0]
            o[3] = pos[e, i, 1]
            c = 4
            for m in range(L):
                o[c] = landmarks[e, m, 0] - pos[e, i, 0]
                o[c + 1] = landmarks[e, m, 1] - pos[e, i, 1]
                c += 2
            for j in range(N):
                if j != i:
                    o[c] = pos[e, j, 0] - pos[e, i, 0]
                    o[c + 1] = pos[e, j, 1] - pos[e, i, 1]
                    c += 2
            for q in range(c, out.shape[2]):
                o[q] = 0.0


_KERNELS: Optional[tuple[Callable[..., Any], ...]] = None


def kernels() -> tuple[Callable[..., Any], ...]:
    """(contact, step, observe): numba-compiled on first use (cached on disk), or the Python functions where
    ``marl_q.compiled.allowed()`` is false (the same bits, slower). Lazy, so that importing the scenarios
    does not import numba."""
    global _KERNELS
    if _KERNELS is None:
        _KERNELS = njit_or_python(_contact_py, _step_py, _observe_py)
    return _KERNELS


def _time_env(env: ParallelEnv, steps: int, seed: int) -> float:
    """Seconds for ``steps`` env steps with uniform random actions, resetting at each episode end."""
    rng = np.random.default_rng(seed)
    agents = list(env.possible_agents)
    actions = rng.integers(0, N_ACTIONS, size=(steps, len(agents)))
    env.reset(seed=seed)
    t0 = time.perf_counter()
    for t in range(steps):
        env.step({a: int(actions[t, i]) for i, a in enumerate(agents)})
        if not env.agents:
            env.reset()
    return time.perf_counter() - t0


def bench(steps: int = 20000, n_agents: int = 3, max_cycles: int = 25, seed: int = 0) -> dict[str, float]:
    """Env steps per second of mpe2's simple_spread_v3 and of SpreadNative, measured in the same run."""
    from mpe2 import simple_spread_v3

    mpe2_env = simple_spread_v3.parallel_env(N=n_agents, local_ratio=0.5, max_cycles=max_cycles,
                                             continuous_actions=False)
    native = SpreadNative(N=n_agents, local_ratio=0.5, max_cycles=max_cycles)
    t_mpe2 = _time_env(mpe2_env, steps, seed)
    t_native = _time_env(native, steps, seed)
    return {"steps": steps, "mpe2_steps_per_s": steps / t_mpe2, "native_steps_per_s": steps / t_native,
            "speedup": t_mpe2 / t_native}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="env steps/s: mpe2 simple_spread_v3 vs SpreadNative")
    parser.add_argument("--steps", type=int, default=20000)
    parser.add_argument("--n-agents", type=int, default=3)
    args = parser.parse_args()
    r = bench(args.steps, args.n_agents)
    print(f"{r['steps']} steps, N={args.n_agents}: mpe2 {r['mpe2_steps_per_s']:.0f} steps/s, "
          f"native {r['native_steps_per_s']:.0f} steps/s, speedup x{r['speedup']:.1f}")
