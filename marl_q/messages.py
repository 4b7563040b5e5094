"""Messages between workers and the server; payloads are numpy arrays whose bytes the ledger counts."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

SERVER = "server"
HELLO = "hello"
LIFE = "life"  # Message.info key: which incarnation of a worker says hello (see `stamp_life`)
# Message.info key: the diagnostics (a list of dicts, marl_q.metrics.DIAGNOSTICS) of the updates a message
# carries; the server hands them to train.csv when it accepts the message. A handful of floats of
# monitoring, not of learning: like the episode rows of metrics.csv they are not in the ledger's bytes
TRAIN = "train"
# Message.info key: which of the server's services a message is for, or from (a run with one learner per
# team: marl_q.server.MultiServer); absent in a run with one service
SERVICE = "service"


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


def stamp_life(msgs: list[Message], life: str) -> list[Message]:
    """Mark a worker's hello with its incarnation, so that the server answers a hello handed over
    twice (an injected duplicate, an at-least-once transport) once, and a restarted worker's anew.

    Backends call this on what `Worker.start()` returns: ``life`` must differ between incarnations
    of a worker, including those of a resumed run (the server's memory of lives is checkpointed)."""
    for m in msgs:
        if m.kind == HELLO:
            m.info[LIFE] = life
    return msgs
