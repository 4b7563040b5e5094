"""Every seed a run derives from ``run.seed``, in one place: no other module writes a seed formula
or offset; each calls a function here.

For new code: ``derive(seed, stream, *path)`` is numpy's SeedSequence over the run seed, a named
stream and an index path: independent, well-mixed 32-bit seeds for any number of consumers, with no
magic offsets that could collide. Add a stream name to the end of STREAMS when nothing fits (never
reorder it: that would change every derived seed). agents/mappo.py (ippo, mappo, ia2c, maa2c) is
built on it: ``worker_seed`` for its workers and ``derive(seed, "env_copy", worker, copy)`` for
each environment copy; with one learner per team, ``derive(seed, "learner", k)`` seeds learner k's
server core and ``derive(seed, "learner", k, worker)`` its sampling on a worker. A circuit head that samples shots or SPSA directions gets
``derive(seed, "shots", worker, k)`` for the k-th such head of a worker, whatever the worker's kind
(``agents.heads.worker_heads``, through ``circuits.shots.seed_heads``).

The streams that published figures were made with keep their historical formulas, named here so
that no other module writes one: changing them would change every recorded run (the golden test
hashes, the evaluation numbers in summary.json, the figures quoted in the scenario files and docs),
which a refactor must not do. They are:

- workers: ``worker_seed`` (actor-critic, COMA, routing, vehicular, and mappo's workers; their
  numpy generator and env, not torch's global stream, which no worker touches),
  ``lsvi_worker_entropy``, ``routing_demand_entropy``, ``vehicular_episode_seed``,
  ``coma_bootstrap_seed``;
- backends: ``timing_seed`` (sim), ``duplicate_seed`` (local's fault injection);
- evaluation: ``coma_eval_seed``, ``routing_eval_seed``, ``vehicular_eval_seed``,
  ``vehicular_eval_episode_seed``, ``vehicular_traffic_seed``, ``coma_critic_probe_seed``,
  ``SCRIPTED_SPREAD_FIRST_SEED`` / ``scripted_episode_seed``.

``run.seed`` itself (no derivation) seeds the server's generator, the initial parameters every worker
and the server share (``seeded_init``) and the environments built only for their spaces.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

import numpy as np

STREAMS = ("worker", "env_copy", "eval", "timing", "shots", "opponents", "learner")


def derive(seed: int, stream: str, *path: int) -> int:
    """A 32-bit seed for ``stream`` (one of STREAMS) at ``path`` (e.g. worker index, copy index)."""
    if stream not in STREAMS:
        raise ValueError(f"unknown seed stream {stream!r} (streams: {', '.join(STREAMS)})")
    key = [int(seed), STREAMS.index(stream), *(int(p) for p in path)]
    return int(np.random.SeedSequence(key).generate_state(1)[0])


@contextmanager
def seeded_init(seed: int) -> Iterator[None]:
    """Build modules inside this block and their initial parameters are a function of ``seed`` alone,
    whatever ran before, and the caller's torch stream is as it was after the block: the block draws
    from a fork of torch's global generator seeded with ``seed``. A fork, not a generator handed to
    each initialiser: ``nn.Linear``'s default initialisation takes none, and the draws (their order,
    hence every recorded run's parameters) are the ones ``torch.manual_seed(seed)`` gave."""
    import torch

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        yield


# ----------------------------------------------------------------------------- historical formulas
# Each function below is one stream that recorded runs were made with. Its formula is frozen: the
# golden test (tests/golden) hashes the metrics of every shipped scenario, and the evaluation numbers
# in summary.json and the figures quoted in the scenario files and docs were made with it. The offsets
# are arbitrary (7919 and 104729 are primes, the others round numbers); some streams share one (7919
# is the sim timing offset, the vehicular episode stride and the COMA bootstrap base) without meaning
# anything by it. New streams use ``derive`` instead.

# -- workers
def worker_seed(seed: int, index: int) -> int:
    """The actor-critic, COMA, routing and vehicular workers' seed (their generator and env);
    kept: every recorded run of those algorithms was seeded with it."""
    return seed * 1000 + index


def lsvi_worker_entropy(seed: int, index: int) -> list[int]:
    """The entropy of an LSVI worker's generator (``np.random.default_rng`` of it); kept: the recorded
    LSVI runs drew their exploration from it."""
    return [int(seed), int(index)]


def routing_demand_entropy(worker: int) -> list[int]:
    """The entropy of a routing worker's demand stream (``default_rng`` of it), from its
    ``worker_seed``; kept: the recorded routing runs trained on that demand."""
    return [int(worker), 1]


def vehicular_episode_seed(worker: int, episode: int) -> int:
    """The reset seed of a vehicular A3C worker's ``episode``-th highway, from its ``worker_seed``;
    kept: the recorded vehicular runs saw that traffic."""
    return worker + 7919 * episode


def coma_bootstrap_seed(updates: int) -> int:
    """The torch seed of the joint actions COMA's learner draws for expected bootstrap values after
    ``updates`` updates (independent of run.seed); kept: the recorded COMA runs used those draws."""
    return 7_919 + updates


# -- backends
def timing_seed(seed: int) -> int:
    """The sim backend's timing generator (compute and network delays, the next worker to pick);
    kept: it decides the message order, hence every sim run's ledger and metrics."""
    return seed + 7919


def duplicate_seed(seed: int) -> int:
    """The local backend's generator of injected duplicate messages; kept: it decides which messages
    a faulty local run duplicates."""
    return seed + 104729


# -- evaluation (independent of every training stream)
def coma_eval_seed(seed: int, episode: int = 0) -> int:
    """COMA's evaluation: the env and generator at ``episode`` 0, and the reset seed of episode ``episode``;
    kept: the evaluation numbers in the recorded summary.json files."""
    return seed + 100_003 + episode


def routing_eval_seed(seed: int) -> int:
    """Routing's evaluation demand (the learned policy and the baselines); kept: the evaluation numbers
    in the recorded summary.json files."""
    return seed + 10_000


def vehicular_eval_seed(seed: int) -> int:
    """The traffic seed of ``analysis.vehicular``'s evaluation of a run with run.seed ``seed`` (the
    learned policy and the baselines see the same traffic); kept: the published coverage figures."""
    return 100_000 + seed * 100


def vehicular_eval_episode_seed(base: int, episode: int) -> int:
    """The reset seed of evaluation ``episode`` from a ``vehicular_eval_seed`` (or
    ``vehicular_traffic_seed``) base; kept: the published coverage figures."""
    return base + 1000 * episode


def vehicular_traffic_seed(index: int) -> int:
    """The ``index``-th traffic seed of ``analysis.vehicular``'s reachability study (no trained run);
    kept: the published reachability figures."""
    return 100_000 + index


def coma_critic_probe_seed(seed: int, episode: int = 0) -> int:
    """``analysis.coma_critic``'s probe environment (episode 0) and the reset seed of its ``episode``-th
    probed state; kept: the critic-vs-Monte-Carlo figures in docs/coma.md."""
    return seed + 7_777 + episode


SCRIPTED_SPREAD_FIRST_SEED = 100_000
"""The default first reset seed of ``scenarios.spread_scripted``'s reference returns; kept: the
scripted levels quoted in the spread scenario files and docs/coma.md."""


def scripted_episode_seed(first: int, episode: int) -> int:
    """The reset seed of ``scenarios.spread_scripted``'s ``episode``-th episode; kept: as above."""
    return first + episode
