"""train.csv: every actor-critic learner writes one row per update the server takes in, with its losses,
entropy, approx KL, clip fraction and explained variance; the diagnostics ride outside the ledger's
bytes; a sim rerun writes the same bytes; resume continues the file; TensorBoard shows CleanRL's tags."""
from __future__ import annotations

import csv
import math
from pathlib import Path

import numpy as np
import pytest

from marl_q.config import build_config, load_config
from marl_q.experiment import resume_experiment, run_experiment
from marl_q.metrics import DIAGNOSTICS, TRAIN_BASE, TRAIN_FIELDS

ROOT = Path(__file__).resolve().parents[2]
QUIET = ["run.progress=false", "run.plots=false", "run.checkpoint_every=0"]
SPREAD = ["scenario={name: spread, n_agents: 2, max_cycles: 10}", "actor={head: mlp, hidden: [16]}",
          "critic={head: mlp, hidden: [16]}"]

# learner family -> (scenario file, overrides, the columns a row may leave empty)
FAMILIES = {
    "a3c": ("cartpole_a3c.yaml", ["run.total_env_steps=800"], {"clipfrac"}),
    "a2c_sync": ("cartpole_a2c_sync.yaml", ["run.total_env_steps=800"], {"clipfrac"}),
    # one step per update through the numpy heads: a single sample has no explained variance
    "a2c_one_step": ("cartpole_qa2c.yaml", ["run.total_env_steps=150"], {"clipfrac", "explained_variance"}),
    "ppo": ("cartpole_a3c.yaml", ["algorithm={name: ppo, n_steps: 16, epochs: 2, minibatches: 2}",
                                  "run.total_env_steps=800"], set()),
    "ppo_gaussian": ("cartpole_a3c.yaml", ["scenario={name: gymnasium, env: Pendulum-v1, num_envs: 2}",
                                           "algorithm={name: ppo, n_steps: 16, epochs: 2, minibatches: 2}",
                                           "run.total_env_steps=400"], set()),
    "mappo": ("cartpole_a3c.yaml", SPREAD + ["algorithm={name: mappo, envs_per_worker: 2, n_steps: 5, epochs: 2, "
                                             "minibatches: 2}", "run.total_env_steps=300"], set()),
    "ippo": ("cartpole_a3c.yaml", SPREAD + ["algorithm={name: ippo, envs_per_worker: 2, n_steps: 5, epochs: 2}",
                                            "run.total_env_steps=300"], set()),
    "ia2c": ("cartpole_a3c.yaml", SPREAD + ["algorithm={name: ia2c, envs_per_worker: 2, n_steps: 5}",
                                            "run.total_env_steps=300"], {"clipfrac"}),
    "maa2c": ("cartpole_a3c.yaml", SPREAD + ["algorithm={name: maa2c, envs_per_worker: 2, n_steps: 5}",
                                             "run.total_env_steps=300"], {"clipfrac"}),
    "coma": ("team_cue_coma.yaml", ["run.total_env_steps=600"], {"clipfrac"}),
    "iac": ("team_cue_coma.yaml", ["algorithm.name=iac", "run.total_env_steps=600"], {"clipfrac"}),
    "central_v": ("team_cue_coma.yaml", ["algorithm.name=central_v", "run.total_env_steps=600"], {"clipfrac"}),
    "routing_ppo": ("routing_amarl.yaml", ["algorithm.n_steps=32", "algorithm.eval_days=0.02",
                                           "run.total_env_steps=300"], set()),
    "vehicular_a3c": ("vehicular_a3c.yaml", ["run.total_env_steps=200"], {"clipfrac"}),
}


def _cfg(name: str, overrides: list[str]):
    return load_config(str(ROOT / "scenarios" / name), QUIET + overrides)


