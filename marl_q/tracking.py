"""TensorBoard (``run.tensorboard: true`` or ``--tensorboard``): every row a run writes, as scalars.

The tracker sees each CSV row after it is written to its run file (``marl_q.rundir.tap_rows``, called by
``write_row_pair`` and the eval writer), so a run file added later is logged without more code. It only
reads what was written: the CSV files of a sim run are the same bytes with or without it.

What is logged, against env steps (TensorBoard's step):

- every numeric column of every row, as ``<file>/<column>`` (``metrics/return``, ``eval/eval_return``,
  ``quantum/<counter>`` ...), at the row's ``env_steps``; a row without that column is placed at the env
  steps the run had reached at its time ``t`` (read from metrics.csv's rows), and held until they are
  known. The coordinates of a row (``t``, ``env_steps``, ``episode``, ``id``, ``seq``) are not logged.
- comm.csv, one row per message, as running totals per step: ``comm/messages_up``, ``messages_down``,
  ``bytes_up``, ``bytes_down``, ``rejected``, ``dropped_stale``, ``server_version`` and the mean
  ``staleness`` of the pushes accepted since the previous step.
- train.csv, one row per update, under CleanRL's tags: ``losses/policy_loss``, ``losses/value_loss``,
  ``losses/entropy``, ``losses/approx_kl``, ``losses/clipfrac``, ``losses/explained_variance`` (its other
  columns only say which update a row is).
- the numbers of the server's ``Service.summary()`` each time the server's updates change, as
  ``server/<key>`` (the losses and entropy of the last update where the service keeps them, e.g.
  ``server/last_critic_loss``, ``server/last_entropy`` for COMA, IAC and central-V).

Event files go into the run directory itself, so ``tensorboard --logdir SWEEP`` names each run by its
path under the sweep: ``algorithm.name=coma/seed0``.
"""
from __future__ import annotations

import bisect
import math
from pathlib import Path
from typing import Any, Optional, Sequence

from marl_q.errors import UserError, import_extra
from marl_q.metrics import DIAGNOSTICS

COORDINATES = {"t", "env_steps", "episode", "id", "seq", "worker"}  # where a row sits, not what it measures
# run files logged under another prefix, and only the columns named: train.csv's diagnostics as CleanRL's tags
RENAMED = {"train": ("losses", DIAGNOSTICS)}
INSTALL = "pip install 'marl-q[tensorboard]' (or pip install tensorboard)"


def require_tensorboard() -> Any:
    """torch's SummaryWriter; a UserError naming the extra when the tensorboard package is missing."""
    module = import_extra("torch.utils.tensorboard", f"run.tensorboard: the tensorboard package is not installed; {INSTALL}",
                          UserError)
    return module.SummaryWriter


def number(value: Any) -> Optional[float]:
    """A CSV cell as a finite float, else None (text, empty, NaN)."""
    if isinstance(value, bool):
        return float(value)
    try:
        x = float(value)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None


