"""Execution backends: the same Worker and Service objects, moved and timed differently."""
from marl_q.backends import local, ray_backend, sim  # noqa: F401  (registration; ray_backend imports Ray lazily)
