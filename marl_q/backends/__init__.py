"""Execution backends: the same Worker and Service objects, moved and timed differently."""
from marl_q.backends import local, sim  # noqa: F401  (registration)
