"""Turn-based (AEC) games: scenarios/aec.py (the game, opponents, scenario.turns), agents/turn_based.py
(the vector of game copies, self-play pool, evaluation), the masks of agents/distributions.py, and the
minimax player of scenarios/tictactoe_minimax.py.

Turn order and reward credit are checked by hand on ``ThreeMoves``, a 3-move AEC game written here."""
from __future__ import annotations

import itertools
from collections import Counter
from functools import partial
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
from gymnasium import spaces
from pettingzoo import AECEnv
from pettingzoo.classic import tictactoe_v3

from agents.distributions import MASKED_LOGIT, Categorical
from agents.turn_based import Pool, TurnCopies, make_opponent
from marl_q.cli import main as cli_main
from marl_q.config import build_config
from marl_q.errors import ConfigError
from marl_q.experiment import resume_experiment, run_experiment
from scenarios import tictactoe_minimax as ttt
from scenarios.aec import Opponent, TurnGame, TurnsConfig, turn_based_env

HERE = "tests.scenarios.test_aec"
TTT = "pettingzoo.classic.tictactoe_v3:env"


# ----------------------------------------------------------------------------- a 3-move game
class ThreeMoves(AECEnv):
    """Two agents a, b moving a, b, a (actions 0/1), then the game ends for both. Rewards, following
    PettingZoo's conventions (``rewards`` of the last step, accumulated into ``_cumulative_rewards``,
    an agent's own cleared when it moves):

    - a's 1st move gives b +0.5 (arriving on a's turn);
    - b's move gives a -1 (arriving on b's turn);
    - a's 2nd move (action x) gives a 2 + x and b -2, and ends the game.

    On a's 2nd move action 1 is legal only if a's 1st move was 1 (the mask). ``log`` records who moved."""

    metadata = {"name": "three_moves_v0", "is_parallelizable": False}

    def __init__(self) -> None:
        self.possible_agents = ["a", "b"]
        self.log: list[tuple[str, int]] = []

    def observation_space(self, agent):
        return spaces.Dict({"observation": spaces.Box(0, 1, (3,), np.float32),
                            "action_mask": spaces.Box(0, 1, (2,), np.int8)})

    def action_space(self, agent):
        return spaces.Discrete(2)

    def observe(self, agent):
        obs = np.zeros(3, dtype=np.float32)
        obs[min(self.moves, 2)] = 1.0
        mask = np.array([1, 1 if self.moves != 2 or self.first == 1 else 0], dtype=np.int8)
        return {"observation": obs, "action_mask": mask}

    def reset(self, seed=None, options=None):
        self.agents = list(self.possible_agents)
        self.rewards = {a: 0.0 for a in self.agents}
        self._cumulative_rewards = {a: 0.0 for a in self.agents}
        self.terminations = {a: False for a in self.agents}
        self.truncations = {a: False for a in self.agents}
        self.infos = {a: {} for a in self.agents}
        self.moves, self.first = 0, 0
        self.agent_selection = "a"
        self.log = []

    def step(self, action):
        agent = self.agent_selection
        if self.terminations[agent] or self.truncations[agent]:
            self._was_dead_step(action)
            return
        self._cumulative_rewards[agent] = 0.0
        self.rewards = {a: 0.0 for a in self.agents}
        self.log.append((agent, int(action)))
        if self.moves == 0:
            self.first = int(action)
            self.rewards["b"] = 0.5
        elif self.moves == 1:
            self.rewards["a"] = -1.0
        else:
            self.rewards["a"], self.rewards["b"] = 2.0 + action, -2.0
            self.terminations = {a: True for a in self.agents}
        self.moves += 1
        self.agent_selection = "b" if agent == "a" else "a"
        self._accumulate_rewards()


def three_moves() -> ThreeMoves:
    return ThreeMoves()


class Always(Opponent):
    """Plays ``action`` and records who it was asked to move for."""

    name = "always"

    def __init__(self, action: int = 0) -> None:
        self.action, self.asked = action, []

    def move(self, agent, observation, mask, flat):
        self.asked.append(agent)
        return self.action


def first_legal(observation, action_mask, rng) -> int:
    """A scripted opponent (import path tests.scenarios.test_aec:first_legal)."""
    return int(np.flatnonzero(action_mask)[0])


def test_three_moves_is_a_turn_based_game_and_tictactoe_too():
    assert turn_based_env(ThreeMoves()) and turn_based_env(tictactoe_v3.env())


