"""The versioned state format of sim snapshots (marl_q/state_format.py): files carry their version,
older versions are upgraded through the one migration table, a version this marl-q does not know (or
a file that holds no state) is one line and exit code 2 at `marlq resume`, and no class keeps a
``__setstate__`` for old layouts."""
from __future__ import annotations

import hashlib
import io
import pickle
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from marl_q.cli import main
from marl_q.errors import CheckpointError
from marl_q.experiment import resume_experiment
from marl_q.rundir import _FullStatePickle, checkpoints, load_checkpoint, load_snapshot, save_checkpoint, save_snapshot
from marl_q.state_format import FORMAT, FORMAT_VERSION, MIGRATIONS, pack, rng_from_state, rng_state, upgrade, version_of
from tests.golden.old_checkpoints import fixture_dir
from tests.marl_q.test_resume import _stopped_run

ROOT = Path(__file__).resolve().parents[2]


def _raw(path: Path):
    """The object a snapshot file holds, unpickled as it is (no version check, no migration)."""
    return torch.load(io.BytesIO(path.read_bytes()), weights_only=False)


def _write_raw(path: Path, obj) -> str:
    """Write ``obj`` as a snapshot file's whole content (bypassing ``pack``); its SHA-256."""
    buf = io.BytesIO()
    torch.save(obj, buf, pickle_module=_FullStatePickle, pickle_protocol=pickle.HIGHEST_PROTOCOL)
    path.write_bytes(buf.getvalue())
    return hashlib.sha256(buf.getvalue()).hexdigest()


def test_a_snapshot_file_carries_the_current_version_and_round_trips(tmp_path):
    rng = np.random.default_rng(5)
    state = {"mode": "events", "now": 2.5, "timing_rng": rng_state(rng), "heap": [(1.0, 0, "done", np.arange(3))],
             "weights": torch.arange(6.0).reshape(2, 3)}
    digest = save_snapshot(tmp_path / "s.sim.pkl", state)
    raw = _raw(tmp_path / "s.sim.pkl")
    assert raw["format"] == FORMAT and raw["format_version"] == FORMAT_VERSION == version_of(raw)
    back = load_snapshot(tmp_path / "s.sim.pkl", digest)
    assert back["mode"] == "events" and back["now"] == 2.5 and back["heap"][0][:3] == (1.0, 0, "done")
    np.testing.assert_array_equal(back["heap"][0][3], np.arange(3))
    torch.testing.assert_close(back["weights"], state["weights"], rtol=0, atol=0)
    assert rng_from_state(back["timing_rng"]).random(4).tolist() == rng.random(4).tolist()  # the stream goes on


def test_a_snapshot_is_streamed_to_its_file_with_the_bytes_and_hash_of_the_in_memory_write(tmp_path):
    """save_snapshot writes as torch writes (no whole copy in memory): the file's bytes are those of
    torch.save into memory (the format is unchanged), its SHA-256 is hashlib's over the file, and the peak
    of Python's allocations while saving is about one copy of the arrays (torch's pickle of the state:
    1.13x the array here), where writing through a BytesIO and its getvalue() held two (2.13x)."""
    import tracemalloc

    big = np.random.default_rng(0).random(2_000_000).astype(np.float32)  # 8 MB
    state = {"arrays": [big, big[:10]], "weights": torch.arange(6.0), "heap": [(0.5, 1, "done", None)]}
    digest = save_snapshot(tmp_path / "s.sim.pkl", state)
    written = (tmp_path / "s.sim.pkl").read_bytes()
    reference = io.BytesIO()
    torch.save(pack(state), reference, pickle_module=_FullStatePickle, pickle_protocol=pickle.HIGHEST_PROTOCOL)
    assert written == reference.getvalue() and digest == hashlib.sha256(written).hexdigest()
    assert not list(tmp_path.glob("*.tmp"))
    tracemalloc.start()
    try:
        save_snapshot(tmp_path / "t.sim.pkl", state)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1.6 * big.nbytes, peak


