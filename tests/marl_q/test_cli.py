"""The CLI finds itself: `marlq --help` lists every command, the analysis commands call themselves
`marlq NAME`, bad inputs exit 2 with one line, a sweep shows one bar over its runs."""
from __future__ import annotations

import sys

import pytest
import yaml

from marl_q import cli
from marl_q.cli import main
from marl_q.registry import load_plugins
from marl_q.registry import COMMANDS


def discovered() -> list[str]:
    load_plugins()
    return [e.name for e in COMMANDS]


def one_error_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith("marlq: error: ")
    return err[0]


def test_help_lists_every_command_with_its_one_line_help(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--help"])
    assert exc.value.code == 0
    out = " ".join(capsys.readouterr().out.split())
    names = discovered()
    assert {"coma", "qa2c", "regret", "report", "routing", "vehicular", "vehicular_eval"} <= set(names)
    for name in sorted(cli.BUILTIN) + names:
        assert f" {name} " in out
    for entry in COMMANDS:
        assert entry.help, f"{entry.name} has no one-line help"
        assert " ".join(entry.help.split()) in out


@pytest.mark.parametrize("name", ["coma", "qa2c", "regret", "report", "routing", "vehicular", "vehicular_eval"])
def test_analysis_commands_call_themselves_marlq_name(name, capsys):
    with pytest.raises(SystemExit) as exc:
        main([name, "--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: marlq {name}")
    assert "python -m analysis" not in out


def test_routing_has_a_description(capsys):
    with pytest.raises(SystemExit):
        main(["routing", "--help"])
    out = capsys.readouterr().out
    assert "AMARL routing comparison" in out and "--seeds" in out and "seeds 0..N-1" in out


def test_switching_a_head_by_set_suggests_replacing_the_section(tmp_path, capsys, small_raw):
    p = tmp_path / "c.yaml"
    p.write_text(yaml.safe_dump(small_raw))
    out = tmp_path / "run"
    assert main(["run", str(p), "--out", str(out), "--set", "actor.head=vqc"]) == 2
    line = one_error_line(capsys)
    assert "--set 'actor={head: vqc, ...}'" in line and "actor.hidden" in line
    assert "unknown key" not in line
    assert not out.exists()


def test_a_real_unknown_key_is_still_blamed(tmp_path, capsys, small_raw):
    p = tmp_path / "c.yaml"
    p.write_text(yaml.safe_dump(small_raw))
    assert main(["run", str(p), "--out", str(tmp_path / "r"), "--set", "actor.hiden=[4]"]) == 2
    assert "actor.hiden: unknown key; did you mean 'actor.hidden'?" in one_error_line(capsys)


@pytest.mark.parametrize("command", [
    ["run", "CONFIG", "--out", "FILE"],
    ["sweep", "CONFIG", "--out", "FILE", "--seeds", "1"],
    ["sweep", "CONFIG", "--out", "FILE/below", "--seeds", "1"],
    ["plot", "RUNS", "--out", "FILE"],
])
def test_out_at_an_existing_file_exits_2_with_one_line(tmp_path, capsys, small_raw, command):
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump(small_raw))
    afile = tmp_path / "afile"
    afile.write_text("keep me")
    runs = tmp_path / "runs"
    runs.mkdir()
    argv = [a.replace("CONFIG", str(config)).replace("FILE", str(afile)).replace("RUNS", str(runs)) for a in command]
    assert main(argv) == 2
    line = one_error_line(capsys)
    assert line.startswith("marlq: error: --out: ") and "not a directory" in line
    assert afile.read_text() == "keep me"


@pytest.mark.parametrize("argv, needle", [
    (["sweep", "CONFIG", "--grid", "algorithm.lr"], "--grid: expected KEY=V1,V2,..., got 'algorithm.lr'"),
    (["sweep", "CONFIG", "--seeds", "0"], "--seeds: must be at least 1, got 0"),
    (["run", "CONFIG", "--set", "algorithm.lr=-1"], "algorithm.lr: must be positive"),
])
def test_errors_read_key_colon_message(tmp_path, capsys, small_raw, argv, needle):
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump(small_raw))
    argv = [a.replace("CONFIG", str(config)) for a in argv] + ["--out", str(tmp_path / "o")]
    assert main(argv) == 2
    assert needle in one_error_line(capsys)


def test_sweep_shows_one_progress_bar_over_its_runs(tmp_path, capsys):
    jobs = [(tmp_path / f"cell{i}" / "seed0", [sys.executable, "-c", "pass"]) for i in range(3)]
    jobs.append((tmp_path / "bad" / "seed0", [sys.executable, "-c", "raise SystemExit(3)"]))
    failed = cli._run_pool(jobs, 2)
    assert failed == [tmp_path / "bad" / "seed0"]
    err = capsys.readouterr().err
    assert "4/4 runs" in err and "sweep:" in err and "ETA" in err  # the bar has an ETA field
    assert "FAILED (exit 3" in err
    assert err.count("\n") <= 3  # one bar (redrawn in place) and the failure line, not a line per run


def test_list_wraps_each_help_whole_under_its_column(capsys, monkeypatch):
    """`marlq list` shows every name with its whole help (the soak bench's ends where its sentence does),
    wrapped to the terminal's width instead of cut."""
    from marl_q.registry import ALL

    monkeypatch.setenv("COLUMNS", "80")
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    assert all(len(line) <= 80 for line in out.splitlines())
    text = " ".join(out.split())
    for title, reg in ALL.items():
        assert f"{title}:" in out
        for name, help in reg.describe():
            assert f" {name} {' '.join(help.split())}" in text, (title, name)
    assert ("soak Soak: N workers for M minutes with worker kills and a whole-process kill + resume; ledger "
            "invariants, server memory and throughput over time.") in text
