"""Seeds as a batch dimension (``agents.batched_a2c``, ``marlq sweep --batch-seeds``): a batched seed's
run files equal the single-seed run's bytes; the batched CartPole and the stacked mlp heads against
their single-copy references; what cannot be batched exits 2 naming the key, with nothing written."""
from __future__ import annotations

import filecmp
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch

from agents.batched_a2c import (BATCHED_SNAPSHOT, CartPoleBatch, StackedMLP, batch_jobs, check_batchable, resume_batched_seeds,
                                run_batched_seeds)
from agents.heads import FlatParameters
from agents.numpy_heads import NumpyMLP
from marl_q.cli import main
from marl_q.config import load_config
from marl_q.errors import CheckpointError, ConfigError
from marl_q.experiment import resume_experiment, run_experiment, snapshot_kind
from marl_q.rundir import checkpoints, load_checkpoint

ROOT = Path(__file__).resolve().parents[2]
QA2C = ROOT / "scenarios" / "cartpole_qa2c.yaml"
FILES = ("metrics.csv", "train.csv", "comm.csv", "quantum.csv", "config.yaml")


def single(config: Path, seed: int, overrides: list[str], out: Path) -> dict:
    cfg = load_config(config, overrides, seed=seed)
    cfg.run.progress = False  # as `marlq run --quiet`, what a sweep runs
    return run_experiment(cfg, out)


def assert_same_run_files(a: Path, b: Path) -> None:
    compared = 0
    for name in FILES:
        assert (a / name).exists() == (b / name).exists(), name
        if (a / name).exists():
            assert filecmp.cmp(a / name, b / name, shallow=False), f"{name} differs between {a} and {b}"
            compared += 1
    assert compared >= 4


@pytest.mark.parametrize("config, steps, extra", [
    ("cartpole_qa2c.yaml", 700, []),
    ("cartpole_qa2c_quantum_critic.yaml", 150, []),
    # the circuit heads' counts are added up per seed and read at episode ends and checkpoints: a
    # checkpoint every 40 updates reads them between episode ends (quantum.csv, the checkpoint's state)
    ("cartpole_qa2c_quantum_actor.yaml", 150, ["run.checkpoint_every=40", "run.keep_checkpoints=5"]),
])
def test_batched_seeds_write_the_single_seed_runs_bytes(tmp_path, config, steps, extra):
    path = ROOT / "scenarios" / config
    overrides = [f"run.total_env_steps={steps}", "run.plots=false", *extra]
    seeds = [0, 3, 1]  # any seeds, in any order
    summaries = run_batched_seeds(str(path), overrides, seeds, [tmp_path / f"b{s}" for s in seeds], progress=False)
    assert [s["seed"] for s in summaries] == seeds
    for seed, got in zip(seeds, summaries):
        want = single(path, seed, overrides, tmp_path / f"s{seed}")
        assert_same_run_files(tmp_path / f"b{seed}", tmp_path / f"s{seed}")
        drop = ("wall_s",)
        assert {k: v for k, v in got.items() if k not in drop} == {k: v for k, v in want.items() if k not in drop}
        mine = sorted((tmp_path / f"b{seed}" / "checkpoints").glob("*.npz"))
        theirs = sorted((tmp_path / f"s{seed}" / "checkpoints").glob("*.npz"))
        assert [p.name for p in mine] == [p.name for p in theirs]
        for path_a, path_b in zip(mine, theirs):
            (a, meta_a), (b, meta_b) = load_checkpoint(path_a), load_checkpoint(path_b)
            assert a.keys() == b.keys()
            for key in b:
                assert np.array_equal(a[key], b[key]), (path_a.name, key)
            for key in ("updates", "env_steps", "episodes", "t", "ledger", "quantum"):
                assert meta_a.get(key) == meta_b.get(key), (path_a.name, key)
            # train.csv's state; a position's second number is its wall-clock sidecar's length (not data)
            train_a, train_b = dict(meta_a["train"]), dict(meta_b["train"])
            assert train_a.pop("position")[0] == train_b.pop("position")[0] and train_a == train_b, path_a.name


