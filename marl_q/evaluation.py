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
import sys
from pathlib import Path
from typing import Any, Optional

import numpy as np

EVAL_FILE = "eval.csv"
FIELDS = ("t", "env_steps", "updates", "episodes", "eval_return", "eval_std", "eval_min", "eval_max")


class EvalProgress:
    """A tqdm bar over evaluation episodes (nothing when disabled)."""

    def __init__(self, total: int, enabled: bool, desc: str = "eval") -> None:
        self.bar = None
        if enabled and total > 0:
            from marl_q.progress import progress_bar

            self.bar = progress_bar(total=total, unit="ep", desc=desc, file=sys.stderr, dynamic_ncols=True, leave=False,
                            mininterval=0.5)

    def update(self, n: int = 1) -> None:
        if self.bar is not None:
            self.bar.update(n)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()

    def __enter__(self) -> "EvalProgress":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def eval_progress(total: int, enabled: bool, desc: str = "eval") -> EvalProgress:
    return EvalProgress(total, enabled, desc)


def eval_row(t: float, env_steps: int, updates: int, returns: list[float]) -> dict[str, Any]:
    r = np.asarray(returns, dtype=np.float64)
    return {"t": t, "env_steps": env_steps, "updates": updates, "episodes": len(r),
            "eval_return": float(r.mean()), "eval_std": float(r.std(ddof=1)) if len(r) > 1 else 0.0,
            "eval_min": float(r.min()), "eval_max": float(r.max())}


class EvalWriter:
    """Appends rows to RUN/eval.csv (header once)."""

    def __init__(self, path: Optional[Path]) -> None:
        self.path = path
        self.rows: list[dict[str, Any]] = []

    def write(self, row: dict[str, Any]) -> None:
        self.rows.append(row)
        if self.path is None:
            return
        new = not self.path.exists()
        try:
            with self.path.open("a", newline="") as f:
                w = csv.DictWriter(f, fieldnames=FIELDS)
                if new:
                    w.writeheader()
                w.writerow({k: repr(v) if isinstance(v, float) else v for k, v in row.items()})
        except OSError as exc:  # no space, directory gone: the run ends naming the file
            from marl_q.errors import RunWriteError

            raise RunWriteError(self.path, exc) from None
        from marl_q.rundir import tap_rows

        tap_rows(self.path, [[row.get(k, "") for k in FIELDS]])


def cut_eval_csv(path: Path, env_steps: int) -> None:
    """Keep the rows at or before ``env_steps`` (a resume from a checkpoint taken there)."""
    if not path.is_file():
        return
    with path.open(newline="") as f:
        rows = [r for r in csv.DictReader(f) if int(r["env_steps"]) <= env_steps]
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=FIELDS)
        w.writeheader()
        w.writerows(rows)


def read_eval_csv(path: Path) -> list[dict[str, float]]:
    if not path.is_file():
        return []
    with path.open(newline="") as f:
        return [{k: float(v) for k, v in r.items()} for r in csv.DictReader(f)]
