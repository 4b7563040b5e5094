"""Imported once by the local backend's fork server (``PRELOAD`` in marl_q/backends/local.py): the plugin index
(every registry's names, read from the plugins' source or the index's cache file, and the installed
entry-point plugins), which every worker process's ``build_config`` would otherwise build again.

Whatever fails here is left to the worker, which does the same and reports it as a worker's error: the fork
server must start (multiprocessing skips only an ImportError of a preloaded module)."""
from __future__ import annotations

try:
    from marl_q.registry import index_plugins

    index_plugins()
except Exception:  # noqa: BLE001  the worker indexes again and says what is wrong
    pass
