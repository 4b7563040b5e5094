"""Seeds as a batch dimension: many independent seeds of the one-step A2C in one process.

``marlq sweep FILE --seeds N --batch-seeds`` runs seeds 0..N-1 of a one-step A2C configuration (Kölle
et al.'s: ``scenarios/cartpole_qa2c*.yaml``) side by side. Per seed, everything the single-seed run
has is kept: its worker generator (``marl_q.seeding.worker_seed``), its initial parameters
(``seeded_init(run.seed)``), its environment's generator, its sim clock, and its own run directory
written by the run's own writers (``marl_q.runtime.Runtime``: metrics.csv, train.csv, comm.csv,
quantum.csv, checkpoints, summary.json). What is shared is the arithmetic:

- the parameters of every seed are rows of one (S, P) float32 tensor, and the server's optimizer
  (``make_optimizer``: FlatAdam / FlatRMSprop / FlatSGD, element-wise) steps all rows at once;
- CartPole's dynamics run on a (4, S) state (Gymnasium's CartPoleVectorEnv formulas, op for op); each
  seed's resets draw from that seed's own env generator, in the same order as alone;
- the loop is every family's rollout core (``agents.rollout.rollout``): the seeds' CartPoles are one
  Gymnasium vector (``CartPoleSeeds``) under ``GymVector`` (its next-step autoreset and episode book),
  the one-step update is the ``store`` hook, and each seed's sim bookkeeping and its server's update
  the ``after`` hook, which ends the rollout when every seed has its budget;
- ``mlp`` heads run as stacked matmuls ((S, R, in) @ (S, in, out): numpy calls the same per-slice
  kernel as for the single seed's 2-D product), their backward likewise;
- circuit heads (``vqc``/``hybrid`` with a numpy twin) run through the circuits' seed-batched entry
  point (``circuits.twins.SeedBatchedVQC``: weights with a leading seed axis; on the compiled kernels
  one call per pass for all seeds, each seed's bits its own twin's); the circuits they count are
  reported per seed where they are read (an episode's quantum.csv row, a checkpoint, the summary);
- the virtual clock of the sim backend is computed for every seed as ``_EventSim`` computes it for one
  worker (no jitter: no draws), and the ledger rows are the ones ``Server.receive`` writes.

So a seed's metrics.csv, train.csv and comm.csv equal its single-seed run's bytes (tests/marl_q/
test_batched_seeds.py; docs/statistics.md, "Batched seeds"). A periodic checkpoint also holds the seed's
worker, env and clock as data (``_capture``, snapshot kind ``BATCHED_SNAPSHOT``): ``marlq sweep
--batch-seeds`` run again continues a stopped cell's seeds side by side, and ``marlq resume SEED_DIR``
one seed, exactly (``resume_batched_seeds``). The final checkpoint holds none (the last push is never
delivered): extending a finished seed continues from its server state with a fresh worker (inexact).

What cannot be batched is refused before anything is written (``check_batchable``: exit 2 naming the
key): more than one worker (asynchronous multi-worker sim runs may come later), other algorithms than
the one-step A2C, heads without a numpy pass, jitter, faults, evaluation, lr schedules, grad clipping.
The team learners (MAPPO, IPPO, IA2C, MAA2C with one worker) are batched another way, each seed its
whole single run with the updates batched: ``check_batchable`` and ``run_batched_seeds`` hand them to
agents/batched_ppo.py.
"""
from __future__ import annotations

import copy
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import numpy as np
import torch
from torch import nn

from agents.actor_critic import ActorCriticConfig, build_models, make_optimizer
from agents.heads import FlatParameters, head_report, worker_heads
from agents.numpy_heads import NumpyMLP, numpy_head
from agents.rollout import EpisodeBook, GymVector, Step, rollout
from circuits.twins import seed_batched_twin
from marl_q.errors import CheckpointError, ConfigError
from marl_q.messages import HELLO, SERVER, Message
from marl_q.metrics import DIAGNOSTICS
from marl_q.progress import Progress
from marl_q.protocol import Work, worker_name
from marl_q.registry import SCENARIOS
from marl_q.seeding import worker_seed
from marl_q.services import PARAMS
from marl_q.state_format import rng_from_state, rng_state

BATCHED_SCENARIOS = ("cartpole",)
W0 = worker_name(0)  # the one worker of every seed
BLOCK = 256  # steps of Gumbel noise drawn at once per seed (the same draws as one (1, A) call per step)
BATCHED_SNAPSHOT = "batched_a2c"  # snapshot.kind of a batched seed's checkpoints (marl_q.runtime.Runtime.checkpoint)


