"""`marlq bench soak`: N workers for M minutes on local and/or ray, with faults, and the ledger checked after.

The run is a child process (`marlq run`, then `marlq resume`), so that it can be killed whole:
- every ``--kill-every`` seconds a random worker is killed (``backend.kill``: SIGKILL on local, ``ray.kill``
  on ray; the clock of a session starts when all its workers have said hello);
- at ``--process-kill-at`` minutes the run process and everything it started get SIGKILL; the soak then runs
  `marlq resume` on the run directory, which continues from the latest checkpoint;
- at ``--minutes`` the run gets SIGINT (Ctrl-C: a checkpoint and summary.json are written).

Every ``--sample-every`` seconds it records (samples.csv): the server's RSS (local: the run process; ray:
the ``ray::ServerHost`` actor's process), pushes/s, restarts, and per worker sent / accepted / rejected /
dropped-stale (read from comm.csv as it grows). At the end it checks the invariants of
marl_q/bench/soak_checks.py, fits the RSS slope over the last 2/3 of the soak and prints a verdict; with
``--plot`` it draws RSS and pushes/s over time.
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Optional, Sequence

import numpy as np

from marl_q.bench.runs import parse_backends
from marl_q.bench.soak_checks import (accounted, applied_once, checkpoint_facts, file_sha256, first_row_at,
                                      metrics_continuous, read_metrics_columns, resumed_from_checkpoint, rss_slope)
from marl_q.rundir import latest_checkpoint
from marl_q.ledger import LedgerAuditor
from marl_q.messages import HELLO, SERVER

DEFAULT_SCENARIO = "scenarios/cartpole_a3c.yaml"
WARMUP_S = 60.0  # a server process's first minute (imports, first allocations) is left out of the RSS slope
STOP_WAIT_S = 180.0  # how long the run may take to end after SIGINT
GRACE_S = 300.0  # how long past --minutes the soak waits for the process kill's checkpoint and the resume's first push


def soak_main(argv: Optional[Sequence[str]] = None) -> int:
    """Soak: N workers for M minutes with worker kills and a whole-process kill + resume; ledger invariants,
    server memory and throughput over time."""
    p = argparse.ArgumentParser(prog="marlq bench soak", description=soak_main.__doc__)
    p.add_argument("--backend", default="local", help="local, ray or both comma-separated (run in turn)")
    p.add_argument("--scenario", default=DEFAULT_SCENARIO, help="scenario file to run (default: %(default)s)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="config override for the run, as for marlq run (repeatable)")
    p.add_argument("--workers", type=int, default=8)
    p.add_argument("--minutes", type=float, default=30.0, help="length of the soak (wall clock, both sessions)")
    p.add_argument("--kill-every", type=float, default=30.0, metavar="S",
                   help="kill a random worker every S seconds of each session; 0 = never")
    p.add_argument("--process-kill-at", type=float, default=None, metavar="MIN",
                   help="SIGKILL the whole run at this minute and resume it (default: half way); -1 = never")
    p.add_argument("--sample-every", type=float, default=5.0, metavar="S")
    p.add_argument("--seed", type=int, default=0, help="run.seed, and which worker each kill hits")
    p.add_argument("--out", type=Path, required=True, help="directory for the run, samples.csv and soak.json")
    p.add_argument("--plot", type=Path, default=None, help="draw RSS and pushes/s over time to this PNG "
                                                           "(with several backends: one file each, NAME-backend.png)")
    p.add_argument("--json", action="store_true", help="print the results as JSON")
    args = p.parse_args(argv)
    from marl_q.errors import ConfigError

    backends = parse_backends(args.backend)
    if "sim" in backends:
        raise ConfigError("--backend: a soak runs local or ray (sim has no processes to kill)")
    if args.workers < 1:
        raise ConfigError(f"--workers: must be >= 1, got {args.workers}")
    for option, value in (("--minutes", args.minutes), ("--sample-every", args.sample_every)):
        if not value > 0:
            raise ConfigError(f"{option}: must be > 0, got {value:g}")
    if args.kill_every < 0:
        raise ConfigError(f"--kill-every: must be >= 0 (0: no worker kills), got {args.kill_every:g}")
    kill_at = args.minutes / 2 if args.process_kill_at is None else args.process_kill_at
    if kill_at != -1 and not 0 < kill_at < args.minutes:
        raise ConfigError(f"--process-kill-at: must be inside (0, --minutes={args.minutes:g}) or -1, got {kill_at}")
    if not Path(args.scenario).is_file():
        raise ConfigError(f"--scenario: {args.scenario}: no such file")
    if args.out.exists() and any(args.out.iterdir()):
        raise ConfigError(f"--out {args.out}: exists and is not empty")
    results = []
    for backend in backends:
        soak = Soak(args, backend, None if kill_at == -1 else kill_at * 60.0)
        try:
            result = soak.run()
        except KeyboardInterrupt:
            if soak.session is not None:
                soak.session.kill_all()
            print(f"marlq: soak interrupted; the run so far is in {soak.dir}", file=sys.stderr)
            return 130
        if args.plot is not None:
            path = args.plot if len(backends) == 1 else args.plot.with_name(f"{args.plot.stem}-{backend}.png")
            plot_soak(result, soak.samples, path)
            result["plot"] = str(path)
        (soak.dir / "soak.json").write_text(json.dumps(result, indent=1))
        results.append(result)
    if args.json:
        print(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "results": results}))
    else:
        for r in results:
            print_verdict(r)
    return 0 if all(r["pass"] for r in results) else 1


def kill_list(workers: int, minutes: float, every_s: float, seed: int) -> list[dict[str, Any]]:
    """``backend.kill`` entries: a random worker every ``every_s`` seconds up to ``minutes`` (each session
    of the run starts this clock again, so the list covers the whole soak)."""
    if every_s <= 0:
        return []
    rng = np.random.default_rng([seed, 18])
    times = np.arange(every_s, minutes * 60.0 + 1e-9, every_s)
    return [{"worker": int(rng.integers(workers)), "at_s": round(float(t), 3)} for t in times]


def soak_config(scenario: str, overrides: list[str], backend: str, workers: int, minutes: float, kill_every: float,
                seed: int) -> dict[str, Any]:
    """The scenario file with the soak's settings: ``backend``, ``workers``, the kill schedule, restarts
    enough for it, a budget the soak never reaches (it ends the run itself), checkpoints, and (unless
    overridden) a generous backend.hello_timeout_s."""
    from marl_q.config import apply_override, build_config, read_yaml

    raw = read_yaml(Path(scenario))
    for item in overrides:
        apply_override(raw, item)
    kills = kill_list(workers, minutes, kill_every, seed)
    run = raw.setdefault("run", {})
    run.update({"seed": seed, "total_env_steps": 10**12, "progress": False, "plots": False})
    run.setdefault("checkpoint_every", 500)
    run.pop("total_episodes", None)
    b = raw.setdefault("backend", {})
    b.update({"name": backend, "workers": workers, "kill": kills, "max_restarts": len(kills) + 10})
    b.setdefault("hello_timeout_s", 300.0)  # a loaded machine's start-up is slow; the soak is about what follows
    if backend == "ray":
        b.setdefault("ray", {}).setdefault("num_cpus_per_worker", 0.25)
    build_config(raw)  # a bad override is a ConfigError now, not in the child process
    return raw


# ----------------------------------------------------------------------------- processes
def _children() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as fh:
                    ppid = int(fh.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            kids.setdefault(ppid, []).append(int(entry))
    return kids


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (children, their children, ...)."""
    kids, out, todo = _children(), [], [pid]
    while todo:
        for c in kids.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return fh.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def rss_mb(pid: int) -> Optional[float]:
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