class TensorBoardTracker:
    """Scalars of one run directory into TensorBoard event files in that directory."""

    def __init__(self, run_dir: Path, purge_step: Optional[int] = None) -> None:
        """``purge_step``: on resume, the checkpoint's env steps plus one; TensorBoard hides what an earlier
        session logged at or after it (those rows were cut from the CSV files too)."""
        writer_class = require_tensorboard()
        self.run_dir = Path(run_dir)
        self.writer = writer_class(log_dir=str(self.run_dir), purge_step=purge_step, flush_secs=30)
        self._headers: dict[str, list[str]] = {}
        self._clock_t: list[float] = []  # t of metrics rows, in order
        self._clock_steps: list[int] = []  # their env_steps
        self._held: list[tuple[str, dict[str, Any]]] = []  # rows later than any metrics row seen yet
        self._counts: dict[str, int] = {}  # rows seen per file without t or env_steps: their step
        self._comm = CommTotals()
        self._updates: Optional[int] = None

    # -- rows of run files ------------------------------------------------------------------------
    def rows(self, path: Path, rows: Sequence[Sequence[Any]]) -> None:
        """Rows just appended to run file ``path`` (their values in the file's column order)."""
        header = self._header(Path(path))
        source = Path(path).stem
        records = [dict(zip(header, r)) for r in rows]
        for rec in records:
            steps, t = number(rec.get("env_steps")), number(rec.get("t"))
            if steps is not None and t is not None and "episode" in rec:  # an episode row: the run's clock
                self._clock_t.append(t)
                self._clock_steps.append(int(steps))
        held, self._held = self._held, []
        for source_, rec in held:  # rows waiting for the clock first: a file's rows keep their order
            self._place(source_, rec)
        for rec in records:
            self._place(source, rec)

    def continue_from(self) -> None:
        """On resume, once the run files are cut back to the checkpoint: the clock from metrics.csv and the
        running totals from comm.csv, as they stand (nothing is logged again)."""
        import csv

        for name in ("metrics.csv", "comm.csv"):
            path = self.run_dir / name
            if not path.is_file():
                continue
            with open(path, newline="") as fh:
                for rec in csv.DictReader(fh):
                    if name == "metrics.csv":
                        self._clock_t.append(float(rec["t"]))
                        self._clock_steps.append(int(rec["env_steps"]))
                    else:
                        t = number(rec.get("t"))
                        i = bisect.bisect_right(self._clock_t, t) if t is not None else 0
                        self._comm.add(rec, self._clock_steps[i - 1] if i else 0)

    def _header(self, path: Path) -> list[str]:
        key = str(path)
        if key not in self._headers:  # the file's first line; write_row_pair has flushed it
            import csv

            with open(path, newline="") as fh:
                self._headers[key] = next(csv.reader(fh), [])
        return self._headers[key]

    def _place(self, source: str, rec: dict[str, Any], final: bool = False) -> None:
        steps = number(rec.get("env_steps"))
        if steps is None:
            t = number(rec.get("t"))
            if t is None:
                steps = self._counts[source] = self._counts.get(source, 0) + 1
            elif self._clock_t and t <= self._clock_t[-1]:
                i = bisect.bisect_right(self._clock_t, t)
                steps = self._clock_steps[i - 1] if i else 0
            elif final:
                steps = self._clock_steps[-1] if self._clock_steps else 0
            else:
                self._held.append((source, rec))
                return
        step = int(steps)
        if source == "comm":
            for tag, value, at in self._comm.add(rec, step):
                self.writer.add_scalar(f"comm/{tag}", value, at)
            return
        prefix, only = RENAMED.get(source, (source, None))
        for column, value in rec.items():
            x = number(value) if column not in COORDINATES and (only is None or column in only) else None
            if x is not None:
                self.writer.add_scalar(f"{prefix}/{column}", x, step)

    # -- the server --------------------------------------------------------------------------------
    def service(self, updates: int, summary: Any, step: int) -> None:
        """The service's numbers after its updates changed (``summary`` is called only then)."""
        if updates == self._updates:
            return
        self._updates = updates
        for key, value in summary().items():
            x = number(value)
            if x is not None:
                self.writer.add_scalar(f"server/{key}", x, step)

    def close(self) -> None:
        held, self._held = self._held, []
        for source, rec in held:
            self._place(source, rec, final=True)
        for tag, value, at in self._comm.flush():
            self.writer.add_scalar(f"comm/{tag}", value, at)
        self.writer.close()


class CommTotals:
    """Running totals of comm.csv rows, given out once per step (when a row of a later step arrives)."""

    def __init__(self) -> None:
        self.step: Optional[int] = None
        self.totals = {"messages_up": 0, "messages_down": 0, "bytes_up": 0, "bytes_down": 0, "rejected": 0,
                       "dropped_stale": 0}
        self.server_version: Optional[float] = None
        self._staleness: list[float] = []

    def add(self, rec: dict[str, Any], step: int) -> list[tuple[str, float, int]]:
        """Count one row at ``step``; the totals of the previous step when this row starts a new one."""
        out = self.flush() if self.step is not None and step != self.step else []
        self.step = step
        if str(rec.get("kind", "")).startswith("fault:"):
            return out  # an injected fault, not traffic (as the ledger's totals)
        up = rec.get("dst") == "server"
        self.totals["messages_up" if up else "messages_down"] += 1
        self.totals["bytes_up" if up else "bytes_down"] += int(number(rec.get("bytes")) or 0)
        if number(rec.get("accepted")) == 0:
            stale = str(rec.get("reason", "")).startswith("stale:")
            self.totals["dropped_stale" if stale else "rejected"] += 1
        elif up and number(rec.get("staleness")) is not None:
            self._staleness.append(number(rec["staleness"]))
        version = number(rec.get("server_version"))
        if version is not None:
            self.server_version = version
        return out

    def flush(self) -> list[tuple[str, float, int]]:
        """(tag, value, step) of the totals at the current step."""
        if self.step is None:
            return []
        out = [(k, float(v)) for k, v in self.totals.items()]
        if self.server_version is not None:
            out.append(("server_version", self.server_version))
        if self._staleness:
            out.append(("staleness", sum(self._staleness) / len(self._staleness)))
            self._staleness = []
        return [(tag, value, self.step) for tag, value in out]
