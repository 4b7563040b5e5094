"""Snapshots written by earlier versions still resume: the plain-pickle format from before torch's
pickler, and workers pickled before the one-step forward reuse and the numpy path existed."""
from __future__ import annotations

import hashlib
import pickle

import numpy as np
import pytest

from agents.actor_critic import ActorCriticWorker
from marl_q.config import build_config
from marl_q.rundir import CheckpointError, load_snapshot, save_snapshot
from marl_q.state_format import upgrade


def test_plain_pickle_snapshots_load_and_are_hash_checked(tmp_path):
    obj = {"events": [(1.5, "w0", np.arange(4))], "version": 7}
    old = tmp_path / "old.sim.pkl"
    old.write_bytes(pickle.dumps(obj))
    digest = hashlib.sha256(old.read_bytes()).hexdigest()
    back = load_snapshot(old, digest)
    assert back["version"] == 7 and np.array_equal(back["events"][0][2], np.arange(4))
    with pytest.raises(CheckpointError, match="does not match"):
        load_snapshot(old, "0" * 64)
    new = tmp_path / "new.sim.pkl"
    assert load_snapshot(new, save_snapshot(new, obj))["version"] == 7  # the current format


def test_a_worker_pickled_before_reuse_and_numpy_path_takes_them_up(small_raw):
    small_raw["algorithm"]["n_steps"] = 1
    worker = ActorCriticWorker(build_config(small_raw), 0)
    assert worker._np_heads is not None
    state = dict(worker.__dict__)
    for key in ("_reuse_act_forward", "_rollout_logits", "_np_heads", "_rollout_np"):
        del state[key]
    old = ActorCriticWorker.__new__(ActorCriticWorker)
    old.__dict__.update(state)
    # a version-0 snapshot unpickles the worker as it was, then migrates it (marl_q.state_format)
    back = upgrade({"workers": [pickle.loads(pickle.dumps(old))]}, 0)["workers"][0]
    assert back._reuse_act_forward and back._np_heads is not None and back._rollout_np is None
    from marl_q.messages import SERVER, Message

    back.deliver(Message(SERVER, "w0", "params", {"params": back.flat.numpy()}, base_version=0))
    grad = back.step().messages[0].payload["grad"]
    assert grad.shape == (back.flat.size,) and np.isfinite(grad).all() and np.abs(grad).max() > 0
