"""What the CLI imports before it does its work (imports, never times): `marlq --help` and a config
mistake import no component, `marlq run` reaches its first env step without analysis, matplotlib or
scipy; `marlq bench startup` prints its medians; `marlq bench runtime --parts a2c` leaves Ray alone and
names what is not installed."""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

from marl_q.bench.startup import startup_main

ROOT = Path(__file__).resolve().parents[2]
CONFIG = "scenarios/cartpole_a3c.yaml"
COMPONENTS = ("torch", "agents", "analysis", "scenarios", "circuits", "matplotlib", "scipy")
PLOTTING = ("analysis", "matplotlib", "scipy")


def python(code: str) -> subprocess.CompletedProcess:
    """``code`` in a fresh interpreter at the repository root."""
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=ROOT, capture_output=True, text=True,
                          timeout=600)


def imported_after(argv: list[str]) -> tuple[int, list[str], str]:
    """(exit code, top-level packages of COMPONENTS imported, stderr) of ``marlq ARGV`` in a fresh process."""
    done = python(f"""
        import sys
        from marl_q.cli import main
        try:
            code = main({argv!r})
        except SystemExit as exc:
            code = exc.code
        sys.stdout.flush()
        print("\\nIMPORTED", code, *[m for m in {COMPONENTS!r} if m in sys.modules])
    """)
    last = done.stdout.strip().splitlines()[-1].split()
    assert last[0] == "IMPORTED", done.stdout + done.stderr
    return int(last[1]), last[2:], done.stderr


def test_help_imports_no_component():
    code, imported, _ = imported_after(["--help"])
    assert code == 0 and imported == []


def test_list_imports_no_component(capsys):
    """`marlq list` prints every registry, the circuit blocks included, from the plugins' source: no
    plugin module is imported, nor torch (the blocks' names and helps are read from circuits/ansatze/...)."""
    code, imported, _ = imported_after(["list"])
    assert code == 0 and imported == []
    done = python("""
        import sys
        from marl_q.cli import main
        main(["list"])
        print("NUMPY", "numpy" in sys.modules)
    """)
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert out.strip().splitlines()[-1] == "NUMPY False"
    for line in ("ansatze:", "  ry_cz ", "encodings:", "  angle_z ", "observables:", "  p0 "):
        assert line in out, line
    assert "RZ(x_i) on qubit i (a global phase unless hadamard: true)" in " ".join(out.split())


def test_a_config_mistake_is_reported_before_any_component_is_imported():
    code, imported, err = imported_after(["run", CONFIG, "--set", "run.nope=1"])
    assert code == 2 and imported == []
    assert err.strip().splitlines() == [err.strip()] and "run.nope: unknown key" in err


def test_an_unknown_component_name_lists_the_choices_without_importing_them(tmp_path):
    config = tmp_path / "typo.yaml"
    config.write_text("run: {total_env_steps: 10}\nscenario: {name: cartpole}\nalgorithm: {name: a3cc}\n")
    code, imported, err = imported_after(["run", str(config)])
    assert code == 2 and "did you mean 'a3c'?" in err and "mappo" in err
    assert "agents" not in imported and "analysis" not in imported


def test_a_run_reaches_its_first_env_step_without_the_plotting_packages(tmp_path):
    done = subprocess.run([sys.executable, "-m", "marl_q.bench.startup", CONFIG, "--out", str(tmp_path / "run")],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    packages = json.loads(done.stdout.strip().splitlines()[-1])["packages"]
    assert {"torch", "agents", "scenarios", "marl_q"} <= set(packages)  # the probe did reach the env
    assert not set(PLOTTING) & set(packages)


def test_bench_startup_prints_a_median_for_each_command_line(capsys):
    assert startup_main(["--repeats", "1", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["command"] for r in rows] == ["python -c pass", "marlq --help", "marlq run (config mistake)",
                                            "marlq list", "marlq run (to first env step)"]
    assert all(r["repeats"] == 1 and 0 < r["min_s"] <= r["median_s"] <= r["max_s"] and r["cpu_median_s"] > 0
               for r in rows)


def test_bench_runtime_a2c_names_a_missing_peer_and_leaves_ray_alone():
    done = python("""
        import sys
        import marl_q.bench.runtime as runtime
        runtime.bench_sb3_a2c = lambda steps: None  # as without Stable-Baselines3
        code = runtime.main(["--parts", "a2c", "--steps", "200", "--repeats", "1"])
        print("RAY", "ray" in sys.modules, code)
    """)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.strip().splitlines()
    assert lines[-1] == "RAY False 0"
    cells = {line.split()[0]: line.split(None, 1)[1] for line in lines[:-1] if line.strip()}
    assert cells["sb3_a2c_steps_per_s"] == cells["a2c_ratio_vs_sb3"] == "not installed (pip install -e '.[bench]')"
    assert "None" not in done.stdout
    assert "ray" not in done.stderr.lower()


def test_startup_bench_default_config_is_the_shipped_file_from_any_folder():
    from marl_q.bench.startup import DEFAULT_CONFIG

    assert Path(DEFAULT_CONFIG).is_absolute() and Path(DEFAULT_CONFIG).is_file()


def test_bench_startup_times_another_checkout_interleaved_and_picks_command_lines(capsys):
    """--against DIR: both sides' medians and their ratio for each command line --only picked."""
    assert startup_main(["--repeats", "2", "--json", "--only", "help", "--only", "list", "--against", str(ROOT)]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["command"] for r in rows] == ["marlq --help", "marlq list"]
    for r in rows:
        assert r["repeats"] == 2 and r["ratio"] == r["median_s"] / r["against_median_s"]
        assert r["against_min_s"] <= r["against_median_s"] <= r["against_max_s"]


def test_bench_startup_names_a_wrong_against_or_only(tmp_path):
    import pytest

    from marl_q.errors import ConfigError

    with pytest.raises(ConfigError, match="--against: .*not a checkout of marl-q"):
        startup_main(["--against", str(tmp_path)])
    with pytest.raises(ConfigError, match="--only: no command line's label contains 'nope'"):
        startup_main(["--only", "nope"])