class UpdateRows:
    """Every seed's server rows of its updates, kept as columns and written a block of steps at a time.

    Each update of a seed is the two comm.csv rows ``Server.receive`` writes for a push and its answer
    (``Ledger.record``) and one train.csv row (``TrainLog.write``), in the very text those write (the
    batched seeds' byte tests hold the two to it); the ledger counts them (``Ledger.tally``) and the
    files take them as text (``Ledger.write_lines``, ``TrainLog.write_lines``). Row by
    row through the writers, they cost two thirds of a batched seed-step; here a step adds one column
    per field for all seeds (``add``), and a seed's rows become text in one pass when its block is
    written (``write``): before its checkpoint, when it finishes, and every ``BLOCK`` steps. Nothing
    reads the ledger's or train.csv's counters in between (a one-step A2C's episode rows do not)."""

    def __init__(self, nbytes: int) -> None:
        self.nbytes = nbytes
        self.t: list[np.ndarray] = []  # per step: (S,) arrival time of each seed's push at its server
        self.env: list[np.ndarray] = []  # per step: (S,) each seed's env steps when its server took the push
        self.k: list[int] = []  # per step: the update's version
        self.diags: list[list[tuple]] = []  # per step: each seed's train.csv diagnostics, as text
        self.on: list[np.ndarray] = []  # per step: (S,) which seeds pushed
        self.perf: list[float] = []  # per step: time.perf_counter() (the sidecars' wall clock)
        self.first = 0  # rows of steps before this index are written for every seed
        self.done: dict[int, int] = {}  # seed -> steps written for it beyond ``first``

    def add(self, t: np.ndarray, env: np.ndarray, k: int, diags: list[tuple], on: np.ndarray) -> None:
        self.t.append(t)
        self.env.append(env.copy())
        self.k.append(k)
        self.diags.append(diags)
        self.on.append(on.copy())
        self.perf.append(time.perf_counter())

    def write(self, rt: Any, s: int) -> None:
        """Seed ``s``'s rows not yet written, into its run's files (``rt``: its Runtime)."""
        j0 = self.done.get(s, self.first)
        steps = [j for j in range(j0 - self.first, len(self.k)) if self.on[j][s]]
        self.done[s] = self.first + len(self.k)
        if not steps:
            return
        led, train, n = rt.ledger, rt.train, self.nbytes
        ts = [float(self.t[j][s]) for j in steps]
        envs = [int(self.env[j][s]) for j in steps]
        ks = [self.k[j] for j in steps]
        diags = [self.diags[j][s] for j in steps]
        perf = [self.perf[j] for j in steps]
        if train.file is not None and train.writer is None:  # the first row makes the file (TrainLog's lazy writer)
            train.write(ts[0], W0, envs[0], ks[0], 0, [dict(zip(DIAGNOSTICS, diags[0]))])
            first_train = 1  # (the ledger still writes this update's rows below)
        else:
            first_train = 0
        c = led.count
        comm = "".join([f"{c + 2 * i},{t:.6f},{W0},{SERVER},grad,{v},{n},{v - 1},{v - 1},0,1,\r\n"
                        f"{c + 2 * i + 1},{t:.6f},{SERVER},{W0},{PARAMS},0,{n},{v},{v},,1,\r\n"
                        for i, (t, v) in enumerate(zip(ts, ks))])
        m = len(ks)
        led.write_lines(comm, [p for p in perf for _ in (0, 1)])
        led.tally("grad", m, n, up=True)
        led.tally(PARAMS, m, n, up=False)
        if train.file is None or m == first_train:
            return
        u = train.updates
        rows = range(first_train, m)
        text = "".join([f"{ts[i]!r},{W0},{envs[i]},{u + r},{ks[i]},0,{','.join(diags[i])}\r\n"
                        for r, i in enumerate(rows, 1)])
        train.write_lines(text, [perf[i] for i in rows])

    def write_all(self, rts: list[Any], seeds: Any) -> None:
        """Every listed seed's rows, then the columns are dropped (every seed is written up to here)."""
        for s in seeds:
            self.write(rts[s], s)
        self.first += len(self.k)
        for column in (self.t, self.env, self.k, self.diags, self.on, self.perf):
            column.clear()
        self.done.clear()


# ----------------------------------------------------------------------------- what can be batched
def check_batchable(cfg: Any) -> None:
    """Refuse (ConfigError naming the key) a configuration whose seeds this module cannot run side by
    side exactly as they run alone."""
    from agents.batched_ppo import TEAM_ALGORITHMS, check_team_batchable

    if cfg.algorithm.name in TEAM_ALGORITHMS:  # the team learners' batched runs: agents/batched_ppo.py
        return check_team_batchable(cfg)

    def refuse(key: str, value: Any, why: str) -> None:
        raise ConfigError(f"--batch-seeds: {key}={value!r} cannot be batched ({why})")

    b, run, srv = cfg.backend, cfg.run, cfg.server
    if b.name != "sim":
        refuse("backend.name", b.name, "seeds are batched on the sim backend only")
    if b.workers != 1:
        refuse("backend.workers", b.workers, "one worker per seed; asynchronous multi-worker runs are not batched yet")
    if b.schedule != "events":
        refuse("backend.schedule", b.schedule, "the event clock only")
    if b.compute.jitter != 0.0:
        refuse("backend.compute.jitter", b.compute.jitter, "the batched clock draws no jitter")
    if b.network.jitter != 0.0:
        refuse("backend.network.jitter", b.network.jitter, "the batched clock draws no jitter")
    f = b.faults
    for key in ("loss", "duplicate", "spike_p"):
        if getattr(f, key):
            refuse(f"backend.faults.{key}", getattr(f, key), "no injected faults")
    if f.crash:
        refuse("backend.faults.crash", f.crash, "no injected faults")
    if b.kill:
        refuse("backend.kill", b.kill, "no kills")
    if b.crash_after_steps:
        refuse("backend.crash_after_steps", b.crash_after_steps, "no injected faults")
    if cfg.algorithm.name != "a2c":
        refuse("algorithm.name", cfg.algorithm.name, "batched: the one-step A2C (algorithm a2c, n_steps 1) and "
               f"the team learners ({', '.join(TEAM_ALGORITHMS)}) with one worker")
    ac: ActorCriticConfig = cfg.algorithm.params
    for key, want in (("n_steps", 1), ("epochs", 1), ("minibatches", 1), ("update", "grad"), ("clip", None),
                      ("value_clip", None), ("max_grad_norm", None), ("lr_schedule", "constant"),
                      ("fast_path", True), ("adv_norm", False)):
        if getattr(ac, key) != want:
            refuse(f"algorithm.{key}", getattr(ac, key), f"the batched one-step A2C needs {want!r}")
    if srv.aggregation != "sync":
        refuse("server.aggregation", srv.aggregation, "sync only")
    if cfg.scenario.name not in BATCHED_SCENARIOS:
        refuse("scenario.name", cfg.scenario.name, f"batched environments: {', '.join(BATCHED_SCENARIOS)}")
    if cfg.scenario.params.num_envs != 1:
        refuse("scenario.num_envs", cfg.scenario.params.num_envs, "one environment per seed")
    if run.eval_every:
        refuse("run.eval_every", run.eval_every, "no evaluation in a batched run")
    if run.stop_after_updates is not None:
        refuse("run.stop_after_updates", run.stop_after_updates, "batched runs go to their budget")
    if run.tensorboard:
        refuse("run.tensorboard", run.tensorboard, "no TensorBoard files in a batched run")
    env = SCENARIOS.get(cfg.scenario.name).obj.make(cfg.scenario.params, seed=0)
    try:
        actor, critic = build_models(cfg, env.single_observation_space, env.single_action_space)
    finally:
        env.close()
    for role, module in (("actor", actor), ("critic", critic)):
        if numpy_head(module) is None:
            refuse(f"{role}.head", getattr(cfg, role).name, "the head has no numpy pass (agents.numpy_heads)")