def test_a_snapshot_write_that_fails_midway_leaves_no_file(tmp_path, monkeypatch):
    import errno

    from marl_q import rundir
    from marl_q.errors import RunWriteError

    calls = {"n": 0}
    real = rundir._HashingWriter.write

    def full_disk(self, data):
        calls["n"] += 1
        if calls["n"] == 3:  # a write in the middle of the file
            self.fh.write(b"partial")
            exc = OSError(errno.ENOSPC, "No space left on device")
            self.error = exc
            raise exc
        return real(self, data)

    monkeypatch.setattr(rundir._HashingWriter, "write", full_disk)
    with pytest.raises(RunWriteError, match="No space left on device"):
        save_snapshot(tmp_path / "s.sim.pkl", {"a": np.arange(100_000), "b": torch.ones(1000), "c": np.ones(5)})
    assert calls["n"] >= 3 and list(tmp_path.iterdir()) == []


def test_a_generator_as_data_continues_its_stream():
    for rng in (np.random.default_rng(3), np.random.Generator(np.random.Philox(9)), np.random.Generator(np.random.MT19937(1))):
        rng.random(7)
        data = rng_state(rng)
        assert isinstance(data["state"], dict) and data["bit_generator"] == type(rng.bit_generator).__name__
        assert rng_from_state(data).normal(size=5).tolist() == rng.normal(size=5).tolist()


def test_a_sim_run_snapshots_its_generators_as_data(small_raw, tmp_path):
    run = _stopped_run(tmp_path, small_raw)
    raw = _raw(run / "checkpoints" / "ckpt_20.sim.pkl")
    assert version_of(raw) == FORMAT_VERSION
    state = raw["state"]
    assert {"mode", "workers", "heap", "now", "algorithm", "service", "rngs"} <= set(state)
    assert isinstance(state["timing_rng"], dict) and not any(
        isinstance(v, np.random.Generator) for v in state.values())


def test_the_table_upgrades_every_older_version_one_step_at_a_time():
    assert sorted(MIGRATIONS) == list(range(FORMAT_VERSION))


def test_an_old_fixture_snapshot_is_version_0_and_migrates_through_the_table():
    """The fixture of a quantum run written by an earlier commit (tests/golden/checkpoints): a bare
    pickled state, workers with their rollout state under the old names, twins with the flags of
    before the kernels, generators as objects. Read, it is today's layout (its resume into the golden
    run's bytes is tests/golden/test_old_checkpoints.py)."""
    folder = fixture_dir("cartpole_qa2c_quantum_both.yaml") / "checkpoints"
    ckpt = next(folder.glob("ckpt_*.npz"))
    _, meta = load_checkpoint(ckpt)
    path = folder / meta["snapshot"]["file"]
    raw = _raw(path)
    assert version_of(raw) == 0 and isinstance(raw["timing_rng"], np.random.Generator)
    old_worker = raw["workers"][0].__dict__
    assert "ep_return" in old_worker and "book" not in old_worker
    old_twins = old_worker["_np_heads"]
    assert all("kernels" in t.__dict__ and "use_kernels" not in t.__dict__ for t in old_twins)
    want = raw["timing_rng"].random(3)

    state = load_snapshot(path, meta["snapshot"]["sha256"])
    assert rng_from_state(state["timing_rng"]).random(3).tolist() == want.tolist()
    worker = state["workers"][0]
    assert "book" in worker.__dict__ and "vec" in worker.__dict__ and "ep_return" not in worker.__dict__
    for twin in worker._np_heads:
        assert {"use_blocks", "use_kernels"} <= set(twin.__dict__) and "kernels" not in twin.__dict__
        assert twin.use_kernels is bool(old_twins[0].__dict__["kernels"])  # it keeps the executors it ran on


def test_a_version_0_shot_sampler_takes_up_its_generator():
    """Version 0 pickled a head's shot sampler as {seed, state} (``ShotSampler.__getstate__`` then):
    migrated, its generator continues the stream."""
    from circuits.shots import ShotSampler

    sampler = ShotSampler(11)
    torch.rand(5, generator=sampler.generator)
    old = ShotSampler.__new__(ShotSampler)
    old.__dict__.update({"seed": 11, "state": sampler.generator.get_state()})
    upgrade({"head": old}, 0)
    assert old.seed == 11 and "state" not in old.__dict__
    assert torch.equal(torch.rand(4, generator=old.generator), torch.rand(4, generator=sampler.generator))


