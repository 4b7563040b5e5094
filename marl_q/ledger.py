"""The ledger: one row per message into or out of the server, accepted or not, streamed to comm.csv."""
from __future__ import annotations

import csv
import time
from pathlib import Path
from typing import IO, Optional

from marl_q.messages import SERVER, Message

COLUMNS = ["id", "t", "src", "dst", "kind", "seq", "bytes", "base_version", "server_version",
           "staleness", "accepted", "reason"]


class Ledger:
    """Counts and records traffic. Rows are buffered and flushed, so memory stays flat on long runs."""

    def __init__(self, path: Optional[Path] = None, flush_every: int = 4096,
                 resume: Optional[dict] = None) -> None:
        """Rows go to ``path`` (comm.csv); the wall clock of each row goes to a sidecar
        ``comm_wall.csv``, kept apart so that comm.csv of a sim run is byte-identical across runs.

        ``resume`` is a checkpoint's ``state()``: both files are cut back to its position and the
        counters continue from its totals."""
        self._file: Optional[IO[str]] = None
        self._wall_file: Optional[IO[str]] = None
        self._writer = self._wall_writer = None
        self._t0 = time.perf_counter() - (resume or {}).get("wall_s", 0.0)
        self._rows: list[tuple] = []
        self._walls: list[tuple] = []
        self.flush_every = flush_every
        self.count = 0
        self.bytes_up = 0
        self.bytes_down = 0
        self.rejected = 0
        self.dropped_stale = 0
        self.by_kind: dict[str, list[int]] = {}  # kind -> [messages, bytes]
        self.faults: dict[str, int] = {}  # injected fault -> count (rows of kind "fault:<name>")
        if resume is not None:
            self._load_state(resume)
        if path is not None:
            wall_path = Path(path).with_name("comm_wall.csv")
            if resume is None:
                self._file = open(path, "w", newline="")
                self._wall_file = open(wall_path, "w", newline="")
            else:
                from marl_q.rundir import reopen_at

                self._file = reopen_at(path, resume["position"][0])
                self._wall_file = reopen_at(wall_path, resume["position"][1])
            self._writer = csv.writer(self._file)
            self._wall_writer = csv.writer(self._wall_file)
            if resume is None:
                self._writer.writerow(COLUMNS)
                self._wall_writer.writerow(["id", "wall_s"])

    def state(self) -> dict:
        """Counters and file positions (after a flush), JSON-able, for a checkpoint."""
        self.flush()
        position = (self._file.tell(), self._wall_file.tell()) if self._file is not None else (0, 0)
        return {"count": self.count, "bytes_up": self.bytes_up, "bytes_down": self.bytes_down,
                "rejected": self.rejected, "dropped_stale": self.dropped_stale,
                "by_kind": {k: list(v) for k, v in self.by_kind.items()}, "faults": dict(self.faults),
                "position": list(position), "wall_s": time.perf_counter() - self._t0}

    def _load_state(self, state: dict) -> None:
        for key in ("count", "bytes_up", "bytes_down", "rejected", "dropped_stale"):
            setattr(self, key, int(state[key]))
        self.by_kind = {k: [int(a), int(b)] for k, (a, b) in state["by_kind"].items()}
        self.faults = {k: int(v) for k, v in state["faults"].items()}

    def record(self, msg: Message, t: float, server_version: int, staleness: Optional[int] = None,
               accepted: bool = True, reason: str = "", stale_drop: bool = False) -> None:
        nbytes = msg.nbytes
        if msg.dst == SERVER:
            self.bytes_up += nbytes
        else:
            self.bytes_down += nbytes
        if not accepted:
            self.rejected += not stale_drop
            self.dropped_stale += stale_drop
        tally = self.by_kind.setdefault(msg.kind, [0, 0])
        tally[0] += 1
        tally[1] += nbytes
        self._rows.append((self.count, f"{t:.6f}", msg.src, msg.dst, msg.kind, msg.seq, nbytes,
                           msg.base_version, server_version, "" if staleness is None else staleness,
                           int(accepted), reason))
        self._walls.append((self.count, f"{time.perf_counter() - self._t0:.6f}"))
        self.count += 1
        if len(self._rows) >= self.flush_every:
            self.flush()

    def record_fault(self, fault: str, t: float, src: str, dst: str, seq: int = 0, nbytes: int = 0,
                     detail: str = "") -> None:
        """An injected fault, as a row of kind ``fault:<name>``; not counted as traffic."""
        self.faults[fault] = self.faults.get(fault, 0) + 1
        self._rows.append((self.count, f"{t:.6f}", src, dst, f"fault:{fault}", seq, nbytes, "", "", "", 0, detail))
        self._walls.append((self.count, f"{time.perf_counter() - self._t0:.6f}"))
        self.count += 1
        if len(self._rows) >= self.flush_every:
            self.flush()

    def flush(self) -> None:
        if self._writer is not None and self._rows:
            self._writer.writerows(self._rows)
            self._wall_writer.writerows(self._walls)
            self._file.flush()
        self._rows.clear()
        self._walls.clear()

    def close(self) -> None:
        self.flush()
        if self._file is not None:
            self._file.close()
            self._wall_file.close()
            self._file = self._wall_file = None

    def totals(self) -> dict[str, int]:
        return {"messages": self.count - sum(self.faults.values()), "bytes_up": self.bytes_up,
                "bytes_down": self.bytes_down, "rejected": self.rejected, "dropped_stale": self.dropped_stale,
                "faults_injected": dict(self.faults)}