@pytest.fixture(scope="module")
def family_run(tmp_path_factory: pytest.TempPathFactory):
    """``family_run(family)``: (summary, run directory) of the family's run (FAMILIES), run once for the module:
    the diagnostics test reads it, and the resume and TensorBoard tests compare against it as their
    uninterrupted (or TensorBoard-off) run, which is the same config and seed, so on sim the same bytes."""
    runs: dict[str, tuple[dict, Path]] = {}

    def get(family: str) -> tuple[dict, Path]:
        if family not in runs:
            name, overrides, _ = FAMILIES[family]
            out = tmp_path_factory.mktemp(family) / "run"
            runs[family] = run_experiment(_cfg(name, overrides), out), out
        return runs[family]

    return get


def read_rows(path: Path) -> tuple[list[str], list[dict[str, str]]]:
    with open(path, newline="") as fh:
        reader = csv.DictReader(fh)
        return list(reader.fieldnames or []), list(reader)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_every_actor_critic_learner_writes_finite_diagnostics_per_update(family: str, family_run) -> None:
    _, _, empty = FAMILIES[family]
    summary, run_dir = family_run(family)
    header, rows = read_rows(run_dir / "train.csv")
    assert header == TRAIN_BASE + TRAIN_FIELDS
    assert rows, f"{family}: no update was written"
    assert [int(r["update"]) for r in rows] == list(range(1, len(rows) + 1))
    # an update whose rollout holds no step to learn from (a one-step rollout that only reset its
    # episode) measures nothing: its cells are empty
    blank = [r for r in rows if all(r[k] == "" for k in DIAGNOSTICS)]
    assert len(blank) <= len(rows) // 10
    for r in rows:
        if r in blank:
            continue
        for key in DIAGNOSTICS:
            if r[key] == "":
                assert key in empty, f"{family}: {key} empty"
            else:
                assert math.isfinite(float(r[key])), f"{family}: {key} = {r[key]}"
        assert float(r["value_loss"]) >= 0 and float(r["entropy"]) >= 0 and float(r["approx_kl"]) >= -1e-7
        if r["clipfrac"] != "":
            assert 0.0 <= float(r["clipfrac"]) <= 1.0
    steps = [int(r["env_steps"]) for r in rows]
    assert steps == sorted(steps) and steps[-1] <= summary["env_steps"]
    assert [int(r["version"]) for r in rows] == sorted(int(r["version"]) for r in rows)
    wall_header, walls = read_rows(run_dir / "train_wall.csv")
    assert wall_header == ["update", "wall_s"] and [w["update"] for w in walls] == [r["update"] for r in rows]


def test_a_row_per_applied_update_and_the_diagnostics_are_not_in_the_ledgers_bytes(small_raw, tmp_path: Path) -> None:
    """A3C (hogwild): one row per accepted gradient, at the version that gradient made; each gradient's
    row in comm.csv counts its float32 payload only (4 bytes a parameter), as before train.csv."""
    summary = run_experiment(build_config(small_raw), tmp_path / "run")
    _, rows = read_rows(tmp_path / "run" / "train.csv")
    _, comm = read_rows(tmp_path / "run" / "comm.csv")
    grads = [c for c in comm if c["kind"] == "grad" and c["accepted"] == "1"]
    assert len(rows) == len(grads) == summary["updates"]
    assert [(r["worker"], int(r["version"]), r["staleness"]) for r in rows] == \
        [(c["src"], int(c["server_version"]) + 1, c["staleness"]) for c in grads]
    n_params = summary["actor_params"] + summary["critic_params"]
    assert {int(c["bytes"]) for c in grads} == {4 * n_params}


