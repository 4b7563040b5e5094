"""dqn on turn-based (AEC) games (agents/q_learning.py's TurnQWorker and TurnEnv, agents/turn_based.py):

- a transition runs from one of the learner's turns to its next, its reward is what the turn-based
  machinery credits the learner's seat in between, and the learner's TD target bootstraps from its own
  next turn: checked by hand on the 3-move game (a non-terminal move, a terminal win and a terminal
  loss) and on tic-tac-toe games that end in a win, a loss and a draw;
- masks: the target's max ignores a move illegal at the next turn even when its Q is the largest;
  acting (epsilon-greedy at epsilon 1 and 0, the greedy evaluation) never picks an illegal move, and
  a training run samples none (counted) and has no chunk refused for one;
- sim reruns are byte-identical, and a run stopped with a non-empty buffer and a self-play pool
  resumes exactly;
- the matches of agents.turn_based (per seat, and the exact walk against minimax) play the greedy
  Q-policy of a dqn run;
- bad input exits 2 with one line.
"""
from __future__ import annotations

import csv
import json
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

from agents.q_learning import NStepAssembler, QConfig, QDims, QLearner, TurnEnv, TurnQWorker, replay_fields, transition
from agents.turn_based import TurnCopies
from agents.value_targets import epsilon_greedy
from marl_q.cli import main as cli_main
from marl_q.config import build_config
from marl_q.experiment import resume_experiment, run_experiment
from scenarios import tictactoe_minimax as ttt
from scenarios.aec import Opponent, TurnGame
from tests.scenarios.test_aec import HERE, TTT, ThreeMoves

GAMMA = 0.9


class Script(Opponent):
    """Plays the moves of a list, in order."""

    name = "script"

    def __init__(self, moves: list[int]) -> None:
        self.moves = list(moves)

    def move(self, agent, observation, mask, flat):
        return self.moves.pop(0)


def _rows(vec: TurnCopies) -> np.ndarray:
    """The learner's rows as TurnQWorker makes them with agent ids: observation, then the seat one-hot."""
    return np.concatenate([vec.obs, np.eye(len(vec.agents), dtype=np.float32)[vec.seat]], axis=1)


def _transitions(env, agents, opponent, seat, actions) -> dict[str, np.ndarray]:
    """The replay rows (one-step windows) of the learner in ``seat`` playing ``actions`` in one game."""
    vec = TurnEnv(TurnCopies([TurnGame(env)], agents, lambda: opponent, seat=seat), _rows)
    steps = []
    for a in [0] + list(actions):  # the first step only starts the game
        observed = vec.observe()
        action = np.array([a])
        steps.append(transition(vec, *observed, action, vec.step(action)))
    chunk = {k: np.stack([s[k] for s in steps]) for k in steps[0]}
    rows = NStepAssembler(GAMMA, 1).rows(chunk)
    assert len(rows["action"]) == len(actions)  # the restart step is never sent
    return rows


def _learner(obs_dim: int, n_actions: int) -> QLearner:
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(obs_dim, 8), torch.nn.ReLU(), torch.nn.Linear(8, n_actions))
    dims = QDims(obs_dim, n_actions, agents=("a", "b"), turns=True, seats=2)
    return QLearner(QConfig(gamma=GAMMA, lr=1e-2, grad_clip=None, double=False, loss="mse"), "dqn", net, dims)


def _update_against(learner: QLearner, rows: dict[str, np.ndarray], y: np.ndarray) -> None:
    """One update of ``learner`` on the replay rows: its TD errors are |y - Q(s, a)| for the targets ``y``
    computed by hand, and its (mean-squared) loss their mean square."""
    fields = [f.name for f in replay_fields(learner.dims)]
    with torch.no_grad():
        q = learner.online(torch.from_numpy(rows["obs"])).numpy()[np.arange(len(y)), rows["action"]]
    loss, td = learner.update({k: rows[k] for k in fields})
    np.testing.assert_allclose(td, np.abs(np.asarray(y) - q), rtol=1e-5, atol=1e-6)
    assert loss == pytest.approx(float(np.mean((np.asarray(y) - q) ** 2)), rel=1e-5)


