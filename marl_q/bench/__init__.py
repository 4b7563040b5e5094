"""Benchmarks of the runtime: `marlq bench runtime` (how fast it moves work and messages),
`marlq bench load` (many workers pushing at once: every push accounted for, server memory),
`marlq bench soak` (hours of work with kills and a resume) and `marlq bench startup` (how fast the
CLI starts).

runtime.py, load.py, soak.py and startup.py are the commands, each exporting ``BENCHES`` (found by
the plugin index like any module's); soak_checks.py: what a soak checks at the end; push_flood.py
the algorithm they measure the runtime with (workers without an environment); memory.py the
server's memory sampler; runs.py what the commands share (backends, run configs, one Ray instance
for all ray runs, tables). Importing this package imports none of them.
"""
