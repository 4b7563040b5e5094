"""The sim backend at many workers (docs/runtime.md, "Many workers on sim"): workers sharing one copy
of the models compute what workers with their own compute, a lognormal fleet of speeds, drop-outs and
rejoins, byte-identical reruns at 250 workers, and `marlq bench sim_scale` (whose --repeats checks the
rerun bytes at 1,000 workers, outside the suite: docs/runtime.md quotes it)."""
from __future__ import annotations

import csv
import json
import math
from types import SimpleNamespace

import numpy as np
import pytest

from agents.actor_critic import ActorCriticWorker, SharedModels
from marl_q.backends.sim import _Timing
from marl_q.bench.sim_scale import RUN_FILES, rerun_differences
from marl_q.config import build_config, load_config
from marl_q.errors import ConfigError
from marl_q.experiment import run_experiment
from marl_q.ledger import ledger_audit
from marl_q.registry import ALGORITHMS

def _files(run_dir) -> dict[str, bytes]:
    return {name: (run_dir / name).read_bytes() for name in RUN_FILES}


@pytest.mark.parametrize("n_steps,aggregation", [(5, "hogwild"), (1, "hogwild"), (5, "buffered")])
def test_workers_sharing_models_write_the_bytes_of_workers_with_their_own(small_raw, tmp_path, monkeypatch,
                                                                          n_steps, aggregation):
    # n_steps 1 takes the numpy path, 5 the torch one; buffered: several workers at one version
    small_raw["backend"]["workers"] = 4
    small_raw["algorithm"]["n_steps"] = n_steps
    small_raw["server"].update({"aggregation": aggregation, "buffer_k": 3})
    small_raw["run"]["checkpoint_every"] = 0
    shared = run_experiment(build_config(small_raw), tmp_path / "shared")
    monkeypatch.setattr(SharedModels, "fits", staticmethod(lambda cfg: False))
    own = run_experiment(build_config(small_raw), tmp_path / "own")
    assert shared["updates"] == own["updates"] > 10
    assert _files(tmp_path / "shared") == _files(tmp_path / "own")


def test_workers_at_one_version_hold_one_array_and_one_model(small_raw):
    small_raw["backend"]["workers"] = 3
    cfg = build_config(small_raw)
    alg = ALGORITHMS.get("a3c").obj(cfg)
    service = alg.make_service()
    workers = [alg.make_worker(i) for i in range(3)]
    hello = service.hello("w0", 0)[0]
    for w in workers:
        w.deliver(hello)
    assert all(w.shares_models for w in workers)
    assert workers[0].actor is workers[1].actor is workers[2].actor
    assert workers[0].flat.values is workers[2].flat.values is hello.payload["params"]  # no copy
    # a worker with models of its own (the reference), fed the same message, pushes the same gradient
    reference = ActorCriticWorker(cfg, 1)
    reference.deliver(hello)
    workers[0].step()  # another worker's step in between leaves the shared buffer at its parameters
    ours, theirs = workers[1].step().messages[0], reference.step().messages[0]
    assert np.array_equal(ours.payload["grad"], theirs.payload["grad"]) and ours.payload["grad"].any()
    assert not reference.shares_models and reference.actor is not workers[1].actor


def _timing(raw: dict) -> _Timing:
    return _Timing(SimpleNamespace(cfg=build_config(raw)))


