"""Recurrent heads and the recurrent team actor-critic (agents/recurrent.py, agents/recurrent_ac.py), each
against an independent reference: the GRU's equations written out, a hand loop over time steps with
detaches at chunk boundaries, the loss written out per sample, the recall task's first observations,
a second identical run, an uninterrupted run, and the CLI's exit status."""
from __future__ import annotations

import csv
from typing import Any

import numpy as np
import pytest
import torch

from agents.actor_critic import ActorCriticConfig
from agents.heads import FlatParameters, MLPConfig, build_mlp
from agents.mappo import TeamWorker
from agents.recurrent import RecurrentHead, from_sequences, to_sequences
from agents.recurrent_ac import recurrent_update
from agents.returns import gae
from marl_q.config import build_config
from marl_q.experiment import run_experiment
from marl_q.optim import FlatAdam

GRU = {"head": "mlp", "hidden": [16], "recurrent": "gru"}


def _head(in_dim: int = 3, out_dim: int = 2, hidden: int = 5, seed: int = 0) -> RecurrentHead:
    torch.manual_seed(seed)
    cfg = MLPConfig(hidden=[hidden], recurrent="gru", out_gain=0.5)
    head = build_mlp(cfg, in_dim, out_dim)
    with torch.no_grad():  # biases away from zero, so that they are checked too
        for p in head.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return head


