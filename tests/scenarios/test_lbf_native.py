"""The native Level-Based Foraging against lbforaging 2.0.0's own env, step by step; its batch against
its copies; its scenario keys and bad input."""
from __future__ import annotations

import numpy as np
import pytest

from agents.rollout import BatchedCopies, ParallelCopies, team_copies
from scenarios import lbf_native
from scenarios.lbf_native import ForagingBatch, ForagingNative, LBFConfig, lbf_env, parse_task
from tests.agents.test_rollout import assert_same_team_step
from tests.scenarios.test_native import assert_engine_refused_without_package

TASKS = ["Foraging-8x8-2p-2f-coop-v3", "Foraging-10x10-3p-3f-v3", "Foraging-2s-8x8-2p-2f-coop-v3",
         "Foraging-2s-12x12-4p-3f-v3", "Foraging-5x5-3p-1f-v3", "Foraging-6x6-9p-4f-v3"]


class IndexOrderSet:
    """What lbforaging's step needs of a ``set`` of players, popping in insertion (= player index) order:
    the one place where its outcome otherwise follows the players' memory addresses (module docstring)."""

    def __init__(self, items=()):
        self.items = list(dict.fromkeys(items))

    def add(self, x):
        if x not in self.items:
            self.items.append(x)

    def pop(self):
        return self.items.pop(0)

    def __sub__(self, other):
        return IndexOrderSet(x for x in self.items if x not in other)

    def __contains__(self, x):
        return x in self.items

    def __iter__(self):
        return iter(self.items)

    def __len__(self):
        return len(self.items)


def _reference(task: str, common_reward: bool, penalty: float = 0.0):
    """What ``scenario.name: gymnasium`` makes of lbforaging's env (FlatParallelEnv over TupleParallelEnv)."""
    pytest.importorskip("lbforaging", reason="the reference is lbforaging's env: the .[epymarl-envs] extra")
    return lbf_env(task, common_reward, penalty, engine="lbforaging")


def _actions(rng: np.random.Generator, n: int, field=None, pos=None) -> list[int]:
    """Random joint actions that load often, so that loads, failed loads and ties happen: given the
    state (one copy's field and positions), each agent heads for the nearest food and loads beside it
    two times in three, else it acts at random; without it, it loads half the time."""
    out = []
    for i in range(n):
        if field is None or rng.random() < 1 / 3:
            out.append(5 if rng.random() < 0.5 else int(rng.integers(0, 5)))
            continue
        foods = np.argwhere(field > 0)
        if len(foods) == 0:
            out.append(0)
            continue
        d = np.abs(foods - pos[i]).sum(axis=1)
        fr, fc = foods[int(np.argmin(d))]
        dr, dc = fr - pos[i][0], fc - pos[i][1]
        if abs(dr) + abs(dc) == 1:
            out.append(5)
        elif abs(dr) > abs(dc) or (abs(dr) == abs(dc) and rng.random() < 0.5):
            out.append(2 if dr > 0 else 1)
        else:
            out.append(4 if dc > 0 else 3)
    return out


