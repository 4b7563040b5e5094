"""What a new researcher trips on: their own env file beside the scenario, a start that fails leaving
its run directory behind, a PettingZoo env the installed version does not have (issue 26)."""
from __future__ import annotations

import importlib.util
import json
import os
import pkgutil
import re
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import gymnasium as gym
import pettingzoo
import pytest
import yaml

from marl_q.cli import main as cli_main
from marl_q.config import build_config, load_config
from marl_q.errors import ConfigError
from scenarios.generic import find_module_dir, make_gymnasium, make_parallel

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "scenarios.md"

# a one-step-per-action corridor that ends after exactly LENGTH steps with reward 1 each: any policy
# returns LENGTH, so the return in summary.json says whose env ran
ENV_FILE = '''
import gymnasium as gym
import numpy as np
from gymnasium import spaces

LENGTH = {length}


class Fixed(gym.Env):
    observation_space = spaces.Box(0.0, 1.0, (2,), np.float32)
    action_space = spaces.Discrete(2)

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(2, np.float32), {{}}

    def step(self, action):
        self.t += 1
        return np.full(2, self.t / LENGTH, np.float32), 1.0, self.t == LENGTH, False, {{}}


def make():
    return Fixed()
'''
SCENARIO = {"run": {"seed": 0, "total_env_steps": 120, "plots": False},
            "backend": {"name": "sim", "workers": 1},
            "scenario": {"name": "gymnasium", "num_envs": 2},
            "algorithm": {"name": "a2c"},
            "actor": {"head": "mlp", "hidden": [8]}, "critic": {"head": "mlp", "hidden": [8]}}


def _unique(prefix: str) -> str:
    """A module name no other test imported (sys.modules outlives a test)."""
    return f"{prefix}_{uuid.uuid4().hex[:8]}"


