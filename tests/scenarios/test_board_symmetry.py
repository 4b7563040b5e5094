"""Board symmetries (scenarios/board_symmetry.py, ``scenario.turns.symmetries``): the maps by hand,
against games played in PettingZoo's envs (a game and its mapped moves give mapped boards and masks),
against minimax's values (a symmetry keeps every move's game value), the rollout batch augmented with
them, config errors, and byte-identical sim reruns with exact resume."""
from __future__ import annotations

import itertools

import numpy as np
import pytest
from pettingzoo.classic import connect_four_v3, tictactoe_v3

from marl_q.cli import main as cli_main
from marl_q.config import build_config
from marl_q.errors import ConfigError
from marl_q.experiment import resume_experiment, run_experiment
from scenarios import tictactoe_minimax as ttt
from scenarios.board_symmetry import augment, map_rows, symmetries
from tests.scenarios.test_aec import TTT, _raw, _write

C4 = "pettingzoo.classic.connect_four_v3:env"


def test_the_dihedral_maps_of_a_3x3_board_by_hand():
    group = symmetries("dihedral", (3, 3, 2), 9)
    assert len(group) == 8
    assert group[0].cells.tolist() == list(range(9)) and group[0].actions.tolist() == list(range(9))
    # the quarter turn counter-clockwise (np.rot90 once): the top-right corner goes to the top-left,
    # the top-left to the bottom-left; the centre stays. Cells 0..8 row by row.
    quarter = group[1]
    assert quarter.cells.tolist() == [2, 5, 8, 1, 4, 7, 0, 3, 6]
    assert quarter.actions.tolist() == [6, 3, 0, 7, 4, 1, 8, 5, 2]  # move 0 (top-left) lands on 6 (bottom-left)
    # the left-right reflection (the identity flipped): columns swap, rows stay
    mirror = group[4]
    assert mirror.cells.tolist() == [2, 1, 0, 5, 4, 3, 8, 7, 6] and mirror.actions.tolist() == [2, 1, 0, 5, 4, 3, 8, 7, 6]
    # 8 distinct permutations, each an inverse pair, closed under composition (a group)
    perms = {tuple(g.cells) for g in group}
    assert len(perms) == 8
    for g in group:
        assert np.array_equal(g.actions[g.cells], np.arange(9)) and np.array_equal(g.action_source, g.cells)
    for g, h in itertools.product(group, group):
        assert tuple(g.cells[h.cells]) in perms
    # every symmetry maps tic-tac-toe's winning lines onto winning lines
    lines = {frozenset(line) for line in ttt.LINES}
    for g in group:
        assert {frozenset(int(g.actions[c]) for c in line) for line in lines} == lines


def _env_board(env, agent):
    obs = env.observe(agent)
    return np.asarray(obs["observation"]), np.asarray(obs["action_mask"])


@pytest.mark.parametrize("kind, make, n", [("dihedral", tictactoe_v3.env, 9), ("mirror", connect_four_v3.env, 7)])
def test_a_game_and_its_mapped_moves_give_the_mapped_boards_and_masks_in_the_env(kind, make, n):
    """Independent reference: the env itself. Moves a_1..a_k played in one env and g(a_1)..g(a_k) in
    another give, at every turn, the second's observation and mask equal to the first's mapped by g."""
    rng = np.random.default_rng(0)
    one, two = make(), make()
    shape = one.observation_space(one.possible_agents[0])["observation"].shape
    group = symmetries(kind, shape, n)
    assert len(group) == (8 if kind == "dihedral" else 2)
    checked = 0
    for game in range(20):
        g = group[game % len(group)]
        one.reset(seed=game)
        two.reset(seed=game)
        while one.agents and not any(one.terminations.values()):
            agent = one.agent_selection
            obs, mask = _env_board(one, agent)
            mobs, mmask = _env_board(two, agent)
            mapped = map_rows(obs.astype(np.float32).reshape(1, -1), g, shape)[0]
            assert np.array_equal(mapped, mobs.astype(np.float32).reshape(-1)), (kind, game)
            assert np.array_equal(mask[g.action_source], mmask), (kind, game)
            a = int(rng.choice(np.flatnonzero(mask)))
            one.step(a)
            two.step(int(g.actions[a]))
            checked += 1
        assert one.rewards == two.rewards  # the same outcome
    assert checked > 100


def test_a_symmetry_keeps_every_moves_minimax_value():
    """Independent reference: minimax's game values. On every reachable board with 2 or more marks,
    the value of move a equals the value of g(a) on the mapped board."""
    group = symmetries("dihedral", (3, 3, 2), 9)
    boards = {(0,) * 9}
    frontier = set(boards)
    for depth in range(4):  # boards after 1..4 moves, from the mover's side
        nxt = set()
        for b in frontier:
            if ttt.winner(b) is None:
                for a in range(9):
                    if b[a] == 0:
                        played = list(b)
                        played[a] = 1
                        nxt.add(tuple({0: 0, 1: 2, 2: 1}[c] for c in played))  # the other side to move
        frontier = nxt
        boards |= nxt
    checked = 0
    for b in boards:
        if ttt.winner(b) is not None or sum(c != 0 for c in b) < 2:
            continue
        values = ttt.values(b)
        for g in group[1:]:
            mapped = tuple(b[int(g.cells[k])] for k in range(9))
            mvalues = ttt.values(mapped)
            assert {int(g.actions[a]): v for a, v in values.items()} == mvalues
            checked += 1
    assert checked > 1000


