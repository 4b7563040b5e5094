"""The run directory: config.yaml, metrics.csv, comm.csv, summary.json, checkpoints/, plots/.

Checkpoints are .npz archives of plain arrays plus one JSON header; loading uses
``allow_pickle=False``, so a checkpoint can never run code. Writes go to a temporary file that is
renamed into place, so a crash mid-write leaves the previous checkpoint intact.
"""
from __future__ import annotations

import csv
import json
import math
import os
import time
import zipfile
from pathlib import Path
from typing import IO, Any, Optional

import numpy as np

from marl_q.errors import CheckpointError, RunDirError

RUN_FILES = ("config.yaml", "metrics.csv", "comm.csv", "summary.json")
CKPT_META = "__meta__"


class MetricsWriter:
    """Streams one row per finished episode to metrics.csv with a fixed column order."""

    BASE = ["t", "worker", "env_steps", "episode"]

    def __init__(self, path: Optional[Path], fields: list[str], flush_every: int = 256) -> None:
        """Rows go to ``path``; each row's wall clock goes to a sidecar ``metrics_wall.csv``
        (episode, wall_s), so that metrics.csv of a sim run is byte-identical across runs."""
        self.columns = self.BASE + [f for f in fields if f not in self.BASE]
        self._file: Optional[IO[str]] = open(path, "w", newline="") if path is not None else None
        self._writer = csv.writer(self._file) if self._file else None
        self._wall_file: Optional[IO[str]] = None
        if self._writer:
            self._writer.writerow(self.columns)
            self._wall_file = open(Path(path).with_name("metrics_wall.csv"), "w", newline="")
            self._wall_writer = csv.writer(self._wall_file)
            self._wall_writer.writerow(["episode", "wall_s"])
        self._t0 = time.perf_counter()
        self._walls: list[tuple] = []
        self._pending: list[list[Any]] = []
        self.flush_every = flush_every
        self.rows: list[dict[str, Any]] = []

    def write(self, row: dict[str, Any]) -> None:
        self.rows.append(row)
        self._pending.append([_fmt(row.get(c, "")) for c in self.columns])
        self._walls.append((row.get("episode", ""), f"{time.perf_counter() - self._t0:.6f}"))
        if len(self._pending) >= self.flush_every:
            self.flush()

    def flush(self) -> None:
        if self._writer and self._pending:
            self._writer.writerows(self._pending)
            self._wall_writer.writerows(self._walls)
            self._file.flush()
            self._wall_file.flush()
        self._pending.clear()
        self._walls.clear()

    def close(self) -> None:
        self.flush()
        if self._file:
            self._file.close()
            self._wall_file.close()
            self._file = self._wall_file = None


def _fmt(value: Any) -> Any:
    """Deterministic text for numbers (the shortest repr of the float)."""
    if isinstance(value, (float, np.floating)):
        value = float(value)
        return repr(value) if math.isfinite(value) else str(value)
    if isinstance(value, np.integer):
        return int(value)
    return value


def make_run_dir(path: Path) -> Path:
    """Create a fresh run directory (an existing non-empty one is refused, so nothing is overwritten)."""
    path = Path(path)
    if path.exists() and any(path.iterdir()):
        raise RunDirError(f"{path}: already exists and is not empty; choose another --out")
    (path / "checkpoints").mkdir(parents=True, exist_ok=True)
    (path / "plots").mkdir(exist_ok=True)
    return path


def is_run_dir(path: Path) -> bool:
    return (Path(path) / "config.yaml").is_file() and (Path(path) / "metrics.csv").is_file()


def write_json_atomic(path: Path, data: Any) -> None:
    tmp = Path(str(path) + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True, default=_json_default) + "\n")
    os.replace(tmp, path)


def _json_default(obj: Any) -> Any:
    if isinstance(obj, np.integer):
        return int(obj)
    if isinstance(obj, np.floating):
        return float(obj)
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")


def save_checkpoint(path: Path, arrays: dict[str, np.ndarray], meta: dict[str, Any]) -> None:
    """Write arrays + a JSON header atomically (temp file, fsync, rename)."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    header = np.frombuffer(json.dumps(meta, sort_keys=True, default=_json_default).encode(), dtype=np.uint8)
    with open(tmp, "wb") as fh:
        np.savez(fh, **{CKPT_META: header}, **{k: np.asarray(v) for k, v in arrays.items()})
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def load_checkpoint(path: Path) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """Read a checkpoint; a missing, truncated or corrupt file raises CheckpointError (nothing written)."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path}: no such checkpoint")
    try:
        with np.load(path, allow_pickle=False) as data:
            arrays = {k: data[k] for k in data.files}
    except (zipfile.BadZipFile, ValueError, OSError, EOFError, KeyError) as exc:
        raise CheckpointError(f"{path}: truncated or corrupt checkpoint ({type(exc).__name__}: {exc})") from None
    if CKPT_META not in arrays:
        raise CheckpointError(f"{path}: not a marl-q checkpoint (no header)")
    try:
        meta = json.loads(arrays.pop(CKPT_META).tobytes().decode())
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"{path}: corrupt checkpoint header ({exc})") from None
    return arrays, meta


def latest_checkpoint(run_dir: Path) -> Optional[Path]:
    ckpts = sorted((Path(run_dir) / "checkpoints").glob("ckpt_*.npz"), key=lambda p: int(p.stem.split("_")[1]))
    return ckpts[-1] if ckpts else None
