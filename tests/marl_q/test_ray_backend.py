"""The ray backend on a local Ray instance: kills, duplicates, Ctrl-C and resume, one config on three backends,
bad input."""
from __future__ import annotations

import copy
import csv
import socket
import subprocess
import sys

import pytest
import ray

from marl_q.backends.ray_backend import check_reachable, connect, import_ray, parse_address
from marl_q.ledger import ledger_audit
from marl_q.cli import main
from marl_q.config import build_config
from marl_q.errors import ConfigError
from marl_q.experiment import run_experiment
from tests.marl_q.test_run_interrupts import interrupt_after_learning_then_resume


@pytest.fixture(scope="module")
def local_ray():
    """One small Ray instance for the module, started as a run starts its own (ray_backend.connect: 2 CPUs,
    no dashboard, bound to localhost, workers at the driver's priority); each run here finds it running."""
    from tests.conftest import CARTPOLE_SMALL

    raw = copy.deepcopy(CARTPOLE_SMALL)
    raw["backend"].update({"name": "ray", "workers": 2, "ray": {"num_cpus_per_worker": 1}})
    assert connect(ray, build_config(raw))  # it started the instance: none was running
    yield ray
    ray.shutdown()


def _on_ray(raw: dict) -> dict:
    raw["backend"].update({"name": "ray", "ray": {"num_cpus_per_worker": 0.5}})
    return raw


def test_a_killed_ray_worker_is_restarted_and_duplicates_apply_once(local_ray, small_raw, tmp_path):
    _on_ray(small_raw)["backend"].update({"kill": [{"worker": 1, "at_s": 0.02}], "max_restarts": 2,
                                          "faults": {"duplicate": 0.3}})
    small_raw["server"]["aggregation"] = "sync"  # the barrier needs w1: the run cannot end without its restart
    # a budget the run cannot finish within 0.02 s of every worker's hello, so the kill always lands
    small_raw["run"]["total_env_steps"] = 8000
    summary = run_experiment(build_config(small_raw), tmp_path / "r")
    assert summary["status"] == "completed" and summary["backend"] == "ray" and summary["env_steps"] >= 8000
    assert [f["kind"] for f in summary["faults"]] == ["worker_restarted"]
    assert "killed by backend.kill at 0.02 s (ray.kill)" in summary["faults"][0]["detail"]
    audit = ledger_audit(tmp_path / "r")
    assert audit.faults["kill"] == 1 and audit.faults["duplicate"] == summary["faults_injected"]["duplicate"] > 0
    assert audit.lives["w1"] == 2 and audit.accepted_after_restart["w1"] > 0
    # at most once: applied updates = distinct accepted (worker, incarnation, seq); duplicates refused
    assert audit.repeated_keys == [] and audit.refused_duplicates > 0
    # sync: 2 pushes per update, plus perhaps half a round at the end and a killed worker's replaced push
    assert 0 <= audit.distinct_accepted - 2 * summary["updates"] <= 1 + audit.faults["kill"]
    assert (tmp_path / "r" / "summary.json").is_file() and (tmp_path / "r" / "checkpoints").is_dir()


def test_a_stopped_ray_run_resumes_from_the_servers_checkpoint(local_ray, small_raw, tmp_path):
    from marl_q.experiment import resume_experiment

    _on_ray(small_raw)["backend"]["workers"] = 1
    small_raw["run"].update({"total_env_steps": 600, "stop_after_updates": 8})
    part = run_experiment(build_config(small_raw), tmp_path / "r")
    assert part["status"] == "stopped" and part["updates"] >= 8
    resumed = resume_experiment(tmp_path / "r")
    assert resumed["status"] == "completed" and resumed["backend"] == "ray" and resumed["env_steps"] >= 600
    assert resumed["resumes"][0]["exact"] is False and resumed["resumes"][0]["updates"] == part["updates"]
    assert resumed["updates"] > part["updates"]  # the server went on from its checkpointed state
    rows = (tmp_path / "r" / "comm.csv").read_bytes().count(b"\n") - 1
    assert resumed["messages"] + sum(resumed["faults_injected"].values()) == rows


def test_ctrl_c_on_ray_prints_one_line_checkpoints_what_was_learned_and_resumes(local_ray, small_raw, tmp_path):
    """Ctrl-C to a `marlq run` process group on its own local Ray instance (test_run_interrupts' check);
    the resume that the printed hint names then runs on this module's instance."""
    small_raw["backend"].update({"name": "ray", "workers": 2, "ray": {"num_cpus_per_worker": 0.5}})
    small_raw["run"].update({"total_env_steps": 10_000_000, "checkpoint_every": 20})
    interrupt_after_learning_then_resume(small_raw, tmp_path)


def _bytes_by_kind(run_dir) -> dict[str, set[int]]:
    sizes: dict[str, set[int]] = {}
    with open(run_dir / "comm.csv", newline="") as fh:
        for r in csv.DictReader(fh):
            sizes.setdefault(r["kind"], set()).add(int(r["bytes"]))
    return sizes


