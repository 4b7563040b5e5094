"""`marlq bench quantum --peers`: the agreement check, the table's JSON, the path choice it measures.

No timing is asserted. PennyLane default.qubit with torch is always installed, so the agreement
code path is tested with it; the JAX peers (the project's [peers] extra) are tested where installed.
"""
from __future__ import annotations

import importlib.util
import json
import os

import numpy as np
import pytest
import torch

from circuits import peers
from circuits.program import block_layout
from circuits.bench import main
from circuits.peer_bench import bench_module, check_agreement, contestants, summarise
from circuits.vqc import VQC

needs_jax = pytest.mark.skipif(importlib.util.find_spec("jax") is None,
                               reason="needs the [peers] extra (pip install -e '.[peers]'): jax is not installed")
needs_tensorcircuit = pytest.mark.skipif(importlib.util.find_spec("tensorcircuit") is None,
                                         reason="needs the [peers] extra (pip install -e '.[peers]'): tensorcircuit-ng is not installed")


def test_pennylane_peer_agrees_and_a_wrong_one_is_flagged():
    sims, _ = contestants(3, 2, ["default.qubit+torch"])
    assert set(sims) == {"marl-q auto", "PL default.qubit+torch"}
    report = check_agreement(sims, 3)
    assert report["PL default.qubit+torch"]["agrees"]
    assert report["PL default.qubit+torch"]["output_max_abs_diff"] < 1e-5
    # a peer whose circuit differs (one weight moved) must be caught, in outputs and gradients
    wrong = bench_module(3, 2)  # the same seeded parameters as the bench's head
    with torch.no_grad():
        wrong.weights[0, 0, 1] += 0.1
    sims["wrong"] = peers.torch_peer("wrong", wrong, wrong.to_qnode("default.qubit", diff_method="backprop"))
    report = check_agreement(sims, 3)
    assert not report["wrong"]["agrees"]
    assert report["wrong"]["output_max_abs_diff"] > 1e-4


@pytest.mark.parametrize("n", [3, 6])
def test_numpy_twins_in_the_bench_agree_with_the_torch_head(n):
    """The bench's numpy columns (the acting and one-step training twins; up to 4 qubits also those of an
    ``engine: gates`` head) compute the torch head's outputs and gradients, and fwd_bwd leaves the
    gradients of sum(outputs) in the parameters' .grad."""
    sims, _ = contestants(n, 2, ["numpy"])
    expected = {"marl-q auto", "marl-q numpy"} | ({"marl-q numpy gates"} if n < 5 else set())
    assert set(sims) == expected
    report = check_agreement(sims, n)
    for name in expected - {"marl-q auto"}:
        assert report[name]["agrees"] and report[name]["grad_max_rel_diff"] < 1e-5, (name, report[name])
    x = torch.randn(4, n, generator=torch.Generator().manual_seed(3))
    got = sims["marl-q numpy"].fwd_bwd(sims["marl-q numpy"].convert(x))
    want = sims["marl-q auto"].fwd_bwd(x)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, atol=1e-5, rtol=1e-4)


def test_a_simulator_too_slow_at_a_smaller_batch_is_not_called_at_a_larger_one():
    """time_cell skips, without calling it, a simulator skipped at a smaller batch or whose one call,
    scaled linearly from there, would pass --max-call-s (a first call at a batch it cannot handle may
    take all the memory); the others are timed."""
    import argparse

    from circuits.peer_bench import time_cell

    called: list[str] = []

    def fake(name: str) -> peers.Peer:
        def call(x):
            called.append(name)
        return peers.Peer(name, act=call, fwd_bwd=call, outputs=lambda x: None, grads=lambda x, c: [])

    sims = {name: fake(name) for name in ("fast", "slow", "gone")}
    args = argparse.Namespace(clock="cpu", max_call_s=0.5, rounds=1, min_time=0.001)
    previous = {"slow": (64, 0.2), "gone": (64, None), "fast": (64, 1e-6)}
    out = time_cell(sims, "act", torch.zeros(1024, 2), args, previous)
    assert set(called) == {"fast"}
    assert "predicted 3.20 s" in out["slow"]["skipped"] and out["gone"]["skipped"] == "skipped at B=64"
    assert "ms_per_call" in out["fast"] and previous["slow"] == (64, None) and previous["fast"][0] == 1024