@pytest.mark.parametrize("task", TASKS)
@pytest.mark.parametrize("common_reward", [False, True])
def test_native_equals_lbforaging_step_by_step(task, common_reward, monkeypatch):
    """2,000 cycles of random actions from the same seeds (resets reseeded every 7th episode, else the
    generator runs on, as a run's copies do): observations, state, rewards, terminations, truncations
    and the agents list equal bit for bit."""
    ref = _reference(task, common_reward)
    import lbforaging.foraging.environment as lbf_module
    monkeypatch.setattr(lbf_module, "set", IndexOrderSet, raising=False)
    nat = ForagingNative(task, common_reward)
    space = ref.inner.inner.observation_space[0]  # lbforaging's own bounds (FlatParallelEnv widens them)
    mine = nat.observation_space("agent_0")
    assert mine.shape == space.shape and np.array_equal(mine.low, space.low) and np.array_equal(mine.high, space.high)
    assert nat.action_space("agent_1") == ref.action_space("agent_1")
    rng = np.random.default_rng(3)
    episodes, loaded, rewarded = 0, 0, 0
    want_obs, got_obs = ref.reset(seed=5), nat.reset(seed=5)
    for t in range(2000):
        for a in ref.possible_agents:
            assert np.array_equal(want_obs[0][a], got_obs[0][a]) and got_obs[0][a].dtype == np.float32, (t, a)
        assert ref.state().tobytes() == nat.state().tobytes(), t
        joint = dict(zip(ref.agents, _actions(rng, len(ref.agents), nat.batch.field[0], nat.batch.pos[0])))
        want, got = ref.step(joint), nat.step(joint)
        for k in range(1, 5):
            assert want[k].keys() == got[k].keys() and all(want[k][a] == got[k][a] for a in want[k]), (t, k)
        assert ref.agents == nat.agents, t
        rewarded += any(r != 0 for r in got[1].values())
        if not nat.agents:
            episodes += 1
            loaded += int(nat.batch.field.sum() == 0)
            seed = 100 + episodes if episodes % 7 == 0 else None
            want_obs, got_obs = ref.reset(seed=seed), nat.reset(seed=seed)
        else:
            want_obs, got_obs = (want[0], {}), (got[0], {})
    assert episodes >= 2000 // 51 and rewarded >= 10 and loaded >= 1, (episodes, rewarded, loaded)


def test_the_index_order_of_loads_is_what_differs_and_it_is_exercised(monkeypatch):
    """A loading player beside two foods, the first of which no other player loads, and a second loading
    player beside the other food: in index order player 0 loads alone (and fails, -coop), then player 1
    alone; in the other order both load food B together. The native loads in index order, as lbforaging
    does with the set popping in that order."""
    nat = ForagingNative("Foraging-8x8-2p-2f-coop-v3")
    nat.reset(seed=0)
    nat.batch.field[0] = 0
    nat.batch.field[0, 2, 3], nat.batch.field[0, 3, 2] = 2, 2  # A north of player 0, B west of it
    nat.batch.pos[0] = [[3, 3], [3, 1]]                  # player 1 is beside B only
    nat.batch.level[0] = [1, 1]
    nat.batch.spawned[0] = 4
    _, rew, term, _, _ = nat.step({"agent_0": 5, "agent_1": 5})
    assert rew == {"agent_0": 0.0, "agent_1": 0.0} and nat.batch.field[0, 2, 3] == 2 and nat.batch.field[0, 3, 2] == 2
    # player 1 first (the order a set may pop them in): both load B, half the spawned levels' reward each
    nat.batch.pos[0] = [[3, 1], [3, 3]]                  # swap the players: now index 0 is beside B only
    _, rew, _, _, _ = nat.step({"agent_0": 5, "agent_1": 5})
    assert rew == {"agent_0": 0.25, "agent_1": 0.25} and nat.batch.field[0, 3, 2] == 0 and nat.batch.field[0, 2, 3] == 2
    ref = _reference("Foraging-8x8-2p-2f-coop-v3", False)
    import lbforaging.foraging.environment as lbf_module
    monkeypatch.setattr(lbf_module, "set", IndexOrderSet, raising=False)
    inner = ref.inner.inner.unwrapped
    ref.reset(seed=0)
    inner.field[:] = 0
    inner.field[2, 3], inner.field[3, 2] = 2, 2
    for p, xy in zip(inner.players, [(3, 3), (3, 1)]):
        p.position, p.level = xy, 1
    inner._food_spawned = 4
    inner._gen_valid_moves()
    _, rew, *_ = ref.step({"agent_0": 5, "agent_1": 5})
    assert rew == {"agent_0": 0.0, "agent_1": 0.0}


