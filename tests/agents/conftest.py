"""Fixtures shared by the tests of the heads' numpy twins."""
from __future__ import annotations

import os

import pytest

from circuits import kernels


@pytest.fixture(params=["kernels", "numpy"])
def path(request, monkeypatch):
    """Which path a circuit twin takes at few rows: "kernels", the compiled kernels (circuits.kernels;
    skipped where the user set MARLQ_KERNELS=0; numba is a core dependency, so without it these cases
    fail), or "numpy", the numpy paths that take more rows (kernels.MAX_ROWS emptied)."""
    if request.param == "kernels":
        if os.environ.get("MARLQ_KERNELS") == "0":
            pytest.skip("MARLQ_KERNELS=0 in the environment turns the compiled kernels off")
    else:
        monkeypatch.setattr(kernels, "MAX_ROWS", {})
    return request.param
