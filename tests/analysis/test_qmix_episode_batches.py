"""analysis/qmix_episode_batches.py: its sampler draws whole, distinct, aligned episodes from a ring
that has wrapped, and refuses batches that are not whole episodes."""
from __future__ import annotations

import numpy as np
import pytest

from agents.replay import Field, ReplayBuffer
from analysis import qmix_episode_batches as exp


def test_batches_are_whole_distinct_episodes():
    buffer = ReplayBuffer([Field("t", (), np.int64), Field("episode", (), np.int64)], 250)
    for episode in range(12):  # 12 episodes of 25 steps in a ring of 10: the last 10 stay, wrapped
        buffer.add({"t": np.arange(25), "episode": np.full(25, episode)})
    rows = exp.episode_rows(buffer, 100, np.random.default_rng(0))
    batch = buffer.gather(rows)
    t, episode = batch["t"].reshape(4, 25), batch["episode"].reshape(4, 25)
    assert np.all(t == np.arange(25)) and np.all(episode == episode[:, :1])  # each block one episode, in order
    assert len(set(episode[:, 0])) == 4 and set(episode[:, 0]) <= set(range(2, 12))
    seen = {int(e) for seed in range(50) for e in buffer.gather(exp.episode_rows(buffer, 25, np.random.default_rng(seed)))["episode"]}
    assert seen == set(range(2, 12))  # every stored episode can be drawn


def test_a_batch_that_is_not_whole_episodes_is_refused():
    buffer = ReplayBuffer([Field("t", (), np.int64)], 100)
    buffer.add({"t": np.arange(50)})
    with pytest.raises(SystemExit, match="multiples of EPISODE_STEPS=25"):
        exp.episode_rows(buffer, 30, np.random.default_rng(0))


def test_settings_that_cannot_give_whole_episodes_exit_2_before_the_run(tmp_path, capsys):
    out = tmp_path / "never"
    code = exp.main(["run", "scenarios/spread_qmix.yaml", "--set", "algorithm.replay.batch_size=810",
                     "--set", "algorithm.chunk_steps=10", "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 2 and "algorithm.chunk_steps=10" in err and "algorithm.replay.batch_size=810" in err
    assert not out.exists()  # nothing was started
    assert exp.main(["run", "scenarios/spread_qmix_gru.yaml", "--out", str(out)]) == 2
    assert "no feed-forward replay" in capsys.readouterr().err and not out.exists()

