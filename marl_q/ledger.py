"""The run's ledgers: one row per message into or out of the server, accepted or not, streamed to
comm.csv (``Ledger``); the quantum resources the workers report, streamed to quantum.csv
(``QuantumLedger``, with the counting and QPU-time model of ``marl_q.quantum``)."""
from __future__ import annotations

import csv
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from marl_q.messages import HELLO, SERVER, SERVICE, Message
from marl_q.quantum import COLUMNS as QUANTUM_COLUMNS
from marl_q.quantum import KINDS, QUANTUM_FILE, ROLES, counter_columns, qpu_seconds
from marl_q.rundir import FileLog, open_run_text

COLUMNS = ["id", "t", "src", "dst", "kind", "seq", "bytes", "base_version", "server_version",
           "staleness", "accepted", "reason"]
SERVICE_COLUMN = "service"  # the last column of a run with several services (one learner per team)
FLUSH_S = 2.0  # rows wait at most this long (wall clock) for the file


class Ledger(FileLog):
    """Counts and records traffic. Rows are buffered and flushed, so memory stays flat on long runs."""

    def __init__(self, path: Optional[Path] = None, flush_every: int = 4096,
                 resume: Optional[dict] = None, services: bool = False) -> None:
        """Rows go to ``path`` (comm.csv) through the run's CSV writer (``marl_q.rundir.MetricsWriter``);
        the wall clock of each row goes to a sidecar ``comm_wall.csv``, kept apart so that comm.csv of a
        sim run is byte-identical across runs.

        ``resume`` is a checkpoint's ``state()``: both files are cut back to its position and the
        counters continue from its totals. ``services``: the run's server has several services (one learner
        per team), and each row names its service in a last column, ``service`` (empty for a fault, or a
        message that named none); a run with one service has no such column."""
        from marl_q.rundir import MetricsWriter

        self.services = services
        self.count = 0
        self.bytes_up = 0
        self.bytes_down = 0
        self.rejected = 0
        self.dropped_stale = 0
        self.by_kind: dict[str, list[int]] = {}  # kind -> [messages, bytes]
        self.faults: dict[str, int] = {}  # injected fault -> count (rows of kind "fault:<name>")
        if resume is not None:
            self._load_state(resume)
        self.file = MetricsWriter(path, COLUMNS + [SERVICE_COLUMN] * services, flush_every=flush_every, base=["id"], flush_s=FLUSH_S,
                                  resume_at=tuple(resume["position"]) if resume is not None and path is not None else None,
                                  wall_offset=(resume or {}).get("wall_s", 0.0))

    @property
    def flush_every(self) -> int:
        return self.file.flush_every

    def state(self) -> dict:
        """Counters and file positions (after a flush), JSON-able, for a checkpoint."""
        return {"count": self.count, "bytes_up": self.bytes_up, "bytes_down": self.bytes_down,
                "rejected": self.rejected, "dropped_stale": self.dropped_stale,
                "by_kind": {k: list(v) for k, v in self.by_kind.items()}, "faults": dict(self.faults),
                "position": list(self.file.position()), "wall_s": self.file.wall_s()}

    def _load_state(self, state: dict) -> None:
        for key in ("count", "bytes_up", "bytes_down", "rejected", "dropped_stale"):
            setattr(self, key, int(state[key]))
        self.by_kind = {k: [int(a), int(b)] for k, (a, b) in state["by_kind"].items()}
        self.faults = {k: int(v) for k, v in state["faults"].items()}

    def record(self, msg: Message, t: float, server_version: int, staleness: Optional[int] = None,
               accepted: bool = True, reason: str = "", stale_drop: bool = False) -> None:
        nbytes = msg.nbytes
        self.tally(msg.kind, 1, nbytes, msg.dst == SERVER)
        if not accepted:
            self.rejected += not stale_drop
            self.dropped_stale += stale_drop
        self._append((self.count, f"{t:.6f}", msg.src, msg.dst, msg.kind, msg.seq, nbytes,
                      msg.base_version, server_version, "" if staleness is None else staleness,
                      int(accepted), reason) + ((str(msg.info.get(SERVICE, "")),) if self.services else ()))

    def tally(self, kind: str, messages: int, nbytes: int, up: bool) -> None:
        """Count ``messages`` messages of ``kind`` of ``nbytes`` bytes each, to the server (``up``) or from
        it: what ``record`` counts of each (its row aside). The seed-batched learner writes its rows as
        text a block at a time (``write_lines``) and counts them here."""
        if up:
            self.bytes_up += nbytes * messages
        else:
            self.bytes_down += nbytes * messages
        tally = self.by_kind.setdefault(kind, [0, 0])
        tally[0] += messages
        tally[1] += nbytes * messages

    def write_lines(self, text: str, perf_times: list[float]) -> None:
        """Rows given as CSV text, ids from ``count`` on, one per line (``MetricsWriter.write_lines``, with
        each row's ``time.perf_counter()`` for the sidecar); the caller counts their traffic (``tally``)."""
        n = len(perf_times)
        self.file.write_lines(text, list(range(self.count, self.count + n)), perf_times)
        self.count += n

    def record_fault(self, fault: str, t: float, src: str, dst: str, seq: int = 0, nbytes: int = 0,
                     detail: str = "", service: str = "") -> None:
        """An injected fault, as a row of kind ``fault:<name>``; not counted as traffic. ``service``: the
        service of the message it befell (a run with several)."""
        self.faults[fault] = self.faults.get(fault, 0) + 1
        self._append((self.count, f"{t:.6f}", src, dst, f"fault:{fault}", seq, nbytes, "", "", "", 0, detail)
                     + ((service,) if self.services else ()))

    def record_message_fault(self, fault: str, t: float, msg: Message, detail: str = "") -> None:
        """A fault that befell message ``msg`` (lost, duplicated, not sent...): ``record_fault`` with its
        sender, addressee, seq, bytes and service."""
        self.record_fault(fault, t, msg.src, msg.dst, msg.seq, msg.nbytes, detail, str(msg.info.get(SERVICE, "")))

    def _append(self, row: tuple) -> None:
        """One row (and its wall clock in the sidecar); written every flush_every rows or FLUSH_S seconds."""
        self.file.write_values(row)
        self.count += 1

    @property
    def pending(self) -> list[tuple]:
        """The rows not written to comm.csv yet."""
        return self.file.pending

    def totals(self) -> dict[str, int]:
        return {"messages": self.count - sum(self.faults.values()), "bytes_up": self.bytes_up,
                "bytes_down": self.bytes_down, "rejected": self.rejected, "dropped_stale": self.dropped_stale,
                "faults_injected": dict(self.faults)}


