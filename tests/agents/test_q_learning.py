"""The replay service and the Q-learners on the server (agents/q_learning.py).

- sim reruns are byte-identical and a run stopped with a non-empty buffer resumes exactly;
- the ledger's accepted transitions (bytes / bytes per transition) equal the buffer's insert count;
- the n-step assembler sends each complete window once across chunk boundaries, as one n-step pass
  over the whole sequence would;
- the learner's VDN/QMIX update uses the mixers and targets of agents/value_targets.py (by hand);
- the buffer pickles its filled rows only, and comes back identical;
- evaluation during training (run.eval_every) plays greedy episodes (the masked argmax of the server's
  Q-network, as a plain loop over the raw env computes them) and leaves the run's bytes as they were;
- config errors exit 2 with one line;
- ``algorithm.lr_schedule: linear``: every Adam step takes lr * (1 - progress), progress the run's env
  steps (train.csv's count at that update) over its budget, by hand; constant keeps lr; resume is exact;
- the same for a GRU Q-network on sequence replay (SMALL_QMIX_GRU; its own tests: test_q_recurrent.py),
  whose greedy evaluation carries the state from zeros at each episode's start.
"""
from __future__ import annotations

import csv
import dataclasses
import json
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch

from agents.q_learning import NStepAssembler, QConfig, QDims, QLearner, TRANSITIONS
from agents.recurrent import is_recurrent
from agents.replay import ReplayBuffer, n_step_chunk, transition_fields
from agents.value_targets import QMixer
from marl_q.cli import main
from marl_q.config import load_config
from marl_q.errors import ConfigError
from marl_q.experiment import resume_experiment, run_experiment

SCEN = Path(__file__).resolve().parents[2] / "scenarios"
QUIET = ["run.progress=false", "run.plots=false"]
SMALL_DQN = QUIET + ["run.total_env_steps=1500", "algorithm.chunk_steps=64", "algorithm.replay.learning_starts=300",
                     "algorithm.replay.ratio=0.125", "algorithm.replay.batch_size=16", "algorithm.target_update_every=100",
                     "critic.hidden=[16, 16]", "algorithm.double=true", "algorithm.replay.n_step=3"]
SMALL_QMIX = QUIET + ["run.total_env_steps=800", "backend.workers=2", "algorithm.replay.learning_starts=200",
                      "algorithm.replay.ratio=0.05", "algorithm.replay.batch_size=8", "critic.hidden=[16]",
                      "algorithm.hypernet_embed=8", "algorithm.mixer_embed_dim=8", "scenario.max_cycles=10",
                      "algorithm.chunk_steps=10"]
# a GRU Q-network on sequences of 6 steps with a burn-in of 2 (10-step episodes: windows 0-6 and 4-10)
SMALL_QMIX_GRU = SMALL_QMIX + ["critic.recurrent=gru", "algorithm.replay.sequence=6", "algorithm.replay.burn_in=2",
                               "algorithm.chunk_steps=7"]
# a recurrent dqn: CartPole's 3 copies as a team of one, 8-step sequences with a burn-in of 2
SMALL_DQN_GRU = QUIET + ["run.total_env_steps=1500", "scenario.num_envs=3", "algorithm.chunk_steps=32",
                         "algorithm.replay.learning_starts=200", "algorithm.replay.ratio=0.02",
                         "algorithm.replay.batch_size=4", "algorithm.target_update_every=100", "critic.hidden=[8]",
                         "critic.recurrent=gru", "algorithm.replay.sequence=8", "algorithm.replay.burn_in=2",
                         "algorithm.double=true"]


def _files(run: Path) -> dict[str, bytes]:
    return {f: (run / f).read_bytes() for f in ("metrics.csv", "comm.csv", "train.csv")}


@pytest.mark.parametrize("name,overrides", [("cartpole_dqn.yaml", SMALL_DQN + ["algorithm.replay.prioritized=true"]),
                                            ("spread_qmix.yaml", SMALL_QMIX),
                                            ("spread_qmix.yaml", SMALL_QMIX + ["server.max_staleness=0"]),
                                            ("spread_qmix.yaml", SMALL_QMIX_GRU),
                                            ("cartpole_dqn.yaml", SMALL_DQN_GRU)])
