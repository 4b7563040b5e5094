"""Messages between workers and the server; payloads are numpy arrays whose bytes the ledger counts."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

SERVER = "server"


@dataclass
class Message:
    """One unit of traffic. ``payload`` holds the data (counted); ``info`` small metadata (not counted)."""

    src: str
    dst: str
    kind: str
    payload: dict[str, np.ndarray] = field(default_factory=dict)
    base_version: int = 0
    seq: int = 0
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def nbytes(self) -> int:
        """Payload size in bytes, measured from the arrays themselves."""
        return int(sum(np.asarray(v).nbytes for v in self.payload.values()))
