"""`marlq bench cluster`: the ray backend on a 3-node cluster on this machine, one worker node lost mid-run,
against a 1-node Ray run of the same config in the same bench.

The cluster is ``ray.cluster_utils.Cluster``: one raylet per node, each with its own resources, all on this
host, token authentication on (a fresh token in the environment of the bench and its runs). The head node
has no CPUs (the driver and the server actor, whose actor asks for none); the two worker nodes have
``--node-cpus`` CPUs each and the resource ``wk``. The run is a child ``marlq run`` joining the cluster by
``backend.ray.address`` with ``backend.placement: spread`` (the workers spread over the two worker nodes)
and the soak's settings (scenario, budget never reached, checkpoints; no scheduled kills).

Its clock starts when every worker actor has said where it runs (``placement.csv``). At ``--remove-at``
minutes the worker node holding the most workers is removed (``Cluster.remove_node``: its raylet and every
process on it end, as a lost machine's would); at ``--minutes`` the run gets Ctrl-C. Then the soak's checks
(marl_q/bench/soak_checks.py: applied_once, accounted, metrics_continuous) and one of its own: every worker
that was on the removed node was restarted, on the remaining worker node (placement.csv).

The 1-node run is the same config on a local Ray instance (the run starts its own, as `marlq run` does
without an address), for the same minutes, without a removal. Pushes/s are worker pushes reaching the server
(comm.csv), sampled every ``--sample-every`` seconds on each run's clock; the medians are compared.
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import sys
import time
import uuid
from pathlib import Path
from typing import Any, Optional, Sequence

import numpy as np

from marl_q.bench.soak import DEFAULT_SCENARIO, STOP_WAIT_S, LiveLedger, Session, soak_config
from marl_q.bench.soak_checks import accounted, applied_once, metrics_continuous, read_metrics_columns

START_WAIT_S = 600.0  # how long the workers may take to start on a busy machine


def cluster_main(argv: Optional[Sequence[str]] = None) -> int:
    """A 3-node Ray cluster on this machine: workers spread over 2 worker nodes, one node removed mid-run;
    the ledger checked, restarts placed, pushes/s against a 1-node Ray run."""
    p = argparse.ArgumentParser(prog="marlq bench cluster", description=cluster_main.__doc__)
    p.add_argument("--scenario", default=DEFAULT_SCENARIO, help="scenario file to run (default: %(default)s)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="config override for both runs, as for marlq run (repeatable)")
    p.add_argument("--workers", type=int, default=8)
    p.add_argument("--minutes", type=float, default=5.0, help="length of each run, from when its workers are up")
    p.add_argument("--remove-at", type=float, default=2.0, metavar="MIN",
                   help="remove a worker node at this minute of the cluster run")
    p.add_argument("--node-cpus", type=float, default=4.0,
                   help="logical CPUs of each worker node (each can hold every worker: 0.5 CPU per worker)")
    p.add_argument("--sample-every", type=float, default=5.0, metavar="S")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-single", action="store_true", help="skip the 1-node Ray run")
    p.add_argument("--out", type=Path, required=True, help="directory for both runs and cluster.json")
    p.add_argument("--json", action="store_true", help="print the results as JSON")
    args = p.parse_args(argv)
    from marl_q.errors import ConfigError

    if args.workers < 2:
        raise ConfigError(f"--workers: must be >= 2 (spread over two nodes), got {args.workers}")
    for option, value in (("--minutes", args.minutes), ("--sample-every", args.sample_every),
                          ("--node-cpus", args.node_cpus)):
        if not value > 0:
            raise ConfigError(f"{option}: must be > 0, got {value:g}")
    if not 0 < args.remove_at < args.minutes:
        raise ConfigError(f"--remove-at: must be inside (0, --minutes={args.minutes:g}), got {args.remove_at:g}")
    if args.workers * CPU_PER_WORKER > args.node_cpus:
        raise ConfigError(f"--node-cpus: {args.node_cpus:g} cannot hold all {args.workers} workers "
                          f"({CPU_PER_WORKER} CPU each) once a node is lost; give at least "
                          f"{args.workers * CPU_PER_WORKER:g}")
    if not Path(args.scenario).is_file():
        raise ConfigError(f"--scenario: {args.scenario}: no such file")
    if args.out.exists() and any(args.out.iterdir()):
        raise ConfigError(f"--out {args.out}: exists and is not empty")
    args.out.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ["RAY_AUTH_MODE"] = "token"  # the cluster, the runs and their probes: one fresh token
    os.environ["RAY_AUTH_TOKEN"] = uuid.uuid4().hex + uuid.uuid4().hex
    os.environ.pop("RAY_AUTH_TOKEN_PATH", None)
    result: dict[str, Any] = {"args": {k: str(v) for k, v in vars(args).items()},
                              "uptime_before": _uptime()}
    result["cluster"] = ClusterRun(args).run()
    if not args.no_single:
        result["single"] = run_single(args)
    result["uptime_after"] = _uptime()
    c, s = result["cluster"], result.get("single")
    if s and s.get("pushes_per_s_median") and c.get("pushes_per_s_median") is not None:
        result["ratio_cluster_to_single"] = c["pushes_per_s_median"] / s["pushes_per_s_median"]
    result["pass"] = c["pass"]
    (args.out / "cluster.json").write_text(json.dumps(result, indent=1))
    if args.json:
        print(json.dumps(result))
    else:
        print_result(result)
    return 0 if result["pass"] else 1


CPU_PER_WORKER = 0.5


def start_cluster(head: dict[str, Any], nodes: list[dict[str, Any]], attempts: int = 3) -> tuple[Any, list[Any]]:
    """A ``ray.cluster_utils.Cluster``: a head with ``head``'s arguments, then a node for each of ``nodes``.

    Ray gives each raylet 30 s to register (fixed in its code); on a loaded machine that can pass, so a start
    that times out is shut down and tried again, ``attempts`` times in all."""
    from ray.cluster_utils import Cluster

    for attempt in range(1, attempts + 1):
        cluster = Cluster(shutdown_at_exit=True)
        try:
            cluster.add_node(**head)
            return cluster, [cluster.add_node(**n) for n in nodes]
        except Exception as exc:  # Ray raises a bare Exception for a raylet that did not register in time
            cluster.shutdown()  # the nodes that did start (a head that did not is ended by Ray's reaper at exit)
            if attempt == attempts or "timed out during startup" not in str(exc):
                raise
            print(f"marlq: a Ray node did not start in time ({exc}); starting the cluster again", file=sys.stderr)
    raise AssertionError("unreachable")


def run_config(args: argparse.Namespace, address: Optional[str]) -> dict[str, Any]:
    raw = soak_config(args.scenario, args.overrides, "ray", args.workers, args.minutes, 0.0, args.seed)
    b = raw["backend"]
    b["ray"].update({"num_cpus_per_worker": CPU_PER_WORKER, "connect_timeout_s": 120.0})
    if address is not None:
        b["ray"]["address"] = address
        b.update({"placement": "spread", "server_placement": "head"})
    b["max_restarts"] = max(b.get("max_restarts", 3), 3)
    return raw


def _uptime() -> str:
    try:
        return Path("/proc/loadavg").read_text().strip()
    except OSError:
        return "unknown"


def read_placement(run_dir: Path) -> list[dict[str, str]]:
    """The rows of a run's placement.csv (the node each actor ran on) that name a node."""
    path = run_dir / "placement.csv"
    if not path.is_file():
        return []
    with open(path, newline="") as fh:
        return [r for r in csv.DictReader(fh) if r.get("node")]


