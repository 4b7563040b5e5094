"""One rollout loop and one evaluation loop for every family that steps environments.

Every family that collects experience (the actor-critic workers, the team workers of IPPO/MAPPO,
the vehicular A3C worker, COMA's actors) and every greedy evaluation runs the same two loops,
``rollout`` and ``evaluate``, over a *vector of environment copies* and a few hooks. What differs
between families lives in the hooks and in the vector's adapter, not in a loop of its own.

The vector (``VectorEnv``): ``num_envs`` copies with ``observe()`` -> whatever the policy reads,
and ``step(env_actions)`` -> a ``Step``: per copy whether the step was real (``valid``; False for
a step that only restarted an episode that ended, Gymnasium's next-step autoreset), the team's
``reward`` (0 where not valid), whether the copy's episode ``ended`` there, and ``data``, whatever
the family's store hook needs (per-agent rewards, terminations, final observations). Adapters here:

- ``GymVector``: a Gymnasium ``VectorEnv`` (next-step autoreset is the env's own).
- ``ParallelCopies``: a list of PettingZoo ``ParallelEnv`` copies, all agents batched as rows;
  an ended episode restarts on the copy's next step (next-step autoreset, as ``GymVector``).

A family with another kind of environment writes its own adapter (``agents/vehicular.py``: one
highway whose set of agents changes, restarted in the step that ends it).

The hooks:

- ``act(obs) -> action``: how to act (sample, the mode, a numpy twin, an epsilon floor...); any
  generator it draws from is the caller's, so the draw order is the caller's too.
- ``to_env(action) -> env action`` (default: the action itself), e.g. ``Distribution.to_env``.
- ``store(t, obs, action, step)``: what to keep of step ``t`` (a batch for an update, a replay
  buffer's transitions); left out for evaluation.
- ``row(i) -> dict``: extra fields of the metrics row of an episode that ended in copy ``i``
  (``version``, coverage...), beside ``return`` and ``length``.

The episode bookkeeping (``EpisodeBook``: each copy's running return and length, added to on
valid steps only) is one object the worker keeps between rollouts (it is part of an exact resume's
snapshot). A value-based learner uses the same loop with ``act`` an epsilon-greedy choice and
``store`` a replay buffer's ``add``; batched seeds are more copies in the vector.

    vec = GymVector(env, seed)
    book = EpisodeBook(vec.num_envs)
    rows, steps = rollout(vec, book, n_steps, act, store=keep, row=lambda i: {"version": v})
    returns = evaluate(GymVector(eval_env, eval_seed), episodes, greedy, to_env=dist.to_env)
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional, Protocol

import numpy as np


@dataclass
class Step:
    """What one step of every copy yields; the loops read ``valid``, ``reward`` and ``ended``."""

    valid: np.ndarray   # (E,) bool: the copy stepped (False: it only restarted an ended episode)
    reward: np.ndarray  # (E,) float64: the team's reward, 0 where not valid
    ended: np.ndarray   # (E,) bool: the copy's episode ended at this (valid) step
    data: Any = None    # the adapter's per-step details for the family's store hook


class VectorEnv(Protocol):
    """``num_envs`` environment copies stepped together (see the module's docstring)."""

    num_envs: int

    def observe(self) -> Any: ...

    def step(self, env_actions: Any) -> Step: ...


class EpisodeBook:
    """Each copy's running episode return and length (valid steps only)."""

    def __init__(self, n: int) -> None:
        self.returns = np.zeros(n)
        self.lengths = np.zeros(n, dtype=np.int64)

    @classmethod
    def resumed(cls, returns: np.ndarray, lengths: np.ndarray) -> "EpisodeBook":
        """A book holding these running counters (a snapshot's)."""
        book = cls(0)
        book.returns, book.lengths = returns, lengths
        return book

    def add(self, step: Step) -> np.ndarray:
        """Take in one step; the copies whose episode ended there, in order."""
        self.returns += step.reward
        self.lengths += step.valid
        return np.flatnonzero(step.ended)

    def close(self, i: int) -> dict[str, Any]:
        """The finished episode of copy ``i`` (``return``, ``length``); its counters start again."""
        out = {"return": float(self.returns[i]), "length": int(self.lengths[i])}
        self.returns[i], self.lengths[i] = 0.0, 0
        return out


def _same(action: Any) -> Any:
    return action


def rollout(vec: VectorEnv, book: EpisodeBook, steps: Optional[int], act: Callable[[Any], Any],
            store: Optional[Callable[[int, Any, Any, Step], None]] = None,
            row: Optional[Callable[[int], dict[str, Any]]] = None,
            to_env: Callable[[Any], Any] = _same, until: Optional[int] = None) -> tuple[list[dict[str, Any]], int]:
    """``steps`` steps of every copy (None: no limit): observe, act, step, store, book; or fewer, up to
    the step in which ``until`` episodes have ended (a whole-episode rollout: ``until=1``). Returns the
    metrics rows of the episodes that ended (copy order within a step; ``row(i)``'s fields after
    return and length) and the count of valid copy-steps (the env steps the rollout took)."""
    if steps is None and until is None:
        raise ValueError("rollout: give steps, until, or both")
    episodes: list[dict[str, Any]] = []
    taken = 0
    t = 0
    while (steps is None or t < steps) and (until is None or len(episodes) < until):
        obs = vec.observe()
        action = act(obs)
        step = vec.step(to_env(action))
        if store is not None:
            store(t, obs, action, step)
        taken += int(step.valid.sum())
        for i in book.add(step):
            out = book.close(i)
            if row is not None:
                out.update(row(i))
            episodes.append(out)
        t += 1
    return episodes, taken


def evaluate(vec: VectorEnv, episodes: int, act: Callable[[Any], Any], to_env: Callable[[Any], Any] = _same,
             bar: Any = None) -> list[float]:
    """The returns of the first ``episodes`` episodes to end in ``vec``, stepping every copy with
    ``act`` (``bar``: a progress bar ticked per episode, ``marl_q.evaluation.eval_progress``)."""
    book = EpisodeBook(vec.num_envs)
    returns: list[float] = []
    while len(returns) < episodes:
        step = vec.step(to_env(act(vec.observe())))
        for i in book.add(step):
            ret = book.close(i)["return"]
            if len(returns) < episodes:
                returns.append(ret)
                if bar is not None:
                    bar.update()
    return returns


# ----------------------------------------------------------------------------- adapters
class GymVector:
    """A Gymnasium ``VectorEnv`` reset with ``seed``; observations as float32 arrays. Its next-step
    autoreset: the step after a copy's episode ended only restarts it (``valid`` False there)."""

    def __init__(self, env: Any, seed: Optional[int]) -> None:
        self.env = env
        self.num_envs = env.num_envs
        obs, _ = env.reset(seed=seed)
        self.obs = np.array(obs, dtype=np.float32)  # a copy: an env may reuse its buffer for the next step
        self.prev_done = np.zeros(self.num_envs, dtype=bool)

    def observe(self) -> np.ndarray:
        return self.obs

    def step(self, env_actions: Any) -> Step:
        """``data``: (the env's rewards, terminated, terminated | truncated)."""
        next_obs, rew, term, trunc, _ = self.env.step(env_actions)
        done = term | trunc
        valid = ~self.prev_done
        self.prev_done = done.copy()
        self.obs = np.array(next_obs, dtype=np.float32)
        return Step(valid, np.where(valid, rew, 0.0), done & valid, (rew, term, done))


class ParallelCopies:
    """PettingZoo ``ParallelEnv`` copies whose agents (``agents``, a fixed order) act as rows
    ``copy * len(agents) + agent``. A copy starts pending: its first step resets it (``valid`` False),
    as does the step after its episode ended; ``reset_seeds`` resets every copy now instead.

    An agent is in play while it is in the env's ``agents`` (the step that ends an agent returns its
    final observation, kept for a truncation's bootstrap, but it acts no more); an episode ends
    when the env has no agents left or every agent that acted terminated or was truncated.
    """

    def __init__(self, envs: list[Any], agents: list[str], continuous: bool,
                 reset_seeds: Optional[list[int]] = None) -> None:
        self.envs, self.agents, self.continuous = envs, agents, continuous
        self.num_envs = len(envs)
        self.pending_reset = np.ones(self.num_envs, dtype=bool)
        self.obs: list[dict] = [dict() for _ in envs]
        self.infos: list[dict] = [dict() for _ in envs]
        if reset_seeds is not None:
            for e, env in enumerate(envs):
                self.obs[e], self.infos[e] = env.reset(seed=int(reset_seeds[e]))
            self.pending_reset[:] = False

    def observe(self) -> "ParallelCopies":
        """The copies themselves: the family reads ``obs``/``infos`` (and the envs' states) into rows."""
        return self

    def step(self, env_actions: np.ndarray) -> Step:
        """``env_actions``: one row per (copy, agent). ``data``: per copy None (a reset) or (the agents'
        indices that acted, rewards, terminations, truncations, whether the episode ended)."""
        E, N = self.num_envs, len(self.agents)
        valid, ended, reward = np.zeros(E, dtype=bool), np.zeros(E, dtype=bool), np.zeros(E)
        data: list[Optional[tuple]] = []
        for e, env in enumerate(self.envs):
            if self.pending_reset[e]:
                self.obs[e], self.infos[e] = env.reset()
                self.pending_reset[e] = False
                data.append(None)
                continue
            in_play = set(env.agents)
            live = [i for i, a in enumerate(self.agents) if a in self.obs[e] and a in in_play]
            self.obs[e], rew, term, trunc, self.infos[e] = env.step(
                {self.agents[i]: env_actions[e * N + i] if self.continuous else int(env_actions[e * N + i])
                 for i in live})
            reward[e] = float(sum(rew.values()))
            done = not env.agents or all(term.get(self.agents[i], False) or trunc.get(self.agents[i], False)
                                         for i in live)
            self.pending_reset[e] = done
            valid[e], ended[e] = True, done
            data.append((live, rew, term, trunc, done))
        return Step(valid, reward, ended, data)
