"""COMA, IAC and central-V through the runtime: tiny runs, the trajectory service's checks, bad input."""
from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest
import torch

from agents.coma import TRAJECTORY, PARAMS, play_episode, trajectory_problem
from marl_q.config import build_config, load_config
from marl_q.errors import ConfigError
from marl_q.experiment import run_experiment
from marl_q.ledger import Ledger
from marl_q.registry import ALGORITHMS
from marl_q.server import Server

torch.set_num_threads(1)
SCENARIO_DIR = Path(__file__).resolve().parents[2] / "scenarios"


def _raw(algorithm: str = "coma", aggregation: str = "buffered", workers: int = 2, steps: int = 200, **scenario) -> dict:
    return {
        "run": {"seed": 0, "total_env_steps": steps, "progress": False, "plots": False},
        "backend": {"name": "sim", "workers": workers},
        "server": {"aggregation": aggregation, "buffer_k": 2},
        "scenario": {"name": "team_cue", "n_agents": 3, "n_cues": 3, "episode_length": 5, **scenario},
        "algorithm": {"name": algorithm, "eval_episodes": 3, "team_reward": "mean"},
        "actor": {"head": "mlp", "hidden": [16]},
        "critic": {"head": "mlp", "hidden": [16]},
    }


@pytest.mark.parametrize("algorithm", ["coma", "iac", "central_v"])
def test_tiny_run_writes_the_summary_the_issue_asks_for(algorithm: str) -> None:
    summary = run_experiment(build_config(_raw(algorithm)), out=None)
    assert summary["env_steps"] >= 200
    assert summary["trajectories_accepted"] > 0 and summary["trajectories_rejected"] == 0
    assert summary["learning_updates"] == summary["server_version"] > 0
    for key in ("final_return", "eval_return", "actor_params", "critic_params"):
        assert summary[key] is not None, key
    assert 0.0 <= summary["eval_return"] <= 5.0  # team_cue's return lies in [0, episode_length]
    assert sum(summary["staleness_hist"].values()) == summary["trajectories_accepted"]


def test_a_quantum_actor_with_the_classical_critic_runs_end_to_end() -> None:
    raw = _raw("coma", steps=100)
    # actor input: cue one-hot (3) + agent id one-hot (3) = 6 features, one qubit each
    raw["actor"] = {"head": "vqc", "n_qubits": 6, "layers": 1, "output": "scaled"}
    summary = run_experiment(build_config(raw), out=None)
    assert summary["learning_updates"] > 0 and summary["eval_return"] is not None
    # 6 qubits x 1 strongly entangling layer x 3 angles + 3 output scales
    assert summary["actor_params"] == 6 * 3 + 3


def test_a_head_that_cannot_take_the_actor_input_is_a_config_error_at_load() -> None:
    raw = _raw("coma")
    raw["actor"] = {"head": "vqc", "n_qubits": 3, "layers": 1}
    with pytest.raises(ConfigError, match=r"actor: .*in_dim 6 > n_qubits 3"):
        build_config(raw)


def test_critic_sizes_differ_as_the_critics_see_different_inputs() -> None:
    sizes = {a: run_experiment(build_config(_raw(a, steps=20)), out=None)["critic_params"] for a in ("coma", "iac", "central_v")}
    # hidden 16: coma in = state 9 + obs 3 + actions 3*3 + id 3 = 24 -> 16 -> 3 outputs
    assert sizes["coma"] == 24 * 16 + 16 + 16 * 3 + 3
    assert sizes["iac"] == (3 + 3) * 16 + 16 + 16 + 1
    assert sizes["central_v"] == 9 * 16 + 16 + 16 + 1


def test_coma_learns_the_team_cue_game_without_id_shift_from_400_episodes() -> None:
    raw = _raw("coma", aggregation="buffered", workers=2, steps=2000, id_shift=False)
    raw["algorithm"].update({"actor_lr": 3e-3, "critic_lr": 3e-3, "epsilon_start": 0.5, "epsilon_anneal_steps": 1500,
                             "gamma": 0.5, "eval_episodes": 20})
    raw["actor"].update({"hidden": [32], "out_gain": 0.01})
    raw["critic"]["hidden"] = [64]
    summary = run_experiment(build_config(raw), out=None)
    # uniform play scores 5/3 per episode; every agent answering right scores 5
    assert summary["eval_return"] > 4.5
    assert summary["final_return"] > 4.0


def test_sync_collection_waits_for_every_worker_before_learning() -> None:
    cfg = build_config(_raw("coma", aggregation="sync", workers=3))
    algo = ALGORITHMS.get("coma").obj(cfg)
    service = algo.make_service()
    server = Server(service, ["w0", "w1", "w2"], cfg.server, Ledger(None))
    workers = [algo.make_worker(i) for i in range(3)]
    for w in workers:
        for reply in server.receive(w.start()[0], 0.0):
            w.deliver(reply)
    replies = server.receive(workers[0].step().messages[0], 1.0)
    assert replies == [] and server.version == 0
    assert server.receive(workers[1].step().messages[0], 2.0) == [] and server.version == 0
    replies = server.receive(workers[2].step().messages[0], 3.0)
    assert server.version == 1 and sorted(r.dst for r in replies) == ["w0", "w1", "w2"]
    assert all(r.kind == PARAMS and r.base_version == 1 for r in replies)


