"""Fill the registries from the other packages: the one place marl_q reaches outside itself.

The registries (``marl_q.registry``) call this module and hand it their tables (``regs``: each
registry by its name there); this module does not import them, so the two are not a cycle.

The plugin modules are found as before (the list below, every module of a listed package, and the
installed distributions' entry points), but the built-in ones are not imported to learn what they
register: their source is read (``ast``) for the registrations a module makes at its top level,

- ``@ALGORITHMS.register("name", ..., help="...")`` on a class or function, ``ALGORITHMS.add("name", ...)``,
- an exported table with literal keys: ``SCENARIOS = {"name": ScenarioSpec(...)}`` (likewise ``HEADS``,
  ``BENCHES``, ``PLOTS``, ``COMMANDS``; the help is the spec's ``help`` field or the function's docstring),

and each name is declared in its registry with its module, which is imported when the name is first
looked up. So ``marlq --help`` imports no plugin, and ``marlq run`` imports only the components its
config names. A module that registers in another way (a name computed at run time, a table it
imports) is declared as a source of that registry and imported when the registry is listed or a
name is not found. Entry-point plugins are imported when the index is built.
"""
from __future__ import annotations

import ast
import copy
import importlib
import importlib.util
import json
import os
import pkgutil
import re
import sys
from pathlib import Path
from types import ModuleType
from typing import Any, Collection, Iterable, Mapping, Optional

# Modules whose import registers components, or which export plain dicts to register; for a package,
# its every module too (found without a list to edit; names starting with "_" are left out).
PLUGIN_MODULES = ["marl_q.staleness", "marl_q.aggregation", "marl_q.backends", "marl_q.bench", "agents",
                  "scenarios", "circuits.heads", "circuits.bench", "circuits.ansatze", "circuits.encodings",
                  "circuits.observables", "analysis"]
# Out-of-tree plugins: an installed distribution declares, in its pyproject.toml,
#   [project.entry-points."marl_q.plugins"]
#   my_plugin = "my_package.marlq_plugin"
# and that module is imported like the ones above: it registers algorithms and heads on import
# (ALGORITHMS.add / HEADS.add) and may export SCENARIOS, HEADS, BENCHES, PLOTS, COMMANDS.
ENTRY_POINT_GROUP = "marl_q.plugins"
# the tables a module may export, each registered into the registry of the same name
TABLES = ("SCENARIOS", "HEADS", "BENCHES", "PLOTS", "COMMANDS")
# tables whose entries' help is their function's docstring (the others': the spec's `help` field)
DOC_TABLES = ("BENCHES", "PLOTS", "COMMANDS")
_indexed: set[str] = set()  # the registries declared so far
_scanned: dict[str, tuple[list[tuple[str, str, Optional[str]]], set[str]]] = {}  # module -> what it registers
_entry_points_loaded = False
_imported: set[str] = set()


def index_plugins(regs: Mapping[str, Any], names: Optional[Iterable[str]] = None) -> None:
    """Declare the built-in plugins' names in the registries ``names`` of ``regs`` (the registries by their
    names in marl_q.registry, e.g. ``["COMMANDS"]``; all when None), read from the source of the modules
    that mention them, nothing imported; and, the first time, import the installed entry-point plugins.
    ``regs`` is ``marl_q.registry.registries()``, handed down: the registries call this module, never
    the reverse."""
    global _entry_points_loaded
    todo = [n for n in (regs if names is None else names) if n in regs and n not in _indexed]
    if not todo:
        return
    _indexed.update(todo)
    # a module that names none of them is not read (``register(Block(`` is the form a block's registry is not named in)
    mention = re.compile(r"\b(?:%s)\b|\bregister\(\s*\w+\(" % "|".join(todo))
    for module in plugin_modules():
        text = _source(module)
        if module in _scanned or (text is not None and not mention.search(text)):
            continue
        declared, sources = _scanned[module] = _scan_cached(module, regs)
        for table, name, help in declared:
            regs[table].declare(name, module, help)
        for table in sources:
            regs[table].declare_source(module)
    _save_cache()
    if not _entry_points_loaded:
        _entry_points_loaded = True
        from importlib import metadata  # a tenth of a second: only once a registry is first used

        for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
            try:
                loaded = ep.load()
            except Exception as exc:  # a broken third-party plugin must not stop marl-q: say which
                print(f"marlq: plugin {ep.name!r} ({ep.value}) failed to load: {type(exc).__name__}: {exc}",
                      file=sys.stderr)
                continue
            if isinstance(loaded, ModuleType):
                register_module(loaded, regs)