def test_a_batched_seed_resumes_from_its_checkpoint(tmp_path):
    """A batched seed's final checkpoint holds the server state without a snapshot (its last push was
    never delivered): `marlq resume` extends it with a fresh worker (the run goes on to its new budget)."""
    overrides = ["run.total_env_steps=300", "run.plots=false"]
    run_batched_seeds(str(QA2C), overrides, [0, 1], [tmp_path / "b0", tmp_path / "b1"], progress=False)
    assert main(["resume", str(tmp_path / "b0"), "--set", "run.total_env_steps=500", "--quiet"]) == 0
    import json

    summary = json.loads((tmp_path / "b0" / "summary.json").read_text())
    assert summary["env_steps"] == 500 and summary["status"] == "completed"
    assert summary["resumes"][0]["exact"] is False


def _killed_after(run_dir: Path, updates: int) -> None:
    """Make ``run_dir`` look like a run killed some steps after its checkpoint at ``updates``: no summary,
    no newer checkpoint (its files keep the rows written after the checkpoint, which a resume cuts)."""
    (run_dir / "summary.json").unlink()
    for path in checkpoints(run_dir):
        if int(path.name.split(".")[0].split("_")[1]) > updates:
            path.unlink()
            path.with_name(path.name.replace(".npz", ".sim.pkl")).unlink(missing_ok=True)


@pytest.mark.parametrize("config, steps, every, stop", [
    ("cartpole_qa2c.yaml", 500, 70, 210),
    # circuit heads: their counts are read at the checkpoint, and the Gumbel block is mid-way (140 % 256)
    ("cartpole_qa2c_quantum_actor.yaml", 200, 40, 120),
])
def test_batched_seeds_resume_exactly_from_a_periodic_checkpoint(tmp_path, config, steps, every, stop):
    """Seeds stopped after a periodic checkpoint and continued side by side write, byte for byte, the
    files of the batched run that was never stopped (hence the single-seed runs' too)."""
    import shutil

    path = str(ROOT / "scenarios" / config)
    overrides = [f"run.total_env_steps={steps}", "run.plots=false", f"run.checkpoint_every={every}",
                 "run.keep_checkpoints=20"]
    seeds = [0, 2, 5]
    run_batched_seeds(path, overrides, seeds, [tmp_path / f"whole{s}" for s in seeds], progress=False)
    for s in seeds:
        shutil.copytree(tmp_path / f"whole{s}", tmp_path / f"cut{s}")
        _killed_after(tmp_path / f"cut{s}", stop)
        _, meta = load_checkpoint(checkpoints(tmp_path / f"cut{s}")[-1])
        assert meta["updates"] == stop and snapshot_kind(meta) == BATCHED_SNAPSHOT
    summaries = resume_batched_seeds([tmp_path / f"cut{s}" for s in seeds], progress=False)
    for s, summary in zip(seeds, summaries):
        assert summary["status"] == "completed" and summary["seed"] == s
        assert summary["resumes"] == [{"from": f"ckpt_{stop}.npz", "updates": stop,
                                       "env_steps": summary["resumes"][0]["env_steps"], "exact": True}]
        assert_same_run_files(tmp_path / f"cut{s}", tmp_path / f"whole{s}")
        assert (tmp_path / f"cut{s}" / "resume_backup_1" / "comm.csv").is_file()  # the rows it cut are kept


