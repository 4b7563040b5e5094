"""Recurrent (GRU) Q-networks for dqn, iql, vdn and qmix: sequence replay with burn-in (agents/q_learning.py).

- R2D2's windows of an episode (``sequence_windows``) against a brute-force statement of the rule, and the
  worker's ``SequenceAssembler`` across chunk boundaries against cutting each whole episode;
- the burn-in TD loss and its gradients against a hand loop over steps (``RecurrentHead.step``: the first
  burn_in steps under no_grad, the loss on the later ones, Double DQN with the action masks);
- padding (and the burn-in steps' actions and rewards) never enters the loss;
- the acting state is zeroed exactly at episode starts and a sequence's stored state is the one the
  acting reached;
- a short seeded QMIX/VDN run with a GRU beats chance on the recall cue task, a feed-forward one doesn't;
- a recurrent dqn: its single-agent vector as a team of one (SoloTeam), each copy cut into sequences on its
  valid steps, its acting state zeroed at each copy's episode starts;
- bad keys exit 2 with one line.
Byte-identical reruns, exact resume and greedy evaluation of the recurrent learners are in
tests/agents/test_q_learning.py, beside the feed-forward ones."""
from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest
import torch

from agents.heads import MLPConfig, build_mlp
from agents.q_learning import (QConfig, QDims, QLearner, QWorker, ReplayConfig, SequenceAssembler, collect_chunk,
                               sequence_buffer)
from agents.replay import sequence_windows
from marl_q.cli import main
from marl_q.config import load_config
from marl_q.experiment import run_experiment

SCEN = Path(__file__).resolve().parents[2] / "scenarios"
QUIET = ["run.progress=false", "run.plots=false"]


# ----------------------------------------------------------------------------- windows
@pytest.mark.parametrize("length,sequence,overlap,expected", [
    (25, 10, 3, [(0, 10), (7, 17), (14, 24), (21, 25)]),
    (25, 25, 0, [(0, 25)]),  # whole-episode replay
    (3, 25, 12, [(0, 3)]),
    (20, 10, 0, [(0, 10), (10, 20)]),
    (20, 10, 5, [(0, 10), (5, 15), (10, 20)]),
])
def test_sequence_windows_by_hand(length, sequence, overlap, expected):
    assert sequence_windows(length, sequence, overlap) == expected


def test_sequence_windows_are_the_r2d2_rule_by_brute_force():
    """Starts at multiples of the stride, each window the longest that fits, every step covered, adjacent
    windows sharing ``overlap`` steps, and no window inside the one before it."""
    for length in range(1, 30):
        for sequence in range(1, 12):
            for overlap in range(sequence):
                w = sequence_windows(length, sequence, overlap)
                stride = sequence - overlap
                assert [a for a, _ in w] == [k * stride for k in range(len(w))]
                assert all(b == min(a + sequence, length) for a, b in w)
                assert set().union(*(range(a, b) for a, b in w)) == set(range(length))
                assert w[-1][1] == length and all(b < length for _, b in w[:-1])
                assert all(b0 - a1 == overlap for (_, b0), (a1, _) in zip(w, w[1:]))


def _stream(rng, lengths, n=2, d=3, A=4, H=5, state_dim=6):
    """Fake ``collect_chunk`` arrays (T, 1, ...) of consecutive episodes of ``lengths`` steps."""
    T = sum(lengths)
    ends = np.cumsum(lengths) - 1
    term = np.zeros((T, 1), bool)
    trunc = np.zeros((T, 1), bool)
    for i, e in enumerate(ends):
        (term if i % 2 else trunc)[e, 0] = True
    f32 = lambda *s: rng.normal(size=(T, 1, *s)).astype(np.float32)  # noqa: E731
    return {"obs": f32(n, d), "next_obs": f32(n, d), "avail": rng.random((T, 1, n, A)) < 0.8,
            "next_avail": rng.random((T, 1, n, A)) < 0.8, "state": f32(state_dim), "next_state": f32(state_dim),
            "action": rng.integers(0, A, (T, 1, n)), "reward": f32(), "terminated": term, "truncated": trunc,
            "valid": np.ones((T, 1), bool), "h0": f32(n, H)}