# ----------------------------------------------------------------------------- reading it back
@dataclass
class LedgerAudit:
    """What comm.csv says about each worker's pushes (every message a worker sent the server but hello)."""

    # per worker: received (push rows), accepted, rejected, dropped_stale, duplicated (fault rows), and
    # sent (the sum over its lives of the highest seq that arrived: pushes sent, bar any lost at the end)
    workers: dict[str, dict[str, int]] = field(default_factory=dict)
    lives: dict[str, int] = field(default_factory=dict)  # hellos, not counting duplicated ones
    accepted_after_restart: dict[str, int] = field(default_factory=dict)
    distinct_accepted: int = 0  # distinct accepted (worker, incarnation, seq)
    repeated_keys: list[tuple[str, int, str]] = field(default_factory=list)  # accepted more than once: a bug
    refused_duplicates: int = 0  # rows the server refused as "duplicate: seq ... already seen"
    faults: dict[str, int] = field(default_factory=dict)  # fault:<name> rows
    # a run with several services (comm.csv's ``service`` column): each one's own audit, by name; the
    # counts above are theirs added up ({} for a run with one service)
    services: dict[str, "LedgerAudit"] = field(default_factory=dict)

    def worker(self, name: str) -> dict[str, int]:
        """One worker's counts; zeros for a worker the ledger never heard from."""
        return self.workers.get(name, _worker_row())


