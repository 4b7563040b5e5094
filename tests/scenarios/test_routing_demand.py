"""Demand: the diurnal profile by hand, Poisson counts against the integrated rate, trace CSV parsing."""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from scipy import integrate

from scenarios.routing_demand import (SERVICE_PROFILES, DemandError, DiurnalDemand, city_cell_weights,
                                      diurnal_factor, load_trace_csv, request_stream)


def test_diurnal_factor_by_hand() -> None:
    assert diurnal_factor(20.0, 20.0, 0.25) == pytest.approx(1.0)
    assert diurnal_factor(8.0, 20.0, 0.25) == pytest.approx(0.25)
    assert diurnal_factor(2.0, 20.0, 0.25) == pytest.approx(0.25 + 0.75 * 0.5)   # six hours away
    assert diurnal_factor(44.0, 20.0, 0.4) == pytest.approx(1.0)                 # one day later


def test_cell_weights_have_mean_one_and_a_city_shape() -> None:
    w = city_cell_weights(24, ["embb", "urllc"], seed=3)
    for s in w:
        assert w[s].mean() == pytest.approx(1.0) and (w[s] > 0).all()
    downtown, residential = slice(0, 8), slice(8, 16)
    assert w["urllc"][downtown].mean() > w["urllc"][residential].mean()
    assert w["embb"][residential].mean() > w["embb"][downtown].mean()


def _demand(day: float = 100.0) -> DiurnalDemand:
    return DiurnalDemand(dict(SERVICE_PROFILES), city_cell_weights(6, list(SERVICE_PROFILES), 0), day, load_scale=5.0)


def test_poisson_count_matches_integrated_rate() -> None:
    demand = _demand()
    rng = np.random.default_rng(0)
    start, end = 10.0, 310.0
    reqs = list(request_stream(demand, SERVICE_PROFILES, ["embb", "mmtc"], 6, [100], [50] * 6, start, end, rng))
    expected = sum(integrate.quad(lambda t: demand.rate(s, c, t), start, end, limit=200)[0]
                   for s in ("embb", "mmtc") for c in range(6))
    assert abs(len(reqs) - expected) < 4.0 * math.sqrt(expected)
    times = [r.time_s for r in reqs]
    assert times == sorted(times) and start <= times[0] and times[-1] < end
    assert {r.service for r in reqs} == {"embb", "mmtc"}
    assert len({r.request_id for r in reqs}) == len(reqs)
    embb = [r for r in reqs if r.service == "embb"]
    lo, hi = SERVICE_PROFILES["embb"].bandwidth_mbps
    assert all(lo * 1000 <= r.bandwidth_kbps <= hi * 1000 for r in embb)
    assert np.mean([r.holding_s for r in embb]) == pytest.approx(SERVICE_PROFILES["embb"].mean_holding_s, rel=0.25)


def test_arrivals_follow_the_peak() -> None:
    """More eMBB arrivals in the two hours around its peak than around its trough."""
    demand = _demand(day=240.0)           # 10 s per hour
    reqs = list(request_stream(demand, SERVICE_PROFILES, ["embb"], 6, [100], [50] * 6, 0.0, 2400.0,
                               np.random.default_rng(1)))
    hours = np.array([24.0 * (r.time_s % 240.0) / 240.0 for r in reqs])
    peak = SERVICE_PROFILES["embb"].peak_hour
    near_peak = np.sum(np.abs(hours - peak) < 1.0)
    near_trough = np.sum(np.abs(hours - (peak - 12.0)) < 1.0)
    assert near_peak > 2.5 * near_trough


def test_request_ids_interleave_for_workers() -> None:
    reqs = list(request_stream(_demand(), SERVICE_PROFILES, ["urllc"], 6, [100], [50] * 6, 0.0, 20.0,
                               np.random.default_rng(2), first_id=1, id_step=3))
    assert [r.request_id for r in reqs] == [1 + 3 * i for i in range(len(reqs))]
    assert all(r.destination == 50 for r in reqs)


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "trace.csv"
    p.write_text(text)
    return p


def test_trace_replay_is_piecewise_constant(tmp_path: Path) -> None:
    p = write(tmp_path, "time,cell,service,rate\n0,0,embb,1.5\n50,0,embb,0.5\n10,1,urllc,2\n")
    trace = load_trace_csv(p, n_cells=2, services=["embb", "urllc"], day_seconds=100.0)
    assert trace.rate("embb", 0, 0.0) == 1.5 and trace.rate("embb", 0, 49.9) == 1.5
    assert trace.rate("embb", 0, 50.0) == 0.5 and trace.rate("embb", 0, 150.0) == 0.5   # repeats daily
    assert trace.rate("urllc", 1, 5.0) == 0.0 and trace.rate("urllc", 1, 10.0) == 2.0
    assert trace.rate("urllc", 0, 10.0) == 0.0
    assert trace.peak_rate("embb", 0) == 1.5


@pytest.mark.parametrize("body, message", [
    ("0,0,embb,1\nabc,0,embb,1\n", "line 3 .*time 'abc' is not a number"),
    ("0,0,embb,1\n5,0,embb\n", "line 3 .*expected 4 fields, got 3"),
    ("0,0,embb,-2\n", "line 2 .*rate -2.0 must be a finite number >= 0"),
    ("0,0,video,1\n", "line 2 .*service 'video' is not one of"),
    ("0,7,embb,1\n", "line 2 .*cell 7 is not in 0..1"),
    ("0,x,embb,1\n", "line 2 .*cell 'x' is not an integer"),
    ("0,0,embb,nan\n", "line 2 .*must be a finite number"),
    ("500,0,embb,1\n", "line 2 .*time 500.0 must lie in"),
])
def test_malformed_trace_rows_are_named(tmp_path: Path, body: str, message: str) -> None:
    p = write(tmp_path, "time,cell,service,rate\n" + body)
    with pytest.raises(DemandError, match=message):
        load_trace_csv(p, n_cells=2, services=["embb", "urllc"], day_seconds=100.0)


def test_bad_trace_files_are_named(tmp_path: Path) -> None:
    with pytest.raises(DemandError, match="does not exist"):
        load_trace_csv(tmp_path / "missing.csv", 2, ["embb"], 100.0)
    with pytest.raises(DemandError, match="line 1 must be the header"):
        load_trace_csv(write(tmp_path, "t,c,s,r\n0,0,embb,1\n"), 2, ["embb"], 100.0)
    with pytest.raises(DemandError, match="no data rows"):
        load_trace_csv(write(tmp_path, "time,cell,service,rate\n"), 2, ["embb"], 100.0)
