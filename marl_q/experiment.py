"""Experiment: a resolved config -> a run directory with metrics, ledger, summary and plots; and
`resume_experiment`, which continues a stopped or interrupted run from its latest good checkpoint."""
from __future__ import annotations

import shutil
import sys
import time
from pathlib import Path
from typing import Any, Optional

import torch

from marl_q.native import prepare_process
from marl_q.evaluation import EVAL_FILE, cut_eval_csv
from marl_q.config import ExperimentConfig, apply_override, build_config, read_yaml
from marl_q.errors import CheckpointError, ConfigError, RunDirError, RunWriteError, UserError
from marl_q.registry import BACKENDS
from marl_q.rundir import (check_new_run_dir, checkpoints, discard_run_dir, is_run_dir, latest_checkpoint, load_checkpoint,
                           load_snapshot, lock_run_dir, make_run_dir, missing_folders, unarchive_run_files)
from marl_q.runtime import CHECKPOINT_FORMAT, SIM_SNAPSHOT, ResumePoint, Runtime, build_algorithm, one_line

# what `marlq resume --set` may change: the budget and bookkeeping, never what is learned or how
RESUMABLE_KEYS = ("run.total_env_steps", "run.total_episodes", "run.checkpoint_every", "run.keep_checkpoints",
                  "run.stop_after_updates", "run.progress", "run.plots", "run.eval_every", "run.eval_episodes",
                  "run.tensorboard", "run.compress_logs",
                  # where a ray run's actors go (a resume on the nodes that remain): not what it computes
                  "backend.placement", "backend.server_placement", "backend.ray.address")
RUN_FILES = ("metrics.csv", "metrics_wall.csv", "comm.csv", "comm_wall.csv", "eval.csv", "quantum.csv", "quantum_wall.csv",
             "train.csv", "train_wall.csv", "returns.csv", "summary.json")


def run_experiment(cfg: ExperimentConfig, out: Optional[Path], plots: Optional[bool] = None) -> dict[str, Any]:
    """Run ``cfg`` on its backend; write everything under ``out`` (None: keep nothing on disk).

    Every check that can refuse the run (the backend's, ``out`` being new or empty, the algorithm and
    its models fitting the env) runs before ``out`` is made; a start that still fails (bad input found
    by a backend, a run file that cannot be opened) removes what it made there, so the same command
    with the config fixed can use the same ``out``."""
    backend = BACKENDS.get(cfg.backend.name, key="backend.name").obj
    _preflight(backend, cfg)
    if out is not None:
        check_new_run_dir(Path(out))
    prepare_process()
    torch.set_num_threads(cfg.backend.threads_per_worker)
    built = build_algorithm(cfg)
    if out is None:
        return _execute(cfg, None, backend, None, plots, built)
    created = missing_folders(Path(out))
    out = make_run_dir(Path(out))
    try:
        (out / "config.yaml").write_text(cfg.to_yaml())
        return _execute(cfg, out, backend, None, plots, built)
    except Exception as exc:
        if _failed_to_start(exc, out):
            discard_run_dir(out, created)
        raise


def _failed_to_start(exc: Exception, out: Path) -> bool:
    """A fresh run's failure before it kept anything: its run files were never opened, or the input was
    refused (a UserError) before a checkpoint or a metrics row was written."""
    metrics = out / "metrics.csv"
    if not metrics.exists():
        return True
    if not isinstance(exc, UserError) or latest_checkpoint(out) is not None:
        return False
    with open(metrics, "rb") as fh:
        return len(fh.read().splitlines()) <= 1  # the header at most


def _preflight(backend: Any, cfg: ExperimentConfig) -> None:
    """A backend's checks of this machine (local: workers per core), and that run.tensorboard can be
    honoured, before anything is written."""
    check = getattr(backend, "preflight", None)
    if check is not None:
        check(cfg)
    if cfg.run.tensorboard:
        from marl_q.tracking import require_tensorboard

        require_tensorboard()


def _execute(cfg: ExperimentConfig, out: Optional[Path], backend: Any, resume: Optional[ResumePoint],
             plots: Optional[bool], built: Optional[tuple[Any, Any]] = None) -> dict[str, Any]:
    torch.set_num_threads(cfg.backend.threads_per_worker)
    lock = lock_run_dir(out) if out is not None and resume is None else None  # resume took it already
    try:
        return _execute_locked(cfg, out, backend, resume, plots, built)
    finally:
        if lock is not None:
            lock.close()


