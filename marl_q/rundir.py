"""The run directory: config.yaml, metrics.csv, comm.csv, summary.json, checkpoints/, plots/.

Checkpoints are .npz archives of plain arrays plus one JSON header; loading uses
``allow_pickle=False``, so a checkpoint can never run code. Writes go to a temporary file that is
renamed into place, so a crash mid-write leaves the previous checkpoint intact. A sim run's
checkpoint also points to a snapshot of the simulation (workers, environments, events in flight)
for exact resume, in the versioned state format of ``marl_q.state_format`` (older versions are
upgraded by its one migration table); its SHA-256 sits in the checkpoint's header and is checked
before the snapshot is unpickled, so only a snapshot this run wrote is ever loaded.
"""
from __future__ import annotations

import copyreg
import csv
import hashlib
import io
import json
import math
import os
import pickle
import shutil
import time
import zipfile
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Optional

import numpy as np

from marl_q.errors import CheckpointError, RunDirError, RunWriteError, UserError
from marl_q.state_format import pack, unpack

if TYPE_CHECKING:
    from marl_q.config import ExperimentConfig

RUN_FILES = ("config.yaml", "metrics.csv", "comm.csv", "summary.json")
CKPT_META = "__meta__"


def write_row_pair(file: IO[str], writer: Any, rows: list, wall_file: Optional[IO[str]], wall_writer: Any,
                   walls: list) -> None:
    """Append rows to a run file and its wall-clock sidecar, if it has one (metrics.csv / comm.csv and
    their *_wall.csv) and flush both; a failed write (no space, directory gone) raises RunWriteError
    naming the file, which ends the run with one line. The rows then go to the run's tracker, if any."""
    try:
        writer.writerows(rows)
        file.flush()
        if wall_file is not None:
            wall_writer.writerows(walls)
            wall_file.flush()
    except OSError as exc:
        raise RunWriteError(file.name, exc) from None
    tap_rows(file.name, rows)


_TAPS: dict[str, Any] = {}  # run directory (absolute) -> its tracker (marl_q.tracking), which sees every row


def tap_rows(path: Any, rows: list) -> None:
    """Hand rows just written to run file ``path`` (values in the file's column order) to the tracker of
    its run directory, if it has one. Every writer of a run's CSV rows calls this after writing."""
    if _TAPS:
        tap = _TAPS.get(os.path.dirname(os.path.abspath(path)))
        if tap is not None:
            tap.rows(Path(path), rows)


def set_tap(run_dir: Path, tap: Optional[Any]) -> None:
    """Attach (or, with None, detach) the tracker that sees every row written in ``run_dir``."""
    key = os.path.abspath(run_dir)
    if tap is None:
        _TAPS.pop(key, None)
    else:
        _TAPS[key] = tap


