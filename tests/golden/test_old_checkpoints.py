"""Old checkpoints still resume: each fixture (tests/golden/old_checkpoints.py) is a shipped scenario's
run stopped after a quarter of its updates by an earlier commit. Resumed by today's code, it must write
what the uninterrupted golden run writes: the golden trace on every machine, and the recorded bytes on
the numerics class that wrote the checkpoint, while the golden's bytes are those it was written under."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.golden.goldens import FILES, compare_trace, numerics_class, recorded_hashes, sha256, trace_path
from tests.golden.old_checkpoints import NAMES, fixture_dir


def test_every_fixture_is_there_and_names_its_writer():
    for name in NAMES:
        meta = json.loads((fixture_dir(name) / "meta.json").read_text())
        assert meta["scenario"] == name and len(meta["commit"]) == 40
        assert 1 <= meta["stopped_after_updates"] < meta["updates_of_the_whole_run"]
        assert set(meta["golden_sha256"]) >= {"metrics.csv", "comm.csv"}
        assert len(list((fixture_dir(name) / "checkpoints").glob("ckpt_*.npz"))) == 1


@pytest.mark.parametrize("name", NAMES)
def test_an_old_checkpoint_resumes_into_the_golden_run(name: str, tmp_path: Path):
    from marl_q.experiment import resume_experiment

    run_dir = tmp_path / "run"
    shutil.copytree(fixture_dir(name), run_dir)
    meta = json.loads((run_dir / "meta.json").read_text())
    before = (run_dir / "metrics.csv").read_bytes()
    summary = resume_experiment(run_dir, plots=False)
    assert summary["status"] == "completed", summary
    files = {f: (run_dir / f).read_bytes() for f in FILES if (run_dir / f).exists()}
    assert files["metrics.csv"].startswith(before) and len(files["metrics.csv"]) > len(before)  # it went on
    problems = []
    for file in sorted(p.name for p in trace_path(name, "x").parent.glob("*.csv")):
        assert file in files, f"{name}: the resumed run wrote no {file}"
        problems += compare_trace(file, files[file], trace_path(name, file).read_bytes())
    exact = recorded_hashes(name)
    if exact is not None and numerics_class().name == meta["numerics_class"] and exact == meta["golden_sha256"]:
        for file, data in files.items():
            if sha256(data) != exact.get(file):
                problems.append(f"{name}: the resumed {file} is not byte-identical to the golden run's")
    assert not problems, f"{name} resumed from a checkpoint of commit {meta['commit'][:10]}:\n" + "\n".join(problems)