def test_lognormal_speeds_are_mean_one_lognormal_per_worker_and_leave_the_timing_stream_alone(small_raw):
    n, sigma = 4000, 0.5
    small_raw["backend"].update({"workers": n, "compute": {"speeds": "lognormal", "speed_sigma": sigma,
                                                           "stragglers": [7], "straggler_factor": 10.0}})
    factors = np.array(_timing(small_raw).factor)
    small_raw["backend"]["compute"]["stragglers"] = []
    plain = np.array(_timing(small_raw).factor)
    assert factors[7] == pytest.approx(10.0 * plain[7]) and np.array_equal(np.delete(factors, 7), np.delete(plain, 7))
    logs = np.log(plain)
    # log-factors are N(-sigma^2/2, sigma): mean within 4 standard errors, and the spread
    assert abs(logs.mean() + sigma ** 2 / 2) < 4 * sigma / math.sqrt(n)
    assert logs.std() == pytest.approx(sigma, rel=0.05)
    # mean one: E exp(N(-s^2/2, s)) = 1; its standard error is sqrt(e^{s^2} - 1) / sqrt(n)
    assert abs(plain.mean() - 1.0) < 4 * math.sqrt(math.exp(sigma ** 2) - 1) / math.sqrt(n)
    assert len(set(plain.tolist())) == n  # a fleet of distinct speeds, fixed by the seed
    # the factors come from a stream of their own: the timing generator draws what it drew before
    small_raw["backend"]["compute"] = {}
    constant = _timing(small_raw).rng.random(5)
    small_raw["backend"]["compute"] = {"speeds": "lognormal"}
    assert np.array_equal(_timing(small_raw).rng.random(5), constant)


@pytest.mark.parametrize("section,values,message", [
    ("compute", {"speeds": "fast"}, "backend.compute.speeds"),
    ("compute", {"speeds": "lognormal", "speed_sigma": -0.1}, "backend.compute.speed_sigma: must be >= 0"),
    ("faults", {"dropout": 1.0}, "dropout: a probability in [0, 1)"),
    ("faults", {"dropout": 0.1, "rejoin_s": -1.0}, "rejoin_s: must be >= 0"),
])
def test_bad_speed_and_dropout_keys_are_refused(small_raw, section, values, message):
    small_raw["backend"][section] = values
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("(", r"\(").replace(")", r"\)")):
        build_config(small_raw)


def test_dropout_needs_the_event_sim_and_exits_2(tmp_path, capsys):
    from marl_q.cli import main

    code = main(["run", "scenarios/linear_mdp_regret.yaml", "--out", str(tmp_path / "r"),
                 "--set", "backend.faults.dropout=0.1"])
    assert code == 2 and not (tmp_path / "r").exists()
    assert "backend.faults: injected faults need backend.name: sim with schedule: events" in capsys.readouterr().err


