"""The ray backend on a cluster of several nodes on this machine (``ray.cluster_utils.Cluster``: one raylet per
node, each with its own resources; ``remove_node`` takes one away as a lost machine would be).

One cluster for the module, three raylets (Ray starts slowly on a busy 2-core machine): the head (the driver's
node, one CPU), node "wk" (one CPU) and node "srv" (no CPUs, resource ``srv``: the server's node). One run loses
"wk" and then "srv", and is resumed on the head alone: every start of Ray actors costs tens of seconds here, so
the node-loss cases share one run. The cluster requires a token (RAY_AUTH_MODE=token), so a join without it can
be tested: a driver's (`marlq run`) and a whole node's (`ray start --address`, and the RPCs a raylet makes). Nothing here asserts a wall-clock time: the tests wait on conditions.
"""
from __future__ import annotations

import os
import threading
import time
import uuid
from pathlib import Path

import pytest

ray = pytest.importorskip("ray", reason="needs the optional extra [ray] (Ray is not installed): pip install -e .[ray]")

from marl_q.backends.ray_backend import Placer  # noqa: E402
from marl_q.bench.cluster import read_placement  # noqa: E402
from marl_q.bench.soak_checks import (accounted, applied_once, metrics_continuous,  # noqa: E402
                                      read_metrics_columns)
from marl_q.cli import main  # noqa: E402
from marl_q.config import build_config  # noqa: E402
from marl_q.errors import ConfigError  # noqa: E402
from marl_q.ledger import ledger_audit  # noqa: E402

WORKER_PORTS = (29100, 29199)  # every node's worker port range: what a cluster may bind beyond its fixed ports
WAIT_S = 480.0  # generous: conditions, not durations, are what the tests check (a worker restarted on
# another node imports torch in a new Ray worker process: at load 10-17 the restart and two checkpoints after it
# took longer than 240 s once; the suite's per-test limit is 900 s)


@pytest.fixture(scope="module")
def cluster():
    """Head + "wk" + "srv", token authentication on; the test process is connected to it as the driver."""
    from marl_q.bench.cluster import start_cluster

    saved = {k: os.environ.get(k) for k in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH",
                                            "RAY_USAGE_STATS_ENABLED")}
    os.environ.update({"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": uuid.uuid4().hex + uuid.uuid4().hex,
                       "RAY_USAGE_STATS_ENABLED": "0"})
    os.environ.pop("RAY_AUTH_TOKEN_PATH", None)
    _reset_auth()
    ports = {"min_worker_port": WORKER_PORTS[0], "max_worker_port": WORKER_PORTS[1]}
    c, added = start_cluster({"num_cpus": 1, "include_dashboard": False, **ports},
                             [{"num_cpus": 1, "resources": {"wk": 1}, **ports},
                              {"num_cpus": 0, "resources": {"srv": 1}, **ports}])
    nodes = dict(zip(("wk", "srv"), added))
    ray.init(address=c.address, log_to_driver=False, logging_level="ERROR")
    c.named = nodes
    c.head_id = ray.get_runtime_context().get_node_id()
    try:
        yield c
    finally:
        ray.shutdown()
        c.shutdown()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        _reset_auth()


def _reset_auth() -> None:
    """Ray caches the token mode and token per process: make it read the environment again."""
    try:
        from ray._private.authentication_test_utils import reset_auth_token_state
    except ImportError:  # a Ray without token authentication
        return
    reset_auth_token_state()


def _raw(small_raw: dict, **backend) -> dict:
    small_raw["backend"].update({"name": "ray", "workers": 2, "ray": {"num_cpus_per_worker": 0.5}, **backend})
    small_raw["server"]["aggregation"] = "sync"  # every round needs every worker: none can be lost unnoticed
    return small_raw


def _when(condition, action, box: dict, on_timeout=lambda: "timed out") -> threading.Thread:
    """Run ``action`` in a thread once ``condition()`` holds (checked every 0.2 s, for WAIT_S at most); after
    that, ``on_timeout`` (which must end what the test waits for, so that a missed condition fails the test
    rather than hanging it)."""
    def go() -> None:
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline:
            if condition():
                box["result"] = action()
                return
            time.sleep(0.2)
        box["result"] = on_timeout()

    thread = threading.Thread(target=go, daemon=True)
    thread.start()
    return thread


def _audit_passes(run_dir: Path, updates: int, sync_workers: int = 0) -> None:
    """The soak's ledger audit (marl_q/bench/soak_checks.py). Under ``sync`` an update takes one push of each
    of ``sync_workers`` workers, so applied_once's count is per round: distinct accepted keys = workers x
    updates, plus a round cut short at the end and a lost worker's push that its restart replaced."""
    audit = ledger_audit(run_dir)
    if sync_workers:
        assert not audit.repeated_keys, audit.repeated_keys[:5]
        assert 0 <= audit.distinct_accepted - sync_workers * updates <= sync_workers, (audit.distinct_accepted, updates)
        checks = []
    else:
        checks = [applied_once(updates, audit)]
    for check in checks + [accounted(audit), metrics_continuous(*read_metrics_columns(run_dir / "metrics.csv"))]:
        assert check.ok, f"{check.name}: {check.detail}"