def load_plugins(regs: Mapping[str, Any]) -> None:
    """Import every plugin module and register what it exports into ``regs`` (what a full listing or a
    test over all components needs; a lookup by name imports only its own module)."""
    index_plugins(regs)
    for module in plugin_modules():
        import_plugin(module, regs)


def import_plugin(name: str, regs: Mapping[str, Any]) -> None:
    """Import one plugin module and register what it exports (its own registrations ran on import)."""
    if name in _imported:
        return
    _imported.add(name)
    try:
        module = importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name is not None and (name == exc.name or name.startswith(exc.name + ".")):
            return  # that package is not there (yet); nothing to register
        _imported.discard(name)
        raise
    except BaseException:
        _imported.discard(name)
        raise
    register_module(module, regs)


def register_module(module: ModuleType, regs: Mapping[str, Any]) -> None:
    """Register what a plugin module exports into ``regs`` (its own registrations ran when it was imported)."""
    for spec_name, spec in _table(module, "SCENARIOS").items():
        regs["SCENARIOS"].add(spec_name, spec, config=spec.config, help=spec.help)
    for spec_name, spec in _table(module, "HEADS").items():
        regs["HEADS"].add(spec_name, spec.build, config=spec.config, help=spec.help)
    for value in list(vars(module).values()):  # blocks: objects whose class names their registry
        table = getattr(type(value), "registry", None)
        if isinstance(table, str) and table in regs:
            regs[table].add(value.name, value, help=value.help)
    for table in DOC_TABLES:
        for spec_name, fn in _table(module, table).items():
            regs[table].add(spec_name, fn, help=summary(fn.__doc__))


def _table(module: ModuleType, name: str) -> dict:
    """An exported table; a module that imported the registry of that name (``from marl_q.registry
    import HEADS``) exports nothing by it."""
    table = getattr(module, name, None)
    return table if isinstance(table, dict) else {}


def summary(doc: Optional[str]) -> str:
    """The first paragraph of a docstring on one line (a help that ends where its sentence does)."""
    if not doc or not doc.strip():
        return ""
    return " ".join(doc.strip().split("\n\n")[0].split())


# ----------------------------------------------------------------------------- the index, from source
_found: dict[tuple[str, ...], list[str]] = {}  # PLUGIN_MODULES -> plugin_modules(), found once a process


def plugin_modules() -> list[str]:
    """PLUGIN_MODULES with every module of each package among them (those that exist)."""
    key = tuple(PLUGIN_MODULES)
    if key not in _found:
        names = []
        for name in PLUGIN_MODULES:
            if module_file(name) is None:
                continue  # that package is not there (yet)
            names += [name, *package_modules(name)]
        _found[key] = names
    return list(_found[key])


def package_modules(package: str) -> list[str]:
    """The modules of ``package`` (``pkg.mod``; in name order, not those starting with '_'), found without
    importing them: how every plugin package's modules are found (no list to edit). [] for a plain module."""
    path = module_file(package)
    if path is None or path.name != "__init__.py":
        return []
    return [f"{package}.{m.name}" for m in sorted(pkgutil.iter_modules([str(path.parent)]), key=lambda m: m.name)
            if not m.name.startswith("_")]


def import_package(package: str) -> list[ModuleType]:
    """Import every module of ``package`` (``package_modules``), in name order, and return them: what a
    package that collects its modules' registrations on import calls (the circuit blocks, the scenarios)."""
    return [importlib.import_module(name) for name in package_modules(package)]


def module_file(name: str) -> Optional[Path]:
    """The source file of module ``name`` (a package's ``__init__.py``), found without importing anything
    but the top-level package's location."""
    top, _, rest = name.partition(".")
    try:
        spec = importlib.util.find_spec(top)
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    if not spec.submodule_search_locations:
        return Path(spec.origin) if not rest and spec.origin else None
    base = Path(list(spec.submodule_search_locations)[0]).joinpath(*rest.split(".")) if rest else \
        Path(list(spec.submodule_search_locations)[0])
    for path in (base / "__init__.py", base.with_suffix(".py")):
        if path.is_file():
            return path
    return None


