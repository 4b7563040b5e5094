"""Optimizers for the server's flat parameter vector: the hot path of every pushed gradient.

torch.optim spends ~100 us of Python per step on one tensor; these do the same arithmetic in a
handful of in-place ops (tested step by step against torch.optim's RMSprop, Adam and SGD).
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator, Literal

import torch

LrSchedule = Literal["constant", "linear"]  # a learner's ``algorithm.lr_schedule``


def lr_factor(schedule: LrSchedule, progress: float) -> float:
    """What a scheduled learning rate is of its configured value at ``progress``, the fraction of the
    run's budget used (``Context.progress``, in [0, 1]): ``constant`` 1; ``linear`` 1 - progress (annealed
    to 0 over the budget). One rule for every learner that schedules its rate: the server's
    ``ParameterService`` (actor-critic) and the Q-learners' ``ReplayService``. A rate at a checkpoint
    is this function of the run's progress, so a resumed run sets the same rate as the uninterrupted one."""
    if schedule == "linear":
        return max(0.0, 1.0 - progress)
    if schedule == "constant":
        return 1.0
    raise ValueError(f"lr_schedule: 'constant' or 'linear', got {schedule!r}")


class FlatOptimizer:
    """step(grad) updates ``param`` in place; ``lr`` may be changed between steps (schedules)."""

    def __init__(self, param: torch.Tensor, lr: float) -> None:
        self.param = param
        self.lr = lr
        self.steps = 0

    @torch.no_grad()
    def step(self, grad: torch.Tensor) -> None:
        raise NotImplementedError

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {"steps": torch.tensor(self.steps)}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        self.steps = int(state["steps"])


class FlatSGD(FlatOptimizer):
    @torch.no_grad()
    def step(self, grad: torch.Tensor) -> None:
        self.param.add_(grad, alpha=-self.lr)
        self.steps += 1


class FlatRMSprop(FlatOptimizer):
    """torch.optim.RMSprop without momentum or centering: v = a v + (1-a) g^2; p -= lr g / (sqrt(v) + eps)."""

    def __init__(self, param: torch.Tensor, lr: float, alpha: float = 0.99, eps: float = 1e-8) -> None:
        super().__init__(param, lr)
        self.alpha, self.eps = alpha, eps
        self.square_avg = torch.zeros_like(param)
        self._buf = torch.empty_like(param)

    @torch.no_grad()
    def step(self, grad: torch.Tensor) -> None:
        self.square_avg.mul_(self.alpha).addcmul_(grad, grad, value=1.0 - self.alpha)
        torch.sqrt(self.square_avg, out=self._buf).add_(self.eps)
        self.param.addcdiv_(grad, self._buf, value=-self.lr)
        self.steps += 1

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {**super().state_dict(), "square_avg": self.square_avg.clone()}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        super().load_state_dict(state)
        self.square_avg.copy_(state["square_avg"])


class FlatAdam(FlatOptimizer):
    """torch.optim.Adam (no weight decay, no amsgrad), with bias correction."""

    def __init__(self, param: torch.Tensor, lr: float, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8) -> None:
        super().__init__(param, lr)
        self.b1, self.b2 = betas
        self.eps = eps
        self.exp_avg = torch.zeros_like(param)
        self.exp_avg_sq = torch.zeros_like(param)
        self._buf = torch.empty_like(param)

    @torch.no_grad()
    def step(self, grad: torch.Tensor) -> None:
        self.steps += 1
        self.exp_avg.lerp_(grad, 1.0 - self.b1)
        self.exp_avg_sq.mul_(self.b2).addcmul_(grad, grad, value=1.0 - self.b2)
        bias1 = 1.0 - self.b1 ** self.steps
        bias2_sqrt = (1.0 - self.b2 ** self.steps) ** 0.5
        torch.sqrt(self.exp_avg_sq, out=self._buf).div_(bias2_sqrt).add_(self.eps)
        self.param.addcdiv_(self.exp_avg, self._buf, value=-self.lr / bias1)

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {**super().state_dict(), "exp_avg": self.exp_avg.clone(), "exp_avg_sq": self.exp_avg_sq.clone()}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        super().load_state_dict(state)
        self.exp_avg.copy_(state["exp_avg"])
        self.exp_avg_sq.copy_(state["exp_avg_sq"])


@torch.no_grad()
def clip_flat_grad(grad: torch.Tensor, views: list[torch.Tensor], max_norm: float) -> torch.Tensor:
    """``nn.utils.clip_grad_norm_`` over parameters whose gradients ``views`` are views of the flat
    ``grad``, to the bit: the same per-tensor norms and their norm, and one multiply of the whole buffer
    by min(1, max_norm / (norm + 1e-6)) instead of one per tensor. Returns the total norm."""
    total = torch.linalg.vector_norm(torch.stack(torch._foreach_norm(views, 2.0)), 2.0)
    grad.mul_(torch.clamp(max_norm / (total + 1e-6), max=1.0))
    return total


@contextmanager
def flush_denormals() -> Iterator[None]:
    """Subnormal floats read as zero and results that would be subnormal are zero inside the block
    (the CPU's FTZ/DAZ flags, this thread), then the default again. A subnormal operand costs an x86 core
    about a hundred cycles: Adam's moments of a parameter whose gradient stays zero (a dead ReLU unit)
    decay by beta each step down through them, and a DQN's update on SB3's CartPole settings then spent
    ~40% of its Adam time there. The values they stand for (below 1.2e-38) move no parameter of normal
    size. torch has no getter for the flag; marl-q sets it nowhere else."""
    torch.set_flush_denormal(True)
    try:
        yield
    finally:
        torch.set_flush_denormal(False)