def test_only_the_seat_to_move_acts_and_rewards_are_credited_to_who_earned_them():
    # learner in seat a: its moves 1 and 3; the opponent is asked for b's move only
    opp = Always(0)
    vec = TurnCopies([TurnGame(ThreeMoves())], ["a", "b"], lambda: opp, seat=0)
    step = vec.step(np.array([0]))  # the restart step: not valid, nothing played by the learner
    assert not step.valid[0] and step.data == [None] and vec.games[0].env.log == []
    np.testing.assert_array_equal(vec.obs[0], [1, 0, 0])
    step = vec.step(np.array([1]))  # a plays 1, b (opponent) plays 0: a is credited b's -1
    assert vec.games[0].env.log == [("a", 1), ("b", 0)] and opp.asked == ["b"]
    assert step.valid[0] and step.reward[0] == -1.0 and not step.ended[0]
    np.testing.assert_array_equal(vec.mask[0], [1, 1])  # a's first move was 1: action 1 legal
    step = vec.step(np.array([1]))  # a's last move: 2 + 1, and the game ends for both
    assert step.reward[0] == 3.0 and step.ended[0] and step.data[0] == (3.0, True, True)
    assert vec.games[0].totals == {"a": 2.0, "b": -1.5}
    assert vec.outcome(0) == {"seat": 0, "opponent": "always", "win": 1, "draw": 0, "loss": 0, "illegal": 0}
    assert not vec.step(np.array([0])).valid[0]  # the next step restarts the game


def test_a_reward_arriving_before_the_seats_first_move_goes_into_its_first_transition():
    # learner in seat b: b's +0.5 arrives on a's turn, before b ever moved; b's only transition then
    # holds it and the -2 of a's last move (arriving on a's turn): -1.5
    opp = Always(1)
    vec = TurnCopies([TurnGame(ThreeMoves())], ["a", "b"], lambda: opp, seat=1)
    vec.step(np.array([0]))
    assert vec.games[0].env.log == [("a", 1)] and opp.asked == ["a"]
    step = vec.step(np.array([0]))
    assert vec.games[0].env.log == [("a", 1), ("b", 0), ("a", 1)] and opp.asked == ["a", "a"]
    assert step.reward[0] == -1.5 and step.ended[0]
    assert vec.outcome(0)["loss"] == 1 and vec.games[0].totals == {"a": 2.0, "b": -1.5}


def test_an_illegal_move_is_counted_and_masked_sampling_never_makes_one():
    vec = TurnCopies([TurnGame(ThreeMoves())], ["a", "b"], lambda: Always(0), seat=0)
    vec.step(np.array([0]))
    vec.step(np.array([0]))  # a's first move 0: on its last move action 1 is illegal
    np.testing.assert_array_equal(vec.mask[0], [1, 0])
    vec.step(np.array([1]))
    assert vec.outcome(0)["illegal"] == 1
    dist, rng = Categorical(2), np.random.default_rng(0)
    draws = dist.sample(np.tile([[0.0, 30.0]], (5000, 1)), rng, np.tile([[1.0, 0.0]], (5000, 1)))
    assert (draws == 0).all()
    assert dist.mode(np.array([[0.0, 30.0]]), np.array([[1.0, 0.0]]))[0] == 0


def test_masked_log_probabilities_and_entropies_are_those_of_the_distribution_over_legal_moves():
    rng = np.random.default_rng(1)
    logits = rng.normal(size=(6, 5))
    avail = (rng.random((6, 5)) < 0.6).astype(np.float32)
    avail[:, 2] = 1.0  # at least one legal move per row
    actions = np.array([np.flatnonzero(a)[k % int(a.sum())] for k, a in enumerate(avail)])
    out = torch.tensor(logits, dtype=torch.float64, requires_grad=True)
    logp, ent = Categorical(5).log_prob_entropy(out, torch.from_numpy(actions), torch.from_numpy(avail))
    for i in range(6):  # reference: softmax over the legal entries alone
        legal = np.flatnonzero(avail[i])
        z = logits[i, legal] - logits[i, legal].max()
        p = np.exp(z) / np.exp(z).sum()
        assert logp[i].item() == pytest.approx(np.log(p[list(legal).index(actions[i])]), abs=1e-12)
        assert ent[i].item() == pytest.approx(-(p * np.log(p)).sum(), abs=1e-12)
    (logp.sum() + ent.sum()).backward()
    assert (out.grad.numpy()[avail == 0] == 0).all()  # an illegal move's logit gets no gradient
    assert MASKED_LOGIT < -1e8


