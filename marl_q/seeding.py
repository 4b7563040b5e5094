"""Every seed a run derives from ``run.seed``, in one place.

``derive(seed, stream, *path)`` is numpy's SeedSequence over the run seed, a named stream and an
index path: independent, well-mixed 32-bit seeds for any number of consumers, with no magic
offsets that could collide. New code derives its seeds here.

The streams that published figures were made with keep their historical formulas, named here so
that no other module writes one: changing them would change every recorded run (the golden test
hashes, the figures quoted in the scenario files and docs), which a refactor must not do.
"""
from __future__ import annotations

import numpy as np

STREAMS = ("worker", "env_copy", "eval", "timing")


def derive(seed: int, stream: str, *path: int) -> int:
    """A 32-bit seed for ``stream`` (one of STREAMS) at ``path`` (e.g. worker index, copy index)."""
    if stream not in STREAMS:
        raise ValueError(f"unknown seed stream {stream!r} (streams: {', '.join(STREAMS)})")
    key = [int(seed), STREAMS.index(stream), *(int(p) for p in path)]
    return int(np.random.SeedSequence(key).generate_state(1)[0])


# ----------------------------------------------------------------------------- historical formulas
def worker_seed(seed: int, index: int) -> int:
    """The actor-critic, COMA, routing and vehicular workers' seed (their generator, torch and env)."""
    return seed * 1000 + index