def test_the_assembler_sends_each_episodes_windows_once_across_chunks():
    rng = np.random.default_rng(0)
    lengths = [7, 3, 12, 1, 9]
    sequence, overlap = 5, 2
    whole = _stream(rng, lengths)
    dims = QDims(obs_dim=3, n_actions=4, n_agents=2, state_dim=6, agents=("a", "b"))
    layout = sequence_buffer(dims, ReplayConfig(sequence=sequence), hidden=5)
    asm = SequenceAssembler(layout, overlap)
    got = []
    for a, b in ((0, 4), (4, 5), (5, 17), (17, 18), (18, 25), (25, 32)):
        rows = asm.rows({k: v[a:b] for k, v in whole.items()})
        got += [{k: v[i] for k, v in rows.items()} for i in range(len(rows["mask"]))]
    # the reference: each whole episode cut by sequence_windows, its last observation the bootstrap one
    ref, start = [], 0
    for length in lengths:
        for a, b in sequence_windows(length, sequence, overlap):
            a, b = start + a, start + b
            k = b - a
            row = {"mask": np.arange(sequence + 1) <= k, "h0": whole["h0"][a, 0]}
            for key in ("obs", "avail", "state"):
                row[key] = np.concatenate([whole[key][a:b, 0], whole["next_" + key][b - 1:b, 0]])
            for key in ("action", "reward", "terminated"):
                row[key] = whole[key][a:b, 0]
            ref.append(row)
        start += length
    assert len(got) == len(ref) == sum(len(sequence_windows(n, sequence, overlap)) for n in lengths)
    for g, r in zip(got, ref):
        k = int(r["mask"].sum())
        np.testing.assert_array_equal(g["mask"], r["mask"])
        np.testing.assert_array_equal(g["h0"], r["h0"])
        for key in ("obs", "avail", "state"):
            np.testing.assert_array_equal(g[key][:k], r[key])
            assert not g[key][k:].any()  # padding is zeros
        for key in ("action", "reward", "terminated"):
            np.testing.assert_array_equal(g[key][:k - 1], r[key])
            assert not g[key][k - 1:].any()


# ----------------------------------------------------------------------------- the burn-in loss
def _learner(kind, burn_in, loss="huber", double=True, seed=0, standardise=False):
    torch.manual_seed(seed)
    dims = QDims(obs_dim=3, n_actions=4, n_agents=2, state_dim=5 if kind == "qmix" else None, agents=("a", "b"))
    hp = QConfig(lr=1e-2, grad_clip=None, double=double, loss=loss, mixer_embed_dim=4, hypernet_embed=8,
                 gamma=0.9, replay=ReplayConfig(sequence=6, burn_in=burn_in), standardise_rewards=standardise)
    net = build_mlp(MLPConfig(hidden=[7], recurrent="gru", out_gain=1.0), dims.in_dim, dims.n_actions)
    learner = QLearner(hp, kind, net, dims)
    with torch.no_grad():  # biases off zero and a target different from the online network
        for p in learner.online.parameters():
            p.add_(0.1 * torch.randn_like(p))
        for p in learner.target.parameters():
            p.add_(0.2 * torch.randn_like(p))
    return learner


def _batch(learner, rng, B=5, lengths=(7, 4, 7, 2, 5)):
    """Rows of ``sequence_buffer``: ``lengths`` observations each (a sequence of length - 1 steps), padded
    with garbage that the loss must ignore (the buffer zeroes it; the learner must not rely on that)."""
    dims, L1 = learner.dims, learner.hp.replay.sequence + 1
    n, A = dims.n_agents, dims.n_actions
    mask = np.arange(L1) < np.asarray(lengths)[:, None]
    batch = {"obs": rng.normal(size=(B, L1, n, dims.obs_dim)).astype(np.float32),
             "action": rng.integers(0, A, (B, L1, n)), "reward": rng.normal(size=(B, L1)).astype(np.float32),
             "terminated": np.zeros((B, L1), bool), "avail": rng.random((B, L1, n, A)) < 0.6,
             "mask": mask, "h0": rng.normal(size=(B, n, 7)).astype(np.float32)}
    batch["avail"][..., 2] = True
    batch["terminated"][0, 5] = True  # a row that ends at its last step with a termination
    batch["avail"][0, 6] = False  # ... whose final observation has no legal action
    if dims.state_dim:
        batch["state"] = rng.normal(size=(B, L1, dims.state_dim)).astype(np.float32)
    return batch


