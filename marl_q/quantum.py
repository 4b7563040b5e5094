"""The run's quantum-resource ledger: circuit executions, shots and jobs per worker and head, and an
estimated QPU wall time from a ``qpu:`` profile (docs/hardware.md).

Workers count (``circuits.resources``) and report the counts since their previous step with each
step (``Work.resources``); the runtime adds them up here. ``quantum.csv`` gets one row per
``metrics.csv`` row (per finished episode, the same ``t, worker, env_steps, episode``) holding the
run's cumulative counts at that point; ``summary.json`` gets the totals, their per-env-step rates
and the per-worker totals. Counting never touches an RNG or a metrics row, so a sim run is
byte-identical with or without it.

QPU time model (seconds), with the head's shots (or ``qpu.assumed_shots`` for an exact head):

    qpu_s = shots x shot_s + circuits x circuit_s + jobs x job_s

A *job* is one batch of circuits submitted together: one forward call of one head (all its rows)
or the gradient circuits of one backward of one head.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple, Optional

ROLES = ("actor", "critic")
KINDS = ("act", "grad")
COUNTS = ("circuits", "shots", "jobs")
QUANTUM_FILE = "quantum.csv"


class QPUProfile(NamedTuple):
    """Timing of one kind of QPU; see docs/hardware.md for where each number comes from (approximate)."""

    shot_s: float  # one shot: reset / repetition delay, gates and readout of a shallow circuit
    circuit_s: float  # per circuit: loading and binding its parameters, control-electronics set-up
    job_s: float  # per job: submission, queue and return latency in a reserved session
    help: str


QPU_PROFILES: dict[str, QPUProfile] = {
    # IBM Eagle / Heron class: default repetition delay 250 us dominates a shot (gates ~0.05-0.5 us,
    # readout ~1-4 us); a few ms per circuit as CLOPS figures of 10^4-10^5 imply; ~2 s per job in a session
    "superconducting": QPUProfile(2.5e-4, 2e-3, 2.0, "IBM Eagle/Heron-like: 250 us per shot, 2 ms per circuit, 2 s per job"),
    # IonQ Aria / Quantinuum H-class: ~600 us two-qubit gates, ~135 us one-qubit gates, ~300 us readout;
    # a 4-qubit, ~20 two-qubit-gate circuit takes ~15 ms per shot; ~50 ms per circuit; ~10 s per job
    "trapped_ion": QPUProfile(1.5e-2, 5e-2, 10.0, "IonQ Aria / Quantinuum-like: 15 ms per shot, 50 ms per circuit, 10 s per job"),
}


@dataclass
class QPUConfig:
    """``qpu:``: the profile the estimated QPU time is computed from (null: no estimate); the three
    times may be overridden one by one."""

    profile: Optional[str] = None
    shot_s: Optional[float] = None
    circuit_s: Optional[float] = None
    job_s: Optional[float] = None
    assumed_shots: int = 1024  # shots per circuit assumed for an exact (analytic) head

    def validate(self) -> None:
        if self.profile is not None and self.profile not in QPU_PROFILES:
            raise ValueError(f"profile: unknown QPU profile {self.profile!r}; choices: {', '.join(QPU_PROFILES)}")
        for key in ("shot_s", "circuit_s", "job_s"):
            value = getattr(self, key)
            if value is not None and value < 0:
                raise ValueError(f"{key}: must be >= 0, got {value}")
        if self.assumed_shots < 1:
            raise ValueError(f"assumed_shots: must be at least 1, got {self.assumed_shots}")

    def timing(self) -> Optional[QPUProfile]:
        """The profile with the overrides applied, or None without a profile."""
        if self.profile is None:
            return None
        base = QPU_PROFILES[self.profile]
        return base._replace(**{k: getattr(self, k) for k in ("shot_s", "circuit_s", "job_s") if getattr(self, k) is not None})


def counter_columns() -> list[str]:
    """quantum.csv's count columns: ``<role>_<act|grad>_<circuits|shots|jobs>``."""
    return [f"{role}_{kind}_{count}" for role in ROLES for kind in KINDS for count in COUNTS]


COLUMNS = counter_columns() + ["circuits", "shots", "qpu_s"]


def qpu_seconds(counts: dict[str, int], exact: dict[str, bool], timing: QPUProfile, assumed_shots: int) -> float:
    """Estimated QPU seconds of flat counts (``counter_columns`` keys); an exact role's shots are its
    circuits x ``assumed_shots``."""
    total = 0.0
    for role in ROLES:
        for kind in KINDS:
            circuits = counts.get(f"{role}_{kind}_circuits", 0)
            shots = circuits * assumed_shots if exact.get(role, True) else counts.get(f"{role}_{kind}_shots", 0)
            total += shots * timing.shot_s + circuits * timing.circuit_s + counts.get(f"{role}_{kind}_jobs", 0) * timing.job_s
    return total


def estimate_qpu_rows(quantum: dict[str, Any], timing: QPUProfile, assumed_shots: int) -> Any:
    """Estimated cumulative QPU seconds at every row of a quantum.csv read as column arrays (a run
    recorded without a ``qpu:`` profile, costed afterwards): the same model as ``qpu_seconds``, with
    a role exact where it ran circuits and recorded no shot."""
    import numpy as np

    exact = {role: not np.nanmax(quantum.get(f"{role}_act_shots", np.zeros(1)), initial=0.0) > 0 for role in ROLES}
    counts = {key: np.nan_to_num(np.asarray(quantum[key], dtype=float)) for key in counter_columns() if key in quantum}
    return qpu_seconds(counts, exact, timing, assumed_shots)  # type: ignore[arg-type]


class QuantumLedger:
    """Adds up the workers' reports; writes quantum.csv rows and the summary's keys."""

    def __init__(self, cfg: Any, out: Optional[Path], resume: Optional[dict[str, Any]] = None) -> None:
        self.out = out
        self.timing = cfg.qpu.timing()
        self.assumed_shots = cfg.qpu.assumed_shots
        state = resume or {}
        self.per_worker: dict[str, dict[str, int]] = {w: dict(c) for w, c in state.get("per_worker", {}).items()}
        self.exact: dict[str, bool] = dict(state.get("exact", {}))
        from marl_q.rundir import LazyMetricsFile

        self.file = LazyMetricsFile(out / QUANTUM_FILE, COLUMNS, state.get("position")) if out is not None else None

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

    def flush(self) -> None:
        if self.file is not None:
            self.file.flush()

    def close(self) -> None:
        if self.file is not None:
            self.file.close()

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
