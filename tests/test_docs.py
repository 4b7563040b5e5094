"""The repository carries its own documentation.

No tracked source, scenario or documentation file points at a document outside the repository, every
``docs/<page>.md`` named in the code exists, and every relative link in ``docs/`` resolves.
"""
from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
THIS = Path(__file__).resolve().relative_to(ROOT).as_posix()
SUFFIXES = (".py", ".yaml", ".md")
# Documents that lived outside the repository; written in pieces so this file does not match itself.
OUTSIDE = ("spec" + "s/", "." + "notes/", "../" + "shared")
DOCS_PATH = re.compile(r"\bdocs/[\w./-]+?\.md\b")
MD_LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def tracked_files() -> list[str]:
    try:
        out = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout: the tracked files are unknown")
    return [f for f in out.splitlines() if f.endswith(SUFFIXES) and (ROOT / f).is_file()]


def test_no_file_points_outside_the_repository():
    offenders = []
    for name in tracked_files():
        if name == THIS:
            continue
        for lineno, line in enumerate((ROOT / name).read_text(encoding="utf-8").splitlines(), 1):
            offenders += [f"{name}:{lineno}: {pattern!r}" for pattern in OUTSIDE if pattern in line]
    assert not offenders, "references to documents outside the repository:\n" + "\n".join(offenders)


def test_every_docs_page_named_in_the_code_exists():
    missing = []
    for name in tracked_files():
        if name == THIS or name.startswith("docs/"):
            continue
        for lineno, line in enumerate((ROOT / name).read_text(encoding="utf-8").splitlines(), 1):
            missing += [f"{name}:{lineno}: {page}" for page in DOCS_PATH.findall(line)
                        if not (ROOT / page).is_file()]
    assert not missing, "docs pages named but absent:\n" + "\n".join(missing)


def test_code_comments_name_docs_pages():
    """The pointers that replaced the outside documents are there (a guard against losing them)."""
    named = set()
    for name in tracked_files():
        if name.endswith((".py", ".yaml")) and name != THIS:
            named.update(DOCS_PATH.findall((ROOT / name).read_text(encoding="utf-8")))
    assert {"docs/actor_critic.md", "docs/coma.md", "docs/lsvi.md", "docs/routing.md", "docs/vehicular.md"} <= named


@pytest.mark.parametrize("page", sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "docs").glob("*.md")))
def test_relative_links_in_docs_resolve(page):
    broken = []
    for target in MD_LINK.findall((ROOT / page).read_text(encoding="utf-8")):
        if "://" in target or target.startswith("mailto:"):
            continue
        resolved = ((ROOT / page).parent / target).resolve()
        rel = resolved.relative_to(ROOT).as_posix() if resolved.is_relative_to(ROOT) else str(resolved)
        if not resolved.exists():
            broken.append(target)
    assert not broken, f"{page}: links to nothing: {broken}"
