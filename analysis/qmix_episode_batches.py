"""An experiment, not a feature: a feed-forward Q-learner's batches drawn as whole episodes, as EPyMARL
draws them (32 episodes of 25 steps), instead of uniformly drawn transitions. It wraps ``marlq``: the
replay buffer's row sampler is replaced for this process, then the command line runs as given.

    python -m analysis.qmix_episode_batches run scenarios/spread_qmix.yaml --set run.seed=0 --out runs/ep0

It needs the buffer's rows to come in whole episodes of ``EPISODE_STEPS`` (default 25) rows at aligned
positions: fixed-length episodes, ``algorithm.chunk_steps`` equal to the episode length, and a capacity
and batch size that are multiples of it (spread_qmix.yaml: 125,000 and 800). Those settings are checked
before the run starts (exit 2 with the keys named); a batch that is still not whole episodes (episodes of
another length) stops the run at its first update. docs/value_based.md ("EPyMARL's QMIX, VDN and IQL at 1M env steps") has what it showed.
"""
from __future__ import annotations

import os
import sys

import numpy as np

from agents import replay

EPISODE_STEPS = int(os.environ.get("EPISODE_STEPS", "25"))


def episode_rows(buffer: replay.ReplayBuffer, batch_size: int, rng: np.random.Generator) -> np.ndarray:
    """``batch_size / EPISODE_STEPS`` distinct stored episodes, each as its rows in order."""
    buffer.check_batch_size(batch_size)
    if batch_size % EPISODE_STEPS or buffer.size % EPISODE_STEPS:
        raise SystemExit(f"qmix_episode_batches: batch_size {batch_size} and the filled rows {buffer.size} must be "
                         f"multiples of EPISODE_STEPS={EPISODE_STEPS}")
    starts = rng.choice(buffer.size // EPISODE_STEPS, size=batch_size // EPISODE_STEPS, replace=False) * EPISODE_STEPS
    return (starts[:, None] + np.arange(EPISODE_STEPS)[None, :]).reshape(-1)


def check_config(argv: list[str]) -> str | None:
    """Why the run that ``marlq run CONFIG [--set KEY=VALUE ...]`` would start cannot draw whole-episode
    batches, or None: checked before it starts, so a bad setting costs no run."""
    import argparse

    from marl_q.config import load_config

    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("command")
    parser.add_argument("config")
    parser.add_argument("--set", dest="overrides", action="append", default=[])
    args, _ = parser.parse_known_args(argv)
    if args.command != "run":
        return f"wraps 'marlq run CONFIG ...' only, got {args.command!r}"
    algorithm = load_config(args.config, args.overrides).algorithm
    replay_cfg = getattr(algorithm, "replay", None)
    if replay_cfg is None or getattr(replay_cfg, "sequence", None) is not None:
        return f"algorithm {algorithm.name!r} has no feed-forward replay of transitions"
    bad = {key: value for key, value in (("algorithm.chunk_steps", algorithm.chunk_steps),
                                         ("algorithm.replay.batch_size", replay_cfg.batch_size),
                                         ("algorithm.replay.capacity", replay_cfg.capacity))
           if value % EPISODE_STEPS or (key.endswith("chunk_steps") and value != EPISODE_STEPS)}
    if bad:
        return (f"{', '.join(f'{k}={v}' for k, v in bad.items())}: the chunk must be one episode of EPISODE_STEPS="
                f"{EPISODE_STEPS} rows, and the batch and capacity multiples of it")
    return None


def main(argv: list[str]) -> int:
    why = check_config(argv)
    if why is not None:
        print(f"qmix_episode_batches: {why}", file=sys.stderr)
        return 2
    replay.ReplayBuffer._sample_rows = episode_rows  # this process only
    from marl_q.cli import main as marlq

    return marlq(argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