def test_sim_rerun_is_byte_identical_and_the_ledger_counts_every_inserted_transition(name, overrides, tmp_path):
    """(With a recurrent Q-network a replay row, and an inserted "transition", is one sequence.)"""
    cfg = load_config(SCEN / name, overrides)
    first = run_experiment(cfg, tmp_path / "a")
    second = run_experiment(load_config(SCEN / name, overrides), tmp_path / "b")
    assert _files(tmp_path / "a") == _files(tmp_path / "b")
    assert first["learning_updates"] > 0 and first["transitions_inserted"] > 0
    with open(tmp_path / "a" / "comm.csv") as fh:
        rows = [r for r in csv.DictReader(fh) if r["kind"] == TRANSITIONS]
    per = first["replay_bytes_per_transition"]
    accepted = sum(int(r["bytes"]) for r in rows if r["accepted"] == "1")
    assert accepted % per == 0
    assert accepted // per == first["transitions_inserted"] == second["transitions_inserted"]
    assert first["chunks_accepted"] == sum(r["accepted"] == "1" for r in rows)
    dropped = [r for r in rows if r["reason"].startswith("stale")]
    if "server.max_staleness=0" in overrides:  # a stale chunk is dropped, counted, and never inserted
        assert dropped and first["dropped_stale"] == len(dropped) and all(r["accepted"] == "0" for r in dropped)
    else:
        assert not dropped


@pytest.mark.parametrize("name,overrides,stop_at", [
    ("cartpole_dqn.yaml", SMALL_DQN + ["algorithm.replay.prioritized=true", "algorithm.tau=0.5"], 40),
    ("cartpole_dqn.yaml", SMALL_DQN + ["algorithm.lr_schedule=linear"], 40),  # the rate: a function of progress
    ("spread_qmix.yaml", SMALL_QMIX, 12),
    ("spread_qmix.yaml", SMALL_QMIX + ["algorithm.standardise_rewards=false", "algorithm.loss=huber",
                                     "algorithm.terminal_at_time_limit=false"], 12),  # the file's settings until 2026-12-04
    ("spread_qmix.yaml", SMALL_QMIX_GRU, 12),  # the workers' GRU states and open sequences travel too
    ("cartpole_dqn.yaml", SMALL_DQN_GRU, 6)])  # and each copy's open sequence
def test_stopped_and_resumed_run_with_a_nonempty_buffer_equals_the_uninterrupted_one(name, overrides, stop_at,
                                                                                     tmp_path):
    full = run_experiment(load_config(SCEN / name, overrides), tmp_path / "full")
    part = run_experiment(load_config(SCEN / name, overrides + [f"run.stop_after_updates={stop_at}"]),
                          tmp_path / "part")
    assert part["status"] == "stopped" and part["updates"] >= stop_at
    assert 0 < part["transitions_inserted"] < full["transitions_inserted"]
    resumed = resume_experiment(tmp_path / "part")
    assert resumed["status"] == "completed" and resumed["resumes"][0]["exact"] is True
    assert _files(tmp_path / "part") == _files(tmp_path / "full")
    for key in ("env_steps", "episodes", "updates", "transitions_inserted", "target_updates", "final_return"):
        assert resumed[key] == full[key], key


@pytest.mark.parametrize("schedule", ["linear", "constant"])
def test_every_adam_step_takes_the_scheduled_rate_of_the_runs_progress(schedule, tmp_path, monkeypatch):
    """The rate each Adam step of the learner uses (``FlatAdam.step`` reads ``lr``), against lr (1 - e / T)
    by hand: e the run's env steps when the server took the chunk (train.csv's column; one row per chunk
    that brought updates, all of them at one rate), T = run.total_env_steps = 1500; constant: lr."""
    from marl_q.optim import FlatAdam

    used: list[float] = []
    step = FlatAdam.step
    monkeypatch.setattr(FlatAdam, "step", lambda self, grad: (used.append(self.lr), step(self, grad))[1])
    cfg = load_config(SCEN / "cartpole_dqn.yaml", SMALL_DQN + [f"algorithm.lr_schedule={schedule}"])
    lr, total = cfg.algorithm.params.lr, cfg.run.total_env_steps
    assert (lr, total) == (0.0023, 1500)
    out = run_experiment(cfg, tmp_path / "r")
    assert len(used) == out["learning_updates"] > 20
    with open(tmp_path / "r" / "train.csv") as fh:
        env_steps = [int(r["env_steps"]) for r in csv.DictReader(fh)]
    runs = [used[0]]  # the rates in order, one per train.csv row
    for rate in used[1:]:
        if rate != runs[-1]:
            runs.append(rate)
    if schedule == "constant":
        assert runs == [lr]
        return
    assert len(runs) == len(env_steps) > 10
    for e, rate in zip(env_steps, runs):
        assert rate == pytest.approx(lr * (1 - e / total), rel=1e-12, abs=0), e
    # the first chunk past learning_starts (300) ends at 305 steps: 0.0023 * 1195 / 1500 = 0.00183233...
    assert env_steps[0] == 305 and runs[0] == pytest.approx(0.0023 * 1195 / 1500, rel=1e-12)
    assert runs == sorted(runs, reverse=True) and 0 < runs[-1] < lr * 0.05  # the last chunk: within 75 steps of T


