"""The plugin index: every registry's names and helps read from the plugins' source are what importing
them registers; a lookup imports only the module of the name it asks for; the forms of registration
the index reads, and those it leaves to the import."""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from marl_q import plugins
from marl_q.registry import ALGORITHMS, ALL, PLOTS, Registry, registries

ROOT = Path(__file__).resolve().parents[2]


def python(code: str, *, path: Path | None = None) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh interpreter at the repository root (``path`` first on sys.path)."""
    env_path = [str(path)] if path is not None else []
    code = f"import sys; sys.path[:0] = {env_path!r}\n" + code
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=600)


def test_the_index_lists_what_the_imports_register():
    """Names and helps as the index reads them (in a fresh process, before any plugin is imported), then
    the same registries after importing every plugin module: the same names, the same helps."""
    done = python(textwrap.dedent("""
        import json, sys
        from marl_q.registry import ALL, PLOTS
        regs = dict(ALL, plots=PLOTS)
        names = {t: r.names() for t, r in regs.items()}  # indexes them
        read = {t: {n: r._declared[n][1] for n in r._declared} for t, r in regs.items()}
        from marl_q.registry import load_plugins
        load_plugins()
        loaded = {t: {e.name: e.help for e in r} for t, r in regs.items()}
        print(json.dumps({"read": read, "names": names, "loaded": loaded}))
    """))
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout)
    for table, loaded in got["loaded"].items():
        assert got["names"][table] == sorted(loaded), table
        for name, help in got["read"][table].items():
            assert name in loaded, f"{table}: {name} read from source but not registered by its module"
            assert help is None or help == loaded[name], (table, name)
    # the index reads every name and help of these without an import
    for table in ("algorithms", "heads", "scenarios", "backends", "aggregations", "staleness", "benches",
                  "commands", "plots", "ansatze", "encodings", "observables"):
        assert sorted(got["read"][table]) == sorted(got["loaded"][table]), table
        assert None not in got["read"][table].values(), table


def test_a_lookup_imports_the_module_of_that_name_only():
    done = python(textwrap.dedent("""
        import sys
        from marl_q.registry import ALGORITHMS, COMMANDS, PLOTS
        assert "a3c" in ALGORITHMS and "coma" in COMMANDS and "standard" in PLOTS
        before = sorted(m for m in ("agents", "analysis", "torch", "scenarios", "circuits") if m in sys.modules)
        ALGORITHMS.get("lsvi_ucb_pooled")
        after = sorted(m for m in sys.modules if m.startswith(("agents.", "analysis", "matplotlib")))
        print(before, after)
    """))
    assert done.returncode == 0, done.stderr
    before, after = done.stdout.strip().split("] [")
    assert before == "["
    assert "'agents.lsvi'" in after
    for other in ("agents.actor_critic", "agents.coma", "agents.routing", "analysis", "matplotlib"):
        assert f"'{other}'" not in after


def test_the_forms_of_registration_the_index_reads(tmp_path):
    pkg = tmp_path / "my_plugins"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "specs.py").write_text(textwrap.dedent('''
        from typing import NamedTuple

        class Spec(NamedTuple):
            config: type
            make: object
            kind: str
            help: str
    '''))
    (pkg / "blocks.py").write_text(textwrap.dedent('''
        from dataclasses import dataclass

        @dataclass(frozen=True)
        class Gadget:
            registry = "ANSATZE"  # the registry its objects go to
            name: str
            help: str

        def register(block):
            return block
    '''))
    (pkg / "mod.py").write_text(textwrap.dedent('''
        from marl_q.registry import ALGORITHMS, HEADS, STALENESS
        from my_plugins.specs import Spec
        from my_plugins.blocks import Gadget, register

        G1 = register(Gadget("by_position", "block by position"))
        register(Gadget(name="by_keyword", help="block by keyword"))
        NOT_REGISTERED = Gadget("plain", "no register call")

        @ALGORITHMS.register("decorated", help="by decorator")
        class A: ...

        ALGORITHMS.add("added", A, help="by add")
        ALGORITHMS.add("no_help", A)
        for _name, _help in (("loop_a", "first"), ("loop_b", "second")):
            ALGORITHMS.add(_name, A, help=_help)
        STALENESS.add("computed_" + "name", A)

        def build(): ...
        SCENARIOS = {"positional": Spec(int, build, "parallel", "help by position"),
                     "keyword": Spec(config=int, make=build, kind="parallel", help="help by keyword")}

        def main(argv):
            """A command's help is its docstring's first paragraph,
            on one line.

            Not this."""

        COMMANDS = {"mine": main}
        HEADS_TABLE = {"not": "a table"}
    '''))
    sys.path.insert(0, str(tmp_path))
    try:
        declared, sources = plugins.scan_module("my_plugins.mod", registries())
    finally:
        sys.path.remove(str(tmp_path))
    assert sorted(declared) == sorted([
        ("ALGORITHMS", "decorated", "by decorator"), ("ALGORITHMS", "added", "by add"),
        ("ALGORITHMS", "no_help", ""), ("ALGORITHMS", "loop_a", "first"), ("ALGORITHMS", "loop_b", "second"),
        ("SCENARIOS", "positional", "help by position"), ("SCENARIOS", "keyword", "help by keyword"),
        ("COMMANDS", "mine", "A command's help is its docstring's first paragraph, on one line."),
        ("ANSATZE", "by_position", "block by position"), ("ANSATZE", "by_keyword", "block by keyword")])
    assert sources == {"STALENESS"}  # a computed name: only the import tells


def test_a_registry_imports_a_declared_module_on_first_lookup(tmp_path, monkeypatch):
    (tmp_path / "widgets.py").write_text("from marl_q.registry import Registry\nWIDGETS = Registry('widget')\n")
    (tmp_path / "lazy_widget.py").write_text(
        "from widgets import WIDGETS\nWIDGETS.add('lazy_one', object, help='imported late')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    from widgets import WIDGETS

    WIDGETS.declare("lazy_one", "lazy_widget", "imported late")
    assert WIDGETS.names() == ["lazy_one"] and "lazy_one" in WIDGETS
    assert WIDGETS.describe() == [("lazy_one", "imported late")] and "lazy_widget" not in sys.modules
    assert WIDGETS.get("lazy_one").obj is object
    assert "lazy_widget" in sys.modules


def test_a_module_that_does_not_register_its_declared_name_is_named():
    reg = Registry("widget")
    reg.declare("ghost", "marl_q.errors")
    with pytest.raises(RuntimeError, match="widget 'ghost': module marl_q.errors"):
        reg.get("ghost")


def test_the_circuit_blocks_are_kept_in_one_table(monkeypatch):
    """circuits.blocks' ANSATZE, ENCODINGS and OBSERVABLES are marl_q.registry's (issue 27: the block
    registry was kept twice): the same names and objects; a block registered once is in both; a second
    block under its name is refused and the same block again is not; a stand-in set through circuits'
    table (as monkeypatch.setitem does) is what the registry gives, and leaves with it."""
    from circuits import blocks
    from marl_q import registry

    blocks.load_all()
    for name in ("ANSATZE", "ENCODINGS", "OBSERVABLES"):
        view, reg = getattr(blocks, name), getattr(registry, name)
        assert len(view) >= 3 and sorted(view) == reg.names()
        assert all(view[key] is reg.get(key).obj for key in view)
    new = blocks.Encoding(name="angle_test_only", axis="ry", help="a test's encoding")
    try:
        assert blocks.register(new) is new and blocks.register(new) is new  # again: nothing happens
        assert blocks.ENCODINGS["angle_test_only"] is new is registry.ENCODINGS.get("angle_test_only").obj
        assert list(blocks.ENCODINGS)[-1] == "angle_test_only"  # in the order registered
        with pytest.raises(RuntimeError, match="encoding 'angle_test_only' is registered twice"):
            blocks.register(blocks.Encoding(name="angle_test_only", axis="rx", help="another"))
    finally:
        del blocks.ENCODINGS["angle_test_only"]
    assert "angle_test_only" not in blocks.ENCODINGS and "angle_test_only" not in registry.ENCODINGS
    original = blocks.ANSATZE["ry_cz"]
    with monkeypatch.context() as patch:
        stand_in = blocks.Ansatz(**{**vars(original), "name": "ry_cz", "help": "a stand-in"})
        patch.setitem(blocks.ANSATZE, "ry_cz", stand_in)
        patch.setitem(blocks.ANSATZE, "new_test_only", stand_in)
        assert registry.ANSATZE.get("ry_cz").obj is stand_in is registry.ANSATZE.get("new_test_only").obj
    assert registry.ANSATZE.get("ry_cz").obj is original is blocks.ANSATZE["ry_cz"]
    assert "new_test_only" not in blocks.ANSATZE and "new_test_only" not in registry.ANSATZE


def test_iterating_a_registry_lists_every_component():
    """What tests parametrised over a registry rely on: every entry, with its object and config."""
    names = [e.name for e in ALGORITHMS]
    assert {"a2c", "a3c", "ppo", "coma", "mappo", "ippo", "push_flood", "lsvi_ucb_pooled"} <= set(names)
    assert all(e.obj is not None for e in ALGORITHMS)
    assert [e.name for e in PLOTS] == ["standard"]
    assert all(list(reg) for reg in ALL.values())


def test_a_kept_scan_is_used_until_a_file_it_read_changes(tmp_path, monkeypatch):
    """The scans kept in the cache file: the same answer as a scan, from the file while neither the module
    nor the module its entries' class was read from has changed, and scanned again once one has."""
    pkg = tmp_path / "kept_plugins"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "kinds.py").write_text("from dataclasses import dataclass\n\n@dataclass\nclass Gadget:\n"
                                  "    registry = 'ANSATZE'\n    name: str\n    help: str\n")
    (pkg / "mod.py").write_text("from kept_plugins.kinds import Gadget\n\ndef register(b):\n    return b\n\n"
                                "G = register(Gadget('g', 'first help'))\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("MARLQ_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(plugins, "_cache", None)

    def scan() -> list:
        plugins._trees.clear()
        plugins._texts.clear()
        got = plugins._scan_cached("kept_plugins.mod", registries())
        plugins._save_cache()
        monkeypatch.setattr(plugins, "_cache", None)  # as a new process would: from the file
        return got[0]

    assert scan() == [("ANSATZE", "g", "first help")] == plugins.scan_module("kept_plugins.mod", registries())[0]
    assert plugins.cache_file().is_file()
    plugins._trees.clear()
    assert scan() == [("ANSATZE", "g", "first help")] and "kept_plugins.mod" not in plugins._trees  # not parsed
    (pkg / "mod.py").write_text((pkg / "mod.py").read_text().replace("first help", "the second help"))
    assert scan() == [("ANSATZE", "g", "the second help")]
    (pkg / "kinds.py").write_text((pkg / "kinds.py").read_text().replace("'ANSATZE'", "'ENCODINGS'"))
    assert scan() == [("ENCODINGS", "g", "the second help")]  # the class's module changed: read again