class LedgerAuditor:
    """Accounts for comm.csv rows one at a time (a live reader feeds rows as the file grows);
    ``audit()`` is what they say so far."""

    def __init__(self) -> None:
        self.result = LedgerAudit()
        self._accepted: set[tuple[str, int, str]] = set()
        self._top: dict[tuple[str, int], int] = {}  # (worker, life) -> highest seq seen
        # worker -> seq of the push it left with (fault:dropout): it rejoins numbering on from there
        self._left_at: dict[str, int] = {}
        self._services: dict[str, LedgerAuditor] = {}  # several services: each one's auditor

    def feed(self, r: dict[str, str]) -> None:
        """One comm.csv row, as csv.DictReader gives it. A row of a run with several services goes to that
        service's own auditor (its pushes are numbered on their own); a fault row, to every one."""
        service = r.get(SERVICE_COLUMN)
        if service is not None:
            if service:
                if service not in self._services:
                    self._services[service] = LedgerAuditor()
                self._services[service]._feed(r)
                if r["kind"].startswith("fault:"):  # counted once here (audit() takes faults from here)
                    name = r["kind"][len("fault:"):]
                    self.result.faults[name] = self.result.faults.get(name, 0) + 1
                return
            if r["kind"] == "fault:crash":  # every service's numbering of the worker's pushes starts again
                for auditor in self._services.values():
                    auditor._feed(r)
            elif not r["kind"].startswith("fault:") and r["dst"] == SERVER:  # it named no service of the server
                self.result.workers.setdefault(r["src"], _worker_row())["rejected"] += 1
                return
        self._feed(r)

    def _feed(self, r: dict[str, str]) -> None:
        audit = self.result
        kind, src = r["kind"], r["src"]
        if kind.startswith("fault:"):
            name = kind[len("fault:"):]
            audit.faults[name] = audit.faults.get(name, 0) + 1
            if name == "duplicate" and not r["reason"].startswith("hello"):
                audit.workers.setdefault(src, _worker_row())["duplicated"] += 1
            elif name == "dropout":
                self._left_at[src] = max(self._left_at.get(src, 0), int(r["seq"]))
            elif name == "crash":  # its successor numbers from 1
                self._left_at.pop(src, None)
            return
        if r["dst"] != SERVER:
            return
        if kind == HELLO:
            if r["accepted"] != "1":
                return  # a hello handed over twice: the server answered the first copy only
            audit.lives[src] = audit.lives.get(src, 0) + 1
            if src in self._left_at:  # a worker back from a drop-out: the push it left with was never sent
                self._top[(src, audit.lives[src])] = self._left_at.pop(src)
            audit.workers.setdefault(src, _worker_row())
            audit.accepted_after_restart.setdefault(src, 0)
            return
        row = audit.workers.setdefault(src, _worker_row())
        life = audit.lives.get(src, 0)
        row["received"] += 1
        seq, top = int(r["seq"]), self._top.get((src, life), 0)
        if seq > top:  # seq counts a life's pushes: its highest is what it sent
            row["sent"] += seq - top
            self._top[(src, life)] = seq
        if r["accepted"] == "1":
            row["accepted"] += 1
            key = (src, life, r["seq"])
            if key in self._accepted:
                audit.repeated_keys.append(key)
            self._accepted.add(key)
            audit.distinct_accepted = len(self._accepted)
            if life >= 2:
                audit.accepted_after_restart[src] = audit.accepted_after_restart.get(src, 0) + 1
        elif r["reason"].startswith("stale:"):
            row["dropped_stale"] += 1
        else:
            row["rejected"] += 1
            audit.refused_duplicates += r["reason"].startswith("duplicate:")

    def audit(self) -> LedgerAudit:
        """What the rows say so far; with several services each one's, and their counts added up."""
        services = self._services
        if not services:
            return self.result
        out = LedgerAudit(workers={w: dict(c) for w, c in self.result.workers.items()}, faults=dict(self.result.faults))
        for name, auditor in services.items():
            part = out.services[name] = auditor.audit()
            for w, counts in part.workers.items():
                mine = out.workers.setdefault(w, _worker_row())
                for key, n in counts.items():
                    mine[key] += n
            for w, n in part.lives.items():
                out.lives[w] = max(out.lives.get(w, 0), n)
            for w, n in part.accepted_after_restart.items():
                out.accepted_after_restart[w] = out.accepted_after_restart.get(w, 0) + n
            out.distinct_accepted += part.distinct_accepted
            out.repeated_keys += [(f"{w}/{name}", life, seq) for w, life, seq in part.repeated_keys]
            out.refused_duplicates += part.refused_duplicates
        return out


def ledger_audit(run_dir: Path) -> LedgerAudit:
    """Read a run's comm.csv once and account for every push (streamed: fine for millions of rows)."""
    auditor = LedgerAuditor()
    with open_run_text(Path(run_dir) / "comm.csv") as fh:  # plain or compressed (run.compress_logs)
        for r in csv.DictReader(fh):
            auditor.feed(r)
    return auditor.audit()


