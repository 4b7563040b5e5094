"""Ctrl-C on a real backend, as a terminal sends it (SIGINT to the whole process group): one short
message, exit 130, a checkpoint of what was learned so that the printed resume hint is true, and no
hint (but "nothing to resume") when nothing was learned. The ray backend's case is in test_ray_backend.py,
where its resume runs on that module's Ray instance."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from marl_q.cli import main
from marl_q.rundir import latest_checkpoint, load_checkpoint

ROOT = Path(__file__).resolve().parents[2]


def _start(raw: dict, tmp_path: Path, sigint_ignored: bool = False) -> tuple[subprocess.Popen, Path]:
    cfg = tmp_path / "run.yaml"
    cfg.write_text(yaml.safe_dump(raw))
    out = tmp_path / "r"
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    # sigint_ignored: started as a non-interactive shell starts a background job (SIGINT ignored). An ignored
    # signal stays ignored across exec, so the parent ignores it while it starts the child: no preexec_fn,
    # which runs Python between fork and exec, where a process with other threads (JAX's, in a test process
    # that imported it) can deadlock. A handled SIGINT is back to its default in the child by exec itself.
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN if sigint_ignored else signal.default_int_handler)
    try:
        proc = subprocess.Popen([sys.executable, "-m", "marl_q.cli", "run", str(cfg), "--out", str(out), "--quiet"],
                                cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                start_new_session=True)  # its own process group, like a job in a terminal
    finally:
        signal.signal(signal.SIGINT, previous)
    return proc, out


# Start-up (imports, a Ray instance, the first checkpoint) is not what these tests are about and takes
# minutes on a loaded machine: its limit only ends a run that will never get there. The interrupt is what
# they test: SIGINT is sent once the run has shown it is running (a file it writes), and the limit on
# the shutdown that follows is generous (seconds idle; the ray backend alone waits up to 30 s for the
# server actor's files).
START_LIMIT_S = 900.0
SHUTDOWN_LIMIT_S = 180.0


def _wait_for(cond, proc: subprocess.Popen, timeout_s: float = START_LIMIT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        if proc.poll() is not None:
            pytest.fail(f"the run ended early (exit {proc.returncode}): {proc.stderr.read()}")
        if time.monotonic() > deadline:
            os.killpg(proc.pid, signal.SIGKILL)
            pytest.fail("the run made no progress in time")
        time.sleep(0.05)


def _interrupt(proc: subprocess.Popen) -> tuple[int, list[str]]:
    os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C in a terminal does: every process of the group
    try:
        _, err = proc.communicate(timeout=SHUTDOWN_LIMIT_S)
    except subprocess.TimeoutExpired:
        os.kill(proc.pid, signal.SIGUSR1)  # marlq prints every thread's stack (cli.dump_stacks_on_sigusr1)
        time.sleep(2.0)
        os.killpg(proc.pid, signal.SIGKILL)
        _, err = proc.communicate()
        pytest.fail(f"the interrupted run did not end in {SHUTDOWN_LIMIT_S:g} s; where it waited:\n" + err[-6000:])
    return proc.returncode, [ln for ln in err.splitlines() if ln.strip()]


def _local(raw: dict) -> dict:
    raw["backend"].update({"name": "local", "workers": 2})
    raw["run"].update({"total_env_steps": 10_000_000, "checkpoint_every": 20})
    return raw


def interrupt_after_learning_then_resume(raw: dict, tmp_path: Path) -> None:
    """Ctrl-C once the run has checkpointed: exit 130, at most 3 lines (a backend may add a start-up
    notice of its own), a checkpoint at the interrupt, and the resume the hint names works (run in this
    process: test_ray_backend's runs it on the module's Ray instance)."""
    proc, out = _start(raw, tmp_path)
    _wait_for(lambda: latest_checkpoint(out) is not None, proc)  # it has learned something
    code, err = _interrupt(proc)
    assert code == 130, err
    assert len(err) <= 3 and not any("Traceback" in ln for ln in err), err
    assert err[-1] == f"marlq: interrupted; continue with `marlq resume {out}`"
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "interrupted" and summary["updates"] > 0
    # the checkpoint holds the state at the interrupt, not only the last periodic one
    assert load_checkpoint(latest_checkpoint(out))[1]["updates"] == summary["updates"]
    # the hint is true
    more = summary["env_steps"] + 200
    assert main(["resume", str(out), "--quiet", "--set", f"run.total_env_steps={more}"]) == 0
    resumed = json.loads((out / "summary.json").read_text())
    assert resumed["status"] == "completed" and resumed["env_steps"] >= more
    assert resumed["resumes"][-1]["updates"] == summary["updates"]


def test_ctrl_c_on_local_prints_one_line_checkpoints_what_was_learned_and_resumes(small_raw, tmp_path):
    interrupt_after_learning_then_resume(_local(small_raw), tmp_path)


def test_ctrl_c_while_workers_start_says_there_is_nothing_to_resume(small_raw, tmp_path):
    proc, out = _start(_local(small_raw), tmp_path)
    _wait_for(lambda: (out / "metrics.csv").is_file(), proc)  # the run has begun; its workers are importing
    time.sleep(0.3)
    code, err = _interrupt(proc)
    assert code == 130, err
    assert len(err) <= 3 and not any("Traceback" in ln for ln in err), err
    assert "nothing to resume" in err[-1] and "marlq resume" not in "\n".join(err)
    assert latest_checkpoint(out) is None
    assert json.loads((out / "summary.json").read_text())["status"] == "interrupted"


def test_sigusr1_prints_where_every_thread_is_and_the_run_goes_on(small_raw, tmp_path):
    """`kill -USR1 PID` on a running `marlq` (marl_q.cli.dump_stacks_on_sigusr1): every thread's stack on
    stderr, the run unharmed (it still stops on Ctrl-C as usual)."""
    small_raw["run"].update({"total_env_steps": 10_000_000, "checkpoint_every": 10_000})
    proc, out = _start(small_raw, tmp_path)
    _wait_for(lambda: (out / "metrics.csv").is_file(), proc)
    os.kill(proc.pid, signal.SIGUSR1)
    time.sleep(1.0)
    assert proc.poll() is None  # it goes on
    code, err = _interrupt(proc)
    assert code == 130, err
    text = "\n".join(err)
    assert "most recent call first" in text and "marl_q/cli.py" in text and "in main" in text


def test_ctrl_c_reaches_a_run_started_with_sigint_ignored(small_raw, tmp_path):
    """A non-interactive shell starts background jobs with SIGINT ignored, and Python then never raises
    KeyboardInterrupt: `kill -INT` did nothing to a sim or ray run so started (the Ray Ctrl-C test,
    test_ray_backend's, hung for 120 s whenever pytest itself ran in the background). marlq restores it
    (cli.interrupt_on_sigint)."""
    small_raw["run"].update({"total_env_steps": 10_000_000, "checkpoint_every": 20})
    proc, out = _start(small_raw, tmp_path, sigint_ignored=True)
    _wait_for(lambda: latest_checkpoint(out) is not None, proc)
    code, err = _interrupt(proc)
    assert code == 130, err
    assert err[-1] == f"marlq: interrupted; continue with `marlq resume {out}`"
