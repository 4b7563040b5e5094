"""Summaries of per-episode metrics shared by episodic algorithms."""
from __future__ import annotations

from typing import Any, Optional

import numpy as np


def episode_summary(rows: list[dict[str, Any]], solve_return: Optional[float], window: int = 100) -> dict[str, Any]:
    """final_return (mean of the last `window` episodes), best windowed mean, and steps_to_solve
    (global env steps when the `window`-episode training mean first reached `solve_return`)."""
    returns = np.array([float(r["return"]) for r in rows if "return" in r])
    out: dict[str, Any] = {"final_return": float(returns[-window:].mean()) if len(returns) else None,
                           "steps_to_solve": None, "time_to_solve": None, "best_mean_return": None}
    if len(returns) >= window:
        csum = np.concatenate([[0.0], np.cumsum(returns)])
        means = (csum[window:] - csum[:-window]) / window  # means[j] = mean of episodes j .. j+window-1
        out["best_mean_return"] = float(means.max())
        if solve_return is not None:
            hit = np.flatnonzero(means >= solve_return)
            if len(hit):
                row = rows_with_return(rows)[hit[0] + window - 1]
                out["steps_to_solve"] = int(row["env_steps"])
                out["time_to_solve"] = float(row["t"])  # virtual seconds in sim, wall seconds otherwise
    return out


def rows_with_return(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in rows if "return" in r]
