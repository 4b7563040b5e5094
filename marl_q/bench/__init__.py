"""Benchmarks of the runtime: `marlq bench runtime` (how fast it moves work and messages) and
`marlq bench load` (many workers pushing at once: every push accounted for, server memory).

runtime.py and load.py are the two commands; push_flood.py the algorithm they measure the runtime
with (workers without an environment); memory.py the server's memory sampler; runs.py what the
commands share (backends, run configs, one Ray instance for all ray runs, tables). Importing this
package registers push_flood and, through BENCHES, the two commands.
"""
from __future__ import annotations

from marl_q.bench import push_flood  # noqa: F401  (registers the push_flood algorithm)
from marl_q.bench.load import load_main
from marl_q.bench.runtime import main

BENCHES = {"runtime": main, "load": load_main}
