"""The versioned state format of sim snapshots (marl_q/state_format.py): files carry their version,
older versions are upgraded through the one migration table, a version this marl-q does not know (or
a file that holds no state) is one line and exit code 2 at `marlq resume`, and no class keeps a
``__setstate__``: old layouts are migrated, and objects pickle as data through named constructors."""
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
from marl_q.rundir import _FullStatePickle, _FullStatePickler, checkpoints, load_checkpoint, load_snapshot, save_checkpoint, save_snapshot
from marl_q.state_format import FORMAT, FORMAT_VERSION, MIGRATIONS, pack, rng_from_state, rng_state, upgrade, version_of
from marl_q.state_format import _reachable as _reachable_objects
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


class _CtrlCFile:
    """A file whose writes are where Ctrl-C arrives (KeyboardInterrupt raised by the write)."""

    def write(self, data):
        raise KeyboardInterrupt


@pytest.mark.parametrize("at_write", [1, 3, -2])  # the zip's first record, a middle one, its directory
def test_ctrl_c_during_a_snapshot_write_is_an_interrupt_and_leaves_no_file(tmp_path, monkeypatch, at_write):
    """torch wraps an exception its writer's callback raised in its own RuntimeError ("unexpected pos"):
    a Ctrl-C during a checkpoint then ended the run with exit 1 and a traceback instead of 130."""
    from marl_q import rundir

    state = {"a": np.arange(10_000), "b": torch.ones(1000), "c": [1, 2, 3]}
    counter = {"n": 0}
    real = rundir._HashingWriter.write

    def count(self, data):
        counter["n"] += 1
        return real(self, data)

    monkeypatch.setattr(rundir._HashingWriter, "write", count)
    save_snapshot(tmp_path / "whole.sim.pkl", state)
    total, calls = counter["n"], {"n": 0}
    at = at_write if at_write > 0 else total + at_write + 1

    def interrupted(self, data):
        calls["n"] += 1
        if calls["n"] == at:
            fh, self.fh = self.fh, _CtrlCFile()
            try:
                return real(self, data)
            finally:
                self.fh = fh
        return real(self, data)

    monkeypatch.setattr(rundir._HashingWriter, "write", interrupted)
    with pytest.raises(KeyboardInterrupt):
        save_snapshot(tmp_path / "s.sim.pkl", state)
    assert calls["n"] >= at and sorted(p.name for p in tmp_path.iterdir()) == ["whole.sim.pkl"]


def test_ctrl_c_in_torchs_own_save_code_does_not_abort_when_the_exception_is_freed(tmp_path):
    """Ctrl-C landing in torch.save's own Python (its zip writer's __exit__, before it finishes the file)
    leaves that writer unfinished; its destructor finishes it when the exception is freed, after the file
    closed. A write raising there is std::terminate: the process aborted (exit -6) after `marlq` had saved
    and printed how to resume (seen as a flaky test_ctrl_c_reaches_a_run_started_with_sigint_ignored)."""
    import subprocess
    import sys

    script = f"""
import gc
import torch, torch.serialization as s
from marl_q.rundir import save_snapshot

def interrupted_exit(self, *args):
    raise KeyboardInterrupt

s._open_zipfile_writer_buffer.__exit__ = interrupted_exit
try:
    save_snapshot({str(tmp_path / "s.sim.pkl")!r}, {{"a": torch.zeros(1000)}})
except KeyboardInterrupt as exc:
    print("interrupted", flush=True)
gc.collect()
print("alive", flush=True)
"""
    proc = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["interrupted", "alive"] and list(tmp_path.iterdir()) == []


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


def _resumes_as_today(small_raw, tmp_path, rewrite) -> None:
    """Two runs of one config stopped at the same checkpoint; the second's snapshot rewritten by
    ``rewrite(snapshot path, meta)`` as an older version wrote it (it updates meta's sha256). Both
    resumes must write the same bytes."""
    from marl_q.config import build_config
    from marl_q.experiment import run_experiment

    runs = {}
    for kind in ("today", "old"):
        raw = {k: (dict(v) if isinstance(v, dict) else v) for k, v in small_raw.items()}
        raw["run"] = dict(small_raw["run"], checkpoint_every=5, stop_after_updates=20)
        run = tmp_path / kind
        run_experiment(build_config(raw), run)
        if kind == "old":
            ckpt = checkpoints(run)[-1]
            arrays, meta = load_checkpoint(ckpt)
            rewrite(ckpt.with_name(meta["snapshot"]["file"]), meta)
            save_checkpoint(ckpt, {f"service.{k}" if not k.startswith("service.") else k: v for k, v in arrays.items()}, meta)
        assert resume_experiment(run, plots=False)["status"] == "completed"
        runs[kind] = {f: (run / f).read_bytes() for f in ("metrics.csv", "comm.csv", "train.csv")}
    assert runs["old"] == runs["today"]


