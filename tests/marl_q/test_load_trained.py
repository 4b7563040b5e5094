"""marl_q.rundir.load_trained: one loader for every family (vehicular A3C, COMA, routing PPO).

Each family is trained for a few steps; the loaded policy's logits, probabilities and actions are
checked against the trained models rebuilt here by hand from the checkpoint file (plain np.load and
the heads), not through the algorithm's hook. Then the errors: a missing run directory, config or
checkpoint, a corrupt checkpoint and a checkpoint of other models are UserErrors naming the path,
exit 2 from the CLI.
"""
from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from agents.heads import FlatParameters, build_head
from marl_q.cli import main as cli
from marl_q.config import build_config, load_config
from marl_q.errors import CheckpointError, ConfigError, RunDirError, UserError
from marl_q.experiment import run_experiment
from marl_q.rundir import latest_checkpoint, load_trained
from tests.agents.test_vehicular import _raw as vehicular_raw
from tests.analysis.test_coma_critic import _tiny_run as coma_run

torch.set_num_threads(1)
ROOT = Path(__file__).resolve().parents[2]


def _arrays(run_dir: Path, prefix: str = "service.") -> dict[str, np.ndarray]:
    """The service's arrays of the run's newest checkpoint, read with numpy alone."""
    ckpts = sorted((run_dir / "checkpoints").glob("ckpt_*.npz"), key=lambda p: int(p.name.split(".")[0][5:]))
    with np.load(ckpts[-1], allow_pickle=False) as data:
        return {k[len(prefix):]: data[k] for k in data.files if k.startswith(prefix)}


def _mlp_pair(cfg, in_dim: int, out_dim: int, params: np.ndarray) -> torch.nn.Module:
    """The actor (and its critic, for the flat layout) of an actor-critic config at flat ``params``."""
    actor, critic = build_head(cfg.actor, in_dim, out_dim), build_head(cfg.critic, in_dim, 1)
    FlatParameters(actor, critic).load(params)
    return actor


def _gumbel_by_hand(logits: np.ndarray, seed: int) -> np.ndarray:
    u = np.random.default_rng(seed).random(logits.shape)
    return np.argmax(logits - np.log(-np.log(u)), axis=1)


@pytest.fixture(scope="module")
def vehicular_run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("vehicular") / "run"
    run_experiment(build_config(vehicular_raw(steps=40)), out=out, plots=False)
    return out


def test_vehicular_a3c_acts_like_its_shared_actor(vehicular_run: Path) -> None:
    from scenarios.vehicular_relay import VehicularRelayEnv

    trained = load_trained(vehicular_run)
    assert trained.checkpoint == latest_checkpoint(vehicular_run) and trained.agents is None
    cfg = load_config(vehicular_run / "config.yaml")
    env = VehicularRelayEnv(**{k: v for k, v in vehicular_raw()["scenario"].items() if k != "name"})
    obs, _ = env.reset(seed=11)
    actor = _mlp_pair(cfg, env.obs_dim, 5, _arrays(vehicular_run)["params"])
    names = sorted(obs)
    with torch.no_grad():
        logits = actor(torch.from_numpy(np.stack([obs[n] for n in names]).astype(np.float32))).numpy()
    got = trained.logits(obs)
    assert sorted(got) == names and np.array_equal(np.stack([got[n] for n in names]), logits)
    assert trained.act(obs) == dict(zip(names, np.argmax(logits, axis=1).tolist()))
    assert trained.act(obs, np.random.default_rng(3)) == dict(zip(names, _gumbel_by_hand(logits, 3).tolist()))
    probs = trained.probs(obs)
    soft = np.exp(logits - logits.max(1, keepdims=True))
    assert np.allclose(np.stack([probs[n] for n in names]), soft / soft.sum(1, keepdims=True))
    assert trained.act({}) == {} and trained.act({}, np.random.default_rng(0)) == {}


def test_coma_acts_with_its_actor_and_the_checkpoints_epsilon_floor(tmp_path) -> None:
    from agents.coma import make_env

    run = coma_run(tmp_path, "coma")
    trained = load_trained(run)
    cfg = load_config(run / "config.yaml")
    state = _arrays(run)
    epsilon = cfg.algorithm.params.epsilon(int(state["env_steps"]))
    assert trained.info["epsilon"] == epsilon and 0.0 < epsilon < 1.0
    env = make_env(cfg, 5)
    obs, _ = env.reset(seed=5)
    agents = list(env.possible_agents)
    assert trained.agents == agents
    x = np.stack([obs[a] for a in agents]).astype(np.float32)
    n_actions = int(env.action_space(agents[0]).n)
    actor = build_head(cfg.actor, x.shape[1] + len(agents), n_actions)
    actor.load_state_dict({k[6:]: torch.from_numpy(v) for k, v in state.items() if k.startswith("actor.")})
    with torch.no_grad():
        soft = torch.softmax(actor(torch.from_numpy(np.concatenate([x, np.eye(len(agents), dtype=np.float32)], 1))),
                             -1).numpy().astype(np.float64)
    expected = (1 - epsilon) * soft + epsilon / n_actions
    probs = trained.probs(obs)
    assert np.allclose(np.stack([probs[a] for a in agents]), expected, rtol=1e-6, atol=1e-7)
    assert trained.act(obs) == dict(zip(agents, np.argmax(expected, axis=1).tolist()))
    drawn = trained.act(obs, np.random.default_rng(4))
    logp = np.log(np.stack([probs[a] for a in sorted(agents)]))
    assert drawn == dict(zip(sorted(agents), _gumbel_by_hand(logp, 4).tolist()))
    critic = trained.models["critic"]
    critic_state = {k[7:]: v for k, v in state.items() if k.startswith("critic.")}
    assert all(np.array_equal(p.detach().numpy(), critic_state[k]) for k, p in critic.state_dict().items())


