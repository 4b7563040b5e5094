"""Issue 27's "one of each" counts that are at their target, held there (docs/architecture.md has the
whole table and the commands behind it):

- one progress bar: only ``marl_q.progress`` imports tqdm;
- one discovery mechanism: only ``marl_q.plugins`` finds modules to import (``pkgutil.iter_modules``,
  ``importlib.metadata.entry_points``), besides two listings of other projects' modules
  (``OTHER_PROJECTS``);
- one worker-restart policy: only ``marl_q.driver`` reads ``backend.max_restarts``;
- one table per kind of circuit block (tests/marl_q/test_plugins.py checks that circuits' are views).

``python tests/test_one_path.py [ROOT]`` prints the sites of each for a checkout (ROOT, default this one).
"""
from __future__ import annotations

import ast
import sys
from pathlib import Path

try:  # as a test module (the repository root on sys.path) or as a script (tests/ on sys.path)
    from tests.test_layering import modules as module_paths, package_tree
except ModuleNotFoundError:
    from test_layering import modules as module_paths, package_tree
# modules that list another project's modules, not marl-q's: PettingZoo's env modules for a user's
# env id, PennyLane's device plugins
OTHER_PROJECTS = ("scenarios.generic", "circuits.reference")


def modules(root: Path) -> dict[str, ast.Module]:
    return {name: ast.parse(path.read_text()) for name, path in module_paths(root).items()}


def imports_of(tree: ast.Module) -> set[str]:
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module)
    return found


def calls_of(tree: ast.Module) -> set[str]:
    """The names of the attributes and functions called (``pkgutil.iter_modules(...)``: iter_modules)."""
    return {n.func.attr if isinstance(n.func, ast.Attribute) else n.func.id
            for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, (ast.Attribute, ast.Name))}


def attributes_of(tree: ast.Module) -> set[str]:
    return {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}


def sites(root: Path) -> dict[str, list[str]]:
    """The modules doing each job (by what they import, call or read)."""
    found = modules(root)
    return {
        "progress bars": sorted(m for m, t in found.items() if any(i.split(".")[0] == "tqdm" for i in imports_of(t))),
        "discovery": sorted(m for m, t in found.items() if calls_of(t) & {"iter_modules", "entry_points"}
                            and m not in OTHER_PROJECTS),
        "restart policies": sorted(m for m, t in found.items() if "max_restarts" in attributes_of(t)),
    }


ROOT = Path(__file__).resolve().parents[1]


def test_one_progress_bar():
    assert sites(ROOT)["progress bars"] == ["marl_q.progress"]


def test_one_discovery_mechanism():
    assert sites(ROOT)["discovery"] == ["marl_q.plugins"]


def test_one_restart_policy():
    assert sites(ROOT)["restart policies"] == ["marl_q.driver"]


def test_the_counter_sees_a_second_of_each(tmp_path):
    """The scan counts what it says: a second bar, a second module finder and a second restart rule."""
    package_tree(tmp_path)
    (tmp_path / "marl_q" / "progress.py").write_text("def bar():\n    from tqdm import tqdm\n    return tqdm()\n")
    (tmp_path / "agents" / "loop.py").write_text("import tqdm.auto\n")
    (tmp_path / "marl_q" / "plugins.py").write_text("import pkgutil\nFOUND = list(pkgutil.iter_modules(['.']))\n")
    (tmp_path / "analysis" / "finder.py").write_text(
        "from importlib import metadata\nEPS = metadata.entry_points(group='x')\n")
    (tmp_path / "scenarios" / "generic.py").write_text("import pkgutil\nENVS = pkgutil.iter_modules(['.'])\n")
    (tmp_path / "marl_q" / "driver.py").write_text("def policy(cfg):\n    return cfg.backend.max_restarts\n")
    (tmp_path / "marl_q" / "local.py").write_text("def again(cfg, n):\n    return n < cfg.backend.max_restarts\n")
    got = sites(tmp_path)
    assert got["progress bars"] == ["agents.loop", "marl_q.progress"]
    assert got["discovery"] == ["analysis.finder", "marl_q.plugins"]  # scenarios.generic lists another project's
    assert got["restart policies"] == ["marl_q.driver", "marl_q.local"]


if __name__ == "__main__":
    for job, where in sites(Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT).items():
        print(f"{job}: {len(where)} ({', '.join(where)})")
