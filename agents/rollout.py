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
highway whose set of agents changes, restarted in the step that ends it; ``agents/coma.py``'s
``Episode``; ``agents/routing.py``'s ``RoutingReplay``: one decision a step over an exact replay, and
``RoutingDecisions``: a training worker's request stream; ``agents/lsvi_agents.py``'s ``MDPEpisode``:
a linear MDP's episode from its own uniforms).

The hooks:

- ``act(obs) -> action``: how to act (sample, the mode, a numpy twin, an epsilon floor...); any
  generator it draws from is the caller's, so the draw order is the caller's too.
- ``to_env(action) -> env action`` (default: the action itself), e.g. ``Distribution.to_env``.
- ``store(t, obs, action, step)``: what to keep of step ``t`` (a batch for an update, a replay
  buffer's transitions); left out for evaluation.
- ``row(i) -> dict``: extra fields of the metrics row of an episode that ended in copy ``i``
  (``version``, coverage...), beside ``return`` and ``length``.
- ``after(t, step, closed) -> bool``: what follows a step once it is booked (``closed``: the rows of
  the episodes that ended in it); true ends the rollout (batched seeds: every seed has its budget).

A step whose reward is not known when it is made (routing: a commit's reward is in the commit
service's reply, which comes after the worker's step has returned) is ``Step.deferred``: the loop
counts it and stores it but does not book it; the family books it with ``book_step`` when the reply
comes. Nothing waits inside the loop, so a worker between its step and the reply is plain data (a
sim snapshot pickles it), where a loop suspended in a generator could not be pickled.

The episode bookkeeping (``EpisodeBook``: each copy's running return and length, added to on
valid steps only) is one object the worker keeps between rollouts (it is part of an exact resume's
snapshot). A value-based learner uses the same loop with ``act`` an epsilon-greedy choice and
``store`` a replay buffer's ``add``; batched seeds (agents/batched_a2c.py) are copies of one
vector (``GymVector`` over their CartPoles stepped as one array), their one-step update in ``store``
and their runs' bookkeeping and servers in ``after``.

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
    deferred: bool = False  # its rewards come later (a service's reply): its caller books it then (book_step)


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


class AgentEpisodeBook(EpisodeBook):
    """An ``EpisodeBook`` of a team vector that also keeps each of its ``agents`` agents' running return
    (a ``TeamStep``'s rewards, valid steps only); a finished episode's row carries them, in the vector's
    agent order, as ``agent_returns`` (per-team and per-agent returns: marl_q/teams.py). ``return``
    stays the book's own sum, step by step over all agents, as before teams existed."""

    def __init__(self, n: int, agents: int) -> None:
        super().__init__(n)
        self.agent_returns = np.zeros((n, agents))

    @classmethod
    def taking_over(cls, book: EpisodeBook, agents: int) -> "AgentEpisodeBook":
        """The book of a snapshot taken before per-agent returns were kept: its counters, and for an
        episode already under way NaN per-agent returns (their start is not known) until it ends."""
        out = cls(len(book.returns), agents)
        out.returns, out.lengths = book.returns, book.lengths
        out.agent_returns[book.lengths > 0] = np.nan
        return out

    def add(self, step: Step) -> np.ndarray:
        self.agent_returns += np.where(step.valid[:, None], step.data.rewards, 0.0)
        return super().add(step)

    def close(self, i: int) -> dict[str, Any]:
        out = super().close(i)
        out["agent_returns"] = [float(r) for r in self.agent_returns[i]]
        self.agent_returns[i] = 0.0
        return out


def _same(action: Any) -> Any:
    return action


def rollout(vec: VectorEnv, book: EpisodeBook, steps: Optional[int], act: Callable[[Any], Any],
            store: Optional[Callable[[int, Any, Any, Step], None]] = None,
            row: Optional[Callable[[int], dict[str, Any]]] = None,
            to_env: Callable[[Any], Any] = _same, until: Optional[int] = None,
            after: Optional[Callable[[int, Step, list[dict[str, Any]]], Any]] = None
            ) -> tuple[list[dict[str, Any]], int]:
    """``steps`` steps of every copy (None: no limit): observe, act, step, store, book, after; or fewer,
    up to the step in which ``until`` episodes have ended (a whole-episode rollout: ``until=1``), or in
    which ``after`` returned true. Returns the metrics rows of the episodes that ended (copy order
    within a step; ``row(i)``'s fields after return and length) and the count of valid copy-steps (the
    env steps the rollout took).

    ``after(t, step, closed)``: what follows step ``t`` once it is booked, ``closed`` being the rows of
    the episodes that ended in it (copy order, as ``step.ended``'s); a true return ends the rollout
    there. Batched seeds (agents/batched_a2c.py) hand each seed's episodes to its run and step the
    servers in it, and end when every seed has its budget."""
    if steps is None and until is None and after is None:
        raise ValueError("rollout: give steps, until or after")
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
        closed = [] if step.deferred else book_step(book, step, row)
        episodes += closed
        t += 1
        if after is not None and after(t - 1, step, closed):
            break
    return episodes, taken


def book_step(book: EpisodeBook, step: Step, row: Optional[Callable[[int], dict[str, Any]]] = None
              ) -> list[dict[str, Any]]:
    """Take one step into ``book``; the metrics rows of the episodes that ended there (copy order;
    ``row(i)``'s fields after return and length). ``rollout`` books every step it makes but a deferred
    one (``Step.deferred``: a decision whose reward a service's reply brings); the family books that
    one, as resolved, when the reply comes (agents/routing.py)."""
    out = []
    for i in book.add(step):
        closed = book.close(i)
        if row is not None:
            closed.update(row(i))
        out.append(closed)
    return out


def evaluate(vec: VectorEnv, episodes: int, act: Callable[[Any], Any], to_env: Callable[[Any], Any] = _same,
             bar: Any = None, book: Optional[EpisodeBook] = None,
             closed: Optional[list[dict[str, Any]]] = None) -> list[float]:
    """The returns of the first ``episodes`` episodes to end in ``vec``, stepping every copy with
    ``act`` (``bar``: a progress bar ticked per episode, ``marl_q.evaluation.eval_progress``). ``book``:
    the episode book to keep (default a fresh ``EpisodeBook``); ``closed``: a list that gets each of
    those episodes' rows (``EpisodeBook.close``: an ``AgentEpisodeBook``'s carry per-agent returns)."""
    book = book if book is not None else EpisodeBook(vec.num_envs)
    returns: list[float] = []
    while len(returns) < episodes:
        step = vec.step(to_env(act(vec.observe())))
        for i in book.add(step):
            out = book.close(i)
            ret = out["return"]
            if len(returns) < episodes:
                returns.append(ret)
                if closed is not None:
                    closed.append(out)
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


@dataclass
class TeamStep:
    """A team vector's per-step details (``Step.data``), one (E, N) array per field, row-major as the
    rows ``copy * N + agent``: which agents acted (``live``), their rewards, terminations, and
    ``dones`` (terminated or truncated, and every agent of a copy whose episode ended there).
    Copies that only restarted are all False/0."""

    live: np.ndarray
    rewards: np.ndarray
    terminated: np.ndarray
    dones: np.ndarray


def team_copies(envs: list[Any], agents: list[str], continuous: bool,
                reset_seeds: Optional[list[int]] = None) -> "ParallelCopies | BatchedCopies":
    """The team vector over these PettingZoo copies: ``BatchedCopies`` when their class steps copies
    together (a ``batched(envs)`` classmethod: scenarios.spread_native.SpreadNative, and the native LBF and
    warehouse of scenarios/native.py), else
    ``ParallelCopies``. Both give the same steps, observations and data."""
    kind = type(envs[0])
    batched = getattr(kind, "batched", None)
    if batched is not None and not continuous and all(type(env) is kind for env in envs):
        return BatchedCopies(batched(envs), agents, reset_seeds)
    return ParallelCopies(envs, agents, continuous, reset_seeds)


class TeamRows:
    """What both team vectors share: ``rows`` fills the arrays a team learner reads."""

    def rows(self, obs_out: np.ndarray, state_out: Optional[np.ndarray] = None,
             avail_out: Optional[np.ndarray] = None) -> None:
        """Write every copy's current observations into ``obs_out`` (E, N, D) (zeros for an agent not
        in play), its global state into ``state_out`` (E, S) when given, and the agents' action masks
        into ``avail_out`` (E, N, A) when given (ones where the env hands none out)."""
        raise NotImplementedError


class ParallelCopies(TeamRows):
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
        """``env_actions``: one row per (copy, agent). ``data``: a ``TeamStep``."""
        E, N = self.num_envs, len(self.agents)
        valid, ended, reward = np.zeros(E, dtype=bool), np.zeros(E, dtype=bool), np.zeros(E)
        data = TeamStep(np.zeros((E, N), dtype=bool), np.zeros((E, N)), np.zeros((E, N), dtype=bool),
                        np.zeros((E, N), dtype=bool))
        for e, env in enumerate(self.envs):
            if self.pending_reset[e]:
                self.obs[e], self.infos[e] = env.reset()
                self.pending_reset[e] = False
                continue
            in_play = set(env.agents)
            live = [i for i, a in enumerate(self.agents) if a in self.obs[e] and a in in_play]
            self.obs[e], rew, term, trunc, self.infos[e] = env.step(
                {self.agents[i]: env_actions[e * N + i] if self.continuous else int(env_actions[e * N + i])
                 for i in live})
            reward[e] = float(sum(rew.values()))
            done = not env.agents or all(term.get(self.agents[i], False) or trunc.get(self.agents[i], False)
                                         for i in live)
            for i in live:
                a = self.agents[i]
                data.live[e, i] = True
                data.rewards[e, i] = float(rew.get(a, 0.0))
                data.terminated[e, i] = bool(term.get(a, False))
                data.dones[e, i] = bool(term.get(a, False) or trunc.get(a, False))
            if done:
                data.dones[e] = True
            self.pending_reset[e] = done
            valid[e], ended[e] = True, done
        return Step(valid, reward, ended, data)

    def rows(self, obs_out: np.ndarray, state_out: Optional[np.ndarray] = None,
             avail_out: Optional[np.ndarray] = None) -> None:
        for e in range(self.num_envs):
            for i, a in enumerate(self.agents):
                info = self.infos[e].get(a) or {}
                present = a in self.obs[e]
                if present:  # an agent with a smaller observation than the rows' fills their first columns
                    own = self.obs[e][a]
                    obs_out[e, i, :np.size(own)] = own
                else:
                    obs_out[e, i] = 0.0
                if avail_out is not None:
                    if present and "action_mask" in info:
                        mask = info["action_mask"]
                        avail_out[e, i, :np.size(mask)] = mask
                    else:
                        avail_out[e, i] = 1.0
        if state_out is not None:
            for e, env in enumerate(self.envs):
                state_out[e] = np.asarray(env.state(), dtype=np.float32).reshape(-1)


class BatchedCopies(TeamRows):
    """A team vector over a batch of copies that steps them together as arrays (``team_copies``):
    ``batch`` has ``num_envs``, ``reset(e, seed)``, ``step(actions (E, N), active) -> (rewards (E, N),
    terminated (E,), truncated (E,))``, ``observations()`` (E, N, D) and ``states(obs)`` (E, S). Every
    agent plays every step of an episode, which ends for all of them at once, terminated (every agent
    terminated: LBF's food gone or its step limit) or truncated (simple_spread's time limit). Next-step
    autoreset as ``ParallelCopies``; a copy starts pending (``reset_seeds``: every copy is reset now
    with its seed instead)."""

    def __init__(self, batch: Any, agents: list[str], reset_seeds: Optional[list[int]] = None) -> None:
        self.batch, self.agents = batch, agents
        self.num_envs = batch.num_envs
        self.pending_reset = np.ones(self.num_envs, dtype=bool)
        self.started = np.zeros(self.num_envs, dtype=bool)  # a copy not yet reset here shows zeros, as ParallelCopies
        if reset_seeds is not None:
            for e in range(self.num_envs):
                batch.reset(e, int(reset_seeds[e]))
            self.pending_reset[:] = False
            self.started[:] = True

    def observe(self) -> "BatchedCopies":
        return self

    def step(self, env_actions: np.ndarray) -> Step:
        """``env_actions``: one row per (copy, agent). ``data``: a ``TeamStep``."""
        E, N = self.num_envs, len(self.agents)
        pending = self.pending_reset
        valid = ~pending
        for e in np.flatnonzero(pending):
            self.batch.reset(int(e))
        self.started |= pending
        rewards, terminated, truncated = self.batch.step(np.asarray(env_actions).reshape(E, N), valid)
        reward = np.zeros(E)
        for i in range(N):  # the agents' rewards summed in order, as sum(rewards.values())
            reward = reward + rewards[:, i]
        ended = valid & (terminated | truncated)
        self.pending_reset = ended.copy()
        live = np.repeat(valid[:, None], N, axis=1)
        return Step(valid, np.where(valid, reward, 0.0), ended,
                    TeamStep(live, rewards, np.repeat((valid & terminated)[:, None], N, axis=1),
                             np.repeat(ended[:, None], N, axis=1)))

    def rows(self, obs_out: np.ndarray, state_out: Optional[np.ndarray] = None,
             avail_out: Optional[np.ndarray] = None) -> None:
        obs = self.batch.observations()
        obs_out[...] = obs
        if not self.started.all():
            obs_out[~self.started] = 0.0
        if state_out is not None:
            state_out[...] = self.batch.states(obs)
        if avail_out is not None:
            avail_out[...] = 1.0
