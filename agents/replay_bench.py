"""marlq bench replay_memory: the bytes a value-based learner's replay buffer takes, measured.

    marlq bench replay_memory [--config scenarios/spread_qmix.yaml] [--transitions 1000000] [--prioritized]

Builds the replay buffer the config's learner would build on the server (its fields sized from one
environment: agents, observation size, actions, and the global state for qmix; a recurrent Q-network's
rows are sequences, ``agents.q_learning.sequence_buffer``) with ``--transitions`` rows, fills every row (random values of each field's dtype, in chunks, so every page is touched),
and prints the fields, the bytes per transition, the arrays' bytes, and the process's resident memory
before and after (VmRSS, Linux). Output also as one JSON line with ``--json``.
"""
from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Optional

import numpy as np

DEFAULT_CONFIG = Path(__file__).resolve().parents[1] / "scenarios" / "spread_qmix.yaml"


def replay_memory(config: str, transitions: int, prioritized: bool, chunk: int = 65536) -> dict:
    """Fill a buffer of ``transitions`` rows laid out as the config's learner lays them; its sizes."""
    from agents.coma import described
    from agents.q_learning import build_q_network, describe, make_q_env, replay_buffer
    from agents.recurrent import is_recurrent
    from agents.replay import EpisodeBuffer
    from marl_q.bench.memory import proc_status_kb
    from marl_q.config import load_config
    from marl_q.errors import ConfigError
    from marl_q.seeding import seeded_init

    cfg = load_config(config, ["run.progress=false"])
    dims = described(cfg, make_q_env, describe)
    with seeded_init(cfg.run.seed):
        net = build_q_network(cfg, dims)
    hidden = net.hidden_size if is_recurrent(net) else None
    if hidden is not None and prioritized:
        raise ConfigError("--prioritized: a recurrent Q-network (critic.recurrent) replays its sequences uniformly")
    rss0 = proc_status_kb("VmRSS")
    buf = replay_buffer(cfg.algorithm.params.replay, dims, transitions, hidden, prioritized)
    fields = buf.fields
    rng = np.random.default_rng(0)
    chunk = min(chunk, max(1, 2**26 // buf.bytes_per_transition))  # about 64 MB of rows at a time
    for start in range(0, transitions, chunk):
        rows = min(chunk, transitions - start)
        filled = {f.name: (rng.integers(0, 2, (rows, *f.shape)) if f.dtype.kind in "bi"
                           else rng.random((rows, *f.shape), dtype=np.float32)).astype(f.dtype) for f in fields}
        if isinstance(buf, EpisodeBuffer):  # whole sequences
            filled["mask"][:] = True
            buf.add_padded(filled)
        else:
            buf.add(filled)
    rss1 = proc_status_kb("VmRSS")
    return {"config": str(config), "algorithm": cfg.algorithm.name, "transitions": transitions,
            "prioritized": prioritized,
            "row": f"sequence of {buf.max_len - 1} steps" if isinstance(buf, EpisodeBuffer) else "transition",
            "fields": {f.name: [list(f.shape), f.dtype.name, math.prod(f.shape) * f.dtype.itemsize] for f in fields},
            "bytes_per_transition": buf.bytes_per_transition, "nbytes": buf.nbytes,
            "rss_before_kb": rss0, "rss_after_kb": rss1,
            "rss_growth_bytes_per_transition": None if rss0 is None or rss1 is None
            else (rss1 - rss0) * 1024 / transitions}


def main(argv: Optional[list[str]] = None) -> int:
    """The bytes a replay buffer of N transitions takes, for a value-based scenario file (1M spread rows by default)."""
    parser = argparse.ArgumentParser(prog="marlq bench replay_memory", description=__doc__.split("\n")[0])
    parser.add_argument("--config", default=str(DEFAULT_CONFIG))
    parser.add_argument("--transitions", type=int, default=1_000_000)
    parser.add_argument("--prioritized", action="store_true")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if args.transitions < 1:
        parser.error("--transitions must be at least 1")
    out = replay_memory(args.config, args.transitions, args.prioritized)
    if args.json:
        print(json.dumps(out))
        return 0
    rows = "transitions" if out["row"] == "transition" else f"rows, each a {out['row']}"
    print(f"{out['algorithm']} replay buffer of {out['transitions']:,} {rows} ({out['config']}"
          f"{', prioritized' if out['prioritized'] else ''})")
    for name, (shape, dtype, nbytes) in out["fields"].items():
        print(f"  {name:11} {str(tuple(shape)):12} {dtype:8} {nbytes:6} bytes")
    print(f"bytes per transition: {out['bytes_per_transition']}; arrays: {out['nbytes']:,} bytes")
    if out["rss_after_kb"] is not None:
        grown = out["rss_growth_bytes_per_transition"]
        print(f"resident memory: {out['rss_before_kb'] / 1024:.0f} MB before, {out['rss_after_kb'] / 1024:.0f} MB after "
              f"({grown:.1f} bytes per transition)")
    return 0


BENCHES = {"replay_memory": main}  # marlq bench replay_memory
