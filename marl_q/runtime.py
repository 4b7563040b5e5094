"""One run: the algorithm, its service on the server, the ledger, metrics, checkpoints and summary.

Backends (marl_q/backends/) own the workers and the clock; they report each finished Worker.step()
here and route every message through `server.receive`.
"""
from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any, Optional

from marl_q.config import ExperimentConfig
from marl_q.ledger import Ledger
from marl_q.protocol import Work
from marl_q.registry import ALGORITHMS
from marl_q.rundir import MetricsWriter, save_checkpoint, write_json_atomic
from marl_q.server import Server

KEEP_CHECKPOINTS = 2


class Runtime:
    """Everything of a run that is not a worker and not the clock."""

    def __init__(self, cfg: ExperimentConfig, out: Optional[Path]) -> None:
        self.cfg = cfg
        self.out = out
        self.algorithm = ALGORITHMS.get(cfg.algorithm.name).obj(cfg)
        self.worker_names = [f"w{i}" for i in range(cfg.backend.workers)]
        self.ledger = Ledger(out / "comm.csv" if out else None)
        self.service = self.algorithm.make_service()
        self.server = Server(self.service, self.worker_names, cfg.server, self.ledger, seed=cfg.run.seed)
        self.server.progress = self.progress
        self.metrics = MetricsWriter(out / "metrics.csv" if out else None, self.algorithm.metric_fields)
        self.env_steps = 0
        self.episodes = 0
        self.faults: list[dict[str, Any]] = []
        self._wall0 = time.perf_counter()
        self._last_ckpt_updates = 0
        self._progress = _Progress(cfg) if cfg.run.progress else None

    # -- called by backends ---------------------------------------------------------------
    def record_work(self, worker: str, work: Work, t: float) -> None:
        """Count env steps and write one metrics row per finished episode."""
        self.env_steps += work.env_steps
        for ep in work.episodes:
            self.episodes += 1
            row = {"t": t, "worker": worker, "env_steps": self.env_steps, "episode": self.episodes}
            row.update(ep)
            self.algorithm.annotate(row, self.ledger)
            self.metrics.write(row)
        if self._progress is not None:
            self._progress.update(self, work)

    def deliver(self, msg, t: float):
        """Hand a message to the server; checkpoint when enough updates have been applied."""
        replies = self.server.receive(msg, t)
        every = self.cfg.run.checkpoint_every
        if every and self.out and self.service.updates() - self._last_ckpt_updates >= every:
            self.checkpoint(t)
        return replies

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
        return ((run.total_env_steps is not None and self.env_steps >= run.total_env_steps)
                or (run.total_episodes is not None and self.episodes >= run.total_episodes))

    def record_fault(self, kind: str, worker: str, detail: str, t: float) -> None:
        self.faults.append({"kind": kind, "worker": worker, "detail": detail, "t": t})
        print(f"marlq: {kind} {worker}: {detail}", file=sys.stderr)

    # -- persistence --------------------------------------------------------------------------
    def checkpoint(self, t: float) -> Optional[Path]:
        if not self.out:
            return None
        updates = self.service.updates()
        arrays = {f"service.{k}": v for k, v in self.service.state_dict().items()}
        meta = {"updates": updates, "server_version": self.server.version, "env_steps": self.env_steps,
                "episodes": self.episodes, "t": t, "algorithm": self.cfg.algorithm.name,
                "ledger": self.ledger.totals()}
        path = self.out / "checkpoints" / f"ckpt_{updates}.npz"
        save_checkpoint(path, arrays, meta)
        self._last_ckpt_updates = updates
        old = sorted(path.parent.glob("ckpt_*.npz"), key=lambda p: int(p.stem.split("_")[1]))
        for stale in old[:-KEEP_CHECKPOINTS]:
            stale.unlink()
        return path

    def finish(self, clock_s: float, virtual: bool, status: str = "completed") -> dict[str, Any]:
        """Flush files, write the final checkpoint and summary.json; return the summary."""
        if self._progress is not None:
            self._progress.close()
        self.metrics.flush()
        self.ledger.flush()
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
            "virtual_s": clock_s if virtual else None,
            **self.ledger.totals(),
            **self.server.summary(),
            "staleness_hist": {str(k): v for k, v in sorted(self.server.staleness_counts.items())},
            "faults": self.faults,
        }
        summary.update(self.service.summary())
        summary.update(self.algorithm.summarize(self.metrics.rows))
        if self.out:
            self.checkpoint(clock_s)
            self.metrics.close()
            self.ledger.close()
            write_json_atomic(self.out / "summary.json", summary)
        return summary


class _Progress:
    """A tqdm bar over the run's budget (env steps, else episodes) with rate, ETA and recent return."""

    def __init__(self, cfg: ExperimentConfig) -> None:
        from tqdm import tqdm

        self.by_steps = cfg.run.total_env_steps is not None
        total = cfg.run.total_env_steps if self.by_steps else cfg.run.total_episodes
        unit = "step" if self.by_steps else "ep"
        self.bar = tqdm(total=total, unit=unit, unit_scale=True, dynamic_ncols=True, mininterval=1.0,
                        desc=f"{cfg.algorithm.name}/{cfg.scenario.name}", file=sys.stderr)
        self._recent: list[float] = []
        self._next_postfix = 0.0

    def update(self, rt: Runtime, work: Work) -> None:
        self.bar.update(work.env_steps if self.by_steps else len(work.episodes))
        for ep in work.episodes:
            if "return" in ep:
                self._recent.append(float(ep["return"]))
        now = time.perf_counter()
        if now >= self._next_postfix:  # the recent mean return and server version, once a second
            self._next_postfix = now + 1.0
            self._recent = self._recent[-100:]
            ret = f"{sum(self._recent) / len(self._recent):.1f}" if self._recent else "-"
            self.bar.set_postfix(ret=ret, v=rt.server.version, refresh=False)

    def close(self) -> None:
        self.bar.close()
