"""The import rules of docs/circuits.md ("Layering"), counted from the source and held at zero.

- no import cycle between the project's modules (every import counts: top level, inside a function,
  under ``TYPE_CHECKING``);
- ``circuits/`` imports nothing from ``agents/`` (the quantum library does not depend on the algorithms);
- no private name crosses a package boundary: another package imports neither a leading-underscore
  name nor one of circuits' implementation modules (the executors' internals, ``INTERNAL``: other
  packages use ``circuits.VQC``, ``circuits.executors``, ``circuits.twins``, ``circuits.gradients``);
  and ``agents/`` does not read ``nn.Module``'s private registries (``._modules``, ``._parameters``,
  ``._buffers``).

``python tests/test_layering.py [ROOT]`` prints the counts for a checkout (ROOT, default this one).
"""
from __future__ import annotations

import ast
import sys
from pathlib import Path

PACKAGES = ("marl_q", "agents", "circuits", "scenarios", "analysis")
# circuits' implementation modules: what the executors are made of, not an API for other packages
# (circuits.adjoint: the statevector executor's earlier name, so that older checkouts count the same)
INTERNAL = ("circuits.engine", "circuits.statevector", "circuits.adjoint", "circuits.kernels", "circuits.numba_kernels",
            "circuits.program", "circuits.einsum_executor")
REGISTRIES = ("_modules", "_parameters", "_buffers")


def package_tree(root: Path) -> None:
    """Empty packages of the project's names under ``root``: the tests' made-up checkouts start here."""
    for package in PACKAGES:
        (root / package).mkdir()
        (root / package / "__init__.py").write_text("")


def modules(root: Path) -> dict[str, Path]:
    out = {}
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            out[name] = path
    return out


def imports(path: Path, name: str, known: dict[str, Path]) -> list[tuple[str, str | None]]:
    """(imported module, imported name or None) of every project import in one file."""
    tree = ast.parse(path.read_text())
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: list[tuple[str, str | None]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(alias.name, None) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parent + ([base] if base else []))
            for alias in node.names:
                full = f"{base}.{alias.name}"
                found.append((full, None) if full in known else (base, alias.name))
    return [(module, item) for module, item in found if module.split(".")[0] in PACKAGES]


def resolve(module: str, known: dict[str, Path]) -> str | None:
    while module and module not in known:
        module = module.rpartition(".")[0]
    return module or None


def counts(root: Path) -> dict[str, list[str]]:
    known = modules(root)
    graph: dict[str, set[str]] = {name: set() for name in known}
    agents_from_circuits, private = [], []
    for name, path in known.items():
        top = name.split(".")[0]
        for module, item in imports(path, name, known):
            target = resolve(module, known)
            if target is None or target == name:
                continue
            graph[name].add(target)
            other = target.split(".")[0]
            if top == "circuits" and other == "agents":
                agents_from_circuits.append(f"{name} -> {target}")
            if other != top and top != "tests":
                if (item or "").startswith("_") or target in INTERNAL:
                    private.append(f"{name} -> {target}{'.' + item if item else ''}")
        if top == "agents":
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Attribute) and node.attr in REGISTRIES:
                    private.append(f"{name} reads .{node.attr} (line {node.lineno})")
    return {"cycles": cycles(graph), "circuits_to_agents": agents_from_circuits, "private": private}


def cycles(graph: dict[str, set[str]]) -> list[str]:
    """The strongly connected components of more than one module (Tarjan), each as 'a <-> b <-> c'."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[str] = []
    sys.setrecursionlimit(10000)

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for succ in graph.get(node, ()):
            if succ not in index:
                visit(succ)
                low[node] = min(low[node], low[succ])
            elif succ in on_stack:
                low[node] = min(low[node], index[succ])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(" <-> ".join(sorted(component)))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


ROOT = Path(__file__).resolve().parents[1]


def test_no_import_cycles():
    assert counts(ROOT)["cycles"] == []


def test_circuits_never_imports_agents():
    assert counts(ROOT)["circuits_to_agents"] == []


def test_no_private_names_cross_packages():
    assert counts(ROOT)["private"] == []


def test_the_circuits_engine_has_no_cycle_and_no_private_import():
    """Part 1's own modules: no exception at all."""
    got = counts(ROOT)
    assert [c for c in got["cycles"] if "circuits." in c and "bench" not in c and "blocks" not in c] == []
    assert [p for p in got["private"] if p.startswith(("analysis.plateau", "agents.numpy_heads"))] == []


def test_the_counter_sees_a_cycle_and_a_private_import(tmp_path):
    """The rules count what they say: a two-module cycle, a circuits -> agents import, an engine internal
    imported by analysis and an nn.Module registry read by agents."""
    package_tree(tmp_path)
    (tmp_path / "circuits" / "engine.py").write_text("from circuits import adjoint\n")
    (tmp_path / "circuits" / "adjoint.py").write_text("def f():\n    from circuits.engine import x\n    import agents.heads\n")
    (tmp_path / "agents" / "heads.py").write_text("def g(m):\n    return m._parameters\n")
    (tmp_path / "analysis" / "plateau.py").write_text("from circuits.engine import apply\nfrom marl_q import _hidden\n")
    got = counts(tmp_path)
    assert got["cycles"] == ["circuits.adjoint <-> circuits.engine"]
    assert got["circuits_to_agents"] == ["circuits.adjoint -> agents.heads"]
    assert sorted(got["private"]) == ["agents.heads reads ._parameters (line 2)", "analysis.plateau -> circuits.engine.apply",
                                      "analysis.plateau -> marl_q._hidden"]


if __name__ == "__main__":
    result = counts(Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT)
    for key, items in result.items():
        print(f"{key}: {len(items)}")
        for item in items:
            print(f"  {item}")
