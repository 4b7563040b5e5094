"""Errors a user can cause: each maps to exit code 2 and names what was wrong."""
from __future__ import annotations

import importlib
from typing import Any


class UserError(Exception):
    """Bad input from the user (config, CLI, files, checkpoints): exit code 2."""


class ConfigError(UserError):
    """A scenario file or an override is malformed, unknown, or of the wrong type."""


class CheckpointError(UserError):
    """A checkpoint file is missing, truncated or corrupt."""


class RunDirError(UserError):
    """A path given as a run directory is not one."""


def import_extra(module: str, message: str, error: type[UserError] = ConfigError) -> Any:
    """Import a module of an optional extra, or raise ``error(message)`` (which names the key that asked
    for it and the pip command) when it is not installed: the one place such imports fail."""
    try:
        return importlib.import_module(module)
    except ImportError:
        raise error(message) from None


RAY_MISSING = "backend.name: ray needs Ray, which is not installed: pip install 'marl-q[ray]'"


class RunWriteError(Exception):
    """A run file could not be written (no space left, directory removed or read-only): exit code 1.

    Not a UserError: the input was fine, the machine failed the run. ``path`` is the file that could not
    be written; the message names it and what to do."""

    def __init__(self, path: object, exc: "BaseException | str", hint: str = "") -> None:
        self.path = path
        if isinstance(exc, OSError):
            self.reason = f"{type(exc).__name__}: {exc.strerror or exc}"
        else:
            self.reason = str(exc)
        super().__init__(f"cannot write {path} ({self.reason})" + (f"; {hint}" if hint else ""))


class RunLost(Exception):
    """The machine under the run failed it (a cluster node that hosted the server was lost): exit code 1, one
    line naming the last good checkpoint and the resume command. Not a UserError: the input was fine."""
