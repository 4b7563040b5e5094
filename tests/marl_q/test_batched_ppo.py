"""Batched seeds of the team learners (``agents.batched_ppo``, ``marlq sweep --batch-seeds`` on MAPPO/IPPO):
each seed's first update equals its single run's to float32 tolerance (the rollout, the samples and the
value normalisation are the single run's code, so those are equal exactly); a batched run writes every
seed's run directory with the single run's files, config and pre-update episodes byte for byte; the
per-row gradient clip against ``nn.utils.clip_grad_norm_``; what cannot be batched exits 2 naming the key."""
from __future__ import annotations

import copy
import csv
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from agents.batched_a2c import run_batched_seeds
from agents.batched_ppo import SeedBatch, clip_rows
from agents.mappo import TeamWorker
from marl_q.cli import main
from marl_q.config import load_config
from marl_q.experiment import run_experiment

ROOT = Path(__file__).resolve().parents[2]
SPREAD = ROOT / "scenarios" / "spread_mappo.yaml"
SMALL = ["algorithm.envs_per_worker=2", "run.eval_every=null", "run.plots=false"]


def _worker(seed: int, overrides: list[str]) -> TeamWorker:
    return TeamWorker(load_config(SPREAD, overrides, seed=seed), 0)


@pytest.mark.parametrize("extra", [
    ["algorithm.epochs=3"],  # MAPPO as shipped (10 epochs cut to 3, one minibatch, value normalisation, clips)
    ["algorithm.epochs=3", "algorithm.name=ippo", "algorithm.minibatches=4"],  # each seed's own permutations
    ["algorithm={name: maa2c, envs_per_worker: 2}"],  # one pass, the gradient pushed (no worker optimizer)
])
def test_first_update_of_batched_seeds_equals_each_single_run(extra):
    overrides = SMALL + extra
    seeds = [0, 5, 2]
    alone = [_worker(s, overrides) for s in seeds]
    batched = [_worker(s, overrides) for s in seeds]
    batches = []
    for a, b in zip(alone, batched):
        batch_a, _, _ = a.rollout()
        batch_b, _, _ = b.rollout()
        for key in batch_a:  # the rollouts are the single run's code: equal exactly
            assert np.array_equal(batch_a[key], batch_b[key]), key
        batches.append(batch_b)
    want = [w.learn(batch) for w, batch in zip(alone, batches)]
    got = SeedBatch().run([lambda w=w, batch=batch: w.learn(batch) for w, batch in zip(batched, batches)])
    for a, b, d_want, d_got in zip(alone, batched, want, got):
        np.testing.assert_allclose(b.flat.numpy(), a.flat.numpy(), rtol=1e-5, atol=2e-6)
        np.testing.assert_allclose(b.flat.grad_numpy(), a.flat.grad_numpy(), rtol=1e-3, atol=1e-5)
        if a.optimizer is not None:
            sa, sb = a.optimizer.state_dict(), b.optimizer.state_dict()
            assert sorted(sa) == sorted(sb)
            for key in sa:  # (the moments: the gradients' float32 rounding, held to 1e-3 above, and its square)
                np.testing.assert_allclose(sb[key].numpy(), sa[key].numpy(), rtol=2e-3, atol=1e-9)
        if a.value_norm is not None:  # the statistics are taken in by the single run's code
            assert (a.value_norm.mean, a.value_norm.mean_sq, a.value_norm.debias) == \
                (b.value_norm.mean, b.value_norm.mean_sq, b.value_norm.debias)
        assert d_got.keys() == d_want.keys()
        for key, value in d_want.items():
            if value is None:
                assert d_got[key] is None, key
            else:
                assert d_got[key] == pytest.approx(value, rel=1e-4, abs=1e-6), key
    # and the seeds did learn something different from each other
    assert not np.allclose(batched[0].flat.numpy(), batched[1].flat.numpy())


def test_clip_rows_scales_each_row_as_clip_grad_norm():
    g = torch.randn(4, 50, dtype=torch.float64) * torch.tensor([0.01, 1.0, 3.0, 10.0], dtype=torch.float64)[:, None]
    got = clip_rows(g, 2.0)
    for s in range(4):
        p = nn.Parameter(torch.zeros(50, dtype=torch.float64))
        p.grad = g[s].clone()
        nn.utils.clip_grad_norm_([p], 2.0)
        assert torch.allclose(got[s], p.grad, rtol=1e-12, atol=0.0)


def test_a_failing_seed_stops_the_batch_and_its_error_is_raised():
    def boom() -> None:
        raise ValueError("seed 1 failed")

    with pytest.raises(ValueError, match="seed 1 failed"):
        SeedBatch().run([lambda: 1, boom, lambda: 3])


def _rows(path: Path) -> list[list[str]]:
    with open(path, newline="") as fh:
        return list(csv.reader(fh))