def test_penalty_of_a_failed_load_equals_lbforagings(monkeypatch):
    ref = _reference("Foraging-8x8-3p-2f-coop-v3", False, penalty=0.1)
    import lbforaging.foraging.environment as lbf_module
    monkeypatch.setattr(lbf_module, "set", IndexOrderSet, raising=False)
    nat = ForagingNative("Foraging-8x8-3p-2f-coop-v3", penalty=0.1)
    ref.reset(seed=1), nat.reset(seed=1)
    rng = np.random.default_rng(0)
    penalised = 0
    for t in range(1500):
        joint = dict(zip(ref.agents, _actions(rng, 3, nat.batch.field[0], nat.batch.pos[0])))
        want, got = ref.step(joint), nat.step(joint)
        assert want[1] == got[1] and want[2] == got[2], t
        penalised += any(r < 0 for r in got[1].values())
        if not nat.agents:
            ref.reset(), nat.reset()
    assert penalised > 0


@pytest.mark.parametrize("task", ["Foraging-8x8-2p-2f-coop-v3", "Foraging-2s-10x10-3p-3f-v3"])
def test_batch_equals_its_copies_stepped_one_by_one(task):
    """The batched vector (every copy in one compiled call) against the same copies through
    ParallelCopies: rows, states, rewards, terminations, dones, valid/ended and the team reward, over
    2,000 cycles of random actions."""
    E = 5

    def copies():
        envs = [ForagingNative(task, common_reward=True) for _ in range(E)]
        for k, env in enumerate(envs):
            env.reset(seed=1000 + k)
        return envs

    n = parse_task(task).players
    agents = [f"agent_{i}" for i in range(n)]
    batched, one_by_one = team_copies(copies(), agents, False), ParallelCopies(copies(), agents, False)
    assert isinstance(batched, BatchedCopies) and isinstance(batched.batch, ForagingBatch)
    D = parse_task(task).obs_dim
    rng = np.random.default_rng(7)
    ended = terminated = 0
    for t in range(2000):
        actions = np.array([_actions(rng, n, batched.batch.field[e], batched.batch.pos[e]) for e in range(E)]).reshape(-1)
        a = assert_same_team_step(batched, one_by_one, actions, D, t)
        ended += int(a.ended.sum())
        terminated += int(a.data.terminated.sum())
    assert ended > E * 2000 // 51 and terminated == ended * n  # every ending is every agent's termination
    with pytest.raises(ValueError, match="actions must be"):
        batched.step(np.full(E * n, 6))


def test_compiled_loops_equal_the_python_functions():
    """The numba-compiled step and observation against the same functions run as Python, on random states."""
    step, observe = lbf_native.kernels()
    rng = np.random.default_rng(0)
    rules = parse_task("Foraging-2s-9x9-4p-3f-v3")
    batches = [ForagingBatch([ForagingNative("Foraging-2s-9x9-4p-3f-v3") for _ in range(6)]) for _ in range(2)]
    for b in batches:
        for e in range(6):
            b.reset(e, seed=e)
    for t in range(300):
        actions = rng.integers(0, 6, (6, 4))
        active = rng.random(6) < 0.8
        outs = []
        for b, (f_step, f_obs) in zip(batches, [(step, observe), (lbf_native._step_py, lbf_native._observe_py)]):
            rewards, ended = np.empty((6, 4)), np.empty(6, dtype=bool)
            f_step(b.field, b.pos, b.level, b.steps, b.spawned, actions, active, 50, 0.0, rewards, ended)
            obs = np.empty((6, 4, rules.obs_dim), np.float32)
            f_obs(b.field, b.pos, b.level, rules.sight, rules.foods, obs)
            outs.append((rewards.tobytes(), ended.tobytes(), obs.tobytes()))
            for e in np.flatnonzero(ended):
                b.reset(int(e))
        assert outs[0] == outs[1], t


def test_same_seed_same_episode_but_resets_remember_old_positions():
    """A reset from a seed replays the episode only from a fresh env: lbforaging (and the native) keep the
    previous episode's positions blocked while placing players."""
    def first_obs(env, seed):
        return env.reset(seed=seed)[0]["agent_0"].copy()
    a, b = ForagingNative("Foraging-5x5-4p-2f-v3"), ForagingNative("Foraging-5x5-4p-2f-v3")
    assert np.array_equal(first_obs(a, 9), first_obs(b, 9))
    starts = {first_obs(a, 9).tobytes() for _ in range(20)}
    assert len(starts) > 1  # the old positions block cells, so the same seed starts elsewhere


