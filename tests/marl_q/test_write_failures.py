"""Disk trouble mid-run: a checkpoint or CSV write that fails (here: ENOSPC injected on the Nth write)
ends the run with one line naming the file and the last good checkpoint, exit 1, no traceback; that
checkpoint stays intact, and `marlq resume` continues from it."""
from __future__ import annotations

import errno
import json
from pathlib import Path

import numpy as np
import pytest
import yaml

from marl_q.cli import main
from marl_q import rundir
from marl_q.rundir import checkpoints, load_checkpoint


def _fail_on_call(n: int, real):
    """``real``, except that its ``n``th call raises ENOSPC (and later calls go through)."""
    calls = {"n": 0}

    def fake(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == n:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(*args, **kwargs)

    return fake


def _config(small_raw: dict, tmp_path: Path, backend: str = "sim") -> Path:
    small_raw["backend"]["name"] = backend
    if backend == "local":  # the test is about a checkpoint's write, not about workers slow to start under load
        small_raw["backend"]["hello_timeout_s"] = 300.0
    small_raw["run"].update({"total_env_steps": 1200, "checkpoint_every": 5})
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(small_raw))
    return path


def _run_fails_then_resumes(cfg: Path, out: Path, capsys, names: str) -> None:
    assert main(["run", str(cfg), "--out", str(out), "--quiet"]) == 1
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(err) == 1 and "Traceback" not in err[0], err
    assert err[0].startswith(f"marlq: error: cannot write {out}") and names in err[0]
    assert "No space left on device" in err[0] and f"`marlq resume {out}`" in err[0]
    kept = checkpoints(out)
    assert kept and f"the last good checkpoint {kept[-1].name} is kept" in err[0]
    before = load_checkpoint(kept[-1])[1]  # intact: reads back whole
    assert not list((out / "checkpoints").glob("*.tmp")) and not (out / "summary.json").exists()
    for snap in (out / "checkpoints").glob("*.sim.pkl"):  # no snapshot left without its checkpoint
        assert snap.with_name(snap.name.replace(".sim.pkl", ".npz")).is_file(), snap
    assert main(["resume", str(out), "--quiet"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["env_steps"] >= 1200
    assert summary["resumes"][0] == {"from": kept[-1].name, "updates": before["updates"],
                                     "env_steps": before["env_steps"], "exact": True}


def test_a_checkpoint_write_that_fails_keeps_the_previous_one_and_it_resumes(small_raw, tmp_path, capsys,
                                                                              monkeypatch):
    cfg = _config(small_raw, tmp_path)
    with monkeypatch.context() as m:
        m.setattr(np, "savez", _fail_on_call(3, np.savez))  # the third checkpoint's archive
        _run_fails_then_resumes(cfg, tmp_path / "r", capsys, "checkpoints/ckpt_15.npz")


class _FullDisk:
    """A csv writer on a full disk."""

    def writerows(self, rows):
        raise OSError(errno.ENOSPC, "No space left on device")


@pytest.mark.parametrize("name", ["metrics.csv", "comm.csv"])
def test_a_csv_write_that_fails_keeps_the_previous_checkpoint_and_it_resumes(small_raw, tmp_path, capsys,
                                                                             monkeypatch, name):
    """The third write of metrics.csv (MetricsWriter) or comm.csv (the Ledger) meets a full disk."""
    cfg = _config(small_raw, tmp_path)
    real, calls = rundir.write_row_pair, {"n": 0}

    def third_write_fails(file, writer, *rest):
        if Path(file.name).name == name:
            calls["n"] += 1
            if calls["n"] == 3:
                writer = _FullDisk()
        return real(file, writer, *rest)

    with monkeypatch.context() as m:
        m.setattr(rundir, "write_row_pair", third_write_fails)
        _run_fails_then_resumes(cfg, tmp_path / "r", capsys, name)


def test_a_removed_checkpoint_folder_on_local_is_named(small_raw, tmp_path, capsys, monkeypatch):
    """The directory gone mid-run (a real OSError, not an injected one), on a real backend."""
    import shutil

    from marl_q import runtime

    cfg = _config(small_raw, tmp_path, backend="local")
    real = runtime.save_checkpoint

    def second_goes_missing(path, arrays, meta, calls=[0]):
        calls[0] += 1
        if calls[0] == 2:
            shutil.rmtree(path.parent)
        return real(path, arrays, meta)

    monkeypatch.setattr(runtime, "save_checkpoint", second_goes_missing)
    out = tmp_path / "r"
    assert main(["run", str(cfg), "--out", str(out), "--quiet"]) == 1
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(err) == 1 and f"cannot write {out}/checkpoints/ckpt_10.npz (FileNotFoundError" in err[0], err
    assert "nothing to resume" in err[0]