def test_agreement_measures_gradients_relative_to_their_scale():
    # hand-made peers: equal outputs, gradients off by 1% of their largest entry
    def fake(name: str, scale: float) -> peers.Peer:
        return peers.Peer(name, act=lambda x: None, fwd_bwd=lambda x: None, outputs=lambda x: np.ones((2, 2)),
                          grads=lambda x, c: [np.array([100.0, 1.0]) * scale, np.array([2.0])])
    diffs = peers.agreement(fake("a", 1.01), fake("b", 1.0), torch.zeros(2, 2), np.ones((2, 2)))
    assert diffs["output_max_abs_diff"] == 0.0
    assert diffs["grad_max_rel_diff"] == pytest.approx(0.01)


def test_summary_ranks_only_agreeing_peers():
    cell = {"marl-q auto": {"ms_per_call": 2.0, "samples_per_s": 50.0}, "marl-q gates": {"ms_per_call": 1.0, "samples_per_s": 100.0},
            "fast but wrong": {"ms_per_call": 0.1, "samples_per_s": 1000.0}, "peer": {"ms_per_call": 4.0, "samples_per_s": 25.0},
            "slow": {"skipped": "one call 2.00 s > 1.0 s"}}
    summary = summarise(cell, excluded={"fast but wrong"})
    assert summary == {"marlq_best": "marl-q gates", "fastest_peer": "peer", "ratio": 4.0, "auto_ratio": 2.0}


def test_peers_json_table(tmp_path, capsys):
    out = tmp_path / "peers.json"
    threads, affinity = torch.get_num_threads(), os.sched_getaffinity(0)
    code = main(["--peers", "--n-qubits", "2", "--batches", "1,3", "--rounds", "2", "--min-time", "0.01",
                 "--sims", "default.qubit+torch", "--json", str(out)])
    assert code == 0
    report = json.loads(out.read_text())
    assert "load average" in report["meta"]["uptime_before"] and "load average" in report["meta"]["uptime_after"]
    assert "intra_op_parallelism_threads=1" in report["meta"]["xla_flags"]
    assert report["meta"]["agreement"]["2"]["PL default.qubit+torch"]["agrees"]
    cells = [(r["mode"], r["batch"]) for r in report["rows"]]
    assert cells == [("act", 1), ("act", 3), ("fwd_bwd", 1), ("fwd_bwd", 3)]
    for row in report["rows"]:
        ours = row["results"][row["marlq_best"]]
        theirs = row["results"][row["fastest_peer"]]
        assert row["fastest_peer"] == "PL default.qubit+torch"
        assert row["ratio"] == pytest.approx(ours["samples_per_s"] / theirs["samples_per_s"])
        assert len(ours["round_ms"]) == 2
        # the first call (JAX's compile, marl-q's caches) is timed apart, and the row names the planner's path
        assert ours["first_call_ms"] > 0 and theirs["first_call_ms"] > 0
        assert row["auto_path"] == bench_module(2, 2).path(row["batch"], row["mode"] == "fwd_bwd")
    printed = capsys.readouterr().out
    assert "uptime before" in printed and "best/peer" in printed
    assert "PL default.qubit+torch: PennyLane default.qubit, torch interface" in printed  # what each contender computes
    # it ran pinned to one CPU with one thread, and leaves the process as it found it
    assert report["meta"]["threads"] == 1 and report["meta"]["cpu"] in affinity
    assert torch.get_num_threads() == threads and os.sched_getaffinity(0) == affinity


