"""run.compress_logs: a finished run keeps comm.csv, train.csv and their wall-clock sidecars gzip-compressed.

What is checked: the compressed files decompress to the very bytes an uncompressed run writes (and are
themselves the same bytes run to run: no name or time in the gzip header); every reader of those files
gives the same answer on either form (plots' run loader, the ledger audit, the regret curves, `marlq
report`); a finished compressed run extended with `marlq resume --set run.total_env_steps=...` continues
exactly, as an uncompressed one does; a stopped run (to be resumed) is left uncompressed; the seed-batched
runs of `marlq sweep --batch-seeds` compress as a single run does.
"""
from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import pytest

from marl_q.config import build_config, load_config
from marl_q.errors import RunDirError
from marl_q.experiment import resume_experiment, run_experiment
from marl_q.rundir import (COMPRESSIBLE_FILES, archive_run_files, open_run_text, run_file, unarchive_run_files)

ROOT = Path(__file__).resolve().parents[2]


def _run(small_raw: dict, out: Path, compress: bool, steps: int = 800) -> dict:
    small_raw["run"].update({"total_env_steps": steps, "compress_logs": compress})
    return run_experiment(build_config(small_raw), out)


def test_a_compressed_run_holds_the_uncompressed_runs_bytes(small_raw, tmp_path):
    plain = _run(dict(small_raw, run=dict(small_raw["run"])), tmp_path / "plain", False)
    packed = _run(small_raw, tmp_path / "packed", True)
    assert packed["final_return"] == plain["final_return"]
    written = [name for name in COMPRESSIBLE_FILES if (tmp_path / "plain" / name).is_file()]
    assert {"comm.csv", "comm_wall.csv", "train.csv"} <= set(written)
    for name in written:
        assert not (tmp_path / "packed" / name).exists(), name
        with gzip.open(tmp_path / "packed" / (name + ".gz"), "rb") as fh:
            text = fh.read()
        if name.endswith("_wall.csv"):  # wall clocks differ run to run: the keys and the row count agree
            plain_rows = (tmp_path / "plain" / name).read_bytes().splitlines()
            rows = text.splitlines()
            assert [r.split(b",")[0] for r in rows] == [r.split(b",")[0] for r in plain_rows], name
        else:
            assert text == (tmp_path / "plain" / name).read_bytes(), name
    # metrics.csv, the summary and the checkpoints are as they were
    assert (tmp_path / "packed" / "metrics.csv").read_bytes() == (tmp_path / "plain" / "metrics.csv").read_bytes()
    assert (tmp_path / "packed" / "summary.json").is_file()


def test_the_gzip_files_are_the_same_bytes_each_time(tmp_path):
    for d in ("a", "b"):
        (tmp_path / d).mkdir()
        (tmp_path / d / "comm.csv").write_bytes(b"seq,t\r\n0,0.001000\r\n" * 1000)
        assert archive_run_files(tmp_path / d) == [tmp_path / d / "comm.csv.gz"]
    assert (tmp_path / "a" / "comm.csv.gz").read_bytes() == (tmp_path / "b" / "comm.csv.gz").read_bytes()
    assert unarchive_run_files(tmp_path / "a") == [tmp_path / "a" / "comm.csv"]
    assert (tmp_path / "a" / "comm.csv").read_bytes() == b"seq,t\r\n0,0.001000\r\n" * 1000
    assert not (tmp_path / "a" / "comm.csv.gz").exists()


def test_every_reader_gives_the_same_answer_on_either_form(small_raw, tmp_path):
    from analysis.plots import load_run
    from analysis.report import ledger_rows
    from marl_q.ledger import ledger_audit

    _run(dict(small_raw, run=dict(small_raw["run"])), tmp_path / "plain", False)
    _run(small_raw, tmp_path / "packed", True)
    plain, packed = load_run(tmp_path / "plain"), load_run(tmp_path / "packed")
    assert plain.comm is not None and packed.comm is not None
    assert plain.comm.keys() == packed.comm.keys()
    for key in plain.comm:
        np.testing.assert_array_equal(plain.comm[key], packed.comm[key], err_msg=key)  # (NaN for empty cells)
    assert vars(ledger_audit(tmp_path / "plain")) == vars(ledger_audit(tmp_path / "packed"))
    assert ledger_rows([plain]) == ledger_rows([packed]) != []
    assert run_file(tmp_path / "packed" / "comm.csv") == tmp_path / "packed" / "comm.csv.gz"
    assert run_file(tmp_path / "packed" / "eval.csv") is None
    with open_run_text(tmp_path / "packed" / "comm.csv") as fh:
        assert fh.readline().startswith("id,t,src,dst,kind,")
    with pytest.raises(FileNotFoundError, match="comm.csv.gz"):
        open_run_text(tmp_path / "nothing" / "comm.csv")


def test_a_compressed_run_extended_by_resume_equals_the_longer_run(small_raw, tmp_path):
    short = dict(small_raw, run=dict(small_raw["run"]))
    _run(short, tmp_path / "short", True, steps=800)
    assert (tmp_path / "short" / "comm.csv.gz").is_file()
    extended = resume_experiment(tmp_path / "short", ["run.total_env_steps=1600"])
    whole = _run(small_raw, tmp_path / "long", False, steps=1600)
    assert extended["env_steps"] == whole["env_steps"]
    for name in ("metrics.csv", "comm.csv", "train.csv"):
        with open_run_text(tmp_path / "short" / name) as fh, open(tmp_path / "long" / name, newline="") as ref:
            assert fh.read() == ref.read(), name  # (compressed again when the resumed run completed)
    assert (tmp_path / "short" / "comm.csv.gz").is_file() and not (tmp_path / "short" / "comm.csv").exists()
    # the files as they were before the resume are kept decompressed in its backup
    assert (tmp_path / "short" / "resume_backup_1" / "comm.csv").is_file()


def test_a_stopped_run_is_left_uncompressed_for_its_resume(small_raw, tmp_path):
    small_raw["run"].update({"checkpoint_every": 5, "stop_after_updates": 10})
    summary = _run(small_raw, tmp_path / "r", True)
    assert summary["status"] == "stopped"
    assert (tmp_path / "r" / "comm.csv").is_file() and not (tmp_path / "r" / "comm.csv.gz").exists()


def test_a_damaged_archive_is_a_clear_error(tmp_path):
    (tmp_path / "comm.csv.gz").write_bytes(b"not gzip at all")
    with pytest.raises(RunDirError, match="comm.csv.gz: cannot be decompressed"):
        unarchive_run_files(tmp_path)
    assert (tmp_path / "comm.csv.gz").is_file() and not (tmp_path / "comm.csv").exists()


def test_batched_seeds_compress_as_their_single_runs_do(tmp_path):
    from agents.batched_a2c import run_batched_seeds

    config = str(ROOT / "scenarios" / "cartpole_qa2c.yaml")
    over = ["run.total_env_steps=300", "run.plots=false", "run.compress_logs=true"]
    run_batched_seeds(config, over, [0, 1], [tmp_path / "b0", tmp_path / "b1"], progress=False)
    cfg = load_config(config, over + ["run.progress=false"], seed=1)
    run_experiment(cfg, tmp_path / "s1")
    for name in ("comm.csv", "train.csv"):
        assert not (tmp_path / "b1" / name).exists()
        with gzip.open(tmp_path / "b1" / (name + ".gz"), "rb") as fh, gzip.open(tmp_path / "s1" / (name + ".gz"), "rb") as ref:
            assert fh.read() == ref.read(), name