class MetricsWriter:
    """The one writer of a run's CSV files: metrics.csv, comm.csv (``marl_q.ledger``), quantum.csv,
    train.csv (through ``LazyMetricsFile``) and eval.csv, each streamed with a fixed column order and,
    but for eval.csv, a wall-clock sidecar ``<name>_wall.csv``."""

    BASE = ["t", "worker", "env_steps", "episode"]

    def __init__(self, path: Optional[Path], fields: list[str], flush_every: int = 256,
                 resume_at: Optional[tuple[int, ...]] = None, wall_offset: float = 0.0,
                 wall_fields: tuple[str, ...] = (), base: Optional[list[str]] = None,
                 flush_s: Optional[float] = None, sidecar: bool = True) -> None:
        """Rows go to ``path``; each row's wall clock goes to a sidecar ``metrics_wall.csv``
        (episode, wall_s), so that metrics.csv of a sim run is byte-identical across runs. Columns in
        ``wall_fields`` are wall-clock measurements too (an agent's compute seconds, say): they go to
        the sidecar, after wall_s, and never into metrics.csv. ``sidecar=False``: no sidecar.

        ``resume_at`` = (bytes of metrics.csv, bytes of metrics_wall.csv) at a checkpoint: both files
        are cut back to that point and writing goes on from there (what `marlq resume` needs).

        ``rows`` (every row so far, for the algorithm's summary) is kept in memory only without a file;
        with one it is read back from the file when asked for, so a long run's memory does not grow
        with its episodes.

        ``base``: the first columns (default BASE), the last of which numbers the rows and keys the
        sidecar (metrics.csv's episode; train.csv's update; comm.csv's id). Rows are written every
        ``flush_every`` rows, and with ``flush_s`` also once that many wall seconds have passed since
        the last write (a slow run's file, read while it runs, stays a few seconds behind at most)."""
        self.base = list(base or self.BASE)
        self.key = self.base[-1]
        self.wall_fields = [f for f in wall_fields if f not in self.base]
        self.columns = self.base + [f for f in fields if f not in self.base and f not in self.wall_fields]
        self._key_index = self.columns.index(self.key)
        self._t0 = time.perf_counter() - wall_offset
        self._walls: list[tuple] = []
        self._pending: list[Any] = []
        self.flush_every = flush_every
        self.flush_s = flush_s
        self._flushed_at = 0.0
        self._rows: list[dict[str, Any]] = []  # without a file only
        self._path = Path(path) if path is not None else None
        self._file: Optional[IO[str]] = None
        self._wall_file: Optional[IO[str]] = None
        self._writer = self._wall_writer = None
        if path is None:
            return
        wall_path = Path(path).with_name(Path(path).stem + "_wall.csv")  # metrics.csv -> metrics_wall.csv
        if resume_at is None:
            self._file = open(path, "w", newline="")
            self._wall_file = open(wall_path, "w", newline="") if sidecar else None
        else:
            self._file = reopen_at(path, resume_at[0])
            self._wall_file = reopen_at(wall_path, resume_at[1]) if sidecar else None
        self._writer = csv.writer(self._file)
        self._wall_writer = csv.writer(self._wall_file) if sidecar else None
        if resume_at is None:
            self._writer.writerow(self.columns)
            if sidecar:
                self._wall_writer.writerow([self.key, "wall_s"] + self.wall_fields)

    def position(self) -> tuple[int, ...]:
        """Flush, then (bytes of metrics.csv, bytes of metrics_wall.csv): a checkpoint's resume point
        (one number without a sidecar)."""
        self.flush()
        if self._file is None:
            return (0, 0)
        if self._wall_file is None:
            return (self._file.tell(),)
        return (self._file.tell(), self._wall_file.tell())

    def wall_s(self) -> float:
        """Wall seconds of this file's clock (since the run started, its earlier lives included)."""
        return time.perf_counter() - self._t0

    @property
    def rows(self) -> list[dict[str, Any]]:
        """Every row written so far (with a file: read back from it, numbers parsed, empty cells left out)."""
        if self._file is None:
            return self._rows
        self.flush()
        return read_metric_rows(self._path, self._file.tell())

    @property
    def pending(self) -> list[Any]:
        """The rows not written yet (each its values in column order)."""
        return list(self._pending)

    def write(self, row: dict[str, Any]) -> None:
        """One row: its values by column name (missing ones left empty; numbers in their shortest text)."""
        if self._file is None:
            self._rows.append(row)
        self._pending.append([_fmt(row.get(c, "")) for c in self.columns])
        wall = time.perf_counter() - self._t0
        self._walls.append((row.get(self.key, ""), f"{wall:.6f}", *(_fmt(row.get(c, "")) for c in self.wall_fields)))
        self._maybe_flush(wall)

    def write_values(self, values: tuple) -> None:
        """One row given as its values in column order, already as they are to be written (text or
        ints; the ledger's rows, one per message, skip the dict)."""
        self._pending.append(values)
        wall = time.perf_counter() - self._t0
        self._walls.append((values[self._key_index], f"{wall:.6f}"))
        self._maybe_flush(wall)

    def write_lines(self, text: str, keys: list, perf_times: list[float]) -> None:
        """Rows given as their CSV text (values that need no quoting, each line ended by ``\\r\\n`` as the
        csv module ends it), with each row's key and the ``time.perf_counter()`` at which it happened
        for the sidecar: what many ``write_values`` calls would write, in one write (the seed-batched
        learner's per-update rows, kept as columns and written a block at a time). Rows still pending
        are written first, so the file keeps its order."""
        self.flush()
        if self._file is None:
            for values in csv.reader(io.StringIO(text, newline="")):
                self._rows.append({c: _parse(v) for c, v in zip(self.columns, values) if v != ""})
            return
        t0 = self._t0
        walls = "".join([f"{key},{p - t0:.6f}\r\n" for key, p in zip(keys, perf_times)])
        try:
            self._file.write(text)
            self._file.flush()
            if self._wall_file is not None:
                self._wall_file.write(walls)
                self._wall_file.flush()
        except OSError as exc:
            raise RunWriteError(self._file.name, exc) from None
        if _TAPS:
            tap_rows(self._file.name, list(csv.reader(io.StringIO(text, newline=""))))
        self._flushed_at = time.perf_counter() - t0

    def _maybe_flush(self, wall: float) -> None:
        if len(self._pending) >= self.flush_every or (self.flush_s is not None and wall - self._flushed_at >= self.flush_s):
            self.flush()

    def flush(self) -> None:
        self._flushed_at = time.perf_counter() - self._t0
        if self._writer and self._pending:
            write_row_pair(self._file, self._writer, self._pending, self._wall_file, self._wall_writer, self._walls)
        self._pending.clear()
        self._walls.clear()

    def close(self) -> None:
        self.flush()
        if self._file:
            self._file.close()
            if self._wall_file is not None:
                self._wall_file.close()
            self._file = self._wall_file = None
            self._writer = self._wall_writer = None

    def abandon(self) -> None:
        """Close without writing what is pending (a run file could not be written: each close may fail
        the same way, and the last good checkpoint is what a resume starts from)."""
        self._pending.clear()
        self._walls.clear()
        for fh in (self._file, self._wall_file):
            try:
                if fh is not None:
                    fh.close()
            except OSError:
                pass
        self._file = self._wall_file = None
        self._writer = self._wall_writer = None