def test_augment_repeats_each_column_once_per_symmetry_with_boards_masks_and_moves_mapped():
    from agents.mappo import TurnWorker

    cfg = build_config(_raw(TTT, opponents=["random"], critic_opponent=True, symmetries="dihedral"))
    worker = TurnWorker(cfg, 0)
    batch, episodes, steps = worker.rollout()
    T, E = cfg.algorithm.params.n_steps, cfg.algorithm.params.envs_per_worker
    assert batch["actions"].shape == (T, 8 * E) and batch["obs"].shape[:2] == (T + 1, 8 * E)
    assert batch["avail"].shape == (T, 8 * E, 9) and batch["critic_obs"].shape[:2] == (T + 1, 8 * E)
    assert steps == batch["valid"][:, :E].sum()  # env steps count the moves played, not their images
    group = symmetries("dihedral", (3, 3, 2), 9)
    for k, g in enumerate(group):
        cols = slice(k * E, (k + 1) * E)
        for key in ("rewards", "terminated", "dones", "valid"):
            assert np.array_equal(batch[key][:, cols], batch[key][:, :E]), key
        # the seat id (the last two actor columns) and the critic's opponent one-hot are not board: unchanged
        assert np.array_equal(batch["obs"][:, cols, 18:], batch["obs"][:, :E, 18:])
        assert np.array_equal(batch["critic_obs"][:, cols, 18:], batch["critic_obs"][:, :E, 18:])
        for t, e in zip(*np.nonzero(batch["valid"][:, :E])):
            board = batch["obs"][t, e, :18].reshape(9, 2)
            mapped = batch["obs"][t, k * E + e, :18].reshape(9, 2)
            a, b = batch["actions"][t, e], batch["actions"][t, k * E + e]
            # the move's cell holds the same content on both boards, and a legal move stays legal
            assert b == g.actions[a] and batch["avail"][t, k * E + e, b] == batch["avail"][t, e, a] == 1
            for cell in range(9):  # by the definition: mapped cell g(c) holds original cell c
                assert np.array_equal(mapped[g.actions[cell]], board[cell])
                assert batch["avail"][t, k * E + e, g.actions[cell]] == batch["avail"][t, e, cell]
    # none: the batch as it was
    plain = TurnWorker(build_config(_raw(TTT, opponents=["random"])), 0).rollout()[0]
    assert plain["actions"].shape == (T, E)
    assert augment(plain, [], (3, 3, 2)) is plain


@pytest.mark.parametrize("env, kind, match", [
    (TTT, "mirror", r"turns.symmetries: mirror needs one move per column .* got observations \(3, 3, 2\) and 9 actions"),
    (C4, "dihedral", r"turns.symmetries: dihedral needs a square board .* got observations \(6, 7, 2\) and 7 actions"),
    (TTT, "rotations", r"turns.symmetries: one of none, dihedral, mirror, got 'rotations'"),
])
def test_a_symmetry_the_board_does_not_have_is_a_config_error(env, kind, match):
    with pytest.raises(ConfigError, match=match):
        build_config(_raw(env, opponents=["random"], symmetries=kind))


def test_a_bad_symmetry_exits_2_with_one_line_and_writes_nothing(tmp_path, capsys):
    cfg = _write(tmp_path, f'{{name: pettingzoo, env: "{C4}", turns: {{symmetries: dihedral}}}}', "ippo")
    assert cli_main(["run", str(cfg), "--out", str(tmp_path / "run"), "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "turns.symmetries: dihedral needs a square board" in err, err
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("env, kind", [(TTT, "dihedral"), (C4, "mirror")])
def test_a_run_with_symmetries_on_sim_is_byte_identical_and_resumes_exactly(env, kind, tmp_path):
    raw = _raw(env, steps=160, opponents=["self_play", "random"], refresh=2, pool_size=2, symmetries=kind)
    files = ("metrics.csv", "train.csv")
    run_experiment(build_config(raw), tmp_path / "one")
    run_experiment(build_config(raw), tmp_path / "two")
    for f in files:
        one = (tmp_path / "one" / f).read_bytes()
        assert one == (tmp_path / "two" / f).read_bytes() and one.count(b"\n") > 2, f
    part = run_experiment(build_config({**raw, "run": {**raw["run"], "stop_after_updates": 4}}), tmp_path / "part")
    assert part["status"] == "stopped"
    resumed = resume_experiment(tmp_path / "part")
    assert resumed["status"] == "completed" and resumed["resumes"][0]["exact"] is True
    for f in files:
        assert (tmp_path / "part" / f).read_bytes() == (tmp_path / "one" / f).read_bytes(), f