def test_batched_run_writes_each_seeds_run_directory_as_alone(tmp_path):
    overrides = SMALL + ["algorithm.epochs=3", "run.total_env_steps=300"]  # six updates of 50 env steps
    seeds = [1, 0]
    summaries = run_batched_seeds(str(SPREAD), overrides, seeds, [tmp_path / f"b{s}" for s in seeds], progress=False)
    assert [s["seed"] for s in summaries] == seeds
    for seed, got in zip(seeds, summaries):
        cfg = load_config(SPREAD, overrides, seed=seed)
        cfg.run.progress = False
        want = run_experiment(cfg, tmp_path / f"s{seed}")
        b, s = tmp_path / f"b{seed}", tmp_path / f"s{seed}"
        assert sorted(p.name for p in b.iterdir()) == sorted(p.name for p in s.iterdir())
        assert (b / "config.yaml").read_bytes() == (s / "config.yaml").read_bytes()
        for name in ("metrics.csv", "train.csv", "comm.csv", "returns.csv"):
            rb, rs = _rows(b / name), _rows(s / name)
            assert rb[0] == rs[0] and len(rb) == len(rs), name
        # the first episodes (their first 25 steps at the initial parameters, the rest after the first
        # update, equal to float32 tolerance: no sampled action flips) are the single run's, byte for byte
        mb, ms = _rows(b / "metrics.csv"), _rows(s / "metrics.csv")
        version = mb[0].index("version")
        first = [r for r in ms[1:] if r[version] == "1"]
        assert len(first) == 2 and [r for r in mb[1:] if r[version] == "1"] == first
        # the first update's train.csv row: the same counters, the losses to float32 tolerance
        tb, ts = _rows(b / "train.csv")[1], _rows(s / "train.csv")[1]
        assert tb[:6] == ts[:6]
        for x, y in zip(tb[6:], ts[6:]):
            assert (x == y == "") or float(x) == pytest.approx(float(y), rel=1e-4, abs=1e-6)
        assert (b / "comm.csv").read_bytes() == (s / "comm.csv").read_bytes()  # the clock and the ledger
        drop = ("wall_s", "final_return", "best_return", "mean_return", "last_100_mean", "returns")
        assert {k: v for k, v in got.items() if k not in drop} .keys() == {k for k in want if k not in drop}
        assert got["env_steps"] == want["env_steps"] and got["episodes"] == want["episodes"]
        assert json.loads((b / "summary.json").read_text())["status"] == "completed"


@pytest.mark.parametrize("override, key", [
    ("backend.workers=2", "backend.workers"),
    ("actor.recurrent=gru", "actor.recurrent"),
    ("algorithm.share_params=false", "algorithm.share_params"),
    ("backend.name=local", "backend.name"),
])
def test_sweep_batch_seeds_refuses_team_runs_it_cannot_batch(tmp_path, capsys, override, key):
    out = tmp_path / "sw"
    assert main(["sweep", str(SPREAD), "--seeds", "2", "--batch-seeds", "--out", str(out), "--set", override,
                 "--set", "run.total_env_steps=100"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("marlq: error: --batch-seeds: ") and f"{key}=" in err[0], err
    assert not out.exists()


def test_a_batched_seed_resumes_alone_from_its_snapshot(tmp_path):
    overrides = SMALL + ["algorithm.epochs=2", "run.total_env_steps=150"]
    run_batched_seeds(str(SPREAD), overrides, [0, 1], [tmp_path / "b0", tmp_path / "b1"], progress=False)
    assert list((tmp_path / "b1" / "checkpoints").glob("*.sim.pkl"))  # the sim snapshot, as a single run's
    assert main(["resume", str(tmp_path / "b1"), "--quiet", "--set", "run.total_env_steps=300"]) == 0
    summary = json.loads((tmp_path / "b1" / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["env_steps"] >= 300
    assert [r["exact"] for r in summary["resumes"]] == [True]


def test_a_batched_team_run_shows_one_bar_over_every_seeds_steps(tmp_path, capsys):
    """The seeds' runs are quiet in their threads; their counted env steps feed one marl_q.progress bar
    (``tap_runs``) over the seeds' budgets (2 x 100), which ends at every step the runs counted (each run
    ends with the rollout that passes its budget, so past 200, as a single run's bar ends past its own)."""
    from agents.batched_ppo import run_batched_team_seeds

    summaries = run_batched_team_seeds(str(SPREAD), SMALL + ["algorithm.epochs=1", "run.total_env_steps=100"], [0, 1],
                                       [tmp_path / "b0", tmp_path / "b1"], progress=True)
    err = capsys.readouterr().err
    steps = sum(s["env_steps"] for s in summaries)
    assert "2 seeds of mappo on spread" in err and "step/s" in err
    assert "/200 [" in err and steps > 200 and f"{steps}step [" in err  # every step each run counted, via the tap