def test_one_config_three_backends_same_bytes_per_message_kind(local_ray, small_raw, tmp_path):
    small_raw["run"]["total_env_steps"] = 600
    small_raw["backend"].update({"workers": 1, "ray": {"num_cpus_per_worker": 0.5}})  # one process to start
    sizes = {}
    for backend in ("sim", "local", "ray"):
        small_raw["backend"]["name"] = backend
        summary = run_experiment(build_config(small_raw), tmp_path / backend)
        assert summary["status"] == "completed" and summary["backend"] == backend
        sizes[backend] = _bytes_by_kind(tmp_path / backend)
    assert set(sizes["sim"]) == {"hello", "grad", "params"}
    assert sizes["local"] == sizes["sim"] and sizes["ray"] == sizes["sim"]
    assert all(len(s) == 1 for s in sizes["sim"].values())  # one size per kind: the same arrays everywhere


def test_unreachable_address_is_a_clear_error(small_raw, tmp_path, capsys):
    import yaml

    with socket.socket() as s:  # a port that was just free: nothing listens there
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump(small_raw))
    code = main(["run", str(cfg), "--out", str(tmp_path / "r"), "--set", "backend.name=ray",
                 "--set", f"backend.ray.address=127.0.0.1:{port}", "--set", "backend.ray.connect_timeout_s=2"])
    assert code == 2
    assert f"backend.ray.address: cannot reach 127.0.0.1:{port}" in capsys.readouterr().err
    with socket.socket() as listener:  # something listens but never answers like a Ray head
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        address = f"127.0.0.1:{listener.getsockname()[1]}"
        with pytest.raises(ConfigError, match="did not answer within 0.5 s"):
            check_reachable(address, 0.5)
    with pytest.raises(ConfigError, match="expected host:port"):
        parse_address("localhost")
    assert parse_address("ray://10.0.0.2:10001") == ("10.0.0.2", 10001)


# stand-ins for the probe process (ray_backend.PROBE, run as `python -c PROBE address`): what ray.init does there
_REFUSED = """
import os, sys, time
open(sys.argv[1], "w").write(str(os.getpid()))
print("[W gcs_client.cc:210] Failed to get cluster ID from GCS server: Unauthenticated: RPC error: "
      "InvalidAuthToken: Authentication token is missing or incorrect", file=sys.stderr, flush=True)
time.sleep(3600)  # Ray retries the same token; only killing the probe ends it
"""


def test_the_probe_stops_at_the_first_refused_token_and_reports_each_outcome(monkeypatch, tmp_path):
    """probe_cluster: a refused token ends the probe at the line that says so, long before its deadline (3600 s
    here: waiting for it would hang the test); a probe that joins passes; one that fails says its last line;
    one that neither answers nor fails is killed at the deadline."""
    import os

    from marl_q.backends import ray_backend

    pid_file = tmp_path / "pid"
    monkeypatch.setattr(ray_backend, "PROBE", _REFUSED)
    with pytest.raises(ConfigError, match="wants an authentication token; run with RAY_AUTH_MODE=token"):
        ray_backend.probe_cluster(str(pid_file), 3600.0)
    with pytest.raises(ProcessLookupError):  # killed and reaped
        os.kill(int(pid_file.read_text()), 0)
    monkeypatch.setattr(ray_backend, "PROBE", "print('cpus', 2.0)")
    ray_backend.probe_cluster("127.0.0.1:1", 60.0)
    monkeypatch.setattr(ray_backend, "PROBE", "import sys; sys.exit('ConnectionError: no head at ' + sys.argv[1])")
    with pytest.raises(ConfigError, match="could not join the Ray cluster at 127.0.0.1:1: ConnectionError: no head"):
        ray_backend.probe_cluster("127.0.0.1:1", 60.0)
    monkeypatch.setattr(ray_backend, "PROBE", "import time; time.sleep(3600)")
    with pytest.raises(ConfigError, match="no Ray cluster answered at 127.0.0.1:1 within 1 s"):
        ray_backend.probe_cluster("127.0.0.1:1", 1.0)


def test_without_ray_installed_the_error_says_how_to_install(small_raw, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "ray" else real(name, *a))
    _on_ray(small_raw)
    with pytest.raises(ConfigError, match=r"pip install 'marl-q\[ray\]'"):
        build_config(small_raw)
    monkeypatch.setitem(sys.modules, "ray", None)  # what `import ray` meets when it is not there
    with pytest.raises(ConfigError, match=r"pip install 'marl-q\[ray\]'"):
        import_ray()


def test_marl_q_imports_and_lists_ray_without_ray():
    code = ("import sys; sys.modules['ray'] = None\n"
            "import marl_q.backends\n"
            "from marl_q.registry import BACKENDS\n"
            "assert 'ray' in BACKENDS, BACKENDS.names()\n"
            "print('ok')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


def test_ray_config_is_validated(small_raw):
    _on_ray(small_raw)["backend"]["ray"]["num_cpus_per_worker"] = -1
    with pytest.raises(ConfigError, match="backend.ray.num_cpus_per_worker: must be >= 0"):
        build_config(small_raw)
    small_raw["backend"]["ray"] = {"adress": "x:1"}
    with pytest.raises(ConfigError, match="did you mean 'backend.ray.address'"):
        build_config(small_raw)
    small_raw["backend"]["ray"] = {}
    small_raw["backend"]["faults"] = {"loss": 0.1}
    with pytest.raises(ConfigError, match="loss need backend.name: sim"):
        build_config(small_raw)
