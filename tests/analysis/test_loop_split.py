"""analysis.loop_split: a team learner's rollout and update timed apart, and its bad input refused."""
from __future__ import annotations

import pytest

from analysis import loop_split

SMALL = ["algorithm.envs_per_worker=2", "algorithm.n_steps=8", "algorithm.epochs=1"]


def test_split_times_both_halves_per_env_step_of_a_batched_and_a_plain_vector():
    batched = loop_split.split("scenarios/spread_mappo.yaml", SMALL, rollouts=2, warmup=0, repeats=3)
    # two copies: the first rollout's first step only resets them (pending), so the second rollout takes 2 x 8
    assert batched["copies"] == 2 and batched["env_steps_per_rollout"] == 16
    assert all(isinstance(batched[key], float) for key in ("rollout_s", "update_s"))  # times: not asserted on
    assert list(batched["calls"]) == ["the batch's step", "the batch's observations", "the team vector's step",
                                      "filling the rows", "filling the rows, acting and sampling (act_rows)"]
    plain = loop_split.split("scenarios/spread_mappo.yaml", SMALL + ["scenario.engine=mpe2"], rollouts=1, warmup=1,
                             repeats=2)  # mpe2's env: stepped copy by copy, no batch of its own
    assert list(plain["calls"]) == ["the team vector's step", "filling the rows",
                                    "filling the rows, acting and sampling (act_rows)"]
    # one epoch of one minibatch is the single clip-free pass, not PPO's numpy epochs: no minibatch split
    assert batched["minibatch"] == {} and plain["minibatch"] == {}


def test_split_times_one_minibatch_of_the_numpy_epochs():
    r = loop_split.split("scenarios/spread_ippo_jaxmarl.yaml", ["algorithm.envs_per_worker=2", "algorithm.n_steps=16"],
                         rollouts=1, warmup=1, repeats=2)
    parts = dict(r["minibatch"])
    # the rollout's valid rows (3 agents an env step; a restart step is not one) in 4 minibatches
    rows = r["env_steps_per_rollout"] * 3
    assert 0 < rows < 2 * 3 * 16 and parts.pop("rows") in (rows // 4, -(-rows // 4))
    assert list(parts) == ["gathering its rows", "the actor's forward", "the critic's forward",
                           "the loss's gradient (loss_grad)", "the critic's backward", "the actor's backward",
                           "the clip and the optimizer step"]
    recurrent = loop_split.split("scenarios/spread_mappo_gru.yaml", ["algorithm.envs_per_worker=2", "algorithm.n_steps=25"],
                                 rollouts=1, warmup=0, repeats=1)
    assert recurrent["minibatch"] == {} and recurrent["env_steps_per_rollout"] > 0  # chunked BPTT: not the numpy epochs


def test_main_prints_the_split(capsys):
    assert loop_split.main(["scenarios/spread_mappo.yaml", *[x for kv in SMALL for x in ("--set", kv)],
                            "--rollouts", "1", "--warmup", "0", "--repeats", "2"]) == 0
    out = capsys.readouterr().out
    assert "per env step: rollout" in out and "update" in out and "us a call" in out


@pytest.mark.parametrize("argv, fault", [
    (["scenarios/no_such_file.yaml"], "no_such_file.yaml"),
    (["scenarios/spread_mappo.yaml", "--rollouts", "0"], "--rollouts: must be at least 1"),
    (["scenarios/spread_mappo.yaml", "--warmup", "-1"], "--warmup: must be at least 0"),
    (["scenarios/spread_mappo.yaml", "--set", "algorithm.n_steps=oops"], "n_steps"),
    (["scenarios/cartpole_a3c.yaml"], "has no team worker"),
])
def test_bad_input_exits_2_naming_the_fault(argv, fault, capsys):
    assert loop_split.main(argv) == 2
    assert fault in capsys.readouterr().err