class FileLog:
    """The flush/close/abandon of a run file kept by a log object (train.csv's TrainLog, comm.csv's Ledger,
    quantum.csv's QuantumLedger, returns.csv's ReturnsLog): each holds its file as ``self.file``, a
    MetricsWriter or LazyMetricsFile, or None when the run writes no file (LazyMetricsFile itself is one,
    around the MetricsWriter it makes at its first row)."""

    file: Any = None

    def flush(self) -> None:
        if self.file is not None:
            self.file.flush()

    def close(self) -> None:
        if self.file is not None:
            self.file.close()

    def abandon(self) -> None:
        """Close without writing what is pending (``MetricsWriter.abandon``)."""
        if self.file is not None:
            self.file.abandon()


class LazyMetricsFile(FileLog):
    """A MetricsWriter made at its first row (a run that writes none has no file), continuing from a
    checkpoint's byte ``position``: the shape quantum.csv, train.csv and eval.csv share."""

    def __init__(self, path: Path, fields: list[str], position: Optional[list[int]] = None, **kwargs: Any) -> None:
        self.path, self.fields, self.kwargs = path, fields, kwargs
        self._position = position
        self.writer: Optional[MetricsWriter] = None
        self._abandoned = False

    def write(self, row: dict[str, Any]) -> None:
        if self._abandoned:
            return
        if self.writer is None:
            resume_at = tuple(self._position) if self._position else None
            self.writer = MetricsWriter(self.path, self.fields, resume_at=resume_at, **self.kwargs)
        self.writer.write(row)

    def position(self) -> Optional[list[int]]:
        return list(self.writer.position()) if self.writer is not None else self._position

    @property
    def file(self) -> Optional[MetricsWriter]:  # FileLog's flush/close/abandon act on it
        return self.writer

    def abandon(self) -> None:
        """``MetricsWriter.abandon``; no file is made after it."""
        self._abandoned = True
        super().abandon()


