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
