"""`marlq bench load`: N push_flood workers pushing as fast as they can for S seconds.

Per worker, the pushes it sent must equal accepted + rejected + dropped_stale in the ledger
(marl_q.ledger.ledger_audit), and the server process's RSS is sampled over time (and drawn with
--plot). Timings are printed, never asserted (tests don't time things).
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any, Optional, Sequence

import numpy as np
import torch

from marl_q.bench.runs import flood_config, parse_backends, run_config, shared_ray
from marl_q.ledger import LedgerAudit, ledger_audit
from marl_q.protocol import worker_names


def load_main(argv: Optional[Sequence[str]] = None) -> int:
    """Load test: N workers push as fast as they can; per-worker accounting and server memory over time."""
    p = argparse.ArgumentParser(prog="marlq bench load", description=load_main.__doc__)
    p.add_argument("--backend", default="local", help="one or more of sim, local, ray, comma-separated (run in turn)")
    p.add_argument("--workers", type=int, default=8)
    p.add_argument("--seconds", type=float, default=60.0, help="how long each worker pushes")
    p.add_argument("--payload", type=int, default=1024, help="float32 values per push")
    p.add_argument("--window", type=int, default=32, help="unanswered pushes a worker may have")
    p.add_argument("--max-staleness", type=int, default=64, help="server.max_staleness (stale pushes are dropped)")
    p.add_argument("--bad-every", type=int, default=50, help="every n-th push carries a NaN (rejected); 0 = none")
    p.add_argument("--out", type=Path, default=None, help="keep the run directories here (default: temporary)")
    p.add_argument("--plot", type=Path, default=None, help="draw the server's RSS over time to this PNG")
    p.add_argument("--trace-after", type=float, default=0.0, metavar="S",
                   help="trace the server's Python allocations (tracemalloc) and list the lines that grew most "
                        "from S seconds after the start to the end; 0 = off (tracing slows the server)")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    from marl_q.errors import ConfigError

    backends = parse_backends(args.backend)
    if args.workers < 1 or args.seconds <= 0:
        raise ConfigError(f"--workers must be >= 1 and --seconds > 0, got {args.workers} and {args.seconds}")
    if not 0 <= args.trace_after < args.seconds:
        raise ConfigError(f"--trace-after: must be in [0, --seconds), got {args.trace_after}")
    if args.out is not None and args.out.exists() and any(args.out.iterdir()):
        raise ConfigError(f"--out {args.out}: exists and is not empty")
    torch.set_num_threads(1)
    results = []
    with shared_ray(backends, args.workers):
        for backend in backends:
            raw = flood_config(backend, args.workers, args.seconds, window=args.window, size=args.payload,
                               max_staleness=args.max_staleness, bad_every=args.bad_every,
                               trace_after_s=args.trace_after)
            keep = args.out / backend if args.out is not None else None
            with run_config(raw, keep) as (summary, run_dir):
                results.append(_load_result(backend, args.workers, summary, ledger_audit(run_dir)))
    if args.plot is not None:
        plot_rss(results, args.plot, args)
    if args.json:
        print(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "results": results}))
    else:
        for r in results:
            _print_load(r, args)
        if args.plot is not None:
            print(f"\nplot: {args.plot}")
    return 0 if all(r["accounted"] for r in results) else 1


def _load_result(backend: str, workers: int, summary: dict[str, Any], audit: LedgerAudit) -> dict[str, Any]:
    per_worker = []
    for name in [n for n in worker_names(workers) if n in summary["sent"]]:
        row = audit.worker(name)
        sent = int(summary["sent"][name])
        total = row["accepted"] + row["rejected"] + row["dropped_stale"]
        per_worker.append({"worker": name, "sent": sent, "accepted": row["accepted"], "rejected": row["rejected"],
                           "dropped_stale": row["dropped_stale"], "ok": sent == total,
                           "pushes_per_s": sent / max(summary["push_seconds"][name], 1e-9)})
    series = summary["server_rss"]
    mid = series[len(series) // 2] if series else (None, None)
    return {
        "backend": backend, "workers": per_worker, "accounted": all(w["ok"] for w in per_worker),
        "pushes_per_s": sum(w["pushes_per_s"] for w in per_worker),
        "rss_mb": {"start": series[0][1] / 1024 if series else None, "middle": mid[1] / 1024 if series else None,
                   "end": series[-1][1] / 1024 if series else None,
                   "peak_sampled": max(kb for _, kb in series) / 1024 if series else None,
                   "peak_vmhwm": summary["server_peak_rss_kb"] / 1024 if summary["server_peak_rss_kb"] else None},
        "rss_series": series, "ledger_messages": summary["messages"], "wall_s": summary["wall_s"],
        "heap_growth": summary.get("heap_growth"),
    }


def _print_load(r: dict[str, Any], args: argparse.Namespace) -> None:
    print(f"\n{r['backend']}: {args.workers} push_flood workers x {args.seconds:g} s, {4 * args.payload} B pushes, "
          f"window {args.window}, max_staleness {args.max_staleness}, a NaN every {args.bad_every}")
    print(f"{'worker':>8s} {'sent':>10s} {'accepted':>10s} {'rejected':>10s} {'stale':>10s} {'pushes/s':>10s}  "
          "sent = accepted + rejected + stale")
    for w in r["workers"]:
        print(f"{w['worker']:>8s} {w['sent']:>10,d} {w['accepted']:>10,d} {w['rejected']:>10,d} "
              f"{w['dropped_stale']:>10,d} {w['pushes_per_s']:>10,.0f}  {'yes' if w['ok'] else 'NO'}")
    m = r["rss_mb"]
    print(f"all workers: {r['pushes_per_s']:,.0f} pushes/s; server RSS (MB): start {m['start']:.1f}, "
          f"middle {m['middle']:.1f}, end {m['end']:.1f}, peak sampled {m['peak_sampled']:.1f}, "
          f"peak (VmHWM) {m['peak_vmhwm']:.1f}")
    heap = r["heap_growth"]
    if heap:
        print(f"Python heap of the server (tracemalloc), {heap['seconds']:g} s apart: traced "
              f"{' -> '.join(f'{mb:.2f}' for mb in heap.get('traced_mb', []))} MB; lines that grew most:")
        for line in heap["lines"]:
            print(f"  {line['grew_kb']:>+10,.1f} KB {line['blocks_grew']:>+8,d} blocks  {line['where']}")


def plot_rss(results: list[dict[str, Any]], path: Path, args: argparse.Namespace) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for r in results:
        if r["rss_series"]:
            t, kb = (np.asarray(v, dtype=float) for v in zip(*r["rss_series"]))
            ax.plot(t - t[0], kb / 1024, label=f"{r['backend']} server process (one run)")
    ax.set_xlabel("time since the first worker said hello (s)")
    ax.set_ylabel("resident memory, VmRSS (MB)")
    ax.set_ylim(bottom=0)
    ax.set_title(f"Server memory under load: {args.workers} workers pushing {4 * args.payload} B "
                 f"for {args.seconds:g} s", fontsize=10)
    ax.legend()
    ax.grid(alpha=0.3)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)



BENCHES = {"load": load_main}  # marlq bench load