def _gru_math(head: RecurrentHead, x: torch.Tensor, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Cho et al.'s GRU as torch documents it, written out: r, z, n gates, h' = (1 - z) n + z h."""
    e = head.encoder(x)
    W_ir, W_iz, W_in = head.gru.weight_ih.chunk(3)
    W_hr, W_hz, W_hn = head.gru.weight_hh.chunk(3)
    b_ir, b_iz, b_in = head.gru.bias_ih.chunk(3)
    b_hr, b_hz, b_hn = head.gru.bias_hh.chunk(3)
    r = torch.sigmoid(e @ W_ir.T + b_ir + h @ W_hr.T + b_hr)
    z = torch.sigmoid(e @ W_iz.T + b_iz + h @ W_hz.T + b_hz)
    n = torch.tanh(e @ W_in.T + b_in + r * (h @ W_hn.T + b_hn))
    h_new = (1 - z) * n + z * h
    return head.out(h_new), h_new


# ----------------------------------------------------------------------------- the head
def test_a_step_is_the_gru_equations_and_a_reset_zeroes_the_state_first():
    head = _head()
    x, h = torch.randn(4, 3), torch.randn(4, 5)
    reset = torch.tensor([False, True, False, True])
    out, h_new = head.step(x, h, reset)
    h_ref = torch.where(reset[:, None], torch.zeros(()), h)
    out_ref, h_new_ref = _gru_math(head, x, h_ref)
    torch.testing.assert_close(out, out_ref)
    torch.testing.assert_close(h_new, h_new_ref)
    with pytest.raises(TypeError, match="hidden state"):
        head(x)


def test_after_a_reset_the_outputs_do_not_depend_on_anything_before_it():
    """State reset at episode boundaries: two histories that differ before a reset give the same outputs
    from the reset on, and differ before it."""
    head = _head()
    L, B = 6, 3
    x = torch.randn(L, B, 3)
    resets = torch.zeros(L, B, dtype=torch.bool)
    resets[3] = True
    other = x.clone()
    other[:3] = torch.randn(3, B, 3)  # another past
    a, _ = head.unroll(x, torch.randn(B, 5), resets)
    b, _ = head.unroll(other, torch.randn(B, 5), resets)
    torch.testing.assert_close(a[3:], b[3:])
    assert not torch.allclose(a[:3], b[:3])
    fresh, _ = head.unroll(x[3:], head.initial_state(B))  # an episode started at step 3 from zeros
    torch.testing.assert_close(a[3:], fresh)


def test_unroll_equals_a_loop_of_steps():
    head = _head()
    L, B = 5, 4
    x, h0 = torch.randn(L, B, 3), torch.randn(B, 5)
    resets = torch.rand(L, B) < 0.3
    outs, h_last = head.unroll(x, h0, resets)
    h = h0
    for t in range(L):
        out, h = _gru_math(head, x[t], torch.where(resets[t][:, None], torch.zeros(()), h))
        torch.testing.assert_close(outs[t], out)
    torch.testing.assert_close(h_last, h)


def test_sequence_layout_round_trips_and_keeps_each_chunk_of_a_row_together():
    T, R, L = 6, 4, 3
    x = torch.arange(T * R).reshape(T, R)
    s = to_sequences(x, L)
    assert s.shape == (L, 2 * R)
    for c in range(T // L):
        for r in range(R):
            assert s[:, c * R + r].tolist() == [x[c * L + k, r].item() for k in range(L)]
    assert torch.equal(from_sequences(s, R), x)


def test_chunked_bptt_gradients_equal_a_hand_unrolled_reference_that_detaches_at_chunk_starts():
    """The gradient of a loss over every step, through to_sequences + unroll from the chunk-start states
    (detached), against a loop over time steps in the GRU's written-out equations."""
    head = _head()
    T, R, L = 6, 2, 3
    x = torch.randn(T, R, 3)
    resets = torch.rand(T, R) < 0.25
    target = torch.randn(T, R, 2)
    h_start = torch.randn(R, 5)
    # the reference: one pass over time, the state detached where a chunk starts (what the rollout stores)
    params = list(head.parameters())
    h, loss_ref, chunk_states = h_start, 0.0, []
    for t in range(T):
        if t % L == 0:
            h = h.detach()
            chunk_states.append(h)
        out, h = _gru_math(head, x[t], torch.where(resets[t][:, None], torch.zeros(()), h))
        loss_ref = loss_ref + ((out - target[t]) ** 2).sum()
    g_ref = torch.autograd.grad(loss_ref, params)
    h0 = torch.cat(chunk_states)  # (C R, H): chunk c, row r at c R + r
    outs, _ = head.unroll(to_sequences(x, L), h0, to_sequences(resets, L))
    loss = ((from_sequences(outs, R) - target) ** 2).sum()
    g = torch.autograd.grad(loss, params)
    for a, b in zip(g, g_ref):
        torch.testing.assert_close(a, b)
    # and the cut matters: without the detach the gradient is another one
    h, loss_full = h_start, 0.0
    for t in range(T):
        out, h = _gru_math(head, x[t], torch.where(resets[t][:, None], torch.zeros(()), h))
        loss_full = loss_full + ((out - target[t]) ** 2).sum()
    g_full = torch.autograd.grad(loss_full, params)
    assert not all(torch.allclose(a, b) for a, b in zip(g, g_full))


# ----------------------------------------------------------------------------- the update
def test_a2c_recurrent_update_pushes_the_gradient_of_the_loss_written_out_per_sample():
    """recurrent_update's single A2C pass against a loop over time steps from the recorded chunk
    states: per valid sample -A logp - ent H + vf (V - R)^2, A from GAE on the looped values."""
    torch.manual_seed(1)
    T, R, L, D, A = 4, 3, 2, 3, 2
    actor, critic = _head(D, A, seed=2), _head(D, 1, seed=3)
    flat = FlatParameters(actor, critic)
    rng = np.random.default_rng(0)
    C = T // L
    batch = {"obs": rng.standard_normal((T + 1, R, D)).astype(np.float32),
             "actions": rng.integers(0, A, (T, R)),
             "rewards": rng.standard_normal((T, R)),
             "terminated": np.zeros((T, R), dtype=bool), "dones": np.zeros((T, R), dtype=bool),
             "valid": np.ones((T, R), dtype=bool),
             "resets": np.zeros((T + 1, R), dtype=bool),
             "actor_h": rng.standard_normal((C + 1, R, 5)).astype(np.float32),
             "critic_h": rng.standard_normal((C + 1, R, 5)).astype(np.float32)}
    batch["dones"][1, 0] = batch["terminated"][1, 0] = True  # row 0's episode ends at step 1 ...
    batch["valid"][2, 0] = False  # ... step 2 restarts it ...
    batch["resets"][3, 0] = True  # ... and step 3 sees the new episode's first observation
    batch["resets"][2, 2] = True
    ac = ActorCriticConfig(n_steps=T, gae_lambda=0.9, ent_coef=0.05, vf_coef=0.7, max_grad_norm=None)
    recurrent_update(ac, actor, critic, flat, None, rng, batch, L)
    got = flat.grad_numpy()

    obs, resets = torch.from_numpy(batch["obs"]), torch.from_numpy(batch["resets"])
    ha = hc = None
    logps, ents, values = [], [], []
    for t in range(T + 1):
        if t % L == 0:
            ha = torch.from_numpy(batch["actor_h"][t // L])
            hc = torch.from_numpy(batch["critic_h"][t // L])
        z = torch.zeros(())
        v, hc = _gru_math(critic, obs[t], torch.where(resets[t][:, None], z, hc))
        values.append(v[:, 0])
        if t < T:
            logits, ha = _gru_math(actor, obs[t], torch.where(resets[t][:, None], z, ha))
            logp_all = torch.log_softmax(logits, -1)
            logps.append(logp_all[torch.arange(R), torch.from_numpy(batch["actions"][t])])
            ents.append(-(logp_all.exp() * logp_all).sum(-1))
    V = torch.stack(values)
    adv = gae(batch["rewards"], V[:T].detach().numpy().astype(np.float64), V[1:].detach().numpy().astype(np.float64),
              batch["terminated"], batch["dones"], ac.gamma, ac.gae_lambda)
    ret = adv + V[:T].detach().numpy()
    m = torch.from_numpy(batch["valid"]).float()
    n = m.sum()
    loss = (-(torch.from_numpy(adv).float() * torch.stack(logps) * m).sum() / n
            - ac.ent_coef * (torch.stack(ents) * m).sum() / n
            + ac.vf_coef * (((V[:T] - torch.from_numpy(ret).float()) ** 2) * m).sum() / n)
    flat.zero_grad()
    loss.backward()
    np.testing.assert_allclose(got, flat.grad_numpy(), rtol=1e-4, atol=1e-6)


def test_ppo_minibatches_are_whole_sequences_each_unrolled_from_its_own_recorded_state(monkeypatch):
    """minibatches: 2 over C R = 4 x 3 sequences: every forward in training sees L = chunk steps of 6
    sequences, and each minibatch's initial states are the recorded states of exactly its sequences."""
    import agents.recurrent_ac as rac

    torch.manual_seed(1)
    T, R, L, D, A = 8, 3, 2, 3, 2
    C = T // L
    actor, critic = _head(D, A, seed=2), _head(D, 1, seed=3)
    flat = FlatParameters(actor, critic)
    rng = np.random.default_rng(0)
    batch = {"obs": rng.standard_normal((T + 1, R, D)).astype(np.float32), "actions": rng.integers(0, A, (T, R)),
             "rewards": rng.standard_normal((T, R)), "terminated": np.zeros((T, R), dtype=bool),
             "dones": np.zeros((T, R), dtype=bool), "valid": np.ones((T, R), dtype=bool),
             "resets": np.zeros((T + 1, R), dtype=bool),
             "actor_h": rng.standard_normal((C + 1, R, 5)).astype(np.float32),
             "critic_h": rng.standard_normal((C + 1, R, 5)).astype(np.float32)}
    calls = []
    real = rac.sequence_forward

    def spy(net, x, h0, resets):
        calls.append((net is actor, x.detach().clone(), None if h0 is None else h0.detach().clone()))
        return real(net, x, h0, resets)

    monkeypatch.setattr(rac, "sequence_forward", spy)
    from agents.actor_critic import PPOConfig
    ac = PPOConfig(n_steps=T, epochs=1, minibatches=2)
    recurrent_update(ac, actor, critic, flat, FlatAdam(flat.flat, lr=1e-3), rng, batch, L)
    training = [c for c in calls if c[0]][1:]  # the actor's forwards after the no-grad pass over all sequences
    assert [x.shape[:2] for _, x, _ in training] == [(L, C * R // 2)] * 2
    obs_seq = to_sequences(torch.from_numpy(batch["obs"][:T]), L)
    h_seq = torch.from_numpy(batch["actor_h"][:C]).reshape(C * R, -1)
    seen = []
    for _, x, h0 in training:
        for b in range(x.shape[1]):  # find the sequence this column is: its steps and its state go together
            s = [k for k in range(C * R) if torch.equal(obs_seq[:, k], x[:, b])]
            assert len(s) == 1 and torch.equal(h_seq[s[0]], h0[b])
            seen.append(s[0])
    assert sorted(seen) == list(range(C * R))


# ----------------------------------------------------------------------------- runs
def _raw(alg: str = "mappo", steps: int = 600, **alg_keys: Any) -> dict:
    algorithm = {"name": alg, "envs_per_worker": 4, "n_steps": 10, "chunk": 5, **alg_keys}
    if alg in ("ippo", "mappo"):
        algorithm.setdefault("epochs", 2)
        algorithm.setdefault("minibatches", 2)
    return {"run": {"seed": 0, "total_env_steps": steps, "progress": False, "plots": False},
            "backend": {"name": "sim", "workers": 1},
            "scenario": {"name": "recall_cue", "n_agents": 2, "n_cues": 2, "delay": 2},
            "algorithm": algorithm, "actor": dict(GRU), "critic": dict(GRU)}


def test_the_rollout_resets_each_rows_state_exactly_at_its_episodes_first_observation():
    """recall_cue shows the cue (a one in the first K columns) only at an episode's first step, so the
    reset flags of the valid steps must be exactly the rows whose observation holds a cue; the state
    that ends one rollout is the one the next starts from."""
    cfg = build_config(_raw())
    worker = TeamWorker(cfg, 0)
    carried = None
    for _ in range(3):
        batch, _, _ = worker.rollout()
        if carried is not None:
            np.testing.assert_array_equal(batch["actor_h"][0], carried)
        carried = batch["actor_h"][-1]
        np.testing.assert_array_equal(carried, worker.memory.state["actor"].numpy())
        T = batch["actions"].shape[0]
        valid = batch["valid"]
        cue = batch["obs"][:T, :, :2].sum(-1) == 1
        assert valid.sum() > 0 and (cue & valid).any()
        np.testing.assert_array_equal(batch["resets"][:T][valid], cue[valid])
        # and the recorded chunk states are the states the acting reached: stepping from them again
        with torch.no_grad():
            h = torch.from_numpy(batch["actor_h"][0])
            for t in range(5):
                _, h = worker.actor.step(torch.from_numpy(batch["obs"][t]), h, torch.from_numpy(batch["resets"][t]))
        np.testing.assert_allclose(h.numpy(), batch["actor_h"][1], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("alg", ["ippo", "mappo", "ia2c", "maa2c"])
def test_every_team_algorithm_runs_with_a_gru_actor_and_critic(alg, tmp_path):
    summary = run_experiment(build_config(_raw(alg, steps=400)), tmp_path / "run")
    assert summary["status"] == "completed" and summary["env_steps"] >= 400
    rows = list(csv.DictReader(open(tmp_path / "run" / "train.csv")))
    assert rows and all(np.isfinite(float(r["policy_loss"])) for r in rows)


def test_a_gru_actor_beside_a_feed_forward_critic_and_the_reverse_run(tmp_path):
    for i, (actor, critic) in enumerate([(GRU, {"head": "mlp", "hidden": [16]}), ({"head": "mlp", "hidden": [16]}, GRU)]):
        raw = _raw(steps=200)
        raw["actor"], raw["critic"] = dict(actor), dict(critic)
        assert run_experiment(build_config(raw), tmp_path / str(i))["status"] == "completed"


def test_a_short_gru_mappo_run_recalls_the_cue_where_chance_is_one_half(tmp_path):
    """Seeded and short: 2 agents, 2 cues, one blank step; the last 200 episodes' mean team return
    (fraction of agents right) is far above 1/2, which no function of the current observation can beat
    (tests/scenarios/test_recall_cue.py)."""
    raw = _raw(steps=2000, n_steps=6, chunk=3, lr=5e-3, epochs=4, minibatches=1)
    raw["algorithm"]["envs_per_worker"] = 8
    raw["scenario"]["delay"] = 1
    run_experiment(build_config(raw), tmp_path / "run")
    returns = [float(r["return"]) for r in csv.DictReader(open(tmp_path / "run" / "metrics.csv"))]
    assert len(returns) >= 600
    assert np.mean(returns[:100]) < 0.6 < 0.85 < np.mean(returns[-200:])


def test_a_recurrent_sim_run_twice_is_byte_identical(tmp_path):
    for name in ("one", "two"):
        run_experiment(build_config(_raw(steps=400)), tmp_path / name)
    for fname in ("metrics.csv", "comm.csv", "train.csv"):
        one, two = (tmp_path / "one" / fname).read_bytes(), (tmp_path / "two" / fname).read_bytes()
        assert one == two and one.count(b"\n") > 2, fname


def test_a_stopped_and_resumed_recurrent_run_equals_the_uninterrupted_one(exact_resume):
    """Exact resume: the hidden states, reset flags and minibatch draws come back with the snapshot."""
    exact_resume(lambda: _raw(steps=800), stop_after=7)


def test_greedy_evaluation_runs_the_recurrent_actor(tmp_path):
    raw = _raw(steps=400)
    raw["run"].update({"eval_every": 200, "eval_episodes": 4})
    run_experiment(build_config(raw), tmp_path / "run")
    rows = list(csv.DictReader(open(tmp_path / "run" / "eval.csv")))
    assert rows and all(0.0 <= float(r["eval_return"]) <= 1.0 for r in rows)


# ----------------------------------------------------------------------------- bad input
def test_loading_a_recurrent_actor_as_a_stateless_policy_is_refused_in_one_line(tmp_path):
    from marl_q.errors import UserError
    from marl_q.rundir import load_trained

    raw = _raw(steps=200)
    raw["run"]["checkpoint_every"] = 1
    run_experiment(build_config(raw), tmp_path / "run")
    with pytest.raises(UserError, match=r"a recurrent actor \(actor.recurrent\) has no stateless acting policy"):
        load_trained(tmp_path / "run")




BAD = [
    ("a quantum head", lambda r: r.update(actor={"head": "vqc", "recurrent": "gru"}),
     "actor.recurrent: head 'vqc' cannot carry a hidden state"),
    ("a critic head", lambda r: r.update(critic={"head": "hybrid", "recurrent": "gru"}),
     "critic.recurrent: head 'hybrid' cannot carry a hidden state"),
    ("an unknown kind", lambda r: r["actor"].update(recurrent="lstm"), "actor.recurrent"),
    ("a learner without memory", lambda r: r.update(algorithm={"name": "coma"}),
     "actor.recurrent: algorithm 'coma' has no recurrent policies"),
    ("a chunk that does not divide n_steps", lambda r: r["algorithm"].update(chunk=4),
     "chunk: must be a positive divisor of n_steps (10), got 4"),
    ("per-agent heads", lambda r: r["algorithm"].update(share_params=False),
     "actor.recurrent: needs algorithm.share_params: true"),
]


@pytest.mark.parametrize("what,change,message", BAD, ids=[b[0] for b in BAD])
def test_bad_recurrent_input_exits_2_with_one_line(what, change, message, cli_run):
    raw = _raw()
    change(raw)
    code, err, out = cli_run(raw)
    assert code == 2 and message in err and len(err.splitlines()) == 1, err
    assert not out.exists()