_texts: dict[str, Optional[str]] = {}
_trees: dict[str, Optional[ast.Module]] = {}


def _source(name: str) -> Optional[str]:
    """The source text of module ``name`` (None where there is none to read)."""
    if name not in _texts:
        path = module_file(name)
        try:
            _texts[name] = path.read_text(encoding="utf-8") if path is not None else None
        except (OSError, ValueError):
            _texts[name] = None
    return _texts[name]


def _tree(name: str) -> Optional[ast.Module]:
    if _read is not None:
        _read.add(name)
    if name not in _trees:
        text = _source(name)
        try:
            _trees[name] = ast.parse(text) if text is not None else None
        except (SyntaxError, ValueError):
            _trees[name] = None
    return _trees[name]


# ----------------------------------------------------------------------------- what a scan read, kept
# Parsing the plugins' source is most of what `marlq list` costs (half a second for ~50 modules), so what
# scan_module finds is kept in a file (the user's cache folder, MARLQ_CACHE_DIR to choose another) with
# the size and modification time of every file the scan read (a module, and those whose classes its
# entries were read from); an entry whose files all still match is used instead of parsing them again.
# The file is only an index of source text: unreadable, stale or missing, the scan runs as before.
_read: Optional[set[str]] = None  # modules whose source the scan running now read
_cache: Optional[dict] = None
_cache_dirty = False


def cache_file() -> Path:
    """Where the scans are kept: $MARLQ_CACHE_DIR, else $XDG_CACHE_HOME/marl-q, else ~/.cache/marl-q."""
    base = os.environ.get("MARLQ_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "marl-q")
    return Path(base) / "plugin-index.json"


def _stamp(module: str) -> Optional[list]:
    """[path, mtime_ns, size] of a module's source file (None: it has none)."""
    path = module_file(module)
    try:
        st = path.stat() if path is not None else None
    except OSError:
        st = None
    return [str(path), st.st_mtime_ns, st.st_size] if st is not None else None


def _load_cache() -> dict:
    global _cache
    if _cache is None:
        _cache = {}
        try:
            data = json.loads(cache_file().read_text(encoding="utf-8"))
            if data.get("scanner") == _stamp(__name__):  # this very scanner wrote it
                _cache = data["modules"]
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            pass
    return _cache


def _scan_cached(name: str, tables: Collection[str]) -> tuple[list[tuple[str, str, Optional[str]]], set[str]]:
    """``scan_module(name, tables)``, from the cache file when none of the files it read has changed since
    (and it was scanned for the same registries)."""
    global _read, _cache_dirty
    cache = _load_cache()
    entry = cache.get(name)
    if isinstance(entry, dict) and isinstance(entry.get("files"), dict) and entry["files"] and all(
            _stamp(module) == stamp for module, stamp in entry["files"].items()) and entry.get("tables") == sorted(tables):
        return [tuple(d) for d in entry["declared"]], set(entry["sources"])
    _read = set()
    try:
        declared, sources = scan_module(name, tables)
        files = {module: _stamp(module) for module in sorted(_read | {name})}
    finally:
        _read = None
    if all(files.values()):
        cache[name] = {"files": files, "tables": sorted(tables), "declared": [list(d) for d in declared],
                       "sources": sorted(sources)}
        _cache_dirty = True
    return declared, sources


def _save_cache() -> None:
    global _cache_dirty
    if not _cache_dirty or _cache is None:
        return
    _cache_dirty = False
    path = cache_file()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"scanner": _stamp(__name__), "modules": _cache}), encoding="utf-8")
        os.replace(tmp, path)
    except OSError:
        pass  # a read-only home: every process scans, as it would without the file