def _hand_loss(learner, batch):
    """The loss by a loop over rows, agents and steps: RecurrentHead.step from h0, the first burn_in steps
    under no_grad, then the TD error of each real step t >= burn_in against the target at t + 1."""
    hp, dims, b = learner.hp, learner.dims, learner.hp.replay.burn_in
    n = dims.n_agents
    B, L1 = batch["mask"].shape
    eye = torch.eye(n)
    terms = []
    for i in range(B):
        q_on, q_tg = [], []
        for net, out in ((learner.online, q_on), (learner.target, q_tg)):
            h = torch.from_numpy(batch["h0"][i])
            for t in range(L1):
                x = torch.cat([torch.from_numpy(batch["obs"][i, t]), eye], -1)
                if t < b or net is learner.target:
                    with torch.no_grad():
                        q, h = net.step(x, h)
                else:
                    q, h = net.step(x, h)
                out.append(q)
        for t in range(b, L1 - 1):
            if not batch["mask"][i, t + 1]:
                continue
            term = bool(batch["terminated"][i, t])
            chosen = torch.stack([q_on[t][j, batch["action"][i, t, j]] for j in range(n)])
            v = []
            for j in range(n):
                legal = [a for a in range(dims.n_actions) if term or batch["avail"][i, t + 1, j, a]]
                pick = q_on[t + 1] if hp.double else q_tg[t + 1]
                best = max(legal, key=lambda a: (float(pick[j, a].detach()), -a))
                v.append(q_tg[t + 1][j, best].detach())
            v = torch.stack(v)
            r = float(batch["reward"][i, t])
            if learner.kind == "iql":
                preds, targets = list(chosen), [r + hp.gamma * (1 - term) * vj for vj in v]
            elif learner.kind == "vdn":
                preds, targets = [chosen.sum()], [r + hp.gamma * (1 - term) * v.sum()]
            else:
                s, s1 = (torch.from_numpy(batch["state"][i, k][None]) for k in (t, t + 1))
                with torch.no_grad():
                    vt = learner.target_mixer(v[None], s1)[0]
                preds, targets = [learner.mixer(chosen[None], s)[0]], [r + hp.gamma * (1 - term) * vt]
            for p, y in zip(preds, targets):
                d = (y - p).abs()
                terms.append(0.5 * d ** 2 if d <= 1 else d - 0.5)
    return torch.stack(terms).mean()


@pytest.mark.parametrize("kind,burn_in,double", [("iql", 2, True), ("vdn", 0, True), ("vdn", 3, False),
                                                 ("qmix", 2, True), ("qmix", 0, False)])
def test_the_burn_in_loss_and_its_gradients_equal_a_hand_loop_over_steps(kind, burn_in, double):
    learner = _learner(kind, burn_in, double=double)
    batch = _batch(learner, np.random.default_rng(1))
    params = learner.params
    loss, _, mask = learner.sequence_loss(batch)
    grads = torch.autograd.grad(loss, params)
    ref = _hand_loss(learner, batch)
    ref_grads = torch.autograd.grad(ref, params)
    assert loss.item() == pytest.approx(ref.item(), rel=1e-5)
    for g, r in zip(grads, ref_grads):
        torch.testing.assert_close(g, r, rtol=1e-4, atol=1e-6)
    # the loss counts the real steps after the burn-in: k - 1 - burn_in of a row of k observations
    per_row = mask.reshape(len(mask), -1).sum(1) / (2 if kind == "iql" else 1)
    want = np.maximum(batch["mask"].sum(1) - 1 - burn_in, 0)
    np.testing.assert_array_equal(per_row.numpy(), want)
    # and update() takes the step
    before = [p.detach().clone() for p in params]
    learner.update(batch)
    assert any(not torch.equal(a, p) for a, p in zip(before, params))