class Session:
    """One `marlq run` or `marlq resume` child process: its stderr counted (restarts) and kept in a log."""

    def __init__(self, cmd: list[str], log: Path, backend: str) -> None:
        env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "PYTHONUNBUFFERED": "1"}
        self.t_start = time.perf_counter()
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                                     start_new_session=True)  # marlq restores SIGINT if it starts ignored (cli)
        self.backend = backend
        self.restarts: dict[str, int] = {}
        self.lines: list[str] = []
        self.log = open(log, "a")
        self.log.write(f"$ {' '.join(cmd)}\n")
        self.readers = [threading.Thread(target=self._read, args=(s,), daemon=True)
                        for s in (self.proc.stdout, self.proc.stderr)]
        for r in self.readers:
            r.start()
        self.server_pid: Optional[int] = None

    def _read(self, stream: Any) -> None:
        for line in stream:
            self.log.write(line)
            self.log.flush()
            self.lines.append(line.rstrip("\n"))
            if line.startswith("marlq: worker_restarted "):
                name = line.split()[2].rstrip(":")
                self.restarts[name] = self.restarts.get(name, 0) + 1

    def server_process(self) -> Optional[int]:
        """The server's process: the run process on local, its ray::ServerHost actor on ray."""
        if self.backend == "local":
            return self.proc.pid
        if self.server_pid is not None and _cmdline(self.server_pid).startswith("ray::ServerHost"):
            return self.server_pid
        self.server_pid = next((p for p in descendants(self.proc.pid) if _cmdline(p).startswith("ray::ServerHost")),
                               None)
        return self.server_pid

    def kill_all(self) -> int:
        """SIGKILL the run process, its process group and every process it started; returns how many."""
        pids = [self.proc.pid, *descendants(self.proc.pid)]
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()
        self.close()
        return len(pids)

    def interrupt(self, timeout_s: float) -> int:
        """Ctrl-C: the run checkpoints and writes its summary; returns the exit code (130 expected)."""
        self.proc.send_signal(signal.SIGINT)
        try:
            code = self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.kill_all()
            return -9
        for pid in descendants(self.proc.pid):  # nothing should be left; end it if it is
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.close()
        return code

    def close(self) -> None:
        for r in self.readers:
            r.join(timeout=5)
        self.log.close()


