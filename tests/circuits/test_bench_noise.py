"""`marlq bench noise` runs end to end and prints one line per measurement (no timing is asserted)."""
from __future__ import annotations

import re

from circuits.bench import BENCHES


def test_bench_noise_prints_its_lines(capsys):
    code = BENCHES["noise"](["--n-qubits", "2", "--layers", "1", "--batch", "3", "--shots", "16",
                             "--rounds", "1", "--min-time", "0.001"])
    assert code == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0].startswith("noise bench (torch")
    assert re.fullmatch(r"density fwd_bwd n=2 layers=1 rzryrz_ring B=3 depolarizing=0.01: native [\d.]+ ms  "
                        r"pennylane default.mixed [\d.]+ ms  speed-up [\d.]+x", lines[1])
    assert [line.split(":")[0] for line in lines[2:]] == ["shots act n=2 B=3 shots=16", "shots fwd n=2 B=3 shots=16"]


def test_bench_noise_bad_part_exits_2(capsys):
    assert BENCHES["noise"](["--parts", "density,bogus"]) == 2
    assert "--parts: unknown part 'bogus'; choices: density, shots" in capsys.readouterr().err