def test_marlq_resume_and_the_sweep_continue_batched_seeds_exactly(tmp_path, capsys):
    """`marlq resume SEED_DIR` continues one batched seed as a batch of one; `marlq sweep --batch-seeds`
    continues a cell's stopped seeds in one batched process; both exactly. The sim backend's resume
    refuses a batched snapshot with one line naming `marlq resume`."""
    import shutil

    out = tmp_path / "sw"
    args = ["sweep", str(QA2C), "--seeds", "3", "--batch-seeds", "--jobs", "1", "--out", str(out), "--no-plot",
            "--set", "run.total_env_steps=400", "--set", "run.plots=false", "--set", "run.checkpoint_every=50",
            "--set", "run.keep_checkpoints=20"]
    assert main(args) == 0
    shutil.copytree(out, tmp_path / "whole")
    for s in (0, 2):
        _killed_after(out / "base" / f"seed{s}", 150)
    capsys.readouterr()
    assert main(args) == 0
    said = capsys.readouterr().out
    assert said.count("resuming it with its batch") == 2 and "1 already complete, 2 to run" in said
    for s in (0, 1, 2):
        assert_same_run_files(out / "base" / f"seed{s}", tmp_path / "whole" / "base" / f"seed{s}")
    one = out / "base" / "seed1"
    with pytest.raises(CheckpointError, match="batched_a2c.* continue it with `marlq resume"):
        resume_experiment(one, checkpoint=Path("ckpt_100.npz"))
    assert main(["resume", str(one), "--from", "ckpt_100.npz", "--quiet"]) == 0
    assert_same_run_files(one, tmp_path / "whole" / "base" / "seed1")


def test_seeds_resumed_together_must_be_one_configuration_at_one_update(tmp_path):
    import shutil

    base = ["run.plots=false", "run.checkpoint_every=30", "run.keep_checkpoints=20"]
    run_batched_seeds(str(QA2C), ["run.total_env_steps=200", *base], [0, 1], [tmp_path / "a0", tmp_path / "a1"],
                      progress=False)
    run_batched_seeds(str(QA2C), ["run.total_env_steps=200", "algorithm.lr=0.001", *base], [2], [tmp_path / "c2"],
                      progress=False)
    for name, stop in (("a0", 90), ("a1", 60), ("c2", 90)):
        shutil.copytree(tmp_path / name, tmp_path / f"k{name}")
        _killed_after(tmp_path / f"k{name}", stop)
    with pytest.raises(CheckpointError, match="different updates \\(60, 90\\)"):
        resume_batched_seeds([tmp_path / "ka0", tmp_path / "ka1"], progress=False)
    with pytest.raises(ConfigError, match="not one configuration"):
        resume_batched_seeds([tmp_path / "ka0", tmp_path / "kc2"], progress=False)


def test_cartpole_batch_steps_each_copy_as_gymnasium_does():
    """Independent reference: one Gymnasium CartPole vector env (num_envs 1) per seed, stepped alone
    with the same actions, through many resets."""
    seeds = [11, 12, 13, 14]
    make = lambda: gym.make_vec("CartPole-v1", num_envs=1, vectorization_mode="vector_entry_point",
                                max_episode_steps=40)
    ref = [make() for _ in seeds]
    mine = [make() for _ in seeds]
    ref_obs = [e.reset(seed=s)[0] for e, s in zip(ref, seeds)]
    for e, s in zip(mine, seeds):
        e.reset(seed=s)
    batch = CartPoleBatch(mine)
    assert np.array_equal(batch.state.T.astype(np.float32), np.concatenate(ref_obs))  # the same first states
    rng = np.random.default_rng(0)
    resets = 0
    for _ in range(400):
        actions = rng.integers(0, 2, size=len(seeds))
        obs, rew, term, trunc = batch.step(actions)
        for i, env in enumerate(ref):
            o, r, te, tr, _ = env.step(actions[i:i + 1])
            assert np.array_equal(o[0], obs[i]) and r[0] == rew[i] and te[0] == term[i] and tr[0] == trunc[i]
            resets += bool(te[0] or tr[0])
    assert resets > 20  # terminations and truncations (40 steps) both happened