def test_service_state_dict_round_trips_buffer_networks_and_optimizer(tmp_path):
    from marl_q.registry import ALGORITHMS

    from marl_q.rundir import checkpoints, load_checkpoint

    cfg = load_config(SCEN / "cartpole_dqn.yaml", SMALL_DQN + ["algorithm.replay.prioritized=true"])
    run_experiment(cfg, tmp_path / "r")
    arrays, _ = load_checkpoint(checkpoints(tmp_path / "r")[-1])
    arrays = {k[len("service."):] if k.startswith("service.") else k: v for k, v in arrays.items()}
    algo = ALGORITHMS.get("dqn").obj(cfg)
    service = algo.make_service()
    service.load_state_dict(arrays)
    again = service.state_dict()
    assert sorted(again) == sorted(arrays)
    for key in again:
        np.testing.assert_array_equal(again[key], arrays[key], err_msg=key)
    assert len(service.buffer) == int(arrays["replay.size"]) > 0


def test_n_step_assembler_sends_each_complete_window_once_across_chunks():
    rng = np.random.default_rng(3)
    T, N, n, gamma = 23, 2, 3, 0.9
    term = rng.random((T, N)) < 0.1
    trunc = ~term & (rng.random((T, N)) < 0.1)
    whole = {"obs": rng.normal(size=(T, N, 2)).astype(np.float32), "action": rng.integers(0, 3, (T, N)),
             "reward": rng.normal(size=(T, N)).astype(np.float32), "next_obs": rng.normal(size=(T, N, 2)).astype(np.float32),
             "terminated": term, "truncated": trunc}
    valid = np.ones((T, N), bool)
    valid[5, 1] = False  # an autoreset step: never sent
    ref = n_step_chunk(whole, gamma, n, drop_incomplete=True)
    ref_keep = n_step_chunk({**whole, "v": valid}, gamma, n, drop_incomplete=True)["v"]
    asm = NStepAssembler(gamma, n)
    got = []
    for a, b in ((0, 7), (7, 8), (8, 16), (16, 23)):
        got.append(asm.rows({**{k: v[a:b] for k, v in whole.items()}, "valid": valid[a:b]}))
    for key in ref:
        joined = np.concatenate([g[key] for g in got])
        # the assembler emits rows when their window completes: compare as sets of rows (sorted by obs)
        order_ref = np.lexsort(ref["obs"][ref_keep].reshape(-1, 2).T)
        order_got = np.lexsort(np.concatenate([g["obs"] for g in got]).reshape(-1, 2).T)
        np.testing.assert_allclose(joined[order_got], ref[key][ref_keep][order_ref], rtol=1e-6, err_msg=key)


@pytest.mark.parametrize("kind", ["iql", "vdn", "qmix"])
def test_learner_update_is_the_td_loss_of_the_mixed_double_dqn_target(kind):
    torch.manual_seed(0)
    dims = QDims(obs_dim=4, n_actions=3, n_agents=2, state_dim=5 if kind == "qmix" else None, agents=("a", "b"))
    hp = QConfig(lr=1e-2, grad_clip=None, double=True, mixer_embed_dim=4, hypernet_embed=8)
    net = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))
    learner = QLearner(hp, kind, net, dims)
    with torch.no_grad():  # a target different from the online network
        for p in learner.target.parameters():
            p.add_(0.1)
    rng = np.random.default_rng(0)
    B = 6
    batch = {"obs": rng.normal(size=(B, 2, 4)).astype(np.float32), "action": rng.integers(0, 3, (B, 2)),
             "reward": rng.normal(size=B).astype(np.float32), "next_obs": rng.normal(size=(B, 2, 4)).astype(np.float32),
             "terminated": np.array([0, 1, 0, 0, 1, 0], bool), "discount": np.full(B, 0.99 ** 2, np.float32),
             "avail": np.ones((B, 2, 3), bool), "next_avail": rng.random((B, 2, 3)) < 0.7}
    batch["next_avail"][:, :, 0] = True
    if kind == "qmix":
        batch["state"] = rng.normal(size=(B, 5)).astype(np.float32)
        batch["next_state"] = rng.normal(size=(B, 5)).astype(np.float32)
    t = {k: torch.from_numpy(v) for k, v in batch.items()}
    eye = torch.eye(2).expand(B, 2, 2)
    online0 = [p.detach().clone() for p in learner.params]
    with torch.no_grad():
        q = net(torch.cat([t["obs"], eye], -1))
        qn_on = net(torch.cat([t["next_obs"], eye], -1))
        qn_t = learner.target(torch.cat([t["next_obs"], eye], -1))
        # Double DQN by hand: the online argmax over legal actions, valued by the target network
        legal = t["next_avail"] | t["terminated"][:, None, None]
        best = qn_on.masked_fill(~legal, -1e9).argmax(-1)
        v = qn_t.gather(-1, best[..., None]).squeeze(-1)
        chosen = q.gather(-1, t["action"][..., None]).squeeze(-1)
        if kind == "iql":
            pred, vt = chosen, v
        elif kind == "vdn":
            pred, vt = chosen.sum(-1), v.sum(-1)
        else:
            pred, vt = learner.mixer(chosen, t["state"]), learner.target_mixer(v, t["next_state"])
        keep = t["discount"] * (1 - t["terminated"].float())
        y = (t["reward"][:, None] + keep[:, None] * vt) if kind == "iql" else t["reward"] + keep * vt
        expected = torch.nn.functional.huber_loss(pred, y).item()
    loss, td = learner.update(batch)
    assert loss == pytest.approx(expected, rel=1e-5)
    ref_td = (y - pred).abs()
    np.testing.assert_allclose(td, (ref_td.mean(-1) if kind == "iql" else ref_td).numpy(), rtol=1e-5)
    assert any(not torch.equal(a, b) for a, b in zip(online0, learner.params))  # it stepped
    if kind == "qmix":
        assert isinstance(learner.mixer, QMixer)


