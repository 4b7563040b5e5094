"""analysis/peers/sb3_defaults.py: what it runs is set up right (no training here)."""
from __future__ import annotations

from analysis.peers.sb3_defaults import OLD_DEFAULTS, SCENARIO, main, overrides_of, random_return
from marl_q.config import load_config


def test_overrides_go_under_algorithm_unless_a_section_is_named():
    assert overrides_of("lr=3e-4; actor.out_gain=1.0;;epochs=10") == [
        "algorithm.lr=3e-4", "actor.out_gain=1.0", "algorithm.epochs=10"]


def test_old_defaults_are_what_the_config_used_to_resolve():
    old = load_config(SCENARIO, overrides_of(";".join(f"{k}={v}" for k, v in OLD_DEFAULTS.items())))
    new = load_config(SCENARIO)
    assert (old.actor.out_gain, new.actor.out_gain) == (1.0, 0.01)
    o, n = old.algorithm.params, new.algorithm.params
    assert (o.n_steps, o.epochs, o.minibatches, o.lr, o.ent_coef, o.value_clip) == (128, 4, 4, 2.5e-4, 0.01, 0.2)
    assert (n.n_steps, n.epochs, n.minibatches, n.lr, n.ent_coef, n.value_clip) == (256, 10, 32, 3e-4, 0.0, None)
    assert old.critic.params == new.critic.params


def test_random_return_is_seeded():
    value = random_return("marlq/SmallReward-v0", {}, 5)
    assert value == random_return("marlq/SmallReward-v0", {}, 5) and 2.0 < value < 7.0


def test_a_wrong_env_is_one_line_and_exit_2(tmp_path, capsys):
    assert main(["--env", "nosuch/Env-v0", "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "nosuch/Env-v0" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()