# ----------------------------------------------------------------------------- placement, without a cluster
class _FakeRay:
    def __init__(self, nodes: dict[str, dict[str, float]]) -> None:
        self._nodes = nodes

    def nodes(self) -> list[dict]:
        return [{"NodeID": k, "Alive": True, "Resources": v} for k, v in self._nodes.items()]


def _placer(small_raw: dict, placement: str, nodes: dict[str, dict[str, float]], workers: int) -> list[str]:
    raw = _raw(small_raw, placement=placement, workers=workers)
    placer = Placer(_FakeRay({k * 56: v for k, v in nodes.items()}), build_config(raw))  # ids: 56 hex digits
    return [placer.strategy(f"w{i}").node_id[0] for i in range(workers)]


def test_spread_pack_and_a_label_choose_nodes_as_documented(small_raw):
    import copy

    nodes = {"a": {"CPU": 0.0}, "b": {"CPU": 2.0, "gpu_box": 1.0}, "c": {"CPU": 2.0}}
    # spread: fewest of this run's workers first (ties in node order); a node without CPUs never
    assert _placer(copy.deepcopy(small_raw), "spread", nodes, 4) == ["b", "c", "b", "c"]
    # pack: the first node until it is full (2 CPUs at 0.5 each: 4 workers), then the next
    assert _placer(copy.deepcopy(small_raw), "pack", nodes, 5) == ["b", "b", "b", "b", "c"]
    # a label: only the nodes that have it
    assert _placer(copy.deepcopy(small_raw), "gpu_box", nodes, 3) == ["b", "b", "b"]


def test_placement_keys_are_validated(small_raw):
    import copy

    for backend, message in (({"name": "local", "placement": "spread"}, "backend.placement: 'spread'"),
                             ({"name": "ray", "placement": "CPU"}, "backend.placement: expected"),
                             ({"name": "ray", "server_placement": "two words"}, "backend.server_placement: expected"),
                             ({"name": "sim", "server_placement": "srv"}, "backend.server_placement: a resource")):
        raw = copy.deepcopy(small_raw)
        raw["backend"].update(backend)
        with pytest.raises(ConfigError, match=message):
            build_config(raw)


def test_a_label_no_node_has_is_refused_at_the_start(small_raw):
    import copy

    from marl_q.backends.ray_backend import check_resources

    class Resources:
        def cluster_resources(self) -> dict[str, float]:
            return {"CPU": 4.0, "wk": 2.0}

    check_resources(Resources(), build_config(_raw(copy.deepcopy(small_raw), placement="wk")))  # it exists: fine
    for key, value in (("placement", "gpu_box"), ("server_placement", "srv")):
        with pytest.raises(ConfigError, match=f"backend.{key}: no node of the cluster has the resource '{value}'"):
            check_resources(Resources(), build_config(_raw(copy.deepcopy(small_raw), **{key: value})))


# ----------------------------------------------------------------------------- on the cluster
def _rpc(method, request, token: str | None) -> str:
    """A gRPC call to a Ray server as a client would make it, with ``token`` as the bearer token (or none):
    "OK" or the status code's name."""
    import grpc

    metadata = (("authorization", "Bearer " + token),) if token is not None else ()
    try:
        method(request, metadata=metadata, timeout=30)
    except grpc.RpcError as exc:
        return exc.code().name
    return "OK"