def test_absent_peers_say_not_installed(monkeypatch):
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None if name == "tensorcircuit" else object())
    assert peers.peer_status("tensorcircuit-ng state jit+vmap") == "not installed (pip install -e '.[peers]')"
    assert peers.peer_status("tensorcircuit-ng expectation_ps legacy") == "not installed (pip install -e '.[peers]')"


def test_peers_bad_arguments_exit_2(capsys):
    assert main(["--peers", "--device", "cuda", "--n-qubits", "2"]) == 2
    assert main(["--peers", "--rounds", "0", "--n-qubits", "2"]) == 2
    assert main(["--peers", "--modes", "fwd", "--n-qubits", "2"]) == 2
    err = capsys.readouterr().err
    assert "--rounds: expected >= 1, got 0" in err and "choices: act, fwd_bwd" in err


@pytest.fixture(scope="module")
def jax_sims() -> dict[str, peers.Peer]:
    """The JAX peers of one 3-qubit bench head, built once for this file: each jitted function compiles at
    its first call, and every test below calls them at the batch of 5 that ``check_agreement`` uses, so
    each compiles once (a JAX compile costs 5-15 CPU-s here)."""
    sims, _ = contestants(3, 2, ["jax.jit", "tensorcircuit", "legacy"])
    return sims


@pytest.mark.parametrize("word, name", [pytest.param("jax.jit", "PL default.qubit+jax.jit", marks=needs_jax),
                                        pytest.param("tensorcircuit", "tensorcircuit-ng state jit+vmap", marks=needs_tensorcircuit)])
def test_jax_peers_agree(word, name, jax_sims):
    sims, absent = contestants(3, 2, [word])  # builds without compiling: jit compiles at the first call
    assert name in sims, absent
    assert not set(sims) & peers.LEGACY  # the legacy peers run only when asked for
    report = check_agreement({"marl-q auto": jax_sims["marl-q auto"], name: jax_sims[name]}, 3)[name]
    assert report["agrees"], report


def _rows(x: torch.Tensor) -> np.ndarray:
    return x.detach().double().numpy()


def _check_peer_computes_the_head(peer: peers.Peer, head: VQC, x: torch.Tensor, c: torch.Tensor) -> None:
    """Outputs, every parameter's gradient of sum(outputs * c), and what fwd_bwd returns (the gradient of
    sum(outputs), through value_and_grad) of ``peer`` equal marl-q's head on the same parameters, to 1e-5."""
    params = [head.weights, head.post.weight, head.post.bias]
    out = head(x)
    want_grads = [_rows(g) for g in torch.autograd.grad((out * c).sum(), params)]
    want_sum = [_rows(g) for g in torch.autograd.grad(head(x).sum(), params)]
    np.testing.assert_allclose(peer.outputs(x), _rows(out), atol=1e-5, rtol=0)
    for got, want in zip(peer.grads(x, c.numpy()), want_grads):
        np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)
    for got, want in zip(peer.fwd_bwd(peer.convert(x)), want_sum):
        np.testing.assert_allclose(np.asarray(got, dtype=np.float64), want, atol=1e-5 * max(1.0, np.abs(want).max()), rtol=0)
    assert np.abs(want_grads[0]).max() > 1e-3  # the circuit's gradients are not vacuous


