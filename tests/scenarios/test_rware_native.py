"""The native multi-robot warehouse against rware 2.0.0's own env, step by step; its move resolution against
rware's networkx calls; its batch against its copies; its scenario keys and bad input."""
from __future__ import annotations

import numpy as np
import pytest

from agents.rollout import BatchedCopies, ParallelCopies, team_copies
from scenarios import rware_native
from scenarios.rware_native import Layout, RwareConfig, WarehouseBatch, WarehouseNative, networkx_commits, rware_env
from tests.agents.test_rollout import assert_same_team_step
from tests.scenarios.test_native import assert_engine_refused_without_package

TASKS = ["rware-tiny-2ag-v2", "rware-tiny-10ag-v2", "rware-small-4ag-hard-v2", "rware-tiny-19ag-v2",
         "rware-medium-6ag-easy-v2"]


def _reference(task: str, common_reward: bool):
    pytest.importorskip("rware", reason="the reference is rware's env: the .[epymarl-envs] extra")
    return rware_env(task, common_reward, engine="rware")


def _actions(rng: np.random.Generator, n: int) -> list[int]:
    """Random actions, forward half the time, so that robots meet, queue, pick up and deliver."""
    return [int(a) for a in rng.choice(5, size=n, p=[0.1, 0.5, 0.15, 0.15, 0.1])]


@pytest.mark.parametrize("task", TASKS)
def test_native_equals_rware_step_by_step(task, monkeypatch):
    """2,000 cycles of random actions from the same seeds (reseeded every third episode, else the generator
    runs on): observations, state, rewards, terminations, truncations and the agents list equal bit for bit."""
    ref = _reference(task, common_reward=task.endswith("easy-v2"))
    nat = WarehouseNative(task, common_reward=task.endswith("easy-v2"))
    assert nat.action_space("agent_0") == ref.action_space("agent_0")
    assert nat.observation_space("agent_0").shape == ref.observation_space("agent_0").shape
    rng = np.random.default_rng(11)
    episodes = 0
    want_obs, got_obs = ref.reset(seed=5)[0], nat.reset(seed=5)[0]
    for t in range(2000):
        for a in ref.possible_agents:
            assert np.array_equal(want_obs[a], got_obs[a]) and got_obs[a].dtype == np.float32, (t, a)
        assert ref.state().tobytes() == nat.state().tobytes(), t
        joint = dict(zip(ref.agents, _actions(rng, len(ref.agents))))
        want, got = ref.step(joint), nat.step(joint)
        for k in range(1, 5):
            assert want[k].keys() == got[k].keys() and all(want[k][a] == got[k][a] for a in want[k]), (t, k)
        assert ref.agents == nat.agents, t
        want_obs, got_obs = want[0], got[0]
        if not nat.agents:
            episodes += 1
            seed = 100 + episodes if episodes % 3 == 0 else None
            want_obs, got_obs = ref.reset(seed=seed)[0], nat.reset(seed=seed)[0]
    assert episodes == 2000 // 500


def test_deliveries_and_ties_are_exercised():
    """Over the crowded tasks' random runs robots deliver requested shelves (rewards), and two equally long
    queues meet at a free cell (resolved by rware's networkx calls) several times."""
    calls = []
    original = rware_native.networkx_commits

    def counted(*args):
        calls.append(1)
        return original(*args)

    rware_native.networkx_commits, delivered = counted, 0.0
    try:
        for task in ("rware-tiny-10ag-v2", "rware-tiny-19ag-v2"):
            env = WarehouseNative(task)
            env.reset(seed=0)
            rng = np.random.default_rng(0)
            for _ in range(3000):
                if not env.agents:
                    env.reset()
                delivered += sum(env.step(dict(zip(env.agents, _actions(rng, len(env.agents)))))[1].values())
    finally:
        rware_native.networkx_commits = original
    assert delivered >= 5 and len(calls) >= 5, (delivered, len(calls))