class Sampler:
    """pushes/s from comm.csv as it grows, every ``every_s`` seconds of the run's clock."""

    def __init__(self, run_dir: Path, every_s: float) -> None:
        self.live = LiveLedger(run_dir / "comm.csv")
        self.every_s = every_s
        self.samples: list[dict[str, float]] = []
        self.next_s = 0.0

    def poll(self, t_s: float) -> None:
        if t_s < self.next_s:
            return
        self.next_s = t_s + self.every_s
        self.live.poll()
        prev = self.samples[-1] if self.samples else None
        rate = float("nan") if prev is None else (self.live.pushes - prev["pushes"]) / (t_s - prev["t_s"])
        self.samples.append({"t_s": t_s, "pushes": self.live.pushes, "pushes_per_s": rate})

    def median(self, lo: float = -1.0, hi: float = float("inf")) -> Optional[float]:
        rates = np.array([s["pushes_per_s"] for s in self.samples if lo < s["t_s"] <= hi], dtype=float)
        rates = rates[np.isfinite(rates)]
        return float(np.median(rates)) if len(rates) else None


def drive(session: Session, run_dir: Path, args: argparse.Namespace, workers: int,
          at: Optional[tuple[float, Any]] = None) -> tuple[Sampler, dict[str, Any]]:
    """Wait until every worker is placed, sample for --minutes (calling ``at[1]()`` at minute ``at[0]``),
    then Ctrl-C; returns the sampler and what happened (times on the run's clock)."""
    events: dict[str, Any] = {}
    t_launch = time.perf_counter()
    while len({r["worker"] for r in read_placement(run_dir) if r["worker"] != "server"}) < workers:
        if session.proc.poll() is not None:
            raise RuntimeError(f"the run ended before its workers started (exit {session.proc.returncode}); "
                               f"see {run_dir.parent / 'console.log'}")
        if time.perf_counter() - t_launch > START_WAIT_S:
            session.kill_all()
            raise RuntimeError(f"the workers did not all start within {START_WAIT_S:g} s")
        time.sleep(0.5)
    events["start_s"] = time.perf_counter() - t_launch
    t0 = time.perf_counter()
    sampler = Sampler(run_dir, args.sample_every)
    while (t := time.perf_counter() - t0) < args.minutes * 60.0:
        if session.proc.poll() is not None:
            events["ended_early_s"] = t
            break
        if at is not None and "removed_s" not in events and t >= at[0] * 60.0:
            events["removed_s"] = t
            events["removed"] = at[1]()
        sampler.poll(t)
        time.sleep(0.2)
    sampler.poll(time.perf_counter() - t0 + args.sample_every)  # the last stretch
    events["exit_code"] = session.interrupt(STOP_WAIT_S) if session.proc.poll() is None else session.proc.returncode
    return sampler, events


