"""The server core: admission, staleness, aggregation rules, and the ledger's accounting."""
from __future__ import annotations

import math

import numpy as np
import pytest

import marl_q.staleness as st_rules
from marl_q.aggregation import Buffered, Hogwild, Sync
from marl_q.config import ServerConfig, StalenessConfig
from marl_q.ledger import Ledger
from marl_q.messages import HELLO, LIFE, SERVER, Message, stamp_life
from marl_q.server import Server
from marl_q.optim import FlatSGD
from marl_q.services import ParameterService

P = 6


def make_server(aggregation="hogwild", workers=("w0", "w1"), mode="grad", **server_kw):
    agg = {"hogwild": Hogwild, "buffered": Buffered, "sync": Sync}[aggregation](tuple(workers), server_kw.pop("buffer_k", 2))
    service = ParameterService(np.zeros(P, dtype=np.float32), mode, agg,
                               make_optimizer=lambda p: FlatSGD(p, lr=1.0))
    server = Server(service, list(workers), ServerConfig(aggregation=aggregation, **server_kw), Ledger(None))
    for w in workers:
        server.receive(Message(w, SERVER, "hello"), 0.0)
    return server, service


def push(server, src="w0", value=1.0, base=None, kind="grad", payload=None):
    payload = payload if payload is not None else {kind: np.full(P, value, dtype=np.float32)}
    return server.receive(Message(src, SERVER, kind, payload, base_version=server.version if base is None else base), 0.0)


def params(service):
    return service.param.detach().numpy().copy()


@pytest.mark.parametrize("bad, reason", [
    ({"grad": np.array([1, np.nan, 0, 0, 0, 0], dtype=np.float32)}, "non-finite"),
    ({"grad": np.array([np.inf, 0, 0, 0, 0, 0], dtype=np.float32)}, "non-finite"),
    ({"grad": np.zeros(P + 1, dtype=np.float32)}, "shape"),
    ({"grad": np.zeros((P, 1), dtype=np.float32)}, "shape"),
    ({"grad": np.zeros(P, dtype=np.float64)}, "dtype"),
    ({"grad": [0.0] * P}, "not an array"),
    ({"grd": np.zeros(P, dtype=np.float32)}, "payload names"),
    ({}, "missing"),
])
def test_bad_pushes_are_rejected_counted_and_change_nothing(bad, reason):
    server, service = make_server()
    before, version = params(service), server.version
    replies = push(server, payload=bad)
    assert server.ledger.rejected == 1
    np.testing.assert_array_equal(params(service), before)
    assert server.version == version
    assert [r.kind for r in replies] == ["params"]  # the sender is not left waiting
    # the run goes on: a good push afterwards is applied
    push(server, value=1.0)
    np.testing.assert_allclose(params(service), before - 1.0)


def test_unknown_sender_and_kind_rejected_with_reason():
    server, service = make_server()
    rows_before = server.ledger.count
    assert push(server, src="mallory") == []
    push(server, kind="gradient", payload={"gradient": np.zeros(P, dtype=np.float32)})
    assert server.ledger.rejected == 2
    assert server.ledger.count == rows_before + 3  # two rejected + the reply to the known sender
    assert service.updates() == 0


def test_staleness_weight_and_max_staleness():
    server, service = make_server(staleness=StalenessConfig(rule="poly", a=1.0), max_staleness=2)
    push(server, value=1.0)                   # staleness 0, w = 1
    push(server, value=1.0)                   # staleness 0
    np.testing.assert_allclose(params(service), -2.0)
    push(server, value=3.0, base=0)           # staleness 2: w = 1/3
    np.testing.assert_allclose(params(service), -3.0, rtol=1e-6)
    push(server, value=1.0, base=0)           # staleness 3 > 2: dropped
    np.testing.assert_allclose(params(service), -3.0, rtol=1e-6)
    assert server.ledger.dropped_stale == 1 and server.ledger.rejected == 0
    assert server.staleness_counts == {0: 2, 2: 1}
    push(server, value=1.0, base=server.version + 1)  # from the future
    assert server.ledger.rejected == 1


def test_buffered_applies_weighted_mean_every_k():
    server, service = make_server("buffered", buffer_k=2, staleness=StalenessConfig(rule="inv_sqrt"))
    push(server, value=2.0)
    assert service.updates() == 0 and server.version == 0
    push(server, value=4.0)
    assert service.updates() == 1 and server.version == 1
    np.testing.assert_allclose(params(service), -3.0)
    push(server, value=3.0, base=0)  # staleness 1: w = 1/sqrt 2
    push(server, value=1.0)
    np.testing.assert_allclose(params(service), -3.0 - (3.0 / math.sqrt(2) + 1.0) / 2, rtol=1e-6)


def test_sync_waits_for_every_worker_then_broadcasts():
    server, service = make_server("sync")
    assert push(server, "w0", 1.0) == []  # held at the barrier
    assert service.updates() == 0
    replies = push(server, "w1", 3.0)
    assert sorted(r.dst for r in replies) == ["w0", "w1"]
    assert all(r.base_version == 1 for r in replies)
    np.testing.assert_allclose(params(service), -2.0)