def _fmt(value: Any) -> Any:
    """Deterministic text for numbers (the shortest repr of the float)."""
    if isinstance(value, (float, np.floating)):
        value = float(value)
        return repr(value) if math.isfinite(value) else str(value)
    if isinstance(value, np.integer):
        return int(value)
    return value


def reopen_at(path: Path, offset: int) -> IO[str]:
    """Open a run file for appending after cutting it back to ``offset`` bytes (a checkpoint's
    position); a file shorter than that means the run directory does not match the checkpoint."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path}: missing, but the checkpoint expects {offset} bytes of it")
    size = path.stat().st_size
    if size < offset:
        raise CheckpointError(f"{path}: {size} bytes, shorter than the checkpoint's position {offset}; "
                              "this checkpoint does not belong to this run directory")
    with open(path, "r+b") as fh:
        fh.truncate(offset)
    return open(path, "a", newline="")


def read_metric_rows(path: Path, offset: int) -> list[dict[str, Any]]:
    """The rows of metrics.csv before ``offset`` bytes, numbers parsed back (int, else float); an empty
    cell (a field that row did not have) is left out of its dict, as it was when written."""
    with open(path, "rb") as fh:
        text = fh.read(offset).decode()
    reader = csv.reader(io.StringIO(text, newline=""))
    header = next(reader, None)
    if header is None:
        return []
    return [{k: _parse(v) for k, v in zip(header, values) if v != ""} for values in reader]


def _parse(text: str) -> Any:
    if text == "":
        return ""
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def check_new_run_dir(path: Path) -> None:
    """Refuse an existing non-empty directory as a new run's (so nothing is overwritten)."""
    path = Path(path)
    if path.exists() and any(path.iterdir()):
        raise RunDirError(f"{path}: already exists and is not empty; choose another --out")


def make_run_dir(path: Path) -> Path:
    """Create a fresh run directory (an existing non-empty one is refused, so nothing is overwritten)."""
    path = Path(path)
    check_new_run_dir(path)
    (path / "checkpoints").mkdir(parents=True, exist_ok=True)
    (path / "plots").mkdir(exist_ok=True)
    return path


def missing_folders(path: Path) -> list[Path]:
    """``path`` and those of its parents that do not exist yet, deepest first: what `make_run_dir` creates."""
    path = Path(path).absolute()
    return [p for p in [path, *path.parents] if not p.exists()]


def discard_run_dir(path: Path, created: list[Path]) -> None:
    """Undo a run that failed to start: remove what it wrote in ``path`` (empty or absent before, as
    `make_run_dir` made sure), then the folders of ``created`` (``missing_folders`` taken before it was
    made) that are empty now. Nothing that existed before is touched."""
    path = Path(path)
    if path.is_dir():
        for child in path.iterdir():
            if child.is_dir() and not child.is_symlink():
                shutil.rmtree(child, ignore_errors=True)
            else:
                child.unlink(missing_ok=True)
    for folder in created:
        try:
            folder.rmdir()  # only when empty
        except FileNotFoundError:
            continue
        except OSError:
            break  # not empty: its parents are not either


def _take_lock(fh: IO[str]) -> Optional[str]:
    """Try to take the exclusive lock of an open .lock file: None when taken, else who holds it."""
    import fcntl

    try:
        fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        fh.seek(0)
        return fh.read().strip() or "another process"
    return None


