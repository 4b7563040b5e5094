"""Shared fixtures: one torch thread (2-core CI), registries loaded, small configs."""
from __future__ import annotations

import copy
from typing import Any

import pytest
import torch

torch.set_num_threads(1)


def pytest_report_header(config: pytest.Config) -> str:
    """Name the machine's numerics class, which decides whether the goldens check bytes or traces."""
    from tests.golden.goldens import load_hashes, numerics_class

    cls = numerics_class()
    kind = "traces and bytes" if cls.name in load_hashes() else "traces only (no bytes recorded for this class)"
    return f"golden numerics class: {cls.describe()}: goldens check {kind}"

CARTPOLE_SMALL: dict[str, Any] = {
    "run": {"seed": 0, "total_env_steps": 1200, "progress": False, "plots": False, "checkpoint_every": 5},
    "backend": {"name": "sim", "workers": 2},
    "scenario": {"name": "cartpole", "num_envs": 4},
    "algorithm": {"name": "a3c", "n_steps": 5},
    "actor": {"head": "mlp", "hidden": [16, 16], "out_gain": 0.01},
    "critic": {"head": "mlp", "hidden": [16, 16]},
    "server": {"aggregation": "hogwild"},
}


@pytest.fixture
def small_raw() -> dict[str, Any]:
    """A tiny CartPole A3C config as a raw mapping (fresh copy per test)."""
    return copy.deepcopy(CARTPOLE_SMALL)