def test_a_node_without_the_clusters_token_cannot_join_or_talk_to_a_raylet(cluster):
    """A whole node (a raylet), not a driver: `ray start --address` without the token ends with Ray's
    authentication error and the cluster keeps its three nodes; the RPC a joining raylet makes first
    (RegisterNode at the GCS) and every raylet's node-manager service refuse a caller without the token
    or with another one (UNAUTHENTICATED) and answer one with it (the control). Not reachable from here:
    the object manager's service (Ray ships no Python stub for it) and the per-node agents' ports; what
    Ray's token authentication covers there is Ray's word (docs/runtime.md, "Security")."""
    import subprocess
    import sys

    import grpc
    import psutil
    from ray.core.generated import gcs_pb2, gcs_service_pb2, gcs_service_pb2_grpc, node_manager_pb2, node_manager_pb2_grpc

    token, other = os.environ["RAY_AUTH_TOKEN"], uuid.uuid4().hex + uuid.uuid4().hex
    alive = [n for n in ray.nodes() if n["Alive"]]  # all three, unless a test that removes nodes ran first
    before = {n["NodeID"] for n in alive}
    assert cluster.head_id in before
    gcs = gcs_service_pb2_grpc.NodeInfoGcsServiceStub(grpc.insecure_channel(cluster.address))
    stranger = gcs_pb2.GcsNodeInfo(node_id=os.urandom(28), node_manager_address="127.0.0.1", node_manager_port=1)
    for tok in (None, other):
        assert _rpc(gcs.RegisterNode, gcs_service_pb2.RegisterNodeRequest(node_info=stranger), tok) == "UNAUTHENTICATED"
        assert _rpc(gcs.GetAllNodeInfo, gcs_service_pb2.GetAllNodeInfoRequest(), tok) == "UNAUTHENTICATED"
    assert _rpc(gcs.GetAllNodeInfo, gcs_service_pb2.GetAllNodeInfoRequest(), token) == "OK"
    for n in alive:
        raylet = node_manager_pb2_grpc.NodeManagerServiceStub(
            grpc.insecure_channel(f"{n['NodeManagerAddress']}:{n['NodeManagerPort']}"))
        stats = node_manager_pb2.GetNodeStatsRequest()
        assert [_rpc(raylet.GetNodeStats, stats, tok) for tok in (None, other, token)] == \
            ["UNAUTHENTICATED", "UNAUTHENTICATED", "OK"], n["NodeID"]

    label = "intruder_" + uuid.uuid4().hex[:8]
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH")}
    env["RAY_gcs_server_port_wait_time_s"] = "1"  # one connection attempt, not Ray's twenty
    try:
        done = subprocess.run([sys.executable, "-m", "ray.scripts.scripts", "start", "--address", cluster.address,
                               "--num-cpus=1", f"--resources={{\"{label}\": 1}}", "--disable-usage-stats"],
                              env=env, capture_output=True, text=True, timeout=WAIT_S)
        assert done.returncode != 0 and "Authentication token is missing or incorrect" in done.stderr, done.stderr[-2000:]
        assert {n["NodeID"] for n in ray.nodes() if n["Alive"]} == before
        assert not any(label in n["Resources"] for n in ray.nodes())
    finally:  # had it joined, its processes must not outlive the test (ended by pid: only those it started)
        for proc in psutil.process_iter(["cmdline"]):
            if label in " ".join(proc.info["cmdline"] or []):
                proc.kill()


