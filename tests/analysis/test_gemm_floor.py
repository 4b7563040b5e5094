"""analysis.gemm_floor: the profiled FLOPs of matrix products against hand counts, and the CLI on a run."""
import torch

from analysis import gemm_floor


def test_the_flops_of_products_are_2mnk_and_other_ops_are_not_counted():
    a, b = torch.randn(7, 5), torch.randn(5, 3)
    x, w, bias = torch.randn(4, 6), torch.randn(2, 6), torch.randn(2)
    p, q = torch.randn(3, 4, 5), torch.randn(3, 5, 2)

    def work():
        a @ b                                    # mm: 2 * 7 * 5 * 3
        torch.nn.functional.linear(x, w, bias)  # addmm: 2 * 4 * 6 * 2
        torch.bmm(p, q)                          # bmm: 2 * 3 * 4 * 5 * 2
        (a + 1).relu().sum()                     # not a product

    flops, _ = gemm_floor.gemm_profile(work)
    assert flops == 2 * 7 * 5 * 3 + 2 * 4 * 6 * 2 + 2 * 3 * 4 * 5 * 2


def test_the_cli_profiles_a_short_run_and_prints_the_floor(capsys):
    code = gemm_floor.main(["scenarios/spread_vdn.yaml", "--steps", "1500", "--set", "backend.workers=1",
                            "--set", "algorithm.replay.learning_starts=100"])
    out = capsys.readouterr().out
    assert code == 0
    line = [ln for ln in out.splitlines() if "MFLOP per env step" in ln][0]
    mflop = float(line.split("matrix products ")[1].split(" MFLOP")[0])
    assert mflop > 0.0
