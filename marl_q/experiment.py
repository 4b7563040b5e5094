"""Experiment: a resolved config -> a run directory with metrics, ledger, summary and plots."""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Optional

import torch

from marl_q.config import ExperimentConfig
from marl_q.registry import BACKENDS
from marl_q.rundir import make_run_dir
from marl_q.runtime import Runtime


def run_experiment(cfg: ExperimentConfig, out: Optional[Path], plots: Optional[bool] = None) -> dict[str, Any]:
    """Run ``cfg`` on its backend; write everything under ``out`` (None: keep nothing on disk)."""
    backend = BACKENDS.get(cfg.backend.name, key="backend.name").obj
    if out is not None:
        out = make_run_dir(Path(out))
        (out / "config.yaml").write_text(cfg.to_yaml())
    torch.set_num_threads(cfg.backend.threads_per_worker)
    rt = Runtime(cfg, out)
    summary = backend(rt)
    if out is not None and (cfg.run.plots if plots is None else plots):
        try:
            from marl_q.registry import PLOTS

            PLOTS.get("standard").obj([out], out / "plots")
        except Exception as exc:  # a plot failure must not lose the run
            print(f"marlq: plotting failed ({exc}); the run itself is saved", file=sys.stderr)
    return summary
