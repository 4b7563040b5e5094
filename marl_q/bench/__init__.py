"""Benchmarks of the runtime: `marlq bench runtime` (how fast it moves work and messages) and
`marlq bench load` (many workers pushing at once: every push accounted for, server memory).

runtime.py, load.py and soak.py are the three commands (soak_checks.py: what a soak checks at the end); push_flood.py the algorithm they measure the runtime
with (workers without an environment); memory.py the server's memory sampler; runs.py what the
commands share (backends, run configs, one Ray instance for all ray runs, tables). Importing this
package registers push_flood and, through BENCHES, the three commands.
"""
from __future__ import annotations

from marl_q.bench import push_flood  # noqa: F401  (registers the push_flood algorithm)
from marl_q.bench.load import load_main
from marl_q.bench.runtime import main
from marl_q.bench.soak import soak_main

BENCHES = {"runtime": main, "load": load_main, "soak": soak_main}
