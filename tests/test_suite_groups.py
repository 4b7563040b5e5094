"""The suite's process groups (tests/conftest.py) reach pytest-xdist: its ``loadgroup`` scheduler reads
each test's ``xdist_group`` mark in its own collection hook, so the conftest hook that adds the marks
must run first. It once ran after, and every group was silently ignored: a golden run and its
rerun went to different processes (each ran the scenario), and the two Ray files could start their
clusters side by side."""
from __future__ import annotations

import os

from tests.conftest import _group


def test_every_test_carries_its_group_and_xdist_sees_it(request):
    group = _group(request.node)
    assert [m.args[0] for m in request.node.iter_markers("xdist_group")] == [group]
    assert group == "tests/test_suite_groups.py"  # a plain test file is one group
    if os.environ.get("PYTEST_XDIST_WORKER") and request.config.getvalue("loadgroup"):
        assert request.node.nodeid.endswith(f"@{group}"), request.node.nodeid