def scan_module(name: str, tables: Collection[str]) -> tuple[list[tuple[str, str, Optional[str]]], set[str]]:
    """What module ``name`` registers into the registries named ``tables`` (their names in marl_q.registry),
    read from its source: (registry, name, help or None) for each name it registers at its top level,
    and the registries it registers into in any other way."""
    regs = sorted(set(tables))
    tree = _tree(name)
    if tree is None:  # not readable as source (compiled only, or broken): its import tells
        return [], set(regs)
    declared: list[tuple[str, str, Optional[str]]] = []
    sources: set[str] = set()
    read: set[int] = set()  # the registration calls read here
    for node in tree.body:
        if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            calls = [d for d in node.decorator_list if isinstance(d, ast.Call)]
        elif isinstance(node, ast.Expr) and isinstance(node.value, ast.Call):
            calls = [node.value]
        else:
            calls = []
        if isinstance(node, (ast.Assign, ast.Expr)) and isinstance(node.value, ast.Call):
            got = _block_registration(name, tree, node.value, regs)  # NAME = register(Block(...))
            if got is not None:
                declared.append(got)
                continue
        for call in calls:
            got = _registration(call, regs)
            if got is not None:
                declared.append(got)
                read.add(id(call))
        if isinstance(node, ast.For):  # for _name, _help in (("a", "..."), ...): REG.add(_name, ..., help=_help)
            for call, got in _loop_registrations(node, regs):
                declared += got
                read.add(id(call))
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                if isinstance(target, ast.Name) and target.id in TABLES:
                    entries = _table_entries(name, tree, target.id, node.value)
                    if entries is None:
                        sources.add(target.id)
                    else:
                        declared += entries
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            if isinstance(node, ast.ImportFrom) and node.module == "marl_q.registry":
                continue  # the registries themselves, not exported tables
            sources.update(a.asname or a.name for a in node.names if (a.asname or a.name) in TABLES)
    text = _source(name) or ""
    calls = re.findall(r"\b(?:%s)\s*\.\s*(?:register|add)\s*\(" % "|".join(regs), text)
    for node in (ast.walk(tree) if len(calls) > len(read) else ()):  # any other registration: only the import tells
        if (isinstance(node, ast.Call) and id(node) not in read and isinstance(node.func, ast.Attribute)
                and node.func.attr in ("register", "add") and isinstance(node.func.value, ast.Name)
                and node.func.value.id in regs):
            sources.add(node.func.value.id)
    return declared, sources


def _registration(call: ast.Call, regs: dict) -> Optional[tuple[str, str, Optional[str]]]:
    """``REG.register("name", help="...")`` or ``REG.add("name", obj, help="...")`` with a literal name."""
    func = call.func
    if not (isinstance(func, ast.Attribute) and func.attr in ("register", "add")
            and isinstance(func.value, ast.Name) and func.value.id in regs):
        return None
    if not call.args or not _is_str(call.args[0]):
        return None
    help_kw = [k.value for k in call.keywords if k.arg == "help"]
    if any(k.arg is None for k in call.keywords):  # **kwargs: the help may be in there
        return func.value.id, call.args[0].value, None
    help = (help_kw[0].value if _is_str(help_kw[0]) else None) if help_kw else ""
    return func.value.id, call.args[0].value, help


def _block_registration(module: str, tree: ast.Module, call: ast.Call,
                        regs: dict) -> Optional[tuple[str, str, Optional[str]]]:
    """``register(Block("name", ..., help="..."))`` (``NAME = register(...)``) where class ``Block`` (defined
    in the module or imported into it) says which registry its objects go to with a class attribute
    ``registry = "ANSATZE"`` and has the fields ``name`` and ``help`` (by keyword or by position): how
    the circuit blocks register (circuits.blocks)."""
    func = call.func
    if not ((isinstance(func, ast.Name) and func.id == "register") or
            (isinstance(func, ast.Attribute) and func.attr == "register" and not
             (isinstance(func.value, ast.Name) and func.value.id in regs))):
        return None
    if len(call.args) != 1 or call.keywords or not isinstance(call.args[0], ast.Call):
        return None
    block = call.args[0]
    if not isinstance(block.func, ast.Name):
        return None
    found = _definition(module, tree, block.func.id)
    if found is None or not isinstance(found[1], ast.ClassDef):
        return None
    table = next((s.value.value for s in found[1].body if isinstance(s, ast.Assign) and _is_str(s.value)
                  and any(isinstance(t, ast.Name) and t.id == "registry" for t in s.targets)), None)
    if table not in regs:
        return None
    name = _field(module, tree, block, "name")
    return (table, name, _help_field(module, tree, block)) if isinstance(name, str) else None