def _rejections(server: Server, path: Path) -> list[dict]:
    """The rejected rows of the ledger, read back from its comm.csv."""
    server.ledger.flush()
    with open(path) as fh:
        return [row for row in csv.DictReader(fh) if row["accepted"] == "0"]


def _service_and_server(path: Path, workers: int = 1):
    cfg = build_config(_raw("coma", aggregation="hogwild", workers=workers))
    algo = ALGORITHMS.get("coma").obj(cfg)
    service = algo.make_service()
    server = Server(service, [f"w{i}" for i in range(workers)], cfg.server, Ledger(path))
    worker = algo.make_worker(0)
    worker.deliver(server.receive(worker.start()[0], 0.0)[0])
    return service, server, worker


def test_wrong_agent_set_is_rejected_with_a_reason_counted_and_the_run_goes_on(tmp_path: Path) -> None:
    service, server, worker = _service_and_server(tmp_path / "comm.csv")
    msg = worker.step().messages[0]
    msg.info = {"agents": ["agent_0", "agent_1", "intruder"]}
    replies = server.receive(msg, 1.0)
    assert server.version == 0 and replies[0].kind == PARAMS  # the worker is answered and can go on
    [row] = _rejections(server, tmp_path / "comm.csv")
    assert row["kind"] == TRAJECTORY and row["reason"].startswith("agents:") and "intruder" in row["reason"]
    worker.deliver(replies[0])
    server.receive(worker.step().messages[0], 2.0)
    assert server.version == 1
    assert service.summary()["trajectories_rejected"] == 1
    assert service.summary()["rejections_by_field"] == {"agents": 1}
    assert server.ledger.totals()["rejected"] == 1


@pytest.mark.parametrize("field, cut", [("rewards", 1), ("obs", 2), ("behaviour_logp", 1)])
def test_inconsistent_lengths_are_rejected_with_the_field_named(field: str, cut: int, tmp_path: Path) -> None:
    service, server, worker = _service_and_server(tmp_path / "comm.csv")
    msg = worker.step().messages[0]
    msg.payload[field] = msg.payload[field][:-cut]
    server.receive(msg, 1.0)
    [row] = _rejections(server, tmp_path / "comm.csv")
    assert row["reason"].startswith("length") and field in row["reason"] and server.version == 0
    assert service.summary()["rejections_by_field"] == {"length": 1}


def test_payload_shape_errors_are_left_to_the_core(tmp_path: Path) -> None:
    """A trajectory with four agents' columns never reaches the service: the core's shape check rejects it."""
    service, server, worker = _service_and_server(tmp_path / "comm.csv")
    msg = worker.step().messages[0]
    msg.payload["actions"] = np.zeros((6, 4), dtype=np.int64)
    server.receive(msg, 1.0)
    [row] = _rejections(server, tmp_path / "comm.csv")
    assert row["reason"].startswith("actions: shape") and service.summary()["trajectories_rejected"] == 0


def test_trajectory_problem_names_bad_actions_and_terminations(tmp_path: Path) -> None:
    service, server, worker = _service_and_server(tmp_path / "comm.csv")
    good = worker.step().messages[0]
    agents, dims = service.desc.agents, service.desc.dims
    assert trajectory_problem(good.payload, good.info, agents, dims) is None
    bad = {k: v.copy() for k, v in good.payload.items()}
    bad["actions"][0, 0] = 7
    assert trajectory_problem(bad, good.info, agents, dims).startswith("actions")
    bad = {k: v.copy() for k, v in good.payload.items()}
    bad["terminated"][0] = 1.0
    assert trajectory_problem(bad, good.info, agents, dims).startswith("terminated")


def test_a_shared_actor_over_different_action_spaces_is_a_clear_error_at_start() -> None:
    raw = _raw("coma")
    raw["scenario"] = {"name": "speaker_listener", "max_cycles": 5}
    with pytest.raises(ConfigError, match=r"same action space.*speaker_0: 3, listener_0: 5.*common_spaces"):
        build_config(raw)  # the config loader asks the algorithm, so a run never starts
    raw["scenario"]["common_spaces"] = True
    summary = run_experiment(build_config(raw), out=None)
    assert summary["trajectories_accepted"] > 0


def test_padded_actions_are_never_taken_under_the_mask() -> None:
    raw = _raw("coma")
    raw["scenario"] = {"name": "speaker_listener", "max_cycles": 25, "common_spaces": True}
    algo = ALGORITHMS.get("coma").obj(build_config(raw))
    worker = algo.make_worker(0)
    rng = np.random.default_rng(0)
    for _ in range(5):
        ep = play_episode(worker.env, worker.actor, worker.desc, 0.5, rng, "sum")
        speaker = worker.desc.agents.index("speaker_0")
        assert ep["actions"][:, speaker].max() <= 2


