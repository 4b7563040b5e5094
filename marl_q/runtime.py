"""One run: the algorithm, its service on the server, the ledger, metrics, checkpoints and summary.

Backends (marl_q/backends/) own the workers and the clock; the one driver (marl_q/driver.py) takes
their events and reports each finished Worker.step() here and routes every message through `deliver`.

Checkpoints hold the server's full state (the service's arrays: parameters, optimizer, versions;
the core's version, RNG, staleness counts and duplicate filter; the ledger's counters; the byte
positions of metrics.csv and comm.csv). A backend that can also capture its workers (sim) hands
its `capture` to `safe_point`, between its events, and checkpoints are taken only there; that makes
resume exact. Other backends' checkpoints are taken after a message (`after_delivery`).
"""
from __future__ import annotations

import sys
import time
from pathlib import Path
from dataclasses import dataclass
from typing import Any, Callable, Optional

from marl_q.config import ExperimentConfig
from marl_q.evaluation import EVAL_FILE, EvalWriter, eval_row
from marl_q.ledger import Ledger, QuantumLedger
from marl_q.metrics import TrainLog
from marl_q.progress import RunProgress, tapped
from marl_q.protocol import Work, worker_names
from marl_q.registry import algorithm_class
from marl_q.errors import CheckpointError, RunWriteError
from marl_q.rundir import (SERVICE_PREFIX, MetricsWriter, SnapshotUnavailable, archive_run_files, checkpoints,
                           load_checkpoint, save_checkpoint, save_snapshot, service_arrays, set_tap, write_json_atomic)
from marl_q.seeding import derive
from marl_q.server import make_server, staleness_hist
from marl_q.services import ServiceGroup
from marl_q.teams import ReturnsLog, with_team_fields

CHECKPOINT_FORMAT = 2


SIM_SNAPSHOT = "sim"  # the sim backend's snapshots (a checkpoint header's snapshot.kind, left out for them)


@dataclass
class ResumePoint:
    """A checkpoint to continue from: its arrays and header, and the sim snapshot if it has one."""

    path: Path
    arrays: dict[str, Any]
    meta: dict[str, Any]
    snapshot: Optional[dict[str, Any]] = None


def build_algorithm(cfg: ExperimentConfig) -> tuple[Any, Any]:
    """The run's algorithm and its service (the server's models): where a config the algorithm cannot
    run is refused (a head that cannot fit the env's sizes, say), so `run_experiment` builds them
    before it writes anything."""
    algorithm = algorithm_class(cfg)(cfg)
    return algorithm, algorithm.make_service()