def lock_run_dir(path: Path) -> IO[str]:
    """Hold an exclusive lock on the run directory for as long as the returned file stays open (the
    kernel drops it when the process ends, however it ends): a second `marlq resume` of a run that is
    still going is refused instead of writing the same files."""
    fh = open(Path(path) / ".lock", "a+")
    holder = _take_lock(fh)
    if holder is not None:
        fh.close()
        raise RunDirError(f"{path}: in use by a running marlq ({holder}); wait for it or stop it first")
    fh.seek(0)
    fh.truncate()
    fh.write(f"pid {os.getpid()}")
    fh.flush()
    return fh


def run_dir_holder(path: Path) -> Optional[str]:
    """Who holds the run directory's lock (``lock_run_dir``) now ("pid N"), or None when no running marlq
    does (no lock file, or its lock free): asked before a run directory is moved or written by another
    command (``marlq sweep`` keeping an incomplete run aside). The probe's own lock ends with its file."""
    lock = Path(path) / ".lock"
    if not lock.is_file():
        return None
    with open(lock, "a+") as fh:
        return _take_lock(fh)


# The per-message and per-update logs, the bulk of a long run's bytes (about 290 bytes per env step of
# a one-step A2C: two comm.csv rows and a train.csv row per update, and their wall-clock sidecars).
# With run.compress_logs a finished run keeps them gzip-compressed (``archive_run_files``); every
# reader opens either form (``open_run_text``), and a resume decompresses them first.
COMPRESSIBLE_FILES = ("comm.csv", "comm_wall.csv", "train.csv", "train_wall.csv")
GZ = ".gz"


def archive_run_files(run_dir: Path) -> list[Path]:
    """Compress a finished run's ``COMPRESSIBLE_FILES`` to ``<name>.gz`` (gzip level 1, no name or time
    in the header, so the same file gives the same bytes) and remove the plain files; each is written to
    a temporary file and renamed, and its plain file removed only then. Returns the files written."""
    import gzip

    done = []
    for name in COMPRESSIBLE_FILES:
        src = Path(run_dir) / name
        if not src.is_file():
            continue
        dst = src.with_name(name + GZ)
        tmp = src.with_name(name + GZ + ".tmp")
        try:
            with open(src, "rb") as fh, open(tmp, "wb") as raw, \
                    gzip.GzipFile(filename="", mode="wb", compresslevel=1, fileobj=raw, mtime=0) as gz:
                shutil.copyfileobj(fh, gz, 1 << 20)
            os.replace(tmp, dst)
        except OSError as exc:
            tmp.unlink(missing_ok=True)
            raise RunWriteError(str(dst), exc) from None
        src.unlink()
        done.append(dst)
    return done


def unarchive_run_files(run_dir: Path) -> list[Path]:
    """Undo ``archive_run_files`` (before a resume appends to the files): each ``<name>.gz`` without its
    plain file back to ``<name>``; returns the files written."""
    import gzip

    done = []
    for name in COMPRESSIBLE_FILES:
        dst = Path(run_dir) / name
        src = dst.with_name(name + GZ)
        if dst.exists() or not src.is_file():
            continue
        tmp = dst.with_name(name + ".tmp")
        try:
            with gzip.open(src, "rb") as gz, open(tmp, "wb") as fh:
                shutil.copyfileobj(gz, fh, 1 << 20)
            os.replace(tmp, dst)
        except (OSError, EOFError) as exc:
            tmp.unlink(missing_ok=True)
            raise RunDirError(f"{src}: cannot be decompressed ({exc})") from None
        src.unlink()
        done.append(dst)
    return done


def run_file(path: Path) -> Optional[Path]:
    """The run file ``path`` as it is on disk: itself, else its compressed ``<name>.gz``, else None."""
    path = Path(path)
    if path.is_file():
        return path
    gz = path.with_name(path.name + GZ)
    return gz if gz.is_file() else None