@pytest.mark.parametrize("rule", [Hogwild, Buffered, Sync])
def test_a_rule_asked_about_rounds_answers_as_it_aggregates(rule):
    """What a service keeping whole pushes (COMA) asks a rule agrees with what offer() does."""
    agg, asked = rule(("w0", "w1"), 3), rule(("w0", "w1"), 3)
    held: list[str] = []
    for worker in ["w0", "w0", "w1", "w1", "w0", "w1"]:
        combined, replies = agg.offer(worker, np.ones(2, dtype=np.float32), 1.0)
        if asked.replaces_in_round:
            held = [w for w in held if w != worker]
        held.append(worker)
        complete = asked.round_complete(held)
        assert complete == (combined is not None) and replies == asked.reply_to(worker, complete)
        if complete:
            held = []

def test_delta_mode_adds_scaled_delta():
    agg = Hogwild(("w0",), 1)
    service = ParameterService(np.ones(P, dtype=np.float32), "delta", agg, server_lr=0.5)
    server = Server(service, ["w0"], ServerConfig(), Ledger(None))
    push(server, value=2.0, kind="delta")
    np.testing.assert_allclose(params(service), 2.0)


def test_ledger_counts_real_payload_bytes_and_directions():
    server, service = make_server()
    push(server, value=1.0)
    led = server.ledger
    # hellos carry nothing; each params reply is P float32; the push is P float32
    assert led.bytes_up == 4 * P
    assert led.bytes_down == 3 * 4 * P
    assert led.by_kind["grad"] == [1, 4 * P]
    assert led.count == 6  # 2 hellos, 2 replies, the push and its reply


@pytest.mark.parametrize("rule, s, expected", [
    ("constant", 7, 1.0), ("poly", 3, 0.5), ("inv_sqrt", 8, 1 / 3),
    ("hinge", 4, 1.0), ("hinge", 6, 0.5),
])
def test_staleness_rules(rule, s, expected):
    fn = getattr(st_rules, rule)
    assert fn(s, a=0.5, b=4) == pytest.approx(expected)


def test_a_duplicated_push_is_applied_at_most_once():
    server, service = make_server()
    msg = Message("w0", SERVER, "grad", {"grad": np.full(P, 1.0, dtype=np.float32)}, base_version=0, seq=1)
    assert [r.kind for r in server.receive(msg, 0.0)] == ["params"]
    assert server.receive(msg, 0.0) == []  # the same (worker, seq) again: recorded, not applied
    np.testing.assert_allclose(params(service), -1.0)
    assert server.ledger.rejected == 1 and service.updates() == 1
    # a restarted worker says hello and numbers its messages from 1 again
    server.receive(Message("w0", SERVER, "hello"), 0.0)
    server.receive(Message("w0", SERVER, "grad", {"grad": np.full(P, 1.0, dtype=np.float32)},
                           base_version=server.version, seq=1), 0.0)
    np.testing.assert_allclose(params(service), -2.0)


def test_a_duplicated_hello_is_answered_once_and_a_new_life_anew():
    server, service = make_server(workers=("w0",))
    hello = stamp_life([Message("w0", SERVER, HELLO)], "1-abc")[0]
    assert hello.info[LIFE] == "1-abc"
    assert [r.kind for r in server.receive(hello, 0.0)] == ["params"]
    grad = Message("w0", SERVER, "grad", {"grad": np.full(P, 1.0, dtype=np.float32)}, base_version=0, seq=1)
    assert [r.kind for r in server.receive(grad, 0.0)] == ["params"]
    # the same incarnation's hello again (handed over twice): no second set of parameters, which a
    # worker blocked on its push would take for the answer and push again, and the seq filter stays
    assert server.receive(hello, 0.0) == []
    assert server.ledger.pending[-1][-1] == "duplicate: hello of incarnation 1-abc from w0 already seen"
    assert server.ledger.rejected == 1
    assert server.receive(grad, 0.0) == []  # still refused as seen
    grad.base_version = server.version
    np.testing.assert_allclose(params(service), -1.0)
    # a new incarnation is greeted, and numbers its pushes from 1 again
    assert [r.kind for r in server.receive(stamp_life([Message("w0", SERVER, HELLO)], "2-def")[0], 0.0)] == ["params"]
    assert [r.kind for r in server.receive(grad, 0.0)] == ["params"]
    np.testing.assert_allclose(params(service), -2.0)
    # the incarnations seen are part of the core's checkpointed state
    state = server.state()
    fresh, _ = make_server(workers=("w0",))
    fresh.load_state(state)
    assert fresh.receive(stamp_life([Message("w0", SERVER, HELLO)], "2-def")[0], 0.0) == []
    # a hello without a stamp (an older backend or a test) is answered every time
    assert len(server.receive(Message("w0", SERVER, HELLO), 0.0)) == 1
    assert len(server.receive(Message("w0", SERVER, HELLO), 0.0)) == 1