def _execute_locked(cfg: ExperimentConfig, out: Optional[Path], backend: Any, resume: Optional[ResumePoint],
                    plots: Optional[bool], built: Optional[tuple[Any, Any]] = None) -> dict[str, Any]:
    rt = Runtime(cfg, out, resume=resume, built=built)
    try:
        summary = backend(rt)
    except UserError:  # the input was refused (a backend's own check): close the run files, write no more
        rt.abandon()
        raise
    except RunWriteError as exc:
        # the disk failed the run: stop writing; the last good checkpoint is untouched (checkpoints are
        # written to a temporary file and renamed), and the rows after it are cut on resume
        rt.abandon()
        raise (exc if out is None else _with_hint(exc, out)) from None
    except KeyboardInterrupt:
        # keep what was computed: flushed metrics and ledger, a summary saying so. A backend that can stop
        # at a safe point (local, ray) has already finished the run and checkpointed what it learned;
        # otherwise the last periodic checkpoint is where `marlq resume` continues (the state at the
        # interrupt may be mid-update)
        if not rt.finished:
            try:
                rt.finish(0.0, virtual=False, status="interrupted", checkpoint=False)
            except Exception as exc:  # never mask the interrupt
                print(f"marlq: could not write the summary of the interrupted run ({one_line(str(exc))})",
                      file=sys.stderr)
        raise Interrupted(interrupt_note(out)) from None
    if summary.get("status") == "interrupted":  # the backend caught the interrupt and stopped cleanly
        raise Interrupted(interrupt_note(out))
    if out is not None and (cfg.run.plots if plots is None else plots):
        try:
            from marl_q.registry import PLOTS

            PLOTS.get("standard").obj([out], out / "plots")
        except Exception as exc:  # a plot failure must not lose the run
            print(f"marlq: plotting failed ({exc}); the run itself is saved", file=sys.stderr)
    return summary


class Interrupted(KeyboardInterrupt):
    """The run was interrupted and what it computed is saved; ``str()`` says whether and how it can be
    continued (the CLI prints that one line and exits 130)."""


def interrupt_note(out: Optional[Path]) -> str:
    """The line printed for an interrupted run: the resume hint only when there is a checkpoint to
    resume from."""
    if out is None:
        return "marlq: interrupted"
    if latest_checkpoint(out) is None:
        return (f"marlq: interrupted before the run learned anything; nothing to resume in {out} "
                "(start it again with `marlq run`)")
    return f"marlq: interrupted; continue with `marlq resume {out}`"


def _with_hint(exc: RunWriteError, out: Path) -> RunWriteError:
    """The write error, saying what is kept and how to go on."""
    last = latest_checkpoint(out) if out.is_dir() else None
    if last is not None:
        hint = f"the last good checkpoint {last.name} is kept: make room (or restore {out}), then `marlq resume {out}`"
    else:
        hint = "no checkpoint was written before it, so nothing to resume: fix the disk and run it again"
    # a copy re-raised through another process (Ray's) may lack the attributes: keep it to one line
    path = getattr(exc, "path", None) or "a run file"
    reason = getattr(exc, "reason", None) or one_line(str(exc))
    return RunWriteError(path, reason, hint=f"the run is stopped; {hint}")


def resume_experiment(run_dir: Path, overrides: list[str] = (), checkpoint: Optional[Path] = None,
                      plots: Optional[bool] = None) -> dict[str, Any]:
    """Continue the run in ``run_dir`` from its latest checkpoint (or ``checkpoint``).

    On sim the continuation is exact: the checkpoint's snapshot holds the workers, environments, events
    in flight and every generator, so the metrics after the checkpoint equal those of a run that was
    never stopped, byte for byte. On local and ray the server's full state is restored and fresh workers
    start from its parameters (what a restarted worker does anyway); their wall clock differs.

    Rows written after the checkpoint are cut from metrics.csv, comm.csv and train.csv (they described a state that
    is not restored); the files as they were are kept in ``resume_backup_<n>/``, so nothing is lost.

    A checkpoint of a seed-batched run (``marlq sweep --batch-seeds``) holds the seed's state in that
    runner's form (``snapshot_kind``): ``marlq resume`` and ``marlq sweep`` continue it there
    (``agents.batched_a2c.resume_batched_seeds``); this function refuses it."""
    cfg, backend, point, lock = prepare_resume(run_dir, overrides, checkpoint, kind=SIM_SNAPSHOT)
    prepare_process()
    try:
        return _execute(cfg, Path(run_dir), backend, point, plots)
    finally:
        lock.close()


