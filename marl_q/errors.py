"""Errors a user can cause: each maps to exit code 2 and names what was wrong."""
from __future__ import annotations


class UserError(Exception):
    """Bad input from the user (config, CLI, files, checkpoints): exit code 2."""


class ConfigError(UserError):
    """A scenario file or an override is malformed, unknown, or of the wrong type."""


class CheckpointError(UserError):
    """A checkpoint file is missing, truncated or corrupt."""


class RunDirError(UserError):
    """A path given as a run directory is not one."""