def test_task_ids_keys_and_bad_input():
    rules = parse_task("lbforaging:Foraging-2s-10x10-3p-3f-coop-v3")
    assert (rules.size, rules.players, rules.foods, rules.sight, rules.coop, rules.obs_dim) == (10, 3, 3, 2, True, 18)
    assert parse_task("Foraging-8x8-2p-2f-v3").sight == 8
    for bad in ["Foraging-8x9-2p-2f-v3", "Foraging-8x8-1p-2f-v3", "Foraging-8x8-2p-5f-v3", "Foraging-grid-8x8-2p-2f-v3",
                "Foraging-20x20-2p-2f-v3", 8, "Foraging-8x8-2p-2f-coop-v2"]:
        with pytest.raises(ValueError, match="scenario.task"):
            parse_task(bad)
    with pytest.raises(ValueError, match="scenario.engine"):
        LBFConfig(engine="jax").validate()
    with pytest.raises(ValueError, match="scenario.common_reward"):
        LBFConfig(common_reward="yes").validate()
    with pytest.raises(ValueError, match="scenario.penalty"):
        LBFConfig(penalty=-1).validate()
    env = ForagingNative()
    env.reset(seed=0)
    with pytest.raises(ValueError, match="action must be an integer in"):
        env.step({"agent_0": 6, "agent_1": 0})
    for _ in range(50):
        if not env.agents:
            break
        env.step({"agent_0": 0, "agent_1": 0})
    assert env.agents == [] and env.step({}) == ({}, {}, {}, {}, {})


@pytest.mark.parametrize("name", ["lbf_mappo.yaml", "lbf_ia2c.yaml"])
def test_a_run_on_either_engine_writes_the_same_metrics(name, tmp_path, monkeypatch):
    """The scenario file on the native engine (the batched vector) and on lbforaging's env (ParallelCopies
    through the gymnasium adapter): the same metrics, comm and train files, byte for byte."""
    pytest.importorskip("lbforaging", reason="the reference is lbforaging's env: the .[epymarl-envs] extra")
    import lbforaging.foraging.environment as lbf_module
    from marl_q.config import load_config
    from marl_q.experiment import run_experiment
    monkeypatch.setattr(lbf_module, "set", IndexOrderSet, raising=False)
    quiet = ["run.progress=false", "run.plots=false", "run.eval_every=null", "run.total_env_steps=4000"]
    out = {}
    for engine in ("native", "lbforaging"):
        cfg = load_config(f"scenarios/{name}", quiet + [f"scenario.engine={engine}"])
        run_experiment(cfg, tmp_path / engine)
        out[engine] = [(tmp_path / engine / f).read_bytes() for f in ("metrics.csv", "comm.csv", "train.csv")]
    assert out["native"] == out["lbforaging"] and len(out["native"][0].splitlines()) > 40


def test_scenario_runs_from_yaml_and_bad_keys_exit_with_the_key(tmp_path):
    from marl_q.config import ConfigError, load_config
    cfg = load_config("scenarios/lbf_mappo.yaml", ["scenario.task=Foraging-2s-8x8-3p-2f-v3"])
    assert cfg.scenario.params.task == "Foraging-2s-8x8-3p-2f-v3"
    with pytest.raises(ConfigError, match="scenario.task"):
        load_config("scenarios/lbf_mappo.yaml", ["scenario.task=Foraging-8x8-2p"])


def test_engine_lbforaging_without_the_package_exits_2_with_the_extra_to_install(tmp_path, monkeypatch, capsys):
    assert_engine_refused_without_package("scenarios/lbf_mappo.yaml", "lbforaging", tmp_path, monkeypatch, capsys)
    from marl_q.cli import main
    assert main(["run", "scenarios/lbf_mappo.yaml", "--set", "run.total_env_steps=800", "--set", "run.eval_every=null",
                 "--set", "run.plots=false", "--quiet", "--out", str(tmp_path / "native")]) == 0


def test_passes_pettingzoo_parallel_api_test():
    from pettingzoo.test import parallel_api_test
    parallel_api_test(ForagingNative("Foraging-8x8-3p-2f-v3"), num_cycles=200)