@pytest.mark.parametrize("kind", ["iql", "qmix"])
def test_padding_and_the_burn_in_steps_actions_and_rewards_never_enter_the_loss(kind):
    learner = _learner(kind, burn_in=2)
    rng = np.random.default_rng(2)
    batch = _batch(learner, rng)
    loss, _, _ = learner.sequence_loss(batch)
    grads = torch.autograd.grad(loss, learner.params)
    noisy = {k: v.copy() for k, v in batch.items()}
    pad = ~batch["mask"]
    for key in ("obs", "action", "reward", "terminated", "avail", "state"):
        if key in noisy:
            junk = _batch(learner, rng)[key]
            noisy[key][pad] = junk[pad]
            if key in ("action", "reward", "terminated"):  # a step's own fields: the last real observation's too
                last = batch["mask"].sum(1) - 1
                noisy[key][np.arange(len(last)), last] = junk[np.arange(len(last)), last]
                noisy[key][:, :2] = junk[:, :2]  # the burn-in steps: they only warm the state
    noisy["avail"][pad] = False  # even an empty mask on the padding
    loss2, _, _ = learner.sequence_loss(noisy)
    grads2 = torch.autograd.grad(loss2, learner.params)
    assert loss2.item() == loss.item()
    for g, g2 in zip(grads, grads2):
        torch.testing.assert_close(g, g2, rtol=0, atol=0)
    # but an observation of the burn-in does change it (through the state it warms)
    noisy["obs"][:, 0] += 1.0
    assert learner.sequence_loss(noisy)[0].item() != loss.item()


# ----------------------------------------------------------------------------- acting
RECALL = QUIET + ["backend.workers=1", "run.total_env_steps=3000", "algorithm.chunk_steps=30",
                  "algorithm.epsilon_anneal_steps=1000", "algorithm.target_update_every=200", "algorithm.lr=3e-3",
                  "algorithm.replay.capacity=500", "algorithm.replay.batch_size=16", "algorithm.replay.ratio=0.1",
                  "algorithm.replay.learning_starts=300", "critic.hidden=[32]"]


def _recall_cfg(tmp_path, overrides):
    cfg = tmp_path / "recall.yaml"
    cfg.write_text("run: {total_env_steps: 3000}\nscenario: {name: recall_cue, n_agents: 2, n_cues: 2, delay: 1}\n"
                   "algorithm: {name: qmix}\nserver: {aggregation: hogwild}\n"
                   "critic: {head: mlp, hidden: [32], recurrent: gru}\n")
    return load_config(cfg, overrides)


def test_the_acting_state_is_zeroed_exactly_at_episode_starts_and_stored_with_each_sequence(tmp_path):
    """recall_cue shows the cue only at an episode's first observation: the state each step was acted from
    is zero exactly there; a mid-episode sequence's stored state is the one stepping the network over the
    episode's earlier observations reaches; the state is carried across chunks."""
    cfg = _recall_cfg(tmp_path, QUIET + ["scenario.delay=3", "algorithm.replay.sequence=3",
                                         "algorithm.replay.burn_in=1", "algorithm.chunk_steps=7"])
    worker = QWorker(cfg, 0)
    n = worker.dims.n_agents
    with torch.no_grad():  # a network whose state is far from zero after one step
        for p in worker.net.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=torch.Generator().manual_seed(3)))
    seen_rows = []
    for _ in range(4):
        carried = worker.memory.h.clone()
        chunk, _, _ = collect_chunk(worker, worker.hp.chunk_steps)
        if seen_rows and not (seen_rows[-1]["terminated"] | seen_rows[-1]["truncated"])[-1, 0]:
            np.testing.assert_array_equal(chunk["h0"][0, 0], carried.numpy().reshape(n, -1))
        cue = chunk["obs"][:, 0, :, :2].sum(-1) == 1  # (T, n): the cue's one-hot
        zero = ~chunk["h0"][:, 0].any(-1)
        np.testing.assert_array_equal(zero, cue)
        seen_rows.append(chunk)
        rows = worker.assembler.rows(chunk)
        for i in range(len(rows["mask"])):
            starts_episode = rows["obs"][i, 0, :, :2].sum(-1) == 1
            assert (~rows["h0"][i].any(-1) == starts_episode).all()
    # a sequence from step 2 of a 5-step episode (stride 2): its state is two GRU steps from zero
    whole = {k: np.concatenate([c[k] for c in seen_rows]) for k in seen_rows[0]}
    starts = np.flatnonzero(whole["obs"][:, 0, 0, :2].sum(-1) == 1)
    s = starts[0]
    x = torch.from_numpy(np.concatenate([whole["obs"][:, 0], np.broadcast_to(np.eye(n), (len(whole["obs"]), n, n))],
                                        -1).astype(np.float32))
    with torch.no_grad():
        h = worker.net.initial_state(n)
        for t in (s, s + 1):
            _, h = worker.net.step(x[t], h)
    np.testing.assert_allclose(whole["h0"][s + 2, 0], h.numpy(), rtol=1e-6, atol=1e-7)
    worker.close()