def open_run_text(path: Path) -> IO[str]:
    """Open a run file for reading as CSV text (``newline=""``), plain or compressed (``run_file``)."""
    found = run_file(path)
    if found is None:
        raise FileNotFoundError(f"{path}: no such file (nor {Path(path).name}{GZ})")
    if found.suffix == GZ:
        import gzip

        return gzip.open(found, "rt", newline="")
    return open(found, newline="")


def is_run_dir(path: Path) -> bool:
    return (Path(path) / "config.yaml").is_file() and (Path(path) / "metrics.csv").is_file()


def write_json_atomic(path: Path, data: Any) -> None:
    tmp = Path(str(path) + ".tmp")
    text = json.dumps(data, indent=2, sort_keys=True, default=_json_default) + "\n"
    try:
        tmp.write_text(text)
        os.replace(tmp, path)
    except OSError as exc:
        _discard(tmp)
        raise RunWriteError(path, exc) from None


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
    try:
        with open(tmp, "wb") as fh:
            np.savez(fh, **{CKPT_META: header}, **{k: np.asarray(v) for k, v in arrays.items()})
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except OSError as exc:  # no space, directory removed or read-only: the older checkpoints are untouched
        _discard(tmp)
        raise RunWriteError(path, exc) from None


def _discard(path: Path) -> None:
    """Remove a half-written temporary file if it can be (it may be what filled the disk)."""
    try:
        path.unlink(missing_ok=True)
    except OSError:
        pass


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


SERVICE_PREFIX = "service."  # checkpoint arrays of the server's service carry this prefix


