"""analysis.gemm_floor: the profiled FLOPs of matrix products against hand counts, and the CLI on a run."""
import pytest
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


def test_numpy_mlp_counts_the_twins_products_by_hand(capsys):
    """Heads 3-4-2 and 3-4-1, 10 rows: per layer forward and weight gradient (2 x 2 rows n_in n_out), the
    input gradient but at the first layer: (2 * 2 * 10 * 3 * 4) + (2 * 2 * 10 * 4 * 2 + 2 * 10 * 4 * 2) for
    the first head, the same with 1 output for the second."""
    flops, _ = gemm_floor.numpy_mlp_products(10, [[3, 4, 2], [3, 4, 1]], repeats=2)
    assert flops == (480 + 320 + 160) + (480 + 160 + 80)
    assert gemm_floor.main(["--numpy-mlp", "3-4-2,3-4-1", "--rows", "10", "--rows-per-env-step", "2"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("numpy float32 products of heads 3-4-2,3-4-1, 10 rows a minibatch: 0.0 MFLOP")
    assert "at 2 rows per env step 0.00 MFLOP" in out  # 1,680 / 10 x 2 = 336 FLOPs


@pytest.mark.parametrize("argv,message", [
    (["--numpy-mlp", "18-x-5", "--rows", "8", "--rows-per-env-step", "2"], "widths are integers"),
    (["--numpy-mlp", "18-64-5", "--rows", "0", "--rows-per-env-step", "2"], "must be positive"),
    (["--numpy-mlp", "18", "--rows", "8", "--rows-per-env-step", "2"], "two or more positive widths"),
    (["--numpy-mlp", "18-64-5"], "needs --rows and --rows-per-env-step"),
    ([], "give a scenario file"),
])
def test_bad_arguments_exit_2_naming_what_is_wrong(argv, message, capsys):
    with pytest.raises(SystemExit) as exc:
        gemm_floor.main(argv)
    assert exc.value.code == 2 and message in capsys.readouterr().err