def _marlq(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    """`marlq ARGS` in a fresh process started in ``cwd``. ``-P``: like the `marlq` script, and unlike
    ``python -m``, it does not put the current directory on sys.path itself."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run([sys.executable, "-P", "-m", "marl_q.cli", *args, "--quiet"], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


def _write_project(folder: Path, module: str, length: int, **scenario) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{module}.py").write_text(ENV_FILE.format(length=length))
    raw = json.loads(json.dumps(SCENARIO))
    raw["scenario"].update(env=f"{module}:make", **scenario)
    path = folder / "scenario.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def _summary(out: Path) -> dict:
    return json.loads((out / "summary.json").read_text())


# ----------------------------------------------------------------------------- 1. own env
def test_own_env_runs_from_its_own_folder(tmp_path):
    project = tmp_path / "project"
    _write_project(project, "myenv", length=3)
    done = _marlq(["run", "scenario.yaml", "--out", "run"], cwd=project)
    assert done.returncode == 0, done.stderr
    assert _summary(project / "run")["final_return"] == 3.0  # the corridor of myenv.py ran
    written = yaml.safe_load((project / "run" / "config.yaml").read_text())
    assert written["scenario"]["module_dir"] == str(project.resolve())


def test_own_env_beside_the_scenario_file_runs_from_another_folder_on_worker_processes(tmp_path):
    """From another directory the module is found beside the scenario file, and the local backend's
    worker processes (spawned, so they import afresh) import it from there too; so does resume."""
    project, elsewhere = tmp_path / "project", tmp_path / "elsewhere"
    scenario = _write_project(project, "myenv", length=4)
    elsewhere.mkdir()
    out = elsewhere / "run"
    done = _marlq(["run", str(scenario), "--out", str(out), "--set", "backend.name=local",
                   "--set", "run.checkpoint_every=1"], cwd=elsewhere)
    assert done.returncode == 0, done.stderr
    assert _summary(out)["final_return"] == 4.0
    resumed = _marlq(["resume", str(out), "--set", "run.total_env_steps=240"], cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    assert _summary(out)["env_steps"] >= 240 and _summary(out)["final_return"] == 4.0


def test_the_current_directory_comes_before_the_scenario_files_folder(tmp_path, monkeypatch):
    """As `python -m`: a module of that name in the current directory wins; the scenario file's folder
    is next; an installed module is not recorded at all."""
    name = _unique("corridor")
    here, beside = tmp_path / "here", tmp_path / "beside"
    _write_project(here, name, length=2)
    _write_project(beside, name, length=5)
    monkeypatch.chdir(here)
    assert find_module_dir(f"{name}:make", beside) == str(here.resolve())
    monkeypatch.chdir(tmp_path)
    assert find_module_dir(f"{name}:make", beside) == str(beside.resolve())
    assert find_module_dir(f"{_unique('absent')}:make", beside) is None
    assert find_module_dir("mpe2.simple_spread_v3:parallel_env", beside) is None  # installed
    assert find_module_dir("Pendulum-v1", beside) is None


def test_a_missing_own_module_names_where_it_looked(tmp_path, monkeypatch):
    name = _unique("nowhere")
    scenario = _write_project(tmp_path / "p", "other", length=2)
    raw = yaml.safe_load(scenario.read_text())
    raw["scenario"]["env"] = f"{name}:make"
    scenario.write_text(yaml.safe_dump(raw))
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError) as exc:
        load_config(scenario)
    assert str(exc.value) == (f"scenario.env: cannot import module '{name}': no {name}.py or {name}/ in the current "
                              f"directory ({tmp_path}), beside the scenario file ({(tmp_path / 'p').resolve()}) "
                              "or among the installed packages")


def _module_registering(tmp_path: Path, body: str) -> str:
    name = _unique("registers")
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(body).replace("ID", f"{name}/Env-v0"))
    return name


def test_module_colon_env_id_imports_the_module_then_makes_the_id_it_registers(tmp_path, monkeypatch):
    """`gymnasium.make("module:EnvId")`'s form, with a module that registers a Gymnasium id on import."""
    name = _module_registering(tmp_path, '''
        import gymnasium as gym
        gym.register(id="ID", entry_point="gymnasium.envs.classic_control.cartpole:CartPoleEnv",
                     max_episode_steps=7)
    ''')
    env_id = f"{name}/Env-v0"
    assert env_id not in gym.registry
    monkeypatch.chdir(tmp_path)
    cfg = build_config({**SCENARIO, "scenario": {"name": "gymnasium", "env": f"{name}:{env_id}", "num_envs": 2}})
    assert str(tmp_path) not in sys.path  # the folder was on it only while the module was imported
    assert cfg.scenario.module_dir == str(tmp_path.resolve())
    env = make_gymnasium(cfg.scenario.params, seed=0)
    assert env.envs[0].spec.id == env_id
    assert env.envs[0].spec.max_episode_steps == 7


def test_module_colon_env_id_for_pettingzoo(tmp_path, monkeypatch):
    name = _module_registering(tmp_path, '''
        import pettingzoo
        from mpe2 import simple_spread_v3
        pettingzoo.register("parallel", "ID", lambda **kw: simple_spread_v3.parallel_env(N=2, **kw))
    ''')
    monkeypatch.chdir(tmp_path)
    cfg = build_config({**SCENARIO, "scenario": {"name": "pettingzoo", "env": f"{name}:{name}/Env-v0",
                                                 "kwargs": {"max_cycles": 5}},
                        "algorithm": {"name": "iac"}})
    env = make_parallel(cfg.scenario.params, seed=0)
    assert len(env.possible_agents) == 2


def test_module_colon_name_that_is_neither_lists_the_accepted_forms(capsys, tmp_path):
    cfg = tmp_path / "bad.yaml"
    cfg.write_text(yaml.safe_dump({**SCENARIO, "scenario": {"name": "gymnasium",
                                                           "env": "gymnasium.envs.classic_control:NoSuch-v0"}}))
    assert cli_main(["run", str(cfg), "--out", str(tmp_path / "run"), "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert "has no attribute 'NoSuch-v0' and registers no Gymnasium id 'NoSuch-v0'" in err[0]
    assert all(form in err[0] for form in ("a registered id", "module:EnvId", "package.module:callable"))


def _doc_block(filename: str) -> str:
    """The code block that follows the line naming ``filename`` on docs/scenarios.md."""
    found = re.search(rf"^`{re.escape(filename)}`:\n\n```\w+\n(.*?)^```", DOC.read_text(), re.S | re.M)
    assert found, f"docs/scenarios.md has no block for {filename}"
    return found.group(1)


def test_the_own_env_example_of_the_docs_runs_as_written(tmp_path):
    (tmp_path / "corridor_env.py").write_text(_doc_block("corridor_env.py"))
    (tmp_path / "corridor.yaml").write_text(_doc_block("corridor.yaml"))
    done = _marlq(["run", "corridor.yaml", "--out", "run", "--set", "run.total_env_steps=200",
                   "--set", "run.plots=false"], cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert _summary(tmp_path / "run")["status"] == "completed"
    by_id = _marlq(["run", "corridor.yaml", "--out", "run_id", "--set", "run.total_env_steps=200",
                    "--set", "run.plots=false", "--set", "scenario.env=corridor_env:Corridor-v0"], cwd=tmp_path)
    assert by_id.returncode == 0, by_id.stderr


# ----------------------------------------------------------------------------- 2. a failed start
VQC_TOO_SMALL = ["actor={head: vqc, n_qubits: 2, layers: 1}"]  # CartPole has 4 features: needs 4 qubits
VQC_FITS = ["actor={head: vqc, n_qubits: 4, layers: 1}"]


def _cartpole_run(out: Path, actor: list[str]) -> int:
    args = ["run", str(ROOT / "scenarios" / "cartpole_a3c.yaml"), "--out", str(out), "--quiet",
            "--set", "run.total_env_steps=80", "--set", "run.plots=false", "--set", "backend.workers=1"]
    for item in actor:
        args += ["--set", item]
    return cli_main(args)


def test_a_head_that_does_not_fit_leaves_no_run_directory_and_the_fixed_config_reuses_out(tmp_path, capsys):
    out = tmp_path / "runs" / "a"
    assert _cartpole_run(out, VQC_TOO_SMALL) == 2
    assert "cannot map 4 inputs" in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()  # nor the parent it would have made
    assert _cartpole_run(out, VQC_FITS) == 0
    assert _summary(out)["status"] == "completed"


def test_an_existing_empty_out_and_its_neighbours_are_kept(tmp_path, capsys):
    out = tmp_path / "mine"
    out.mkdir()
    (tmp_path / "notes.txt").write_text("the user's own file")
    assert _cartpole_run(out, VQC_TOO_SMALL) == 2
    assert out.is_dir() and not any(out.iterdir())
    assert (tmp_path / "notes.txt").read_text() == "the user's own file"


def test_a_start_refused_by_the_backend_removes_what_it_made(tmp_path, capsys):
    """The ray backend refuses an unreachable address after the run directory exists: it goes again,
    with the folders made for it, and nothing that was there before."""
    (tmp_path / "notes.txt").write_text("the user's own file")
    out = tmp_path / "deep" / "run"
    code = cli_main(["run", str(ROOT / "scenarios" / "cartpole_a3c.yaml"), "--out", str(out), "--quiet",
                     "--set", "backend.name=ray", "--set", "backend.ray.address=127.0.0.1:1",
                     "--set", "run.total_env_steps=80"])
    assert code == 2
    assert "backend.ray.address" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]


# ----------------------------------------------------------------------------- 3. PettingZoo versions
def _installed_env_modules(package: str) -> list[str]:
    spec = importlib.util.find_spec(package)
    return sorted(m.name for m in pkgutil.iter_modules(spec.submodule_search_locations) if re.search(r"_v\d+$", m.name))


def _pettingzoo_error(tmp_path: Path, env: str, capsys) -> str:
    cfg = tmp_path / "pz.yaml"
    cfg.write_text(yaml.safe_dump({"run": {"total_env_steps": 100}, "algorithm": {"name": "iac"},
                                   "scenario": {"name": "pettingzoo", "env": env}}))
    assert cli_main(["run", str(cfg), "--out", str(tmp_path / "run"), "--quiet"]) == 2
    assert not (tmp_path / "run").exists()
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("marlq: error: scenario.env: ")
    return err[0]


def test_a_sisl_module_the_installed_pettingzoo_lacks_lists_what_sisl_has(tmp_path, capsys):
    line = _pettingzoo_error(tmp_path, "pettingzoo.sisl.waterworld_v4:parallel_env", capsys)
    have = _installed_env_modules("pettingzoo.sisl")
    assert "waterworld_v4" not in have and have  # what this test is about: 1.27 dropped waterworld
    assert f"PettingZoo {pettingzoo.__version__}'s sisl has {', '.join(have)}" in line


def test_an_unknown_sisl_id_lists_the_family_s_registered_ids(tmp_path, capsys):
    line = _pettingzoo_error(tmp_path, "sisl/waterworld-v4", capsys)
    ids = sorted(i for i in set(pettingzoo.parallel_registry) | set(pettingzoo.aec_registry) if i.startswith("sisl/"))
    assert f"registers in sisl: {', '.join(ids)}" in line


@pytest.mark.parametrize("env", ["pettingzoo.mpe.simple_spread_v3:parallel_env", "mpe/simple_spread-v3"])
def test_the_moved_mpe_family_points_to_mpe2_and_what_it_has(tmp_path, capsys, env):
    line = _pettingzoo_error(tmp_path, env, capsys)
    assert "ships no mpe: it moved to mpe2" in line
    assert ", ".join(_installed_env_modules("mpe2")) in line


def test_an_mpe2_module_that_does_not_exist_lists_mpe2s(tmp_path, capsys):
    line = _pettingzoo_error(tmp_path, "mpe2.simple_spreadd_v3:parallel_env", capsys)
    assert "has " + ", ".join(_installed_env_modules("mpe2")) in line


@pytest.mark.parametrize("family", ["butterfly", "classic", "atari"])
def test_other_families_list_their_modules(tmp_path, capsys, family):
    line = _pettingzoo_error(tmp_path, f"pettingzoo.{family}.no_such_game_v1:env", capsys)
    assert f"'s {family} has {', '.join(_installed_env_modules(f'pettingzoo.{family}'))}" in line
