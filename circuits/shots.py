"""Finite shots: measured bitstrings drawn from a circuit's exact outcome distribution, with a seeded
generator that a head owns and a sim snapshot carries (docs/circuits.md, "Shots, noise and hardware
gradients").

One circuit execution with s shots measures s bitstrings; every readout (a product of Z, or P(0)) is
computed from the same bitstrings, as PennyLane does (its Z-basis measurements commute and are
taken from one sample per execution). So the counts of the 2^n bitstrings are drawn as one
multinomial(s, p) per batch row, and the readouts of a row are correlated exactly as on hardware.
The multinomial is drawn as a binary tree of binomials, wire by wire (the count of a prefix splits
into its two children with the conditional probability of the next bit): 2^n - 1 binomial draws per
row in n vectorised calls, instead of s categorical draws.
"""
from __future__ import annotations

from typing import Callable, Iterable

import numpy as np
import torch
from torch import nn


def child_seed(seed: int) -> int:
    """A head's default sampling seed from its ``seed`` key or torch's initial seed: an independent
    child stream (numpy SeedSequence spawn), so that it does not repeat the generator of the weights."""
    return int(np.random.SeedSequence(int(seed)).spawn(1)[0].generate_state(1, dtype=np.uint64)[0])


class ShotSampler:
    """A seeded ``torch.Generator`` that pickles: its state travels with the module (a sim snapshot,
    a deepcopy), so a resumed or copied head continues the same stream."""

    def __init__(self, seed: int) -> None:
        self.reseed(seed)

    def reseed(self, seed: int) -> None:
        """Restart the stream from ``seed``."""
        self.seed = int(seed)
        self.generator = torch.Generator().manual_seed(self.seed)

    def counts(self, probabilities: torch.Tensor, shots: int) -> torch.Tensor:
        """Bitstring counts (B, 2^n), one multinomial(shots, p_b) per row, in float64 on the CPU."""
        p = probabilities.detach().to("cpu", torch.float64).clamp_min(0.0)
        batch, dim = p.shape
        levels = [p]  # levels[k]: probabilities of the 2^(n-k) prefixes ... up to the root
        while levels[-1].shape[1] > 1:
            levels.append(levels[-1].reshape(batch, -1, 2).sum(-1))
        counts = torch.full((batch, 1), float(shots), dtype=torch.float64)
        for level in reversed(levels[:-1]):
            pairs = level.reshape(batch, -1, 2)
            total = pairs.sum(-1)
            first = torch.where(total > 0, pairs[..., 0] / total.clamp_min(1e-300), torch.zeros_like(total)).clamp(0.0, 1.0)
            left = torch.binomial(counts, first, generator=self.generator)
            counts = torch.stack([left, counts - left], dim=-1).reshape(batch, -1)
        return counts

    def frequencies(self, probabilities: torch.Tensor, shots: int) -> torch.Tensor:
        """Measured frequencies of the bitstrings (counts / shots), on probabilities' device and dtype."""
        counts = self.counts(probabilities, shots)
        return (counts / shots).to(device=probabilities.device, dtype=probabilities.dtype)

    def rademacher(self, shape: torch.Size | tuple[int, ...], like: torch.Tensor) -> torch.Tensor:
        """A tensor of independent +-1 entries (SPSA's perturbation), like ``like`` in device and dtype."""
        signs = torch.randint(0, 2, tuple(shape), generator=self.generator).mul_(2).sub_(1)
        return signs.to(device=like.device, dtype=like.dtype)


def sampling_heads(modules: Iterable[nn.Module]) -> list[nn.Module]:
    """Every circuit head inside ``modules`` that draws random numbers (shots or SPSA), in module order."""
    found = []
    for module in modules:
        for sub in module.modules():
            if isinstance(sub.__dict__.get("sampler"), ShotSampler):
                found.append(sub)
    return found


def seed_heads(modules: Iterable[nn.Module], seed_of: Callable[[int], int]) -> int:
    """Seed the k-th sampling head inside ``modules`` with ``seed_of(k)`` (a worker's own streams, e.g.
    ``marl_q.seeding.derive(run_seed, "shots", worker, k)``); returns how many were seeded."""
    heads = sampling_heads(modules)
    for k, head in enumerate(heads):
        head.sampler.reseed(seed_of(k))
    return len(heads)