# ----------------------------------------------------------------------------- heads
class StackedMLP:
    """An ``mlp`` head (Linear / ReLU / Tanh) of every seed at once: weights read from the rows of the
    stacked parameters, the same float64 arithmetic as ``NumpyMLP`` per seed (per-slice matmuls)."""

    def __init__(self, module: nn.Sequential, offset: int) -> None:
        self.layers: list[tuple[str, Optional[tuple[int, tuple[int, int], int, int]]]] = []
        for kind, layer in NumpyMLP(module).layers:
            if kind != "linear":
                self.layers.append((kind, None))
                continue
            out_dim, in_dim = layer.weight.shape
            self.layers.append(("linear", (offset, (out_dim, in_dim), offset + out_dim * in_dim, out_dim)))
            offset += out_dim * in_dim + out_dim
        self.end = offset

    def _weights(self, params: np.ndarray, spec: tuple) -> tuple[np.ndarray, np.ndarray]:
        w_off, (o, i), b_off, n_b = spec
        return params[:, w_off:w_off + o * i].reshape(-1, o, i), params[:, b_off:b_off + n_b]

    def forward(self, params: np.ndarray, x: np.ndarray) -> tuple[np.ndarray, Any]:
        """x (S, R, in) float64 -> (S, R, out) and what the backward needs."""
        saved = []
        h = x
        for kind, spec in self.layers:
            saved.append(h)
            if kind == "linear":
                w, bias = self._weights(params, spec)
                h = h @ w.transpose(0, 2, 1).astype(np.float64) + bias[:, None, :]
            elif kind == "tanh":
                h = np.tanh(h)
            else:
                h = np.maximum(h, 0.0)
        return h, (saved, h)

    def backward(self, params: np.ndarray, cache: Any, grad: np.ndarray, out: np.ndarray) -> None:
        """Write d loss / d parameters of every seed into ``out`` (S, P) float32 (its rows' slices)."""
        saved, last = cache
        outputs = saved[1:] + [last]
        for (kind, spec), h_in, h_out in zip(reversed(self.layers), reversed(saved), reversed(outputs)):
            if kind == "linear":
                w_off, (o, i), b_off, n_b = spec
                out[:, w_off:w_off + o * i] = (grad.transpose(0, 2, 1) @ h_in).reshape(-1, o * i)
                out[:, b_off:b_off + n_b] = grad.sum(axis=1)
                grad = grad @ params[:, w_off:w_off + o * i].reshape(-1, o, i).astype(np.float64)
            elif kind == "tanh":
                grad = grad * (1.0 - h_out * h_out)
            else:
                grad = grad * (h_out > 0.0)


class CircuitHeads:
    """A circuit head of every seed: ``circuits.twins.SeedBatchedVQC`` on the head's columns of the
    stacked parameters (its parameters in the module's order, as ``FlatParameters`` lays them out)."""

    def __init__(self, modules: list[nn.Module], offset: int, size: int) -> None:
        self.twin = seed_batched_twin(modules)
        if self.twin is None or self.twin.size != size:
            raise ValueError("the seeds' circuit heads have no seed-batched twin")
        self.offset, self.end = offset, offset + size

    def forward(self, params: np.ndarray, x: np.ndarray) -> tuple[np.ndarray, Any]:
        return self.twin.forward(params[:, self.offset:self.end], x)

    def backward(self, params: np.ndarray, cache: Any, grad: np.ndarray, out: np.ndarray) -> None:
        self.twin.backward(cache, grad, out[:, self.offset:self.end])

    def report_counts(self, seed: int) -> None:
        self.twin.report_counts(seed)