def test_the_learners_batch_carries_each_turns_legal_moves(tmp_path):
    from agents.mappo import TurnWorker

    cfg = build_config(_raw(f"{HERE}:three_moves", steps=40, opponents=[f"{HERE}:first_legal"]))
    worker = TurnWorker(cfg, 0)
    batch, episodes, steps = worker.rollout()
    valid = batch["valid"]
    # rows where the learner holds seat a at its 2nd move after playing 0 first: action 1 masked
    assert batch["avail"].shape == (cfg.algorithm.params.n_steps, 2, 2)
    assert (batch["avail"][valid].sum(axis=1) >= 1).all()
    assert ((batch["avail"][valid] == 0).sum()) > 0
    picked = np.take_along_axis(batch["avail"], batch["actions"][..., None], axis=2)[..., 0]
    assert (picked[valid] == 1).all()  # never an illegal move sampled
    assert episodes and all(e["illegal"] == 0 for e in episodes) and steps == valid.sum()


def test_with_critic_opponent_the_critic_reads_the_opponent_each_row_was_played_against():
    from agents.mappo import TurnWorker

    specs = ["self_play", "random", f"{HERE}:first_legal"]
    names = ["self_play", "random", "first_legal"]
    cfg = build_config(_raw(TTT, opponents=specs, critic_opponent=True))
    worker = TurnWorker(cfg, 0)
    played: list[list] = []  # before each step (when the rows are read): each copy's opponent's name
    step = worker.vec.step

    def recording(actions):
        played.append([None if o is None else o.name for o in worker.vec.opponent])
        return step(actions)
    worker.vec.step = recording
    batch, episodes, steps = worker.rollout()
    K, T = len(specs), cfg.algorithm.params.n_steps
    obs, cobs, valid = batch["obs"], batch["critic_obs"], batch["valid"]
    assert cobs.shape == obs.shape[:2] + (obs.shape[2] + K,)
    assert np.array_equal(cobs[..., :-K], obs)  # the actor's rows, unchanged, then the one-hot
    assert len(played) == T and valid.any()
    seen = set()
    for t, e in zip(*np.nonzero(valid)):
        expected = np.zeros(K, dtype=np.float32)
        expected[names.index(played[t][e])] = 1.0
        assert np.array_equal(cobs[t, e, -K:], expected), (t, e)
        seen.add(played[t][e])
    assert len(seen) >= 2  # the rollout met several opponents
    # the critic's input is sized for the one-hot; the actor's is not
    first = lambda m: next(x for x in m.modules() if isinstance(x, torch.nn.Linear))
    assert first(worker.critic).in_features == obs.shape[2] + K
    assert first(worker.actor).in_features == obs.shape[2]
    # a critic per agent (share_params: false) cannot take it: refused at load
    raw = _raw(TTT, opponents=specs, critic_opponent=True)
    raw["algorithm"]["share_params"] = False
    with pytest.raises(ConfigError, match="critic_opponent: algorithm ippo needs algorithm.share_params: true"):
        build_config(raw)
    # without the key, no critic rows of its own
    plain = TurnWorker(build_config(_raw(TTT, opponents=specs)), 0)
    assert "critic_obs" not in plain.rollout()[0]


# ----------------------------------------------------------------------------- opponents and config
def test_the_self_play_pool_keeps_the_newest_snapshots_and_plays_the_one_it_drew():
    actor = torch.nn.Linear(3, 2)
    critic = torch.nn.Linear(3, 1)
    # flat layout: actor weight (6), actor bias (2), critic weight (3), critic bias (1)
    pool = Pool((actor, critic, Categorical(2)), np.zeros(12, dtype=np.float32), 2, None, ["a", "b"],
                np.random.default_rng(0))
    for k in (1, 2, 3):
        pool.add(np.full(12, float(k), dtype=np.float32))
    assert [s[0] for s in pool.snapshots] == [2.0, 3.0]
    frozen = pool.draw()
    assert frozen.generation in (2, 3)
    # a snapshot whose actor says action 1 always, action 0 masked out or not
    pool.snapshots[-1] = np.concatenate([np.zeros(6), [-50.0, 50.0], np.zeros(4)]).astype(np.float32)
    pool.loaded = None
    assert pool.move(3, "a", np.zeros(3, np.float32), np.array([1.0, 1.0])) == 1
    assert pool.move(3, "a", np.zeros(3, np.float32), np.array([1.0, 0.0])) == 0


