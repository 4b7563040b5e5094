"""The command sequences the docs show read only folders an earlier command of theirs wrote.

A reader who pastes the README's short tour, or docs/report.md's examples, in order must not meet a
`marlq plot`, `marlq report` or `tensorboard --logdir` naming a folder that nothing before it created
(the tour once reported on `runs/grid`). Each command is read as the CLI reads it: `marlq run` writes
its `--out` (default `runs/<config stem>/...`), `marlq sweep` its `--out` (default `sweeps/<config stem>`).
"""
from __future__ import annotations

import re
import shlex
from pathlib import Path, PurePosixPath

import pytest

ROOT = Path(__file__).resolve().parents[1]


def bash_blocks(text: str) -> list[list[str]]:
    """The commands of each ```bash block: continuation lines joined, comments dropped, split as a shell."""
    blocks = []
    for body in re.findall(r"```bash\n(.*?)```", text, flags=re.S):
        joined = re.sub(r"\\\n\s*", " ", body)
        blocks.append([shlex.split(line, comments=True) for line in joined.splitlines() if line.strip()])
    return blocks


def option(words: list[str], name: str) -> str | None:
    return words[words.index(name) + 1] if name in words[:-1] else None


def written(words: list[str]) -> str | None:
    """The folder a `marlq run` or `marlq sweep` command writes (None for other commands)."""
    if words[:2] not in (["marlq", "run"], ["marlq", "sweep"]):
        return None
    out = option(words, "--out")
    if out:
        return out
    stem = PurePosixPath(words[2]).stem
    return f"runs/{stem}" if words[1] == "run" else f"sweeps/{stem}"


def read(words: list[str]) -> str | None:
    """The folder a `marlq plot`/`marlq report` or `tensorboard --logdir` command reads (None otherwise)."""
    if words[:2] in (["marlq", "plot"], ["marlq", "report"]) and len(words) > 2 and words[2] != "...":
        return words[2]
    if words[:1] == ["tensorboard"]:
        return option(words, "--logdir")
    return None


def unmade(commands: list[list[str]]) -> list[str]:
    """Each folder read before any earlier command wrote it or a folder above it."""
    made: list[PurePosixPath] = []
    missing = []
    for words in commands:
        if not words:
            continue
        path = read(words)
        if path is not None:
            p = PurePosixPath(path)
            if not any(p == m or m in p.parents for m in made):
                missing.append(" ".join(words))
        out = written(words)
        if out is not None:
            made.append(PurePosixPath(out))
    return missing


def tour() -> list[list[str]]:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split("## A short tour", 1)[1].split("\n## ", 1)[0]
    return [c for block in bash_blocks(section) for c in block]


def test_the_checker_finds_a_folder_nothing_made():
    commands = [shlex.split(c) for c in ("marlq sweep scenarios/cartpole_a3c.yaml --seeds 5",
                                         "marlq plot sweeps/cartpole_a3c",
                                         "marlq run scenarios/x.yaml --out runs/one",
                                         "marlq report runs/one/seed0",
                                         "marlq report runs/grid --target 200")]
    assert unmade(commands) == ["marlq report runs/grid --target 200"]


def test_the_readme_tour_reads_only_folders_it_made():
    commands = tour()
    assert sum(1 for c in commands if read(c)) >= 4  # plot, report, report, tensorboard
    assert unmade(commands) == []


@pytest.mark.parametrize("page", ["docs/report.md"])
def test_a_docs_pages_commands_read_only_folders_it_made(page):
    commands = [c for block in bash_blocks((ROOT / page).read_text(encoding="utf-8")) for c in block]
    assert any(read(c) for c in commands)
    assert unmade(commands) == []
