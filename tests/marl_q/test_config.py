"""Config loading: typed validation, helpful errors, overrides, the resolved file."""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from marl_q.cli import main
from marl_q.config import apply_override, build_config, load_config
from marl_q.errors import ConfigError


def write(tmp_path: Path, data) -> Path:
    p = tmp_path / "c.yaml"
    p.write_text(yaml.safe_dump(data) if not isinstance(data, str) else data)
    return p


def test_defaults_filled_and_discriminators(small_raw):
    cfg = build_config(small_raw)
    assert cfg.algorithm.name == "a3c" and cfg.algorithm.lr == 7e-4  # default filled
    assert cfg.actor.name == "mlp" and cfg.actor.hidden == [16, 16]
    assert cfg.backend.compute.step_s == 1e-4
    resolved = cfg.to_dict()
    assert resolved["algorithm"]["name"] == "a3c" and resolved["actor"]["head"] == "mlp"
    # the resolved config is itself a valid config that resolves to the same thing
    assert build_config(yaml.safe_load(cfg.to_yaml())).to_dict() == resolved


def test_malformed_yaml_names_file_and_line(tmp_path):
    p = write(tmp_path, "run:\n  seed: [1, 2\nbackend: {}\n")
    with pytest.raises(ConfigError, match=r"c.yaml: malformed YAML \(line \d+"):
        load_config(p)


def test_unknown_key_suggests_closest(small_raw):
    small_raw["algorithm"]["n_step"] = 5
    with pytest.raises(ConfigError, match=r"algorithm.n_step: unknown key; did you mean 'algorithm.n_steps'\?"):
        build_config(small_raw)
    small_raw["algorithm"].pop("n_step")
    small_raw["servr"] = {}
    with pytest.raises(ConfigError, match=r"did you mean 'server'"):
        build_config(small_raw)


def test_wrong_type_names_key_value_and_expected(small_raw):
    small_raw["backend"]["workers"] = "four"
    with pytest.raises(ConfigError, match=r"backend.workers: expected an integer, got 'four'"):
        build_config(small_raw)
    small_raw["backend"]["workers"] = 2
    small_raw["run"]["progress"] = "yes please"
    with pytest.raises(ConfigError, match=r"run.progress: expected true or false"):
        build_config(small_raw)


def test_unknown_choice_lists_choices(small_raw):
    small_raw["server"]["aggregation"] = "hogwlid"
    with pytest.raises(ConfigError, match=r"server.aggregation: unknown value 'hogwlid'; did you mean 'hogwild'\?.*choices: buffered, hogwild, sync"):
        build_config(small_raw)
    small_raw["server"]["aggregation"] = "sync"
    small_raw["algorithm"]["optimizer"] = "adamw"
    with pytest.raises(ConfigError, match=r"algorithm.optimizer: unknown value 'adamw'.*rmsprop"):
        build_config(small_raw)


def test_numeric_text_and_integral_floats_accepted(small_raw):
    small_raw["run"]["total_env_steps"] = "1e5"  # YAML reads 1e5 as text
    assert build_config(small_raw).run.total_env_steps == 100000
    small_raw["run"]["total_env_steps"] = 2.5
    with pytest.raises(ConfigError, match="expected an integer"):
        build_config(small_raw)


def test_overrides_are_typed_and_dotted(small_raw):
    apply_override(small_raw, "server.aggregation=sync")
    apply_override(small_raw, "backend.compute.stragglers=[1]")
    apply_override(small_raw, "backend.compute.straggler_factor=10")
    apply_override(small_raw, "run.progress=false")
    cfg = build_config(small_raw)
    assert cfg.server.aggregation == "sync" and cfg.backend.compute.stragglers == [1]
    assert cfg.backend.compute.straggler_factor == 10.0 and cfg.run.progress is False
    with pytest.raises(ConfigError, match="expected key=value"):
        apply_override(small_raw, "server.aggregation")
    with pytest.raises(ConfigError, match="is a value, not a section"):
        apply_override(small_raw, "run.seed.x=1")


