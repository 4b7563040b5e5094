"""`marlq bench load` end to end on sim: every push a worker sent is in the ledger exactly once."""
from __future__ import annotations

import json

from marl_q.cli import main


def test_load_accounts_for_every_push_and_samples_memory(tmp_path, capsys):
    code = main(["bench", "load", "--backend", "sim", "--workers", "2", "--seconds", "0.2", "--bad-every", "10",
                 "--max-staleness", "8", "--out", str(tmp_path / "runs"), "--plot", str(tmp_path / "rss.png"),
                 "--json"])
    assert code == 0
    (result,) = json.loads(capsys.readouterr().out)["results"]
    assert result["backend"] == "sim" and result["accounted"]
    for w in result["workers"]:
        assert w["sent"] == w["accepted"] + w["rejected"] + w["dropped_stale"] > 0
        assert w["rejected"] == w["sent"] // 10  # every 10th push carries a NaN: refused by admission
    assert sum(w["dropped_stale"] for w in result["workers"]) > 0  # 2 x 32 in flight > max_staleness 8
    assert result["rss_series"] and result["rss_mb"]["peak_vmhwm"] >= result["rss_mb"]["start"] > 0
    assert (tmp_path / "rss.png").stat().st_size > 0 and (tmp_path / "runs" / "sim" / "comm.csv").is_file()
    assert main(["bench", "load", "--backend", "nope"]) == 2


def test_trace_after_must_lie_inside_the_run(capsys):
    assert main(["bench", "load", "--backend", "sim", "--seconds", "1", "--trace-after", "2"]) == 2
    err = capsys.readouterr().err
    assert "--trace-after: must be in [0, --seconds), got 2.0" in err and len(err.strip().splitlines()) == 1


def test_heap_tracer_finds_the_line_whose_memory_grew():
    from marl_q.bench.memory import HeapTracer

    heap = HeapTracer(after_s=1e-9, every_s=0.0)
    heap.start()
    heap.sample()  # the baseline
    kept = [bytes(1024) for _ in range(2048)]  # 2 MiB in 2048 blocks, held until the next snapshot
    heap.sample()
    growth = heap.growth()
    top = growth["lines"][0]
    assert "test_bench_load.py" in top["where"].split(" <- ")[0]
    assert 2048 <= top["grew_kb"] < 2048 * 1.2 and top["blocks_grew"] >= 2048  # each bytes object: 1 KiB + header
    assert growth["traced_mb"][1] - growth["traced_mb"][0] >= 2.0
    del kept
    import tracemalloc

    tracemalloc.stop()
