"""What the benchmarks share: which backends they compare, push_flood run configs, running a config
into a directory that is cleaned up after, one Ray instance for all their ray runs, and tables."""
from __future__ import annotations

import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Optional, Sequence

BACKEND_NAMES = ("sim", "local", "ray")


def parse_backends(text: str) -> list[str]:
    """``--backend sim,local`` as a list; a ConfigError for a name that is not a backend."""
    from marl_q.errors import ConfigError

    names = [b.strip() for b in text.split(",") if b.strip()]
    for b in names:
        if b not in BACKEND_NAMES:
            raise ConfigError(f"--backend: unknown backend {b!r} (choices: {', '.join(BACKEND_NAMES)})")
    return names


def flood_config(backend: str, workers: int, seconds: float, window: int = 32, size: int = 1024,
                 max_staleness: Optional[int] = None, bad_every: int = 0, trace_after_s: float = 0.0) -> dict[str, Any]:
    """push_flood workers; the run ends when every worker has reported its count."""
    return {
        "run": {"seed": 0, "total_episodes": workers, "progress": False, "plots": False},
        "backend": {"name": backend, "workers": workers, "ray": {"num_cpus_per_worker": 0.25}},
        "scenario": {"name": "cartpole"},  # not used by push_flood; a config names one
        "algorithm": {"name": "push_flood", "size": size, "window": window, "seconds": seconds,
                      "bad_every": bad_every, "trace_after_s": trace_after_s},
        "server": {"aggregation": "hogwild", "max_staleness": max_staleness},
    }


@contextmanager
def run_config(raw: dict[str, Any], keep: Optional[Path] = None) -> Iterator[tuple[dict[str, Any], Path]]:
    """Run a raw config into ``keep`` or a temporary directory; yields (summary, run dir).

    A temporary directory is deleted when the ``with`` block ends."""
    from marl_q.config import build_config
    from marl_q.experiment import run_experiment

    tmp = None
    if keep is None:
        tmp = tempfile.mkdtemp(prefix="marlq-bench-")
        keep = Path(tmp) / "run"
    try:
        summary = run_experiment(build_config(raw), keep, plots=False)
        yield summary, keep
    finally:
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)


@contextmanager
def shared_ray(backends: Sequence[str], workers: int) -> Iterator[None]:
    """One local Ray instance for every ray run of a benchmark (started once, shut down after);
    nothing if ``backends`` has no ray."""
    if "ray" not in backends:
        yield
        return
    from marl_q.backends.ray_backend import ray_instance
    from marl_q.config import build_config

    raw = flood_config("ray", workers, 1.0)
    raw["backend"]["ray"]["num_cpus_per_worker"] = 0.5
    with ray_instance(build_config(raw)):
        yield


def print_table(title: str, rows: list[dict[str, Any]], columns: list[str]) -> None:
    print(f"\n{title}")
    print("  ".join(f"{c:>16s}" for c in columns))
    for r in rows:
        cells = []
        for c in columns:
            v = r.get(c)
            cells.append(f"{v:>16,.1f}" if isinstance(v, float) else f"{str(v):>16s}")
        print("  ".join(cells))