def test_workers_drop_out_and_rejoin_with_every_push_accounted(small_raw, tmp_path):
    small_raw["backend"].update({"workers": 4, "faults": {"dropout": 0.2, "rejoin_s": 0.01},
                                 "compute": {"speeds": "lognormal", "speed_sigma": 1.0}})
    small_raw["run"].update({"total_env_steps": 4000, "checkpoint_every": 0})
    summary = run_experiment(build_config(small_raw), tmp_path / "r")
    assert summary["status"] == "completed" and summary["env_steps"] >= 4000
    audit = ledger_audit(tmp_path / "r")
    dropouts = audit.faults["dropout"]
    assert dropouts == summary["faults_injected"]["dropout"] > 5
    # every drop-out but those the run ended before is followed by a rejoin: a hello of a new incarnation
    assert dropouts <= sum(audit.lives.values()) <= 4 + dropouts  # (4 first hellos, 4 at most still away)
    assert audit.repeated_keys == []
    for worker, row in audit.workers.items():  # the pushes left behind were never sent; the rest all arrived
        assert row["received"] == row["sent"] == row["accepted"] + row["rejected"] + row["dropped_stale"], worker
    # a worker that left sends nothing until its hello, and its pushes go on from the next seq
    with open(tmp_path / "r" / "comm.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    for i, r in enumerate(rows):
        if r["kind"] == "fault:dropout":
            later = [x for x in rows[i + 1:] if x["src"] == r["src"] and x["kind"] in ("hello", "grad", "fault:dropout")]
            if later:
                assert later[0]["kind"] == "hello" and float(later[0]["t"]) > float(r["t"])
                # its next push (arrived, or left behind again) is the next one it numbered
                assert len(later) == 1 or int(later[1]["seq"]) == int(r["seq"]) + 1


MANY = 250  # workers in the suite's reruns; `marlq bench sim_scale --repeats 2` checks 1,000 (docs/runtime.md)


def _many(tmp_path, name: str, extra: list[str]) -> dict:
    cfg = load_config("scenarios/cartpole_a3c.yaml", [
        # one env step a worker step, each an episode (so that metrics.csv has a row per step): 4 waves
        f"backend.workers={MANY}", f"run.total_env_steps={4 * MANY}", "scenario.num_envs=1", "algorithm.n_steps=1",
        "scenario.max_episode_steps=1",
        "run.progress=false", "run.plots=false", "run.checkpoint_every=0", "backend.compute.speeds=lognormal",
        "backend.faults.dropout=0.05", "backend.faults.rejoin_s=0.001", *extra])
    return run_experiment(cfg, tmp_path / name)


@pytest.mark.parametrize("extra", [["server.staleness.rule=poly"],
                                   ["server.aggregation=buffered", "server.buffer_k=100"]],
                         ids=["hogwild_poly", "buffered_k100"])
def test_many_workers_rerun_byte_identical(tmp_path, extra):
    first, second = _many(tmp_path, "a", extra), _many(tmp_path, "b", extra)
    assert first["workers"] == MANY and first["env_steps"] >= 4 * MANY and first["faults_injected"]["dropout"] > 0
    assert len({r["worker"] for r in csv.DictReader(open(tmp_path / "a" / "metrics.csv"))}) > MANY // 2
    assert _files(tmp_path / "a") == _files(tmp_path / "b")
    assert {k: v for k, v in first.items() if k != "wall_s"} == {k: v for k, v in second.items() if k != "wall_s"}


def test_many_lsvi_agents_rerun_byte_identical(tmp_path):
    def run(name: str) -> dict:
        cfg = load_config("scenarios/linear_mdp_regret.yaml", [f"backend.workers={MANY}",
                                                                f"run.total_episodes={4 * MANY}", "run.progress=false"])
        return run_experiment(cfg, tmp_path / name)

    first, second = run("a"), run("b")
    assert first["workers"] == MANY and first["episodes"] == 4 * MANY
    assert (tmp_path / "a" / "metrics.csv").read_bytes() == (tmp_path / "b" / "metrics.csv").read_bytes()
    assert (tmp_path / "a" / "comm.csv").read_bytes() == (tmp_path / "b" / "comm.csv").read_bytes()


def test_bench_sim_scale_reruns_measures_and_draws_the_figure(tmp_path, capsys):
    from marl_q.bench.sim_scale import sim_scale_main

    png = tmp_path / "scale.png"
    code = sim_scale_main(["--workers", "3", "--steps", "300", "--variant", "hogwild:server.aggregation=hogwild",
                           "--set", "scenario.num_envs=2", "--repeats", "2", "--out", str(tmp_path / "runs"),
                           "--plot", str(png), "--json"])
    assert code == 0
    [r] = json.loads(capsys.readouterr().out)
    assert (r["variant"], r["workers"], r["repeats"]) == ("hogwild", 3, 2)
    assert r["env_steps"] >= 300 and r["peak_rss_mb"] > 0 and r["cpu_s"] > 0
    # wall_s is written to 0.01 s, and the median of the repeats is rounded to 0.01 s again (the mean of two
    # values 0.01 apart ends in 5): up to 0.005 s each, so 0.01 s in all (a 0.0068 s gap failed the old bound)
    assert r["wall_per_1M"] == pytest.approx(r["wall_s"] * 1e6 / r["env_steps"], abs=0.0101e6 / r["env_steps"] + 0.1)
    # the repeat wrote the first run's bytes, and the bench compared them
    first, rerun = tmp_path / "runs" / "hogwild" / "w3", tmp_path / "runs" / "hogwild" / "w3-rerun1"
    assert r["rerun"] == "identical" and (first / "metrics.csv").is_file() and _files(first) == _files(rerun)
    # the second half's rate, and the run carried on to 1M env steps at it
    assert r["steady_cpu_per_1M"] > 0 and r["steady_wall_per_1M"] > 0
    assert r["wall_1M_est"] == pytest.approx(r["wall_s"] + (1e6 - r["env_steps"]) * r["steady_wall_per_1M"] / 1e6,
                                             rel=0.01)
    assert r["loadavg_start"] and r["loadavg_end"] and r["wall_x"] == r["rss_x"] == r["steady_cpu_x"] == 1.0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_ratios_are_against_the_first_worker_count_of_each_variant():
    from marl_q.bench.sim_scale import add_ratios

    rows = add_ratios([{"variant": "a", "workers": 10, "cpu_per_1M": 200.0, "peak_rss_mb": 300.0},
                       {"variant": "a", "workers": 1000, "cpu_per_1M": 290.0, "peak_rss_mb": 450.0},
                       {"variant": "b", "workers": 10, "cpu_per_1M": 100.0, "peak_rss_mb": 0.0}])
    assert [(r["cpu_x"], r["rss_x"], r["wall_x"]) for r in rows] == [(1.0, 1.0, None), (1.45, 1.5, None), (1.0, None, None)]


def test_the_bench_names_the_run_files_a_rerun_changed(tmp_path):
    first, other = tmp_path / "a", tmp_path / "b"
    for d in (first, other):
        d.mkdir()
        for name in RUN_FILES:
            (d / name).write_bytes(b"t,worker\n0.5,w0\n")
    assert rerun_differences(first, other) == []
    (other / "comm.csv").write_bytes(b"t,worker\n0.5,w1\n")  # one byte
    assert rerun_differences(first, other) == ["comm.csv"]
    for d in (first, other):  # a file neither run wrote (an LSVI run's train.csv) is no difference
        (d / "train.csv").unlink()
    assert rerun_differences(first, other) == ["comm.csv"]
    (first / "comm.csv").unlink()  # one that only one of them wrote is
    assert rerun_differences(first, other) == ["comm.csv"]


def test_medians_of_the_repeats_and_the_rerun_verdict(tmp_path):
    from marl_q.bench.sim_scale import summarize_repeats

    dirs = []
    for i, content in enumerate((b"x", b"x", b"y")):
        d = tmp_path / f"r{i}"
        d.mkdir()
        for name in RUN_FILES:
            (d / name).write_bytes(content if name == "train.csv" else b"same")
        dirs.append(d)
    runs = [{"env_steps": 100, "wall_s": w, "cpu_s": c, "peak_rss_mb": m, "run_dir": str(d)}
            for w, c, m, d in zip((3.0, 1.0, 2.0), (5.0, 4.0, 9.0), (10.0, 30.0, 20.0), dirs)]
    row = summarize_repeats("v", 7, runs)
    assert (row["wall_s"], row["cpu_s"], row["peak_rss_mb"]) == (2.0, 5.0, 20.0)  # by hand
    assert row["rerun"] == "DIFFER: train.csv" and row["repeats"] == 3
    assert summarize_repeats("v", 7, runs[:2])["rerun"] == "identical"
    assert summarize_repeats("v", 7, runs[:1])["rerun"] == "-"


@pytest.mark.parametrize("argv,message", [(["--workers", "0"], "--workers '0'"),
                                          (["--variant", "nocolon"], "--variant 'nocolon'"),
                                          (["--repeats", "0"], "--repeats: must be >= 1")])
def test_bench_sim_scale_refuses_bad_arguments(argv, message):
    from marl_q.bench.sim_scale import sim_scale_main

    with pytest.raises(ConfigError, match=message):
        sim_scale_main(argv)