def test_a_version_0_file_resumes_exactly_like_the_current_one(small_raw, tmp_path):
    """The same checkpoint, its snapshot written as version 0 (the bare state, generators as objects)
    and as today's: both resumes write the same bytes."""
    def as_version_0(snap, meta):
        state = _raw(snap)["state"]
        for key in ("timing_rng", "pick_rng"):
            if key in state:
                state[key] = rng_from_state(state[key])
        meta["snapshot"]["sha256"] = _write_raw(snap, state)

    _resumes_as_today(small_raw, tmp_path, as_version_0)


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


def test_no_class_keeps_a_setstate():
    """Old layouts are migrated in marl_q/state_format.py only, and what an object leaves out of its
    pickle it rebuilds through a named constructor (``__reduce__``, e.g. ``ReplayBuffer.from_state``),
    so no class has a ``__setstate__`` (docs/runtime.md, "State format and migrations")."""
    found = sorted(str(path.relative_to(ROOT)) for package in ("marl_q", "agents", "circuits", "scenarios", "analysis")
                   for path in (ROOT / package).rglob("*.py") if "def __setstate__" in path.read_text())
    assert found == []


# -- version 3 -> 4: the replay and flat parameter buffers, pickled as data --------------------------

def _v3_pickle(obj) -> object:
    """What a version-3 file held of a replay or flat parameter buffer, unpickled by today's classes:
    the object with the attribute dict its ``__getstate__`` then returned (written out here, from the
    version-3 code), and no ``__setstate__`` to rebuild the rest."""
    from agents.heads import FlatParameters

    if isinstance(obj, FlatParameters):
        state = {"flat": obj.flat, "modules": obj.modules, "size": obj.size}
    else:
        state = obj.__dict__.copy()
        state["data"] = {name: arr[:obj.size].copy() for name, arr in obj.data.items()}
    old = type(obj).__new__(type(obj))
    old.__dict__.update(state)
    return old


class _V3Pickler(_FullStatePickler):
    """Writes the two buffers as version 3 did (``copyreg.__newobj__`` and their ``__getstate__`` dict),
    the rest as today."""

    def reducer_override(self, obj):
        from agents.heads import FlatParameters
        from agents.replay import ReplayBuffer

        if isinstance(obj, (FlatParameters, ReplayBuffer)):
            import copyreg

            return copyreg.__newobj__, (type(obj),), _v3_pickle(obj).__dict__, None, None
        return super().reducer_override(obj)


class _V3Pickle:
    Pickler = _V3Pickler
    Unpickler = pickle.Unpickler
    HIGHEST_PROTOCOL = pickle.HIGHEST_PROTOCOL