def service_arrays(arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The service's state from a checkpoint's arrays, keys without the prefix (what load_state_dict takes)."""
    return {k[len(SERVICE_PREFIX):]: v for k, v in arrays.items() if k.startswith(SERVICE_PREFIX)}


def latest_checkpoint(run_dir: Path) -> Optional[Path]:
    ckpts = checkpoints(run_dir)
    return ckpts[-1] if ckpts else None


def checkpoints(run_dir: Path) -> list[Path]:
    """The run's checkpoints, oldest first (by server updates)."""
    return sorted((Path(run_dir) / "checkpoints").glob("ckpt_*.npz"), key=checkpoint_updates)


def checkpoint_updates(path: Path) -> int:
    """The server updates a checkpoint file was written at (from its name ckpt_<updates>.npz); -1 if not one."""
    try:
        return int(path.name.split(".")[0].split("_")[1])
    except (IndexError, ValueError):
        return -1


def save_snapshot(path: Path, state: dict[str, Any]) -> str:
    """Write a sim backend's full state (workers, events in flight, RNGs; ``marl_q.state_format``)
    atomically, under the current format version; return its SHA-256, which the checkpoint's header
    records and `load_snapshot` checks before it unpickles anything.

    The bytes go to the file as torch writes them, hashed on the way (``_HashingWriter``): a snapshot of
    1,000 sim workers is 75 MB, and holding it whole in memory (and once more to write it) was the peak
    of such a run's resident memory (docs/runtime.md, "Many workers on sim")."""
    import torch  # its pickler stores each tensor storage once, so views stay views and stay small

    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    out: Optional[_HashingWriter] = None
    try:
        with open(tmp, "wb") as fh:
            out = _HashingWriter(fh)
            try:
                torch.save(pack(state), out, pickle_module=_FullStatePickle, pickle_protocol=pickle.HIGHEST_PROTOCOL)
            except (TypeError, pickle.PicklingError, AttributeError) as exc:  # e.g. an env holding a Box2D world
                raise SnapshotUnavailable(f"{type(exc).__name__}: {exc}") from None
            except Exception:
                # a write that failed or was interrupted (Ctrl-C) inside torch, which wraps it in its own
                # RuntimeError ("unexpected pos"): the cause is what the caller handles (exit 2 / 130)
                if out.error is not None:
                    raise out.error from None
                raise
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        _abandon(out, tmp)
        raise RunWriteError(path, exc) from None
    except BaseException:
        _abandon(out, tmp)
        raise
    return out.sha256.hexdigest()


def _abandon(out: Optional["_HashingWriter"], tmp: Path) -> None:
    """A save that did not finish: its file is discarded, and its writer takes no more bytes. torch's zip
    writer finishes its file from its destructor when an exception (Ctrl-C in torch.save's own code) left
    it unfinished; that destructor runs when the exception is freed, long after the file closed, and a
    write that raised there ended the process (std::terminate, exit -6, after the run had saved and
    printed how to resume)."""
    if out is not None:
        out.abandoned = True
    _discard(tmp)


class _HashingWriter:
    """A binary file that hashes what is written to it (SHA-256), for writers that stream their bytes."""

    def __init__(self, fh: IO[bytes]) -> None:
        self.fh, self.sha256 = fh, hashlib.sha256()
        self.error: Optional[BaseException] = None
        self.abandoned = False  # see _abandon: bytes written after that go nowhere

    def write(self, data: Any) -> int:
        if self.abandoned:
            return len(data)
        try:
            written = self.fh.write(data)
        except BaseException as exc:  # OSError, or KeyboardInterrupt arriving during the write
            self.error = exc
            raise
        self.sha256.update(data)
        return written

    def flush(self) -> None:
        self.fh.flush()


class _FullStatePickler(pickle.Pickler):
    """Pickles Gymnasium/PettingZoo ``EzPickle`` objects (mpe2's worlds, most wrapped envs) by their
    full state instead of by their constructor arguments: EzPickle rebuilds an env that was never
    reset, so a resumed sim run would not continue the episode it stopped in."""

    def reducer_override(self, obj: Any) -> Any:
        if _EZPICKLE is not None and isinstance(obj, _EZPICKLE) and hasattr(obj, "__dict__"):
            state = {k: v for k, v in obj.__dict__.items() if not _is_render_resource(v)}
            if len(state) == len(obj.__dict__):
                return copyreg.__newobj__, (type(obj),), state, None, None, _set_full_state
            # pygame surfaces and fonts (mpe2 makes them in its constructor) do not pickle: the object
            # is rebuilt by its constructor for those, then given the rest of its state
            rebuild = (type(obj), tuple(obj._ezpickle_args), dict(obj._ezpickle_kwargs))
            return _construct, rebuild, state, None, None, _set_full_state
        return NotImplemented


def _is_render_resource(value: Any) -> bool:
    return type(value).__module__.startswith("pygame")


def _construct(cls: type, args: tuple, kwargs: dict) -> Any:
    return cls(*args, **kwargs)


def _set_full_state(obj: Any, state: dict) -> None:
    obj.__dict__.update(state)


class _FullStatePickle:
    """The pickle module handed to ``torch.save``: the standard one with ``_FullStatePickler``."""

    Pickler = _FullStatePickler
    Unpickler = pickle.Unpickler
    HIGHEST_PROTOCOL = pickle.HIGHEST_PROTOCOL


try:
    from gymnasium.utils import EzPickle as _EZPICKLE
except ImportError:  # pragma: no cover - gymnasium is a dependency
    _EZPICKLE = None

class SnapshotUnavailable(Exception):
    """The sim's state holds an object that cannot be pickled whole (a Box2D world, say): the
    checkpoint is written without a snapshot, and a resume continues from the server's state with
    fresh workers, as on ``local`` (not byte-identical)."""


def load_snapshot(path: Path, sha256: str) -> dict[str, Any]:
    """A snapshot's state, upgraded to the current format version (``marl_q.state_format``). It is
    unpickled only if its bytes hash to what the (pickle-free) checkpoint header says: a truncated,
    corrupted or swapped file is refused before any of it is unpickled."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path}: the checkpoint's sim snapshot is missing")
    blob = path.read_bytes()
    if hashlib.sha256(blob).hexdigest() != sha256:
        raise CheckpointError(f"{path}: sim snapshot does not match its checkpoint (truncated or corrupt)")
    import torch

    try:
        if blob[:2] == b"PK":  # torch.save's zip container
            obj = torch.load(io.BytesIO(blob), weights_only=False)
        else:
            obj = pickle.loads(blob)  # snapshots written before torch's pickler: plain pickle (hash checked above)
    except Exception as exc:  # the hash matched, so this is a version mismatch of the code
        raise CheckpointError(f"{path}: sim snapshot cannot be read by this version of marl-q "
                              f"({type(exc).__name__}: {exc})") from None
    try:
        return unpack(obj, str(path))
    except CheckpointError:
        raise
    except Exception as exc:  # a migration met a state it does not know: the file's, not the code's
        raise CheckpointError(f"{path}: sim snapshot cannot be upgraded to this marl-q's state format "
                              f"({type(exc).__name__}: {exc})") from None


# ---------------------------------------------------------------------------------------------
# A trained policy from a run directory: the one place a run's models are rebuilt and loaded
# ---------------------------------------------------------------------------------------------

class TrainedPolicies:
    """The policy of a finished (or checkpointed) run, rebuilt by its registered algorithm.

    ``act(obs, rng=None)``: one action per agent, the most likely (``rng`` None) or drawn with ``rng``;
    ``logits(obs)`` / ``probs(obs)``: per agent. ``cfg`` is the run's resolved config, ``checkpoint``
    the file the parameters came from; ``agents``, ``models`` and ``info`` are the algorithm's (see
    ``marl_q.protocol.ActingPolicy``)."""

    def __init__(self, run_dir: Path, checkpoint: Path, cfg: ExperimentConfig, policy: Any) -> None:
        self.run_dir, self.checkpoint, self.cfg, self.policy = Path(run_dir), Path(checkpoint), cfg, policy

    @property
    def agents(self) -> Optional[list[str]]:
        return self.policy.agents

    @property
    def models(self) -> dict[str, Any]:
        return self.policy.models

    @property
    def info(self) -> dict[str, Any]:
        return self.policy.info

    def logits(self, obs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return self.policy.logits(obs)

    def probs(self, obs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return self.policy.probs(obs)

    def act(self, obs: dict[str, np.ndarray], rng: Optional[np.random.Generator] = None) -> dict[str, int]:
        return self.policy.act(obs, rng)


def load_trained(run_dir: Path, checkpoint: Optional[Path] = None) -> TrainedPolicies:
    """The trained policy of ``run_dir``: its config.yaml, its newest checkpoint (or ``checkpoint``), the
    models rebuilt by the registered algorithm's ``acting_policy`` hook. A missing run directory,
    config or checkpoint, or a corrupt checkpoint, is a UserError naming the path."""
    from marl_q.config import load_config
    from marl_q.registry import algorithm_class

    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise RunDirError(f"{run_dir}: not a run directory (no such directory)")
    if not (run_dir / "config.yaml").is_file():
        raise RunDirError(f"{run_dir}: not a run directory (no config.yaml)")
    cfg = load_config(run_dir / "config.yaml")
    if checkpoint is None:
        checkpoint = latest_checkpoint(run_dir)
        if checkpoint is None:
            raise CheckpointError(f"{run_dir / 'checkpoints'}: no checkpoint to load "
                                  "(run with run.checkpoint_every > 0, or let it finish)")
    arrays, _ = load_checkpoint(Path(checkpoint))
    algorithm = algorithm_class(cfg)(cfg)
    try:
        policy = algorithm.acting_policy(service_arrays(arrays))
    except UserError as exc:
        raise type(exc)(f"{checkpoint}: {exc}") from None
    except (KeyError, ValueError, RuntimeError) as exc:  # arrays missing or of the wrong shape for this config
        raise CheckpointError(f"{checkpoint}: does not hold the parameters of this run's "
                              f"{cfg.algorithm.name} models ({type(exc).__name__}: {exc})") from None
    return TrainedPolicies(run_dir, Path(checkpoint), cfg, policy)