@pytest.mark.parametrize("turns,match", [
    ({"opponents": ["no_such_module_xyz:player"]}, r"cannot import module 'no_such_module_xyz'"),
    ({"opponents": [f"{HERE}:no_such_player"]}, r"has no attribute 'no_such_player'"),
    ({"opponents": ["minimax"]}, r"neither 'self_play', 'random' nor an import path"),
    ({"eval_opponents": ["self_play"]}, r"self_play is a training opponent"),
    ({"pool_size": 0}, r"turns.pool_size: must be a positive integer"),
    ({"opponent": "random"}, r"unknown key 'opponent'"),
    ({"opponents": ["self_play", "random"], "weights": [1.0]}, r"turns.weights: one non-negative number per opponent"),
    ({"opponents": ["self_play", "random"], "weights": [1.0, -0.5]}, r"turns.weights: one non-negative number"),
    ({"opponents": ["self_play", "random"], "weights": [0, 0]}, r"not all zero"),
    ({"opponents": ["self_play", "random"], "weights": [1, "a"]}, r"turns.weights"),
    ({"critic_opponent": "yes"}, r"turns.critic_opponent: true or false"),
])
def test_bad_turns_keys_are_config_errors(turns, match):
    with pytest.raises(ConfigError, match=match):
        build_config(_raw(TTT, **turns))


def test_weighted_opponents_are_drawn_at_their_normalised_weights_and_unweighted_ones_as_before():
    from scipy.stats import chisquare
    specs = ["self_play", "random", f"{HERE}:first_legal"]
    cfg = TurnsConfig.from_dict({"opponents": specs, "weights": [1, 3, 6]})
    rng, n = np.random.default_rng(5), 20000
    counts = Counter(cfg.draw(rng) for _ in range(n))
    expected = np.array([0.1, 0.3, 0.6]) * n  # 1:3:6 normalised, by hand
    assert chisquare([counts[s] for s in specs], expected).pvalue > 1e-3
    assert counts[specs[0]] < counts[specs[1]] < counts[specs[2]]
    # a zero weight is never drawn
    zero = TurnsConfig.from_dict({"opponents": specs, "weights": [0, 1, 1]})
    assert "self_play" not in {zero.draw(rng) for _ in range(2000)}
    # without weights: one integers draw per episode, the stream the shipped goldens were recorded with
    plain, a, b = TurnsConfig.from_dict({"opponents": specs}), np.random.default_rng(9), np.random.default_rng(9)
    assert [plain.draw(a) for _ in range(200)] == [specs[int(b.integers(3))] for _ in range(200)]


def test_turns_on_a_game_that_is_not_turn_based_is_a_config_error():
    raw = _raw("mpe2.simple_spread_v3:parallel_env", opponents=["random"])
    with pytest.raises(ConfigError, match="is not a turn-based game"):
        build_config(raw)


def _write(tmp_path: Path, scenario: str, algorithm: str) -> Path:
    cfg = tmp_path / "bad.yaml"
    cfg.write_text(textwrap.dedent(f"""
        run: {{total_env_steps: 100}}
        scenario: {scenario}
        algorithm: {{name: {algorithm}}}
    """))
    return cfg