def test_version_3_buffers_are_rebuilt_in_place_by_their_constructors():
    """A version-3 replay buffer (filled rows only) and flat parameter buffer (no views) are rebuilt by
    ``_v3_to_v4``: the same rows, counters and priority trees as before the pickle (so the same draws),
    the parameters views of the flat buffer again (gradients too), every reference to them kept; a flat
    buffer of today's layout (one a step before built) is left as it is."""
    from torch import nn

    from agents.heads import FlatParameters
    from agents.replay import EpisodeBuffer, Field, PrioritizedReplayBuffer, ReplayBuffer

    fields = [Field("obs", (3,)), Field("action", (), np.int64), Field("done", (), np.bool_)]
    rng = np.random.default_rng(0)
    chunk = {"obs": rng.random((11, 3)), "action": rng.integers(0, 4, 11), "done": rng.random(11) < 0.3}
    ring = ReplayBuffer(fields, 8)
    ring.add(chunk)  # wrapped: pos 3, size 8
    part = PrioritizedReplayBuffer(fields, 16, alpha=0.6)
    part.add(chunk)  # part-filled: size 11 of 16
    part.update_priorities(np.array([0, 4, 9]), np.array([2.0, 0.1, 5.0]))
    part.snapshot_max_bytes = 10_000
    episodes = EpisodeBuffer([Field("obs", (2,))], 4, 5, episode_fields=[Field("h0", (3,))])
    episodes.add({"obs": rng.random((3, 5, 2)), "h0": rng.random((3, 3))}, lengths=[5, 2, 4])
    actor, critic = nn.Linear(3, 2), nn.Linear(3, 1)
    flat = FlatParameters(actor, critic)
    flat.load(rng.random(flat.size).astype(np.float32))
    today = FlatParameters(nn.Linear(2, 2))
    kept_param = today.modules[0].weight

    olds = {name: _v3_pickle(obj) for name, obj in
            (("ring", ring), ("part", part), ("episodes", episodes), ("flat", flat))}
    assert "writes" not in olds["flat"].__dict__ and len(olds["part"].data["obs"]) == 11  # as version 3 left them
    state = {"service": {"buffer": olds["ring"], "prio": olds["part"]}, "worker": [olds["episodes"], olds["flat"]],
             "again": olds["flat"], "today": today}
    upgrade(state, 3)
    assert state["again"] is state["worker"][1] is olds["flat"]  # rebuilt in place: references kept
    for name, before in (("ring", ring), ("part", part), ("episodes", episodes)):
        after = olds[name]
        assert type(after) is type(before) and (after.pos, after.size, after.inserted) == (before.pos, before.size, before.inserted)
        assert after.fields == before.fields and after.data.keys() == before.data.keys()
        for key, arr in before.data.items():  # the whole capacity again, zeros past the filled rows
            assert after.data[key].dtype == arr.dtype
            np.testing.assert_array_equal(after.data[key], arr)
    assert olds["part"].snapshot_max_bytes == 10_000 and olds["ring"].snapshot_max_bytes is None
    np.testing.assert_array_equal(olds["part"].tree.sums, part.tree.sums)
    np.testing.assert_array_equal(olds["part"].tree.mins, part.tree.mins)
    assert olds["part"].max_priority == part.max_priority == 5.0 + olds["part"].priority_eps
    rows, _, weights = olds["part"].sample(6, np.random.default_rng(3))
    want_rows, _, want_weights = part.sample(6, np.random.default_rng(3))
    np.testing.assert_array_equal(rows, want_rows)
    np.testing.assert_array_equal(weights, want_weights)
    assert olds["episodes"].max_len == 5 and olds["episodes"].episode_fields == episodes.episode_fields

    rebuilt = olds["flat"]
    assert rebuilt.size == flat.size and rebuilt.writes == 0
    torch.testing.assert_close(rebuilt.flat.data, flat.flat.data, rtol=0, atol=0)
    offset = 0
    for p in list(actor.parameters()) + list(critic.parameters()):  # seated in the flat buffer's order
        assert p.data_ptr() == rebuilt.flat.data[offset:].data_ptr()
        assert p.grad.data_ptr() == rebuilt.flat.grad[offset:].data_ptr()
        offset += p.numel()
    rebuilt.load(np.arange(rebuilt.size, dtype=np.float32))
    torch.testing.assert_close(actor.bias.data, torch.tensor([6.0, 7.0]), rtol=0, atol=0)
    assert today.modules[0].weight is kept_param  # today's layout: not seated again


def test_a_buffer_pickles_as_its_constructor_and_plain_data():
    """Pickled now, a replay buffer is ``from_state`` and plain data (its layout: str, int, float and
    tuples; ``state_dict()``'s arrays), not its attributes: its priority tree is rebuilt, not saved. A
    flat parameter buffer is ``from_state`` of its storage and modules."""
    from torch import nn

    from agents.heads import FlatParameters
    from agents.replay import Field, PrioritizedReplayBuffer

    buffer = PrioritizedReplayBuffer([Field("obs", (2,)), Field("done", (), np.bool_)], 4, alpha=0.5)
    buffer.add({"obs": np.ones((3, 2)), "done": np.zeros(3, dtype=bool)})
    rebuild, (layout, state, limit) = buffer.__reduce__()
    assert rebuild == PrioritizedReplayBuffer.from_state and limit is None
    assert layout == {"fields": [("obs", (2,), "<f4"), ("done", (), "|b1")], "capacity": 4, "alpha": 0.5,
                      "priority_eps": 1e-6}
    assert all(isinstance(v, np.ndarray) for v in state.values()) and len(state["data.obs"]) == 3
    blob = pickle.dumps(buffer)
    assert b"SumTree" not in blob and b"from_state" in blob
    back = pickle.loads(blob)
    assert back.tree.total == buffer.tree.total and back.data["obs"].shape == (4, 2)

    flat = FlatParameters(nn.Linear(2, 2))
    rebuild, args = flat.__reduce__()
    assert rebuild == FlatParameters.from_state and args == (flat.flat, flat.modules)
    assert pickle.loads(pickle.dumps(flat)).modules[0].weight.grad is not None


