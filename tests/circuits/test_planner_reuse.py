"""The planner's choice between the cached dense matrix and the state vector for calls without a gradient."""
import numpy as np
import torch

from circuits.peer_bench import bench_module
from circuits.planner import REUSE_MAX_BATCH, REUSE_MAX_QUBITS, Facts, plan


def test_cached_dense_matrix_only_where_it_is_cheaper():
    for n in (5, REUSE_MAX_QUBITS):
        assert plan(Facts(n), 1024, False, dense_ready=True).executor == "dense"
    big = Facts(REUSE_MAX_QUBITS + 1)
    assert plan(big, REUSE_MAX_BATCH, False, dense_ready=True).executor == "dense"  # a few rows: the cached matrix
    assert plan(big, REUSE_MAX_BATCH + 1, False, dense_ready=True) == plan(big, 1024, False)
    assert plan(big, 1024, False, dense_ready=True).variant == "blocks"


def test_state_vector_past_the_reuse_rows_agrees_with_the_dense_matrix():
    torch.manual_seed(0)
    head = bench_module(8, 2)
    x = torch.rand(REUSE_MAX_BATCH + 1, 8)
    with torch.no_grad():
        head(x)  # marks the weights: the next call without a gradient may reuse the dense matrix
        assert head.plan(REUSE_MAX_BATCH, False).executor == "dense"
        few = head(x[:REUSE_MAX_BATCH])  # the cached dense matrix (the reference)
        assert head.plan(x.shape[0], False).executor == "statevector"
        many = head(x)  # the state vector's blocks, with the matrix cached
    torch.testing.assert_close(many[:REUSE_MAX_BATCH], few, rtol=1e-4, atol=1e-5)


def test_twin_backward_from_kept_states_matches_dense_autograd():
    from circuits import statevector
    from circuits.program import program_of
    from circuits.twins import NumpyVQC

    torch.manual_seed(1)
    rows = statevector.KEEP_STATES_MIN_ROWS
    twin_head, reference = bench_module(6, 2), bench_module(6, 2, "dense")
    reference.load_state_dict(twin_head.state_dict())
    assert statevector.keeps_states(program_of(twin_head.circuit), rows)
    params = [twin_head.weights, twin_head.post.weight, twin_head.post.bias]
    for p in params:
        p.grad = torch.zeros_like(p)
    x = np.random.default_rng(1).random((rows, 6))
    coefficients = np.random.default_rng(2).standard_normal((rows, twin_head.out_dim))
    twin = NumpyVQC(twin_head)
    twin.use_columns = False  # the numpy blocks' sweep (the planner gives this call to the columns kernels)
    out, cache = twin.forward(x)
    assert cache.plan.variant == "blocks" and cache.saved[3]  # the kept states' backward ran
    twin.backward(cache, coefficients)
    y = reference(torch.tensor(x, dtype=torch.float32))
    (y * torch.tensor(coefficients, dtype=torch.float32)).sum().backward()
    torch.testing.assert_close(torch.tensor(out, dtype=torch.float32), y.detach(), rtol=1e-4, atol=1e-5)
    for mine, theirs in zip(params, [reference.weights, reference.post.weight, reference.post.bias]):
        torch.testing.assert_close(mine.grad, theirs.grad, rtol=1e-3, atol=1e-4)