class Runtime:
    """Everything of a run that is not a worker and not the clock."""

    def __init__(self, cfg: ExperimentConfig, out: Optional[Path], resume: Optional[ResumePoint] = None,
                 built: Optional[tuple[Any, Any]] = None) -> None:
        """``built``: the (algorithm, service) of ``build_algorithm(cfg)``, when the caller built them
        before making the run directory."""
        self.cfg = cfg
        self.out = out
        self.algorithm, service = built if built is not None else build_algorithm(cfg)
        self.worker_names = list(worker_names(cfg.backend.workers))
        meta = resume.meta if resume else {}
        self.tracker = None  # run.tensorboard: sees every row written below (marl_q.tracking)
        if out is not None and cfg.run.tensorboard:
            from marl_q.tracking import TensorBoardTracker

            # on resume TensorBoard hides what an earlier session logged after the checkpoint's env steps
            self.tracker = TensorBoardTracker(out, purge_step=int(meta["env_steps"]) + 1 if resume else None)
            set_tap(out, self.tracker)
        # several services (one learner per team): comm.csv's and train.csv's rows name theirs
        several = isinstance(service, ServiceGroup) and len(service.services) > 1
        self.ledger = Ledger(out / "comm.csv" if out else None, resume=meta.get("ledger_state"), services=several)
        self.service = service
        self.server = make_server(self.service, self.worker_names, cfg.server, self.ledger, seed=cfg.run.seed,
                             progress=self.progress, on_train=self.record_train)
        metrics_at = tuple(meta["metrics_position"]) if resume else None
        # per-team and per-agent returns (marl_q/teams.py): returns.csv, and with several teams a column per team
        self.teams = getattr(self.algorithm, "teams", None)
        self.returns = ReturnsLog(self.teams, out, resume=meta.get("returns")) if self.teams is not None else None
        self.metrics = MetricsWriter(out / "metrics.csv" if out else None, with_team_fields(
                                         self.algorithm.metric_fields, self.teams),
                                     resume_at=metrics_at, wall_offset=meta.get("wall_s", 0.0),
                                     wall_fields=tuple(getattr(self.algorithm, "wall_fields", ())))
        # circuit executions, shots and the QPU estimate of circuit heads (quantum.csv; none without one)
        self.quantum = QuantumLedger(cfg, out, resume=meta.get("quantum"))
        # the learners' losses, entropy, KL and explained variance per update (train.csv; none without them)
        self.train = TrainLog(out, resume=meta.get("train", {}) if resume else None, wall_offset=meta.get("wall_s", 0.0),
                              services=several)
        if self.tracker is not None and resume is not None:  # the files are cut back to the checkpoint now
            self.tracker.continue_from()
        self.env_steps = int(meta.get("env_steps", 0))
        self.episodes = int(meta.get("episodes", 0))
        self.faults: list[dict[str, Any]] = list(meta.get("faults", []))
        self.resumes: list[dict[str, Any]] = list(meta.get("resumes", []))
        self._wall0 = time.perf_counter() - float(meta.get("wall_s", 0.0))
        self._last_ckpt_updates = int(meta.get("updates", 0))
        self.resume = resume
        if resume is not None:
            self._restore(resume)
        self.stopped = False  # run.stop_after_updates was reached
        self.evals = EvalWriter(out / EVAL_FILE if out else None)
        every = cfg.run.eval_every
        self._next_eval = (self.env_steps // every + 1) * every if every else None
        self._progress = (RunProgress(cfg, self.env_steps, self.episodes, mininterval=1.0)
                          if cfg.run.progress else None)
        self.finished = False  # finish() wrote the summary (an interrupt handler must not write it again)

    def _restore(self, resume: ResumePoint) -> None:
        meta = resume.meta
        if resume.snapshot is not None:  # the very objects of the run (exact): algorithm, service, RNGs
            snap = resume.snapshot
            self.algorithm = snap["algorithm"]
            self.service = snap["service"]
            self.server.serve(self.service)
            _set_global_rngs(snap["rngs"])
        else:
            self.service.load_state_dict(service_arrays(resume.arrays))
        self.server.load_state(meta["server_state"])
        self.resumes.append({"from": resume.path.name, "updates": meta["updates"], "env_steps": self.env_steps,
                             "exact": resume.snapshot is not None})

    # -- called by backends ---------------------------------------------------------------
    def record_work(self, worker: str, work: Work, t: float) -> None:
        """Count env steps and write one metrics row per finished episode."""
        self.env_steps += work.env_steps
        if work.resources:
            self.quantum.add(worker, work.resources)
        for ep in work.episodes:
            self.episodes += 1
            base = {"t": t, "worker": worker, "env_steps": self.env_steps, "episode": self.episodes}
            if self.returns is not None:  # before the row is made: ``return`` becomes the report team's
                self.returns.write(base, ep)
            row = dict(base, **ep)
            self.algorithm.annotate(row, self.ledger)
            self.metrics.write(row)
            self.quantum.row(base)
        if self.tracker is not None:
            self.tracker.service(self.service.updates(), self.service.summary, self.env_steps)
        if self._progress is not None:
            self._progress.advance(work.env_steps, work.episodes, self.server.version)
        tapped(work.env_steps, len(work.episodes))
        if self._next_eval is not None and self.env_steps >= self._next_eval:
            self.evaluate(t)

    def record_train(self, worker: str, updates: list, version: int, staleness: Optional[int], t: float,
                     service: Optional[str] = None) -> None:
        """One train.csv row per update the server just took in (its diagnostics), at the run's env steps
        (``service``: which of several services took it in)."""
        self.train.write(t, worker, self.env_steps, version, staleness, updates, service)

    def evaluate(self, t: float) -> None:
        """``run.eval_episodes`` greedy episodes of the server's current policy -> one eval.csv row."""
        every = self.cfg.run.eval_every
        index = self.env_steps // every
        self._next_eval = (index + 1) * every
        if self._progress is not None:
            self._progress.bar.clear()
        returns = self.algorithm.evaluate_returns(self.cfg.run.eval_episodes, derive(self.cfg.run.seed, "eval", index))
        row = eval_row(t, self.env_steps, self.service.updates(), returns)
        self.evals.write(row)
        if self._progress is not None:
            self._progress.eval_return = row["eval_return"]

    def deliver(self, msg, t: float):
        """Hand a message to the server; its answers."""
        return self.server.receive(msg, t)

    def after_delivery(self, t: float) -> None:
        """After a message, for a backend without safe points: checkpoint when enough updates have been
        applied; stop at run.stop_after_updates."""
        if self.checkpoint_due():
            self.checkpoint(t)
        stop = self.cfg.run.stop_after_updates
        if stop is not None and self.service.updates() >= stop:
            self.stopped = True

    def safe_point(self, t: float, capture: Optional[Callable[[], dict[str, Any]]] = None) -> bool:
        """Between a snapshotting backend's events, where its state is whole (``capture`` returns it):
        checkpoint if due; True if the run must stop here (run.stop_after_updates reached)."""
        stop = self.cfg.run.stop_after_updates
        if stop is not None and self.service.updates() >= stop and not self.done():
            self.stopped = True
            self.checkpoint(t, capture)
            return True
        if self.checkpoint_due():
            self.checkpoint(t, capture)
        return False

    def checkpoint_due(self, updates: Optional[int] = None) -> bool:
        """run.checkpoint_every updates have been applied since the last checkpoint. ``updates``: the
        server's count where a learner keeps it outside the service (the seed-batched learner)."""
        every = self.cfg.run.checkpoint_every
        done = self.service.updates() if updates is None else updates
        return bool(every and self.out and done - self._last_ckpt_updates >= every)

    def progress(self) -> float:
        """Fraction of the budget used: the larger of the env-step and episode fractions."""
        run = self.cfg.run
        parts = [0.0]
        if run.total_env_steps:
            parts.append(self.env_steps / run.total_env_steps)
        if run.total_episodes:
            parts.append(self.episodes / run.total_episodes)
        return min(1.0, max(parts))

    def done(self) -> bool:
        run = self.cfg.run
        return self.stopped or ((run.total_env_steps is not None and self.env_steps >= run.total_env_steps)
                or (run.total_episodes is not None and self.episodes >= run.total_episodes))

    def record_fault(self, kind: str, worker: str, detail: str, t: float) -> None:
        """A fault in the summary (in full) and on the console as it happens (one line)."""
        self.faults.append({"kind": kind, "worker": worker, "detail": detail, "t": t})
        if self._progress is not None:
            self._progress.bar.clear()
        print(f"marlq: {kind} {worker}: {one_line(detail)}", file=sys.stderr, flush=True)

    # -- persistence --------------------------------------------------------------------------
    def _warn_no_snapshot(self, exc: Exception) -> None:
        """Say once per run that its checkpoints hold no sim snapshot, so a resume is not exact."""
        if not getattr(self, "_warned_no_snapshot", False):
            self._warned_no_snapshot = True
            print(f"marl-q: checkpoints of this run hold no sim snapshot: its state cannot be saved whole ({exc}); "
                  "a resume continues from the server's state with fresh workers (not byte-identical)", file=sys.stderr)

    def checkpoint(self, t: float, capture: Optional[Callable[[], dict[str, Any]]] = None,
                   kind: str = SIM_SNAPSHOT) -> Optional[Path]:
        """Write the server's full state (and ``capture()``, the backend's whole state, as the sim
        snapshot) atomically; then, once the new checkpoint reads back whole, prune all but the last
        run.keep_checkpoints. ``kind``: what the snapshot is a state of, if not the sim backend's (the
        seed-batched runner's), in the header as ``snapshot.kind``, so a resume finds its runner."""
        if not self.out:
            return None
        updates = self.service.updates()
        folder = self.out / "checkpoints"
        path = folder / f"ckpt_{updates}.npz"
        snapshot_meta = None
        if capture is not None:
            state = capture()
            state["algorithm"], state["service"], state["rngs"] = self.algorithm, self.service, _global_rngs()
            snap_path = folder / f"ckpt_{updates}.sim.pkl"
            try:
                snapshot_meta = {"file": snap_path.name, "sha256": save_snapshot(snap_path, state),
                                 **({} if kind == SIM_SNAPSHOT else {"kind": kind})}
            except SnapshotUnavailable as exc:
                self._warn_no_snapshot(exc)
        try:
            arrays = {f"{SERVICE_PREFIX}{k}": v for k, v in self.service.state_dict().items()}
            meta = {"format": CHECKPOINT_FORMAT, "updates": updates, "server_version": self.server.version,
                    "env_steps": self.env_steps, "episodes": self.episodes, "t": t,
                    "wall_s": time.perf_counter() - self._wall0,
                    "algorithm": self.cfg.algorithm.name, "backend": self.cfg.backend.name,
                    "ledger": self.ledger.totals(), "ledger_state": self.ledger.state(),
                    "metrics_position": list(self.metrics.position()), "server_state": self.server.state(),
                    **({"quantum": self.quantum.state()} if self.quantum.active() else {}),
                    "train": self.train.state(),
                    **({"returns": self.returns.state()} if self.returns is not None else {}),
                    "faults": self.faults, "resumes": self.resumes, "snapshot": snapshot_meta}
            save_checkpoint(path, arrays, meta)
        except RunWriteError:  # (a CSV flush or the archive) a snapshot without its checkpoint is of no use
            if snapshot_meta is not None:
                (folder / snapshot_meta["file"]).unlink(missing_ok=True)
            raise
        self._last_ckpt_updates = updates
        try:
            load_checkpoint(path)  # verify before pruning: the previous good checkpoints stay otherwise
        except CheckpointError as exc:
            print(f"marlq: the checkpoint just written does not read back ({exc}); older ones are kept",
                  file=sys.stderr)
            return path
        for stale in checkpoints(self.out)[:-max(1, self.cfg.run.keep_checkpoints)]:
            if stale == path:
                continue
            stale.unlink()
            stale.with_name(stale.name.replace(".npz", ".sim.pkl")).unlink(missing_ok=True)
        return path

    def finish(self, clock_s: float, virtual: bool, status: str = "completed",
               checkpoint: bool = True) -> dict[str, Any]:
        """Flush files, write the final checkpoint (unless the backend just wrote it) and summary.json;
        return the summary."""
        if status == "completed" and self.stopped:
            status = "stopped"  # run.stop_after_updates: continue it with `marlq resume`
        if self._progress is not None:
            self._progress.close()
        self.metrics.flush()
        self.ledger.flush()
        self.quantum.flush()
        self.train.flush()
        if self.returns is not None:
            self.returns.flush()
        summary: dict[str, Any] = {
            "status": status,
            "algorithm": self.cfg.algorithm.name,
            "scenario": self.cfg.scenario.name,
            "backend": self.cfg.backend.name,
            "workers": self.cfg.backend.workers,
            "seed": self.cfg.run.seed,
            "env_steps": self.env_steps,
            "episodes": self.episodes,
            "wall_s": round(time.perf_counter() - self._wall0, 3),
            **sweep_jobs(),
            "virtual_s": clock_s if virtual else None,
            **self.ledger.totals(),
            **self.server.summary(),
            "staleness_hist": staleness_hist(self.server.staleness_counts),
            "faults": self.faults,
            "resumes": self.resumes,
        }
        summary.update(self.service.summary())
        summary.update(self.algorithm.summarize(self.metrics.rows))
        if self.returns is not None:  # several teams: which team return is, and each team's final return
            summary.update(self.returns.summary(self.cfg.run.solve_window))
        summary.update(self.quantum.summary(self.env_steps))
        if self.out:
            if checkpoint:
                self.checkpoint(clock_s)
            self.metrics.close()
            self.ledger.close()
            self.quantum.close()
            self.train.close()
            if self.returns is not None:
                self.returns.close()
            self.close_tracker()
            write_json_atomic(self.out / "summary.json", summary)
            if self.cfg.run.compress_logs and status == "completed":
                archive_run_files(self.out)  # (a resume with a larger budget decompresses them first)
        self.finished = True
        return summary

    def abandon(self) -> None:
        """A run file could not be written: close what is open without writing more (each close may
        fail the same way; the last good checkpoint is what a resume starts from)."""
        if self._progress is not None:
            self._progress.close()
            self._progress = None
        # metrics.csv is a rundir.MetricsWriter; the others are rundir.FileLog objects around theirs
        for run_file in (self.metrics, self.ledger, self.quantum, self.train, self.returns):
            if run_file is not None:
                run_file.abandon()
        self.close_tracker()
        self.out = None  # nothing more is written for this run

    def close_tracker(self) -> None:
        """Write what the tracker holds and detach it (rows written after this are not logged)."""
        if self.tracker is not None:
            set_tap(self.out, None)
            self.tracker, tracker = None, self.tracker
            try:
                tracker.close()
            except Exception as exc:  # the TensorBoard files are a view of the run files: never fail the run
                print(f"marlq: the TensorBoard files could not be closed ({one_line(str(exc))})", file=sys.stderr)

    def retire(self) -> Optional[Path]:
        """Another Runtime (Ray's server actor's) owns the run directory from here on: close this one's
        files and bar, and leave it nothing to write (an interrupt handler calling its finish must not
        overwrite the other's summary). Returns the run directory."""
        out = self.out
        self.ledger.close()
        self.metrics.close()
        if self.returns is not None:
            self.returns.close()
        if self._progress is not None:
            self._progress.close()
            self._progress = None
        self.out = None
        return out


def sweep_jobs() -> dict[str, int]:
    """``{"sweep_jobs": N}`` for a run that ``marlq sweep`` started while running up to N at once (its
    ``MARLQ_SWEEP_JOBS``): its wall time was measured beside the others'; ``{}`` for a run started alone."""
    import os

    value = os.environ.get("MARLQ_SWEEP_JOBS", "")
    return {"sweep_jobs": int(value)} if value.isdigit() and int(value) > 0 else {}


def one_line(detail: str) -> str:
    """A fault's detail for the console: a traceback shortened to its first and last lines."""
    lines = [ln.strip() for ln in str(detail).splitlines() if ln.strip()]
    if len(lines) <= 1:
        return lines[0] if lines else ""
    return f"{lines[0]} ... {lines[-1]}"


def _global_rngs() -> dict[str, Any]:
    """The process-wide generators a worker might draw from (torch, NumPy's legacy global, random)."""
    import random

    import numpy as np
    import torch

    return {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "random": random.getstate()}


def _set_global_rngs(state: dict[str, Any]) -> None:
    import random

    import numpy as np
    import torch

    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    random.setstate(state["random"])