def test_a_version_3_file_resumes_exactly_like_the_current_one(small_raw, tmp_path):
    """The same checkpoint, its snapshot written as version 3 wrote its flat parameter buffers (the
    workers', an A3C run) and as today's: both resumes write the same bytes (a version-3 replay buffer's
    resume is the cartpole_dqn fixture's, tests/golden/test_old_checkpoints.py)."""
    def as_version_3(snap, meta):
        buf = io.BytesIO()
        torch.save(dict(pack(_raw(snap)["state"]), format_version=3), buf, pickle_module=_V3Pickle,
                   pickle_protocol=pickle.HIGHEST_PROTOCOL)
        assert b"FlatParameters" in buf.getvalue() and b"from_state" not in buf.getvalue()
        snap.write_bytes(buf.getvalue())
        meta["snapshot"]["sha256"] = hashlib.sha256(buf.getvalue()).hexdigest()

    _resumes_as_today(small_raw, tmp_path, as_version_3)


def _write_as_version(snap: Path, meta: dict, state: dict, version: int) -> None:
    """Write ``state`` to the snapshot file as a file of format ``version`` (torch's pickler, full-state envs),
    and name its new bytes in the checkpoint's header ``meta``."""
    buf = io.BytesIO()
    torch.save(dict(pack(state), format_version=version), buf, pickle_module=_FullStatePickle,
               pickle_protocol=pickle.HIGHEST_PROTOCOL)
    snap.write_bytes(buf.getvalue())
    meta["snapshot"]["sha256"] = hashlib.sha256(buf.getvalue()).hexdigest()


@pytest.mark.parametrize("optimizer", ["adam", "rmsprop", "sgd"])
def test_a_version_5_file_with_torch_optimizers_resumes_exactly_like_the_current_one(small_raw, tmp_path, optimizer):
    """Version 5's PPO workers stepped torch.optim optimizers on their flat parameters; the same
    checkpoint with each worker's flat optimizer written back as the torch.optim one it continues (its
    hyperparameters, moments and step count) resumes to the same bytes as today's."""
    small_raw["algorithm"] = {"name": "ppo", "n_steps": 16, "epochs": 2, "minibatches": 2, "optimizer": optimizer}
    small_raw["run"]["total_env_steps"] = 3000  # past the 20 updates where the runs stop and resume
    seen = []

    def as_version_5(snap, meta):
        state = _raw(snap)["state"]
        for obj in _reachable_objects(state):
            flat = getattr(obj, "__dict__", {}).get("optimizer")
            if flat is None or not hasattr(flat, "steps"):
                continue
            cls = {"FlatAdam": torch.optim.Adam, "FlatRMSprop": torch.optim.RMSprop, "FlatSGD": torch.optim.SGD}
            kwargs = {"FlatAdam": lambda f: {"betas": (f.b1, f.b2), "eps": f.eps},
                      "FlatRMSprop": lambda f: {"alpha": f.alpha, "eps": f.eps}, "FlatSGD": lambda f: {}}
            name = type(flat).__name__
            old = cls[name]([flat.param], lr=flat.lr, **kwargs[name](flat))
            if name != "FlatSGD":
                keys = {"FlatAdam": ("exp_avg", "exp_avg_sq"), "FlatRMSprop": ("square_avg",)}[name]
                moments = {k: getattr(flat, k) for k in keys}
                old.state[flat.param] = {"step": torch.tensor(float(flat.steps)), **{k: v.clone() for k, v in moments.items()}}
            obj.__dict__["optimizer"] = old
            seen.append((name, flat.steps))
        _write_as_version(snap, meta, state, 5)

    _resumes_as_today(small_raw, tmp_path, as_version_5)
    expected = {"adam": "FlatAdam", "rmsprop": "FlatRMSprop", "sgd": "FlatSGD"}[optimizer]
    assert seen and all(name == expected and steps > 0 for name, steps in seen)


def test_a_torch_optimizer_of_another_kind_in_an_old_file_is_a_clear_error():
    from marl_q.state_format import _v5_to_v6

    holder = type("Worker", (), {})()
    holder.optimizer = torch.optim.Adagrad([torch.zeros(3, requires_grad=True)], lr=0.1)
    with pytest.raises(CheckpointError, match="torch.optim.Adagrad"):
        _v5_to_v6({"workers": [holder]})