def test_the_three_move_games_transitions_and_targets_by_hand():
    # seat a: a plays 0, b (the opponent) plays 0 (a is credited b's -1), a plays 0 and wins (2 + 0);
    # after a's first move 0, action 1 is illegal on a's second turn
    rows = _transitions(ThreeMoves(), ["a", "b"], Script([0]), 0, [0, 0])
    np.testing.assert_array_equal(rows["obs"][:, :3], [[1, 0, 0], [0, 0, 1]])  # a's two turns
    np.testing.assert_array_equal(rows["obs"][:, 3:], [[1, 0], [1, 0]])  # seat a's id
    np.testing.assert_array_equal(rows["next_obs"][0], rows["obs"][1])  # its next turn, not b's
    np.testing.assert_array_equal(rows["reward"], [-1.0, 2.0])
    np.testing.assert_array_equal(rows["terminated"], [False, True])
    np.testing.assert_array_equal(rows["next_avail"][0], [True, False])
    np.testing.assert_allclose(rows["discount"], [GAMMA, GAMMA])
    learner = _learner(5, 2)
    with torch.no_grad():  # the target network values a's 2nd turn's illegal move 1 far above move 0
        learner.target[2].bias.copy_(torch.tensor([0.0, 50.0]))
        q = learner.target(torch.from_numpy(rows["next_obs"][:1])).numpy()[0]
    assert q[1] > q[0] + 10
    # by hand: the non-terminal move bootstraps from a's own next turn, over its legal move 0 only;
    # the terminal win is its reward
    _update_against(learner, rows, [-1.0 + GAMMA * q[0], 2.0])
    # the same game with a's first move 1: both moves legal on its next turn, the max takes move 1
    rows = _transitions(ThreeMoves(), ["a", "b"], Script([0]), 0, [1, 1])
    np.testing.assert_array_equal(rows["next_avail"][0], [True, True])
    np.testing.assert_array_equal(rows["reward"], [-1.0, 3.0])
    q = learner.target(torch.from_numpy(rows["next_obs"][:1])).detach().numpy()[0]
    _update_against(learner, rows, [-1.0 + GAMMA * q.max(), 3.0])
    # seat b: its one transition holds the +0.5 of a's first move and the -2 of a's last (a terminal loss)
    rows = _transitions(ThreeMoves(), ["a", "b"], Script([1, 1]), 1, [0])
    np.testing.assert_array_equal(rows["obs"][0], [0, 1, 0, 0, 1])
    np.testing.assert_array_equal(rows["reward"], [-1.5])
    assert rows["terminated"].tolist() == [True]
    _update_against(learner, rows, [-1.5])


@pytest.mark.parametrize("seat,learner_moves,opponent_moves,rewards", [
    (0, [0, 1, 2], [3, 4], [0, 0, 1]),  # X completes the top row: a win
    (1, [3, 8], [0, 1, 2], [0, -1]),  # O loses to X's top row, the -1 arriving on X's move
    (0, [0, 8, 7, 2, 3], [4, 1, 6, 5], [0, 0, 0, 0, 0])])  # a draw, X's block at 3 the last move
