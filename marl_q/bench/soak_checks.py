"""What `marlq bench soak` checks at the end of a soak, as plain functions of a run's files and figures
(each unit-tested on small hand-made ledgers, good and broken).

- applied_once: the server's applied updates equal the distinct accepted (worker, life, seq) in the ledger,
  and no key was accepted twice (nothing applied twice, nothing applied without a ledger row);
- accounted: per worker, sent = accepted + rejected + dropped_stale (sent: the sum over the worker's lives of
  the highest seq that reached the server, so a push lost or counted twice in the middle of a life shows);
- resumed_from_checkpoint: the resumed session started from the very checkpoint that was the latest when the
  process was killed (same file, same bytes) and from its state: counters, ledger row ids, server version,
  metrics episode numbers all continue from the checkpoint's header;
- metrics_continuous: metrics.csv's episode numbers are 1..N with no gap or repeat (across the resume) and
  env_steps never goes back.

Plus the memory figure: the least-squares RSS slope, one intercept per server process (the resume starts a
new one), one slope shared by all.
"""
from __future__ import annotations

import csv
import hashlib
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Optional, Sequence

import numpy as np

from marl_q.ledger import LedgerAudit


@dataclass
class Check:
    """One invariant's verdict and what it saw."""

    name: str
    ok: bool
    detail: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def applied_once(updates: int, audit: LedgerAudit) -> Check:
    """Applied updates (the server's count) = distinct accepted (worker, life, seq) in comm.csv, none twice."""
    ok = updates == audit.distinct_accepted and not audit.repeated_keys
    detail = f"{updates} updates applied, {audit.distinct_accepted} distinct accepted (worker, life, seq)"
    if audit.repeated_keys:
        detail += f"; accepted more than once: {audit.repeated_keys[:5]}"
    return Check("applied_once", ok, detail)


def accounted(audit: LedgerAudit) -> Check:
    """Per worker: sent = accepted + rejected + dropped_stale."""
    bad = []
    for name, w in sorted(audit.workers.items()):
        total = w["accepted"] + w["rejected"] + w["dropped_stale"]
        if w["sent"] != total:
            bad.append(f"{name}: sent {w['sent']} != {w['accepted']} + {w['rejected']} + {w['dropped_stale']}")
    sent = sum(w["sent"] for w in audit.workers.values())
    detail = "; ".join(bad) if bad else f"{len(audit.workers)} workers, {sent} pushes, each accounted for once"
    return Check("accounted", not bad, detail)


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def checkpoint_facts(path: Path) -> dict[str, Any]:
    """What the resume must start from: a checkpoint's name, bytes and header counters."""
    from marl_q.rundir import load_checkpoint

    _, meta = load_checkpoint(path)
    return {"file": path.name, "sha256": file_sha256(path), "updates": int(meta["updates"]),
            "env_steps": int(meta["env_steps"]), "episodes": int(meta["episodes"]),
            "server_version": int(meta["server_version"]), "ledger_count": int(meta["ledger_state"]["count"]),
            "comm_position": int(meta["ledger_state"]["position"][0]),
            "metrics_position": int(meta["metrics_position"][0])}


def first_row_at(path: Path, offset: int) -> Optional[dict[str, str]]:
    """The CSV row that starts at byte ``offset`` of ``path`` (its header read from the top); None at the end."""
    with open(path, newline="") as fh:
        header = next(csv.reader([fh.readline()]))
        fh.seek(offset)
        line = fh.readline()
    return dict(zip(header, next(csv.reader([line])))) if line.strip() else None


