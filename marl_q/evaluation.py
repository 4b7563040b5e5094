"""Evaluation during training (``run.eval_every``) and the progress of every evaluation.

Every ``run.eval_every`` env steps the runtime asks the algorithm for ``run.eval_episodes`` greedy
episodes of the server's current policy (``Algorithm.evaluate_returns(episodes, seed)``) and writes
one row to ``eval.csv``:

    t, env_steps, updates, episodes, eval_return, eval_std, eval_min, eval_max

``t`` is the backend's clock (virtual on sim), ``eval_return`` the mean episode return. The
episodes are played in separate environments seeded from the run seed and the evaluation's index
(``marl_q.seeding``), outside the workers and their generators, so evaluating does not change what
the run learns: a sim run's metrics.csv and comm.csv are the same with or without it. On resume the
rows after the checkpoint are cut, as metrics.csv's are.

``eval_progress(total, enabled, desc)`` is the bar every evaluation loop shows (episodes, rate and
ETA on stderr), the end-of-run ones included.
"""
from __future__ import annotations

import csv
from pathlib import Path
from typing import Any, Optional

import numpy as np

from marl_q.progress import Progress

EVAL_FILE = "eval.csv"
FIELDS = ("t", "env_steps", "updates", "episodes", "eval_return", "eval_std", "eval_min", "eval_max")


def eval_progress(total: int, enabled: bool, desc: str = "eval") -> Progress:
    """The bar over an evaluation's episodes (``marl_q.progress.Progress``; nothing when disabled)."""
    return Progress(total, "ep", desc, enabled=enabled, leave=False, mininterval=0.5)


EvalProgress = Progress  # what an evaluation loop is handed (agents/routing.py's type hints)


class EvalReturns(list):
    """An evaluation's returns carrying columns of their own for eval.csv, after FIELDS (a turn-based
    game's win, draw and loss rates against each opponent: agents/turn_based.py)."""

    def __init__(self, returns: list[float], columns: dict[str, Any]) -> None:
        super().__init__(returns)
        self.columns = dict(columns)


def eval_row(t: float, env_steps: int, updates: int, returns: list[float]) -> dict[str, Any]:
    r = np.asarray(returns, dtype=np.float64)
    return {"t": t, "env_steps": env_steps, "updates": updates, "episodes": len(r),
            "eval_return": float(r.mean()), "eval_std": float(r.std(ddof=1)) if len(r) > 1 else 0.0,
            "eval_min": float(r.min()), "eval_max": float(r.max()), **getattr(returns, "columns", {})}


class EvalWriter:
    """Appends rows to RUN/eval.csv (header once) through the run's CSV writer
    (``marl_q.rundir.MetricsWriter``, without a wall sidecar), opened for each row and closed after it:
    an evaluation is rare, and nothing stays open between them."""

    def __init__(self, path: Optional[Path]) -> None:
        self.path = path
        self.rows: list[dict[str, Any]] = []

    def write(self, row: dict[str, Any]) -> None:
        self.rows.append(row)
        if self.path is None:
            return
        from marl_q.rundir import MetricsWriter

        try:
            size = self.path.stat().st_size if self.path.exists() else 0  # a resumed run's, cut to its checkpoint
            writer = MetricsWriter(self.path, list(row), base=list(FIELDS), resume_at=(size,) if size else None,
                                   flush_every=1, sidecar=False)
        except OSError as exc:  # no space, directory gone: the run ends naming the file
            from marl_q.errors import RunWriteError

            raise RunWriteError(self.path, exc) from None
        try:
            writer.write(row)  # written and flushed here (a failure: RunWriteError naming the file)
        finally:
            writer.abandon()  # closes it; nothing is pending


def cut_eval_csv(path: Path, env_steps: int) -> None:
    """Keep the rows at or before ``env_steps`` (a resume from a checkpoint taken there): the file is cut
    at its first later row (rows are written in env_steps order), as the other run files are cut back to
    their checkpoint's byte position; nothing is written again."""
    if not path.is_file():
        return
    with path.open("rb") as f:
        data = f.read()
    offset, column = 0, None
    for line in data.splitlines(keepends=True):
        cells = next(csv.reader([line.decode()]), [])
        if column is None:
            if "env_steps" not in cells:
                break  # no header (rows appended to a file the run never wrote): nothing of it is kept
            column = cells.index("env_steps")
        elif cells and int(cells[column]) > env_steps:
            break
        offset += len(line)
    with path.open("r+b") as f:
        f.truncate(offset)


def read_eval_csv(path: Path) -> list[dict[str, float]]:
    if not path.is_file():
        return []
    with path.open(newline="") as f:
        return [{k: float(v) for k, v in r.items()} for r in csv.DictReader(f)]
