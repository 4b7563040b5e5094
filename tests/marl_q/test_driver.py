"""The one driver (marl_q/driver.py): events from a transport in, the server's answers out, one restart
policy, the kill schedule; against a stub runtime and a scripted transport, so each rule is seen alone."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from marl_q.driver import (Arrived, Driver, Failed, KillSchedule, RestartPolicy, SafePoint, Started, Stepped, Tick,
                           Verdict)
from marl_q.messages import SERVER, Message


class StubRuntime:
    """What the driver calls on a Runtime, recorded in order."""

    def __init__(self, max_restarts: int = 2, duplicate: float = 0.0, kill=(), stop_after: int | None = None):
        backend = SimpleNamespace(max_restarts=max_restarts, kill=list(kill),
                                  faults=SimpleNamespace(duplicate=duplicate))
        self.cfg = SimpleNamespace(backend=backend, run=SimpleNamespace(seed=0))
        self.worker_names = ["w0", "w1"]
        self.calls: list[tuple] = []
        self.stopped = False
        self.updates = 0
        self.stop_after = stop_after
        self.ledger = SimpleNamespace(record_fault=lambda *a, **k: self.calls.append(("fault_row", a[0])),
                                      record_message_fault=lambda *a, **k: self.calls.append(("fault_row", a[0])))

    def deliver(self, msg, t):
        self.calls.append(("deliver", msg.src, msg.seq, t))
        self.updates += 1
        return [Message(SERVER, msg.src, "params", base_version=self.updates)]

    def after_delivery(self, t):
        self.calls.append(("after_delivery", t))

    def record_work(self, worker, work, t):
        self.calls.append(("work", worker, t))

    def safe_point(self, t, capture):
        self.calls.append(("safe_point", t, capture()))
        if self.stop_after is not None and self.updates >= self.stop_after:
            self.stopped = True
            return True
        return False

    def done(self):
        return self.stopped


class Script:
    """A transport that yields a list of events, one a turn, remembering what the driver asked of it."""

    def __init__(self, events, safe_points=False, kill_detail="killed"):
        self.script = list(events)
        self.safe_points = safe_points
        self.kill_detail = kill_detail
        self.log: list[tuple] = []

    def start(self, driver):
        return iter(())

    def more(self, driver):
        return bool(self.script)

    def turn(self, driver):
        yield self.script.pop(0)

    def send(self, reply, t):
        self.log.append(("send", reply.dst, reply.base_version, t))

    def capture(self):
        return {"state": len(self.log)}

    def record_fault(self, kind, name, detail):
        self.log.append(("fault", kind, name, detail))

    def restart(self, name):
        self.log.append(("restart", name))

    def kill(self, name, at_s):
        self.log.append(("kill", name, at_s))
        return self.kill_detail


def push(src: str, seq: int) -> Message:
    return Message(src, SERVER, "grad", seq=seq)


# ----------------------------------------------------------------------------- the restart policy
def test_a_worker_is_restarted_up_to_max_restarts_then_the_run_ends():
    policy = RestartPolicy(["w0", "w1"], max_restarts=2)
    assert policy.failure("w0", "died", steps=1) == Verdict(True, "died; restart 1")
    assert policy.failure("w0", "died", steps=2) == Verdict(True, "died; restart 2")
    verdict = policy.failure("w0", "died", steps=3)
    assert verdict == Verdict(False, "died; no restarts left") and verdict.kind == "worker_failed"
    assert policy.failure("w1", "died", steps=3).kind == "worker_restarted"  # counted per worker


def test_every_worker_failing_twice_with_no_step_taken_ends_the_run():
    policy = RestartPolicy(["w0", "w1"], max_restarts=5)
    kinds = [policy.failure(w, "silent", steps=0).kind for w in ("w0", "w1", "w0", "w1")]
    assert kinds == ["worker_restarted"] * 3 + ["worker_failed"]
    assert "every worker has now failed twice with no step taken by any" in policy.failure("w1", "x", 0).detail


def test_a_step_taken_between_failures_starts_the_count_again():
    policy = RestartPolicy(["w0", "w1"], max_restarts=5)
    kinds = [policy.failure(w, "silent", steps=s).kind for w, s in (("w0", 0), ("w1", 0), ("w0", 0), ("w1", 7))]
    assert kinds == ["worker_restarted"] * 4  # a step was taken before w1's second failure


# ----------------------------------------------------------------------------- the kill schedule
def test_kills_are_due_from_the_moment_every_worker_said_hello():
    cfg = StubRuntime(kill=[SimpleNamespace(at_s=2.0, worker=1), SimpleNamespace(at_s=1.0, worker=0)]).cfg
    kills = KillSchedule(cfg, ["w0", "w1"])
    assert kills.due(1e9) is None and kills.wait_s(0.0, 0.5) == 0.5  # no clock before every hello
    kills.zero = 100.0
    assert kills.wait_s(100.25, 0.5) == 0.5 and kills.wait_s(100.75, 0.5) == pytest.approx(0.25)
    assert kills.due(100.9) is None
    assert kills.due(101.0) == (1.0, "w0") and kills.due(101.0) is None and kills.due(102.0) == (2.0, "w1")
    assert kills.wait_s(200.0, 0.5) == 0.5  # nothing left


# ----------------------------------------------------------------------------- the driver
def test_messages_reach_the_server_and_answers_go_back_in_order():
    rt = StubRuntime()
    script = Script([Stepped("w0", object(), 1.0), Arrived(push("w0", 1), 1.0), Arrived(push("w1", 1), 2.0)])
    assert Driver(rt, script).run() == "completed"
    assert rt.calls == [("work", "w0", 1.0), ("deliver", "w0", 1, 1.0), ("after_delivery", 1.0),
                        ("deliver", "w1", 1, 2.0), ("after_delivery", 2.0)]
    assert script.log == [("send", "w0", 1, 1.0), ("send", "w1", 2, 2.0)]


def test_a_transport_with_safe_points_checkpoints_there_with_its_capture_and_stops_there():
    rt = StubRuntime(stop_after=1)
    script = Script([SafePoint(0.0), Arrived(push("w0", 1), 0.5), SafePoint(0.5), Arrived(push("w1", 1), 0.6)],
                    safe_points=True)
    assert Driver(rt, script).run() == "completed"
    # no checkpoint after the message (only at safe points); the second safe point stops the run
    assert rt.calls == [("safe_point", 0.0, {"state": 0}), ("deliver", "w0", 1, 0.5),
                        ("safe_point", 0.5, {"state": 1})]
    assert rt.stopped


def test_duplicates_hand_a_message_to_the_server_twice_after_their_ledger_row():
    rt = StubRuntime(duplicate=1.0)
    Driver(rt, Script([Arrived(push("w0", 3), 1.0)]), duplicate=True).run()
    assert [c[0] for c in rt.calls] == ["fault_row", "deliver", "after_delivery", "deliver", "after_delivery"]
    rt = StubRuntime(duplicate=1.0)
    Driver(rt, Script([Arrived(push("w0", 3), 1.0)])).run()  # the sim duplicates in its own network
    assert [c[0] for c in rt.calls] == ["deliver", "after_delivery"]


def test_a_failed_worker_is_restarted_through_the_transport_until_the_policy_ends_the_run():
    rt = StubRuntime(max_restarts=1)
    script = Script([Failed("w1", "exited 3"), Stepped("w0", object(), 1.0), Failed("w1", "exited 3"),
                     Arrived(push("w0", 1), 2.0)])
    assert Driver(rt, script).run() == "worker_failed"
    assert script.log == [("fault", "worker_restarted", "w1", "exited 3; restart 1"), ("restart", "w1"),
                          ("fault", "worker_failed", "w1", "exited 3; no restarts left")]
    assert ("deliver", "w0", 1, 2.0) not in rt.calls  # no turn after the run is done


def test_a_due_kill_whose_death_is_known_at_once_is_a_failure_and_one_noticed_later_is_not():
    kill = [SimpleNamespace(at_s=1.0, worker=1)]
    rt = StubRuntime(kill=kill)
    script = Script([Tick(50.0), Started(100.0), Tick(100.5), Tick(101.0), Tick(102.0)])
    assert Driver(rt, script).run() == "completed"
    assert script.log == [("kill", "w1", 1.0), ("fault", "worker_restarted", "w1", "killed; restart 1"),
                          ("restart", "w1")]
    script = Script([Started(0.0), Tick(5.0)], kill_detail=None)  # (ray: the actor's end is an event later)
    Driver(StubRuntime(kill=kill), script).run()
    assert script.log == [("kill", "w1", 1.0)]


def test_the_loop_runs_turns_until_the_transport_can_go_no_further_and_starts_with_start():
    class Two(Script):
        def start(self, driver):
            yield Arrived(push("w0", 1), 0.0)

    rt = StubRuntime()
    script = Two([Stepped("w1", object(), 1.0), Stepped("w0", object(), 2.0)])
    assert Driver(rt, script).run() == "completed" and not script.script
    assert [c[0] for c in rt.calls] == ["deliver", "after_delivery", "work", "work"]


def test_an_interrupt_ends_the_run_interrupted_whatever_else_ended_it():
    driver = Driver(StubRuntime(), Script([]))
    driver.stop("worker_failed")
    driver.stop("completed")  # the first reason to stop is kept
    assert driver.status == "worker_failed" and driver.done()
    driver.interrupt()
    assert driver.status == "interrupted"