# ----------------------------------------------------------------------------- the soak
class LiveLedger:
    """comm.csv read as it grows (whole lines only); read again from the top if the file was cut (a resume)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.reset()

    def reset(self) -> None:
        self.auditor = LedgerAuditor()
        self.offset = 0
        self.header: Optional[list[str]] = None
        self.pushes = 0  # rows of worker pushes (not hellos) that reached the server
        self.last_push_id = -1  # the ledger row id of the latest of them
        self.resets = getattr(self, "resets", -1) + 1

    def poll(self) -> None:
        try:
            size = self.path.stat().st_size
        except OSError:
            return
        if size < self.offset:
            self.reset()
        with open(self.path, newline="") as fh:
            fh.seek(self.offset)
            chunk = fh.read()
        end = chunk.rfind("\n")
        if end < 0:
            return
        lines = chunk[:end + 1].splitlines()
        self.offset += len(chunk[:end + 1].encode())
        if self.header is None and lines:
            self.header = next(csv.reader([lines.pop(0)]))
        for values in csv.reader(lines):
            row = dict(zip(self.header, values))
            self.auditor.feed(row)
            if row["dst"] == SERVER and row["kind"] != HELLO and not row["kind"].startswith("fault:"):
                self.pushes += 1
                self.last_push_id = int(row["id"])


class Soak:
    """One backend's soak: the sessions, the sampling loop, the checks."""

    def __init__(self, args: argparse.Namespace, backend: str, process_kill_s: Optional[float]) -> None:
        self.args, self.backend, self.process_kill_s = args, backend, process_kill_s
        self.dir = args.out / backend
        self.dir.mkdir(parents=True, exist_ok=True)
        self.run_dir = self.dir / "run"
        self.raw = soak_config(args.scenario, args.overrides, backend, args.workers, args.minutes, args.kill_every,
                               args.seed)
        self.samples: list[dict[str, Any]] = []
        self.session: Optional[Session] = None  # the run's process now

    def run(self) -> dict[str, Any]:
        from marl_q.config import build_config

        cfg_path = self.dir / "soak_config.yaml"
        cfg_path.write_text(build_config(self.raw).to_yaml())
        log = self.dir / "console.log"
        cli = [sys.executable, "-m", "marl_q.cli"]
        t0 = time.perf_counter()
        end_s = self.args.minutes * 60.0
        live = LiveLedger(self.run_dir / "comm.csv")
        session = self.session = Session(cli + ["run", str(cfg_path), "--out", str(self.run_dir), "--quiet"], log,
                                         self.backend)
        events: list[dict[str, Any]] = [{"t_s": 0.0, "event": "run started"}]
        before: Optional[dict[str, Any]] = None
        sha_at_resume = ""
        row_at_kill: Optional[dict[str, str]] = None
        resumed_writing = False
        restarts_done = 0
        killed = False
        with open(self.dir / "samples.csv", "w", newline="") as fh:
            writer = csv.writer(fh)
            writer.writerow(["t_s", "session", "server_pid", "server_rss_mb", "pushes", "pushes_per_s", "restarts",
                             "worker", "sent", "accepted", "rejected", "dropped_stale"])
            last = (0.0, 0, live.resets)
            next_sample = self.args.sample_every
            while True:
                now = time.perf_counter() - t0
                if session.proc.poll() is not None:
                    events.append({"t_s": round(now, 1), "event": f"run process ended early, exit {session.proc.returncode}"})
                    session.close()
                    break
                if not killed and self.process_kill_s is not None and now >= self.process_kill_s \
                        and latest_checkpoint(self.run_dir) is not None:  # (a slow start postpones it)
                    killed = True
                    n = session.kill_all()
                    restarts_done += sum(session.restarts.values())
                    latest = latest_checkpoint(self.run_dir)
                    events.append({"t_s": round(now, 1), "event": f"SIGKILL to the run process and {n - 1} "
                                                                  "processes it started"})
                    before = checkpoint_facts(latest)
                    sha_at_resume = file_sha256(latest)
                    session = self.session = Session(cli + ["resume", str(self.run_dir), "--quiet"], log, self.backend)
                    events.append({"t_s": round(time.perf_counter() - t0, 1), "event": f"marlq resume (from "
                                                                                       f"{before['file']})"})
                    # the resume cuts comm.csv back to the checkpoint before it writes: until the row at the cut is
                    # another than the killed run's, what the file holds is the killed run's and is not read
                    row_at_kill = first_row_at(live.path, before["comm_position"])
                    resumed_writing = False
                    continue
                if before is not None and not resumed_writing:
                    now_row = first_row_at(live.path, before["comm_position"])
                    resumed_writing = now_row is not None and now_row != row_at_kill
                    if resumed_writing:
                        live.reset()
                # a soak whose process kill is still waiting for a first checkpoint, or whose resumed session has not
                # pushed anything yet, would leave nothing to check at the end: it gets up to GRACE_S more
                waiting = (self.process_kill_s is not None and not killed) or \
                    (before is not None and (not resumed_writing or live.last_push_id < before["ledger_count"]))
                if now >= end_s and (not waiting or now >= end_s + GRACE_S):
                    code = session.interrupt(STOP_WAIT_S)
                    restarts_done += sum(session.restarts.values())
                    events.append({"t_s": round(now, 1), "event": f"SIGINT (end of the soak): exit {code}" if code != -9
                                   else f"SIGINT (end of the soak): still running {STOP_WAIT_S:g} s later, SIGKILL"})
                    break
                if now >= next_sample:
                    next_sample += self.args.sample_every
                    if before is None or resumed_writing:
                        live.poll()
                    pid = session.server_process()
                    rss = rss_mb(pid) if pid is not None else None
                    fresh = live.resets != last[2]  # comm.csv was read again from the top (a resume)
                    rate = float("nan") if fresh else (live.pushes - last[1]) / max(now - last[0], 1e-9)
                    last = (now, live.pushes, live.resets)
                    sample = {"t_s": round(now, 2), "session": 2 if killed else 1, "server_pid": pid,
                              "server_rss_mb": rss, "pushes": live.pushes, "pushes_per_s": rate,
                              "restarts": restarts_done + sum(session.restarts.values())}
                    self.samples.append(sample)
                    audit = live.auditor.audit()
                    for name, w in sorted(audit.workers.items()):
                        writer.writerow([sample["t_s"], sample["session"], pid, rss, live.pushes, f"{rate:.1f}",
                                         sample["restarts"], name, w["sent"], w["accepted"], w["rejected"],
                                         w["dropped_stale"]])
                    if not audit.workers:
                        writer.writerow([sample["t_s"], sample["session"], pid, rss, live.pushes, f"{rate:.1f}",
                                         sample["restarts"], "", "", "", "", ""])
                    fh.flush()
                time.sleep(min(0.5, max(0.0, next_sample - (time.perf_counter() - t0))))
        return self.verdict(before, sha_at_resume, events, restarts_done)

    def verdict(self, before: Optional[dict[str, Any]], sha_at_resume: str, events: list[dict[str, Any]],
                restarts: int) -> dict[str, Any]:
        from marl_q.ledger import ledger_audit

        checks = []
        summary_path = self.run_dir / "summary.json"
        summary = json.loads(summary_path.read_text()) if summary_path.is_file() else None
        if summary is None:
            checks.append({"name": "summary", "ok": False, "detail": "the run wrote no summary.json"})
        else:
            audit = ledger_audit(self.run_dir)
            checks.append(applied_once(int(summary["updates"]), audit).to_dict())
            checks.append(accounted(audit).to_dict())
        if self.process_kill_s is not None:
            if before is None:
                checks.append({"name": "resumed_from_checkpoint", "ok": False,
                               "detail": "the run wrote no checkpoint before the end, so it was never killed and resumed"})
            else:
                entry = (summary or {}).get("resumes", [None])[-1] if (summary or {}).get("resumes") else None
                checks.append(resumed_from_checkpoint(
                    before, sha_at_resume, entry, first_row_at(self.run_dir / "comm.csv", before["comm_position"]),
                    first_row_at(self.run_dir / "metrics.csv", before["metrics_position"])).to_dict())
        if (self.run_dir / "metrics.csv").is_file():
            checks.append(metrics_continuous(*read_metrics_columns(self.run_dir / "metrics.csv")).to_dict())
        t = np.array([s["t_s"] for s in self.samples], dtype=float)
        rss = np.array([np.nan if s["server_rss_mb"] is None else s["server_rss_mb"] for s in self.samples])
        pid = [s["server_pid"] for s in self.samples]
        first_seen = {p: t[i] for i, p in reversed(list(enumerate(pid)))}
        fit_from = self.args.minutes * 60.0 / 3
        use = [i for i in range(len(t)) if t[i] >= fit_from and not np.isnan(rss[i])
               and t[i] - first_seen[pid[i]] >= WARMUP_S]
        slope = rss_slope(t[use], rss[use], [pid[i] for i in use]) if use else float("nan")
        rates = np.array([self.samples[i]["pushes_per_s"] for i in range(1, len(t)) if t[i] >= fit_from], dtype=float)
        rates = rates[np.isfinite(rates)]  # (the sample right after the resume has none)
        result = {
            "backend": self.backend, "workers": self.args.workers, "minutes": self.args.minutes,
            "kill_every_s": self.args.kill_every, "process_kill_s": self.process_kill_s,
            "scenario": self.args.scenario, "run_dir": str(self.run_dir), "events": events, "checks": checks,
            "rss_slope_mb_per_10min": slope * 600.0, "rss_fit": {"from_s": fit_from, "samples": len(use),
                                                                  "warmup_s": WARMUP_S},
            "rss_mb": {"first": _first(rss), "last": _last(rss), "max": float(np.nanmax(rss)) if len(rss) else None},
            "pushes_per_s_median": float(np.median(rates)) if len(rates) else None,
            "restarts": restarts, "kills_scheduled": len(self.raw["backend"]["kill"]),
            "summary": {k: summary.get(k) for k in ("status", "env_steps", "episodes", "updates", "messages",
                                                    "rejected", "dropped_stale", "faults_injected")} if summary else None,
        }
        result["pass"] = bool(checks) and all(c["ok"] for c in checks)
        return result