class QuantumLedger(FileLog):
    """Adds up the workers' reports; writes quantum.csv rows and the summary's keys."""

    def __init__(self, cfg: Any, out: Optional[Path], resume: Optional[dict[str, Any]] = None) -> None:
        self.out = out
        self.timing = cfg.qpu.timing()
        self.assumed_shots = cfg.qpu.assumed_shots
        state = resume or {}
        self.per_worker: dict[str, dict[str, int]] = {w: dict(c) for w, c in state.get("per_worker", {}).items()}
        self.exact: dict[str, bool] = dict(state.get("exact", {}))
        from marl_q.rundir import LazyMetricsFile

        self.file = LazyMetricsFile(out / QUANTUM_FILE, QUANTUM_COLUMNS, state.get("position")) if out is not None else None

    def active(self) -> bool:
        return bool(self.per_worker)

    def add(self, worker: str, report: dict[str, Any]) -> None:
        """A worker's counts since its previous report: {"counts": {role: {counter: n}}, "exact": {role: bool}}."""
        mine = self.per_worker.setdefault(worker, dict.fromkeys(counter_columns(), 0))
        for role, counts in report["counts"].items():
            for key, value in counts.items():
                mine[f"{role}_{key}"] = mine.get(f"{role}_{key}", 0) + int(value)
        self.exact.update(report.get("exact", {}))

    def totals(self) -> dict[str, int]:
        out = dict.fromkeys(counter_columns(), 0)
        for counts in self.per_worker.values():
            for key, value in counts.items():
                out[key] = out.get(key, 0) + value
        return out

    def _aggregate(self, counts: dict[str, int]) -> dict[str, Any]:
        circuits = sum(counts.get(f"{r}_{k}_circuits", 0) for r in ROLES for k in KINDS)
        shots = sum(counts.get(f"{r}_{k}_shots", 0) for r in ROLES for k in KINDS)
        qpu = qpu_seconds(counts, self.exact, self.timing, self.assumed_shots) if self.timing else None
        return {"circuits": circuits, "shots": shots, "qpu_s": qpu}

    def row(self, base: dict[str, Any]) -> None:
        """One quantum.csv row beside a metrics.csv row (``base``: its t, worker, env_steps, episode)."""
        if not self.active() or self.file is None:
            return
        totals = self.totals()
        self.file.write({**base, **totals, **self._aggregate(totals)})

    @property
    def writer(self) -> Any:
        """The open MetricsWriter, or None before the first row."""
        return self.file.writer if self.file is not None else None

    def position(self) -> Optional[list[int]]:
        return self.file.position() if self.file is not None else None

    def state(self) -> dict[str, Any]:
        """What a checkpoint keeps to continue the ledger on resume."""
        return {"per_worker": self.per_worker, "exact": self.exact, "position": self.position()}

    def summary(self, env_steps: int) -> dict[str, Any]:
        """summary.json keys: totals, per env step, per worker, exactness and the QPU estimate."""
        if not self.active():
            return {}
        totals = self.totals()
        agg = self._aggregate(totals)
        out: dict[str, Any] = {f"quantum_{k}": v for k, v in totals.items()}
        out.update({"quantum_circuits": agg["circuits"], "quantum_shots": agg["shots"],
                    "quantum_exact": all(self.exact.values()),
                    "quantum_circuits_per_env_step": agg["circuits"] / env_steps if env_steps else None,
                    "quantum_shots_per_env_step": agg["shots"] / env_steps if env_steps else None,
                    "quantum_per_worker": {w: dict(c) for w, c in sorted(self.per_worker.items())}})
        if self.timing is not None:
            out["qpu_profile"] = {"shot_s": self.timing.shot_s, "circuit_s": self.timing.circuit_s, "job_s": self.timing.job_s,
                                  "assumed_shots": self.assumed_shots}
            out["qpu_hours"] = agg["qpu_s"] / 3600.0
            out["qpu_s_per_env_step"] = agg["qpu_s"] / env_steps if env_steps else None
        return out


def _worker_row() -> dict[str, int]:
    return {"received": 0, "accepted": 0, "rejected": 0, "dropped_stale": 0, "duplicated": 0, "sent": 0}
