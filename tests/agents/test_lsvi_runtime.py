"""The four LSVI algorithms through the runtime: the ledger's rounds and bytes, summaries, bad input."""
from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest

from marl_q.cli import main as marlq

CONFIG = str(Path(__file__).resolve().parents[2] / "scenarios" / "linear_mdp_regret.yaml")
H, D, S, A, M, K = 3, 2, 4, 3, 3, 40
SMALL = [f"scenario.horizon={H}", f"scenario.d={D}", f"scenario.n_states={S}", f"scenario.n_actions={A}",
         f"backend.workers={M}", f"run.total_episodes={K}"]


def run(tmp_path: Path, *overrides: str) -> tuple[dict, list[dict], list[dict]]:
    out = tmp_path / "run"
    args = ["run", CONFIG, "--quiet", "--out", str(out)]
    for item in SMALL + list(overrides):
        args += ["--set", item]
    assert marlq(args) == 0
    summary = json.loads((out / "summary.json").read_text())
    with open(out / "metrics.csv", newline="") as f:
        metrics = list(csv.DictReader(f))
    with open(out / "comm.csv", newline="") as f:
        comm = list(csv.DictReader(f))
    return summary, metrics, comm


def upload_bytes(n_transitions: int) -> int:
    """gram (H, d, d) float64 + transitions (n, 4) int32 + rewards (n,) float64."""
    return H * D * D * 8 + n_transitions * 4 * 4 + n_transitions * 8


DOWNLOAD_BYTES = H * D * D * 8 + H * D * 8 + H * D * S * 8  # gram, c, B as float64


def test_pooled_costs_a_round_every_episode_and_broadcasts_to_every_agent(tmp_path):
    summary, metrics, comm = run(tmp_path, "algorithm.name=lsvi_ucb_pooled")
    assert summary["comm_rounds"] == K and summary["episodes"] == K and summary["agents"] == M
    uploads = [r for r in comm if r["kind"] == "upload"]
    assert len(uploads) == K and all(int(r["accepted"]) for r in uploads)
    assert summary["bytes_up"] == K * upload_bytes(H)
    assert summary["bytes_down"] == K * M * DOWNLOAD_BYTES
    assert summary["regret"] == pytest.approx(sum(float(r["regret"]) for r in metrics))
    assert summary["transitions_received"] == K * H


def test_independent_learners_send_nothing(tmp_path):
    summary, metrics, comm = run(tmp_path, "algorithm.name=lsvi_ucb_independent")
    assert summary["comm_rounds"] == 0 and summary["bytes_up"] == 0 and summary["bytes_down"] == 0
    assert comm == [] and len(metrics) == K
    assert sorted({int(r["agent"]) for r in metrics}) == list(range(M))


def test_async_uploads_are_counted_by_the_ledger_with_their_real_sizes(tmp_path):
    summary, metrics, comm = run(tmp_path, "algorithm.name=async_coop_lsvi", "algorithm.alpha=0.5")
    uploads = [r for r in comm if r["kind"] == "upload"]
    downloads = [r for r in comm if r["kind"] == "statistics"]
    assert 0 < len(uploads) < K and summary["comm_rounds"] == len(uploads)
    # each upload is answered by one download to the uploader only
    assert [r["src"] for r in uploads] == [r["dst"] for r in downloads]
    assert summary["bytes_down"] == len(uploads) * DOWNLOAD_BYTES
    n = summary["transitions_received"]
    assert summary["bytes_up"] == len(uploads) * upload_bytes(0) + n * (16 + 8)
    assert n % H == 0 and n <= K * H
    assert summary["alpha"] == 0.5
    assert summary["comm_rounds_theory"] == pytest.approx(D * H * M ** 2 * np.log(K))


def test_async_default_alpha_is_one_over_m_squared_and_coop_runs(tmp_path):
    summary, _, _ = run(tmp_path, "algorithm.name=async_coop_lsvi")
    assert summary["alpha"] == pytest.approx(1 / M ** 2)
    summary, _, comm = run(tmp_path / "coop", "algorithm.name=coop_lsvi", "algorithm.sync_threshold=0.2")
    uploads = [r for r in comm if r["kind"] == "upload"]
    downloads = [r for r in comm if r["kind"] == "statistics"]
    assert summary["comm_rounds"] == len(uploads) > 0
    assert summary["bytes_down"] == len(downloads) * DOWNLOAD_BYTES
    # a sync-starting upload is answered to all M agents, an answering upload to its sender only
    started, rest = divmod(len(downloads) - len(uploads), M - 1)
    assert rest == 0 and 0 < started <= len(uploads)


@pytest.mark.parametrize("schedule", ["round_robin", "zipf"])
def test_schedules_choose_the_active_agent(tmp_path, schedule):
    _, metrics, _ = run(tmp_path, f"backend.schedule={schedule}", "algorithm.name=lsvi_ucb_independent")
    agents = [int(r["agent"]) for r in metrics]
    if schedule == "round_robin":
        assert agents == [k % M for k in range(K)]
    else:  # zipf: agent 0 plays most often
        counts = np.bincount(agents, minlength=M)
        assert counts[0] == counts.max()


def test_same_seed_reproduces_the_run_exactly(tmp_path):
    first, m1, _ = run(tmp_path / "a", "algorithm.name=async_coop_lsvi")
    second, m2, _ = run(tmp_path / "b", "algorithm.name=async_coop_lsvi")
    assert first["regret"] == second["regret"] and first["comm_rounds"] == second["comm_rounds"]
    assert [r["regret"] for r in m1] == [r["regret"] for r in m2]


@pytest.mark.parametrize("override, key", [
    ("scenario.d=0", "scenario.d"), ("scenario.n_states=-2", "scenario.n_states"),
    ("scenario.n_actions=0", "scenario.n_actions"), ("scenario.horizon=0", "scenario.horizon"),
    ("backend.workers=0", "backend.workers"), ("algorithm.alpha=0", "algorithm.alpha"),
    ("algorithm.alpha=-1", "algorithm.alpha"), ("algorithm.beta_scale=-0.5", "algorithm.beta_scale"),
    ("backend.schedule=bursty", "backend.schedule"), ("algorithm.lam=0", "algorithm.lam"),
])
def test_bad_input_exits_2_naming_the_key(tmp_path, capsys, override, key):
    code = marlq(["run", CONFIG, "--quiet", "--out", str(tmp_path / "bad"), "--set", override])
    assert code == 2
    assert key in capsys.readouterr().err
