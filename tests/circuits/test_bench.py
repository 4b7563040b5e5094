"""The quantum benchmark runs end to end and reports consistent rows (no timing is asserted)."""
from __future__ import annotations

import json

import pytest
import torch

from circuits.bench import BENCHES, main, parse_ints


def test_json_rows_have_the_documented_fields(capsys):
    assert BENCHES["quantum"] is main
    code = main(["--json", "--batches", "2", "--min-time", "0.01", "--modes", "act,fwd_bwd", "--n-qubits", "2"])
    assert code == 0
    report = json.loads(capsys.readouterr().out)
    assert [(r["mode"], r["batch"], r["n_qubits"]) for r in report["rows"]] == [("act", 2, 2), ("fwd_bwd", 2, 2)]
    for row in report["rows"]:
        assert row["native_samples_per_s"] > 0 and row["pennylane_samples_per_s"] > 0
        assert row["ratio"] == pytest.approx(row["native_samples_per_s"] / row["pennylane_samples_per_s"])
    assert torch.get_num_threads() == 1


def test_bad_arguments_exit_2(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--batches", "0"])
    assert exc.value.code == 2
    assert main(["--modes", "backward", "--batches", "1", "--n-qubits", "2"]) == 2
    assert "choices: act, fwd, fwd_bwd" in capsys.readouterr().err
    assert parse_ints("1,64") == [1, 64]