def test_tictactoe_transitions_end_in_the_terminal_reward_and_bootstrap_from_the_learners_next_turn(
        seat, learner_moves, opponent_moves, rewards):
    from pettingzoo.classic import tictactoe_v3

    rows = _transitions(tictactoe_v3.env(), ["player_1", "player_2"], Script(opponent_moves), seat, learner_moves)
    np.testing.assert_array_equal(rows["reward"], rewards)
    assert rows["terminated"].tolist() == [False] * (len(rewards) - 1) + [True]
    for k in range(len(rewards) - 1):  # each next state is the learner's next turn: two more marks
        np.testing.assert_array_equal(rows["next_obs"][k], rows["obs"][k + 1])
        assert rows["next_obs"][k][:18].sum() == rows["obs"][k][:18].sum() + 2
        np.testing.assert_array_equal(rows["next_avail"][k], rows["avail"][k + 1])
    assert not any(rows["avail"][k][a] == 0 for k, a in enumerate(rows["action"]))
    learner = _learner(20, 9)
    q = learner.target(torch.from_numpy(rows["next_obs"][:-1])).detach().numpy()
    best = np.where(rows["next_avail"][:-1], q, -np.inf).max(1)  # over the learner's legal moves at its next turn
    # a terminal win, loss or draw: the target is its reward; a move before it bootstraps
    _update_against(learner, rows, np.append(np.asarray(rewards[:-1]) + GAMMA * best, rewards[-1]))


def test_acting_and_the_greedy_move_never_pick_an_illegal_move():
    rng = np.random.default_rng(0)
    q = rng.normal(size=(500, 9))
    avail = rng.random((500, 9)) < 0.4
    avail[:, 4] = True
    q[:, 0] = 100.0  # the best Q, often illegal
    for eps in (0.0, 1.0, 0.3):
        picked = epsilon_greedy(q, avail, eps, rng)
        assert avail[np.arange(500), picked].all()
    worker = TurnQWorker(build_config(_raw(steps=64)), 0)
    vec = TurnCopies(worker.envs[:1], worker.turn_agents, lambda: None)
    board = (1, 0, 2, 0, 0, 0, 0, 0, 0)  # cell 0 taken
    vec.obs[0], vec.mask[0] = ttt.observation_of(board).reshape(-1), [c == 0 for c in board]
    bias = [p for n, p in worker.net.named_parameters() if n.endswith("bias") and p.numel() == 9][-1]
    with torch.no_grad():
        bias.add_(torch.tensor([100.0] + [0.0] * 8))  # Q prefers the taken cell 0
    worker.flat.load(worker.flat.numpy())  # (the acting twin's weights are taken again)
    assert worker.q_values(worker.turn_rows(vec))[0].argmax() == 0
    assert worker.greedy(vec)[0] != 0 and vec.mask[0][worker.greedy(vec)[0]] == 1


# ----------------------------------------------------------------------------- runs
def _raw(steps: int = 600, opponents=("self_play", "random", "scenarios.tictactoe_minimax:minimax"), **turns) -> dict:
    return {"run": {"seed": 0, "total_env_steps": steps, "progress": False, "plots": False},
            "backend": {"name": "sim", "workers": 1},
            "scenario": {"name": "pettingzoo", "env": TTT,
                         "turns": {"opponents": list(opponents), "refresh": 2, "pool_size": 2, **turns}},
            "algorithm": {"name": "dqn", "envs_per_worker": 3, "chunk_steps": 8, "target_update_every": 100,
                          "epsilon_anneal_steps": 400,
                          "replay": {"learning_starts": 100, "batch_size": 16, "ratio": 0.25}},
            "critic": {"head": "mlp", "hidden": [16]}}


FILES = ("metrics.csv", "comm.csv", "train.csv", "eval.csv")