def test_a_routing_worker_of_version_3_takes_its_episode_into_a_book():
    """Before its decisions went through agents.rollout, a routing worker kept its episode under way in
    ``_window``; read, the routing_amarl fixture's workers (version 0) hold an EpisodeBook with the same
    running return and decisions, and the first outcome beside it (the resume's bytes:
    tests/golden/test_old_checkpoints.py)."""
    from agents.rollout import EpisodeBook

    folder = fixture_dir("routing_amarl.yaml") / "checkpoints"
    _, meta = load_checkpoint(next(folder.glob("ckpt_*.npz")))
    path = folder / meta["snapshot"]["file"]
    windows = [w.__dict__["_window"] for w in _raw(path)["workers"]]
    assert any(w["length"] > 0 for w in windows)  # episodes under way
    workers = load_snapshot(path, meta["snapshot"]["sha256"])["workers"]
    for worker, window in zip(workers, windows):
        assert "_window" not in worker.__dict__ and type(worker.book) is EpisodeBook
        assert worker.book.returns.tolist() == [window["return"]] and worker.book.lengths.tolist() == [window["length"]]
        assert worker.first_outcome == window["first_outcome"]


def test_version_4_twins_keep_the_executor_variants_they_ran_on():
    """Version 4's acting twins carried ``use_columns`` but acted through the numpy blocks past the per-row
    kernels' rows; version 5's act through the columns kernels there (5-8 qubits). Read as version 4, an
    acting twin keeps the blocks (the bits of a twin that ran them), a training twin pickled before the
    columns kernels (no ``use_columns``) keeps them too, and one pickled after keeps the columns kernels;
    a version-5 twin keeps its own choice across a pickle."""
    from circuits import VQC
    from circuits.twins import NumpyVQC, NumpyVQCActing

    torch.manual_seed(3)
    module = VQC(8, 3, n_qubits=8, layers=2, ansatz="rzryrz_ring", output="relu_linear", scaling="atan")
    x = np.random.default_rng(3).normal(size=(64, 8))
    acting, training, older = NumpyVQCActing(module), NumpyVQC(module), NumpyVQC(module)
    for twin in (acting, training, older):
        twin.plan(64)  # a planner made before the snapshot: left out of it
    assert acting.plan(64).variant == training.plan(64).variant == "columns"
    blocks = NumpyVQCActing(module)
    blocks.use_columns = False
    want = blocks.forward(x)[0]
    assert blocks.plan(64).variant == "blocks"
    del older.__dict__["use_columns"]
    state = pickle.loads(pickle.dumps({"workers": [acting, training, older]}))
    assert all("_planner" not in twin.__dict__ for twin in state["workers"])
    assert "use_columns" not in state["workers"][2].__dict__
    upgrade(state, 4)
    acting4, training4, older4 = state["workers"]
    assert (acting4.use_columns, training4.use_columns, older4.use_columns) == (False, True, False)
    assert (acting4.plan(64).variant, training4.plan(64).variant, older4.plan(64).variant) == ("blocks", "columns", "blocks")
    np.testing.assert_array_equal(acting4.forward(x)[0], want)
    again = pickle.loads(pickle.dumps(acting))
    assert again.use_columns is True and again.plan(64).variant == "columns"


def test_a_version_6_recurrent_q_worker_resumes_exactly_like_the_current_one(tmp_path):
    """Version 6's SequenceAssembler kept its one env copy's open episode as plain values (steps, first,
    start, covered); version 7's keeps lists, one entry per copy. The same checkpoint of a recurrent QMIX
    run, its assemblers written back as version 6 held them, resumes to the bytes of today's."""
    import yaml

    raw = yaml.safe_load((ROOT / "scenarios" / "spread_qmix.yaml").read_text())
    raw["run"] = {"seed": 0, "total_env_steps": 1200, "progress": False, "plots": False}
    raw["backend"] = {"name": "sim", "workers": 2}
    raw["scenario"]["max_cycles"] = 10
    raw["algorithm"].update(chunk_steps=7, hypernet_embed=8, mixer_embed_dim=8)
    raw["algorithm"]["replay"].update(learning_starts=200, ratio=0.05, batch_size=8, sequence=6, burn_in=2)
    raw["critic"] = {"head": "mlp", "hidden": [16], "recurrent": "gru"}
    seen = []

    def as_version_6(snap, meta):
        state = _raw(snap)["state"]
        for obj in _reachable_objects(state):
            if type(obj).__name__ == "SequenceAssembler":
                assert len(obj.first) == 1  # a TeamEnv: one copy
                for key in ("steps", "first", "start", "covered"):
                    obj.__dict__[key] = obj.__dict__[key][0]
                seen.append(len(obj.steps))
        _write_as_version(snap, meta, state, 6)

    _resumes_as_today(raw, tmp_path, as_version_6)
    assert len(seen) == 2 and any(seen)  # both workers' assemblers, at least one with an open window