def _final(run: Path, last: int = 200) -> tuple[float, float]:
    returns = [float(r["return"]) for r in csv.DictReader(open(run / "metrics.csv"))]
    assert len(returns) >= 900
    return float(np.mean(returns[:100])), float(np.mean(returns[-last:]))


@pytest.mark.parametrize("name", ["qmix", "vdn"])
def test_a_short_gru_run_recalls_the_cue_and_a_feed_forward_one_stays_at_chance(name, tmp_path):
    """2 agents, 2 cues, one blank step (3-step episodes, each one sequence: whole-episode replay): the
    last 200 episodes' mean team return with a GRU is far above 1/2, which no function of the current
    observation beats in expectation (tests/scenarios/test_recall_cue.py); the feed-forward Q-network's
    stays near it. Epsilon ends at 0.05, so a perfect memory scores 0.975 in expectation."""
    gru = _recall_cfg(tmp_path, [f"algorithm.name={name}", *RECALL, "algorithm.replay.sequence=3"])
    ff = _recall_cfg(tmp_path, [f"algorithm.name={name}", *RECALL, "critic.recurrent=null"])
    run_experiment(gru, tmp_path / "gru")
    run_experiment(ff, tmp_path / "ff")
    first_gru, last_gru = _final(tmp_path / "gru")
    first_ff, last_ff = _final(tmp_path / "ff")
    assert first_gru < 0.6 and first_ff < 0.6
    assert last_gru > 0.9
    assert last_ff < 0.6  # chance is 0.5; 200 episodes of 2 agents: the sd of the mean is about 0.025


# ----------------------------------------------------------------------------- bad input
@pytest.mark.parametrize("overrides,needle", [
    (["algorithm.replay.sequence=3", "algorithm.replay.burn_in=3"],
     "algorithm.replay.burn_in=3 must lie in [0, replay.sequence=3)"),
    (["algorithm.replay.sequence=4", "algorithm.replay.overlap=4"],
     "algorithm.replay.overlap must be an integer in [0, replay.sequence=4), got 4"),
    ([], "algorithm.replay.sequence: a recurrent Q-network (critic.recurrent: gru) replays sequences"),
    (["algorithm.replay.sequence=3", "algorithm.replay.prioritized=true"],
     "algorithm.replay.prioritized: not supported with a recurrent Q-network"),
    (["algorithm.replay.sequence=3", "algorithm.replay.n_step=3"],
     "algorithm.replay.n_step: a recurrent Q-network bootstraps one step on within its sequence"),
    (["algorithm.replay.sequence=3", "algorithm.dueling=true"],
     "algorithm.dueling: not supported with a recurrent Q-network"),
    (["critic.recurrent=null", "algorithm.replay.sequence=3"],
     "algorithm.replay.sequence: sequence replay is for a recurrent Q-network"),
    (["critic.recurrent=null", "algorithm.replay.burn_in=2"], "algorithm.replay.burn_in: needs replay.sequence"),
    (["algorithm.replay.sequence=3", "critic={head: vqc, recurrent: gru}"],
     "critic.recurrent: head 'vqc' cannot carry a hidden state"),
    (["algorithm.replay.sequence=3", "actor={head: mlp, hidden: [8], recurrent: gru}"],
     "actor.recurrent: algorithm 'qmix' has no actor to make recurrent (only critic.recurrent)"),
])
def test_bad_recurrent_keys_exit_2_with_one_line(overrides, needle, tmp_path, capsys):
    cfg = tmp_path / "recall.yaml"
    cfg.write_text("run: {total_env_steps: 3000}\nscenario: {name: recall_cue, n_agents: 2, n_cues: 2, delay: 1}\n"
                   "algorithm: {name: qmix}\nserver: {aggregation: hogwild}\n"
                   "critic: {head: mlp, hidden: [32], recurrent: gru}\n")
    args = ["run", str(cfg), "--out", str(tmp_path / "x")]
    for o in overrides:
        args += ["--set", o]
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert needle in err and len(err.splitlines()) == 1, err
    assert not (tmp_path / "x").exists()