def test_a_scripted_opponent_that_does_not_import_exits_2_with_one_line(tmp_path, capsys):
    cfg = _write(tmp_path, f'{{name: pettingzoo, env: "{TTT}", turns: {{opponents: ["no_such_module_xyz:play"]}}}}',
                 "ippo")
    assert cli_main(["run", str(cfg), "--out", str(tmp_path / "run"), "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "cannot import module 'no_such_module_xyz'" in err, err
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("algorithm", ["mappo", "maa2c", "iql", "coma", "ppo"])
def test_a_turn_based_game_given_to_a_learner_that_cannot_take_turns_exits_2_with_one_line(algorithm, tmp_path,
                                                                                           capsys):
    cfg = _write(tmp_path, f'{{name: pettingzoo, env: "{TTT}"}}', algorithm)
    assert cli_main(["run", str(cfg), "--out", str(tmp_path / "run"), "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and ("turn-based (AEC) game" in err or "kind 'aec'" in err), err
    assert not (tmp_path / "run").exists()


# ----------------------------------------------------------------------------- runs
def _raw(env: str, algorithm: str = "ippo", steps: int = 400, **turns) -> dict:
    algo = {"name": algorithm, "envs_per_worker": 2, "n_steps": 8}
    if algorithm == "ippo":
        algo.update(epochs=2, minibatches=2)
    scenario = {"name": "pettingzoo", "env": env}
    if turns:
        scenario["turns"] = turns
    return {"run": {"seed": 0, "total_env_steps": steps, "progress": False, "plots": False},
            "backend": {"name": "sim", "workers": 1}, "scenario": scenario, "algorithm": algo,
            "actor": {"head": "mlp", "hidden": [16]}, "critic": {"head": "mlp", "hidden": [16]}}


@pytest.mark.parametrize("algorithm", ["ippo", "ia2c"])
def test_a_tictactoe_run_reports_each_episodes_seat_opponent_and_outcome(algorithm, tmp_path):
    raw = _raw(TTT, algorithm, steps=300, opponents=["self_play", "random"], refresh=2,
               eval_opponents=["random", "scenarios.tictactoe_minimax:minimax"])
    raw["run"].update(eval_every=150, eval_episodes=6)
    summary = run_experiment(build_config(raw), tmp_path / "r")
    assert summary["status"] == "completed"
    import csv
    rows = list(csv.DictReader((tmp_path / "r" / "metrics.csv").open()))
    assert rows and {r["opponent"] for r in rows} == {"self_play", "random"}
    assert {r["seat"] for r in rows} == {"0", "1"}
    for r in rows:
        assert int(r["win"]) + int(r["draw"]) + int(r["loss"]) == 1 and r["illegal"] == "0"
        assert float(r["return"]) == {"1": 1.0, "0": 0.0}[r["win"]] - int(r["loss"])  # tictactoe: +1/0/-1
    evals = list(csv.DictReader((tmp_path / "r" / "eval.csv").open()))
    assert len(evals) == 2
    for e in evals:
        for name in ("random", "minimax"):
            assert sum(float(e[f"{k}_{name}"]) for k in ("win", "draw", "loss")) == pytest.approx(1.0)
        assert e["illegal"] == "0" and e["episodes"] == "12"
        assert float(e["win_minimax"]) == 0.0  # a perfect player is never beaten


@pytest.mark.parametrize("extra", [{}, {"weights": [1, 3], "critic_opponent": True}])
def test_a_turn_based_run_on_sim_is_byte_identical_and_resumes_exactly(extra, tmp_path):
    raw = _raw(TTT, steps=320, opponents=["self_play", "random"], refresh=2, pool_size=2, **extra)
    raw["run"].update(eval_every=160, eval_episodes=4)
    files = ("metrics.csv", "comm.csv", "train.csv", "eval.csv")
    run_experiment(build_config(raw), tmp_path / "one")
    run_experiment(build_config(raw), tmp_path / "two")
    for f in files:
        one = (tmp_path / "one" / f).read_bytes()
        assert one == (tmp_path / "two" / f).read_bytes() and one.count(b"\n") > 2, f
    part = run_experiment(build_config({**raw, "run": {**raw["run"], "stop_after_updates": 7}}), tmp_path / "part")
    assert part["status"] == "stopped"
    resumed = resume_experiment(tmp_path / "part")
    assert resumed["status"] == "completed" and resumed["resumes"][0]["exact"] is True
    for f in files:
        assert (tmp_path / "part" / f).read_bytes() == (tmp_path / "one" / f).read_bytes(), f


def test_a_scripted_opponent_resumes_from_its_import_path(tmp_path):
    raw = _raw(TTT, steps=160, opponents=["scenarios.tictactoe_minimax:minimax"])
    run_experiment(build_config(raw), tmp_path / "one")
    part = run_experiment(build_config({**raw, "run": {**raw["run"], "stop_after_updates": 4}}), tmp_path / "part")
    resume_experiment(tmp_path / "part")
    one = (tmp_path / "one" / "metrics.csv").read_bytes()
    assert (tmp_path / "part" / "metrics.csv").read_bytes() == one and part["status"] == "stopped"
    assert b",minimax," in one and b",1,0,0,0\n" not in one  # never a win against minimax


# ----------------------------------------------------------------------------- the minimax player
def _brute(board: tuple[int, ...]) -> int:
    """The mover's (1's) value by full enumeration of every continuation, no memo, no swap trick:
    players alternate 1, 2 from here; +1 if 1 completes a line first, -1 if 2 does, 0 on a full board."""
    def search(b: list[int], mover: int) -> int:
        for line in ttt.LINES:
            marks = {b[i] for i in line}
            if len(marks) == 1 and 0 not in marks:
                return 1 if marks == {1} else -1
        moves = [i for i in range(9) if b[i] == 0]
        if not moves:
            return 0
        outcomes = []
        for i in moves:
            b[i] = mover
            outcomes.append(search(b, 3 - mover))
            b[i] = 0
        return max(outcomes) if mover == 1 else min(outcomes)
    return search(list(board), 1)


def _positions(min_marks: int) -> list[tuple[int, ...]]:
    """Every legal position with the mover (1) to play, not yet won, with at least ``min_marks`` marks:
    the mover has as many marks as the opponent (it moved first) or one fewer."""
    out = []
    for board in itertools.product((0, 1, 2), repeat=9):
        ones, twos = board.count(1), board.count(2)
        if ones + twos < min_marks or twos - ones not in (0, 1) or ttt.winner(board) or ones + twos == 9:
            continue
        out.append(board)
    return out


def test_the_best_win_rate_against_random_matches_by_hand_and_a_simulation_of_its_policy():
    # by hand: side 1 to move with two in a line wins; side 2 (random) to move with one cell left,
    # the last cell completing its line: it loses for sure
    assert ttt.against_random((1, 1, 0, 2, 2, 0, 0, 0, 0), True, False) == (1.0, 0.0)
    assert ttt.against_random((1, 1, 2, 2, 1, 2, 1, 2, 0), False, True) == (0.0, 1.0)  # 2 completes 2-5-8
    # the policy that attains it, played against a uniform random player: win and loss rates within
    # 4.5 standard errors of the exact values, and the safe one never loses
    rng = np.random.default_rng(0)
    for first, safe in ((True, True), (False, True), (False, False)):
        exact_win, exact_loss = ttt.against_random((0,) * 9, first, safe)
        n, wins, losses = 6000, 0, 0
        for _ in range(n):
            board, mine = [0] * 9, first
            while ttt.winner(tuple(board)) is None and 0 in board:
                if mine:
                    board[ttt.best_move_against_random(tuple(board), safe)] = 1
                else:
                    empty = [a for a in range(9) if board[a] == 0]
                    board[empty[rng.integers(len(empty))]] = 2
                mine = not mine
            wins += ttt.winner(tuple(board)) == 1
            losses += ttt.winner(tuple(board)) == 2
        for got, p in ((wins / n, exact_win), (losses / n, exact_loss)):
            assert abs(got - p) <= 4.5 * np.sqrt(max(p * (1 - p), 1e-4) / n), (first, safe, got, p)
        if safe:
            assert losses == 0


def test_minimax_values_and_best_moves_match_brute_force_on_small_positions():
    positions = _positions(5)
    assert len(positions) > 1000
    for board in positions:
        vals = ttt.values(board)
        for a, v in vals.items():
            after = board[:a] + (1,) + board[a + 1:]
            brute = 1 if ttt.winner(after) == 1 else (0 if 0 not in after else -_brute(tuple((0, 2, 1)[c] for c in after)))
            assert v == brute, (board, a)
        assert ttt.value(board) == _brute(board)


def test_minimax_reads_the_envs_board_never_loses_and_draws_against_itself():
    def game(players, seed):
        env = tictactoe_v3.env()
        env.reset(seed=seed)
        rng = np.random.default_rng(seed)
        totals = {a: 0.0 for a in env.possible_agents}
        for agent in env.agent_iter():
            obs, rew, term, trunc, _ = env.last()
            totals[agent] += rew
            if term or trunc:
                env.step(None)
                continue
            board = ttt.board_of(obs["observation"])
            assert board.count(0) == int(obs["action_mask"].sum())  # the empty cells are the legal moves
            env.step(players[agent](obs["observation"], obs["action_mask"], rng))
        return totals

    rand = make_opponent("random", np.random.default_rng(5))

    def random_player(o, m, r):
        return rand.move("", o, m, o)

    for seed in range(60):
        first = game({"player_1": ttt.minimax, "player_2": random_player}, seed)
        second = game({"player_1": random_player, "player_2": ttt.minimax}, seed)
        assert first["player_1"] >= 0 and second["player_2"] >= 0
    for seed in range(10):
        assert game({"player_1": ttt.minimax, "player_2": ttt.minimax}, seed) == {"player_1": 0.0, "player_2": 0.0}


def test_minimax_centre_opens_in_the_centre_a_drawn_opening_and_otherwise_plays_as_minimax():
    empty = np.zeros((3, 3, 2), dtype=np.int8)
    rng = np.random.default_rng(0)
    assert {ttt.minimax_centre(empty, np.ones(9, dtype=np.int8), rng) for _ in range(20)} == {4}
    assert ttt.values((0,) * 9) == {a: 0 for a in range(9)}  # tic-tac-toe is a draw from every opening, the centre too
    for board in _positions(1):  # every position after the opening, the mover to play
        obs, mask = ttt.observation_of(board), np.array([c == 0 for c in board], dtype=np.int8)
        a, b = np.random.default_rng(3), np.random.default_rng(3)
        assert ttt.minimax_centre(obs, mask, a) == ttt.minimax(obs, mask, b), board


def _blocker(board: tuple[int, ...]) -> int:
    """A scripted player (side 1): complete its own line, else block the opponent's, else the first empty
    cell of 4, 1, 3, 5, 7, 0, 2, 6, 8 (it draws as first player and loses to some forks as second)."""
    empty = [a for a in range(9) if board[a] == 0]
    for side in (1, 2):
        for a in empty:
            if ttt.winner(board[:a] + (side,) + board[a + 1:]) == side:
                return a
    return next(a for a in (4, 1, 3, 5, 7, 0, 2, 6, 8) if board[a] == 0)


def test_the_exact_outcome_against_minimax_matches_by_hand_and_games_played_in_the_env():
    perfect = lambda board: ttt.best_moves(board)[0]  # noqa: E731
    for first in (True, False):
        rates, lost = ttt.against_minimax(perfect, first)
        assert rates == pytest.approx({"win": 0.0, "draw": 1.0, "loss": 0.0}) and lost == []
    # by hand: first in action order, as first player: 0 (a corner); minimax's one drawing reply is the
    # centre; 1 threatens 2, minimax blocks it there and threatens 6 (2-4-6); 3 does not block: lost
    rates, lost = ttt.against_minimax(lambda board: board.index(0), True)
    assert rates == {"win": 0.0, "draw": 0.0, "loss": 1.0}
    assert lost == [(1.0, ("p0", "m4", "p1", "m2", "p3*", "m6"))]
    # the blocker as second player, against minimax in tictactoe_v3 itself (the board read from the env's
    # observations): the loss rate within 4.5 standard errors of the exact one; the lost lines add up to it
    rates, lost = ttt.against_minimax(_blocker, False)
    assert 0.2 < rates["loss"] < 0.8 and rates["win"] == 0.0
    assert sum(rates.values()) == pytest.approx(1.0) and sum(p for p, _ in lost) == pytest.approx(rates["loss"])
    assert all(line[0].startswith("m") and any("*" in m for m in line) for _, line in lost)
    env, rng, n, losses = tictactoe_v3.env(), np.random.default_rng(3), 1500, 0
    for game in range(n):
        env.reset(seed=game)
        for agent in env.agent_iter():
            obs, rew, term, trunc, _ = env.last()
            if term or trunc:
                losses += agent == "player_2" and rew < 0
                env.step(None)
                continue
            o = obs["observation"]
            assert np.array_equal(ttt.observation_of(ttt.board_of(o)), o)  # board_of's inverse
            env.step(ttt.minimax(o, obs["action_mask"], rng) if agent == "player_1" else _blocker(ttt.board_of(o)))
    p = rates["loss"]
    assert abs(losses / n - p) <= 4.5 * np.sqrt(p * (1 - p) / n), (losses / n, p)


def test_the_exact_outcome_against_random_matches_the_expectimax_and_games_played_in_the_env():
    # the expectimax-best player (against_random's own moves, searched separately) walked against every
    # random move: exactly against_random's win and loss probabilities, in each seat
    for first in (True, False):
        rates, lost = ttt.against_random_player(lambda board: ttt.best_move_against_random(board, False), first)
        win, loss = ttt.against_random((0,) * 9, first, False)
        assert rates["win"] == pytest.approx(win) and rates["loss"] == pytest.approx(loss)
        assert sum(rates.values()) == pytest.approx(1.0) and sum(p for p, _ in lost) == pytest.approx(loss)
    # the blocker as second player against a uniform random player in tictactoe_v3 itself: the win and
    # loss rates within 4.5 standard errors of the exact ones
    rates, _ = ttt.against_random_player(_blocker, False)
    env, rng, n, wins, losses = tictactoe_v3.env(), np.random.default_rng(4), 1500, 0, 0
    for game in range(n):
        env.reset(seed=game)
        for agent in env.agent_iter():
            obs, rew, term, trunc, _ = env.last()
            if term or trunc:
                if agent == "player_2":
                    wins, losses = wins + (rew > 0), losses + (rew < 0)
                env.step(None)
                continue
            legal = np.flatnonzero(obs["action_mask"])
            env.step(int(rng.choice(legal)) if agent == "player_1" else _blocker(ttt.board_of(obs["observation"])))
    for count, p in ((wins, rates["win"]), (losses, rates["loss"])):
        assert abs(count / n - p) <= 4.5 * np.sqrt(p * (1 - p) / n), (count / n, p)


def test_turns_defaults_are_filled_in_when_validated():
    cfg = build_config(_raw(TTT))
    assert cfg.scenario.params.turns == TurnsConfig().as_dict()


def test_matches_of_a_finished_run_per_seat_and_a_bad_opponent_path_exit_2(tmp_path, capsys):
    import json

    from agents.turn_based import main as matches_main

    raw = _raw(TTT, steps=64, opponents=["random"])
    run_experiment(build_config(raw), tmp_path / "r")
    capsys.readouterr()
    assert matches_main([str(tmp_path / "r"), "--opponent", "scenarios.tictactoe_minimax:minimax", "--games", "6"]) == 0
    out = json.loads(capsys.readouterr().out)
    for agent in ("player_1", "player_2"):
        assert out[agent]["games"] == 6 and out[agent]["illegal"] == 0 and out[agent]["win"] == 0.0
        assert out[agent]["draw"] + out[agent]["loss"] == pytest.approx(1.0)
    assert matches_main([str(tmp_path / "r"), "--opponent", "no_such_module_xyz:f"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "cannot import module 'no_such_module_xyz'" in err



def _greedy_on_board(worker, board, seat: int) -> int:
    """The worker's greedy move on a tic-tac-toe board for ``seat``, read from the env's observation as
    evaluation reads it (the exact walks' policy)."""
    vec = TurnCopies(worker.envs[:1], worker.desc.agents, lambda: None)
    vec.obs[0], vec.mask[0], vec.seat[0] = ttt.observation_of(board).reshape(-1), [c == 0 for c in board], seat
    return int(worker.greedy(vec)[0])


def test_exact_matches_walk_the_greedy_policy_of_a_run_against_minimax_and_refuse_other_opponents(tmp_path,
                                                                                                  capsys):
    import json

    from agents.turn_based import main as matches_main
    from marl_q.registry import ALGORITHMS
    from marl_q.rundir import load_trained

    raw = _raw(TTT, steps=64, opponents=["random"])
    run_experiment(build_config(raw), tmp_path / "r")
    capsys.readouterr()
    assert matches_main([str(tmp_path / "r"), "--opponent", ttt.SPEC, "--exact"]) == 0
    out = json.loads(capsys.readouterr().out)
    # the same walk over the policy's greedy moves, read from the env's observation as evaluation does
    trained = load_trained(tmp_path / "r")
    worker = ALGORITHMS.get(trained.cfg.algorithm.name).obj(trained.cfg).make_worker(0)
    worker.actor.load_state_dict(trained.policy.models["actor"].state_dict())
    for seat, agent in enumerate(("player_1", "player_2")):
        policy = partial(_greedy_on_board, worker, seat=seat)
        rates, lost = ttt.against_minimax(policy, seat == 0)
        assert {k: out[agent][k] for k in rates} == pytest.approx(rates) and out[agent]["win"] == 0.0
        assert out[agent]["lost"] == [[round(p, 6), " ".join(line)] for p, line in lost]
    assert matches_main([str(tmp_path / "r"), "--opponent", "scenarios.tictactoe_minimax:minimax_centre",
                         "--exact"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "--exact needs --opponent scenarios.tictactoe_minimax:minimax or random" in err
    # against random: the exact walk of every random move, its ten likeliest lost lines and their count
    assert matches_main([str(tmp_path / "r"), "--opponent", "random", "--exact"]) == 0
    out = json.loads(capsys.readouterr().out)
    for seat, agent in enumerate(("player_1", "player_2")):
        policy = partial(_greedy_on_board, worker, seat=seat)
        rates, lost = ttt.against_random_player(policy, seat == 0)
        assert {k: out[agent][k] for k in rates} == pytest.approx(rates) and out[agent]["lost_lines"] == len(lost)
        assert out[agent]["lost"] == [[round(p, 6), " ".join(line)] for p, line in lost[:10]]