def test_a_tictactoe_dqn_run_reports_outcomes_samples_no_illegal_move_and_is_byte_identical(tmp_path):
    raw = _raw(eval_opponents=["random", "scenarios.tictactoe_minimax:minimax"])
    raw["run"].update(eval_every=300, eval_episodes=6)
    one = run_experiment(build_config(raw), tmp_path / "one")
    run_experiment(build_config(raw), tmp_path / "two")
    for f in FILES:
        a = (tmp_path / "one" / f).read_bytes()
        assert a == (tmp_path / "two" / f).read_bytes() and a.count(b"\n") > 2, f
    assert one["chunks_rejected"] == 0 and one["learning_updates"] > 0
    rows = list(csv.DictReader((tmp_path / "one" / "metrics.csv").open()))
    assert {r["opponent"] for r in rows} == {"self_play", "random", "minimax"}
    assert {r["seat"] for r in rows} == {"0", "1"}
    for r in rows:
        assert int(r["win"]) + int(r["draw"]) + int(r["loss"]) == 1 and r["illegal"] == "0"
        assert float(r["return"]) == int(r["win"]) - int(r["loss"])  # tic-tac-toe: +1 / 0 / -1
    evals = list(csv.DictReader((tmp_path / "one" / "eval.csv").open()))
    assert len(evals) == 2
    for e in evals:
        assert e["illegal"] == "0" and e["episodes"] == "12" and float(e["win_minimax"]) == 0.0
    # env steps are the learner's moves: an episode's length is its moves (first player 3 to 5, second 2 to 4)
    for seat, moves in (("0", {3, 4, 5}), ("1", {2, 3, 4})):
        assert {int(r["length"]) for r in rows if r["seat"] == seat} <= moves


def test_a_stopped_tictactoe_dqn_run_with_a_nonempty_buffer_resumes_exactly(tmp_path):
    raw = _raw()
    raw["run"].update(eval_every=300, eval_episodes=4)
    full = run_experiment(build_config(raw), tmp_path / "full")
    part = run_experiment(build_config({**raw, "run": {**raw["run"], "stop_after_updates": 20}}), tmp_path / "part")
    assert part["status"] == "stopped" and 0 < part["transitions_inserted"] < full["transitions_inserted"]
    resumed = resume_experiment(tmp_path / "part")
    assert resumed["status"] == "completed" and resumed["resumes"][0]["exact"] is True
    for f in FILES:
        assert (tmp_path / "part" / f).read_bytes() == (tmp_path / "full" / f).read_bytes(), f


def test_the_matches_of_agents_turn_based_play_the_greedy_q_policy_of_a_dqn_run(tmp_path, capsys):
    from agents.turn_based import main as matches_main
    from marl_q.rundir import load_trained

    run_experiment(build_config(_raw(steps=300)), tmp_path / "r")
    capsys.readouterr()
    assert matches_main([str(tmp_path / "r"), "--opponent", "random", "--games", "4"]) == 0
    out = json.loads(capsys.readouterr().out)
    for agent in ("player_1", "player_2"):
        assert out[agent]["games"] == 4 and out[agent]["illegal"] == 0
    assert matches_main([str(tmp_path / "r"), "--opponent", ttt.SPEC, "--exact"]) == 0
    out = json.loads(capsys.readouterr().out)
    # by hand: the masked argmax of the checkpoint's Q-network on the rows the worker makes
    trained = load_trained(tmp_path / "r")
    net = trained.policy.models["q"]
    for seat, agent in enumerate(("player_1", "player_2")):
        def policy(board, seat=seat):
            x = np.concatenate([ttt.observation_of(board).reshape(-1), np.eye(2)[seat]]).astype(np.float32)
            q = net(torch.from_numpy(x)[None]).detach().numpy()[0]
            return int(np.where([c == 0 for c in board], q, -np.inf).argmax())
        rates, lost = ttt.against_minimax(policy, seat == 0)
        assert {k: out[agent][k] for k in rates} == pytest.approx(rates) and out[agent]["win"] == 0.0
        assert out[agent]["lost"] == [[round(p, 6), " ".join(line)] for p, line in lost]
    # the checkpoint's acting policy appends the seat as the worker does
    logits = trained.policy.logits({"player_2": ttt.observation_of((1, 0, 0, 0, 0, 0, 0, 0, 0))})
    x = np.concatenate([ttt.observation_of((1, 0, 0, 0, 0, 0, 0, 0, 0)).reshape(-1), [0, 1]]).astype(np.float32)
    np.testing.assert_allclose(logits["player_2"], net(torch.from_numpy(x)[None]).detach().numpy()[0], rtol=1e-6)


