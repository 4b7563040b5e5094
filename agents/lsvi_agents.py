"""The agent and server logic of the four LSVI algorithms, as plain classes (no runtime, no messages).

- ``async_coop_lsvi`` (Min, He, Wang, Gu, ICML 2023): an agent plays greedily w.r.t. the Q it planned
  from the server statistics it last downloaded; after an episode, if for some h
  det(Lambda_ser + Lambda_loc) > (1 + alpha) det(Lambda_ser), it uploads its local Gram matrices and
  transitions, downloads the server's statistics, clears its local data and re-plans. The trigger is
  reconstructed from the abstract and from FedLinUCB (He et al. 2022), on which the paper builds.
- ``coop_lsvi`` (Dubey & Pentland 2021): the same local/server split, but a sync is global: it starts
  when an agent's (k - k_last) log(det Lambda_now / det Lambda_last) exceeds ``sync_threshold``; the
  server then sends its statistics to every agent and asks each to upload its local data. With one
  active agent per episode (the runtime's schedules) an asked agent uploads after its next episode, so
  the global sync completes within one episode of each agent rather than instantly; such an answering
  upload gets the statistics back but does not start another sync.
- ``lsvi_ucb_pooled``: every episode is uploaded and the server's statistics reach every agent before
  the next episode, so all agents act as one LSVI-UCB learner (perfect communication).
- ``lsvi_ucb_independent``: every agent runs LSVI-UCB on its own data only; nothing is sent.

The server's record is the sum of the Gram matrices and the union of the transitions, the latter
kept as c_h and B_h (lsvi_planner), so a download has a fixed size whatever the number of episodes.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from agents.lsvi_planner import LsviStatistics, determinant_trigger, plan_optimistic, sync_condition
from agents.rollout import EpisodeBook, Step, rollout


class MDPEpisode:
    """One episode of a linear MDP (``scenarios.linear_mdp.LinearMDP``) as a one-copy vector for
    ``agents.rollout.rollout``, drawing from ``rng`` what the paper's setting draws: the horizon + 1
    uniforms of the episode at its start, the first for the initial state (uniform over the states), the
    (h + 1)-th for step h's transition (``mdp.sample_next_state`` inverts P_h(.|s, a) at it).
    ``observe`` gives (h, state); a step's reward is r_h(s, a), its ``data`` ((state, action), next state),
    and the episode ends after ``horizon`` steps."""

    num_envs = 1

    def __init__(self, mdp, rng: np.random.Generator) -> None:
        self.mdp = mdp
        self.uniforms = rng.random(mdp.horizon + 1)
        self.h = 0
        self.state = int(self.uniforms[0] * mdp.n_states)

    def observe(self) -> tuple[int, int]:
        return self.h, self.state

    def step(self, action: int) -> Step:
        h, state = self.h, self.state
        self.state = self.mdp.sample_next_state(h, state, action, self.uniforms[h + 1])
        self.h += 1
        return Step(np.ones(1, dtype=bool), np.array([self.mdp.rewards[h, state, action]], dtype=np.float64),
                    np.array([self.h == self.mdp.horizon]), ((state, action), self.state))


@dataclass
class Upload:
    """What an agent sends: local Gram sums (H, d, d) without lam I, transitions (n, 4) = [h, s, a, s'], rewards (n,)."""

    gram: np.ndarray
    transitions: np.ndarray
    rewards: np.ndarray


@dataclass
class Download:
    """What the server sends: the Gram matrices with lam I (H, d, d), c (H, d) and B (H, d, S)."""

    gram: np.ndarray
    reward_sums: np.ndarray
    next_state_sums: np.ndarray


@dataclass
class EpisodeResult:
    """One played episode: first state, its per-step data and the exact regret of the policy used."""

    initial_state: int
    states: np.ndarray
    actions: np.ndarray
    rewards: np.ndarray
    next_states: np.ndarray
    regret: float


class LsviServerRecord:
    """The server's statistics: summed Gram matrices and c_h, B_h built from every uploaded transition."""

    def __init__(self, features: np.ndarray, horizon: int, lam: float) -> None:
        n_states, _, d = features.shape
        self.features = features
        self.gram = np.repeat(np.eye(d)[None] * lam, horizon, axis=0)
        self.reward_sums = np.zeros((horizon, d))
        self.next_state_sums = np.zeros((horizon, d, n_states))
        self.transitions_received = 0

    def absorb(self, upload: Upload) -> None:
        """Add an agent's Gram matrices and fold its transitions into c_h and B_h."""
        self.gram += upload.gram
        steps, states, actions, next_states = upload.transitions.T
        phi = self.features[states, actions]
        np.add.at(self.reward_sums, steps, phi * upload.rewards[:, None])
        np.add.at(self.next_state_sums.transpose(0, 2, 1), (steps, next_states), phi)
        self.transitions_received += len(upload.rewards)

    def download(self) -> Download:
        """A copy of the current statistics to send."""
        return Download(self.gram.copy(), self.reward_sums.copy(), self.next_state_sums.copy())


class LsviAgent:
    """State every LSVI agent keeps: downloaded statistics, local un-uploaded data, and its greedy policy.

    ``combined`` = last download + local data, updated by Sherman-Morrison after every episode; it is
    what the triggers compare with the download, and what planning uses when local data counts.
    Subclasses say when to upload (``wants_upload``) and which statistics to plan from.
    """

    plans_with_local_data = False

    def __init__(self, mdp, lam: float, beta: float) -> None:
        self.mdp = mdp
        self.lam = float(lam)
        self.beta = float(beta)
        self.features = mdp.phi
        self.optimal_first_values = mdp.optimal_values()[0][0]
        self._server = LsviStatistics(mdp.horizon, mdp.d, mdp.n_states, lam)
        self.combined = self._server.copy()
        self._clear_local()
        self.episodes_played = 0
        self._pending: Download | None = None
        self.replan()

    def _clear_local(self) -> None:
        self.local_gram = np.zeros((self.mdp.horizon, self.mdp.d, self.mdp.d))
        self.local_transitions: list[np.ndarray] = []
        self.local_rewards: list[np.ndarray] = []

    def planning_statistics(self) -> LsviStatistics:
        """The statistics the agent's Q is planned from."""
        return self.combined if self.plans_with_local_data else self._server

    @property
    def server(self) -> LsviStatistics:
        """The server statistics the agent last downloaded (after adopting any pending download)."""
        self._adopt_pending()
        return self._server

    @property
    def q_values(self) -> np.ndarray:
        """The optimistic Q (H, S, A) the agent acts on (after adopting any pending download)."""
        self._adopt_pending()
        return self._q_values

    def replan(self) -> None:
        """Recompute optimistic Q, the greedy policy and that policy's exact values V^pi_1."""
        stats = self.planning_statistics()
        self._q_values = plan_optimistic(self.features, stats.gram_inv, stats.reward_sums,
                                        stats.next_state_sums, self.beta)
        self.policy = self._q_values.argmax(axis=2)
        self.policy_first_values = self.mdp.evaluate(self.policy)[0]

    def play_episode(self, rng: np.random.Generator) -> EpisodeResult:
        """Play one episode greedily (the shared rollout loop over ``MDPEpisode``), record it locally, and
        return it with its exact regret."""
        self._adopt_pending()
        mdp = self.mdp
        horizon = mdp.horizon
        episode = MDPEpisode(mdp, rng)
        initial = episode.state
        states = np.empty(horizon, dtype=np.int64)
        actions = np.empty(horizon, dtype=np.int64)
        next_states = np.empty(horizon, dtype=np.int64)

        def store(t: int, obs: tuple[int, int], action: int, step: Step) -> None:
            (states[t], actions[t]), next_states[t] = step.data

        rollout(episode, EpisodeBook(1), horizon, lambda obs: int(self.policy[obs]), store=store)
        steps = np.arange(horizon)
        rewards = mdp.rewards[steps, states, actions]
        regret = float(self.optimal_first_values[initial] - self.policy_first_values[initial])
        self._record(states, actions, rewards, next_states)
        self.episodes_played += 1
        self.after_episode()
        return EpisodeResult(initial, states, actions, rewards, next_states, regret)

    def _record(self, states: np.ndarray, actions: np.ndarray, rewards: np.ndarray,
                next_states: np.ndarray) -> None:
        phi = self.features[states, actions]
        self.combined.add_episode(phi, rewards, next_states)
        self.local_gram += phi[:, :, None] * phi[:, None, :]
        steps = np.arange(len(states))
        self.local_transitions.append(np.stack([steps, states, actions, next_states], axis=1))
        self.local_rewards.append(rewards)

    def after_episode(self) -> None:
        """Hook after an episode is recorded (re-plan for learners that use local data)."""
        if self.plans_with_local_data:
            self.replan()

    def wants_upload(self) -> bool:
        """Whether the agent sends its local data now."""
        return False

    def take_upload(self) -> Upload:
        """Hand over the local data (Gram sums and transitions) and forget it."""
        upload = Upload(self.local_gram,
                        np.concatenate(self.local_transitions).astype(np.int32),
                        np.concatenate(self.local_rewards))
        self._clear_local()
        return upload

    def receive(self, download: Download) -> None:
        """Take the server's statistics; they are adopted (and Q re-planned) before the agent next acts.

        Deferring the work means an agent that receives several downloads between two of its
        episodes (pooled and coop broadcasts) re-plans once, so an episode costs O(1) re-plans, not O(M).
        """
        self._pending = download

    def _adopt_pending(self) -> None:
        """Adopt a received download (local data not yet uploaded is kept on top) and re-plan."""
        download, self._pending = self._pending, None
        if download is None:
            return
        self._server = LsviStatistics.from_sums(download.gram, download.reward_sums,
                                               download.next_state_sums, self.lam)
        self.combined = self._server.copy()
        for transitions, rewards in zip(self.local_transitions, self.local_rewards):
            steps, states, actions, next_states = transitions.T
            assert np.array_equal(steps, np.arange(len(steps))), "local data is kept one episode at a time"
            self.combined.add_episode(self.features[states, actions], rewards, next_states)
        self.replan()


class AsyncCoopAgent(LsviAgent):
    """Async-Coop-LSVI-UCB: upload when det(Lambda_ser + Lambda_loc) > (1 + alpha) det(Lambda_ser) for some h."""

    def __init__(self, mdp, lam: float, beta: float, alpha: float,
                 use_local_data_for_planning: bool = False) -> None:
        if not alpha > 0:
            raise ValueError(f"algorithm.alpha must be > 0, got {alpha!r}")
        self.alpha = float(alpha)
        self.plans_with_local_data = bool(use_local_data_for_planning)
        super().__init__(mdp, lam, beta)

    def wants_upload(self) -> bool:
        self._adopt_pending()
        return bool(self.local_rewards) and determinant_trigger(self.combined.logdet, self._server.logdet,
                                                                self.alpha)


class CoopSyncAgent(LsviAgent):
    """Coop-LSVI: start a global sync when (k - k_last) log det(Lambda_now)/det(Lambda_last) > S; obey sync requests."""

    def __init__(self, mdp, lam: float, beta: float, sync_threshold: float) -> None:
        if not sync_threshold > 0:
            raise ValueError(f"algorithm.sync_threshold must be > 0, got {sync_threshold!r}")
        self.sync_threshold = float(sync_threshold)
        self.sync_requested = False
        self.answers_request = False
        self.episodes_since_sync = 0
        super().__init__(mdp, lam, beta)

    def after_episode(self) -> None:
        self.episodes_since_sync += 1

    def request_sync(self) -> None:
        """The server asks for this agent's local data (a global sync is under way)."""
        self.sync_requested = True

    def wants_upload(self) -> bool:
        self._adopt_pending()
        if not self.local_rewards:
            return False
        return self.sync_requested or sync_condition(self.episodes_since_sync, self.combined.logdet,
                                                     self._server.logdet, self.sync_threshold)

    def take_upload(self) -> Upload:
        """Hand over local data; ``answers_request`` says whether it completes a sync another agent started."""
        self.answers_request = self.sync_requested
        self.sync_requested = False
        self.episodes_since_sync = 0
        return super().take_upload()


class PooledAgent(LsviAgent):
    """LSVI-UCB with perfect communication: uploads every episode and plans from the server's data."""

    def wants_upload(self) -> bool:
        return bool(self.local_rewards)


class IndependentAgent(LsviAgent):
    """LSVI-UCB on the agent's own data only (never communicates)."""

    plans_with_local_data = True