def prepare_resume(run_dir: Path, overrides: list[str] = (), checkpoint: Optional[Path] = None,
                   kind: Optional[str] = None) -> tuple[ExperimentConfig, Any, ResumePoint, Any]:
    """Everything a resume does before the run goes on: the config (with ``overrides`` of
    ``RESUMABLE_KEYS`` only), the run directory locked, the checkpoint read (``kind``: the snapshot it
    must hold; for ``SIM_SNAPSHOT`` a checkpoint without one is taken too, and continued inexactly), the
    budget checked, compressed logs decompressed, the files as they were copied to
    ``resume_backup_<n>/`` and cut back to the checkpoint. Returns (config, backend, resume point, lock);
    the caller runs it and closes the lock."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise RunDirError(f"{run_dir}: no such directory")
    if not is_run_dir(run_dir):
        raise RunDirError(f"{run_dir}: not a marl-q run directory (no config.yaml and metrics.csv)")
    raw = read_yaml(run_dir / "config.yaml")
    raw.setdefault("run", {})["stop_after_updates"] = None  # it stopped the first session, not this one
    for item in overrides:
        key = item.split("=", 1)[0].strip()
        if key not in RESUMABLE_KEYS:
            raise ConfigError(f"resume --set {item!r}: only {', '.join(RESUMABLE_KEYS)} may change on resume "
                              "(anything else would not continue the same run)")
        apply_override(raw, item)
    cfg = build_config(raw, source=str(run_dir / "config.yaml"))
    backend = BACKENDS.get(cfg.backend.name, key="backend.name").obj
    _preflight(backend, cfg)
    lock = lock_run_dir(run_dir)  # before anything is read for the resume, let alone cut or moved
    try:
        point = _resume_point(run_dir, checkpoint, cfg)
        found = snapshot_kind(point.meta)
        if kind == SIM_SNAPSHOT and found not in (None, SIM_SNAPSHOT):
            raise CheckpointError(f"{point.path}: its snapshot is a {found!r} one (a seed of `marlq sweep "
                                  f"--batch-seeds`): continue it with `marlq resume {run_dir}`")
        if kind not in (None, SIM_SNAPSHOT) and found != kind:
            raise CheckpointError(f"{point.path}: holds {'no snapshot' if found is None else f'a {found!r} snapshot'}, "
                                  f"not a {kind!r} one: continue it with `marlq resume {run_dir}`")
        if _budget_reached(cfg, point.meta):
            raise ConfigError(f"{run_dir}: the run already reached its budget ({point.meta['env_steps']} env "
                              f"steps, {point.meta['episodes']} episodes); raise it to continue, e.g. "
                              "--set run.total_env_steps=N")
        unarchive_run_files(run_dir)  # run.compress_logs: the logs are appended to from the checkpoint on
        _set_aside(run_dir, point)
        cut_eval_csv(run_dir / EVAL_FILE, int(point.meta["env_steps"]))
    except BaseException:
        lock.close()
        raise
    return cfg, backend, point, lock


def snapshot_kind(meta: dict[str, Any]) -> Optional[str]:
    """What wrote a checkpoint's snapshot (its header's ``snapshot.kind``): ``SIM_SNAPSHOT`` for the sim
    backend (headers before the key: every snapshot was one), a runner's name for another (the seed-batched
    A2C's), None for a checkpoint without snapshot."""
    snap = meta.get("snapshot")
    return None if not snap else snap.get("kind", SIM_SNAPSHOT)


def _resume_point(run_dir: Path, checkpoint: Optional[Path], cfg: ExperimentConfig) -> ResumePoint:
    found = checkpoints(run_dir)
    if checkpoint is None:
        if not found:
            raise CheckpointError(f"{run_dir}: no checkpoint to resume from (checkpoints/ is empty); "
                                  "set run.checkpoint_every to take them during a run")
        path = found[-1]
    else:
        path = Path(checkpoint)
        if not path.is_absolute() and not path.exists():
            path = run_dir / "checkpoints" / path
    try:
        arrays, meta = load_checkpoint(path)
        if meta.get("format") != CHECKPOINT_FORMAT:
            raise CheckpointError(f"{path}: checkpoint format {meta.get('format')!r}, this marl-q reads "
                                  f"{CHECKPOINT_FORMAT} (it predates resume)")
        if meta.get("algorithm") != cfg.algorithm.name or meta.get("backend") != cfg.backend.name:
            raise CheckpointError(f"{path}: written by {meta.get('algorithm')}/{meta.get('backend')}, but the run "
                                  f"is {cfg.algorithm.name}/{cfg.backend.name}")
        snapshot = None
        if meta.get("snapshot"):
            snapshot = load_snapshot(path.with_name(meta["snapshot"]["file"]), meta["snapshot"]["sha256"])
    except CheckpointError as exc:
        older = [p.name for p in found if p != path]
        hint = (f"; the older checkpoint(s) {', '.join(older)} are kept: resume from one with "
                f"--from {older[-1]}") if older else ""
        raise CheckpointError(f"{exc}{hint}") from None
    return ResumePoint(path=path, arrays=arrays, meta=meta, snapshot=snapshot)


def _budget_reached(cfg: ExperimentConfig, meta: dict[str, Any]) -> bool:
    run = cfg.run
    return ((run.total_env_steps is not None and meta["env_steps"] >= run.total_env_steps)
            or (run.total_episodes is not None and meta["episodes"] >= run.total_episodes))


def _set_aside(run_dir: Path, point: ResumePoint) -> None:
    """Copy the run files into resume_backup_<n>/ and move checkpoints newer than ``point`` there."""
    n = 1
    while (run_dir / f"resume_backup_{n}").exists():
        n += 1
    backup = run_dir / f"resume_backup_{n}"
    backup.mkdir()
    for name in RUN_FILES:
        if (run_dir / name).is_file():
            shutil.copy2(run_dir / name, backup / name)
    updates = point.meta["updates"]
    for path in checkpoints(run_dir):
        if path != point.path and int(path.name.split(".")[0].split("_")[1]) >= updates:
            for f in (path, path.with_name(path.name.replace(".npz", ".sim.pkl"))):
                if f.exists():
                    shutil.move(str(f), backup / f.name)
    (backup / "README").write_text(f"marl-q resumed this run from {point.path.name} on "
                                   f"{time.strftime('%Y-%m-%d %H:%M:%S')}; these are the files as they were.\n")
