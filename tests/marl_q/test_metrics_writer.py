"""MetricsWriter's two ways of taking rows: value tuples (``write_values``) and CSV text a block at a
time (``write_lines``, the seed-batched learner's update rows) give the same file and sidecar keys."""
from __future__ import annotations

import csv
import io
import time
from pathlib import Path

import pytest

from marl_q.errors import RunWriteError
from marl_q.rundir import MetricsWriter

BASE = ["id"]  # the last base column keys the sidecar
FIELDS = ["t", "src", "kind", "seq", "reason"]
ROWS = [(0, "0.001000", "w0", "grad", 1, ""), (1, "0.001000", "server", "params", 0, ""),
        (2, "1.250000", "w0", "grad", 2, ""), (3, "1.250000", "server", "params", 1, "stale")]


def as_text(rows: list[tuple]) -> str:
    out = io.StringIO(newline="")
    csv.writer(out).writerows(rows)
    return out.getvalue()


def test_lines_write_the_bytes_value_rows_write(tmp_path: Path):
    a = MetricsWriter(tmp_path / "a.csv", FIELDS, base=BASE)
    for row in ROWS:
        a.write_values(row)
    a.close()
    b = MetricsWriter(tmp_path / "b.csv", FIELDS, base=BASE)
    b.write_values(ROWS[0])  # pending when the text comes: written first, so the order holds
    now = time.perf_counter()
    text = "".join(f"{i},{t},{src},{kind},{seq},{reason}\r\n" for i, t, src, kind, seq, reason in ROWS[1:])
    assert text == as_text(ROWS[1:])  # (the text is what the csv module writes for these values)
    b.write_lines(text, [1, 2, 3], [now, now, now + 0.5])
    b.close()
    assert (tmp_path / "b.csv").read_bytes() == (tmp_path / "a.csv").read_bytes()
    walls = list(csv.reader((tmp_path / "b_wall.csv").read_text().splitlines()))
    assert walls[0] == ["id", "wall_s"] and [w[0] for w in walls[1:]] == ["0", "1", "2", "3"]
    # the sidecar holds the given perf_counter times less the writer's start (no clock is read here):
    # rows given the same time get the same text, and the offset between given times is kept
    written = [float(w[1]) for w in walls[1:]]
    assert written[1] == written[2] and written[3] - written[2] == pytest.approx(0.5, abs=2e-6)


def test_lines_without_a_file_are_kept_as_rows(tmp_path: Path):
    w = MetricsWriter(None, FIELDS, base=BASE)
    w.write_lines(as_text(ROWS[2:]), [2, 3], [0.0, 0.0])
    assert w.rows == [{"id": 2, "t": 1.25, "src": "w0", "kind": "grad", "seq": 2},
                      {"id": 3, "t": 1.25, "src": "server", "kind": "params", "seq": 1, "reason": "stale"}]


def test_a_failed_text_write_names_the_file(tmp_path: Path, monkeypatch):
    w = MetricsWriter(tmp_path / "c.csv", FIELDS, base=BASE)
    fh = w._file

    def full(_text: str) -> int:
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(fh, "write", full)
    with pytest.raises(RunWriteError, match="c.csv"):
        w.write_lines(as_text(ROWS[:1]), [0], [0.0])
