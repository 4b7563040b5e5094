"""`marlq bench update` (agents/update_bench.py): its variants compute one update, and bad sizes exit 2.
Timings are printed, never asserted."""
from __future__ import annotations

import json

import pytest

from agents.update_bench import VARIANTS, main, measure


def test_the_flat_buffer_variants_agree_bit_for_bit_and_every_variant_is_timed():
    out = measure(rows=48, epochs=2, repeats=2, check=4)
    assert out["same_bits"] is True
    # the numpy epochs end where the torch path does to float32 rounding: far inside one Adam step (lr 5e-4)
    assert 0.0 <= out["numpy_epochs_apart"] < 1e-5
    assert list(out["ms_per_epoch"]) == list(VARIANTS)
    for t in out["ms_per_epoch"].values():
        assert 0 < t["min"] <= t["median"] <= t["max"]


def test_the_cli_prints_json_and_refuses_a_size_below_one(capsys):
    assert main(["--rows", "16", "--epochs", "1", "--repeats", "1", "--check", "1", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["rows"] == 16 and out["same_bits"] is True
    with pytest.raises(SystemExit) as exc:
        main(["--epochs", "0"])
    assert exc.value.code == 2 and "--epochs must be at least 1" in capsys.readouterr().err