def test_stacked_mlp_equals_numpy_mlp_per_seed():
    """Forward and backward of every seed's row against ``NumpyMLP`` on that seed's own module."""
    torch.manual_seed(0)
    nets = [torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.Tanh(), torch.nn.Linear(6, 5), torch.nn.ReLU(),
                                torch.nn.Linear(5, 3)) for _ in range(5)]
    flats = [FlatParameters(n) for n in nets]
    params = np.stack([f.numpy() for f in flats])
    stacked = StackedMLP(nets[0], 0)
    assert stacked.end == params.shape[1]
    rng = np.random.default_rng(1)
    x = rng.normal(size=(5, 2, 4))
    g = rng.normal(size=(5, 2, 3))
    out, cache = stacked.forward(params, x)
    grads = np.zeros_like(params)
    stacked.backward(params, cache, g, grads)
    for s, (net, flat) in enumerate(zip(nets, flats)):
        twin = NumpyMLP(net)
        want, c = twin.forward(x[s])
        assert np.array_equal(out[s], want)
        flat.zero_grad()
        twin.backward(c, g[s])
        assert np.array_equal(grads[s], flat.grad_numpy())


@pytest.mark.parametrize("override, key", [
    ("backend.workers=2", "backend.workers"),
    ("algorithm.name=ppo", "algorithm.name"),
    ("algorithm.n_steps=5", "algorithm.n_steps"),
    ("backend.network.jitter=0.1", "backend.network.jitter"),
    ("algorithm.max_grad_norm=0.5", "algorithm.max_grad_norm"),
    ("run.eval_every=1000", "run.eval_every"),
])
def test_sweep_batch_seeds_refuses_what_it_cannot_batch(tmp_path, capsys, override, key):
    out = tmp_path / "sw"
    assert main(["sweep", str(QA2C), "--seeds", "2", "--batch-seeds", "--out", str(out), "--set", override,
                 "--set", "run.total_env_steps=100"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("marlq: error: --batch-seeds: ") and f"{key}=" in err[0], err
    assert not out.exists()


def test_the_torch_path_is_refused_by_name():
    cfg = load_config(QA2C, ["algorithm.fast_path=false"], seed=0)
    with pytest.raises(ConfigError, match=r"algorithm\.fast_path=False"):
        check_batchable(cfg)


def test_sweep_jobs_deal_the_seeds_round_robin(tmp_path):
    jobs = batch_jobs("c.yaml", ["run.total_env_steps=10"], [0, 1, 2, 3, 4], tmp_path, 2)
    assert [j[0].name for j in jobs] == ["batch0", "batch1"]
    seeds = [cmd[cmd.index("--seeds") + 1] for _, cmd in jobs]
    assert seeds == ["0,2,4", "1,3"]
    assert all(cmd[-2:] == ["--set", "run.total_env_steps=10"] for _, cmd in jobs)
    assert len(batch_jobs("c.yaml", [], [7], tmp_path, 4)) == 1


def test_sweep_batch_seeds_writes_every_seed_and_a_rerun_skips_them(tmp_path, capsys):
    out = tmp_path / "sw"
    args = ["sweep", str(QA2C), "--seeds", "3", "--batch-seeds", "--jobs", "2", "--out", str(out), "--no-plot",
            "--set", "run.total_env_steps=150", "--set", "run.plots=false"]
    assert main(args) == 0
    assert "3 runs in" in capsys.readouterr().out
    single(QA2C, 2, ["run.total_env_steps=150", "run.plots=false"], tmp_path / "s2")
    assert_same_run_files(out / "base" / "seed2", tmp_path / "s2")
    assert sorted(p.name for p in (out / "base").iterdir() if p.is_dir()) == ["seed0", "seed1", "seed2"]
    assert main(args) == 0
    assert "3 already complete, 0 to run" in capsys.readouterr().out


def test_a_batched_run_shows_the_one_progress_bar(tmp_path, capsys):
    """Every seed's env steps against their budgets, through marl_q.progress (rate and ETA)."""
    run_batched_seeds(str(QA2C), ["run.total_env_steps=200", "run.plots=false"], [0, 1],
                      [tmp_path / "b0", tmp_path / "b1"], progress=True)
    err = capsys.readouterr().err
    assert "2 seeds of a2c on cartpole" in err
    assert "400/400" in err and "step/s" in err