# ----------------------------------------------------------------------------- bad input
def _cli(tmp_path: Path, capsys, text: str) -> str:
    cfg = tmp_path / "bad.yaml"
    cfg.write_text(textwrap.dedent(text))
    assert cli_main(["run", str(cfg), "--out", str(tmp_path / "run"), "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert not (tmp_path / "run").exists()
    return err


@pytest.mark.parametrize("extra,needle", [
    ("turns: {critic_opponent: true}", "scenario.turns.critic_opponent: for the actor-critics"),
    ("turns: {symmetries: dihedral}", "scenario.turns.symmetries: not supported by dqn")])
def test_turn_options_of_the_actor_critics_exit_2_with_one_line_for_dqn(extra, needle, tmp_path, capsys):
    err = _cli(tmp_path, capsys, f"""
        run: {{total_env_steps: 100}}
        scenario: {{name: pettingzoo, env: "{TTT}", {extra}}}
        algorithm: {{name: dqn}}
    """)
    assert needle in err, err


def test_envs_per_worker_on_a_game_that_is_not_turn_based_exits_2_with_one_line(tmp_path, capsys):
    err = _cli(tmp_path, capsys, """
        run: {total_env_steps: 100}
        scenario: {name: cartpole}
        algorithm: {name: dqn, envs_per_worker: 4}
    """)
    assert "algorithm.envs_per_worker: the copies of a turn-based game" in err, err


class BoxMoves(ThreeMoves):
    """The 3-move game with a continuous action space: no value-based learner can take its turns."""

    def action_space(self, agent):
        from gymnasium import spaces

        return spaces.Box(-1, 1, (2,), np.float32)


def box_moves() -> BoxMoves:
    return BoxMoves()


@pytest.mark.parametrize("algorithm,needle", [
    ("dqn", "is not supported in a turn-based game (Discrete)"),
    ("vdn", "is not supported in a turn-based game (Discrete)")])
def test_a_turn_based_game_without_discrete_moves_exits_2_with_one_line(algorithm, needle, tmp_path, capsys):
    err = _cli(tmp_path, capsys, f"""
        run: {{total_env_steps: 100}}
        scenario: {{name: pettingzoo, env: "tests.agents.test_q_turn_based:box_moves"}}
        algorithm: {{name: {algorithm}}}
    """)
    assert needle in err, err


@pytest.mark.parametrize("algorithm", ["iql", "vdn", "qmix"])
def test_the_multi_agent_q_learners_cannot_take_turns_and_say_dqn_can(algorithm, tmp_path, capsys):
    err = _cli(tmp_path, capsys, f"""
        run: {{total_env_steps: 100}}
        scenario: {{name: pettingzoo, env: "{TTT}"}}
        algorithm: {{name: {algorithm}}}
    """)
    assert f"algorithm {algorithm} cannot take turns" in err and "use ippo, ia2c or dqn" in err, err


def test_the_three_move_game_runs_with_dqn_against_a_scripted_opponent(tmp_path):
    raw = _raw(steps=60, opponents=[f"{HERE}:first_legal"])
    raw["scenario"] = {"name": "pettingzoo", "env": f"{HERE}:three_moves",
                       "turns": {"opponents": [f"{HERE}:first_legal"]}}
    raw["algorithm"]["replay"]["learning_starts"] = 20
    summary = run_experiment(build_config(raw), tmp_path / "r")
    assert summary["status"] == "completed" and summary["chunks_rejected"] == 0
    rows = list(csv.DictReader((tmp_path / "r" / "metrics.csv").open()))
    # seat a (0) moves twice, seat b (1) once; a always wins (its total 2 + x - 1 against b's -1.5)
    assert {(r["seat"], r["length"], r["win"]) for r in rows} == {("0", "2", "1"), ("1", "1", "0")}
    for r in rows:
        assert float(r["return"]) in ((1.0, 2.0) if r["seat"] == "0" else (-1.5,))