@pytest.mark.parametrize("scenario", [{"name": "spread", "max_cycles": 10},
                                      {"name": "speaker_listener", "max_cycles": 10, "common_spaces": True}])
def test_numpy_acting_draws_the_torch_actions(scenario: dict) -> None:
    """The numpy twin of the shared actor (fast_path) against the torch forward: the same episodes
    (same actions from the same generator) and behaviour log-probabilities to float32 rounding,
    with masked actions (speaker_listener) and greedy play."""
    raw = _raw("coma")
    raw["scenario"] = scenario
    algo = ALGORITHMS.get("coma").obj(build_config(raw))
    worker = algo.make_worker(0)
    assert worker._np_actor is not None
    with torch.no_grad():
        for p in worker.actor.parameters():  # away from the near-uniform start, so actions depend on obs
            p.mul_(30.0)
    for greedy in (False, True):
        episodes = []
        for np_actor in (None, worker._np_actor):
            rng = np.random.default_rng(5)
            episodes.append([play_episode(worker.env, worker.actor, worker.desc, 0.2, rng, "sum", greedy=greedy,
                                          seed=11 + i, np_actor=np_actor) for i in range(4)])
        for ref, fast in zip(*episodes):
            np.testing.assert_array_equal(fast["actions"], ref["actions"])
            np.testing.assert_allclose(fast["behaviour_logp"], ref["behaviour_logp"], rtol=1e-4, atol=1e-5)
            np.testing.assert_array_equal(fast["rewards"], ref["rewards"])
        assert len({tuple(ep["actions"].reshape(-1)) for ep in episodes[0]}) > 1


def test_checkpoint_state_round_trips(tmp_path: Path) -> None:
    service, server, worker = _service_and_server(tmp_path / "a.csv")
    server.receive(worker.step().messages[0], 1.0)
    state = service.state_dict()
    other, _, _ = _service_and_server(tmp_path / "b.csv")
    other.load_state_dict(state)
    assert np.array_equal(other.actor_vector(), service.actor_vector())
    assert other.updates() == service.updates() == 1


@pytest.mark.parametrize("name", ["team_cue_coma.yaml", "spread_coma.yaml", "speaker_listener_coma.yaml"])
def test_scenario_files_load_and_run_a_few_episodes(name: str, tmp_path: Path) -> None:
    cfg = load_config(SCENARIO_DIR / name, ["run.total_env_steps=60", "run.progress=false", "run.plots=false",
                                            "algorithm.eval_episodes=1", "backend.workers=2"])
    summary = run_experiment(cfg, out=tmp_path / "run")
    assert (tmp_path / "run" / "summary.json").is_file()
    assert summary["trajectories_accepted"] >= 1


@pytest.mark.parametrize("key, value, message", [
    ("bootstrap", "mean", r"algorithm.bootstrap: unknown value 'mean' \(choices: sampled, expected\)"),
    ("bootstrap_samples", 0, r"bootstrap_samples: must be at least 1, got 0"),
    ("critic_warmup_updates", -1, r"critic_warmup_updates: must be >= 0, got -1"),
])
def test_bad_gamma_remedy_settings_are_named_config_errors(key: str, value: object, message: str) -> None:
    raw = _raw("coma")
    raw["algorithm"][key] = value
    with pytest.raises(ConfigError, match=message):
        build_config(raw)


def test_the_gamma_remedies_run_end_to_end_and_the_dueling_critic_has_one_more_output() -> None:
    raw = _raw("coma", steps=100)
    raw["algorithm"].update({"bootstrap": "expected", "bootstrap_samples": 2, "critic_warmup_updates": 3,
                             "critic_dueling": True, "gamma": 0.99, "td_lambda": 0.0})
    summary = run_experiment(build_config(raw), out=None)
    assert summary["learning_updates"] > 3 and summary["trajectories_rejected"] == 0
    # same critic as the plain one (in 24 -> 16 -> out) with out = |U| + 1 = 4: the value and 3 differences
    assert summary["critic_params"] == 24 * 16 + 16 + 16 * 4 + 4


def test_workers_mark_a_torch_circuit_actor_acting_only_and_leave_numpy_actors_alone() -> None:
    from agents.coma import ComaWorker

    raw = _raw("coma", steps=50)
    from agents.numpy_heads import NumpyVQCActing

    raw["actor"] = {"head": "vqc", "n_qubits": 4, "layers": 1, "preprocess": "linear", "output": "linear"}
    worker = ComaWorker(build_config(raw), 0)  # a dense-path circuit acts through its numpy forward
    assert isinstance(worker._np_actor, NumpyVQCActing) and worker.actor.acting_only
    raw["actor"]["shots"] = 100  # shots have no numpy pass (the twins are exact): torch, acting only
    worker = ComaWorker(build_config(raw), 0)
    assert worker._np_actor is None and worker.actor.acting_only
    mlp_worker = ComaWorker(build_config(_raw("coma", steps=50)), 0)
    assert mlp_worker._np_actor is not None