def _first(a: np.ndarray) -> Optional[float]:
    ok = a[np.isfinite(a)]
    return float(ok[0]) if len(ok) else None


def _last(a: np.ndarray) -> Optional[float]:
    ok = a[np.isfinite(a)]
    return float(ok[-1]) if len(ok) else None


# ----------------------------------------------------------------------------- output
def print_verdict(r: dict[str, Any]) -> None:
    print(f"\n{r['backend']}: {r['workers']} workers, {r['minutes']:g} min of {r['scenario']}, a worker killed every "
          f"{r['kill_every_s']:g} s, whole process killed at "
          f"{'never' if r['process_kill_s'] is None else format(r['process_kill_s'] / 60, 'g') + ' min'}")
    for e in r["events"]:
        print(f"  {e['t_s']:>8.1f} s  {e['event']}")
    for c in r["checks"]:
        print(f"  {'PASS' if c['ok'] else 'FAIL'}  {c['name']}: {c['detail']}")
    fit = r["rss_fit"]
    print(f"  server RSS: {r['rss_mb']['first']} -> {r['rss_mb']['last']} MB (max {r['rss_mb']['max']}); slope "
          f"{r['rss_slope_mb_per_10min']:+.2f} MB per 10 min (least squares over {fit['samples']} samples from "
          f"{fit['from_s'] / 60:g} min, each process's first {fit['warmup_s']:g} s left out)")
    med = r["pushes_per_s_median"]
    print(f"  pushes/s: median {'n/a' if med is None else format(med, ',.0f')} over the same samples; restarts "
          f"{r['restarts']} "
          f"({r['kills_scheduled']} kills scheduled, each session's clock starting when all its workers said hello)")
    print(f"  verdict: {'PASS' if r['pass'] else 'FAIL'}")