def test_lost_nodes_a_worker_node_then_the_server_node_and_the_resume(cluster, small_raw, tmp_path, capsys):
    """One run (Ray's start-up is the slow part): workers spread over the head and "wk", the server on "srv".

    1. "wk" is removed as soon as a worker runs there: that worker is restarted on the head (the other node
       with CPUs), under ``sync``, so the run cannot go on without it;
    2. once two checkpoints were written after that restart, "srv" is removed: the run ends with exit 1 and one
       line naming the last good checkpoint;
    3. `marlq resume` on the nodes that remain (the server on the driver's node) continues from that very
       checkpoint, and the ledger audit of `marlq bench soak` passes over both sessions."""
    import json

    import yaml

    from marl_q.bench.soak_checks import checkpoint_facts, file_sha256, first_row_at, resumed_from_checkpoint
    from marl_q.rundir import checkpoint_updates, checkpoints, latest_checkpoint

    def _updates(path) -> int:
        return -1 if path is None else checkpoint_updates(path)

    raw = _raw(small_raw, placement="spread", server_placement="srv", max_restarts=2)
    raw["run"].update({"total_env_steps": 10_000_000, "checkpoint_every": 5})  # ends only by losing its server
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump(raw))
    out = tmp_path / "r"
    wk, srv, head = cluster.named["wk"].node_id, cluster.named["srv"].node_id, cluster.head_id
    state: dict = {}

    def step() -> bool:
        """Called every 0.2 s from a thread: removes "wk", then "srv", each when its moment has come."""
        rows = read_placement(out)
        if "wk" not in state:
            if any(r["node"] == wk for r in rows):
                cluster.remove_node(cluster.named["wk"])
                state["wk"] = True
            return False
        if "restarted" not in state:
            if any(r["life"] != "0" and r["worker"] != "server" for r in rows):
                state["restarted"] = _updates(latest_checkpoint(out))
            return False
        # two checkpoints written after the restart, told by their update counts (the run keeps only the last
        # few files, so their number stops growing: counting files never got there when one already existed)
        if sum(_updates(p) > state["restarted"] for p in checkpoints(out)) >= 2:
            cluster.remove_node(cluster.named["srv"])
            return True
        return False

    def give_up() -> str:
        """The moment never came within WAIT_S: take the server's node away so that the run ends now (the
        assertion below then fails and says where it stood) instead of running its 10M steps."""
        if cluster.named["srv"] in cluster.worker_nodes:
            cluster.remove_node(cluster.named["srv"])
        return "timed out"

    box: dict = {}
    thread = _when(step, lambda: "removed both", box, on_timeout=give_up)
    code = main(["run", str(cfg), "--out", str(out), "--quiet"])
    thread.join()
    err = capsys.readouterr().err
    assert box.get("result") == "removed both", (box, state, err)
    rows = read_placement(out)
    assert [r["node"] for r in rows if r["worker"] == "server"] == [srv]
    first = {r["worker"]: r["node"] for r in rows if r["life"] == "0" and r["worker"] != "server"}
    assert sorted(first.values()) == sorted([head, wk])  # spread: one worker per node with CPUs
    lost = next(w for w, n in first.items() if n == wk)
    assert {r["node"] for r in rows if r["worker"] == lost and r["life"] != "0"} == {head}
    assert f"marlq: worker_restarted {lost}: actor died: its node {wk[:12]} was lost; restart 1" in err
    # the server's loss: one line, the checkpoint named, exit 1
    lines = [line for line in err.strip().splitlines() if line.startswith("marlq: error")]
    last = latest_checkpoint(out)
    assert code == 1 and len(lines) == 1, err
    assert "server actor was lost" in lines[0] and str(last) in lines[0] and f"marlq resume {out}" in lines[0]
    before = checkpoint_facts(last)
    sha = file_sha256(last)
    budget = before["env_steps"] + 400
    code = main(["resume", str(out), "--quiet", "--set", "backend.server_placement=driver",
                 "--set", f"run.total_env_steps={budget}"])
    assert code == 0, capsys.readouterr().err
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["env_steps"] >= budget
    check = resumed_from_checkpoint(before, sha, summary["resumes"][-1],
                                    first_row_at(out / "comm.csv", before["comm_position"]),
                                    first_row_at(out / "metrics.csv", before["metrics_position"]))
    assert check.ok, check.detail
    audit = ledger_audit(out)
    # the worker moved off the lost node pushed before the checkpoint (every sync round needs it) and after
    assert audit.workers[lost]["accepted"] > 0 and audit.lives[lost] >= 2
    _audit_passes(out, summary["updates"], sync_workers=2)
    assert {r["node"] for r in read_placement(out) if r["worker"] == "server"} == {srv, head}


def test_listening_ports_are_the_documented_ones(cluster):
    """Every TCP port the cluster's processes listen on: the GCS port, each node's node-manager,
    object-manager, runtime-env-agent, metrics and dashboard-agent ports as Ray reports them, or a worker
    port in the nodes' --min/max-worker-port range (docs/runtime.md lists them). marl-q itself opens none."""
    import psutil

    from ray._private.services import parse_address as ray_parse

    allowed = {int(ray_parse(cluster.address)[1])}
    for n in ray.nodes():
        for key in ("NodeManagerPort", "ObjectManagerPort", "RuntimeEnvAgentPort", "MetricsExportPort",
                    "DashboardAgentListenPort", "DashboardAgentGrpcPort"):
            if n.get(key, -1) and n.get(key, -1) > 0:
                allowed.add(int(n[key]))
    roots = {p.pid for p in psutil.process_iter(["cmdline"])
             if any(s in " ".join(p.info["cmdline"] or []) for s in ("gcs_server", "raylet"))
             and cluster.head_node.get_session_dir_path() in " ".join(p.info["cmdline"] or [])}
    pids = {os.getpid()}
    for pid in roots:
        proc = psutil.Process(pid)
        pids |= {pid} | {c.pid for c in proc.children(recursive=True)}
    listening = {(c.pid, c.laddr.port) for c in psutil.net_connections("tcp") if c.status == "LISTEN" and c.pid in pids}
    assert roots and listening
    extra = sorted((pid, port) for pid, port in listening
                   if port not in allowed and not WORKER_PORTS[0] <= port <= WORKER_PORTS[1])
    assert not extra, [(pid, port, psutil.Process(pid).name()) for pid, port in extra]


def test_a_join_without_the_clusters_token_is_refused(cluster, small_raw, tmp_path, monkeypatch, capsys):
    """`marlq run` against the cluster with a wrong token: exit 2, one line saying a token is wanted, nothing run."""
    import yaml

    raw = _raw(small_raw, ray={"num_cpus_per_worker": 0.5, "address": cluster.address, "connect_timeout_s": 60})
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump(raw))
    monkeypatch.setenv("RAY_AUTH_TOKEN", "not-the-token-" + uuid.uuid4().hex)
    code = main(["run", str(cfg), "--out", str(tmp_path / "r"), "--quiet"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert "backend.ray.address" in err and "token" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "r" / "metrics.csv").exists()

