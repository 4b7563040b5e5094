"""Demand of the routing scenario: services, diurnal Poisson arrivals with a city-like spatial mix, traces.

Requests of each (cell, service) arrive as a non-homogeneous Poisson process; the rate follows a
diurnal profile (one compressed day lasts ``day_seconds``) scaled by a per-cell weight drawn once per
city (districts: downtown, residential, industrial). Arrivals are drawn by thinning (Lewis and
Shedler 1979): candidates at the peak rate, each kept with probability rate(t) / peak. A CSV trace of
(time, cell, service, rate) rows can replace the synthetic rates.
"""
from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Protocol

import numpy as np


@dataclass(frozen=True)
class ServiceProfile:
    """Traffic class: bandwidth range, latency budget, holding time, rates and where it terminates."""

    name: str
    bandwidth_mbps: tuple[float, float]
    budget_ms: float
    mean_holding_s: float
    peak_rate_per_cell: float     # requests/s at the diurnal peak in a cell of weight 1
    peak_hour: float
    trough_fraction: float        # rate at the trough relative to the peak
    processing_factor: int        # processing (kb/s) used at each DU/CU/core node per kb/s carried
    destination: str              # "core" (a gateway) or "edge" (the MEC site at the cell's CU)


SERVICE_PROFILES: dict[str, ServiceProfile] = {
    "embb": ServiceProfile("embb", (20.0, 80.0), 30.0, 40.0, 0.135, 20.0, 0.25, 1, "core"),
    "urllc": ServiceProfile("urllc", (5.0, 20.0), 2.5, 20.0, 0.13, 11.0, 0.3, 4, "edge"),
    "mmtc": ServiceProfile("mmtc", (0.2, 1.0), 100.0, 120.0, 0.14, 14.0, 0.6, 2, "core"),
}

DISTRICTS = ("downtown", "residential", "industrial")
# How much of each service a district generates relative to the city average (before normalising).
DISTRICT_FACTOR = {
    "downtown": {"embb": 1.0, "urllc": 2.0, "mmtc": 0.8},
    "residential": {"embb": 1.6, "urllc": 0.5, "mmtc": 1.0},
    "industrial": {"embb": 0.5, "urllc": 1.2, "mmtc": 2.0},
}


class DemandError(ValueError):
    """Malformed demand input: a bad trace file or an impossible shift."""


@dataclass(frozen=True)
class Request:
    """One connection request: when, from which cell, which service, how much, for how long, to where."""

    request_id: int
    time_s: float
    cell: int
    service: str
    bandwidth_kbps: int
    holding_s: float
    destination: int


class RateSource(Protocol):
    """Anything that gives the arrival rate (requests/s) of a service in a cell at a time."""

    def rate(self, service: str, cell: int, time_s: float) -> float: ...

    def peak_rate(self, service: str, cell: int) -> float: ...


def diurnal_factor(hour: float, peak_hour: float, trough_fraction: float) -> float:
    """Raised-cosine day profile: 1 at ``peak_hour``, ``trough_fraction`` twelve hours away."""
    phase = 2.0 * math.pi * (hour - peak_hour) / 24.0
    return trough_fraction + (1.0 - trough_fraction) * 0.5 * (1.0 + math.cos(phase))