def resumed_from_checkpoint(before: dict[str, Any], sha_at_resume: str, resume_entry: Optional[dict[str, Any]],
                            first_comm: Optional[dict[str, str]], first_metrics: Optional[dict[str, str]]) -> Check:
    """The resumed session started from ``before`` (checkpoint_facts when the process was killed):

    the same file with the same bytes (``sha_at_resume``, hashed just before `marlq resume` ran), the
    summary's resume entry (from, updates, env_steps) naming it, and the first rows the resumed session
    wrote continuing from its header (comm.csv: the next row id at the server version it recorded;
    metrics.csv: the next episode number)."""
    problems = []
    if sha_at_resume != before["sha256"]:
        problems.append("the checkpoint's bytes changed between the kill and the resume")
    if resume_entry is None:
        problems.append("summary.json has no resume entry")
    else:
        for key, want in (("from", before["file"]), ("updates", before["updates"]),
                          ("env_steps", before["env_steps"])):
            if resume_entry.get(key) != want:
                problems.append(f"resume entry {key}={resume_entry.get(key)!r}, checkpoint has {want!r}")
    if first_comm is None:
        problems.append("the resumed session wrote no comm.csv row")
    else:
        if int(first_comm["id"]) != before["ledger_count"]:
            problems.append(f"first comm.csv row after the resume has id {first_comm['id']}, "
                            f"the checkpoint's ledger ended at {before['ledger_count']}")
        if first_comm["server_version"] and int(first_comm["server_version"]) != before["server_version"]:
            problems.append(f"first comm.csv row after the resume was at server version "
                            f"{first_comm['server_version']}, the checkpoint's is {before['server_version']}")
    if first_metrics is not None and int(first_metrics["episode"]) != before["episodes"] + 1:
        problems.append(f"first metrics row after the resume is episode {first_metrics['episode']}, "
                        f"the checkpoint had {before['episodes']}")
    detail = "; ".join(problems) if problems else (
        f"resumed from {before['file']} (sha256 {before['sha256'][:12]}, {before['updates']} updates, "
        f"{before['env_steps']} env steps, version {before['server_version']}); ledger id "
        f"{before['ledger_count']} and episode {before['episodes'] + 1} came next")
    return Check("resumed_from_checkpoint", not problems, detail)


def metrics_continuous(episodes: Sequence[int], env_steps: Sequence[int]) -> Check:
    """Episode numbers are exactly 1..N in order, and env_steps never decreases."""
    ep = np.asarray(episodes, dtype=np.int64)
    problems = []
    if len(ep) == 0:
        problems.append("metrics.csv has no rows")
    else:
        steps = np.diff(ep)
        if ep[0] != 1:
            problems.append(f"the first episode is {ep[0]}, not 1")
        for what, where in (("gap", np.flatnonzero(steps > 1)), ("repeat or step back", np.flatnonzero(steps < 1))):
            if len(where):
                i = int(where[0])
                problems.append(f"{len(where)} {what}(s), the first after episode {ep[i]} (next is {ep[i + 1]})")
        back = np.flatnonzero(np.diff(np.asarray(env_steps, dtype=np.int64)) < 0)
        if len(back):
            problems.append(f"env_steps goes back {len(back)} time(s), first after episode {ep[int(back[0])]}")
    detail = "; ".join(problems) if problems else f"episodes 1..{len(ep)}, each once, env_steps non-decreasing"
    return Check("metrics_continuous", not problems, detail)


def read_metrics_columns(path: Path) -> tuple[list[int], list[int]]:
    """(episode, env_steps) columns of a metrics.csv."""
    episodes, steps = [], []
    with open(path, newline="") as fh:
        for r in csv.DictReader(fh):
            episodes.append(int(r["episode"]))
            steps.append(int(r["env_steps"]))
    return episodes, steps


def rss_slope(t_s: Sequence[float], rss_mb: Sequence[float], process: Sequence[Any]) -> float:
    """Least-squares slope of RSS against time (MB per second), one intercept per process and one slope
    shared by all (a resumed run's server is a new process: its level differs, its leak would not);
    nan with fewer than 3 samples or no spread in time within a process."""
    t, y = np.asarray(t_s, dtype=float), np.asarray(rss_mb, dtype=float)
    if len(t) < 3:
        return float("nan")
    keys = list(dict.fromkeys(process))
    cols = [np.asarray([p == k for p in process], dtype=float) for k in keys]
    a = np.column_stack([t, *cols])
    if np.linalg.matrix_rank(a) < a.shape[1]:
        return float("nan")
    coef, *_ = np.linalg.lstsq(a, y, rcond=None)
    return float(coef[0])
