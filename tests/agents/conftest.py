"""Fixtures shared by the tests of the heads' numpy twins."""
from __future__ import annotations

import pytest

from circuits import kernels


@pytest.fixture(params=["kernels", "numpy"])
def path(request, monkeypatch):
    """Which path a circuit twin takes at few rows: "kernels", the compiled kernels (circuits.kernels;
    skipped, saying so, where numba cannot be imported or MARLQ_KERNELS=0), or "numpy", the numpy paths
    that take more rows (kernels.MAX_ROWS emptied)."""
    if request.param == "kernels":
        if not kernels.available():
            pytest.skip("the compiled kernels are off here (numba not importable, or MARLQ_KERNELS=0)")
    else:
        monkeypatch.setattr(kernels, "MAX_ROWS", {})
    return request.param