def plot_soak(r: dict[str, Any], samples: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t = np.array([s["t_s"] for s in samples], dtype=float) / 60
    rss = np.array([np.nan if s["server_rss_mb"] is None else s["server_rss_mb"] for s in samples])
    rate = np.array([s["pushes_per_s"] for s in samples], dtype=float)
    fig, (a1, a2) = plt.subplots(2, 1, figsize=(8, 6), sharex=True)
    a1.plot(t, rss, ".-", ms=2, lw=0.8, label="server process RSS (one run)")
    a2.plot(t, rate, ".-", ms=2, lw=0.8, color="tab:green", label="pushes reaching the server")
    for e in r["events"]:
        if e["event"].startswith("SIGKILL"):
            for ax in (a1, a2):
                ax.axvline(e["t_s"] / 60, color="tab:red", ls="--", lw=1, label="whole-process kill, then resume")
    a1.set_ylabel("resident memory, VmRSS (MB)")
    a2.set_ylabel(f"pushes/s (per {samples[1]['t_s'] - samples[0]['t_s'] if len(samples) > 1 else 0:.0f} s)")
    a2.set_xlabel("time since the soak started (min)")
    a1.set_ylim(bottom=0)
    a2.set_ylim(bottom=0)
    for ax in (a1, a2):
        ax.grid(alpha=0.3)
        ax.legend(loc="lower right", fontsize=8)
    kill = "" if r["process_kill_s"] is None else f", process killed at {r['process_kill_s'] / 60:g} min"
    a1.set_title(f"Soak on {r['backend']}: {r['workers']} workers, {Path(r['scenario']).stem}, a worker killed every "
                 f"{r['kill_every_s']:g} s{kill}\nRSS slope {r['rss_slope_mb_per_10min']:+.2f} MB/10 min; "
                 f"invariants {'all PASS' if r['pass'] else 'FAIL'}", fontsize=9)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


BENCHES = {"soak": soak_main}  # marlq bench soak