def _batch(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(5, 3, generator=generator) * 2.0  # 5 rows, as check_agreement: the compiled shapes
    return x, torch.randn(5, 2, generator=generator)


@needs_tensorcircuit
def test_tensorcircuit_rewrite_computes_the_legacy_peer_and_the_head(jax_sims):
    """The rewritten tensorcircuit-ng peer (P(0) from |psi|^2 of the state) gives the outputs of the legacy
    one (one expectation_ps per qubit), and the outputs and every gradient of marl-q's head (3 qubits: 5
    checked nothing 3 do not, at 2x the JAX compile). The legacy peer's gradients are not compiled here
    (two more JAX compiles, 12 CPU-s): `marlq bench quantum --peers --sims legacy` checks them against
    marl-q before it times them, as it does every contender."""
    new, old = jax_sims.get("tensorcircuit-ng state jit+vmap"), jax_sims.get("tensorcircuit-ng expectation_ps legacy")
    assert new is not None and old is not None
    x, c = _batch(7)
    _check_peer_computes_the_head(new, bench_module(3, 2), x, c)
    np.testing.assert_allclose(new.outputs(x), old.outputs(x), atol=1e-6, rtol=0)
    assert np.abs(new.outputs(x) - new.outputs(x + 0.5)).max() > 1e-3  # the outputs depend on the input


@needs_jax
def test_pennylane_jax_peer_computes_the_head(jax_sims):
    """PennyLane + jax.jit: outputs and gradients (sum and weighted) of marl-q's head to 1e-5."""
    peer = jax_sims.get("PL default.qubit+jax.jit")
    assert peer is not None
    x, c = _batch(8)
    _check_peer_computes_the_head(peer, bench_module(3, 2), x, c)


def test_p0_table_reads_every_qubits_probability_of_zero():
    """|psi|^2 @ p0_table(n) against the marginals summed directly from the state's (2,)*n tensor, qubit 0
    the first (most significant) axis; and against PennyLane's expval(Z) of the same state."""
    import pennylane as qml

    n = 3
    rng = np.random.default_rng(0)
    psi = rng.normal(size=2 ** n) + 1j * rng.normal(size=2 ** n)
    psi /= np.linalg.norm(psi)
    probs = np.abs(psi) ** 2
    got = probs @ peers.p0_table(n)
    tensor = probs.reshape((2,) * n)
    want = [tensor.take(0, axis=i).sum() for i in range(n)]
    np.testing.assert_allclose(got, want, atol=1e-6)

    @qml.qnode(qml.device("default.qubit", wires=n))
    def z(state):
        qml.StatePrep(state, wires=range(n))
        return [qml.expval(qml.PauliZ(i)) for i in range(n)]

    np.testing.assert_allclose(got, (np.asarray(z(psi)) + 1) / 2, atol=1e-6)


def test_every_contender_says_what_it_computes():
    sims, _ = contestants(3, 2, ["numpy", "default.qubit+torch"])
    for name, sim in sims.items():
        assert len(sim.about) > 20, name


def test_path_choice():
    def module(n: int, **spec) -> VQC:
        return VQC(n, 2, n_qubits=n, layers=1, **spec)

    # up to 4 qubits the paths are those the shipped scenarios always took
    assert module(4).path(1, True) == "dense_analytic"
    assert module(4).path(65, True) == "dense"
    assert module(4).path(1, False) == "dense"
    # from 5 qubits on, training takes the adjoint state vector, except large batches at n <= 8, and the
    # pauli executor where its cost model says it is the cheaper (one layer: few strings; from 365 rows at n = 8)
    assert module(8).path(64, True) == "adjoint"
    assert module(8).path(600, True) == "pauli"
    assert module(8).path(4096, True) == "pauli"
    # an act (no gradient) keeps the pauli executor's weights side: from 8 qubits it takes it where its strings
    # are few (12 qubits, one layer, one row: 0.019 ms against the blocks' 0.071), else the blocks
    assert module(12).path(1, False) == "pauli"
    assert VQC(12, 2, n_qubits=12, layers=2).path(1, False) == "adjoint"  # 5,819 strings
    assert module(12).path(4096, True) == "pauli"
    deep = dict(layers=2, ansatz="rzryrz_ring")  # 8 qubits: 12,105 strings, past 6 x 2 x 2^8
    assert VQC(8, 2, n_qubits=8, **deep).path(600, True) == "adjoint"
    assert VQC(8, 2, n_qubits=8, **deep).path(4096, True) == "dense"
    assert module(4).path(4096, True) == "dense"  # up to 4 qubits: never pauli under engine auto
    assert module(8, engine="pauli").path(1, False) == "pauli"
    assert module(8, engine="dense").path(600, True) == "dense"
    assert module(6, engine="gates").path(1, True) == "adjoint"
    # re-uploading: the state vector's blocks on the CPU at every row count (the compiled kernels take
    # none), torch_autograd on CUDA, the torch executors under shots or a gradient rule
    assert module(6, engine="gates", reupload=True).path(1, True) == "adjoint"
    from circuits.planner import Facts, Plan, plan

    reupload = Facts(4, reupload=True)
    for rows, grad, entry in [(1, False, "torch"), (16, True, "torch"), (1, False, "numpy"), (1, True, "numpy"),
                              (5000, True, "numpy")]:
        assert plan(reupload, rows, grad, entry, kernel_rows=64).variant == "blocks"
    assert plan(Facts(4, device="cuda", reupload=True), 1, True) == Plan("torch_autograd", "autograd")
    assert plan(Facts(4, reupload=True, hardware=True, analytic=False), 1, True) == Plan("torch_autograd", "rule")


def test_calls_without_gradient_build_the_dense_matrix_only_for_reuse():
    """From 5 qubits, a call without a gradient takes the state vector at new weights (no 2^n x 2^n
    rebuild), the dense matrix from the second call at the same weights (a rollout) on, and the state
    vector again after a weight change; both give the same outputs."""
    torch.manual_seed(0)
    m = VQC(6, 2, n_qubits=6, layers=2)
    x = torch.randn(3, 6)
    taken = []
    with torch.no_grad():
        for _ in range(3):
            taken.append(m.path(3, False))
            out = m(x)
        assert taken == ["adjoint", "dense", "dense"] and m._cached() is not None
        m.weights.add_(0.1)
        assert m.path(3, False) == "adjoint"
        first = m(x)
        assert m.path(3, False) == "dense"
        torch.testing.assert_close(m(x), first, atol=1e-6, rtol=0)
    assert not torch.allclose(out, first)
    assert VQC(4, 2, n_qubits=4).path(3, False) == "dense"  # up to 4 qubits as the goldens always ran


def test_acting_past_the_dense_path_reuses_the_weights_blocks_and_matches_the_differentiable_forward():
    """Past ``dense_max_qubits`` every call without a gradient runs the numpy state-vector forward with the
    blocks cached per weights: the same numbers as the autograd node's forward, blocks rebuilt only after a
    weight change (or a replaced readout), and left out of a pickle."""
    import pickle

    torch.manual_seed(0)
    m = VQC(11, 2, n_qubits=11, layers=2)
    x = torch.randn(2, 11)
    with torch.no_grad():
        first = m(x)
        blocks = m._act_blocks[1]
        assert torch.equal(m(x), first) and m._act_blocks[1] is blocks and m._act_weights is m._act_blocks[0]
    assert torch.equal(m(x).detach(), first)  # with a gradient: circuits.adjoint.StatevectorAdjoint
    with torch.no_grad():
        m.weights.add_(0.05)
        moved = m(x)
        assert m._act_blocks[1] is not blocks and not torch.allclose(moved, first)
    assert torch.equal(m(x).detach(), moved)
    assert pickle.loads(pickle.dumps(m))._act_blocks is None
    with torch.no_grad():
        m.circuit.readout = m.circuit.readout.flip(0)  # a head replacing its readout (output: born) rebuilds
        assert not torch.allclose(m(x), moved)


def test_block_layout_covers_every_wire_once():
    for n in range(1, 14):
        layout = block_layout(n)
        assert [w for first, width in layout for w in range(first, first + width)] == list(range(n))
        assert max(width for _, width in layout) <= 4
        assert max(width for _, width in layout) - min(width for _, width in layout) <= 1