def test_a_version_0_file_resumes_exactly_like_the_current_one(small_raw, tmp_path):
    """The same checkpoint, its snapshot written as version 0 (the bare state, generators as objects)
    and as today's: both resumes write the same bytes."""
    from marl_q.config import build_config
    from marl_q.experiment import run_experiment

    runs = {}
    for kind in ("v1", "v0"):
        raw = {k: (dict(v) if isinstance(v, dict) else v) for k, v in small_raw.items()}
        raw["run"] = dict(small_raw["run"], checkpoint_every=5, stop_after_updates=20)
        run = tmp_path / kind
        run_experiment(build_config(raw), run)
        if kind == "v0":
            ckpt = checkpoints(run)[-1]
            arrays, meta = load_checkpoint(ckpt)
            snap = ckpt.with_name(meta["snapshot"]["file"])
            state = _raw(snap)["state"]
            for key in ("timing_rng", "pick_rng"):
                if key in state:
                    state[key] = rng_from_state(state[key])
            meta["snapshot"]["sha256"] = _write_raw(snap, state)
            save_checkpoint(ckpt, {f"service.{k}" if not k.startswith("service.") else k: v for k, v in arrays.items()}, meta)
        assert resume_experiment(run, plots=False)["status"] == "completed"
        runs[kind] = {f: (run / f).read_bytes() for f in ("metrics.csv", "comm.csv", "train.csv")}
    assert runs["v0"] == runs["v1"]


@pytest.mark.parametrize("content, message", [
    (lambda state: dict(pack(state), format_version=FORMAT_VERSION + 1),
     rf"state format version {FORMAT_VERSION + 1}, but this marl-q reads versions 0 to {FORMAT_VERSION}"),
    (lambda state: dict(pack(state), format_version="one"), r"state format version 'one'"),
    (lambda state: pack([1, 2, 3]), r"holds a list, not a state"),
    (lambda state: [state], r"holds a list, not a state"),
])
def test_an_unknown_version_or_a_file_without_a_state_is_one_line_and_exit_2(small_raw, tmp_path, capsys, content, message):
    run = _stopped_run(tmp_path, small_raw)
    ckpt = checkpoints(run)[-1]
    arrays, meta = load_checkpoint(ckpt)
    snap = ckpt.with_name(meta["snapshot"]["file"])
    meta["snapshot"]["sha256"] = _write_raw(snap, content(_raw(snap)["state"]))
    save_checkpoint(ckpt, arrays, meta)  # the header names the new bytes: only the content is wrong
    with pytest.raises(CheckpointError, match=message):
        resume_experiment(run)
    capsys.readouterr()
    assert main(["resume", str(run)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and re.search(message, err) and "ckpt_20.sim.pkl" in err
    assert "ckpt_15.npz are kept" in err  # and the older checkpoint is named, untouched
    assert load_checkpoint(checkpoints(run)[0])[1]["updates"] == 15


# the __setstate__ methods that rebuild what is never saved, each with its reason; a new one needs
# one too, and an old layout goes to a migration instead (docs/runtime.md, "State format and migrations")
DERIVED = {
    "agents/heads.py": "the flat parameter buffer's views and gradients, seated again",
    "agents/replay.py": "the buffer's empty capacity, allocated again (a snapshot holds the filled rows)",
}


def test_no_class_takes_up_old_layouts_in_setstate():
    """Old layouts are migrated in marl_q/state_format.py only. What ``__setstate__`` is left rebuilds
    derived state that is never saved (``DERIVED``), not an old file's layout."""
    found = sorted(str(path.relative_to(ROOT)) for package in ("marl_q", "agents", "circuits", "scenarios", "analysis")
                   for path in (ROOT / package).rglob("*.py") if "def __setstate__" in path.read_text())
    assert found == sorted(DERIVED)