def city_cell_weights(n_cells: int, services: list[str], seed: int) -> dict[str, np.ndarray]:
    """Per-service cell weights (mean 1): district factor times a lognormal cell-to-cell spread."""
    rng = np.random.default_rng(seed)
    district = [DISTRICTS[(3 * c) // max(n_cells, 1) % 3] for c in range(n_cells)]
    spread = rng.lognormal(mean=0.0, sigma=0.35, size=n_cells)
    out = {}
    for s in services:
        w = np.array([DISTRICT_FACTOR[district[c]].get(s, 1.0) for c in range(n_cells)]) * spread
        out[s] = w / w.mean()
    return out


@dataclass
class DiurnalDemand:
    """Synthetic rates: profile peak x diurnal factor x cell weight x load scale (x shift)."""

    profiles: dict[str, ServiceProfile]
    cell_weights: dict[str, np.ndarray]
    day_seconds: float
    load_scale: float = 1.0
    rate_multiplier: dict[str, float] | None = None

    def rate(self, service: str, cell: int, time_s: float) -> float:
        """Arrival rate (requests/s) at ``time_s`` seconds into the run."""
        p = self.profiles[service]
        hour = 24.0 * (time_s % self.day_seconds) / self.day_seconds
        return self.peak_rate(service, cell) * diurnal_factor(hour, p.peak_hour, p.trough_fraction)

    def peak_rate(self, service: str, cell: int) -> float:
        """Largest rate over the day (the thinning envelope)."""
        mult = (self.rate_multiplier or {}).get(service, 1.0)
        return self.profiles[service].peak_rate_per_cell * float(self.cell_weights[service][cell]) \
            * self.load_scale * mult


@dataclass
class TraceDemand:
    """Replayed rates: piecewise constant per (cell, service) from CSV rows, repeating every day."""

    table: dict[tuple[int, str], tuple[np.ndarray, np.ndarray]]   # (times sorted, rates)
    day_seconds: float
    rate_multiplier: dict[str, float] | None = None

    def rate(self, service: str, cell: int, time_s: float) -> float:
        """Rate of the latest trace row at or before the time of day (0 before the first row)."""
        entry = self.table.get((cell, service))
        if entry is None:
            return 0.0
        times, rates = entry
        i = int(np.searchsorted(times, time_s % self.day_seconds, side="right")) - 1
        mult = (self.rate_multiplier or {}).get(service, 1.0)
        return float(rates[i]) * mult if i >= 0 else 0.0

    def peak_rate(self, service: str, cell: int) -> float:
        """Largest rate the trace gives this (cell, service)."""
        entry = self.table.get((cell, service))
        mult = (self.rate_multiplier or {}).get(service, 1.0)
        return float(entry[1].max()) * mult if entry is not None else 0.0


TRACE_COLUMNS = ("time", "cell", "service", "rate")


def load_trace_csv(path: str | Path, n_cells: int, services: list[str], day_seconds: float) -> TraceDemand:
    """Read a (time, cell, service, rate) CSV; any malformed row raises DemandError naming its line."""
    path = Path(path)
    if not path.is_file():
        raise DemandError(f"trace file {str(path)!r} does not exist")
    rows: dict[tuple[int, str], list[tuple[float, float]]] = {}
    with path.open(newline="") as f:
        reader = csv.reader(f)
        header = next(reader, None)
        if header is None or [h.strip().lower() for h in header] != list(TRACE_COLUMNS):
            raise DemandError(f"{path}: line 1 must be the header {','.join(TRACE_COLUMNS)}, got {header}")
        for line_no, row in enumerate(reader, start=2):
            if not row or all(not cell.strip() for cell in row):
                continue
            where = f"{path}: line {line_no} ({','.join(row)})"
            if len(row) != len(TRACE_COLUMNS):
                raise DemandError(f"{where}: expected {len(TRACE_COLUMNS)} fields, got {len(row)}")
            try:
                time_s = float(row[0])
            except ValueError:
                raise DemandError(f"{where}: time {row[0]!r} is not a number") from None
            try:
                cell = int(row[1])
            except ValueError:
                raise DemandError(f"{where}: cell {row[1]!r} is not an integer") from None
            service = row[2].strip().lower()
            try:
                rate = float(row[3])
            except ValueError:
                raise DemandError(f"{where}: rate {row[3]!r} is not a number") from None
            if not math.isfinite(time_s) or not 0.0 <= time_s < day_seconds:
                raise DemandError(f"{where}: time {time_s} must lie in [0, day_seconds={day_seconds})")
            if not 0 <= cell < n_cells:
                raise DemandError(f"{where}: cell {cell} is not in 0..{n_cells - 1}")
            if service not in services:
                raise DemandError(f"{where}: service {service!r} is not one of {services}")
            if not math.isfinite(rate) or rate < 0.0:
                raise DemandError(f"{where}: rate {rate} must be a finite number >= 0 (requests/s)")
            rows.setdefault((cell, service), []).append((time_s, rate))
    if not rows:
        raise DemandError(f"{path}: the trace has no data rows")
    table = {}
    for key, entries in rows.items():
        entries.sort()
        table[key] = (np.array([t for t, _ in entries]), np.array([r for _, r in entries]))
    return TraceDemand(table=table, day_seconds=day_seconds)


def destination_node(profile: ServiceProfile, cell: int, cores: list[int], edge_cu_of_cell: list[int],
                     rng: np.random.Generator) -> int:
    """Where a request terminates: a random core gateway, or the edge site serving its cell."""
    if profile.destination == "edge":
        return edge_cu_of_cell[cell]
    return cores[int(rng.integers(len(cores)))]


def request_stream(demand: RateSource, profiles: dict[str, ServiceProfile], services: list[str],
                   n_cells: int, cores: list[int], edge_cu_of_cell: list[int], start_s: float,
                   end_s: float, rng: np.random.Generator, first_id: int = 0,
                   id_step: int = 1) -> Iterator[Request]:
    """Time-ordered arrivals of the given services over [start_s, end_s) by thinning the peak rates."""
    return RequestStream(demand, profiles, services, n_cells, cores, edge_cu_of_cell, start_s, end_s, rng,
                         first_id, id_step)


class RequestStream:
    """The iterator behind `request_stream`: a class rather than a generator, so that a run holding one
    can be pickled into a sim snapshot (exact resume) and continues drawing where it stopped."""

    def __init__(self, demand: RateSource, profiles: dict[str, ServiceProfile], services: list[str],
                 n_cells: int, cores: list[int], edge_cu_of_cell: list[int], start_s: float, end_s: float,
                 rng: np.random.Generator, first_id: int = 0, id_step: int = 1) -> None:
        self.demand, self.profiles = demand, profiles
        self.cores, self.edge_cu_of_cell = cores, edge_cu_of_cell
        self.marks = [(s, c) for s in services for c in range(n_cells)]
        peaks = np.array([demand.peak_rate(s, c) for s, c in self.marks], dtype=float)
        self.total = float(peaks.sum())
        self.probs = peaks / self.total if self.total > 0.0 else peaks
        self.t = start_s
        self.end_s = end_s
        self.rng = rng
        self.next_id = first_id
        self.id_step = id_step
        self.finished = self.total <= 0.0

    def __iter__(self) -> "RequestStream":
        return self

    def __next__(self) -> Request:
        rng = self.rng
        while not self.finished:
            self.t += rng.exponential(1.0 / self.total)
            if self.t >= self.end_s:
                self.finished = True
                break
            s, c = self.marks[int(rng.choice(len(self.marks), p=self.probs))]
            keep = self.demand.rate(s, c, self.t) / self.demand.peak_rate(s, c)
            if rng.random() >= keep:
                continue
            p = self.profiles[s]
            lo, hi = p.bandwidth_mbps
            bandwidth_kbps = int(round(1000.0 * rng.uniform(lo, hi)))
            holding = float(rng.exponential(p.mean_holding_s))
            dest = destination_node(p, c, self.cores, self.edge_cu_of_cell, rng)
            request = Request(self.next_id, float(self.t), c, s, bandwidth_kbps, holding, dest)
            self.next_id += self.id_step
            return request
        raise StopIteration