def test_polyak_and_hard_target_updates():
    dims = QDims(obs_dim=2, n_actions=2)
    for tau in (1.0, 0.25):
        net = torch.nn.Linear(2, 2)
        learner = QLearner(QConfig(tau=tau), "dqn", net, dims)
        old = [p.detach().clone() for p in learner.target.parameters()]
        with torch.no_grad():
            for p in net.parameters():
                p.add_(1.0)
        learner.update_target()
        for p_t, p, o in zip(learner.target.parameters(), net.parameters(), old):
            torch.testing.assert_close(p_t, tau * p + (1 - tau) * o)


def test_buffer_pickles_its_filled_rows_only():
    buf = ReplayBuffer(transition_fields((18,), n_agents=3, n_actions=5), 10_000)
    rng = np.random.default_rng(0)
    chunk = {f.name: (rng.random((40, *f.shape)) * 4).astype(f.dtype) for f in buf.fields}
    buf.add(chunk)
    blob = pickle.dumps(buf)
    assert len(blob) < 40 * buf.bytes_per_transition + 4096 < buf.nbytes
    back = pickle.loads(blob)
    assert back.size == 40 and back.pos == 40 and back.data["obs"].shape[0] == 10_000
    for name in buf.data:
        np.testing.assert_array_equal(back.data[name], buf.data[name])
    a = back.sample(8, np.random.default_rng(1))
    b = buf.sample(8, np.random.default_rng(1))
    np.testing.assert_array_equal(a[0], b[0])


@pytest.mark.parametrize("overrides,needle", [
    (["scenario={name: gymnasium, env: Pendulum-v1, num_envs: 1}"], "algorithm.name: dqn is a value-based learner "
                                                                    "and needs discrete actions"),
    (["algorithm.replay.capacity=8", "algorithm.replay.batch_size=32"],
     "algorithm.replay.capacity=8 is smaller than a batch (batch_size=32)"),
    (["algorithm.replay.prioritized=true", "algorithm.replay.alpha=1.5"], "algorithm.replay.alpha must lie in [0, 1]"),
    (["algorithm.replay.prioritized=true", "algorithm.replay.alpha=-0.1"], "algorithm.replay.alpha must lie in [0, 1]"),
    (["server.aggregation=sync"], "server.aggregation: 'sync' is not supported by the replay service"),
    (["algorithm.lr_schedule=cosine"], "algorithm.lr_schedule: unknown value 'cosine' (choices: constant, linear)"),
])
def test_config_errors_exit_2_with_one_line(overrides, needle, tmp_path, capsys):
    args = ["run", str(SCEN / "cartpole_dqn.yaml"), "--out", str(tmp_path / "x")]
    for o in overrides:
        args += ["--set", o]
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert needle in err and len(err.splitlines()) == 1, err
    assert not (tmp_path / "x").exists() or not any((tmp_path / "x").iterdir())