def test_stale_and_lost_updates_write_no_row(small_raw, tmp_path: Path) -> None:
    """Updates the server drops (stale, lost on the way, duplicated) have no row: only accepted ones do."""
    small_raw["server"]["max_staleness"] = 1
    small_raw["backend"]["compute"] = {"jitter": 0.5, "stragglers": [1], "straggler_factor": 4.0}
    small_raw["backend"]["faults"] = {"loss": 0.1, "duplicate": 0.2}
    run_experiment(build_config(small_raw), tmp_path / "run")
    _, rows = read_rows(tmp_path / "run" / "train.csv")
    _, comm = read_rows(tmp_path / "run" / "comm.csv")
    grads = [c for c in comm if c["kind"] == "grad" and c["dst"] == "server"]
    refused = [c for c in grads if c["accepted"] == "0"]
    assert any(c["reason"].startswith("stale:") for c in refused)  # the case is exercised
    assert len(rows) == len(grads) - len(refused)


def test_a_sim_rerun_writes_the_same_train_csv(tmp_path: Path) -> None:
    name, overrides, _ = FAMILIES["ppo"]
    for out in ("a", "b"):
        run_experiment(_cfg(name, overrides + ["backend.compute.jitter=0.3"]), tmp_path / out)
    assert (tmp_path / "a" / "train.csv").read_bytes() == (tmp_path / "b" / "train.csv").read_bytes()


@pytest.mark.parametrize("family,stop_at", [("ppo", 2), ("coma", 20), ("routing_ppo", 130)])
def test_resume_continues_train_csv_as_if_never_stopped(family: str, stop_at: int, tmp_path: Path, family_run) -> None:
    name, overrides, _ = FAMILIES[family]
    _, full_dir = family_run(family)  # the uninterrupted run
    part = run_experiment(_cfg(name, overrides + [f"run.stop_after_updates={stop_at}"]), tmp_path / "part")
    assert part["status"] == "stopped"
    stopped = (tmp_path / "part" / "train.csv").read_bytes()
    resume_experiment(tmp_path / "part")
    full = (full_dir / "train.csv").read_bytes()
    assert (tmp_path / "part" / "train.csv").read_bytes() == full and len(full) > len(stopped)


def test_resume_cuts_rows_written_after_the_checkpoint(small_raw, tmp_path: Path) -> None:
    """A session that went on past its last checkpoint (killed, say): its later rows are cut on resume,
    as metrics.csv's are, and the file goes on from the checkpoint."""
    small_raw["run"]["checkpoint_every"] = 4
    run_experiment(build_config(small_raw), tmp_path / "full")
    small_raw["run"]["stop_after_updates"] = 8
    run_experiment(build_config(small_raw), tmp_path / "part")
    with open(tmp_path / "part" / "train.csv", "a") as fh:  # what a session killed after its checkpoint wrote
        fh.write("9.0,w0,999,9,9,0,0.1,0.1,0.1,0.0,,0.5\n")
    resume_experiment(tmp_path / "part")
    assert (tmp_path / "part" / "train.csv").read_bytes() == (tmp_path / "full" / "train.csv").read_bytes()


def test_tensorboard_has_cleanrls_loss_tags(small_raw, tmp_path: Path, family_run) -> None:
    pytest.importorskip("tensorboard", reason="needs the [tensorboard] extra (pip install 'marl-q[tensorboard]')")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    name, overrides, _ = FAMILIES["ppo"]
    run_experiment(_cfg(name, overrides + ["run.tensorboard=true"]), tmp_path / "on")
    _, off = family_run("ppo")  # the same config without TensorBoard
    assert (tmp_path / "on" / "train.csv").read_bytes() == (off / "train.csv").read_bytes()
    ea = EventAccumulator(str(tmp_path / "on"), size_guidance={"scalars": 0})
    ea.Reload()
    tags = set(ea.Tags()["scalars"])
    _, rows = read_rows(tmp_path / "on" / "train.csv")
    for key in DIAGNOSTICS:
        events = ea.Scalars(f"losses/{key}")
        assert [e.step for e in events] == [int(r["env_steps"]) for r in rows]
        np.testing.assert_allclose([e.value for e in events], [float(r[key]) for r in rows], rtol=1e-6)
    assert not any(t.startswith("train/") for t in tags)  # the file's other columns say which update, no more
    assert not {"losses/update", "losses/version", "losses/staleness"} & tags
