"""The routing comparison's statistics and tables, from hand-made run directories."""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from scipy import stats

from analysis.routing import ci95, compare, report

SHIFTS = ("none", "urllc_surge", "embb_peak_moved")


def test_ci95_by_hand() -> None:
    m, h = ci95([1.0, 2.0, 3.0, 4.0])
    sd = math.sqrt(((1.5 ** 2) * 2 + (0.5 ** 2) * 2) / 3)
    assert m == 2.5 and h == pytest.approx(stats.t.ppf(0.975, 3) * sd / 2.0)
    assert ci95([7.0]) == (7.0, 0.0)
    assert ci95([float("nan"), 2.0, 4.0])[0] == 3.0


def fake_summary(gos: float, latency: float, virtual_s: float, conflicts: float) -> dict:
    out = {"virtual_s": virtual_s, "wall_s": 2 * virtual_s, "commit_conflict_rate": conflicts, "env_steps": 100,
           "commits": 90}
    for s in SHIFTS:
        out.update({f"eval_{s}_gos": gos, f"eval_{s}_latency_mean_ms": latency, f"eval_{s}_latency_p95_ms": 2 * latency})
        for h in ("shortest_path_first_fit", "random_feasible", "uniform_random"):
            out.update({f"baseline_{h}_{s}_gos": 0.5, f"baseline_{h}_{s}_latency_mean_ms": 9.0})
    return out


def test_compare_pairs_seeds(tmp_path: Path) -> None:
    for seed, (ga, gs) in enumerate([(0.95, 0.96), (0.97, 0.96)]):
        for name, gos, lat, vs in (("amarl", ga, 5.0, 10.0), ("single_ppo", gs, 4.0, 40.0)):
            d = tmp_path / name / f"seed{seed}"
            d.mkdir(parents=True)
            (d / "summary.json").write_text(json.dumps(fake_summary(gos, lat, vs, 0.01)))
            workers = ["w0", "w1", "w2"] if name == "amarl" else ["w0"]
            lines = ["t,worker,episode,gos,requests"] + [f"1.0,{w},{i + 1},0.9,10" for i, w in enumerate(workers)]
            (d / "metrics.csv").write_text("\n".join(lines) + "\n")
            walls = ["episode,wall_s,compute_s"] + [f"{i + 1},0.5,{vs / 10 + i}" for i in range(len(workers))]
            (d / "metrics_wall.csv").write_text("\n".join(walls) + "\n")
    res = compare(tmp_path)
    g = res["gos_pp_none"]
    assert res["seeds"] == 2
    assert g["amarl"] == pytest.approx(96.0) and g["single"] == pytest.approx(96.0)
    assert g["diff"] == pytest.approx(0.0) and g["diff_ci"] == pytest.approx(stats.t.ppf(0.975, 1) * math.sqrt(2) / math.sqrt(2))
    assert res["time_ratio"] == (pytest.approx(0.25), 0.0)
    assert res["latency_ratio_nominal"][0] == pytest.approx(1.25)
    assert res["gos_pp_none_uniform_random"] == (pytest.approx(50.0), 0.0)
    assert res["busiest_agent_compute_s"]["amarl"] == (pytest.approx(3.0), 0.0)   # 1.0 + 2 (worker w2)
    assert res["all_agents_compute_s"]["amarl"] == (pytest.approx(6.0), 0.0)
    assert res["busiest_compute_ratio"] == (pytest.approx(0.75), 0.0)
    text = report(res)
    assert res["conflict_rate_pct"]["amarl"] == (pytest.approx(1.0), 0.0)
    assert "| nominal | 96.00" in text and "ratio 0.25 ± 0.00" in text and "AMARL 1.00 ± 0.00 %" in text