def test_routing_acts_with_each_services_uploaded_actor(tmp_path) -> None:
    from agents.routing import routing_spaces
    from scenarios.routing import RoutingWorld

    overrides = ["run.progress=false", "run.plots=false", "algorithm.n_steps=32", "algorithm.eval_days=0",
                 "algorithm.episode_requests=20", "run.total_env_steps=150"]
    cfg = load_config(ROOT / "scenarios" / "routing_amarl.yaml", overrides)
    run_experiment(cfg, out=tmp_path / "routing", plots=False)
    trained = load_trained(tmp_path / "routing")
    services = list(cfg.scenario.params.services)
    assert trained.agents == services
    state = _arrays(tmp_path / "routing")
    obs_space, act_space = routing_spaces(RoutingWorld(cfg.scenario.params), False)
    rng = np.random.default_rng(0)
    obs = {s: rng.uniform(0.0, 1.0, obs_space.shape).astype(np.float32) for s in services}
    logits = {}
    for i, s in enumerate(services):  # amarl: worker i routes service i
        actor = _mlp_pair(cfg, obs_space.shape[0], int(act_space.n), state[f"policy.w{i}"])
        with torch.no_grad():
            logits[s] = actor(torch.from_numpy(obs[s][None]))[0].numpy()
    assert len({tuple(v) for v in logits.values()}) == len(services)  # three different actors
    assert all(np.array_equal(trained.logits(obs)[s], logits[s]) for s in services)
    assert trained.act(obs) == {s: int(np.argmax(logits[s])) for s in services}
    stacked = np.stack([logits[s] for s in sorted(services)])
    assert trained.act(obs, np.random.default_rng(9)) == dict(zip(sorted(services), _gumbel_by_hand(stacked, 9).tolist()))


def test_missing_and_corrupt_inputs_are_user_errors_naming_the_path(vehicular_run: Path, tmp_path, capsys) -> None:
    with pytest.raises(RunDirError, match=f"{tmp_path / 'nowhere'}: not a run directory"):
        load_trained(tmp_path / "nowhere")
    bare = tmp_path / "bare"
    bare.mkdir()
    with pytest.raises(RunDirError, match=f"{bare}: not a run directory \\(no config.yaml\\)"):
        load_trained(bare)
    run = tmp_path / "run"
    shutil.copytree(vehicular_run, run)
    ckpt = latest_checkpoint(run)
    with pytest.raises(CheckpointError, match=f"{run / 'nope.npz'}: no such checkpoint"):
        load_trained(run, run / "nope.npz")
    ckpt.write_bytes(ckpt.read_bytes()[:200])
    with pytest.raises(CheckpointError, match=f"{ckpt}: truncated or corrupt"):
        load_trained(run)
    assert cli(["vehicular_eval", str(run), "--out", str(tmp_path / "e.csv")]) == 2
    assert f"{ckpt}: truncated or corrupt" in capsys.readouterr().err
    for path in (run / "checkpoints").iterdir():
        path.unlink()
    with pytest.raises(CheckpointError, match=f"{run / 'checkpoints'}: no checkpoint"):
        load_trained(run)
    (run / "config.yaml").write_text("run: [\n")
    with pytest.raises(ConfigError, match=str(run / "config.yaml")):
        load_trained(run)


def test_a_checkpoint_of_other_models_or_an_algorithm_without_a_policy_is_refused(vehicular_run: Path,
                                                                                   tmp_path) -> None:
    run = tmp_path / "run"
    shutil.copytree(vehicular_run, run)
    config = run / "config.yaml"
    config.write_text(config.read_text().replace("- 16", "- 12"))  # the heads' hidden width
    assert load_config(config).actor.params.hidden == [12]
    with pytest.raises(CheckpointError, match=f"{latest_checkpoint(run)}: does not hold the parameters"):
        load_trained(run)
    lsvi = tmp_path / "lsvi"
    run_experiment(load_config(ROOT / "scenarios" / "linear_mdp_regret.yaml",
                               ["run.total_episodes=5", "run.progress=false"]), out=lsvi)
    with pytest.raises(UserError, match="has no acting policy"):
        load_trained(lsvi)