def test_a_recurrent_dqn_on_a_turn_based_game_is_refused_with_one_line(tmp_path, capsys):
    args = ["run", str(SCEN / "tictactoe_dqn.yaml"), "--out", str(tmp_path / "x"), "--set", "critic.recurrent=gru",
            "--set", "algorithm.replay.sequence=8", "--set", "algorithm.replay.prioritized=false",
            "--set", "algorithm.replay.n_step=1", "--set", "algorithm.dueling=false"]
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert "critic.recurrent: dqn on a turn-based game has no recurrent Q-network" in err, err
    assert len(err.splitlines()) == 1 and not (tmp_path / "x").exists()


# ----------------------------------------------------------------------------- a recurrent dqn (SoloTeam)
def test_the_assembler_cuts_each_copy_on_its_valid_steps_as_if_it_ran_alone():
    """Three copies whose episodes end at different steps, each followed by one step that only restarts the
    copy (not valid, as a Gymnasium vector's next-step autoreset gives): the windows of each copy are
    those of its valid steps' episodes cut by sequence_windows, copy by copy, across chunk boundaries."""
    rng = np.random.default_rng(1)
    sequence, overlap = 4, 1
    lengths = {0: [6, 2, 9], 1: [3, 3, 3, 3, 4], 2: [17]}
    T = max(sum(n + 1 for n in ls) for ls in lengths.values())  # each episode, then its restart step
    whole = _stream(rng, [T], n=1)
    for k in ("valid", "terminated", "truncated"):
        whole[k] = np.zeros((T, 3), bool)
    for k in whole:  # three copies of the stream, each copy's floats offset by its index (to tell rows apart)
        if whole[k].shape[1] == 1 and k not in ("valid", "terminated", "truncated"):
            offset = np.arange(3).reshape(1, 3, *[1] * (whole[k].ndim - 2))
            whole[k] = np.repeat(whole[k], 3, axis=1) + (offset.astype(whole[k].dtype) if whole[k].dtype != bool else 0)
    steps_of: dict[int, list[list[int]]] = {}  # per copy: each episode's (chunk-wide) steps
    for e, ls in lengths.items():
        t, eps = 0, []
        for i, n in enumerate(ls):
            eps.append(list(range(t, t + n)))
            whole["valid"][t:t + n, e] = True
            (whole["terminated"] if i % 2 else whole["truncated"])[t + n - 1, e] = True
            t += n + 1  # the restart step: not valid
        steps_of[e] = eps
    dims = QDims(obs_dim=3, n_actions=4, n_agents=1, state_dim=6, agents=("agent",), agent_id=False, solo=True)
    asm = SequenceAssembler(sequence_buffer(dims, ReplayConfig(sequence=sequence), hidden=5), overlap)
    got: dict[int, list[dict]] = {0: [], 1: [], 2: []}
    for a, b in ((0, 5), (5, 6), (6, 13), (13, T)):
        rows = asm.rows({k: v[a:b] for k, v in whole.items()})
        for i in range(len(rows["mask"])):
            got_row = {k: v[i] for k, v in rows.items()}
            # which copy: the row's first observation is one of that copy's (each copy's obs are offset by e)
            copy = next(e for e in range(3) if (whole["obs"][:, e] == got_row["obs"][0]).all(axis=(1, 2)).any())
            got[copy].append(got_row)
    for e in range(3):
        ref = []
        for ep in steps_of[e]:
            for a, b in sequence_windows(len(ep), sequence, overlap):
                idx = ep[a:b]
                row = {"mask": np.arange(sequence + 1) <= len(idx), "h0": whole["h0"][idx[0], e]}
                for key in ("obs", "avail", "state"):
                    row[key] = np.concatenate([whole[key][idx, e], whole["next_" + key][idx[-1]:idx[-1] + 1, e]])
                for key in ("action", "reward", "terminated"):
                    row[key] = whole[key][idx, e]
                ref.append(row)
        assert len(got[e]) == len(ref) == sum(len(sequence_windows(len(ep), sequence, overlap)) for ep in steps_of[e])
        for g, r in zip(got[e], ref):
            k = int(r["mask"].sum())
            np.testing.assert_array_equal(g["mask"], r["mask"])
            np.testing.assert_array_equal(g["h0"], r["h0"])
            for key in ("obs", "avail", "state"):
                np.testing.assert_array_equal(g[key][:k], r[key])
            for key in ("action", "reward", "terminated"):
                np.testing.assert_array_equal(g[key][:k - 1], r[key])


