"""Summaries of per-episode metrics shared by episodic algorithms, and train.csv: the learners'
diagnostics, one row per update."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import numpy as np
from marl_q.rundir import FileLog


def episode_summary(rows: list[dict[str, Any]], solve_return: Optional[float], window: int = 100) -> dict[str, Any]:
    """final_return (mean of the last `window` episodes), best windowed mean, and steps_to_solve
    (global env steps when the `window`-episode training mean first reached `solve_return`)."""
    returns = np.array([float(r["return"]) for r in rows if "return" in r])
    out: dict[str, Any] = {"final_return": float(returns[-window:].mean()) if len(returns) else None,
                           "steps_to_solve": None, "time_to_solve": None, "best_mean_return": None}
    if len(returns) >= window:
        csum = np.concatenate([[0.0], np.cumsum(returns)])
        means = (csum[window:] - csum[:-window]) / window  # means[j] = mean of episodes j .. j+window-1
        out["best_mean_return"] = float(means.max())
        if solve_return is not None:
            hit = np.flatnonzero(means >= solve_return)
            if len(hit):
                row = rows_with_return(rows)[hit[0] + window - 1]
                out["steps_to_solve"] = int(row["env_steps"])
                out["time_to_solve"] = float(row["t"])  # virtual seconds in sim, wall seconds otherwise
    return out


def rows_with_return(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in rows if "return" in r]


# ----------------------------------------------------------------------------- train.csv
TRAIN_FILE = "train.csv"
# per update, as CleanRL logs them (TensorBoard: losses/<name>); agents.losses computes them
DIAGNOSTICS = ("policy_loss", "value_loss", "entropy", "approx_kl", "clipfrac", "explained_variance")
TRAIN_BASE = ["t", "worker", "env_steps", "update"]  # update: the row's number, 1, 2, ... over the run
TRAIN_FIELDS = ["version", "staleness", *DIAGNOSTICS]


class TrainLog(FileLog):
    """train.csv: one row per update the server takes in with its diagnostics (a worker's pushed update,
    or one the server's own learner ran), written by ``marl_q.rundir.MetricsWriter`` (wall clock in
    train_wall.csv). The file is made at the first row, so a run without diagnostics has none."""

    def __init__(self, out: Optional[Path], resume: Optional[dict[str, Any]] = None, wall_offset: float = 0.0,
                 services: bool = False) -> None:
        """``resume``: a checkpoint's ``state()`` (``{}`` for a checkpoint written before train.csv):
        the file is cut back to its position, or removed if the checkpoint had no row yet. ``services``:
        the server has several services (one learner per team); each row names its own in a last column,
        ``service`` (its ``version`` is that service's)."""
        from marl_q.rundir import LazyMetricsFile

        state = resume or {}
        self.out = out
        self.services = services
        self.updates = int(state.get("updates", 0))
        position = state.get("position")
        self.file = (LazyMetricsFile(Path(out) / TRAIN_FILE, TRAIN_FIELDS + ["service"] * services, position, base=TRAIN_BASE,
                                     wall_offset=wall_offset) if out is not None else None)
        if out is not None and resume is not None and position is None:
            for name in (TRAIN_FILE, "train_wall.csv"):  # rows written after the checkpoint only
                (Path(out) / name).unlink(missing_ok=True)

    @property
    def writer(self) -> Any:
        """The open MetricsWriter, or None before the first row."""
        return self.file.writer if self.file is not None else None

    def write(self, t: float, worker: str, env_steps: int, version: int, staleness: Optional[int],
              updates: list[dict[str, Any]], service: Optional[str] = None) -> None:
        """One row per diagnostics dict in ``updates`` (keys of DIAGNOSTICS; others are ignored);
        ``service``: the service that took them in (a run with several)."""
        if self.file is None:
            return
        for diag in updates:
            if not isinstance(diag, dict):
                continue
            self.updates += 1
            row = {k: diag.get(k) for k in DIAGNOSTICS}
            row.update(t=t, worker=worker, env_steps=env_steps, update=self.updates, version=version,
                       staleness=staleness)
            if self.services:
                row["service"] = service
            self.file.write(row)

    def write_lines(self, text: str, perf_times: list[float]) -> None:
        """Rows given as CSV text, numbered from ``updates + 1`` on, one per line, after the file's first row
        made it (``MetricsWriter.write_lines``, each row's ``time.perf_counter()`` for the sidecar): the
        seed-batched learner's rows, a block at a time."""
        n = len(perf_times)
        self.writer.write_lines(text, list(range(self.updates + 1, self.updates + 1 + n)), perf_times)
        self.updates += n

    def state(self) -> dict[str, Any]:
        """What a checkpoint keeps to continue train.csv on resume (rows so far, byte positions)."""
        return {"updates": self.updates, "position": self.file.position() if self.file is not None else None}