def checks_of(run_dir: Path) -> tuple[list[dict[str, Any]], Optional[dict[str, Any]]]:
    from marl_q.ledger import ledger_audit

    path = run_dir / "summary.json"
    if not path.is_file():
        return [{"name": "summary", "ok": False, "detail": "the run wrote no summary.json"}], None
    summary = json.loads(path.read_text())
    audit = ledger_audit(run_dir)
    checks = [applied_once(int(summary["updates"]), audit).to_dict(), accounted(audit).to_dict(),
              metrics_continuous(*read_metrics_columns(run_dir / "metrics.csv")).to_dict()]
    return checks, summary


class ClusterRun:
    """The 3-node cluster, the run on it, the removal, the checks."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.dir = args.out / "cluster"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.run_dir = self.dir / "run"

    def run(self) -> dict[str, Any]:
        from marl_q.config import build_config

        a = self.args
        t = time.perf_counter()
        cluster, nodes = start_cluster({"num_cpus": 0, "include_dashboard": False},
                                       [{"num_cpus": a.node_cpus, "resources": {"wk": 1}}] * 2)
        started_s = time.perf_counter() - t
        try:
            raw = run_config(a, cluster.address)
            cfg_path = self.dir / "config.yaml"
            cfg_path.write_text(build_config(raw).to_yaml())
            session = Session([sys.executable, "-m", "marl_q.cli", "run", str(cfg_path), "--out", str(self.run_dir),
                               "--quiet"], self.dir / "console.log", "ray")
            ids = {n.node_id: n for n in nodes}
            removed: dict[str, Any] = {}

            def remove() -> str:
                on = {}
                for r in read_placement(self.run_dir):
                    if r["worker"] != "server" and r["life"] == "0":
                        on[r["node"]] = on.get(r["node"], 0) + 1
                victim = max((n for n in ids if n in on), key=lambda n: on[n])
                cluster.remove_node(ids[victim])
                removed["node"] = victim
                return victim

            sampler, events = drive(session, self.run_dir, a, a.workers, (a.remove_at, remove))
        finally:
            cluster.shutdown()
        checks, summary = checks_of(self.run_dir)
        checks.append(self.restarts_placed(removed.get("node"), [n.node_id for n in nodes]))
        rem = events.get("removed_s")
        return {
            "backend": "ray, 3-node cluster", "cluster_start_s": started_s, "events": events,
            "samples": sampler.samples, "checks": checks, "run_dir": str(self.run_dir),
            "pushes_per_s_median": sampler.median(),
            "pushes_per_s_before_removal": sampler.median(hi=rem) if rem else None,
            "pushes_per_s_after_removal": sampler.median(lo=rem + 30.0) if rem else None,  # past the restarts
            "summary": {k: summary.get(k) for k in ("status", "env_steps", "episodes", "updates", "messages",
                                                    "rejected", "dropped_stale", "faults")} if summary else None,
            "pass": all(c["ok"] for c in checks),
        }

    def restarts_placed(self, victim: Optional[str], node_ids: list[str]) -> dict[str, Any]:
        """Every worker that was on the removed node got a new life, on the remaining worker node."""
        rows = read_placement(self.run_dir)
        if victim is None:
            return {"name": "restarts_placed", "ok": False, "detail": "no node was removed"}
        remaining = [n for n in node_ids if n != victim]
        first = {r["worker"]: r["node"] for r in rows if r["life"] == "0" and r["worker"] != "server"}
        lost = sorted(w for w, n in first.items() if n == victim)
        later = {w: [r["node"] for r in rows if r["worker"] == w and r["life"] != "0"] for w in lost}
        bad = [w for w in lost if not later[w] or any(n not in remaining for n in later[w])]
        spread = sorted(set(first.values()))
        detail = (f"{len(first)} workers over {len(spread)} nodes at the start ({', '.join(f'{n[:8]}: ' + str(sum(1 for v in first.values() if v == n)) for n in spread)}); "
                  f"{len(lost)} on the removed node {victim[:8]}, restarted on {sorted({n[:8] for w in lost for n in later[w]})}")
        if bad:
            detail += f"; not restarted on the remaining node: {bad}"
        return {"name": "restarts_placed", "ok": not bad and len(lost) > 0, "detail": detail}


def run_single(args: argparse.Namespace) -> dict[str, Any]:
    """The same config on a 1-node local Ray instance the run starts itself, for the same minutes."""
    from marl_q.config import build_config

    d = args.out / "single"
    d.mkdir(parents=True, exist_ok=True)
    run_dir = d / "run"
    cfg_path = d / "config.yaml"
    cfg_path.write_text(build_config(run_config(args, None)).to_yaml())
    session = Session([sys.executable, "-m", "marl_q.cli", "run", str(cfg_path), "--out", str(run_dir), "--quiet"],
                      d / "console.log", "ray")
    sampler, events = drive(session, run_dir, args, args.workers)
    checks, summary = checks_of(run_dir)
    return {"backend": "ray, 1 node (local instance)", "events": events, "samples": sampler.samples,
            "checks": checks, "run_dir": str(run_dir), "pushes_per_s_median": sampler.median(),
            "pass": all(c["ok"] for c in checks),
            "summary": {k: summary.get(k) for k in ("status", "env_steps", "episodes", "updates")} if summary else None}


def print_result(r: dict[str, Any]) -> None:
    a = r["args"]
    print(f"\nmarlq bench cluster: {a['workers']} workers of {a['scenario']}, {a['minutes']} min per run; "
          f"load average before: {r['uptime_before']}, after: {r['uptime_after']}")
    for key in ("cluster", "single"):
        run = r.get(key)
        if run is None:
            continue
        ev = run["events"]
        print(f"\n{run['backend']}: workers up after {ev['start_s']:.0f} s"
              + (f"; worker node {ev['removed'][:8]} removed at {ev['removed_s']:.0f} s" if ev.get("removed") else "")
              + f"; exit {ev['exit_code']}")
        for c in run["checks"]:
            print(f"  {'PASS' if c['ok'] else 'FAIL'}  {c['name']}: {c['detail']}")
        med = run["pushes_per_s_median"]
        line = f"  pushes/s: median {'n/a' if med is None else format(med, ',.1f')}"
        if run.get("pushes_per_s_before_removal") is not None:
            after = run.get("pushes_per_s_after_removal")
            line += (f" (before the removal {run['pushes_per_s_before_removal']:,.1f}, from 30 s after it "
                     f"{'n/a' if after is None else format(after, ',.1f')})")
        print(line)
        s = run.get("summary") or {}
        print(f"  {s.get('env_steps')} env steps, {s.get('updates')} updates, status {s.get('status')}")
    if "ratio_cluster_to_single" in r:
        print(f"\ncluster / 1-node pushes/s (medians, same bench): {r['ratio_cluster_to_single']:.2f}")
    print(f"verdict: {'PASS' if r['pass'] else 'FAIL'}")


BENCHES = {"cluster": cluster_main}  # marlq bench cluster