def _loop_registrations(loop: ast.For, regs: dict) -> list[tuple[ast.Call, list[tuple[str, str, Optional[str]]]]]:
    """The registrations of a top-level ``for`` over a literal tuple of tuples whose body calls
    ``REG.add(name, ...)`` with the loop's variables: one declaration per item."""
    target = loop.target.elts if isinstance(loop.target, ast.Tuple) else [loop.target]
    if not all(isinstance(t, ast.Name) for t in target) or not isinstance(loop.iter, (ast.Tuple, ast.List)):
        return []
    items = []
    for item in loop.iter.elts:
        values = item.elts if isinstance(item, ast.Tuple) else [item]
        if len(values) != len(target):
            return []
        items.append({t.id: v for t, v in zip(target, values)})
    out = []
    for stmt in loop.body:
        call = stmt.value if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call) else None
        if call is None:
            continue
        got = []
        for bound in items:
            sub = _Substitute(bound).visit(copy.deepcopy(call))
            found = _registration(sub, regs)
            if found is None:
                break
            got.append(found)
        else:
            out.append((call, got))
    return out


class _Substitute(ast.NodeTransformer):
    """Names replaced by the expressions they are bound to (one item of a loop)."""

    def __init__(self, bound: dict[str, ast.expr]) -> None:
        self.bound = bound

    def visit_Name(self, node: ast.Name) -> ast.expr:
        return self.bound.get(node.id, node)


def _table_entries(module: str, tree: ast.Module, table: str,
                   value: Optional[ast.expr]) -> Optional[list[tuple[str, str, Optional[str]]]]:
    """The entries of ``TABLE = {"name": ..., ...}`` with literal keys; None when not such a dict."""
    if not isinstance(value, ast.Dict) or not all(k is not None and _is_str(k) for k in value.keys):
        return None
    out = []
    for key, item in zip(value.keys, value.values):
        if table in DOC_TABLES:
            help = _docstring(module, tree, item.id) if isinstance(item, ast.Name) else None
        else:
            help = _help_field(module, tree, item)
        out.append((table, key.value, help))
    return out


def _docstring(module: str, tree: ast.Module, name: str) -> Optional[str]:
    """The summary of the docstring of function ``name`` defined in ``module`` or imported into it."""
    found = _definition(module, tree, name)
    if found is None or not isinstance(found[1], (ast.FunctionDef, ast.AsyncFunctionDef)):
        return None
    return summary(ast.get_docstring(found[1], clean=False))


def _help_field(module: str, tree: ast.Module, item: ast.expr) -> Optional[str]:
    """The ``help`` field of ``Spec(..., help="...")`` or of a positional call of a NamedTuple (or a
    dataclass) whose definition is readable (``class HeadSpec(NamedTuple)`` with a field ``help``)."""
    return _field(module, tree, item, "help")


def _field(module: str, tree: ast.Module, item: ast.expr, field: str) -> Optional[str]:
    """The literal string given for field ``field`` in the call ``Spec(...)``: by keyword, or by position
    when the class's definition is readable (its annotated fields, in order); None otherwise."""
    if not isinstance(item, ast.Call):
        return None
    for kw in item.keywords:
        if kw.arg == field:
            return kw.value.value if _is_str(kw.value) else None
    if not isinstance(item.func, ast.Name):
        return None
    found = _definition(module, tree, item.func.id)
    if found is None or not isinstance(found[1], ast.ClassDef):
        return None
    fields = [s.target.id for s in found[1].body if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)]
    if field not in fields or fields.index(field) >= len(item.args):
        return None
    arg = item.args[fields.index(field)]
    return arg.value if _is_str(arg) else None


def _definition(module: str, tree: ast.Module, name: str, depth: int = 0) -> Optional[tuple[str, ast.stmt]]:
    """(module, definition) of top-level ``name`` in ``module``, following ``from X import name``."""
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == name:
            return module, node
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and depth < 3:
            for alias in node.names:
                if (alias.asname or alias.name) == name:
                    other = _tree(node.module)
                    return _definition(node.module, other, alias.name, depth + 1) if other is not None else None
    return None


def _is_str(node: Optional[ast.expr]) -> bool:
    return isinstance(node, ast.Constant) and isinstance(node.value, str)
