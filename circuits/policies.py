"""The policy read-outs the quantum-RL papers train, beside ``raw``/``scaled``/``linear`` (``output:``):

- ``softmax`` (Jerbi et al. 2021): logits_a = beta <O_a> with O_a = sum_i w_(a,i) P_i, the P_i the
  observable family's readouts (Z products). beta (one trainable inverse temperature) and w (out_dim x
  readouts, trainable) start at 1 and at the ``sum`` grouping (w_(a,i) = 1 if i mod out_dim = a), so
  the first policy is softmax(sum of the readouts grouped per action). The actor's softmax then gives
  pi(a|s) = exp(beta <O_a>) / sum_b exp(beta <O_b>).
- ``born``: the action distribution is the measured bitstring distribution, partitioned: bitstring b
  (wire 0 the most significant bit) counts for action b mod |A|. The circuit's readout is the
  partition matrix itself (probabilities @ partition = action probabilities, on both engine paths; the
  PennyLane reference measures ``qml.probs`` and applies the same matrix). The head outputs
  log(max(p_a, BORN_CLAMP)): the actor's Categorical takes logits, and softmax(log p) = p because the
  p_a sum to 1, so sampling, log-probabilities and entropies are those of p. The clamp keeps the log
  finite for an action of (numerically) zero probability; such an action's log-probability reads
  log(1e-12) = -27.6 and carries no gradient.
"""
from __future__ import annotations

import numpy as np
import torch

BORN_CLAMP = 1e-12


def born_partition(n_qubits: int, n_actions: int) -> np.ndarray:
    """(2^n, |A|) 0/1 matrix: bitstring b -> action b mod |A|."""
    dim = 2**n_qubits
    partition = np.zeros((dim, n_actions))
    partition[np.arange(dim), np.arange(dim) % n_actions] = 1.0
    return partition


def born_log_probs(action_probs: torch.Tensor) -> torch.Tensor:
    """Logits for the actor's Categorical from action probabilities (see the module docstring)."""
    return torch.log(action_probs.clamp_min(BORN_CLAMP))


def observable_grouping(n_readouts: int, out_dim: int) -> torch.Tensor:
    """(out_dim, readouts): w_(a,i) = 1 if i mod out_dim = a (the ``sum`` output's grouping)."""
    weights = torch.zeros(out_dim, n_readouts)
    weights[torch.arange(n_readouts) % out_dim, torch.arange(n_readouts)] = 1.0
    return weights