def test_move_resolution_equals_rwares_networkx_calls_on_random_crowds():
    """The compiled resolution (cycles, swaps, robots standing still, longest chains into free cells) against
    rware's own networkx procedure, on 3,000 random crowds of 2-12 robots in a 5 x 5 corner; where two equal
    chains meet (``tie``) the step defers to that procedure, so only the others are compared."""
    plan = rware_native.kernels()[0]
    rng = np.random.default_rng(0)
    layout = Layout.of("rware-tiny-2ag-v2")
    highway = layout.highways()
    compared = 0
    for _ in range(3000):
        n = int(rng.integers(2, 13))
        cells = rng.choice(25, size=n, replace=False)
        pos = np.stack([cells % 5, cells // 5], axis=1)[None].astype(np.int64)
        direction = rng.integers(0, 4, (1, n))
        actions = rng.choice(5, size=(1, n), p=[0.1, 0.7, 0.1, 0.05, 0.05]).astype(np.int64)
        act, tx, ty = (np.empty((1, n), dtype=np.int64) for _ in range(3))
        commit, tie = np.empty((1, n), dtype=bool), np.empty(1, dtype=bool)
        plan(pos, direction, np.zeros((1, n), np.int64), np.zeros((1, 0, 2), np.int64), highway, actions,
             np.ones(1, dtype=bool), act, tx, ty, commit, tie)
        if tie[0]:
            continue
        want = networkx_commits([tuple(p) for p in pos[0].tolist()], list(zip(tx[0].tolist(), ty[0].tolist())))
        assert commit[0].tolist() == want, (pos[0].tolist(), actions[0].tolist(), direction[0].tolist())
        compared += 1
    assert compared > 2000


@pytest.mark.parametrize("task", ["rware-tiny-4ag-v2", "rware-small-6ag-hard-v2"])
def test_batch_equals_its_copies_stepped_one_by_one(task):
    E = 4

    def copies():
        envs = [WarehouseNative(task, common_reward=True) for _ in range(E)]
        for k, env in enumerate(envs):
            env.reset(seed=1000 + k)
        return envs

    n = Layout.of(task).agents
    agents = [f"agent_{i}" for i in range(n)]
    batched, one_by_one = team_copies(copies(), agents, False), ParallelCopies(copies(), agents, False)
    assert isinstance(batched, BatchedCopies) and isinstance(batched.batch, WarehouseBatch)
    D = rware_native.OBS_DIM
    rng = np.random.default_rng(7)
    ended = 0
    for t in range(2000):
        actions = np.array([_actions(rng, n) for _ in range(E)]).reshape(-1)
        a = assert_same_team_step(batched, one_by_one, actions, D, t)
        ended += int(a.ended.sum())
    assert ended == E * 3  # 500-step episodes, each copy's first step a reset
    with pytest.raises(ValueError, match="actions must be"):
        batched.step(np.full(E * n, 5))


def test_compiled_loops_equal_the_python_functions():
    rng = np.random.default_rng(0)
    compiled = rware_native.kernels()
    plain = (rware_native._plan_py, rware_native._apply_py, rware_native._observe_py)
    batches = [WarehouseBatch([WarehouseNative("rware-tiny-12ag-v2") for _ in range(5)]) for _ in range(2)]
    for b in batches:
        for e in range(5):
            b.reset(e, seed=e)
    for t in range(300):
        actions = rng.choice(5, size=(5, 12), p=[0.1, 0.5, 0.15, 0.15, 0.1]).astype(np.int64)
        active = rng.random(5) < 0.8
        outs = []
        for b, (plan, apply, observe) in zip(batches, [compiled, plain]):
            act, tx, ty = (np.empty((5, 12), dtype=np.int64) for _ in range(3))
            commit, tie = np.empty((5, 12), dtype=bool), np.empty(5, dtype=bool)
            plan(b.pos, b.direction, b.carrying, b.shelf_pos, b.env.highway, actions, active, act, tx, ty, commit, tie)
            goal_shelf, goal_agent = np.empty((5, 2), np.int64), np.empty((5, 2), np.int64)
            apply(b.pos, b.direction, b.carrying, b.shelf_pos, b.env.highway, active, act, tx, ty, commit, b.env.goals,
                  goal_shelf, goal_agent)
            obs = np.empty((5, 12, rware_native.OBS_DIM), np.float32)
            observe(b.pos, b.direction, b.carrying, b.shelf_pos, b.env.highway, b.requested, obs)
            outs.append((commit.tobytes(), tie.tobytes(), b.pos.tobytes(), b.carrying.tobytes(), obs.tobytes()))
        assert outs[0] == outs[1], t


def test_task_ids_keys_and_bad_input():
    tiny = Layout.of("rware:rware-tiny-4ag-hard-v2")
    assert (tiny.rows, tiny.cols, tiny.agents, tiny.queue) == (11, 10, 4, 2)
    assert len(tiny.shelf_cells()) == 32 and tiny.goals().tolist() == [[4, 10], [5, 10]]
    large = Layout.of("rware-large-3ag-easy-v2")
    assert (large.rows, large.cols, large.queue) == (29, 16, 6)
    for bad in ["rware-huge-2ag-v2", "rware-tiny-0ag-v2", "rware-tiny-20ag-v2", "rware-tiny-2ag-v1", 3,
                "rware-img-tiny-2ag-v2"]:
        with pytest.raises(ValueError, match="scenario.task"):
            Layout.of(bad)
    with pytest.raises(ValueError, match="requests 38 shelves at a time of the 32"):
        Layout.of("rware-tiny-19ag-easy-v2")
    with pytest.raises(ValueError, match="scenario.engine"):
        RwareConfig(engine="jax").validate()
    with pytest.raises(ValueError, match="scenario.common_reward"):
        RwareConfig(common_reward=1).validate()
    env = WarehouseNative()
    env.reset(seed=0)
    with pytest.raises(ValueError, match="action must be an integer in"):
        env.step({"agent_0": 5, "agent_1": 0})


def test_the_scenario_file_runs_on_either_engine_with_the_same_metrics(tmp_path):
    """rware_mappo.yaml on the native engine (the batched vector) and on rware's env through the gymnasium
    adapter write the same metrics, comm and train files, byte for byte."""
    pytest.importorskip("rware", reason="the reference is rware's env: the .[epymarl-envs] extra")
    from marl_q.config import load_config
    from marl_q.experiment import run_experiment
    quiet = ["run.progress=false", "run.plots=false", "run.eval_every=null", "run.total_env_steps=4800"]
    out = {}
    for name in ("native", "rware"):
        cfg = load_config("scenarios/rware_mappo.yaml", quiet + [f"scenario.engine={name}"])
        run_experiment(cfg, tmp_path / name)
        out[name] = [(tmp_path / name / f).read_bytes() for f in ("metrics.csv", "comm.csv", "train.csv")]
    assert out["native"] == out["rware"] and len(out["native"][0].splitlines()) >= 8


def test_engine_rware_without_the_package_exits_2_with_the_extra_to_install(tmp_path, monkeypatch, capsys):
    assert_engine_refused_without_package("scenarios/rware_mappo.yaml", "rware", tmp_path, monkeypatch, capsys)


def test_passes_pettingzoo_parallel_api_test():
    from pettingzoo.test import parallel_api_test
    parallel_api_test(WarehouseNative("rware-tiny-3ag-v2"), num_cycles=600)