@pytest.mark.parametrize("algorithm", ["iql", "vdn", "qmix"])
def test_team_value_learners_on_continuous_actions_exit_2_naming_the_agent(algorithm, tmp_path, capsys):
    """simple_spread with continuous actions (a Box per agent): refused before any step, one line."""
    out = tmp_path / "x"
    assert main(["run", str(SCEN / f"spread_{algorithm}.yaml"), "--out", str(out),
                 "--set", "scenario={name: pettingzoo, env: mpe2.simple_spread_v3:parallel_env, "
                          "kwargs: {N: 3, max_cycles: 25, continuous_actions: true}, state: concat}"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert f"algorithm.name: {algorithm} is a value-based learner and needs discrete actions, but agent " in err
    assert not out.exists() or not any(out.iterdir())


def test_qmix_without_a_global_state_is_a_config_error_naming_it(monkeypatch, tmp_path, capsys):
    from marl_q import registry
    from marl_q.registry import SCENARIOS

    spec = SCENARIOS.get("spread").obj

    def make_without_state(cfg, seed):
        env = spec.make(cfg, seed)

        class NoState:
            def __init__(self, inner):
                self._inner = inner

            def __getattr__(self, item):
                if item == "state":
                    raise AttributeError(item)
                return getattr(self._inner, item)

        return NoState(env)

    entry = registry.SCENARIOS.get("spread")
    monkeypatch.setitem(registry.SCENARIOS._entries, "spread",
                        dataclasses.replace(entry, obj=spec._replace(make=make_without_state)))
    with pytest.raises(ConfigError, match=r"algorithm.name: qmix mixes on the global state, but scenario 'spread' "
                                          r"offers no state\(\)"):
        load_config(SCEN / "spread_qmix.yaml", QUIET)
    load_config(SCEN / "spread_vdn.yaml", QUIET)  # vdn needs none
    capsys.readouterr()
    assert main(["run", str(SCEN / "spread_qmix.yaml"), "--out", str(tmp_path / "x")]) == 2  # the CLI: one line
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "qmix mixes on the global state" in err, err


def test_one_q_network_refuses_agents_of_unequal_spaces_naming_their_sizes():
    """iql/vdn/qmix share one Q-network: speaker-listener's speaker (3 actions, 3 inputs) and listener
    (5 actions, 11 inputs) are refused with their sizes and the padding hint; padded, they load."""
    over = QUIET + ["scenario={name: speaker_listener}"]
    with pytest.raises(ConfigError, match=r"iql shares one Q-network, so every agent needs the same action space and "
                                          r"observation size \(actions \{'speaker_0': 3, 'listener_0': 5\}.*pad them"):
        load_config(SCEN / "spread_iql.yaml", over)
    load_config(SCEN / "spread_iql.yaml", QUIET + ["scenario={name: speaker_listener, common_spaces: true}"])


def test_a_buffer_over_the_snapshot_limit_is_left_out_of_the_snapshot_and_said_once(tmp_path, capsys):
    overrides = SMALL_DQN + ["algorithm.replay.snapshot_max_bytes=1000"]
    part = run_experiment(load_config(SCEN / "cartpole_dqn.yaml", overrides + ["run.stop_after_updates=40"]),
                          tmp_path / "part")
    assert part["status"] == "stopped" and part["transitions_inserted"] * part["replay_bytes_per_transition"] > 1000
    err = capsys.readouterr().err
    assert err.count("snapshot_max_bytes=1000") == 1 and "not byte-identical" in err
    resumed = resume_experiment(tmp_path / "part")
    assert resumed["status"] == "completed" and resumed["resumes"][0]["exact"] is False
    assert resumed["transitions_inserted"] > part["transitions_inserted"]  # the buffer came back from the .npz


def test_replay_memory_bench_reports_the_hand_counted_bytes_of_spread_qmix(capsys):
    from marl_q.registry import BENCHES

    assert BENCHES.get("replay_memory").obj(["--config", str(SCEN / "spread_qmix.yaml"), "--transitions", "1000",
                                             "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    # obs and next_obs 2 x 3 x 18 float32, action 3 int64, reward, discount float32, terminated bool,
    # avail and next_avail 2 x 3 x 5 bool, state and next_state 2 x 54 float32
    assert out["bytes_per_transition"] == 2 * 3 * 18 * 4 + 3 * 8 + 4 + 4 + 1 + 2 * 3 * 5 + 2 * 54 * 4 == 927
    assert out["nbytes"] == 927 * 1000


def test_replay_memory_bench_lays_out_the_gru_learners_sequences(capsys):
    from marl_q.registry import BENCHES

    bench = BENCHES.get("replay_memory").obj
    assert bench(["--config", str(SCEN / "spread_qmix_gru.yaml"), "--transitions", "40", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    # 26 observations (25 steps and the bootstrap one): obs 3 x 18 float32, action 3 int64, reward float32,
    # terminated bool, avail 3 x 5 bool, state 54 float32; mask 26 bool; h0 3 x 64 float32
    assert out["row"] == "sequence of 25 steps"
    assert out["bytes_per_transition"] == 26 * (3 * 18 * 4 + 3 * 8 + 4 + 1 + 3 * 5 + 54 * 4) + 26 + 3 * 64 * 4 == 13170
    assert out["nbytes"] == 13170 * 40
    assert main(["bench", "replay_memory", "--config", str(SCEN / "spread_qmix_gru.yaml"), "--transitions", "4",
                 "--prioritized"]) == 2
    err = capsys.readouterr().err.strip()
    assert "--prioritized: a recurrent Q-network (critic.recurrent) replays its sequences uniformly" in err
    assert len(err.splitlines()) == 1


def test_circuit_q_network_scalings_get_their_own_learning_rates():
    from agents.q_learning import QDims, build_q_network

    cfg = load_config(SCEN / "cartpole_qdqn_skolik.yaml", QUIET + ["algorithm.lr=0.002", "algorithm.lr_input_scale=0.003"])
    learner = QLearner(cfg.algorithm.params, "dqn", build_q_network(cfg, QDims(4, 2)), QDims(4, 2))

    def lrs(learner):  # each parameter's learning rate: its FlatAdam's (slots[i][0]: the FlatAdam of parameter i)
        return {n.split(".", 1)[1]: learner.adams[slot[0]].lr for n, slot in zip(learner.param_names, learner.slots)}

    assert lrs(learner) == {"weights": 0.002, "input_scale": 0.003, "output_scale": 0.1}
    assert len(learner.adams) == 3
    plain = load_config(SCEN / "cartpole_qdqn_skolik.yaml", QUIET + ["algorithm.lr_output_scale=null",
                                                                      "algorithm.lr_input_scale=null"])
    learner = QLearner(plain.algorithm.params, "dqn", build_q_network(plain, QDims(4, 2)), QDims(4, 2))
    assert lrs(learner) == {"weights": 1e-3, "input_scale": 1e-3, "output_scale": 1e-3}
    assert len(learner.adams) == 1  # one learning rate: one FlatAdam over the whole buffer


@pytest.mark.parametrize("name,overrides", [("cartpole_dqn.yaml", SMALL_DQN + ["algorithm.dueling=true"]),
                                            ("spread_qmix.yaml", SMALL_QMIX),
                                            # without the one-hot agent index: the network reads observations only
                                            ("spread_qmix.yaml", SMALL_QMIX + ["algorithm.agent_id=false"])])
def test_load_trained_acts_greedily_on_the_checkpoints_q_values(name, overrides, tmp_path):
    from marl_q.rundir import load_trained

    summary = run_experiment(load_config(SCEN / name, overrides), tmp_path / "r")
    trained = load_trained(tmp_path / "r")
    net = trained.models["q"]
    rng = np.random.default_rng(0)
    if name.startswith("cartpole"):
        obs = {"agent": rng.normal(size=4).astype(np.float32)}
        q = net(torch.from_numpy(obs["agent"][None])).detach().numpy()[0]
    else:
        obs = {f"agent_{i}": rng.normal(size=18).astype(np.float32) for i in range(3)}
        ids = np.eye(3) if "algorithm.agent_id=false" not in overrides else np.zeros((3, 0))
        x = torch.from_numpy(np.stack([np.concatenate([obs[f"agent_{i}"], ids[i]]) for i in range(3)])
                             .astype(np.float32))
        assert net[0].in_features == x.shape[1]  # 18 + 3, or 18
        q = net(x).detach().numpy()
    acts = trained.act(obs)
    expected = q.argmax(-1).reshape(-1)
    assert [acts[a] for a in sorted(obs)] == expected.tolist()
    # the server's count: the steps of the chunks it received (the last ones may still be in flight)
    assert 0 < trained.info["env_steps"] <= summary["env_steps"]


@pytest.mark.parametrize("name,overrides", [("cartpole_dqn.yaml", SMALL_DQN), ("spread_qmix.yaml", SMALL_QMIX),
                                            ("spread_qmix.yaml", SMALL_QMIX_GRU),
                                            ("cartpole_dqn.yaml", SMALL_DQN_GRU)])
def test_eval_every_writes_greedy_rows_and_leaves_the_run_unchanged(name, overrides, tmp_path):
    from marl_q.evaluation import FIELDS, read_eval_csv

    plain = run_experiment(load_config(SCEN / name, overrides), tmp_path / "plain")
    evaluated = run_experiment(load_config(SCEN / name, overrides + ["run.eval_every=400", "run.eval_episodes=3"]),
                               tmp_path / "eval")
    assert _files(tmp_path / "plain") == _files(tmp_path / "eval")
    assert plain["transitions_inserted"] == evaluated["transitions_inserted"]
    assert (tmp_path / "eval" / "eval.csv").read_text().splitlines()[0] == ",".join(FIELDS)
    rows = read_eval_csv(tmp_path / "eval" / "eval.csv")
    # one row each time the run's env steps cross a multiple of 400, at the first count at or past it
    assert [int(r["env_steps"]) // 400 for r in rows] == list(range(1, evaluated["env_steps"] // 400 + 1))
    assert all(r["episodes"] == 3 and r["eval_min"] <= r["eval_return"] <= r["eval_max"] for r in rows)
    assert rows[-1]["updates"] > rows[0]["updates"]


def _greedy_by_hand(cfg, net, episodes: int, seed: int) -> list[float]:
    """The greedy returns by a plain loop over the raw env (no agents.rollout): torch's argmax of Q."""
    from agents.q_learning import make_q_env

    env = make_q_env(cfg, seed)
    returns: list[float] = []
    if cfg.algorithm.name == "dqn":  # a Gymnasium vector env of one copy, next-step autoreset
        obs, _ = env.reset(seed=seed)
        ret, restarting = 0.0, False
        while len(returns) < episodes:
            with torch.no_grad():
                a = net(torch.from_numpy(np.asarray(obs, np.float32))).argmax(-1).numpy()
            obs, rew, term, trunc, _ = env.step(a)
            if not restarting:
                ret += float(rew[0])
                if term[0] or trunc[0]:
                    returns.append(ret)
                    ret = 0.0
            restarting = bool(term[0] or trunc[0]) and not restarting
    else:  # a PettingZoo ParallelEnv, one-hot agent ids, the team reward summed; a GRU's state from zeros
        agents = list(env.possible_agents)
        obs, _ = env.reset(seed=seed)
        ret = 0.0
        h = net.initial_state(len(agents)) if is_recurrent(net) else None
        while len(returns) < episodes:
            x = np.stack([np.concatenate([obs[a], np.eye(len(agents))[i]]) for i, a in enumerate(agents)])
            with torch.no_grad():
                x = torch.from_numpy(x.astype(np.float32))
                if h is None:
                    a = net(x).argmax(-1).numpy()
                else:
                    q, h = net.step(x, h)
                    a = q.argmax(-1).numpy()
            obs, rew, term, trunc, _ = env.step({ag: int(a[i]) for i, ag in enumerate(agents)})
            ret += sum(float(r) for r in rew.values())
            if not env.agents or any(term.values()) or all(trunc.values()):
                returns.append(ret)
                ret = 0.0
                obs, _ = env.reset()
                h = net.initial_state(len(agents)) if h is not None else None
    env.close()
    return returns


@pytest.mark.parametrize("name,overrides", [("cartpole_dqn.yaml", SMALL_DQN), ("spread_qmix.yaml", SMALL_QMIX),
                                            ("spread_qmix.yaml", SMALL_QMIX_GRU)])
def test_evaluate_returns_are_the_greedy_returns_of_the_servers_q_network(name, overrides):
    from marl_q.registry import ALGORITHMS

    cfg = load_config(SCEN / name, overrides)
    algo = ALGORITHMS.get(cfg.algorithm.name).obj(cfg)
    service = algo.make_service()
    with torch.no_grad():  # parameters of their own, so the greedy actions are not the initial network's
        for p in service.learner.online.parameters():
            p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(5)) * 0.3)
    service._snapshot = None
    for seed in (11, 12):
        got = algo.evaluate_returns(4, seed)
        assert got == _greedy_by_hand(cfg, service.learner.online, 4, seed)


def test_the_q_builds_draw_what_manual_seed_drew_and_leave_the_callers_stream_alone():
    """The server's network and QMIX mixer, and a worker's network, are what ``torch.manual_seed(run.seed)``
    then the builds gave (the mixer's draws after the network's), and torch's global stream is as the
    caller left it."""
    from agents.q_learning import build_q_network
    from marl_q.registry import ALGORITHMS

    cfg = load_config(SCEN / "spread_qmix.yaml", SMALL_QMIX)
    algorithm = ALGORITHMS.get("qmix").obj(cfg)
    torch.manual_seed(123)
    before = torch.random.get_rng_state().clone()
    learner = algorithm.make_service().learner
    worker = algorithm.make_worker(0)
    assert torch.equal(torch.random.get_rng_state(), before)
    torch.manual_seed(cfg.run.seed)  # the reference: the builds as they ran on the global stream
    net = build_q_network(cfg, algorithm.dims)
    hp, dims = cfg.algorithm.params, algorithm.dims
    mixer = QMixer(dims.n_agents, dims.state_dim, hp.mixer_embed_dim, hp.hypernet_layers, hp.hypernet_embed)
    for got, want in ((learner.online, net), (learner.mixer, mixer), (worker.net, net)):
        for a, b in zip(got.parameters(), want.parameters(), strict=True):
            assert torch.equal(a, b)
    worker.close()


def test_a_recurrent_q_network_has_no_stateless_policy_to_load(tmp_path):
    from marl_q.errors import UserError
    from marl_q.rundir import load_trained

    run_experiment(load_config(SCEN / "spread_qmix.yaml", SMALL_QMIX_GRU), tmp_path / "r")
    with pytest.raises(UserError, match=r"a recurrent Q-network \(critic.recurrent\) has no stateless acting policy"):
        load_trained(tmp_path / "r")


@pytest.mark.parametrize("kind", ["iql", "qmix"])
def test_standardised_rewards_are_the_pooled_statistics_of_every_replayed_batch(kind):
    """``standardise_rewards``: a learner on raw rewards steps exactly as its twin without the key on the
    rewards standardised by hand, (r - mean) / std with mean and variance pooled over every batch so far
    and the prior pseudo-sample (count 1e-4, mean 0, variance 1), over three updates."""
    dims = QDims(obs_dim=4, n_actions=3, n_agents=2, state_dim=5 if kind == "qmix" else None, agents=("a", "b"))
    twins = []
    for on in (True, False):
        torch.manual_seed(0)
        net = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))
        twins.append(QLearner(QConfig(lr=1e-2, mixer_embed_dim=4, hypernet_embed=8, standardise_rewards=on),
                              kind, net, dims))
    on, off = twins
    rng = np.random.default_rng(1)
    seen = []
    for B in (6, 4, 9):
        batch = {"obs": rng.normal(size=(B, 2, 4)).astype(np.float32), "action": rng.integers(0, 3, (B, 2)),
                 "reward": rng.normal(-3.0, 2.0, size=B).astype(np.float32),
                 "next_obs": rng.normal(size=(B, 2, 4)).astype(np.float32), "terminated": np.zeros(B, bool),
                 "discount": np.full(B, 0.99, np.float32), "avail": np.ones((B, 2, 3), bool),
                 "next_avail": np.ones((B, 2, 3), bool)}
        if kind == "qmix":
            batch["state"] = rng.normal(size=(B, 5)).astype(np.float32)
            batch["next_state"] = rng.normal(size=(B, 5)).astype(np.float32)
        seen.append(batch["reward"].astype(np.float64))
        x = np.concatenate(seen)
        n = 1e-4 + x.size
        mean = x.sum() / n
        var = (1e-4 * (1.0 + mean ** 2) + ((x - mean) ** 2).sum()) / n
        loss_on, td_on = on.update(batch)
        loss_off, td_off = off.update({**batch, "reward": ((batch["reward"] - mean) / np.sqrt(var)).astype(np.float32)})
        assert loss_on == pytest.approx(loss_off, rel=1e-5)
        np.testing.assert_allclose(td_on, td_off, rtol=1e-5, atol=1e-6)
        for p, q in zip(on.params, off.params):
            torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)
    assert on.reward_stats.count == pytest.approx(1e-4 + 19) and off.reward_stats is None


def test_reward_statistics_travel_in_the_service_state_and_their_absence_is_refused():
    """The array path of resume (no sim snapshot): ``reward_stats.*`` come back as they were; a state
    without them (written by a run without the key) is refused with a CheckpointError naming the key."""
    from marl_q.errors import CheckpointError
    from marl_q.runtime import build_algorithm

    std = SMALL_QMIX + ["algorithm.standardise_rewards=true"]
    service = build_algorithm(load_config(SCEN / "spread_qmix.yaml", std))[1]
    service.learner.reward_stats.update(np.array([-3.0, -1.0, -2.5]))
    state = service.state_dict()
    assert {"reward_stats.mean", "reward_stats.var", "reward_stats.count"} <= set(state)
    back = build_algorithm(load_config(SCEN / "spread_qmix.yaml", std))[1]
    back.load_state_dict(state)
    want, got = service.learner.reward_stats.state_dict(), back.learner.reward_stats.state_dict()
    assert set(got) == set(want)
    for key in want:  # 0-d arrays, back as they were (pytest 9.2's approx takes no arrays inside a dict)
        np.testing.assert_array_equal(got[key], want[key], err_msg=key)
    plain = build_algorithm(load_config(SCEN / "spread_qmix.yaml", SMALL_QMIX + ["algorithm.standardise_rewards=false"])
                            )[1].state_dict()
    assert not any(k.startswith("reward_stats.") for k in plain)
    with pytest.raises(CheckpointError, match="standardise_rewards"):
        back.load_state_dict(plain)


@pytest.mark.parametrize("sequences", [False, True])
def test_terminal_at_time_limit_marks_exactly_each_episodes_last_step_terminal(sequences):
    """``terminal_at_time_limit``: the rows a worker pushes are terminal exactly at the step that ends an
    episode by its time limit (every 10th of spread's 10-cycle episodes), and never without the key; the
    same for a GRU Q-network's worker (its chunks become sequences)."""
    from agents.q_learning import QWorker, collect_chunk

    base = SMALL_QMIX_GRU if sequences else SMALL_QMIX
    for on in (True, False):
        cfg = load_config(SCEN / "spread_qmix.yaml", base + [f"algorithm.terminal_at_time_limit={str(on).lower()}"])
        worker = QWorker(cfg, 0)
        chunk, episodes, taken = collect_chunk(worker, 30)
        assert taken == 30 and len(episodes) == 3
        ends = np.zeros(30, bool)
        ends[[9, 19, 29]] = True
        np.testing.assert_array_equal(chunk["truncated"][:, 0], ends)
        np.testing.assert_array_equal(chunk["terminated"][:, 0], ends if on else np.zeros(30, bool))