def test_cross_checks(small_raw):
    small_raw["backend"]["compute"] = {"stragglers": [5]}
    with pytest.raises(ConfigError, match="worker index 5 out of range"):
        build_config(small_raw)
    small_raw["backend"]["compute"] = {}
    small_raw["run"].pop("total_env_steps")
    with pytest.raises(ConfigError, match="needs a budget"):
        build_config(small_raw)


@pytest.mark.parametrize("content, needle", [
    ("run: {seed: [1,\n", "malformed YAML"),
    ("run: {sed: 1, total_env_steps: 10}\nscenario: {name: cartpole}\nalgorithm: {name: a3c}\n", "did you mean 'run.seed'"),
    ("run: {seed: x, total_env_steps: 10}\nscenario: {name: cartpole}\nalgorithm: {name: a3c}\n", "run.seed: expected an integer"),
    # the actor-critic knobs are checked once, by ActorCriticConfig.validate
    ("run: {seed: 0, total_env_steps: 10}\nscenario: {name: cartpole}\nalgorithm: {name: ppo, epochs: 0}\n",
     "algorithm.epochs: must be at least 1, got 0"),
    ("run: {seed: 0, total_env_steps: 10}\nscenario: {name: cartpole}\nalgorithm: {name: a3c, epochs: 2}\n",
     "epochs > 1 needs update: delta"),
])
def test_cli_bad_config_exits_2_and_writes_nothing(tmp_path, capsys, content, needle):
    p = write(tmp_path, content)
    out = tmp_path / "run"
    assert main(["run", str(p), "--out", str(out)]) == 2
    assert needle in capsys.readouterr().err
    assert not out.exists()


def test_cli_usage_errors_exit_2(tmp_path, capsys):
    assert main(["run"]) == 2
    assert main(["run", str(tmp_path / "missing.yaml")]) == 2
    assert "no such config file" in capsys.readouterr().err
    assert main(["frobnicate"]) == 2


def test_mlp_out_gain_defaults_by_section(small_raw):
    """A null (unset) out_gain is 0.01 in the actor section and 1.0 in the critic's; a set one is kept,
    and the resolved config.yaml says which was used."""
    del small_raw["actor"]["out_gain"]
    cfg = build_config(small_raw)
    assert (cfg.actor.out_gain, cfg.critic.out_gain) == (0.01, 1.0)
    assert cfg.to_dict()["actor"]["out_gain"] == 0.01
    small_raw["actor"]["out_gain"], small_raw["critic"]["out_gain"] = 1.0, 0.5
    cfg = build_config(small_raw)
    assert (cfg.actor.out_gain, cfg.critic.out_gain) == (1.0, 0.5)


def test_ppo_defaults_as_documented(small_raw):
    """PPO's knobs (SB3's update sizes) are the defaults docs/actor_critic.md lists."""
    small_raw["algorithm"] = {"name": "ppo"}
    del small_raw["actor"]["out_gain"]
    cfg = build_config(small_raw)
    a = cfg.algorithm.params
    assert (a.n_steps, a.epochs, a.minibatches, a.lr, a.optimizer) == (256, 10, 32, 3e-4, "adam")
    assert (a.clip, a.value_clip, a.adv_norm, a.ent_coef, a.vf_coef, a.max_grad_norm) == (0.2, None, True, 0.0, 0.5, 0.5)
    assert (a.gamma, a.gae_lambda) == (0.99, 0.95)
    assert cfg.actor.out_gain == 0.01 and cfg.actor.hidden == [16, 16]


def test_team_and_routing_ppo_keep_the_settings_they_were_measured_with(small_raw):
    """The single-agent PPO defaults moved (issue 26); MAPPO/IPPO and routing PPO pin what they had."""
    from agents.mappo import MultiAgentPPOConfig
    from agents.routing import RoutingPPOConfig

    m, r = MultiAgentPPOConfig(), RoutingPPOConfig()
    assert (m.n_steps, m.epochs, m.minibatches, m.lr, m.ent_coef, m.value_clip) == (25, 10, 1, 7e-4, 0.01, 0.2)
    assert (r.n_steps, r.epochs, r.minibatches, r.lr, r.ent_coef, r.value_clip) == (256, 4, 4, 1e-3, 0.01, 0.2)
