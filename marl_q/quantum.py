"""What the run's quantum-resource ledger counts: circuit executions, shots and jobs per worker and
head, and an estimated QPU wall time from a ``qpu:`` profile (docs/hardware.md).

Workers count (``circuits.resources``) and report the counts since their previous step with each
step (``Work.resources``); the runtime adds them up in ``marl_q.ledger.QuantumLedger``. ``quantum.csv`` gets one row per
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