def test_a_solo_team_steps_as_its_gymnasium_vector_does():
    """A recurrent dqn's SoloTeam and a plain GymVector of the same CartPole copies, given the same actions:
    the same observations, rewards, ends and valid steps, with the agent axis of one."""
    from agents.q_learning import SoloTeam, make_q_env
    from agents.rollout import GymVector

    cfg = load_config(SCEN / "cartpole_dqn.yaml", QUIET + ["scenario.num_envs=3"])
    plain, solo = GymVector(make_q_env(cfg, 5), 11), SoloTeam(GymVector(make_q_env(cfg, 5), 11), 2)
    rng = np.random.default_rng(0)
    ended = 0
    for _ in range(300):
        obs, avail, state = solo.observe()
        np.testing.assert_array_equal(obs[:, 0], plain.observe())
        assert avail.shape == (3, 1, 2) and avail.all() and state is None
        action = rng.integers(0, 2, 3)
        a, b = plain.step(action), solo.step(action[:, None])
        rew, term, done = a.data
        np.testing.assert_array_equal(a.valid, b.valid)
        np.testing.assert_array_equal(a.ended, b.ended)
        np.testing.assert_array_equal(b.data["reward"], np.asarray(rew, np.float32))
        np.testing.assert_array_equal(b.data["terminated"], term)
        np.testing.assert_array_equal(b.data["truncated"], done & ~term)
        np.testing.assert_array_equal(b.data["next_obs"][:, 0], plain.observe())
        ended += int(a.ended.sum())
    assert ended >= 10  # episodes ended, and their restart steps were compared too


def test_a_recurrent_dqns_acting_state_is_zeroed_exactly_at_each_copys_episode_starts():
    """CartPole with 3 copies: the state each valid step was acted from is zero exactly at an episode's first
    step, and the worker's rows have the agent axis of one."""
    cfg = load_config(SCEN / "cartpole_dqn.yaml", QUIET + ["scenario.num_envs=3", "critic.recurrent=gru",
                                                            "critic.hidden=[8]", "algorithm.replay.sequence=6"])
    worker = QWorker(cfg, 0)
    assert worker.dims.solo and worker.dims.n_agents == 1 and worker.dims.in_dim == 4
    with torch.no_grad():
        for p in worker.net.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=torch.Generator().manual_seed(3)))
    chunks = [collect_chunk(worker, 40)[0] for _ in range(3)]
    whole = {k: np.concatenate([c[k] for c in chunks]) for k in chunks[0]}
    assert whole["obs"].shape[1:] == (3, 1, 4) and whole["h0"].shape[1:] == (3, 1, 8)
    starts = 0
    for e in range(3):
        first = True  # the worker's vector was just reset: its first step starts an episode
        for t in range(len(whole["valid"])):
            if not whole["valid"][t, e]:
                continue
            assert (~whole["h0"][t, e].any()) == first, (t, e)
            starts += first
            first = bool(whole["terminated"][t, e] or whole["truncated"][t, e])
    assert starts >= 6
    worker.close()


def test_standardised_rewards_of_sequences_pool_only_the_steps_in_the_loss():
    """With ``standardise_rewards`` a batch of sequences adds the rewards of the steps in the loss (after
    the burn-in, before the padding) to the running statistics, and nothing of the padding's garbage."""
    learner = _learner("vdn", burn_in=2, standardise=True)
    batch = _batch(learner, np.random.default_rng(4))
    batch["reward"][~batch["mask"]] = 1e6  # padding: garbage the statistics must never see
    learner.update(batch)
    b = learner.hp.replay.burn_in
    live = batch["mask"][:, b + 1:]
    x = batch["reward"][:, b:-1][live].astype(np.float64)
    n = 1e-4 + x.size
    mean = x.sum() / n
    assert learner.reward_stats.count == pytest.approx(n)
    assert learner.reward_stats.mean == pytest.approx(mean, rel=1e-9)
    assert learner.reward_stats.var == pytest.approx((1e-4 * (1 + mean ** 2) + ((x - mean) ** 2).sum()) / n, rel=1e-9)