# ----------------------------------------------------------------------------- CartPole
class CartPoleBatch:
    """S CartPole-v1 copies, one per seed, as Gymnasium's CartPoleVectorEnv (num_envs 1, next-step
    autoreset) steps each: the same formulas op for op on a (4, S) state, and each copy's resets drawn
    from its own env generator (the seed's ``env.np_random``) in the same order."""

    def __init__(self, envs: list[Any]) -> None:
        self.envs = [e.unwrapped for e in envs]
        e0 = self.envs[0]
        for name in ("gravity", "masspole", "total_mass", "length", "polemass_length", "force_mag", "tau",
                     "theta_threshold_radians", "x_threshold", "max_episode_steps", "kinematics_integrator",
                     "_sutton_barto_reward"):
            setattr(self, name, getattr(e0, name))
        self.state = np.concatenate([e.state for e in self.envs], axis=1)  # (4, S)
        self.steps = np.concatenate([e.steps for e in self.envs])
        self.prev_done = np.concatenate([e.prev_done for e in self.envs])
        self.low, self.high = e0.low, e0.high

    def step(self, action: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        x, x_dot, theta, theta_dot = self.state
        force = np.sign(action - 0.5) * self.force_mag
        costheta = np.cos(theta)
        sintheta = np.sin(theta)
        temp = (force + self.polemass_length * np.square(theta_dot) * sintheta) / self.total_mass
        thetaacc = (self.gravity * sintheta - costheta * temp) / (
            self.length * (4.0 / 3.0 - self.masspole * np.square(costheta) / self.total_mass))
        xacc = temp - self.polemass_length * thetaacc * costheta / self.total_mass
        if self.kinematics_integrator == "euler":
            x = x + self.tau * x_dot
            x_dot = x_dot + self.tau * xacc
            theta = theta + self.tau * theta_dot
            theta_dot = theta_dot + self.tau * thetaacc
        else:
            x_dot = x_dot + self.tau * xacc
            x = x + self.tau * x_dot
            theta_dot = theta_dot + self.tau * thetaacc
            theta = theta + self.tau * theta_dot
        self.state = np.stack((x, x_dot, theta, theta_dot))
        terminated = ((x < -self.x_threshold) | (x > self.x_threshold)
                      | (theta < -self.theta_threshold_radians) | (theta > self.theta_threshold_radians))
        self.steps += 1
        truncated = self.steps >= self.max_episode_steps
        if self._sutton_barto_reward:
            reward = -np.array(terminated, dtype=np.float32)
        else:
            reward = np.ones_like(terminated, dtype=np.float32)
        for s in np.flatnonzero(self.prev_done):  # each copy's reset from its own generator
            self.state[:, s:s + 1] = self.envs[s].np_random.uniform(low=self.low, high=self.high, size=(4, 1))
        self.steps[self.prev_done] = 0
        reward[self.prev_done] = 0.0
        terminated[self.prev_done] = False
        truncated[self.prev_done] = False
        self.prev_done = np.logical_or(terminated, truncated)
        return self.state.T.astype(np.float32), reward, terminated, truncated


class CartPoleSeeds:
    """The seeds' CartPoles as one Gymnasium ``VectorEnv`` (``num_envs``, ``reset(seed=seeds)``,
    ``step``), for ``agents.rollout.GymVector``: the rollout core's adapter, with its next-step
    autoreset bookkeeping, is the one every Gymnasium family runs through. ``reset`` resets each copy
    with its seed (its own env, as alone), then the copies step as one ``CartPoleBatch``."""

    def __init__(self, envs: list[Any]) -> None:
        self.envs = envs
        self.num_envs = len(envs)
        self.batch: Optional[CartPoleBatch] = None

    def reset(self, seed: list[int]) -> tuple[np.ndarray, dict]:
        obs = [np.array(e.reset(seed=s)[0], dtype=np.float32) for e, s in zip(self.envs, seed)]
        self.batch = CartPoleBatch(self.envs)
        return np.concatenate(obs), {}

    def step(self, action: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict]:
        return (*self.batch.step(action), {})


# ----------------------------------------------------------------------------- the batched run
@dataclass
class _Clock:
    """The sim's delays for one worker without jitter (``backends.sim._Timing``, jitter factor 1.0)."""

    step_s: float
    factor: float
    latency_s: float
    bandwidth: float

    def network_s(self, nbytes: int) -> float:
        return (self.latency_s + nbytes / self.bandwidth) * 1.0


class BatchedA2C:
    """Seeds ``cfgs[s].run.seed`` of one configuration, each with its Runtime (``rts[s]``), stepped
    together; ``run()`` writes every seed's run directory as its single-seed run would."""

    def __init__(self, cfgs: list[Any], rts: list[Any], snapshots: Optional[list[dict[str, Any]]] = None) -> None:
        """``snapshots``: each seed's ``batched_seed`` state from its checkpoint (``_capture``), to continue
        the seeds exactly where they were (their ``rts`` resumed from the same checkpoints)."""
        self.cfgs, self.rts = cfgs, rts
        cfg = cfgs[0]
        self.ac: ActorCriticConfig = cfg.algorithm.params
        self.S = S = len(cfgs)
        spec = SCENARIOS.get(cfg.scenario.name).obj
        self.seeds = [worker_seed(c.run.seed, 0) for c in cfgs]
        self.rngs = [np.random.default_rng(ws) for ws in self.seeds]  # the worker's generator (ActorCriticWorker)
        envs = [spec.make(c.scenario.params, seed=ws) for c, ws in zip(cfgs, self.seeds)]
        self.vec = GymVector(CartPoleSeeds(envs), self.seeds)  # each copy reset with its seed; obs (S, obs_dim) float32
        self.book = EpisodeBook(S)
        # per seed: its own modules (initial parameters from seeded_init(run.seed)) over a flat buffer
        models = [build_models(c, e.single_observation_space, e.single_action_space) for c, e in zip(cfgs, envs)]
        self.flats = [FlatParameters(a, c) for a, c in models]
        self.resources = [worker_heads({"actor": a, "critic": c}, cf.run.seed, 0) for (a, c), cf in zip(models, cfgs)]
        self.param = torch.from_numpy(np.stack([f.numpy() for f in self.flats]))  # (S, P) float32, the servers'
        self.grad = np.zeros(self.param.shape, dtype=np.float32)
        self.optimizer = make_optimizer(self.ac.optimizer, self.param, self.ac)
        n_actor = sum(p.numel() for p in models[0][0].parameters())
        self.actor = self._head([m[0] for m in models], 0, n_actor)
        self.critic = self._head([m[1] for m in models], n_actor, self.param.shape[1] - n_actor)
        self.n_actions = int(envs[0].single_action_space.n)
        b = cfg.backend
        self.clock = _Clock(b.compute.step_s, b.compute.straggler_factor if 0 in b.compute.stragglers else 1.0,
                            b.network.latency_s, b.network.bandwidth_bytes_per_s)
        self.nbytes = int(self.param.shape[1]) * 4
        self._grad_payload = {"grad": np.zeros(self.param.shape[1], dtype=np.float32)}  # sized like a push (nbytes)
        self._params_payload = {PARAMS: self._grad_payload["grad"]}
        self._start = self._restore(snapshots) if snapshots is not None else None

    # -- exact resume: a seed's state at a checkpoint, as data ---------------------------------------
    def _capture(self, s: int, k: int, t: float, block: np.ndarray) -> dict[str, Any]:
        """Seed s's worker, env and clock after its k-th update (the sim snapshot of its checkpoint:
        its server is in the checkpoint already). ``t``: when its next step starts; ``block``: the
        Gumbel uniforms drawn ahead (the generator's state is after them)."""
        b = self.vec.env.batch
        return {"batched_seed": {
            "k": k, "t": t, "obs": self.vec.obs[s].copy(), "vec_prev_done": bool(self.vec.prev_done[s]),
            "cart_state": b.state[:, s].copy(), "cart_steps": int(b.steps[s]), "cart_prev_done": bool(b.prev_done[s]),
            "env_rng": rng_state(b.envs[s].np_random), "worker_rng": rng_state(self.rngs[s]),
            "noise_block": block[s].copy(), "episode_return": float(self.book.returns[s]),
            "episode_length": int(self.book.lengths[s])}}

    def _restore(self, snapshots: list[dict[str, Any]]) -> tuple[np.ndarray, int, np.ndarray]:
        """Every seed as ``_capture`` saw it, its server from its resumed Runtime (parameters and optimizer
        rows); the (clock, step, noise block) the run goes on from. Seeds checkpointed after different
        numbers of updates cannot step together (CheckpointError)."""
        ks = sorted({int(snap["k"]) for snap in snapshots})
        if len(ks) != 1:
            raise CheckpointError(f"the seeds' checkpoints are at different updates ({', '.join(map(str, ks))}); "
                                  "resume each group of equal updates on its own")
        k = ks[0]
        b = self.vec.env.batch
        optim = self.optimizer.state_dict()
        block = np.zeros((self.S, BLOCK, self.n_actions))
        t = np.zeros(self.S)
        for s, snap in enumerate(snapshots):
            state = self.rts[s].service.state_dict()
            self.param[s].copy_(torch.as_tensor(np.asarray(state["params"])))
            for key, value in optim.items():
                if value.dim():
                    value[s].copy_(torch.as_tensor(np.asarray(state[f"optim.{key}"])))
            self.vec.obs[s] = snap["obs"]
            self.vec.prev_done[s] = snap["vec_prev_done"]
            b.state[:, s] = snap["cart_state"]
            b.steps[s] = snap["cart_steps"]
            b.prev_done[s] = snap["cart_prev_done"]
            b.envs[s].np_random = rng_from_state(snap["env_rng"])
            self.rngs[s] = rng_from_state(snap["worker_rng"])
            self.book.returns[s], self.book.lengths[s] = snap["episode_return"], snap["episode_length"]
            block[s] = snap["noise_block"]
            t[s] = snap["t"]
        for key, value in optim.items():
            if not value.dim():  # the step count: one per update, every seed's the same
                optim[key] = torch.tensor(k)
        self.optimizer.load_state_dict(optim)
        return t, k, block

    def _head(self, modules: list[nn.Module], offset: int, size: int) -> Any:
        if NumpyMLP.supports(modules[0]):
            return StackedMLP(modules[0], offset)
        return CircuitHeads(modules, offset, size)

    def _report(self, s: int) -> Optional[dict[str, Any]]:
        """Seed s's circuit counts since its previous report (``head_report``; None without a circuit head)."""
        res = self.resources[s]
        if res is None:
            return None
        for head in (self.actor, self.critic):
            if isinstance(head, CircuitHeads):
                head.report_counts(s)
        return head_report(res)

    # -- the server side of one seed, as Server.receive records it ----------------------------
    def _record_hello(self, s: int, t: float) -> None:
        rt, name = self.rts[s], worker_name(0)
        hello = Message(name, SERVER, HELLO, info={"life": str(len(rt.resumes))})
        rt.server._life[name] = str(len(rt.resumes))
        rt.ledger.record(hello, t, 0, accepted=True)
        rt.ledger.record(Message(SERVER, name, PARAMS, self._params_payload, base_version=0), t, 0)

    def _sync_service(self, s: int, updates: int) -> None:
        """Seed s's Runtime holds its server's state (parameters, optimizer, counters) and its circuit
        counts for a checkpoint."""
        rt = self.rts[s]
        report = self._report(s)
        if report is not None:
            rt.quantum.add(W0, report)
        # through the service's and the server's own state (a checkpoint's format): the batched
        # optimizer's rows are this seed's, and every update was one fresh push from its one worker
        state = rt.service.state_dict()
        state["params"] = self.param[s].numpy().copy()
        state["updates"] = np.array(updates)
        for key, value in self.optimizer.state_dict().items():
            state[f"optim.{key}"] = value[s].numpy().copy() if value.dim() else np.array(updates)
        rt.service.load_state_dict(state)
        core = rt.server.state()
        core.update(version=updates, staleness_counts=[[0, updates]] if updates else [],
                    last_seq=[[W0, "grad", updates]] if updates else [])
        rt.server.load_state(core)

    # -- the rollout ------------------------------------------------------------------------------
    def run(self, progress: bool = True) -> list[dict[str, Any]]:
        """Every seed to its budget through ``agents.rollout.rollout``: ``act`` is the actor's forward
        (kept for the update) and each seed's Gumbel draw, ``store`` the one-step update's gradient,
        ``after`` each seed's sim bookkeeping (its episodes, its budget, its server's update and
        checkpoints), ending the rollout when every seed has its budget."""
        S, ac, clock = self.S, self.ac, self.clock
        net_up0 = clock.network_s(0)
        net = clock.network_s(self.nbytes)
        if self._start is None:
            # each seed's clock: hello at 0 reaches the server at net_up0, its params reach the worker
            t = np.zeros(S)
            for s in range(S):
                t1 = 0.0 + net_up0
                self._record_hello(s, t1)
                t[s] = t1 + net
            k = 0  # the k-th step of every seed (version k - 1), then the k-th update
            block = np.zeros((S, BLOCK, self.n_actions))
        else:  # resumed: where the checkpoints left every seed
            t, k, block = self._start
        active = np.ones(S, dtype=bool)
        summaries: list[Optional[dict[str, Any]]] = [None] * S
        gamma, lam, scale = ac.gamma, ac.gae_lambda, ac.reward_scale
        rows = np.arange(S)
        params = self.param.numpy()  # the servers' rows (the optimizer steps them in place)
        diags: list[tuple] = []
        updates = UpdateRows(self.nbytes)  # each seed's update rows, written a block at a time
        env_steps = np.array([rt.env_steps for rt in self.rts])  # each seed's, as its Runtime counts them
        checkpoints = any(rt.out is not None and rt.cfg.run.checkpoint_every for rt in self.rts)
        # a seed can end only at its env-step budget, unless it also counts episodes (then Runtime.done decides)
        by_steps = all(rt.cfg.run.total_episodes is None and rt.cfg.run.total_env_steps is not None for rt in self.rts)
        budget = np.array([rt.cfg.run.total_env_steps or 0 for rt in self.rts])
        # the one progress bar (marl_q.progress): every seed's env steps against their budgets (episodes
        # where a seed counts them), with its rate and ETA; a file (a sweep's batch log) gets a line a minute
        total = int(budget.sum()) if by_steps else S * int(self.cfgs[0].run.total_episodes or 0)
        bar = Progress(total, "step" if by_steps else "ep", f"{S} seeds of a2c on {self.cfgs[0].scenario.name}",
                       enabled=progress, initial=int(env_steps.sum()) if by_steps else sum(rt.episodes for rt in self.rts),
                       unit_scale=True, mininterval=1.0 if sys.stderr.isatty() else 60.0)

        def act(obs: np.ndarray) -> tuple[np.ndarray, np.ndarray, Any]:
            """Every copy's action, with the actor's logits and forward kept for the update."""
            nonlocal k, block
            k += 1
            logits, actor_cache = self.actor.forward(params, obs.astype(np.float64)[:, None, :])
            logits = logits[:, 0, :]
            j = (k - 1) % BLOCK
            if j == 0:  # the next BLOCK steps' uniforms of every seed: its generator's stream in the same order
                block = np.stack([rng.random((BLOCK, self.n_actions)) for rng in self.rngs])
            noise = block[:, j]
            return np.argmax(logits - np.log(-np.log(noise)), axis=1), logits, actor_cache

        def learn(_t: int, obs: np.ndarray, action: tuple, step: Step) -> None:
            """The one-step update's gradient of every seed into ``self.grad`` (agents.numpy_heads.
            a2c_gradient, per seed a row) and its train.csv diagnostics into ``diags``."""
            nonlocal diags
            actions, logits, actor_cache = action
            rew, term, done = step.data
            valid = step.valid
            obs_pair = np.stack([obs, self.vec.obs], axis=1).astype(np.float64)  # (S, 2, obs)
            values_col, critic_cache = self.critic.forward(params, obs_pair)
            v, v_next = values_col[:, 0, 0], values_col[:, 1, 0]
            rewards = rew.astype(np.float64) * scale
            not_term = 1.0 - term.astype(np.float64)
            not_done = 1.0 - done.astype(np.float64)
            deltas = rewards + gamma * not_term * v_next - v
            adv = deltas + gamma * lam * not_done * np.zeros(S)
            returns = adv + v
            grad_logits = np.zeros((S, 1, self.n_actions))
            grad_values = np.zeros((S, 2, 1))
            no_diag = ("", "", "", "", "", "")  # a step that only reset the env: no valid sample, empty cells
            diags = [no_diag] * S
            if valid.any():
                z = logits - logits.max(axis=1, keepdims=True)
                logp = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
                p = np.exp(logp)
                onehot = np.zeros_like(p)
                onehot[rows, actions] = 1.0
                g = (adv / 1)[:, None] * (p - onehot)
                entropy = None
                if ac.ent_coef != 0.0:
                    entropy = -(p * logp).sum(axis=1, keepdims=True)
                    g += (ac.ent_coef / 1) * p * (logp + entropy)
                error = v - returns
                gv = (2.0 * ac.vf_coef / 1) * error
                grad_logits[valid, 0] = g[valid]
                grad_values[valid, 0, 0] = gv[valid]
                # agents.losses.loss_grad's terms: a one-element np.dot is the product itself; the
                # entropy's two-term sum stays np.vdot (a BLAS dot, which may fuse), seed by seed
                policy = (-(adv * logp[rows, actions]) / 1).tolist()
                value = ((error * error) / 1).tolist()
                for s in np.flatnonzero(valid & active).tolist():
                    ent = float(-np.vdot(p[s], logp[s]) if entropy is None else entropy[s:s + 1].sum()) / 1
                    diags[s] = (repr(policy[s]), repr(value[s]), repr(ent), "0.0", "", "")
            self.grad[:] = 0.0
            self.critic.backward(params, critic_cache, grad_values, self.grad)
            self.actor.backward(params, actor_cache, grad_logits, self.grad)

        def after(_t: int, step: Step, closed: list[dict[str, Any]]) -> bool:
            """The sim's bookkeeping of this step, seed by seed, then every server's update; true when
            every seed has its budget."""
            nonlocal t
            valid = step.valid
            # the worker's step ends at t + cost * step_s
            cost = valid.astype(np.float64)
            t_done = t + cost * clock.step_s * clock.factor * 1.0
            t_server = t_done + net
            t_next = t_server + net
            ended = dict(zip(np.flatnonzero(step.ended).tolist(), closed)) if closed else {}
            env_steps[active] += valid[active]
            stepped = int(valid[active].sum())  # (the bar's count)
            steps = valid.astype(np.int64).tolist()
            may_end = (env_steps >= budget).tolist() if by_steps else None
            for s in np.flatnonzero(active).tolist():
                rt = self.rts[s]
                if s in ended:  # a metrics row (and quantum.csv's, with the circuits counted so far): the run's own path
                    rt.record_work(W0, Work([], env_steps=steps[s], episodes=[ended[s]], resources=self._report(s)),
                                   float(t_done[s]))
                else:  # (the circuits' counts are added up and reported where they are read: the same totals)
                    rt.env_steps += steps[s]
                # its last push is never delivered (the sim stops at the step that ends it)
                if (may_end is None or may_end[s]) and rt.done():
                    active[s] = False
                    updates.write(rt, s)
                    summaries[s] = self._finish(s, k - 1, float(t_done[s]))
            # the server: one optimizer step on every row (finished seeds' rows are no longer read)
            self.optimizer.step(torch.from_numpy(self.grad))
            updates.add(t_server, env_steps, k, diags, active)
            if checkpoints:
                t_srv = t_server.tolist()
                for s in np.flatnonzero(active).tolist():
                    if self.rts[s].checkpoint_due(updates=k):
                        updates.write(self.rts[s], s)
                        self._sync_service(s, k)
                        self.rts[s].checkpoint(t_srv[s], capture=lambda s=s: self._capture(s, k, float(t_next[s]), block),
                                               kind=BATCHED_SNAPSHOT)
            if len(updates.k) >= BLOCK or not active.any():
                updates.write_all(self.rts, range(S))
            t = t_next
            bar.update(stepped if by_steps else len(closed))
            if not active.any():
                bar.close()
                return True
            return False

        # an episode's metrics row: return, length (the book's), then the version that played it
        rollout(self.vec, self.book, None, act, store=learn, row=lambda i: {"version": k - 1},
                to_env=lambda action: action[0], after=after)
        return summaries

    def _finish(self, s: int, updates: int, now: float) -> dict[str, Any]:
        """Seed s reached its budget after ``updates`` updates (its last push is never delivered, as in
        the sim): the final checkpoint and summary.json, as ``run_sim`` writes them."""
        rt = self.rts[s]
        self._sync_service(s, updates)
        if rt.out is not None:
            rt.checkpoint(now)
        return rt.finish(now, virtual=True, checkpoint=False)


def config_texts(cfgs: list[Any]) -> dict[int, str]:
    """Each seed's config.yaml text (``cfg.to_yaml()``): rendered once and the run's seed put in per seed,
    checked against a full rendering for the first seeds (else every seed is rendered)."""
    first = cfgs[0].to_yaml()
    head = f"run:\n  seed: {cfgs[0].run.seed}\n"
    if not first.startswith(head):
        return {c.run.seed: c.to_yaml() for c in cfgs}
    texts = {c.run.seed: f"run:\n  seed: {c.run.seed}\n" + first[len(head):] for c in cfgs}
    if any(texts[c.run.seed] != c.to_yaml() for c in cfgs[1:3]):
        return {c.run.seed: c.to_yaml() for c in cfgs}
    return texts


def run_batched_seeds(config: str, overrides: list[str], seeds: list[int], outs: list[Path],
                      progress: bool = True) -> list[dict[str, Any]]:
    """Run ``seeds`` of ``config`` in one process, seed ``seeds[i]`` into ``outs[i]`` (new run
    directories, made here as ``run_experiment`` makes them). Refuses (ConfigError) what cannot be
    batched before anything is written."""
    from marl_q.config import load_config
    from marl_q.rundir import check_new_run_dir, lock_run_dir, make_run_dir
    from marl_q.runtime import Runtime, build_algorithm

    base = load_config(config, list(overrides), seed=seeds[0])
    from agents.batched_ppo import TEAM_ALGORITHMS, run_batched_team_seeds

    if base.algorithm.name in TEAM_ALGORITHMS:  # each seed its whole single run, the updates batched
        return run_batched_team_seeds(config, overrides, seeds, outs, progress=progress)
    check_batchable(base)
    cfgs = []
    for seed in seeds:  # the file is read once: each seed's config is a copy with its run.seed
        cfg = copy.deepcopy(base)
        cfg.run.seed = seed
        cfg.run.progress = False  # as `marlq run --quiet` (what a sweep runs) writes it
        cfgs.append(cfg)
    texts = config_texts(cfgs)
    for out in outs:
        check_new_run_dir(Path(out))
    torch.set_num_threads(cfgs[0].backend.threads_per_worker)
    rts, locks = [], []
    try:
        for cfg, out in zip(cfgs, outs):
            built = build_algorithm(cfg)
            out = make_run_dir(Path(out))
            (out / "config.yaml").write_text(texts[cfg.run.seed])
            locks.append(lock_run_dir(out))
            rts.append(Runtime(cfg, out, built=built))
        return BatchedA2C(cfgs, rts).run(progress=progress)
    finally:
        for lock in locks:
            lock.close()


def resume_batched_seeds(run_dirs: list[Path], overrides: list[str] = (), checkpoint: Optional[Path] = None,
                         progress: bool = True) -> list[dict[str, Any]]:
    """Continue batched seeds from their checkpoints (the latest, or ``checkpoint`` for a single run), side
    by side and exactly: each seed's metrics.csv, train.csv and comm.csv then equal those of the run
    that was never stopped, byte for byte. Each run directory is prepared as ``marlq resume`` prepares
    one (``marl_q.experiment.prepare_resume``: locked, the files kept in resume_backup_<n>/ and cut back
    to the checkpoint); its checkpoint must hold a batched seed's snapshot (``BATCHED_SNAPSHOT``), and
    every seed the same configuration but for its seed, checkpointed after the same number of updates."""
    from marl_q.experiment import prepare_resume
    from marl_q.runtime import Runtime

    if checkpoint is not None and len(run_dirs) != 1:
        raise ConfigError("resume_batched_seeds: a named checkpoint is for one run directory")
    cfgs: list[Any] = []
    rts: list[Any] = []
    snapshots: list[dict[str, Any]] = []
    locks: list[Any] = []
    try:
        for run_dir in run_dirs:
            cfg, _backend, point, lock = prepare_resume(Path(run_dir), list(overrides), checkpoint, kind=BATCHED_SNAPSHOT)
            locks.append(lock)
            check_batchable(cfg)
            if cfgs:
                _same_configuration(cfgs[0], cfg, Path(run_dirs[0]), Path(run_dir))
            cfg.run.progress = False
            cfgs.append(cfg)
            snapshots.append(point.snapshot["batched_seed"])
            rts.append(Runtime(cfg, Path(run_dir), resume=point))
        torch.set_num_threads(cfgs[0].backend.threads_per_worker)
        return BatchedA2C(cfgs, rts, snapshots).run(progress=progress)
    finally:
        for lock in locks:
            lock.close()


def _same_configuration(first: Any, cfg: Any, first_dir: Path, run_dir: Path) -> None:
    """Seeds resumed side by side must be one configuration (ConfigError naming the two runs)."""
    other = copy.deepcopy(cfg)
    other.run.seed = first.run.seed
    if other.to_yaml() != first.to_yaml():
        raise ConfigError(f"{run_dir} and {first_dir} are not one configuration (their config.yaml differ beyond "
                          "run.seed): resume them in separate batches")


# ----------------------------------------------------------------------------- the sweep's jobs
def batch_jobs(config: str, overrides: list[str], seeds: list[int], cell: Path, width: int) -> list[tuple[Path, list[str]]]:
    """``marlq sweep --batch-seeds``: the seeds of one grid cell as at most ``width`` processes (seeds
    dealt round-robin), each running its share side by side into ``cell/seed<N>``; (log name, command)
    pairs for the sweep's pool."""
    width = max(1, min(width, len(seeds)))
    jobs = []
    for j in range(width):
        share = seeds[j::width]
        cmd = [sys.executable, "-m", "agents.batched_a2c", config, "--cell", str(cell),
               "--seeds", ",".join(str(s) for s in share)]
        for ov in overrides:
            cmd += ["--set", ov]
        jobs.append((Path(cell) / f"batch{j}", cmd))
    return jobs


def resume_jobs(seeds: list[int], cell: Path, width: int) -> list[tuple[Path, list[str]]]:
    """``marlq sweep --batch-seeds`` over a cell whose seeds stopped with batched checkpoints: the seeds
    to continue as at most ``width`` processes, each resuming its share side by side (``--resume``)."""
    width = max(1, min(width, len(seeds)))
    return [(Path(cell) / f"resume{j}", [sys.executable, "-m", "agents.batched_a2c", "--resume", "--cell", str(cell),
                                         "--seeds", ",".join(str(s) for s in seeds[j::width])])
            for j in range(width)]


def main(argv: Optional[list[str]] = None) -> int:
    """One process of ``marlq sweep --batch-seeds`` (``batch_jobs``, ``resume_jobs``): exit 2 on bad input,
    as marlq."""
    import argparse

    from marl_q.errors import UserError

    p = argparse.ArgumentParser(prog="python -m agents.batched_a2c")
    p.add_argument("config", nargs="?", help="the scenario file (not with --resume: each run's config.yaml is read)")
    p.add_argument("--cell", required=True, help="the grid cell's folder; seed N goes to CELL/seed<N>")
    p.add_argument("--seeds", required=True, help="comma-separated seeds")
    p.add_argument("--set", dest="overrides", action="append", default=[])
    p.add_argument("--resume", action="store_true", help="continue the seeds' runs from their latest checkpoints")
    args = p.parse_args(argv)
    if (args.config is None) != args.resume:
        p.error("give a scenario file, or --resume (not both)")
    seeds = [int(s) for s in args.seeds.split(",") if s != ""]
    try:
        dirs = [Path(args.cell) / f"seed{s}" for s in seeds]
        summaries = (resume_batched_seeds(dirs, args.overrides) if args.resume
                     else run_batched_seeds(args.config, args.overrides, seeds, dirs))
    except UserError as exc:
        print(f"marlq: error: {exc}", file=sys.stderr)
        return 2
    for seed, summary in zip(seeds, summaries):
        print(f"seed {seed}: {summary['status']}, {summary['env_steps']} env steps, "
              f"final_return {summary.get('final_return')}")
    return 0 if all(s["status"] == "completed" for s in summaries) else 1


if __name__ == "__main__":
    sys.exit(main())
